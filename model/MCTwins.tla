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

(* PolicyRetryReusesApproval: only the POLICY's retry is authorized by the *)
(* approval again; a human's granted retry stays "human" (AttemptAuth     *)
(* otherwise).  On a reconcile call every policy retry follows "not       *)
(* applied" with the earlier attempts fenced, so it breaks NoBlindReplay   *)
(* through the reconcile disjunct's policy-auth clause only: the human's  *)
(* unfenced retry that AuthReusesApproval also relabels (and through which *)
(* ApprovalReusedReconcile violates the fence clause too) is untouched.   *)
AuthReusesApprovalOnPolicyRetry(c) ==
    IF stage[c] = "retry"
    THEN (IF RetryGranted(c) THEN "human"
          ELSE IF NeedsApproval[c] THEN "approval" ELSE "policy")
    ELSE IF NeedsApproval[c] THEN "approval" ELSE "auto"

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
(* AuditFirstRowOnly: the old keying, the audit keeps one decision row    *)
(* per (execution, kind, attempt): a decision taken again for the same    *)
(* attempt (a halted call re-decided after a crash) is dropped when an     *)
(* earlier row has that kind and attempt.  Breaks AuditComplete (the      *)
(* repeated decision has no row of its own).                               *)
AuditFirstRowOnly(e, d, n, i) ==
    audit' = IF HasRow(e, d, n) THEN audit
             ELSE [audit EXCEPT ![e] = @ \cup {<<d, n, i>>}]

(* ReHaltAbandoned: a call a human abandoned is halted for a human again   *)
(* (recovery_required) instead of reconstructed: the human's give-up is    *)
(* overridden by a new question.  Nothing is sent, so only the audit can  *)
(* show it: the repeated decision (recovery_required for attempt 1, as    *)
(* the first halt) recomputes to reconstruct.  Breaks AuditRecomputable;  *)
(* under the old keying (AuditFirstRowOnly) its row is dropped and every   *)
(* invariant holds.                                                        *)
DecideReHaltsAbandoned(c) ==
    LET i == DecisionInputs(c) IN
    IF ~i.hasResult /\ i.status = "abandoned" THEN "recovery_required" ELSE Decide(i)

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

(***************************************************************************)
(* Clause twins (model/clauses.toml): each violates its invariant through  *)
(* ONE clause only, so that deleting that clause flips its row.           *)
(***************************************************************************)
(* ReconcileManual: recovery reconciles a manual call found dispatched    *)
(* (treats "manual" like "reconcile"): the connector fences, the policy   *)
(* retries.  Breaks NoBlindReplay through its policy clause only (the     *)
(* retry is fenced, but the call is not a reconcile call).                *)
DecideReconcilesManual(c) ==
    LET i == DecisionInputs(c) IN
    IF ~i.hasResult /\ i.policy = "manual" /\ i.status = "dispatched"
    THEN "reconcile" ELSE Decide(i)

(* LegacyRetried: a legacy call (approved, no record) is taken for a      *)
(* policy retry (retry_same_id) of an attempt that never was.  Breaks     *)
(* LegacyConservative through its human-retry clause only: a policy      *)
(* retry no human retry preceded.                                          *)
DecideRetriesLegacy(c) ==
    LET i == DecisionInputs(c) IN
    IF ~i.hasResult /\ i.status = "none" /\ i.legacy /\ i.policy = "idempotent"
    THEN "retry_same_id" ELSE Decide(i)

(* HumanRetryAsPolicy: the dispatch of a human's granted retry says      *)
(* "policy" (the engine labels the attempt a policy retry of itself).      *)
(* Breaks LegacyConservative through its ordering clause only: a policy   *)
(* request whose human retry is not an EARLIER attempt.                    *)
AuthGrantAsPolicy(c) ==
    IF stage[c] = "retry" THEN "policy"
    ELSE IF NeedsApproval[c] THEN "approval" ELSE "auto"

(* LegacyRetryReusesApproval: a human's granted retry of a legacy call is *)
(* dispatched as the human's, but the policy retry that follows it is     *)
(* authorized by the call's old approval again (not labelled "policy").   *)
(* Breaks LegacyConservative through its policy-auth clause only: every   *)
(* violation is an "approval" request made after a human_retry row of an  *)
(* earlier attempt (the human's, the first invocation, is fine), so with  *)
(* i[3] = "policy" weakened, or i \in invocations[c] narrowed to its      *)
(* first value (the lowest attempt), the twin passes.                     *)
(* LegacyApprovalReused (every attempt "approval", the human's too)       *)
(* isolates neither.                                                      *)
AuthRetryReusesApproval(c) ==
    IF stage[c] = "retry" /\ RetryGranted(c) THEN "human"
    ELSE IF NeedsApproval[c] THEN "approval"
    ELSE IF stage[c] = "retry" THEN "policy" ELSE "auto"

(* RetryGrantForgotten: the old rule.  A human's retry is not a durable   *)
(* grant the next engine honours: the engine that reloads the session     *)
(* (after the operator answered from the command line) halts the call     *)
(* again.  Breaks RetryGrantHonoured.                                      *)
HonourRetryGrantOff == FALSE

(* RetryGrantReused: a grant read from any human_retry row of the         *)
(* execution, not the one for the attempt after the record's: the retry   *)
(* it authorized halts, and a restart sends another attempt on the same   *)
(* grant.  Breaks AtMostOnceEffect (one grant, two extra effects).        *)
RetryGrantedAnyRow(c) ==
    /\ msg[c] = "durable" /\ result[c] = NoResult
    /\ Rec(c).status = "recovery_required" /\ HumanMayRetry(c)
    /\ \E n \in 1..MaxAttempts : HasRow(ExecId(c), "human_retry", n)

(* DispatchUnaudited: the engine persists a dispatched record without its *)
(* dispatch row (a human retry still writes its own).  Breaks             *)
(* AuditComplete through its dispatch clause only.                         *)
PersistDispatchedUnaudited(c) ==
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
    /\ UNCHANGED audit
    /\ stage' = [stage EXCEPT ![c] = "dispatched"]
    /\ UNCHANGED <<msg, args, result, approval, approvalArgs, marker>>
    /\ UNCHANGED external /\ UNCHANGED ghosts
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

(* AuditSkipsHalts: Recover audits every decision but a halt              *)
(* (recovery_required).  Breaks AuditComplete, and only through a halt's  *)
(* row: the issue-28 mutant that exempts halts from it survives nothing.  *)
AuditSkipsHalts(e, d, n, i) ==
    audit' = IF d = "recovery_required" \/ HasRow(e, d, n) THEN audit
             ELSE [audit EXCEPT ![e] = @ \cup {<<d, n, i>>}]

(* RepollForever: a halted reconcile call (the connector could not tell)  *)
(* is polled again by the engine instead of waiting for a human: its      *)
(* record goes back to dispatched and the connector is asked again, for   *)
(* ever.  The call settles and unsettles infinitely often: it breaks      *)
(* EventuallySettled's <>[] (a <>Settled would hold).                      *)
EngineRepoll(c) ==
    LET e == ExecId(c) IN
    /\ stage[c] = "none" /\ Policy[c] = "reconcile"
    /\ Rec(c).status = "recovery_required" /\ result[c] = NoResult
    /\ ledger' = [ledger EXCEPT ![e].status = "dispatched"]
    /\ stage' = [stage EXCEPT ![c] = "reconciling"]
    /\ UNCHANGED <<msg, args, result, approval, approvalArgs, marker, audit>>
    /\ UNCHANGED external /\ UNCHANGED ghosts
    /\ UNCHANGED positions
    /\ UNCHANGED extVars
RepollSpec == Init /\ [][Next \/ \E c \in Calls : EngineRepoll(c)]_vars /\ FairnessByGuards

(* ResendAfterOutcome: a resume path re-sends the last attempt of a call   *)
(* whose record already succeeded (it re-runs the request it finds,       *)
(* without deciding).  The engine holds no retry (stage waiting): breaks  *)
(* NoReinvokeAfterKnownOutcome through its send-count clause only.        *)
EngineResendKnown(c) ==
    LET e == ExecId(c) IN
    /\ stage[c] = "resume" /\ Rec(c).status = "succeeded"
    /\ sentAfterOutcome[c] = 0   \* a bound for TLC: one re-send
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
ResendKnownSpec == Init /\ [][Next \/ \E c \in Calls : EngineResendKnown(c)]_vars

(* RetryKnownAtBudget: an unanswered succeeded idempotent call is retried *)
(* (ReinvokeAfterOutcome's mistake) even when no attempt is left: the     *)
(* engine holds a retry it can never send (one attempt).  Breaks          *)
(* NoReinvokeAfterKnownOutcome through its held-request clause only.      *)
DecideReplaysAtBudget(c) ==
    LET i == DecisionInputs(c) IN
    IF ~i.hasResult /\ i.policy = "idempotent" /\ i.status = "succeeded"
    THEN "retry_same_id" ELSE Decide(i)

(* TimeoutFails: the adapter takes a time-out for a definite failure (the *)
(* request may still have been applied, its answer lost).  The error      *)
(* result stands beside an effect no human retry explains: breaks         *)
(* ResultFidelity through its error clause only.                           *)
TimeoutFails(c) ==
    /\ stage[c] = "waiting"
    /\ stage' = [stage EXCEPT ![c] = "got_fail"]
    /\ UNCHANGED durable /\ UNCHANGED external /\ UNCHANGED ghosts
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

(* CancelAfterDispatch: a user's Stop is accepted after the call was       *)
(* dispatched (its record exists, its request may be out): the call gets *)
(* a "cancelled" result although it was invoked; the engine re-decides    *)
(* it and sends nothing more.  Breaks CancelledNeverInvoked through its   *)
(* invocations clause only.                                                *)
CancelAnyTime(c) ==
    /\ msg[c] = "durable" /\ stage[c] \in {"live", "waiting"} /\ result[c] = NoResult
    /\ ApprovalOK(c)
    /\ result' = [result EXCEPT ![c] = Result("cancelled", ExecId(c), args[c])]
    /\ stage' = [stage EXCEPT ![c] = "resume"]
    /\ Audited(ExecId(c), "human_cancel", Rec(c).attempt)
    /\ Decided(c, "human_cancel", Rec(c).attempt)
    /\ UNCHANGED <<msg, args, approval, approvalArgs, ledger, marker>>
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, invocations, humanApproved, humanRetries, crashes,
                   sent, knownOutcome, sentAfterOutcome>>
    /\ UNCHANGED positions
    /\ UNCHANGED extVars

QueryThenFenceSpec == Init /\ [][Next \/ \E c \in Calls : ConnectorFenceLater(c)]_vars
=============================================================================
