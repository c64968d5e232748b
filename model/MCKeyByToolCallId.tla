-------------------- MODULE MCKeyByToolCallId --------------------
(***************************************************************************)
(* Shortcut: the execution id is (session_id, tool_call_id) only, and the  *)
(* provider reuses call_0 on the next turn.                                *)
(* Every constant is a literal: the Python checkers read them from here.   *)
(***************************************************************************)
EXTENDS DurableToolExecution

MCCalls == {"c1", "c2"}
MCTurn == [c1 |-> 1, c2 |-> 2]
MCSlot == [c1 |-> 0, c2 |-> 0]
MCToolCallId == [c1 |-> "call_0", c2 |-> "call_0"]
MCPolicy == [c1 |-> "manual", c2 |-> "manual"]
MCNeedsApproval == [c1 |-> TRUE, c2 |-> TRUE]
MCArgChoices == [c1 |-> {"a1"}, c2 |-> {"a2"}]
MCMarkerTurn == 0
MCMaxCrashes == 1
MCMaxAttempts == 2
MCKeyByPosition == FALSE
MCFenceOnReconcile == TRUE
=============================================================================
