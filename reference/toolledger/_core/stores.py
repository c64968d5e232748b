"""The store port: what the protocol core needs from durable storage.

Private module of :mod:`toolledger`: import the public names from ``toolledger``.

Theory of operation
-------------------
The protocol core (:mod:`toolledger._core.protocol`) is pure: every transition
returns a new :class:`~toolledger._core.protocol.SessionState`, and
:func:`~toolledger._core.protocol.durable_changes` says which part of it must be
made durable before the engine acts on it.  A :class:`Store` is where that
part goes.  It has one write operation, :meth:`Store.commit`, which makes
``durable_changes(before, after)`` *and* the audit rows describing that
transition durable in ONE transaction: all of it or none of it.  A crash can
therefore never leave a ``dispatched`` record without its audit row, or a
``succeeded`` record half written.

:meth:`Store.load` returns what a restarted engine sees: the durable calls
(every call without a result at :attr:`~toolledger._core.protocol.Stage.RESUME`,
the others at :attr:`~toolledger._core.protocol.Stage.NONE`), approvals, ledger
records, audit keys and the protocol marker.  Calls whose message never became
durable do not exist.  That is exactly :func:`durable_projection` of the
engine's in-memory state, which is what the tests check after every step.

A recovering engine does not need the whole past of a session:
:meth:`Store.load_working_set` returns only :func:`working_set` of it, every
call without a result and every call of the last durable turn, with their
approvals, records and audit keys.  No transition of the core reads a call
outside that set except ``ProviderEmitCall``'s "is the position free"
guard, which :meth:`Store.call_exists` answers; so the
:class:`~toolledger._core.ledger.Ledger` keeps only the working set in memory and a
restart reads only that, whatever the length of the history (``bench_recovery``
measures it).

Two implementations: :class:`MemoryStore` here (for tests and the checkers;
it has nothing volatile, so its :meth:`MemoryStore.crash` loses nothing) and
:class:`toolledger._core.sqlite_store.SqliteStore` (real durability).  Both plan a
commit with :func:`plan_commit`, so they validate and write exactly the same
things, and both refuse a commit whose ``before`` is not what is durable now
(:class:`StaleState`): two engines resuming one session cannot both win.  The
check is a compare-and-set, inside the commit's transaction, of the durable
state of every call the commit writes anything for (result, approval, ledger
record and audit keys: :class:`CallView`), so it covers every commit, also
one that only appends an audit row (a ``Recover`` deciding ``retry_same_id``
changes no record): the losing resumer is refused before it writes, and the
audit never holds two decisions for one attempt.

Besides the protocol state a store keeps, per call, the JSON arguments the
model emitted (optional, checked against the call's argument digest), because
a retry after a crash must invoke the adapter with the same arguments and the
engine's memory is gone by then.

What a store must never do: decide anything (it records decisions, it does
not make them), change a state it was not asked to write, update or delete an
audit row, or report a commit as done before it is durable.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol, runtime_checkable

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

__all__ = [
    "RELOAD",
    "AuditRow",
    "CallView",
    "CommitPlan",
    "LeaseLost",
    "MemoryStore",
    "SessionExists",
    "StaleState",
    "Store",
    "StoreCorrupt",
    "StoreError",
    "UnknownSession",
    "UnsupportedSchema",
    "arguments_json",
    "call_view",
    "check_lease",
    "durable_projection",
    "plan_commit",
    "working_set",
]


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


class StoreError(Exception):
    """A store could not do what was asked; nothing was written.

    The message says what went wrong and what to do.  After a
    :class:`StoreError` from a commit, reload the session with
    :meth:`~toolledger._core.ledger.Ledger.reload` (what a restarted engine would
    do) before acting on anything.
    """


class UnknownSession(StoreError, KeyError):
    """The session id is not in the store."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0]) if self.args else ""


class SessionExists(StoreError):
    """:meth:`Store.create_session` was asked for a session that already exists."""


class StaleState(StoreError):
    """A commit's ``before`` is not what is durable now.

    Another engine (or another :class:`~toolledger._core.ledger.Ledger`) changed the
    session since this one loaded it: a call the commit writes for (its
    result, approval, record or audit keys) or the session's marker.  Nothing
    was written; reload the session with
    :meth:`~toolledger._core.ledger.Ledger.reload` and decide again.
    """


class LeaseLost(StaleState):
    """The commit's lease epoch is no longer the session's.

    Another worker took the session (:meth:`Store.take_session` bumped its
    epoch) after this one did: this worker was declared dead, or a second
    resume path took over.  Checked inside the commit's transaction before
    any write, so nothing was written.  Stop working on the session; take it
    again (a new :class:`~toolledger._core.ledger.Ledger`) only if this worker
    is meant to own it now.
    """


def check_lease(session_id: str, stored: int, epoch: int | None) -> None:
    """Raise :class:`LeaseLost` unless ``epoch`` (if given) is the stored epoch.

    Every store calls it first inside a commit's transaction: a worker that
    lost the session cannot commit (spec/ConcurrentResumers.tla,
    StaleWorkerNeverCommits).  ``None``: the caller holds no lease, only the
    compare-and-set applies.
    """
    if epoch is not None and stored != epoch:
        raise LeaseLost(
            f"session {session_id!r} is held under lease epoch {stored}, this worker "
            f"holds epoch {epoch}: another worker took the session since; nothing was "
            "written; stop working on it (take the session again only if this worker "
            "is to own it)"
        )


class StoreCorrupt(StoreError):
    """The store's file is damaged, truncated or not a store at all.

    Raised when opening (before anything is executed or written) or when a
    stored value cannot be read back.  ``path`` names the file.
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class UnsupportedSchema(StoreError):
    """The store was written with a schema this version cannot read.

    ``found`` is the schema version found (``None`` if the file belongs to
    another application), ``supported`` the one this version reads.
    """

    def __init__(
        self, message: str, *, path: str | None = None, found: int | None, supported: int
    ) -> None:
        super().__init__(message)
        self.path = path
        self.found = found
        self.supported = supported


# --------------------------------------------------------------------------
# Audit rows
# --------------------------------------------------------------------------

_DECISIONS: Final = frozenset(d.value for d in Decision)


def _frozen_json(value: Mapping[str, Any], what: str) -> str:
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{what} must be a JSON object (a dict), got {type(value).__name__}")
    bad = [k for k in value if not isinstance(k, str)]
    if bad:
        raise InvalidInput(f"{what} must have string keys, got {bad[0]!r}: use str keys")
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
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
    ``"reconcile_unknown"``) or a human resolution (``"human_applied"``,
    ``"human_retry"``, ``"human_abandon"``); ``recovery_decision`` is the
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


# --------------------------------------------------------------------------
# The port
# --------------------------------------------------------------------------


@runtime_checkable
class Store(Protocol):
    """Durable storage for sessions of the protocol core.

    ``commits`` counts the durable transactions made through this object
    (:meth:`create_session` and every non-empty :meth:`commit`);
    ``ledger_commits`` those of them that wrote at least one ledger record
    (the cost the protocol adds to a tool call).
    """

    commits: int
    ledger_commits: int

    def create_session(self, session_id: str, *, marker: int, max_attempts: int) -> None:
        """Create an empty session governed from turn ``marker`` on, durably.

        Raises :class:`SessionExists` if it exists, ``InvalidInput`` for bad values.
        """
        ...

    def load(self, session_id: str) -> SessionState:
        """The durable state of the session, as a restarted engine sees it.

        Reads the whole session (every call ever made): for audits, tools and
        checkers.  Raises :class:`UnknownSession` if there is no such session.
        """
        ...

    def load_working_set(self, session_id: str) -> SessionState:
        """``working_set(load(session_id))``, without reading the rest of the history.

        What a :class:`~toolledger._core.ledger.Ledger` loads on start and restart;
        its cost must not grow with the number of settled calls.  Raises
        :class:`UnknownSession` if there is no such session.
        """
        ...

    def call_exists(self, session_id: str, position: CallPosition) -> bool:
        """Whether a durable call is at ``position`` (settled or not)."""
        ...

    def take_session(self, session_id: str) -> int:
        """Take the session's lease: bump its epoch durably and return the new one.

        Unconditional (the previous holder may be declared dead while it still
        runs); from now on a commit carrying an older epoch raises
        :class:`LeaseLost`.  Not counted in ``commits`` (it writes no protocol
        state).  Raises :class:`UnknownSession` if there is no such session.
        """
        ...

    def lease_epoch(self, session_id: str) -> int:
        """The session's current lease epoch (0: never taken)."""
        ...

    def commit(
        self,
        session_id: str,
        before: SessionState,
        after: SessionState,
        audit_rows: Sequence[AuditRow],
        *,
        arguments: Mapping[CallPosition, Mapping[str, Any]] | None = None,
        epoch: int | None = None,
    ) -> None:
        """Make ``durable_changes(before, after)`` and ``audit_rows`` durable atomically.

        ``arguments`` optionally gives the JSON arguments of calls that become
        durable in this commit (checked against their digest).  ``epoch``: the
        lease epoch the caller took (:meth:`take_session`); if given, the
        commit is refused with :class:`LeaseLost` unless it is still the
        session's.  A commit with nothing to write writes nothing and is not
        counted.  Raises :class:`StaleState` if ``before`` is not what is
        durable now, ``InvalidInput`` if the audit rows do not match the new
        audit keys.
        """
        ...

    def call_arguments(self, session_id: str, position: CallPosition) -> dict[str, Any] | None:
        """The stored arguments of the durable call at ``position`` (``None`` if not kept)."""
        ...

    def audit(self, session_id: str) -> list[AuditRow]:
        """Every audit row of the session, in the order they were written."""
        ...

    def sessions(self) -> list[str]:
        """The ids of every session in the store, sorted."""
        ...

    def close(self) -> None:
        """Release the store; idempotent.  Everything committed stays durable."""
        ...


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
    eids = {c.execution_id for c in calls}
    return replace(
        state,
        calls=calls,
        approvals={k: v for k, v in state.approvals.items() if k in eids},
        ledger={k: v for k, v in state.ledger.items() if k in eids},
        audit=frozenset(k for k in state.audit if k[0] in eids),
    )


RELOAD: Final = (
    "reload the session with Ledger.reload() (what a restarted engine reads: the "
    "durable state, volatile stages dropped)"
)
"""How every error that asks for a reload says it: naming the method to call."""


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
                    f"written; {RELOAD}, and decide again"
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


def _identity(c: CallState) -> tuple[object, ...]:
    return (c.tool_call_id, c.tool, c.execution_id, c.args_digest, c.message)


def _check_session_values(session_id: str, marker: int, max_attempts: int) -> None:
    # new_session validates exactly as the core does, with its messages.
    new_session(session_id, marker=marker, max_attempts=max_attempts)


def _resumed(call: CallState) -> CallState:
    stage = Stage.RESUME if call.result is None else Stage.NONE
    return call if call.stage is stage else replace(call, stage=stage)


# --------------------------------------------------------------------------
# MemoryStore
# --------------------------------------------------------------------------


@dataclass(slots=True)
class _MemorySession:
    marker: int
    max_attempts: int
    calls: dict[CallPosition, CallState] = field(default_factory=dict)
    arguments: dict[CallPosition, str] = field(default_factory=dict)
    approvals: dict[str, ApprovalState] = field(default_factory=dict)
    ledger: dict[str, ExecutionRecord] = field(default_factory=dict)
    audit: list[AuditRow] = field(default_factory=list)
    # the same rows by execution id: a commit's stale check reads one call's keys
    audit_of: dict[str, tuple[AuditRow, ...]] = field(default_factory=dict)
    epoch: int = 0  # the session's lease epoch

    def copy(self) -> _MemorySession:
        return _MemorySession(
            self.marker,
            self.max_attempts,
            dict(self.calls),
            dict(self.arguments),
            dict(self.approvals),
            dict(self.ledger),
            list(self.audit),
            dict(self.audit_of),
            self.epoch,
        )


class MemoryStore:
    """A :class:`Store` in memory, for tests and the checkers.

    Everything it holds is durable by definition: :meth:`crash` drops nothing
    (what a crash loses is the engine's memory, i.e. the
    :class:`~toolledger._core.ledger.Ledger`'s state).  It keeps only immutable
    values and private copies, so mutating what was passed in or handed out
    changes nothing stored.  A commit is staged on a copy and swapped in at
    the end, so a failure part-way leaves nothing of it visible; commits are
    counted as :class:`~toolledger._core.sqlite_store.SqliteStore` counts them.
    It never touches the file system.
    """

    def __init__(self) -> None:
        self._sessions: dict[str, _MemorySession] = {}
        self._closed = False
        self.commits = 0
        self.ledger_commits = 0
        self.crashes = 0

    # -- lifecycle ------------------------------------------------------------

    def close(self) -> None:
        """Mark the store closed; later calls raise :class:`StoreError`."""
        self._closed = True

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def crash(self) -> None:
        """The process dies: a memory store has nothing volatile, so nothing is lost."""
        self._open()
        self.crashes += 1

    def _open(self) -> None:
        if self._closed:
            raise StoreError("this MemoryStore is closed: create a new one")

    def _session(self, session_id: str) -> _MemorySession:
        self._open()
        s = self._sessions.get(session_id)
        if s is None:
            raise UnknownSession(
                f"no session {session_id!r} in this MemoryStore: create it with "
                "create_session() first"
            )
        return s

    # -- the port -------------------------------------------------------------

    def create_session(self, session_id: str, *, marker: int, max_attempts: int) -> None:
        """Create an empty session; raises :class:`SessionExists` if it exists."""
        self._open()
        _check_session_values(session_id, marker, max_attempts)
        if session_id in self._sessions:
            raise SessionExists(
                f"session {session_id!r} already exists: open it with "
                f"Ledger(store, {session_id!r}) instead of creating it"
            )
        self._sessions[session_id] = _MemorySession(marker, max_attempts)
        self.commits += 1

    def sessions(self) -> list[str]:
        """The ids of every session, sorted."""
        self._open()
        return sorted(self._sessions)

    def load(self, session_id: str) -> SessionState:
        """The durable state of the session, as a restarted engine sees it."""
        s = self._session(session_id)
        return SessionState(
            session_id=session_id,
            marker=s.marker,
            max_attempts=s.max_attempts,
            calls=tuple(_resumed(s.calls[p]) for p in sorted(s.calls)),
            approvals=dict(s.approvals),
            ledger=dict(s.ledger),
            audit=frozenset(row.key for row in s.audit),
        )

    def load_working_set(self, session_id: str) -> SessionState:
        """The working set of the session (see :func:`working_set`)."""
        return working_set(self.load(session_id))

    @staticmethod
    def _differs(s: _MemorySession, seen: CallView) -> str | None:
        """What of the call ``seen`` describes differs from what is stored."""
        call = s.calls.get(seen.position)
        if call is None or call.execution_id != seen.execution_id:
            return "it is no longer a durable call of the session"
        eid = seen.execution_id
        return seen.difference(
            audit=frozenset((r.kind, r.attempt) for r in s.audit_of.get(eid, ())),
            record=s.ledger.get(eid) == seen.record,
            approval=s.approvals.get(eid) is seen.approval,
            result=call.result == seen.result,
        )

    def call_exists(self, session_id: str, position: CallPosition) -> bool:
        """Whether a durable call is at ``position``."""
        return (position[0], position[1]) in self._session(session_id).calls

    def take_session(self, session_id: str) -> int:
        """Bump the session's lease epoch and return it."""
        s = self._session(session_id)
        s.epoch += 1
        return s.epoch

    def lease_epoch(self, session_id: str) -> int:
        """The session's current lease epoch."""
        return self._session(session_id).epoch

    def commit(
        self,
        session_id: str,
        before: SessionState,
        after: SessionState,
        audit_rows: Sequence[AuditRow],
        *,
        arguments: Mapping[CallPosition, Mapping[str, Any]] | None = None,
        epoch: int | None = None,
    ) -> None:
        """Make the transition ``before -> after`` durable, all or nothing."""
        s = self._session(session_id)
        plan = plan_commit(session_id, before, after, audit_rows, arguments)
        if plan.empty:
            return
        check_lease(session_id, s.epoch, epoch)
        plan.check_session(
            session_id,
            (s.marker, s.max_attempts),
            after,
            lambda seen: self._differs(s, seen),
        )
        staged = s.copy()
        plan.write(
            call=lambda c, text: self._write_call(session_id, staged, c, text),
            result=lambda old, new: self._write_result(session_id, staged, old, new),
            approval=lambda eid, was, now: self._write_approval(
                session_id, staged, eid, was, now
            ),
            record=lambda old, new: self._write_record(session_id, staged, old, new),
            audit=lambda row: self._write_audit(staged, row),
        )
        self._sessions[session_id] = staged  # the commit point
        self.commits += 1
        if plan.writes_ledger:
            self.ledger_commits += 1

    def call_arguments(self, session_id: str, position: CallPosition) -> dict[str, Any] | None:
        """A fresh copy of the stored arguments of the call at ``position``."""
        text = self._session(session_id).arguments.get((position[0], position[1]))
        if text is None:
            return None
        value: dict[str, Any] = json.loads(text)
        return value

    def audit(self, session_id: str) -> list[AuditRow]:
        """Copies of the session's audit rows, oldest first."""
        return [replace(row) for row in self._session(session_id).audit]

    # -- the writes of one commit (separate so tests can inject failures) -----

    def _write_call(
        self, session_id: str, s: _MemorySession, call: CallState, arguments: str | None
    ) -> None:
        if call.position in s.calls:
            raise StaleState(
                f"call {call.position} of session {session_id!r} is already durable: "
                f"another engine persisted it; {RELOAD}"
            )
        s.calls[call.position] = replace(call, stage=Stage.NONE)
        if arguments is not None:
            s.arguments[call.position] = arguments

    def _write_result(
        self, session_id: str, s: _MemorySession, old: CallState, new: CallState
    ) -> None:
        stored = s.calls.get(new.position)
        if stored is None or stored.result != old.result:
            raise StaleState(
                f"the result of call {new.position} of session {session_id!r} is not the one "
                f"this engine saw: another engine wrote it; {RELOAD}"
            )
        s.calls[new.position] = replace(stored, result=new.result)

    def _write_approval(
        self,
        session_id: str,
        s: _MemorySession,
        execution_id: str,
        was: ApprovalState | None,
        now: ApprovalState,
    ) -> None:
        if s.approvals.get(execution_id) is not was:
            raise StaleState(
                f"the approval of {execution_id} in session {session_id!r} is "
                f"{s.approvals.get(execution_id)}, this engine saw {was}: {RELOAD}"
            )
        s.approvals[execution_id] = now

    def _write_record(
        self,
        session_id: str,
        s: _MemorySession,
        old: ExecutionRecord | None,
        new: ExecutionRecord,
    ) -> None:
        if s.ledger.get(new.execution_id) != old:
            raise StaleState(
                f"the ledger record of {new.execution_id} in session {session_id!r} is not the "
                f"one this engine saw: another engine wrote it; {RELOAD}"
            )
        s.ledger[new.execution_id] = new

    def _write_audit(self, s: _MemorySession, row: AuditRow) -> None:
        copied = replace(row)  # replace() re-copies inputs through JSON
        s.audit.append(copied)
        s.audit_of[row.execution_id] = (*s.audit_of.get(row.execution_id, ()), copied)
