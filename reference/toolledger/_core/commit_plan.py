"""What every store shares: the audit rows it appends and the checked plan of a commit.

Private module of :mod:`toolledger`: import the public names from ``toolledger``
(:mod:`toolledger._core.stores` re-exports every name here).  A store decides
nothing: :func:`plan_commit` checks a commit (``before`` -> ``after`` plus its
audit rows and arguments) against the protocol and says exactly what it writes,
in write order (:class:`CommitPlan`); each store then writes that plan in one
transaction.  :func:`durable_projection` and :func:`working_set` are what a
restarted engine sees and what a :class:`~toolledger._core.ledger.Ledger` keeps
in memory (see :mod:`toolledger._core.stores`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from .protocol import (
    Action,
    ApprovalState,
    AuditKey,
    Authorization,
    CallPosition,
    CallState,
    Decision,
    Event,
    ExecutionRecord,
    InvalidInput,
    MessageState,
    SessionState,
    Stage,
    ToolResult,
    apply,
    args_digest,
    derive_execution_id,
    durable_changes,
    new_session,
)
from .store_errors import StaleState

__all__ = [
    "RELOAD",
    "AuditRow",
    "CallView",
    "CommitPlan",
    "arguments_json",
    "call_view",
    "check_new_session",
    "durable_projection",
    "last_durable_turn",
    "plan_commit",
    "working_set",
]


# --------------------------------------------------------------------------
# Audit rows
# --------------------------------------------------------------------------

_DECISIONS: Final = frozenset(d.value for d in Decision)


_FROZEN: Final = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _frozen_json(value: Mapping[str, Any], what: str) -> str:
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{what} must be a JSON object (a dict), got {type(value).__name__}")
    bad = [k for k in value if not isinstance(k, str)]
    if bad:
        raise InvalidInput(f"{what} must have string keys, got {bad[0]!r}: use str keys")
    try:
        return _FROZEN.encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(
            f"{what} is not JSON-serializable ({exc}): pass plain str/int/float/bool/None, "
            "lists and dicts"
        ) from exc


def arguments_json(arguments: Mapping[str, Any]) -> str:
    """The canonical text a store keeps for a call's arguments (key order kept)."""
    return _frozen_json(arguments, "the call's arguments")


def _check_nonneg(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"{name} must be a non-negative int, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One append-only row of the audit log.

    ``(execution_id, kind, attempt)`` is the protocol's audit key
    (:data:`~toolledger._core.protocol.AuditKey`); the other fields let anyone tie
    the row to its call and recompute a decision: ``kind`` is ``"dispatch"``,
    a recovery decision (``"reconstruct"``, ``"retry_same_id"``,
    ``"reconcile"``, ``"recovery_required"``, ``"execute"``), a reconcile
    outcome (``"reconcile_applied"``, ``"reconcile_not_applied"``,
    ``"reconcile_unknown"``), a human resolution (``"human_applied"``,
    ``"human_retry"``, ``"human_abandon"``), or one of the facade's rows with no
    spec action: ``"superseded"``, ``"same_call"``, an approval's ``"approved"``,
    ``"rejected"``, ``"approval_expired"`` (``attempt``: the approval's round;
    docs/protocol.md#approvals-that-expire); ``recovery_decision`` is the
    recovery decision the row belongs to (``None`` for a first, live
    attempt); ``inputs`` is a JSON object, for decisions
    :meth:`~toolledger._core.protocol.RecoveryInputs.as_dict`.

    ``inputs`` is copied on construction (through JSON), so mutating the dict
    passed in, or the one read back, changes no stored row.
    """

    session_id: str
    execution_id: str
    tool_call_id: str
    position: CallPosition
    kind: str
    attempt: int
    authorization: Authorization
    recovery_decision: str | None
    inputs: dict[str, Any] = field(default_factory=dict, hash=False)
    note: str = ""

    def __post_init__(self) -> None:
        for name in ("session_id", "execution_id", "kind"):
            value: object = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise InvalidInput(f"audit row {name} must be a non-empty string, got {value!r}")
        tool_call_id: object = self.tool_call_id
        if not isinstance(tool_call_id, str):
            raise InvalidInput(
                f"audit row tool_call_id must be a string ('' if the provider gave none), "
                f"got {tool_call_id!r}"
            )
        position: object = self.position
        if not isinstance(position, tuple | list) or len(position) != 2:
            raise InvalidInput(f"audit row position must be (turn, slot), got {position!r}")
        turn = _check_nonneg("audit row turn", position[0])
        slot = _check_nonneg("audit row slot", position[1])
        object.__setattr__(self, "position", (turn, slot))
        _check_nonneg("audit row attempt", self.attempt)
        auth: object = self.authorization
        if not isinstance(auth, Authorization):
            try:
                object.__setattr__(self, "authorization", Authorization(str(auth)))
            except ValueError:
                valid = ", ".join(a.value for a in Authorization)
                raise InvalidInput(
                    f"audit row authorization {auth!r} is not one of: {valid}"
                ) from None
        decision: object = self.recovery_decision
        if decision is not None and decision not in _DECISIONS:
            raise InvalidInput(
                f"audit row recovery_decision {decision!r} is not a recovery decision; "
                f"use None or one of: {', '.join(sorted(_DECISIONS))}"
            )
        if isinstance(decision, Decision):
            object.__setattr__(self, "recovery_decision", decision.value)
        note: object = self.note
        if not isinstance(note, str):
            raise InvalidInput(f"audit row note must be a string, got {type(note).__name__}")
        text = _frozen_json(self.inputs, "audit row inputs")
        object.__setattr__(self, "inputs", json.loads(text))

    @property
    def key(self) -> AuditKey:
        """The protocol's audit key of this row."""
        return (self.execution_id, self.kind, self.attempt)

    def inputs_json(self) -> str:
        """``inputs`` as the compact JSON text a store keeps."""
        return _frozen_json(self.inputs, "audit row inputs")

    @property
    def by(self) -> str | None:
        """Who gave the human answer this row records (``resolve(..., by=...)``,
        ``approve(..., by=...)``, ``reject(..., by=...)``), if named.

        Kept in the ``note`` column as a structured note (:func:`attributed_note`):
        the stores' schema is unchanged, and the audit's mapping to the spec
        (``toolledger.check.mapping``) reads only its key and inputs."""
        return _parse_note(self.note)[0]

    @property
    def human_note(self) -> str:
        """``note`` without the attribution :attr:`by` (the text a human gave, or the default)."""
        return _parse_note(self.note)[1]

    @property
    def expires_at(self) -> float | None:
        """Until when the approval this row records holds (seconds since the epoch;
        ``approve(..., expires_at=...)`` or the session's ``approval_ttl``), if it expires.
        In the structured note too (docs/protocol.md#approvals-that-expire)."""
        return _parse_note(self.note)[2]


def attributed_note(note: str, by: str | None, *, expires_at: float | None = None) -> str:
    """The ``note`` of a human's audit row naming who gave it (``by``; None: nobody named).

    With ``by`` (or ``expires_at``, an approval's end), the JSON object ``{"by": ...,
    "note": ...}`` (and ``"expires_at"``).  A plain note that could be read as one
    (it starts with ``{``) is wrapped the same way with ``"by": null``, so a note
    can never pass itself off as an attribution."""
    if by is not None and (not isinstance(by, str) or not by.strip() or not by.isprintable()):
        raise InvalidInput(f"by must name who answered (a non-empty printable string), "
                           f"got {by!r}; nothing was written")
    if not isinstance(note, str):
        raise InvalidInput(f"note must be a string, got {type(note).__name__}")
    if expires_at is not None:
        expires_at = check_expiry(expires_at)
        return json.dumps({"by": by, "expires_at": expires_at, "note": note},
                          ensure_ascii=False, sort_keys=True)
    if by is None and not note.lstrip().startswith("{"):
        return note
    return json.dumps({"by": by, "note": note}, ensure_ascii=False, sort_keys=True)


def check_expiry(value: object, what: str = "expires_at") -> float:
    """``value`` as an expiry time (seconds since the epoch, finite), or InvalidInput."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"{what} must be a time in seconds since the epoch (a finite "
                           f"number, as the session's clock gives), got {value!r}; nothing "
                           "was written")
    return float(value)


def _parse_note(note: str) -> tuple[str | None, str, float | None]:
    if not note.lstrip().startswith("{"):
        return None, note, None
    try:
        value = json.loads(note)
    except ValueError:
        return None, note, None
    if (not isinstance(value, dict) or set(value) - {"expires_at"} != {"by", "note"}
            or not isinstance(value["note"], str)
            or not (value["by"] is None or isinstance(value["by"], str))):
        return None, note, None
    expires = value.get("expires_at")
    if expires is not None and (isinstance(expires, bool)
                                or not isinstance(expires, int | float)):
        return None, note, None
    return value["by"], value["note"], None if expires is None else float(expires)


# --------------------------------------------------------------------------
# Shared by every store: the durable projection and the commit plan
# --------------------------------------------------------------------------

_CRASH: Final = Event(Action.Crash)


def durable_projection(state: SessionState) -> SessionState:
    """What survives a crash of the engine holding ``state``.

    This is the core's own ``Crash`` transition: volatile calls vanish,
    every durable call without a result is at ``RESUME``, the others at
    ``NONE``; approvals, ledger, audit keys and marker stay.  Which key
    retention windows have passed is the clock's, not the store's: a ledger
    recomputes it from the records' dispatch times (``retention_passed`` is
    empty here).
    """
    return replace(apply(state, _CRASH), retention_passed=frozenset())


def last_durable_turn(state: SessionState) -> int | None:
    """The highest turn holding a durable call (``None``: no durable call)."""
    turns = [c.position[0] for c in state.calls if c.message is MessageState.DURABLE]
    return max(turns) if turns else None


def working_set(state: SessionState) -> SessionState:
    """The part of a session an engine needs to go on: what a Ledger keeps in memory.

    Every call without a result (volatile or durable), every call of the last
    durable turn (the engine's resume reconciles that turn with the
    conversation), and the approvals, ledger records and audit keys of those
    calls; marker and max_attempts.  Every other call is settled: it has its
    result and, being answered, sits at stage ``NONE``; no transition of the
    core reads it except ``ProviderEmitCall``'s check that its position is
    free.  ``working_set`` commutes with :func:`durable_projection`.
    """
    last = last_durable_turn(state)
    calls = tuple(c for c in state.calls if c.result is None or c.position[0] == last)
    if len(calls) == len(state.calls):
        return state
    return only_calls(state, calls)


def only_calls(state: SessionState, calls: tuple[CallState, ...]) -> SessionState:
    """``state`` with just ``calls`` and the approvals, records and audit keys they own."""
    eids = {c.execution_id for c in calls}
    return replace(
        state,
        calls=calls,
        approvals={k: v for k, v in state.approvals.items() if k in eids},
        approval_digests={k: v for k, v in state.approval_digests.items() if k in eids},
        ledger={k: v for k, v in state.ledger.items() if k in eids},
        audit=frozenset(k for k in state.audit if k[0] in eids),
    )


RELOAD: Final = (
    "the durable state must be read again before deciding: a Session has reloaded it "
    "already, so call recover() and act on what it returns (a bare Ledger: call "
    "Ledger.reload(), what a restarted engine reads)"
)
"""How every error that asks for a reload says it: what a Session user does (the
Session reloads after any failed commit, session_guard.py) and the method a
bare :class:`~toolledger._core.ledger.Ledger` user calls."""
_CREATED_SINCE: Final = (
    "session {session_id!r} was created by another engine since this one opened it (this "
    "commit was to create it): nothing was written; " + RELOAD
)


@dataclass(frozen=True, slots=True)
class CallView:
    """The durable state of one call that a decision about it reads.

    Its result, its ledger record, its approval (``None``: absent) and the
    ``(kind, attempt)`` of its audit keys: every input of
    :func:`~toolledger._core.protocol.recovery_inputs` that can change, plus the
    decisions already made.  A commit compares these, as its ``before``
    has them, with what is stored (:meth:`CommitPlan.check_session`).
    """

    execution_id: str
    position: CallPosition
    result: ToolResult | None
    record: ExecutionRecord | None
    approval: ApprovalState | None
    audit: frozenset[tuple[str, int]]

    def difference(
        self,
        *,
        audit: frozenset[tuple[str, int]],
        record: bool,
        approval: bool,
        result: bool,
    ) -> str | None:
        """What differs from the stored call, for the error message; ``None``: nothing.

        ``audit`` is the stored call's audit keys; ``record``, ``approval``
        and ``result`` say whether the stored one equals this view's.
        """
        parts = []
        if audit != self.audit:
            new = sorted(audit - self.audit)
            parts.append(f"audit keys written since: {new}" if new else "its audit keys differ")
        for what, same in (("record", record), ("approval", approval), ("result", result)):
            if not same:
                parts.append(f"its {what} differs")
        return "; ".join(parts) or None


def call_view(state: SessionState, call: CallState) -> CallView:
    """:class:`CallView` of ``call`` in ``state``."""
    eid = call.execution_id
    return CallView(
        eid,
        call.position,
        call.result,
        state.ledger.get(eid),
        state.approvals.get(eid),
        frozenset((kind, attempt) for e, kind, attempt in state.audit if e == eid),
    )


@dataclass(frozen=True, slots=True)
class CommitPlan:
    """What one commit writes, checked and in write order.

    ``new_calls``: calls that become durable, with their arguments JSON (or
    ``None``); ``results``: durable calls whose result changes, with the result
    they had before (for the stale check); ``approvals``: (execution id, state
    before or ``None`` if absent, state after); ``records``: (record before or
    ``None``, record after); ``audit_rows``: the rows to append; ``guards``:
    the durable state, as ``before`` has it, of every already durable call the
    commit writes anything for (a result, an approval, a record or an audit
    row): what the transition was decided on.
    """

    new_calls: tuple[tuple[CallState, str | None], ...]
    results: tuple[tuple[CallState, CallState], ...]
    approvals: tuple[tuple[str, ApprovalState | None, ApprovalState], ...]
    records: tuple[tuple[ExecutionRecord | None, ExecutionRecord], ...]
    audit_rows: tuple[AuditRow, ...]
    guards: tuple[CallView, ...] = ()

    @property
    def empty(self) -> bool:
        """Nothing to write: no transaction happens and nothing is counted."""
        return not (
            self.new_calls or self.results or self.approvals or self.records or self.audit_rows
        )

    @property
    def writes_ledger(self) -> bool:
        """Whether the commit writes a ledger record (counted in ``ledger_commits``)."""
        return bool(self.records)

    def check_session(
        self,
        session_id: str,
        stored: tuple[int, int],
        after: SessionState,
        differs: Callable[[CallView], str | None],
    ) -> None:
        """Raise :class:`StaleState` unless what the commit was decided on is still stored.

        ``stored`` is the session's marker and max_attempts as the store holds
        them; ``differs(view)`` compares, inside the commit's transaction, a
        call's :class:`CallView` as ``before`` has it with what is stored, and
        says what differs (``None``: nothing; see :meth:`CallView.difference`).
        The compare-and-set covers EVERY commit, audit-only ones included: a
        ``Recover`` whose decision only adds an audit row must be refused when
        another engine has decided (or acted) on the call since this engine
        loaded it, or two engines each record a decision for one attempt.  The
        writers' own checks of what they replace stay as a second line.
        """
        if stored != (after.marker, after.max_attempts):
            raise StaleState(
                f"session {session_id!r} is stored with marker/max_attempts "
                f"{stored[0]}/{stored[1]}, the state committed has "
                f"{after.marker}/{after.max_attempts}: {RELOAD}"
            )
        for seen in self.guards:
            why = differs(seen)
            if why is not None:
                raise StaleState(
                    f"call {seen.position} of session {session_id!r} changed since this "
                    f"engine loaded it ({why}): another engine acted on it; nothing was "
                    f"written; {RELOAD}"
                )

    def write(
        self,
        *,
        call: Callable[[CallState, str | None], None],
        result: Callable[[CallState, CallState], None],
        approval: Callable[[str, ApprovalState | None, ApprovalState], None],
        record: Callable[[ExecutionRecord | None, ExecutionRecord], None],
        audit: Callable[[AuditRow], None],
    ) -> None:
        """Hand every write of the plan, in write order, to a store's writers.

        Each writer checks that what it replaces is what the plan says was
        there (else :class:`StaleState`) and writes; the store makes the whole
        sequence one transaction.
        """
        for c, text in self.new_calls:
            call(c, text)
        for old, new in self.results:
            result(old, new)
        for eid, was, now in self.approvals:
            approval(eid, was, now)
        for old_rec, rec in self.records:
            record(old_rec, rec)
        for row in self.audit_rows:
            audit(row)


def plan_commit(
    session_id: str,
    before: SessionState,
    after: SessionState,
    audit_rows: Sequence[AuditRow],
    arguments: Mapping[CallPosition, Mapping[str, Any]] | None = None,
) -> CommitPlan:
    """Check a commit and say exactly what it writes; raises ``InvalidInput``.

    Checked: both states belong to ``session_id`` and agree on marker and
    max_attempts; nothing durable disappears; a durable call never changes
    anything but gaining its result; a new call carries the derived execution
    id; every
    new audit key has a row (``AuditComplete``: the row is written with the
    transition it describes) and every row's key is an audit key of ``after``
    and names the call that has that execution id; arguments are given only
    for calls that become durable here, and match their digest.
    """
    for name, st in (("before", before), ("after", after)):
        if not isinstance(st, SessionState):
            raise InvalidInput(f"{name} must be a SessionState, got {type(st).__name__}")
        if st.session_id != session_id:
            raise InvalidInput(
                f"{name} is a state of session {st.session_id!r}, not of {session_id!r}: "
                "commit it to its own session"
            )
    if (before.marker, before.max_attempts) != (after.marker, after.max_attempts):
        raise InvalidInput(
            "a transition never changes the protocol marker or max_attempts "
            f"(before: {before.marker}/{before.max_attempts}, "
            f"after: {after.marker}/{after.max_attempts})"
        )
    if _nothing_durable(before, after, audit_rows, arguments):
        return _EMPTY_PLAN
    calls, approvals, records, new_keys = durable_changes(before, after)

    old_calls = {c.position: c for c in before.calls}
    new_calls_by_position = {c.position: c for c in after.calls}
    for was in before.calls:
        if was.message is not MessageState.DURABLE:
            continue
        now = new_calls_by_position.get(was.position)
        if now is None or _identity(now) != _identity(was) or (
            was.result is not None and now.result != was.result
        ):
            raise InvalidInput(
                f"durable call {was.position} was removed or changed its identity "
                "(tool_call_id, tool, execution id, digest) or its result: a durable call "
                "only ever gains a result"
            )
    lost = [
        what
        for what, gone in (
            ("approvals", set(before.approvals) - set(after.approvals)),
            ("ledger records", set(before.ledger) - set(after.ledger)),
            ("audit keys", before.audit - after.audit),
        )
        if gone
    ]
    if lost:
        raise InvalidInput(
            f"the new state drops {' and '.join(lost)} of the old one: durable state is never "
            "removed by a transition; commit states that apply() produced"
        )
    args = dict(arguments or {})
    new_calls: list[tuple[CallState, str | None]] = []
    results: list[tuple[CallState, CallState]] = []
    for c in calls:
        old = old_calls.get(c.position)
        if old is None or old.message is not MessageState.DURABLE:
            if c.execution_id != derive_execution_id(session_id, *c.position, c.tool_call_id):
                raise InvalidInput(
                    f"call {c.position} carries execution id {c.execution_id}, which is not "
                    "derive_execution_id(session, turn, slot, tool_call_id): the id must be "
                    "derived by the engine, never taken from elsewhere"
                )
            text: str | None = None
            if c.position in args:
                given = args.pop(c.position)
                text = arguments_json(given)
                if args_digest(c.tool.name, given) != c.args_digest:
                    raise InvalidInput(
                        f"the arguments given for call {c.position} do not match its argument "
                        f"digest {c.args_digest}: pass the arguments the model emitted"
                    )
            new_calls.append((c, text))
        else:
            results.append((old, c))
    if args:
        raise InvalidInput(
            f"arguments were given for {sorted(args)}, but no call becomes durable there in "
            "this commit: give them with the transition that persists the call"
        )

    durable_eids = {c.execution_id for c in after.calls if c.message is MessageState.DURABLE}
    orphans = sorted(
        ({r.execution_id for r in records} | {k for k, _ in approvals}) - durable_eids
    )
    if orphans:
        raise InvalidInput(
            f"the new state has approvals or ledger records for {orphans}, which are not "
            "durable calls of the session: records and approvals belong to a persisted call"
        )
    planned_approvals = tuple((k, before.approvals.get(k), v) for k, v in approvals)
    touched = (
        {row.execution_id for row in audit_rows if isinstance(row, AuditRow)}
        | {r.execution_id for r in records}
        | {k for k, _ in approvals}
        | {new.execution_id for _, new in results}
    )
    guards = tuple(
        call_view(before, c)
        for c in before.calls
        if c.message is MessageState.DURABLE and c.execution_id in touched
    )
    planned_records = tuple((before.ledger.get(r.execution_id), r) for r in records)

    rows = tuple(audit_rows)
    by_eid = {c.execution_id: c for c in after.calls}
    for row in rows:
        if not isinstance(row, AuditRow):
            raise InvalidInput(f"audit rows must be AuditRow values, got {type(row).__name__}")
        if row.session_id != session_id:
            raise InvalidInput(
                f"audit row {row.key} is for session {row.session_id!r}, not {session_id!r}"
            )
        if row.key not in after.audit:
            raise InvalidInput(
                f"audit row {row.key} has no audit key in the new state: rows describe "
                "transitions of the protocol, derive them from after.audit - before.audit"
            )
        call = by_eid.get(row.execution_id)
        if call is None or (call.tool_call_id, call.position) != (row.tool_call_id, row.position):
            raise InvalidInput(
                f"audit row {row.key} names tool_call_id {row.tool_call_id!r} at "
                f"{row.position}, which is not the call with that execution id"
            )
    covered = {row.key for row in rows}
    missing = [k for k in new_keys if k not in covered]
    if missing:
        raise InvalidInput(
            f"the transition adds audit keys {missing} without their audit rows: every "
            "invocation and decision is written with the transition it describes"
        )
    return CommitPlan(
        tuple(new_calls), tuple(results), planned_approvals, planned_records, rows, guards
    )


_EMPTY_PLAN: Final = CommitPlan((), (), (), (), (), ())


def _nothing_durable(
    before: SessionState,
    after: SessionState,
    audit_rows: Sequence[AuditRow],
    arguments: Mapping[CallPosition, Mapping[str, Any]] | None,
) -> bool:
    """Whether ``before -> after`` provably changes nothing durable (a volatile step:
    an invocation, an answer held in memory): the same approval, record and audit
    objects, the same calls at the same positions with the same identity and result,
    no rows, no arguments.  Every check of :func:`plan_commit` then passes and its
    plan is empty; this says so without building the plan (bench_bytes: half of a
    protected call's commits are such steps)."""
    if (audit_rows or arguments or after.approvals is not before.approvals
            or after.ledger is not before.ledger or after.audit is not before.audit
            or len(after.calls) != len(before.calls)):
        return False
    for was, now in zip(before.calls, after.calls, strict=True):
        if was is not now and (was.position != now.position
                               or _identity(was) != _identity(now)
                               or was.result != now.result):
            return False
    return True


def _identity(c: CallState) -> tuple[object, ...]:
    return (c.tool_call_id, c.tool, c.execution_id, c.args_digest, c.message)


def _check_session_values(session_id: str, marker: int, max_attempts: int) -> None:
    # new_session validates exactly as the core does, with its messages.
    new_session(session_id, marker=marker, max_attempts=max_attempts)


def check_new_session(session_id: str, before: SessionState) -> tuple[int, int]:
    """The ``(marker, max_attempts)`` of a session a commit creates (``commit(create=True)``).

    A session created by its first commit starts from the core's initial
    state (:func:`~toolledger._core.state.new_session`): ``before`` must be
    exactly that, for this session id, or the commit would write the changes
    of a history that is not durable anywhere.
    """
    _check_session_values(session_id, before.marker, before.max_attempts)
    initial = new_session(session_id, marker=before.marker, max_attempts=before.max_attempts)
    if before != initial:
        raise InvalidInput(
            f"a commit that creates session {session_id!r} must start from its initial "
            "state (no calls, approvals, records or audit keys): open the session's "
            "ledger with Ledger.new() and commit its first step; nothing was written"
        )
    return before.marker, before.max_attempts


def _resumed(call: CallState) -> CallState:
    stage = Stage.RESUME if call.result is None else Stage.NONE
    return call if call.stage is stage else replace(call, stage=stage)
