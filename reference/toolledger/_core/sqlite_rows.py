"""SqliteStore's row layer: checked reads, checksummed writes, a session's state from rows.

Private module of :mod:`toolledger`: :class:`SqliteRows` is the half of
:class:`~toolledger._core.sqlite_store.SqliteStore` that turns rows of an open
connection into the protocol's values and back, inside whatever transaction
the store opened: every row read is checked against its checksum
(``_select``), every row written gets one (``_insert``, ``_update``), a
commit's compare-and-set reads what it compares in one statement
(``_differs``), and a session's state (whole, or only its working set) is
assembled from the rows its calls own.  Opening, transactions, the port's
public methods and the writes of one commit stay in ``sqlite_store``; the
columns and checksums shared with PostgreSQL are in :mod:`toolledger._core.rows`.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Sequence
from typing import Final

from .protocol import ApprovalState, CallState, SessionState
from .rows import (
    _DATA,
    _KEY,
    Row,
    RowDecoder,
    _checksum,
    _enum,
    stored_difference,
)
from .sqlite_schema import _COLUMNS, _RECORD_COLUMNS
from .state import stored_approval_digests
from .stores import CallView

__all__ = ["SqliteRows"]

_IN_CHUNK: Final = 500  # execution ids per ``IN (...)`` query


class SqliteRows(RowDecoder):
    """The row layer of :class:`~toolledger._core.sqlite_store.SqliteStore` (see the module doc)."""

    def _session_row(self, conn: sqlite3.Connection, session_id: str) -> tuple[int, int]:
        raise NotImplementedError  # the store reads it (and words an unknown session)

    # -- rows: every read verifies the checksum, every write sets it ----------------

    def _select(
        self, conn: sqlite3.Connection, table: str, where: str, params: Sequence[object]
    ) -> list[Row]:
        columns = _COLUMNS[table]
        rows = []
        for values in conn.execute(_select_sql(table, where), params):
            row = dict(zip(columns, values, strict=True))
            if table == "calls":
                row.update(_unpacked_result(row))
            try:
                ok = row["row_checksum"] == _checksum(table, row)
            except (TypeError, ValueError):
                ok = False  # a value of a type this store never writes
            if not ok:
                key = ", ".join(f"{k}={row[k]!r}" for k in _KEY[table])
                raise self._corrupt(
                    f"the {table} row ({key}) does not match its checksum: its content was "
                    "altered or damaged on disk"
                )
            if table == "calls":
                self._record_row(row)  # the record it holds is checked too
            rows.append(row)
        return rows

    def _record_row(self, call: Row) -> Row | None:
        """The execution record a ``calls`` row holds, as a ``ledger`` row (None: no record).

        Checked against ``record_checksum`` (the record's own checksum, the
        one PostgreSQL's ``ledger`` row has): a record column set without a
        checksum, or a checksum that does not match, is corruption.
        """
        row: Row = {"execution_id": call["execution_id"], "session_id": call["session_id"]}
        row.update((ledger, call[column]) for ledger, column in _RECORD_COLUMNS)
        if row["row_checksum"] is None:
            if any(call[c] is not None for _, c in _RECORD_COLUMNS):
                raise self._corrupt(
                    f"the calls row ({call['session_id']!r}, {call['turn']!r}, "
                    f"{call['slot']!r}) has record columns but no record_checksum: its "
                    "content was altered or damaged on disk"
                )
            return None
        row.update(_unpacked(call, row))
        try:
            ok = row["row_checksum"] == _checksum("ledger", row)
        except (TypeError, ValueError):
            ok = False  # a value of a type this store never writes
        if not ok:
            raise self._corrupt(
                f"the ledger record of execution {call['execution_id']!r} (in the calls row "
                f"({call['session_id']!r}, {call['turn']!r}, {call['slot']!r})) does not "
                "match its checksum: its content was altered or damaged on disk"
            )
        return row

    def _insert(self, conn: sqlite3.Connection, table: str, row: Row,
                unchecked: Row | None = None) -> None:
        """Insert ``row`` with its checksum; ``unchecked``: columns outside the row
        checksum written by the same statement (a call's record, which has its own)."""
        extra = unchecked or {}
        stored = {**row, **_packed_result(row)} if table == "calls" else row
        conn.execute(
            _insert_sql(table, tuple(extra)),
            (*[stored[c] for c in _DATA[table]], _checksum(table, row), *extra.values()),
        )

    def _update(self, conn: sqlite3.Connection, table: str, current: Row, changes: Row,
                unchecked: Row | None = None) -> None:
        """Set ``changes`` and the new checksum of ``current``'s row; ``unchecked``:
        columns outside the row checksum set by the same statement."""
        extra = unchecked or {}
        new = {**current, **changes}
        stored = {**new, **_packed_result(new)} if table == "calls" else new
        conn.execute(
            _update_sql(table, tuple(changes), tuple(extra)),
            (*(stored[c] for c in changes), _checksum(table, new), *extra.values(),
             *(current[k] for k in _KEY[table])),
        )

    def _differs(self, conn: sqlite3.Connection, session_id: str, seen: CallView) -> str | None:
        """What of the call ``seen`` describes differs from what is stored: one statement.

        Compared without decoding the rows (every commit pays for it): the
        record by its checksum, the approval, the result columns and the
        ``(kind, attempt)`` of the call's audit rows.  A damaged row can only
        make them differ, i.e. refuse the commit.
        """
        found = conn.execute(
            "SELECT c.execution_id, c.result_kind, c.result_content, "
            # stored NULL when the result repeats the call's own (``_packed_result``)
            "coalesce(c.result_execution_id, "
            "CASE WHEN c.result_kind IS NOT NULL THEN c.execution_id END), "
            "coalesce(c.result_args_digest, "
            "CASE WHEN c.result_kind IS NOT NULL THEN c.args_digest END), "
            "c.record_checksum, "
            "(SELECT state FROM approvals WHERE execution_id = c.execution_id), "
            "(SELECT group_concat(kind || ' ' || attempt, ',') FROM audit "
            "WHERE session_id = c.session_id AND turn = c.turn AND slot = c.slot "
            "AND execution_id = c.execution_id) "
            "FROM calls AS c WHERE c.session_id = ? AND c.turn = ? AND c.slot = ?",
            (session_id, *seen.position),
        ).fetchone()
        return stored_difference(found, session_id, seen)

    def _load(self, conn: sqlite3.Connection, session_id: str) -> SessionState:
        marker, max_attempts = self._session_row(conn, session_id)
        rows = self._select(conn, "calls", "WHERE session_id = ?", (session_id,))
        return self._state(conn, session_id, marker, max_attempts, rows, whole=True)

    def _load_working_set(self, conn: sqlite3.Connection, session_id: str) -> SessionState:
        marker, max_attempts = self._session_row(conn, session_id)
        (last,) = conn.execute(
            "SELECT max(turn) FROM calls WHERE session_id = ?", (session_id,)
        ).fetchone()
        rows = self._select(
            conn, "calls", "WHERE session_id = ? AND result_kind IS NULL", (session_id,)
        )
        if last is not None:
            rows += self._select(
                conn,
                "calls",
                "WHERE session_id = ? AND turn = ? AND result_kind IS NOT NULL",
                (session_id, last),
            )
            rows.sort(key=lambda r: (r["turn"], r["slot"]))
        return self._state(conn, session_id, marker, max_attempts, rows)

    def _state(
        self,
        conn: sqlite3.Connection,
        session_id: str,
        marker: int,
        max_attempts: int,
        call_rows: list[Row],
        whole: bool = False,
    ) -> SessionState:
        """The state made of these calls and the approvals, records, audit keys they own."""
        calls = tuple(self._decode_call(session_id, r) for r in call_rows)
        eids = [c.execution_id for c in calls]
        approvals = {}
        for r in self._owned(conn, session_id, "approvals", eids):
            approvals[r["execution_id"]] = _enum(
                ApprovalState, r["state"], f"approvals[{r['execution_id']!r}].state", self
            )
        ledger = {}
        for c in call_rows:  # a call's row holds its record (schema 7)
            held = self._record_row(c)
            if held is not None:
                rec = self._decode_record(held)
                ledger[rec.execution_id] = rec
        audit = frozenset(
            self._decode_audit(session_id, r).key
            for r in self._owned_audit(conn, session_id, calls, whole)
        )
        return SessionState(
            session_id=session_id,
            marker=marker,
            max_attempts=max_attempts,
            calls=calls,
            approvals=approvals,
            approval_digests=stored_approval_digests(calls, approvals),
            ledger=ledger,
            audit=audit,
        )

    def _owned(
        self, conn: sqlite3.Connection, session_id: str, table: str, eids: Sequence[str]
    ) -> list[Row]:
        """The rows of ``table`` for these execution ids (by index), all of this session."""
        rows: list[Row] = []
        for i in range(0, len(eids), _IN_CHUNK):
            chunk = eids[i : i + _IN_CHUNK]
            marks = ", ".join("?" * len(chunk))
            rows += self._select(conn, table, f"WHERE execution_id IN ({marks})", chunk)
        for r in rows:
            if r["session_id"] != session_id:
                raise self._corrupt(
                    f"the {table} row of execution {r['execution_id']!r} names session "
                    f"{r['session_id']!r}, but that execution is a call of {session_id!r}"
                )
        return rows

    def _owned_audit(
        self, conn: sqlite3.Connection, session_id: str, calls: Sequence[CallState], whole: bool
    ) -> list[Row]:
        """The audit rows of these calls of the session: by ``audit_by_session``.

        The index is ``(session_id, turn, slot)`` (narrow entries: fewer pages
        per commit than an execution id's 37 bytes, bench_bytes), so the rows
        are found by the calls' positions, one query per turn, and kept if
        they name the call's execution id (others belong to no call:
        ``verify`` reports them).  ``whole``: these are all the session's
        calls, so all its audit rows are read in one query.
        """
        eids = {c.execution_id for c in calls}
        if whole:
            rows = self._select(conn, "audit", "WHERE session_id = ?", (session_id,))
        else:
            slots: dict[int, list[int]] = {}
            for c in calls:
                slots.setdefault(c.position[0], []).append(c.position[1])
            rows = []
            for turn, in_turn in slots.items():
                for i in range(0, len(in_turn), _IN_CHUNK):
                    chunk = in_turn[i : i + _IN_CHUNK]
                    marks = ", ".join("?" * len(chunk))
                    rows += self._select(
                        conn,
                        "audit",
                        f"WHERE session_id = ? AND turn = ? AND slot IN ({marks})",
                        (session_id, turn, *chunk),
                    )
        return [r for r in rows if r["execution_id"] in eids]


# A record mostly repeats its call: its arguments' digest, and once it has a
# result, the call's execution id, digest and result content.  Such a value is
# stored as NULL in the call's row and read back from the call's own column
# (bench_bytes: a call's row with its record must stay well under a page).
# The record's checksum is over its values, not over this encoding, so a
# damaged byte either way still fails its check.  A record's ``args_digest``
# is never empty (``_decode_record``), so '' stands for None.


def packed_record(call: CallState, values: Row) -> Row:
    """The ``calls`` columns (without ``record_checksum``) that store ``values`` in ``call``'s row.

    ``values`` is the record as a ``ledger`` row (``_record_values``); ``call``
    is the call as it is stored once the commit is done (results are written
    before records in a commit, and a stored result never changes).
    """
    out = {column: values[ledger] for ledger, column in _RECORD_COLUMNS[:-1]}
    digest = values["args_digest"]
    out["record_args_digest"] = (
        "" if digest is None else None if digest == call.args_digest else digest
    )
    if values["result_kind"] is not None:
        if values["result_execution_id"] == call.execution_id:
            out["record_result_execution_id"] = None
        if values["result_args_digest"] == call.args_digest:
            out["record_result_args_digest"] = None
        if call.result is not None and values["result_content"] == call.result.content:
            out["record_result_content"] = None
    return out


# The statements' texts, built once per shape (every commit sends the same few).


@functools.cache
def _select_sql(table: str, where: str) -> str:
    return (f"SELECT {', '.join(_COLUMNS[table])} FROM {table} {where} "
            f"ORDER BY {', '.join(_KEY[table])}")


@functools.cache
def _insert_sql(table: str, extra: tuple[str, ...]) -> str:
    columns = (*_DATA[table], "row_checksum", *extra)
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


@functools.cache
def _update_sql(table: str, changes: tuple[str, ...], extra: tuple[str, ...]) -> str:
    sets = (*changes, "row_checksum", *extra)
    return (f"UPDATE {table} SET {', '.join(f'{c} = ?' for c in sets)} "
            f"WHERE {' AND '.join(f'{k} = ?' for k in _KEY[table])}")


def _unpacked(call: Row, row: Row) -> Row:
    """The record's values that ``packed_record`` stored as references to the call's row."""
    out: Row = {}
    digest = row["args_digest"]
    out["args_digest"] = None if digest == "" else call["args_digest"] if digest is None else digest
    if row["result_kind"] is not None:
        for ledger, own in (
            ("result_execution_id", "execution_id"),
            ("result_args_digest", "args_digest"),
            ("result_content", "result_content"),
        ):
            if row[ledger] is None:
                out[ledger] = call[own]
    return out


# A call's result names the call's own execution id and digest (its
# ``result_execution_id`` / ``result_args_digest``): stored as NULL then, and
# read back from the call's columns.  The row's checksum is over the values.


def _packed_result(call: Row) -> Row:
    """The stored values of a ``calls`` row's result columns (see above)."""
    out: Row = {}
    if call["result_kind"] is not None:
        if call["result_execution_id"] == call["execution_id"]:
            out["result_execution_id"] = None
        if call["result_args_digest"] == call["args_digest"]:
            out["result_args_digest"] = None
    return out


def _unpacked_result(stored: Row) -> Row:
    """The values of a ``calls`` row's result columns from what ``_packed_result`` stored."""
    out: Row = {}
    if stored["result_kind"] is not None:
        if stored["result_execution_id"] is None:
            out["result_execution_id"] = stored["execution_id"]
        if stored["result_args_digest"] is None:
            out["result_args_digest"] = stored["args_digest"]
    return out
