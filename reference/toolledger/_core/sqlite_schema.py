"""The SQLite store's schema and the checks that read a file before opening it.

Private module of :mod:`toolledger`: import the public names from ``toolledger``.

:data:`SCHEMA_VERSION` and :data:`APPLICATION_ID` (which
:mod:`toolledger._core.sqlite_store` re-exports), the tables, indexes and
triggers a store file holds (``_SCHEMA``, ``_COLUMNS``, ``_OBJECTS``; the
checksummed columns shared with PostgreSQL are in
:mod:`toolledger._core.rows`), and ``_check_file``: what opening checks in the
file's bytes before SQLite touches it (never writing).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from .protocol import (
    ApprovalState,
    Authorization,
    LedgerStatus,
    RecoveryPolicy,
    ResultKind,
)
from .rows import (
    _DATA,
    _RESULT_DDL,
    _one_of,
)
from .stores import (
    StoreCorrupt,
)

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION"]

SCHEMA_VERSION: Final = 7
"""The schema this version writes and reads; a file with another one is refused.

Version 7 (from 6): the execution record lives in its call's row.  The
``ledger`` table and its ``execution_id`` index are gone; ``calls`` has the
record's columns (``record_status`` ... ``record_dispatched_at``, see
``_RECORD_COLUMNS``) and ``record_checksum``, the checksum of the record as
the ``ledger`` row it was (so ``_differs`` compares it as before, and
PostgreSQL keeps its ``ledger`` table and the same checksums).  A record
always belongs to a durable call of its session (``plan_commit`` refuses
others), so the call's row is its natural home, and a commit that writes a
record touches one B-tree fewer plus its index (``benchmarks/bench_bytes.py``:
WAL frames per call by table).  Values a record or a result repeats from its
call are stored once (``sqlite_rows``: NULL, read back from the call's
column), so a call's row with its record stays well under a 1 KiB page.
``audit_by_session`` is on ``(session_id, turn, slot)`` (it was
``(session_id, execution_id)``): narrower entries, so fewer of its pages split
per commit; a call's audit rows are found by its position.  A version-6
file keeps its records in the old table, so it is refused at open like every
other version; no migration exists (copying each ledger row into its call's
row would be one).

Version 6 (from 5): leaner pages per commit, measured by
``benchmarks/bench_bytes.py``.  The ledger is a rowid table with
``execution_id`` UNIQUE (it was ``WITHOUT ROWID``: an index B-tree keeps
whole ~300-byte rows in its interior pages, so its fan-out was tiny and a
1024-byte page overflowed); the audit rows have one index,
``audit_by_session (session_id, execution_id)``, which serves both the
session's audit and a call's audit keys (``audit_by_execution`` is gone); and
``calls.execution_id`` is no longer UNIQUE (it is derived from the call's
primary key, and re-derived on every read).  The columns are unchanged, but a
version-5 file has the old tables and indexes (SQLite cannot change a
table's key in place), so it is refused at open like every other version; no
migration exists (a table rebuild would be one).

Version 5 (from 3): ``sessions.epoch``, the session's lease epoch
(:meth:`~toolledger._core.sqlite_store.SqliteStore.take_session`; a commit
carrying an older one is refused with
:class:`~toolledger._core.stores.LeaseLost`); ``calls.retention_window`` (how
long the tool's external system keeps an idempotency key, ``NULL``: forever)
and ``ledger.dispatched_at`` (the execution's first dispatch time), from which
a restarted engine computes ``keyRetained``.  A version-3 file has none of
these columns (and its rows' checksums cover none): its records would read as
"no dispatch time", and a retry after the key's window would look safe.
Version 4 was two development schemas, each with only part of these columns.
Files of version 3 or 4 are refused at open, with a message naming both
versions, like every other version.

Version 3 (from 2): ``result_kind`` may be ``'cancelled'`` (``HumanCancel``,
a user's Stop before dispatch).  Only a CHECK list grew, but a version-2 file
carries the old CHECK in its table definition (SQLite cannot alter it in
place), so a cancel would fail on it at the first Stop, mid-session; and a
version-2 reader would meet a result kind it does not know.  Refusing the
other version at open, with a message naming it, is the honest outcome for
both; no migration exists yet (a table rebuild would be one)."""

APPLICATION_ID: Final = 0x544C4752
"""``PRAGMA application_id`` of a toolledger store ("TLGR")."""

PAGE_SIZE: Final = 1024
"""The SQLite page size a new store file is created with (an existing file keeps its own).

Measured by ``benchmarks/bench_bytes.py`` (5-call turns, ``execute_many``): a
commit writes whole pages into the WAL, one per table or index it touches,
and a protected call's commits touch ~11 pages however small its rows are.
Bytes the kernel counts per call: 62 KB at 4096, 45 KB at 2048, 39 KB at
1024.  Not part of the schema version: SQLite reads any page size, and
opening checks only that the header's is valid."""

_SQLITE_MAGIC: Final = b"SQLite format 3\x00"


# --------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------

# The columns of the ``calls`` row that hold its execution record: (the
# record's column as PostgreSQL's ``ledger`` table and the checksum name it,
# the column of ``calls``).  ``execution_id`` and ``session_id`` are the
# call's own; ``record_checksum`` is ``_checksum("ledger", ...)`` of the
# record's values, NULL with every other record column when there is no record.
_RECORD_COLUMNS: Final[tuple[tuple[str, str], ...]] = (
    *(
        (c, f"record_{c}")
        for c in _DATA["ledger"]
        if c not in ("execution_id", "session_id")
    ),
    ("row_checksum", "record_checksum"),
)

_COLUMNS: Final[Mapping[str, tuple[str, ...]]] = {
    "meta": ("singleton", "schema_version", "created"),
    **{
        t: (("id",) if t == "audit" else ())
        + cols
        + ("row_checksum",)
        + (tuple(c for _, c in _RECORD_COLUMNS) if t == "calls" else ())
        for t, cols in _DATA.items()
        if t != "ledger"
    },
}

_SCHEMA: Final[tuple[str, ...]] = (
    """CREATE TABLE meta (
        singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
        schema_version INTEGER NOT NULL,
        created TEXT NOT NULL)""",
    """CREATE TABLE sessions (
        session_id TEXT PRIMARY KEY,
        marker INTEGER NOT NULL CHECK (marker >= 0),
        max_attempts INTEGER NOT NULL CHECK (max_attempts >= 1),
        epoch INTEGER NOT NULL CHECK (epoch >= 0),
        row_checksum TEXT NOT NULL)""",
    f"""CREATE TABLE calls (
        session_id TEXT NOT NULL REFERENCES sessions (session_id),
        turn INTEGER NOT NULL CHECK (turn >= 0),
        slot INTEGER NOT NULL CHECK (slot >= 0),
        tool_call_id TEXT NOT NULL,
        tool_name TEXT NOT NULL,
        policy TEXT NOT NULL CHECK (policy IN ({_one_of(RecoveryPolicy)})),
        requires_approval INTEGER NOT NULL CHECK (requires_approval IN (0, 1)),
        execution_id TEXT NOT NULL,
        args_digest TEXT NOT NULL,
        arguments TEXT,
        message_state TEXT NOT NULL CHECK (message_state = 'durable'),
        {_RESULT_DDL},
        retention_window REAL CHECK (retention_window IS NULL OR retention_window > 0),
        row_checksum TEXT NOT NULL,
        record_status TEXT
            CHECK (record_status IS NULL OR record_status IN ({_one_of(LedgerStatus)})),
        record_attempt INTEGER CHECK (record_attempt IS NULL OR record_attempt >= 0),
        record_args_digest TEXT,
        record_authorization TEXT CHECK (
            record_authorization IS NULL OR record_authorization IN ({_one_of(Authorization)})),
        record_result_kind TEXT CHECK (
            record_result_kind IS NULL OR record_result_kind IN ({_one_of(ResultKind)})),
        record_result_content TEXT,
        record_result_execution_id TEXT,
        record_result_args_digest TEXT,
        record_turn INTEGER,
        record_slot INTEGER,
        record_dispatched_at REAL,
        record_checksum TEXT,
        PRIMARY KEY (session_id, turn, slot))""",
    f"""CREATE TABLE approvals (
        execution_id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions (session_id),
        state TEXT NOT NULL CHECK (state IN ({_one_of(ApprovalState)})),
        row_checksum TEXT NOT NULL) WITHOUT ROWID""",
    """CREATE TABLE audit (
        id INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions (session_id),
        execution_id TEXT NOT NULL,
        tool_call_id TEXT NOT NULL,
        turn INTEGER NOT NULL,
        slot INTEGER NOT NULL,
        kind TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        authorization TEXT NOT NULL,
        recovery_decision TEXT,
        inputs TEXT NOT NULL,
        note TEXT NOT NULL,
        recorded_at TEXT NOT NULL,
        row_checksum TEXT NOT NULL)""",
    "CREATE INDEX calls_open ON calls (session_id, turn, slot) WHERE result_kind IS NULL",
    "CREATE INDEX audit_by_session ON audit (session_id, turn, slot)",
    """CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
        BEGIN SELECT RAISE(ABORT, 'audit rows are append-only'); END""",
    """CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
        BEGIN SELECT RAISE(ABORT, 'audit rows are append-only'); END""",
)


# The named indexes and triggers of the schema; opening checks they exist.
_OBJECTS: Final = frozenset(
    {"calls_open", "audit_by_session", "audit_no_update", "audit_no_delete"}
)


_SCHEMA_TEXT: dict[str, str] = {}


def schema_text() -> Mapping[str, str]:
    """Name -> the SQL text SQLite keeps in ``sqlite_master`` for each table, index and
    trigger of this schema version (as SQLite stores it: from an in-memory database).

    Opening a store compares its objects' text with this: a damaged byte in the
    schema's own text (a CHECK constraint's list, a column's type) changes what
    SQLite enforces without changing the column names, so only the text tells."""
    if not _SCHEMA_TEXT:
        conn = sqlite3.connect(":memory:")
        try:
            for statement in _SCHEMA:
                conn.execute(statement)
            _SCHEMA_TEXT.update(
                (str(name), str(sql)) for name, sql in conn.execute(
                    "SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL"))
        finally:
            conn.close()
    return _SCHEMA_TEXT


# --------------------------------------------------------------------------
# Opening: checks that read the file and never write it
# --------------------------------------------------------------------------


def _check_file(path: Path) -> None:
    """Header and size checks done in Python, before SQLite touches the file."""
    size = path.stat().st_size
    if size == 0:
        raise StoreCorrupt(
            f"{path} is empty (0 bytes), so it is not a toolledger store (a store is never "
            "empty once created). Nothing was executed or written. If it was truncated, "
            "restore it from a backup; if you created the empty file yourself, delete it and "
            "open the path again.",
            path=str(path),
        )
    with path.open("rb") as f:
        header = f.read(100)
    if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
        raise StoreCorrupt(
            f"{path} is not a SQLite database (it is {size} bytes and starts with "
            f"{header[:16]!r}, not {_SQLITE_MAGIC!r}): point the store at its own "
            "database file. Nothing was executed or written.",
            path=str(path),
        )
    page_size = int.from_bytes(header[16:18], "big")
    if page_size == 1:
        page_size = 65536
    if page_size < 512 or page_size & (page_size - 1):
        raise StoreCorrupt(
            f"{path} has a damaged SQLite header (page size {page_size}): restore it from "
            "a backup. Nothing was executed or written.",
            path=str(path),
        )
    wal = Path(f"{path}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        return  # committed pages may still live in the WAL; SQLite's checks decide
    pages = int.from_bytes(header[28:32], "big")
    header_valid = header[24:28] == header[92:96]  # the in-header size is current
    if size % page_size or (header_valid and pages * page_size > size):
        expected = f"{pages} pages of {page_size} bytes" if header_valid else "whole pages"
        raise StoreCorrupt(
            f"{path} is truncated or damaged: it has {size} bytes, its header says "
            f"{expected}. Restore it from a backup; do not open it with SQLite tools, "
            "which may write to it. Nothing was executed or written.",
            path=str(path),
        )
