-------------------- MODULE MCDeepManual --------------------
(***************************************************************************)
(* One manual call that needs no approval (a standing grant or a           *)
(* scheduled run: dispatched on "auto"), 3 crashes, 3 attempts: reaches    *)
(* two human retries and the user's Stop before dispatch (Decide: skip).   *)
(* Every constant is a literal: the Python checkers read them from here.   *)
(***************************************************************************)
EXTENDS DurableToolExecution

MCCalls == {"c1"}
MCTurn == [c1 |-> 1]
MCSlot == [c1 |-> 0]
MCToolCallId == [c1 |-> "call_0"]
MCPolicy == [c1 |-> "manual"]
MCNeedsApproval == [c1 |-> FALSE]
MCArgChoices == [c1 |-> {"a1"}]
MCMarkerTurn == 0
MCMaxCrashes == 3
MCMaxAttempts == 3
MCKeyByPosition == TRUE
MCFenceOnReconcile == TRUE

(***************************************************************************)
(* Witnesses: each is the negation of a situation this model must reach;  *)
(* a witness model checks one of them and must find it violated, so a     *)
(* change that makes the situation unreachable fails `toolledger check`.  *)
(***************************************************************************)
\* a protected call that needs no approval is invoked (authorization auto)
WitnessAutoDispatch ==
    ~\E c \in Calls : Protected(c) /\ \E i \in invocations[c] : i[3] = "auto"

\* a human authorized two retries of one execution
WitnessTwoHumanRetries == ~\E e \in ExecIds : humanRetries[e] >= 2

=============================================================================
