-------------------- MODULE MCLegacyUpgradeDeep --------------------
(***************************************************************************)
(* LegacyUpgrade with two crashes (not in CI: 327,753 states).            *)
(* Every constant is a literal: the Python checkers read them from here.   *)
(***************************************************************************)
EXTENDS DurableToolExecution

MCCalls == {"c1", "c2"}
MCTurn == [c1 |-> 0, c2 |-> 1]
MCSlot == [c1 |-> 0, c2 |-> 0]
MCToolCallId == [c1 |-> "call_0", c2 |-> "call_0"]
MCPolicy == [c1 |-> "idempotent", c2 |-> "reconcile"]
MCNeedsApproval == [c1 |-> TRUE, c2 |-> TRUE]
MCArgChoices == [c1 |-> {"a1"}, c2 |-> {"a2"}]
MCMarkerTurn == 1
MCMaxCrashes == 2
MCMaxAttempts == 2
MCKeyByPosition == TRUE
MCFenceOnReconcile == TRUE
=============================================================================
