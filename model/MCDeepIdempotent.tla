-------------------- MODULE MCDeepIdempotent --------------------
(***************************************************************************)
(* One idempotent legacy call (before the protocol marker) that needed no  *)
(* approval, 3 crashes, 3 attempts: reaches the legacy rule's no-approval  *)
(* branch (recovery_required) and human retries of a legacy call.          *)
(* Every constant is a literal: the Python checkers read them from here.   *)
(***************************************************************************)
EXTENDS DurableToolExecution

MCCalls == {"c1"}
MCTurn == [c1 |-> 0]
MCSlot == [c1 |-> 0]
MCToolCallId == [c1 |-> "call_0"]
MCPolicy == [c1 |-> "idempotent"]
MCNeedsApproval == [c1 |-> FALSE]
MCArgChoices == [c1 |-> {"a1"}]
MCMarkerTurn == 1
MCMaxCrashes == 3
MCMaxAttempts == 3
MCKeyByPosition == TRUE
MCFenceOnReconcile == TRUE

(***************************************************************************)
(* Witnesses: each is the negation of a situation this model must reach;  *)
(* a witness model checks one of them and must find it violated, so a     *)
(* change that makes the situation unreachable fails `toolledger check`.  *)
(***************************************************************************)
\* Recover applied the legacy rule to a call that needed no approval: its
\* record was halted at attempt 0, i.e. before any dispatch by this engine
WitnessLegacyNoApproval ==
    ~\E c \in Calls :
        /\ IsLegacy(c) /\ ~NeedsApproval[c] /\ Protected(c)
        /\ HasRow(ExecId(c), "recovery_required", 0)
=============================================================================
