-------------------- MODULE MCLivenessRepair --------------------
(***************************************************************************)
(* A liveness twin of the conversation's repair (LivenessLostConversation: *)
(* the constants of MCLostConversation).  ParkOnlyFirstApproval: the       *)
(* engine parks an approval only where none exists, so a call the         *)
(* provider emits again with other arguments after a repair never gets its *)
(* own approval asked: it is never sent on the lost call's approval        *)
(* (ApprovalBoundToArgs holds) and never answered.  Every fairness         *)
(* assumption is kept; the step is a fair engine step that is simply not   *)
(* enabled, so the twin is checked under FairSpec (ENABLED), not under the *)
(* guards (FairnessGuardsExact would fail first).                          *)
(***************************************************************************)
EXTENDS MCLostConversation

\* EngineParkApproval with "none" for NeedsNewApproval(c) (a copy, not a
\* call: the cfg substitutes this operator for EngineParkApproval).
ParkOnlyFirstApproval(c) ==
    /\ stage[c] = "live" /\ NeedsApproval[c] /\ approval[ExecId(c)] = "none"
    /\ approval' = [approval EXCEPT ![ExecId(c)] = "pending"]
    /\ approvalArgs' = [approvalArgs EXCEPT ![ExecId(c)] = args[c]]
    /\ UNCHANGED <<msg, args, result, ledger, audit, marker, stage>>
    /\ UNCHANGED external /\ UNCHANGED ghosts
    /\ UNCHANGED positions
    /\ UNCHANGED extVars
=============================================================================
