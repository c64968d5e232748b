-------------------- MODULE MCTwoCalls --------------------
(***************************************************************************)
(* Two calls in two turns that reuse the provider id call_0 (as Gemini     *)
(* does): a manual call whose arguments the model may change if it is      *)
(* asked again after a crash, then an idempotent call; both need approval; *)
(* two crashes. The conformance checker replays this model's whole state   *)
(* graph against the Python reference.                                     *)
(* Every constant is a literal: the Python checkers read them from here.   *)
(***************************************************************************)
EXTENDS DurableToolExecution

MCCalls == {"c1", "c2"}
MCTurn == [c1 |-> 1, c2 |-> 2]
MCSlot == [c1 |-> 0, c2 |-> 0]
MCToolCallId == [c1 |-> "call_0", c2 |-> "call_0"]
MCPolicy == [c1 |-> "manual", c2 |-> "idempotent"]
MCNeedsApproval == [c1 |-> TRUE, c2 |-> TRUE]
MCArgChoices == [c1 |-> {"a1", "a2"}, c2 |-> {"a3"}]
MCMarkerTurn == 0
MCMaxCrashes == 2
MCMaxAttempts == 2
MCKeyByPosition == TRUE
MCFenceOnReconcile == TRUE
\* TwoCalls.cfg writes decision rows without their inputs
\* (RowInputs <- WithoutInputs), which keeps this biggest conformance model
\* at its size; AuditRecomputable is checked on ReconcileReadonly and
\* LegacyUpgrade, whose rows carry the inputs.
MCDecisionRowsWithInputs == FALSE
=============================================================================
