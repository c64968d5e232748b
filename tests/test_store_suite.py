"""One store test-suite, run against MemoryStore, SqliteStore and PostgresStore alike.

Under test: the store port's guarantees, the same for every store: commits
counted and grouped (2 / 0 ledger commits per protected / readonly call; a
tool result and its ``succeeded`` record in ONE transaction), a failure in
the middle of a commit leaves nothing, the compare-and-set of every commit
(``CommitPlan.check_session``: result, record, approval and audit keys each
pinned, audit-only commits included), ``create_session`` refusing an existing
session; for the stores that read bytes back (SQLite, PostgreSQL): every
read error fails closed as ``StoreCorrupt``, an older or newer schema is
refused with ``UnsupportedSchema``, and opening an existing store never
clobbers it.

Oracles: what a second, independent handle on the same store reads back;
the statements each durable store really ran (SQLite's trace callback,
PostgresStore's ``trace``), split at BEGIN/COMMIT; the commit counters.
Each compare-and-set test has a control showing the check is what refuses.
The PostgreSQL cases run on a real throwaway server (``pg_cluster``); each
test gets its own PostgreSQL schema.
"""

from __future__ import annotations

import re
import sqlite3
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pg_cluster import PgCluster
from toolledger._core import postgres_store, sqlite_store, stores
from toolledger._core import protocol as p
from toolledger._core.ledger import Ledger
from toolledger._core.postgres_store import PostgresStore, StoreExists
from toolledger._core.sqlite_store import SqliteStore
from toolledger._core.stores import (
    CommitPlan,
    LeaseLost,
    MemoryStore,
    SessionExists,
    StaleState,
    Store,
    StoreCorrupt,
    UnknownSession,
    UnsupportedSchema,
    durable_projection,
)

A = p.Action
E = p.Event
SID = "s1"
POS = (0, 0)
IDEMPOTENT = p.ToolProfile("create_ticket", p.RecoveryPolicy.IDEMPOTENT, False)
MANUAL = p.ToolProfile("send_email", p.RecoveryPolicy.MANUAL, True)
READONLY = p.ToolProfile("read_file", p.RecoveryPolicy.READONLY, False)
DECISIONS = {d.value for d in p.Decision}


@dataclass
class Backend:
    """One kind of store under test.

    ``open()`` gives a new handle on the same store (for MemoryStore, the
    same object: it has no second handle); ``sql(statement)`` edits the
    durable storage behind the store's back (durable stores only);
    ``statements(store)`` starts recording the statements a handle runs.
    """

    name: str
    open: Callable[[], Store]
    sql: Callable[[str], None] | None = None
    record: Callable[[Store], list[str]] | None = None
    opened: list[Store] = field(default_factory=list)

    def new(self) -> Store:
        store = self.open()
        self.opened.append(store)
        return store


def _sqlite(tmp_path: Path) -> Backend:
    path = tmp_path / "x.db"

    def sql(statement: str) -> None:
        raw = sqlite3.connect(path)
        raw.execute(statement)
        raw.commit()
        raw.close()

    def record(store: Store) -> list[str]:
        assert isinstance(store, SqliteStore)
        out: list[str] = []
        store.connection.set_trace_callback(out.append)
        return out

    return Backend("sqlite", lambda: SqliteStore(path), sql, record)


def _postgres(cluster: PgCluster) -> Backend:
    schema = f"t_{uuid.uuid4().hex[:16]}"

    def sql(statement: str) -> None:
        with psycopg.connect(cluster.conninfo, autocommit=True) as conn:
            conn.execute(f"SET search_path = {schema}")
            conn.execute(statement)

    def record(store: Store) -> list[str]:
        assert isinstance(store, PostgresStore)
        out: list[str] = []
        store.trace = lambda statement, params: out.append(statement)
        return out

    return Backend(
        "postgres", lambda: PostgresStore(cluster.conninfo, schema=schema), sql, record
    )


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "memory":
        memory = MemoryStore()
        backend = Backend("memory", lambda: memory)
    elif request.param == "sqlite":
        backend = _sqlite(tmp_path)
    else:
        backend = _postgres(request.getfixturevalue("pg_cluster"))
    try:
        yield backend
    finally:
        for store in backend.opened:
            store.close()


@pytest.fixture(params=["sqlite", "postgres"])
def durable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """The stores that read bytes back from storage (corruption, schema versions)."""
    backend = (
        _sqlite(tmp_path)
        if request.param == "sqlite"
        else _postgres(request.getfixturevalue("pg_cluster"))
    )
    try:
        yield backend
    finally:
        for store in backend.opened:
            store.close()


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def emit(pos: p.CallPosition, tool: p.ToolProfile, args: dict[str, Any]) -> E:
    return E(A.ProviderEmitCall, pos, f"call_{pos[1]}", tool, p.args_digest(tool.name, args))


def protected_call(ledger: Ledger, pos: p.CallPosition, result: str = "ok") -> None:
    args = {"to": "a@example.com"}
    ledger.step(emit(pos, MANUAL, args), arguments=args)
    ledger.step(E(A.EnginePersistCall, pos))
    ledger.step(E(A.EngineParkApproval, pos))
    ledger.step(E(A.HumanApprove, pos))
    ledger.step(E(A.EnginePersistDispatched, pos))
    ledger.step(E(A.EngineInvokeAdapter, pos))
    ledger.step(E(A.ExternalApply, pos, attempt=1))
    ledger.step_many(
        [E(A.EngineRecordSucceeded, pos), E(A.EngineAppendResult, pos)],
        result_content={pos: result},
    )


def readonly_call(ledger: Ledger, pos: p.CallPosition) -> None:
    args = {"query": f"q{pos[1]}"}
    ledger.step(emit(pos, READONLY, args), arguments=args)
    ledger.step(E(A.EnginePersistCall, pos))
    ledger.step(E(A.EngineInvokeReadonly, pos))
    ledger.step(E(A.EngineAppendResult, pos), result_content="file text")


def dispatched_before_a_crash(store: Store) -> None:
    ledger = Ledger.create(store, SID)
    ledger.step(emit(POS, IDEMPOTENT, {"title": "disk full"}), arguments={"title": "disk full"})
    ledger.step(E(A.EnginePersistCall, POS))
    ledger.step(E(A.EnginePersistDispatched, POS))


def transactions(statements: list[str]) -> list[list[str]]:
    """The committed write transactions among recorded statements."""
    out: list[list[str]] = []
    current: list[str] | None = None
    for s in statements:
        if s.startswith("BEGIN"):
            current = [s]
        elif current is not None:
            current.append(s)
            if s == "COMMIT":
                if any(re.match(r"(INSERT|UPDATE)\b", x) for x in current):
                    out.append(current)
                current = None
            elif s == "ROLLBACK":
                current = None
    return out


def writes(tx: list[str], table: str) -> bool:
    """Whether the transaction writes ``table``; "ledger" on SQLite (schema 7, a record
    in its call's row): the call's ``record_*`` columns, set by an UPDATE of their own, by
    the INSERT of a call dispatched in the same commit or by the UPDATE of the result
    recorded with it."""
    if table == "ledger" and any(re.match(r"(INSERT INTO|UPDATE) calls\b", s)
                                 and "record_status" in s for s in tx):
        return True
    return any(
        re.match(rf"(INSERT INTO|UPDATE) {table}\b", s)
        and not s.startswith("UPDATE calls SET record_")
        for s in tx
    )


def audit_keys(store: Store) -> list[tuple[str, int]]:
    return [(r.kind, r.attempt) for r in store.audit(SID)]


def one_decision_per_attempt(store: Store) -> bool:
    decided = Counter(r.attempt for r in store.audit(SID) if r.kind in DECISIONS)
    return all(n == 1 for n in decided.values())


# --------------------------------------------------------------------------
# Sessions, counting and grouping of commits
# --------------------------------------------------------------------------


def test_creating_an_existing_session_is_refused(store_factory: Backend) -> None:
    first, second = store_factory.new(), store_factory.new()
    first.create_session(SID, marker=0, max_attempts=3)
    commits = second.commits
    with pytest.raises(SessionExists, match="already exists"):
        second.create_session(SID, marker=5, max_attempts=9)
    assert second.commits == commits
    assert (second.load(SID).marker, second.load(SID).max_attempts) == (0, 3)


def test_a_protected_call_costs_two_ledger_commits_and_a_readonly_one_none(
    store_factory: Backend,
) -> None:
    store = store_factory.new()
    ledger = Ledger.create(store, SID)
    recorded = store_factory.record(store) if store_factory.record else None
    before = store.commits
    protected_call(ledger, (0, 0))
    # persist call, park approval, approve, dispatched, succeeded + tool result
    assert (store.commits - before, store.ledger_commits) == (5, 2)
    readonly_call(ledger, (1, 0))
    assert (store.commits - before, store.ledger_commits) == (7, 2)
    if recorded is not None:  # the store's real transactions agree with its counters
        txs = transactions(recorded)
        assert len(txs) == 7
        ledger_txs = [t for t in txs if writes(t, "ledger")]
        assert len(ledger_txs) == 2
        dispatched, succeeded = ledger_txs
        assert writes(dispatched, "audit") and not writes(dispatched, "calls")
        # succeeded(result) and the role=tool result: one transaction
        assert writes(succeeded, "calls") and writes(succeeded, "ledger")
    again = store_factory.new()
    assert again.load_working_set(SID) == durable_projection(ledger.state)


@pytest.mark.parametrize("fail_in", ["_write_record", "_write_audit"])
def test_a_crash_in_the_middle_of_a_commit_leaves_nothing(
    store_factory: Backend, fail_in: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = store_factory.new()
    ledger = Ledger.create(store, SID)
    ledger.step(emit(POS, IDEMPOTENT, {}))
    ledger.step(E(A.EnginePersistCall, POS))
    state, counted = ledger.state, (store.commits, store.ledger_commits)
    original = getattr(type(store), fail_in)

    def write_then_die(self: Any, *args: Any) -> None:
        original(self, *args)  # the write happened inside the transaction ...
        raise RuntimeError("power cut inside the transaction")  # ... then the crash

    monkeypatch.setattr(type(store), fail_in, write_then_die)
    with pytest.raises(RuntimeError, match="power cut"):
        ledger.step(E(A.EnginePersistDispatched, POS))
    monkeypatch.undo()
    assert ledger.state is state
    assert (store.commits, store.ledger_commits) == counted
    again = store_factory.new()
    assert again.load(SID) == durable_projection(state)
    assert again.audit(SID) == []


# --------------------------------------------------------------------------
# The compare-and-set of every commit (tests/test_concurrent_resume.py, on all stores)
# --------------------------------------------------------------------------


def two_resumers(backend: Backend) -> tuple[Store, Ledger, Ledger]:
    store = backend.new()
    dispatched_before_a_crash(store)
    return store, Ledger(backend.new(), SID), Ledger(backend.new(), SID)


def test_the_losing_resumer_is_refused_before_it_writes_its_decision(
    store_factory: Backend,
) -> None:
    store, winner, loser = two_resumers(store_factory)
    winner.step(E(A.Recover, POS))  # retry_same_id: an audit row, no record change
    rows = len(store.audit(SID))
    kept = loser.state
    with pytest.raises(StaleState, match=r"audit keys written since: \[\('retry_same_id', 1\)\]"):
        loser.step(E(A.Recover, POS))
    assert len(store.audit(SID)) == rows
    assert loser.state is kept
    winner.step(E(A.EnginePersistDispatched, POS))
    assert audit_keys(store) == [("dispatch", 1), ("retry_same_id", 1), ("dispatch", 2)]
    assert one_decision_per_attempt(store)


def test_the_loser_is_refused_after_the_winner_dispatched_too(store_factory: Backend) -> None:
    store, winner, loser = two_resumers(store_factory)
    winner.step(E(A.Recover, POS))
    winner.step(E(A.EnginePersistDispatched, POS))
    with pytest.raises(StaleState, match="its record differs") as info:
        loser.step(E(A.Recover, POS))
    assert "Ledger.reload()" in str(info.value)
    assert loser.reload().call(POS).stage is p.Stage.RESUME  # type: ignore[union-attr]
    loser.step(E(A.Recover, POS))
    assert audit_keys(store) == [
        ("dispatch", 1), ("retry_same_id", 1), ("dispatch", 2), ("retry_same_id", 2),
    ]  # fmt: skip
    assert one_decision_per_attempt(store)


def test_control_without_the_guards_the_loser_writes(
    store_factory: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broken variant the two tests above catch, on every store."""
    original = CommitPlan.check_session

    def records_only(self: CommitPlan, *args: object, **kwargs: object) -> None:
        original(replace(self, guards=()), *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(CommitPlan, "check_session", records_only)
    store, winner, loser = two_resumers(store_factory)
    winner.step(E(A.Recover, POS))
    winner.step(E(A.EnginePersistDispatched, POS))
    loser.step(E(A.Recover, POS))  # accepted: nothing stops an audit-only commit
    assert not one_decision_per_attempt(store)


def test_a_record_changed_alone_is_stale(store_factory: Backend) -> None:
    store = store_factory.new()
    first = Ledger.create(store, SID)
    first.step(emit(POS, IDEMPOTENT, {}))
    first.step(E(A.EnginePersistCall, POS))
    first.step(E(A.EnginePersistDispatched, POS))
    second = Ledger(store_factory.new(), SID)
    first.step(E(A.EngineInvokeAdapter, POS))
    first.step(E(A.ExternalApply, POS, attempt=1))
    first.step(E(A.EngineRecordSucceeded, POS), result_content="ticket 7")  # no audit key
    with pytest.raises(StaleState, match=r"\(its record differs\)"):
        second.step(E(A.Recover, POS))
    assert audit_keys(store) == [("dispatch", 1)]


def test_an_approval_changed_alone_is_stale(store_factory: Backend) -> None:
    store = store_factory.new()
    first = Ledger.create(store, SID)
    first.step(emit(POS, MANUAL, {}))
    first.step(E(A.EnginePersistCall, POS))
    first.step(E(A.EngineParkApproval, POS))
    second = Ledger(store_factory.new(), SID)
    first.step(E(A.HumanApprove, POS))
    with pytest.raises(StaleState, match=r"\(its approval differs\)"):
        second.step(E(A.HumanReject, POS))
    assert store.load(SID).approvals == first.state.approvals


def test_a_result_changed_alone_is_stale(store_factory: Backend) -> None:
    store = store_factory.new()
    first = Ledger.create(store, SID)
    first.step(emit(POS, READONLY, {}))
    first.step(E(A.EnginePersistCall, POS))
    second = Ledger(store_factory.new(), SID)
    for ledger in (first, second):
        ledger.reload()
        ledger.step(E(A.Recover, POS))  # readonly: execute again
        ledger.step(E(A.EngineInvokeReadonly, POS))
    first.step(E(A.EngineAppendResult, POS), result_content="first answer")
    with pytest.raises(StaleState, match=r"\(its result differs\)"):
        second.step(E(A.EngineAppendResult, POS), result_content="second answer")
    result = store.load(SID).calls[0].result
    assert result is not None and result.content == "first answer"


@pytest.mark.parametrize("part", ["result", "record", "approval", "audit"])
def test_control_each_part_of_the_guard_is_what_refuses(
    store_factory: Backend, part: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Drop one part of every guard (view it as stored): that stale commit goes through.

    The broken variant each of the four tests above catches: a compare-and-set
    that forgets one part of the call's state.
    """
    original = CommitPlan.check_session

    def forgetting(
        self: CommitPlan, session_id: str, stored: Any, after: Any, differs: Any
    ) -> None:
        def partial(seen: Any) -> str | None:
            why = differs(seen)
            if why is None:
                return None
            kept = [w for w in why.split("; ") if part not in w]
            return "; ".join(kept) or None

        original(self, session_id, stored, after, partial)

    monkeypatch.setattr(CommitPlan, "check_session", forgetting)
    # Only the audit-key guard stands between a loser and its audit-only decision;
    # the writers' own checks catch the other three when the guard is blind.
    if part == "audit":
        store, winner, loser = two_resumers(store_factory)
        winner.step(E(A.Recover, POS))
        loser.step(E(A.Recover, POS))
        assert not one_decision_per_attempt(store)
    elif part == "record":
        store = store_factory.new()
        first = Ledger.create(store, SID)
        first.step(emit(POS, IDEMPOTENT, {}))
        first.step(E(A.EnginePersistCall, POS))
        first.step(E(A.EnginePersistDispatched, POS))
        second = Ledger(store_factory.new(), SID)
        first.step(E(A.EngineInvokeAdapter, POS))
        first.step(E(A.ExternalApply, POS, attempt=1))
        first.step(E(A.EngineRecordSucceeded, POS), result_content="ticket 7")
        # the guard no longer refuses: a decision is recorded on a stale record
        second.step(E(A.Recover, POS))
        assert len(audit_keys(store)) == 2
    else:  # result, approval: the writer's own compare-and-set is the second line
        store = store_factory.new()
        first = Ledger.create(store, SID)
        if part == "approval":
            first.step(emit(POS, MANUAL, {}))
            first.step(E(A.EnginePersistCall, POS))
            first.step(E(A.EngineParkApproval, POS))
            second = Ledger(store_factory.new(), SID)
            first.step(E(A.HumanApprove, POS))
            with pytest.raises(StaleState, match="this engine saw"):
                second.step(E(A.HumanReject, POS))
        else:
            first.step(emit(POS, READONLY, {}))
            first.step(E(A.EnginePersistCall, POS))
            second = Ledger(store_factory.new(), SID)
            for ledger in (first, second):
                ledger.reload()
                ledger.step(E(A.Recover, POS))
                ledger.step(E(A.EngineInvokeReadonly, POS))
            first.step(E(A.EngineAppendResult, POS), result_content="first answer")
            with pytest.raises(StaleState, match="not the one this engine saw"):
                second.step(E(A.EngineAppendResult, POS), result_content="second answer")


# --------------------------------------------------------------------------
# Durable stores: reading fails closed, schema versions, no clobbering
# --------------------------------------------------------------------------


def settled(backend: Backend) -> Store:
    store = backend.new()
    dispatched_before_a_crash(store)
    ledger = Ledger(store, SID)
    ledger.step(E(A.Recover, POS))
    return store


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE ledger SET attempt = attempt + 1",  # a value altered: checksum mismatch
        "UPDATE calls SET tool_name = 'other_tool'",
    ],
)
def test_an_altered_row_fails_closed(durable: Backend, statement: str) -> None:
    settled(durable)
    assert durable.sql is not None
    if durable.name == "sqlite":  # schema 7: the record is in its call's row
        statement = statement.replace(
            "UPDATE ledger SET attempt = attempt + 1",
            "UPDATE calls SET record_attempt = record_attempt + 1",
        )
    durable.sql(statement)
    with pytest.raises(StoreCorrupt, match="does not match its checksum"):
        Ledger(durable.new(), SID)


def test_a_malformed_row_with_a_valid_checksum_fails_closed(durable: Backend) -> None:
    """A row the store never writes, checksummed as if valid (an audit row with no
    kind), is still refused when a recovery reads it: decoding is strict."""
    from toolledger._core.rows import _DATA, _checksum

    store = settled(durable)
    (call,) = store.load(SID).calls
    row: dict[str, Any] = {
        "session_id": SID, "execution_id": call.execution_id, "tool_call_id": "call_0",
        "turn": 0, "slot": 0, "kind": "", "attempt": 1, "authorization": "auto",
        "recovery_decision": None, "inputs": "{}", "note": "", "recorded_at": "now",
    }  # fmt: skip
    values = [row[c] for c in _DATA["audit"]] + [_checksum("audit", row)]
    literal = ", ".join("NULL" if v is None else repr(v) for v in values)
    assert durable.sql is not None
    durable.sql(
        f"INSERT INTO audit ({', '.join(_DATA['audit'])}, row_checksum) VALUES ({literal})"
        .replace('"authorization"', "authorization")
        .replace("authorization,", '"authorization",')
    )
    with pytest.raises(StoreCorrupt, match="audit row kind must be a non-empty string"):
        Ledger(durable.new(), SID)


def test_a_read_error_fails_closed(durable: Backend) -> None:
    """The storage fails under an open store (a table gone): StoreCorrupt, never a default."""
    store = settled(durable)
    assert durable.sql is not None
    durable.sql("DROP TABLE audit" + (" CASCADE" if durable.name == "postgres" else ""))
    with pytest.raises(StoreCorrupt):
        store.audit(SID)
    with pytest.raises(StoreCorrupt):
        store.load(SID)


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4, 5, 99])
def test_an_older_or_newer_schema_is_refused(durable: Backend, version: int) -> None:
    settled(durable)
    own = (sqlite_store if durable.name == "sqlite" else postgres_store).SCHEMA_VERSION
    if version == own:
        durable.new().close()  # control: its own version opens
        return
    assert durable.sql is not None
    durable.sql(f"UPDATE meta SET schema_version = {version}")
    with pytest.raises(UnsupportedSchema) as info:
        durable.new()
    assert (info.value.found, info.value.supported) == (version, own)
    assert ("written by a newer toolledger" in str(info.value)) is (version > own)


def test_opening_an_existing_store_never_clobbers_it(durable: Backend) -> None:
    store = settled(durable)
    before = store.load(SID), store.audit(SID)
    for _ in range(2):
        again = durable.new()
        assert (again.load(SID), again.audit(SID)) == before
    if isinstance(store, PostgresStore):
        with pytest.raises(StoreExists, match="never created over an existing one"):
            PostgresStore.create(store.connection.info.dsn, schema=store.schema)
        assert (durable.new().load(SID), durable.new().audit(SID)) == before


def test_without_the_guards_the_record_writer_still_refuses_a_second_dispatch(
    store_factory: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writers' own compare-and-set (the second line) pinned on every store.

    With the guards gone, the loser's audit-only decision goes through (the
    control above), but its dispatch replaces a ledger record that is no
    longer the one it saw: the record writer (SQLite/PostgreSQL: ``UPDATE ...
    WHERE row_checksum = <the old record's>``; memory: a comparison) refuses
    it, so the attempt is still dispatched once.  Removing that check makes
    this test fail: the loser dispatches attempt 2 a second time.
    """
    original = CommitPlan.check_session

    def records_only(self: CommitPlan, *args: object, **kwargs: object) -> None:
        original(replace(self, guards=()), *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(CommitPlan, "check_session", records_only)
    store, winner, loser = two_resumers(store_factory)
    winner.step(E(A.Recover, POS))
    loser.step(E(A.Recover, POS))  # both decided retry_same_id on attempt 1
    winner.step(E(A.EnginePersistDispatched, POS))
    with pytest.raises(StaleState, match=r"ledger record .* is not the one this engine saw"):
        loser.step(E(A.EnginePersistDispatched, POS))
    dispatches = Counter(r.attempt for r in store.audit(SID) if r.kind == "dispatch")
    assert dispatches == {1: 1, 2: 1}


def test_a_stale_outcome_is_refused_by_the_record_check_of_its_result_write(
    store_factory: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record written with a call's result (SQLite: one UPDATE of the call's row, the
    record's columns riding in it) keeps the record's compare-and-set.

    With the guards gone, a live engine still holding attempt 1 records its outcome after
    another engine re-dispatched the call (attempt 2): the stored result is still none, so
    only the record check can refuse it; nothing is written.  Dropping that check from the
    result's UPDATE makes this test fail (attempt 2's record is overwritten with attempt 1's
    success)."""
    original = CommitPlan.check_session

    def records_only(self: CommitPlan, *args: object, **kwargs: object) -> None:
        original(replace(self, guards=()), *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(CommitPlan, "check_session", records_only)
    store = store_factory.new()
    live = Ledger.create(store, SID)
    live.step(emit(POS, IDEMPOTENT, {}))
    live.step(E(A.EnginePersistCall, POS))
    live.step(E(A.EnginePersistDispatched, POS))
    other = Ledger(store_factory.new(), SID)  # loads the call as a restart would: resume
    other.step(E(A.Recover, POS))  # retry_same_id
    other.step(E(A.EnginePersistDispatched, POS))  # attempt 2: the record changed
    live.step(E(A.EngineInvokeAdapter, POS))
    live.step(E(A.ExternalApply, POS, attempt=1))
    with pytest.raises(StaleState, match=r"ledger record .* is not the one this engine saw"):
        live.step_many([E(A.EngineRecordSucceeded, POS), E(A.EngineAppendResult, POS)],
                       result_content={POS: "ticket 7"})
    again = store_factory.new().load(SID)
    assert again.calls[0].result is None
    rec = again.ledger[again.calls[0].execution_id]
    assert (rec.status, rec.attempt) == (p.LedgerStatus.DISPATCHED, 2)


# --------------------------------------------------------------------------
# Session ownership: the lease and its fencing epoch (spec/ConcurrentResumers.tla)
# --------------------------------------------------------------------------


def test_taking_the_session_bumps_its_epoch_durably(store_factory: Backend) -> None:
    store = store_factory.new()
    store.create_session(SID, marker=0, max_attempts=3)
    commits = store.commits
    assert store.lease_epoch(SID) == 0
    assert store.take_session(SID) == 1
    other = store_factory.new()
    assert other.lease_epoch(SID) == 1  # durable: another handle sees it
    assert other.take_session(SID) == 2 and store.lease_epoch(SID) == 2
    assert store.commits == commits  # no protocol state written, not counted
    with pytest.raises(UnknownSession):
        store.take_session("nope")


def stale_and_owner(backend: Backend) -> tuple[Store, Ledger, Ledger]:
    """A worker that took the session, then lost it to another (declared dead)."""
    store = backend.new()
    dispatched_before_a_crash(store)
    stale = Ledger(backend.new(), SID, take_session=True)
    owner = Ledger(backend.new(), SID, take_session=True)
    assert (stale.epoch, owner.epoch) == (1, 2)
    return store, stale, owner


def test_a_worker_that_lost_the_session_is_refused_before_it_writes(
    store_factory: Backend,
) -> None:
    store, stale, owner = stale_and_owner(store_factory)
    rows, kept = audit_keys(store), stale.state
    # Nobody committed since the stale worker read: the compare-and-set alone
    # would accept this commit; the epoch refuses it.
    with pytest.raises(LeaseLost, match="lease epoch 2, this worker holds epoch 1") as info:
        stale.step(E(A.Recover, POS))
    assert isinstance(info.value, StaleState)  # a stale-state error, as the engine expects
    assert audit_keys(store) == rows and stale.state is kept
    assert stale.reload().call(POS) is not None  # reloading does not restore the lease
    with pytest.raises(LeaseLost):
        stale.step(E(A.Recover, POS))
    owner.step(E(A.Recover, POS))
    owner.step(E(A.EnginePersistDispatched, POS))
    assert audit_keys(store) == [("dispatch", 1), ("retry_same_id", 1), ("dispatch", 2)]


def test_control_without_the_epoch_check_the_stale_worker_commits(
    store_factory: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broken variant the test above catches (the StaleWorkerCommits twin)."""
    for module in (stores, sqlite_store, postgres_store):
        monkeypatch.setattr(module, "check_lease", lambda *args: None)
    store, stale, _owner = stale_and_owner(store_factory)
    stale.step(E(A.Recover, POS))  # accepted: a worker that lost the session commits
    assert ("retry_same_id", 1) in audit_keys(store)


def test_without_a_lease_only_the_compare_and_set_applies(store_factory: Backend) -> None:
    store = store_factory.new()
    dispatched_before_a_crash(store)
    plain = Ledger(store_factory.new(), SID)
    Ledger(store_factory.new(), SID, take_session=True)
    assert plain.epoch is None
    plain.step(E(A.Recover, POS))  # holds no lease: nothing to lose
