"""Group commit across sessions: ``SqliteStore(path, group_commit=True)``.

Under test: :class:`toolledger._core.groupcommit.GroupCommitter` inside a real
:class:`SqliteStore`, driven by real threads (one session each).  The oracles:

- every thread's commits are durable when its call returns (a second,
  independent connection sees them) and the store verifies;
- the per-session counts are those of a store without grouping, while
  ``syncs`` (SQLite COMMITs, one fsync each) is smaller than ``commits``;
- a failure of the shared COMMIT reaches every waiter of the group as a
  ``StoreError`` and none of their rows exists; a body's own refusal
  (``StaleState``) reaches only that waiter and leaves none of its rows;
- a stale writer in the same group as the winner is refused.

Broken variants that these tests catch (run in this file): a committer that
swallows a failed group (waiters told "done"), and one that runs the bodies
without savepoints (a refused body's first writes stay).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from toolledger import Session, SqliteStore, Tool
from toolledger._core.groupcommit import GroupCommitter, _Job
from toolledger._core.sqlite_verify import verify_file
from toolledger._core.stores import StaleState, StoreError

TOOLS = {"send": Tool("idempotent", requires_approval=False)}


def _turn(store: SqliteStore, sid: str, calls: int = 3) -> None:
    s = Session.open(store, sid, TOOLS)
    recorded = s.record(1, [{"id": f"c{i}", "name": "send", "arguments": {"i": i}}
                            for i in range(calls)])
    s.execute_many([(st.call.key, lambda a: "sent") for st in recorded])


def _sessions_seen_by_another_connection(path: Path) -> set[str]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {r[0] for r in conn.execute("SELECT session_id FROM sessions")}
    finally:
        conn.close()


def _threads(n: int, target: Callable[[int], None]) -> list[BaseException | None]:
    errors: list[BaseException | None] = [None] * n

    def run(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # collected: the test asserts on it
            errors[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a waiter was never woken"
    return errors


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "g.db", group_commit=True)
    yield s
    s.close()


def test_sessions_in_threads_share_syncs_and_every_commit_is_durable(
    store: SqliteStore,
) -> None:
    n, turns = 8, 6
    durable_on_return: list[bool] = []

    def worker(i: int) -> None:
        for t in range(turns):
            sid = f"w{i}-t{t}"
            _turn(store, sid)
            durable_on_return.append(sid in _sessions_seen_by_another_connection(store.path))

    assert _threads(n, worker) == [None] * n
    assert all(durable_on_return) and len(durable_on_return) == n * turns
    # per session: create + record + (3 calls -> 4 commits), as without grouping
    assert store.commits == n * turns * 6
    assert store.ledger_commits == n * turns * 4
    assert store.group_commit
    assert store.syncs < store.commits, (store.syncs, store.commits)
    for i in range(n):
        state = store.load(f"w{i}-t0")
        assert all(c.result is not None for c in state.calls)
    store.close()
    assert verify_file(store.path).sessions == n * turns


def test_without_group_commit_every_commit_is_one_sync(tmp_path: Path) -> None:
    with SqliteStore(tmp_path / "plain.db") as plain:
        _threads(4, lambda i: _turn(plain, f"p{i}"))
        assert not plain.group_commit
        assert plain.syncs == plain.commits == 4 * 6


def _hold_first_group_until(
    store: SqliteStore, queued: int, then: Callable[[int], None]
) -> threading.Event:
    """Patch the committer's COMMIT: the first waits until ``queued`` jobs are queued
    behind it (so they form the next group), each call n runs ``then(n)`` first.
    The event returned is set once the first COMMIT is entered: the threads meant
    for the second group wait for it, so the first group is the blocker's alone."""
    committer = store._group
    assert isinstance(committer, GroupCommitter)
    calls = [0]
    real = committer._commit
    entered = threading.Event()

    def commit(conn: sqlite3.Connection) -> None:
        calls[0] += 1
        if calls[0] == 1:
            entered.set()
            deadline = time.monotonic() + 30
            while len(committer._queue) < queued and time.monotonic() < deadline:
                time.sleep(0.005)
            assert len(committer._queue) == queued
        then(calls[0])
        real(conn)

    committer._commit = commit  # type: ignore[method-assign]
    return entered


def test_a_failed_shared_commit_fails_every_waiter_and_writes_nothing(
    store: SqliteStore,
) -> None:
    def then(n: int) -> None:
        if n == 2:
            raise sqlite3.OperationalError("disk I/O error")  # the second group's COMMIT

    first = _hold_first_group_until(store, 3, then)

    def create(i: int) -> None:
        if i > 0:
            assert first.wait(30)  # the blocker leads; the others queue behind it
        store.create_session(f"s{i}", marker=0, max_attempts=3)

    errors = _threads(4, create)
    assert errors[0] is None
    for e in errors[1:]:
        assert isinstance(e, StoreError) and "nothing of it was written" in str(e), e
        assert "disk I/O error" in str(e)
    assert _sessions_seen_by_another_connection(store.path) == {"s0"}
    assert store.sessions() == ["s0"]
    assert store.commits == 1 and store.syncs == 1
    # the store goes on: the same sessions can be created now
    for i in range(1, 4):
        store.create_session(f"s{i}", marker=0, max_attempts=3)
    assert store.sessions() == ["s0", "s1", "s2", "s3"]


def test_a_stale_writer_in_the_same_group_is_refused_alone(store: SqliteStore) -> None:
    Session.open(store, "shared", TOOLS)
    a, b = Session.open(store, "shared", TOOLS), Session.open(store, "shared", TOOLS)
    first = _hold_first_group_until(store, 2, lambda n: None)
    message = [{"id": "c0", "name": "send", "arguments": {"i": 0}}]

    def work(i: int) -> None:
        if i == 0:
            store.create_session("blocker", marker=0, max_attempts=3)
        else:
            assert first.wait(30)
            (a if i == 1 else b).record(1, message)

    errors = _threads(3, work)
    assert errors[0] is None
    assert sorted(type(e).__name__ for e in errors[1:]) == ["NoneType", "StaleState"], errors
    assert store.syncs == 3  # Session.open of "shared", the blocker, the group of two
    [call] = store.load("shared").calls
    assert call.tool_call_id == "c0"


def _body_that_writes_then_is_refused(i: int) -> Callable[[sqlite3.Connection], None]:
    def body(conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT INTO audit (session_id, execution_id, tool_call_id, turn, slot, kind, "
            "attempt, authorization, recovery_decision, inputs, note, recorded_at, "
            "row_checksum) VALUES ('s0', 'e', 't', 0, 0, 'k', 0, 'a', NULL, '{}', '', '', 'x')"
        )
        raise StaleState(f"job {i}: refused after its first write")

    return body


def _refused_body_leaves_nothing(store: SqliteStore) -> tuple[list[Any], int]:
    store.create_session("s0", marker=0, max_attempts=3)
    first = _hold_first_group_until(store, 2, lambda n: None)

    def work(i: int) -> None:
        if i == 0:
            store.create_session("blocker", marker=0, max_attempts=3)
        elif i == 1:
            assert first.wait(30)
            store._write_transaction("refused", _body_that_writes_then_is_refused(i))
        else:
            assert first.wait(30)
            store.create_session("ok", marker=0, max_attempts=3)

    errors = _threads(3, work)
    conn = sqlite3.connect(f"file:{store.path}?mode=ro", uri=True)
    try:
        (audit_rows,) = conn.execute("SELECT count(*) FROM audit").fetchone()
    finally:
        conn.close()
    return errors, audit_rows


def test_a_refused_body_in_a_group_leaves_none_of_its_rows(store: SqliteStore) -> None:
    errors, audit_rows = _refused_body_leaves_nothing(store)
    assert errors[0] is None and errors[2] is None
    assert isinstance(errors[1], StaleState)
    assert audit_rows == 0
    assert set(store.sessions()) == {"s0", "blocker", "ok"}


# -- the broken variants the tests above must catch ---------------------------------


class _SwallowsFailures(GroupCommitter):
    @staticmethod
    def _fail(group: list[_Job], error: BaseException) -> None:
        pass  # broken: waiters of a rolled-back group are told it worked


class _NoSavepoints(GroupCommitter):
    def _run_job(self, conn: sqlite3.Connection, job: _Job) -> None:
        try:
            job.body(conn)  # broken: a refused body's earlier writes stay
        except Exception as exc:
            job.error = exc


def _with_committer(store: SqliteStore, cls: type[GroupCommitter]) -> None:
    store._group = cls(connection=store._live, lock=store._lock,
                       sql_error=store._sql_error, rollback=store._rollback)


def test_the_fault_test_catches_a_committer_that_swallows_a_failed_group(
    store: SqliteStore,
) -> None:
    _with_committer(store, _SwallowsFailures)
    with pytest.raises(AssertionError):
        test_a_failed_shared_commit_fails_every_waiter_and_writes_nothing(store)


def test_the_refusal_test_catches_a_committer_without_savepoints(store: SqliteStore) -> None:
    _with_committer(store, _NoSavepoints)
    errors, audit_rows = _refused_body_leaves_nothing(store)
    assert isinstance(errors[1], StaleState)
    assert audit_rows == 1  # what the real committer's test refuses


def test_group_commit_must_be_a_bool(tmp_path: Path) -> None:
    from toolledger import InvalidInput

    with pytest.raises(InvalidInput, match="group_commit must be True or False"):
        SqliteStore(tmp_path / "x.db", group_commit="yes")  # type: ignore[arg-type]
    assert not (tmp_path / "x.db").exists()


_CHILD = """
import sys, threading
from toolledger import Session, SqliteStore, Tool
store = SqliteStore(sys.argv[1], group_commit=True)
tools = {"send": Tool("idempotent", requires_approval=False)}
lock = threading.Lock()

def worker(i):
    for t in range(10_000):
        sid = f"w{i}-t{t}"
        s = Session.open(store, sid, tools)
        msg = [{"id": f"c{k}", "name": "send", "arguments": {"k": k}} for k in range(3)]
        rec = s.record(1, msg)
        s.execute_many([(r.call.key, lambda a: "sent") for r in rec])
        with lock:  # acknowledged: every commit of this turn returned
            print(sid, flush=True)

for i in range(8):
    threading.Thread(target=worker, args=(i,), daemon=True).start()
threading.Event().wait()
"""


@pytest.mark.parametrize("after_turns", [3, 25])
def test_a_sigkill_amid_group_commits_loses_no_acknowledged_commit(
    tmp_path: Path, after_turns: int
) -> None:
    """A process killed while groups are being committed: every turn whose commits
    had all returned is durable with its results, and the file verifies."""
    import signal
    import subprocess
    import sys

    path = tmp_path / "killed.db"
    SqliteStore(path).close()
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    acknowledged: list[str] = []
    try:
        while len(acknowledged) < after_turns:
            line = child.stdout.readline()
            assert line, "the child ended before it was killed"
            acknowledged.append(line.strip())
    finally:
        child.send_signal(signal.SIGKILL)
        rest, _ = child.communicate(timeout=30)
    acknowledged += rest.split()
    assert verify_file(path).sessions >= len(acknowledged)
    with SqliteStore(path) as store:
        for sid in acknowledged:
            state = store.load(sid)
            assert len(state.calls) == 3 and all(c.result is not None for c in state.calls), sid


def test_a_bounded_group_leaves_the_rest_to_the_next_leader(store: SqliteStore) -> None:
    """max_group=2 and 6 commits queued behind a held group: every commit is done,
    in groups of at most 2 (a leader whose own job did not fit waits its turn)."""
    committer = store._group
    assert isinstance(committer, GroupCommitter)
    committer.max_group = 2
    first = _hold_first_group_until(store, 6, lambda n: None)

    def create(i: int) -> None:
        if i > 0:
            assert first.wait(30)
        store.create_session(f"b{i}", marker=0, max_attempts=3)

    assert _threads(7, create) == [None] * 7
    assert sorted(store.sessions()) == sorted(f"b{i}" for i in range(7))
    assert committer.largest_group == 2
    assert committer.groups == 4 == store.syncs  # 1 + 6 / 2
