------------------------ MODULE DurableToolExecution ------------------------
(***************************************************************************)
(* The toolledger protocol: crash-safe execution of side-effecting tool    *)
(* calls in an agent engine.                                               *)
(*                                                                         *)
(* One session holds several tool calls, each at a fixed position (turn,   *)
(* slot) of the conversation.  For every call the engine may need a human  *)
(* approval, writes a durable execution record ("the ledger") before it   *)
(* invokes the tool's adapter, and writes the outcome right after.  A      *)
(* crash may happen between ANY two steps; it loses the engine's volatile  *)
(* state only.  On restart (and on a live time-out) the engine applies one *)
(* total recovery decision per unanswered call.                            *)
(*                                                                         *)
(* The external system (email server, payment API, ...) is its own actor:  *)
(* requests sent to it stay in flight across engine crashes, may be        *)
(* applied with the answer delivered or lost, may fail definitely without  *)
(* being applied, and arrive late.  It deduplicates on the execution id    *)
(* only for tools whose policy is "idempotent", and it can fence attempts  *)
(* when a "reconcile" connector is asked whether an execution was applied. *)
(*                                                                         *)
(* What is deliberately left out: message contents (a result is a record   *)
(* naming the execution and the arguments it was computed from), more     *)
(* than one session, concurrent resumers of one session (the engine holds  *)
(* the session; its lease is outside this spec).                          *)
(*                                                                         *)
(* Names of actions and invariants are the ones used by the Python         *)
(* reference (reference/toolledger) and the docs, one to one.             *)
(*                                                                         *)
(* Where each variable lives, and what can lose it or change it:           *)
(*  - the CONVERSATION store (the engine's message history; durable once   *)
(*    checkpointed): msg, args, result, marker, turnOf.  A crash loses a   *)
(*    call not yet checkpointed (msg = "volatile").  Its load-time         *)
(*    pairing repair (ConversationRepair, at most MaxRepairs times) may    *)
(*    REMOVE an unanswered durable call, and the provider may then emit    *)
(*    a different call at that position; its compaction or repair may      *)
(*    RENUMBER an unanswered call's turn (ConversationRenumber, turnOf,    *)
(*    at most MaxRenumbers times).  It never loses or alters a result.     *)
(*  - the LEDGER store (durable, loses nothing, never rewritten by the     *)
(*    conversation's repairs): approval, approvalArgs (the arguments an   *)
(*    approval was asked and given for), ledger, audit, storedId (the      *)
(*    execution id the ledger store keeps for a call from the moment the   *)
(*    call is persisted on; a legacy call's was stored by the old engine). *)
(*    An audit row is <<kind, attempt, inputs>>: a recovery decision's     *)
(*    row carries the DecisionInputs it was computed from;                 *)
(*  - volatile, the engine's memory (lost on every crash): stage;          *)
(*  - external, the external system (survives engine crashes): inflight  *)
(*    and fenced;                                                          *)
(*  - environment, the clock: windowPassed (executions whose idempotency *)
(*    key's retention window has passed; the engine computes it from the   *)
(*    tool's declared window and the dispatch time in the record);         *)
(*  - external, key memory: keyForgotten (executions whose key the         *)
(*    external system forgot after the window: ExternalExpireKey);         *)
(*  - environment bounds (no store): renumbers, repairs;                   *)
(*  - ghost, history for the invariants (no implementation keeps it;      *)
(*    keyed by the CALL, the real-world identity, unless said otherwise): *)
(*    applied (by execution id: what the external system applied under   *)
(*    the key, which the reconcile connector and deduplication read),     *)
(*    invocations, humanApproved (<<call, arguments>> a human approved), *)
(*    humanRetries (by execution id),                                      *)
(*    crashes, sent (requests per attempt), knownOutcome and              *)
(*    sentAfterOutcome (NoReinvokeAfterKnownOutcome), decided (every      *)
(*    decision taken, with the row it must have, AuditComplete), effects (effects[c]: how many times *)
(*    the request of CALL c itself was applied; a request answered from   *)
(*    another call's deduplicated key is not c's effect), droppedAnswers  *)
(*    (by execution id and attempt: an applied answer the engine dropped  *)
(*    while it held that attempt unanswered; empty in every must-pass     *)
(*    model, HumanSeesKnownOutcome).  The ghosts sent, knownOutcome,       *)
(*    sentAfterOutcome, decided and effects are functions of the other   *)
(*    variables in every must-pass model, so they add no states.          *)
(*                                                                         *)
(* The two durable stores disagree only through the conversation's         *)
(* repairs, and the engine reconciles them in one place: a call is         *)
(* matched with the ledger's record at its execution id by the argument    *)
(* digest (Decide's digestMatches).  A freshly persisted call whose id     *)
(* already has a record is not dispatched live: it goes through Recover    *)
(* like a resumed one (EnginePersistCall), so a different call emitted at  *)
(* the position of a lost one meets the digest rule and halts; the halt    *)
(* keeps the record's digest and result, and no human retry is offered on  *)
(* it (Halt, HumanMayRetry), so a known outcome is never retried and the   *)
(* other call is never sent under the record's id.  An approval is bound   *)
(* the same way: it carries the arguments it was asked for (approvalArgs), *)
(* and only an approval of exactly the call's arguments dispatches it      *)
(* (ApprovalOK), so a call lost after its approval but BEFORE its first    *)
(* record leaves an approval the different call at that position cannot   *)
(* use: the engine parks a new approval for the new arguments              *)
(* (EngineParkApproval).  ApprovalBindsArgs = FALSE is the design that     *)
(* binds approvals to the position only: twin ApprovalByPosition           *)
(* (ApprovalBoundToArgs).                                                  *)
(*                                                                         *)
(* ASSUMPTIONS behind AtMostOnceEffect (docs/protocol.md#assumptions),    *)
(* each with the broken model that shows why it matters:                   *)
(*  - an idempotent tool's external system deduplicates on the execution   *)
(*    id for the tool's declared retention window at least; the engine    *)
(*    retries only while the key is retained (keyRetained): twin           *)
(*    RetryAfterKeyExpiry;                                                 *)
(*  - a reconcile connector's "not applied" and the fence of the attempts  *)
(*    made so far are ONE atomic step (query-and-fence): twin              *)
(*    QueryThenFence; without the fence at all: UnfencedReconcile;         *)
(*  - a return for an older attempt is discarded (EngineDiscardLateReturn),*)
(*    never taken as the current attempt's answer: probe                   *)
(*    Witness_LateReturnDiscarded; a return of the current attempt that    *)
(*    arrives after a time-out is recorded while the record is still at    *)
(*    that attempt, never dropped (HumanSeesKnownOutcome): twin            *)
(*    LateReturnDropped, probe Witness_LateAnswerRecorded;                 *)
(*  - an API's answer under the key that does not say whether the effect  *)
(*    happened ("in flight", "parameters differ", a replayed failure) is   *)
(*    classified unknown, and the retry keeps the key (KeyAnswers): twins  *)
(*    InFlightAsApplied, InFlightNewKey, ParamsDifferNewKey,               *)
(*    ReplayedFailureNewKey;                                               *)
(*  - the execution id is not shared by two calls (it includes the         *)
(*    position): ASSUME ExecutionIdUnique; twins KeyByToolCallId,          *)
(*    KeyByToolCallIdIdempotent;                                           *)
(*  - the id is read back from the ledger store, not re-derived from a     *)
(*    position the conversation may renumber (UseStoredId): twin           *)
(*    IdFromPosition;                                                      *)
(*  - one engine process resumes a session at a time, or every commit is  *)
(*    a compare-and-set on the state that process read                    *)
(*    (spec/ConcurrentResumers.tla): twin ResumeWithoutCAS.               *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets

CONSTANTS
    Calls,          \* call positions in the session (strings, e.g. "c1")
    Turn,           \* Turn[c]: sequence number of the assistant message holding c
    Slot,           \* Slot[c]: index of c inside that message
    ToolCallId,     \* ToolCallId[c]: the provider's id; providers REUSE them
    Policy,         \* Policy[c] \in Policies: declared by the engine per tool
    NeedsApproval,  \* NeedsApproval[c]: the tool requires a human approval
    ArgChoices,     \* ArgChoices[c]: what the model may emit at that position
    MarkerTurn,     \* protocol marker: calls of turns < MarkerTurn are legacy
    MaxCrashes,     \* bound on crashes in one behaviour
    MaxAttempts,    \* retry budget per execution (policy and human retries)
    KeyByPosition,  \* design switch: TRUE binds the execution id to the position
    FenceOnReconcile \* design switch: TRUE fences attempts on "not applied"

Policies == {"readonly", "manual", "idempotent", "reconcile"}

ASSUME /\ Policy \in [Calls -> Policies]
       /\ NeedsApproval \in [Calls -> BOOLEAN]
       /\ Turn \in [Calls -> Nat] /\ Slot \in [Calls -> Nat]
       /\ ToolCallId \in [Calls -> STRING]
       /\ \A c \in Calls : ArgChoices[c] # {}
       /\ MarkerTurn \in Nat /\ MaxCrashes \in Nat /\ MaxAttempts \in Nat \ {0}
       /\ KeyByPosition \in BOOLEAN /\ FenceOnReconcile \in BOOLEAN
       \* a legacy call was emitted (and made durable) by the old engine
       /\ \A c \in Calls : Turn[c] < MarkerTurn => Cardinality(ArgChoices[c]) = 1

(***************************************************************************)
(* The execution id.  The engine derives it from the call's position (the  *)
(* turn it reads from the conversation, and the slot) and the provider's   *)
(* tool_call_id, never from tool arguments.  Gemini numbers calls call_0,  *)
(* call_1, ... on every turn, so the tool_call_id alone is not a key: with *)
(* KeyByPosition = FALSE two calls of different turns share an id          *)
(* (docs/protocol.md#what-must-fail).  The turn the engine reads is a      *)
(* variable (turnOf): the conversation may renumber an unanswered call     *)
(* (ConversationRenumber), so the id is derived once, when the call is     *)
(* persisted, stored in the ledger store with it (storedId: before the     *)
(* call's first record, its approval and every request) and read back      *)
(* from there afterwards (ExecId, after VARIABLES).  The ids a call can    *)
(* ever derive are IdAt(c, t) for t in Renumberings(c).                    *)
(***************************************************************************)
\* Bounds of the conversation's rewrites, and the stored-id design switch.
\* Operators, not CONSTANTS, so that only the models that change them name
\* them (in their .cfg, e.g. MaxRenumbers <- MCMaxRenumbers).
MaxRenumbers == 0  \* ConversationRenumber steps in one behaviour
MaxRepairs == 0    \* ConversationRepair steps in one behaviour
UseStoredId == TRUE \* FALSE: the IdFromPosition twin re-derives the id

IdAt(c, t) == IF KeyByPosition THEN <<t, Slot[c], ToolCallId[c]>>
                               ELSE <<0, 0, ToolCallId[c]>>
Renumberings(c) == Turn[c]..(Turn[c] + MaxRenumbers)
ExecIds == UNION {{IdAt(c, t) : t \in Renumberings(c)} : c \in Calls}

(* ExecutionIdUnique: two different calls never share an id, even when    *)
(* the provider reuses tool_call_ids and whatever the renumbering: the     *)
(* engine never gives a new call a position an earlier call had (its       *)
(* sequence numbers only grow).  An ASSUMPTION on the id's derivation,     *)
(* checked once per model, not a state invariant (nothing a step does can  *)
(* change it).  The KeyByToolCallId twin is the design without it.         *)
ExecutionIdUnique ==
    \A c, d \in Calls : c # d =>
        \A t \in Renumberings(c), u \in Renumberings(d) : IdAt(c, t) # IdAt(d, u)
ASSUME KeyByPosition => ExecutionIdUnique

IsLegacy(c) == Turn[c] < MarkerTurn
LegacyCalls == {c \in Calls : IsLegacy(c)}
\* A legacy call's arguments: the one choice it has (ASSUME above).
LegacyArgs(c) == CHOOSE a \in ArgChoices[c] : TRUE
Args == UNION {ArgChoices[c] : c \in Calls}

(***************************************************************************)
(* Results.  A result names the execution and the arguments it was         *)
(* computed from, so that a result shown for the wrong call, or for other  *)
(* arguments than the call at that position, is visible to ResultFidelity. *)
(* kind: "ok" (the external system's answer), "error" (definite failure,   *)
(* known not applied), "denied" (approval rejected), "human" (a human said *)
(* it was applied and typed the result), "abandoned" (a human gave up),    *)
(* "cancelled" (a user's Stop before the call was ever dispatched).        *)
(***************************************************************************)
NoResult == [kind |-> "none", exec |-> <<>>, args |-> "none"]
Result(k, e, a) == [kind |-> k, exec |-> e, args |-> a]
ResultKinds == {"ok", "error", "denied", "human", "abandoned", "cancelled"}
Results == {Result(k, e, a) : k \in ResultKinds, e \in ExecIds, a \in Args}

Statuses == {"none", "dispatched", "succeeded", "failed",
             "recovery_required", "abandoned"}
Auths == {"none", "auto", "approval", "policy", "human"}
NoRecord == [status |-> "none", attempt |-> 0, args |-> "none",
             auth |-> "none", result |-> NoResult, call |-> "none"]
Decisions == {"execute", "reconstruct", "retry_same_id", "reconcile",
              "recovery_required", "skip"}
AuditKinds == {"dispatch", "reconcile_applied", "reconcile_not_applied",
               "reconcile_unknown", "human_applied", "human_retry",
               "human_abandon", "human_cancel"} \cup Decisions
\* The inputs column of an audit row that records no recovery decision.
NoInputs ==
    [status |-> "none", attempt |-> 0, digestMatches |-> TRUE, approval |-> "none",
     hasResult |-> FALSE, policy |-> "none", legacy |-> FALSE,
     requiresApproval |-> FALSE, keyRetained |-> TRUE]

(***************************************************************************)
(* Engine stages (volatile).  "resume" marks a call whose in-memory state  *)
(* was lost (crash) or abandoned (live time-out): Recover must decide it.  *)
(***************************************************************************)
Stages == {"none", "resume", "live", "retry", "dispatched", "waiting",
           "got_ok", "got_fail", "recorded", "reconciling"}

VARIABLES
    \* --- durable: the engine's store ------------------------------------
    msg,          \* msg[c]: "absent" | "volatile" | "durable" (the call itself)
    args,         \* args[c]: arguments of the call at position c, or "none"
    result,       \* result[c]: the role="tool" result in the conversation
    approval,     \* approval[e]: "none" | "pending" | "approved" | "rejected"
    approvalArgs, \* approvalArgs[e]: the arguments approval[e] was asked for
    ledger,       \* ledger[e]: the execution record
    audit,        \* audit[e]: set of <<kind, attempt, inputs>> rows
    marker,       \* the session's protocol marker (first governed turn)
    \* --- volatile: the engine's memory ----------------------------------
    stage,        \* stage[c] \in Stages
    \* --- the external system (survives engine crashes) ------------------
    inflight,     \* inflight[e]: attempts sent and not yet processed
    fenced,       \* fenced[e]: attempts <= fenced[e] are rejected
    \* --- ghosts (history, for the invariants) ----------------------------
    applied,      \* applied[e]: times the external system applied a request of e
    invocations,  \* invocations[c]: set of <<exec id, attempt, authorization>>
    humanApproved,\* <<call, arguments>> a human approved (what was shown)
    humanRetries, \* humanRetries[e]: retries a human authorized
    crashes,
    sent,         \* sent[c][n]: requests sent for attempt n of CALL c
    knownOutcome, \* calls whose succeeded/failed/abandoned outcome was ever durable
    sentAfterOutcome, \* sentAfterOutcome[c]: requests of c sent after that
    decided,      \* decided[c]: <<kind, attempt, inputs>> of every decision on c
    \* --- positions and the conversation's rewrites ----------------------
    turnOf,       \* turnOf[c]: the turn the engine reads for c (conversation)
    storedId,     \* storedId[c]: the id the ledger store keeps for c, or NoId
    renumbers,    \* ConversationRenumber steps so far (bound MaxRenumbers)
    repairs,      \* ConversationRepair steps so far (bound MaxRepairs)
    \* --- added for the external-system assumptions ----------------------
    effects,      \* ghost: effects[c]: times the request of CALL c was applied
    windowPassed, \* environment: executions whose key-retention window passed
    keyForgotten, \* external: executions whose idempotency key was forgotten
    droppedAnswers \* ghost: <<e, n>> whose applied answer the engine dropped

durable  == <<msg, args, result, approval, approvalArgs, ledger, audit, marker>>
external == <<inflight, fenced>>
ghosts   == <<applied, invocations, humanApproved, humanRetries, crashes,
             sent, knownOutcome, sentAfterOutcome, decided>>
vars == <<msg, args, result, approval, approvalArgs, ledger, audit, marker, stage,
          inflight, fenced, applied, invocations, humanApproved,
          humanRetries, crashes, sent, knownOutcome, sentAfterOutcome, decided,
          turnOf, storedId, renumbers, repairs,
          effects, windowPassed, keyForgotten, droppedAnswers>>
positions == <<turnOf, storedId, renumbers, repairs>>
\* The variables of the external-system assumptions (the clock, the key
\* memory, the per-call effects, the answers an engine dropped): most steps
\* leave all four unchanged.
extVars == <<effects, windowPassed, keyForgotten, droppedAnswers>>

(***************************************************************************)
(* The id the engine uses for call c: the one the ledger store keeps for   *)
(* c, else (a call not persisted yet) the one derived from the turn it     *)
(* reads now.                                                              *)
(***************************************************************************)
NoId == <<>>
DerivedId(c) == IdAt(c, turnOf[c])
ExecId(c) == IF UseStoredId /\ storedId[c] # NoId THEN storedId[c] ELSE DerivedId(c)
\* The ledger store keeps the id from the moment the call is persisted
\* (EnginePersistCall) on: every approval, record and request of the call
\* uses it, whatever the conversation does to the position later.
StoreId(c) == storedId' = IF storedId[c] = NoId
                          THEN [storedId EXCEPT ![c] = ExecId(c)] ELSE storedId

(***************************************************************************)
(* TypeOK: every variable has the shape described above.                   *)
(***************************************************************************)
Records == [status : Statuses, attempt : 0..MaxAttempts, args : Args \cup {"none"},
            auth : Auths, result : Results \cup {NoResult},
            call : Calls \cup {"none"}]
Inputs == [status : Statuses, attempt : 0..MaxAttempts, digestMatches : BOOLEAN,
           approval : {"none", "pending", "approved", "rejected"},
           hasResult : BOOLEAN, policy : Policies \cup {"none"},
           legacy : BOOLEAN, requiresApproval : BOOLEAN, keyRetained : BOOLEAN]
TypeOK ==
    /\ msg \in [Calls -> {"absent", "volatile", "durable"}]
    /\ args \in [Calls -> Args \cup {"none"}]
    /\ result \in [Calls -> Results \cup {NoResult}]
    /\ approval \in [ExecIds -> {"none", "pending", "approved", "rejected"}]
    /\ approvalArgs \in [ExecIds -> Args \cup {"none"}]
    /\ \A e \in ExecIds : (approval[e] = "none") = (approvalArgs[e] = "none")
    /\ ledger \in [ExecIds -> Records]
    /\ audit \in [ExecIds -> SUBSET (AuditKinds \X (0..MaxAttempts) \X Inputs)]
    /\ marker = MarkerTurn
    /\ stage \in [Calls -> Stages]
    /\ inflight \in [ExecIds -> SUBSET (1..MaxAttempts)]
    /\ fenced \in [ExecIds -> 0..MaxAttempts]
    /\ applied \in [ExecIds -> Nat]
    /\ invocations \in [Calls -> SUBSET (ExecIds \X (1..MaxAttempts) \X Auths)]
    /\ humanApproved \subseteq Calls \X Args
    /\ humanRetries \in [ExecIds -> 0..MaxAttempts]
    /\ crashes \in 0..MaxCrashes
    /\ sent \in [Calls -> [1..MaxAttempts -> Nat]]
    /\ knownOutcome \subseteq Calls
    /\ sentAfterOutcome \in [Calls -> Nat]
    /\ decided \in [Calls -> SUBSET (AuditKinds \X (0..MaxAttempts) \X Inputs)]
    /\ turnOf \in [Calls -> Nat]
    /\ \A c \in Calls : turnOf[c] \in Renumberings(c)
    /\ storedId \in [Calls -> ExecIds \cup {NoId}]
    /\ renumbers \in 0..MaxRenumbers
    /\ repairs \in 0..MaxRepairs
    /\ effects \in [Calls -> Nat]
    /\ windowPassed \subseteq ExecIds
    /\ keyForgotten \subseteq windowPassed
    /\ droppedAnswers \subseteq ExecIds \X (1..MaxAttempts)

(***************************************************************************)
(* Init.  Calls of the protocol's turns are not emitted yet.  A legacy     *)
(* call (turn < marker) was emitted, made durable and approved under the   *)
(* old engine, which may or may not have applied it: the new engine finds  *)
(* it with no result and no record and must recover it.                    *)
(***************************************************************************)
Init ==
    \* first: ExecId, used below, reads them
    /\ turnOf = Turn
    /\ storedId = [c \in Calls |-> IF IsLegacy(c) THEN IdAt(c, Turn[c]) ELSE NoId]
    /\ renumbers = 0
    /\ repairs = 0
    /\ msg = [c \in Calls |-> IF IsLegacy(c) THEN "durable" ELSE "absent"]
    /\ args = [c \in Calls |-> IF IsLegacy(c) THEN LegacyArgs(c) ELSE "none"]
    /\ result = [c \in Calls |-> NoResult]
    /\ approval = [e \in ExecIds |->
                     IF \E c \in LegacyCalls : ExecId(c) = e /\ NeedsApproval[c]
                     THEN "approved" ELSE "none"]
    \* the old engine's approval was given for the legacy call's arguments
    /\ approvalArgs = [e \in ExecIds |->
                         IF \E c \in LegacyCalls : ExecId(c) = e /\ NeedsApproval[c]
                         THEN LegacyArgs(CHOOSE c \in LegacyCalls :
                                             ExecId(c) = e /\ NeedsApproval[c])
                         ELSE "none"]
    /\ ledger = [e \in ExecIds |-> NoRecord]
    /\ audit = [e \in ExecIds |-> {}]
    /\ marker = MarkerTurn
    /\ stage = [c \in Calls |-> IF IsLegacy(c) THEN "resume" ELSE "none"]
    /\ inflight = [e \in ExecIds |-> {}]
    /\ fenced = [e \in ExecIds |-> 0]
    /\ applied \in [ExecIds -> {0}] \cup
         {f \in [ExecIds -> {0, 1}] :
            \A e \in ExecIds : f[e] = 1 =>
               \E c \in LegacyCalls : ExecId(c) = e /\ Policy[c] # "readonly"}
    /\ invocations = [c \in Calls |-> {}]
    /\ humanApproved = {<<c, LegacyArgs(c)>> : c \in {d \in LegacyCalls : NeedsApproval[d]}}
    /\ humanRetries = [e \in ExecIds |-> 0]
    /\ crashes = 0
    /\ sent = [c \in Calls |-> [n \in 1..MaxAttempts |-> 0]]
    /\ knownOutcome = {}
    /\ sentAfterOutcome = [c \in Calls |-> 0]
    /\ decided = [c \in Calls |-> {}]
    \* a legacy call's effect is its own: the old engine applied THIS call
    /\ effects = [c \in Calls |-> IF IsLegacy(c) THEN applied[ExecId(c)] ELSE 0]
    /\ windowPassed = {}
    /\ keyForgotten = {}
    /\ droppedAnswers = {}

(***************************************************************************)
(* Helpers.                                                                *)
(***************************************************************************)
Rec(c) == ledger[ExecId(c)]
(***************************************************************************)
(* An approval is asked for, and given for, the arguments the human is     *)
(* shown (approvalArgs, written with the pending approval).  ApprovalFor:  *)
(* the approval at c's id is for exactly the arguments of the call now at  *)
(* c's position.  ApprovalBindsArgs is the design switch: FALSE binds an   *)
(* approval to the position only (any call at an approved position is     *)
(* dispatched on it), the ApprovalByPosition twin, which overrides it in   *)
(* its .cfg: no other model has to name it.                                *)
(***************************************************************************)
\* (IF, not \/: TLC would take each true disjunct of an action's guard as a
\* step of its own, and dump the same step twice.)
ApprovalBindsArgs == TRUE
ApprovalFor(c) ==
    IF ApprovalBindsArgs THEN approvalArgs[ExecId(c)] = args[c] ELSE TRUE
ApprovalOK(c) ==
    ~NeedsApproval[c] \/ (approval[ExecId(c)] = "approved" /\ ApprovalFor(c))
\* The engine must ask (again): no approval yet, or one for other arguments.
NeedsNewApproval(c) ==
    IF approval[ExecId(c)] = "none" THEN TRUE ELSE ~ApprovalFor(c)
PriorTurnsAnswered(c) ==
    \A d \in Calls : Turn[d] < Turn[c] => result[d] # NoResult
\* An audit row: <<kind, attempt, inputs>>; only a recovery decision's row
\* carries inputs (DecisionInputs), every other row NoInputs.
Audited(e, kind, n) == audit' = [audit EXCEPT ![e] = @ \cup {<<kind, n, NoInputs>>}]
HasRow(e, kind, n) == \E row \in audit[e] : row[1] = kind /\ row[2] = n
\* The inputs column of a decision's row (and of its decided entry).
\* WithoutInputs is an abstraction for the models that do not check
\* AuditRecomputable (they override RowInputs with it in their .cfg:
\* decision rows without inputs).  Sound for every other
\* invariant and for EventuallySettled: no action and no other invariant
\* reads a row's inputs (HasRow reads kind and attempt only), so states that
\* differ only in rows' inputs take the same steps, and a step changes the
\* state exactly when it does with inputs.
RowInputs(i) == i
WithoutInputs(i) == NoInputs
\* A decision taken on call c, with the row it must have in the audit (the
\* history AuditComplete checks against): a recovery decision's row carries
\* its inputs (DecidedOn), every other decision's NoInputs.
Decided(c, kind, n) == decided' = [decided EXCEPT ![c] = @ \cup {<<kind, n, NoInputs>>}]
DecidedOn(c, kind, n, i) ==
    decided' = [decided EXCEPT ![c] = @ \cup {<<kind, n, RowInputs(i)>>}]
\* A succeeded, failed or abandoned outcome of c becomes durable
\* (NoReinvokeAfterKnownOutcome): a human's "give up" is as final as an answer.
OutcomeKnown(c) == knownOutcome' = knownOutcome \cup {c}

(***************************************************************************)
(* The recovery decision: a total function of its inputs, the record      *)
(* DecisionInputs(c) (ledger record, approval state, conversation has a    *)
(* result, policy, legacy per the marker).  The same record is written     *)
(* into the decision's audit row, so anyone can recompute the decision     *)
(* from the row alone (AuditRecomputable).  A record whose argument digest *)
(* disagrees with the call found at its position is a contradiction and    *)
(* fails closed.  The engine applies the same function on resume and after *)
(* a live time-out.  keyRetained: the idempotency key of the execution is  *)
(* still within the tool's declared retention window (the engine knows it  *)
(* from the dispatch time in the record and the clock); past it, the       *)
(* external system may have forgotten the key, so a retry with the same    *)
(* id is no longer deduplicated and the call halts instead.               *)
(***************************************************************************)
DecisionInputs(c) ==
    [status |-> Rec(c).status, attempt |-> Rec(c).attempt,
     digestMatches |-> Rec(c).args = args[c],
     approval |-> approval[ExecId(c)], hasResult |-> result[c] # NoResult,
     policy |-> Policy[c], legacy |-> IsLegacy(c),
     requiresApproval |-> NeedsApproval[c],
     keyRetained |-> ExecId(c) \notin windowPassed]

Decide(i) ==
    IF i.hasResult THEN "skip"
    ELSE IF i.policy = "readonly" THEN "execute"
    ELSE IF i.status # "none" /\ ~i.digestMatches THEN "recovery_required"
    ELSE IF i.status \in {"succeeded", "failed", "abandoned"} THEN "reconstruct"
    ELSE IF i.status = "recovery_required" THEN "recovery_required"
    ELSE IF i.status = "dispatched" THEN
            CASE i.policy = "idempotent" ->
                   IF i.attempt < MaxAttempts /\ i.keyRetained
                   THEN "retry_same_id" ELSE "recovery_required"
              [] i.policy = "reconcile" -> "reconcile"
              [] OTHER -> "recovery_required"
    \* no record from here on
    ELSE IF i.legacy /\ (i.approval = "approved" \/ ~i.requiresApproval)
         THEN "recovery_required"
    ELSE "execute"

DecisionFor(c) == Decide(DecisionInputs(c))

(***************************************************************************)
(* ACTIONS.  Each is its own operator and a disjunct of Next, so that TLC  *)
(* labels trace steps and dumped edges with its name.                      *)
(***************************************************************************)

\* The model emits call c (volatile: the assistant message is in memory).
ProviderEmitCall(c, a) ==
    /\ a \in ArgChoices[c]
    /\ msg[c] = "absent" /\ ~IsLegacy(c) /\ PriorTurnsAnswered(c)
    /\ msg' = [msg EXCEPT ![c] = "volatile"]
    /\ args' = [args EXCEPT ![c] = a]
    /\ UNCHANGED <<result, approval, approvalArgs, ledger, audit, marker, stage>>
    /\ UNCHANGED external /\ UNCHANGED ghosts
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

\* The assistant message holding c is checkpointed.  Nothing is dispatched
\* before this: otherwise a crash could put another call at this position.
\* A fresh call goes through the same recovery decision as a resumed one:
\* with no record at its id, Decide says "execute" (a fresh call has no
\* result and is never legacy), which is the live stage; a call whose id
\* already has a record (the conversation lost an unanswered call and the
\* provider emitted one at its position) is handed to Recover, which
\* compares the record's argument digest with this call's and audits the
\* decision.  Dispatching it live would overwrite the record blindly.
EnginePersistCall(c) ==
    /\ msg[c] = "volatile"
    /\ msg' = [msg EXCEPT ![c] = "durable"]
    /\ stage' = [stage EXCEPT ![c] = IF Rec(c).status = "none" THEN "live"
                                                              ELSE "resume"]
    /\ UNCHANGED <<args, result, approval, approvalArgs, ledger, audit, marker>>
    /\ UNCHANGED external /\ UNCHANGED ghosts
    /\ StoreId(c)
    /\ UNCHANGED <<turnOf, renumbers, repairs>>
    /\ UNCHANGED extVars

\* The approval is parked in the inbox and persisted, for the call's
\* arguments.  An approval at this id for other arguments (given to a call
\* the conversation lost, or still pending for it) is replaced: the human
\* is asked again, for what will be sent.
EngineParkApproval(c) ==
    /\ stage[c] = "live" /\ NeedsApproval[c] /\ NeedsNewApproval(c)
    /\ approval' = [approval EXCEPT ![ExecId(c)] = "pending"]
    /\ approvalArgs' = [approvalArgs EXCEPT ![ExecId(c)] = args[c]]
    /\ UNCHANGED <<msg, args, result, ledger, audit, marker, stage>>
    /\ UNCHANGED external /\ UNCHANGED ghosts
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

HumanApprove(c) ==
    /\ msg[c] = "durable" /\ approval[ExecId(c)] = "pending"
    /\ approval' = [approval EXCEPT ![ExecId(c)] = "approved"]
    \* the human approves what the inbox shows: the parked arguments
    /\ humanApproved' = humanApproved \cup {<<c, approvalArgs[ExecId(c)]>>}
    /\ UNCHANGED <<msg, args, result, approvalArgs, ledger, audit, marker, stage>>
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, invocations, humanRetries, crashes>>
    /\ UNCHANGED <<sent, knownOutcome, sentAfterOutcome, decided>>
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

HumanReject(c) ==
    /\ msg[c] = "durable" /\ approval[ExecId(c)] = "pending"
    /\ approval' = [approval EXCEPT ![ExecId(c)] = "rejected"]
    /\ UNCHANGED <<msg, args, result, approvalArgs, ledger, audit, marker, stage>>
    /\ UNCHANGED external /\ UNCHANGED ghosts
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

\* A rejected approval of these arguments becomes a "denied" tool result
\* (a rejection of other arguments is asked again: EngineParkApproval).
EngineRecordDenied(c) ==
    /\ stage[c] = "live" /\ NeedsApproval[c] /\ approval[ExecId(c)] = "rejected"
    /\ ApprovalFor(c)
    /\ result' = [result EXCEPT ![c] = Result("denied", ExecId(c), args[c])]
    /\ stage' = [stage EXCEPT ![c] = "none"]
    /\ UNCHANGED <<msg, args, approval, approvalArgs, ledger, audit, marker>>
    /\ UNCHANGED external /\ UNCHANGED ghosts
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

(***************************************************************************)
(* A halt never rebinds a record to another call.  The record keeps the    *)
(* argument digest it was written for and, if its outcome was known (a     *)
(* succeeded, failed or abandoned record halted on a digest mismatch), its *)
(* result: the record's result is what says "the outcome of this execution *)
(* was known".  Only a call with no record yet (a legacy call) is bound to *)
(* the arguments at its position by its halt.  HumanMayRetry: a human may  *)
(* send another attempt only of a halted record whose outcome is unknown   *)
(* and whose digest matches the call at its position; elsewhere the only   *)
(* human choices (HumanResolveApplied, HumanResolveAbandon) invoke         *)
(* nothing, and they bind the record to the call they resolve.             *)
(* HaltKeepsRecord is a design switch: FALSE is the old rule (a halt       *)
(* rebinds the record to the call now at its position and a human may      *)
(* retry any halted record), the HaltRebindsRecord twin, which overrides   *)
(* it in its .cfg: no other model has to name it.                          *)
(***************************************************************************)
HaltKeepsRecord == TRUE

Halt(c) ==
    IF HaltKeepsRecord /\ Rec(c).status # "none"
    THEN [Rec(c) EXCEPT !.status = "recovery_required"]
    ELSE [Rec(c) EXCEPT !.status = "recovery_required", !.args = args[c], !.call = c]

HumanMayRetry(c) ==
    ~HaltKeepsRecord \/ (Rec(c).result = NoResult /\ Rec(c).args = args[c])

(***************************************************************************)
(* A human's retry is a durable GRANT, not a dispatch.  HumanResolveRetry  *)
(* writes only its "human_retry" audit row, for the attempt after the      *)
(* halted record's (n+1): the human (an operator's command line, another   *)
(* process) never dispatches.  RetryGranted(c): the grant stands and is    *)
(* unused: the record is still halted at attempt n, its outcome unknown,   *)
(* its digest the call's (HumanMayRetry).  Recover honours it: its halt   *)
(* decision sends the call to the "retry" stage instead of back to the    *)
(* human, and the dispatch of attempt n+1 is authorized "human"         *)
(* (AttemptAuth).  Whichever engine runs Recover next, in the resolving    *)
(* process or after a restart, reads the grant from the ledger store       *)
(* alone.  One grant is at most one attempt: once attempt n+1 is           *)
(* dispatched the record is at n+1 and the row at n+1 grants nothing more; *)
(* a late answer of attempt n makes the outcome known and the grant moot.  *)
(* HonourRetryGrant is the design switch: FALSE is the engine that does    *)
(* not read the grant and halts the call again (twin RetryGrantForgotten:  *)
(* RetryGrantHonoured); a grant read from ANY human_retry row of the       *)
(* execution, not the one for the next attempt, is used twice (twin        *)
(* RetryGrantReused: AtMostOnceEffect).  Both override it in their .cfg.   *)
(***************************************************************************)
HonourRetryGrant == TRUE

RetryGranted(c) ==
    /\ msg[c] = "durable" /\ result[c] = NoResult
    /\ Rec(c).status = "recovery_required" /\ HumanMayRetry(c)
    /\ HasRow(ExecId(c), "human_retry", Rec(c).attempt + 1)

\* dispatched(attempt n) is made durable, with its audit row, BEFORE the
\* adapter is invoked.  Attempt 1 is authorized by the approval (or needs
\* none); a later attempt by the recovery policy or a human's grant ("retry"
\* stage).  Who authorizes the attempt about to be dispatched: a retry is the
\* policy's, or the human's whose grant it uses (RetryGranted).
AttemptAuth(c) == IF stage[c] = "retry" THEN (IF RetryGranted(c) THEN "human" ELSE "policy")
                  ELSE IF NeedsApproval[c] THEN "approval" ELSE "auto"

EnginePersistDispatched(c) ==
    LET e == ExecId(c)
        n == Rec(c).attempt + 1
        auth == AttemptAuth(c)
    IN
    /\ Policy[c] # "readonly" /\ msg[c] = "durable"
    /\ \/ stage[c] = "live" /\ ApprovalOK(c)
       \/ stage[c] = "retry"
    /\ n <= MaxAttempts
    /\ ledger' = [ledger EXCEPT ![e] = [status |-> "dispatched", attempt |-> n,
                      args |-> args[c], auth |-> auth, result |-> NoResult, call |-> c]]
    /\ Audited(e, "dispatch", n)
    /\ stage' = [stage EXCEPT ![c] = "dispatched"]
    /\ UNCHANGED <<msg, args, result, approval, approvalArgs, marker>>
    /\ UNCHANGED external /\ UNCHANGED ghosts
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

\* The adapter is invoked with the execution id: the request is now out.
EngineInvokeAdapter(c) ==
    LET e == ExecId(c) IN
    /\ stage[c] = "dispatched"
    /\ inflight' = [inflight EXCEPT ![e] = @ \cup {Rec(c).attempt}]
    /\ invocations' = [invocations EXCEPT ![c] =
                         @ \cup {<<e, Rec(c).attempt, Rec(c).auth>>}]
    /\ sent' = [sent EXCEPT ![c][Rec(c).attempt] = @ + 1]
    /\ sentAfterOutcome' = [sentAfterOutcome EXCEPT ![c] =
                              IF c \in knownOutcome THEN @ + 1 ELSE @]
    /\ stage' = [stage EXCEPT ![c] = "waiting"]
    /\ UNCHANGED durable /\ UNCHANGED fenced
    /\ UNCHANGED <<applied, humanApproved, humanRetries, crashes>>
    /\ UNCHANGED <<knownOutcome, decided>>
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

\* A readonly tool bypasses the ledger: replaying it is safe.
EngineInvokeReadonly(c) ==
    /\ stage[c] = "live" /\ Policy[c] = "readonly" /\ ApprovalOK(c)
    /\ stage' = [stage EXCEPT ![c] = "got_ok"]
    /\ UNCHANGED durable /\ UNCHANGED external /\ UNCHANGED ghosts
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

(***************************************************************************)
(* The external system processes request n of execution e.  An answer     *)
(* reaches the engine if the engine still waits for that attempt, or if   *)
(* it arrives late (after a time-out) while the call's record is still at  *)
(* that attempt with no outcome: HoldsUnanswered.  The engine then takes   *)
(* it as that attempt's answer and records it (got_ok, got_fail), whether  *)
(* it was about to Recover ("resume"), had halted the call for a human     *)
(* ("none", recovery_required), was reconciling it or held a policy retry *)
(* of it in memory ("retry": the retry is not sent).  Dropping it would    *)
(* leave a human to decide knowing less than the engine did               *)
(* (HumanSeesKnownOutcome).  RecordLateReturn is the design switch: FALSE *)
(* is the old rule, which discarded every answer after a time-out (twin    *)
(* LateReturnDropped); it overrides the definition in its .cfg.           *)
(***************************************************************************)
RecordLateReturn == TRUE
Waiting(c, e, n) == ExecId(c) = e /\ stage[c] = "waiting" /\ Rec(c).attempt = n
\* The engine holds call c's record of e at attempt n with no outcome, and
\* does not wait for the attempt (it timed out): a late answer of n is still
\* this attempt's answer.  The record is c's own (its digest matches): one
\* written for a call the conversation lost is not answered through the
\* call now at its position.
HoldsUnanswered(c, e, n) ==
    /\ ExecId(c) = e /\ msg[c] = "durable" /\ result[c] = NoResult
    /\ Rec(c).attempt = n /\ Rec(c).status \in {"dispatched", "recovery_required"}
    /\ Rec(c).args = args[c]
    /\ stage[c] \in {"resume", "none", "reconciling", "retry"}
Takes(c, e, n) ==
    Waiting(c, e, n) \/ (RecordLateReturn /\ HoldsUnanswered(c, e, n))
Answer(e, n, s) ==
    stage' = [c \in Calls |-> IF Takes(c, e, n) THEN s ELSE stage[c]]
\* An engine waits for attempt n of e, or holds its record at n unanswered:
\* the answer is taken.
Delivered(e, n) == \E c \in Calls : Takes(c, e, n)
Fenced(e, n) == n <= fenced[e]
\* The external system's own property of the key: not what the engine reads.
Dedups(e) == \E c \in Calls : Policy[c] = "idempotent" /\
                 \E t \in Renumberings(c) : IdAt(c, t) = e
\* The external system still holds e's idempotency key: it applied e and
\* has not forgotten the key since (ExternalExpireKey).
KeyRemembered(e) == Dedups(e) /\ applied[e] >= 1 /\ e \notin keyForgotten
\* Call c sent attempt n of e (a ghost: the request carries only e and n;
\* with ids keyed by tool_call_id alone two calls may send under one e).
\* Read from the requests c sent, not from the id c uses now: with ids
\* re-derived from a renumbered position (IdFromPosition) they differ.
Sender(c, e, n) == \E a \in Auths : <<e, n, a>> \in invocations[c]
\* The request of call c is applied, or deduplicated on the key: then it
\* has no effect, and in particular none of c's own.  Applying stores the
\* key (again).
Apply(c, e) ==
    IF KeyRemembered(e)
    THEN UNCHANGED <<applied, effects, keyForgotten>>
    ELSE /\ applied' = [applied EXCEPT ![e] = @ + 1]
         /\ effects' = [effects EXCEPT ![c] = @ + 1]
         /\ keyForgotten' = keyForgotten \ {e}

\* Applied (or deduplicated on the execution id) and answered to the engine
\* that waits for this attempt.
ExternalApply(e) ==
    \E n \in inflight[e], c \in Calls :
      /\ Sender(c, e, n) /\ ~Fenced(e, n) /\ Delivered(e, n)
      /\ inflight' = [inflight EXCEPT ![e] = @ \ {n}]
      /\ Apply(c, e)
      /\ Answer(e, n, "got_ok")
      /\ UNCHANGED durable /\ UNCHANGED fenced /\ UNCHANGED windowPassed
      /\ UNCHANGED droppedAnswers
      /\ UNCHANGED <<invocations, humanApproved, humanRetries, crashes>>
      /\ UNCHANGED <<sent, knownOutcome, sentAfterOutcome, decided>>
      /\ UNCHANGED positions

\* Applied, but the answer is lost (time-out, connection reset).
ExternalApplyLoseAnswer(e) ==
    \E n \in inflight[e], c \in Calls :
      /\ Sender(c, e, n) /\ ~Fenced(e, n)
      /\ inflight' = [inflight EXCEPT ![e] = @ \ {n}]
      /\ Apply(c, e)
      /\ UNCHANGED durable /\ UNCHANGED stage /\ UNCHANGED fenced
      /\ UNCHANGED <<windowPassed, droppedAnswers>>
      /\ UNCHANGED <<invocations, humanApproved, humanRetries, crashes>>
      /\ UNCHANGED <<sent, knownOutcome, sentAfterOutcome, decided>>
      /\ UNCHANGED positions

\* A definite failure: known not applied (e.g. rejected before sending).
\* An idempotent system that already applied e answers with that result.
ExternalRejectDefinite(e) ==
    \E n \in inflight[e] :
      /\ ~Fenced(e, n) /\ Delivered(e, n)
      /\ ~KeyRemembered(e)
      /\ inflight' = [inflight EXCEPT ![e] = @ \ {n}]
      /\ Answer(e, n, "got_fail")
      /\ UNCHANGED durable /\ UNCHANGED fenced /\ UNCHANGED ghosts
      /\ UNCHANGED positions
      /\ UNCHANGED extVars

\* A late request of a fenced attempt is dropped without effect.
ExternalDropFenced(e) ==
    \E n \in inflight[e] :
      /\ Fenced(e, n)
      /\ inflight' = [inflight EXCEPT ![e] = @ \ {n}]
      /\ UNCHANGED durable /\ UNCHANGED stage /\ UNCHANGED fenced
      /\ UNCHANGED ghosts /\ UNCHANGED extVars
      /\ UNCHANGED positions

(***************************************************************************)
(* Key answers (docs/protocol.md#real-apis-answers).  A real API that      *)
(* deduplicates on an idempotency key answers a request under a key it    *)
(* knows in more ways than "applied" and "rejected"; each answer below     *)
(* consumes the request WITHOUT applying it, and none of them says whether *)
(* the execution's effect happened:                                        *)
(*  - ExternalAnswerInFlight: "in flight" (409 Conflict): another request *)
(*    under the key is still being processed, and may still be applied;   *)
(*  - ExternalAnswerParamsDiffer: "parameters differ" (Stripe's           *)
(*    idempotency_error, EC2's IdempotentParameterMismatch): the key holds *)
(*    an earlier request whose body differs (under our own key: an adapter *)
(*    whose bodies are not byte-stable across attempts, or two calls       *)
(*    sharing a key: a bug either way), processed with an outcome the      *)
(*    engine does not know;                                               *)
(*  - ExternalReplayFailure: the key holds the FAILURE answer of an        *)
(*    earlier request (Stripe replays a stored 500), whose effect may have *)
(*    been applied.  A stored failure the API guarantees had no effect is  *)
(*    a definite rejection, replayed or not: ExternalRejectDefinite.        *)
(* The spec does not model request bodies or stored answers: the API may  *)
(* answer the last two to any request under a key it remembers (an over-  *)
(* approximation, sound for safety).  The adapter seam classifies each as  *)
(* UNKNOWN (toolledger.KeyInFlight, KeyParamsDiffer, ReplayedFailure): the *)
(* engine waiting for the attempt treats it as a time-out ("resume") and   *)
(* Recover decides (an idempotent call retries with the SAME key, or halts *)
(* for a human).  InFlightAnswer, ParamsDifferAnswer and                   *)
(* ReplayedFailureAnswer are the classification, a design switch: a twin   *)
(* overrides one with "applied" (the adapter takes the answer for success) *)
(* or "new_key" (the adapter re-sends under a fresh key, as EC2's docs     *)
(* suggest for a mismatch: the API applies it as a new request, with no    *)
(* key to deduplicate it against the earlier effect).  A key answer is    *)
(* modelled for the attempt the engine waits for only: one that arrives   *)
(* after the time-out tells the engine nothing it does not know already   *)
(* (unknown), and such a request is left to the other external actions.  *)
(* KeyAnswers is FALSE in every model but the key-answer ones (they        *)
(* override it in their .cfg): none of the three actions is then enabled.  *)
(***************************************************************************)
KeyAnswers == FALSE
InFlightAnswer == "unknown"
ParamsDifferAnswer == "unknown"
ReplayedFailureAnswer == "unknown"

\* The answer k ("unknown", "applied", "new_key") of attempt n of e reaches
\* call c, which waits for it.
TakeKeyAnswer(c, k) ==
    /\ stage' = [stage EXCEPT ![c] = IF k = "unknown" THEN "resume" ELSE "got_ok"]
    /\ effects' = IF k = "new_key" THEN [effects EXCEPT ![c] = @ + 1] ELSE effects
    /\ UNCHANGED durable /\ UNCHANGED fenced
    /\ UNCHANGED <<applied, windowPassed, keyForgotten, droppedAnswers>>
    /\ UNCHANGED <<invocations, humanApproved, humanRetries, crashes>>
    /\ UNCHANGED <<sent, knownOutcome, sentAfterOutcome, decided>>
    /\ UNCHANGED positions

ExternalAnswerInFlight(e) ==
    \E n \in inflight[e], c \in Calls :
      /\ KeyAnswers /\ Dedups(e) /\ ~KeyRemembered(e)
      /\ ~Fenced(e, n) /\ Waiting(c, e, n) /\ Sender(c, e, n)
      /\ \E m \in inflight[e] : m # n        \* the other request, being processed
      /\ inflight' = [inflight EXCEPT ![e] = @ \ {n}]
      /\ TakeKeyAnswer(c, InFlightAnswer)

ExternalAnswerParamsDiffer(e) ==
    \E n \in inflight[e], c \in Calls :
      /\ KeyAnswers /\ KeyRemembered(e)
      /\ ~Fenced(e, n) /\ Waiting(c, e, n) /\ Sender(c, e, n)
      /\ inflight' = [inflight EXCEPT ![e] = @ \ {n}]
      /\ TakeKeyAnswer(c, ParamsDifferAnswer)

ExternalReplayFailure(e) ==
    \E n \in inflight[e], c \in Calls :
      /\ KeyAnswers /\ KeyRemembered(e)
      /\ ~Fenced(e, n) /\ Waiting(c, e, n) /\ Sender(c, e, n)
      /\ inflight' = [inflight EXCEPT ![e] = @ \ {n}]
      /\ TakeKeyAnswer(c, ReplayedFailureAnswer)

(***************************************************************************)
(* EngineDiscardLateReturn: the external system processes attempt n of e   *)
(* (applies it, or rejects it definitely) and returns, but the engine      *)
(* takes it for no call (~Delivered): it belongs to an older attempt (a    *)
(* retry was dispatched since), or to a call the conversation no longer    *)
(* holds.  The engine discards it: the return never becomes another        *)
(* attempt's answer, so no stage changes (the effect, if applied, is what  *)
(* Recover and the invariants must account for).  ASSUMPTION: the adapter *)
(* seam delivers a return only to the attempt that sent it (the core       *)
(* refuses any other).  The ghost droppedAnswers keeps an applied answer   *)
(* discarded while the engine held its attempt unanswered                  *)
(* (HoldsUnanswered): only the old rule (RecordLateReturn = FALSE) does    *)
(* that.                                                                   *)
(***************************************************************************)
EngineDiscardLateReturn(e) ==
    \E n \in inflight[e], c \in Calls :
      /\ Sender(c, e, n) /\ ~Fenced(e, n) /\ ~Delivered(e, n)
      /\ inflight' = [inflight EXCEPT ![e] = @ \ {n}]
      /\ \/ /\ Apply(c, e)                   \* applied, the "ok" discarded
            /\ droppedAnswers' =
                 IF \E d \in Calls : HoldsUnanswered(d, e, n)
                 THEN droppedAnswers \cup {<<e, n>>} ELSE droppedAnswers
         \/ /\ ~KeyRemembered(e)            \* rejected, the "error" discarded
            /\ UNCHANGED <<applied, effects, keyForgotten, droppedAnswers>>
      /\ UNCHANGED durable /\ UNCHANGED stage /\ UNCHANGED fenced
      /\ UNCHANGED windowPassed
      /\ UNCHANGED <<invocations, humanApproved, humanRetries, crashes>>
      /\ UNCHANGED <<sent, knownOutcome, sentAfterOutcome, decided>>
      /\ UNCHANGED positions

(***************************************************************************)
(* Key retention.  Time is abstract: RetentionWindowPasses(e) is the clock *)
(* passing the end of the retention window the tool declared, counted from *)
(* the execution's first dispatch (the earliest time its key can have     *)
(* been stored: conservative for every later attempt).  From then on the   *)
(* engine knows the key may be gone (DecisionInputs.keyRetained), and the  *)
(* external system MAY forget it (ExternalExpireKey): a request with the   *)
(* same id is then applied anew.  ASSUMPTION: the window the tool declares *)
(* is shorter than the external system's retention by a margin that covers *)
(* a retry's whole path: a retry the engine decided while the key was      *)
(* retained is sent and reaches the external system (or is lost) before   *)
(* the key is forgotten.  So the key is not forgotten while a request      *)
(* under it is in flight or an engine holds a retry of it in memory        *)
(* (without the margin a retry decided just in time could land after the   *)
(* expiry).  KeysExpire is FALSE in every model but                        *)
(* the key-retention ones (they override it in their .cfg): keys are then  *)
(* kept forever and neither action is enabled.                             *)
(***************************************************************************)
KeysExpire == FALSE

RetentionWindowPasses(e) ==
    /\ KeysExpire /\ e \notin windowPassed /\ ledger[e].status # "none"
    /\ \E c \in Calls : ExecId(c) = e /\ Policy[c] = "idempotent"
    /\ windowPassed' = windowPassed \cup {e}
    /\ UNCHANGED durable /\ UNCHANGED stage /\ UNCHANGED external
    /\ UNCHANGED ghosts /\ UNCHANGED <<effects, keyForgotten, droppedAnswers>>
    /\ UNCHANGED positions

ExternalExpireKey(e) ==
    /\ e \in windowPassed /\ KeyRemembered(e) /\ inflight[e] = {}
    /\ \A c \in Calls : ExecId(c) = e => stage[c] \notin {"retry", "dispatched", "waiting"}
    /\ keyForgotten' = keyForgotten \cup {e}
    /\ UNCHANGED durable /\ UNCHANGED stage /\ UNCHANGED external
    /\ UNCHANGED ghosts /\ UNCHANGED <<effects, windowPassed, droppedAnswers>>
    /\ UNCHANGED positions

\* succeeded(result) is made durable immediately after the adapter returns.
EngineRecordSucceeded(c) ==
    LET e == ExecId(c) IN
    /\ stage[c] = "got_ok" /\ Policy[c] # "readonly"
    /\ ledger' = [ledger EXCEPT ![e].status = "succeeded",
                                ![e].result = Result("ok", e, Rec(c).args)]
    /\ stage' = [stage EXCEPT ![c] = "recorded"]
    /\ OutcomeKnown(c)
    /\ UNCHANGED <<msg, args, result, approval, approvalArgs, audit, marker>>
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, invocations, humanApproved, humanRetries, crashes,
                   sent, sentAfterOutcome, decided>>
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

\* failed(error) is made durable for a definite, known-not-applied failure.
EngineRecordFailed(c) ==
    LET e == ExecId(c) IN
    /\ stage[c] = "got_fail"
    /\ ledger' = [ledger EXCEPT ![e].status = "failed",
                                ![e].result = Result("error", e, Rec(c).args)]
    /\ stage' = [stage EXCEPT ![c] = "recorded"]
    /\ OutcomeKnown(c)
    /\ UNCHANGED <<msg, args, result, approval, approvalArgs, audit, marker>>
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, invocations, humanApproved, humanRetries, crashes,
                   sent, sentAfterOutcome, decided>>
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

\* The role="tool" result is appended to the conversation and checkpointed:
\* from the ledger record, or (readonly) from the answer in memory.
EngineAppendResult(c) ==
    /\ \/ stage[c] = "recorded"
       \/ stage[c] = "got_ok" /\ Policy[c] = "readonly"
    /\ result' = [result EXCEPT ![c] =
                    IF Policy[c] = "readonly" THEN Result("ok", ExecId(c), args[c])
                    ELSE Rec(c).result]
    /\ stage' = [stage EXCEPT ![c] = "none"]
    /\ UNCHANGED <<msg, args, approval, approvalArgs, ledger, audit, marker>>
    /\ UNCHANGED external /\ UNCHANGED ghosts
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

\* The live engine gives up waiting: the outcome is unknown, exactly as
\* after a crash, so the same recovery decision applies.
EngineTimeout(c) ==
    /\ stage[c] = "waiting"
    /\ stage' = [stage EXCEPT ![c] = "resume"]
    /\ UNCHANGED durable /\ UNCHANGED external /\ UNCHANGED ghosts
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

(***************************************************************************)
(* Recover: apply the recovery decision to call c, and audit it with the  *)
(* attempt it was made for, in the same transaction.                      *)
(***************************************************************************)
StageAfter(d) ==
    CASE d = "skip" -> "none"
      [] d = "execute" -> "live"
      [] d = "reconstruct" -> "recorded"
      [] d = "retry_same_id" -> "retry"
      [] d = "reconcile" -> "reconciling"
      [] d = "recovery_required" -> "none"


\* The decision's row, with its inputs.  EVERY decision is kept: a decision
\* taken again for the same attempt (after another crash, or after a human
\* resolved the call) is a row of its own, so AuditRecomputable and
\* AuditComplete are about every decision, not the first one per attempt.
\* (The store appends each row with its own id; two decisions with the same
\* kind, attempt and inputs are one row here: they say the same.)  The old
\* rule kept only the first row per (execution, kind, attempt), which hides
\* a repeated, wrong decision: twins AuditFirstRowOnly, ReHaltAbandoned.
AuditDecision(e, d, n, i) == audit' = [audit EXCEPT ![e] = @ \cup {<<d, n, RowInputs(i)>>}]

Recover(c) ==
    LET e == ExecId(c)
        d == DecisionFor(c)
    IN
    /\ stage[c] = "resume"
    \* a halt with a human's unused retry grant: the retry, not the human again
    /\ stage' = [stage EXCEPT ![c] = IF d = "recovery_required" /\ HonourRetryGrant
                                        /\ RetryGranted(c)
                                     THEN "retry" ELSE StageAfter(d)]
    /\ ledger' = IF d = "recovery_required" /\ Rec(c).status # "recovery_required"
                 THEN [ledger EXCEPT ![e] = Halt(c)] ELSE ledger
    /\ IF Policy[c] = "readonly" \/ d = "skip"
       THEN UNCHANGED <<audit, decided>>
       ELSE /\ AuditDecision(e, d, Rec(c).attempt, DecisionInputs(c))
            /\ DecidedOn(c, d, Rec(c).attempt, DecisionInputs(c))
    /\ UNCHANGED <<msg, args, result, approval, approvalArgs, marker>>
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, invocations, humanApproved, humanRetries, crashes,
                   sent, knownOutcome, sentAfterOutcome>>
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

(***************************************************************************)
(* Reconcile: ask the connector whether execution e was applied.  "Not    *)
(* applied" is definite only because the connector fences the attempts    *)
(* made so far (a late original must not land afterwards); the fence is   *)
(* per attempt, so the retry (attempt n+1) is not rejected by it.         *)
(* CONNECTOR OBLIGATION: the query and the fence are ONE atomic step at   *)
(* the external system (EngineReconcileNotApplied reads applied[e] and     *)
(* sets fenced[e] together).  A connector that answers first and fences    *)
(* later lets a late original land in between: twin QueryThenFence.       *)
(***************************************************************************)
\* The connector's answer comes from the external system's own state.
ConnectorSaysApplied(e) == applied[e] >= 1

EngineReconcileApplied(c) ==
    LET e == ExecId(c) IN
    /\ stage[c] = "reconciling" /\ ConnectorSaysApplied(e)
    /\ ledger' = [ledger EXCEPT ![e].status = "succeeded",
                                ![e].result = Result("ok", e, Rec(c).args)]
    /\ Audited(e, "reconcile_applied", Rec(c).attempt)
    /\ Decided(c, "reconcile_applied", Rec(c).attempt)
    /\ OutcomeKnown(c)
    /\ stage' = [stage EXCEPT ![c] = "recorded"]
    /\ UNCHANGED <<msg, args, result, approval, approvalArgs, marker>>
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, invocations, humanApproved, humanRetries, crashes,
                   sent, sentAfterOutcome>>
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

EngineReconcileNotApplied(c) ==
    LET e == ExecId(c) IN
    /\ stage[c] = "reconciling" /\ applied[e] = 0
    /\ Rec(c).attempt < MaxAttempts
    /\ fenced' = IF FenceOnReconcile
                 THEN [fenced EXCEPT ![e] = Rec(c).attempt] ELSE fenced
    /\ Audited(e, "reconcile_not_applied", Rec(c).attempt)
    /\ Decided(c, "reconcile_not_applied", Rec(c).attempt)
    /\ stage' = [stage EXCEPT ![c] = "retry"]
    /\ UNCHANGED <<msg, args, result, approval, approvalArgs, ledger, marker>>
    /\ UNCHANGED inflight
    /\ UNCHANGED <<applied, invocations, humanApproved, humanRetries, crashes,
                   sent, knownOutcome, sentAfterOutcome>>
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

\* The connector cannot tell (unreachable, or the retry budget is spent).
EngineReconcileUnknown(c) ==
    LET e == ExecId(c) IN
    /\ stage[c] = "reconciling"
    /\ ledger' = [ledger EXCEPT ![e] = Halt(c)]
    /\ Audited(e, "reconcile_unknown", Rec(c).attempt)
    /\ Decided(c, "reconcile_unknown", Rec(c).attempt)
    /\ stage' = [stage EXCEPT ![c] = "none"]
    /\ UNCHANGED <<msg, args, result, approval, approvalArgs, marker>>
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, invocations, humanApproved, humanRetries, crashes,
                   sent, knownOutcome, sentAfterOutcome>>
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

(***************************************************************************)
(* A human resolves a recovery_required item.  Resolving it resumes the    *)
(* session, as resolving an inbox item does in the engine.                 *)
(***************************************************************************)
HumanResolveApplied(c) ==
    LET e == ExecId(c) IN
    /\ msg[c] = "durable" /\ result[c] = NoResult
    /\ Rec(c).status = "recovery_required" /\ stage[c] = "none"
    /\ ledger' = [ledger EXCEPT ![e].status = "succeeded",
                                ![e].result = Result("human", e, args[c]),
                                ![e].args = args[c], ![e].call = c]
    /\ Audited(e, "human_applied", Rec(c).attempt)
    /\ Decided(c, "human_applied", Rec(c).attempt)
    /\ OutcomeKnown(c)
    /\ stage' = [stage EXCEPT ![c] = "resume"]
    /\ UNCHANGED <<msg, args, result, approval, approvalArgs, marker>>
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, invocations, humanApproved, humanRetries, crashes,
                   sent, sentAfterOutcome>>
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

\* The human grants one more attempt (n+1, same id): a durable grant, the
\* audit row only; the engine re-decides (Recover honours the grant).  One
\* grant per attempt: a call whose grant stands is not halted for a human.
HumanResolveRetry(c) ==
    LET e == ExecId(c)
        n == Rec(c).attempt + 1
    IN
    /\ msg[c] = "durable" /\ result[c] = NoResult
    /\ Rec(c).status = "recovery_required" /\ stage[c] = "none" /\ n <= MaxAttempts
    /\ HumanMayRetry(c) /\ ~HasRow(e, "human_retry", n)
    /\ Audited(e, "human_retry", n)
    /\ Decided(c, "human_retry", n)
    /\ humanRetries' = [humanRetries EXCEPT ![e] = @ + 1]
    /\ stage' = [stage EXCEPT ![c] = "resume"]
    /\ UNCHANGED <<msg, args, result, approval, approvalArgs, ledger, marker>>
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, invocations, humanApproved, crashes,
                   sent, knownOutcome, sentAfterOutcome>>
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

HumanResolveAbandon(c) ==
    LET e == ExecId(c) IN
    /\ msg[c] = "durable" /\ result[c] = NoResult
    /\ Rec(c).status = "recovery_required" /\ stage[c] = "none"
    /\ ledger' = [ledger EXCEPT ![e].status = "abandoned",
                                ![e].result = Result("abandoned", e, args[c]),
                                ![e].args = args[c], ![e].call = c]
    /\ Audited(e, "human_abandon", Rec(c).attempt)
    /\ Decided(c, "human_abandon", Rec(c).attempt)
    /\ OutcomeKnown(c)
    /\ stage' = [stage EXCEPT ![c] = "resume"]
    /\ UNCHANGED <<msg, args, result, approval, approvalArgs, marker>>
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, invocations, humanApproved, humanRetries, crashes,
                   sent, sentAfterOutcome>>
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

(***************************************************************************)
(* HumanCancel: a user's Stop after approval (or for a call that needs     *)
(* none) but before dispatch.  In one step the call gets a "cancelled"     *)
(* result and a "human_cancel" audit row, and the engine must re-decide it *)
(* from the durable state ("resume"), as after resolving an inbox item:    *)
(* Decide then says "skip" because the call has a result, so it is never   *)
(* dispatched, and its approval is consumed (nothing reads an approval but *)
(* the dispatch from stage "live", which a call with a result never        *)
(* reaches again).  CancelStopsEngine is a design switch for the           *)
(* CancelIgnored twin: FALSE is an engine whose dispatch loop does not     *)
(* look at the Stop (it keeps its in-memory "live" stage); that twin       *)
(* overrides the definition in its .cfg: no other model has to name it.    *)
(***************************************************************************)
CancelStopsEngine == TRUE

HumanCancel(c) ==
    /\ msg[c] = "durable" /\ stage[c] = "live" /\ result[c] = NoResult
    /\ ApprovalOK(c)
    /\ Policy[c] = "readonly" \/ Rec(c).status = "none"
    /\ result' = [result EXCEPT ![c] = Result("cancelled", ExecId(c), args[c])]
    /\ stage' = IF CancelStopsEngine THEN [stage EXCEPT ![c] = "resume"] ELSE stage
    /\ Audited(ExecId(c), "human_cancel", Rec(c).attempt)
    /\ Decided(c, "human_cancel", Rec(c).attempt)
    /\ UNCHANGED <<msg, args, approval, approvalArgs, ledger, marker>>
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, invocations, humanApproved, humanRetries, crashes,
                   sent, knownOutcome, sentAfterOutcome>>
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

(***************************************************************************)
(* Crash: the engine process dies and restarts.  Only volatile state is   *)
(* lost: calls not yet checkpointed vanish, and every durable call without *)
(* a result must be recovered.  Requests already sent stay in flight.     *)
(***************************************************************************)
Crash ==
    /\ crashes < MaxCrashes
    /\ crashes' = crashes + 1
    /\ msg' = [c \in Calls |-> IF msg[c] = "volatile" THEN "absent" ELSE msg[c]]
    /\ args' = [c \in Calls |-> IF msg[c] = "volatile" THEN "none" ELSE args[c]]
    /\ stage' = [c \in Calls |->
                   IF msg[c] = "durable" /\ result[c] = NoResult
                   THEN "resume" ELSE "none"]
    /\ UNCHANGED <<result, approval, approvalArgs, ledger, audit, marker>>
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, invocations, humanApproved, humanRetries>>
    /\ UNCHANGED <<sent, knownOutcome, sentAfterOutcome, decided>>
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

(***************************************************************************)
(* The conversation's own rewrites (environment actions, no fairness).     *)
(* Both happen when the engine loads the conversation after a restart, to  *)
(* an unanswered durable call the loader hands to Recover (stage resume).  *)
(* Neither touches the ledger store, which is why the two stores can       *)
(* disagree.                                                               *)
(***************************************************************************)
\* The load-time pairing repair removes an unanswered call from the
\* conversation (openworker rewrites history on load so that every call has
\* a result); the provider may then emit another call at that position.
ConversationRepair(c) ==
    /\ repairs < MaxRepairs
    /\ msg[c] = "durable" /\ result[c] = NoResult /\ stage[c] = "resume"
    /\ ~IsLegacy(c)
    /\ repairs' = repairs + 1
    /\ msg' = [msg EXCEPT ![c] = "absent"]
    /\ args' = [args EXCEPT ![c] = "none"]
    /\ stage' = [stage EXCEPT ![c] = "none"]
    /\ UNCHANGED <<result, approval, approvalArgs, ledger, audit, marker>>
    /\ UNCHANGED external /\ UNCHANGED ghosts
    /\ UNCHANGED <<turnOf, storedId, renumbers>>
    /\ UNCHANGED extVars

\* Compaction or a repair changes the number of messages before an
\* unanswered call, so the turn the engine derives from the conversation's
\* length moves (by one per step here).
ConversationRenumber(c) ==
    /\ renumbers < MaxRenumbers
    /\ msg[c] = "durable" /\ result[c] = NoResult /\ stage[c] = "resume"
    /\ renumbers' = renumbers + 1
    /\ turnOf' = [turnOf EXCEPT ![c] = @ + 1]
    /\ UNCHANGED durable /\ UNCHANGED stage
    /\ UNCHANGED external /\ UNCHANGED ghosts
    /\ UNCHANGED <<storedId, repairs>>
    /\ UNCHANGED extVars

Next ==
    \/ \E c \in Calls, a \in Args : ProviderEmitCall(c, a)
    \/ \E c \in Calls : EnginePersistCall(c)
    \/ \E c \in Calls : EngineParkApproval(c)
    \/ \E c \in Calls : HumanApprove(c)
    \/ \E c \in Calls : HumanReject(c)
    \/ \E c \in Calls : EngineRecordDenied(c)
    \/ \E c \in Calls : EnginePersistDispatched(c)
    \/ \E c \in Calls : EngineInvokeAdapter(c)
    \/ \E c \in Calls : EngineInvokeReadonly(c)
    \/ \E e \in ExecIds : ExternalApply(e)
    \/ \E e \in ExecIds : ExternalApplyLoseAnswer(e)
    \/ \E e \in ExecIds : ExternalRejectDefinite(e)
    \/ \E e \in ExecIds : ExternalDropFenced(e)
    \/ \E e \in ExecIds : ExternalAnswerInFlight(e)
    \/ \E e \in ExecIds : ExternalAnswerParamsDiffer(e)
    \/ \E e \in ExecIds : ExternalReplayFailure(e)
    \/ \E e \in ExecIds : EngineDiscardLateReturn(e)
    \/ \E e \in ExecIds : RetentionWindowPasses(e)
    \/ \E e \in ExecIds : ExternalExpireKey(e)
    \/ \E c \in Calls : EngineRecordSucceeded(c)
    \/ \E c \in Calls : EngineRecordFailed(c)
    \/ \E c \in Calls : EngineAppendResult(c)
    \/ \E c \in Calls : EngineTimeout(c)
    \/ \E c \in Calls : Recover(c)
    \/ \E c \in Calls : EngineReconcileApplied(c)
    \/ \E c \in Calls : EngineReconcileNotApplied(c)
    \/ \E c \in Calls : EngineReconcileUnknown(c)
    \/ \E c \in Calls : HumanResolveApplied(c)
    \/ \E c \in Calls : HumanResolveRetry(c)
    \/ \E c \in Calls : HumanResolveAbandon(c)
    \/ \E c \in Calls : HumanCancel(c)
    \/ Crash
    \/ \E c \in Calls : ConversationRepair(c)
    \/ \E c \in Calls : ConversationRenumber(c)

(***************************************************************************)
(* Steps of several engine processes (spec/ConcurrentResumers.tla), which *)
(* one engine never takes: NOT in Next, so no model of this module takes   *)
(* them and every state count stays; ConcurrentNext is the main spec's     *)
(* image of the concurrent one, which model/MCConcurrentRefinesMain.tla    *)
(* checks the concurrent models against                                    *)
(* (docs/protocol.md#concurrent-resumers).                                 *)
(*  - EngineZombieSend: an engine declared dead (its lease taken: the main *)
(*    spec's Crash) between its dispatched commit and its send still sends *)
(*    attempt n, dispatched (its row is there) and never sent.  Its        *)
(*    authorization is the one its dispatch had: a human's grant for n,    *)
(*    the approval for attempt 1, else the policy;                        *)
(*  - ConnectorFenceUnrecorded: a query-and-fence for attempt n (a        *)
(*    reconcile decided for n) answered "not applied" and fenced, and the *)
(*    engine has not recorded the answer (its commit is                   *)
(*    EngineReconcileNotApplied; it never comes if the engine that asked  *)
(*    crashed or was declared dead);                                       *)
(*  - HumanResolvedRecorded: the process that shows a halted call records *)
(*    the human's "applied" or "abandon" and appends it, without deciding  *)
(*    again (the main spec's human resolution resumes, and Recover         *)
(*    reconstructs).                                                       *)
(***************************************************************************)
ZombieAuth(c, n) ==
    IF HasRow(ExecId(c), "human_retry", n) THEN "human"
    ELSE IF n = 1 THEN (IF NeedsApproval[c] THEN "approval" ELSE "auto")
    ELSE "policy"

EngineZombieSend(c, n) ==
    LET e == ExecId(c) IN
    /\ Policy[c] # "readonly" /\ n \in 1..MaxAttempts
    /\ HasRow(e, "dispatch", n) /\ sent[c][n] = 0
    /\ inflight' = [inflight EXCEPT ![e] = @ \cup {n}]
    /\ invocations' = [invocations EXCEPT ![c] = @ \cup {<<e, n, ZombieAuth(c, n)>>}]
    /\ sent' = [sent EXCEPT ![c][n] = @ + 1]
    /\ sentAfterOutcome' = [sentAfterOutcome EXCEPT ![c] =
                              IF c \in knownOutcome THEN @ + 1 ELSE @]
    /\ UNCHANGED durable /\ UNCHANGED stage /\ UNCHANGED fenced
    /\ UNCHANGED <<applied, humanApproved, humanRetries, crashes>>
    /\ UNCHANGED <<knownOutcome, decided>>
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

ConnectorFenceUnrecorded(c, n) ==
    LET e == ExecId(c) IN
    /\ FenceOnReconcile /\ applied[e] = 0 /\ n < MaxAttempts
    /\ n <= Rec(c).attempt /\ HasRow(e, "reconcile", n)
    /\ fenced' = [fenced EXCEPT ![e] = IF n > @ THEN n ELSE @]
    /\ UNCHANGED durable /\ UNCHANGED stage /\ UNCHANGED inflight
    /\ UNCHANGED ghosts /\ UNCHANGED positions /\ UNCHANGED extVars

HumanResolvedRecorded(c) ==
    LET e == ExecId(c) IN
    /\ msg[c] = "durable" /\ result[c] = NoResult
    /\ Rec(c).status = "recovery_required" /\ stage[c] = "none"
    /\ \E k \in {"human_applied", "human_abandon"} :
         /\ ledger' = [ledger EXCEPT
                         ![e].status = IF k = "human_applied" THEN "succeeded"
                                       ELSE "abandoned",
                         ![e].result = Result(IF k = "human_applied" THEN "human"
                                              ELSE "abandoned", e, args[c]),
                         ![e].args = args[c], ![e].call = c]
         /\ Audited(e, k, Rec(c).attempt)
         /\ Decided(c, k, Rec(c).attempt)
    /\ OutcomeKnown(c)
    /\ stage' = [stage EXCEPT ![c] = "recorded"]
    /\ UNCHANGED <<msg, args, result, approval, approvalArgs, marker>>
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, invocations, humanApproved, humanRetries, crashes,
                   sent, sentAfterOutcome>>
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

ConcurrentNext ==
    \/ Next
    \/ \E c \in Calls, n \in 1..MaxAttempts : EngineZombieSend(c, n)
    \/ \E c \in Calls, n \in 1..MaxAttempts : ConnectorFenceUnrecorded(c, n)
    \/ \E c \in Calls : HumanResolvedRecorded(c)

(***************************************************************************)
(* Fairness: the engine, the provider and the engine's time-out are weakly *)
(* fair; humans eventually answer approvals and recovery items (without    *)
(* that, EventuallySettled cannot hold and we say so here rather than      *)
(* weaken the property).  Crashes and the external system get no fairness: *)
(* a request may never be answered, which is what the time-out is for.     *)
(***************************************************************************)
EngineStep(c) ==
    \/ EnginePersistCall(c) \/ EngineParkApproval(c) \/ EngineRecordDenied(c)
    \/ EnginePersistDispatched(c) \/ EngineInvokeAdapter(c)
    \/ EngineInvokeReadonly(c) \/ EngineRecordSucceeded(c)
    \/ EngineRecordFailed(c) \/ EngineAppendResult(c) \/ EngineTimeout(c)
    \/ Recover(c) \/ EngineReconcileApplied(c) \/ EngineReconcileNotApplied(c)
    \/ EngineReconcileUnknown(c)
HumanStep(c) ==
    \/ HumanApprove(c) \/ HumanReject(c) \/ HumanResolveApplied(c)
    \/ HumanResolveRetry(c) \/ HumanResolveAbandon(c)

Fairness ==
    /\ \A c \in Calls : WF_vars(\E a \in ArgChoices[c] : ProviderEmitCall(c, a))
    /\ \A c \in Calls : WF_vars(EngineStep(c))
    /\ \A c \in Calls : WF_vars(HumanStep(c))

Spec == Init /\ [][Next]_vars
FairSpec == Spec /\ Fairness

\* The same without fairness for humans: EventuallySettled must then fail
\* (a human who never answers leaves the call pending forever).
EngineFairSpec ==
    /\ Spec
    /\ \A c \in Calls : WF_vars(\E a \in ArgChoices[c] : ProviderEmitCall(c, a))
    /\ \A c \in Calls : WF_vars(EngineStep(c))

(***************************************************************************)
(* The same fairness, written for TLC's speed: WF_vars(A) is              *)
(* []<>~ENABLED <<A>>_vars \/ []<><<A>>_vars, and TLC evaluates the        *)
(* ENABLED of every fair action on every transition it generates (6        *)
(* ENABLEDs, each as costly as computing the action's successors: two      *)
(* thirds of the Liveness model's time).  EmitEnabled, EngineEnabled and   *)
(* HumanEnabled are the actions' guards as plain state predicates;         *)
(* FairnessGuardsExact says each equals the ENABLED it replaces, and the   *)
(* Liveness model checks it in every reachable state, where it costs one   *)
(* ENABLED per state, not per transition.  Where it holds, FairnessByGuards *)
(* is Fairness and FairSpecByGuards is FairSpec, behaviour for behaviour.  *)
(* (No fair action is ever a stuttering step, so the guards need not say   *)
(* "and changes vars"; FairnessGuardsExact compares with <<A>>_vars.)      *)
(***************************************************************************)
EmitStep(c) == \E a \in ArgChoices[c] : ProviderEmitCall(c, a)
EmitEnabled(c) ==
    ArgChoices[c] # {} /\ msg[c] = "absent" /\ ~IsLegacy(c) /\ PriorTurnsAnswered(c)
EngineEnabled(c) ==
    \/ msg[c] = "volatile"
    \/ stage[c] \in {"dispatched", "waiting", "got_ok", "got_fail", "recorded",
                     "resume", "reconciling"}
    \/ /\ stage[c] = "live"
       /\ \/ NeedsApproval[c] /\ NeedsNewApproval(c)
          \/ NeedsApproval[c] /\ approval[ExecId(c)] = "rejected" /\ ApprovalFor(c)
          \/ /\ ApprovalOK(c)
             /\ \/ Policy[c] = "readonly"
                \/ msg[c] = "durable" /\ Rec(c).attempt < MaxAttempts
    \/ /\ stage[c] = "retry" /\ Policy[c] # "readonly" /\ msg[c] = "durable"
       /\ Rec(c).attempt < MaxAttempts
HumanEnabled(c) ==
    /\ msg[c] = "durable"
    /\ \/ approval[ExecId(c)] = "pending"
       \/ /\ result[c] = NoResult /\ Rec(c).status = "recovery_required"
          /\ stage[c] = "none"

FairnessGuardsExact ==
    \A c \in Calls :
        /\ EmitEnabled(c) = ENABLED <<EmitStep(c)>>_vars
        /\ EngineEnabled(c) = ENABLED <<EngineStep(c)>>_vars
        /\ HumanEnabled(c) = ENABLED <<HumanStep(c)>>_vars

EngineFairnessByGuards ==
    /\ \A c \in Calls : []<>~EmitEnabled(c) \/ []<><<EmitStep(c)>>_vars
    /\ \A c \in Calls : []<>~EngineEnabled(c) \/ []<><<EngineStep(c)>>_vars
FairnessByGuards ==
    /\ EngineFairnessByGuards
    /\ \A c \in Calls : []<>~HumanEnabled(c) \/ []<><<HumanStep(c)>>_vars

FairSpecByGuards == Spec /\ FairnessByGuards
EngineFairSpecByGuards == Spec /\ EngineFairnessByGuards

(***************************************************************************)
(* INVARIANTS (docs/protocol.md#invariants).                               *)
(***************************************************************************)
Protected(c) == Policy[c] # "readonly"

(* AtMostOnceEffect: the external effect of a non-readonly call is applied *)
(* at most once, plus once per retry a human explicitly authorized.  The  *)
(* effects are counted per CALL (effects[c]: c's own requests applied),    *)
(* not per execution id, so two calls that wrongly share an id are not     *)
(* one call applied twice, and one call answered from the other's key has  *)
(* no effect of its own.                                                   *)
AtMostOnceEffect ==
    \A c \in Calls : Protected(c) =>
        effects[c] <= 1 + humanRetries[ExecId(c)]

(* NoReinvokeAfterKnownOutcome: once a succeeded, failed or abandoned     *)
(* outcome of a call was durable (at any time in the past: the ghost      *)
(* knownOutcome), the adapter is never invoked again for that call, and   *)
(* the engine holds no request of it that is about to be sent.  A human's  *)
(* abandon is a known outcome: no decision may override it (twin          *)
(* ReconcileAbandoned).                                                    *)
NoReinvokeAfterKnownOutcome ==
    \A c \in knownOutcome :
        /\ sentAfterOutcome[c] = 0
        /\ stage[c] \notin {"dispatched", "retry"}

(* AttemptSentOnce: each attempt of a call is sent at most once.  A        *)
(* re-sent attempt changes none of the sets the other invariants read      *)
(* (invocations, inflight); the count per attempt, keyed by the call (the  *)
(* real-world identity, not the execution id), does.  Readonly calls       *)
(* bypass the ledger and may be replayed: they are not sent through it.   *)
AttemptSentOnce ==
    \A c \in Calls : \A n \in 1..MaxAttempts : sent[c][n] <= 1

(* NoBlindReplay: every invocation after the first is authorized by the    *)
(* policy (idempotent with the same id; reconcile said not applied and     *)
(* fenced the earlier attempts) or by a human.                             *)
NoBlindReplay ==
    \A c \in Calls : \A i \in invocations[c] :
        i[2] > 1 =>
            \/ i[3] = "human"
            \/ i[3] = "policy" /\ Policy[c] = "idempotent"
            \/ i[3] = "policy" /\ Policy[c] = "reconcile" /\ fenced[i[1]] >= i[2] - 1

(* ResultFidelity: every tool result in the conversation belongs to THIS *)
(* call's execution and arguments, and says what happened:                 *)
(*  - ok: the external system returned it, so THIS protected call's own    *)
(*    effect was applied (effects[c]: never fabricated, never an answer   *)
(*    deduplicated from another call's request under a shared id);        *)
(*  - denied, cancelled: the call was never sent;                          *)
(*  - error: the LAST attempt definitely failed.  An effect may stand     *)
(*    beside it only from an earlier attempt whose outcome was unknown:   *)
(*    one that a HUMAN chose to retry (HumanResolveRetry; at most one     *)
(*    effect per human retry), or, for an idempotent tool only, the one   *)
(*    attempt still in flight when the policy retry (retry_same_id) was   *)
(*    rejected: the external system deduplicates applied requests but    *)
(*    does not remember a definite rejection of the key, so the earlier   *)
(*    request may land after it.  A manual call is retried only by a      *)
(*    human, and a reconcile retry follows "not applied" with the earlier *)
(*    attempts fenced, so neither policy leaves one;                      *)
(*  - human and abandoned: a human's word on an unknown outcome           *)
(*    (HumanResolveApplied: "it was applied", HumanResolveAbandon: "give  *)
(*    up"); the protocol cannot check either against the external         *)
(*    system, which is why only a human may choose them.                  *)
ResultFidelity ==
    \A c \in Calls : result[c] # NoResult =>
        /\ result[c].exec = ExecId(c)
        /\ result[c].args = args[c]
        /\ result[c].kind = "ok" /\ Protected(c) => effects[c] >= 1
        /\ result[c].kind \in {"denied", "cancelled"} => invocations[c] = {}
        /\ result[c].kind = "error" /\ Protected(c) =>
              effects[c] <= humanRetries[ExecId(c)]
                                    + (IF Policy[c] = "idempotent" THEN 1 ELSE 0)

(* ApprovalGate: no invocation of a call that needs approval unless a      *)
(* human approved THIS call (by position) or authorized a retry.           *)
ApprovalGate ==
    \A c \in Calls : NeedsApproval[c] /\ Protected(c) =>
        \A i \in invocations[c] :
            (\E a \in Args : <<c, a>> \in humanApproved) \/ i[3] = "human"

(* ApprovalBoundToArgs: every request dispatched on the strength of an     *)
(* approval (its first attempt, or a policy retry of it) was approved by a *)
(* human for exactly its arguments: the dispatched record's call and       *)
(* argument digest are a pair the human was shown and approved.  A         *)
(* request a human retry authorized is the human's own word on those      *)
(* arguments (HumanMayRetry); a call that needs no approval needs none.    *)
ApprovalBoundToArgs ==
    \A e \in ExecIds :
        LET r == ledger[e] IN
        (r.status = "dispatched" /\ r.auth \in {"approval", "policy"}
            /\ NeedsApproval[r.call])
        => <<r.call, r.args>> \in humanApproved

(* ApprovalSingleUse: an approval authorizes one attempt, not a replay.   *)
ApprovalSingleUse ==
    \A c \in Calls :
        Cardinality({i \in invocations[c] : i[3] = "approval"}) <= 1

(* RecoveryRequiredHalts: while a call is in recovery_required the engine  *)
(* holds nothing that could invoke it; only a human moves it on (a retry   *)
(* the human granted, held to dispatch: RetryGranted), or the attempt's    *)
(* own late answer, which the engine holds to record (got_ok, got_fail:    *)
(* HoldsUnanswered).                                                       *)
RecoveryRequiredHalts ==
    \A c \in Calls : Rec(c).status = "recovery_required" =>
        \/ stage[c] \in {"none", "resume", "got_ok", "got_fail"}
        \/ stage[c] = "retry" /\ RetryGranted(c)

(* RetryGrantHonoured: a human's retry grant outlives the process that    *)
(* recorded it and is not answered by another halt: while a call holds an  *)
(* unused grant (RetryGranted), no engine leaves it waiting for a human    *)
(* (stage none).  A resolution given from the command line, by a process  *)
(* that runs nothing, is the retry the next engine sends.                 *)
RetryGrantHonoured ==
    \A c \in Calls : RetryGranted(c) => stage[c] # "none"

(* HumanSeesKnownOutcome: the human decides knowing what the engine knew.  *)
(* A call waits for a human (its record is recovery_required: the only     *)
(* state a human decision starts from) only if no applied answer of the    *)
(* attempt its record is at ever reached the engine and was dropped: an    *)
(* answer that arrives after the time-out, while the record is still at    *)
(* that attempt, is recorded (HoldsUnanswered), never discarded.           *)
HumanSeesKnownOutcome ==
    \A e \in ExecIds : ledger[e].status = "recovery_required" =>
        <<e, ledger[e].attempt>> \notin droppedAnswers

(* LegacyConservative: a call from before the protocol marker (approved,   *)
(* no result, no record) is never executed on the strength of its old      *)
(* approval: every execution is one a human authorized, or a policy retry *)
(* (same id) of an earlier attempt a human authorized.                     *)
LegacyConservative ==
    \A c \in LegacyCalls : Protected(c) =>
        \A i \in invocations[c] :
            \/ i[3] = "human"
            \/ /\ i[3] = "policy"
               /\ \E row \in audit[ExecId(c)] : row[1] = "human_retry" /\ row[2] < i[2]

(* ExecutionIdStable: the id a call's requests carry never changes: every  *)
(* invocation in the call's history (live, or after any number of resumes  *)
(* and renumberings of its position) carries one id, the one the engine    *)
(* uses for the call now.  A statement about behaviour through the         *)
(* history ghost invocations: once a request was sent with an id, every    *)
(* later state still has ExecId(c) equal to it.                            *)
ExecutionIdStable ==
    \A c \in Calls :
        \A i \in invocations[c] : i[1] = ExecId(c)

(* AuditComplete: every invocation has its dispatch row, and every        *)
(* decision the engine or a human took on a call (the ghost decided: each  *)
(* recovery decision of Recover but skip, each connector answer, each      *)
(* human resolution) has its own row in the call's execution audit: that  *)
(* kind, that attempt and, for a recovery decision, the inputs it was      *)
(* computed from.  A decision taken again for the same attempt needs its  *)
(* own row: one dropped (the first row kept) or overwritten (the last row *)
(* kept) is missing.  Approvals are recorded in approval itself.          *)
AuditComplete ==
    \A c \in Calls :
        /\ \A i \in invocations[c] : HasRow(i[1], "dispatch", i[2])
        /\ \A d \in decided[c] : d \in audit[ExecId(c)]

(* AuditRecomputable: every recovery-decision row carries the inputs the   *)
(* decision was computed from, and recomputing Decide on them gives the   *)
(* row's decision: anyone can check the engine's choice from the audit,   *)
(* every choice (AuditDecision keeps a row per decision).                  *)
AuditRecomputable ==
    \A e \in ExecIds : \A row \in audit[e] :
        row[1] \in Decisions => Decide(row[3]) = row[1]

(* CancelledNeverInvoked: a call with a "cancelled" result was never       *)
(* invoked and never is: no request of it was ever sent (the invocations   *)
(* are history) and the engine holds nothing that could send one.          *)
CancelledNeverInvoked ==
    \A c \in Calls : result[c].kind = "cancelled" =>
        /\ invocations[c] = {}
        /\ stage[c] \notin {"live", "retry", "dispatched", "waiting"}

(***************************************************************************)
(* WITNESSES.  An invariant whose antecedent is never reached proves       *)
(* nothing.  Each Witness_X below is the NEGATION of a situation that some *)
(* safety invariant is about; model/manifest.toml runs each on a must-pass *)
(* model and expects TLC to report it violated, i.e. the situation is      *)
(* reached.  A refactor that makes one unreachable fails `make check`.     *)
(* The manifest's antecedent_of field names the invariants each serves.    *)
(***************************************************************************)
\* An effect was applied and a later attempt of the same call was sent
\* (AtMostOnceEffect, NoBlindReplay: the retry that could apply it twice).
Witness_RetryAfterApplied ==
    ~\E c \in Calls : Protected(c) /\ effects[c] >= 1
                      /\ \E n \in 2..MaxAttempts : sent[c][n] >= 1

\* A crash left an applied, unanswered call to Recover (AtMostOnceEffect).
Witness_RecoverAfterApplied ==
    ~\E c \in Calls : Protected(c) /\ effects[c] >= 1 /\ crashes >= 1
                      /\ stage[c] = "resume" /\ Rec(c).status = "dispatched"

\* A call whose outcome is known is resumed (NoReinvokeAfterKnownOutcome).
\* (Its sharper case, a call a human abandoned: Witness_AbandonedResumed.)
Witness_ResumeAfterKnownOutcome ==
    ~\E c \in knownOutcome : stage[c] = "resume"

\* A call is resumed while its sent attempt is still in flight: the moment
\* an engine could send that attempt again (AttemptSentOnce).
Witness_ResumeWithAttemptInFlight ==
    ~\E c \in Calls : stage[c] = "resume" /\ Rec(c).status = "dispatched"
                      /\ Rec(c).attempt \in inflight[ExecId(c)]

\* A reconcile attempt was fenced and the call retried (NoBlindReplay's
\* reconcile case: the fence is what makes "not applied" definite).
Witness_FencedRetry ==
    ~\E c \in Calls : Policy[c] = "reconcile" /\ fenced[ExecId(c)] >= 1
                      /\ \E i \in invocations[c] : i[2] >= 2

\* A protected call shows an ok result after a crash (ResultFidelity).
Witness_OkAfterCrash ==
    ~\E c \in Calls : Protected(c) /\ result[c].kind = "ok" /\ crashes >= 1

\* Two calls of one message were both dispatched, one applied and the other
\* never sent, when a crash left both to be recovered: the state
\* Session.execute_message(together=True) leaves after a crash between its
\* two commits (AtMostOnceEffect, NoReinvokeAfterKnownOutcome).
Witness_MessageDispatchedTogether ==
    ~\E c, d \in Calls :
        /\ c # d /\ Turn[c] = Turn[d] /\ crashes >= 1
        /\ \A x \in {c, d} : Rec(x).status = "dispatched" /\ stage[x] = "resume"
        /\ effects[c] >= 1 /\ sent[d][Rec(d).attempt] = 0

\* An error result stands beside an applied effect (ResultFidelity's
\* error clause: a human retried, or an idempotent late original landed).
Witness_ErrorBesideEffect ==
    ~\E c \in Calls : Protected(c) /\ result[c].kind = "error"
                      /\ effects[c] >= 1

\* A live call stands at a position whose approval a human gave for other
\* arguments (the conversation lost the approved call and the provider
\* emitted another there): the engine must ask again, not dispatch
\* (ApprovalBoundToArgs: the moment a position-only approval is misused).
Witness_ApprovedForOtherArgs ==
    ~\E c \in Calls : /\ stage[c] = "live" /\ NeedsApproval[c]
                      /\ approval[ExecId(c)] = "approved"
                      /\ approvalArgs[ExecId(c)] # args[c]

\* A call that needs approval is invoked again after a crash
\* (ApprovalGate, ApprovalSingleUse).
Witness_ApprovedCallRetried ==
    ~\E c \in Calls : NeedsApproval[c] /\ crashes >= 1
                      /\ \E i \in invocations[c] : i[2] >= 2

\* A call in recovery_required is resumed by a restart (RecoveryRequiredHalts).
Witness_HaltedCallResumed ==
    ~\E c \in Calls : Rec(c).status = "recovery_required" /\ stage[c] = "resume"

\* A legacy call was invoked (LegacyConservative).
Witness_LegacyInvoked ==
    ~\E c \in LegacyCalls : invocations[c] # {}

\* Two calls that share a tool_call_id were both invoked, one after a
\* crash (ExecutionIdStable; ExecutionIdUnique is an ASSUME).
Witness_ReusedIdsInvoked ==
    ~\E c, d \in Calls :
        /\ c # d /\ ToolCallId[c] = ToolCallId[d] /\ crashes >= 1
        /\ invocations[c] # {} /\ invocations[d] # {}

\* A human retried (AuditComplete: a human decision to audit).
Witness_HumanRetried ==
    ~\E c \in Calls : \E d \in decided[c] : d[1] = "human_retry"

\* A human's retry grant is honoured by Recover: the call, still halted,
\* is held for the granted retry (RetryGrantHonoured, RecoveryRequiredHalts).
Witness_RetryGrantHonoured ==
    ~\E c \in Calls : RetryGranted(c) /\ stage[c] = "retry"

\* A recovery decision on a dispatched call was audited with its inputs
\* (AuditRecomputable: a row whose inputs are not NoInputs).
Witness_DecisionRowWithInputs ==
    ~\E e \in ExecIds : \E row \in audit[e] :
        row[1] \in Decisions /\ row[3].status = "dispatched"

\* A call the user stopped (HumanCancel) is about to be re-decided: Recover
\* applies Decide's "skip" branch (CancelledNeverInvoked: the Stop happened
\* and the engine went on).
Witness_DecideSkip ==
    ~\E c \in Calls : stage[c] = "resume" /\ DecisionFor(c) = "skip"

\* A call is about to be decided against a record whose argument digest
\* differs from it: the conversation lost the record's call and the provider
\* emitted another at that position (ResultFidelity: without the digest
\* rule the record's result would be shown for the other call).
Witness_DigestMismatch ==
    ~\E c \in Calls : stage[c] = "resume" /\ Rec(c).status # "none"
                      /\ ~DecisionInputs(c).digestMatches

\* A human is to resolve a record halted against other arguments than the
\* call now at its position, after its outcome was known: the moment the old
\* rule offered a retry of that known outcome (NoReinvokeAfterKnownOutcome:
\* HumanMayRetry refuses it, the human may only resolve or abandon).
Witness_HumanAfterDigestHalt ==
    ~\E c \in Calls : /\ msg[c] = "durable" /\ result[c] = NoResult
                      /\ stage[c] = "none" /\ Rec(c).status = "recovery_required"
                      /\ Rec(c).args # args[c] /\ Rec(c).result # NoResult

\* A call that was already invoked is about to be resumed after its
\* position was renumbered (ExecutionIdStable: the moment an id derived
\* from the position again would differ from the one its requests carried).
Witness_RenumberedAfterInvoke ==
    ~\E c \in Calls : stage[c] = "resume" /\ turnOf[c] # Turn[c]
                      /\ invocations[c] # {}

\* The return of an older attempt arrives while the engine waits for a
\* newer attempt of the same execution: EngineDiscardLateReturn must drop it
\* (ResultFidelity: taken as the current attempt's answer, an older
\* attempt's "ok" or "error" would be recorded for the wrong attempt).
Witness_LateReturnDiscarded ==
    ~\E e \in ExecIds : \E n \in inflight[e] :
        /\ ~Fenced(e, n) /\ ~Delivered(e, n)
        /\ \E c \in Calls : ExecId(c) = e /\ stage[c] = "waiting"

\* A call a human abandoned is about to be re-decided: the moment a decision
\* could override the human's give-up (NoReinvokeAfterKnownOutcome: the
\* abandon is a known outcome, Decide reconstructs it).
Witness_AbandonedResumed ==
    ~\E c \in Calls : /\ stage[c] = "resume" /\ result[c] = NoResult
                      /\ Rec(c).status = "abandoned"

\* An answer of the attempt a call is halted at (recovery_required, for a
\* human) arrives after the halt: the engine holds it to record it, and the
\* human is not asked any more (HumanSeesKnownOutcome).
Witness_LateAnswerRecorded ==
    ~\E c \in Calls : stage[c] = "got_ok" /\ Rec(c).status = "recovery_required"

\* The external system forgot the key of an applied idempotent call that
\* waits for Recover with its attempt dispatched: the retry with the same
\* id would apply it again (AtMostOnceEffect: keyRetained must stop it).
Witness_KeyForgottenBeforeRecover ==
    ~\E c \in Calls :
        /\ Policy[c] = "idempotent" /\ ExecId(c) \in keyForgotten
        /\ effects[c] >= 1 /\ stage[c] = "resume"
        /\ Rec(c).status = "dispatched"

\* The external system may answer a request of an idempotent call "in
\* flight" (409) while the engine waits for it: another request under the
\* key is still in flight and may still land (AtMostOnceEffect: a retry under
\* a fresh key would apply it twice; ResultFidelity: taken for success, the
\* answer shows an ok result for an effect that may never happen).
Witness_InFlightAnswerable ==
    ~\E e \in ExecIds : ENABLED ExternalAnswerInFlight(e)

\* The external system may answer a retry "parameters differ" under a key it
\* remembers while the engine waits for it (AtMostOnceEffect: re-sent under a
\* fresh key, the effect of the earlier attempt is applied again).
Witness_ParamsDifferAnswerable ==
    ~\E e \in ExecIds : ENABLED ExternalAnswerParamsDiffer(e)

\* The external system may replay a stored failure to a retry under a key it
\* remembers while the engine waits for it (AtMostOnceEffect: re-sent under a
\* fresh key, the effect of the earlier attempt is applied again).
Witness_ReplayedFailureAnswerable ==
    ~\E e \in ExecIds : ENABLED ExternalReplayFailure(e)

(***************************************************************************)
(* LIVENESS.                                                               *)
(***************************************************************************)
(* EventuallySettled: with fair engine steps, humans who answer eventually *)
(* and finitely many crashes, every call ends (and stays) with a           *)
(* conversation result or in recovery_required: never stuck, never         *)
(* looping.                                                                *)
Settled(c) == result[c] # NoResult \/ Rec(c).status = "recovery_required"
EventuallySettled == \A c \in Calls : <>[]Settled(c)

(* EventuallyAnswered: stronger, and what a user waits for: with the same  *)
(* fairness every call ends (and stays) with a result in the conversation: *)
(* a call halted for a human is answered once the human resolves it.       *)
Answered(c) == result[c] # NoResult
EventuallyAnswered == \A c \in Calls : <>[]Answered(c)

=============================================================================
