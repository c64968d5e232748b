-------------------- MODULE MCLivenessTwins --------------------
(***************************************************************************)
(* Liveness twins: an ENGINE bug, with every fairness assumption kept,    *)
(* must break EventuallySettled (LivenessNoHumanFairness only shows that  *)
(* the human fairness assumption is needed).  One reconcile call that     *)
(* needs no approval, no crash, 2 attempts.                               *)
(* Every constant is a literal: the Python checkers read them from here.   *)
(***************************************************************************)
EXTENDS DurableToolExecution

MCCalls == {"c1"}
MCTurn == [c1 |-> 1]
MCSlot == [c1 |-> 0]
MCToolCallId == [c1 |-> "call_0"]
MCPolicy == [c1 |-> "reconcile"]
MCNeedsApproval == [c1 |-> FALSE]
MCArgChoices == [c1 |-> {"a1"}]
MCMarkerTurn == 0
MCMaxCrashes == 0
MCMaxAttempts == 2
MCKeyByPosition == TRUE
MCFenceOnReconcile == TRUE

(* ReconcilePollsForever: a connector that cannot tell makes the engine    *)
(* ask again (back to Recover, which decides reconcile again) instead of   *)
(* halting for a human.  Every step is a fair engine step and every        *)
(* safety invariant holds; the call never settles.                         *)
ReconcilePollsAgain(c) ==
    LET e == ExecId(c) IN
    /\ stage[c] = "reconciling"
    /\ Audited(e, "reconcile_unknown", Rec(c).attempt)
    /\ Decided(c, "reconcile_unknown", Rec(c).attempt)
    /\ stage' = [stage EXCEPT ![c] = "resume"]
    /\ UNCHANGED <<msg, args, result, ledger, approval, approvalArgs, marker>>
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, invocations, humanApproved, humanRetries, crashes,
                   sent, knownOutcome, sentAfterOutcome>>
    /\ UNCHANGED positions
    /\ UNCHANGED extVars
=============================================================================
