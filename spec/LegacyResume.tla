---------------------------- MODULE LegacyResume ----------------------------
(***************************************************************************)
(* Today's engine (openworker before the ledger), as reported in its issue *)
(* #443: a call counts as done only when a role="tool" result is in the   *)
(* persisted conversation; results become durable at the end of the      *)
(* iteration; durable resume re-runs every unanswered trailing call and   *)
(* reuses its already-resolved approval.                                   *)
(*                                                                         *)
(* With RecordSuccess = TRUE it is the "record only success" shortcut of   *)
(* docs/protocol.md#what-must-fail: a success record right after the       *)
(* adapter returns, but nothing is written before it is invoked.  Both    *)
(* break AtMostOnceEffect; TLC's counterexample for the first is the      *)
(* seed's reproduction step by step.  Safety only.                         *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets

CONSTANTS Calls, MaxCrashes, RecordSuccess

VARIABLES
    msg,          \* msg[c]: "absent" | "volatile" | "durable"
    result,       \* result[c]: "none" | "volatile" | "durable" (role="tool")
    approval,     \* approval[c]: "none" | "pending" | "approved" (the inbox)
    ledger,       \* ledger[c]: "none" | "succeeded" (only with RecordSuccess)
    stage,        \* stage[c]: volatile engine progress
    inflight,     \* inflight[c]: a request is out at the external system
    applied,      \* ghost: how many times the effect was applied
    crashes

vars == <<msg, result, approval, ledger, stage, inflight, applied, crashes>>

TypeOK ==
    /\ msg \in [Calls -> {"absent", "volatile", "durable"}]
    /\ result \in [Calls -> {"none", "volatile", "durable"}]
    /\ approval \in [Calls -> {"none", "pending", "approved"}]
    /\ ledger \in [Calls -> {"none", "succeeded"}]
    /\ stage \in [Calls -> {"none", "live", "waiting", "got_ok", "recorded", "resume"}]
    /\ inflight \in [Calls -> BOOLEAN]
    /\ applied \in [Calls -> Nat]
    /\ crashes \in 0..MaxCrashes

Init ==
    /\ msg = [c \in Calls |-> "absent"]
    /\ result = [c \in Calls |-> "none"]
    /\ approval = [c \in Calls |-> "none"]
    /\ ledger = [c \in Calls |-> "none"]
    /\ stage = [c \in Calls |-> "none"]
    /\ inflight = [c \in Calls |-> FALSE]
    /\ applied = [c \in Calls |-> 0]
    /\ crashes = 0

\* The provider emits the call (in memory).
ProviderEmitCall(c) ==
    /\ msg[c] = "absent"
    /\ msg' = [msg EXCEPT ![c] = "volatile"]
    /\ stage' = [stage EXCEPT ![c] = "live"]
    /\ UNCHANGED <<result, approval, ledger, inflight, applied, crashes>>

\* The approver parks the approval and persists the session (the call too).
EngineParkApproval(c) ==
    /\ stage[c] = "live" /\ approval[c] = "none"
    /\ approval' = [approval EXCEPT ![c] = "pending"]
    /\ msg' = [msg EXCEPT ![c] = "durable"]
    /\ UNCHANGED <<result, ledger, stage, inflight, applied, crashes>>

HumanApprove(c) ==
    /\ approval[c] = "pending" /\ msg[c] = "durable"
    /\ approval' = [approval EXCEPT ![c] = "approved"]
    /\ UNCHANGED <<msg, result, ledger, stage, inflight, applied, crashes>>

\* registry.execute(...): the request goes out.
EngineInvokeAdapter(c) ==
    /\ stage[c] = "live" /\ approval[c] = "approved"
    /\ inflight' = [inflight EXCEPT ![c] = TRUE]
    /\ stage' = [stage EXCEPT ![c] = "waiting"]
    /\ UNCHANGED <<msg, result, approval, ledger, applied, crashes>>

\* The external system delivers (e.g. the email is sent) and answers.
ExternalApply(c) ==
    /\ inflight[c]
    /\ inflight' = [inflight EXCEPT ![c] = FALSE]
    /\ applied' = [applied EXCEPT ![c] = @ + 1]
    /\ stage' = [stage EXCEPT ![c] = IF @ = "waiting" THEN "got_ok" ELSE @]
    /\ UNCHANGED <<msg, result, approval, ledger, crashes>>

\* The shortcut only: success is recorded right after the adapter returns.
EngineRecordSucceeded(c) ==
    /\ RecordSuccess /\ stage[c] = "got_ok"
    /\ ledger' = [ledger EXCEPT ![c] = "succeeded"]
    /\ stage' = [stage EXCEPT ![c] = "recorded"]
    /\ UNCHANGED <<msg, result, approval, inflight, applied, crashes>>

\* _record_result: appended to the in-memory history only.
EngineAppendResult(c) ==
    /\ stage[c] = IF RecordSuccess THEN "recorded" ELSE "got_ok"
    /\ result' = [result EXCEPT ![c] = "volatile"]
    /\ stage' = [stage EXCEPT ![c] = "none"]
    /\ UNCHANGED <<msg, approval, ledger, inflight, applied, crashes>>

\* iteration_end: the checkpoint that makes results durable.
EngineCheckpoint ==
    /\ \E c \in Calls : result[c] = "volatile" \/ msg[c] = "volatile"
    /\ result' = [c \in Calls |-> IF result[c] = "volatile" THEN "durable" ELSE result[c]]
    /\ msg' = [c \in Calls |-> IF msg[c] = "volatile" THEN "durable" ELSE msg[c]]
    /\ UNCHANGED <<approval, ledger, stage, inflight, applied, crashes>>

Crash ==
    /\ crashes < MaxCrashes
    /\ crashes' = crashes + 1
    /\ msg' = [c \in Calls |-> IF msg[c] = "volatile" THEN "absent" ELSE msg[c]]
    /\ result' = [c \in Calls |-> IF result[c] = "volatile" THEN "none" ELSE result[c]]
    /\ stage' = [c \in Calls |->
                   IF msg[c] = "durable" /\ result[c] # "durable" THEN "resume" ELSE "none"]
    /\ UNCHANGED <<approval, ledger, inflight, applied>>

\* _durable_resume: an unanswered trailing call is re-driven; the resolved
\* approval is found again by (session_id, tool_call_id) and reused.
Recover(c) ==
    /\ stage[c] = "resume"
    /\ stage' = [stage EXCEPT ![c] = IF ledger[c] = "succeeded" THEN "recorded" ELSE "live"]
    /\ UNCHANGED <<msg, result, approval, ledger, inflight, applied, crashes>>

Next ==
    \/ \E c \in Calls : ProviderEmitCall(c)
    \/ \E c \in Calls : EngineParkApproval(c)
    \/ \E c \in Calls : HumanApprove(c)
    \/ \E c \in Calls : EngineInvokeAdapter(c)
    \/ \E c \in Calls : ExternalApply(c)
    \/ \E c \in Calls : EngineRecordSucceeded(c)
    \/ \E c \in Calls : EngineAppendResult(c)
    \/ EngineCheckpoint
    \/ Crash
    \/ \E c \in Calls : Recover(c)

Spec == Init /\ [][Next]_vars

(* AtMostOnceEffect: one approval, one delivery.                           *)
AtMostOnceEffect == \A c \in Calls : applied[c] <= 1
=============================================================================
