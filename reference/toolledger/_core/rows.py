"""The stores' shared row layout: table columns, checksums, row codec.

Private module of :mod:`toolledger`: import the public names from ``toolledger``.

:class:`~toolledger._core.sqlite_store.SqliteStore` and
:class:`~toolledger._core.postgres_store.PostgresStore` keep the same five
tables (``sessions``, ``calls``, ``approvals``, ``ledger``, ``audit``) with the
same checksummed columns, and accept exactly the same rows: this module holds
that shared part once.  The checksummed columns of each table (``_DATA``), its
key (``_KEY``), the row checksum (``_checksum``), the encoding of a record and
a result into columns, and :class:`RowDecoder`, which decodes a stored row
into the protocol's values and fails closed: an unexpected value is
corruption (``StoreCorrupt``, worded by each store), never a default.
Each store keeps its own DDL, connections and transactions.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, Final, TypeVar

from .protocol import (
    Authorization,
    CallPosition,
    CallState,
    ExecutionRecord,
    InvalidInput,
    LedgerStatus,
    MessageState,
    RecoveryPolicy,
    ResultKind,
    Stage,
    ToolProfile,
    ToolResult,
    args_digest,
    derive_execution_id,
)
from .stores import AuditRow, CallView, StoreCorrupt

Row = dict[str, Any]
_E = TypeVar("_E", bound=StrEnum)


def _one_of(enum: type[StrEnum]) -> str:
    return ", ".join(f"'{m.value}'" for m in enum)


_RESULT: Final = ("result_kind", "result_content", "result_execution_id", "result_args_digest")

# The checksummed columns of each table, in order (``row_checksum`` follows).
_DATA: Final[Mapping[str, tuple[str, ...]]] = {
    "sessions": ("session_id", "marker", "max_attempts", "epoch"),
    "calls": (
        "session_id", "turn", "slot", "tool_call_id", "tool_name", "policy",
        "requires_approval", "execution_id", "args_digest", "arguments", "message_state",
        *_RESULT, "retention_window",
    ),
    "approvals": ("execution_id", "session_id", "state"),
    "ledger": (
        "execution_id", "session_id", "status", "attempt", "args_digest", "authorization",
        *_RESULT, "turn", "slot", "dispatched_at",
    ),
    "audit": (
        "session_id", "execution_id", "tool_call_id", "turn", "slot", "kind", "attempt",
        "authorization", "recovery_decision", "inputs", "note", "recorded_at",
    ),
}  # fmt: skip
_KEY: Final[Mapping[str, tuple[str, ...]]] = {
    "sessions": ("session_id",),
    "calls": ("session_id", "turn", "slot"),
    "approvals": ("execution_id",),
    "ledger": ("execution_id",),
    "audit": ("id",),
}

_RESULT_DDL: Final = (
    f"result_kind TEXT CHECK (result_kind IS NULL OR result_kind IN ({_one_of(ResultKind)})),"
    " result_content TEXT, result_execution_id TEXT, result_args_digest TEXT"
)


_COMPACT: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
"""``json.dumps(..., ensure_ascii=False, separators=(",", ":"))`` without building an
encoder per call (the same text)."""


def _checksum(table: str, row: Mapping[str, Any]) -> str:
    values = tuple(row[c] for c in _DATA[table])
    # The types are part of the key: 1, 1.0 and True are equal as keys but
    # encode differently ("1", "1.0", "true"), so each gets its own checksum.
    return _checksum_of(table, values, tuple(map(type, values)))


@functools.lru_cache(maxsize=4096)
def _checksum_of(table: str, values: tuple[Any, ...], _types: tuple[type, ...]) -> str:
    """The checksum of a row's values, remembered: a commit checks the checksum of
    the record it replaces, which the commit that wrote it (or the read that
    checked it) already computed (bench_bytes: ~10 checksums per protected call)."""
    text = _COMPACT.encode([table, *values])
    return hashlib.sha256(text.encode()).hexdigest()


def _result_values(result: ToolResult | None) -> Row:
    if result is None:
        return dict.fromkeys(_RESULT)
    return dict(
        zip(
            _RESULT,
            (result.kind.value, result.content, result.execution_id, result.args_digest),
            strict=True,
        )
    )


def _record_values(session_id: str, rec: ExecutionRecord) -> Row:
    turn, slot = rec.position if rec.position is not None else (None, None)
    return {
        "execution_id": rec.execution_id,
        "session_id": session_id,
        "status": rec.status.value,
        "attempt": rec.attempt,
        "args_digest": rec.args_digest,
        "authorization": rec.authorization.value,
        **_result_values(rec.result),
        "turn": turn,
        "slot": slot,
        "dispatched_at": rec.dispatched_at,
    }


class RowDecoder:
    """Decodes stored rows into the protocol's values; each store words ``_corrupt``."""

    def _corrupt(self, what: str) -> StoreCorrupt:
        raise NotImplementedError  # each store says which file or database is corrupt

    def _decode_call(self, session_id: str, r: Row) -> CallState:
        where = f"calls[{session_id!r}, {r['turn']!r}, {r['slot']!r}]"
        turn, slot = _int(r["turn"], where, self), _int(r["slot"], where, self)
        tool_call_id = _text(r["tool_call_id"], f"{where}.tool_call_id", self, empty=True)
        if r["requires_approval"] not in (0, 1):
            raise self._corrupt(f"{where}.requires_approval is {r['requires_approval']!r}")
        try:
            tool = ToolProfile(
                _text(r["tool_name"], f"{where}.tool_name", self),
                _enum(RecoveryPolicy, r["policy"], f"{where}.policy", self),
                bool(r["requires_approval"]),
                _seconds(r["retention_window"], f"{where}.retention_window", self),
            )
        except InvalidInput as exc:
            raise self._corrupt(f"{where}: {exc}") from exc
        execution_id = _text(r["execution_id"], f"{where}.execution_id", self)
        if execution_id != derive_execution_id(session_id, turn, slot, tool_call_id):
            raise self._corrupt(
                f"{where}.execution_id {execution_id!r} is not the id derived from the call's "
                "position and tool_call_id"
            )
        digest = _text(r["args_digest"], f"{where}.args_digest", self)
        if r["arguments"] is not None:
            arguments = _json_object(r["arguments"], f"{where}.arguments", self)
            if args_digest(tool.name, arguments) != digest:
                raise self._corrupt(f"{where}.arguments do not match the call's args_digest")
        if r["message_state"] != MessageState.DURABLE.value:
            raise self._corrupt(f"{where}.message_state is {r['message_state']!r}")
        result = _decode_result(r, where, self)
        stage = Stage.RESUME if result is None else Stage.NONE
        return CallState(
            (turn, slot), tool_call_id, tool, execution_id, digest, MessageState.DURABLE,
            result, stage,
        )  # fmt: skip

    def _decode_record(self, r: Row) -> ExecutionRecord:
        where = f"ledger[{r['execution_id']!r}]"
        position: CallPosition | None = None
        if r["turn"] is not None or r["slot"] is not None:
            turn = _int(r["turn"], f"{where}.turn", self)
            position = (turn, _int(r["slot"], f"{where}.slot", self))
        return ExecutionRecord(
            _text(r["execution_id"], where, self),
            _enum(LedgerStatus, r["status"], f"{where}.status", self),
            _int(r["attempt"], f"{where}.attempt", self),
            None if r["args_digest"] is None else _text(r["args_digest"], where, self),
            _enum(Authorization, r["authorization"], f"{where}.authorization", self),
            _decode_result(r, where, self),
            position,
            _seconds(r["dispatched_at"], f"{where}.dispatched_at", self),
        )

    def _decode_audit(self, session_id: str, r: Row) -> AuditRow:
        where = f"audit[{r['id']!r}]"
        try:
            return AuditRow(
                session_id=session_id,
                execution_id=r["execution_id"],
                tool_call_id=r["tool_call_id"],
                position=(r["turn"], r["slot"]),
                kind=r["kind"],
                attempt=r["attempt"],
                authorization=r["authorization"],
                recovery_decision=r["recovery_decision"],
                inputs=_json_object(r["inputs"], f"{where}.inputs", self),
                note=r["note"],
            )
        except InvalidInput as exc:
            raise self._corrupt(f"{where}: {exc}") from exc


def _text(value: object, where: str, store: RowDecoder, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not empty):
        raise store._corrupt(f"{where} is {value!r}, not a {'' if empty else 'non-empty '}string")
    return value


def _seconds(value: object, where: str, store: RowDecoder) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise store._corrupt(f"{where} is {value!r}, not a number of seconds")
    return float(value)


def _int(value: object, where: str, store: RowDecoder, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise store._corrupt(f"{where} is {value!r}, not an integer >= {minimum}")
    return value


def _enum(enum: type[_E], value: object, where: str, store: RowDecoder) -> _E:
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        return enum(value)
    except ValueError:
        raise store._corrupt(f"{where} is {value!r}, not one of {_one_of(enum)}") from None


def _json_object(value: object, where: str, store: RowDecoder) -> dict[str, Any]:
    try:
        decoded = json.loads(_text(value, where, store))
    except json.JSONDecodeError as exc:
        raise store._corrupt(f"{where} is not valid JSON ({exc})") from exc
    if not isinstance(decoded, dict):
        raise store._corrupt(f"{where} is JSON but not an object")
    return decoded


def _decode_result(r: Row, where: str, store: RowDecoder) -> ToolResult | None:
    kind, content, execution_id, digest = (r[c] for c in _RESULT)
    if kind is None:
        if (content, execution_id, digest) != (None, None, None):
            raise store._corrupt(f"{where} has result columns but no result kind")
        return None
    return ToolResult(
        _enum(ResultKind, kind, f"{where}.result_kind", store),
        _text(execution_id, f"{where}.result_execution_id", store),
        _text(digest, f"{where}.result_args_digest", store, empty=True),
        _text(content, f"{where}.result_content", store, empty=True),
    )


def stored_difference(
    found: Sequence[Any] | None, session_id: str, seen: CallView
) -> str | None:
    """What of the call ``seen`` describes differs from the stored row ``found``.

    ``found`` is the one row both stores' ``_differs`` select in their own SQL
    dialect: the call's execution id, its result columns, its ledger record's
    checksum, its approval's state and its audit rows' ``kind attempt`` keys
    joined by commas (``None``: no such call).  A damaged row can only make
    them differ, i.e. refuse the commit.
    """
    if found is None or found[0] != seen.execution_id:
        return "it is no longer a durable call of the session"
    result, (record, approval, keys) = tuple(found[1:5]), found[5:]
    audit: set[tuple[str, int]] = set()
    for key in keys.split(",") if keys else ():
        kind, _, attempt = key.rpartition(" ")
        audit.add((kind, int(attempt) if attempt.isdigit() else -1))
    expected = (
        None
        if seen.record is None
        else _checksum("ledger", _record_values(session_id, seen.record))
    )
    return seen.difference(
        audit=frozenset(audit),
        record=record == expected,
        approval=approval == (None if seen.approval is None else seen.approval.value),
        result=result == tuple(_result_values(seen.result).values()),
    )
