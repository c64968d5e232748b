-------------------- MODULE MCCancelIgnored --------------------
(***************************************************************************)
(* Twin: an engine whose dispatch loop ignores the user's Stop (it keeps   *)
(* its in-memory "live" stage after HumanCancel); one auto manual call.    *)
(* Every constant is a literal: the Python checkers read them from here.   *)
(***************************************************************************)
EXTENDS DurableToolExecution

MCCalls == {"c1"}
MCTurn == [c1 |-> 1]
MCSlot == [c1 |-> 0]
MCToolCallId == [c1 |-> "call_0"]
MCPolicy == [c1 |-> "manual"]
MCNeedsApproval == [c1 |-> FALSE]
MCArgChoices == [c1 |-> {"a1"}]
MCMarkerTurn == 0
MCMaxCrashes == 0
MCMaxAttempts == 1
MCKeyByPosition == TRUE
MCFenceOnReconcile == TRUE

MCCancelStopsEngine == FALSE
=============================================================================
