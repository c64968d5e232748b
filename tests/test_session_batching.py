"""Session.execute_many: succeeded(k) + its result and dispatched(k+1) in ONE commit.

Under test: :meth:`toolledger.Session.execute_many`.  The oracles:

- the store's own counters and SQLite's statement trace (COMMIT statements):
  n sequential protected calls take n + 1 ledger commits instead of 2n, a
  single call still exactly two (issue 12's promise);
- the merged commit really holds the next call's dispatched: after a crash in
  call k+1's body, a new process finds call k with its result and call k+1
  dispatched-and-unknown (RETRY for an idempotent tool), and the external
  system saw each effect once;
- the runs (with that crash, the restart and the recovery) are behaviours of
  the spec: recorded by :class:`~toolledger.check.kittrace.KitRecorder`, the
  merged batches replayed as consecutive spec actions and validated by TLC.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import toolledger.check.kittrace as kt
import toolledger.check.tracecheck as tc
from checker_support import ROOT
from toolledger import Attempt, InvalidInput, Next, NotApplied, Session, SqliteStore, Tool

SID = "batch"
TOOLS = {"send": Tool("idempotent", requires_approval=False)}


def recorded(s: Session, n: int) -> list[str]:
    st = s.record(1, [{"id": f"c{i}", "name": "send", "arguments": {"i": i}} for i in range(n)])
    return [x.call.key for x in st]


class External:
    """Deduplicates on the idempotency key, as an email API with Idempotency-Key does."""

    def __init__(self) -> None:
        self.applied: list[str] = []

    def body(self, a: Attempt) -> str:
        assert a.idempotency_key is not None
        if a.idempotency_key not in self.applied:
            self.applied.append(a.idempotency_key)
        return "sent"


def commits_of(tmp: Path, name: str, run: Any) -> tuple[int, int]:
    with SqliteStore(tmp / f"{name}.sqlite3") as store:
        s = Session.open(store, SID, TOOLS)
        keys = recorded(s, 5)
        statements: list[str] = []
        store.connection.set_trace_callback(statements.append)
        before = store.ledger_commits
        run(s, keys)
        store.connection.set_trace_callback(None)
        traced = sum(1 for x in statements if x.strip().upper() == "COMMIT")
        assert all(c.next is Next.RESULT for c in s.recover())
        return store.ledger_commits - before, traced


def test_n_calls_take_n_plus_one_commits_and_one_call_still_two(tmp_path: Path) -> None:
    ext = External()
    many = commits_of(tmp_path, "many",
                      lambda s, keys: s.execute_many([(k, ext.body) for k in keys]))
    assert many == (6, 6)  # dispatched(1), 4 x [succeeded(k) + dispatched(k+1)], succeeded(5)
    one_by_one = commits_of(tmp_path, "each",
                            lambda s, keys: [s.execute(k, ext.body) for k in keys])
    assert one_by_one == (10, 10)

    def single(s: Session, keys: list[str]) -> None:
        s.execute_many([(keys[0], ext.body)])
        for k in keys[1:]:
            s.execute(k, ext.body)

    assert commits_of(tmp_path, "single", single) == (10, 10)


def test_a_failed_call_is_recorded_alone_and_the_next_dispatches_itself(tmp_path: Path) -> None:
    ext = External()

    def fails(a: Attempt) -> str:
        raise NotApplied("550 no such mailbox")  # a definite failure: recorded as failed

    with SqliteStore(tmp_path / "f.sqlite3") as store:
        s = Session.open(store, SID, {"send": Tool("idempotent", requires_approval=False)})
        keys = recorded(s, 3)
        before = store.ledger_commits
        out = s.execute_many([(keys[0], ext.body), (keys[1], fails), (keys[2], ext.body)])
        # dispatched(1); succeeded(1)+dispatched(2); failed(2) alone; dispatched(3); succeeded(3)
        assert store.ledger_commits - before == 5
        assert [o.next for o in out] == [Next.RESULT] * 3
        assert ext.applied == [keys[0], keys[2]]


def test_bad_input_runs_nothing(tmp_path: Path) -> None:
    with SqliteStore(tmp_path / "b.sqlite3") as store:
        s = Session.open(store, SID, TOOLS)
        keys = recorded(s, 2)
        before = store.ledger_commits
        for bad in ("send", [(keys[0], "not callable")], [(keys[0],)]):
            with pytest.raises(InvalidInput, match="execute_many"):
                s.execute_many(bad)  # type: ignore[arg-type]
        assert store.ledger_commits == before


def crash_in_the_third_body(tmp: Path) -> tuple[list[kt.Logged], External, list[str]]:
    ext = External()

    def crashes(a: Attempt) -> str:
        raise KeyboardInterrupt  # the process goes away while call 3 runs

    with kt.KitRecorder() as rec, SqliteStore(tmp / "c.sqlite3") as store:
        s = Session.open(store, SID, TOOLS)
        keys = recorded(s, 4)
        with pytest.raises(KeyboardInterrupt):
            s.execute_many([(keys[0], ext.body), (keys[1], ext.body), (keys[2], crashes),
                            (keys[3], ext.body)])
        # a new process: what is durable is what the merged commits made durable
        s2 = Session.open(store, SID, TOOLS)
        todo = {x.call.key: x for x in s2.recover()}
        assert todo[keys[0]].next is Next.RESULT and todo[keys[1]].next is Next.RESULT
        # succeeded(2) and dispatched(3) were one commit: 3 is dispatched-and-unknown
        assert todo[keys[2]].next is Next.RETRY and todo[keys[2]].attempt == 1
        assert todo[keys[3]].next is Next.EXECUTE  # never dispatched
        s2.execute_many([(keys[2], ext.body), (keys[3], ext.body)])
        assert all(x.next is Next.RESULT for x in s2.recover())
    assert ext.applied == keys[:2] + keys[2:]  # each effect once
    return rec.of(SID), ext, keys


def test_a_crash_after_a_merged_commit_leaves_the_next_call_dispatched(tmp_path: Path) -> None:
    crash_in_the_third_body(tmp_path)


@pytest.mark.slow
def test_merged_commits_are_consecutive_spec_steps_tlc_replays_them(tmp_path: Path) -> None:
    entries, _, _ = crash_in_the_third_body(tmp_path)
    merged = [e.events for e in entries
              if [ev.action.value for ev in e.events][-1:] == ["EnginePersistDispatched"]
              and len(e.events) == 3]
    assert len(merged) >= 3  # the run really had merged commits
    cfg = kt.kit_config([entries])
    run = kt.replay(cfg, entries)
    names = [a for a, _ in run]
    assert "Crash" in names and "Recover" in names
    result = tc.validate_traces(ROOT, cfg, [tc.trace_of(cfg, run, origin="execute_many")])
    assert result.ok, result.describe() + "\n" + result.tlc.output[-2000:]
