-------------------- MODULE MCRenumbered --------------------
(***************************************************************************)
(* The conversation renumbers an unanswered call (compaction or a load-    *)
(* time repair moves the turn the engine derives from the conversation's   *)
(* length) while its requests may be in flight: one idempotent call that   *)
(* needs approval, one crash, one renumbering, two attempts (a policy      *)
(* retry after the renumbering must carry the stored id).                  *)
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
MCMaxRenumbers == 1

(* IdFromPosition twin: the engine re-derives the id from the turn it      *)
(* reads now instead of the stored one.  Breaks ExecutionIdStable: after   *)
(* a renumbering the call's earlier requests carry another id, and its     *)
(* next request goes out under a key the external system never saw (no     *)
(* record, no approval, no deduplication behind it).                       *)
MCUseStoredId == FALSE

(* ResultUnderDerivedId twin: the engine stamps a result with the id it    *)
(* derives from the call's position when it writes the result, not with   *)
(* the execution's (stored) id: after a renumbering the result names      *)
(* another execution.  Nothing but the stamp changes (only ResultFidelity *)
(* reads a result's exec), so it breaks ResultFidelity through its exec   *)
(* clause alone (model/clauses.toml).                                      *)
CallOfId(e) == CHOOSE c \in Calls : e \in {IdAt(c, t) : t \in Renumberings(c)}
ResultUnderDerivedId(k, e, a) == [kind |-> k, exec |-> DerivedId(CallOfId(e)), args |-> a]
=============================================================================
