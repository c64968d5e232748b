-------------------- MODULE MCSameTurnCrashRetry --------------------
(***************************************************************************)
(* Two calls of ONE assistant message in flight together, a crash and a    *)
(* retry: SameTurnOneCrash with TWO attempts.  Both calls (a manual and an *)
(* idempotent one, neither needing approval, both with the provider id     *)
(* "") are dispatched before either is invoked; after the crash the        *)
(* idempotent call is retried under its key while the manual one halts,    *)
(* and a human may retry it: every interleaving of the two calls' attempts,*)
(* answers and late answers.  No conformance row (SameTurnOneCrash has     *)
(* it): TLC only.                                                          *)
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
MCMaxAttempts == 2
MCKeyByPosition == TRUE
MCFenceOnReconcile == TRUE
\* Its .cfg writes decision rows without their inputs, as SameTurn's does.
MCDecisionRowsWithInputs == FALSE
=============================================================================
