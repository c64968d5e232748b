-------------------- MODULE MCThreeCalls --------------------
(***************************************************************************)
(* Three calls in two turns: manual and idempotent in turn 1, reconcile in *)
(* turn 2 reusing call_0; one crash (not in CI: about 2.4M states).        *)
(* Every constant is a literal: the Python checkers read them from here.   *)
(***************************************************************************)
EXTENDS DurableToolExecution

MCCalls == {"c1", "c2", "c3"}
MCTurn == [c1 |-> 1, c2 |-> 1, c3 |-> 2]
MCSlot == [c1 |-> 0, c2 |-> 1, c3 |-> 0]
MCToolCallId == [c1 |-> "call_0", c2 |-> "call_1", c3 |-> "call_0"]
MCPolicy == [c1 |-> "manual", c2 |-> "idempotent", c3 |-> "reconcile"]
MCNeedsApproval == [c1 |-> TRUE, c2 |-> TRUE, c3 |-> TRUE]
MCArgChoices == [c1 |-> {"a1"}, c2 |-> {"a2"}, c3 |-> {"a3"}]
MCMarkerTurn == 0
MCMaxCrashes == 1
MCMaxAttempts == 2
MCKeyByPosition == TRUE
MCFenceOnReconcile == TRUE
\* ThreeCalls.cfg writes decision rows without their inputs
\* (RowInputs <- WithoutInputs), as TwoCalls does.
MCDecisionRowsWithInputs == FALSE
=============================================================================
