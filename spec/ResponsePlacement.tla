------------------------- MODULE ResponsePlacement -------------------------
(***************************************************************************)
(* The ledger owns a call's identity: placing the model's responses in a  *)
(* durable sequence of its own (docs/protocol.md#placing-a-response).      *)
(*                                                                         *)
(* spec/DurableToolExecution.tla names a call by a position (turn, slot)   *)
(* and ASSUMEs ExecutionIdUnique: the engine persists the turn and never   *)
(* reuses it.  Engines cannot: the framework's message list is trimmed,    *)
(* summarised and rewritten, loses the newest unsaved response on a crash, *)
(* and the model re-emits it with new ids; providers reuse ids (call_0 on *)
(* every response).  This module models that conversation as what it is,  *)
(* with the ledger's placement rule (Session.record(calls, seen=keys)),    *)
(* and CHECKS ExecutionIdUnique as a state invariant.                      *)
(*                                                                         *)
(* Actors:                                                                 *)
(*  - the model (ModelEmit): emits a response of calls <<pid, args>> with  *)
(*    provider ids that may be reused and arguments from a small domain;   *)
(*    it may repeat an identical response on purpose after it saw the     *)
(*    results;                                                             *)
(*  - the framework's history (hist, saved; FrameworkSave, FrameworkTrim,  *)
(*    Crash): an ordered list of responses and tool results; a crash       *)
(*    drops everything after the saved prefix (the newest unsaved response *)
(*    and results); trimming drops old messages, never the newest answered *)
(*    round (a processor that drops the newest results keeps their keys,   *)
(*    docs/protocol.md#placing-a-response);                                *)
(*  - the engine (EnginePlace, EngineDispatch, EngineAnswer): presents the *)
(*    history's unanswered response with the seen signal it reads off the  *)
(*    history (the keys of the results before the response), dispatches   *)
(*    its calls and answers them with the results the ledger holds;        *)
(*  - the ledger (led, sup, lstat, bind): a durable monotone sequence of   *)
(*    the responses it recorded and the placement rule Placement: the      *)
(*    response goes right after the latest recorded response whose results *)
(*    the history shows; the one recorded there (the candidate) is         *)
(*    re-recorded if identical, else replaced: a re-emission superseding   *)
(*    the candidate and every response after it (their undispatched calls  *)
(*    voided, a re-emitted call bound to a dispatched lost call with the   *)
(*    same arguments: "same call"); no candidate: new;                     *)
(*  - the external system (ExternalResult): a dispatched call gets its     *)
(*    result; the policy's recovery of an unknown outcome (halt, retry     *)
(*    under the same key, reconcile) is abstracted into that one step.     *)
(*                                                                         *)
(* Ghosts (no implementation keeps them): the INTENT of every call, the    *)
(* real-world identity the invariants are about.  Every emission of the    *)
(* model is a new intent per call, a deliberate repeat included; after a   *)
(* loss, a call asking for the arguments of a call of a lost response (any *)
(* of them: the model re-plans from the history it has; the first unused  *)
(* one, each at most once) is that lost call's intent, a new one           *)
(* otherwise; each emission re-expresses the oldest lost response.         *)
(*                                                                         *)
(* What is left out: approvals (spec/DurableToolExecution.tla binds them), *)
(* tool names (one tool; the Python matches name and argument digest),     *)
(* the engine passing its own sequence number (record(seq, calls)),       *)
(* legacy calls, retries (a retry under the same key adds no new           *)
(* <<intent, key>> pair), more than one engine process.                   *)
(*                                                                         *)
(* Environment switch SaveBeforeEmit: the framework saves its history     *)
(* before it asks the model again, so a crash loses at most the newest     *)
(* response.  The rule does not need it: LostTwoResponses (FALSE: one      *)
(* crash loses two responses, as pydantic-ai and LangGraph with            *)
(* durability="exit" do) passes; its twin PlaceAgainstLatestOnly, the rule *)
(* that compared with the latest response only, re-records the older one's *)
(* re-emission as the newer one and fails.                                 *)
(***************************************************************************)
EXTENDS Naturals, Sequences, FiniteSets, TLC

CONSTANTS
    Ids,            \* provider call ids; providers REUSE them (call_0 each time)
    ArgVals,        \* the arguments the model may ask for
    MaxSlots,       \* calls per response: 1..MaxSlots
    MaxEmits,       \* bound on the model's emissions in one behaviour
    MaxCrashes,     \* bound on crashes
    MaxTrims,       \* bound on the framework's trims
    SaveBeforeEmit, \* environment: the history is saved before each model request
    KeyFrom,        \* design switch: "ledger" (its sequence), "providerId", "listIndex"
    UseSeen,        \* design switch: FALSE places by content alone (no seen)
    SeqMonotone,    \* design switch: FALSE gives a re-emission the number of the
                    \* response it supersedes
    AcceptReEmission, \* design switch: FALSE refuses a re-emission (InvalidInput)
    BindSameCall,   \* design switch: FALSE gives a re-emitted dispatched call a
                    \* new identity
    AgainstLatestOnly \* design switch: TRUE compares with the latest response only
                    \* (the rule before LostTwoResponses was fixed)

ASSUME /\ Ids # {} /\ ArgVals # {} /\ MaxSlots \in Nat \ {0}
       /\ MaxEmits \in Nat /\ MaxCrashes \in Nat /\ MaxTrims \in Nat
       /\ SaveBeforeEmit \in BOOLEAN /\ UseSeen \in BOOLEAN /\ SeqMonotone \in BOOLEAN
       /\ AcceptReEmission \in BOOLEAN /\ BindSameCall \in BOOLEAN
       /\ AgainstLatestOnly \in BOOLEAN
       /\ KeyFrom \in {"ledger", "providerId", "listIndex"}

(***************************************************************************)
(* Responses and keys.  A call is <<pid, args>>; a response a non-empty   *)
(* sequence of calls.  A key (execution id) is <<n, slot, pid>>: the      *)
(* ledger's sequence number n of the response, as the Python's            *)
(* derive_execution_id(session, turn, slot, tool_call_id).  The twins key *)
(* by the provider id alone (<<0, 0, pid>>) or by the response's index in *)
(* the framework's CURRENT list (<<index, slot, pid>>).                   *)
(***************************************************************************)
Call == [pid : Ids, args : ArgVals]
SeqsUpTo(S, n) == UNION {[1..k -> S] : k \in 0..n}
Responses == UNION {[1..k -> Call] : k \in 1..MaxSlots}
NoKey == <<0, 0, "none">>
Key(n, s, c, idx) ==
    CASE KeyFrom = "ledger"     -> <<n, s, c.pid>>
      [] KeyFrom = "providerId" -> <<0, 0, c.pid>>
      [] KeyFrom = "listIndex"  -> <<idx, s, c.pid>>
ArgsOf(R) == [s \in DOMAIN R |-> R[s].args]

(***************************************************************************)
(* The placement rule, constant-level (the Python's placement() and       *)
(* same_call_slots() are checked against these on every input of a small  *)
(* domain: tests/test_placement_conformance.py, model PlacementTable).     *)
(*                                                                         *)
(* Placement(resps, R): the set of answers for a response R presented     *)
(* when the ledger's live responses (recorded, after the marker, not       *)
(* superseded; oldest first) are resps, each [calls, seen]: seen means the *)
(* history before R holds a result of it.  R's place is right after the    *)
(* latest seen response (the anchor; none seen: the session start); the    *)
(* response after the anchor, if any, is the candidate.  Exactly one       *)
(* answer (PlacementTotal), [kind, at] with at the candidate's index:      *)
(* "new" (at 0) if there is no candidate (a deliberate repeat of the       *)
(* anchor runs again); else "rerecord" if R's calls are the candidate's,   *)
(* slot by slot (a resume); else "reemission": R replaces the candidate,   *)
(* which the history lost, and every response after it is lost with it.    *)
(* AgainstLatestOnly (the old rule, a twin) looks at the latest response   *)
(* only: the anchor is never before it.  Left out: the engine's refusal   *)
(* of a new response while an earlier call is unanswered (Answers adds it).*)
(***************************************************************************)
Anchor(resps) ==
    LET lo == IF AgainstLatestOnly /\ resps # <<>> THEN Len(resps) - 1 ELSE 0
        seen == {i \in DOMAIN resps : i > lo /\ UseSeen /\ resps[i].seen}
    IN IF seen = {} THEN lo ELSE CHOOSE i \in seen : \A j \in seen : j <= i
Placement(resps, R) ==
    LET a == Anchor(resps) IN
    IF a = Len(resps) THEN {[kind |-> "new", at |-> 0]}
    ELSE IF resps[a + 1].calls = R THEN {[kind |-> "rerecord", at |-> a + 1]}
    ELSE IF AcceptReEmission THEN {[kind |-> "reemission", at |-> a + 1]} ELSE {}

(* SameCallSlots(pool, wanted): for each call of a re-emission (wanted:   *)
(* its arguments, slot by slot), the index in pool (the arguments of the   *)
(* dispatched calls of every response it supersedes, oldest response      *)
(* first, slot order) of the lost call it IS:                              *)
(* the first unused one with the same arguments; 0 if none.  Each lost     *)
(* call is bound at most once.                                             *)
RECURSIVE SameCallFrom(_, _, _)
SameCallFrom(pool, wanted, used) ==
    IF wanted = <<>> THEN <<>>
    ELSE LET hits == {i \in 1..Len(pool) : i \notin used /\ pool[i] = Head(wanted)} IN
         IF hits = {} THEN <<0>> \o SameCallFrom(pool, Tail(wanted), used)
         ELSE LET i == CHOOSE j \in hits : \A m \in hits : j <= m IN
              <<i>> \o SameCallFrom(pool, Tail(wanted), used \cup {i})
SameCallSlots(pool, wanted) == SameCallFrom(pool, wanted, {})

VARIABLES
    hist, saved,          \* the framework's history and its saved prefix length
    led, sup, lstat, bind, \* the ledger: durable
    cur,                  \* the engine's memory (lost on a crash)
    lost, nextIntent, keyIntents, dispatches, effectOf, handed,
    numbered, placedAfterTrim, placedBehind,  \* ghosts
    emits, crashes, trims \* bounds

vars == <<hist, saved, led, sup, lstat, bind, cur, lost, nextIntent,
          keyIntents, dispatches, effectOf, handed, numbered, placedAfterTrim,
          placedBehind, emits, crashes, trims>>

(***************************************************************************)
(* Variables.                                                              *)
(*  - hist: entries [t |-> "resp", calls, ints, ...] (a response and the   *)
(*    ghost intents of its calls) and                                      *)
(*    [t |-> "res", key, ...] (a tool result the engine created, carrying  *)
(*    the call's key, as drop-ins do); saved: the length of the prefix the *)
(*    framework saved;                                                     *)
(*  - led: the ledger's sequence, led[n] = [calls, keys]; never shortened; *)
(*    sup: the numbers of superseded responses; lstat[k]: "none"           *)
(*    (recorded), "dispatched", "done" (has its result), "void"            *)
(*    (superseded before dispatch), "same" (the same call as bind[k]);     *)
(*  - cur: the response the engine is acting on ([n, keys, ints]) or none; *)
(*  - ghosts: lost (the lost responses' arguments and intents, oldest      *)
(*    first; a call re-expressed already has arguments "used");            *)
(*    placedBehind (a placement's candidate was not the latest live        *)
(*    response); keyIntents (every                                         *)
(*    <<key, intent>> the ledger gave a presented call); dispatches        *)
(*    (<<intent, key>>); effectOf[k] (the intent whose request went out    *)
(*    under k); handed (<<intent of the call answered, intent whose effect *)
(*    the result is>>); numbered (<<n, calls>> for every placement).       *)
(***************************************************************************)
NoCur == [n |-> 0, keys |-> <<>>, ints |-> <<>>]
Entry(t, calls, ints, key) == [t |-> t, calls |-> calls, ints |-> ints, key |-> key]
RespEntry(R, ints) == Entry("resp", R, ints, NoKey)
ResEntry(k) == Entry("res", <<>>, <<>>, k)

Statuses == {"none", "dispatched", "done", "void", "same"}
MaxIntent == MaxEmits * MaxSlots

TypeOK ==
    /\ hist \in Seq([t : {"resp", "res"}, calls : SeqsUpTo(Call, MaxSlots),
                     ints : SeqsUpTo(0..MaxIntent, MaxSlots),
                     key : Nat \X Nat \X (Ids \cup {"none"})])
    /\ saved \in 0..Len(hist)
    /\ \A n \in DOMAIN led : led[n].calls \in Responses
    /\ sup \subseteq DOMAIN led
    /\ \A k \in DOMAIN lstat : lstat[k] \in Statuses
    /\ DOMAIN bind \subseteq DOMAIN lstat
    /\ nextIntent \in 1..(MaxIntent + 1)
    /\ emits \in 0..MaxEmits /\ crashes \in 0..MaxCrashes /\ trims \in 0..MaxTrims

(* Init: an empty conversation and an empty ledger. *)
Init ==
    /\ hist = <<>> /\ saved = 0
    /\ led = <<>> /\ sup = {} /\ lstat = <<>> /\ bind = <<>>
    /\ cur = NoCur
    /\ lost = <<>> /\ nextIntent = 1
    /\ keyIntents = {} /\ dispatches = {} /\ effectOf = <<>> /\ handed = {}
    /\ numbered = {} /\ placedAfterTrim = FALSE /\ placedBehind = FALSE
    /\ emits = 0 /\ crashes = 0 /\ trims = 0

(***************************************************************************)
(* Helpers over the history and the ledger.                                *)
(***************************************************************************)
Last(s) == s[Len(s)]
\* The history ends with a response the engine has not answered.
Pending == hist # <<>> /\ Last(hist).t = "resp"
\* The keys of the results the history holds before its last entry.
SeenKeys == {hist[j].key : j \in {i \in 1..(Len(hist) - 1) : hist[i].t = "res"}}
\* Python's _keys_of: a same call's key and the key of the call it is.
Target(k) == IF k \in DOMAIN bind THEN bind[k] ELSE k
KeysOf(n) == {led[n].keys[s] : s \in DOMAIN led[n].keys}
             \cup {Target(led[n].keys[s]) : s \in DOMAIN led[n].keys}
\* The live responses' numbers, ascending (Python: the turns from the marker on
\* whose calls are not superseded), and the rule's input over them.
LiveNums == SelectSeq([n \in 1..Len(led) |-> n], LAMBDA n : n \notin sup)
Live == [i \in DOMAIN LiveNums |-> [calls |-> led[LiveNums[i]].calls,
                                    seen |-> SeenKeys \cap KeysOf(LiveNums[i]) # {}]]
\* The numbers a re-emission at candidate index a supersedes: a and after.
LostFrom(a) == SubSeq(LiveNums, a, Len(LiveNums))
Range(s) == {s[i] : i \in DOMAIN s}
\* The response index a listIndex twin would key by: responses in the list.
ListIndex == Cardinality({i \in 1..Len(hist) : hist[i].t = "resp"})
\* Python's open-calls refusal: an unanswered call of an earlier response,
\* not superseded and not one of the responses being superseded (except).
OpenEarlier(except) ==
    \E n \in DOMAIN led : n \notin sup /\ n \notin except /\
        \E s \in DOMAIN led[n].keys : lstat[led[n].keys[s]] \in {"none", "dispatched"}
\* The answers the ledger gives the presented response R (Python's _record).
Answers(R) ==
    {a \in Placement(Live, R) : \/ a.kind = "rerecord"
                                \/ a.kind = "new" /\ ~OpenEarlier({})
                                \/ a.kind = "reemission" /\ ~OpenEarlier(Range(LostFrom(a.at)))}

(***************************************************************************)
(* ModelEmit(R): the model answers the history with response R.  The       *)
(* engine asks only when it answered everything (no pending response, no   *)
(* response in its hands); with SaveBeforeEmit the history is saved first. *)
(* Intents: after a loss, a call of R asking for the arguments of a call   *)
(* of a lost response (the first unused one, oldest response first, each  *)
(* at most once: SameCallSlots) is that call's intent; R re-expresses the *)
(* oldest lost response, and the calls R used are used for good.          *)
(***************************************************************************)
RECURSIVE FlatLost(_)
FlatLost(l) ==
    IF l = <<>> THEN <<>>
    ELSE [s \in DOMAIN Head(l).args |-> [args |-> Head(l).args[s], int |-> Head(l).ints[s]]]
         \o FlatLost(Tail(l))
ModelEmit(R) ==
    /\ emits < MaxEmits /\ ~Pending /\ cur = NoCur
    /\ SaveBeforeEmit => saved = Len(hist)
    /\ LET flat == FlatLost(lost)
           m == SameCallSlots([i \in DOMAIN flat |-> flat[i].args], ArgsOf(R))
           ints == [s \in DOMAIN R |-> IF m[s] # 0 THEN flat[m[s]].int ELSE nextIntent + s - 1]
           used == {flat[m[s]].int : s \in {t \in DOMAIN R : m[t] # 0}}
           rest == IF lost = <<>> THEN <<>> ELSE Tail(lost)
       IN /\ hist' = Append(hist, RespEntry(R, ints))
          /\ lost' = [i \in DOMAIN rest |->
                        [args |-> [s \in DOMAIN rest[i].args |->
                                     IF rest[i].ints[s] \in used THEN "used"
                                     ELSE rest[i].args[s]],
                         ints |-> rest[i].ints]]
    /\ nextIntent' = nextIntent + Len(R)
    /\ emits' = emits + 1
    /\ UNCHANGED <<saved, led, sup, lstat, bind, cur, keyIntents, dispatches,
                   effectOf, handed, numbered, placedAfterTrim, placedBehind, crashes, trims>>

(* RecordAt(n, R, ints, same, poolKeys, base): the ledger records R at     *)
(* number n (appended; with SeqMonotone = FALSE, over the number of the   *)
(* response R supersedes) and keys its calls; a call with same[s] # 0 IS   *)
(* the lost call poolKeys[same[s]] ("same").  A key the ledger already     *)
(* holds keeps its record (what a store does; only the twins reach it).   *)
(* base: the statuses before (the latest response's voids applied).        *)
RecordAt(n, R, ints, same, poolKeys, base) ==
    LET keys == [s \in DOMAIN R |-> Key(n, s, R[s], ListIndex)]
        sameSlots == {s \in DOMAIN R : same[s] # 0}
        fresh == {keys[s] : s \in DOMAIN R} \ DOMAIN base
        newStat == [k \in fresh |-> IF \E s \in sameSlots : keys[s] = k
                                    THEN "same" ELSE "none"]
        newBind == [k \in {keys[s] : s \in sameSlots} \cap fresh |->
                      poolKeys[same[CHOOSE s \in sameSlots : keys[s] = k]]]
    IN /\ led' = IF n > Len(led) THEN Append(led, [calls |-> R, keys |-> keys])
                 ELSE [led EXCEPT ![n] = [calls |-> R, keys |-> keys]]
       /\ keyIntents' = keyIntents \cup {<<keys[s], ints[s]>> : s \in DOMAIN R}
       /\ numbered' = numbered \cup {<<n, R>>}
       /\ cur' = [n |-> n, keys |-> keys, ints |-> ints]
       /\ lstat' = newStat @@ base
       /\ bind' = newBind @@ bind

(***************************************************************************)
(* EnginePlace: the engine presents the history's unanswered response with *)
(* the seen signal; the ledger answers by the rule (Answers).  A           *)
(* re-emission supersedes the candidate and every live response after it  *)
(* in the same step: their calls never dispatched are voided; a call of R  *)
(* asking for the arguments of a dispatched call of any of them (or of the *)
(* call a same call is), oldest response first, IS that call.  Not enabled *)
(* when the rule gives no answer (PlacementTotal).                        *)
\* A response's calls as the binding pool holds them: <<target key, args>>.
CallsOf(n) == [s \in DOMAIN led[n].keys |-> <<Target(led[n].keys[s]), led[n].calls[s].args>>]
RECURSIVE PoolOf(_)
PoolOf(ns) == IF ns = <<>> THEN <<>> ELSE CallsOf(Head(ns)) \o PoolOf(Tail(ns))
EnginePlace ==
    /\ Pending /\ cur = NoCur
    /\ LET e == Last(hist)
           R == e.calls
       IN \E a \in Answers(R) :
          /\ placedAfterTrim' = (placedAfterTrim \/ trims > 0)
          /\ placedBehind' = (placedBehind \/ a.at \notin {0, Len(LiveNums)})
          /\ CASE a.kind = "rerecord" ->
                  LET n == LiveNums[a.at] IN
                  /\ cur' = [n |-> n, keys |-> led[n].keys, ints |-> e.ints]
                  /\ keyIntents' = keyIntents \cup
                        {<<led[n].keys[s], e.ints[s]>> : s \in DOMAIN R}
                  /\ UNCHANGED <<led, sup, lstat, bind, numbered>>
            [] a.kind = "new" ->
                  /\ RecordAt(Len(led) + 1, R, e.ints, [s \in DOMAIN R |-> 0], <<>>, lstat)
                  /\ UNCHANGED sup
            [] a.kind = "reemission" ->
                  LET gone == LostFrom(a.at)
                      lostKeys == UNION {Range(led[n].keys) : n \in Range(gone)}
                      \* what R's calls may be: their dispatched calls (or their targets)
                      pool == SelectSeq(PoolOf(gone),
                                        LAMBDA p : lstat[p[1]] \in {"dispatched", "done"})
                      same == IF BindSameCall
                              THEN SameCallSlots([i \in DOMAIN pool |-> pool[i][2]], ArgsOf(R))
                              ELSE [s \in DOMAIN R |-> 0]
                      voided == [k \in DOMAIN lstat |->
                                   IF k \in lostKeys /\ lstat[k] = "none"
                                   THEN "void" ELSE lstat[k]]
                  IN /\ sup' = sup \cup Range(gone)
                     /\ RecordAt(IF SeqMonotone THEN Len(led) + 1 ELSE LiveNums[a.at], R, e.ints,
                                 same, [i \in DOMAIN pool |-> pool[i][1]], voided)
    /\ UNCHANGED <<hist, saved, lost, nextIntent, dispatches, effectOf, handed,
                   emits, crashes, trims>>

(* EngineDispatch(s): the engine sends the call at slot s of the response  *)
(* it acts on, whose key was never dispatched.                             *)
EngineDispatch(s) ==
    /\ cur # NoCur /\ s \in DOMAIN cur.keys
    /\ LET k == cur.keys[s] IN
       /\ lstat[k] = "none"
       /\ lstat' = [lstat EXCEPT ![k] = "dispatched"]
       /\ dispatches' = dispatches \cup {<<cur.ints[s], k>>}
       /\ effectOf' = IF k \in DOMAIN effectOf THEN effectOf
                      ELSE (k :> cur.ints[s]) @@ effectOf
    /\ UNCHANGED <<hist, saved, led, sup, bind, cur, lost, nextIntent,
                   keyIntents, handed, numbered, placedAfterTrim, placedBehind, emits, crashes, trims>>

(* ExternalResult(k): a dispatched call's outcome is recorded (the policy's *)
(* recovery of an unknown outcome included), whatever the engine does.     *)
ExternalResult(k) ==
    /\ k \in DOMAIN lstat /\ lstat[k] = "dispatched"
    /\ lstat' = [lstat EXCEPT ![k] = "done"]
    /\ UNCHANGED <<hist, saved, led, sup, bind, cur, lost, nextIntent,
                   keyIntents, dispatches, effectOf, handed, numbered, placedAfterTrim, placedBehind,
                   emits, crashes, trims>>

(* EngineAnswer: every call of the response the engine acts on has a      *)
(* result (a same call: the call it is has one); the engine appends one    *)
(* tool result per call, carrying the call's key, to the history.          *)
EngineAnswer ==
    /\ cur # NoCur
    /\ \A s \in DOMAIN cur.keys : lstat[Target(cur.keys[s])] = "done"
    /\ hist' = hist \o [s \in DOMAIN cur.keys |-> ResEntry(cur.keys[s])]
    /\ handed' = handed \cup {<<cur.ints[s], effectOf[Target(cur.keys[s])]>> :
                               s \in DOMAIN cur.keys}
    /\ cur' = NoCur
    /\ UNCHANGED <<saved, led, sup, lstat, bind, lost, nextIntent, keyIntents,
                   dispatches, effectOf, numbered, placedAfterTrim, placedBehind, emits, crashes, trims>>

(* FrameworkSave: the framework saves its whole history. *)
FrameworkSave ==
    /\ saved < Len(hist)
    /\ saved' = Len(hist)
    /\ UNCHANGED <<hist, led, sup, lstat, bind, cur, lost, nextIntent,
                   keyIntents, dispatches, effectOf, handed, numbered, placedAfterTrim, placedBehind,
                   emits, crashes, trims>>

(* FrameworkTrim: a history processor drops the oldest saved message, if   *)
(* it is older than the newest answered response of the SAVED history     *)
(* (summarising is the same for the ledger: the old messages are gone).   *)
(* The saved prefix, what a crash restores, is itself a trimmed history   *)
(* that keeps its newest answered round: a trim written back is saved      *)
(* with the messages it kept, never ahead of them.                         *)
FrameworkTrim ==
    /\ trims < MaxTrims /\ saved >= 1
    /\ \E j \in 2..saved :
          /\ hist[j].t = "resp"
          /\ \E i \in (j + 1)..saved : hist[i].t = "res"
    /\ hist' = Tail(hist) /\ saved' = saved - 1
    /\ trims' = trims + 1
    /\ UNCHANGED <<led, sup, lstat, bind, cur, lost, nextIntent, keyIntents,
                   dispatches, effectOf, handed, numbered, placedAfterTrim, placedBehind, emits, crashes>>

(* Crash: the engine's process dies: its memory is lost, and the history   *)
(* keeps only its saved prefix; the responses it drops are lost (the       *)
(* model will re-express them, oldest first).  The ledger loses nothing.   *)
Crash ==
    /\ crashes < MaxCrashes
    /\ LET dropped == SubSeq(hist, saved + 1, Len(hist))
           resps == SelectSeq(dropped, LAMBDA e : e.t = "resp")
       IN /\ hist' = SubSeq(hist, 1, saved)
          /\ lost' = [i \in DOMAIN resps |-> [args |-> ArgsOf(resps[i].calls),
                                              ints |-> resps[i].ints]] \o lost
    /\ cur' = NoCur
    /\ crashes' = crashes + 1
    /\ UNCHANGED <<saved, led, sup, lstat, bind, nextIntent, keyIntents,
                   dispatches, effectOf, handed, numbered, placedAfterTrim, placedBehind, emits, trims>>

Next ==
    \/ \E R \in Responses : ModelEmit(R)
    \/ EnginePlace
    \/ \E s \in 1..MaxSlots : EngineDispatch(s)
    \/ \E k \in DOMAIN lstat : ExternalResult(k)
    \/ EngineAnswer
    \/ FrameworkSave
    \/ FrameworkTrim
    \/ Crash

Spec == Init /\ [][Next]_vars

(***************************************************************************)
(* INVARIANTS                                                              *)
(***************************************************************************)
(* ExecutionIdUnique: no two distinct intended calls share a ledger        *)
(* identity, whatever the provider ids, the trimming and the losses: the  *)
(* main spec's ASSUME, checked here under the ledger-owned sequence.       *)
(* Left out: a same call has a key of its own beside the key of the call   *)
(* it is (two keys, one intent: allowed).                                  *)
ExecutionIdUnique ==
    \A a, b \in keyIntents : a[1] = b[1] => a[2] = b[2]

(* NoAlias: a call is never handed another call's result: every result    *)
(* the engine gave a call is the effect of that call's own intent.         *)
NoAlias ==
    \A h \in handed : h[1] = h[2]

(* NoDuplicateDispatch: an intent is dispatched under one identity at     *)
(* most (a policy's retry reuses the same key: the same pair).             *)
NoDuplicateDispatch ==
    \A a, b \in dispatches : a[1] = b[1] => a[2] = b[2]

(* PlacementTotal: never a dead end: the response the engine presents     *)
(* gets exactly one answer from the ledger (new, re-record or              *)
(* re-emission; no refusal, no ambiguity).                                 *)
PlacementTotal ==
    (Pending /\ cur = NoCur) => Cardinality(Answers(Last(hist).calls)) = 1

(* SequenceMonotone: the ledger's sequence only grows: a number, once      *)
(* given to a response, names that response forever (a superseded one      *)
(* included), so a key derived from it is never reused.                    *)
SequenceMonotone ==
    \A a, b \in numbered : a[1] = b[1] => a[2] = b[2]

(***************************************************************************)
(* WITNESSES: negated antecedents; each must be violated on a must-pass    *)
(* model (model/manifest.toml, antecedent_of).                             *)
(***************************************************************************)
\* A deliberate repeat ran again: two consecutive responses of the ledger,
\* identical (ids and arguments), both dispatched (ExecutionIdUnique, NoAlias).
Witness_DeliberateRepeatRun ==
    ~\E n \in DOMAIN led : n + 1 \in DOMAIN led /\ led[n].calls = led[n + 1].calls
        /\ \A m \in {n, n + 1} : \A k \in KeysOf(m) : lstat[k] \in {"dispatched", "done"}

\* A re-emission superseded a lost response (SequenceMonotone, PlacementTotal).
Witness_ReEmissionSuperseded ==
    sup = {}

\* A re-emitted call was bound to the dispatched call of a lost response
\* (NoDuplicateDispatch, NoAlias).
Witness_SameCallBound ==
    bind = <<>>

\* A response the ledger recorded was lost from the history before it was
\* saved (NoDuplicateDispatch).
Witness_RecordedResponseLost ==
    ~\E i \in DOMAIN lost : \E k \in keyIntents : k[2] \in {lost[i].ints[s] : s \in DOMAIN lost[i].ints}

\* A response was placed after the history was trimmed (PlacementTotal,
\* ExecutionIdUnique).
Witness_PlacedAfterTrim ==
    ~placedAfterTrim

\* A response was placed behind the latest live one: re-recorded or
\* re-emitted in the place of an older response (ExecutionIdUnique, NoAlias).
Witness_PlacedBehindLatest ==
    ~placedBehind

\* One re-emission superseded two responses at once (NoDuplicateDispatch,
\* PlacementTotal).
Witness_SupersededSeveral ==
    Cardinality(sup) < 2

=============================================================================
