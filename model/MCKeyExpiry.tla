-------------------- MODULE MCKeyExpiry --------------------
(***************************************************************************)
(* Key retention: one idempotent call that needs approval, whose external  *)
(* system forgets the idempotency key once the tool's declared retention   *)
(* window has passed (KeysExpire: RetentionWindowPasses, ExternalExpireKey *)
(* are enabled), 1 crash, 2 attempts.  Recover must halt rather than retry *)
(* with the same id once the window has passed (keyRetained = FALSE).      *)
(* Every constant is a literal: the Python checkers read them from here.   *)
(***************************************************************************)
EXTENDS DurableToolExecution

MCCalls == {"c1"}
MCTurn == [c1 |-> 1]
MCSlot == [c1 |-> 0]
MCToolCallId == [c1 |-> "call_0"]
MCPolicy == [c1 |-> "idempotent"]
MCNeedsApproval == [c1 |-> TRUE]
MCArgChoices == [c1 |-> {"a1"}]
MCMarkerTurn == 0
MCMaxCrashes == 1
MCMaxAttempts == 2
MCKeyByPosition == TRUE
MCFenceOnReconcile == TRUE
MCKeysExpire == TRUE
=============================================================================
