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
(*    the responses it recorded and the placement rule Placement: new,     *)
(*    re-record, or re-emission superseding the latest response (its       *)
(*    undispatched calls voided, a re-emitted call bound to a dispatched   *)
(*    lost call with the same arguments: "same call");                     *)
(*  - the external system (ExternalResult): a dispatched call gets its     *)
(*    result; the policy's recovery of an unknown outcome (halt, retry     *)
(*    under the same key, reconcile) is abstracted into that one step.     *)
(*                                                                         *)
(* Ghosts (no implementation keeps them): the INTENT of every call, the    *)
(* real-world identity the invariants are about.  Every emission of the    *)
(* model is a new intent per call, a deliberate repeat included; a call    *)
(* of a re-emission after a lost response is the intent of the lost call   *)
(* at its slot if it asks for the same arguments, a new one otherwise.    *)
(*                                                                         *)
(* What is left out: approvals (spec/DurableToolExecution.tla binds them), *)
(* tool names (one tool; the Python matches name and argument digest),     *)
(* the engine passing its own sequence number (record(seq, calls)),       *)
(* legacy calls, retries (a retry under the same key adds no new           *)
(* <<intent, key>> pair), more than one engine process.                   *)
(*                                                                         *)
(* ASSUMPTION (SaveBeforeEmit): the framework saves its history before it  *)
(* asks the model again, so a crash loses at most the newest response.     *)
(* Without it the LostTwoResponses model shows the rule is not enough: a  *)
(* crash that loses two responses makes the re-emission of the older one   *)
(* meet the newer one, the only one the rule compares with.                *)
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
    BindSameCall    \* design switch: FALSE gives a re-emitted dispatched call a
                    \* new identity

ASSUME /\ Ids # {} /\ ArgVals # {} /\ MaxSlots \in Nat \ {0}
       /\ MaxEmits \in Nat /\ MaxCrashes \in Nat /\ MaxTrims \in Nat
       /\ SaveBeforeEmit \in BOOLEAN /\ UseSeen \in BOOLEAN /\ SeqMonotone \in BOOLEAN
       /\ AcceptReEmission \in BOOLEAN /\ BindSameCall \in BOOLEAN
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
(* Placement(latest, seenLatest, R): the set of answers for a response R   *)
(* presented when the latest recorded response is latest (<<>>: none) and *)
(* the history before R holds a result of latest (seenLatest).  Exactly    *)
(* one answer (PlacementTotal): "new" if there is no latest or its         *)
(* results precede R (a deliberate repeat runs again); else "rerecord" if  *)
(* R's calls are latest's, slot by slot (a resume); else "reemission"     *)
(* (the history lost latest before it was saved; R replaces it).  Left     *)
(* out: the engine's refusal of a new response while an earlier call is    *)
(* unanswered (Answers, below, adds it).                                   *)
(***************************************************************************)
Placement(latest, seenLatest, R) ==
    LET seenOK == IF UseSeen THEN seenLatest ELSE FALSE IN
    IF latest = <<>> \/ seenOK THEN {"new"}
    ELSE IF R = latest THEN {"rerecord"}
    ELSE IF AcceptReEmission THEN {"reemission"} ELSE {}

(* SameCallSlots(pool, wanted): for each call of a re-emission (wanted:   *)
(* its arguments, slot by slot), the index in pool (the arguments of the   *)
(* lost response's dispatched calls, slot order) of the lost call it IS:   *)
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
    numbered, placedAfterTrim,  \* ghosts
    emits, crashes, trims \* bounds

vars == <<hist, saved, led, sup, lstat, bind, cur, lost, nextIntent,
          keyIntents, dispatches, effectOf, handed, numbered, placedAfterTrim,
          emits, crashes, trims>>

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
(*    first, which the model re-expresses in order); keyIntents (every     *)
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
    /\ numbered = {} /\ placedAfterTrim = FALSE
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
\* The latest recorded response (Python's last_durable_turn): the highest number.
LatestN == Len(led)
Latest == IF led = <<>> THEN <<>> ELSE led[LatestN].calls
\* The response index a listIndex twin would key by: responses in the list.
ListIndex == Cardinality({i \in 1..Len(hist) : hist[i].t = "resp"})
\* Python's open-calls refusal: an unanswered call of an earlier response,
\* not superseded and not one of the calls being superseded (except).
OpenEarlier(except) ==
    \E n \in DOMAIN led : n \notin sup /\ n # except /\
        \E s \in DOMAIN led[n].keys : lstat[led[n].keys[s]] \in {"none", "dispatched"}
\* The answers the ledger gives the presented response R (Python's _record).
Answers(R) ==
    LET latestKeys == IF led = <<>> THEN {} ELSE KeysOf(LatestN)
        kinds == Placement(Latest, SeenKeys \cap latestKeys # {}, R)
    IN {a \in kinds : \/ a = "rerecord"
                      \/ a = "new" /\ ~OpenEarlier(0)
                      \/ a = "reemission" /\ ~OpenEarlier(LatestN)}

(***************************************************************************)
(* ModelEmit(R): the model answers the history with response R.  The       *)
(* engine asks only when it answered everything (no pending response, no   *)
(* response in its hands); with SaveBeforeEmit the history is saved first. *)
(* Intents: after a loss, the calls of R asking for the arguments of the   *)
(* oldest lost response's call at the same slot are that call's intent.    *)
(***************************************************************************)
ModelEmit(R) ==
    /\ emits < MaxEmits /\ ~Pending /\ cur = NoCur
    /\ SaveBeforeEmit => saved = Len(hist)
    /\ LET head == IF lost = <<>> THEN [args |-> <<>>, ints |-> <<>>] ELSE Head(lost)
           ints == [s \in DOMAIN R |->
                      IF s \in DOMAIN head.args /\ head.args[s] = R[s].args
                      THEN head.ints[s] ELSE nextIntent + s - 1]
       IN /\ hist' = Append(hist, RespEntry(R, ints))
          /\ lost' = IF lost = <<>> THEN <<>> ELSE Tail(lost)
    /\ nextIntent' = nextIntent + Len(R)
    /\ emits' = emits + 1
    /\ UNCHANGED <<saved, led, sup, lstat, bind, cur, keyIntents, dispatches,
                   effectOf, handed, numbered, placedAfterTrim, crashes, trims>>

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
(* re-emission supersedes the latest response L in the same step: L's      *)
(* calls never dispatched are voided; a call of R asking for the arguments *)
(* of a dispatched call of L (or of the call a same call of L is) IS that  *)
(* call.  Not enabled when the rule gives no answer (PlacementTotal).     *)
(***************************************************************************)
EnginePlace ==
    /\ Pending /\ cur = NoCur
    /\ LET e == Last(hist)
           R == e.calls
       IN \E a \in Answers(R) :
          /\ placedAfterTrim' = (placedAfterTrim \/ trims > 0)
          /\ CASE a = "rerecord" ->
                  /\ cur' = [n |-> LatestN, keys |-> led[LatestN].keys, ints |-> e.ints]
                  /\ keyIntents' = keyIntents \cup
                        {<<led[LatestN].keys[s], e.ints[s]>> : s \in DOMAIN R}
                  /\ UNCHANGED <<led, sup, lstat, bind, numbered>>
            [] a = "new" ->
                  /\ RecordAt(Len(led) + 1, R, e.ints, [s \in DOMAIN R |-> 0], <<>>, lstat)
                  /\ UNCHANGED sup
            [] a = "reemission" ->
                  LET lk == led[LatestN].keys
                      \* what R's calls may be: L's dispatched calls (or their targets)
                      pool == SelectSeq([s \in DOMAIN lk |-> <<Target(lk[s]),
                                                              led[LatestN].calls[s].args>>],
                                        LAMBDA p : lstat[p[1]] \in {"dispatched", "done"})
                      same == IF BindSameCall
                              THEN SameCallSlots([i \in DOMAIN pool |-> pool[i][2]], ArgsOf(R))
                              ELSE [s \in DOMAIN R |-> 0]
                      voided == [k \in DOMAIN lstat |->
                                   IF \E s \in DOMAIN lk : lk[s] = k /\ lstat[k] = "none"
                                   THEN "void" ELSE lstat[k]]
                  IN /\ sup' = sup \cup {LatestN}
                     /\ RecordAt(IF SeqMonotone THEN Len(led) + 1 ELSE LatestN, R, e.ints, same,
                                 [i \in DOMAIN pool |-> pool[i][1]], voided)
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
                   keyIntents, handed, numbered, placedAfterTrim, emits, crashes, trims>>

(* ExternalResult(k): a dispatched call's outcome is recorded (the policy's *)
(* recovery of an unknown outcome included), whatever the engine does.     *)
ExternalResult(k) ==
    /\ k \in DOMAIN lstat /\ lstat[k] = "dispatched"
    /\ lstat' = [lstat EXCEPT ![k] = "done"]
    /\ UNCHANGED <<hist, saved, led, sup, bind, cur, lost, nextIntent,
                   keyIntents, dispatches, effectOf, handed, numbered, placedAfterTrim,
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
                   dispatches, effectOf, numbered, placedAfterTrim, emits, crashes, trims>>

(* FrameworkSave: the framework saves its whole history. *)
FrameworkSave ==
    /\ saved < Len(hist)
    /\ saved' = Len(hist)
    /\ UNCHANGED <<hist, led, sup, lstat, bind, cur, lost, nextIntent,
                   keyIntents, dispatches, effectOf, handed, numbered, placedAfterTrim,
                   emits, crashes, trims>>

(* FrameworkTrim: a history processor drops the oldest saved message, if   *)
(* it is older than the newest answered response (summarising is the same *)
(* for the ledger: the old messages are gone).                             *)
FrameworkTrim ==
    /\ trims < MaxTrims /\ saved >= 1
    /\ \E j \in 2..Len(hist) :
          /\ hist[j].t = "resp"
          /\ \E i \in (j + 1)..Len(hist) : hist[i].t = "res"
    /\ hist' = Tail(hist) /\ saved' = saved - 1
    /\ trims' = trims + 1
    /\ UNCHANGED <<led, sup, lstat, bind, cur, lost, nextIntent, keyIntents,
                   dispatches, effectOf, handed, numbered, placedAfterTrim, emits, crashes>>

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
                   dispatches, effectOf, handed, numbered, placedAfterTrim, emits, trims>>

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

=============================================================================
