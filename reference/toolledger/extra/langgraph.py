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

Execution ids come from the graph's durable identities: the ``thread_id`` (with
the node's name: the ledger session), the position of the ``AIMessage`` in the
state's messages (the ``add_messages`` list the checkpointer persists), the
call's index in it, and the provider's tool call id.

Where the ledger lives: a :class:`~toolledger.SqliteStore` beside the graph's
``SqliteSaver`` (:func:`store_beside`: ``checkpoints.sqlite`` gets
``checkpoints.toolledger.sqlite3`` in the same directory). It must be as durable as
the checkpointer, and it is a separate file: a toolledger store is never a file of
another application.

Not covered: a protected tool that returns a ``Command`` (its text is recorded,
its state update is not reconstructed after a crash); a protected tool that calls
``interrupt()`` itself (its attempt ends with an unknown outcome: use the ledger's
approvals); message lists trimmed (``RemoveMessage``) before a call that is still
unanswered (positions would shift: the ledger refuses a position that names
another message, never confuses them).
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
    "LedgerToolNode",
    "Reconciler",
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

_ASK: Final = (Next.AWAIT_APPROVAL, Next.HALTED)
_RUN_AGAIN: Final = (Next.EXECUTE, Next.RETRY)


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
    seq: int
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
            statuses = self._settle(plan)
            if self._ask(plan, statuses):
                continue
            token = _RUN.set(_Run(plan.session, statuses))
            try:
                out = super()._func(input, config, runtime)
            finally:
                _RUN.reset(token)
            if not any(s.next in _ASK for s in self._settle(plan).values()):
                return out
            # a call ended halted: the human's interrupt comes next, this output is dropped

    async def _afunc(self, input: list[AnyMessage] | dict[str, Any] | BaseModel,
                     config: RunnableConfig, runtime: Runtime[Any]) -> Any:
        plan = self._plan(input, config)
        if plan is None:
            return await super()._afunc(input, config, runtime)
        if plan.refused is not None:
            return self._refusal(input, plan)
        while True:
            statuses = self._settle(plan)
            if self._ask(plan, statuses):
                continue
            token = _RUN.set(_Run(plan.session, statuses))
            try:
                out = await super()._afunc(input, config, runtime)
            finally:
                _RUN.reset(token)
            if not any(s.next in _ASK for s in self._settle(plan).values()):
                return out

    def _plan(self, input: Any, config: RunnableConfig) -> _Plan | None:
        """The session, message position and calls of this run; None if none is ours."""
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
        for seq in range(len(messages) - 1, -1, -1):
            m = messages[seq]
            if isinstance(m, AIMessage) and ids & {c["id"] for c in m.tool_calls}:
                break
        else:
            raise InvalidInput(f"tool calls {sorted(map(str, ids))} are in no AIMessage of "
                               "the state's messages; nothing was executed")
        calls = [c for c in m.tool_calls if c["name"] in self.tools_by_name]
        session = self.session(str(thread))
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
        return _Plan(session, seq, [{"id": c["id"] or "", "name": c["name"],
                                     "arguments": c["args"]} for c in calls],
                     [c["id"] or "" for c in ours], refused)

    def _settle(self, plan: _Plan) -> dict[str, CallStatus]:
        """Record the message (again: idempotent), run the reconcile connectors; the
        status of every call this run executes, by tool call id."""
        statuses = plan.session.record(plan.seq, plan.calls)
        out = {}
        for status in statuses:
            while status.next is Next.RECONCILE:
                ask = self.reconcilers.get(status.call.name)
                status = plan.session.reconcile(
                    status.key, ask if ask is not None else _cannot_tell)
            out[status.call.tool_call_id] = status
        return {cid: out[cid] for cid in plan.mine}

    def _ask(self, plan: _Plan, statuses: Mapping[str, CallStatus]) -> bool:
        """Interrupt for the approvals and recovery items of this run; apply the answer.

        Returns whether anything was asked (then the caller settles again)."""
        asks = [s for s in statuses.values() if s.next in _ASK]
        if not asks:
            return False
        # the core's decision and the attempt, for the human who answers
        decided = {s.key: s for s in plan.session.recover()}
        answer = interrupt({INTERRUPT_KEY: [_request(decided.get(s.key, s)) for s in asks]})
        _apply(plan.session, asks, answer)
        return True

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
                return self._message(request, status, fresh)

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
                return self._message(request, status, fresh)

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
        ask = self.reconcilers.get(status.call.name)
        return session.reconcile(status.key, ask if ask is not None else _cannot_tell)

    def _message(self, request: ToolCallRequest, status: CallStatus,
                 fresh: list[Any]) -> ToolMessage | Command[Any]:
        call = request.tool_call
        if status.next is not Next.RESULT or status.result is None:
            # halted (or waiting): the node interrupts for a human before this output
            # can reach the state
            return ToolMessage(content=f"(toolledger: {status.next.value})",
                               tool_call_id=call["id"] or "", name=call["name"],
                               status="error")
        last = fresh[-1] if fresh else None
        if isinstance(last, (ToolMessage, Command)) and status.outcome is Outcome.APPLIED:
            return last  # the live message, as ToolNode returns it
        if fresh and status.outcome is Outcome.NOT_APPLIED and isinstance(last, Exception):
            # a definite failure ends as it would without the ledger
            return self._error_message(last, call)
        ok = status.result.kind is ResultKind.OK
        return ToolMessage(content=status.result.content, tool_call_id=call["id"] or "",
                           name=call["name"], status="success" if ok else "error")

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
    """Apply a human's answer: ``{key: decision}``; a decision for another key (an old
    execution's, a stale resume) or one that is not allowed is ignored: that call asks
    again, nothing runs on it."""
    if not isinstance(answer, Mapping):
        return
    for s in asks:
        raw = answer.get(s.key)
        decision, result, note = _decision(raw)
        if decision is None:
            continue
        if s.next is Next.AWAIT_APPROVAL and decision in APPROVAL_DECISIONS:
            if decision == "approve":
                session.approve(s.key)
            else:
                session.reject(s.key)
        elif s.next is Next.HALTED and decision in RESOLUTIONS:
            session.resolve(s.key, decision, result=result, note=note)


def _decision(raw: object) -> tuple[str | None, str | None, str]:
    if isinstance(raw, str):
        return raw, None, ""
    if isinstance(raw, Mapping) and isinstance(raw.get("type"), str):
        result = raw.get("result")
        note = raw.get("note", "")
        return (str(raw["type"]), None if result is None else str(result),
                note if isinstance(note, str) else str(note))
    return None, None, ""


def open_saver(path: str | Path) -> SqliteSaver:
    """A ``SqliteSaver`` on ``path`` for a long-lived process (one connection, shared
    with the graph's worker threads), its tables created."""
    saver = SqliteSaver(sqlite3.connect(str(path), check_same_thread=False))
    saver.setup()
    return saver
