----------------------- MODULE MCConcurrentDecideTie -----------------------
(***************************************************************************)
(* spec/ConcurrentResumers.tla restates the recovery decision Decide of    *)
(* spec/DurableToolExecution.tla (to stay a module of its own).  This      *)
(* model ties the two: DecideAgrees says they give the same decision on    *)
(* EVERY input of the main spec's Inputs, so a change of either that the  *)
(* other does not follow fails `toolledger check`.  The twin               *)
(* ConcurrentDecideDrift swaps in a drifted copy and must violate it.      *)
(* Both modules are instantiated with every constant and variable         *)
(* substituted: only their constant-level operators are used.             *)
(***************************************************************************)
EXTENDS Naturals

VARIABLE tick

TieMaxAttempts == 2

D == INSTANCE DurableToolExecution WITH
        Calls <- {"c1"}, Turn <- [c \in {"c1"} |-> 1], Slot <- [c \in {"c1"} |-> 0],
        ToolCallId <- [c \in {"c1"} |-> "call_0"],
        Policy <- [c \in {"c1"} |-> "manual"],
        NeedsApproval <- [c \in {"c1"} |-> TRUE],
        ArgChoices <- [c \in {"c1"} |-> {"a1"}], MarkerTurn <- 0,
        MaxCrashes <- 0, MaxAttempts <- TieMaxAttempts,
        KeyByPosition <- TRUE, FenceOnReconcile <- TRUE,
        msg <- 0, args <- 0, result <- 0, approval <- 0, approvalArgs <- 0, ledger <- 0, audit <- 0,
        marker <- 0, stage <- 0, inflight <- 0, fenced <- 0, applied <- 0,
        invocations <- 0, humanApproved <- 0, humanRetries <- 0, crashes <- 0,
        sent <- 0, knownOutcome <- 0, sentAfterOutcome <- 0, decided <- 0,
        turnOf <- 0, storedId <- 0, renumbers <- 0, repairs <- 0,
        effects <- 0, windowPassed <- 0, keyForgotten <- 0, droppedAnswers <- 0

CR == INSTANCE ConcurrentResumers WITH
        Procs <- {"p1"}, Pol <- "manual", NeedsApproval <- TRUE,
        MaxAttempts <- TieMaxAttempts, MaxCrashes <- 0, MaxEpoch <- 0,
        UseCAS <- TRUE, UseLease <- TRUE, EpochAware <- TRUE,
        rec <- 0, res <- 0, epoch <- 0, audit <- 0, pc <- 0, view <- 0, held <- 0,
        inflight <- 0, fenced <- 0, extEpoch <- 0, applied <- 0, sent <- 0,
        invocations <- 0, humanRetries <- 0, crashes <- 0, staleCommits <- 0,
        refusals <- 0, staleDropped <- 0, knownOutcome <- 0, sentAfterOutcome <- 0,
        droppedAfterOutcome <- 0, staleViewCommits <- 0

\* The restated decision (the twin's cfg overrides this name).
CRDecide(i) == CR!Decide(i)

\* A drifted restatement: an idempotent call at its last attempt is retried.
DriftedDecide(i) ==
    IF ~i.hasResult /\ i.policy = "idempotent" /\ i.status = "dispatched"
    THEN "retry_same_id" ELSE CR!Decide(i)

\* Two states: the check runs on the second one, so that TLC reports a
\* violation with a state count (a violation in the initial state has none).
Init == tick = 0
Next == tick' = 1
Spec == Init /\ [][Next]_tick

\* State-level (tick) on purpose: TLC refuses a FALSE constant invariant
\* with an error instead of reporting a violation.
DecideAgrees == tick = 0 \/ \A i \in D!Inputs : CRDecide(i) = D!Decide(i)
=============================================================================
