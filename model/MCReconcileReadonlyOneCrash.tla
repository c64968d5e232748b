-------------------- MODULE MCReconcileReadonlyOneCrash --------------------
(***************************************************************************)
(* A reconcile call whose arguments may change before the call is durable, *)
(* then a readonly call that needs no approval; one crash.                 *)
(* ReconcileReadonly with one crash instead of two (11,494 states, not     *)
(* 39,281): the size whose conformance check make check can afford; the    *)
(* two-crash model's conformance runs in make test.                        *)
(* Every constant is a literal: the Python checkers read them from here.   *)
(***************************************************************************)
EXTENDS DurableToolExecution

MCCalls == {"c1", "c2"}
MCTurn == [c1 |-> 1, c2 |-> 2]
MCSlot == [c1 |-> 0, c2 |-> 0]
MCToolCallId == [c1 |-> "call_0", c2 |-> "call_0"]
MCPolicy == [c1 |-> "reconcile", c2 |-> "readonly"]
MCNeedsApproval == [c1 |-> TRUE, c2 |-> FALSE]
MCArgChoices == [c1 |-> {"a1", "a2"}, c2 |-> {"a3"}]
MCMarkerTurn == 0
MCMaxCrashes == 1
MCMaxAttempts == 2
MCKeyByPosition == TRUE
MCFenceOnReconcile == TRUE
=============================================================================
