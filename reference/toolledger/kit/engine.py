'''The engine adoption kit: a small turn engine shaped like openworker's ``TurnEngine``.

What it is for
--------------
This module shows, in running code, where each ledger call goes in a real
agent engine's turn, and it is the harness the crash tests and
``toolledger simulate`` drive.  A scripted provider emits assistant messages
with tool calls (``{id, function{name, arguments JSON}}``; ids may repeat
across turns like Gemini's ``call_0``, or be ``""``), approvals are parked
and resolved by a (scripted) human, calls execute through the adapters of a
:class:`~toolledger._core.tools.ToolRegistry`, results are recorded, the
conversation is checkpointed, and :meth:`TurnEngine.resume` does durable
resume.  It runs in one of two modes:

- ``legacy``: today's behaviour, as in ``spec/LegacyResume.tla`` and issue
  #443.  A call is done when a ``role="tool"`` message with its
  ``tool_call_id`` exists anywhere in the thread; results become durable only
  at the end of the iteration; resume re-runs every unanswered trailing call
  and reuses the resolved approval it finds by ``(session_id,
  tool_call_id)``.  It is here to be measured, not to be used.
- ``ledger``: the protocol, through the adopter's API: a
  :class:`toolledger.Session` on the store.  The engine never names a spec
  action, never steps the :class:`~toolledger._core.ledger.Ledger` and never
  reads a protocol stage: the session feeds the ledger the events of
  ``spec/DurableToolExecution.tla`` in the order of
  ``docs/protocol.md#the-live-path`` and says what to do next for each call
  (:class:`toolledger.Next`).

Adopting it in an engine (the ``ledger`` mode, step by step)
------------------------------------------------------------
The comments marked ``LEDGER:`` in :class:`TurnEngine` are the integration
guide; in one place:

1. When the provider's assistant message arrives, validate every call
   (known tool, arguments a JSON object, no argument named like the
   idempotency key) BEFORE anything is recorded: :meth:`ToolRegistry.check_call`.
2. Checkpoint the assistant message, then record its calls:
   :meth:`toolledger.Session.record` makes them durable with their arguments
   and parks the approvals they need, in ONE transaction.  The position
   (message sequence number, index in the message) goes into the execution
   id, so a reused ``call_0`` never aliases an older call.
3. Approvals are keyed by execution id (the inbox key; the human's answer
   through :meth:`toolledger.Session.approve` / :meth:`toolledger.Session.reject`),
   not by ``(session_id, tool_call_id)``; a Stop after approval is
   :meth:`toolledger.Session.cancel`.
4. Running a call is :meth:`toolledger.Session.execute`: ``dispatched`` is
   durable before the body runs; the body gets the execution id (and, for
   ``idempotent`` tools, the same id as its idempotency key, through a keyword
   the model cannot write) and calls ``sending()`` before the adapter's
   request leaves.
5. The body's return (``Applied``) becomes ``succeeded`` + the tool result in
   ONE transaction, then the conversation checkpoint.  A ``DefiniteFailure``
   is raised as :class:`DefiniteFailureError` (a ``NotApplied``) and recorded
   as a failed result.  ``Unknown`` (or an exception) is an unknown outcome:
   the session makes the decision a restarted engine would make.  A
   reconcile goes through :meth:`toolledger.Session.reconcile`.
6. On resume, re-read the conversation and the session: the calls the
   conversation holds and the ledger lacks are recorded now;
   :meth:`toolledger.Session.recover` decides every call a restart
   interrupted (ONE transaction, each decision audited with its inputs) and
   says what is next for each: ``result`` (a result the ledger holds and the
   conversation lost is appended from the record: never re-invoked),
   ``retry`` (attempt n+1, same id), ``reconcile`` (ask the adapter) or
   ``halted`` (surface it in :meth:`TurnEngine.recovery_required`; a human's
   :meth:`TurnEngine.resolve_recovery`, i.e. :meth:`toolledger.Session.resolve`,
   resumes).  A session that ran under the legacy engine is adopted with
   :meth:`toolledger.Session.adopt` (:func:`adopt_legacy_session`).

What the engine still reads from the ledger (never writes): the call at a
position (its key), the halted calls without applying a decision, an
attempt number, and the working set's calls without a result.  The glue is
measured by :func:`toolledger.notebook.kit_support.kit_engine_glue` (docs/adopting.md,
notebook 05).

Crash points and the session's commits: the session reports every step it
makes (``observe``) to :meth:`CrashInjector.stepped`, which fires the crash
points after them; the engine's own moments (the model's answer, the
conversation checkpoints, the request leaving) are :class:`Moment` values.
Steps the session commits together share one crash point, the moment after
that commit: ``after EnginePersistCall`` and ``after EngineParkApproval``
(``record``), and, on resume, the points after what ``recover`` adds to
``Recover`` for every interrupted call at once (a parked approval, an
appended result).

A runnable example (it is a doctest of this module's test suite)::

    >>> from toolledger import MemoryStore
    >>> from toolledger.kit.engine import (CrashInjector, MemoryConversationStore, ScriptedHuman,
    ...     ScriptedProvider, SimulatedCrash, ToolRegistry, TurnEngine, parse_crash_point,
    ...     tool_call)
    >>> from toolledger.kit.external import CountingAdapter, CountingExternalSystem
    >>> email = CountingExternalSystem()          # the outside world: survives crashes
    >>> store, conversations = MemoryStore(), MemoryConversationStore()  # durable storage
    >>> crash = CrashInjector(parse_crash_point("ledger", "after ExternalApply"))
    >>> def engine() -> TurnEngine:                # what a (re)started process builds
    ...     registry = ToolRegistry()
    ...     registry.register("send_email", CountingAdapter(email, "send_email",
    ...         on_request_sent=crash.request_sent), policy="manual")
    ...     return TurnEngine(session_id="s1", mode="ledger", registry=registry,
    ...         provider=ScriptedProvider([[tool_call("call_0", "send_email", {"to": "ada"})],
    ...                                    "Sent."]),
    ...         human=ScriptedHuman(), store=store, conversations=conversations, crash=crash)
    >>> try:
    ...     engine().run("email Ada")              # approved, sent, then the process dies
    ... except SimulatedCrash as died:
    ...     print(died)
    simulated crash at 'after ExternalApply' (ledger engine)
    >>> resumed = engine().resume()               # a new process: manual -> halt, no replay
    >>> resumed.status.value, email.effects()
    ('recovery_required', 1)
    >>> again = engine()
    >>> [item.tool for item in again.recovery_required()]
    ['send_email']
    >>> again.resolve_recovery((1, 0), "applied", result_text="sent, id 42").status.value
    'done'
    >>> again.messages[-2]["content"], email.effects()
    ('sent, id 42', 1)

Crash points
------------
:func:`crash_points` enumerates them from the step tables :data:`LEDGER_STEPS`
and :data:`LEGACY_STEPS` (the steps this engine performs on the path of one
approved call, in order): ``before ProviderEmitCall`` and ``after S`` for
every step ``S``.  ``before S`` is accepted as another name of the point
after the step preceding ``S``.  :class:`CrashInjector` raises
:class:`SimulatedCrash` at the point, or SIGKILLs the process.  The request
"out, not answered" moment (``after EngineInvokeAdapter``) is inside the
adapter, so the transport fires it (:meth:`CrashInjector.request_sent`).
:data:`SEED_MATRIX` maps the five rows of the seed issue's fault-injection
matrix to crash points per mode.

What this module must never do: invoke an adapter before the ledger said
``dispatched`` (ledger mode), take an execution id or key from tool
arguments, decide recovery itself (the session applies
:func:`~toolledger._core.protocol.decide_recovery`), step the ledger or read
a protocol stage, or catch a :class:`SimulatedCrash`.

The steps, crash points and crash injector are in :mod:`toolledger.kit.crash`,
the provider, the human and the conversation stores in
:mod:`toolledger.kit.world`; this module re-exports their names, so
``from toolledger.kit.engine import ...`` reaches the whole kit engine.
'''

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final

from .._core.protocol import (
    CallPosition,
    Decision,
    InvalidInput,
    RecoveryPolicy,
    ResultKind,
    ToolResult,
)
from .._core.session import (
    Attempt,
    CallRef,
    CallStatus,
    Next,
    NotApplied,
    Outcome,
    Session,
    Tool,
)
from .._core.stores import Store
from .._core.tools import (
    Applied,
    CannotTell,
    DefiniteFailure,
    ReconcileAnswer,
    ReconcilingAdapter,
    RegisteredTool,
    ToolRegistry,
    Unknown,
    frozen_arguments,
)
from .crash import (
    LEDGER_STEPS,
    LEGACY_STEPS,
    SEED_MATRIX,
    CrashInjector,
    CrashPoint,
    EngineMode,
    EngineStep,
    Moment,
    SeedRow,
    SimulatedCrash,
    _mode,
    crash_points,
    parse_crash_point,
)
from .world import (
    ApprovalRequest,
    ConversationStore,
    FileConversationStore,
    Human,
    InboxItem,
    MemoryConversationStore,
    Message,
    Provider,
    ScriptedHuman,
    ScriptedProvider,
    tool_call,
)

if TYPE_CHECKING:  # the type of the read-only accessor TurnEngine.ledger
    from .._core.ledger import Ledger

__all__ = [
    "LEDGER_STEPS",
    "LEGACY_STEPS",
    "SEED_MATRIX",
    "ApprovalRequest",
    "ConversationStore",
    "CrashInjector",
    "CrashPoint",
    "DecisionTaken",
    "DefiniteFailureError",
    "EngineMode",
    "EngineStep",
    "FileConversationStore",
    "Human",
    "InboxItem",
    "MemoryConversationStore",
    "Moment",
    "Provider",
    "RecoveryItem",
    "ScriptedHuman",
    "ScriptedProvider",
    "SeedRow",
    "SimulatedCrash",
    "ToolRegistry",  # the registry a TurnEngine takes (from the core's adapter seam)
    "TurnEngine",
    "TurnResult",
    "TurnStatus",
    "UnknownOutcome",
    "adopt_legacy_session",
    "crash_points",
    "parse_crash_point",
    "tool_call",
]


# --------------------------------------------------------------------------
# What a turn ends with
# --------------------------------------------------------------------------


class TurnStatus(StrEnum):
    DONE = "done"
    WAITING_FOR_APPROVAL = "waiting_for_approval"
    RECOVERY_REQUIRED = "recovery_required"
    MAX_ITERATIONS = "max_iterations"
    STOPPED = "stopped"  # the user pressed Stop: the remaining calls were cancelled


@dataclass(frozen=True, slots=True)
class TurnResult:
    """How :meth:`TurnEngine.run` / :meth:`~TurnEngine.resume` ended."""

    status: TurnStatus
    text: str | None = None  # the final assistant text, when done
    halted: tuple[CallPosition, ...] = ()  # calls in recovery_required
    waiting: tuple[CallPosition, ...] = ()  # calls whose approval is pending


@dataclass(frozen=True, slots=True)
class RecoveryItem:
    """A call halted in ``recovery_required``, as shown to a human."""

    position: CallPosition
    tool_call_id: str
    execution_id: str
    tool: str
    arguments: Mapping[str, Any]
    attempt: int


@dataclass(frozen=True, slots=True)
class DecisionTaken:
    """One recovery decision this engine applied (also in the audit log)."""

    position: CallPosition
    execution_id: str
    decision: Decision
    inputs: Mapping[str, object]


class DefiniteFailureError(NotApplied):
    """An adapter's :class:`~toolledger._core.tools.DefiniteFailure`, raised to the session."""


class UnknownOutcome(Exception):
    """An adapter's :class:`~toolledger._core.tools.Unknown`, raised to the session."""


class _Outcome(StrEnum):
    SETTLED = "settled"
    READY = "ready"
    WAITING = "waiting"
    HALTED = "halted"


# --------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------


def _parse_calls(
    message: Mapping[str, Any], registry: ToolRegistry
) -> list[tuple[str, str, dict[str, Any]]]:
    """(tool_call_id, tool name, arguments) of every call, validated; raises InvalidInput."""
    raw = message.get("tool_calls") or []
    if not isinstance(raw, list):
        raise InvalidInput("assistant message tool_calls must be a list")
    out = []
    for i, tc in enumerate(raw):
        if not isinstance(tc, Mapping) or not isinstance(tc.get("function"), Mapping):
            raise InvalidInput(f"tool call {i} is not {{id, function{{name, arguments}}}}: {tc!r}")
        call_id = tc.get("id")
        call_id = "" if call_id is None else call_id
        if not isinstance(call_id, str):
            raise InvalidInput(f"tool call {i} has a non-string id {call_id!r}")
        fn = tc["function"]
        name = fn.get("name")
        text = fn.get("arguments") or "{}"
        try:
            arguments = json.loads(text) if isinstance(text, str) else text
        except json.JSONDecodeError as exc:
            raise InvalidInput(
                f"tool call {i} ({name!r}) has arguments that are not JSON ({exc}); "
                "nothing was recorded"
            ) from None
        registry.check_call(str(name), arguments)
        out.append((call_id, str(name), dict(arguments)))
    return out


class TurnEngine:
    """A turn engine shaped like openworker's ``TurnEngine``, in ``legacy`` or ``ledger`` mode.

    Build one per (re)started process from durable things only: the
    ``store`` (ledger mode), the ``conversations`` checkpoint store and the
    external systems behind the registry's adapters.  :meth:`run` runs a user
    turn; :meth:`resume` is durable resume (after a crash, or when an
    approval or recovery item was resolved while no engine ran).

    ``fused=True``: a message whose calls need no human runs through
    :meth:`toolledger.Session.execute_message` on a lazily created session
    (n + 1 commits for n protected calls).  ``together=True``: the same, with
    ``execute_message(..., together=True)`` (two commits per message however
    many calls); it implies ``fused``, so ``TurnEngine(together=True)`` is
    enough.
    """

    def __init__(
        self,
        *,
        session_id: str,
        registry: ToolRegistry,
        provider: Provider,
        human: Human,
        conversations: ConversationStore,
        mode: EngineMode | str = EngineMode.LEDGER,
        store: Store | None = None,
        crash: CrashInjector | None = None,
        max_iterations: int = 12,
        max_attempts: int = 3,
        fused: bool = False,
        together: bool = False,
    ) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise InvalidInput(f"session_id must be a non-empty string, got {session_id!r}")
        self.mode = _mode(mode)
        if self.mode is EngineMode.LEDGER and store is None:
            raise InvalidInput(
                "the ledger engine needs a store (MemoryStore, SqliteStore): pass store=..."
            )
        self.session_id = session_id
        self.registry = registry
        self.provider = provider
        self.human = human
        self.conversations = conversations
        self.store = store
        self.crash = crash or CrashInjector(None)
        self.max_iterations = max_iterations
        self.max_attempts = max_attempts
        # fused: a message whose calls need no human runs through
        # Session.execute_message on a lazily created session (its first commit
        # creates it, records the calls and dispatches the first).  The host
        # declares every conversation of this engine ledger-governed from its
        # first message: a missing session is a new one, never a legacy one.
        # together: the fused path with Session.execute_message(together=True), a
        # message's calls dispatched in its record commit and their outcomes
        # recorded in one commit.  It implies fused (the same lazily created
        # session, the same messages: those whose calls need no human).
        for flag, value in (("fused", fused), ("together", together)):
            if not isinstance(value, bool):
                raise InvalidInput(f"TurnEngine: {flag} must be True or False, got {value!r}")
        self.together = together
        self.fused = fused or together
        self.log: list[str] = []
        self.decisions: list[DecisionTaken] = []
        self._messages: list[Message] = conversations.load_messages(session_id)
        self._inbox: list[InboxItem] = conversations.load_inbox(session_id)
        self._session: Session | None = None
        # The user's Stop (openworker's ``_cancel`` flag): set from outside,
        # e.g. by a tool or a UI thread while a call runs; volatile.
        self._stop_requested = False
        if self.mode is EngineMode.LEDGER:
            # LEDGER: the tools as the session knows them; marks_send: the body
            # says when the request leaves (an exception before it: not sent).
            tools = {t.name: Tool(t.profile.policy, t.profile.requires_approval, marks_send=True)
                     for t in registry}
            # observe: the crash harness hears of every commit (fault injection only)
            self._session = self._open_session(tools, self.crash.stepped)

    # -- public -----------------------------------------------------------------

    @property
    def messages(self) -> list[Message]:
        """A copy of the conversation as this engine holds it."""
        return copy.deepcopy(self._messages)

    @property
    def session(self) -> Session:
        """The adopter's API on the ledger (ledger mode only)."""
        if self._session is None:
            raise InvalidInput("the legacy engine has no ledger")
        return self._session

    @property
    def ledger(self) -> Ledger:
        """The session's ledger, for tests and audits (ledger mode only; read it only)."""
        return self.session.ledger

    def run(self, user_text: str) -> TurnResult:
        """Run one user turn until the model stops, an approval waits, or a call halts."""
        if self.mode is EngineMode.LEDGER:
            open_calls = [p for p, done in self._recorded() if not done]
            if open_calls:
                raise InvalidInput(
                    f"session {self.session_id!r} has calls without a result at {open_calls}: "
                    "answer their approvals (resolve_approval) or recovery items "
                    "(resolve_recovery) first; nothing was recorded"
                )
        self._messages.append({"role": "user", "content": user_text})
        self._checkpoint()  # turn_start
        return self._loop()

    def resume(self) -> TurnResult:
        """Durable resume: finish the trailing calls, then continue the turn."""
        if self.mode is EngineMode.LEGACY:
            pending = self._legacy_unanswered_trailing()
            if pending:
                outcome = self._legacy_handle(pending)
                if outcome is not None:
                    return outcome
            return self._loop()
        # LEDGER: the conversation and the ledger are two files; a crash
        # between their writes leaves one ahead of the other.  Repair first:
        # the calls the conversation holds and the ledger lacks (a crash after
        # the assistant message was checkpointed) are recorded now.
        positions = self._trailing_positions()
        self._record_missing(positions)
        # LEDGER: recover() decides every call a restart interrupted (ONE
        # commit) and says what to do next for each; the decisions are the
        # core's, audited with their inputs.
        known = {}
        for status in self.session.recover():
            self._taken(status)
            known[status.call.position] = status
        # A legacy call (before the marker) that already had its result when
        # the session was adopted is not in the ledger: it is answered.
        positions = [p for p in positions if p in known]
        for pos in positions:
            status = known[pos]
            if status.next is Next.RESULT and not self._has_tool_message(status.call.key):
                # The ledger answered the call, the conversation file lost the
                # message: reconstruct it from the record, never re-invoke.
                self.log.append(f"reconstruct {pos} from the ledger: conversation repaired")
        result = self._handle(positions)
        return result if result is not None else self._loop()

    def recovery_required(self) -> list[RecoveryItem]:
        """Calls halted in ``recovery_required``, waiting for a human (ledger mode).

        Read only (no decision is applied): what the host's recovery inbox shows."""
        out = []
        for c in self.session.ledger.recovery_required():
            ref = self.session.call(c.execution_id)
            out.append(RecoveryItem(ref.position, ref.tool_call_id, ref.key, ref.name,
                                    dict(ref.arguments), self._attempt(ref.key)))
        return out

    def resolve_recovery(
        self,
        position: CallPosition,
        resolution: str,
        *,
        result_text: str | None = None,
        note: str = "",
    ) -> TurnResult:
        """A human resolves a halted call (``"applied"``, ``"retry"``, ``"abandon"``), then the
        session resumes, as resolving an inbox item resumes it in openworker."""
        # LEDGER: the session records the resolution as one audited
        # transition; "retry" authorizes attempt n+1 by a human, "applied"
        # makes the human's text the result, "abandon" ends the call (both
        # with the result in the same step).
        self._taken(self.session.resolve(self._key(position), resolution,
                                         result=result_text, note=note))
        self.log.append(f"human resolved {position}: {resolution}")
        return self.resume()

    def pending_approvals(self) -> list[CallPosition]:
        """Calls whose approval is parked and unanswered."""
        if self.mode is EngineMode.LEGACY:
            by_id = {tc: pos for pos, tc in self._legacy_calls()}
            return [by_id[i.tool_call_id] for i in self._inbox
                    if i.state == "pending" and i.tool_call_id in by_id]
        return [ref.position for ref in self.session.pending_approvals()]

    def resolve_approval(self, position: CallPosition, approve: bool) -> TurnResult:
        """A human answers a parked approval while no engine waits; the session resumes."""
        if self.mode is EngineMode.LEGACY:
            call_id = dict(self._legacy_calls()).get(position)
            item = next((i for i in self._inbox if i.tool_call_id == call_id), None)
            if item is None or item.state != "pending":
                raise InvalidInput(f"no pending approval for the call at {position}")
            item.state, item.resolution = "resolved", "allow" if approve else "deny"
            self.conversations.save_inbox(self.session_id, self._inbox)
        else:  # LEDGER: the answer is keyed by the execution id (the inbox key)
            key = self._key(position)
            self.session.approve(key) if approve else self.session.reject(key)
        return self.resume()

    def request_stop(self) -> None:
        """The user's Stop, pressed while the turn runs (ledger mode).

        Checked before each call is dispatched: every call of the message not
        dispatched yet, approved or needing no approval, is cancelled
        (``HumanCancel``: a ``cancelled`` result, never dispatched afterwards)
        and the turn ends with :attr:`TurnStatus.STOPPED`.  A call already
        dispatched runs to its end (its outcome is recorded as usual); a call
        still waiting for its approval is left waiting.
        """
        if self.mode is not EngineMode.LEDGER:
            raise InvalidInput(
                "Stop before dispatch is a ledger action; the legacy engine has none"
            )
        self._stop_requested = True

    # -- the loop -------------------------------------------------------------------

    def _loop(self) -> TurnResult:
        for _ in range(self.max_iterations):
            last = self._messages[-1] if self._messages else None
            if last is not None and last.get("role") == "assistant" and not last.get("tool_calls"):
                return TurnResult(TurnStatus.DONE, last.get("content"))
            self.crash.at(self.mode, Moment.MODEL_CALLED)
            message = self.provider.complete(_for_provider(self._messages))
            # Validate every call before anything is recorded: an unknown
            # tool, non-JSON arguments or a model-supplied key argument stop
            # here, with nothing in the conversation, the ledger or the world.
            calls = _parse_calls(message, self.registry)
            turn = len(self._messages)
            self._messages.append(message)
            self.crash.at(self.mode, Moment.MODEL_ANSWERED)
            if not calls:
                self._checkpoint()
                return TurnResult(TurnStatus.DONE, message.get("content"))
            positions = [(turn, slot) for slot in range(len(calls))]
            if self.mode is EngineMode.LEGACY:
                legacy = [(pos, cid) for pos, (cid, _, _) in zip(positions, calls, strict=True)]
                outcome = self._legacy_handle(legacy)
            else:
                # LEDGER: the assistant message is checkpointed BEFORE anything
                # is dispatched: otherwise a crash could let the model put a
                # different call at the same position under a reused id.
                self._checkpoint()
                self.crash.at(self.mode, Moment.CALLS_SAVED)
                if self.fused and not any(self.registry.get(name).profile.requires_approval
                                          for _, name, _ in calls):
                    self._execute_message(turn, calls)
                else:
                    self._record(turn, calls)
                outcome = self._handle(positions)
            if outcome is not None:
                return outcome
        return TurnResult(TurnStatus.MAX_ITERATIONS)

    # -- ledger mode ------------------------------------------------------------------

    def _open_session(
        self, tools: Mapping[str, Tool], observe: Callable[[Sequence[Any]], None]
    ) -> Session:
        """The session on the store: loaded, adopted from the legacy engine, or created."""
        assert self.store is not None
        if self.session_id in self.store.sessions():
            opened = Session.open(self.store, self.session_id, tools)
        elif self.fused:  # (together implies fused)
            # LEDGER: no commit of its own; a crash before the first one leaves the
            # conversation ahead of the ledger, and resume records its calls
            opened = Session.open(self.store, self.session_id, tools,
                                  max_attempts=self.max_attempts, lazy_create=True)
        elif self._messages:
            # A session that ran under the legacy engine: calls before this
            # point are legacy (the protocol marker), and its unanswered
            # approved calls are recovered conservatively.
            opened = adopt_legacy_session(
                self.store, self.session_id, self._messages, self._inbox, self.registry,
                max_attempts=self.max_attempts,
            )
        else:
            opened = Session.open(self.store, self.session_id, tools,
                                  max_attempts=self.max_attempts)
        return Session(opened.ledger, tools, observe=observe)

    def _record(self, turn: int, calls: Sequence[tuple[str, str, dict[str, Any]]]) -> None:
        # LEDGER: the calls of the message are durable, with their arguments
        # (a retry after a crash sends exactly the same request), and their
        # approvals parked: ONE transaction.  The position (message number,
        # index in it) goes into the execution id.
        self.session.record(turn, [{"id": cid, "name": name, "arguments": args}
                                   for cid, name, args in calls])
        self.log.append(f"recorded the calls of message {turn}")

    def _execute_message(self, turn: int, calls: Sequence[tuple[str, str, dict[str, Any]]]
                         ) -> None:
        # LEDGER (fused): record the calls and run them in order, in n + 1 commits:
        # [record + dispatched(1)], [succeeded(k) + result + dispatched(k+1)] ...,
        # [succeeded(n) + result].  Outcomes other than "applied" are recorded as
        # in _run; _handle then appends the tool messages and settles the rest.
        # LEDGER (together): [record + dispatched(1..n)], [outcomes 1..n + results]:
        # two commits however many calls; a crash between them leaves every call
        # of the message dispatched-and-unknown, and recovery decides each by its
        # policy.  An unknown outcome is decided at once, the outcomes before it
        # committed first (execute_message's doc).
        def body(a: Attempt) -> object:
            return self._body(a.call)(a)

        for status in self.session.execute_message(
                turn, [{"id": cid, "name": name, "arguments": args}
                       for cid, name, args in calls], body, together=self.together):
            if status.outcome is Outcome.UNKNOWN:
                self.log.append(f"outcome unknown {status.call.position}: {status.error}")
            self._taken(status)
        self.log.append(f"recorded and ran the calls of message {turn}")

    def _recorded(self) -> list[tuple[CallPosition, bool]]:
        """(position, has a result) of every call in the session's working set."""
        return [(c.position, c.result is not None) for c in self.session.ledger.state.calls]

    def _key(self, pos: CallPosition) -> str:
        """The execution id of the call at ``pos`` (the key every session method takes)."""
        c = self.session.ledger.state.call(pos)
        if c is None:
            raise InvalidInput(f"no call at {pos} in session {self.session_id!r}")
        return c.execution_id

    def _attempt(self, key: str) -> int:
        return self.session.ledger.state.record(key).attempt

    def _trailing_positions(self) -> list[CallPosition]:
        """Positions of the calls of the last assistant message, unless a user spoke since."""
        for turn in range(len(self._messages) - 1, -1, -1):
            m = self._messages[turn]
            if m.get("role") == "user":
                return []
            if m.get("role") == "assistant" and m.get("tool_calls"):
                return [(turn, slot) for slot in range(len(m["tool_calls"]))]
        return []

    def _record_missing(self, positions: Sequence[CallPosition]) -> None:
        recorded = {p for p, _ in self._recorded()}
        if not positions or all(p in recorded for p in positions):
            return
        turn = positions[0][0]
        if turn < self.session.marker:
            return  # legacy calls were adopted when the session was opened
        self._record(turn, _parse_calls(self._messages[turn], self.registry))

    def _handle(self, positions: Sequence[CallPosition]) -> TurnResult | None:
        """Settle the calls at ``positions``; ``None`` if all have results (go on)."""
        # Phase A (openworker's authorization pass): ask the human.
        waiting = [p for p in positions if self._settle(p, execute=False) is _Outcome.WAITING]
        if waiting:
            return TurnResult(TurnStatus.WAITING_FOR_APPROVAL, waiting=tuple(waiting))
        # Phase B: execute, one call at a time, in order.
        halted = []
        for p in positions:
            if self._stop_requested:
                self._cancel_if_not_dispatched(p)
            if self._settle(p, execute=True) is _Outcome.HALTED:
                halted.append(p)
        if halted:
            return TurnResult(TurnStatus.RECOVERY_REQUIRED, halted=tuple(halted))
        if self._stop_requested:
            self._stop_requested = False
            return TurnResult(TurnStatus.STOPPED)
        return None

    def _cancel_if_not_dispatched(self, pos: CallPosition) -> None:
        # LEDGER: a Stop after approval but before dispatch: the call gets a
        # cancelled result (and its audit row) in one commit; it is never
        # dispatched.  Only a call the engine would run now is cancelled.
        key = self._key(pos)
        if self.session.status(key).next is Next.EXECUTE:
            self.session.cancel(key)
            self.log.append(f"stopped {pos} before dispatch: cancelled")

    def _settle(self, pos: CallPosition, *, execute: bool) -> _Outcome:
        # LEDGER: what to do next is the session's answer (Next), never a
        # reading of the protocol's stages.
        key = self._key(pos)
        while True:
            status = self.session.status(key)
            nxt = status.next
            if nxt is Next.RESULT:
                self._ensure_tool_message(status)
                return _Outcome.SETTLED
            if nxt is Next.HALTED:
                return _Outcome.HALTED
            if nxt is Next.AWAIT_APPROVAL:
                # LEDGER: the approval is keyed by the execution id, so a
                # reused tool_call_id can never find another call's.
                answer = self.human.decide(self._approval_request(status.call))
                if answer is None:
                    return _Outcome.WAITING
                # LEDGER: a rejection records the denied result in the same commit
                self.session.approve(key) if answer == "approve" else self.session.reject(key)
                continue
            if not execute:
                return _Outcome.READY
            if nxt in (Next.EXECUTE, Next.RETRY):
                self._run(status.call)
            elif nxt is Next.RECONCILE:
                self._reconcile(status.call)
            else:
                raise InvalidInput(f"call {key} at {pos} cannot be settled now "
                                   f"(next: {nxt.value})")

    def _run(self, call: CallRef) -> None:
        # LEDGER: the session makes dispatched(n) durable, with its audit row,
        # BEFORE the body runs; from a.sending() on, a crash means "outcome
        # unknown".  The body's return is applied (succeeded + the tool result,
        # ONE transaction), NotApplied a definite failure, anything else
        # unknown: the session then makes the decision a restart would.
        status = self.session.execute(call.key, self._body(call))
        if status.outcome is Outcome.UNKNOWN:
            self.log.append(f"outcome unknown {call.position}: {status.error}")
        self._taken(status)

    def _body(self, call: CallRef) -> Callable[[Attempt], str]:
        """The tool body of ``call``: its adapter, with the crash points around the request."""
        pos, readonly = call.position, call.policy is RecoveryPolicy.READONLY
        adapter = self.registry.get(call.name).adapter

        def body(a: Attempt) -> str:
            if not readonly:
                self.log.append(f"dispatched {pos} attempt {a.attempt}")
            a.sending()
            self.crash.sending(self.mode, Moment.READONLY_REQUEST_OUT if readonly
                               else Moment.REQUEST_OUT)
            try:  # LEDGER: the key travels as a keyword, never inside the arguments.
                outcome = adapter.invoke(a.arguments, execution_id=a.execution_id,
                                         idempotency_key=a.idempotency_key, attempt=a.attempt)
            except Exception as exc:  # an adapter that raises: outcome unknown
                outcome = Unknown(f"the adapter raised {type(exc).__name__}: {exc}")
            finally:
                self.crash.done_sending()
            self.log.append(f"invoked {pos}{'' if readonly else f' attempt {a.attempt}'}: "
                            f"{type(outcome).__name__}")
            if isinstance(outcome, Applied):
                if readonly:  # no ledger step to follow (the session's report does it)
                    self.crash.at(self.mode, Moment.ANSWERED)
                return outcome.result
            if not readonly and isinstance(outcome, DefiniteFailure):
                raise DefiniteFailureError(outcome.error)
            if not readonly:
                assert isinstance(outcome, Unknown)
                raise UnknownOutcome(outcome.reason)
            reason = outcome.error if isinstance(outcome, DefiniteFailure) else outcome.reason
            return json.dumps({"error": reason, "error_type": type(outcome).__name__})

        return body

    def _taken(self, status: CallStatus) -> None:
        if status.recovered and status.decision is not None and status.inputs is not None:
            self.decisions.append(DecisionTaken(status.call.position, status.key,
                                                status.decision, status.inputs.as_dict()))
            self.log.append(f"decided {status.call.position}: {status.decision.value}")

    def _reconcile(self, call: CallRef) -> None:
        adapter = self.registry.get(call.name).adapter

        def ask(ref: CallRef, attempt: int) -> ReconcileAnswer:
            answer: ReconcileAnswer = (
                adapter.reconcile(ref.key, attempt=attempt)
                if isinstance(adapter, ReconcilingAdapter)
                else CannotTell("the adapter has no reconcile()"))
            self.log.append(f"reconcile {ref.position} attempt {attempt}: "
                            f"{type(answer).__name__}")
            return answer

        self.session.reconcile(call.key, ask)

    def _approval_request(self, call: CallRef) -> ApprovalRequest:
        return ApprovalRequest(self.session_id, call.name, dict(call.arguments),
                               call.tool_call_id, call.key, call.position)

    def _has_tool_message(self, key: str) -> bool:
        return any(m.get("role") == "tool" and m.get("execution_id") == key
                   for m in self._messages)

    def _ensure_tool_message(self, status: CallStatus) -> None:
        """Append the role=tool message of a call the ledger answered, once."""
        assert status.result is not None
        if self._has_tool_message(status.key):
            return
        self._messages.append(_tool_message(status.call.tool_call_id, status.result))
        self._checkpoint()  # tool_finished is a checkpoint here
        self.crash.at(self.mode, Moment.RESULT_SAVED)

    # -- legacy mode (today's behaviour, LegacyResume.tla) ------------------------------

    def _legacy_calls(self) -> list[tuple[CallPosition, str]]:
        out = []
        for turn, m in enumerate(self._messages):
            for slot, tc in enumerate(m.get("tool_calls") or []):
                out.append(((turn, slot), str(tc.get("id") or "")))
        return out

    def _legacy_unanswered_trailing(self) -> list[tuple[CallPosition, str]]:
        # _unanswered_trailing_tool_calls: "answered" is built from ALL role=tool
        # messages of the thread, so a reused id counts as answered.
        answered = {m.get("tool_call_id") for m in self._messages if m.get("role") == "tool"}
        positions = self._trailing_positions()
        calls = dict(self._legacy_calls())
        return [(p, calls[p]) for p in positions if calls[p] not in answered]

    def _legacy_handle(self, calls: Sequence[tuple[CallPosition, str]]) -> TurnResult | None:
        cleared: list[tuple[CallPosition, str, RegisteredTool, dict[str, Any]]] = []
        for pos, call_id in calls:  # Phase A: authorize
            turn, slot = pos
            _, name, arguments = _parse_calls(self._messages[turn], self.registry)[slot]
            tool = self.registry.get(name)
            if tool.profile.requires_approval:
                # InboxStore.add is idempotent by (session_id, tool_call_id) only:
                # a resolved item of an earlier call with the same id comes back.
                item = next((i for i in self._inbox if i.session_id == self.session_id
                             and i.tool_call_id == call_id), None)
                if item is None:
                    item = InboxItem(uuid.uuid4().hex, self.session_id, call_id, name, arguments)
                    self._inbox.append(item)
                    self.conversations.save_inbox(self.session_id, self._inbox)
                    self._checkpoint()  # the approver's persist_session()
                    self.crash.at(self.mode, Moment.INBOX_PARKED)
                if item.state == "pending":
                    answer = self.human.decide(ApprovalRequest(
                        self.session_id, name, arguments, call_id, None, pos))
                    if answer is None:
                        return TurnResult(TurnStatus.WAITING_FOR_APPROVAL, waiting=(pos,))
                    item.state = "resolved"
                    item.resolution = "allow" if answer == "approve" else "deny"
                    self.conversations.save_inbox(self.session_id, self._inbox)
                    self.crash.at(self.mode, Moment.INBOX_RESOLVED)
                else:
                    self.log.append(f"reused resolved approval {item.id} for {call_id!r}")
                if item.resolution != "allow":
                    self._messages.append({"role": "tool", "tool_call_id": call_id,
                                           "content": json.dumps({"error": "denied by the user"}),
                                           "status": ResultKind.DENIED.value})
                    continue
            cleared.append((pos, call_id, tool, arguments))
        for pos, call_id, tool, arguments in cleared:  # Phase B: execute
            # registry.execute(name, args): no execution identity, no key.
            label = f"legacy:{self.session_id}:{call_id}"
            self.crash.sending(self.mode, Moment.REQUEST_OUT)
            try:
                outcome = tool.adapter.invoke(frozen_arguments(arguments), execution_id=label,
                                              idempotency_key=None, attempt=1)
            except Exception as exc:
                outcome = Unknown(f"{type(exc).__name__}: {exc}")
            finally:
                self.crash.done_sending()
            self.log.append(f"execute {call_id!r} at {pos}: {type(outcome).__name__}")
            if isinstance(outcome, Applied):
                self.crash.at(self.mode, Moment.ANSWERED)
                content, status = outcome.result, ResultKind.OK.value
            else:
                reason = outcome.error if isinstance(outcome, DefiniteFailure) else outcome.reason
                content = json.dumps({"error": reason, "error_type": type(outcome).__name__})
                status = ResultKind.ERROR.value
            # _record_result: in memory only; nothing is persisted here.
            self._messages.append({"role": "tool", "tool_call_id": call_id,
                                   "content": content, "status": status})
            self.crash.at(self.mode, Moment.RESULT_IN_MEMORY)
        self._checkpoint()  # iteration_end
        self.crash.at(self.mode, Moment.RESULT_SAVED)
        return None

    # -- shared ------------------------------------------------------------------------

    def _checkpoint(self) -> None:
        self.conversations.save_messages(self.session_id, self._messages)


_ENGINE_METADATA: Final = ("execution_id", "status")


def _for_provider(messages: Sequence[Message]) -> list[Message]:
    """A copy of the conversation without the engine's own metadata."""
    out = copy.deepcopy(list(messages))
    for m in out:
        if m.get("role") == "tool":
            for key in _ENGINE_METADATA:
                m.pop(key, None)
    return out


def _tool_message(tool_call_id: str, result: ToolResult) -> Message:
    return {
        "role": "tool",
        "tool_call_id": tool_call_id,
        "content": result.content,
        # engine metadata, stripped before the conversation goes to a provider
        "execution_id": result.execution_id,
        "status": result.kind.value,
    }


def adopt_legacy_session(
    store: Store,
    session_id: str,
    messages: Sequence[Mapping[str, Any]],
    inbox: Sequence[InboxItem],
    registry: ToolRegistry,
    *,
    max_attempts: int = 3,
) -> Session:
    """Put a session that ran under the legacy engine under the ledger.

    The protocol marker is the next message's sequence number: every call
    already in ``messages`` is legacy.  Each legacy call without a tool result
    is made durable in the ledger as the spec's ``Init`` has it (durable, in
    ``RESUME``, approved if its inbox item was resolved "allow"), so that
    ``Recover`` applies the conservative legacy rule: approved, no result, no
    record -> ``recovery_required``.  Nothing is executed here.
    """
    # LEDGER: Session.adopt does it from plain message dicts; the registry
    # validates every call first (a known tool), the inbox gives each call's
    # approval (its first item, by tool_call_id: all a legacy inbox keys by).
    for m in messages:
        if m.get("tool_calls"):
            _parse_calls(m, registry)
    approvals: dict[str, str] = {}
    for item in inbox:
        approvals.setdefault(item.tool_call_id, "pending" if item.state == "pending" else
                             "approved" if item.resolution == "allow" else "rejected")
    tools = {t.name: Tool(t.profile.policy, t.profile.requires_approval) for t in registry}
    return Session.adopt(store, session_id, messages, tools, approvals=approvals,
                         max_attempts=max_attempts)

