"""Crash-safe MCP tool calls: every ``tools/call`` of a client session goes through the ledger.

``await LedgerClientSession.open(client, store, session_id, tools)`` wraps an
initialized :class:`mcp.ClientSession` (the official ``mcp`` package, 2.x); the
agent loop then hands it each model response's calls instead of calling
``client.call_tool`` itself (docs/protocol.md for what the ledger guarantees):

- :meth:`LedgerClientSession.call_tools` records the response's calls
  (``Session.record(calls, seen=keys)``: durable, approvals parked) before any
  of them runs, then sends each call that needs no human as one
  ``tools/call``, ``dispatched`` durable before the request leaves and the
  result recorded after it (two transactions per protected call, on an
  :class:`~toolledger.AsyncSession`: no store I/O on the event loop);
- the execution id reaches the server in the request's ``_meta`` as
  ``"io.toolledger/idempotency-key"`` (with ``"io.toolledger/attempt"``): the
  same on every attempt of one call, so an idempotent server deduplicates a
  retry; the model can never write it (the core refuses arguments named like it);
- a restarted agent re-runs the same response (same calls, same ``seen``):
  a call with a recorded result returns it without a request; an unknown
  outcome is decided by the tool's policy (``manual``: halted for a human,
  :meth:`resolve`; ``idempotent``: sent again under the same key).

Policies.  The engine's ``tools`` declaration wins, as it is, for every tool
it names: annotations never replace or weaken it.  A tool the engine did not
name gets its default from the server's ``tools/list`` annotations, which the
MCP spec calls untrusted hints, so a missing hint is read as the worst case
(MCP's own defaults: not read-only, destructive, not idempotent): ``manual``,
approval required.  ``idempotentHint=True`` gives ``idempotent`` (approval
still required): the one thing the hint claims is that a repeat has no
additional effect, which is exactly what a retry under the same key needs.
``readOnlyHint=True`` (and no ``destructiveHint=True`` contradicting it) gives
``readonly`` (no approval, no ledger transaction) only with
``trust_read_only=True``; by default it gives ``idempotent`` with approval,
because a server that lies about read-only would otherwise send an effect
nobody approved and replay it after a crash.  ``destructiveHint`` can only
make things stricter (it never lowers anything).

Results.  Each call comes back as an :class:`McpCall`: its ledger status and,
when it has one, its ``CallToolResult`` (the server's, recorded as JSON; a
denial, an abandon or a definite failure as an ``isError`` text result), so
the model sees the same result after a restart.  Put ``McpCall.key`` with the
tool result in the conversation you persist: the keys before a response are
its ``seen`` (docs/protocol.md#placing-a-response), which tells a re-run of a
response from a new one that reuses the provider's call ids.

Outcomes.  A ``CallToolResult`` is an answer (``isError`` included: the
server ran the tool and reported its error to the model).  A JSON-RPC error
saying the request itself was refused (parse error, invalid request, method
not found, invalid params) is definitely not applied.  Anything else (a
timeout, a lost connection, a client-side output-schema failure after the
server answered, an ``InputRequiredResult``) is an unknown outcome.

MCP tasks: the reconcile source.  Where the server's capabilities offer
task-augmented ``tools/call`` (MCP 2025-11-25: ``tasks.requests.tools.call``)
and a tool's ``execution.taskSupport`` is ``optional`` or ``required``, the
call is sent as a task (``params.task``): the server answers a
``CreateTaskResult`` at once, the drop-in records the task id against the
execution and attempt in a :class:`TaskBook` (durable: :class:`SqliteTaskBook`
beside a SQLite ledger, ``task_book=`` for another store), then waits for
``tasks/result``.  Such a tool the engine did not declare defaults to
``reconcile`` (approval required; a trusted read-only one stays ``readonly``),
and a ``reconcile`` call whose outcome is unknown (a crash after
``dispatched``, a time-out) is answered by the task of its attempt
(docs/frameworks.md#mcp-tasks-the-reconcile-source):

- ``completed``: applied, ``tasks/result``'s ``CallToolResult`` is the result;
- ``failed``: ``tasks/result`` returns what the ``tools/call`` would have: a
  ``CallToolResult`` (``isError``: the tool ran and answered) is applied as
  that answer, a JSON-RPC refusal of the request itself (parse error, invalid
  request, method not found, invalid params, checked against a second
  ``tasks/get`` so a deleted task's ``-32602`` is not taken for it) is
  definitely not applied, and fenced (a terminal task never runs again): a
  retry; any other error cannot be told;
- ``working`` / ``input_required``: still unknown: nothing is written or sent,
  the call stays at ``next == "reconcile"`` (:attr:`McpCall.task_status` says
  why) and the next :meth:`LedgerClientSession.call_tools` asks again;
- ``cancelled``, a task the server no longer knows (it may delete any task
  after its ttl, finished ones too), no task id recorded (the client stopped
  before the ``CreateTaskResult`` was durable) or a failing query: nobody can
  tell, halted for a human.

A server without tasks, or a tool without task support, keeps the plain
``tools/call`` and the policies above.  mcp 2.3.0 validates a 2025-11-25
``tools/call`` result as ``CallToolResult`` only (its per-version table leaves
tasks out), so the task-augmented request goes through the client session's
JSON-RPC dispatcher; ``tasks/get`` and ``tasks/result`` use its public
``send_request``.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, Protocol, cast

from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CallToolRequest,
    CallToolRequestParams,
    CallToolResult,
    CreateTaskResult,
    GetTaskPayloadRequest,
    GetTaskPayloadRequestParams,
    GetTaskRequest,
    GetTaskRequestParams,
    GetTaskResult,
    PaginatedRequestParams,
    RequestParamsMeta,
    ServerCapabilities,
    TaskMetadata,
    TextContent,
    ToolAnnotations,
)
from mcp_types import Tool as McpTool
from mcp_types.jsonrpc import INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR
from pydantic import ValidationError

from .._core.async_session import AsyncSession
from .._core.calls import CallRef
from .._core.protocol import ResultKind
from .._core.session import Attempt, CallStatus, Next, NotApplied, Tool
from .._core.sqlite_store import SqliteStore
from .._core.stores import MemoryStore, Store
from .._core.tools import CannotTell, NotAppliedFenced, ReconcileAnswer, WasApplied

__all__ = ["ATTEMPT_META", "IDEMPOTENCY_META", "LedgerClientSession", "McpCall",
           "MemoryTaskBook", "SqliteTaskBook", "TaskBook", "policies_from_listing",
           "policy_from_annotations", "task_answer", "task_tools"]

IDEMPOTENCY_META: Final = "io.toolledger/idempotency-key"
"""The ``_meta`` key of a ``tools/call`` that carries the execution id."""

ATTEMPT_META: Final = "io.toolledger/attempt"
"""The ``_meta`` key of a ``tools/call`` that carries the attempt number (from 1)."""

_REFUSED: Final = frozenset({PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS})


def policy_from_annotations(annotations: ToolAnnotations | None, *,
                            trust_read_only: bool = False) -> Tool:
    """The default :class:`~toolledger.Tool` of an MCP tool the engine did not declare.

    A missing hint is the worst case (manual, approval required); see the
    module documentation for why each hint gives what it gives."""
    if annotations is None:
        return Tool("manual")
    if annotations.read_only_hint is True and annotations.destructive_hint is not True:
        return Tool("readonly") if trust_read_only else Tool("idempotent")
    if annotations.idempotent_hint is True:
        return Tool("idempotent")
    return Tool("manual")


def policies_from_listing(listed: Iterable[McpTool], declared: Mapping[str, Tool | str],
                          *, trust_read_only: bool = False,
                          task_tools: Iterable[str] = ()) -> dict[str, Tool | str]:
    """The engine's declarations, plus an annotation default for every listed tool it
    did not declare (a declared tool keeps its declaration: never weakened).  A
    tool in ``task_tools`` (:func:`task_tools`) defaults to ``reconcile``, approval
    required: its task is the reconcile source (a trusted read-only one stays
    ``readonly``)."""
    tasked = set(task_tools)
    out: dict[str, Tool | str] = {}
    for t in listed:
        tool = policy_from_annotations(t.annotations, trust_read_only=trust_read_only)
        if t.name in tasked and str(tool.policy) != "readonly":
            tool = Tool("reconcile")
        out[t.name] = tool
    out.update(declared)
    return out


def task_tools(capabilities: ServerCapabilities | None, listed: Iterable[McpTool]) -> set[str]:
    """The listed tools whose calls go as tasks: the server offers task-augmented
    ``tools/call`` and the tool's ``execution.taskSupport`` is ``optional`` or
    ``required`` (absent means ``forbidden``: MCP 2025-11-25, tool-level negotiation)."""
    tasks = capabilities.tasks if capabilities is not None else None
    requests = tasks.requests if tasks is not None else None
    tools = requests.tools if requests is not None else None
    if tools is None or tools.call is None:
        return set()
    return {t.name for t in listed if t.execution is not None
            and t.execution.task_support in ("optional", "required")}


class TaskBook(Protocol):
    """Where the drop-in keeps the task id the server gave one attempt of an execution.

    ``bind`` is durable before it returns (a restarted client reads it back with
    ``task_of``); both are called off the event loop."""

    def bind(self, execution_id: str, attempt: int, task_id: str) -> None: ...

    def task_of(self, execution_id: str, attempt: int) -> str | None: ...


class MemoryTaskBook:
    """A :class:`TaskBook` in memory: for a :class:`~toolledger.MemoryStore` (tests)."""

    def __init__(self) -> None:
        self._tasks: dict[tuple[str, int], str] = {}

    def bind(self, execution_id: str, attempt: int, task_id: str) -> None:
        self._tasks[(execution_id, attempt)] = task_id

    def task_of(self, execution_id: str, attempt: int) -> str | None:
        return self._tasks.get((execution_id, attempt))


class SqliteTaskBook:
    """A :class:`TaskBook` in a SQLite file of its own (``synchronous=FULL``: a bound
    task id survives a crash), by default beside the ledger's (``<ledger>-mcp-tasks``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with self._connect() as db:
            db.execute("CREATE TABLE IF NOT EXISTS tasks (execution_id TEXT NOT NULL, "
                       "attempt INTEGER NOT NULL, task_id TEXT NOT NULL, "
                       "PRIMARY KEY (execution_id, attempt))")

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30.0)
        db.execute("PRAGMA synchronous=FULL")
        return db

    def bind(self, execution_id: str, attempt: int, task_id: str) -> None:
        db = self._connect()
        try:
            with db:
                db.execute("INSERT OR REPLACE INTO tasks VALUES (?, ?, ?)",
                           (execution_id, attempt, task_id))
        finally:
            db.close()

    def task_of(self, execution_id: str, attempt: int) -> str | None:
        db = self._connect()
        try:
            row = db.execute("SELECT task_id FROM tasks WHERE execution_id = ? AND attempt = ?",
                             (execution_id, attempt)).fetchone()
        finally:
            db.close()
        return None if row is None else str(row[0])


def _default_book(store: Store) -> TaskBook | None:
    if isinstance(store, SqliteStore):
        return SqliteTaskBook(store.path.with_name(store.path.name + "-mcp-tasks"))
    if isinstance(store, MemoryStore):
        return MemoryTaskBook()
    return None


TaskAnswer = Literal["pending", "payload", "cannot_tell", "not_applied"]
"""What a task's status lets the reconcile do: ``pending`` (still unknown: write
and send nothing), ``payload`` (terminal: ``tasks/result`` decides),
``cannot_tell`` (a human decides), ``not_applied`` (definitely not applied and
fenced; no status means that on its own: only a refused request does)."""


def task_answer(status: str) -> TaskAnswer:
    """The reconcile's reading of a task status (MCP 2025-11-25, Task Status Lifecycle).

    ``working``/``input_required`` may still apply the call; ``completed`` and
    ``failed`` are terminal and ``tasks/result`` returns what the ``tools/call``
    would have; ``cancelled`` may have run on after the cancel (the spec keeps
    the status even if execution continues), so nobody can tell."""
    if status in ("working", "input_required"):
        return "pending"
    if status in ("completed", "failed"):
        return "payload"
    return "cannot_tell"


@dataclass(frozen=True)
class McpCall:
    """One call of a response, as :meth:`LedgerClientSession.call_tools` leaves it.

    ``status.next`` says what is next (``result``, ``await_approval``, ``halted``,
    ``reconcile``); ``result`` is the tool result for the model when there is
    one (``None`` otherwise)."""

    status: CallStatus
    result: CallToolResult | None
    task_status: str | None = None
    """The status ``tasks/get`` gave last, when the reconcile asked a task (``working``:
    why the call is still at ``reconcile``)."""
    task_note: str | None = None
    """Why the task could not tell (a halted call's reason, for the human), if so."""

    @property
    def key(self) -> str:
        """The execution id: the ``seen`` key, the inbox item's key, the ``_meta`` key."""
        return self.status.key


class LedgerClientSession:
    """The ledger in front of one MCP client session; see the module documentation.

    Build it with :meth:`open`.  ``ledger`` is the :class:`~toolledger.AsyncSession`
    underneath (``approve``, ``reject``, ``recover``, ``halted``, ``resolve``,
    ``reconcile``); ``policies`` what each tool was declared or defaulted to;
    ``task_tools`` the tools whose calls go as MCP tasks, their ids kept in
    ``task_book`` (``None``: not kept, so a reconcile of such a call cannot tell)."""

    def __init__(self, client: ClientSession, ledger: AsyncSession,
                 policies: Mapping[str, Tool | str], *,
                 read_timeout_seconds: float | None = None,
                 task_tools: Iterable[str] = (), task_book: TaskBook | None = None,
                 task_ttl_ms: int | None = None) -> None:
        self.client = client
        self.ledger = ledger
        self.policies = dict(policies)
        self.read_timeout_seconds = read_timeout_seconds
        self.task_tools = frozenset(task_tools)
        self.task_book = task_book
        self.task_ttl_ms = task_ttl_ms

    @classmethod
    async def open(cls, client: ClientSession, store: Store, session_id: str,
                   tools: Mapping[str, Tool | str] | None = None, *,
                   trust_read_only: bool = False, max_attempts: int = 3,
                   read_timeout_seconds: float | None = None, use_tasks: bool = True,
                   task_book: TaskBook | None = None,
                   task_ttl_ms: int | None = None) -> LedgerClientSession:
        """List the server's tools (every page), merge their annotation defaults under
        the engine's ``tools``, and open the ledger session ``session_id`` on ``store``.

        Tools the server runs as MCP tasks (:func:`task_tools`; ``use_tasks=False``:
        none) are sent as tasks, their ids kept in ``task_book`` (default: a
        :class:`SqliteTaskBook` beside a :class:`~toolledger.SqliteStore`, a
        :class:`MemoryTaskBook` for a :class:`~toolledger.MemoryStore`; pass one
        for another store); ``task_ttl_ms`` is the ttl asked for each task."""
        listed: list[McpTool] = []
        cursor: str | None = None
        while True:
            page = await client.list_tools(
                params=None if cursor is None else PaginatedRequestParams(cursor=cursor))
            listed += page.tools
            cursor = page.next_cursor
            if cursor is None:
                break
        tasked = (task_tools(client.server_capabilities, listed)
                  if use_tasks and _can_send_tasks(client) else set())
        if tasked and task_book is None:
            task_book = await asyncio.to_thread(_default_book, store)
        policies = policies_from_listing(listed, tools or {}, trust_read_only=trust_read_only,
                                         task_tools=tasked)
        ledger = await AsyncSession.open(store, session_id, policies, max_attempts=max_attempts)
        return cls(client, ledger, policies, read_timeout_seconds=read_timeout_seconds,
                   task_tools=tasked, task_book=task_book, task_ttl_ms=task_ttl_ms)

    async def call_tools(self, calls: Sequence[Mapping[str, Any]], *,
                         seen: Iterable[str]) -> list[McpCall]:
        """Record one model response's calls (``{"id", "name", "arguments"}`` dicts) and
        send every call that needs no human, in the response's order.

        ``seen``: the keys (:attr:`McpCall.key`) of the calls whose results the
        conversation holds before this response (``[]`` if none).  Calling it
        again with the same response and ``seen`` (a restart, or after
        :meth:`approve`) writes nothing new and sends only what is still to run."""
        statuses = await self.ledger.record(calls, seen=list(seen))
        out = []
        for st in statuses:
            task_status = note = None
            for _ in range(64):  # bounded; the ledger bounds the attempts anyway
                if st.next in (Next.EXECUTE, Next.RETRY):
                    st = await self.ledger.execute(st.key, self._send)
                elif st.next is Next.RECONCILE and st.call.name in self.task_tools:
                    st, task_status, note = await self._reconciled(st)
                    if st.next is Next.RECONCILE:  # still running: ask again later
                        break
                else:
                    break
            out.append(McpCall(st, _result_of(st), task_status, note))
        return out

    async def call_tool(self, call_id: str, name: str, arguments: Mapping[str, Any], *,
                        seen: Iterable[str]) -> McpCall:
        """:meth:`call_tools` for a response with one call."""
        [one] = await self.call_tools([{"id": call_id, "name": name,
                                        "arguments": dict(arguments)}], seen=seen)
        return one

    async def approve(self, key: str, *, by: str | None = None, note: str = "",
                      expires_at: float | None = None) -> CallStatus:
        """A human allows the call ``key``; then :meth:`call_tools` again sends it.
        ``by``, ``note``, ``expires_at``: as :meth:`toolledger.Session.approve`."""
        return await self.ledger.approve(key, by=by, note=note, expires_at=expires_at)

    async def reject(self, key: str, *, by: str | None = None, note: str = "") -> McpCall:
        """A human denies the call ``key``: its result (for the model) is the denial.
        ``by`` names who (in the audit)."""
        st = await self.ledger.reject(key, by=by, note=note)
        return McpCall(st, _result_of(st))

    async def resolve(self, key: str, resolution: str, *, result: str | None = None,
                      note: str = "", by: str | None = None) -> McpCall:
        """A human's answer to a halted call: ``"applied"`` (``result``: what the
        server did), ``"retry"`` (then :meth:`call_tools` sends it again, same key)
        or ``"abandon"``; ``by`` names who answered (in the audit)."""
        st = await self.ledger.resolve(key, resolution, result=result, note=note, by=by)
        return McpCall(st, _result_of(st))

    async def _send(self, a: Attempt) -> dict[str, Any]:
        """One ``tools/call``: runs after ``dispatched`` is durable; its return is recorded."""
        # RequestParamsMeta takes extra items (PEP 728), which mypy cannot check yet
        meta = cast(RequestParamsMeta, {IDEMPOTENCY_META: a.execution_id,
                                        ATTEMPT_META: a.attempt})
        if a.call.name in self.task_tools:
            return await self._send_as_task(a, meta)
        try:
            res = await self.client.call_tool(a.call.name, dict(a.arguments),
                                              self.read_timeout_seconds, meta=meta)
        except MCPError as exc:
            if exc.code in _REFUSED:  # JSON-RPC: the request itself was refused
                raise NotApplied(f"the server refused the request ({exc.code}): "
                                 f"{exc.message}") from exc
            raise  # anything else: an unknown outcome, for the tool's policy
        dumped: dict[str, Any] = res.model_dump(mode="json", by_alias=True, exclude_none=True)
        return dumped

    # -- MCP tasks ------------------------------------------------------------------

    async def _send_as_task(self, a: Attempt, meta: RequestParamsMeta) -> dict[str, Any]:
        """A task-augmented ``tools/call``: the task id is bound to this attempt (durable)
        before ``tasks/result`` is awaited, so a restarted client can ask the task."""
        request = CallToolRequest(params=CallToolRequestParams(
            name=a.call.name, arguments=dict(a.arguments), _meta=meta,
            task=TaskMetadata(ttl=self.task_ttl_ms)))
        data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
        try:
            raw = await self._raw_request(data)
        except MCPError as exc:
            if exc.code in _REFUSED:  # refused before any task was created
                raise NotApplied(f"the server refused the request ({exc.code}): "
                                 f"{exc.message}") from exc
            raise
        if "task" not in raw:  # the server ran it as a plain call after all
            return _dumped(CallToolResult.model_validate(raw))
        task_id = CreateTaskResult.model_validate(raw).task.task_id
        if self.task_book is not None:
            await asyncio.to_thread(self.task_book.bind, a.execution_id, a.attempt, task_id)
        answer = await self._payload(task_id)
        if isinstance(answer, WasApplied):
            return cast(dict[str, Any], json.loads(answer.result))
        if isinstance(answer, NotAppliedFenced):
            raise NotApplied(f"task {task_id} failed: the server refused the request")
        raise _TaskUnknown(f"task {task_id}: {answer.reason}")

    async def _raw_request(self, data: dict[str, Any]) -> dict[str, Any]:
        """Send a request past the client's per-version result check (mcp 2.3.0 admits
        only ``CallToolResult`` for a 2025-11-25 ``tools/call``; a task's answer is a
        ``CreateTaskResult``), stamped and timed out as ``send_request`` does."""
        session: Any = self.client
        if not _can_send_tasks(session):
            raise NotApplied("this mcp client session has no JSON-RPC dispatcher to send a "
                             "task-augmented tools/call with; nothing was sent")
        opts: dict[str, Any] = {}
        session._stamp(data, opts)
        if self.read_timeout_seconds is not None:
            opts["timeout"] = self.read_timeout_seconds
        raw = await session._dispatcher.send_raw_request(data["method"], data.get("params"),
                                                         opts)
        return cast(dict[str, Any], raw)

    async def _get_task(self, task_id: str) -> GetTaskResult:
        return await self.client.send_request(
            GetTaskRequest(params=GetTaskRequestParams(task_id=task_id)), GetTaskResult,
            request_read_timeout_seconds=self.read_timeout_seconds)

    async def _payload(self, task_id: str) -> ReconcileAnswer:
        """``tasks/result`` (it waits until the task is terminal) as a reconcile answer:
        a ``CallToolResult`` (``isError`` included) was applied; a refusal of the
        request itself, on a task ``tasks/get`` still shows ``failed``, was not."""
        try:
            res = await self.client.send_request(
                GetTaskPayloadRequest(params=GetTaskPayloadRequestParams(task_id=task_id)),
                CallToolResult, request_read_timeout_seconds=self.read_timeout_seconds)
        except MCPError as exc:
            if exc.code in _REFUSED:
                try:  # -32602 is also "no such task": it counts only if the task is still there
                    again = await self._get_task(task_id)
                except MCPError as gone:
                    return CannotTell(f"tasks/result refused ({exc.code}) and the task is gone "
                                      f"({gone.code}): {gone.message}")
                if again.status == "failed":
                    return NotAppliedFenced()
            return CannotTell(f"tasks/result failed ({exc.code}): {exc.message}")
        return WasApplied(json.dumps(_dumped(res), ensure_ascii=False))

    async def _reconciled(self, st: CallStatus) -> tuple[CallStatus, str | None, str | None]:
        """Answer a ``reconcile`` call from the task of its attempt: (status, the task's
        status, why it could not tell).  Still pending (``working``,
        ``input_required``): nothing is written or sent, the status is returned as
        it is; else the answer goes through :meth:`AsyncSession.reconcile`."""
        attempt = st.attempt
        status: str | None = None
        answer: ReconcileAnswer
        task_id = (None if self.task_book is None else
                   await asyncio.to_thread(self.task_book.task_of, st.key, attempt))
        if task_id is None:
            answer = CannotTell(f"no task id was recorded for attempt {attempt} (the client "
                                "stopped before the server's CreateTaskResult was durable)")
        else:
            try:
                got = await self._get_task(task_id)
            except Exception as exc:  # as the core reads a raising connector: cannot tell
                code = getattr(exc, "code", type(exc).__name__)
                answer = CannotTell(f"tasks/get {task_id} failed ({code}): {exc} (a server "
                                    "may delete any task after its ttl, finished ones too)")
            else:
                status = got.status
                kind = task_answer(got.status)
                if kind == "pending":
                    return st, status, None
                if kind == "payload":
                    answer = await self._payload(task_id)
                elif kind == "not_applied":
                    answer = NotAppliedFenced()
                else:
                    answer = CannotTell(f"task {task_id} is {got.status}: it may have run on")

        def ask(call: CallRef, now: int) -> ReconcileAnswer:
            if now != attempt:
                return CannotTell(f"the task answered for attempt {attempt}, the call is at {now}")
            return answer

        note = answer.reason if isinstance(answer, CannotTell) else None
        return await self.ledger.reconcile(st.key, ask), status, note


def _can_send_tasks(client: object) -> bool:
    """Whether the client session has what :meth:`LedgerClientSession._raw_request` uses."""
    dispatcher = getattr(client, "_dispatcher", None)
    return (callable(getattr(dispatcher, "send_raw_request", None))
            and callable(getattr(client, "_stamp", None)))


class _TaskUnknown(Exception):
    """A task's outcome the live path cannot classify: an unknown outcome."""


def _dumped(res: CallToolResult) -> dict[str, Any]:
    out: dict[str, Any] = res.model_dump(mode="json", by_alias=True, exclude_none=True)
    return out


def _result_of(st: CallStatus) -> CallToolResult | None:
    """The model's tool result of a call with a result: the server's, as recorded,
    or the ledger's own text (a denial, a definite failure, a human's answer)."""
    if st.next is not Next.RESULT or st.result is None:
        return None
    text = st.result.content
    if st.result.kind in (ResultKind.OK, ResultKind.HUMAN):
        try:
            return CallToolResult.model_validate_json(text)
        except (ValidationError, ValueError):
            pass
    error = st.result.kind not in (ResultKind.OK, ResultKind.HUMAN)
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=error)
