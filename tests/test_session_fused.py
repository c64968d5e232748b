"""Session.execute_message, lazily created session: create + record + dispatched(1) in ONE commit.

Under test: :meth:`toolledger.Session.execute_message` and
``Session.open(..., lazy_create=True)`` (:meth:`toolledger.Ledger.new`,
``Store.commit(..., create=True)``).  The oracles:

- the stores' own counters and SQLite's statement trace (COMMIT statements):
  n sequential protected calls of a NEW session take n + 1 commits in all
  (session, record and first dispatch in one; then the merged
  succeeded(k) + dispatched(k+1); then succeeded(n)), on MemoryStore,
  SqliteStore and SqliteStore with group commit;
- what a new process finds after a crash just before and just after that
  first commit (nothing at all; the first call dispatched-and-unknown), and
  the external system's own record: every effect once;
- the runs with those crashes are behaviours of the spec: recorded by
  :class:`~toolledger.check.kittrace.KitRecorder`, replayed as consecutive
  spec actions and validated by TLC;
- a creating commit is refused, with nothing written, when the session
  exists by then (another engine created it: ``StaleState``, and the loser
  reloads and sees the winner's calls) or when it does not start from the
  session's initial state (``InvalidInput``), on every store.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import toolledger.check.kittrace as kt
import toolledger.check.tracecheck as tc
from checker_support import ROOT
from toolledger import Attempt, InvalidInput, MemoryStore, Next, Session, SqliteStore, Tool
from toolledger._core.ledger import Ledger
from toolledger._core.protocol import Action, Event, args_digest, new_session
from toolledger._core.stores import StaleState, Store

SID = "fused"
TOOLS = {"send": Tool("idempotent", requires_approval=False)}


def message(n: int) -> list[dict[str, Any]]:
    return [{"id": f"c{i}", "name": "send", "arguments": {"i": i}} for i in range(n)]


class External:
    """Deduplicates on the idempotency key, as an email API with Idempotency-Key does;
    ``requests`` counts every request it received (a manual tool sends no key)."""

    def __init__(self) -> None:
        self.applied: list[str] = []
        self.requests = 0

    def body(self, a: Attempt) -> str:
        self.requests += 1
        key = a.idempotency_key or a.call.key
        if key not in self.applied:
            self.applied.append(key)
        return "sent"


STORES: dict[str, Callable[[Path], Store]] = {
    "memory": lambda d: MemoryStore(),
    "sqlite": lambda d: SqliteStore(d / "s.sqlite3"),
    "sqlite-group": lambda d: SqliteStore(d / "g.sqlite3", group_commit=True),
}


@pytest.mark.parametrize("kind", sorted(STORES))
def test_a_new_sessions_turn_of_n_calls_takes_n_plus_one_commits(tmp_path: Path,
                                                                   kind: str) -> None:
    store = STORES[kind](tmp_path)
    try:
        ext = External()
        s = Session.open(store, SID, TOOLS, lazy_create=True)
        assert store.commits == 0 and store.sessions() == []  # nothing written yet
        statements: list[str] = []
        if isinstance(store, SqliteStore) and kind == "sqlite":
            store.connection.set_trace_callback(statements.append)
        out = s.execute_message(1, message(5), ext.body)
        assert [o.next for o in out] == [Next.RESULT] * 5
        assert (store.commits, store.ledger_commits) == (6, 6)  # n + 1
        if statements:
            assert sum(1 for x in statements if x.strip().upper() == "COMMIT") == 6
        assert store.sessions() == [SID]
        assert ext.applied == [o.call.key for o in out] and ext.requests == 5
        # a restarted engine finds every result, nothing to do
        assert all(x.next is Next.RESULT for x in Session.open(store, SID, TOOLS).recover())
    finally:
        store.close()


def test_commit_counts_against_the_other_ways_of_running_the_same_turn(tmp_path: Path) -> None:
    def count(run: Callable[[Store], object]) -> int:
        store = MemoryStore()
        run(store)
        return store.commits

    ext = External()

    def eager(store: Store) -> None:  # session created by a commit of its own
        Session.open(store, SID, TOOLS).execute_message(1, message(5), ext.body)

    def record_then_many(store: Store) -> None:  # the bench's former batched turn
        s = Session.open(store, SID, TOOLS)
        s.execute_many([(x.call.key, ext.body) for x in s.record(1, message(5))])

    def each(store: Store) -> None:
        s = Session.open(store, SID, TOOLS)
        for x in s.record(1, message(5)):
            s.execute(x.call.key, ext.body)

    assert count(eager) == 7
    assert count(record_then_many) == 8
    assert count(each) == 12
    lazy = count(lambda st: Session.open(st, SID, TOOLS, lazy_create=True).execute_message(
        1, message(5), ext.body))
    assert lazy == 6


def test_the_second_message_of_a_session_takes_n_plus_one_too() -> None:
    store, ext = MemoryStore(), External()
    s = Session.open(store, SID, TOOLS, lazy_create=True)
    s.execute_message(1, message(3), ext.body)
    before = store.commits
    out = s.execute_message(3, [{"id": "c0", "name": "send", "arguments": {"i": 9}}], ext.body)
    assert out[0].next is Next.RESULT and store.commits - before == 2  # record+dispatch, result


def test_calls_waiting_for_a_human_are_recorded_and_left_waiting() -> None:
    store, ext = MemoryStore(), External()
    tools = {"send": Tool("idempotent", requires_approval=False), "pay": Tool("manual")}
    s = Session.open(store, SID, tools, lazy_create=True)
    calls = [{"id": "a", "name": "pay", "arguments": {"eur": 5}}, *message(2)]
    out = s.execute_message(1, calls, ext.body)
    assert [o.next for o in out] == [Next.AWAIT_APPROVAL, Next.RESULT, Next.RESULT]
    assert store.commits == 3  # [session, record, park, dispatched(1)], merged, succeeded(2)
    assert ext.applied == [out[1].key, out[2].key]
    assert [c.key for c in s.pending_approvals()] == [out[0].key]


def test_a_readonly_first_call_runs_with_no_commit_and_is_not_dispatched() -> None:
    store, ext = MemoryStore(), External()
    tools = {"look": Tool("readonly", requires_approval=False),
             "send": Tool("idempotent", requires_approval=False)}
    s = Session.open(store, SID, tools, lazy_create=True)
    calls = [{"id": "r", "name": "look", "arguments": {}}, *message(1)]
    out = s.execute_message(1, calls, ext.body)
    assert [o.next for o in out] == [Next.RESULT, Next.RESULT]
    # [session + record] (no dispatch joins it: the readonly call runs first), the
    # readonly answer, then dispatched and succeeded of the protected call
    assert (store.commits, store.ledger_commits) == (4, 2)


def test_bad_input_writes_nothing_and_creates_no_session() -> None:
    store, ext = MemoryStore(), External()
    s = Session.open(store, SID, TOOLS, lazy_create=True)
    with pytest.raises(InvalidInput, match="fn must be a callable"):
        s.execute_message(1, message(2), "send")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        s.execute_message(1, [{"id": "c0", "name": "send", "arguments": "[1]"}], ext.body)
    assert store.commits == 0 and store.sessions() == [] and ext.requests == 0


class CrashingSqliteStore(SqliteStore):
    """Dies (a BaseException, as a SIGKILL would stop it) just before or just after
    the ``n``-th commit."""

    def __init__(self, path: Path, n: int, when: str) -> None:
        super().__init__(path)
        self.n, self.when, self.seen = n, when, 0

    def commit(self, *args: Any, **kwargs: Any) -> None:
        self.seen += 1
        if self.seen == self.n and self.when == "before":
            raise KeyboardInterrupt(f"killed before commit {self.n}")
        super().commit(*args, **kwargs)
        if self.seen == self.n and self.when == "after":
            raise KeyboardInterrupt(f"killed after commit {self.n}")


def crash_and_resume(tmp: Path, when: str, policy: str = "idempotent",
                     n: int = 3) -> tuple[External, list[Any], Store]:
    """A first process dies around the fused first commit; a second re-runs the turn
    from its conversation (the same assistant message) and settles it."""
    tools = {"send": Tool(policy, requires_approval=False)}
    ext = External()
    path = tmp / f"{when}-{policy}.sqlite3"
    first = CrashingSqliteStore(path, 1, when)

    def dies(a: Attempt) -> str:  # "body": the process goes away in the first call's body
        raise KeyboardInterrupt

    s = Session.open(first, SID, tools, lazy_create=True)
    with pytest.raises(KeyboardInterrupt):
        s.execute_message(1, message(n), dies if when == "body" else ext.body)
    first.close()
    store = SqliteStore(path)
    s2 = Session.open(store, SID, tools, lazy_create=True)
    out = s2.execute_message(1, message(n), ext.body)  # a no-op re-record if it is there
    return ext, out, store


def test_a_crash_before_the_fused_commit_leaves_nothing(tmp_path: Path) -> None:
    ext, out, store = crash_and_resume(tmp_path, "before")
    try:
        assert [o.next for o in out] == [Next.RESULT] * 3
        assert ext.requests == 3 and len(ext.applied) == 3  # nothing ran before the crash
        assert len([r for r in store.audit(SID) if r.kind == "dispatch"]) == 3
    finally:
        store.close()


@pytest.mark.parametrize("when", ["after", "body"])
def test_a_crash_after_the_fused_commit_leaves_the_first_call_dispatched(
    tmp_path: Path, when: str
) -> None:
    ext, out, store = crash_and_resume(tmp_path, when)
    try:
        # the first call was dispatched and never ran: idempotent, so retried with the
        # same key (attempt 2); the others ran once
        assert [o.next for o in out] == [Next.RESULT] * 3
        assert [o.attempt for o in out] == [2, 1, 1]
        decided = [r.recovery_decision for r in store.audit(SID)
                   if r.execution_id == out[0].key and r.kind == "dispatch"]
        assert decided == [None, "retry_same_id"]  # the retry was recovery's decision
        assert ext.requests == 3 and len(ext.applied) == 3
    finally:
        store.close()


def test_manual_a_crash_after_the_fused_commit_halts_and_nothing_is_sent_twice(
    tmp_path: Path,
) -> None:
    ext, out, store = crash_and_resume(tmp_path, "after", policy="manual")
    try:
        assert out[0].next is Next.HALTED  # dispatched-and-unknown: a human decides
        assert [o.next for o in out[1:]] == [Next.RESULT, Next.RESULT]
        assert ext.requests == 2 and out[0].key not in ext.applied
    finally:
        store.close()


@pytest.mark.parametrize("kind", sorted(STORES))
def test_a_create_commit_is_refused_if_the_session_exists_and_writes_nothing(
    tmp_path: Path, kind: str
) -> None:
    store = STORES[kind](tmp_path)
    try:
        a = Session.open(store, SID, TOOLS, lazy_create=True)
        b = Session.open(store, SID, TOOLS, lazy_create=True)  # another engine, same id
        ext = External()
        a.execute_message(1, message(1), ext.body)
        commits = store.commits
        with pytest.raises(StaleState, match="created by another engine"):
            b.execute_message(1, [{"id": "x", "name": "send", "arguments": {"i": 7}}], ext.body)
        assert store.commits == commits and ext.requests == 1
        # b reloaded: it sees a's call, and its own never got anywhere
        assert [x.call.tool_call_id for x in b.recover()] == ["c0"]
    finally:
        store.close()


@pytest.mark.parametrize("kind", sorted(STORES))
def test_a_create_commit_must_start_from_the_initial_state(tmp_path: Path, kind: str) -> None:
    store = STORES[kind](tmp_path)
    try:
        ledger = Ledger.new(store, SID)
        profile = TOOLS["send"].profile("send")
        pos = (1, 0)
        emit = Event(Action.ProviderEmitCall, pos, "c0", profile, args_digest("send", {}))
        ledger.step_many([emit, Event(Action.EnginePersistCall, pos)], arguments={pos: {}})
        assert ledger.created and store.sessions() == [SID]
        # a history that is not durable anywhere, committed as a creation
        with pytest.raises(InvalidInput, match="must start from its initial state"):
            store.commit("other", replace(ledger.state, session_id="other"),
                         replace(ledger.state, session_id="other"), [], create=True)
        assert store.sessions() == [SID]
        # and the initial state itself, for a session that exists, is stale
        with pytest.raises(StaleState):
            store.commit(SID, new_session(SID), ledger.state, [], create=True)
    finally:
        store.close()


@pytest.mark.slow
def test_fused_first_commits_are_consecutive_spec_steps_tlc_replays_them(tmp_path: Path) -> None:
    with kt.KitRecorder() as rec:
        ext, out, store = crash_and_resume(tmp_path, "body", n=2)
        store.close()
    assert all(o.next is Next.RESULT for o in out) and len(ext.applied) == 2
    entries = rec.of(SID)
    fused = [[ev.action.value for ev in e.events] for e in entries if e.events
             and e.events[-1].action is Action.EnginePersistDispatched
             and any(ev.action is Action.EnginePersistCall for ev in e.events)]
    assert fused == [["ProviderEmitCall", "ProviderEmitCall", "EnginePersistCall",
                      "EnginePersistCall", "EnginePersistDispatched"]]
    cfg = kt.kit_config([entries])
    run = kt.replay(cfg, entries)
    names = [a for a, _ in run]
    assert "Crash" in names and "Recover" in names
    result = tc.validate_traces(ROOT, cfg, [tc.trace_of(cfg, run, origin="execute_message")])
    assert result.ok, result.describe() + "\n" + result.tlc.output[-2000:]


# -- PostgreSQL (a real throwaway cluster: tests/pg_cluster.py) -------------------------


def pg_store(pg_cluster: Any) -> Any:
    from toolledger._core.postgres_store import PostgresStore

    return PostgresStore(pg_cluster.conninfo, schema=f"fused_{uuid.uuid4().hex[:12]}")


def test_postgres_a_new_sessions_turn_takes_n_plus_one_commits(pg_cluster: Any) -> None:
    store, ext = pg_store(pg_cluster), External()
    try:
        statements: list[str] = []
        store.trace = lambda sql, params: statements.append(sql)
        s = Session.open(store, SID, TOOLS, lazy_create=True)
        assert store.sessions() == []
        statements.clear()
        out = s.execute_message(1, message(5), ext.body)
        assert [o.next for o in out] == [Next.RESULT] * 5
        assert (store.commits, store.ledger_commits) == (6, 6)
        # the session's row went in with the first commit's rows, in its transaction
        first = statements[:statements.index(next(x for x in statements if "ledger" in x))]
        assert any("INSERT" in x and "sessions" in x for x in first)
        assert ext.requests == 5 and len(ext.applied) == 5
        assert all(x.next is Next.RESULT for x in Session.open(store, SID, TOOLS).recover())
    finally:
        store.close()


def test_postgres_a_create_commit_for_an_existing_session_is_stale(pg_cluster: Any) -> None:
    store, ext = pg_store(pg_cluster), External()
    try:
        a = Session.open(store, SID, TOOLS, lazy_create=True)
        b = Session.open(store, SID, TOOLS, lazy_create=True)
        a.execute_message(1, message(1), ext.body)
        commits = store.commits
        with pytest.raises(StaleState, match="created by another engine"):
            b.execute_message(1, [{"id": "x", "name": "send", "arguments": {"i": 7}}], ext.body)
        assert store.commits == commits and ext.requests == 1
        assert [x.call.tool_call_id for x in b.recover()] == ["c0"]
    finally:
        store.close()
