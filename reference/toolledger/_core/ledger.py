"""The Ledger facade: the protocol core bound to one session of a store.

Private module of :mod:`toolledger`: import the public names from ``toolledger``.

Theory of operation
-------------------
A :class:`Ledger` holds what one engine process knows about one session: the
current :class:`~toolledger._core.protocol.SessionState`, including the volatile
stage of every call, in memory.  :meth:`Ledger.step` feeds one
:class:`~toolledger._core.protocol.Event` to :func:`~toolledger._core.protocol.apply`
and, if the transition changed anything durable, commits
``durable_changes(before, after)`` together with the audit rows of that
transition through the :class:`~toolledger._core.stores.Store`, in ONE
transaction, before the new state becomes the ledger's state.  The engine
acts on a transition (invokes an adapter, appends a message) only after
``step`` returned.  :meth:`Ledger.step_many` does the same for several events
with one commit; the engine uses it to make ``EngineRecordSucceeded`` and
``EngineAppendResult`` a single transaction, so a protected call costs two
ledger commits: ``dispatched``, then ``succeeded`` + the tool result.  A
transition that changes nothing durable (``EngineInvokeAdapter``,
``EngineTimeout``, a readonly tool's invocation) commits nothing.

A session may be created by its first commit (:meth:`Ledger.new`): until
then it exists in memory only, as the core's initial state, and its first
non-empty commit inserts the session together with what that step made
durable, in ONE transaction.  A crash before that commit leaves no trace of
the session (the engine re-runs the turn from its conversation, as for a
crash before any commit); after it the session is as if it had been
created first and the step committed next.

Audit rows are derived from the audit keys the transition adds
(``after.audit - before.audit``, and the key of every ``Recover`` decision,
also one taken again for an attempt a row of that kind covers:
:func:`~toolledger._core.protocol.decision_audit_key`), enriched with the call (tool_call_id,
position), the attempt's authorization, the recovery decision the row
belongs to and the :class:`~toolledger._core.protocol.RecoveryInputs` of the state
the transition was made in, so anyone can recompute a decision with
:func:`~toolledger._core.protocol.decide_recovery`.

Beyond the core, the facade carries two things the core leaves out: the
content of tool results (the adapter's answer, a human's "it was applied"
text), attached to the result the transition creates; and the JSON arguments
of a call, kept in memory from ``ProviderEmitCall`` and stored with the call
when it becomes durable, so a retry after a crash can use them.

:meth:`Ledger.reload` forgets everything in memory and re-reads the
session from the store: exactly what a restarted process sees (the
protocol's ``Crash``; :meth:`Ledger.crash` is the same, named for tests).

A Ledger keeps only the session's working set in memory
(:func:`~toolledger._core.stores.working_set`: the calls without a result and the
calls of the last durable turn, with their approvals, records and audit
keys): after every commit the calls that are settled and behind the last
turn leave :attr:`Ledger.state`, and loading (at start and on
:meth:`Ledger.reload`) reads only the working set
(:meth:`~toolledger._core.stores.Store.load_working_set`).  A session's past can
grow without making transitions or recoveries slower.  The one guard of the
core that looks at other calls, "no call is at that position yet" of
``ProviderEmitCall``, is completed by :meth:`~toolledger._core.stores.Store.call_exists`
for a position behind the last durable turn.  :meth:`Ledger.full_state` is
the whole session (the store's settled calls plus the working set in
memory), for checkers and tools.

What it must never do: act on a state before it is durable, write anything
when ``apply`` refuses an event (``ProtocolError``) or the input is bad
(``InvalidInput``), decide recovery itself (the core does), or keep going on
its in-memory state after the store failed (call :meth:`Ledger.reload`).
A Ledger is not thread-safe: one per session per engine task.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from .protocol import (
    Action,
    Authorization,
    CallPosition,
    CallState,
    Decision,
    Event,
    InvalidInput,
    LedgerStatus,
    MessageState,
    ProtocolError,
    ResultKind,
    SessionState,
    Stage,
    ToolResult,
    apply,
    args_digest,
    check_call_position,
    decide_recovery,
    decision_audit_key,
    new_session,
    recovery_inputs,
)
from .stores import (
    AuditRow,
    Store,
    UnknownSession,
    arguments_json,
    last_durable_turn,
    working_set,
)

__all__ = [
    "APPROVAL_EXPIRED",
    "APPROVAL_KINDS",
    "APPROVED",
    "REJECTED",
    "RESOLUTIONS",
    "SAME_CALL",
    "SUPERSEDED",
    "Ledger",
    "Void",
]

SUPERSEDED: Final = "superseded"
"""Audit kind of a call whose response the engine's history lost and a new one replaced."""
SAME_CALL: Final = "same_call"
"""Audit kind of a call of a re-emission that IS an earlier, dispatched call (its result
content names that call): it is never run under its own identity."""
APPROVED: Final = "approved"
"""Audit kind of a human's approval (beside the spec's ``HumanApprove``): its note names
who gave it and until when it holds (:attr:`AuditRow.by`, :attr:`AuditRow.expires_at`)."""
REJECTED: Final = "rejected"
"""Audit kind of a human's rejection (beside the spec's ``HumanReject``): its note names who."""
APPROVAL_EXPIRED: Final = "approval_expired"
"""Audit kind of an approval that expired before its call was dispatched: it authorizes
nothing any more, the call waits for a new approval (docs/protocol.md#approvals-that-expire)."""
APPROVAL_KINDS: Final = frozenset({APPROVED, REJECTED, APPROVAL_EXPIRED})
"""The facade's approval rows: their ``attempt`` is the approval's round (1 for the first
approval of a call, 2 for the one asked for after it expired, ...), not a dispatch attempt."""


@dataclass(frozen=True, slots=True)
class Void:
    """A facade step with no spec action (docs/protocol.md#superseding-a-lost-response).

    The call at ``position`` gets the audit key ``(execution id, kind,
    attempt)`` and a row saying ``note``; with ``result`` (only for a call
    never dispatched and without a result) it also gets a ``cancelled``
    result with that content, so it is settled and never runs.  ``kind`` is
    :data:`SUPERSEDED` or :data:`SAME_CALL`, or one of :data:`APPROVAL_KINDS`
    (who approved or rejected, an approval's expiry: ``attempt`` is then the
    approval's round, and the row follows the events of its step).
    """

    position: CallPosition
    kind: str
    note: str
    result: str | None = None
    attempt: int | None = None

# The events that send an attempt: the record keeps the first one's time.
_DISPATCHES: Final = frozenset({Action.EnginePersistDispatched})

RESOLUTIONS: Final[Mapping[str, Action]] = {
    "applied": Action.HumanResolveApplied,
    "retry": Action.HumanResolveRetry,
    "abandon": Action.HumanResolveAbandon,
}
"""A human's answer to a call in ``recovery_required``, and the event it becomes."""

# Transitions that put a new result into the ledger record, and those that put
# one straight into the conversation (a denied call, a readonly tool's answer).
_RECORD_RESULT: Final = frozenset(
    {
        Action.EngineRecordSucceeded,
        Action.EngineRecordFailed,
        Action.EngineReconcileApplied,
        Action.HumanResolveApplied,
        Action.HumanResolveAbandon,
    }
)
_CALL_RESULT: Final = frozenset({Action.EngineRecordDenied, Action.EngineAppendResult})
_HUMAN: Final = frozenset(RESOLUTIONS.values())
_RECONCILE: Final = frozenset(
    {
        Action.EngineReconcileApplied,
        Action.EngineReconcileNotApplied,
        Action.EngineReconcileUnknown,
    }
)


def _position(value: object, what: str) -> CallPosition:
    return check_call_position(value, what)


class Ledger:
    """One session of a :class:`~toolledger._core.stores.Store`, driven by protocol events.

    ``Ledger(store, session_id)`` loads the session (raises
    :class:`~toolledger._core.stores.UnknownSession` if it does not exist; use
    :meth:`create` for a new one).

    ``take_session=True`` makes this ledger the session's owner first: it
    takes the session's lease (:meth:`~toolledger._core.stores.Store.take_session`
    bumps the durable epoch, before the load), and every commit carries that
    epoch, so once another worker takes the session every commit of this one
    raises :class:`~toolledger._core.stores.LeaseLost` before it writes
    (docs/protocol.md#concurrent-resumers).  Without it only the stores'
    compare-and-set on what was read protects the session.
    """

    def __init__(
        self,
        store: Store,
        session_id: str,
        *,
        take_session: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._session_id = session_id
        # Taken before the load: what this ledger reads is at least as new as
        # its lease, so no commit of an older holder can slip in unseen.
        self._epoch: int | None = store.take_session(session_id) if take_session else None
        # Seconds since the epoch: the dispatch time kept in each record, and
        # the "now" that decides whether an idempotency key is still retained.
        self._clock = clock
        # True until the first commit of a session that does not exist yet (new()):
        # that commit creates it.
        self._create = False
        self._state = store.load_working_set(session_id)
        # Volatile, like the stages: lost by crash().
        self._arguments: dict[CallPosition, str] = {}
        self._decisions: dict[CallPosition, str] = {}

    @classmethod
    def create(
        cls,
        store: Store,
        session_id: str,
        *,
        marker: int = 0,
        max_attempts: int = 3,
        clock: Callable[[], float] = time.time,
    ) -> Ledger:
        """Create the session in ``store`` (durably) and return its ledger.

        Its state is the session's initial one, what a load right after the
        creating commit reads (no second read transaction: bench_bytes' plain
        path); a writer that changed the session since is caught by the next
        commit's checks (:class:`~toolledger._core.stores.StaleState`), as
        after any load."""
        store.create_session(session_id, marker=marker, max_attempts=max_attempts)
        ledger = cls.new(store, session_id, marker=marker, max_attempts=max_attempts,
                         clock=clock)
        ledger._create = False
        return ledger

    @classmethod
    def new(
        cls,
        store: Store,
        session_id: str,
        *,
        marker: int = 0,
        max_attempts: int = 3,
        clock: Callable[[], float] = time.time,
    ) -> Ledger:
        """The ledger of a new session that its first commit creates (nothing is written now).

        Unlike :meth:`create` (one transaction for the empty session, then one
        per step), the session's row is inserted by the first commit that
        writes anything, in that same transaction (``Store.commit(...,
        create=True)``): opening a session, recording an assistant message's
        calls and dispatching the first of them can be ONE transaction.
        Nothing is read either: if the session exists by then (it did
        already, or another engine created it since), that commit raises
        :class:`~toolledger._core.stores.StaleState` and writes nothing; the
        ledger reloads (:meth:`reload`) and its engine decides again on what
        is durable.
        """
        initial = new_session(session_id, marker=marker, max_attempts=max_attempts)
        ledger = cls.__new__(cls)
        ledger._store = store
        ledger._session_id = session_id
        ledger._epoch = None
        ledger._clock = clock
        ledger._create = True
        ledger._state = initial
        ledger._arguments = {}
        ledger._decisions = {}
        return ledger

    @property
    def created(self) -> bool:
        """Whether the session is in the store (``False``: a :meth:`new` one before its
        first commit)."""
        return not self._create

    def __repr__(self) -> str:
        return f"Ledger({self._store!r}, {self._session_id!r})"

    @property
    def store(self) -> Store:
        """The store this ledger commits to."""
        return self._store

    @property
    def epoch(self) -> int | None:
        """The lease epoch this ledger holds (``None``: it did not take the session).

        It travels to the tool beside the execution id and the attempt
        (``Attempt.epoch``), so that a connector that supports it can refuse a
        request of an older epoch than one it has already seen.
        """
        return self._epoch

    def now(self) -> float:
        """The ledger's clock (seconds since the epoch): a dispatch's time, and the
        "now" a key's retention window and an approval's expiry are compared with."""
        return self._clock()

    @property
    def session_id(self) -> str:
        """The session this ledger drives."""
        return self._session_id

    @property
    def state(self) -> SessionState:
        """The working set, including the volatile stages held in memory.

        Every call without a result and every call of the last durable turn;
        settled calls of earlier turns are in the store only (see
        :meth:`full_state`).  Key-retention windows that have passed by the
        clock are applied first (``RetentionWindowPasses``), so a decision
        computed from this state is the one ``Recover`` will take.
        """
        self._state = self._windows_passed(self._state)
        return self._state

    def full_state(self) -> SessionState:
        """The whole session: the store's settled calls and the working set in memory.

        Reads the session's history from the store (its cost grows with it):
        for checkers, tests and tools, not for the engine's hot path.  Settled
        calls outside the working set sit at stage ``NONE``, as they would in
        memory.
        """
        if self._create:  # nothing is stored yet (new())
            return self._state
        stored = self._store.load(self._session_id)
        mine = {c.position: c for c in self._state.calls}
        calls = tuple(
            sorted(
                [mine.pop(c.position, c) for c in stored.calls] + list(mine.values()),
                key=lambda c: c.position,
            )
        )
        return replace(
            stored,
            calls=calls,
            approvals={**stored.approvals, **self._state.approvals},
            approval_digests={**stored.approval_digests, **self._state.approval_digests},
            ledger={**stored.ledger, **self._state.ledger},
            audit=stored.audit | self._state.audit,
            retention_passed=self._state.retention_passed,
        )

    def next_turn(self) -> int:
        """The ledger's next response sequence number: never given to a response before.

        One more than the highest turn holding a durable call (the protocol
        marker if none): the sequence the ledger owns.  It is durable and
        monotone because calls are never deleted from a store, superseded
        ones included (docs/protocol.md#placing-a-response); the commit that
        records a response at it is the one that takes it (a second engine
        that took the same number is refused with
        :class:`~toolledger._core.stores.StaleState`, nothing written).
        """
        last = last_durable_turn(self.state)
        return self._state.marker if last is None else max(self._state.marker, last + 1)

    def turn_state(self, turn: int) -> SessionState:
        """The calls of ``turn`` with their approvals, records and audit keys.

        The working set in memory (with its volatile stages) over what the
        store holds for that turn: a settled call of an earlier turn is read
        from the store (:meth:`~toolledger._core.stores.Store.load_turn`), so
        its cost does not grow with the history.  Settled calls read from the
        store sit at stage ``NONE``.
        """
        if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
            raise InvalidInput(f"turn must be an int >= 0, got {turn!r}")
        mine = {c.position: c for c in self.state.calls if c.position[0] == turn}
        if self._create or turn == last_durable_turn(self._state):
            stored = None  # the last turn is wholly in the working set
        else:
            stored = self._store.load_turn(self._session_id, turn)
        if stored is None:
            eids = {c.execution_id for c in mine.values()}
            return replace(
                self._state,
                calls=tuple(mine[p] for p in sorted(mine)),
                approvals={k: v for k, v in self._state.approvals.items() if k in eids},
                approval_digests={k: v for k, v in self._state.approval_digests.items()
                                  if k in eids},
                ledger={k: v for k, v in self._state.ledger.items() if k in eids},
                audit=frozenset(k for k in self._state.audit if k[0] in eids),
            )
        calls = {c.position: c for c in stored.calls}
        calls.update(mine)
        eids = {c.execution_id for c in mine.values()}
        return replace(
            stored,
            calls=tuple(calls[p] for p in sorted(calls)),
            approvals={**stored.approvals,
                       **{k: v for k, v in self._state.approvals.items() if k in eids}},
            approval_digests={**stored.approval_digests,
                              **{k: v for k, v in self._state.approval_digests.items()
                                 if k in eids}},
            ledger={**stored.ledger,
                    **{k: v for k, v in self._state.ledger.items() if k in eids}},
            audit=stored.audit | frozenset(k for k in self._state.audit if k[0] in eids),
            retention_passed=self._state.retention_passed,
        )

    # -- transitions ------------------------------------------------------------

    def step(
        self,
        event: Event,
        *,
        result_content: str | None = None,
        arguments: Mapping[str, Any] | None = None,
    ) -> SessionState:
        """Apply ``event``, commit what it made durable with its audit rows; the new state.

        ``result_content`` is the text of the result this transition creates
        (the adapter's answer for ``EngineRecordSucceeded``/``...Failed``, a
        readonly tool's answer for its ``EngineAppendResult``, ...).
        ``arguments`` are the JSON arguments of a ``ProviderEmitCall`` (checked
        against its ``args_digest``).  An event that creates a result whose
        content comes from outside (``EngineRecordSucceeded``,
        ``EngineRecordFailed``, ``EngineReconcileApplied``,
        ``EngineRecordDenied``, ``HumanResolveApplied``, a readonly tool's
        ``EngineAppendResult``) is refused without ``result_content``: an empty
        tool result is never recorded by omission (pass ``""`` to record one).
        A ``Crash`` event is :meth:`reload`.

        Raises ``ProtocolError`` (event not allowed), ``InvalidInput`` (bad
        input) or :class:`~toolledger._core.stores.StoreError`; then nothing was
        written and :attr:`state` is unchanged.
        """
        if isinstance(event, Event) and event.action is Action.Crash:
            if result_content is not None or arguments is not None:
                raise InvalidInput("a Crash carries no result content or arguments")
            return self.crash()
        pos = event.position if isinstance(event, Event) else None
        contents = {} if result_content is None or pos is None else {pos: result_content}
        if result_content is not None and pos is None:
            raise InvalidInput(f"{event!r} names no call, so it cannot carry result content")
        args = {} if arguments is None or pos is None else {pos: arguments}
        if arguments is not None and pos is None:
            raise InvalidInput(f"{event!r} names no call, so it cannot carry arguments")
        return self._advance([event], contents, args, None)

    def step_many(
        self,
        events: Iterable[Event],
        *,
        result_content: Mapping[CallPosition, str] | None = None,
        arguments: Mapping[CallPosition, Mapping[str, Any]] | None = None,
        voids: Iterable[Void] = (),
    ) -> SessionState:
        """Apply ``events`` in order and commit them as ONE transaction.

        ``result_content`` maps a call position to the content of the first
        result created for that call in the batch; ``arguments`` maps the
        position of a ``ProviderEmitCall`` in the batch to its arguments.  If
        any event is refused, nothing is written and :attr:`state` is
        unchanged.  A ``Crash`` cannot be part of a batch.  ``voids`` (:class:`Void`)
        are applied after the events, in the same transaction.
        """
        return self._advance(list(events), dict(result_content or {}), dict(arguments or {}), None,
                             list(voids))

    def reload(self) -> SessionState:
        """Drop the volatile state and re-read the durable state: what a restarted process sees.

        Everything held only in memory is forgotten (volatile calls, the
        stages of durable calls, arguments of calls not yet durable, the
        decisions this process made) and the session's working set is read
        from the store: every durable call without a result is at ``RESUME``,
        ready for ``Recover``.  Call it after any
        :class:`~toolledger._core.stores.StoreError` from a step (e.g.
        :class:`~toolledger._core.stores.StaleState`: another engine changed the
        session), then decide again on what is durable.
        """
        try:
            self._state = self._store.load_working_set(self._session_id)
            self._create = False
        except UnknownSession:
            if not self._create:
                raise
            # a new() session before its first commit: nothing of it is durable
            self._state = new_session(self._session_id, marker=self._state.marker,
                                      max_attempts=self._state.max_attempts)
        self._arguments.clear()
        self._decisions.clear()
        return self._state

    def crash(self) -> SessionState:
        """The protocol's ``Crash``: exactly :meth:`reload`, named for tests and simulations.

        A process that crashes and restarts sees what :meth:`reload` reads;
        ``step(Event(Action.Crash))`` ends here too.
        """
        return self.reload()

    # -- humans -------------------------------------------------------------------

    def recovery_required(self) -> list[CallState]:
        """The calls halted in ``recovery_required``, waiting for a human."""
        return list(self._state.halted())

    def resolve(
        self,
        position: CallPosition,
        resolution: str,
        *,
        result_text: str | None = None,
        note: str = "",
    ) -> SessionState:
        """Apply a human's resolution of a halted call: ``"applied"``, ``"retry"``, ``"abandon"``.

        ``"applied"`` needs ``result_text``, what the external system answered,
        kept as the content of the human result; ``note`` goes into the audit
        row.  After a restart a halted call (record ``recovery_required``) is
        first re-decided (``Recover``, which always halts it again) in the same
        commit.  Anything else raises ``ProtocolError`` and writes nothing.
        """
        if not isinstance(resolution, str) or resolution not in RESOLUTIONS:
            raise InvalidInput(
                f"unknown resolution {resolution!r}: answer one of "
                f"{', '.join(repr(r) for r in RESOLUTIONS)}"
            )
        if resolution == "applied":
            if not isinstance(result_text, str):
                raise InvalidInput(
                    "resolution 'applied' needs result_text: what the external system "
                    "answered, to become the tool result"
                )
        elif result_text is not None:
            raise InvalidInput(
                f"result_text is only for resolution 'applied', not {resolution!r}: drop it"
            )
        if not isinstance(note, str):
            raise InvalidInput(f"note must be a string, got {type(note).__name__}")
        pos = _position(position, "resolve() position")
        events = [Event(RESOLUTIONS[resolution], pos)]
        call = self._state.call(pos)
        if call is not None and call.stage is Stage.RESUME and call in self.recovery_required():
            events.insert(0, Event(Action.Recover, pos))
        contents = {pos: result_text} if result_text is not None else {}
        return self._advance(events, contents, {}, note)

    def cancel(self, position: CallPosition, *, note: str = "") -> SessionState:
        """A user's Stop for the call at ``position``, approved (or needing no
        approval) and never dispatched: ``HumanCancel``.

        The call gets a ``cancelled`` result and is re-decided from the durable
        state (``Recover``: it has a result, so ``skip``), both in ONE commit
        with the audit row ``human_cancel`` (``note`` goes into it).  It can
        never be dispatched afterwards, and its approval authorizes nothing
        any more.  A call that is not approved (reject it instead), already
        dispatched, answered or unknown raises ``ProtocolError`` and nothing is
        written.
        """
        if not isinstance(note, str):
            raise InvalidInput(f"note must be a string, got {type(note).__name__}")
        pos = _position(position, "cancel() position")
        return self._advance(
            [Event(Action.HumanCancel, pos), Event(Action.Recover, pos)], {}, {}, note or None
        )

    # -- reading ------------------------------------------------------------------

    def audit(self) -> list[AuditRow]:
        """The session's audit rows, as stored, oldest first."""
        if self._create:  # nothing is stored yet (new())
            return []
        return self._store.audit(self._session_id)

    def call_arguments(self, position: CallPosition) -> dict[str, Any] | None:
        """The arguments of the call at ``position``: from memory, else from the store."""
        position = _position(position, "call_arguments() position")
        text = self._arguments.get(position)
        if text is not None:
            value: dict[str, Any] = json.loads(text)
            return value
        call = self._state.call(position)
        if call is not None and call.message is not MessageState.DURABLE:
            return None
        return self._store.call_arguments(self._session_id, position)

    # -- the one place that commits -----------------------------------------------

    def _advance(
        self,
        events: list[Event],
        contents: dict[CallPosition, str],
        arguments: dict[CallPosition, Mapping[str, Any]],
        human_note: str | None,
        voids: list[Void] | None = None,
    ) -> SessionState:
        for ev in events:
            if not isinstance(ev, Event):
                raise InvalidInput(f"expected Event values, got {type(ev).__name__}")
            if ev.action is Action.Crash:
                raise InvalidInput(
                    "a Crash cannot be part of a batch: commit the batch, then call Ledger.reload()"
                )
            if ev.action in (Action.ConversationRepair, Action.ConversationRenumber):
                # The conversation's own rewrites: the ledger store is exactly
                # what they do not touch, so there is nothing to commit.  The
                # checkers apply them to the core's state (toolledger.check).
                raise InvalidInput(
                    f"{ev.action} is a rewrite of the engine's conversation, not a ledger "
                    "step: the ledger keeps its records; record the call the provider emits "
                    "next as usual (it goes through Recover if its id has a record)"
                )
            if ev.position is not None:
                _position(ev.position, f"the position of {ev.action} events")
        for key, text in contents.items():
            _position(key, "a key of result_content")
            if not isinstance(text, str):
                raise InvalidInput(f"result content for {key} must be a string, got {text!r}")
        emitted = {ev.position for ev in events if ev.action is Action.ProviderEmitCall}
        for key in arguments:
            if _position(key, "a key of arguments") not in emitted:
                raise InvalidInput(
                    f"arguments were given for {key}, but the events emit no call there: give "
                    "them with the call's ProviderEmitCall"
                )

        outside = {_position(v.position, "a Void's position")[0] for v in voids or ()
                   if isinstance(v, Void) and self._state.call(v.position) is None}
        # a lost response settled outside the working set: its stored calls come in
        # for this step (pruned again after it), nothing in memory changes before
        base = self._with_turns(outside) if outside else self._state
        start = state = self._windows_passed(base)
        rows: list[AuditRow] = []
        pending = dict(self._arguments)
        decisions = dict(self._decisions)
        unused = dict(contents)
        last_turn = last_durable_turn(start)
        # a Void of a call durable already (a lost response's) comes first: the new
        # response's ProviderEmitCall must find it superseded; one of a call this batch
        # persists (a same-call) comes after the events
        early = [v for v in voids or () if isinstance(v, Void)
                 and v.kind not in APPROVAL_KINDS and start.call(v.position) is not None]
        for void in early:
            state = self._void(state, void, rows)
        for ev in events:
            if ev.action in _DISPATCHES and ev.at is None:
                ev = replace(ev, at=self._clock())  # kept in the record as its first dispatch
            before = state
            if (
                ev.action is Action.ProviderEmitCall
                and ev.position is not None
                and last_turn is not None
                and ev.position[0] < last_turn
                and before.call(ev.position) is None
                and self._store.call_exists(self._session_id, ev.position)
            ):
                # The core's own guard, for a settled call outside the working set.
                raise ProtocolError(ev.action, ev.position, "a call is already at that position")
            decision: Decision | None = None
            if ev.action is Action.Recover and ev.position is not None:
                call = before.call(ev.position)
                if call is not None:
                    decision = decide_recovery(recovery_inputs(before, call)).decision
            after = apply(before, ev)  # ProtocolError: nothing has been written
            pos = ev.position
            if pos is not None and pos in arguments and ev.action is Action.ProviderEmitCall:
                pending[pos] = self._checked_arguments(ev, arguments[pos])
            if pos is not None and pos in unused:
                after, used = _attach_content(ev, after, unused[pos])
                if used:
                    del unused[pos]
            elif pos is not None and ev.action is not Action.HumanResolveAbandon and (
                _takes_content(ev, after)
            ):
                # The result's content is the answer the tool (or a human) gave: a
                # result recorded without it would be an empty tool result forever.
                raise InvalidInput(_NO_CONTENT.get(ev.action, _NO_CONTENT[None]).format(
                    action=ev.action.value, pos=pos
                ))
            rows.extend(self._rows(ev, before, after, decision, decisions, human_note))
            if pos is not None:
                if decision is not None:
                    decisions[pos] = decision.value
                elif ev.action in _RECONCILE:
                    decisions[pos] = Decision.RECONCILE.value
                elif ev.action in _HUMAN:
                    decisions[pos] = Decision.RECOVERY_REQUIRED.value
                elif ev.action is Action.EnginePersistDispatched:
                    decisions.pop(pos, None)
            state = after
        for void in voids or ():
            if void not in early:
                state = self._void(state, void, rows)
        if unused:
            raise InvalidInput(
                f"result content was given for {sorted(unused)}, but no event creates a result "
                "there: give it with EngineRecordSucceeded/EngineRecordFailed (protected "
                "tools) or EngineAppendResult (readonly tools)"
            )

        if rows or state is not start:  # the store writes nothing for an empty plan
            was_durable = {c.position for c in start.calls if c.message is MessageState.DURABLE}
            new_args = {
                c.position: json.loads(pending[c.position])
                for c in state.calls
                if c.message is MessageState.DURABLE
                and c.position not in was_durable
                and c.position in pending
            }
            if self._create:  # the session's first commit creates it (new())
                self._store.commit(
                    self._session_id, start, state, rows, arguments=new_args, create=True
                )
                self._create = False
            elif self._epoch is None:
                self._store.commit(self._session_id, start, state, rows, arguments=new_args)
            else:
                self._store.commit(
                    self._session_id, start, state, rows, arguments=new_args, epoch=self._epoch
                )
        kept = working_set(state)
        if kept is not state:
            positions = {c.position for c in kept.calls}
            pending = {k: v for k, v in pending.items() if k in positions}
            decisions = {k: v for k, v in decisions.items() if k in positions}
        self._state = kept
        self._arguments = pending
        self._decisions = decisions
        return kept

    def _with_turns(self, turns: set[int]) -> SessionState:
        """The working set with the stored calls of ``turns`` in it (settled calls a
        step must touch: a Void of a lost response outside the working set); the
        commit after the step prunes them again (:func:`working_set`)."""
        st = self._state
        for turn in sorted(turns):
            got = self.turn_state(turn)
            have = {c.position for c in st.calls}
            extra = tuple(c for c in got.calls if c.position not in have)
            if not extra:
                continue
            st = replace(
                st,
                calls=tuple(sorted(st.calls + extra, key=lambda c: c.position)),
                approvals={**got.approvals, **st.approvals},
                approval_digests={**got.approval_digests, **st.approval_digests},
                ledger={**got.ledger, **st.ledger},
                audit=st.audit | got.audit,
            )
        return st

    def _void(self, state: SessionState, void: Void, rows: list[AuditRow]) -> SessionState:
        """``void`` applied to ``state`` (its audit row appended to ``rows``)."""
        approval = isinstance(void, Void) and void.kind in APPROVAL_KINDS
        if not isinstance(void, Void) or not (approval or void.kind in (SUPERSEDED, SAME_CALL)):
            raise InvalidInput(f"expected a Void of kind superseded, same_call or one of "
                               f"{sorted(APPROVAL_KINDS)}, got {void!r}")
        if approval != (void.attempt is not None) or (approval and void.result is not None):
            raise InvalidInput(f"an approval row's Void carries its round (attempt) and no "
                               f"result, any other none: got {void!r}")
        pos = _position(void.position, "a Void's position")
        c = state.call(pos)
        if c is None or c.message is not MessageState.DURABLE:
            raise InvalidInput(f"a Void names no durable call at {pos}")
        rec = state.record(c.execution_id)
        n = rec.attempt if void.attempt is None else void.attempt
        key = (c.execution_id, void.kind, n)
        if key in state.audit or (void.kind == SUPERSEDED and state.superseded(c.execution_id)):
            raise ProtocolError(void.kind, pos, "the call is already marked so")
        inputs = recovery_inputs(state, c).as_dict()
        out = state._with_audit(key)
        if void.result is not None:
            if c.result is not None or rec.status is not LedgerStatus.NONE:
                raise ProtocolError(void.kind, pos, "only a call never dispatched and "
                                    "without a result is voided")
            res = ToolResult(ResultKind.CANCELLED, c.execution_id, c.args_digest, void.result)
            out = out._with_call(replace(c, result=res, stage=Stage.NONE))
        human = void.kind in (APPROVED, REJECTED)
        rows.append(AuditRow(
            session_id=self._session_id, execution_id=c.execution_id,
            tool_call_id=c.tool_call_id, position=c.position, kind=void.kind,
            attempt=n, authorization=Authorization.HUMAN if human else Authorization.NONE,
            recovery_decision=None, inputs=inputs, note=void.note,
        ))
        return out

    def _windows_passed(self, state: SessionState) -> SessionState:
        """The protocol's ``RetentionWindowPasses`` for every idempotent call
        whose key's retention window (the tool's ``retention_window``, from the
        record's first dispatch time) has passed by the clock: from then on its
        recovery inputs say ``key_retained = False``.  In memory only: the
        durable facts (dispatch time, window) are stored, the clock is read."""
        now: float | None = None
        for c in state.calls:
            window = c.tool.retention_window
            if window is None:  # the usual tool: no record to look at (per state read)
                continue
            rec = state.record(c.execution_id)
            if (
                rec.dispatched_at is None
                or rec.status is LedgerStatus.NONE
                or c.execution_id in state.retention_passed
            ):
                continue
            if now is None:
                now = self._clock()
            if now - rec.dispatched_at >= window:
                state = apply(state, Event(Action.RetentionWindowPasses, c.position))
        return state

    @staticmethod
    def _checked_arguments(ev: Event, given: Mapping[str, Any]) -> str:
        text = arguments_json(given)
        assert ev.tool is not None and ev.args_digest is not None  # apply() checked both
        if args_digest(ev.tool.name, given) != ev.args_digest:
            raise InvalidInput(
                f"the arguments given for call {ev.position} do not match the event's "
                f"args_digest {ev.args_digest}: pass the arguments the model emitted"
            )
        return text

    def _rows(
        self,
        ev: Event,
        before: SessionState,
        after: SessionState,
        decision: Decision | None,
        decisions: Mapping[CallPosition, str],
        human_note: str | None,
    ) -> list[AuditRow]:
        added = set(after.audit - before.audit)
        if ev.action is Action.Recover and ev.position is not None:
            # every decision has its own row: one taken again for an attempt an
            # earlier row of that kind covers is written too (its key is not new)
            call_before = before.call(ev.position)
            key = None if call_before is None else decision_audit_key(before, call_before)
            if key is not None:
                added.add(key)
        # dispatch rows after the decision/resolution rows they follow from
        keys = sorted(added, key=lambda k: (k[1] == "dispatch", k))
        by_eid = {c.execution_id: c for c in before.calls}
        rows = []
        for eid, kind, attempt in keys:
            call = by_eid[eid]  # the core audits only calls that exist
            old, new = before.record(eid), after.record(eid)
            recovery: str | None
            if ev.action is Action.Recover:
                assert decision is not None and decision.value == kind, (decision, kind)
                recovery, auth = decision.value, old.authorization
                note = f"recovery decision {kind} for attempt {attempt}"
            elif ev.action is Action.HumanCancel:
                recovery, auth = None, Authorization.HUMAN
                note = human_note or "cancelled by the user before dispatch (Stop)"
            elif ev.action in _HUMAN:
                recovery, auth = Decision.RECOVERY_REQUIRED.value, Authorization.HUMAN
                note = (
                    f"attempt {attempt} dispatched, authorized by a human"
                    if kind == "dispatch"
                    else human_note or f"resolved by a human: {kind}"
                )
            elif kind == "dispatch":
                recovery, auth = decisions.get(call.position), new.authorization
                note = f"attempt {attempt} dispatched, authorized by {auth.value}"
            elif ev.action in _RECONCILE:
                recovery, auth = Decision.RECONCILE.value, old.authorization
                note = f"the connector answered for attempt {attempt}: {kind}"
            else:
                recovery, auth = decisions.get(call.position), new.authorization
                note = kind
            rows.append(
                AuditRow(
                    session_id=self._session_id,
                    execution_id=eid,
                    tool_call_id=call.tool_call_id,
                    position=call.position,
                    kind=kind,
                    attempt=attempt,
                    authorization=auth,
                    recovery_decision=recovery,
                    inputs=recovery_inputs(before, call).as_dict(),
                    note=note,
                )
            )
        return rows


_NO_CONTENT: Final[Mapping[Action | None, str]] = {
    Action.HumanResolveApplied: (
        "{action} at {pos} creates the call's tool result, but no result content was given: "
        "use resolve({pos}, 'applied', result_text=...) with what the external system "
        "answered"
    ),
    None: (
        "{action} at {pos} creates the call's tool result, but no result content was given: "
        "pass the tool's answer, step(event, result_content=text) or "
        "step_many(events, result_content={{{pos}: text}}) ('' only if the tool really "
        "answered nothing); nothing was written"
    ),
}


def _takes_content(ev: Event, after: SessionState) -> bool:
    """Whether ``ev`` created a result whose content the caller gives (see ``_attach_content``)."""
    assert ev.position is not None
    call = after.call(ev.position)
    if call is None:
        return False
    if ev.action in _RECORD_RESULT:
        return True
    return ev.action in _CALL_RESULT and (
        ev.action is Action.EngineRecordDenied or not call.tool.protected
    )


def _attach_content(ev: Event, after: SessionState, text: str) -> tuple[SessionState, bool]:
    """Put ``text`` into the result ``ev`` created; (new state, whether one was created)."""
    assert ev.position is not None
    call = after.call(ev.position)
    assert call is not None
    if ev.action in _RECORD_RESULT:
        rec = after.record(call.execution_id)
        assert rec.result is not None
        return after._with_record(replace(rec, result=replace(rec.result, content=text))), True
    if ev.action in _CALL_RESULT and (
        ev.action is Action.EngineRecordDenied or not call.tool.protected
    ):
        assert call.result is not None
        return after._with_call(replace(call, result=replace(call.result, content=text))), True
    return after, False
