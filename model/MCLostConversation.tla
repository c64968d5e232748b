-------------------- MODULE MCLostConversation --------------------
(***************************************************************************)
(* The conversation loses or renumbers an unanswered call while the ledger *)
(* and the approval survive: one manual call that needs approval, whose    *)
(* arguments the provider may change when it emits a call at the same      *)
(* position again; one crash, one load-time repair (ConversationRepair)    *)
(* and two attempts, so that a human retry is possible after the repair.   *)
(* With the old halt (a halt rebinds the record to the call now at its     *)
(* position, and a human may retry any halted record) a human retry sends  *)
(* attempt 2 of an execution whose outcome a human declared known          *)
(* (HaltRebindsRecord twin: NoReinvokeAfterKnownOutcome,                  *)
(* 1,882 states).  With                                                     *)
(* approvals bound to the position only, the other call is dispatched on   *)
(* the lost call's approval (ApprovalByPosition twin: ApprovalBoundToArgs).*)
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
MCMaxAttempts == 2
MCKeyByPosition == TRUE
MCFenceOnReconcile == TRUE
MCMaxRepairs == 1

(* DigestIgnored twin: Decide trusts a record whatever call stands at its  *)
(* position (the digest always "matches").  Breaks ResultFidelity: a       *)
(* succeeded record of the lost call is reconstructed as the other         *)
(* call's result.                                                          *)
DecideIgnoresDigest(c) ==
    Decide([DecisionInputs(c) EXCEPT !.digestMatches = TRUE])

(* HaltRebindsRecord twin: the old rule (HaltKeepsRecord = FALSE).         *)
MCHaltKeepsRecord == FALSE

(* ApprovalByPosition twin: an approval binds the position only            *)
(* (ApprovalBindsArgs = FALSE).  Approve a1, crash, the repair drops it,   *)
(* the provider emits a2 at the same (turn, slot, call_0): a2 is           *)
(* dispatched on a1's approval.  Breaks ApprovalBoundToArgs (ApprovalGate, *)
(* which reads positions, holds).                                          *)
MCApprovalBindsArgs == FALSE
=============================================================================
