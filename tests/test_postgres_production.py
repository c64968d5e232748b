"""PostgreSQL in production: outages, restarts, timeouts, as an adopter meets them.

Under test: ``PostgresStore`` (connection handling: timeouts, reconnecting
after a lost connection) and ``Session`` (what the adopter gets when a commit
fails while the server is down) on the real throwaway server
(``pg_cluster``), which these tests stop and start again.  Oracles: what a
fresh connection reads afterwards (nothing half-written), the external
system's own count of applied effects, the error types and texts the
adopter catches, and wall-clock bounds on the timeouts.  Control: the
previous ``Session._guard`` (reload, let the reload's error escape) is shown
to hand the adopter the reload's error instead of the commit's.
"""

from __future__ import annotations

import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from pg_cluster import PgCluster
from toolledger import Next, Session, Tool
from toolledger._core import protocol as p
from toolledger._core.ledger import Ledger
from toolledger._core.postgres_store import PostgresStore, StoreUnavailable
from toolledger._core.stores import StaleState, StoreCorrupt, StoreError

pytestmark = pytest.mark.slow

TOOLS = {"create_ticket": Tool("idempotent", requires_approval=False)}
CALL = [{"id": "c0", "name": "create_ticket", "arguments": {"title": "x"}}]


@pytest.fixture
def schema() -> str:
    return f"prod_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def stores(pg_cluster: PgCluster) -> Iterator[list[PostgresStore]]:
    opened: list[PostgresStore] = []
    yield opened
    if not pg_cluster.running():  # a test stopped it and failed before starting it again
        pg_cluster.start_again()
    for store in opened:
        store.close()


def open_store(pg: PgCluster, schema: str, opened: list[PostgresStore], **kw: Any) -> PostgresStore:
    store = PostgresStore(pg.conninfo, schema=schema, **kw)
    opened.append(store)
    return store


def stop_server(pg: PgCluster) -> None:
    """A fast shutdown (SIGINT to the postmaster), returning once it is gone."""
    pid = pg.postmaster_pid()
    os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + 60
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, "the server did not stop"
        time.sleep(0.05)


class External:
    """The external system: what it applied, keyed by the idempotency key."""

    def __init__(self) -> None:
        self.applied: list[str] = []

    def body(self, then: Callable[[], None] | None = None) -> Callable[[Any], str]:
        def run(attempt: Any) -> str:
            self.applied.append(attempt.idempotency_key)
            if then is not None:
                then()
            return "ticket 7"

        return run


# --------------------------------------------------------------------------
# Session._guard: a commit that fails while the server is down
# --------------------------------------------------------------------------


def commit_during_an_outage(
    pg: PgCluster, schema: str, opened: list[PostgresStore]
) -> tuple[Session, PostgresStore, External, str, BaseException]:
    """A call whose effect is applied, then the server stops before its success commit."""
    store = open_store(pg, schema, opened, connect_timeout=2)
    session = Session.open(store, "s1", TOOLS)
    (status,) = session.record(0, CALL)
    key = status.call.key
    external = External()
    with pytest.raises(StoreError) as info:
        session.execute(key, external.body(then=lambda: stop_server(pg)))
    return session, store, external, key, info.value


def test_a_commit_during_an_outage_reports_its_own_error_and_nothing_is_half_written(
    pg_cluster: PgCluster, schema: str, stores: list[PostgresStore]
) -> None:
    session, store, external, key, error = commit_during_an_outage(pg_cluster, schema, stores)
    # the adopter gets the commit's error, naming the server and what to do ...
    assert isinstance(error, StoreUnavailable)
    assert error.port == str(pg_cluster.port)
    assert "connection was lost during" in str(error)
    assert "Check that the server runs and is reachable" in str(error)
    # ... and a note that the reload failed too, saying what happens next
    notes = "\n".join(getattr(error, "__notes__", []))
    assert "Reloading session 's1' after this failed too" in notes and "recover()" in notes
    # while the server is down, the session starts nothing: every call says why
    with pytest.raises(StoreUnavailable, match="cannot connect") as again:
        session.status(key)
    assert "could not reload after an earlier store error" in "\n".join(again.value.__notes__)
    pg_cluster.start_again()
    # nothing half-written: the dispatch is durable, the success commit is not there at all
    fresh = open_store(pg_cluster, schema, stores)
    (call,) = fresh.load("s1").calls
    assert call.result is None
    assert fresh.load("s1").record(call.execution_id).status is p.LedgerStatus.DISPATCHED
    assert [(a.kind, a.attempt) for a in fresh.audit("s1")] == [("dispatch", 1)]
    # the same Session, the server back: it reloads (reconnecting), recovers, retries
    (decided,) = session.recover()
    assert decided.recovered and decided.decision is p.Decision.RETRY_SAME_ID
    assert decided.next is Next.RETRY
    done = session.execute(key, external.body())
    assert done.next is Next.RESULT and store.reconnects == 1
    # the retry carried the same key: the external system deduplicates it
    assert external.applied == [key, key]
    assert [(a.kind, a.attempt) for a in fresh.audit("s1")] == [
        ("dispatch", 1), ("retry_same_id", 1), ("dispatch", 2),
    ]  # fmt: skip


def test_control_the_old_guard_hands_the_adopter_the_reloads_error(
    pg_cluster: PgCluster, schema: str, stores: list[PostgresStore],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The variant the test above catches: reload, and let the reload's error escape."""

    def old_guard(self: Session, commit: Callable[[], Any]) -> Any:
        try:
            return commit()
        except StoreError:
            self._ledger.reload()
            raise

    monkeypatch.setattr(Session, "_guard", old_guard)
    *_, error = commit_during_an_outage(pg_cluster, schema, stores)
    pg_cluster.start_again()
    # what failed (the commit, the lost connection) is hidden behind "cannot connect"
    assert "cannot connect" in str(error)
    assert "connection was lost during" not in str(error)


# --------------------------------------------------------------------------
# Reconnecting
# --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_after_a_server_restart_a_new_session_on_the_same_store_works(
    pg_cluster: PgCluster, schema: str, stores: list[PostgresStore], mode: str
) -> None:
    store = open_store(pg_cluster, schema, stores)
    first = Session.open(store, "s1", TOOLS)
    (status,) = first.record(0, CALL)
    first.execute(status.call.key, External().body())
    pg_cluster.restart(mode)
    # the operation that meets the lost connection fails closed, never retried silently
    with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{pg_cluster.port}"):
        Session.open(store, "s2", TOOLS)
    assert store.reconnects == 0
    # the next one connects again: a new Session works, the old session's data is there
    second = Session.open(store, "s2", TOOLS)
    (status,) = second.record(0, CALL)
    assert second.execute(status.call.key, External().body()).next is Next.RESULT
    assert store.reconnects == 1
    assert [c.result is not None for c in store.load("s1").calls] == [True]
    assert store.sessions() == ["s1", "s2"]


def test_a_commit_decided_before_a_lost_connection_is_refused_if_the_session_moved_on(
    pg_cluster: PgCluster, schema: str, stores: list[PostgresStore]
) -> None:
    """Why reconnecting is safe: a commit is a compare-and-set on what it was decided on."""
    store = open_store(pg_cluster, schema, stores)
    ledger = Ledger.create(store, "s1")
    tool = p.ToolProfile("create_ticket", p.RecoveryPolicy.IDEMPOTENT, False)
    pos = (0, 0)
    ledger.step(p.Event(p.Action.ProviderEmitCall, pos, "c0", tool,
                        p.args_digest(tool.name, {})), arguments={})  # fmt: skip
    ledger.step(p.Event(p.Action.EnginePersistCall, pos))
    ledger.step(p.Event(p.Action.EnginePersistDispatched, pos))
    stale = Ledger(store, "s1")  # a worker that read the session, then lost its connection
    with psycopg.connect(pg_cluster.conninfo, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s, 30000)",
                      (store.connection.info.backend_pid,))  # fmt: skip
    other = Ledger(open_store(pg_cluster, schema, stores), "s1")
    other.step(p.Event(p.Action.Recover, pos))  # another worker decides meanwhile
    with pytest.raises(StoreUnavailable, match="connection was lost"):
        stale.step(p.Event(p.Action.Recover, pos))  # meets the dead connection
    with pytest.raises(StaleState):  # reconnected, and refused before it writes
        stale.step(p.Event(p.Action.Recover, pos))
    assert store.reconnects == 1
    assert [(a.kind, a.attempt) for a in store.audit("s1")] == [
        ("dispatch", 1), ("retry_same_id", 1),
    ]  # fmt: skip


def test_reconnecting_never_creates_a_store_whose_tables_are_gone(
    pg_cluster: PgCluster, schema: str, stores: list[PostgresStore]
) -> None:
    store = open_store(pg_cluster, schema, stores)
    Session.open(store, "s1", TOOLS)
    with psycopg.connect(pg_cluster.conninfo, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s, 30000)",
                      (store.connection.info.backend_pid,))  # fmt: skip
        admin.execute(f"DROP SCHEMA {schema} CASCADE")
        with pytest.raises(StoreUnavailable):
            store.sessions()
        with pytest.raises(StoreCorrupt, match="tables are gone"):
            store.sessions()
        tables = admin.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchone()
    assert tables == (0,)


# --------------------------------------------------------------------------
# Timeouts
# --------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["connect_timeout", "statement_timeout"])
@pytest.mark.parametrize("value", [0, -1, "5", True, float("nan")])
def test_a_bad_timeout_is_refused_before_connecting(option: str, value: object) -> None:
    with pytest.raises(p.InvalidInput, match=f"{option} must be a positive number"):
        PostgresStore("host=127.0.0.1 port=1", **{option: value})  # type: ignore[arg-type]


def test_a_server_that_never_answers_is_unavailable_within_the_connect_timeout() -> None:
    with socket.socket() as silent:  # accepts connections (the kernel does), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match=r"connect_timeout=2 s") as info:
            PostgresStore(f"host=127.0.0.1 port={port} dbname=ledgers user=x", connect_timeout=2)
        took = time.monotonic() - started
    assert 1.5 <= took <= 10, took
    assert (info.value.host, info.value.port, info.value.dbname) == ("127.0.0.1", str(port),
                                                                     "ledgers")  # fmt: skip
    assert "Check that the server runs and is reachable" in str(info.value)


def test_a_commit_waiting_on_a_held_lock_times_out_naming_the_option(
    pg_cluster: PgCluster, schema: str, stores: list[PostgresStore]
) -> None:
    store = open_store(pg_cluster, schema, stores, statement_timeout=0.5)
    session = Session.open(store, "s1", TOOLS)
    with psycopg.connect(pg_cluster.conninfo) as holder:  # another worker holds the lock
        holder.execute(f"SELECT * FROM {schema}.sessions FOR UPDATE")
        started = time.monotonic()
        with pytest.raises(StoreError, match=r"statement_timeout=0\.5 s") as info:
            session.record(0, CALL)
        took = time.monotonic() - started
        holder.rollback()
    assert took < 10
    assert "nothing was written" in str(info.value)
    assert open_store(pg_cluster, schema, stores).load("s1").calls == ()
    (status,) = session.record(0, CALL)  # the lock released: the same session goes on
    assert status.next is Next.EXECUTE
