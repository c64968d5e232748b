"""The PostgreSQL store's schema, and the checks that open an existing one.

Private module of :mod:`toolledger`: import the public names from ``toolledger``.

:data:`SCHEMA_VERSION` and :data:`APPLICATION` (which
:mod:`toolledger._core.postgres_store` re-exports), the tables, indexes and
the trigger a store's PostgreSQL schema holds (``_SCHEMA``, ``_COLUMNS``,
``_INDEXES``; the checksummed columns shared with SQLite are in
:mod:`toolledger._core.rows`), the store's fail-closed wording (``_Rows``), and
``_check_tables``: what opening checks in an existing schema (the version
first, then every table's columns, the indexes and the trigger), never writing.

Schema (version :data:`SCHEMA_VERSION`, in the PostgreSQL schema ``schema``)
--------------------------------------------------------------------------
The tables and checksummed columns of ``SqliteStore`` (``sessions``,
``calls``, ``approvals``, ``ledger``, ``audit``) plus ``meta`` (singleton,
application, schema_version, created).  Indexes ``calls_open`` (partial: the
calls without a result), ``audit_by_session`` and ``audit_by_execution``
keep a restart independent of the history; a trigger refuses UPDATE and
DELETE on ``audit``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from .protocol import (
    ApprovalState,
    LedgerStatus,
    RecoveryPolicy,
)
from .rows import (
    _DATA,
    _RESULT_DDL,
    RowDecoder,
    _one_of,
)
from .stores import (
    StoreCorrupt,
    UnsupportedSchema,
)

__all__ = ["APPLICATION", "SCHEMA_VERSION"]

SCHEMA_VERSION: Final = 3
"""The PostgreSQL schema version this version writes and reads.

Version 3 (from 1): ``sessions.epoch``, the session's lease epoch
(:meth:`~toolledger._core.postgres_store.PostgresStore.take_session`),
``calls.retention_window`` and ``ledger.dispatched_at``, as in the SQLite
store's version 5 (a restarted engine computes keyRetained from them).
Version 2 was two development schemas, each with only part of these
columns.  A schema of version 1 or 2 is refused at open with a message
naming its version and this one."""

APPLICATION: Final = "toolledger"

_COLUMNS: Final[Mapping[str, tuple[str, ...]]] = {
    "meta": ("singleton", "application", "schema_version", "created"),
    **{
        t: (("id",) if t == "audit" else ()) + cols + ("row_checksum",)
        for t, cols in _DATA.items()
    },
}

_SCHEMA: Final[tuple[str, ...]] = (
    """CREATE TABLE meta (
        singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
        application TEXT NOT NULL,
        schema_version INTEGER NOT NULL,
        created TEXT NOT NULL)""",
    """CREATE TABLE sessions (
        session_id TEXT PRIMARY KEY,
        marker INTEGER NOT NULL CHECK (marker >= 0),
        max_attempts INTEGER NOT NULL CHECK (max_attempts >= 1),
        epoch BIGINT NOT NULL CHECK (epoch >= 0),
        row_checksum TEXT NOT NULL)""",
    f"""CREATE TABLE calls (
        session_id TEXT NOT NULL REFERENCES sessions (session_id),
        turn INTEGER NOT NULL CHECK (turn >= 0),
        slot INTEGER NOT NULL CHECK (slot >= 0),
        tool_call_id TEXT NOT NULL,
        tool_name TEXT NOT NULL,
        policy TEXT NOT NULL CHECK (policy IN ({_one_of(RecoveryPolicy)})),
        requires_approval INTEGER NOT NULL CHECK (requires_approval IN (0, 1)),
        execution_id TEXT NOT NULL UNIQUE,
        args_digest TEXT NOT NULL,
        arguments TEXT,
        message_state TEXT NOT NULL CHECK (message_state = 'durable'),
        {_RESULT_DDL},
        retention_window DOUBLE PRECISION
            CHECK (retention_window IS NULL OR retention_window > 0),
        row_checksum TEXT NOT NULL,
        PRIMARY KEY (session_id, turn, slot))""",
    f"""CREATE TABLE approvals (
        execution_id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions (session_id),
        state TEXT NOT NULL CHECK (state IN ({_one_of(ApprovalState)})),
        row_checksum TEXT NOT NULL)""",
    f"""CREATE TABLE ledger (
        execution_id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions (session_id),
        status TEXT NOT NULL CHECK (status IN ({_one_of(LedgerStatus)})),
        attempt INTEGER NOT NULL CHECK (attempt >= 0),
        args_digest TEXT,
        "authorization" TEXT NOT NULL,
        {_RESULT_DDL},
        turn INTEGER,
        slot INTEGER,
        dispatched_at DOUBLE PRECISION,
        row_checksum TEXT NOT NULL)""",
    """CREATE TABLE audit (
        id BIGSERIAL PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions (session_id),
        execution_id TEXT NOT NULL,
        tool_call_id TEXT NOT NULL,
        turn INTEGER NOT NULL,
        slot INTEGER NOT NULL,
        kind TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        "authorization" TEXT NOT NULL,
        recovery_decision TEXT,
        inputs TEXT NOT NULL,
        note TEXT NOT NULL,
        recorded_at TEXT NOT NULL,
        row_checksum TEXT NOT NULL)""",
    "CREATE INDEX calls_open ON calls (session_id, turn, slot) WHERE result_kind IS NULL",
    "CREATE INDEX audit_by_session ON audit (session_id, id)",
    "CREATE INDEX audit_by_execution ON audit (execution_id)",
    """CREATE FUNCTION audit_append_only() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN RAISE EXCEPTION 'audit rows are append-only'; END $$""",
    """CREATE TRIGGER audit_no_update BEFORE UPDATE OR DELETE ON audit
        FOR EACH ROW EXECUTE FUNCTION audit_append_only()""",
)

_INDEXES: Final = frozenset({"calls_open", "audit_by_session", "audit_by_execution"})


class _Rows(RowDecoder):
    """The shared row decoders (:mod:`toolledger._core.rows`), failing closed with
    PostgreSQL's wording.  Decoding is shared on purpose: both stores accept
    exactly the same rows."""

    def __init__(self, where: str) -> None:
        self.where = where

    def _corrupt(self, what: str) -> StoreCorrupt:
        return StoreCorrupt(
            f"{self.where} is not a usable toolledger store: {what}. Nothing was executed "
            "or written. Restore the database from a backup, or point the store at another "
            "schema to start an empty one.",
            path=self.where,
        )


Fetch = Callable[[str, Sequence[object]], list[tuple[Any, ...]]]
"""Runs one statement in the opening transaction and returns its rows."""


def _unsupported(where: str, what: str, found: int | None) -> UnsupportedSchema:
    return UnsupportedSchema(
        f"{where} {what} Nothing was executed or written.",
        path=where,
        found=found,
        supported=SCHEMA_VERSION,
    )


def _check_tables(fetch: Fetch, schema: str, tables: set[str], errors: _Rows) -> None:
    """Check the tables of an existing store in ``schema`` (never writing).

    :class:`~toolledger._core.stores.UnsupportedSchema` for another store or
    another version, :class:`~toolledger._core.stores.StoreCorrupt` (worded
    by ``errors``) for a table, index or trigger that is not this version's.
    """
    where = errors.where
    if "meta" not in tables:
        raise _unsupported(
            where,
            f"holds tables ({', '.join(sorted(tables))}) but is not a toolledger store: "
            "point the store at its own schema.",
            None,
        )
    rows = fetch("SELECT application, schema_version FROM meta", ())
    if len(rows) != 1 or rows[0][0] != APPLICATION or not isinstance(rows[0][1], int):
        raise errors._corrupt(f"its meta table holds {rows!r}, not one schema version")
    version: int = rows[0][1]
    if version != SCHEMA_VERSION:
        raise _unsupported(
            where,
            f"has toolledger schema version {version}; this toolledger reads version "
            f"{SCHEMA_VERSION} only. "
            + (
                "It was written by a newer toolledger: open it with that version "
                "(upgrade toolledger)."
                if version > SCHEMA_VERSION
                else "No migration from that version exists: open it with the "
                "toolledger that wrote it."
            ),
            version,
        )
    for table, expected in _COLUMNS.items():
        found = tuple(
            str(r[0])
            for r in fetch(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
                (schema, table),
            )
        )
        if found != expected:
            raise errors._corrupt(
                f"table {table} has columns {found or '(none: it is missing)'}, "
                f"schema version {SCHEMA_VERSION} has {expected}"
            )
    indexes = {
        str(r[0])
        for r in fetch("SELECT indexname FROM pg_indexes WHERE schemaname = %s", (schema,))
    }
    triggers = {
        str(r[0])
        for r in fetch(
            "SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = 'audit' AND t.tgenabled <> 'D'",
            (schema,),
        )
    }
    missing = sorted((_INDEXES - indexes) | ({"audit_no_update"} - triggers))
    if missing:
        raise errors._corrupt(f"its indexes or triggers {', '.join(missing)} are missing")
