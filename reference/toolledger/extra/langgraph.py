"""Crash-safe tool calls for LangGraph graphs: a ``ToolNode`` that runs every call through
``toolledger.Session``.

``LedgerToolNode(tools, store=..., policies=...)`` is a drop-in for LangGraph's
``ToolNode`` (same tools, same state, ``InjectedState`` / ``ToolRuntime`` /
``InjectedStore`` injection, ``tools_condition`` routing) whose calls go through
the ledger of the graph's thread:

- the calls of one ``AIMessage`` are recorded (durable, approvals parked) in one
  transaction before any of them runs;
- ``dispatched`` is durable before the tool body runs, the outcome is recorded
  after it (a protected call costs two transactions);
- a tool that declares ``execution_id`` and/or ``idempotency_key`` as injected
  arguments (``Annotated[str, InjectedToolArg]``, the LangChain way: the model's
  schema never shows them, and ``ToolNode`` drops a value the model writes) gets
  the ledger's values there; a call whose arguments name them anyway is refused
  (an error ``ToolMessage``; nothing is recorded or run);
- approvals are LangGraph interrupts (``interrupt``) whose requests carry the
  execution id (``key``); an answer, ``Command(resume={key: "approve"})``, counts
  only for that execution and only once: a later call that re-uses the provider's
  tool call id is a new execution and asks again;
- a graph resumed after a crash the LangGraph way (``graph.invoke(None, config)``
  on the same ``thread_id``: the tools node runs again) gets the ledger's recovery
  decision: a call with a recorded result returns it without running again; an
  ``idempotent`` call is retried with the same key; a ``reconcile`` call asks its
  connector (``reconcilers={name: ask}``, see :meth:`toolledger.Session.reconcile`);
  a call whose outcome nobody can tell (a ``manual`` one, or a reconcile without an
  answer) is a ``recovery_required`` interrupt a human answers with
  ``Command(resume={key: "applied" | "retry" | "abandon"})`` (``{"type":
  "applied", "result": "..."}`` to give the result the external system holds).

The ledger places each ``AIMessage`` itself, never by its position in the state's
messages (docs/protocol.md#placing-a-response): every ``ToolMessage`` this node creates
carries its call's ledger key in ``response_metadata["toolledger"]`` (:data:`LEDGER_MARK`,
read with :func:`ledger_key`; it survives the checkpointer and ``RemoveMessage``), and
an ``AIMessage`` is recorded with ``seen`` = the keys on the ToolMessages before it. So:

- trimming (``RemoveMessage``) or summarising old messages changes nothing, as long as
  the newest tool results (or a copy of them, marks included) stay in the state;
- a provider that re-uses ``call_0`` with the same arguments on a later turn gets a new
  execution, which runs (it follows the previous result);
- a response the graph lost before it was saved (``durability="exit"``, a kill
  mid-tool) and the model asks again: the same call (tool and arguments) under a new
  tool call id IS the lost call, answered under the new id with the lost call's
  recovery (a result, a retry under its own key, a connector, a human); a different
  call is new and runs, the lost response's undispatched calls are voided (their
  approvals ask nothing more) and its dispatched ones are recovered by their policy
  after the message's calls ran (a ``manual`` one: a ``recovery_required`` interrupt
  whose ``tool_call_id`` is the lost call's).

Where the ledger lives: a :class:`~toolledger.SqliteStore` beside the graph's
``SqliteSaver`` (:func:`store_beside`: ``checkpoints.sqlite`` gets
``checkpoints.toolledger.sqlite3`` in the same directory). It must be as durable as
the checkpointer, and it is a separate file: a toolledger store is never a file of
another application.

Not covered: a protected tool that returns a ``Command`` (its text is recorded,
its state update is not reconstructed after a crash); a protected tool that calls
``interrupt()`` itself (its attempt ends with an unknown outcome: use the ledger's
approvals); a history processor that drops the newest ToolMessages with their marks
(then an identical repeat of the latest call reads as a resume: its recorded result is
returned, nothing is sent twice); a lost ``idempotent`` call retried with a tool that
needs the state of its own message (it gets the current one).
"""

from __future__ import annotations

import contextvars
import json
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from copy import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NoReturn, TypeAlias

from langchain_core.messages import AIMessage, AnyMessage, ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import (
    ToolCallRequest,
    ToolInvocationError,
    ToolRuntime,
    _default_handle_tool_errors,
    _handle_tool_error,
    _infer_handled_types,
)
from langgraph.runtime import Runtime
from langgraph.types import Command, interrupt
from pydantic import BaseModel

from .._core.ledger import RESOLUTIONS
from .._core.protocol import InvalidInput, ResultKind
from .._core.session import CallStatus, Next, NotApplied, Outcome, Session, Tool
from .._core.sqlite_store import SqliteStore
from .._core.stores import Store
from .._core.tools import CannotTell, ReconcileAnswer, check_arguments

__all__ = [
    "APPROVAL_DECISIONS",
    "INTERRUPT_KEY",
    "LEDGER_KEYWORDS",
    "LEDGER_MARK",
    "LedgerToolNode",
    "Reconciler",
    "ledger_key",
    "ledger_path",
    "open_saver",
    "store_beside",
]

LEDGER_KEYWORDS: Final = ("execution_id", "idempotency_key")
"""Injected tool arguments the ledger fills in; never in the schema the model sees."""

INTERRUPT_KEY: Final = "toolledger"
"""The key of the ledger's requests in an interrupt's value: ``{"toolledger": [...]}``."""

APPROVAL_DECISIONS: Final = ("approve", "reject")
"""What a human answers to an ``approval`` request (``recovery_required``: a resolution)."""

Reconciler: TypeAlias = Callable[..., ReconcileAnswer]
"""``ask(call, attempt)``: asks the external system about a ``reconcile`` call
(:meth:`toolledger.Session.reconcile`)."""

LEDGER_MARK: Final = "toolledger"
"""The key of the ledger's mark in a ``ToolMessage``'s ``response_metadata``:
``{"session": ..., "key": ...}``, the execution id of the call it answers."""

_ASK: Final = (Next.AWAIT_APPROVAL, Next.HALTED)
_RUN_AGAIN: Final = (Next.EXECUTE, Next.RETRY)
_LOST: Final = "toolledger-lost:"  # the tool call id a lost call runs under (never the model's)
_LOST_NEXT: Final = (Next.HALTED, Next.RECONCILE, *_RUN_AGAIN)


def ledger_key(message: ToolMessage, session_id: str | None = None) -> str | None:
    """The ledger key a :class:`LedgerToolNode` put on a ``ToolMessage`` it created (of
    the ledger session ``session_id`` if given); ``None`` on any other message."""
    mark = message.response_metadata.get(LEDGER_MARK)
    if not isinstance(mark, Mapping) or not isinstance(mark.get("key"), str):
        return None
    if session_id is not None and mark.get("session") != session_id:
        return None
    return str(mark["key"])


def _marked(message: ToolMessage, session: Session, key: str) -> ToolMessage:
    """``message`` with the ledger's mark (a copy: the tool's own message is not changed)."""
    meta = {**message.response_metadata,
            LEDGER_MARK: {"session": session.session_id, "key": key}}
    return message.model_copy(update={"response_metadata": meta})


def store_beside(checkpointer: SqliteSaver | str | Path) -> SqliteStore:
    """The ledger's :class:`~toolledger.SqliteStore` next to a ``SqliteSaver`` (or its file).

    ``checkpoints.sqlite`` -> ``checkpoints.toolledger.sqlite3`` in the same directory
    (:func:`ledger_path`): the same disk, the same backups, the same lifetime as the
    graph's checkpoints.
    """
    return SqliteStore(ledger_path(checkpointer))


def ledger_path(checkpointer: SqliteSaver | str | Path) -> Path:
    """Where :func:`store_beside` puts the ledger of a ``SqliteSaver`` (or of its file)."""
    if isinstance(checkpointer, SqliteSaver):
        rows = checkpointer.conn.execute("PRAGMA database_list").fetchall()
        main = next((str(r[2]) for r in rows if r[1] == "main"), "")
        if not main:
            raise InvalidInput("the checkpointer's SQLite database is in memory: it has no "
                               "directory to put the ledger in; give the checkpointer a file, "
                               "or open SqliteStore(path) yourself")
        path = Path(main)
    elif isinstance(checkpointer, (str, Path)):
        if str(checkpointer) in ("", ":memory:"):
            raise InvalidInput(f"{str(checkpointer)!r} is not a checkpoint file path: give "
                               "the file of the graph's SqliteSaver")
        path = Path(checkpointer)
    else:
        raise InvalidInput(f"store_beside needs a SqliteSaver or its file path, got "
                           f"{type(checkpointer).__name__}")
    return path.with_name(f"{path.stem}.toolledger.sqlite3")


@dataclass(frozen=True, slots=True)
class _Run:
    """One run of the node on one AIMessage: what its per-call wrapper needs."""

    session: Session
    statuses: Mapping[str, CallStatus]  # tool call id -> status, when the run started


_RUN: contextvars.ContextVar[_Run] = contextvars.ContextVar("toolledger_langgraph_run")
# (tool call id, execution id, idempotency key) of the call whose tool body runs now
_ATTEMPT: contextvars.ContextVar[tuple[str, str, str | None]] = contextvars.ContextVar(
    "toolledger_langgraph_attempt")


@dataclass(frozen=True, slots=True)
class _Plan:
    session: Session
    seen: frozenset[str]  # the keys on this node's ToolMessages before the AIMessage
    calls: list[dict[str, Any]]  # every call of the message to this node's tools
    mine: list[str]  # the tool call ids this run of the node executes
    refused: str | None  # why nothing of this message may be recorded


class LedgerToolNode(ToolNode):
    """A ``ToolNode`` whose tool calls go through the ledger on ``store``.

    ``policies`` declares the recovery policy (and approval default) per tool name, as
    in :class:`toolledger.Session`: a tool not named there is ``manual`` and requires
    approval. ``reconcilers`` maps a ``reconcile`` tool's name to its connector.
    ``max_attempts`` bounds an ``idempotent`` tool's retries. The other arguments are
    ``ToolNode``'s; ``handle_tool_errors`` applies to calls that definitely did not
    run (the model's invalid arguments, a tool's :class:`~toolledger.NotApplied`): an
    exception after which nobody can tell goes to the ledger's recovery instead.
    """

    def __init__(
        self,
        tools: Sequence[BaseTool | Callable[..., Any]],
        *,
        store: Store,
        policies: Mapping[str, Tool | str] | None = None,
        reconcilers: Mapping[str, Reconciler] | None = None,
        max_attempts: int = 3,
        name: str = "tools",
        tags: list[str] | None = None,
        handle_tool_errors: Any = _default_handle_tool_errors,
        messages_key: str = "messages",
    ) -> None:
        super().__init__(tools, name=name, tags=tags, handle_tool_errors=False,
                         messages_key=messages_key, wrap_tool_call=self._wrap,
                         awrap_tool_call=self._awrap)
        # ToolNode must hand every exception to the ledger (which classifies it); this
        # node applies the user's handling to what definitely did not run.
        self._user_handle_tool_errors = handle_tool_errors
        self.store = store
        self.policies: dict[str, Tool | str] = dict(policies or {})
        self.reconcilers: dict[str, Reconciler] = dict(reconcilers or {})
        self.max_attempts = max_attempts
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._keywords: dict[str, frozenset[str]] = {}
        for tool_name, tool in self.tools_by_name.items():
            model_sees = _properties(tool.tool_call_schema)
            declared = _properties(tool.get_input_schema())
            visible = sorted(k for k in LEDGER_KEYWORDS if k in model_sees)
            if visible:
                raise InvalidInput(
                    f"tool {tool_name!r} shows {visible} to the model: the ledger fills them "
                    "in; declare them as injected arguments, e.g. "
                    "execution_id: Annotated[str, InjectedToolArg]")
            self._keywords[tool_name] = frozenset(k for k in LEDGER_KEYWORDS if k in declared)
        for rname in self.reconcilers:
            if rname not in self.tools_by_name:
                raise InvalidInput(f"reconcilers names {rname!r}, which is not a tool of this "
                                   "node")

    # -- the thread's session ------------------------------------------------------------

    def session(self, thread_id: str) -> Session:
        """The ledger session of one thread (opened on first use)."""
        sid = f"{thread_id}:{self.name}"
        with self._lock:
            s = self._sessions.get(sid)
            if s is None:
                s = Session.open(self.store, sid, self.policies, max_attempts=self.max_attempts)
                self._sessions[sid] = s
            return s

    def _forget(self, session: Session) -> None:
        """A tool body was interrupted (the process is going away): a later run in this
        process opens the thread anew, as a restart does."""
        with self._lock:
            self._sessions.pop(session.session_id, None)

    # -- the node -------------------------------------------------------------------------

    def _func(self, input: list[AnyMessage] | dict[str, Any] | BaseModel,
              config: RunnableConfig, runtime: Runtime[Any]) -> Any:
        plan = self._plan(input, config)
        if plan is None:
            return super()._func(input, config, runtime)
        if plan.refused is not None:
            return self._refusal(input, plan)
        while True:
            statuses, lost = self._settle(plan)
            if self._ask(plan, statuses, lost, own_first=True):
                continue
            token = _RUN.set(_Run(plan.session, {**statuses, **lost}))
            try:
                out = super()._func(input, config, runtime)
                for call, rt in self._lost_calls(input, config, runtime, lost):
                    try:
                        self._run_one(call, "tool_calls", rt)
                    except GraphBubbleUp:
                        raise
                    except Exception:  # the ledger recorded it; the model never asked
                        continue
            finally:
                _RUN.reset(token)
            statuses, lost = self._settle(plan)
            if not self._ask(plan, statuses, lost, own_first=False):
                return out
            # asked (a call ended halted, a lost call waits for a human): this output is
            # dropped, the node runs again with the answer applied

    async def _afunc(self, input: list[AnyMessage] | dict[str, Any] | BaseModel,
                     config: RunnableConfig, runtime: Runtime[Any]) -> Any:
        plan = self._plan(input, config)
        if plan is None:
            return await super()._afunc(input, config, runtime)
        if plan.refused is not None:
            return self._refusal(input, plan)
        while True:
            statuses, lost = self._settle(plan)
            if self._ask(plan, statuses, lost, own_first=True):
                continue
            token = _RUN.set(_Run(plan.session, {**statuses, **lost}))
            try:
                out = await super()._afunc(input, config, runtime)
                for call, rt in self._lost_calls(input, config, runtime, lost):
                    try:
                        await self._arun_one(call, "tool_calls", rt)
                    except GraphBubbleUp:
                        raise
                    except Exception:  # the ledger recorded it; the model never asked
                        continue
            finally:
                _RUN.reset(token)
            statuses, lost = self._settle(plan)
            if not self._ask(plan, statuses, lost, own_first=False):
                return out

    def _plan(self, input: Any, config: RunnableConfig) -> _Plan | None:
        """The session, what the history shows (``seen``) and the calls of this run; None
        if no call is ours."""
        wanted, _ = self._parse_input(input)
        ours = [c for c in wanted if c["name"] in self.tools_by_name]
        if not ours:
            return None
        thread = (config.get("configurable") or {}).get("thread_id")
        if thread is None:
            raise InvalidInput("LedgerToolNode needs the run's thread_id (its ledger session): "
                               "compile the graph with a checkpointer and invoke it with "
                               "config={'configurable': {'thread_id': ...}}")
        state = self._extract_state(input, config)
        messages = (state if isinstance(state, list) else
                    state.get(self._messages_key, []) if isinstance(state, dict) else
                    getattr(state, self._messages_key, []))
        ids = {c["id"] for c in ours}
        # the LAST message that carries these ids: a provider that re-uses an id names
        # the newest call with it
        for at in range(len(messages) - 1, -1, -1):
            m = messages[at]
            if isinstance(m, AIMessage) and ids & {c["id"] for c in m.tool_calls}:
                break
        else:
            raise InvalidInput(f"tool calls {sorted(map(str, ids))} are in no AIMessage of "
                               "the state's messages; nothing was executed")
        calls = [c for c in m.tool_calls if c["name"] in self.tools_by_name]
        session = self.session(str(thread))
        # what the history shows: the keys on this node's ToolMessages BEFORE the message
        # (docs/protocol.md#placing-a-response); trimming older ones changes nothing
        seen = frozenset(k for msg in messages[:at] if isinstance(msg, ToolMessage)
                         for k in [ledger_key(msg, session.session_id)] if k is not None)
        call_ids = [c["id"] for c in calls]
        refused = None
        if len(set(call_ids)) != len(call_ids) or None in call_ids:
            refused = (f"tool call ids {call_ids} are not unique in one message: the ledger "
                       "cannot tell those calls apart; nothing was executed")
        for c in calls:
            try:
                # the model wrote an argument only the ledger may set (ToolNode would drop
                # it; the ledger refuses the message): nothing is recorded, the model is told
                check_arguments(c["name"], c["args"])
            except InvalidInput as exc:
                refused = str(exc)
        return _Plan(session, seen, [{"id": c["id"] or "", "name": c["name"],
                                      "arguments": c["args"]} for c in calls],
                     [c["id"] or "" for c in ours], refused)

    def _settle(self, plan: _Plan) -> tuple[dict[str, CallStatus], dict[str, CallStatus]]:
        """Record the message (placed by the ledger; again: a re-record, nothing written),
        run the reconcile connectors.

        Returns the status of every call this run executes, by tool call id (a call that
        is the same call as a dispatched call of a lost response has that call's status),
        and the lost calls to recover (dispatched calls of a response the history lost,
        not re-emitted), by :data:`_LOST` + key: only in the run that holds the message's
        first call (with ``Send``, one run per call), so a lost call is recovered once."""
        statuses = plan.session.record(plan.calls, seen=plan.seen)
        out = {c["id"]: self._reconciled(plan.session, st)
               for c, st in zip(plan.calls, statuses, strict=True)}
        lost: dict[str, CallStatus] = {}
        if plan.calls[0]["id"] in plan.mine:
            keys = {st.key for st in out.values()}
            for st in plan.session.recover():
                if st.key not in keys and st.result is None and st.next in _LOST_NEXT:
                    lost[_LOST + st.key] = self._reconciled(plan.session, st)
        return {cid: out[cid] for cid in plan.mine}, lost

    def _ask(self, plan: _Plan, statuses: Mapping[str, CallStatus],
             lost: Mapping[str, CallStatus], *, own_first: bool) -> bool:
        """Interrupt for the approvals and recovery items of this run; apply the answer.

        ``own_first``: ask only if a call of this message must wait (a lost call's human
        never holds the message's calls back). Returns whether anything was asked (then
        the caller settles again)."""
        asks = [s for s in statuses.values() if s.next in _ASK]
        if own_first and not asks:
            return False
        asks += [s for s in lost.values() if s.next in _ASK]
        if not asks:
            return False
        # the core's decision and the attempt, for the human who answers
        decided = {s.key: s for s in plan.session.recover()}
        answer = interrupt({INTERRUPT_KEY: [_request(decided.get(s.key, s)) for s in asks]})
        _apply(plan.session, asks, answer)
        return True

    def _lost_calls(self, input: Any, config: RunnableConfig, runtime: Runtime[Any],
                    lost: Mapping[str, CallStatus]) -> list[tuple[ToolCall, ToolRuntime[Any, Any]]]:
        """The lost calls to run again (an ``idempotent`` retry under its own key, a
        ``retry`` a human chose), as ``ToolNode`` runs a call: with the recorded
        arguments and the state of this run; what they return is not the model's."""
        out = []
        for lid, st in lost.items():
            if st.next not in _RUN_AGAIN:
                continue
            call = ToolCall(name=st.call.name, args=dict(st.call.arguments), id=lid,
                            type="tool_call")
            out.append((call, ToolRuntime(
                state=self._extract_state(input, config), tool_call_id=lid, config=config,
                context=runtime.context, store=runtime.store,
                stream_writer=runtime.stream_writer, tools=list(self.tools_by_name.values()),
                execution_info=runtime.execution_info, server_info=runtime.server_info)))
        return out

    def _refusal(self, input: Any, plan: _Plan) -> Any:
        return self._combine_tool_outputs(
            [ToolMessage(content=plan.refused or "", tool_call_id=cid, status="error")
             for cid in plan.mine], self._parse_input(input)[1])

    # -- one call -----------------------------------------------------------------------------

    def _wrap(self, request: ToolCallRequest,
              execute: Callable[[ToolCallRequest], ToolMessage | Command[Any]]
              ) -> ToolMessage | Command[Any]:
        run, status = self._call_of(request)
        if run is None or status is None:
            return execute(request)
        fresh: list[Any] = []
        while True:
            if status.next in _RUN_AGAIN:
                with self._dispatching(run.session, request, status) as (a, done):
                    try:
                        value = execute(request)
                    except Exception as exc:
                        fresh.append(exc)
                        _reraise(exc)
                    fresh.append(value)
                    done(value)
                status = a.result()
            elif status.next is Next.RECONCILE:
                status = self._reconciled(run.session, status)
            else:
                return self._message(run.session, request, status, fresh)

    async def _awrap(self, request: ToolCallRequest,
                     execute: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]]
                     ) -> ToolMessage | Command[Any]:
        run, status = self._call_of(request)
        if run is None or status is None:
            return await execute(request)
        fresh: list[Any] = []
        while True:
            if status.next in _RUN_AGAIN:
                with self._dispatching(run.session, request, status) as (a, done):
                    try:
                        value = await execute(request)
                    except Exception as exc:
                        fresh.append(exc)
                        _reraise(exc)
                    fresh.append(value)
                    done(value)
                status = a.result()
            elif status.next is Next.RECONCILE:
                status = self._reconciled(run.session, status)
            else:
                return self._message(run.session, request, status, fresh)

    @staticmethod
    def _call_of(request: ToolCallRequest) -> tuple[_Run | None, CallStatus | None]:
        run = _RUN.get(None)
        if run is None:
            return None, None
        return run, run.statuses.get(request.tool_call["id"] or "")

    def _dispatching(self, session: Session, request: ToolCallRequest,
                     status: CallStatus) -> _Dispatching:
        return _Dispatching(self, session, request, status)

    def _reconciled(self, session: Session, status: CallStatus) -> CallStatus:
        """Ask a ``reconcile`` call's connector until it has a next step (a status that
        is not ``reconcile`` is returned as it is)."""
        while status.next is Next.RECONCILE:
            ask = self.reconcilers.get(status.call.name)
            status = session.reconcile(status.key, ask if ask is not None else _cannot_tell)
        return status

    def _message(self, session: Session, request: ToolCallRequest, status: CallStatus,
                 fresh: list[Any]) -> ToolMessage | Command[Any]:
        """The ToolMessage of a settled call, under the request's tool call id, with the
        call's ledger key on it (:data:`LEDGER_MARK`: the next message's ``seen``)."""
        call = request.tool_call
        if status.next is not Next.RESULT or status.result is None:
            # halted (or waiting): the node interrupts for a human before this output
            # can reach the state
            return ToolMessage(content=f"(toolledger: {status.next.value})",
                               tool_call_id=call["id"] or "", name=call["name"],
                               status="error")
        last = fresh[-1] if fresh else None
        if isinstance(last, Command) and status.outcome is Outcome.APPLIED:
            return last  # the live Command, as ToolNode returns it (not marked)
        if isinstance(last, ToolMessage) and status.outcome is Outcome.APPLIED:
            return _marked(last, session, status.key)  # the live message
        if fresh and status.outcome is Outcome.NOT_APPLIED and isinstance(last, Exception):
            # a definite failure ends as it would without the ledger
            return _marked(self._error_message(last, call), session, status.key)
        ok = status.result.kind is ResultKind.OK
        return _marked(ToolMessage(content=status.result.content,
                                   tool_call_id=call["id"] or "", name=call["name"],
                                   status="success" if ok else "error"), session, status.key)

    def _error_message(self, exc: Exception, call: ToolCall) -> ToolMessage:
        flag = self._user_handle_tool_errors
        handled: tuple[type[Exception], ...]
        if isinstance(flag, type) and issubclass(flag, Exception):
            handled = (flag,)
        elif isinstance(flag, tuple):
            handled = flag
        elif callable(flag) and not isinstance(flag, type):
            handled = _infer_handled_types(flag)
        else:
            handled = (Exception,)
        if not flag or not isinstance(exc, handled):
            raise exc
        return ToolMessage(content=_handle_tool_error(exc, flag=flag),
                           tool_call_id=call["id"] or "", name=call["name"], status="error")

    # -- the ledger's arguments ---------------------------------------------------------------

    def _inject_tool_args(self, tool_call: ToolCall, tool_runtime: ToolRuntime[Any, Any],
                          tool: BaseTool | None = None) -> ToolCall:
        injected = super()._inject_tool_args(tool_call, tool_runtime, tool)
        current = _ATTEMPT.get(None)
        wanted = self._keywords.get(tool_call["name"], frozenset())
        if current is None or current[0] != (tool_call["id"] or "") or not wanted:
            return injected
        _, execution_id, idempotency_key = current
        out = copy(injected)
        args = dict(out["args"])
        if "execution_id" in wanted:
            args["execution_id"] = execution_id
        if "idempotency_key" in wanted:
            args["idempotency_key"] = idempotency_key
        out["args"] = args
        return out


class _Dispatching:
    """``with node._dispatching(...) as (attempt, done):`` one attempt of one call:
    ``Session.dispatch`` with the ledger's arguments visible to ``_inject_tool_args``."""

    def __init__(self, node: LedgerToolNode, session: Session, request: ToolCallRequest,
                 status: CallStatus) -> None:
        self._node, self._session = node, session
        self._request, self._status = request, status
        self.status: CallStatus | None = None

    def result(self) -> CallStatus:
        assert self.status is not None  # set when the block ended
        return self.status

    def __enter__(self) -> tuple[_Dispatching, Callable[[Any], None]]:
        self._cm = self._session.dispatch(self._status.key)
        a = self._cm.__enter__()  # dispatched is durable from here
        self._attempt = a
        self._token = _ATTEMPT.set((self._request.tool_call["id"] or "", a.execution_id,
                                    a.idempotency_key))

        def done(value: Any) -> None:
            a.done(_content(value))

        return self, done

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: Any) -> bool:
        _ATTEMPT.reset(self._token)
        bubble = ev if isinstance(ev, _Bubble) else None
        try:
            swallowed = bool(self._cm.__exit__(et, ev, tb))
        except BaseException:
            if et is not None and not issubclass(et, Exception):
                self._node._forget(self._session)
            raise
        self.status = self._attempt.status
        if bubble is not None:  # an interrupt from inside the tool: recorded, then re-raised
            raise bubble.cause
        return swallowed


class _Bubble(Exception):
    """A ``GraphBubbleUp`` from inside a tool body: the ledger records the attempt's
    outcome as unknown, then the interrupt propagates."""

    def __init__(self, cause: GraphBubbleUp) -> None:
        super().__init__(f"the tool raised {type(cause).__name__} (an interrupt) mid-call")
        self.cause = cause


def _reraise(exc: Exception) -> NoReturn:
    """Raise what the ledger should see of a tool's exception (inside ``dispatch``)."""
    if isinstance(exc, ToolInvocationError):
        # the model's arguments failed validation: the tool body never ran
        raise NotApplied(exc.message) from exc
    if isinstance(exc, GraphBubbleUp):
        raise _Bubble(exc) from exc
    raise exc


def _content(value: Any) -> Any:
    """The text the ledger records for what ``ToolNode`` returned."""
    if isinstance(value, ToolMessage):
        return value.content if isinstance(value.content, str) else json.dumps(
            value.content, default=str)
    return repr(value)  # a Command: its text only (see the module's "Not covered")


def _properties(schema: Any) -> set[str]:
    """The argument names of a tool schema (a pydantic model, or a JSON schema dict)."""
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        schema = schema.model_json_schema()
    props = schema.get("properties", {}) if isinstance(schema, Mapping) else {}
    return set(props)


def _cannot_tell(call: Any, attempt: int) -> ReconcileAnswer:
    return CannotTell("no reconcile connector for this tool: a human decides")


def _request(s: CallStatus) -> dict[str, Any]:
    """One item of the ledger's interrupt: what a human answers, keyed by execution."""
    approval = s.next is Next.AWAIT_APPROVAL
    return {
        "key": s.key,
        "kind": "approval" if approval else "recovery_required",
        "tool_call_id": s.call.tool_call_id,
        "name": s.call.name,
        "args": dict(s.call.arguments),
        "allowed": list(APPROVAL_DECISIONS if approval else RESOLUTIONS),
        "attempt": s.attempt,
        "decision": None if s.decision is None else s.decision.value,
        "error": s.error,
    }


def _apply(session: Session, asks: Sequence[CallStatus], answer: object) -> None:
    """Apply a human's answer: ``{key: decision}``, a decision a string or
    ``{"type": decision, "result": ..., "note": ..., "by": who}`` (``by`` goes to
    the audit row of the answer); a decision for another key (an old execution's,
    a stale resume) or one that is not allowed is ignored: that call asks again,
    nothing runs on it."""
    if not isinstance(answer, Mapping):
        return
    for s in asks:
        raw = answer.get(s.key)
        decision, result, note, by = _decision(raw)
        if decision is None:
            continue
        if s.next is Next.AWAIT_APPROVAL and decision in APPROVAL_DECISIONS:
            if decision == "approve":
                session.approve(s.key, by=by, note=note)
            else:
                session.reject(s.key, by=by, note=note)
        elif s.next is Next.HALTED and decision in RESOLUTIONS:
            session.resolve(s.key, decision, result=result, note=note, by=by)


def _decision(raw: object) -> tuple[str | None, str | None, str, str | None]:
    if isinstance(raw, str):
        return raw, None, "", None
    if isinstance(raw, Mapping) and isinstance(raw.get("type"), str):
        result, note, by = raw.get("result"), raw.get("note", ""), raw.get("by")
        return (str(raw["type"]), None if result is None else str(result),
                note if isinstance(note, str) else str(note),
                None if by is None else str(by))
    return None, None, "", None


def open_saver(path: str | Path) -> SqliteSaver:
    """A ``SqliteSaver`` on ``path`` for a long-lived process (one connection, shared
    with the graph's worker threads), its tables created."""
    saver = SqliteSaver(sqlite3.connect(str(path), check_same_thread=False))
    saver.setup()
    return saver
