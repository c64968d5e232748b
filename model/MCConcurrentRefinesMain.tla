----------------------- MODULE MCConcurrentRefinesMain -----------------------
(***************************************************************************)
(* A refinement mapping from spec/ConcurrentResumers.tla (several engine  *)
(* processes, one call) to spec/DurableToolExecution.tla (one engine),     *)
(* checked by TLC (docs/protocol.md#concurrent-resumers): every step of    *)
(* the concurrent spec, seen through the mapping, is a step of the main    *)
(* spec (its Next, or one of the ConcurrentNext steps only several         *)
(* processes take) or leaves the mapped state unchanged (StepsRefine).     *)
(*                                                                         *)
(* The main spec's engine is the process that holds the current lease      *)
(* epoch (Owner): with the lease only it commits, so its view is what the *)
(* store holds, and its location is the main spec's stage.  A process     *)
(* that loses the session (another takes it, it crashes, or its commit is *)
(* refused) is the main spec's Crash; a worker declared dead is a crashed  *)
(* engine, whose late send is the main spec's EngineZombieSend.  The       *)
(* concurrent spec's conversation is one durable, approved call with fixed *)
(* arguments, so the main spec's conversation, approval, placement and     *)
(* key-retention variables map to constants.                               *)
(*                                                                         *)
(* History variables (no implementation keeps them; they change nothing    *)
(* the concurrent spec does):                                              *)
(*  - parked: requests that left the external system with no effect and    *)
(*    no answer the owner took (an epoch-aware connector dropped a stale    *)
(*    epoch's unfenced request, or a definite rejection reached no one    *)
(*    but a stale worker): in the main spec such a request is one that is *)
(*    never processed, so it stays in flight;                             *)
(*  - lost: the main spec's crashes (crashes of the owner, takeovers of a  *)
(*    held session, refusals of the owner), from 1: the concurrent Init is *)
(*    a session a crashed engine left (MCMappedInitReachable shows each    *)
(*    mapped initial state is reached by the main spec, and that with     *)
(*    lost = 0 two of them are not);                                      *)
(*  - resent: requests sent after the outcome was durable, every one (the *)
(*    concurrent ghost counts only those that can still reach the tool).   *)
(*                                                                         *)
(* Decision rows map without inputs (the cfg overrides the main spec's    *)
(* RowInputs with WithoutInputs: the concurrent audit keys carry none).   *)
(* The lease is required (UseLease): without it the owner is the last     *)
(* process to commit, and one concurrent step (a current view's Recover    *)
(* beside a worker that waits) is two main steps, Crash then Recover: a    *)
(* mapping would need a stuttering variable (docs/protocol.md).            *)
(***************************************************************************)
EXTENDS MCConcurrentResumers

VARIABLES parked, lost, resent

hist == <<parked, lost, resent>>

(* The process holding the current epoch, at work on the call. *)
Owner == {p \in Procs : pc[p] # "idle" /\ held[p] = epoch}

HNext ==
    \/ \E p \in Procs :
         /\ TakeSession(p)
         /\ lost' = lost + (IF Owner # {} THEN 1 ELSE 0)
         /\ UNCHANGED <<parked, resent>>
    \/ \E p \in Procs :
         /\ Crash(p) \/ Refused(p)
         /\ lost' = lost + (IF p \in Owner THEN 1 ELSE 0)
         /\ UNCHANGED <<parked, resent>>
    \/ \E p \in Procs :
         /\ InvokeAdapter(p)
         /\ resent' = resent + (IF knownOutcome THEN 1 ELSE 0)
         /\ UNCHANGED <<parked, lost>>
    \/ \E r \in Requests :
         /\ ExternalDrop(r)
         /\ parked' = IF Fenced(r) THEN parked ELSE parked \cup {r}
         /\ UNCHANGED <<lost, resent>>
    \/ \E r \in Requests :
         /\ ExternalRejectDefinite(r)
         /\ parked' = IF \E o \in Owner : Takes(o, r) THEN parked ELSE parked \cup {r}
         /\ UNCHANGED <<lost, resent>>
    \/ /\ \/ \E p \in Procs : AnnounceEpoch(p)
          \/ \E p \in Procs : Recover(p)
          \/ \E p \in Procs : PersistDispatched(p)
          \/ \E p \in Procs : RecordSucceeded(p)
          \/ \E p \in Procs : RecordFailed(p)
          \/ \E p \in Procs : AppendResult(p)
          \/ \E p \in Procs : Timeout(p)
          \/ \E p \in Procs : ReconcileQuery(p)
          \/ \E p \in Procs : ReconcileCommit(p)
          \/ \E p \in Procs : HumanResolveApplied(p)
          \/ \E p \in Procs : HumanResolveRetry(p)
          \/ \E p \in Procs : HumanResolveAbandon(p)
          \/ \E r \in Requests : ExternalApply(r)
          \/ \E r \in Requests : ExternalApplyLoseAnswer(r)
       /\ UNCHANGED hist

HInit == Init /\ parked = {} /\ lost = 1 /\ resent = 0
HSpec == HInit /\ [][HNext]_<<vars, hist>>

(***************************************************************************)
(* The mapping.                                                            *)
(***************************************************************************)
TheCall == "c1"
TheId == <<1, 1, "t1">>          \* the main spec's IdAt(TheCall, 1)
TheArgs == "a"
NoResultM == [kind |-> "none", exec |-> <<>>, args |-> "none"]
NoInputsM ==
    [status |-> "none", attempt |-> 0, digestMatches |-> TRUE, approval |-> "none",
     hasResult |-> FALSE, policy |-> "none", legacy |-> FALSE,
     requiresApproval |-> FALSE, keyRetained |-> TRUE]
\* The main spec's RowInputs, overridden in the cfg: rows without inputs.
NoRowInputs(i) == NoInputsM
ResultM(k) == IF k = "none" THEN NoResultM
              ELSE [kind |-> k, exec |-> TheId, args |-> TheArgs]
RecordM ==
    [status |-> rec.status, attempt |-> rec.attempt,
     args |-> IF rec.status = "none" THEN "none" ELSE TheArgs,
     auth |-> rec.auth, result |-> ResultM(rec.result),
     call |-> IF rec.status = "none" THEN "none" ELSE TheCall]
RowsM == {<<k[1], k[2], NoInputsM>> : k \in audit}

(* The owner's location is the main spec's stage; with no owner the call  *)
(* is as a crash leaves it (resume if it has no result).                  *)
StageOfPc(o) ==
    CASE pc[o] \in {"taken", "resume"} -> IF view[o].res # "none" THEN "none" ELSE "resume"
      [] pc[o] \in {"rec_applied", "rec_not_applied", "rec_unknown"} -> "reconciling"
      [] pc[o] = "halted" -> "none"
      [] OTHER -> pc[o]
StageM ==
    IF Owner = {} THEN (IF res = "none" THEN "resume" ELSE "none")
    ELSE StageOfPc(CHOOSE o \in Owner : TRUE)

Main == INSTANCE DurableToolExecution WITH
    Calls <- {TheCall},
    Turn <- [c \in {TheCall} |-> 1],
    Slot <- [c \in {TheCall} |-> 1],
    ToolCallId <- [c \in {TheCall} |-> "t1"],
    Policy <- [c \in {TheCall} |-> Pol],
    NeedsApproval <- [c \in {TheCall} |-> NeedsApproval],
    ArgChoices <- [c \in {TheCall} |-> {TheArgs}],
    MarkerTurn <- 0,
    MaxCrashes <- 1 + MaxCrashes + 2 * MaxEpoch,
    MaxAttempts <- MaxAttempts,
    KeyByPosition <- TRUE,
    FenceOnReconcile <- TRUE,
    msg <- [c \in {TheCall} |-> "durable"],
    args <- [c \in {TheCall} |-> TheArgs],
    result <- [c \in {TheCall} |-> ResultM(res)],
    approval <- [e \in {TheId} |-> IF NeedsApproval THEN "approved" ELSE "none"],
    approvalArgs <- [e \in {TheId} |-> IF NeedsApproval THEN TheArgs ELSE "none"],
    ledger <- [e \in {TheId} |-> RecordM],
    audit <- [e \in {TheId} |-> RowsM],
    marker <- 0,
    stage <- [c \in {TheCall} |-> StageM],
    inflight <- [e \in {TheId} |-> {r[1] : r \in inflight \cup parked}],
    fenced <- [e \in {TheId} |-> fenced],
    applied <- [e \in {TheId} |-> applied],
    invocations <- [c \in {TheCall} |-> {<<TheId, i[1], i[2]>> : i \in invocations}],
    humanApproved <- IF NeedsApproval THEN {<<TheCall, TheArgs>>} ELSE {},
    humanRetries <- [e \in {TheId} |-> humanRetries],
    crashes <- lost,
    sent <- [c \in {TheCall} |-> sent],
    knownOutcome <- IF knownOutcome THEN {TheCall} ELSE {},
    sentAfterOutcome <- [c \in {TheCall} |-> resent],
    decided <- [c \in {TheCall} |-> {row \in RowsM : row[1] # "dispatch"}],
    turnOf <- [c \in {TheCall} |-> 1],
    storedId <- [c \in {TheCall} |-> TheId],
    renumbers <- 0,
    repairs <- 0,
    effects <- [c \in {TheCall} |-> applied],
    windowPassed <- {},
    keyForgotten <- {},
    droppedAnswers <- {}

(***************************************************************************)
(* Twin RefinesAuthMislabelled: a first attempt recorded as authorized by *)
(* a human (AttemptAuth), not by the approval it was dispatched on.  Every *)
(* invariant of the concurrent spec still holds (none reads who authorized *)
(* a first attempt, and the approval is used once); the main spec's        *)
(* dispatch writes the approval's authorization, so the step has no image *)
(* and StepsRefine fails: the audit would tell a human decided what no    *)
(* human was asked.                                                        *)
(***************************************************************************)
AuthMislabelled(p) == IF pc[p] = "retry"
                      THEN (IF RetryGranted(view[p]) THEN "human" ELSE "policy")
                      ELSE "human"

(* StepsRefine: every step of the concurrent spec is a step of the main   *)
(* spec's ConcurrentNext under the mapping, or a stutter of it.           *)
StepsRefine == [][Main!ConcurrentNext]_(Main!vars)

(* MappedTypeOK: the mapped state is of the main spec's type.             *)
MappedTypeOK == Main!TypeOK

(* The main spec's safety invariants, each on the mapped state: what      *)
(* ConcurrentResumers restates in its own variables, checked here in the  *)
(* main spec's own words.  The Refines models check all of them but two:  *)
(*  - AuditRecomputable: the mapped rows carry no inputs (NoInputsM), as   *)
(*    in every main model with RowInputs <- WithoutInputs (they omit it);  *)
(*  - NoReinvokeAfterKnownOutcome: a stale worker's send after a human    *)
(*    resolved the call is the main spec's EngineZombieSend, a             *)
(*    ConcurrentNext step that counts every send after the outcome (its    *)
(*    sentAfterOutcome), while the epoch-aware connector refuses that      *)
(*    request: ConcurrentResumers' own NoReinvokeAfterKnownOutcome counts  *)
(*    only the sends that can still reach the tool.  RefinesZombieAfter-   *)
(*    Outcome records that the main form fails (1,985 states); its stage  *)
(*    clause, MappedNoReinvokeStage, holds and is checked.                 *)
MappedAtMostOnceEffect == Main!AtMostOnceEffect
MappedNoReinvokeAfterKnownOutcome == Main!NoReinvokeAfterKnownOutcome
MappedNoReinvokeStage == knownOutcome => StageM \notin {"dispatched", "retry"}
MappedAttemptSentOnce == Main!AttemptSentOnce
MappedNoBlindReplay == Main!NoBlindReplay
MappedResultFidelity == Main!ResultFidelity
MappedApprovalGate == Main!ApprovalGate
MappedApprovalBoundToArgs == Main!ApprovalBoundToArgs
MappedApprovalSingleUse == Main!ApprovalSingleUse
MappedRecoveryRequiredHalts == Main!RecoveryRequiredHalts
MappedHumanSeesKnownOutcome == Main!HumanSeesKnownOutcome
MappedLegacyConservative == Main!LegacyConservative
MappedExecutionIdStable == Main!ExecutionIdStable
MappedAuditComplete == Main!AuditComplete
MappedCancelledNeverInvoked == Main!CancelledNeverInvoked
MappedRetryGrantHonoured == Main!RetryGrantHonoured

=============================================================================
