"""What only PostgresStore has: a server, connections, row locks, query plans.

Under test: ``toolledger._core.postgres_store.PostgresStore`` on a real throwaway
server (``pg_cluster``).  The store guarantees it shares with the other
stores are in tests/test_store_suite.py.  Oracles: the server's own plans
(``EXPLAIN`` of the statements the store really ran, with their
parameters), its lock table (``pg_locks``: a second commit waits for the
session's row lock), what a fresh connection reads after a connection was
killed mid-transaction (``pg_terminate_backend``), and two OS processes
racing on one session (files as a barrier, as for SQLite).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from checker_support import race_two_resumers
from pg_cluster import PgCluster
from toolledger._core import protocol as p
from toolledger._core.ledger import Ledger
from toolledger._core.postgres_store import PostgresStore, StoreExists, StoreUnavailable
from toolledger._core.stores import CallView, StaleState, StoreError, durable_projection

A = p.Action
E = p.Event
SID = "s1"
POS = (0, 0)
IDEMPOTENT = p.ToolProfile("create_ticket", p.RecoveryPolicy.IDEMPOTENT, False)
MANUAL = p.ToolProfile("send_email", p.RecoveryPolicy.MANUAL, True)
DECISIONS = {d.value for d in p.Decision}


@pytest.fixture
def schema(pg_cluster: PgCluster) -> str:
    return f"t_{uuid.uuid4().hex[:16]}"


@pytest.fixture
def opened(pg_cluster: PgCluster, schema: str) -> Iterator[list[PostgresStore]]:
    stores: list[PostgresStore] = []
    yield stores
    for store in stores:
        store.close()


def open_store(pg: PgCluster, schema: str, opened: list[PostgresStore]) -> PostgresStore:
    store = PostgresStore(pg.conninfo, schema=schema)
    opened.append(store)
    return store


def emit(pos: p.CallPosition, tool: p.ToolProfile) -> E:
    return E(A.ProviderEmitCall, pos, f"call_{pos[1]}", tool, p.args_digest(tool.name, {}))


def protected_call(ledger: Ledger, pos: p.CallPosition) -> None:
    ledger.step(emit(pos, MANUAL), arguments={})
    ledger.step(E(A.EnginePersistCall, pos))
    ledger.step(E(A.EngineParkApproval, pos))
    ledger.step(E(A.HumanApprove, pos))
    ledger.step(E(A.EnginePersistDispatched, pos))
    ledger.step(E(A.EngineInvokeAdapter, pos))
    ledger.step(E(A.ExternalApply, pos, attempt=1))
    ledger.step_many(
        [E(A.EngineRecordSucceeded, pos), E(A.EngineAppendResult, pos)],
        result_content={pos: "sent"},
    )


def dispatched(ledger: Ledger, pos: p.CallPosition) -> None:
    ledger.step(emit(pos, IDEMPOTENT), arguments={})
    ledger.step(E(A.EnginePersistCall, pos))
    ledger.step(E(A.EnginePersistDispatched, pos))


def audit_keys(store: PostgresStore) -> list[tuple[str, int]]:
    return [(r.kind, r.attempt) for r in store.audit(SID)]


def one_decision_per_attempt(store: PostgresStore) -> bool:
    decided = Counter(r.attempt for r in store.audit(SID) if r.kind in DECISIONS)
    return all(n == 1 for n in decided.values())


# --------------------------------------------------------------------------
# Opening and connections
# --------------------------------------------------------------------------


def test_the_core_package_imports_without_psycopg() -> None:
    """``import toolledger`` exports PostgresStore yet imports psycopg only when one opens."""
    script = (
        "import sys; sys.modules['psycopg'] = None\n"
        "import toolledger\n"
        "from toolledger import PostgresStore, StoreError\n"
        "assert 'toolledger._core.postgres_store' in sys.modules\n"
        "try:\n    PostgresStore('host=127.0.0.1')\n"
        "except StoreError as exc:\n    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'toolledger[postgres]'" in done.stdout


def test_an_unreachable_server_is_a_typed_error_naming_it() -> None:
    with socket_port() as port:  # nothing listens there
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            PostgresStore(f"host=127.0.0.1 port={port} dbname=ledgers user=x", connect_timeout=2)
    assert time.monotonic() - started < 30
    assert (info.value.host, info.value.port, info.value.dbname) == (
        "127.0.0.1", str(port), "ledgers",
    )  # fmt: skip
    assert f"127.0.0.1:{port}, database 'ledgers'" in str(info.value)


class socket_port:
    """A loopback port bound but not listening: connections to it are refused."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        port: int = self.sock.getsockname()[1]
        return port

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def test_a_bad_schema_name_is_refused_before_connecting() -> None:
    with pytest.raises(p.InvalidInput, match="plain lower-case SQL identifier"):
        PostgresStore("host=127.0.0.1 port=1", schema="x; DROP TABLE calls")


def test_creation_refuses_an_existing_store_and_concurrent_openers_make_one(
    pg_cluster: PgCluster, schema: str, opened: list[PostgresStore]
) -> None:
    errors: list[BaseException] = []

    def opener() -> None:
        try:
            opened.append(PostgresStore(pg_cluster.conninfo, schema=schema))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(opened) == 4
    opened[0].create_session(SID, marker=0, max_attempts=3)
    with pytest.raises(StoreExists, match="already holds tables"):
        PostgresStore.create(pg_cluster.conninfo, schema=schema)
    assert opened[3].sessions() == [SID]
    fresh = PostgresStore.create(pg_cluster.conninfo, schema=f"{schema}_new")
    opened.append(fresh)
    assert fresh.sessions() == []


def test_another_applications_tables_are_refused(pg_cluster: PgCluster, schema: str) -> None:
    with psycopg.connect(pg_cluster.conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.users (id int)")
    from toolledger._core.stores import UnsupportedSchema

    with pytest.raises(UnsupportedSchema, match="not a toolledger store") as info:
        PostgresStore(pg_cluster.conninfo, schema=schema)
    assert info.value.found is None


def test_a_missing_index_or_trigger_fails_closed(
    pg_cluster: PgCluster, schema: str, opened: list[PostgresStore]
) -> None:
    open_store(pg_cluster, schema, opened)
    with psycopg.connect(pg_cluster.conninfo, autocommit=True) as conn:
        conn.execute(f"DROP TRIGGER audit_no_update ON {schema}.audit")
    from toolledger._core.stores import StoreCorrupt

    with pytest.raises(StoreCorrupt, match="audit_no_update"):
        PostgresStore(pg_cluster.conninfo, schema=schema)


def test_audit_rows_are_append_only(
    pg_cluster: PgCluster, schema: str, opened: list[PostgresStore]
) -> None:
    store = open_store(pg_cluster, schema, opened)
    dispatched(Ledger.create(store, SID), POS)
    with psycopg.connect(pg_cluster.conninfo, autocommit=True) as conn:
        for sql in ("UPDATE {}.audit SET note = 'x'", "DELETE FROM {}.audit"):
            with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                conn.execute(sql.format(schema))
    assert audit_keys(store) == [("dispatch", 1)]


def test_a_connection_killed_mid_transaction_writes_nothing(
    pg_cluster: PgCluster, schema: str, opened: list[PostgresStore]
) -> None:
    store = open_store(pg_cluster, schema, opened)
    ledger = Ledger.create(store, SID)
    ledger.step(emit(POS, IDEMPOTENT), arguments={})
    ledger.step(E(A.EnginePersistCall, POS))
    state = ledger.state
    pid = store.connection.info.backend_pid
    original = store._write_audit

    def killed_after_the_record(conn: Any, row: Any) -> None:
        original(conn, row)  # record and audit row written, not committed ...
        with psycopg.connect(pg_cluster.conninfo, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))  # ... the link dies
        conn.execute("SELECT 1")  # the store's next statement meets the dead connection

    store._write_audit = killed_after_the_record  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailable, match="connection was lost") as info:
        ledger.step(E(A.EnginePersistDispatched, POS))
    assert info.value.port == str(pg_cluster.port)
    assert ledger.state is state
    again = open_store(pg_cluster, schema, opened)
    assert again.load(SID) == durable_projection(state)
    assert again.audit(SID) == []
    # the failed transaction was not retried; the handle's next one connects again
    assert store.reconnects == 0
    assert store.load(SID) == durable_projection(state) and store.reconnects == 1


def test_a_statement_timeout_is_a_store_error_and_writes_nothing(
    pg_cluster: PgCluster, schema: str, opened: list[PostgresStore]
) -> None:
    store = open_store(pg_cluster, schema, opened)
    ledger = Ledger.create(store, SID)
    ledger.step(emit(POS, IDEMPOTENT), arguments={})
    ledger.step(E(A.EnginePersistCall, POS))
    slow = PostgresStore(pg_cluster.conninfo, schema=schema, statement_timeout=0.5)
    opened.append(slow)
    other = Ledger(slow, SID)
    with psycopg.connect(pg_cluster.conninfo) as holder:  # holds the session row lock
        holder.execute(f"SELECT * FROM {schema}.sessions FOR UPDATE")
        with pytest.raises(StoreError, match="timed out"):
            other.step(E(A.Recover, POS))  # a decision: an audit row
        holder.rollback()
    assert store.audit(SID) == []
    other.reload()
    other.step(E(A.Recover, POS))  # the handle is still usable
    assert len(audit_keys(store)) == 1


# --------------------------------------------------------------------------
# Recovery reads through indexes only
# --------------------------------------------------------------------------


def test_restart_and_recover_use_index_scans_only(
    pg_cluster: PgCluster, schema: str, opened: list[PostgresStore]
) -> None:
    store = open_store(pg_cluster, schema, opened)
    writer = Ledger.create(store, SID)
    protected_call(writer, (0, 0))
    protected_call(writer, (1, 0))
    dispatched(writer, (2, 0))
    restarted = open_store(pg_cluster, schema, opened)
    ran: list[tuple[str, Sequence[object]]] = []
    restarted.trace = lambda sql, params: ran.append((sql, params))
    ledger = Ledger(restarted, SID)
    assert [c.position for c in ledger.state.calls] == [(2, 0)]
    ledger.step(E(A.Recover, (2, 0)))
    restarted.trace = None
    queries = [(q, ps) for q, ps in ran if q.split()[0] in ("SELECT", "UPDATE")]
    assert len(queries) >= 6, ran
    conn = restarted.connection
    # With sequential scans priced out, the planner still picks one when no index
    # serves a statement: so no "Seq Scan" means an index serves every one.
    conn.execute("SET enable_seqscan = off")
    try:
        for q, ps in queries:
            plan = "\n".join(
                str(r[0]) for r in conn.execute("EXPLAIN " + q, ps).fetchall()
            )
            assert "Seq Scan" not in plan, (q, plan)
    finally:
        conn.execute("RESET enable_seqscan")


def test_control_without_the_open_calls_index_recovery_scans(
    pg_cluster: PgCluster, schema: str, opened: list[PostgresStore]
) -> None:
    """The broken variant the test above catches: a missing index shows as a Seq Scan."""
    store = open_store(pg_cluster, schema, opened)
    dispatched(Ledger.create(store, SID), (0, 0))
    conn = store.connection
    conn.execute("BEGIN")
    try:
        conn.execute(f"DROP INDEX {schema}.audit_by_execution")
        conn.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(
            str(r[0])
            for r in conn.execute(
                f"EXPLAIN SELECT * FROM {schema}.audit WHERE execution_id = ANY(%s)",
                (["x"],),
            ).fetchall()
        )
        assert "Seq Scan" in plan
    finally:
        conn.execute("ROLLBACK")


# --------------------------------------------------------------------------
# The session's row lock serializes commits: the race, pinned
# --------------------------------------------------------------------------


def race_in_threads(
    pg: PgCluster, schema: str, opened: list[PostgresStore]
) -> tuple[PostgresStore, list[str]]:
    """A decides and stops inside its transaction until B is blocked or done; B decides."""
    store = open_store(pg, schema, opened)
    dispatched(Ledger.create(store, SID), POS)
    a_store, b_store = open_store(pg, schema, opened), open_store(pg, schema, opened)
    a, b = Ledger(a_store, SID), Ledger(b_store, SID)
    b_pid = b_store.connection.info.backend_pid
    b_done = threading.Event()
    outcomes: list[str] = []
    checked = a_store._differs_query  # the commit's check of a call, sent with its reads

    def a_differs(conn: Any, session_id: str, seen: CallView) -> Callable[[], str | None]:
        answer = checked(conn, session_id, seen)

        def check() -> str | None:
            why = answer()
            b_thread.start()  # A has checked, not written: B now decides on the same state
            with psycopg.connect(pg.conninfo, autocommit=True) as admin:
                deadline = time.monotonic() + 30
                while not b_done.is_set() and time.monotonic() < deadline:
                    waiting = admin.execute(
                        "SELECT 1 FROM pg_locks WHERE pid = %s AND NOT granted", (b_pid,)
                    ).fetchone()
                    if waiting:
                        break  # B waits for A's row lock
                    time.sleep(0.01)
            return why

        return check

    def run_b() -> None:
        try:
            b.step(E(A.Recover, POS))
            outcomes.append("b won")
        except StaleState:
            outcomes.append("b refused")
        finally:
            b_done.set()

    b_thread = threading.Thread(target=run_b)
    a_store._differs_query = a_differs  # type: ignore[method-assign]
    a.step(E(A.Recover, POS))
    outcomes.append("a won")
    b_thread.join(60)
    return store, outcomes


def test_a_second_resumer_waits_for_the_session_lock_then_is_refused(
    pg_cluster: PgCluster, schema: str, opened: list[PostgresStore]
) -> None:
    store, outcomes = race_in_threads(pg_cluster, schema, opened)
    assert sorted(outcomes) == ["a won", "b refused"]
    assert audit_keys(store) == [("dispatch", 1), ("retry_same_id", 1)]


def test_control_without_the_row_lock_both_resumers_decide(
    pg_cluster: PgCluster, schema: str, opened: list[PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broken variant the test above catches: READ COMMITTED without FOR UPDATE."""
    monkeypatch.setattr(PostgresStore, "LOCK_SESSION", False)
    store, outcomes = race_in_threads(pg_cluster, schema, opened)
    assert sorted(outcomes) == ["a won", "b won"]
    assert not one_decision_per_attempt(store)  # two retry_same_id for attempt 1


# --------------------------------------------------------------------------
# Two real OS processes on one session
# --------------------------------------------------------------------------

RESUMER = """
import json, sys, time
from pathlib import Path
from toolledger._core import protocol as p
from toolledger._core.ledger import Ledger
from toolledger._core.postgres_store import PostgresStore
from toolledger._core.stores import StaleState

conninfo, schema, name, sync = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
store = PostgresStore(conninfo, schema=schema)
ledger = Ledger(store, "s1")
assert ledger.state.call((0, 0)).stage is p.Stage.RESUME
(sync / f"{name}.loaded").touch()
deadline = time.monotonic() + 60
while not (sync / "go").exists():
    if time.monotonic() > deadline:
        sys.exit("no go signal")
    time.sleep(0.0005)
statements = []
store.trace = lambda sql, params: statements.append(sql)
outcome, message = "won", ""
try:
    ledger.step(p.Event(p.Action.Recover, (0, 0)))
    if ledger.state.call((0, 0)).stage is p.Stage.RETRY:
        ledger.step(p.Event(p.Action.EnginePersistDispatched, (0, 0)))
except StaleState as exc:
    outcome, message = "refused", str(exc)
store.trace = None
writes = [s for s in statements if s.split()[0].upper() in ("INSERT", "UPDATE", "DELETE")]
print(json.dumps({"outcome": outcome, "message": message, "writes": len(writes),
                  "commits": store.commits}))
store.close()
"""


@pytest.mark.parametrize("round_", [1, 2])
def test_two_processes_recovering_one_call_exactly_one_decides(
    pg_cluster: PgCluster, schema: str, opened: list[PostgresStore], tmp_path: Path, round_: int
) -> None:
    store = open_store(pg_cluster, schema, opened)
    dispatched(Ledger.create(store, SID), POS)
    results = race_two_resumers(RESUMER, [pg_cluster.conninfo, schema], tmp_path / "sync")
    assert sorted(str(r["outcome"]) for r in results) == ["refused", "won"], results
    (winner,) = [r for r in results if r["outcome"] == "won"]
    (loser,) = [r for r in results if r["outcome"] == "refused"]
    assert winner["commits"] == 2
    assert (loser["commits"], loser["writes"]) == (0, 0), loser  # refused before any write
    assert "changed since this engine loaded it" in str(loser["message"])
    assert audit_keys(store) == [("dispatch", 1), ("retry_same_id", 1), ("dispatch", 2)]
    assert one_decision_per_attempt(store)


def test_postgres_store_implements_the_port(
    pg_cluster: PgCluster, schema: str, opened: list[PostgresStore]
) -> None:
    from toolledger._core.stores import Store

    assert isinstance(open_store(pg_cluster, schema, opened), Store)


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_server_restart_fails_the_old_handle_closed_and_loses_nothing(
    pg_cluster: PgCluster, schema: str, opened: list[PostgresStore], mode: str
) -> None:
    """``immediate`` is PostgreSQL's crash stop (no checkpoint: WAL recovery on start)."""
    store = open_store(pg_cluster, schema, opened)
    ledger = Ledger.create(store, SID)
    dispatched(ledger, POS)
    state = ledger.state
    pg_cluster.restart(mode)
    with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{pg_cluster.port}"):
        ledger.step(E(A.EngineInvokeAdapter, POS))  # no commit: a volatile step
        ledger.step(E(A.ExternalApply, POS, attempt=1))
        ledger.step(E(A.EngineRecordSucceeded, POS), result_content="ticket 7")
    again = open_store(pg_cluster, schema, opened)
    assert again.load(SID) == durable_projection(state)
    assert audit_keys(again) == [("dispatch", 1)]
    assert store.load(SID) == durable_projection(state) and store.reconnects == 1


KILLED_INSIDE_A_COMMIT = """
import sys, time
from pathlib import Path
from toolledger._core import protocol as p
from toolledger._core.ledger import Ledger
from toolledger._core.postgres_store import PostgresStore

conninfo, schema, sync = sys.argv[1], sys.argv[2], Path(sys.argv[3])
store = PostgresStore(conninfo, schema=schema)
ledger = Ledger(store, "s1")
original = store._write_audit

def stop_inside(conn, row):
    original(conn, row)  # record and audit row written, session row locked, no COMMIT
    (sync / "inside").touch()
    time.sleep(600)  # SIGKILLed here

store._write_audit = stop_inside
ledger.step(p.Event(p.Action.Recover, (0, 0)))
"""


def test_a_worker_killed_inside_a_commit_leaves_nothing_and_releases_the_session(
    pg_cluster: PgCluster, schema: str, opened: list[PostgresStore], tmp_path: Path
) -> None:
    import signal

    store = open_store(pg_cluster, schema, opened)
    dispatched(Ledger.create(store, SID), POS)
    state = store.load(SID)
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_INSIDE_A_COMMIT, pg_cluster.conninfo, schema, str(tmp_path)],
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "inside").exists():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the worker never reached its commit"
            time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    # The server rolled the dead worker's transaction back and released its row lock:
    # another worker decides at once (the statement timeout would refuse a held lock).
    other = Ledger(open_store(pg_cluster, schema, opened), SID)
    assert other.state == durable_projection(state)
    other.step(E(A.Recover, POS))
    assert audit_keys(store) == [("dispatch", 1), ("retry_same_id", 1)]
