"""The clause twins of issue 28's surviving weakened invariants kill them (TLC).

Issue 28 planted weakened invariants no model noticed: NoBlindReplay without
its fence clause, EventuallySettled as <>Settled, LegacyConservative
accepting any policy retry, AuditComplete without a halt's row; and a
dropped ~Fenced(e, n) in ExternalApply.  Each now has an entry in
model/clauses.toml; here each is run (toolledger.check.clauses.run_kills:
the twin with the clause weakened must satisfy what is left, or, for the
guard, drift).  The check bites: a twin that does not isolate a clause
(UnfencedRetry for the reconcile disjunct's auth clause) is reported alive,
in the same TLC run.  `python -m toolledger.check.clauses` runs every entry.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from checker_support import ROOT
from toolledger.check.clauses import ClauseEntry, load_clauses, main, run_kills
from toolledger.check.manifest import load_manifest

SURVIVORS = [
    ("NoBlindReplay", "fenced[i[1]] >= i[2] - 1", ""),
    ("EventuallySettled", "<>[]Settled(c)", "<>Settled(c)"),
    ("LegacyConservative", 'row[1] = "human_retry"', ""),
    ("AuditComplete", "d \\in audit[ExecId(c)]",
     'd[1] = "recovery_required" \\/ d \\in audit[ExecId(c)]'),
    ("ExternalApply", "~Fenced(e, n)", ""),
]


def test_the_issue_28_survivors_are_killed(tmp_path: Path) -> None:
    manifest = load_manifest(ROOT)
    entries = {(e.operator, e.clause, e.weakened): e for e in load_clauses(ROOT)}
    chosen = [entries[s] for s in SURVIVORS]
    # not isolated by UnfencedRetry (its retry is a policy one): must be reported alive
    alive = ClauseEntry("DurableToolExecution", "NoBlindReplay", 'i[3] = "policy"',
                        occurrence=2, twin="UnfencedRetry")
    kills = {(k.entry.operator, k.entry.clause, k.entry.weakened, k.entry.occurrence): k
             for k in run_kills(manifest, [*chosen, alive], tmp_path)}
    for e in chosen:
        k = kills[(e.operator, e.clause, e.weakened, e.occurrence)]
        assert k.killed, k.detail
    k = kills[("NoBlindReplay", 'i[3] = "policy"', "", 2)]
    assert not k.killed and "does not isolate" in k.detail


def test_a_narrowed_bound_is_killed_and_an_unchanged_one_is_not(tmp_path: Path) -> None:
    """Quantifier bounds (kind = "bound"): CancelIgnored (one call) kills the
    narrowing of ``c \\in Calls`` to every call but the first (none left), and
    cannot kill the narrowing to the first call alone (the domain unchanged):
    model/clauses.toml names a two-call twin for that one (MCSecondValue.tla:
    the mistake at the second call only)."""
    manifest = load_manifest(ROOT)
    rest, first = (ClauseEntry("DurableToolExecution", "CancelledNeverInvoked", "c \\in Calls",
                               weakened=w, twin="CancelIgnored", kind="bound")
                   for w in ("rest", "first"))
    entries = {(e.operator, e.kind, e.clause, e.weakened): e for e in load_clauses(ROOT)}
    assert entries[("CancelledNeverInvoked", "bound", "c \\in Calls", "rest")].twin
    assert entries[("CancelledNeverInvoked", "bound", "c \\in Calls", "first")].twin not in (
        "", "CancelIgnored")
    got = {k.entry.weakened: k for k in run_kills(manifest, [rest, first], tmp_path)}
    assert got["rest"].killed, got["rest"].detail
    assert not got["first"].killed and "does not isolate" in got["first"].detail


def test_a_one_process_twin_kills_one_narrowing_of_procs(tmp_path: Path) -> None:
    """The processes of ConcurrentResumers are symmetric, so a narrowing of
    ``p \\in Procs`` needs a twin with the mistake in one process only
    (model/MCConcurrentResumers.tla, Faulty): ConcurrentRetryKnownFirstProcess,
    the mistake in the first process, kills the narrowing to the rest and
    not the one to the first, which ConcurrentRetryKnownSecondProcess kills."""
    manifest = load_manifest(ROOT)
    entries = {(e.operator, e.kind, e.clause, e.weakened): e for e in load_clauses(ROOT)}
    key = ("NoReinvokeAfterKnownOutcome", "bound", "p \\in Procs")
    assert entries[(*key, "rest")].twin == "ConcurrentRetryKnownFirstProcess"
    assert entries[(*key, "first")].twin == "ConcurrentRetryKnownSecondProcess"
    rest, first = (ClauseEntry("ConcurrentResumers", key[0], key[2], weakened=w,
                               twin="ConcurrentRetryKnownFirstProcess", kind="bound")
                   for w in ("rest", "first"))
    got = {k.entry.weakened: k for k in run_kills(manifest, [rest, first], tmp_path)}
    assert got["rest"].killed, got["rest"].detail
    assert not got["first"].killed and "does not isolate" in got["first"].detail


def test_the_concurrent_audit_narrowing_needs_its_own_twin(tmp_path: Path) -> None:
    """ConcurrentResumers' AuditComplete narrowed to every invocation but the
    first: ConcurrentDispatchUnaudited (every dispatch without its row) breaks
    the narrowed invariant too, so it cannot kill it (the entry named it until
    the clauses tool reported it alive); ConcurrentFirstDispatchUnaudited
    (attempt 1's row missing, the first invocation's, alone) does."""
    manifest = load_manifest(ROOT)
    entries = {(e.spec, e.operator, e.kind, e.clause, e.weakened): e for e in load_clauses(ROOT)}
    key = ("ConcurrentResumers", "AuditComplete", "bound", "i \\in invocations", "rest")
    assert entries[key].twin == "ConcurrentFirstDispatchUnaudited"
    old = ClauseEntry("ConcurrentResumers", "AuditComplete", "i \\in invocations",
                      weakened="rest", twin="ConcurrentDispatchUnaudited", kind="bound")
    got = {k.entry.twin: k for k in run_kills(manifest, [entries[key], old], tmp_path)}
    assert got["ConcurrentFirstDispatchUnaudited"].killed, got[
        "ConcurrentFirstDispatchUnaudited"].detail
    assert not got["ConcurrentDispatchUnaudited"].killed
    assert "does not isolate" in got["ConcurrentDispatchUnaudited"].detail


def test_the_approval_gate_narrowing_to_the_first_invocation_has_a_twin(tmp_path: Path) -> None:
    """ApprovalGate narrowed to the first of invocations[c] (the lowest
    attempt): a call never approved violates it at every invocation but a
    human's, so a twin must send a human's invocation first and an
    unauthorized one after it.  PendingApprovalHalted (MCSecondValue.tla: a
    restart halts a call whose approval is not given, a human's retry grants
    attempt 1, the policy retry of attempt 2 runs on no approval) does; the
    entry was open until it was built.  ApprovalIgnored (attempt 1 itself
    sent without approval) violates the narrowed invariant too: alive."""
    manifest = load_manifest(ROOT)
    entries = {(e.spec, e.operator, e.kind, e.clause, e.weakened): e for e in load_clauses(ROOT)}
    key = ("DurableToolExecution", "ApprovalGate", "bound", "i \\in invocations[c]", "first")
    assert entries[key].twin == "PendingApprovalHalted"
    assert not entries[key].reason
    old = ClauseEntry("DurableToolExecution", "ApprovalGate", "i \\in invocations[c]",
                      weakened="first", twin="ApprovalIgnored", kind="bound")
    got = {k.entry.twin: k for k in run_kills(manifest, [entries[key], old], tmp_path)}
    assert got["PendingApprovalHalted"].killed, got["PendingApprovalHalted"].detail
    assert not got["ApprovalIgnored"].killed
    assert "does not isolate" in got["ApprovalIgnored"].detail


def test_the_no_alias_narrowing_to_the_rest_needs_the_earliest_call_aliased(
        tmp_path: Path) -> None:
    """ResponsePlacement's NoAlias narrowed to every handed pair but the first
    (the earliest call answered): PlaceByContent hands a later call (a
    deliberate repeat) the earlier call's effect, a later pair, so it breaks
    the narrowed invariant too and cannot kill it; RequestById (one response,
    a reused provider id: the earlier call's key goes out with the later
    call's request, never the reverse) breaks NoAlias at the first pair
    alone, and does."""
    manifest = load_manifest(ROOT)
    entries = {(e.spec, e.operator, e.kind, e.clause, e.weakened): e for e in load_clauses(ROOT)}
    key = ("ResponsePlacement", "NoAlias", "bound", "h \\in handed", "rest")
    assert entries[key].twin == "RequestById" and not entries[key].reason
    assert entries[(*key[:4], "first")].twin == "PlaceByContent"
    old = ClauseEntry("ResponsePlacement", "NoAlias", "h \\in handed",
                      weakened="rest", twin="PlaceByContent", kind="bound")
    first = ClauseEntry("ResponsePlacement", "NoAlias", "h \\in handed",
                        weakened="first", twin="RequestById", kind="bound")
    got = {(k.entry.twin, k.entry.weakened): k
           for k in run_kills(manifest, [entries[key], old, first], tmp_path)}
    assert got[("RequestById", "rest")].killed, got[("RequestById", "rest")].detail
    for alive in (("PlaceByContent", "rest"), ("RequestById", "first")):
        assert not got[alive].killed and "does not isolate" in got[alive].detail, alive


def test_the_clauses_command_refuses_a_name_it_does_not_know(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A misspelt operator would otherwise select no entry and report
    "0 of 0 clauses killed" with exit 0: it is refused, naming the word and
    the names it knows, before any TLC run."""
    assert main(["ApprovalGte"]) == 2
    err = capsys.readouterr().err
    assert "ApprovalGte" in err and "ApprovalGate" in err and "killed" not in err
    assert main(["--jobs", "two", "ApprovalGate"]) == 2
    assert "--jobs takes a number" in capsys.readouterr().err


@pytest.mark.parametrize(("spec", "auth", "old", "new"), [
    ("DurableToolExecution", 'i[3] = "policy"', "ApprovalReusedReconcile",
     "PolicyRetryReusesApproval"),
    ("ConcurrentResumers", 'i[2] = "policy"', "ConcurrentApprovalReusedReconcile",
     "ConcurrentPolicyRetryReusesApproval"),
])
def test_the_reconcile_policy_auth_clause_needs_only_the_policy_retry_relabelled(
        tmp_path: Path, spec: str, auth: str, old: str, new: str) -> None:
    """NoBlindReplay's reconcile disjunct weakened to ``Policy = "reconcile"
    /\\ fenced >= n - 1`` (its policy-auth clause, occurrence 2, TRUE): the
    old twins relabel EVERY retry with the approval, a human's granted retry
    too, which is not fenced (a reconcile query said unknown, the call
    halted), so they break the fence clause as well and do not isolate it.
    The new twins (AuthReusesApprovalOnPolicyRetry, in MCTwins.tla and
    MCConcurrentResumers.tla) relabel only the policy's retry, which is
    always fenced: the weakened invariant holds on their whole state space."""
    manifest = load_manifest(ROOT)
    entries = {(e.spec, e.operator, e.clause, e.occurrence): e for e in load_clauses(ROOT)}
    entry = entries[(spec, "NoBlindReplay", auth, 2)]
    assert entry.twin == new and not entry.reason
    for name in (old, new):  # the old twin stays a ci row of NoBlindReplay
        row = manifest.get(name)
        assert row.ci and row.expect == "NoBlindReplay"
    stale = ClauseEntry(spec, "NoBlindReplay", auth, occurrence=2, twin=old)
    got = {k.entry.twin: k for k in run_kills(manifest, [entry, stale], tmp_path)}
    assert got[new].killed, got[new].detail
    assert not got[old].killed and "does not isolate" in got[old].detail


def test_the_legacy_policy_auth_clause_and_first_invocation_have_a_twin(tmp_path: Path) -> None:
    """LegacyConservative with i[3] = "policy" weakened to TRUE (any request
    after a human_retry row of a lower attempt passes), and with
    i \\in invocations[c] narrowed to the first (the lowest attempt).
    LegacyApprovalReused labels every attempt "approval", the human's granted
    retry (attempt 1) too, which no human_retry row precedes and which is the
    first invocation: it violates both weakened invariants, alive (issue 28).
    LegacyRetryReusesApproval (MCTwins.tla) dispatches the human's retry as
    the human's and authorizes the policy retry after it (attempt 2) by the
    old approval: every violation is past the first invocation, after the
    human's row, so both are killed."""
    manifest = load_manifest(ROOT)
    entries = {(e.spec, e.operator, e.kind, e.clause, e.weakened): e for e in load_clauses(ROOT)}
    auth = entries[("DurableToolExecution", "LegacyConservative", "invariant",
                    'i[3] = "policy"', "")]
    first = entries[("DurableToolExecution", "LegacyConservative", "bound",
                     "i \\in invocations[c]", "first")]
    for e in (auth, first):
        assert e.twin == "LegacyRetryReusesApproval" and not e.reason
    assert "LegacyApprovalReused" in {m.name for m in manifest.models}
    old = [ClauseEntry("DurableToolExecution", "LegacyConservative", 'i[3] = "policy"',
                       twin="LegacyApprovalReused"),
           ClauseEntry("DurableToolExecution", "LegacyConservative", "i \\in invocations[c]",
                       weakened="first", twin="LegacyApprovalReused", kind="bound")]
    got = {(k.entry.twin, k.entry.kind): k
           for k in run_kills(manifest, [auth, first, *old], tmp_path)}
    assert len(got) == 4
    for kind in ("invariant", "bound"):
        new = got[("LegacyRetryReusesApproval", kind)]
        assert new.killed, new.detail
        alive = got[("LegacyApprovalReused", kind)]
        assert not alive.killed and "does not isolate" in alive.detail, kind


def test_every_entry_of_the_clause_table_is_killed(tmp_path: Path) -> None:
    """The whole table, as ``python -m toolledger.check.clauses`` runs it:
    every twin isolates its clause (its states violate the invariant, and
    none violates it with that clause weakened), every guard's twin drifts
    without it.  Without this run a twin that stopped isolating its clause
    (a spec or twin change since the entry was written) goes unseen: four
    entries had, until this test."""
    entries = [e for e in load_clauses(ROOT) if e.twin]
    kills = run_kills(load_manifest(ROOT), entries, tmp_path, jobs=2)
    assert len(kills) == len(entries)
    alive = [f"{k.entry.label} ({k.entry.twin}): {k.detail}" for k in kills if not k.killed]
    assert alive == [], "\n".join(alive)
