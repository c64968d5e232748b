"""Leaner SQLite stores: new files use the measured page size, older files still open.

Under test: :data:`toolledger._core.sqlite_schema.PAGE_SIZE` at creation, and
that an existing store with another page size (4096, what earlier versions
created) opens, commits and verifies as before: the page size is a property
of the file, not of the schema version.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from toolledger import Session, SqliteStore, Tool
from toolledger._core.sqlite_schema import PAGE_SIZE
from toolledger._core.sqlite_verify import verify_file


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
