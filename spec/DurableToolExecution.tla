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
(* the session; its lease is outside this spec), and key expiry at the     *)
(* external system.                                                        *)
(*                                                                         *)
(* Names of actions and invariants are the ones used by the Python         *)
(* reference (reference/toolledger) and the docs, one to one.             *)
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
(* The execution id.  The engine derives it from the call's persisted      *)
(* position and the provider's tool_call_id, never from tool arguments.    *)
(* Gemini numbers calls call_0, call_1, ... on every turn, so the          *)
(* tool_call_id alone is not a key: with KeyByPosition = FALSE two calls   *)
(* of different turns share an id (docs/protocol.md#what-must-fail).       *)
(***************************************************************************)
ExecId(c) == IF KeyByPosition THEN <<Turn[c], Slot[c], ToolCallId[c]>>
                              ELSE <<0, 0, ToolCallId[c]>>
ExecIds == {ExecId(c) : c \in Calls}

IsLegacy(c) == Turn[c] < MarkerTurn
LegacyCalls == {c \in Calls : IsLegacy(c)}
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
    ledger,       \* ledger[e]: the execution record
    audit,        \* audit[e]: set of <<kind, attempt>> rows
    marker,       \* the session's protocol marker (first governed turn)
    \* --- volatile: the engine's memory ----------------------------------
    stage,        \* stage[c] \in Stages
    \* --- the external system (survives engine crashes) ------------------
    inflight,     \* inflight[e]: attempts sent and not yet processed
    fenced,       \* fenced[e]: attempts <= fenced[e] are rejected
    \* --- ghosts (history, for the invariants) ----------------------------
    applied,      \* applied[e]: how many times the effect was applied
    invocations,  \* invocations[c]: set of <<exec id, attempt, authorization>>
    humanApproved,\* calls a human approved (by position)
    humanRetries, \* humanRetries[e]: retries a human authorized
    crashes

durable  == <<msg, args, result, approval, ledger, audit, marker>>
external == <<inflight, fenced>>
ghosts   == <<applied, invocations, humanApproved, humanRetries, crashes>>
vars == <<msg, args, result, approval, ledger, audit, marker, stage,
          inflight, fenced, applied, invocations, humanApproved,
          humanRetries, crashes>>

(***************************************************************************)
(* TypeOK: every variable has the shape described above.                   *)
(***************************************************************************)
Records == [status : Statuses, attempt : 0..MaxAttempts, args : Args \cup {"none"},
            auth : Auths, result : Results \cup {NoResult},
            call : Calls \cup {"none"}]
TypeOK ==
    /\ msg \in [Calls -> {"absent", "volatile", "durable"}]
    /\ args \in [Calls -> Args \cup {"none"}]
    /\ result \in [Calls -> Results \cup {NoResult}]
    /\ approval \in [ExecIds -> {"none", "pending", "approved", "rejected"}]
    /\ ledger \in [ExecIds -> Records]
    /\ audit \in [ExecIds -> SUBSET (AuditKinds \X (0..MaxAttempts))]
    /\ marker = MarkerTurn
    /\ stage \in [Calls -> Stages]
    /\ inflight \in [ExecIds -> SUBSET (1..MaxAttempts)]
    /\ fenced \in [ExecIds -> 0..MaxAttempts]
    /\ applied \in [ExecIds -> Nat]
    /\ invocations \in [Calls -> SUBSET (ExecIds \X (1..MaxAttempts) \X Auths)]
    /\ humanApproved \subseteq Calls
    /\ humanRetries \in [ExecIds -> 0..MaxAttempts]
    /\ crashes \in 0..MaxCrashes

(***************************************************************************)
(* Init.  Calls of the protocol's turns are not emitted yet.  A legacy     *)
(* call (turn < marker) was emitted, made durable and approved under the   *)
(* old engine, which may or may not have applied it: the new engine finds  *)
(* it with no result and no record and must recover it.                    *)
(***************************************************************************)
Init ==
    /\ msg = [c \in Calls |-> IF IsLegacy(c) THEN "durable" ELSE "absent"]
    /\ args = [c \in Calls |-> IF IsLegacy(c) THEN CHOOSE a \in ArgChoices[c] : TRUE
                                              ELSE "none"]
    /\ result = [c \in Calls |-> NoResult]
    /\ approval = [e \in ExecIds |->
                     IF \E c \in LegacyCalls : ExecId(c) = e /\ NeedsApproval[c]
                     THEN "approved" ELSE "none"]
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
    /\ humanApproved = {c \in LegacyCalls : NeedsApproval[c]}
    /\ humanRetries = [e \in ExecIds |-> 0]
    /\ crashes = 0

(***************************************************************************)
(* Helpers.                                                                *)
(***************************************************************************)
Rec(c) == ledger[ExecId(c)]
ApprovalOK(c) == ~NeedsApproval[c] \/ approval[ExecId(c)] = "approved"
PriorTurnsAnswered(c) ==
    \A d \in Calls : Turn[d] < Turn[c] => result[d] # NoResult
Audited(e, kind, n) == audit' = [audit EXCEPT ![e] = @ \cup {<<kind, n>>}]

(***************************************************************************)
(* The recovery decision: a total function of (ledger record, approval     *)
(* state, conversation has a result, policy, legacy per the marker).      *)
(* A record whose argument digest disagrees with the call found at its    *)
(* position is a contradiction and fails closed.  The engine applies the   *)
(* same function on resume and after a live time-out.                      *)
(***************************************************************************)
Decide(rec, appr, hasResult, pol, legacy, needsApproval, callArgs) ==
    IF hasResult THEN "skip"
    ELSE IF pol = "readonly" THEN "execute"
    ELSE IF rec.status # "none" /\ rec.args # callArgs THEN "recovery_required"
    ELSE IF rec.status \in {"succeeded", "failed", "abandoned"} THEN "reconstruct"
    ELSE IF rec.status = "recovery_required" THEN "recovery_required"
    ELSE IF rec.status = "dispatched" THEN
            CASE pol = "idempotent" ->
                   IF rec.attempt < MaxAttempts THEN "retry_same_id"
                                                ELSE "recovery_required"
              [] pol = "reconcile" -> "reconcile"
              [] OTHER -> "recovery_required"
    \* no record from here on
    ELSE IF legacy /\ (appr = "approved" \/ ~needsApproval) THEN "recovery_required"
    ELSE "execute"

DecisionFor(c) ==
    Decide(Rec(c), approval[ExecId(c)], result[c] # NoResult, Policy[c],
           IsLegacy(c), NeedsApproval[c], args[c])

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
    /\ UNCHANGED <<result, approval, ledger, audit, marker, stage>>
    /\ UNCHANGED external /\ UNCHANGED ghosts

\* The assistant message holding c is checkpointed.  Nothing is dispatched
\* before this: otherwise a crash could put another call at this position.
EnginePersistCall(c) ==
    /\ msg[c] = "volatile"
    /\ msg' = [msg EXCEPT ![c] = "durable"]
    /\ stage' = [stage EXCEPT ![c] = "live"]
    /\ UNCHANGED <<args, result, approval, ledger, audit, marker>>
    /\ UNCHANGED external /\ UNCHANGED ghosts

\* The approval is parked in the inbox and persisted.
EngineParkApproval(c) ==
    /\ stage[c] = "live" /\ NeedsApproval[c] /\ approval[ExecId(c)] = "none"
    /\ approval' = [approval EXCEPT ![ExecId(c)] = "pending"]
    /\ UNCHANGED <<msg, args, result, ledger, audit, marker, stage>>
    /\ UNCHANGED external /\ UNCHANGED ghosts

HumanApprove(c) ==
    /\ msg[c] = "durable" /\ approval[ExecId(c)] = "pending"
    /\ approval' = [approval EXCEPT ![ExecId(c)] = "approved"]
    /\ humanApproved' = humanApproved \cup {c}
    /\ UNCHANGED <<msg, args, result, ledger, audit, marker, stage>>
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, invocations, humanRetries, crashes>>

HumanReject(c) ==
    /\ msg[c] = "durable" /\ approval[ExecId(c)] = "pending"
    /\ approval' = [approval EXCEPT ![ExecId(c)] = "rejected"]
    /\ UNCHANGED <<msg, args, result, ledger, audit, marker, stage>>
    /\ UNCHANGED external /\ UNCHANGED ghosts

\* A rejected approval becomes a "denied" tool result.
EngineRecordDenied(c) ==
    /\ stage[c] = "live" /\ NeedsApproval[c] /\ approval[ExecId(c)] = "rejected"
    /\ result' = [result EXCEPT ![c] = Result("denied", ExecId(c), args[c])]
    /\ stage' = [stage EXCEPT ![c] = "none"]
    /\ UNCHANGED <<msg, args, approval, ledger, audit, marker>>
    /\ UNCHANGED external /\ UNCHANGED ghosts

\* dispatched(attempt n) is made durable, with its audit row, BEFORE the
\* adapter is invoked.  Attempt 1 is authorized by the approval (or needs
\* none); a later attempt by the recovery policy ("retry" stage).
EnginePersistDispatched(c) ==
    LET e == ExecId(c)
        n == Rec(c).attempt + 1
        auth == IF stage[c] = "retry" THEN "policy"
                ELSE IF NeedsApproval[c] THEN "approval" ELSE "auto"
    IN
    /\ Policy[c] # "readonly" /\ msg[c] = "durable"
    /\ \/ stage[c] = "live" /\ ApprovalOK(c)
       \/ stage[c] = "retry"
    /\ n <= MaxAttempts
    /\ ledger' = [ledger EXCEPT ![e] = [status |-> "dispatched", attempt |-> n,
                      args |-> args[c], auth |-> auth, result |-> NoResult, call |-> c]]
    /\ Audited(e, "dispatch", n)
    /\ stage' = [stage EXCEPT ![c] = "dispatched"]
    /\ UNCHANGED <<msg, args, result, approval, marker>>
    /\ UNCHANGED external /\ UNCHANGED ghosts

\* The adapter is invoked with the execution id: the request is now out.
EngineInvokeAdapter(c) ==
    LET e == ExecId(c) IN
    /\ stage[c] = "dispatched"
    /\ inflight' = [inflight EXCEPT ![e] = @ \cup {Rec(c).attempt}]
    /\ invocations' = [invocations EXCEPT ![c] =
                         @ \cup {<<e, Rec(c).attempt, Rec(c).auth>>}]
    /\ stage' = [stage EXCEPT ![c] = "waiting"]
    /\ UNCHANGED durable /\ UNCHANGED fenced
    /\ UNCHANGED <<applied, humanApproved, humanRetries, crashes>>

\* A readonly tool bypasses the ledger: replaying it is safe.
EngineInvokeReadonly(c) ==
    /\ stage[c] = "live" /\ Policy[c] = "readonly" /\ ApprovalOK(c)
    /\ stage' = [stage EXCEPT ![c] = "got_ok"]
    /\ UNCHANGED durable /\ UNCHANGED external /\ UNCHANGED ghosts

(***************************************************************************)
(* The external system processes request n of execution e.  An answer     *)
(* reaches the engine only if the engine still waits for that attempt.    *)
(***************************************************************************)
Waiting(c, e, n) == ExecId(c) = e /\ stage[c] = "waiting" /\ Rec(c).attempt = n
Answer(e, n, s) ==
    stage' = [c \in Calls |-> IF Waiting(c, e, n) THEN s ELSE stage[c]]
Fenced(e, n) == n <= fenced[e]
Dedups(e) == \E c \in Calls : ExecId(c) = e /\ Policy[c] = "idempotent"
Apply(e) == applied' = [applied EXCEPT ![e] = IF Dedups(e) /\ @ >= 1 THEN @ ELSE @ + 1]

\* Applied (or deduplicated on the execution id) and answered.
ExternalApply(e) ==
    \E n \in inflight[e] :
      /\ ~Fenced(e, n)
      /\ inflight' = [inflight EXCEPT ![e] = @ \ {n}]
      /\ Apply(e)
      /\ Answer(e, n, "got_ok")
      /\ UNCHANGED durable /\ UNCHANGED fenced
      /\ UNCHANGED <<invocations, humanApproved, humanRetries, crashes>>

\* Applied, but the answer is lost (time-out, connection reset).
ExternalApplyLoseAnswer(e) ==
    \E n \in inflight[e] :
      /\ ~Fenced(e, n)
      /\ inflight' = [inflight EXCEPT ![e] = @ \ {n}]
      /\ Apply(e)
      /\ UNCHANGED durable /\ UNCHANGED stage /\ UNCHANGED fenced
      /\ UNCHANGED <<invocations, humanApproved, humanRetries, crashes>>

\* A definite failure: known not applied (e.g. rejected before sending).
\* An idempotent system that already applied e answers with that result.
ExternalRejectDefinite(e) ==
    \E n \in inflight[e] :
      /\ ~Fenced(e, n)
      /\ ~(Dedups(e) /\ applied[e] >= 1)
      /\ inflight' = [inflight EXCEPT ![e] = @ \ {n}]
      /\ Answer(e, n, "got_fail")
      /\ UNCHANGED durable /\ UNCHANGED fenced /\ UNCHANGED ghosts

\* A late request of a fenced attempt is dropped without effect.
ExternalDropFenced(e) ==
    \E n \in inflight[e] :
      /\ Fenced(e, n)
      /\ inflight' = [inflight EXCEPT ![e] = @ \ {n}]
      /\ UNCHANGED durable /\ UNCHANGED stage /\ UNCHANGED fenced
      /\ UNCHANGED ghosts

\* succeeded(result) is made durable immediately after the adapter returns.
EngineRecordSucceeded(c) ==
    LET e == ExecId(c) IN
    /\ stage[c] = "got_ok" /\ Policy[c] # "readonly"
    /\ ledger' = [ledger EXCEPT ![e].status = "succeeded",
                                ![e].result = Result("ok", e, Rec(c).args)]
    /\ stage' = [stage EXCEPT ![c] = "recorded"]
    /\ UNCHANGED <<msg, args, result, approval, audit, marker>>
    /\ UNCHANGED external /\ UNCHANGED ghosts

\* failed(error) is made durable for a definite, known-not-applied failure.
EngineRecordFailed(c) ==
    LET e == ExecId(c) IN
    /\ stage[c] = "got_fail"
    /\ ledger' = [ledger EXCEPT ![e].status = "failed",
                                ![e].result = Result("error", e, Rec(c).args)]
    /\ stage' = [stage EXCEPT ![c] = "recorded"]
    /\ UNCHANGED <<msg, args, result, approval, audit, marker>>
    /\ UNCHANGED external /\ UNCHANGED ghosts

\* The role="tool" result is appended to the conversation and checkpointed:
\* from the ledger record, or (readonly) from the answer in memory.
EngineAppendResult(c) ==
    /\ \/ stage[c] = "recorded"
       \/ stage[c] = "got_ok" /\ Policy[c] = "readonly"
    /\ result' = [result EXCEPT ![c] =
                    IF Policy[c] = "readonly" THEN Result("ok", ExecId(c), args[c])
                    ELSE Rec(c).result]
    /\ stage' = [stage EXCEPT ![c] = "none"]
    /\ UNCHANGED <<msg, args, approval, ledger, audit, marker>>
    /\ UNCHANGED external /\ UNCHANGED ghosts

\* The live engine gives up waiting: the outcome is unknown, exactly as
\* after a crash, so the same recovery decision applies.
EngineTimeout(c) ==
    /\ stage[c] = "waiting"
    /\ stage' = [stage EXCEPT ![c] = "resume"]
    /\ UNCHANGED durable /\ UNCHANGED external /\ UNCHANGED ghosts

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

Halt(c) ==
    [Rec(c) EXCEPT !.status = "recovery_required", !.args = args[c], !.call = c]

Recover(c) ==
    LET e == ExecId(c)
        d == DecisionFor(c)
    IN
    /\ stage[c] = "resume"
    /\ stage' = [stage EXCEPT ![c] = StageAfter(d)]
    /\ ledger' = IF d = "recovery_required" /\ Rec(c).status # "recovery_required"
                 THEN [ledger EXCEPT ![e] = Halt(c)] ELSE ledger
    /\ IF Policy[c] = "readonly" \/ d = "skip"
       THEN UNCHANGED audit ELSE Audited(e, d, Rec(c).attempt)
    /\ UNCHANGED <<msg, args, result, approval, marker>>
    /\ UNCHANGED external /\ UNCHANGED ghosts

(***************************************************************************)
(* Reconcile: ask the connector whether execution e was applied.  "Not    *)
(* applied" is definite only because the connector fences the attempts    *)
(* made so far (a late original must not land afterwards); the fence is   *)
(* per attempt, so the retry (attempt n+1) is not rejected by it.         *)
(***************************************************************************)
EngineReconcileApplied(c) ==
    LET e == ExecId(c) IN
    /\ stage[c] = "reconciling" /\ applied[e] >= 1
    /\ ledger' = [ledger EXCEPT ![e].status = "succeeded",
                                ![e].result = Result("ok", e, Rec(c).args)]
    /\ Audited(e, "reconcile_applied", Rec(c).attempt)
    /\ stage' = [stage EXCEPT ![c] = "recorded"]
    /\ UNCHANGED <<msg, args, result, approval, marker>>
    /\ UNCHANGED external /\ UNCHANGED ghosts

EngineReconcileNotApplied(c) ==
    LET e == ExecId(c) IN
    /\ stage[c] = "reconciling" /\ applied[e] = 0
    /\ Rec(c).attempt < MaxAttempts
    /\ fenced' = IF FenceOnReconcile
                 THEN [fenced EXCEPT ![e] = Rec(c).attempt] ELSE fenced
    /\ Audited(e, "reconcile_not_applied", Rec(c).attempt)
    /\ stage' = [stage EXCEPT ![c] = "retry"]
    /\ UNCHANGED <<msg, args, result, approval, ledger, marker>>
    /\ UNCHANGED inflight /\ UNCHANGED ghosts

\* The connector cannot tell (unreachable, or the retry budget is spent).
EngineReconcileUnknown(c) ==
    LET e == ExecId(c) IN
    /\ stage[c] = "reconciling"
    /\ ledger' = [ledger EXCEPT ![e] = Halt(c)]
    /\ Audited(e, "reconcile_unknown", Rec(c).attempt)
    /\ stage' = [stage EXCEPT ![c] = "none"]
    /\ UNCHANGED <<msg, args, result, approval, marker>>
    /\ UNCHANGED external /\ UNCHANGED ghosts

(***************************************************************************)
(* A human resolves a recovery_required item.  Resolving it resumes the    *)
(* session, as resolving an inbox item does in the engine.                 *)
(***************************************************************************)
HumanResolveApplied(c) ==
    LET e == ExecId(c) IN
    /\ msg[c] = "durable" /\ result[c] = NoResult
    /\ Rec(c).status = "recovery_required" /\ stage[c] = "none"
    /\ ledger' = [ledger EXCEPT ![e].status = "succeeded",
                                ![e].result = Result("human", e, args[c])]
    /\ Audited(e, "human_applied", Rec(c).attempt)
    /\ stage' = [stage EXCEPT ![c] = "resume"]
    /\ UNCHANGED <<msg, args, result, approval, marker>>
    /\ UNCHANGED external /\ UNCHANGED ghosts

HumanResolveRetry(c) ==
    LET e == ExecId(c)
        n == Rec(c).attempt + 1
    IN
    /\ msg[c] = "durable" /\ result[c] = NoResult
    /\ Rec(c).status = "recovery_required" /\ stage[c] = "none" /\ n <= MaxAttempts
    /\ ledger' = [ledger EXCEPT ![e] = [status |-> "dispatched", attempt |-> n,
                      args |-> args[c], auth |-> "human", result |-> NoResult,
                      call |-> c]]
    /\ audit' = [audit EXCEPT ![e] = @ \cup {<<"human_retry", n>>, <<"dispatch", n>>}]
    /\ humanRetries' = [humanRetries EXCEPT ![e] = @ + 1]
    /\ stage' = [stage EXCEPT ![c] = "dispatched"]
    /\ UNCHANGED <<msg, args, result, approval, marker>>
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, invocations, humanApproved, crashes>>

HumanResolveAbandon(c) ==
    LET e == ExecId(c) IN
    /\ msg[c] = "durable" /\ result[c] = NoResult
    /\ Rec(c).status = "recovery_required" /\ stage[c] = "none"
    /\ ledger' = [ledger EXCEPT ![e].status = "abandoned",
                                ![e].result = Result("abandoned", e, args[c])]
    /\ Audited(e, "human_abandon", Rec(c).attempt)
    /\ stage' = [stage EXCEPT ![c] = "resume"]
    /\ UNCHANGED <<msg, args, result, approval, marker>>
    /\ UNCHANGED external /\ UNCHANGED ghosts

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
    /\ UNCHANGED <<msg, args, approval, ledger, marker>>
    /\ UNCHANGED external /\ UNCHANGED ghosts

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
    /\ UNCHANGED <<result, approval, ledger, audit, marker>>
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, invocations, humanApproved, humanRetries>>

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
(* INVARIANTS (docs/protocol.md#invariants).                               *)
(***************************************************************************)
Protected(c) == Policy[c] # "readonly"

(* AtMostOnceEffect: the external effect of a non-readonly call is applied *)
(* at most once, plus once per retry a human explicitly authorized.        *)
AtMostOnceEffect ==
    \A c \in Calls : Protected(c) =>
        applied[ExecId(c)] <= 1 + humanRetries[ExecId(c)]

(* NoReinvokeAfterKnownOutcome: once succeeded or failed is durable, the   *)
(* adapter is never called again for that execution: every invocation has *)
(* an attempt no later than the one whose outcome was recorded, and no     *)
(* request of it is still waiting to be sent.                              *)
NoReinvokeAfterKnownOutcome ==
    \A c \in Calls :
        Rec(c).status \in {"succeeded", "failed"} /\ Rec(c).call = c =>
            /\ \A i \in invocations[c] : i[2] <= Rec(c).attempt
            /\ stage[c] \notin {"dispatched", "retry"}

(* NoBlindReplay: every invocation after the first is authorized by the    *)
(* policy (idempotent with the same id; reconcile said not applied and     *)
(* fenced the earlier attempts) or by a human.                             *)
NoBlindReplay ==
    \A c \in Calls : \A i \in invocations[c] :
        i[2] > 1 =>
            \/ i[3] = "human"
            \/ i[3] = "policy" /\ Policy[c] = "idempotent"
            \/ i[3] = "policy" /\ Policy[c] = "reconcile" /\ fenced[i[1]] >= i[2] - 1

(* ResultFidelity: a successful tool result in the conversation is what    *)
(* the external system returned for THIS call's execution and arguments:   *)
(* never fabricated, never another call's.                                 *)
ResultFidelity ==
    \A c \in Calls : result[c].kind = "ok" =>
        /\ result[c].exec = ExecId(c)
        /\ result[c].args = args[c]
        /\ Protected(c) => applied[ExecId(c)] >= 1

(* ApprovalGate: no invocation of a call that needs approval unless a      *)
(* human approved THIS call (by position) or authorized a retry.           *)
ApprovalGate ==
    \A c \in Calls : NeedsApproval[c] /\ Protected(c) =>
        \A i \in invocations[c] : c \in humanApproved \/ i[3] = "human"

(* ApprovalSingleUse: an approval authorizes one attempt, not a replay.   *)
ApprovalSingleUse ==
    \A c \in Calls :
        Cardinality({i \in invocations[c] : i[3] = "approval"}) <= 1

(* RecoveryRequiredHalts: while a call is in recovery_required the engine  *)
(* holds nothing that could invoke it; only a human moves it on.          *)
RecoveryRequiredHalts ==
    \A c \in Calls : Rec(c).status = "recovery_required" =>
        stage[c] \in {"none", "resume"}

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

(* ExecutionIdStable: every invocation of a call, live or after any       *)
(* number of resumes, carries the one id derived from its position.       *)
ExecutionIdStable ==
    \A c \in Calls :
        \A i \in invocations[c] : i[1] = ExecId(c)

(* ExecutionIdUnique: two different calls never share an id, even when    *)
(* the provider reuses tool_call_ids.                                     *)
ExecutionIdUnique ==
    \A c, d \in Calls : c # d => ExecId(c) # ExecId(d)

(* AuditComplete: every invocation and every recovery decision that       *)
(* changed durable state has its audit row (tool_call_id, execution id,   *)
(* attempt, decision are all recoverable from <<e, kind, attempt>>).      *)
AuditComplete ==
    \A c \in Calls :
        /\ \A i \in invocations[c] : <<"dispatch", i[2]>> \in audit[i[1]]
        /\ Rec(c).status = "recovery_required" =>
              \E row \in audit[ExecId(c)] :
                  row[1] \in {"recovery_required", "reconcile_unknown"}
        /\ humanRetries[ExecId(c)] <=
              Cardinality({row \in audit[ExecId(c)] : row[1] = "human_retry"})

(* CancelledNeverInvoked: a call with a "cancelled" result was never       *)
(* invoked and never is: no request of it was ever sent (the invocations   *)
(* are history) and the engine holds nothing that could send one.          *)
CancelledNeverInvoked ==
    \A c \in Calls : result[c].kind = "cancelled" =>
        /\ invocations[c] = {}
        /\ stage[c] \notin {"live", "retry", "dispatched", "waiting"}

(***************************************************************************)
(* LIVENESS.                                                               *)
(***************************************************************************)
(* EventuallySettled: with fair engine steps, humans who answer eventually *)
(* and finitely many crashes, every call ends (and stays) with a           *)
(* conversation result or in recovery_required: never stuck, never         *)
(* looping.                                                                *)
Settled(c) == result[c] # NoResult \/ Rec(c).status = "recovery_required"
EventuallySettled == \A c \in Calls : <>[]Settled(c)

=============================================================================
