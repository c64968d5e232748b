---------------------------- MODULE MCSecondValue ---------------------------
(***************************************************************************)
(* Second-call twins (model/clauses.toml, the "first" narrowing of a      *)
(* bound): a one-call twin violates its invariant at the only value of    *)
(* the domain, which is the first, so narrowing the bound to its first    *)
(* value changes nothing and no one-call twin can notice.  Here each twin *)
(* has two calls: c1, the first value of Calls (and, in turn 1, of        *)
(* ExecIds; first of LegacyCalls when both are legacy), is a readonly     *)
(* call that bypasses the ledger, so no invariant can fail at it; c2,     *)
(* in turn 2 (emitted once c1 has its result), is the one-call twin's     *)
(* call with the twin's mistake (the same .cfg substitution: a readonly   *)
(* call never reaches the paths any of them changes).  Every violation    *)
(* lies at c2: with the bound narrowed to its first value the twin        *)
(* passes.  For NoReinvokeAfterKnownOutcome, whose domain is knownOutcome, *)
(* c1 is an idempotent call with no approval and no user Stop (HumanCancel *)
(* off), so it is in knownOutcome before c2 is emitted.                   *)
(***************************************************************************)
EXTENDS MCTwins

SecondCalls == {"c1", "c2"}
SecondTurn == [c1 |-> 1, c2 |-> 2]
SecondSlot == [c1 |-> 0, c2 |-> 0]
SecondId == [c1 |-> "call_0", c2 |-> "call_0"]
SecondArgs == [c1 |-> {"a0"}, c2 |-> {"a1"}]
\* the repair twin (ApprovalByPosition): c2's arguments may change
SecondArgsChange == [c1 |-> {"a0"}, c2 |-> {"a1", "a2"}]
SecondRepairs == 1
SecondBindsPosition == FALSE
SecondApproval == [c1 |-> FALSE, c2 |-> TRUE]
SecondNoApproval == [c1 |-> FALSE, c2 |-> FALSE]
SecondManual == [c1 |-> "readonly", c2 |-> "manual"]
SecondIdempotent == [c1 |-> "readonly", c2 |-> "idempotent"]
\* knownOutcome's first value: c1 must have a known outcome
KnownThenReconcile == [c1 |-> "idempotent", c2 |-> "reconcile"]
NoUserStop(c) == FALSE
\* the renumbering twin (IdFromPosition): one renumbering, the id re-derived
SecondRenumbers == 1
SecondDerivesId == FALSE
SecondIdsDiffer == [c1 |-> "call_0", c2 |-> "call_1"]  \* ids unique when renumbered
\* LegacyCalls' first value: both calls legacy (turn 0, before the marker)
SecondLegacyTurn == [c1 |-> 0, c2 |-> 0]
SecondLegacySlot == [c1 |-> 0, c2 |-> 1]

(***************************************************************************)
(* Second-attempt twins: the same idea inside a call, for the bounds over *)
(* its attempts and invocations (n \in 1..MaxAttempts, i \in              *)
(* invocations[c]: the first value is attempt 1).  A one-call twin's      *)
(* mistake restricted to attempt 2 (ResendSecondAttempt), or to a call    *)
(* whose attempt 1 was sent (ManualRetryAfterSend, RetryDispatchUnaudited) *)
(* kills the "first" narrowing; restricted to attempt 1, or to a call     *)
(* whose attempt 1 was never sent (ResendFirstAttempt, ManualRetryUnsent,  *)
(* FirstDispatchUnaudited), the "rest" narrowing.                         *)
(***************************************************************************)
\* ResendAttempt's re-send (MCTwins) of attempt 2 only, or of attempt 1 only.
EngineResendSecond(c) == Rec(c).attempt = 2 /\ EngineResendAdapter(c)
EngineResendFirst(c) == Rec(c).attempt = 1 /\ EngineResendAdapter(c)
ResendSecondSpec == Init /\ [][Next \/ \E c \in Calls : EngineResendSecond(c)]_vars
ResendFirstSpec == Init /\ [][Next \/ \E c \in Calls : EngineResendFirst(c)]_vars

\* ManualRetry's decision (MCTwins) on a call whose attempt 1 was sent, or
\* on one none of whose attempts was.
DecideRetriesManualAfterSend(c) ==
    IF invocations[c] # {} THEN DecideRetriesManual(c) ELSE Decide(DecisionInputs(c))
DecideRetriesManualUnsent(c) ==
    IF invocations[c] = {} THEN DecideRetriesManual(c) ELSE Decide(DecisionInputs(c))

\* DispatchUnaudited's mistake (MCTwins: a dispatched record without its
\* dispatch row) for a retry of a call whose attempt 1 was sent, or for
\* attempt 1 only.
PersistDispatchedRowUnless(c, skip) ==
    LET e == ExecId(c)
        n == Rec(c).attempt + 1
        auth == AttemptAuth(c)
    IN
    /\ Policy[c] # "readonly" /\ msg[c] = "durable"
    /\ \/ stage[c] = "live" /\ ApprovalOK(c)
       \/ stage[c] = "retry"
    /\ n <= MaxAttempts
    /\ ledger' = [ledger EXCEPT ![e] = [status |-> "dispatched", attempt |-> n,
                      args |-> args[c], auth |-> auth, result |-> NoResult, call |-> c]]
    /\ IF skip THEN UNCHANGED audit ELSE Audited(e, "dispatch", n)
    /\ stage' = [stage EXCEPT ![c] = "dispatched"]
    /\ UNCHANGED <<msg, args, result, approval, approvalArgs, marker>>
    /\ UNCHANGED external /\ UNCHANGED ghosts
    /\ UNCHANGED positions
    /\ UNCHANGED extVars
PersistRetryUnaudited(c) == PersistDispatchedRowUnless(c, invocations[c] # {})
PersistFirstUnaudited(c) == PersistDispatchedRowUnless(c, Rec(c).attempt = 0)

\* ApprovalIgnored: the dispatch loop does not wait for the approval (a call
\* that needs one is dispatched as if approved).  On one call it violates
\* ApprovalGate at the first (only) value of c \in Calls, so narrowing that
\* bound to the rest passes: it kills the "rest" narrowing KeyByToolCallId
\* (both calls) cannot.
ApprovalIgnoredOK(c) == TRUE

\* PendingApprovalHalted: a restart turns a call's unanswered approval
\* request into a recovery item (Recover halts a call with no record whose
\* approval is not given, instead of asking again).  A human's "retry" of
\* that item grants attempt 1 (the halted record is at attempt 0), and a
\* time-out of it leads to the policy retry of attempt 2, which no approval
\* authorizes.  ApprovalGate reads an invocation only through
\* i[3] = "human", and attempt 1, the first of invocations[c] (a tuple
\* <<e, n, auth>>: the lowest attempt under the call's one id), is always
\* the human's here: attempt 1 is sent in the step after its dispatch (the
\* one crash is spent before the halt), so no state has attempt 2 sent
\* without it.  Every violation is at attempt 2: narrowing
\* i \in invocations[c] to its first value passes (model/clauses.toml).
DecideHaltsPendingApproval(c) ==
    LET i == DecisionInputs(c) IN
    IF /\ ~i.hasResult /\ i.status = "none" /\ i.policy # "readonly"
       /\ i.requiresApproval /\ i.approval # "approved"
    THEN "recovery_required" ELSE Decide(i)
=============================================================================
