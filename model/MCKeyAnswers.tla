-------------------- MODULE MCKeyAnswers --------------------
(***************************************************************************)
(* Key answers: one idempotent call that needs approval, whose external    *)
(* system answers a request under a key it knows "in flight" (409),       *)
(* "parameters differ" (422) or with a replayed failure (a stored 500)    *)
(* (KeyAnswers: ExternalAnswerInFlight, ExternalAnswerParamsDiffer,       *)
(* ExternalReplayFailure are enabled), and forgets keys after the tool's  *)
(* retention window (KeysExpire), 1 crash, 2 attempts.  The adapter seam   *)
(* classifies each key answer as unknown.                                  *)
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
MCKeyAnswers == TRUE
=============================================================================
