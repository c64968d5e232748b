------------------------ MODULE MCConcurrentResumers ------------------------
(***************************************************************************)
(* Two engine processes resuming one session's protected call, one call   *)
(* per policy (the .cfgs pick the policy and the design switches).        *)
(* Every constant is a literal.                                            *)
(***************************************************************************)
EXTENDS ConcurrentResumers

MCProcs == {"p1", "p2"}
MCMaxAttempts == 2
MCMaxCrashes == 1
MCMaxEpoch == 2

(* The twins start from a crashed engine's dispatched attempt 1, so that  *)
(* the counterexample is the race on the recovery decision, not the       *)
(* simpler double first dispatch (which ResumeWithoutCASApproval shows).  *)
DispatchedSpec == Init /\ rec.status = "dispatched" /\ [][Next]_vars

(* EpochOnQueryOnly twin: the old rule, the epoch reaches the external     *)
(* side only with a request or a reconcile query (EpochOnTake = FALSE).    *)
MCEpochOnTakeOff == FALSE

(* ConcurrentRetryGrantForgotten twin: the old rule, a process that reads  *)
(* a human's retry grant halts the call again (HonourRetryGrant = FALSE).  *)
MCHonourRetryGrantOff == FALSE

(* Clause twins (model/clauses.toml): each the spec with ONE mistake that  *)
(* breaks an invariant through one clause only (the main spec's twins of  *)
(* model/MCTwins.tla, here with two processes).                           *)
\* ConcurrentApprovalReusedRetry, ConcurrentApprovalReusedReconcile: a
\* policy retry is authorized by the call's approval again.
AuthReusesApproval(p) == FirstAuth
\* ConcurrentPolicyRetryReusesApproval: only the policy's retry is
\* authorized by the approval again; a human's granted retry stays "human"
\* (AttemptAuth otherwise).  A reconcile call's policy retry is fenced, so
\* it breaks NoBlindReplay through the reconcile disjunct's policy-auth
\* clause only (AuthReusesApproval also relabels the human's unfenced retry).
AuthReusesApprovalOnPolicyRetry(p) ==
    IF pc[p] = "retry"
    THEN (IF RetryGranted(view[p]) THEN "human" ELSE FirstAuth)
    ELSE FirstAuth
\* ConcurrentManualRetry: recovery retries a manual call found dispatched.
DecideRetriesManual(p) ==
    LET i == InputsOf(view[p]) IN
    IF ~i.hasResult /\ i.policy = "manual" /\ i.status = "dispatched"
       /\ i.attempt < MaxAttempts
    THEN "retry_same_id" ELSE Decide(i)
\* ConcurrentReconcileManual: recovery reconciles a manual call found
\* dispatched (fenced, then policy-retried).
DecideReconcilesManual(p) ==
    LET i == InputsOf(view[p]) IN
    IF ~i.hasResult /\ i.policy = "manual" /\ i.status = "dispatched"
    THEN "reconcile" ELSE Decide(i)
\* ConcurrentUnfencedRetry: recovery retries a reconcile call found
\* dispatched under its id, without the connector's query-and-fence.
DecideRetriesReconcile(p) ==
    LET i == InputsOf(view[p]) IN
    IF ~i.hasResult /\ i.policy = "reconcile" /\ i.status = "dispatched"
       /\ i.attempt < MaxAttempts
    THEN "retry_same_id" ELSE Decide(i)
\* ConcurrentRetryKnown: a succeeded idempotent call is retried (with one
\* attempt, the retry is held and never sent).
DecideRetriesKnown(p) ==
    LET i == InputsOf(view[p]) IN
    IF ~i.hasResult /\ i.policy = "idempotent" /\ i.status = "succeeded"
    THEN "retry_same_id" ELSE Decide(i)
\* ConcurrentHaltKeepsLive: a halt leaves the process live (about to
\* dispatch) although the record says recovery_required.
StageAfterKeepsLive(d) ==
    CASE d = "skip" -> "idle"
      [] d = "execute" -> "live"
      [] d = "reconstruct" -> "recorded"
      [] d = "retry_same_id" -> "retry"
      [] d = "reconcile" -> "reconciling"
      [] d = "recovery_required" -> "live"
\* ConcurrentResendAfterOutcome: a resume path re-sends the last attempt of
\* a call whose record succeeded, before deciding (no retry is held).
ResendAfterOutcome(p) ==
    LET n == view[p].rec.attempt IN
    /\ pc[p] = "resume" /\ view[p].rec.status = "succeeded" /\ sent[n] < 2
    /\ inflight' = inflight \cup {<<n, held[p], p>>}
    /\ sent' = [sent EXCEPT ![n] = @ + 1]
    /\ invocations' = invocations \cup {<<n, view[p].rec.auth, p, held[p]>>}
    /\ sentAfterOutcome' = IF knownOutcome /\ ~Refusable(held[p])
                          THEN sentAfterOutcome + 1 ELSE sentAfterOutcome
    /\ pc' = [pc EXCEPT ![p] = "waiting"]
    /\ UNCHANGED durable /\ UNCHANGED <<view, held, fenced, extEpoch>>
    /\ UNCHANGED <<applied, humanRetries, crashes, staleCommits, refusals,
                   staleDropped, knownOutcome, droppedAfterOutcome, staleViewCommits>>
ResendSpec == Init /\ [][Next \/ \E p \in Procs : ResendAfterOutcome(p)]_vars
\* ConcurrentTimeoutAsOk: the adapter takes a time-out for success.
TimeoutAsOk(p) ==
    /\ pc[p] = "waiting"
    /\ pc' = [pc EXCEPT ![p] = "got_ok"]
    /\ UNCHANGED durable /\ UNCHANGED <<view, held>> /\ UNCHANGED external
    /\ UNCHANGED ghosts
\* ConcurrentDispatchUnaudited: dispatched is committed without its dispatch
\* audit row (PersistDispatched with no rows), for the attempts Unaudited
\* names: every attempt here, attempt 1 only in
\* PersistDispatchedFirstUnaudited below.  A copy of PersistDispatched (a cfg
\* substitution replaces a name everywhere): change both together.
PersistDispatchedWithoutRow(p, Unaudited(_)) ==
    LET n == view[p].rec.attempt + 1
        auth == AttemptAuth(p)
    IN
    /\ pc[p] \in {"live", "retry"} /\ n <= MaxAttempts
    /\ Commit(p, Dispatched(n, auth), view[p].res,
              IF Unaudited(n) THEN {} ELSE {<<"dispatch", n>>})
    /\ pc' = [pc EXCEPT ![p] = "dispatched"]
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, sent, invocations, humanRetries, crashes,
                   refusals, staleDropped, sentAfterOutcome,
                   droppedAfterOutcome>>
EveryAttempt(n) == TRUE
PersistDispatchedUnaudited(p) == PersistDispatchedWithoutRow(p, EveryAttempt)
\* ConcurrentTimeoutFails: the adapter takes a time-out for a definite
\* failure (the request may have been applied).
TimeoutAsFailure(p) ==
    /\ pc[p] = "waiting"
    /\ pc' = [pc EXCEPT ![p] = "got_fail"]
    /\ UNCHANGED durable /\ UNCHANGED <<view, held>> /\ UNCHANGED external
    /\ UNCHANGED ghosts

(***************************************************************************)
(* Narrowing twins (model/clauses.toml, kind = "bound"): each a clause    *)
(* twin above whose mistake is confined to one value of a bound, so that  *)
(* narrowing the bound to its first value ("first") or to the others      *)
(* ("rest") drops every violation and the twin passes.  The processes run  *)
(* the same code, so a mistake in every process has its mirror at the     *)
(* other one; here it is in one process only, Faulty(p): the first of      *)
(* Procs in TLC's order (the CHOOSE the narrowings use, so the twin does   *)
(* not depend on how TLC orders strings), or the other one (the cfg's      *)
(* Faulty <- FaultyOther).  Attempts are numbers and invocations tuples    *)
(* led by their attempt, so their first value is attempt 1's.              *)
(***************************************************************************)
FirstProc == CHOOSE p \in Procs : TRUE
Faulty(p) == p = FirstProc
FaultyOther(p) == p # FirstProc

\* ConcurrentRetryKnown's decision in the faulty process only.
DecideRetriesKnownIfFaulty(p) ==
    IF Faulty(p) THEN DecideRetriesKnown(p) ELSE Decide(InputsOf(view[p]))

\* Recover with the stage it moves to chosen per process: the spec's
\* Recover (keepsLive FALSE, honours HonourRetryGrant), with the halt of
\* ConcurrentHaltKeepsLive (keepsLive) or the forgotten grant of
\* ConcurrentRetryGrantForgotten (~honours).  A copy of the spec's Recover
\* (a cfg substitution replaces a name everywhere, so the twin cannot call
\* the original): a change to Recover must be made here too.
RecoverStaged(p, keepsLive, honours) ==
    LET d == DecisionFor(p) IN
    /\ pc[p] = "resume"
    /\ pc' = [pc EXCEPT ![p] = IF d = "recovery_required" /\ honours
                                   /\ RetryGranted(view[p])
                                THEN "retry"
                                ELSE IF keepsLive THEN StageAfterKeepsLive(d)
                                ELSE StageAfter(d)]
    /\ IF d = "skip"
       THEN NoCommit
       ELSE Commit(p, RecoverRecord(p), view[p].res, RecoverRows(p))
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, sent, invocations, humanRetries, crashes,
                   refusals, staleDropped, sentAfterOutcome,
                   droppedAfterOutcome>>
RecoverKeepsLiveIfFaulty(p) == RecoverStaged(p, Faulty(p), HonourRetryGrant)
RecoverForgetsGrantIfFaulty(p) == RecoverStaged(p, FALSE, ~Faulty(p))

\* The adapter of a process waiting for attempt n sends it again (its own
\* retry loop, under the same id); for attempt 2 only, or attempt 1 only.
\* One re-send per attempt (a bound for TLC).
ResendWaiting(p) ==
    LET n == view[p].rec.attempt IN
    /\ pc[p] = "waiting" /\ sent[n] < 2
    /\ inflight' = inflight \cup {<<n, held[p], p>>}
    /\ sent' = [sent EXCEPT ![n] = @ + 1]
    /\ invocations' = invocations \cup {<<n, view[p].rec.auth, p, held[p]>>}
    /\ sentAfterOutcome' = IF knownOutcome /\ ~Refusable(held[p])
                          THEN sentAfterOutcome + 1 ELSE sentAfterOutcome
    /\ UNCHANGED durable /\ UNCHANGED volatile
    /\ UNCHANGED <<fenced, extEpoch>>
    /\ UNCHANGED <<applied, humanRetries, crashes, staleCommits, refusals,
                   staleDropped, knownOutcome, droppedAfterOutcome, staleViewCommits>>
ResendSecondSpec ==
    Init /\ rec.status = "dispatched"
    /\ [][Next \/ \E p \in Procs : view[p].rec.attempt = 2 /\ ResendWaiting(p)]_vars
ResendFirstSpec ==
    Init /\ rec = NoRecord
    /\ [][Next \/ \E p \in Procs : view[p].rec.attempt = 1 /\ ResendWaiting(p)]_vars

\* ConcurrentDispatchUnaudited's mistake for attempt 1 only: its dispatched
\* commit lacks the dispatch row, a retry's has it.  Attempt 1's invocation
\* is the first of invocations in every state, so narrowing AuditComplete's
\* bound to the rest drops every violation.
FirstAttempt(n) == n = 1
PersistDispatchedFirstUnaudited(p) == PersistDispatchedWithoutRow(p, FirstAttempt)

\* The crashed engine's attempt 1 was never sent (no invocation: a retry's
\* is the first), or was sent (in flight or applied: a retry's follows it).
UnsentSpec == Init /\ rec.status = "dispatched" /\ invocations = {} /\ [][Next]_vars
SentSpec == Init /\ rec.status = "dispatched" /\ invocations # {} /\ [][Next]_vars
=============================================================================
