"""SqliteStore: real durability, counted commits, and failing closed on bad files.

Under test: ``toolledger._core.sqlite_store.SqliteStore``.  Oracles:

- the protocol core: ``load()`` after reopening the file equals
  ``durable_projection`` of what was committed, for every field;
- SQLite itself: the COMMIT statements it really ran (``set_trace_callback``)
  and its pragmas, not the store's own counters or settings;
- the file's bytes: a file the store refuses is byte for byte unchanged, and
  an engine that tries to restart on it executes nothing (a healthy copy of
  the same file would have retried a call).
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from test_store_suite import transactions, writes

from toolledger._core import protocol as p
from toolledger._core.ledger import Ledger
from toolledger._core.rows import _checksum
from toolledger._core.sqlite_schema import _SCHEMA
from toolledger._core.sqlite_store import (
    APPLICATION_ID,
    SCHEMA_VERSION,
    SqliteStore,
)
from toolledger._core.stores import (
    AuditRow,
    MemoryStore,
    StaleState,
    StoreCorrupt,
    StoreError,
    UnsupportedSchema,
    durable_projection,
    working_set,
)
from toolledger.cli import main as cli_main

A = p.Action
E = p.Event
SID = "s1"
IDEMPOTENT = p.ToolProfile("create_ticket", p.RecoveryPolicy.IDEMPOTENT, False)
MANUAL = p.ToolProfile("send_email", p.RecoveryPolicy.MANUAL, True)
READONLY = p.ToolProfile("read_file", p.RecoveryPolicy.READONLY, False)
RESULT_TEXT = "RESULT-CONTENT-0123456789"
ARGUMENT_TEXT = "ARGUMENT-TEXT-abcdefghij"


def emit(pos: p.CallPosition, tool: p.ToolProfile, args: dict[str, Any]) -> E:
    return E(A.ProviderEmitCall, pos, f"call_{pos[1]}", tool, p.args_digest(tool.name, args))


def protected_call(ledger: Ledger, pos: p.CallPosition, result: str = "ok") -> None:
    args = {"to": "a@example.com", "body": ARGUMENT_TEXT}
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


def readonly_call(ledger: Ledger, pos: p.CallPosition, text: str = "file text") -> None:
    args = {"path": f"/tmp/{pos[1]}", "pad": "x" * 300}
    ledger.step(emit(pos, READONLY, args), arguments=args)
    ledger.step(E(A.EnginePersistCall, pos))
    ledger.step(E(A.EngineInvokeReadonly, pos))
    ledger.step(E(A.EngineAppendResult, pos), result_content=text)


def populated(path: Path) -> Path:
    """A store holding an idempotent call dispatched before a crash, and more."""
    with SqliteStore(path) as store:
        ledger = Ledger.create(store, SID)
        args = {"title": "disk full"}
        ledger.step(emit((0, 0), IDEMPOTENT, args), arguments=args)
        ledger.step(E(A.EnginePersistCall, (0, 0)))
        ledger.step(E(A.EnginePersistDispatched, (0, 0)))
        protected_call(ledger, (0, 1), RESULT_TEXT)
        for slot in range(2, 40):
            readonly_call(ledger, (0, slot))
    return path


def restart_and_recover(path: Path, invoked: list[p.CallPosition]) -> None:
    """What an engine does on restart: open, re-decide, retry what the policy allows."""
    store = SqliteStore(path)
    try:
        ledger = Ledger(store, SID)
        for call in ledger.state.calls:
            if call.stage is p.Stage.RESUME:
                ledger.step(E(A.Recover, call.position))
                if ledger.state.call(call.position).stage is p.Stage.RETRY:  # type: ignore[union-attr]
                    ledger.step(E(A.EnginePersistDispatched, call.position))
                    invoked.append(call.position)
    finally:
        store.close()


def by_hand(path: Path, *statements: str) -> None:
    """Edit the file with plain SQLite, as a person with a shell would."""
    raw = sqlite3.connect(path)
    for sql in statements:
        raw.execute(sql)
    raw.commit()
    raw.close()


def listing(directory: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(directory.iterdir())}


# --------------------------------------------------------------------------
# Opening, durability settings
# --------------------------------------------------------------------------


def test_a_missing_path_gets_the_schema(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    with SqliteStore(path) as store:
        conn = store.connection
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"meta", "sessions", "calls", "approvals", "audit"} <= tables
        assert "ledger" not in tables  # schema 7: a record lives in its call's row
        assert conn.execute("SELECT schema_version FROM meta").fetchall() == [(SCHEMA_VERSION,)]
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert store.sessions() == []


def test_commits_are_fsynced_full_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    for _ in range(2):  # a new file and a reopened one
        with SqliteStore(path) as store:
            conn = store.connection
            assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
            assert conn.isolation_level is None
            assert store.journal_mode == "wal"


def test_an_empty_sqlite_database_is_initialized(tmp_path: Path) -> None:
    path = tmp_path / "blank.db"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE t (x)")
    raw.execute("DROP TABLE t")
    raw.commit()
    raw.close()
    with SqliteStore(path) as store:
        store.create_session(SID, marker=0, max_attempts=3)
    with SqliteStore(path) as store:
        assert store.sessions() == [SID]


@pytest.mark.parametrize("path", [":memory:", "", "file:x.db?mode=memory"])
def test_non_durable_paths_are_refused(path: str) -> None:
    with pytest.raises(p.InvalidInput, match="needs a file path"):
        SqliteStore(path)


def test_a_missing_directory_is_explained(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist; create it first"):
        SqliteStore(tmp_path / "nope" / "x.db")
    with pytest.raises(StoreError, match="not a regular file"):
        SqliteStore(tmp_path)


def test_a_closed_store_refuses_work(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "x.db")
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="closed; open a new SqliteStore"):
        store.sessions()


# --------------------------------------------------------------------------
# Commits, counted by SQLite itself
# --------------------------------------------------------------------------


def test_a_protected_call_costs_two_ledger_commits_counted_by_sqlite(tmp_path: Path) -> None:
    with SqliteStore(tmp_path / "x.db") as store:
        statements: list[str] = []
        store.connection.set_trace_callback(statements.append)
        ledger = Ledger.create(store, SID)
        before = store.commits
        protected_call(ledger, (0, 0), "sent")
        txs = transactions(statements)
        assert len(txs) == store.commits == before + 5  # + create_session
        ledger_txs = [t for t in txs if writes(t, "ledger")]
        assert len(ledger_txs) == store.ledger_commits == 2
        dispatched, succeeded = ledger_txs
        assert writes(dispatched, "audit") and not writes(dispatched, "calls")
        # succeeded(result) and the role=tool result: one transaction
        assert writes(succeeded, "calls") and writes(succeeded, "ledger")
        assert sum(s == "COMMIT" for s in statements) == len(txs)


def test_a_readonly_call_costs_no_ledger_commit_counted_by_sqlite(tmp_path: Path) -> None:
    with SqliteStore(tmp_path / "x.db") as store:
        ledger = Ledger.create(store, SID)
        statements: list[str] = []
        store.connection.set_trace_callback(statements.append)
        readonly_call(ledger, (0, 0))
        txs = transactions(statements)
        assert len(txs) == 2  # the call persisted; its result appended
        assert not any(writes(t, "ledger") for t in txs)
        assert store.ledger_commits == 0
        statements.clear()
        args = {"path": "/b"}
        ledger.step(emit((0, 1), READONLY, args))
        ledger.step(E(A.EnginePersistCall, (0, 1)))
        statements.clear()
        ledger.step(E(A.EngineInvokeReadonly, (0, 1)))
        assert not any(s.startswith("BEGIN IMMEDIATE") for s in statements)


class FailAfterWrite(SqliteStore):
    """Raises right after one of the writes of a commit has been executed."""

    fail_in = ""
    error: BaseException = RuntimeError("power cut inside the transaction")

    def _write_record(self, *args: Any) -> None:
        super()._write_record(*args)
        if self.fail_in == "record":
            raise self.error

    def _write_result(self, *args: Any) -> None:
        super()._write_result(*args)
        if self.fail_in == "result":
            raise self.error

    def _write_audit(self, *args: Any) -> None:
        super()._write_audit(*args)
        if self.fail_in == "audit":
            raise self.error


@pytest.mark.parametrize("fail_in", ["record", "audit"])
def test_a_failed_dispatch_commit_leaves_nothing_after_reopening(
    tmp_path: Path, fail_in: str
) -> None:
    path = tmp_path / "x.db"
    store = FailAfterWrite(path)
    ledger = Ledger.create(store, SID)
    ledger.step(emit((0, 0), IDEMPOTENT, {}))
    ledger.step(E(A.EnginePersistCall, (0, 0)))
    state, counted = ledger.state, (store.commits, store.ledger_commits)
    store.fail_in = fail_in
    with pytest.raises(RuntimeError, match="power cut"):
        ledger.step(E(A.EnginePersistDispatched, (0, 0)))
    assert ledger.state is state
    assert (store.commits, store.ledger_commits) == counted
    store.close()
    with SqliteStore(path) as reopened:
        assert reopened.load(SID) == durable_projection(state)
        assert reopened.audit(SID) == []
        assert reopened.connection.execute(
            "SELECT count(*) FROM calls WHERE record_checksum IS NOT NULL OR "
            "record_status IS NOT NULL").fetchone()[0] == 0


def test_a_failed_success_commit_leaves_neither_record_nor_tool_result(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    store = FailAfterWrite(path)
    ledger = Ledger.create(store, SID)
    ledger.step(emit((0, 0), IDEMPOTENT, {}))
    ledger.step(E(A.EnginePersistCall, (0, 0)))
    ledger.step(E(A.EnginePersistDispatched, (0, 0)))
    ledger.step(E(A.EngineInvokeAdapter, (0, 0)))
    ledger.step(E(A.ExternalApply, (0, 0), attempt=1))
    durable = durable_projection(ledger.state)
    store.fail_in = "result"  # runs after the call's row got its result and its record
    with pytest.raises(RuntimeError):
        ledger.step_many(
            [E(A.EngineRecordSucceeded, (0, 0)), E(A.EngineAppendResult, (0, 0))],
            result_content={(0, 0): "done"},
        )
    store.close()
    with SqliteStore(path) as reopened:
        loaded = reopened.load(SID)
        assert loaded == durable
        assert loaded.calls[0].result is None
        assert loaded.ledger[loaded.calls[0].execution_id].status is p.LedgerStatus.DISPATCHED


def test_a_sqlite_error_inside_a_commit_is_a_store_error(tmp_path: Path) -> None:
    store = FailAfterWrite(tmp_path / "x.db")
    ledger = Ledger.create(store, SID)
    ledger.step(emit((0, 0), IDEMPOTENT, {}))
    ledger.step(E(A.EnginePersistCall, (0, 0)))
    store.fail_in, store.error = "audit", sqlite3.OperationalError("disk I/O error")
    with pytest.raises(StoreError, match=r"disk I/O error\); nothing was written"):
        ledger.step(E(A.EnginePersistDispatched, (0, 0)))
    store.fail_in = ""
    ledger.step(E(A.EnginePersistDispatched, (0, 0)))  # the store is still usable
    assert store.load(SID).ledger != {}
    store.close()


def test_audit_rows_are_append_only(tmp_path: Path) -> None:
    with SqliteStore(populated(tmp_path / "x.db")) as store:
        for statement in ("UPDATE audit SET note = 'x'", "DELETE FROM audit"):
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                store.connection.execute(statement)
        assert len(store.audit(SID)) == 2


# --------------------------------------------------------------------------
# Round trip of every durable field, through the file
# --------------------------------------------------------------------------


def rich_state() -> tuple[p.SessionState, list[AuditRow], dict[p.CallPosition, dict[str, Any]]]:
    """A state using every enum value, odd ids and texts; its audit rows; arguments."""
    sid = "sess-é/1"
    ids = ("call_0", "", "call_salvaged_0", "工具-7")
    texts = ("", "line\nnext \"quoted\" 'single' é ✓", "nul\x00inside", "x" * 2000)
    results: list[p.ResultKind | None] = [None, *p.ResultKind]
    calls, approvals, ledger, rows = [], {}, {}, []
    arguments: dict[p.CallPosition, dict[str, Any]] = {}
    i = 0
    for policy in p.RecoveryPolicy:
        for requires_approval in (True, False):
            for kind in results:
                pos = (i // 5, i % 5)
                name = f"{policy.value}-{requires_approval}-ünï"
                tool = p.ToolProfile(name, policy, requires_approval)
                tcid = ids[i % len(ids)]
                args = {"i": i, "text": texts[i % len(texts)], "list": [1.5, None, True]}
                eid = p.derive_execution_id(sid, *pos, tcid)
                digest = p.args_digest(tool.name, args)
                if i % 3:
                    arguments[pos] = args
                result = (
                    None
                    if kind is None
                    else p.ToolResult(kind, eid, digest, texts[(i + 1) % len(texts)])
                )
                calls.append(
                    p.CallState(pos, tcid, tool, eid, digest, p.MessageState.DURABLE, result)
                )
                if requires_approval:
                    approvals[eid] = list(p.ApprovalState)[i % len(p.ApprovalState)]
                status = list(p.LedgerStatus)[i % len(p.LedgerStatus)]
                ledger[eid] = p.ExecutionRecord(
                    eid,
                    status,
                    i % 4,
                    None if i % 7 == 0 else digest,
                    list(p.Authorization)[i % len(p.Authorization)],
                    None if i % 2 else p.ToolResult(p.ResultKind.OK, eid, "", texts[i % 4]),
                    None if i % 5 == 0 else pos,
                )
                decision = [None, *p.Decision][i % (len(p.Decision) + 1)]
                rows.append(
                    AuditRow(
                        session_id=sid,
                        execution_id=eid,
                        tool_call_id=tcid,
                        position=pos,
                        kind=["dispatch", "reconstruct", "human_retry"][i % 3],
                        attempt=i % 4,
                        authorization=list(p.Authorization)[(i + 1) % len(p.Authorization)],
                        recovery_decision=decision,
                        inputs={"n": i, "nested": {"t": texts[i % 4]}},
                        note=texts[(i + 2) % 4],
                    )
                )
                i += 1
    audit = frozenset(r.key for r in rows)
    # every approval carries its call's digest, as the core's park writes it
    digests = {c.execution_id: c.args_digest for c in calls if c.execution_id in approvals}
    state = p.SessionState(sid, 1, 4, tuple(calls), approvals, ledger, audit,
                           approval_digests=digests)
    return state, rows, arguments


def test_every_durable_field_round_trips_through_the_file(tmp_path: Path) -> None:
    state, rows, arguments = rich_state()
    sid = state.session_id
    path = tmp_path / "rich.db"
    memory = MemoryStore()
    for store in (SqliteStore(path), memory):
        store.create_session(sid, marker=1, max_attempts=4)
        store.commit(sid, store.load(sid), state, rows, arguments=arguments)
        assert store.ledger_commits == 1
    memory_view = (memory.load(sid), memory.audit(sid))
    with SqliteStore(path) as reopened:
        loaded = reopened.load(sid)
        assert loaded == durable_projection(state)
        assert reopened.audit(sid) == rows
        assert (loaded, rows) == memory_view
        for c in state.calls:
            assert reopened.call_arguments(sid, c.position) == arguments.get(c.position)
        assert reopened.sessions() == [sid]


def test_two_connections_cannot_both_write_the_same_step(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    with SqliteStore(path) as one, SqliteStore(path) as two:
        first = Ledger.create(one, SID)
        second = Ledger(two, SID)
        for ledger in (first, second):
            ledger.step(emit((0, 0), IDEMPOTENT, {}))
            ledger.step(E(A.EnginePersistCall, (0, 0))) if ledger is first else None
        with pytest.raises(StaleState, match="already durable"):
            second.step(E(A.EnginePersistCall, (0, 0)))
        second.crash()
        first.step(E(A.EnginePersistDispatched, (0, 0)))
        # It saw no record and would decide execute: an audit-only commit on
        # stale inputs, refused before it writes its decision row.
        with pytest.raises(StaleState, match=r"audit keys written since: \[\('dispatch', 1\)\]"):
            second.step(E(A.Recover, (0, 0)))
        assert two.load(SID).ledger == one.load(SID).ledger
        assert [r.kind for r in one.audit(SID)] == ["dispatch"]
        second.reload()  # sees the dispatched attempt: decides on what is durable
        second.step(E(A.Recover, (0, 0)))
        assert [r.kind for r in one.audit(SID)] == ["dispatch", "retry_same_id"]


def test_a_store_can_be_used_from_another_thread(tmp_path: Path) -> None:
    with SqliteStore(populated(tmp_path / "x.db")) as store:
        seen: list[p.SessionState] = []
        worker = threading.Thread(target=lambda: seen.append(store.load(SID)))
        worker.start()
        worker.join()
        assert seen == [store.load(SID)]


# --------------------------------------------------------------------------
# Files it must refuse: typed error, clear message, unchanged bytes, nothing run
# --------------------------------------------------------------------------


def test_control_a_healthy_copy_would_retry_the_call(tmp_path: Path) -> None:
    invoked: list[p.CallPosition] = []
    restart_and_recover(populated(tmp_path / "x.db"), invoked)
    assert invoked == [(0, 0)]


def refuse(path: Path, error: type[Exception], message: str) -> Exception:
    before = listing(path.parent)
    invoked: list[p.CallPosition] = []
    with pytest.raises(error, match=message) as info:
        restart_and_recover(path, invoked)
    assert invoked == []
    assert str(path) in str(info.value)
    assert "Nothing was executed or written" in str(info.value)
    assert listing(path.parent) == before  # same files, same bytes
    return info.value


def test_random_bytes_over_the_middle_pages(tmp_path: Path) -> None:
    path = populated(tmp_path / "x.db")
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    pages = len(data) // page
    assert pages >= 8
    rng = random.Random(443)
    start, end = pages // 3 * page, 2 * pages // 3 * page
    data[start:end] = rng.randbytes(end - start)
    path.write_bytes(bytes(data))
    refuse(path, StoreCorrupt, "not a usable toolledger store")


@pytest.mark.parametrize("needle", [RESULT_TEXT, ARGUMENT_TEXT, "attempt 1 dispatched"])
def test_altered_bytes_inside_a_stored_value(tmp_path: Path, needle: str) -> None:
    path = populated(tmp_path / "x.db")
    data = path.read_bytes()
    assert needle.encode() in data
    # Still valid UTF-8 of the same length: only a checksum can tell.
    path.write_bytes(data.replace(needle.encode(), needle.swapcase().encode()))
    refuse(path, StoreCorrupt, "does not match its checksum")


@pytest.mark.parametrize("keep", ["half", "all but one byte"])
def test_a_truncated_file(tmp_path: Path, keep: str) -> None:
    path = populated(tmp_path / "x.db")
    data = path.read_bytes()
    cut = len(data) // 2 // 4096 * 4096 if keep == "half" else len(data) - 1
    path.write_bytes(data[:cut])
    refuse(path, StoreCorrupt, f"truncated or damaged: it has {cut} bytes")


def test_a_text_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("session_id,marker\ns1,0\n" * 20)
    refuse(path, StoreCorrupt, "is not a SQLite database")


def test_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    path.write_bytes(b"")
    refuse(path, StoreCorrupt, r"is empty \(0 bytes\)")


def test_a_future_schema_version(tmp_path: Path) -> None:
    path = populated(tmp_path / "x.db")
    by_hand(path, f"UPDATE meta SET schema_version = {SCHEMA_VERSION + 1}")
    error = refuse(path, UnsupportedSchema, "written by a newer toolledger")
    assert isinstance(error, UnsupportedSchema)
    assert (error.found, error.supported) == (SCHEMA_VERSION + 1, SCHEMA_VERSION)


def test_another_applications_database(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    by_hand(path, "CREATE TABLE notes (text)", "INSERT INTO notes VALUES ('hello')")
    error = refuse(path, UnsupportedSchema, r"not a toolledger store \(its tables: notes\)")
    assert isinstance(error, UnsupportedSchema) and error.found is None


def test_a_row_altered_by_hand(tmp_path: Path) -> None:
    path = populated(tmp_path / "x.db")
    by_hand(
        path,
        "UPDATE calls SET record_status = 'succeeded' "
        "WHERE record_attempt = 1 AND record_result_kind IS NULL",
    )
    refuse(path, StoreCorrupt, r"the ledger record of execution 'tlx1-.*' .* does not match")


def test_record_columns_without_their_checksum(tmp_path: Path) -> None:
    """A record's values in a call's row with its checksum gone: damage, not "no record"."""
    path = populated(tmp_path / "x.db")
    by_hand(path, "UPDATE calls SET record_checksum = NULL WHERE record_attempt = 1")
    refuse(path, StoreCorrupt, "has record columns but no record_checksum")


def test_a_record_repeating_its_call_is_stored_once_and_read_back_whole(
    tmp_path: Path,
) -> None:
    """The record's digest and result name the call's own: stored as NULL (bench_bytes),
    read back as the values, and the checksum is over the values."""
    path = with_history(tmp_path / "x.db")
    raw = sqlite3.connect(path)
    settled = raw.execute(
        "SELECT count(*) FROM calls WHERE record_result_kind IS NOT NULL AND "
        "record_args_digest IS NULL AND record_result_execution_id IS NULL AND "
        "record_result_args_digest IS NULL AND record_result_content IS NULL AND "
        "result_execution_id IS NULL AND result_args_digest IS NULL").fetchone()[0]
    raw.close()
    assert settled > 0
    with SqliteStore(path) as store:
        state = store.load(SID)
        store.verify()
    done = [c for c in state.calls if c.result is not None and c.execution_id in state.ledger]
    assert done
    for c in done:
        rec = state.ledger[c.execution_id]
        assert rec.args_digest == c.args_digest and rec.result == c.result
        assert c.result is not None and c.result.execution_id == c.execution_id


def test_a_row_altered_with_its_checksum_still_fails_closed(tmp_path: Path) -> None:
    path = populated(tmp_path / "x.db")
    raw = sqlite3.connect(path)
    raw.row_factory = sqlite3.Row
    row = dict(raw.execute("SELECT * FROM calls WHERE turn = 0 AND slot = 0").fetchone())
    row["tool_call_id"] = "call_99"  # the execution id no longer derives from it
    raw.execute(
        "UPDATE calls SET tool_call_id = ?, row_checksum = ? WHERE turn = 0 AND slot = 0",
        (row["tool_call_id"], _checksum("calls", row)),
    )
    raw.commit()
    raw.close()
    refuse(path, StoreCorrupt, "is not the id derived from the call's position")


def test_a_hand_written_result_must_be_json(tmp_path: Path) -> None:
    path = populated(tmp_path / "x.db")
    shutil.copy(path, tmp_path / "copy.db")
    raw = sqlite3.connect(path)
    raw.row_factory = sqlite3.Row
    row = dict(raw.execute("SELECT * FROM audit ORDER BY id LIMIT 1").fetchone())
    row["inputs"] = json.dumps(["not", "an", "object"])
    raw.execute("DROP TRIGGER audit_no_update")  # a determined hand
    raw.execute(
        "UPDATE audit SET inputs = ?, row_checksum = ? WHERE id = ?",
        (row["inputs"], _checksum("audit", row), row["id"]),
    )
    raw.execute(_SCHEMA[-2])  # and puts the trigger back
    raw.commit()
    raw.close()
    refuse(path, StoreCorrupt, r"audit\[1\]\.inputs is JSON but not an object")


def test_a_dropped_append_only_trigger_fails_closed(tmp_path: Path) -> None:
    path = populated(tmp_path / "x.db")
    by_hand(path, "DROP TRIGGER audit_no_delete")
    refuse(path, StoreCorrupt, "its indexes or triggers audit_no_delete are missing")


def test_a_commit_survives_the_process_being_killed(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    script = f"""
import os, signal
from toolledger._core import protocol as p
from toolledger._core.ledger import Ledger
from toolledger._core.sqlite_store import SqliteStore
store = SqliteStore({str(path)!r})
ledger = Ledger.create(store, "s1")
tool = p.ToolProfile("create_ticket", p.RecoveryPolicy.IDEMPOTENT, False)
digest = p.args_digest(tool.name, {{}})
ledger.step(p.Event(p.Action.ProviderEmitCall, (0, 0), "call_0", tool, digest))
ledger.step(p.Event(p.Action.EnginePersistCall, (0, 0)))
ledger.step(p.Event(p.Action.EnginePersistDispatched, (0, 0)))
os.kill(os.getpid(), signal.SIGKILL)  # no close(), no checkpoint: the WAL holds the commits
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    assert Path(f"{path}-wal").stat().st_size > 0
    with SqliteStore(path) as store:
        loaded = store.load(SID)
        (call,) = loaded.calls
        assert call.stage is p.Stage.RESUME
        assert loaded.ledger[call.execution_id].status is p.LedgerStatus.DISPATCHED
        assert [r.kind for r in store.audit(SID)] == ["dispatch"]


# --------------------------------------------------------------------------
# The working set: recovery reads the open calls, verify() reads everything
# --------------------------------------------------------------------------

SETTLED_TEXT = "SETTLED-RESULT-9876543210"


def with_history(path: Path) -> Path:
    """Turns 0 and 1 settled (protected calls), turn 2: an idempotent call dispatched."""
    with SqliteStore(path) as store:
        ledger = Ledger.create(store, SID)
        protected_call(ledger, (0, 0), SETTLED_TEXT)
        protected_call(ledger, (1, 0), RESULT_TEXT)
        ledger.step(emit((2, 0), IDEMPOTENT, {}), arguments={})
        ledger.step(E(A.EnginePersistCall, (2, 0)))
        ledger.step(E(A.EnginePersistDispatched, (2, 0)))
        assert [c.position for c in ledger.state.calls] == [(2, 0)]  # turns 0, 1 left memory
    return path


def test_the_working_set_is_loaded_through_indexes_only(tmp_path: Path) -> None:
    with SqliteStore(with_history(tmp_path / "x.db")) as store:
        full = store.load(SID)
        assert [c.position for c in full.calls] == [(0, 0), (1, 0), (2, 0)]
        assert store.load_working_set(SID) == working_set(full)
        assert [c.position for c in store.load_working_set(SID).calls] == [(2, 0)]
        assert store.call_exists(SID, (0, 0)) and not store.call_exists(SID, (0, 1))
        # Every statement a restart and a recovery issue is an index lookup: the
        # plans SQLite chose for the statements it really ran (expanded SQL).
        statements: list[str] = []
        store.connection.set_trace_callback(statements.append)
        ledger = Ledger(store, SID)
        ledger.step(E(A.Recover, (2, 0)))
        store.connection.set_trace_callback(None)
        queries = [q for q in statements if q.split()[0].upper() in ("SELECT", "UPDATE")]
        assert len(queries) >= 6, statements
        for q in queries:
            plan = [str(r[-1]) for r in store.connection.execute(f"EXPLAIN QUERY PLAN {q}")]
            assert not [step for step in plan if step.startswith("SCAN")], (q, plan)


def test_recovery_does_not_read_a_damaged_settled_call_but_verify_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = with_history(tmp_path / "x.db")
    data = path.read_bytes()
    assert data.count(SETTLED_TEXT.encode()) >= 1
    path.write_bytes(data.replace(SETTLED_TEXT.encode(), SETTLED_TEXT.lower().encode()))
    invoked: list[p.CallPosition] = []
    store = SqliteStore(path)
    try:
        ledger = Ledger(store, SID)  # reads turn 2 only: the damage is not in its way
        ledger.step(E(A.Recover, (2, 0)))
        assert ledger.state.call((2, 0)).stage is p.Stage.RETRY  # type: ignore[union-attr]
        invoked.append((2, 0))
        with pytest.raises(StoreCorrupt, match=r"the calls row .* does not match its checksum"):
            store.verify()
        with pytest.raises(StoreCorrupt, match="does not match its checksum"):
            store.load(SID)  # reading the whole session reads the damage
    finally:
        store.close()
    assert invoked == [(2, 0)]
    assert cli_main(["verify-store", str(path)]) == 1
    assert "does not match its checksum" in capsys.readouterr().err


def test_verify_passes_a_healthy_store_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = with_history(tmp_path / "x.db")
    before = listing(tmp_path)
    with SqliteStore(path) as store:
        store.verify()
    assert cli_main(["verify-store", str(path)]) == 0
    assert "ok (1 sessions" in capsys.readouterr().out
    assert listing(tmp_path) == before
    assert cli_main(["verify-store", str(tmp_path / "missing.db")]) == 2


def test_verify_finds_an_approval_that_belongs_to_no_call(tmp_path: Path) -> None:
    # (a ledger record cannot: schema 7 keeps it in its call's row)
    path = with_history(tmp_path / "x.db")
    raw = sqlite3.connect(path)
    row = {"execution_id": "tlx1-" + "0" * 32, "session_id": SID, "state": "approved"}
    row["row_checksum"] = _checksum("approvals", row)
    raw.execute(
        f"INSERT INTO approvals ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
        tuple(row.values()),
    )
    raw.commit()
    raw.close()
    with SqliteStore(path) as store, pytest.raises(StoreCorrupt, match="belongs to no call"):
        store.verify()


def test_arguments_of_a_settled_call_come_from_the_store(tmp_path: Path) -> None:
    with SqliteStore(with_history(tmp_path / "x.db")) as store:
        ledger = Ledger(store, SID)
        assert ledger.state.call((0, 0)) is None
        assert ledger.call_arguments((0, 0)) == {"to": "a@example.com", "body": ARGUMENT_TEXT}
        assert ledger.call_arguments((0, 5)) is None


def test_text_that_is_not_utf8_fails_closed(tmp_path: Path) -> None:
    """SQLite hands back bytes Python cannot decode: damage, found on the first read."""
    path = populated(tmp_path / "x.db")
    by_hand(path, "UPDATE calls SET tool_call_id = CAST(x'ff00fe' AS TEXT) WHERE slot = 0")
    error = refuse(path, StoreCorrupt, "Could not decode to UTF-8")
    assert "reading failed" in str(error)


def test_a_damaged_byte_in_the_schema_text_is_refused_as_corrupt(tmp_path: Path) -> None:
    """The crash campaign's damaged-byte trial: 'approved' -> '&pproved' in the text of
    the approvals table's CHECK constraint.  The columns are unchanged, but SQLite would
    now refuse every approved row; the open compares the schema's text and fails closed."""
    path = tmp_path / "s.sqlite3"
    with SqliteStore(path) as store:
        store.create_session("s", marker=0, max_attempts=3)
    data = path.read_bytes()
    at = data.index(b"'approved'")
    path.write_bytes(data[:at + 1] + b"&" + data[at + 2:])
    with pytest.raises(StoreCorrupt, match="schema text of approvals"):
        SqliteStore(path)
    assert path.read_bytes()[at + 1:at + 2] == b"&"  # nothing was written


def test_a_damaged_byte_that_is_not_utf8_is_refused_as_corrupt(tmp_path: Path) -> None:
    """The crash campaign's trial at a table's name in sqlite_master: the byte became
    0xEC, which is not UTF-8, and sqlite3's decoding raised UnicodeDecodeError out of
    the open (a traceback, not a StoreCorrupt naming the file).  The same damage in a
    row's text, on a read and on a write."""
    path = tmp_path / "s.sqlite3"
    with SqliteStore(path) as store:
        store.create_session("s", marker=0, max_attempts=3)
    data = path.read_bytes()
    at = data.index(b"approvals")  # sqlite_master's name column comes first
    path.write_bytes(data[:at] + b"\xec" + data[at + 1:])
    with pytest.raises(StoreCorrupt, match="not valid UTF-8") as e:
        SqliteStore(path)
    assert str(path) in str(e.value)
    assert path.read_bytes()[at:at + 1] == b"\xec"  # nothing was written

    rows = tmp_path / "rows.sqlite3"
    with SqliteStore(rows) as store:
        store.create_session("s", marker=0, max_attempts=3)
    conn = sqlite3.connect(rows)
    conn.execute("UPDATE sessions SET session_id = CAST(x'73ec' AS TEXT)")
    conn.commit()
    conn.close()
    with SqliteStore(rows) as store, pytest.raises(StoreCorrupt, match=r"(?i)utf-8"):
        store.sessions()


def test_a_record_stored_in_its_calls_row_reads_back_as_it_was_written(tmp_path: Path) -> None:
    """Schema 7 stores a record's values that repeat its call's as NULL (and None as ''):
    every kind of record, repeating the call or not, with or without a result, reads
    back as the ledger row it is, and its checksum is that row's."""
    from dataclasses import replace

    from toolledger._core.rows import _record_values
    from toolledger._core.sqlite_rows import packed_record

    with SqliteStore(with_history(tmp_path / "x.db")) as store:
        conn = store.connection
        (row,) = store._select(conn, "calls", "WHERE turn = 0 AND slot = 0", ())
        (call,) = [c for c in store.load(SID).calls if c.position == (0, 0)]
        assert call.result is not None
        other = p.ToolResult(p.ResultKind.OK, "tlx1-" + "f" * 32, "sha256:" + "e" * 64, "y")
        base = p.ExecutionRecord(
            call.execution_id, p.LedgerStatus.SUCCEEDED, 2, call.args_digest,
            p.Authorization.AUTO, call.result, call.position, 12.5,
        )  # fmt: skip
        records = [
            base,  # repeats the call: digest and result stored once
            replace(base, args_digest=None, result=None, status=p.LedgerStatus.DISPATCHED),
            replace(base, args_digest="sha256:" + "d" * 64, result=other, position=None),
            replace(base, result=replace(call.result, content="")),  # "" is not NULL
        ]
        for open_call in (False, True):
            c = replace(call, result=None) if open_call else call
            stored_row = dict(row)
            if open_call:
                stored_row.update(result_kind=None, result_content=None,
                                  result_execution_id=None, result_args_digest=None)
            for rec in records:
                values = _record_values(SID, rec)
                packed = packed_record(c, values)
                held = {**stored_row, **packed, "record_checksum": _checksum("ledger", values)}
                assert store._record_row(held) == {
                    **values, "row_checksum": _checksum("ledger", values)}
                assert store._decode_record(values | {"row_checksum": ""}) == rec
        # a repeat is stored as NULL, a None digest as '' (never a valid digest)
        packed = packed_record(call, _record_values(SID, base))
        assert packed["record_args_digest"] is None
        assert packed["record_result_execution_id"] is None
        assert packed["record_result_args_digest"] is None
        assert packed["record_result_content"] is None
        assert packed_record(call, _record_values(SID, records[1]))["record_args_digest"] == ""
