-------------------- MODULE MCLiveness --------------------
(***************************************************************************)
(* An idempotent call, then a reconcile call in the next turn reusing      *)
(* call_0; one crash.                                                      *)
(* Every constant is a literal: the Python checkers read them from here.   *)
(***************************************************************************)
EXTENDS DurableToolExecution

MCCalls == {"c1", "c2"}
MCTurn == [c1 |-> 1, c2 |-> 2]
MCSlot == [c1 |-> 0, c2 |-> 0]
MCToolCallId == [c1 |-> "call_0", c2 |-> "call_0"]
MCPolicy == [c1 |-> "idempotent", c2 |-> "reconcile"]
MCNeedsApproval == [c1 |-> TRUE, c2 |-> TRUE]
MCArgChoices == [c1 |-> {"a1"}, c2 |-> {"a2"}]
MCMarkerTurn == 0
MCMaxCrashes == 1
MCMaxAttempts == 2
MCKeyByPosition == TRUE
MCFenceOnReconcile == TRUE

\* Liveness.cfg and LivenessNoHumanFairness.cfg write decision rows without
\* their inputs (RowInputs <- WithoutInputs: sound for EventuallySettled).
MCDecisionRowsWithInputs == FALSE
=============================================================================
