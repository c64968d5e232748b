-------------------- MODULE MCLostConversation --------------------
(***************************************************************************)
(* The conversation loses or renumbers an unanswered call while the ledger *)
(* and the approval survive: one manual call that needs approval, whose    *)
(* arguments the provider may change when it emits a call at the same      *)
(* position again; one crash and one load-time repair                      *)
(* (ConversationRepair).  One attempt: a human                             *)
(* retry of a digest-mismatched record would send the OTHER call under     *)
(* the first call's id, a limit the spec states (docs/protocol.md).        *)
(* Every constant is a literal: the Python checkers read them from here.   *)
(***************************************************************************)
EXTENDS DurableToolExecution

MCCalls == {"c1"}
MCTurn == [c1 |-> 1]
MCSlot == [c1 |-> 0]
MCToolCallId == [c1 |-> "call_0"]
MCPolicy == [c1 |-> "manual"]
MCNeedsApproval == [c1 |-> TRUE]
MCArgChoices == [c1 |-> {"a1", "a2"}]
MCMarkerTurn == 0
MCMaxCrashes == 1
MCMaxAttempts == 1
MCKeyByPosition == TRUE
MCFenceOnReconcile == TRUE
MCMaxRepairs == 1

(* DigestIgnored twin: Decide trusts a record whatever call stands at its  *)
(* position (the digest always "matches").  Breaks ResultFidelity: a       *)
(* succeeded record of the lost call is reconstructed as the other         *)
(* call's result.                                                          *)
DecideIgnoresDigest(c) ==
    Decide([DecisionInputs(c) EXCEPT !.digestMatches = TRUE])
=============================================================================
