"""Leaner SQLite stores: the measured page size and the lean schema (versions 6 and 7).

Under test: :data:`toolledger._core.sqlite_schema.PAGE_SIZE` at creation, and
that an existing store with another page size (4096, what earlier versions
created) opens, commits and verifies as before: the page size is a property
of the file, not of the schema version.  The schema's tables and indexes
(``bench_bytes.py`` measured what each costs per commit), that a file of the
previous version is refused by name without a byte changed, and that every
per-call read of the store still goes through an index (recovery flat in
the history).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from toolledger import Session, SqliteStore, Tool
from toolledger._core.sqlite_schema import PAGE_SIZE, SCHEMA_VERSION
from toolledger._core.sqlite_verify import verify_file
from toolledger._core.stores import UnsupportedSchema


def _page_size(path: Path) -> int:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(conn.execute("PRAGMA page_size").fetchone()[0])
    finally:
        conn.close()


def _turn(store: SqliteStore, name: str) -> None:
    s = Session.open(store, name, {"send": Tool("idempotent", requires_approval=False)})
    recorded = s.record(1, [{"id": f"c{i}", "name": "send", "arguments": {"i": i}}
                            for i in range(3)])
    s.execute_many([(st.call.key, lambda a: "sent") for st in recorded])


def test_a_new_store_has_the_measured_page_size(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    with SqliteStore(path) as store:
        _turn(store, "s")
    assert PAGE_SIZE == 1024
    assert _page_size(path) == PAGE_SIZE
    assert verify_file(path).sessions == 1


def test_a_store_with_another_page_size_still_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.db"
    with monkeypatch.context() as m:
        m.setattr("toolledger._core.sqlite_store.PAGE_SIZE", 4096)  # what earlier versions made
        with SqliteStore(path) as store:
            _turn(store, "a")
    assert _page_size(path) == 4096
    with SqliteStore(path) as store:
        _turn(store, "b")
        assert store.sessions() == ["a", "b"]
    assert _page_size(path) == 4096
    assert verify_file(path).sessions == 2


def _sql_of(path: Path) -> dict[str, str]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {str(n): str(q or "") for n, q in conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE tbl_name IN ('ledger', 'audit', 'calls')")}
    finally:
        conn.close()


def test_the_lean_schema_a_new_store_gets(tmp_path: Path) -> None:
    path = tmp_path / "lean.db"
    with SqliteStore(path) as store:
        _turn(store, "s")
    sql = _sql_of(path)
    # schema 7: no ledger table (nor its execution id index): a record is in its call's row
    assert "ledger" not in sql and not any("ledger" in n for n in sql)
    assert "record_checksum" in sql["calls"] and "WITHOUT ROWID" not in sql["calls"]
    # one index on the audit rows, by the call's position (narrow entries), serving the
    # session's audit and a call's keys
    assert [n for n in sql if n.startswith("audit_by")] == ["audit_by_session"]
    assert "(session_id, turn, slot)" in sql["audit_by_session"]
    # calls: the primary key's index only (the execution id is derived from it)
    assert [n for n in sql if n.startswith("sqlite_autoindex_calls")] == [
        "sqlite_autoindex_calls_1"]


def test_a_store_of_the_previous_schema_version_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    SqliteStore(path).close()
    raw = sqlite3.connect(path)
    raw.execute(f"UPDATE meta SET schema_version = {SCHEMA_VERSION - 1}")
    raw.commit()
    raw.close()
    before = path.read_bytes()
    with pytest.raises(UnsupportedSchema, match=f"version {SCHEMA_VERSION - 1}.*No migration"):
        SqliteStore(path)
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    ("query", "search"),
    [
        # what a commit's compare-and-set and a recovery's load read, per call: the
        # audit rows of one call (or of several calls of a turn) by the whole index key
        ("SELECT group_concat(kind) FROM audit WHERE session_id = 's' AND turn = 0 "
         "AND slot = 1 AND execution_id = 'e'", "(session_id=? AND turn=? AND slot=?)"),
        ("SELECT id FROM audit WHERE session_id = 's' AND turn = 0 AND slot IN (0, 1)",
         "(session_id=? AND turn=? AND slot=?)"),
        # a call's record: in the call's row, by its primary key
        ("SELECT record_checksum FROM calls WHERE session_id = 's' AND turn = 0 "
         "AND slot = 1", "(session_id=? AND turn=? AND slot=?)"),
        ("SELECT id FROM audit WHERE session_id = 's'", "(session_id=?)"),
    ],
)
def test_the_per_call_reads_go_through_an_index(
    tmp_path: Path, query: str, search: str
) -> None:
    """Recovery stays flat in the history: no read of a call's rows scans a table."""
    path = tmp_path / "plan.db"
    SqliteStore(path).close()
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        plan = " / ".join(str(r[3]) for r in conn.execute(f"EXPLAIN QUERY PLAN {query}"))
    finally:
        conn.close()
    assert "SCAN" not in plan and search in plan, plan
