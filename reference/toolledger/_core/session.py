"""The adopter's API: an engine protects its tool calls without narrating the spec.

Private module of :mod:`toolledger`: import the public names from ``toolledger``.
The values a session takes and gives (:class:`Tool`, :class:`Outcome`,
:class:`NotApplied`, :class:`CallStatus`, :class:`Attempt`, ...) are in
:mod:`toolledger._core.calls`; this module re-exports them.

Theory of operation
-------------------
A :class:`Session` is one conversation's tool calls, kept by a
:class:`~toolledger._core.ledger.Ledger` on a store (:class:`~toolledger._core.stores.MemoryStore`
for tests, :class:`~toolledger._core.sqlite_store.SqliteStore` for real).  It speaks
the engine's language and feeds the ledger the protocol's events itself, in
the order and with the transactions the spec checks:

- :meth:`Session.record` makes the calls of one assistant message durable
  (and parks the approvals they need) in ONE transaction, after validating
  every call: nothing is written if any call is bad.
- :meth:`Session.approve` / :meth:`Session.reject` answer an approval, keyed by
  the call's execution id (:attr:`CallRef.key`): the key for the host's inbox.
- :meth:`Session.dispatch` (a context manager) and :meth:`Session.execute` (the
  same with a function) run one call: ``dispatched`` is durable before the
  body runs; the body gets the execution id, the idempotency key and the
  attempt number (:class:`Attempt`); the outcome is classified and recorded,
  ``succeeded`` + the tool result in ONE transaction.  A protected call costs
  exactly two transactions, a ``readonly`` call no ledger transaction.
- :meth:`Session.execute_many` runs calls in sequence with fewer commits
  (``succeeded(k)`` + ``dispatched(k+1)`` in one), and
  :meth:`Session.execute_message` records a message and runs its calls that
  need no human, the first ``dispatched`` in the record's transaction (and,
  on a session opened with ``lazy_create=True``, the session's creation
  too): n + 1 commits for a new session's n protected calls; with
  ``together=True``, two commits per message (every ``dispatched`` in the
  record's transaction, every outcome in one), at the price of a wider crash
  window (every call of the message dispatched-and-unknown after a crash).
- :meth:`Session.recover` says, for every call the restarted (or the live)
  engine must still act on, what to do next (:class:`Next`), with the core's
  recovery decision and its inputs; a retry runs through :meth:`Session.execute`
  again and a reconcile through :meth:`Session.reconcile`.
- :meth:`Session.resolve` applies a human's answer to a halted call and
  everything that follows it.
- :meth:`Session.cancel` is a user's Stop for an approved call that was never
  dispatched (the protocol's ``HumanCancel``): a ``cancelled`` result, in
  ONE transaction; it never runs afterwards.
- :meth:`Session.adopt` puts a session that ran without the ledger under it,
  from plain message dicts; its unanswered calls follow the conservative
  legacy rule.

Outcome classification
----------------------
An engine's tools return or raise; the protocol needs "applied", "definitely
not applied" or "unknown".  In :meth:`Session.dispatch`:

1. a return (``done(value)``, or the function's return in :meth:`Session.execute`)
   is **applied**: the value becomes the tool result;
2. :class:`NotApplied` raised by the tool is **definitely not applied** (the
   external system refused the request, or it never left); a
   :class:`KeyAnswer` (:class:`KeyInFlight`, :class:`KeyParamsDiffer`,
   :class:`ReplayedFailure`: an API's answer under the key that does not say
   whether the effect happened, docs/protocol.md#real-apis-answers) is
   **unknown**, whatever the rules below say;
3. else the tool's ``classify`` hook (:class:`Tool`) may answer
   :attr:`Outcome.NOT_APPLIED` or :attr:`Outcome.UNKNOWN`;
4. else, for a tool declared ``marks_send=True``, an exception raised before
   the body called :meth:`Attempt.sending` is **definitely not applied** (the
   request had not left; for such a tool, ``sending()`` is the moment the
   spec's ``EngineInvokeAdapter`` happens, for any other tool it is the start
   of the body);
5. everything else is **unknown**, and the session makes the decision a
   restarted engine would make: ``manual`` halts for a human, ``idempotent``
   asks for a retry with the same key, ``reconcile`` asks for a reconcile.

A definite failure is recorded as a ``failed`` result whose text is
``{"error": ..., "error_type": ...}`` (the model sees the error).  An
exception that is not an ``Exception`` (``KeyboardInterrupt``, a simulated
crash) is taken for the process going away: nothing is recorded, the call
stays ``dispatched`` as a crash leaves it, the exception propagates, and the
Session starts nothing more (:class:`SessionInterrupted`): open a new one and
:meth:`Session.recover`, as a restarted engine does.

Positions
---------
A call's position is ``(message sequence number, index in the message)``.
By default the LEDGER assigns the number (:meth:`Session.record` without
``seq``): its own durable, monotone sequence, taken in the commit that
records the response; the engine says what its history shows (``seen``)
and the ledger tells a new response from a re-record of the latest one and
from a re-emission replacing a lost one (docs/protocol.md#placing-a-response,
docs/protocol.md#superseding-a-lost-response).  An engine may pass its own
number instead: one it assigns to the assistant message and persists with
it, never a list index (a repair or a trim shifts a list index, and the
number goes into the execution id).

Threads
-------
A Session may be used from several threads (engines run tools in worker
threads): every method takes the session's lock while it reads or changes
the ledger, and releases it while a tool body runs, so calls of one message
may run in parallel; :meth:`Session.execute_message` ``(concurrency=w)`` runs
up to ``w`` bodies of a message at once in its own worker threads (each call's
``dispatched`` durable before its body, the same commit counts; see
docs/adopting.md).  Running the same call twice at once is an error
(:class:`CallBusy`), never a second dispatch.

Store errors
------------
A commit that fails (:class:`~toolledger._core.stores.StoreError`: a stale
state, a lost connection, a timeout) propagates to the engine, and the
session reloads the durable state first, as a restarted engine would.  If
that reload fails too (the server is still down), the engine gets the
commit's own error, with a note saying so, and the session starts nothing
until a reload succeeds: its next call reloads first (or raises the store's
error again); then :meth:`Session.recover` says what to do.  A commit refused
for a lost lease (:class:`~toolledger._core.stores.LeaseLost`: another worker
took the session) is the exception: the session does not reload, and every
later call that would start something raises ``LeaseLost`` without touching
the store (a worker that reloaded under its old epoch would decide again
forever, each commit refused, and keep the session from its owner; open a
new Session with ``take_session=True`` to own it again).

What is not here: this module never decides recovery itself
(:func:`~toolledger._core.protocol.decide_recovery` does) nor writes anything
but through the :class:`~toolledger._core.ledger.Ledger` (legacy adoption aside,
which writes the spec's initial legacy state through the store).  Its parts
live next to it: :mod:`~toolledger._core.session_guard` (the lock and the
store-error guard every step goes through), :mod:`~toolledger._core.call_input`
(validating tool declarations and call dicts), :mod:`~toolledger._core.next_step`
(what a call's state says to do next, the recovery events) and
:mod:`~toolledger._core.legacy` (legacy adoption).
"""

from __future__ import annotations

import contextvars
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Final

from .answers import SEEN, Trailing, answered_calls
from .call_input import check_seq, declared_tools, parse_call
from .calls import (
    _DENIED,
    _UNDECLARED,
    Attempt,
    CallBusy,
    CallRef,
    CallStatus,
    Classifier,
    KeyAnswer,
    Next,
    NotApplied,
    Outcome,
    SessionInterrupted,
    Tool,
    _error_text,
    _result_text,
    check_ttl,
)
from .commit_plan import attributed_note, check_expiry
from .ledger import (
    APPROVAL_EXPIRED,
    APPROVED,
    REJECTED,
    RESOLUTIONS,
    SAME_CALL,
    SUPERSEDED,
    Ledger,
    Void,
)
from .legacy import legacy_calls, write_legacy
from .next_step import (
    approval_round,
    approval_withdrawn,
    approved,
    denied_contents,
    next_of,
    recovery_decision,
    recovery_events,
)
from .placement import Placement, placement, same_call_slots
from .protocol import (
    Action,
    ApprovalState,
    CallPosition,
    CallState,
    Decision,
    Event,
    ExecutionRecord,
    InvalidInput,
    LedgerStatus,
    MessageState,
    ProtocolError,
    RecoveryInputs,
    RecoveryPolicy,
    ResultKind,
    SessionState,
    Stage,
    ToolProfile,
    args_digest,
)
from .session_guard import LedgerGuard
from .stores import Store, UnknownSession, last_durable_turn
from .tools import (
    CannotTell,
    NotAppliedFenced,
    ReconcileAnswer,
    WasApplied,
)

# A record a stale worker may still hold a request of (Session.open's announce_epoch).
_UNANSWERED: Final = frozenset({LedgerStatus.DISPATCHED, LedgerStatus.RECOVERY_REQUIRED})

__all__ = [
    "Attempt",
    "CallBusy",
    "CallRef",
    "CallStatus",
    "Classifier",
    "Next",
    "NotApplied",
    "Outcome",
    "Session",
    "SessionInterrupted",
    "Tool",
]


class _Run:
    """The shared state of one message's concurrent run (under the session's lock)."""

    def __init__(self, keys: list[str]) -> None:
        self.queue: deque[str] = deque(keys)  # not started yet, in the message's order
        self.out: dict[str, CallStatus] = {}
        self.error: Exception | None = None  # the session's first error
        self.crash: BaseException | None = None  # the first BaseException of a body
        self.stopped = False


class _Abandoned(BaseException):
    """A body ended after a sibling's crash: nothing is recorded for it."""

    def __init__(self, first: str) -> None:
        super().__init__(first)
        self.first = first


# --------------------------------------------------------------------------
# The session
# --------------------------------------------------------------------------


class Session(LedgerGuard):
    """One session's tool calls on a store; see the module documentation.

    Build it with :meth:`open` (or :meth:`adopt`); one per session per
    process.  ``tools`` maps tool names to :class:`Tool` (or just a policy
    string); a tool not named there is ``manual`` and requires approval.

    ``observe`` is for test harnesses (fault injection, tracing), not for
    engines: it is called with the events of every step the session makes, right
    after the step (and its commit, if any), under the session's lock (a human's
    resolution, one :meth:`~toolledger._core.ledger.Ledger.resolve`, excepted).
    """

    def __init__(
        self,
        ledger: Ledger,
        tools: Mapping[str, Tool | str] | None = None,
        *,
        observe: Callable[[Sequence[Event]], None] | None = None,
        approval_ttl: float | None = None,
    ) -> None:
        super().__init__(ledger, observe)  # the ledger, the lock, the guarded steps
        self._tools = declared_tools(tools)
        self._approval_ttl = check_ttl(approval_ttl, "approval_ttl")
        # (execution id, approval round) -> when that approval expires (None: never),
        # from its "approved" audit row (approve() fills it; a restart reads the audit)
        self._expiry: dict[tuple[str, int], float | None] = {}
        self._running: set[str] = set()  # keys whose tool body runs now
        # execute_many: (key, next key) while key runs; its success commit may
        # carry next key's dispatched (see execute_many)
        self._chain: tuple[str, str] | None = None
        # execute_message(together=True): keys whose outcome commit is deferred, and
        # the deferred outcomes (events, result text) by key, committed together
        self._defer_keys: set[str] = set()
        self._deferred: dict[str, tuple[list[Event], str]] = {}

    # -- opening --------------------------------------------------------------

    @classmethod
    def open(
        cls,
        store: Store,
        session_id: str,
        tools: Mapping[str, Tool | str] | None = None,
        *,
        max_attempts: int = 3,
        legacy_messages: Sequence[Mapping[str, Any]] | None = None,
        legacy_approvals: Mapping[str, str] | None = None,
        legacy_held: Callable[[Mapping[str, Any]], bool] | None = None,
        take_session: bool = False,
        clock: Callable[[], float] = time.time,
        lazy_create: bool = False,
        announce_epoch: Callable[[CallRef, int], object] | None = None,
        approval_ttl: float | None = None,
    ) -> Session:
        """The session ``session_id`` of ``store``, created if it does not exist.

        ``lazy_create=True``: a session that does not exist is created by its
        first commit, in that commit's transaction, instead of by a commit of
        its own now (:meth:`~toolledger._core.ledger.Ledger.new`); with
        :meth:`execute_message`, opening the session, recording the
        message's calls and dispatching the first one are then ONE
        transaction.  A crash before it leaves no trace of the session.

        With ``legacy_messages`` (the conversation so far, of a session that
        ran without the ledger), a new session is adopted (:meth:`adopt`;
        ``legacy_held`` is its ``held``).
        ``take_session=True`` (an existing session) takes the session's lease
        (:class:`~toolledger._core.ledger.Ledger`): a worker that lost the
        session since cannot commit, and tools get the epoch (``Attempt.epoch``).
        ``clock`` (seconds since the epoch) is what the ledger records as a
        call's first dispatch and compares with a tool's ``retention_window``:
        a test moves it instead of waiting the window out; it also decides whether
        an approval has expired.  ``approval_ttl``: seconds an approval given in
        this session holds unless its tool declares its own (``Tool.approval_ttl``)
        or ``approve(..., expires_at=...)`` says (default: until the call runs;
        docs/protocol.md#approvals-that-expire).

        ``announce_epoch(call, epoch)`` (with ``take_session=True``): the
        worker that took the session makes its epoch known to the external
        side BEFORE it decides anything (the spec's ``AnnounceEpoch``): it is
        called once for every protected call of the session without a result
        whose record is dispatched or halted for a human, so that an
        epoch-aware connector refuses the request of a worker declared dead
        between its dispatched commit and its send, even when this worker
        (or its human) resolves the call without sending anything
        (docs/protocol.md#concurrent-resumers).  An exception from it
        propagates: the session is not returned, nothing but the lease was
        written, and opening again announces again.
        """
        if announce_epoch is not None and not (take_session and callable(announce_epoch)):
            raise InvalidInput(
                "announce_epoch(call, epoch) needs take_session=True (there is no epoch to "
                f"announce without the lease) and must be callable, got {announce_epoch!r}; "
                "nothing was written"
            )
        declared = declared_tools(tools)
        check_ttl(approval_ttl, "approval_ttl")
        try:
            ledger = Ledger(store, session_id, take_session=take_session, clock=clock)
        except UnknownSession:
            if legacy_messages:
                adopted = cls.adopt(store, session_id, legacy_messages, tools,
                                    approvals=legacy_approvals, held=legacy_held,
                                    max_attempts=max_attempts)
                adopted._approval_ttl = check_ttl(approval_ttl, "approval_ttl")
                return adopted
            make = Ledger.new if lazy_create else Ledger.create
            ledger = make(store, session_id, max_attempts=max_attempts, clock=clock)
        else:
            marker = ledger.state.marker
            if legacy_messages and marker > 0 and not ledger.state.calls:
                # Created, but maybe the process died before the legacy calls were
                # written (adoption is two commits): write what is missing.  With
                # no call in the store at all, none of them was written.
                legacy = legacy_calls(legacy_messages[:marker], declared,
                                      legacy_approvals or {}, legacy_held)
                if legacy:
                    write_legacy(ledger, legacy)
                    ledger = Ledger(store, session_id, clock=clock)
        session = cls(ledger, declared, approval_ttl=approval_ttl)
        if announce_epoch is not None and ledger.epoch is not None:
            session._announce_epoch(announce_epoch, ledger.epoch)
        return session

    @property
    def epoch(self) -> int | None:
        """The lease epoch this session's ledger took (``None``: ``take_session=False``)."""
        return self._ledger.epoch

    def _announce_epoch(self, announce: Callable[[CallRef, int], object], epoch: int) -> None:
        """``announce(call, epoch)`` for every call a stale worker may still send (open)."""
        state = self._ledger.state
        for c in state.calls:
            if (c.tool.protected and c.result is None
                    and state.record(c.execution_id).status in _UNANSWERED):
                announce(self._ref(c), epoch)

    @classmethod
    def adopt(
        cls,
        store: Store,
        session_id: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Mapping[str, Tool | str] | None = None,
        *,
        approvals: Mapping[str, str] | None = None,
        held: Callable[[Mapping[str, Any]], bool] | None = None,
        max_attempts: int = 3,
    ) -> Session:
        """Put a session that ran without the ledger under it.

        ``messages`` are plain dicts: ``{"role": "assistant", "tool_calls":
        [{"id", "function": {"name", "arguments"}}]}`` (or ``{"id", "name",
        "arguments"}``) and ``{"role": "tool", "tool_call_id": ...}``.  Legacy
        positions are ``(index in messages, index in the message)``; new
        messages must get sequence numbers ``>= len(messages)`` (the protocol
        marker).  ``held(call)`` (each raw call dict of an assistant message):
        whether the ledger holds it, as the engine's glue gives calls to
        :meth:`record` (``None``: every call); a call it does not hold (an
        interactive tool the engine answered inline, a malformed or unknown
        call) is not adopted, and the held calls keep slots 0..n-1, so that the
        glue's re-record finds them.  A call is answered if a tool message with
        its id follows it before the next assistant message; an answer goes to
        a call the ledger does not hold first, and where fewer answers than
        held calls share an id (``""``), none of those takes one: it is never
        guessed (docs/protocol.md#placing-a-response).  Every unanswered call is written
        as the spec's initial legacy state, with its approval from
        ``approvals`` (tool_call_id -> ``"approved"``, ``"rejected"`` or
        ``"pending"``, the host's inbox); :meth:`recover` then applies the
        conservative legacy rule: approved (or needing no approval), no
        result, no record: halted for a human.  Nothing is executed.  Every
        call is validated before anything is written.
        """
        declared = declared_tools(tools)
        parsed = legacy_calls(messages, declared, approvals or {}, held)  # validates first
        ledger = Ledger.create(store, session_id, marker=len(messages),
                               max_attempts=max_attempts)
        write_legacy(ledger, parsed)
        return cls(Ledger(store, session_id) if parsed else ledger, declared)

    # -- reading ----------------------------------------------------------------

    @property
    def session_id(self) -> str:
        return self._ledger.session_id

    @property
    def marker(self) -> int:
        """The first message sequence number governed by the ledger."""
        return self._ledger.state.marker

    @property
    def ledger(self) -> Ledger:
        """The underlying ledger (for audits and checkers; do not step it yourself)."""
        return self._ledger

    def audit(self) -> list[Any]:
        """The session's audit rows, oldest first."""
        with self._lock:
            return list(self._ledger.audit())

    def call(self, key: str) -> CallRef:
        """The recorded call with execution id ``key`` (unanswered or of the last message)."""
        with self._usable():
            return self._ref(self._find(key))

    def status(self, key: str) -> CallStatus:
        """Where the call ``key`` stands now and what to do next (nothing is written).

        A call interrupted by a restart has no status until :meth:`recover`
        decided it (:class:`InvalidInput` says so)."""
        with self._usable():
            return self._status_now(self._find(key))

    def pending_approvals(self) -> list[CallRef]:
        """Calls waiting for an approval: what the host's inbox shows."""
        with self._usable():
            st = self._ledger.state
            return [self._ref(c) for c in st.calls if c.result is None
                    and (st.approval(c.execution_id) is ApprovalState.PENDING
                         or approval_withdrawn(st, c))]

    def find(
        self,
        call: Mapping[str, Any],
        *,
        response: Sequence[Mapping[str, Any]] | None = None,
    ) -> CallStatus | None:
        """The recorded call the engine has in hand, by what it has.

        ``None``: no such call among the calls the engine can still act on
        (the latest message and every message with a call without a result):
        not recorded yet, or settled in an earlier message (``record(seq,
        calls)`` with its :attr:`CallRef.position` returns those).

        ``call`` is the provider's call dict (id, name, arguments), as given to
        :meth:`record`.  With ``response`` (the calls of the message it came
        in, as recorded): the call of that recorded message, found as
        :meth:`record` would place it with ``seen=[]`` (the latest message, or
        the one with exactly these calls).  Without it (an engine that decides
        approval one call at a time, with no position): the most recent
        recorded call with that id, name and arguments, among the calls the
        engine can still act on (the latest message and every call without a
        result); :class:`InvalidInput` if its message holds that call more
        than once (an empty or reused id): one equal call is never given the
        other's status.  Record the response first: a call the model repeats is only
        found as the new one once it is recorded.  Nothing is written; a call
        that is the same call as a dispatched call of a lost response gives
        that call's status.
        """
        cid, name, digest_args = parse_call(0, call)
        wanted_one = (cid, name, args_digest(name, digest_args))
        with self._usable():
            st = self._ledger.state
            if response is not None:
                _, calls_ = self._seq_and(response, None, "find")
                wanted = [(i, n, args_digest(n, a))
                          for i, n, a in (parse_call(j, c) for j, c in enumerate(calls_))]
                slots = [j for j, w in enumerate(wanted) if w == wanted_one]
                if not slots:
                    raise InvalidInput("find(call, response=...): the call is not one of the "
                                       "response's calls")
                if len(slots) > 1:
                    raise InvalidInput(f"find(call, response=...): the response holds this call "
                                       f"{len(slots)} times (slots {slots}): use the statuses "
                                       "record() returned, in slot order")
                turns = sorted({c.position[0] for c in st.calls}, reverse=True)
                for turn in turns:
                    there = self._turn(turn, last_durable_turn(st))
                    if _same_calls(there, wanted):
                        c = there.call((turn, slots[0]))
                        assert c is not None
                        return self._status_of(c)
                return None
            for c in sorted(st.calls, key=lambda c: c.position, reverse=True):
                if (c.message is MessageState.DURABLE
                        and (c.tool_call_id, c.tool.name, c.args_digest) == wanted_one):
                    there = self._turn(c.position[0], last_durable_turn(st))
                    slots = [d.position[1] for d in there.calls
                             if (d.tool_call_id, d.tool.name, d.args_digest) == wanted_one]
                    if len(slots) > 1:  # never one equal call's status for the other
                        raise InvalidInput(
                            f"find(call): message {c.position[0]} holds this call "
                            f"{len(slots)} times (slots {slots}, the same id, name and "
                            "arguments): the call alone cannot tell them apart; use the "
                            "statuses record() returned, in slot order; nothing was written")
                    return self._status_of(c)
            return None

    # -- recording calls --------------------------------------------------------

    def record(
        self,
        seq: int | Sequence[Mapping[str, Any]] | None,
        calls: Sequence[Mapping[str, Any]] | None = None,
        *,
        requires_approval: Sequence[bool | None] | None = None,
        seen: Iterable[str] | None = None,
    ) -> list[CallStatus]:
        """Make the calls of one assistant message durable; park their approvals.

        ``record(calls, seen=keys)``: the ledger places the response itself
        (docs/protocol.md#placing-a-response).  ``seen`` is what the engine's
        history shows: the keys (:attr:`CallRef.key`) of the ledger calls whose
        tool results the history holds BEFORE this response (drop-ins carry
        the key on the tool-result messages they create; ``[]`` if none).
        With the latest recorded response ``L``:

        - ``seen`` holds a key of ``L``: the model saw ``L``'s results, so this is
          a NEW response, recorded at the ledger's next sequence number, even
          if its calls are identical to ``L``'s (a model repeating ``call_0
          send(x)`` on purpose runs again);
        - else, the same calls as ``L`` (ids, names, arguments): a re-record of
          ``L`` (a resume): nothing is written, the calls' statuses are returned;
        - else, a re-emission replacing ``L``, which the history lost before it
          was saved: ``L`` is superseded (:meth:`_supersede`) and this response
          is recorded at the next number, in ONE transaction.

        ``record(seq, calls)``: the engine's own persisted sequence number (see
        "Positions"), as before; re-recording ANY recorded message (same ids,
        names, arguments) writes nothing and returns its calls' statuses; a
        message recorded with other calls is a re-emission only if ``seq`` is
        the latest recorded response (or was superseded): then it is placed as
        above with ``seen=[]``; else :class:`InvalidInput`.

        ``calls``: ``{"id", "name", "arguments"}`` dicts (``arguments`` a dict or
        its JSON text; openai's ``{"id", "function": {...}}`` is accepted too);
        the call's index is its slot.  ``requires_approval`` overrides the
        tool's default per call (e.g. a standing grant: ``False``), ``None``
        keeps it.  Everything is validated first; then at most ONE
        transaction.  A re-recorded call interrupted by a restart gets its
        recovery decision first, as in :meth:`recover`.
        """
        seq_, calls_ = self._seq_and(seq, calls, "record")
        return self._record(seq_, calls_, requires_approval, dispatch="none", seen=seen)

    def record_trailing(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        held: Callable[[Mapping[str, Any]], bool] | None = None,
        requires_approval: Callable[[Mapping[str, Any]], bool | None] | None = None,
    ) -> Trailing:
        """Record the trailing response of a chat history; what answers each of its calls.

        For an engine whose conversation is a list of chat message dicts
        (``{"role": "assistant", "tool_calls": [...]}``, ``{"role": "tool",
        "tool_call_id": ...}``), keeping on each tool message it writes for a
        ledger call the call's key (``message[SEEN] = [key]``, :data:`SEEN`;
        a summary that replaces messages keeps theirs).  The trailing
        response is the last message with tool calls; unless a user message
        follows it (``stale``: nothing is recorded), its calls that ``held``
        accepts (each raw call dict; ``None``: every call), the same
        predicate as ``Session.open(legacy_held=...)``, are recorded with
        :meth:`record` (``seen``: the keys the messages before it hold;
        ``requires_approval(call)`` per held call, ``None`` the tool's
        default).  Re-recording writes nothing, so an engine calls this on
        every turn and on every resume.  ``answered`` pairs the tool messages
        after it with its calls by key, never by a reused id
        (:func:`answered_calls`); :meth:`Trailing.unanswered` is what a
        resume re-drives (docs/adopting.md#an-engine-with-openworkers-seams).
        """
        if isinstance(messages, Mapping) or not isinstance(messages, Sequence) or not all(
                isinstance(m, Mapping) for m in messages):
            raise InvalidInput("record_trailing(messages): messages must be a list of message "
                               "dicts; nothing was recorded")
        for name, fn in (("held", held), ("requires_approval", requires_approval)):
            if fn is not None and not callable(fn):
                raise InvalidInput(f"record_trailing: {name} must be a function of one call "
                                   f"dict, got {fn!r}; nothing was recorded")
        at = max((i for i, m in enumerate(messages) if m.get("tool_calls")), default=-1)
        if at < 0:
            return Trailing(-1, (), (), (), False)
        raw = messages[at]["tool_calls"]
        if isinstance(raw, (Mapping, str, bytes)) or not isinstance(raw, Sequence):
            raise InvalidInput(f"record_trailing: message {at}: tool_calls must be a list")
        after = messages[at + 1:]
        stale = any(m.get("role") == "user" for m in after)
        ours = [not stale and (held is None or bool(held(tc))) for tc in raw]
        mine = [tc for tc, o in zip(raw, ours, strict=True) if o]
        seen = [k for m in messages[:at] for k in _seen_on(m)]
        recorded = iter(self.record(mine, seen=seen, requires_approval=[
            None if requires_approval is None else requires_approval(tc) for tc in mine])
            if mine else [])
        statuses = tuple(next(recorded) if o else None for o in ours)
        ids = [tc.get("id") if isinstance(tc, Mapping) else None for tc in raw]
        results = [(m.get("tool_call_id"), next(iter(_seen_on(m)), None))
                   for m in after if m.get("role") == "tool"]
        done = answered_calls([("" if i is None else str(i), st)
                               for i, st in zip(ids, statuses, strict=True)], results)
        return Trailing(at, tuple(raw), statuses, tuple(done), stale)

    @staticmethod
    def _seq_and(
        seq: object, calls: object, what: str
    ) -> tuple[int | None, Sequence[Mapping[str, Any]]]:
        """(seq, calls) of ``record(calls)`` / ``record(seq, calls)`` (and execute_message)."""
        if calls is None:
            if isinstance(seq, int) and not isinstance(seq, bool):
                raise InvalidInput(f"{what}({seq!r}) gives a sequence number but no calls: "
                                   f"{what}(calls, seen=...) or {what}(seq, calls)")
            seq, calls = None, seq
        if seq is not None:
            check_seq(seq)
        if isinstance(calls, (Mapping, str, bytes)) or not isinstance(calls, Sequence):
            raise InvalidInput(f"calls must be a list of call dicts, got {type(calls).__name__}")
        return seq, calls  # type: ignore[return-value]  # checked just above

    def execute_message(
        self,
        seq: int | Sequence[Mapping[str, Any]] | None,
        calls: Sequence[Mapping[str, Any]] | Callable[[Attempt], object],
        fn: Callable[[Attempt], object] | None = None,
        *,
        requires_approval: Sequence[bool | None] | None = None,
        together: bool = False,
        seen: Iterable[str] | None = None,
        concurrency: int = 1,
    ) -> list[CallStatus]:
        """Record the calls of an assistant message and run those that need no human.

        ``execute_message(calls, fn, seen=keys)`` places the response as
        :meth:`record` does (the ledger's own sequence number);
        ``execute_message(seq, calls, fn)`` takes the engine's.

        What an engine does with an assistant message: :meth:`record` its
        calls, then run, in the message's order, every call that can run
        now (needs no approval, or is a re-recorded call to execute or
        retry), each as ``fn(attempt)`` (``attempt.call`` names the call and
        its tool; the return is the result, as in :meth:`execute`), as
        :meth:`execute_many` does.  Calls waiting for an approval, halted or
        to be reconciled are left as they are; their status says what next.
        Returns the status of every call of the message, in order.

        The difference is the number of commits.  When the first call to run
        is protected, its ``dispatched`` goes into the transaction that
        records the message (the spec's ``EnginePersistCall`` ... then
        ``EnginePersistDispatched``, consecutive steps, one commit); with
        :meth:`open` ``(lazy_create=True)`` on a new session, that same
        transaction creates the session.  Then ``succeeded(k)`` + its result
        and ``dispatched(k+1)`` share one commit (:meth:`execute_many`).  So n
        protected calls of a new session take n + 1 commits in all, instead
        of n + 2 (record, then n + 1) or 2n + 2.  Nothing is acted on before
        the commit that makes it durable: a crash before the first commit
        leaves nothing (the engine re-runs the turn from its conversation);
        after it, the first call is dispatched-and-unknown, exactly as after
        its own dispatch commit.  Bad input is refused before anything is
        written or run.

        ``together=True``: the message's calls are dispatched together and
        their outcomes recorded together, so the whole message takes TWO
        commits however many calls it has: [record + ``dispatched`` of every
        protected call that can run now], then every call runs in the
        message's order, then [every outcome + its result].  The calls of one
        assistant message are independent (the model wrote them all before it
        saw any result), and in the spec each call is its own process: these
        are consecutive steps of a behaviour of the spec (the n
        ``EnginePersistDispatched`` steps, the calls' invocations and
        answers, then the n ``EngineRecordSucceeded`` / ``EngineRecordFailed``
        + ``EngineAppendResult`` steps), so every invariant holds of them.
        The price is the crash window: a crash between the two commits
        leaves EVERY dispatched call of the message dispatched-and-unknown,
        including those whose body had not started, and recovery decides
        each by its policy (idempotent: retried under its key; reconcile:
        asked; manual: halted for a human, one recovery item per call where
        the default would leave one).  Choose it for messages of idempotent
        or reconcilable tools, or where throughput matters more than a
        human's work after a crash.  A call whose outcome is unknown is
        decided at once, with the outcomes before it recorded first; an
        exception from the session (not from a tool body) records the
        outcomes known so far before it propagates; a ``BaseException`` in a
        tool body records nothing more, as a crash would.

        ``concurrency=w`` (default 1: one body after the other, in this
        thread): up to ``w`` bodies run at once, each in a worker thread of a
        pool of ``min(w, runnable calls)`` threads made for the message (the
        caller's context variables copied in), taken in the message's order;
        ``fn`` must then be safe to call from several threads at once.  Each
        call is its own process of the spec, so any interleaving of different
        calls' steps is one of its behaviours.  Per-call form: the record
        commit carries the ``dispatched`` of the first ``w`` runnable protected
        calls (a resumed message: one commit of them before any body starts);
        each outcome is committed as its body ends, and a success's commit
        carries the ``dispatched`` of the next call still waiting for a worker,
        which that worker runs next.  So a message of n protected calls still
        takes n + 1 commits, and never more than with ``w = 1``; a crash leaves
        the calls whose bodies were running (or just dispatched for one)
        dispatched-and-unknown.  ``together=True``: still two commits.  Results
        come back in the message's order.  An error of the session in one
        worker (a store error, a call that cannot start) starts no further
        call, lets the running bodies end and record their outcomes, then
        propagates (the first one); a store error makes the
        session reload the durable state, so a body still running then ends
        with its call dispatched-and-unknown, decided by :meth:`recover` as
        after a crash.  A ``BaseException`` in one body records nothing more
        for any call of the message: the others' bodies end, unrecorded, and
        it propagates.  See docs/adopting.md ("Running a message's calls
        concurrently").
        """
        given: tuple[object, object] = (seq, calls)
        if fn is None and callable(calls):
            given, fn = (seq, None), calls  # execute_message(calls, fn)
        if not callable(fn):
            raise InvalidInput(f"execute_message: fn must be a callable taking the Attempt, got "
                               f"{fn!r}; nothing was recorded")
        if not isinstance(together, bool):
            raise InvalidInput(f"execute_message: together must be True or False, got "
                               f"{together!r}; nothing was recorded")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidInput(f"execute_message: concurrency must be an int >= 1 (how many "
                               f"bodies may run at once), got {concurrency!r}; nothing was "
                               "recorded")
        seq_, calls_ = self._seq_and(*given, "execute_message")
        recorded = self._record(seq_, calls_, requires_approval,
                                dispatch="all" if together else concurrency,
                                seen=seen)
        runnable = [st.call.key for st in recorded if st.next in (Next.EXECUTE, Next.RETRY)]
        if concurrency > 1 and len(runnable) > 1:
            ran = dict(zip(runnable, self._execute_concurrently(
                runnable, fn, together=together, workers=min(concurrency, len(runnable))),
                strict=True))
        elif together:
            ran = dict(zip(runnable, self._execute_together(runnable, fn), strict=True))
        else:
            ran = dict(zip(runnable, self.execute_many([(k, fn) for k in runnable]),
                           strict=True))
        return [ran.get(st.call.key, st) for st in recorded]

    def _execute_together(
        self, keys: list[str], fn: Callable[[Attempt], object]
    ) -> list[CallStatus]:
        """Run ``keys`` (dispatched together, see :meth:`execute_message`); ONE outcome commit."""
        with self._usable():
            # a message recorded before (a resume): its runnable calls are dispatched
            # here, together; a new message's were dispatched in its record commit
            pending = [Event(Action.EnginePersistDispatched, c.position)
                       for c in map(self._find, keys) if self._dispatchable(c)]
            if pending:
                self._step_many(pending)
        out: list[CallStatus] = []
        try:
            for key in keys:
                with self._lock:
                    self._defer_keys.add(key)
                try:
                    out.append(self.execute(key, fn))
                finally:
                    with self._lock:
                        self._defer_keys.discard(key)
        except Exception:
            with self._lock:  # the session's own error: what is known is recorded first
                self._flush_deferred(keys)
            raise
        except BaseException:
            with self._lock:  # the process is going away: nothing more is recorded
                for key in keys:
                    self._deferred.pop(key, None)
            raise
        with self._lock:
            self._flush_deferred(keys)
            # an unknown outcome's recovery decision, applied by _unknown, stays in its
            # status (decision, inputs, recovered), as execute_message without together says
            return [replace(self._status_now(self._find(st.call.key)), outcome=st.outcome,
                            error=st.error, decision=st.decision, inputs=st.inputs,
                            recovered=st.recovered) for st in out]

    def _execute_concurrently(
        self, keys: list[str], fn: Callable[[Attempt], object], *, together: bool,
        workers: int
    ) -> list[CallStatus]:
        """Run ``keys`` with up to ``workers`` bodies at once (see :meth:`execute_message`)."""
        run = _Run(keys)
        with self._usable():
            # a message recorded before (a resume): the calls about to start are
            # dispatched here, in ONE commit; a new message's were in its record commit
            first = keys if together else keys[:workers]
            pending = [Event(Action.EnginePersistDispatched, c.position)
                       for c in map(self._find, first) if self._dispatchable(c)]
            if pending:
                self._step_many(pending)
            self._defer_keys.update(keys)  # every outcome waits for its commit, below
        # each worker's first call is its own from the start: a worker whose thread
        # starts late must not find a dispatched call taken and start an undispatched
        # one (one commit more than n + 1)
        firsts = [run.queue.popleft() for _ in range(workers)]
        threads = [threading.Thread(target=contextvars.copy_context().run,
                                    args=(self._concurrent_worker, run, fn, together,
                                          firsts[i]),
                                    name=f"toolledger-{self.session_id}-{i}", daemon=True)
                   for i in range(workers)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        except BaseException as exc:  # the caller is interrupted while waiting: a crash
            with self._lock:
                run.stopped = True
                if self._interrupted_by is None:
                    self._interrupted_by = f"{type(exc).__name__} while a message's calls ran"
                for key in keys:
                    self._deferred.pop(key, None)
            raise
        finally:
            with self._lock:
                self._defer_keys.difference_update(keys)
        with self._lock:
            if run.crash is not None:  # the process is going away: nothing more is recorded
                for key in keys:
                    self._deferred.pop(key, None)
                raise run.crash
            if together:  # ONE commit of every outcome known (before any error propagates)
                self._flush_deferred(keys)
            if run.error is not None:
                raise run.error
            return [replace(self._status_now(self._find(k)), outcome=st.outcome,
                            error=st.error, decision=st.decision, inputs=st.inputs,
                            recovered=st.recovered)
                    for k, st in ((k, run.out[k]) for k in keys)]

    def _concurrent_worker(self, run: _Run, fn: Callable[[Attempt], object],
                           together: bool, first: str | None) -> None:
        """One worker thread of :meth:`_execute_concurrently`: its ``first`` call, then
        calls from the queue until it is empty or the run stops (a session error, a
        crash)."""
        claimed: str | None = None  # dispatched in this worker's last outcome commit
        while True:
            with self._lock:
                if claimed is not None and run.crash is None:
                    key, claimed = claimed, None  # durable as dispatched: it runs now
                elif run.stopped:
                    return
                elif first is not None:
                    key, first = first, None
                elif not run.queue:
                    return
                else:
                    key = run.queue.popleft()
            held = [False]

            def body(a: Attempt, held: list[bool] = held) -> object:
                try:
                    return fn(a)
                finally:
                    # From the body's end until its outcome is committed this worker
                    # holds the lock: a sibling's crash cannot fall in between, and a
                    # body that ends after one records nothing (as after the crash).
                    self._lock.acquire()
                    held[0] = True
                    if self._interrupted_by is not None:
                        raise _Abandoned(self._interrupted_by)
            try:
                try:
                    st = self.execute(key, body)
                    if not together:
                        st, claimed = self._commit_outcome(run, key, st)
                    run.out[key] = st
                except _Abandoned as gone:
                    self._interrupted_by = gone.first  # the crash's own account stays
                    return
                finally:
                    if held[0]:
                        self._lock.release()
            except Exception as exc:  # the session's error: start nothing more
                with self._lock:
                    if run.error is None:  # the first; a later one is its consequence
                        run.error = exc
                    run.stopped = True
                return
            except BaseException as exc:  # a crash in this body
                with self._lock:
                    if run.crash is None:
                        run.crash = exc
                    run.stopped = True
                return

    def _commit_outcome(self, run: _Run, key: str, st: CallStatus
                        ) -> tuple[CallStatus, str | None]:
        """Commit the outcome of ``key`` kept by :meth:`_defer` (lock held), with the
        ``dispatched`` of the next queued call after a success (that call is then
        claimed by this worker; see :meth:`execute_message`)."""
        got = self._deferred.pop(key, None)
        if got is None:  # unknown: decided and recorded by execute itself
            return st, None
        events, text = got
        pos = self._find(key).position
        chained: list[Event] = []
        if (events[0].action is Action.EngineRecordSucceeded and run.queue
                and not run.stopped and self._dispatchable(self._find(run.queue[0]))):
            chained = [Event(Action.EnginePersistDispatched, self._find(run.queue[0]).position)]
        try:  # succeeded + the tool result (+ the next call's dispatched), ONE tx
            self._step_many(events + chained, result_content={pos: text})
        except ProtocolError:
            if not chained:
                raise
            # the next call could not be dispatched after all: record this one alone
            self._step_many(events, result_content={pos: text})
            chained = []
        return st, run.queue.popleft() if chained else None

    def _dispatchable(self, c: CallState) -> bool:
        """Call ``c`` can be dispatched right now (the checks of :meth:`_start`)."""
        if self._expired(c):
            return False
        return (c.result is None and c.execution_id not in self._running and c.tool.protected
                and (c.stage is Stage.RETRY
                     or (c.stage is Stage.LIVE and approved(self._ledger.state, c))))

    def _defer(self, a: Attempt, events: list[Event], text: str) -> bool:
        """Keep the outcome of a call run together with others for the one outcome commit."""
        key = a.call.key
        if key not in self._defer_keys:
            return False
        self._deferred[key] = (events, text)
        return True

    def _flush_deferred(self, keys: Sequence[str] | None = None) -> None:
        """ONE commit of the outcomes kept by :meth:`_defer` (of ``keys``, or all)."""
        if not self._deferred:
            return
        taken = [k for k in (keys if keys is not None else list(self._deferred))
                 if k in self._deferred]
        events: list[Event] = []
        content: dict[CallPosition, str] = {}
        for k in taken:
            evs, text = self._deferred.pop(k)
            events += evs
            content[self._find(k).position] = text
        if events:
            self._step_many(events, result_content=content)

    def _record(
        self,
        seq: int | None,
        calls: Sequence[Mapping[str, Any]],
        requires_approval: Sequence[bool | None] | None,
        *,
        dispatch: str | int,
        seen: Iterable[str] | None = None,
    ) -> list[CallStatus]:
        overrides = list(requires_approval) if requires_approval is not None else [None] * len(
            calls)
        if len(overrides) != len(calls):
            raise InvalidInput(
                f"requires_approval has {len(overrides)} entries for {len(calls)} calls: "
                "give one per call (None keeps the tool's default)"
            )
        seen_keys = _seen_keys(seen, given_seq=seq is not None)
        parsed = [parse_call(i, c) for i, c in enumerate(calls)]
        profiles = []
        for (_, name, _), override in zip(parsed, overrides, strict=True):
            if override is not None and not isinstance(override, bool):
                raise InvalidInput(f"requires_approval entries must be bool or None, got "
                                   f"{override!r}")
            profiles.append(self._tool(name).profile(name, override))
        wanted = [(cid, name, args_digest(name, args)) for cid, name, args in parsed]
        with self._usable():
            st = self._ledger.state
            if not parsed:
                return []
            last = last_durable_turn(st)
            if seq is not None:
                if seq < st.marker:
                    raise InvalidInput(
                        f"message {seq} is before the protocol marker {st.marker}: its calls "
                        "are legacy (adopted when the session was put under the ledger); new "
                        f"messages need sequence numbers >= {st.marker}"
                    )
                there = self._turn(seq, last)
                if not there.calls:
                    return self._record_new(seq, parsed, profiles, dispatch, ())
                if _same_calls(there, wanted):
                    return self._rerecorded(there)
                raise InvalidInput(
                    f"message {seq} is already recorded with other calls "
                    f"({[(c.tool_call_id, c.tool.name) for c in there.calls]}): a sequence "
                    "number names one message forever; nothing was recorded.  If your "
                    "history lost that message (or its numbers move), record(calls, seen=...) "
                    "without seq: the ledger places the response and supersedes a lost one "
                    "(docs/protocol.md#placing-a-response)"
                )
            # placed by the ledger (docs/protocol.md#placing-a-response)
            live = self._live_back_to_seen(last, seen_keys)
            kind, at = placement([(_call_keys(t), bool(seen_keys & _keys_of(t))) for t in live],
                                 wanted)
            if kind is Placement.REEMISSION and last is not None and last < st.marker:
                kind = Placement.NEW  # a legacy message is re-recorded, never superseded
            if kind is Placement.NEW or at is None:
                return self._record_new(self._ledger.next_turn(), parsed, profiles, dispatch, ())
            if kind is Placement.RERECORD:
                return self._rerecorded(live[at])
            gone = live[at:]  # the candidate and every live response after it
            return self._record_new(self._ledger.next_turn(), parsed, profiles, dispatch,
                                    [c for t in gone for c in t.calls], replaced=gone)

    def _live_back_to_seen(self, last: int | None, seen: frozenset[str]) -> list[SessionState]:
        """The live responses (from the marker on, not superseded), oldest first,
        from the latest one holding a key in ``seen`` on (all of them if none
        does): what :func:`placement` needs, the earlier ones changing nothing.
        The latest response seen (the usual case) reads nothing from the store."""
        st = self._ledger.state
        if last is None:
            return []
        if last < st.marker:
            # only legacy calls so far (Session.adopt): the latest legacy message is the
            # candidate, so that re-recording the engine's trailing message finds its
            # calls (docs/protocol.md#placing-a-response); only as a re-record (_record)
            legacy = self._turn(last, last)
            return [legacy] if _legacy_candidate(legacy) else []
        latest = self._turn(last, last)
        if seen & _keys_of(latest) and not _all_superseded(latest):
            return [latest]
        turns = sorted({c.position[0] for c in self._ledger.full_state().calls
                        if c.position[0] >= st.marker}, reverse=True)
        out: list[SessionState] = []
        for turn in turns:
            there = latest if turn == last else self._turn(turn, last)
            if not there.calls or _all_superseded(there):
                continue
            out.append(there)
            if seen & _keys_of(there):
                break
        return out[::-1]

    def _turn(self, turn: int, last: int | None) -> SessionState:
        """The calls of ``turn`` (none past the last durable turn: no store read then)."""
        if last is None or turn > last:
            return replace(self._ledger.state, calls=())
        return self._ledger.turn_state(turn)

    def _record_new(
        self,
        seq: int,
        parsed: list[tuple[str, str, dict[str, Any]]],
        profiles: list[ToolProfile],
        dispatch: str | int,
        lost: Sequence[CallState],
        *,
        replaced: Sequence[SessionState] = (),
    ) -> list[CallStatus]:
        """Record a new response at ``seq``; supersede the ``lost`` calls of ``replaced``
        (the responses the engine's history lost, oldest first) in the same transaction."""
        st = self._ledger.state
        lost_pos = {c.position for c in lost}
        open_calls = [c.position for c in st.calls if c.result is None and c.position[0] < seq
                      and c.position not in lost_pos and not _superseded(st, c)]
        if open_calls:
            raise InvalidInput(
                f"calls of an earlier message are unanswered at {open_calls}: settle them "
                "(execute, recover, resolve, reject) before recording message "
                f"{seq}; nothing was recorded"
            )
        positions = [(seq, slot) for slot in range(len(parsed))]
        events: list[Event] = []
        voids: list[Void] = []
        same: dict[CallPosition, CallState] = {}  # slot of the new response -> the lost call
        if replaced:
            numbers = [t.calls[0].position[0] for t in replaced]
            note = (f"superseded: the engine's history lost message"
                    f"{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))} "
                    f"before it was saved; message {seq} replaces "
                    f"{'them' if len(numbers) > 1 else 'it'}")
            for there in replaced:
                for c in there.calls:
                    if _superseded(there, c):
                        continue
                    if c.result is None and there.record(c.execution_id).status is (
                            LedgerStatus.NONE):
                        voids.append(Void(c.position, SUPERSEDED, note, result=_VOIDED))
                    else:
                        voids.append(Void(c.position, SUPERSEDED, note))
            same = self._same_as_dispatched(replaced, positions, parsed)
            for target in same.values():  # a restart interrupted it: decided first
                if target.stage is Stage.RESUME and st.call(target.position) is not None:
                    events += recovery_events(st, target)[0]
        events += [
            Event(Action.ProviderEmitCall, pos, cid, prof, args_digest(name, args))
            for pos, (cid, name, args), prof in zip(positions, parsed, profiles, strict=True)
        ]
        events += [Event(Action.EnginePersistCall, pos) for pos in positions]
        events += [Event(Action.EngineParkApproval, pos)
                   for pos, prof in zip(positions, profiles, strict=True)
                   if prof.requires_approval and pos not in same]
        runnable = [(pos, prof) for pos, prof in zip(positions, profiles, strict=True)
                    if not prof.requires_approval and pos not in same]
        # execute_message runs the first `window` runnable calls next (one, or
        # `concurrency` at once; together: all): their dispatched join the record
        # commit (a readonly call runs with no commit: nothing to join)
        window = (len(runnable) if dispatch == "all" else 1 if dispatch == "first"
                  else 0 if dispatch == "none" else int(dispatch))
        events += [Event(Action.EnginePersistDispatched, pos)
                   for pos, prof in runnable[:window] if prof.protected]
        for pos, target in same.items():
            voids.append(Void(pos, SAME_CALL, f"the same call as {target.execution_id} at "
                              f"{target.position} (same tool and arguments, dispatched as "
                              "part of a lost response): it is never sent again under a new "
                              "identity", result=_same_call_text(target)))
        arguments = {pos: args for pos, (_, _, args) in zip(positions, parsed, strict=True)}
        self._step_many(events, arguments=arguments, voids=voids)
        return [self._status_of(self._find_at(pos)) for pos in positions]

    def _same_as_dispatched(
        self,
        replaced: Sequence[SessionState],
        positions: list[CallPosition],
        parsed: list[tuple[str, str, dict[str, Any]]],
    ) -> dict[CallPosition, CallState]:
        """The calls of the new response that ARE a dispatched call of a lost one.

        Same tool and argument digest, matched in slot order against the
        dispatched calls of every response superseded (oldest first), each
        lost call at most once; a lost call that is itself the same call as
        an earlier one stands for that one."""
        pool: list[CallState] = []
        for there in replaced:
            for c in there.calls:
                target = self._same_call_target(there, c)
                if target is not None:
                    pool.append(target)
                elif there.record(c.execution_id).status is not LedgerStatus.NONE:
                    pool.append(c)
        slots = same_call_slots([(c.tool.name, c.args_digest) for c in pool],
                                [(name, args_digest(name, args)) for _, name, args in parsed])
        return {pos: pool[i] for pos, i in zip(positions, slots, strict=True) if i is not None}

    def _same_call_target(self, st: SessionState, c: CallState) -> CallState | None:
        """The earlier call ``c`` is the same call as (``None``: ``c`` is its own)."""
        if (c.result is None or c.result.kind is not ResultKind.CANCELLED
                or not any(k[0] == c.execution_id and k[1] == SAME_CALL for k in st.audit)):
            return None
        eid, pos = _same_call_of(c.result.content)
        found = self._ledger.state.call(pos)
        if found is None:
            found = self._ledger.turn_state(pos[0]).call(pos)
        assert found is not None and found.execution_id == eid, (eid, pos)
        return found

    def _status_of(self, c: CallState) -> CallStatus:
        """:meth:`_status_now`, following a call that is the same call as an earlier one."""
        in_memory = self._ledger.state
        if in_memory.call(c.position) is None:  # settled, behind the working set
            turn = self._ledger.turn_state(c.position[0])
            target = self._same_call_target(turn, c)
            return self._status_of(target) if target is not None else self._status_in(turn, c)
        target = self._same_call_target(in_memory, c)
        return self._status_now(c) if target is None else self._status_of(target)

    def _rerecorded(self, there: SessionState) -> list[CallStatus]:
        """The statuses of a recorded message presented again: nothing is written but the
        recovery decision of a call interrupted by a restart (as :meth:`recover`)."""
        positions = [c.position for c in there.calls]
        targets = [self._same_call_target(there, c) for c in there.calls]
        events: list[Event] = []
        decided = {}
        for c in [*there.calls, *(t for t in targets if t is not None)]:
            live = self._ledger.state.call(c.position)
            if live is not None and live.stage is Stage.RESUME and c.position not in decided:
                evs, d = recovery_events(self._ledger.state, live)
                events += evs
                decided[c.position] = d
        if events:
            self._step_many(events, result_content=denied_contents(events))
        out = []
        for pos, target in zip(positions, targets, strict=True):
            now = self._ledger.state.call(pos) or there.call(pos)
            assert now is not None
            status = self._status_of(now)
            got = decided.get(pos if target is None else target.position)
            out.append(status if got is None else replace(
                status, decision=got.decision, inputs=got.inputs, recovered=True))
        return out

    # -- approvals ---------------------------------------------------------------

    def approve(self, key: str, *, by: str | None = None, note: str = "",
                expires_at: float | None = None) -> CallStatus:
        """A human approves the call ``key`` (the inbox item's key); it can then run.

        The approval's audit row (kind ``approved``) names ``by``, who approved,
        and ``note``.  ``expires_at`` (seconds since the epoch, on the session's
        ``clock``; default: now + the tool's or the session's ``approval_ttl``,
        else never): a call not dispatched by then is not run on this approval,
        it waits for a new one (docs/protocol.md#approvals-that-expire).  A
        call whose approval expired is approved again the same way.
        """
        return self._answer(key, approve=True, by=by, note=note, expires_at=expires_at)

    def reject(self, key: str, *, by: str | None = None, note: str = "") -> CallStatus:
        """A human rejects the call ``key``: it gets a denied result, in the same transaction.

        The rejection's audit row (kind ``rejected``) names ``by`` and ``note``.
        A call whose approval expired is rejected by cancelling it (the spec's
        ``HumanCancel``: its old approval authorizes nothing): a ``cancelled``
        result, in the same transaction."""
        return self._answer(key, approve=False, by=by, note=note, expires_at=None)

    def _answer(self, key: str, *, approve: bool, by: str | None, note: str,
                expires_at: float | None) -> CallStatus:
        verb = "approved" if approve else "rejected"
        if not isinstance(note, str):
            raise InvalidInput(f"note must be a string, got {type(note).__name__}; nothing "
                               "was written")
        text = attributed_note(note or f"{verb} by a human", by)  # checks by
        if expires_at is not None:
            expires_at = check_expiry(expires_at)
        with self._usable():
            c = self._find(key)
            st = self._ledger.state
            approval = st.approval(c.execution_id)
            renew = (c.result is None and approval is ApprovalState.APPROVED
                     and approval_withdrawn(st, c))
            if c.result is not None or not (approval is ApprovalState.PENDING or renew):
                raise InvalidInput(
                    f"call {key} has no pending approval (approval: {approval.value}, "
                    f"result: {'yes' if c.result else 'no'}); nothing was changed"
                )
            if approve and expires_at is None:
                ttl = self._tool(c.tool.name).approval_ttl or self._approval_ttl
                expires_at = None if ttl is None else self._ledger.now() + ttl
            n = approval_round(st, c.execution_id) + 1
            row = Void(c.position, APPROVED if approve else REJECTED,
                       attributed_note(note or f"{verb} by a human", by, expires_at=expires_at)
                       if approve else text, attempt=n)
            events = recovery_events(st, c)[0] if c.stage is Stage.RESUME else []
            content = {}
            if renew and not approve:
                # the spec's approval is still "approved": a Stop before dispatch
                events += [Event(Action.HumanCancel, c.position), Event(Action.Recover, c.position)]
            elif not renew:
                events.append(Event(Action.HumanApprove if approve else Action.HumanReject,
                                    c.position))
                if not approve:
                    events.append(Event(Action.EngineRecordDenied, c.position))
                    content = {c.position: _DENIED}
            self._step_many(events, result_content=content, voids=[row])
            if approve:
                self._expiry[(c.execution_id, n)] = expires_at
            return self._status_now(self._find(key))

    def _expired(self, c: CallState) -> bool:
        """Whether ``c``'s approval has expired now, by the session's clock; if it has,
        its ``approval_expired`` row is committed first (the call waits for a new
        approval).  Decided where a call is about to be dispatched."""
        st = self._ledger.state
        if (not c.tool.requires_approval or c.stage is not Stage.LIVE
                or st.approval(c.execution_id) is not ApprovalState.APPROVED
                or approval_withdrawn(st, c)):
            return False
        n = approval_round(st, c.execution_id)
        if n == 0:
            # approved without a row: given before approvals had rows (an older store).
            # When is unknown, so under an expiry (the tool's or the session's
            # approval_ttl) it may have run out already: it fails closed, expiring
            # now, and the call waits for a new approval (round 1, with its row).
            # Without an expiry it holds until the call runs, as any approval does.
            if (self._tool(c.tool.name).approval_ttl or self._approval_ttl) is None:
                return False
            self._step_many([], voids=[Void(
                c.position, APPROVAL_EXPIRED,
                "an approval given before approvals were recorded with their time (no "
                "approved row) cannot be shown to be within its approval_ttl: it "
                "authorizes nothing, the call waits for a new approval", attempt=0)])
            return True
        if (c.execution_id, n) not in self._expiry:  # given by another process, or before
            for row in self._ledger.audit():            # a restart: read once
                if row.kind == APPROVED:
                    self._expiry[(row.execution_id, row.attempt)] = row.expires_at
        at = self._expiry.get((c.execution_id, n))
        now = self._ledger.now()
        if at is None or now < at:
            return False
        self._step_many([], voids=[Void(
            c.position, APPROVAL_EXPIRED,
            f"the approval of round {n} expired at {at} (now {now}) before the call was "
            "dispatched: it authorizes nothing, the call waits for a new approval", attempt=n)])
        return True

    def cancel(self, key: str, *, note: str = "") -> CallStatus:
        """A user's Stop for the call ``key`` after its approval, before it ran.

        The call gets a ``cancelled`` result (its tool message says so) in ONE
        transaction, with an audit row (``note`` goes into it); it is never
        dispatched afterwards and its approval authorizes nothing any more.
        Only a call that is approved (or needs no approval) and was never
        dispatched can be cancelled: a call still waiting for its approval is
        rejected instead (:meth:`reject`); a dispatched or running call runs to
        its outcome (a request may be out: cancelling it would hide an effect);
        a call interrupted by a restart is decided by :meth:`recover` first.
        Anything else raises :class:`InvalidInput` and nothing is written.
        """
        if not isinstance(note, str):
            raise InvalidInput(f"note must be a string, got {type(note).__name__}")
        with self._usable():
            c = self._find(key)
            st = self._ledger.state
            rec = st.record(c.execution_id)
            why = None
            if c.result is not None:
                why = f"it already has its result ({c.result.kind.value})"
            elif key in self._running or rec.status is not LedgerStatus.NONE:
                why = (f"it was dispatched (attempt {rec.attempt}): a request may be out, so "
                       "it runs to its outcome; recover() / resolve() it instead")
            elif c.stage is Stage.RESUME:
                why = "it was interrupted by a restart: call recover() first, then cancel"
            elif c.stage is not Stage.LIVE:
                why = f"it is not waiting to run (stage {c.stage.value})"
            elif not approved(st, c):
                why = (f"it is not approved (approval: {st.approval(c.execution_id).value}): "
                       "reject(key) it instead")
            if why is not None:
                raise InvalidInput(f"call {key} cannot be cancelled: {why}; nothing was changed")
            pos = c.position
            self._guard(lambda: self._ledger.cancel(pos, note=note))
            if self._observe is not None:
                self._observe((Event(Action.HumanCancel, pos), Event(Action.Recover, pos)))
            return self._status_now(self._find_at(pos))

    # -- running a call ----------------------------------------------------------

    @contextmanager
    def dispatch(
        self, key: str, *, arguments: Mapping[str, Any] | None = None
    ) -> Iterator[Attempt]:
        """Run the call ``key``: ``with session.dispatch(key) as a: ... a.done(value)``.

        ``arguments``: the arguments the engine is about to run the tool with,
        when it does not run it with ``a.arguments`` (the recorded, approved
        ones).  They are checked against the call's recorded digest (which its
        approval and record were given for) BEFORE ``dispatched`` is written:
        other arguments raise :class:`InvalidInput`, and nothing is written or
        run (docs/protocol.md#approvals-bound-to-arguments).

        Before the body runs, ``dispatched`` (attempt n) is durable.  When the
        block ends, the outcome is classified (see the module documentation),
        recorded, and put in ``a.status``; an ``Exception`` from the body is
        recorded and NOT re-raised (its text is in the status).  Works for a
        first run, a retry (:attr:`Next.RETRY`) and a human's retry alike.
        A block that ends without ``done()`` or an exception is recorded as
        unknown, then :class:`RuntimeError` is raised.
        """
        if arguments is not None:
            with self._usable():  # a durable call's digest never changes: checked once
                c = self._find(key)
                _check_arguments(c, self._ref(c), arguments)
        attempt, readonly = self._start(key)
        try:
            yield attempt
        except Exception as exc:  # every tool error is classified, then recorded
            with self._lock:
                self._running.discard(key)
                attempt.status = (self._finish_readonly(attempt, _error_text(exc))
                                  if readonly else self._failed(attempt, exc))
            return
        except BaseException as exc:
            with self._lock:
                # The process is going away: nothing is recorded or stepped (the
                # call stays dispatched, as a crash leaves it) and this session
                # starts nothing more.  Other threads may still record their calls.
                self._running.discard(key)
                self._interrupted_by = f"{type(exc).__name__} in call {key}"
            raise
        with self._lock:
            self._running.discard(key)
            if attempt._done:
                text = _result_text(attempt._value)
                attempt.status = (self._finish_readonly(attempt, text) if readonly
                                  else self._succeeded(attempt, text))
                return
            err = RuntimeError(
                f"the dispatch block of call {key} ended without done(value) or an exception"
            )
            attempt.status = (self._finish_readonly(attempt, _error_text(err)) if readonly
                              else self._unknown(attempt, err))
        raise err

    def execute(
        self,
        key: str,
        fn: Callable[[Attempt], object],
        *,
        arguments: Mapping[str, Any] | None = None,
    ) -> CallStatus:
        """Run the call ``key`` as ``fn(attempt)``; its return is the result (:meth:`dispatch`).

        A ``fn`` that is not callable is refused before anything is written
        (no ``dispatched``, the approval still unused).  ``arguments``: the
        ones ``fn`` will send, checked before anything is written, as
        :meth:`dispatch` does."""
        if not callable(fn):
            raise InvalidInput(f"execute({key!r}, fn): fn must be a callable taking the "
                               f"Attempt, got {fn!r}; nothing was written or run")
        with self.dispatch(key, arguments=arguments) as attempt:
            attempt.done(fn(attempt))
        assert attempt.status is not None
        return attempt.status

    def execute_many(
        self, calls: Sequence[tuple[str, Callable[[Attempt], object]]]
    ) -> list[CallStatus]:
        """Run ``calls`` (``(key, fn)`` pairs) one after the other, as :meth:`execute` each.

        The difference is the number of commits.  When call k succeeded and
        call k+1 can be dispatched right now (protected, approved, live or to
        be retried, not running), ``succeeded(k)`` + its result and
        ``dispatched(k+1)`` are ONE transaction: consecutive steps of the spec
        (``EngineRecordSucceeded``, ``EngineAppendResult``,
        ``EnginePersistDispatched``) in one commit.  Nothing is acted on
        before that commit is durable: a crash before it leaves call k
        dispatched-and-unknown and call k+1 not dispatched, exactly as
        :meth:`execute` does; after it, call k has its result and call k+1 is
        dispatched, as after a crash right after k+1's own dispatch commit.
        So n protected calls take n + 1 commits instead of 2n; a single call
        still takes exactly two.  Any other outcome of call k (failed,
        unknown, readonly) is recorded on its own and call k+1 dispatches in
        its own commit.  An error raised by :meth:`execute` (e.g. a call not
        approved) stops the sequence; the calls before it are recorded.
        """
        given: object = calls  # checked at run time: engines pass what they parsed
        if isinstance(given, (str, bytes)) or not isinstance(given, Sequence):
            raise InvalidInput(f"execute_many takes a list of (key, fn) pairs, got {calls!r}")
        for i, item in enumerate(calls):
            if (not isinstance(item, tuple) or len(item) != 2 or not isinstance(item[0], str)
                    or not callable(item[1])):
                raise InvalidInput(f"execute_many: item {i} must be a (key, fn) pair with a "
                                   f"str key and a callable fn, got {item!r}; nothing was run")
        out = []
        for i, (key, fn) in enumerate(calls):
            with self._lock:
                self._chain = (key, calls[i + 1][0]) if i + 1 < len(calls) else None
            try:
                out.append(self.execute(key, fn))
            finally:
                with self._lock:
                    self._chain = None
        return out

    def _chained_dispatch(self, key: str) -> list[Event]:
        """``EnginePersistDispatched`` of the call after ``key`` in execute_many, if it
        can be dispatched now (the checks of :meth:`_start`); else nothing."""
        if self._chain is None or self._chain[0] != key:
            return []
        try:
            c = self._find(self._chain[1])
        except InvalidInput:
            return []
        return [Event(Action.EnginePersistDispatched, c.position)] if self._dispatchable(c) else []

    def _start(self, key: str) -> tuple[Attempt, bool]:
        with self._usable():
            c = self._find(key)
            ref = self._ref(c)
            pos = c.position
            if c.result is not None:
                raise InvalidInput(f"call {key} already has its result; it is never run again")
            if key in self._running or c.stage in (Stage.WAITING, Stage.GOT_OK, Stage.GOT_FAIL):
                raise CallBusy(f"call {key} is running right now (in another thread?): a call "
                               "is never dispatched twice at once")
            if c.stage is Stage.RESUME:
                raise InvalidInput(
                    f"call {key} was interrupted (a restart, or an earlier run that did not "
                    "finish): call recover() first and act on what it says for it"
                )
            if c.stage is Stage.RECONCILING:
                raise InvalidInput(f"call {key} must be reconciled first: reconcile(key, ask)")
            if c.stage is Stage.LIVE and (self._expired(c) or not approved(self._ledger.state, c)):
                if approval_withdrawn(self._ledger.state, c):
                    raise InvalidInput(
                        f"call {key}'s approval expired before it was dispatched: it "
                        "authorizes nothing; approve(key) again (or reject(key)); the call "
                        "was not run")
                raise InvalidInput(
                    f"call {key} is not approved (approval: "
                    f"{self._ledger.state.approval(c.execution_id).value}): approve(key) first"
                )
            if c.stage is Stage.NONE:
                raise InvalidInput(f"call {key} is halted for a human: resolve(key, ...) first")
            # Everything that can fail is done before the dispatch commits: after
            # it, only the tool body and the outcome's record may happen.
            if not c.tool.protected:
                attempt = Attempt(ref, 1, None, self._ledger.epoch)
                self._step(Event(Action.EngineInvokeReadonly, pos))  # volatile
                self._running.add(key)
                return attempt, True
            rec = self._ledger.state.record(c.execution_id)
            dispatch = c.stage in (Stage.LIVE, Stage.RETRY)
            if not dispatch and c.stage is not Stage.DISPATCHED:
                raise InvalidInput(f"call {key} cannot run now (stage {c.stage.value})")
            key_ = c.execution_id if c.tool.policy is RecoveryPolicy.IDEMPOTENT else None
            attempt = Attempt(
                ref, rec.attempt + 1 if dispatch else rec.attempt, key_, self._ledger.epoch
            )
            if dispatch:  # else DISPATCHED: recorded by an earlier step, not sent yet
                self._step_many([Event(Action.EnginePersistDispatched, pos)])  # commit 1
            assert self._ledger.state.record(c.execution_id).attempt == attempt.attempt
            self._running.add(key)
            if self._tool(c.tool.name).marks_send:
                # the request leaves at sending(): until then none is out
                attempt._on_send = lambda: self._invoked(attempt)
            else:
                self._invoked(attempt)  # it may leave as soon as the body runs
            return attempt, False

    def _invoked(self, a: Attempt) -> None:
        """The adapter's request may be out from now on (once per attempt)."""
        with self._lock:
            c = self._find_at(a.call.position)
            if c.stage is Stage.DISPATCHED:
                self._step(Event(Action.EngineInvokeAdapter, c.position))  # volatile

    def _succeeded(self, a: Attempt, text: str) -> CallStatus:
        pos = a.call.position
        self._invoked(a)
        self._step(Event(Action.ExternalApply, pos, attempt=a.attempt))  # volatile
        done = [Event(Action.EngineRecordSucceeded, pos), Event(Action.EngineAppendResult, pos)]
        if self._defer(a, done, text):  # together: the message's one outcome commit
            return replace(self._status_now(self._find_at(pos)), outcome=Outcome.APPLIED)
        chained = self._chained_dispatch(a.call.key)
        try:  # commit 2: succeeded + the tool result (+ the next call's dispatched), ONE tx
            self._step_many(done + chained, result_content={pos: text})
        except ProtocolError:
            if not chained:
                raise
            # the next call could not be dispatched after all: record this one alone
            # (a refused batch wrote nothing and left the state as it was)
            self._step_many(done, result_content={pos: text})
        return replace(self._status_now(self._find_at(pos)), outcome=Outcome.APPLIED)

    def _failed(self, a: Attempt, exc: Exception) -> CallStatus:
        verdict = self._classify(a, exc)
        if verdict is not Outcome.NOT_APPLIED:
            return self._unknown(a, exc)
        pos = a.call.position
        self._invoked(a)  # not out, or refused: in the spec, a definite rejection
        self._step(Event(Action.ExternalRejectDefinite, pos, attempt=a.attempt))
        failed = [Event(Action.EngineRecordFailed, pos), Event(Action.EngineAppendResult, pos)]
        if not self._defer(a, failed, _error_text(exc)):
            self._step_many(failed, result_content={pos: _error_text(exc)})
        return replace(self._status_now(self._find_at(pos)), outcome=Outcome.NOT_APPLIED,
                       error=str(exc))

    def _classify(self, a: Attempt, exc: Exception) -> Outcome:
        if isinstance(exc, KeyAnswer):  # never definite, whatever the hooks say
            return Outcome.UNKNOWN
        if isinstance(exc, NotApplied):
            return Outcome.NOT_APPLIED
        tool = self._tool(a.call.name)
        if tool.classify is not None:
            try:
                verdict = tool.classify(exc, a.sent)
            except Exception:  # a broken classifier must not lose the call
                return Outcome.UNKNOWN
            if verdict is not None:
                return verdict if verdict is Outcome.NOT_APPLIED else Outcome.UNKNOWN
        if tool.marks_send and not a.sent:
            return Outcome.NOT_APPLIED
        return Outcome.UNKNOWN

    def _unknown(self, a: Attempt, exc: BaseException) -> CallStatus:
        # The live engine makes the decision a restarted one would make.
        pos = a.call.position
        self._invoked(a)
        self._flush_deferred()  # together: the outcomes known so far first
        self._step(Event(Action.EngineTimeout, pos))  # volatile
        status = self._recover_one(self._find_at(pos))
        return replace(status, outcome=Outcome.UNKNOWN, error=f"{type(exc).__name__}: {exc}")

    def _finish_readonly(self, a: Attempt, text: str) -> CallStatus:
        pos = a.call.position
        done = [Event(Action.EngineAppendResult, pos)]
        if not self._defer(a, done, text):
            self._step_many(done, result_content={pos: text})
        return self._status_now(self._find_at(pos))

    # -- reconcile ----------------------------------------------------------------

    def reconcile(
        self, key: str, ask: Callable[[CallRef, int], ReconcileAnswer]
    ) -> CallStatus:
        """Ask the external system about a call whose next is :attr:`Next.RECONCILE`.

        ``ask(call, attempt)`` answers :class:`~toolledger._core.tools.WasApplied`
        (the result becomes the call's: ONE transaction),
        :class:`~toolledger._core.tools.NotAppliedFenced` (it fenced every attempt
        ``<= attempt``: next is a retry) or :class:`~toolledger._core.tools.CannotTell`
        (halted for a human).  An exception counts as CannotTell.
        """
        if not callable(ask):
            raise InvalidInput(f"reconcile({key!r}, ask): ask must be a callable (call, "
                               f"attempt) -> answer, got {ask!r}; nothing was written")
        with self._usable():
            c = self._find(key)
            if c.stage is not Stage.RECONCILING:
                raise InvalidInput(f"call {key} is not waiting for a reconcile (next: "
                                   f"{self._status_now(c).next.value})")
            ref = self._ref(c)
            attempt = self._ledger.state.record(c.execution_id).attempt
        try:
            answer: object = ask(ref, attempt)
        except Exception as exc:  # the connector's failure: nobody can tell
            answer = CannotTell(f"reconcile raised {type(exc).__name__}: {exc}")
        with self._lock:
            c = self._find(key)
            pos = c.position
            if c.stage is not Stage.RECONCILING:
                raise CallBusy(f"call {key} was reconciled by someone else meanwhile")
            if isinstance(answer, WasApplied):
                self._step_many([Event(Action.EngineReconcileApplied, pos),
                                 Event(Action.EngineAppendResult, pos)],
                                result_content={pos: answer.result})
            elif (isinstance(answer, NotAppliedFenced)
                  and attempt < self._ledger.state.max_attempts):
                self._step_many([Event(Action.EngineReconcileNotApplied, pos)])
            else:
                # cannot tell, a wrong answer, or the retry budget spent: a human decides
                self._step_many([Event(Action.EngineReconcileUnknown, pos)])
            return self._status_now(self._find_at(pos))

    # -- recovery -------------------------------------------------------------------

    def recover(self) -> list[CallStatus]:
        """What to do next for every call the engine must still act on, in position order.

        Applies the core's recovery decision to every call interrupted by a
        restart (or an unknown outcome), in ONE transaction, and returns the
        status of every call without a result plus every call of the last
        recorded message (:attr:`Next.RESULT`: make sure the conversation has
        its tool message; the ledger may be ahead of it).  Calling it again
        changes nothing.
        """
        with self._usable():
            st = self._ledger.state
            events: list[Event] = []
            decided: dict[CallPosition, tuple[Decision, RecoveryInputs]] = {}
            for c in st.calls:
                if c.message is MessageState.DURABLE and c.stage is Stage.RESUME:
                    evs, d = recovery_events(self._ledger.state, c)
                    events += evs
                    decided[c.position] = (d.decision, d.inputs)
            if events:
                self._step_many(events, result_content=denied_contents(events))
            out = []
            for c in self._ledger.state.calls:
                if c.message is not MessageState.DURABLE:
                    continue
                status = self._status_now(c)
                d_in = decided.get(c.position)
                if d_in is None:
                    d = recovery_decision(self._ledger.state, c)
                    d_in = (d.decision, d.inputs)
                out.append(replace(status, decision=d_in[0], inputs=d_in[1],
                                   recovered=c.position in decided))
            return out

    def _recover_one(self, c: CallState) -> CallStatus:
        events, d = recovery_events(self._ledger.state, c)
        self._step_many(events, result_content=denied_contents(events))
        return replace(self._status_now(self._find_at(c.position)),
                       decision=d.decision, inputs=d.inputs, recovered=True)

    # -- humans -----------------------------------------------------------------

    def halted(self) -> list[CallStatus]:
        """Calls halted for a human: what the host shows as recovery items."""
        with self._usable():  # after a restart, their decision is applied first
            return [status for status in self.recover() if status.next is Next.HALTED]

    def resolve(
        self, key: str, resolution: str, *, result: str | None = None, note: str = "",
        by: str | None = None,
    ) -> CallStatus:
        """A human resolves a halted call: ``"applied"`` (``result``: what the
        external system answered), ``"retry"`` (next: run it with
        :meth:`execute`, attempt n+1, same id) or ``"abandon"``.

        ``"applied"`` without ``result`` (a host with nothing to give): the
        call's tool result, what the model sees, is :data:`APPLIED_NO_TEXT`,
        a JSON object saying a human confirmed the call was applied
        (docs/protocol.md#placing-a-response).

        The resolution and what follows it are recorded; the call's result
        (applied, abandoned) is there when this returns.  ``by`` names who
        answered: it goes into the resolution's audit row with ``note``
        (:attr:`AuditRow.by <toolledger._core.commit_plan.AuditRow.by>`).
        """
        if not isinstance(resolution, str) or resolution not in RESOLUTIONS:
            raise InvalidInput(f"unknown resolution {resolution!r}: answer one of "
                               f"{', '.join(repr(r) for r in RESOLUTIONS)}")
        if by is not None:
            note = attributed_note(note or f"resolved by a human: {resolution}", by)
        else:
            note = attributed_note(note, None)
        with self._usable():
            c = self._find(key)
            if c not in self._ledger.recovery_required():
                raise InvalidInput(f"call {key} is not halted for a human (next: "
                                   f"{self._status_now(c).next.value}); nothing was changed")
            text = APPLIED_NO_TEXT if resolution == "applied" and result is None else result
            self._guard(lambda: self._ledger.resolve(c.position, resolution,
                                                     result_text=text, note=note))
            c = self._find_at(c.position)
            if c.stage is Stage.RESUME:  # applied / abandon: the result follows
                return self._recover_one(c)
            return self._status_now(c)

    # -- internals ------------------------------------------------------------------

    def _tool(self, name: str) -> Tool:
        return self._tools.get(name, _UNDECLARED)

    def _find(self, key: str) -> CallState:
        if not isinstance(key, str):
            raise InvalidInput(f"a call key is the execution id string, got {key!r}")
        for c in self._ledger.state.calls:
            if c.execution_id == key:
                return c
        raise InvalidInput(
            f"no open or recent call with key {key!r} in session {self.session_id!r}: "
            "keys are execution ids returned by record() and recover()"
        )

    def _find_at(self, pos: CallPosition) -> CallState:
        c = self._ledger.state.call(pos)
        if c is None:  # settled just now, behind the latest message (a superseded call's)
            c = self._ledger.turn_state(pos[0]).call(pos)
        assert c is not None, pos  # every caller names a durable call
        return c

    def _ref(self, c: CallState) -> CallRef:
        args = self._ledger.call_arguments(c.position)
        if args is None:
            raise InvalidInput(f"the arguments of call {c.execution_id} are not stored")
        return CallRef(c.execution_id, c.tool_call_id, c.tool.name, c.position,
                       MappingProxyType(args), c.tool.policy, c.tool.requires_approval,
                       self._ledger.epoch)

    def _status_now(self, c: CallState) -> CallStatus:
        st = self._ledger.state
        if st.call(c.position) is None:  # settled behind the working set
            st = self._ledger.turn_state(c.position[0])
        return self._status_in(st, c)

    def _status_in(self, st: SessionState, c: CallState) -> CallStatus:
        rec: ExecutionRecord = st.record(c.execution_id)
        ref = self._ref(c)  # first: a call without stored arguments says so
        nxt = next_of(st, c, running=c.execution_id in self._running)
        return CallStatus(ref, nxt, rec.attempt, c.result)


def _check_arguments(c: CallState, ref: CallRef, arguments: object) -> None:
    """Refuse to run call ``c`` with other arguments than the recorded ones: its
    approval and its record authorize exactly those (Session.dispatch)."""
    if not isinstance(arguments, Mapping):
        raise InvalidInput(f"arguments of call {c.execution_id} must be a mapping, got "
                           f"{type(arguments).__name__}; nothing was written or run")
    given = dict(arguments)
    try:
        digest = args_digest(c.tool.name, given)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"arguments of call {c.execution_id} are not JSON: {exc}; "
                           "nothing was written or run") from exc
    if digest == c.args_digest:
        return
    recorded = dict(ref.arguments)
    differ = sorted(k for k in recorded.keys() | given.keys()
                    if k not in recorded or k not in given or recorded[k] != given[k])
    what = "approved and recorded" if c.tool.requires_approval else "recorded"
    raise InvalidInput(
        f"call {c.execution_id} ({c.tool.name}) would run with other arguments than the "
        f"{what} ones (they differ in {', '.join(map(repr, differ)) or 'their encoding'}): "
        "nothing was written or run; run it with attempt.arguments, or record the new "
        "arguments as a new call"
        + (" and have that one approved" if c.tool.requires_approval else "")
    )


# --------------------------------------------------------------------------
# Placing a response (docs/protocol.md#placing-a-response)
# --------------------------------------------------------------------------

APPLIED_NO_TEXT: Final = json.dumps({
    "status": "applied",
    "note": "a human confirmed that the external system applied this call; no result "
            "text was given",
})
"""The tool result of ``resolve(key, "applied")`` without ``result``."""

_VOIDED: Final = json.dumps({"error": "superseded: the response that asked for this call was "
                             "lost from the conversation and replaced; it never ran"})
_SAME_CALL_PREFIX: Final = "same_call"


def _seen_keys(seen: object, *, given_seq: bool) -> frozenset[str]:
    """The keys of ``record(..., seen=...)``, checked."""
    if seen is None:
        if given_seq:
            return frozenset()
        raise InvalidInput(
            "record(calls) without a sequence number needs seen=: the keys of the ledger "
            "calls whose tool results your history holds before this response ([] if none); "
            "it tells a new response from a re-record of the latest (docs/protocol.md"
            "#placing-a-response); nothing was recorded"
        )
    if isinstance(seen, (str, bytes, Mapping)) or not isinstance(seen, Iterable):
        raise InvalidInput(f"seen must be a list of call keys (execution ids), got {seen!r}; "
                           "nothing was recorded")
    keys = list(seen)
    bad = [k for k in keys if not isinstance(k, str)]
    if bad:
        raise InvalidInput(f"seen must hold call keys (strings), got {bad[0]!r}; nothing was "
                           "recorded")
    return frozenset(keys)


def _call_keys(there: SessionState) -> list[tuple[str, str, str]]:
    """The recorded calls of one message as the placement rule compares them:
    (id, name, digest) in slot order (record writes slots 0..n-1)."""
    return [(c.tool_call_id, c.tool.name, c.args_digest) for c in there.calls]


def _same_calls(there: SessionState, wanted: Sequence[tuple[str, str, str]]) -> bool:
    """The recorded calls of one message are ``wanted`` (id, name, digest), slot by slot."""
    return len(there.calls) == len(wanted) and all(
        c.position[1] == slot and (c.tool_call_id, c.tool.name, c.args_digest) == w
        for slot, (c, w) in enumerate(zip(there.calls, wanted, strict=True))
    )


def _seen_on(message: Mapping[str, Any]) -> list[str]:
    """The ledger keys a chat message carries (``message[SEEN]``: a list, or one key)."""
    value = message.get(SEEN)
    if value is None:
        return []
    keys = [value] if isinstance(value, str) else value
    if isinstance(keys, (Mapping, bytes)) or not isinstance(keys, Sequence) or not all(
            isinstance(k, str) for k in keys):
        raise InvalidInput(f"a message's {SEEN!r} must be a list of ledger keys, got "
                           f"{value!r}; nothing was recorded")
    return list(keys)


def _legacy_candidate(turn: SessionState) -> bool:
    """A legacy message (before the marker) a re-record may find: it has calls, in
    slots 0..n-1 (a partly answered one has gaps: its calls are found one by one,
    :meth:`Session.find`), none superseded."""
    return bool(turn.calls) and not any(_superseded(turn, c) for c in turn.calls) and [
        c.position[1] for c in turn.calls] == list(range(len(turn.calls)))


def _all_superseded(turn: SessionState) -> bool:
    """Every call of one message was superseded: the message is no longer live."""
    return bool(turn.calls) and all(_superseded(turn, c) for c in turn.calls)


def _superseded(st: SessionState, c: CallState) -> bool:
    """``c``'s response was superseded (lost from the engine's history, replaced)."""
    return st.superseded(c.execution_id)


def _same_call_text(target: CallState) -> str:
    """The result content of a call that is the same call as ``target``."""
    return json.dumps({_SAME_CALL_PREFIX: target.execution_id,
                       "position": list(target.position)})


def _same_call_of(content: str) -> tuple[str, CallPosition]:
    value = json.loads(content)
    t, slot = value["position"]
    return str(value[_SAME_CALL_PREFIX]), (int(t), int(slot))


def _keys_of(turn: SessionState) -> frozenset[str]:
    """The keys the engine holds for the calls of one message (a same-call's is its target's)."""
    keys = set()
    for c in turn.calls:
        keys.add(c.execution_id)
        if (c.result is not None and c.result.kind is ResultKind.CANCELLED
                and any(k[0] == c.execution_id and k[1] == SAME_CALL for k in turn.audit)):
            keys.add(_same_call_of(c.result.content)[0])
    return frozenset(keys)
