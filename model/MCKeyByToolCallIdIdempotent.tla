-------------------- MODULE MCKeyByToolCallIdIdempotent --------------------
(***************************************************************************)
(* Shortcut: the execution id is (session_id, tool_call_id) only, the      *)
(* provider reuses call_0 on the next turn, and both calls are idempotent  *)
(* and need no approval (auto: a standing grant), with the SAME arguments  *)
(* (the model asks for the same thing again on the next turn).  The second *)
(* call is persisted at an id that has the first call's record, so it goes *)
(* through Recover; the digest matches, so the first call's "ok" is        *)
(* reconstructed as the second call's result, although its own effect      *)
(* never happened: only effects keyed by the CALL see it (ResultFidelity). *)
(* With different arguments the digest rule halts the second call and no   *)
(* human choice there invokes it (HumanMayRetry), so nothing breaks.       *)
(* Every constant is a literal: the Python checkers read them from here.   *)
(***************************************************************************)
EXTENDS DurableToolExecution

MCCalls == {"c1", "c2"}
MCTurn == [c1 |-> 1, c2 |-> 2]
MCSlot == [c1 |-> 0, c2 |-> 0]
MCToolCallId == [c1 |-> "call_0", c2 |-> "call_0"]
MCPolicy == [c1 |-> "idempotent", c2 |-> "idempotent"]
MCNeedsApproval == [c1 |-> FALSE, c2 |-> FALSE]
MCArgChoices == [c1 |-> {"a1"}, c2 |-> {"a1"}]
MCMarkerTurn == 0
MCMaxCrashes == 0
MCMaxAttempts == 2
MCKeyByPosition == FALSE
MCFenceOnReconcile == TRUE
=============================================================================
