------------------------------ MODULE MCTwins ------------------------------
(***************************************************************************)
(* Broken twins: each is the spec with ONE deliberate design mistake,      *)
(* swapped in by its .cfg (an operator override, or its own SPECIFICATION),*)
(* on a one-call model.  Each must violate the invariant named by its     *)
(* manifest entry's `witnesses`: weakening that invariant fails           *)
(* `make check`.  The constants below are shared by the twins' .cfgs.     *)
(***************************************************************************)
EXTENDS DurableToolExecution

OneCall == {"c1"}
TurnOne == [c1 |-> 1]
TurnZero == [c1 |-> 0]
SlotZero == [c1 |-> 0]
IdZero == [c1 |-> "call_0"]
PolicyManual == [c1 |-> "manual"]
PolicyIdempotent == [c1 |-> "idempotent"]
PolicyReconcile == [c1 |-> "reconcile"]
Approval == [c1 |-> TRUE]
NoApproval == [c1 |-> FALSE]
ArgsOne == [c1 |-> {"a1"}]

(* ResendAttempt: a resume path that re-sends the attempt it finds         *)
(* dispatched, instead of deciding (the request still carries the same    *)
(* id and attempt, so invocations and inflight do not change).  Breaks    *)
(* AttemptSentOnce; no other invariant sees it on an idempotent call.     *)
EngineResendAdapter(c) ==
    LET e == ExecId(c) IN
    /\ stage[c] = "resume" /\ Rec(c).status = "dispatched"
    /\ sent[c][Rec(c).attempt] < 2   \* a bound for TLC: one re-send per attempt
    /\ inflight' = [inflight EXCEPT ![e] = @ \cup {Rec(c).attempt}]
    /\ invocations' = [invocations EXCEPT ![c] =
                         @ \cup {<<e, Rec(c).attempt, Rec(c).auth>>}]
    /\ sent' = [sent EXCEPT ![c][Rec(c).attempt] = @ + 1]
    /\ sentAfterOutcome' = [sentAfterOutcome EXCEPT ![c] =
                              IF c \in knownOutcome THEN @ + 1 ELSE @]
    /\ stage' = [stage EXCEPT ![c] = "waiting"]
    /\ UNCHANGED durable /\ UNCHANGED fenced
    /\ UNCHANGED <<applied, humanApproved, humanRetries, crashes>>
    /\ UNCHANGED <<knownOutcome, decided>>
    /\ UNCHANGED positions
    /\ UNCHANGED extVars
ResendSpec == Init /\ [][Next \/ \E c \in Calls : EngineResendAdapter(c)]_vars

(* ReinvokeAfterOutcome: "an idempotent call is safe to replay", so an    *)
(* unanswered succeeded record is retried instead of reconstructed.       *)
(* Breaks NoReinvokeAfterKnownOutcome (dedup hides it from the others).   *)
DecideReplaysIdempotent(c) ==
    LET i == DecisionInputs(c) IN
    IF ~i.hasResult /\ i.policy = "idempotent" /\ i.status = "succeeded"
       /\ i.attempt < MaxAttempts
    THEN "retry_same_id" ELSE Decide(i)

(* ManualRetry: recovery retries a manual call found dispatched.          *)
(* Breaks NoBlindReplay.                                                   *)
DecideRetriesManual(c) ==
    LET i == DecisionInputs(c) IN
    IF ~i.hasResult /\ i.policy = "manual" /\ i.status = "dispatched"
       /\ i.attempt < MaxAttempts
    THEN "retry_same_id" ELSE Decide(i)

(* LegacyTrustsApproval: a legacy call's old approval is trusted and the  *)
(* call executed (today's durable resume).  Breaks LegacyConservative.    *)
DecideTrustsLegacy(c) ==
    LET i == DecisionInputs(c) IN
    IF ~i.hasResult /\ i.status = "none" /\ i.legacy /\ i.policy # "readonly"
    THEN "execute" ELSE Decide(i)

(* FabricatedOk: a connector that answers "applied" when it cannot tell.  *)
(* Breaks ResultFidelity (an ok result that was never applied).           *)
ConnectorGuesses(e) == TRUE

(* ApprovalReused: a policy retry is authorized by the call's approval    *)
(* again.  Breaks ApprovalSingleUse.                                       *)
AuthReusesApproval(c) ==
    IF NeedsApproval[c] THEN "approval"
    ELSE IF stage[c] = "retry" THEN "policy" ELSE "auto"

(* HaltKeepsRetry: the ledger says recovery_required, but the engine keeps *)
(* the call queued for a retry in memory.  Breaks RecoveryRequiredHalts.  *)
StageAfterKeepsRetry(d) ==
    CASE d = "skip" -> "none"
      [] d = "execute" -> "live"
      [] d = "reconstruct" -> "recorded"
      [] d = "retry_same_id" -> "retry"
      [] d = "reconcile" -> "reconciling"
      [] d = "recovery_required" -> "retry"

(* AuditOnlyHalts: Recover audits only recovery_required decisions.       *)
(* Breaks AuditComplete.                                                   *)
AuditOnlyHalts(e, d, n, i) ==
    audit' = IF d # "recovery_required" \/ HasRow(e, d, n) THEN audit
             ELSE [audit EXCEPT ![e] = @ \cup {<<d, n, i>>}]

(* AuditNextAttempt: the row of a retry records the attempt the retry     *)
(* will use instead of the one the decision read.  Breaks                 *)
(* AuditRecomputable (at the last attempt it recomputes to                *)
(* recovery_required).                                                     *)
AuditNextAttempt(e, d, n, i) ==
    LET row == IF d = "retry_same_id" THEN [i EXCEPT !.attempt = @ + 1] ELSE i IN
    audit' = IF HasRow(e, d, n) THEN audit
             ELSE [audit EXCEPT ![e] = @ \cup {<<d, n, row>>}]
(* RetryAfterKeyExpiry: recovery retries an idempotent call with the same  *)
(* id without asking whether the external system still holds its key (it  *)
(* ignores keyRetained).  After the retention window the key may be gone:  *)
(* the retry is applied anew.  Breaks AtMostOnceEffect.                    *)
KeysExpireOn == TRUE
DecideIgnoresKeyRetention(c) ==
    Decide([DecisionInputs(c) EXCEPT !.keyRetained = TRUE])

(* QueryThenFence: a reconcile connector that answers "not applied" first  *)
(* and fences the attempts in a later step (two round trips instead of one *)
(* atomic query-and-fence).  The late original lands in between, then the *)
(* retry is applied too.  Breaks AtMostOnceEffect.  The query step leaves  *)
(* the call in stage "fencing" (outside Stages: this twin checks only      *)
(* AtMostOnceEffect); ConnectorFenceLater is the second round trip.        *)
QueryNotAppliedOnly(c) ==
    LET e == ExecId(c) IN
    /\ stage[c] = "reconciling" /\ applied[e] = 0
    /\ Rec(c).attempt < MaxAttempts
    /\ Audited(e, "reconcile_not_applied", Rec(c).attempt)
    /\ Decided(c, "reconcile_not_applied", Rec(c).attempt)
    /\ stage' = [stage EXCEPT ![c] = "fencing"]
    /\ UNCHANGED <<msg, args, result, approval, approvalArgs, ledger, marker>>
    /\ UNCHANGED <<inflight, fenced>>
    /\ UNCHANGED <<applied, invocations, humanApproved, humanRetries, crashes,
                   sent, knownOutcome, sentAfterOutcome>>
    /\ UNCHANGED positions
    /\ UNCHANGED extVars
ConnectorFenceLater(c) ==
    LET e == ExecId(c) IN
    /\ stage[c] = "fencing"
    /\ fenced' = [fenced EXCEPT ![e] = Rec(c).attempt]
    /\ stage' = [stage EXCEPT ![c] = "retry"]
    /\ UNCHANGED durable /\ UNCHANGED inflight /\ UNCHANGED ghosts
    /\ UNCHANGED positions
    /\ UNCHANGED extVars
(* LateReturnDropped: the old rule, an answer that arrives after the       *)
(* engine timed out is discarded even while the record is still at that  *)
(* attempt (RecordLateReturn = FALSE).  One manual call, no crash: the    *)
(* answer arrives, is dropped, the human is asked to resolve, may retry,   *)
(* and the effect is applied twice.  Breaks HumanSeesKnownOutcome         *)
(* (AtMostOnceEffect allows it: a human retried).                         *)
RecordLateReturnOff == FALSE

(* InFlightAsApplied: the adapter takes a 409 "in flight" answer for      *)
(* success ("already done"), although the other request under the key is  *)
(* still being processed and may be rejected or never land.  Breaks       *)
(* ResultFidelity (an ok result with no effect).                          *)
(* InFlightNewKey, ParamsDifferNewKey, ReplayedFailureNewKey: the adapter *)
(* re-sends the request under a fresh key on a 409, a "parameters differ" *)
(* or a replayed failure (EC2's advice for IdempotentParameterMismatch);   *)
(* the API applies it as a new request.  Break AtMostOnceEffect: the     *)
(* earlier request had been applied (or still lands).                     *)
KeyAnswersOn == TRUE
KeyAnswerApplied == "applied"
KeyAnswerNewKey == "new_key"

(* ReconcileAbandoned: a reconcile call a human abandoned is reconciled   *)
(* again instead of reconstructed, so the connector's "not applied" sends *)
(* attempt 2 after the human gave up.  Breaks NoReinvokeAfterKnownOutcome *)
(* (the abandon is a known outcome).                                       *)
DecideReconcilesAbandoned(c) ==
    LET i == DecisionInputs(c) IN
    IF ~i.hasResult /\ i.policy = "reconcile" /\ i.status = "abandoned"
    THEN "reconcile" ELSE Decide(i)

QueryThenFenceSpec == Init /\ [][Next \/ \E c \in Calls : ConnectorFenceLater(c)]_vars
=============================================================================
