-------------------- MODULE MCSameTurnOneCrash --------------------
(***************************************************************************)
(* Two calls of ONE assistant message (turn 1, slots 0 and 1), both with   *)
(* the provider id "": a manual call and an idempotent call, neither       *)
(* needing approval, and ONE crash: the calls an engine runs with          *)
(* Session.execute_message(together=True), both dispatched before either   *)
(* is invoked, and a crash between the record commit and the outcome       *)
(* commit.  One attempt, and its conformance row: after the crash an      *)
(* unknown call halts for a human.  SameTurnCrashRetry is the same two    *)
(* calls with two attempts (a retry under the key, a human retry), TLC    *)
(* only; SameTurn (no crash) is its live sibling.                         *)
(* Every constant is a literal: the Python checkers read them from here.   *)
(***************************************************************************)
EXTENDS DurableToolExecution

MCCalls == {"c1", "c2"}
MCTurn == [c1 |-> 1, c2 |-> 1]
MCSlot == [c1 |-> 0, c2 |-> 1]
MCToolCallId == [c1 |-> "", c2 |-> ""]
MCPolicy == [c1 |-> "manual", c2 |-> "idempotent"]
MCNeedsApproval == [c1 |-> FALSE, c2 |-> FALSE]
MCArgChoices == [c1 |-> {"a1"}, c2 |-> {"a2"}]
MCMarkerTurn == 0
MCMaxCrashes == 1
MCMaxAttempts == 1
MCKeyByPosition == TRUE
MCFenceOnReconcile == TRUE
\* Its .cfg writes decision rows without their inputs, as SameTurn's does.
MCDecisionRowsWithInputs == FALSE
=============================================================================
