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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from .commit_plan import _CREATED_SINCE as _CREATED_SINCE

# The errors and the commit plan live in their own modules; this module
# re-exports them, so ``toolledger._core.stores`` stays the one place a store
# imports from.  MemoryStore looks ``check_lease`` up here (a test replaces it).
from .commit_plan import (
    RELOAD,
    AuditRow,
    CallView,
    CommitPlan,
    _resumed,
    arguments_json,
    call_view,
    check_new_session,
    durable_projection,
    last_durable_turn,
    only_calls,
    plan_commit,
    working_set,
)

# sqlite_store and postgres_store import it from here (an explicit re-export)
from .commit_plan import _check_session_values as _check_session_values
from .protocol import (
    ApprovalState,
    CallPosition,
    CallState,
    ExecutionRecord,
    SessionState,
    Stage,
)
from .state import stored_approval_digests
from .store_errors import (
    LeaseLost,
    SessionExists,
    StaleState,
    StoreCorrupt,
    StoreError,
    UnknownSession,
    UnsupportedSchema,
    check_lease,
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
    "check_new_session",
    "durable_projection",
    "last_durable_turn",
    "plan_commit",
    "working_set",
]



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

    def load_turn(self, session_id: str, turn: int) -> SessionState:
        """The durable calls of one turn, with their approvals, records and audit keys.

        As :meth:`load` restricted to the calls at ``(turn, *)``: what a
        re-recorded message is compared with when it is behind the working
        set (docs/protocol.md#placing-a-response).  Its cost does not grow
        with the history.  Raises :class:`UnknownSession`.
        """
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
        create: bool = False,
    ) -> None:
        """Make ``durable_changes(before, after)`` and ``audit_rows`` durable atomically.

        ``arguments`` optionally gives the JSON arguments of calls that become
        durable in this commit (checked against their digest).  ``epoch``: the
        lease epoch the caller took (:meth:`take_session`); if given, the
        commit is refused with :class:`LeaseLost` unless it is still the
        session's.  ``create=True``: the session does not exist yet and this
        commit creates it, in the same transaction (``before`` must be its
        initial state, see :func:`check_new_session`; its marker and
        max_attempts are the session's): a session that exists by then is
        refused with :class:`StaleState`, nothing written.  A commit with
        nothing to write writes nothing and is not counted.  Raises
        :class:`StaleState` if ``before`` is not what is durable now,
        ``InvalidInput`` if the audit rows do not match the new audit keys.
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
        calls = tuple(_resumed(s.calls[p]) for p in sorted(s.calls))
        return SessionState(
            session_id=session_id,
            marker=s.marker,
            max_attempts=s.max_attempts,
            calls=calls,
            approvals=dict(s.approvals),
            approval_digests=stored_approval_digests(calls, s.approvals),
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

    def load_turn(self, session_id: str, turn: int) -> SessionState:
        """The durable calls of ``turn`` with what they own (see :meth:`Store.load_turn`)."""
        state = self.load(session_id)
        return only_calls(state, tuple(c for c in state.calls if c.position[0] == turn))

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
        create: bool = False,
    ) -> None:
        """Make the transition ``before -> after`` durable, all or nothing."""
        if create:
            marker, max_attempts = check_new_session(session_id, before)
            self._open()
        else:
            s = self._session(session_id)
        plan = plan_commit(session_id, before, after, audit_rows, arguments)
        if plan.empty:
            return
        if create:
            if session_id in self._sessions:
                raise StaleState(_CREATED_SINCE.format(session_id=session_id))
            s = _MemorySession(marker, max_attempts)  # staged below, stored at the commit point
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
