------------------------ MODULE ConcurrentResumers ------------------------
(***************************************************************************)
(* Several engine processes resuming ONE session at once.                  *)
(*                                                                         *)
(* spec/DurableToolExecution.tla has one engine, which holds the session;  *)
(* this module drops that assumption for the one unanswered protected call *)
(* a crashed engine left behind (docs/protocol.md#concurrent-resumers).    *)
(* A deployment resumes a session from several paths at once (an inbox    *)
(* resolution, a chat reply, a WebSocket reconnect), and a worker that was *)
(* declared dead may still be running.  Each process has its own volatile  *)
(* state: what it READ from the durable store (the record, the result      *)
(* and the audit keys), the epoch of the lease it took, and where it is.   *)
(* It decides on what it read, never on the store's current state.         *)
(*                                                                         *)
(* Two mechanisms protect the store, both what the Python stores do:      *)
(*  - compare-and-set (UseCAS): every durable write, an audit-only one     *)
(*    included, commits only if the store still holds what the process     *)
(*    read (the call's record, result and audit keys, as the stores'       *)
(*    CommitPlan.check_session compares its CallView).  A refused process  *)
(*    reloads (Refused): nothing of it is written;                         *)
(*  - session ownership (UseLease): a process takes the session by bumping *)
(*    the durable lease epoch (TakeSession, atomic with its read), and     *)
(*    every commit also requires that the epoch is still the one it took:  *)
(*    a process that lost the lease cannot commit.  The epoch travels with *)
(*    every request beside the execution id and attempt; a connector that  *)
(*    supports it (EpochAware) drops a request of an epoch older than one  *)
(*    it has already seen.                                                 *)
(*                                                                         *)
(* The external system is the main spec's: requests stay in flight across *)
(* crashes, may be applied with the answer lost, fail definitely, arrive   *)
(* late; it deduplicates on the execution id for "idempotent" and fences   *)
(* attempts when a "reconcile" connector answers "not applied".  The       *)
(* connector's query-and-fence is one atomic step at the external system;  *)
(* the commit that records its answer is a separate step, which a          *)
(* concurrent process may overtake (that race is the point of the model).  *)
(*                                                                         *)
(* The recovery decision Decide is restated from DurableToolExecution     *)
(* (model/MCConcurrentDecideTie.tla checks that the two agree on every    *)
(* input this module can produce).                                         *)
(*                                                                         *)
(* Where each variable lives:                                              *)
(*  - durable, the store: rec (the execution record), res (the call's      *)
(*    result in the conversation), audit (the audit keys <<kind,          *)
(*    attempt>>, the stores' audit keys: a decision taken again for the    *)
(*    same attempt writes its row but adds no key), epoch (the lease);    *)
(*  - volatile, per process (lost when it crashes): pc, view, held;       *)
(*  - external: inflight (requests <<attempt, epoch, sender>>), fenced,    *)
(*    extEpoch (the newest epoch the external system has seen);           *)
(*  - ghosts: applied, sent, invocations, humanRetries, crashes,          *)
(*    staleCommits, refusals, staleDropped.                                *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets

CONSTANTS
    Procs,          \* the engine processes (e.g. {"p1", "p2"})
    Pol,            \* the call's policy: "manual", "idempotent" or "reconcile"
    NeedsApproval,  \* the call needed (and got) a human approval
    MaxAttempts,    \* retry budget of the execution
    MaxCrashes,     \* bound on process crashes in one behaviour
    MaxEpoch,       \* bound on lease takeovers in one behaviour (for TLC)
    UseCAS,         \* design switch: every commit is a compare-and-set on what was read
    UseLease,       \* design switch: every commit also requires the current lease epoch
    EpochAware      \* connector capability: requests of a stale epoch are dropped

ASSUME /\ Pol \in {"manual", "idempotent", "reconcile"}
       /\ NeedsApproval \in BOOLEAN
       /\ MaxAttempts \in Nat \ {0} /\ MaxCrashes \in Nat /\ MaxEpoch \in Nat
       /\ UseCAS \in BOOLEAN /\ UseLease \in BOOLEAN /\ EpochAware \in BOOLEAN
       /\ Procs # {} /\ "orig" \notin Procs

Statuses == {"none", "dispatched", "succeeded", "failed",
             "recovery_required", "abandoned"}
Auths == {"none", "auto", "approval", "policy", "human"}
ResKinds == {"none", "ok", "error", "human", "abandoned"}
\* rec.result: the result the record carries for the conversation.
NoRecord == [status |-> "none", attempt |-> 0, auth |-> "none", result |-> "none"]
Dispatched(n, a) == [status |-> "dispatched", attempt |-> n, auth |-> a, result |-> "none"]
Halt(r) == [r EXCEPT !.status = "recovery_required"]
NoView == [rec |-> NoRecord, res |-> "none", audit |-> {}]

\* Process locations (the main spec's stages, plus the connector's answer
\* held in memory before it is committed, and "halted": the process holds
\* a call in recovery_required, which only a human moves on).
PCs == {"idle", "taken", "resume", "live", "retry", "dispatched", "waiting", "got_ok",
        "got_fail", "recorded", "rec_applied", "rec_not_applied",
        "rec_unknown", "reconciling", "halted"}

VARIABLES
    rec, res, epoch, audit,      \* durable
    pc, view, held,              \* volatile, per process
    inflight, fenced, extEpoch,  \* external
    applied, sent, invocations, humanRetries, crashes,
    staleCommits, refusals, staleDropped,
    knownOutcome, sentAfterOutcome, droppedAfterOutcome,
    staleViewCommits                       \* ghosts

durable == <<rec, res, epoch, audit>>
volatile == <<pc, view, held>>
external == <<inflight, fenced, extEpoch>>
ghosts == <<applied, sent, invocations, humanRetries, crashes,
            staleCommits, refusals, staleDropped, knownOutcome, sentAfterOutcome,
                   droppedAfterOutcome, staleViewCommits>>
vars == <<rec, res, epoch, audit, pc, view, held, inflight, fenced, extEpoch,
          applied, sent, invocations, humanRetries, crashes, staleCommits,
          refusals, staleDropped, knownOutcome, sentAfterOutcome,
                   droppedAfterOutcome, staleViewCommits>>

Records == [status : Statuses, attempt : 0..MaxAttempts, auth : Auths,
            result : ResKinds]
\* The crashed engine that left the session (epoch 0): not a process here.
Orig == "orig"
Senders == Procs \cup {Orig}
AuditKinds == {"dispatch", "execute", "retry_same_id", "reconcile", "recovery_required",
               "reconstruct", "reconcile_applied", "reconcile_not_applied",
               "reconcile_unknown", "human_applied", "human_retry", "human_abandon"}
Rows == AuditKinds \X (0..MaxAttempts)
Requests == (1..MaxAttempts) \X (0..MaxEpoch) \X Senders

TypeOK ==
    /\ rec \in Records /\ res \in ResKinds /\ epoch \in 0..MaxEpoch
    /\ audit \subseteq Rows
    /\ pc \in [Procs -> PCs]
    /\ view \in [Procs -> [rec : Records, res : ResKinds, audit : SUBSET Rows]]
    /\ held \in [Procs -> 0..MaxEpoch]
    /\ inflight \subseteq Requests /\ fenced \in 0..MaxAttempts
    /\ extEpoch \in 0..MaxEpoch
    /\ applied \in Nat /\ sent \in [1..MaxAttempts -> Nat]
    /\ invocations \subseteq ((1..MaxAttempts) \X Auths \X Senders \X (0..MaxEpoch))
    /\ humanRetries \in 0..MaxAttempts /\ crashes \in 0..MaxCrashes
    /\ staleCommits \in Nat /\ refusals \subseteq {"cas", "epoch"}
    /\ staleDropped \in BOOLEAN
    /\ knownOutcome \in BOOLEAN /\ sentAfterOutcome \in Nat
    /\ droppedAfterOutcome \in BOOLEAN /\ staleViewCommits \in BOOLEAN

FirstAuth == IF NeedsApproval THEN "approval" ELSE "auto"

(***************************************************************************)
(* Init: the session as a crashed engine (epoch 0, no process of this     *)
(* model) left it: the call is durable and approved, with no record, or    *)
(* with attempt 1 dispatched and never sent, in flight, or applied with    *)
(* its answer lost.  No process holds anything yet.                        *)
(***************************************************************************)
Init ==
    /\ \/ /\ rec = NoRecord /\ inflight = {} /\ applied = 0
          /\ sent = [n \in 1..MaxAttempts |-> 0] /\ invocations = {}
       \/ /\ rec = Dispatched(1, FirstAuth)
          /\ \/ inflight = {} /\ applied = 0 /\ sent = [n \in 1..MaxAttempts |-> 0]
                /\ invocations = {}
             \/ /\ inflight = {<<1, 0, Orig>>}
                /\ invocations = {<<1, FirstAuth, Orig, 0>>}
                /\ applied = 0
                /\ sent = [n \in 1..MaxAttempts |-> IF n = 1 THEN 1 ELSE 0]
             \/ /\ inflight = {} /\ applied = 1
                /\ invocations = {<<1, FirstAuth, Orig, 0>>}
                /\ sent = [n \in 1..MaxAttempts |-> IF n = 1 THEN 1 ELSE 0]
    /\ audit = IF rec = NoRecord THEN {} ELSE {<<"dispatch", 1>>}
    /\ res = "none" /\ epoch = 0
    /\ pc = [p \in Procs |-> "idle"]
    /\ view = [p \in Procs |-> NoView]
    /\ held = [p \in Procs |-> 0]
    /\ fenced = 0 /\ extEpoch = 0
    /\ humanRetries = 0 /\ crashes = 0
    /\ staleCommits = 0 /\ refusals = {} /\ staleDropped = FALSE
    /\ knownOutcome = FALSE /\ sentAfterOutcome = 0
    /\ droppedAfterOutcome = FALSE /\ staleViewCommits = FALSE

(***************************************************************************)
(* The recovery decision, restated from DurableToolExecution (the call is  *)
(* not legacy, its arguments never change, it has an approval if it needs *)
(* one, and its idempotency key is retained: key expiry, ExternalExpireKey *)
(* of the main spec, is not modelled here, so keyRetained is TRUE).  It    *)
(* reads the PROCESS's view, never the store.                              *)
(***************************************************************************)
Decide(i) ==
    IF i.hasResult THEN "skip"
    ELSE IF i.policy = "readonly" THEN "execute"
    ELSE IF i.status # "none" /\ ~i.digestMatches THEN "recovery_required"
    ELSE IF i.status \in {"succeeded", "failed", "abandoned"} THEN "reconstruct"
    ELSE IF i.status = "recovery_required" THEN "recovery_required"
    ELSE IF i.status = "dispatched" THEN
            CASE i.policy = "idempotent" ->
                   IF i.attempt < MaxAttempts /\ i.keyRetained
                   THEN "retry_same_id" ELSE "recovery_required"
              [] i.policy = "reconcile" -> "reconcile"
              [] OTHER -> "recovery_required"
    ELSE IF i.legacy /\ (i.approval = "approved" \/ ~i.requiresApproval)
         THEN "recovery_required"
    ELSE "execute"

InputsOf(v) ==
    [status |-> v.rec.status, attempt |-> v.rec.attempt, digestMatches |-> TRUE,
     approval |-> IF NeedsApproval THEN "approved" ELSE "none",
     hasResult |-> v.res # "none", policy |-> Pol, legacy |-> FALSE,
     requiresApproval |-> NeedsApproval, keyRetained |-> TRUE]
DecisionFor(p) == Decide(InputsOf(view[p]))

(***************************************************************************)
(* Commits.  CanCommit is the store's check inside the transaction; Commit *)
(* writes the new record, result and audit rows and leaves the process    *)
(* knowing what it wrote.  Without UseCAS a commit is a blind write of     *)
(* what the process computed from its (possibly stale) view.               *)
(***************************************************************************)
Current(p) == held[p] = epoch
\* The process decided on exactly what the store holds (NoCommitOnStaleView).
ViewIsCurrent(p) ==
    view[p].rec = rec /\ view[p].res = res /\ view[p].audit = audit
\* What the compare-and-set compares, on EVERY commit, an audit-only one
\* included: what the process read of the call, its record, result and
\* audit keys (the stores' CallView: result, record, approval and the
\* (kind, attempt) of its audit keys).  Not a version every commit bumps: a
\* decision taken again for an attempt writes its row, but adds no key and
\* changes nothing another process decided on, so the stores accept that
\* process's next commit (trace validation, tests/test_concurrent_trace.py,
\* found a version refusing it).  Nothing compared ever returns to an
\* earlier value (attempts grow, the audit and the result only gain), so
\* comparing contents is comparing "nothing changed since I read".  The
\* twin CASOnRecord compares the call's record and result only, so a commit
\* that only added audit keys since the process read goes unnoticed.
CASHolds(p) == ViewIsCurrent(p)
CASOnRecordHolds(p) == view[p].rec = rec /\ view[p].res = res
CAS(p) == CASHolds(p)   \* the twin's cfg overrides this name
CanCommit(p) == (UseCAS => CAS(p)) /\ (UseLease => Current(p))

Outcomes == {"succeeded", "failed", "abandoned"}
\* A commit step that writes nothing (an empty CommitPlan, below).
NoCommit == UNCHANGED <<rec, res, epoch, audit, view, held, staleCommits,
                        knownOutcome, staleViewCommits>>

Commit(p, r, s, rows) ==
    /\ CanCommit(p)
    /\ rec' = r /\ res' = s /\ audit' = audit \cup rows
    /\ view' = [view EXCEPT ![p] = [rec |-> r, res |-> s,
                                    audit |-> view[p].audit \cup rows]]
    /\ staleCommits' = IF Current(p) THEN staleCommits ELSE staleCommits + 1
    /\ staleViewCommits' = (staleViewCommits \/ ~ViewIsCurrent(p))
    /\ knownOutcome' = (knownOutcome \/ r.status \in Outcomes)
    /\ UNCHANGED <<epoch, held>>

\* A commit that would change nothing the process knows of (the record as
\* it read it, and an audit key it already saw: the store's audit key is
\* (execution, kind, attempt)) writes nothing and checks nothing, exactly
\* as an empty CommitPlan: a connector's "not applied" for an attempt whose
\* row is there already.  A recovery decision is never empty: every
\* decision keeps its row (the main spec's AuditDecision; the core writes
\* the row of a decision taken again), so its commit is checked as any
\* other and a process that decides again on a stale view is refused.
Empty(p, r, rows) == r = view[p].rec /\ rows \subseteq view[p].audit
RecoverRows(p) == {<<DecisionFor(p), view[p].rec.attempt>>}
RecoverRecord(p) == IF DecisionFor(p) = "recovery_required" THEN Halt(view[p].rec)
                    ELSE view[p].rec
NotAppliedRows(p) == {<<"reconcile_not_applied", view[p].rec.attempt>>}

\* The locations whose next step is a commit that writes something.
CommitsNext(p) ==
    \/ pc[p] \in {"live", "retry", "got_ok", "got_fail", "recorded",
                  "rec_applied", "rec_unknown", "halted"}
    \/ pc[p] = "rec_not_applied" /\ ~Empty(p, view[p].rec, NotAppliedRows(p))
    \/ pc[p] = "resume" /\ DecisionFor(p) # "skip"

\* The store refuses the commit: nothing is written; the process forgets
\* what it read and must take the session again and decide again.
Refused(p) ==
    /\ CommitsNext(p) /\ ~CanCommit(p)
    /\ pc' = [pc EXCEPT ![p] = "idle"]
    /\ view' = [view EXCEPT ![p] = NoView]
    /\ held' = [held EXCEPT ![p] = 0]
    /\ refusals' = refusals \cup
                     {r \in {"cas", "epoch"} :
                        IF r = "cas" THEN UseCAS /\ ~CAS(p)
                                     ELSE UseLease /\ ~Current(p)}
    /\ UNCHANGED durable /\ UNCHANGED external
    /\ UNCHANGED <<applied, sent, invocations, humanRetries, crashes,
                   staleCommits, staleDropped, knownOutcome, sentAfterOutcome,
                   droppedAfterOutcome, staleViewCommits>>

(***************************************************************************)
(* Actions of process p.                                                   *)
(***************************************************************************)
\* The external side learns process p's epoch (an epoch-aware connector
\* keeps the newest it has seen).
SeeEpoch(p) == extEpoch' = IF EpochAware /\ held[p] > extEpoch THEN held[p] ELSE extEpoch
\* A request of epoch e can no longer reach the tool: the connector has
\* seen a newer epoch (extEpoch only grows) and will refuse it.
Refusable(e) == EpochAware /\ e < extEpoch

\* The process that took the session makes its epoch known to the external
\* side before it decides anything (docs/protocol.md#concurrent-resumers):
\* the connector's announcement (Session.open's announce_epoch hook), a
\* request of its own, not a durable write.  From then on an epoch-aware
\* connector refuses every request of an older epoch, so a worker declared
\* dead between its dispatched commit and its send can no longer reach the
\* tool once this process or its human resolved the call.  Every later
\* request (InvokeAdapter, ReconcileQuery) carries the epoch too.  The twin
\* EpochOnQueryOnly is the old rule (EpochOnTake = FALSE): the epoch reaches
\* the external side only with a request or a reconcile query, and a human
\* resolving a halted call sends neither.
EpochOnTake == TRUE
\* A connector without epochs has nothing to announce to: no step.
Announces == EpochAware /\ EpochOnTake

\* Take the session and read it: bump the lease epoch (the takeover is not
\* conditioned on anything: the previous holder may be declared dead while
\* it still runs, and a resume path may fire when nothing is left to do)
\* and load the durable state, in one transaction.
TakeSession(p) ==
    /\ pc[p] = "idle" /\ epoch < MaxEpoch
    /\ epoch' = epoch + 1
    /\ held' = [held EXCEPT ![p] = epoch + 1]
    /\ view' = [view EXCEPT ![p] = [rec |-> rec, res |-> res, audit |-> audit]]
    /\ pc' = [pc EXCEPT ![p] = IF Announces THEN "taken" ELSE "resume"]
    /\ UNCHANGED <<rec, res, audit>> /\ UNCHANGED external /\ UNCHANGED ghosts

\* The process that took the session announces its epoch (above).
AnnounceEpoch(p) ==
    /\ pc[p] = "taken"
    /\ SeeEpoch(p)
    /\ pc' = [pc EXCEPT ![p] = "resume"]
    /\ UNCHANGED durable /\ UNCHANGED <<view, held, inflight, fenced>>
    /\ UNCHANGED ghosts

(***************************************************************************)
(* A human's retry is a durable GRANT, not a dispatch (the main spec's     *)
(* HumanResolveRetry): it writes only the "human_retry" row for the        *)
(* attempt after the halted record's.  RetryGranted(v): the grant stands  *)
(* and is unused in what v holds (a process's view, or the store: Stored): *)
(* the record is still halted at attempt n, the call has no result, and   *)
(* the row for n+1 is there.  Recover honours it: its halt decision sends *)
(* the call to the "retry" stage instead of back to the human, and the     *)
(* dispatch of attempt n+1 is authorized "human" (AttemptAuth).  Whichever *)
(* process runs Recover next reads the grant from the store alone.  Once   *)
(* n+1 is dispatched the record is at n+1 and the row grants nothing more. *)
(* HonourRetryGrant is the design switch: FALSE is the engine that does    *)
(* not read the grant and halts the call again (twin                       *)
(* ConcurrentRetryGrantForgotten: RetryGrantHonoured).                     *)
(***************************************************************************)
HonourRetryGrant == TRUE
Stored == [rec |-> rec, res |-> res, audit |-> audit]
RetryGranted(v) ==
    /\ v.rec.status = "recovery_required" /\ v.res = "none"
    /\ <<"human_retry", v.rec.attempt + 1>> \in v.audit
\* Process p holds the call for the granted retry, on what the store holds.
HoldsGrantedRetry(p) ==
    pc[p] = "retry" /\ RetryGranted(view[p]) /\ view[p] = Stored

StageAfter(d) ==
    CASE d = "skip" -> "idle"
      [] d = "execute" -> "live"
      [] d = "reconstruct" -> "recorded"
      [] d = "retry_same_id" -> "retry"
      [] d = "reconcile" -> "reconciling"
      [] d = "recovery_required" -> "halted"

\* Apply the recovery decision to the call as the process read it.  Every
\* decision but skip is audited, a decision taken again for the same
\* attempt included (its row is written, its key is one the store has), so
\* every decision but skip is a commit, checked by the store (the audit
\* row is the commit's content here; a halt also writes the record).
Recover(p) ==
    LET d == DecisionFor(p) IN
    /\ pc[p] = "resume"
    \* a halt with a human's unused retry grant: the retry, not the human again
    /\ pc' = [pc EXCEPT ![p] = IF d = "recovery_required" /\ HonourRetryGrant
                                   /\ RetryGranted(view[p])
                                THEN "retry" ELSE StageAfter(d)]
    /\ IF d = "skip"
       THEN NoCommit
       ELSE Commit(p, RecoverRecord(p), view[p].res, RecoverRows(p))
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, sent, invocations, humanRetries, crashes,
                   refusals, staleDropped, sentAfterOutcome,
                   droppedAfterOutcome>>

\* dispatched(attempt n) is made durable before the adapter is invoked.
\* Who authorizes it: a retry is the recovery policy's, or the human's whose
\* grant it uses; a first attempt the approval's (the main spec's
\* AttemptAuth; a clause twin's cfg overrides this name).
AttemptAuth(p) == IF pc[p] = "retry"
                  THEN (IF RetryGranted(view[p]) THEN "human" ELSE "policy")
                  ELSE FirstAuth
PersistDispatched(p) ==
    LET n == view[p].rec.attempt + 1
        auth == AttemptAuth(p)
    IN
    /\ pc[p] \in {"live", "retry"} /\ n <= MaxAttempts
    /\ Commit(p, Dispatched(n, auth), view[p].res, {<<"dispatch", n>>})
    /\ pc' = [pc EXCEPT ![p] = "dispatched"]
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, sent, invocations, humanRetries, crashes,
                   refusals, staleDropped, sentAfterOutcome,
                   droppedAfterOutcome>>

\* The adapter is invoked with the execution id, the attempt and the epoch
\* the process holds.  Sending is not a durable write: a process that lost
\* the lease since it committed dispatched still sends.
InvokeAdapter(p) ==
    LET n == view[p].rec.attempt IN
    /\ pc[p] = "dispatched"
    /\ inflight' = inflight \cup {<<n, held[p], p>>}
    /\ sent' = [sent EXCEPT ![n] = @ + 1]
    /\ invocations' = invocations \cup {<<n, view[p].rec.auth, p, held[p]>>}
    /\ sentAfterOutcome' = IF knownOutcome /\ ~Refusable(held[p])
                          THEN sentAfterOutcome + 1 ELSE sentAfterOutcome
    /\ pc' = [pc EXCEPT ![p] = "waiting"]
    /\ UNCHANGED durable /\ UNCHANGED <<view, held, fenced, extEpoch>>
    /\ UNCHANGED <<applied, humanRetries, crashes, staleCommits, refusals,
                   staleDropped, knownOutcome, droppedAfterOutcome, staleViewCommits>>

RecordSucceeded(p) ==
    /\ pc[p] = "got_ok"
    /\ Commit(p, [view[p].rec EXCEPT !.status = "succeeded", !.result = "ok"],
              view[p].res, {})
    /\ pc' = [pc EXCEPT ![p] = "recorded"]
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, sent, invocations, humanRetries, crashes,
                   refusals, staleDropped, sentAfterOutcome,
                   droppedAfterOutcome>>

RecordFailed(p) ==
    /\ pc[p] = "got_fail"
    /\ Commit(p, [view[p].rec EXCEPT !.status = "failed", !.result = "error"],
              view[p].res, {})
    /\ pc' = [pc EXCEPT ![p] = "recorded"]
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, sent, invocations, humanRetries, crashes,
                   refusals, staleDropped, sentAfterOutcome,
                   droppedAfterOutcome>>

\* The result is appended to the conversation (the same store, so the same
\* check) and the process is done with the call.
AppendResult(p) ==
    /\ pc[p] = "recorded"
    /\ Commit(p, view[p].rec, view[p].rec.result, {})
    /\ pc' = [pc EXCEPT ![p] = "idle"]
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, sent, invocations, humanRetries, crashes,
                   refusals, staleDropped, sentAfterOutcome,
                   droppedAfterOutcome>>

\* The live process gives up waiting and re-decides on what it knows.
Timeout(p) ==
    /\ pc[p] = "waiting"
    /\ pc' = [pc EXCEPT ![p] = "resume"]
    /\ UNCHANGED durable /\ UNCHANGED <<view, held>> /\ UNCHANGED external
    /\ UNCHANGED ghosts

\* The connector's query: one atomic step at the external system, which
\* fences the attempts so far when it answers "not applied".  It carries
\* the process's epoch too.

ReconcileQuery(p) ==
    LET n == view[p].rec.attempt IN
    /\ pc[p] = "reconciling"
    /\ \/ /\ applied >= 1
          /\ pc' = [pc EXCEPT ![p] = "rec_applied"] /\ UNCHANGED fenced
       \/ /\ applied = 0 /\ n < MaxAttempts
          /\ fenced' = IF n > fenced THEN n ELSE fenced
          /\ pc' = [pc EXCEPT ![p] = "rec_not_applied"]
       \/ /\ pc' = [pc EXCEPT ![p] = "rec_unknown"] /\ UNCHANGED fenced
    /\ SeeEpoch(p)
    /\ UNCHANGED durable /\ UNCHANGED <<view, held, inflight>> /\ UNCHANGED ghosts

\* The connector's answer is committed (its audit row; "applied" also
\* writes the outcome, "unknown" halts the call).
ReconcileCommit(p) ==
    /\ \/ /\ pc[p] = "rec_applied"
          /\ Commit(p, [view[p].rec EXCEPT !.status = "succeeded", !.result = "ok"],
                    view[p].res, {<<"reconcile_applied", view[p].rec.attempt>>})
          /\ pc' = [pc EXCEPT ![p] = "recorded"]
       \/ /\ pc[p] = "rec_not_applied"
          /\ IF Empty(p, view[p].rec, NotAppliedRows(p))
             THEN NoCommit
             ELSE Commit(p, view[p].rec, view[p].res, NotAppliedRows(p))
          /\ pc' = [pc EXCEPT ![p] = "retry"]
       \/ /\ pc[p] = "rec_unknown"
          /\ Commit(p, Halt(view[p].rec), view[p].res,
                    {<<"reconcile_unknown", view[p].rec.attempt>>})
          /\ pc' = [pc EXCEPT ![p] = "halted"]
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, sent, invocations, humanRetries, crashes,
                   refusals, staleDropped, sentAfterOutcome,
                   droppedAfterOutcome>>

\* A human resolves the halted call through the process that shows it
\* (an inbox resolution is one of the resume paths).
HumanResolveApplied(p) ==
    /\ pc[p] = "halted" /\ view[p].rec.status = "recovery_required"
    /\ Commit(p, [view[p].rec EXCEPT !.status = "succeeded", !.result = "human"],
              view[p].res, {<<"human_applied", view[p].rec.attempt>>})
    /\ pc' = [pc EXCEPT ![p] = "recorded"]
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, sent, invocations, humanRetries, crashes,
                   refusals, staleDropped, sentAfterOutcome,
                   droppedAfterOutcome>>

\* The human grants one more attempt (n+1, same id): a durable grant, the
\* audit row only; the process re-decides (Recover honours the grant).  One
\* grant per attempt.
HumanResolveRetry(p) ==
    LET n == view[p].rec.attempt + 1 IN
    /\ pc[p] = "halted" /\ view[p].rec.status = "recovery_required"
    /\ n <= MaxAttempts /\ <<"human_retry", n>> \notin view[p].audit
    /\ Commit(p, view[p].rec, view[p].res, {<<"human_retry", n>>})
    /\ humanRetries' = humanRetries + 1
    /\ pc' = [pc EXCEPT ![p] = "resume"]
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, sent, invocations, crashes, refusals, staleDropped,
                   sentAfterOutcome, droppedAfterOutcome>>

HumanResolveAbandon(p) ==
    /\ pc[p] = "halted" /\ view[p].rec.status = "recovery_required"
    /\ Commit(p, [view[p].rec EXCEPT !.status = "abandoned", !.result = "abandoned"],
              view[p].res, {<<"human_abandon", view[p].rec.attempt>>})
    /\ pc' = [pc EXCEPT ![p] = "recorded"]
    /\ UNCHANGED external
    /\ UNCHANGED <<applied, sent, invocations, humanRetries, crashes,
                   refusals, staleDropped, sentAfterOutcome,
                   droppedAfterOutcome>>

\* Process p dies: its volatile state is lost; its requests stay in flight.
\* It may start again (TakeSession).  A process declared dead while it
\* still runs is not a crash: it is the other process taking the session.
Crash(p) ==
    /\ crashes < MaxCrashes /\ pc[p] # "idle"
    /\ crashes' = crashes + 1
    /\ pc' = [pc EXCEPT ![p] = "idle"]
    /\ view' = [view EXCEPT ![p] = NoView]
    /\ held' = [held EXCEPT ![p] = 0]
    /\ UNCHANGED durable /\ UNCHANGED external
    /\ UNCHANGED <<applied, sent, invocations, humanRetries, staleCommits,
                   refusals, staleDropped, knownOutcome, sentAfterOutcome,
                   droppedAfterOutcome, staleViewCommits>>

(***************************************************************************)
(* The external system processes request r = <<attempt, epoch, sender>>.  *)
(* An answer reaches the sender only if it still waits for that attempt.  *)
(***************************************************************************)
Fenced(r) == r[1] <= fenced
StaleEpoch(r) == Refusable(r[2])
\* The answer of request r reaches its sender while it waits for that
\* attempt, or late (after a time-out) while it still holds the record at
\* that attempt with no outcome (the main spec's HoldsUnanswered): about to
\* re-decide, halted for a human, reconciling, or holding a policy retry in
\* memory; it then records that attempt's answer (its commit is checked as
\* any other) instead of leaving a human to decide knowing less.
HoldsUnanswered(p, n) ==
    /\ pc[p] \in {"resume", "halted", "reconciling", "retry"}
    /\ view[p].rec.attempt = n
    /\ view[p].rec.status \in {"dispatched", "recovery_required"}
Takes(p, r) ==
    /\ p = r[3] /\ held[p] = r[2]
    /\ \/ pc[p] = "waiting" /\ view[p].rec.attempt = r[1]
       \/ HoldsUnanswered(p, r[1])
Answer(r, s) == pc' = [p \in Procs |-> IF Takes(p, r) THEN s ELSE pc[p]]
See(r) == extEpoch' = IF EpochAware /\ r[2] > extEpoch THEN r[2] ELSE extEpoch
Apply == applied' = IF Pol = "idempotent" /\ applied >= 1 THEN applied ELSE applied + 1

ExternalApply(r) ==
    /\ r \in inflight /\ ~Fenced(r) /\ ~StaleEpoch(r)
    /\ inflight' = inflight \ {r} /\ Apply /\ See(r)
    /\ Answer(r, "got_ok")
    /\ UNCHANGED durable /\ UNCHANGED <<view, held, fenced>>
    /\ UNCHANGED <<sent, invocations, humanRetries, crashes, staleCommits,
                   refusals, staleDropped, knownOutcome, sentAfterOutcome,
                   droppedAfterOutcome, staleViewCommits>>

ExternalApplyLoseAnswer(r) ==
    /\ r \in inflight /\ ~Fenced(r) /\ ~StaleEpoch(r)
    /\ inflight' = inflight \ {r} /\ Apply /\ See(r)
    /\ UNCHANGED durable /\ UNCHANGED volatile /\ UNCHANGED fenced
    /\ UNCHANGED <<sent, invocations, humanRetries, crashes, staleCommits,
                   refusals, staleDropped, knownOutcome, sentAfterOutcome,
                   droppedAfterOutcome, staleViewCommits>>

\* A definite failure, known not applied (an idempotent system that already
\* applied the execution answers with that result instead).
ExternalRejectDefinite(r) ==
    /\ r \in inflight /\ ~Fenced(r) /\ ~StaleEpoch(r)
    /\ ~(Pol = "idempotent" /\ applied >= 1)
    /\ inflight' = inflight \ {r} /\ See(r)
    /\ Answer(r, "got_fail")
    /\ UNCHANGED durable /\ UNCHANGED <<view, held, fenced>>
    /\ UNCHANGED ghosts

\* A late request of a fenced attempt, or of a stale epoch at an
\* epoch-aware connector, is dropped without effect.
ExternalDrop(r) ==
    /\ r \in inflight /\ (Fenced(r) \/ StaleEpoch(r))
    /\ inflight' = inflight \ {r}
    /\ staleDropped' = (staleDropped \/ (StaleEpoch(r) /\ ~Fenced(r)))
    /\ droppedAfterOutcome' = (droppedAfterOutcome \/
                                (StaleEpoch(r) /\ ~Fenced(r) /\ knownOutcome))
    /\ UNCHANGED durable /\ UNCHANGED volatile /\ UNCHANGED <<fenced, extEpoch>>
    /\ UNCHANGED <<applied, sent, invocations, humanRetries, crashes,
                   staleCommits, refusals, knownOutcome, sentAfterOutcome,
                   staleViewCommits>>

\* Each action is its own disjunct, so that TLC labels trace steps with it.
Next ==
    \/ \E p \in Procs : TakeSession(p)
    \/ \E p \in Procs : AnnounceEpoch(p)
    \/ \E p \in Procs : Recover(p)
    \/ \E p \in Procs : PersistDispatched(p)
    \/ \E p \in Procs : InvokeAdapter(p)
    \/ \E p \in Procs : RecordSucceeded(p)
    \/ \E p \in Procs : RecordFailed(p)
    \/ \E p \in Procs : AppendResult(p)
    \/ \E p \in Procs : Timeout(p)
    \/ \E p \in Procs : ReconcileQuery(p)
    \/ \E p \in Procs : ReconcileCommit(p)
    \/ \E p \in Procs : HumanResolveApplied(p)
    \/ \E p \in Procs : HumanResolveRetry(p)
    \/ \E p \in Procs : HumanResolveAbandon(p)
    \/ \E p \in Procs : Refused(p)
    \/ \E p \in Procs : Crash(p)
    \/ \E r \in Requests : ExternalApply(r)
    \/ \E r \in Requests : ExternalApplyLoseAnswer(r)
    \/ \E r \in Requests : ExternalRejectDefinite(r)
    \/ \E r \in Requests : ExternalDrop(r)

Spec == Init /\ [][Next]_vars

(***************************************************************************)
(* Fairness, for EventuallyAnswered (the main spec's Fairness, per        *)
(* process): a process does not stop halfway through its own steps (it    *)
(* commits, sends, times out, is refused), its human answers a call it    *)
(* holds halted, the external system answers, applies or drops every       *)
(* request in flight, and a session nobody runs is taken again (Restart:   *)
(* the engine comes back after a crash or a refusal).  Nothing forces a    *)
(* crash, or a takeover of a session another process runs.                 *)
(***************************************************************************)
ProcStep(p) ==
    \/ AnnounceEpoch(p) \/ Recover(p) \/ PersistDispatched(p) \/ InvokeAdapter(p)
    \/ RecordSucceeded(p) \/ RecordFailed(p) \/ AppendResult(p) \/ Timeout(p)
    \/ ReconcileQuery(p) \/ ReconcileCommit(p) \/ Refused(p)
HumanStep(p) ==
    HumanResolveApplied(p) \/ HumanResolveRetry(p) \/ HumanResolveAbandon(p)
Restart(p) == TakeSession(p) /\ \A q \in Procs : pc[q] = "idle"
ExternalStep ==
    \E r \in Requests :
        \/ ExternalApply(r) \/ ExternalApplyLoseAnswer(r)
        \/ ExternalRejectDefinite(r) \/ ExternalDrop(r)
Fairness ==
    /\ \A p \in Procs : WF_vars(ProcStep(p))
    /\ \A p \in Procs : WF_vars(HumanStep(p))
    /\ WF_vars(\E p \in Procs : Restart(p))
    /\ WF_vars(ExternalStep)
FairSpec == Spec /\ Fairness

(***************************************************************************)
(* INVARIANTS: the main spec's, same names and meaning, for the one call.  *)
(***************************************************************************)
(* AtMostOnceEffect: the effect is applied at most once, plus once per     *)
(* retry a human explicitly authorized.                                    *)
AtMostOnceEffect ==
    applied <= 1 + humanRetries

(* AttemptSentOnce: each attempt is sent at most once, by all the          *)
(* processes together.                                                     *)
AttemptSentOnce ==
    \A n \in 1..MaxAttempts : sent[n] <= 1

(* NoBlindReplay: every invocation after the first is authorized by the    *)
(* policy (idempotent with the same id; reconcile with the earlier         *)
(* attempts fenced) or by a human.                                         *)
NoBlindReplay ==
    \A i \in invocations :
        i[1] > 1 =>
            \/ i[2] = "human"
            \/ i[2] = "policy" /\ Pol = "idempotent"
            \/ i[2] = "policy" /\ Pol = "reconcile" /\ fenced >= i[1] - 1

(* ApprovalSingleUse: the approval authorizes one request, not one per     *)
(* process.                                                                *)
ApprovalSingleUse ==
    Cardinality({i \in invocations : i[2] = "approval"}) <= 1

(* StaleWorkerNeverCommits: a process that lost the session (another took *)
(* a newer lease epoch) never commits anything.                            *)
StaleWorkerNeverCommits ==
    staleCommits = 0

(* NoReinvokeAfterKnownOutcome: once a succeeded, failed or abandoned     *)
(* outcome was durable (the ghost knownOutcome), no request of the call    *)
(* that can still reach the tool is sent, and no process holds one that is *)
(* about to be sent.  With several processes, "reach the tool" is the only *)
(* reading that a protocol can keep: a worker declared dead between its    *)
(* dispatched commit and its send cannot be stopped from sending; what     *)
(* makes it harmless is that its request can no longer be applied (an     *)
(* epoch-aware connector has seen a newer epoch: Refusable), or that it    *)
(* cannot commit the dispatch of a retry (CanCommit, which never becomes   *)
(* TRUE again once FALSE).  With one process this is the main spec's       *)
(* invariant word for word.                                                *)
CanStillInvoke(p) ==
    \/ pc[p] = "dispatched" /\ ~Refusable(held[p])
    \/ pc[p] = "retry" /\ CanCommit(p)
NoReinvokeAfterKnownOutcome ==
    /\ sentAfterOutcome = 0
    /\ knownOutcome => \A p \in Procs : ~CanStillInvoke(p)

(* ResultFidelity: the result in the conversation says what happened: ok *)
(* only if the effect was applied; error (the last attempt definitely     *)
(* failed) beside an effect only from an attempt a human chose to retry,   *)
(* or, for an idempotent tool, the one attempt still in flight when its    *)
(* policy retry was rejected; human and abandoned are a human's word.      *)
(* (The main spec's clauses on the execution id and the arguments have    *)
(* nothing to say of one call with one id and fixed arguments.)           *)
ResultFidelity ==
    /\ res = "ok" => applied >= 1
    /\ res = "error" =>
          applied <= humanRetries + (IF Pol = "idempotent" THEN 1 ELSE 0)

(* RecoveryRequiredHalts: while the call is in recovery_required no        *)
(* process holds anything that could invoke it: a process about to commit  *)
(* a dispatch cannot (CanCommit), and a request about to be sent cannot   *)
(* reach the tool (CanStillInvoke); only a human (a retry the human        *)
(* granted, held to dispatch on what the store holds: HoldsGrantedRetry),  *)
(* or the attempt's own late answer, moves the call on.                    *)
RecoveryRequiredHalts ==
    rec.status = "recovery_required" =>
        \A p \in Procs :
            /\ ~CanStillInvoke(p) \/ HoldsGrantedRetry(p)
            /\ pc[p] = "live" => ~CanCommit(p)

(* RetryGrantHonoured: a human's retry grant outlives the process that    *)
(* recorded it and is not answered by another halt: no process that read  *)
(* an unused grant (RetryGranted) holds the call waiting for a human.      *)
RetryGrantHonoured ==
    \A p \in Procs : pc[p] = "halted" => ~RetryGranted(view[p])

(* AuditComplete: every invocation has its dispatch row.  (Every decision *)
(* and connector answer is committed with its row, so the main spec's     *)
(* second clause holds by construction here.)                              *)
AuditComplete ==
    \A i \in invocations : <<"dispatch", i[1]>> \in audit

(* NoCommitOnStaleView: every commit was decided on exactly what the store *)
(* held when it committed: the record, the result and the audit keys (the  *)
(* stores' CallView).  A commit that only adds an audit row (a recovery    *)
(* decision, a connector's "not applied") is no exception, or two          *)
(* processes each record a decision for one attempt, the second on a view  *)
(* that missed the first.  The compare-and-set on everything read keeps    *)
(* it; one on the call's record does not (twin CASOnRecord).               *)
NoCommitOnStaleView ==
    ~staleViewCommits

(***************************************************************************)
(* WITNESSES: negated antecedents; each must be violated on a must-pass    *)
(* model (model/manifest.toml, antecedent_of).                             *)
(***************************************************************************)
\* Two processes hold the session's call at once, having read the same
\* durable state (AtMostOnceEffect, AttemptSentOnce, ApprovalSingleUse:
\* the race the compare-and-set decides).
Witness_TwoResuming ==
    ~\E p, q \in Procs :
        /\ p # q /\ pc[p] # "idle" /\ pc[q] # "idle"
        /\ view[p] = view[q] /\ view[p].rec.status = "dispatched"

\* A loser's commit was refused because the store changed since it read
\* (NoBlindReplay, AttemptSentOnce: the second reconcile resumer).
Witness_LoserRefused ==
    "cas" \notin refusals

\* A process that lost the lease tried to commit and was refused
\* (StaleWorkerNeverCommits).
Witness_StaleWorkerRefused ==
    "epoch" \notin refusals

\* A stale worker's request reached an epoch-aware connector after a newer
\* epoch and was dropped (the epoch travels with the request).
Witness_StaleRequestDropped ==
    ~staleDropped

\* A stale worker's request, sent after the call's outcome was durable, was
\* refused by the epoch-aware connector because the process that took the
\* session made its epoch known (NoReinvokeAfterKnownOutcome: the refusal
\* is what keeps it, AnnounceEpoch).
Witness_StaleRequestRefusedAfterOutcome ==
    ~droppedAfterOutcome

\* The call waits for a human while another process is about to commit a
\* dispatch or to send (RecoveryRequiredHalts: what the compare-and-set,
\* the lease and the announced epoch make harmless), a granted retry aside.
Witness_HaltedBesideSender ==
    ~(rec.status = "recovery_required" /\
      \E p \in Procs : pc[p] \in {"live", "retry", "dispatched"} /\ ~HoldsGrantedRetry(p))

\* A human's retry grant is honoured by Recover: a process holds the call,
\* still halted, for the granted retry (RetryGrantHonoured,
\* RecoveryRequiredHalts).
Witness_RetryGrantHonoured ==
    ~\E p \in Procs : HoldsGrantedRetry(p)

\* The call's result is an error although its effect was applied (the
\* idempotent exception of ResultFidelity: the attempt still in flight
\* when its policy retry was rejected).
Witness_ErrorResultBesideEffect ==
    ~(res = "error" /\ applied >= 1)

(***************************************************************************)
(* PROPERTIES                                                              *)
(***************************************************************************)
(* EventuallyAnswered: the main spec's, for the one call: with Fairness    *)
(* the call ends (and stays) with a result, a halted call once its human   *)
(* resolves it, whichever process holds it and however often the session  *)
(* changes hands (MCConcurrentLiveness bounds the takeovers).              *)
EventuallyAnswered == <>[](res # "none")

=============================================================================
