"""A fixed subset of the crash campaign (``benchmarks/crash_campaign.py``), in ``make test``.

Under test: the engine kit on :class:`~toolledger._core.sqlite_store.SqliteStore`
in real child processes that are SIGKILLed, then resumed by new processes.
The oracle is the external system's own durable log and what survived on
disk (see the campaign's module doc).  Here: the manual policy at the five
crash points of the seed issue's fault-injection matrix, the legacy engine
as a control (the checks must see its duplicate), one damaged store, and a
short fuzz of the public API.  And, per agent framework (LangGraph, pydantic-ai,
through ``toolledger.extra``), every crash point of :mod:`toolledger.kit.frameworks`
x every protected policy, with the framework alone as the control.  Two gaps the
campaign found (a malformed position raised TypeError; a kill while a store file was
created left it empty) are fixed, and their tests stay here as regressions.  The
engine's fused and together paths (``TurnEngine(fused=True)``, ``TurnEngine(together=True)``)
are killed around their commits; a core broken on purpose (a together message's
``dispatched`` joined to its outcome commit) must show a duplicate effect.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from benchmarks import crash_campaign as cc
from toolledger._core.ledger import Ledger
from toolledger._core.protocol import (
    Action,
    Event,
    InvalidInput,
    ProtocolError,
    RecoveryPolicy,
    ToolProfile,
)
from toolledger._core.sqlite_store import SqliteStore
from toolledger._core.stores import MemoryStore
from toolledger.kit import frameworks
from toolledger.kit.engine import SEED_MATRIX, EngineMode

pytestmark = pytest.mark.slow


def test_seed_matrix_sigkill_manual_all_zero() -> None:
    result = cc.run_campaign(
        policies=[RecoveryPolicy.MANUAL], points="seed", io=0, timer=0, multi=0,
        corruption_trials=0, fuzz_examples=0, legacy_control=False, verbose=False,
    )
    assert result["kills"] == len(SEED_MATRIX) == 5
    assert sorted(r["where"] for r in result["summary"]) == sorted(
        r.ledger.name for r in SEED_MATRIX.values())
    assert result["totals"] == dict.fromkeys(cc.COUNTERS, 0), result["problems"]
    assert result["final_status"] == {"done": 5}


def test_the_checks_see_the_legacy_engines_duplicate(tmp_path: Path) -> None:
    point = SEED_MATRIX["after_external_success"].legacy.name
    crashed = cc.execute(cc.RunSpec("legacy-control", RecoveryPolicy.MANUAL, point,
                                    (cc.Phase(crash_at=point),), EngineMode.LEGACY), tmp_path)
    assert crashed.kills == 1 and crashed.counts["duplicates"] == 1, crashed.problems
    clean = cc.execute(cc.RunSpec("legacy-control", RecoveryPolicy.MANUAL, "no crash", (),
                                  EngineMode.LEGACY), tmp_path)
    assert clean.counts == dict.fromkeys(cc.COUNTERS, 0), clean.problems


def test_a_kill_at_a_random_io_boundary_and_in_recovery_too(tmp_path: Path) -> None:
    phases = (cc.Phase(kill_at_io=60), cc.Phase(kill_at_io=40, deliver_first=True))
    r = cc.execute(cc.RunSpec("multi", RecoveryPolicy.IDEMPOTENT, "fixed", phases), tmp_path)
    assert r.kills >= 1
    assert r.counts == dict.fromkeys(cc.COUNTERS, 0), r.problems


def test_a_damaged_store_fails_closed(tmp_path: Path) -> None:
    report = cc.corruption_campaign(tmp_path, trials=2, seed=443)
    assert report.trials == 2
    assert report.silent == 0 and report.wrote_anyway == 0, report.problems
    assert report.detected + report.harmless == 2
    assert report.detected >= 1  # the truncation: never in unused bytes of a small store


def test_a_damaged_audit_row_is_refused_when_read_not_silent(tmp_path: Path) -> None:
    # The resume never reads the audit rows, so it completes; the damage must
    # still be refused (StoreCorrupt) by every read of those rows, and no effect
    # may be applied twice.  A damage nothing refuses would count as silent.
    import random
    import sqlite3

    base = cc.corruption_base(tmp_path)
    data = (base / cc.STORE).read_bytes()
    # the audit_by_session index entry (session_id, turn, slot) of the dispatch's audit
    # row, in the index's one page (a small store): the byte of its record header that
    # holds the turn (turn 1 is SQLite serial type 9, a constant with no body bytes).
    # A read of the rows takes the turn from the index, so it no longer matches the
    # row's checksum.  (A damaged session id in an index entry hides the row from the
    # session's reads: silent, for this schema and the one before it alike.)
    conn = sqlite3.connect(f"file:{base / cc.STORE}?mode=ro", uri=True)
    try:
        (root,) = conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = 'audit_by_session'").fetchone()
        (size,) = conn.execute("PRAGMA page_size").fetchone()
    finally:
        conn.close()
    page = data[(root - 1) * size:root * size]
    assert page.count(b"campaign") >= 1, "the audit rows' index entries"
    at = (root - 1) * size + page.rfind(b"campaign") - 3
    assert data[at - 2:at + 1] == bytes([5, 2 * len(b"campaign") + 13, 9]), "hdr, text, 1"
    report = cc.CorruptionReport()
    cc.corruption_trial(base, tmp_path, "flip", random.Random(1), report, at=at)
    assert (report.detected_on_read, report.silent, report.wrote_anyway) == (1, 0, 0), \
        report.problems


def test_fuzz_of_provider_and_config_inputs_raises_only_typed_errors(tmp_path: Path) -> None:
    out = cc.fuzz(25, 443, tmp_path)
    not_ledger = {t: r for t, r in out["by_target"].items() if t != "Ledger.step"}
    assert not_ledger and all(r["unhandled"] == 0 for r in not_ledger.values()), \
        out["unhandled_kinds"]


def test_ledger_step_with_a_malformed_position_raises_a_typed_error() -> None:
    ledger = Ledger.create(MemoryStore(), "s")
    tool = ToolProfile("send_email", RecoveryPolicy.MANUAL, True)
    with pytest.raises((InvalidInput, ProtocolError)):
        ledger.step(Event(Action.ProviderEmitCall, [1, 0], "call_0", tool,  # type: ignore[arg-type]
                          "digest"))


def test_a_kill_while_the_store_is_created_leaves_a_usable_store(tmp_path: Path) -> None:
    killed = 0
    for k in range(1, 7):  # the statements before the file gets its SQLite header
        d = tmp_path / f"k{k}"
        d.mkdir()
        spec = cc.RunSpec("io", RecoveryPolicy.MANUAL, f"io {k}", ())
        out = cc.run_child(cc._child_cmd(spec, d, cc.Phase(kill_at_io=k), final=False))
        killed += out.returncode == -signal.SIGKILL
        SqliteStore(d / cc.STORE).close()  # what a restarted engine does first
    assert killed == 6


@pytest.mark.parametrize("framework", frameworks.FRAMEWORKS)
def test_framework_subset_every_crash_point_and_policy_all_zero(
        framework: str, tmp_path: Path) -> None:
    """Real SIGKILLs of the framework's agent at every crash point, for every protected
    policy; the resuming process answers what the ledger asks as a careful human would.
    The framework alone (the control) must show its duplicate: the checks are not blind."""
    policies = ("manual", "idempotent", "reconcile")
    results = frameworks.campaign([framework], policies, tmp_path)
    ledger = [(r, c) for r, c in results if r.mode == "ledger"]
    assert sorted((r.policy, r.point) for r, _ in ledger) == sorted(
        (p, pt) for p in policies for pt in frameworks.POINTS)
    kills = sum(code == -signal.SIGKILL for r, _ in ledger for code in r.returncodes)
    assert kills == len(policies) * (len(frameworks.POINTS) + 1)  # +1: killed in recovery
    totals = {k: sum(c.counts[k] for _, c in ledger) for k in frameworks.COUNTERS}
    assert totals == dict.fromkeys(frameworks.COUNTERS, 0), [
        (r.policy, r.point, c.problems) for r, c in ledger if c.problems]
    assert all(r.applied == 1 for r, _ in ledger)  # every email sent exactly once
    [(control, counts)] = [(r, c) for r, c in results if r.mode == "plain"]
    assert control.applied == 2 and counts.counts["duplicates"] == 1, counts.problems


def test_the_framework_checks_catch_a_broken_integration(tmp_path: Path) -> None:
    """A twin of LedgerToolNode that runs the tool before ``dispatched`` is durable: killed
    right after the effect, the resumed graph finds no trace of it and sends it again."""
    broken = frameworks.run("langgraph", "late-dispatch", "manual", "after_effect",
                            tmp_path / "broken", fork=True)
    assert broken.returncodes == (-signal.SIGKILL, 0), broken.stderr[-2000:]
    assert broken.applied == 2
    assert frameworks.check(broken).counts["duplicates"] == 1
    fixed = frameworks.run("langgraph", "ledger", "manual", "after_effect", tmp_path / "ok",
                           fork=True)
    assert fixed.applied == 1 and frameworks.check(fixed).counts == dict.fromkeys(
        frameworks.COUNTERS, 0)


@pytest.mark.parametrize("policy", [RecoveryPolicy.MANUAL, RecoveryPolicy.IDEMPOTENT])
def test_fused_path_kills_around_the_commit_that_creates_the_session(
    tmp_path: Path, policy: RecoveryPolicy
) -> None:
    """TurnEngine(fused=True): the first commit creates the session, records the call and
    dispatches it.  A SIGKILL before its BEGIN, inside it, right before its COMMIT and
    right after it: a restarted engine re-records (nothing was durable) or finds the
    call dispatched-and-unknown; every run ends all zero, the effect at most once."""
    n, _, labels = cc.clean_run(policy, tmp_path, fused=True)
    assert len(labels) == n
    created = labels.index("before SQL INSERT sessions")
    begin = max(i for i in range(created) if labels[i] == "before SQL BEGIN IMMEDIATE")
    commit = labels.index("before SQL COMMIT", created)
    # the fused transaction holds the session's row, the call with its ledger record
    # (schema 7: the record's columns ride in the call's INSERT when both are written by
    # one commit) and the dispatch's audit row
    inside = labels[begin:commit]
    assert any("INSERT calls" in x for x in inside) and any("INSERT audit" in x
                                                            for x in inside), inside
    assert "before external request" not in " ".join(labels[:commit])  # nothing sent before
    for k in sorted({begin + 1, (begin + commit) // 2 + 1, commit + 1, commit + 2}):
        r = cc.execute(cc.RunSpec("fused", policy, f"k{k}", (cc.Phase(kill_at_io=k),),
                                  fused=True), tmp_path)
        assert r.kills == 1, (k, labels[k - 1])
        assert r.counts == dict.fromkeys(cc.COUNTERS, 0), (k, labels[k - 1], r.problems)
        assert r.final_status == "done", (k, r.final_status)


def _together_boundaries(labels: list[str]) -> dict[str, int]:
    """1-based kill points of the together path's first message, by what they hit."""
    created = labels.index("before SQL INSERT sessions")
    begin = max(i for i in range(created) if labels[i] == "before SQL BEGIN IMMEDIATE")
    record = labels.index("before SQL COMMIT", created)  # [record + dispatched(1..2)]
    outcome = labels.index("before SQL COMMIT", record + 1)  # [outcomes 1..2 + results]
    sent = [i for i in range(record, outcome) if labels[i] == "after external apply"]
    assert len(sent) == 2, labels[record:outcome]  # both bodies ran between the commits
    return {"inside the record commit": (begin + record) // 2 + 1,
            "right after the record commit": record + 2,
            "after the first effect": sent[0] + 1,
            "after both effects": sent[1] + 1,
            "right before the outcome COMMIT": outcome + 1,
            "right after the outcome commit": outcome + 2}


@pytest.mark.parametrize("policy", list(RecoveryPolicy))
def test_together_path_kills_at_its_io_boundaries_all_zero(
    tmp_path: Path, policy: RecoveryPolicy
) -> None:
    """TurnEngine(together=True), two calls per message: the record commit dispatches both,
    both bodies run, one commit records both outcomes.  A SIGKILL inside the record
    commit, after it, between and after the effects, and around the outcome commit:
    recovery decides every dispatched call of the message by its policy and every
    counter of the campaign stays zero."""
    n, _, labels = cc.clean_run(policy, tmp_path, together=True)
    assert len(labels) == n
    record = labels.index("before SQL COMMIT", labels.index("before SQL INSERT sessions"))
    begin = max(i for i in range(record) if labels[i] == "before SQL BEGIN IMMEDIATE")
    inside = labels[begin:record]
    protected = policy is not RecoveryPolicy.READONLY
    # both calls with their records (schema 7: a record written by the commit that
    # inserts its call's row rides in that INSERT) and both dispatch audit rows
    assert sum("INSERT calls" in x for x in inside) == 2, inside
    assert not any("UPDATE calls" in x for x in inside), inside
    assert sum("INSERT audit" in x for x in inside) == (2 if protected else 0), inside
    assert "before external" not in " ".join(labels[:record])  # nothing sent before it
    points = _together_boundaries(labels) if protected else {
        "inside the record commit": (begin + record) // 2 + 1}
    for what, k in points.items():
        r = cc.execute(cc.RunSpec("together", policy, what, (cc.Phase(kill_at_io=k),),
                                  together=True), tmp_path)
        assert r.kills == 1, (what, k, labels[k - 1])
        assert r.counts == dict.fromkeys(cc.COUNTERS, 0), (what, labels[k - 1], r.problems)
        assert r.final_status == "done", (what, r.final_status)


@pytest.mark.parametrize("policy", [RecoveryPolicy.MANUAL, RecoveryPolicy.RECONCILE])
def test_the_checks_catch_a_core_that_dispatches_a_together_message_late(
    tmp_path: Path, policy: RecoveryPolicy
) -> None:
    """Broken on purpose (``cc.BROKEN["late-dispatch"]``, installed in the child): the
    message's ``dispatched`` records go with its OUTCOME commit, not its record commit.
    Killed after an effect, before that commit, the restarted engine finds the calls
    recorded and never dispatched and runs them again: the campaign must see it.  The
    same kill of the real core: every counter zero.  (An idempotent tool hides this bug:
    the re-run carries the same key and the external system deduplicates it.)"""
    _, _, labels = cc.clean_run(policy, tmp_path, together=True, broken="late-dispatch")
    record = labels.index("before SQL COMMIT", labels.index("before SQL INSERT sessions"))
    inside = labels[labels.index("before SQL INSERT sessions"):record]
    assert not any("INSERT audit" in x for x in inside), inside  # no dispatch row yet
    k = labels.index("after external apply", record) + 1  # the first email is out
    spec = cc.RunSpec("together", policy, "broken", (cc.Phase(kill_at_io=k),), together=True,
                      broken="late-dispatch")
    broken = cc.execute(spec, tmp_path)
    assert broken.kills == 1, labels[k - 1]
    assert broken.counts["duplicates"] >= 1, broken.problems
    assert any("applied 2 times" in p for p in broken.problems), broken.problems
    _, _, real = cc.clean_run(policy, tmp_path, together=True)
    k = real.index("after external apply") + 1
    fixed = cc.execute(cc.RunSpec("together", policy, "real", (cc.Phase(kill_at_io=k),),
                                  together=True), tmp_path)
    assert fixed.kills == 1 and fixed.counts == dict.fromkeys(cc.COUNTERS, 0), fixed.problems


def test_an_unknown_broken_variant_is_refused() -> None:
    with pytest.raises(ValueError, match="not a broken variant"):
        cc.RunSpec("together", RecoveryPolicy.MANUAL, "x", (), together=True, broken="nope")
