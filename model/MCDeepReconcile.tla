-------------------- MODULE MCDeepReconcile --------------------
(***************************************************************************)
(* One reconcile call that needs approval, 3 crashes, 3 attempts.          *)
(* Every constant is a literal: the Python checkers read them from here.   *)
(***************************************************************************)
EXTENDS DurableToolExecution

MCCalls == {"c1"}
MCTurn == [c1 |-> 1]
MCSlot == [c1 |-> 0]
MCToolCallId == [c1 |-> "call_0"]
MCPolicy == [c1 |-> "reconcile"]
MCNeedsApproval == [c1 |-> TRUE]
MCArgChoices == [c1 |-> {"a1"}]
MCMarkerTurn == 0
MCMaxCrashes == 3
MCMaxAttempts == 3
MCKeyByPosition == TRUE
MCFenceOnReconcile == TRUE
\* Its .cfg writes decision rows without their inputs
\* (RowInputs <- WithoutInputs), which keeps the model at its size;
\* AuditRecomputable is checked on the models whose rows carry the inputs.
MCDecisionRowsWithInputs == FALSE
=============================================================================
