"""Crash-safe tool calls for the OpenAI Agents SDK: its ``FunctionTool``s through the ledger.

``LedgerAgents(store, tools).protect(agent, session_id)`` returns a clone of
``agent`` whose ``FunctionTool``s go through the ledger of one conversation
(``session_id``, the ledger session; docs/protocol.md):

- each model response's calls are recorded (durable, approvals parked) before
  any of them runs: the clone's ``AgentHooks.on_llm_end`` records them, with
  ``seen`` read from the input the model was given (``on_llm_start``); the
  agent's own hooks still run;
- ``dispatched`` is durable before the tool body runs (the wrapped
  ``on_invoke_tool``), the outcome is recorded after it;
- ``needs_approval`` asks the ledger per execution: a call whose approval is
  pending in the ledger (or that waits for a human after a crash) interrupts
  the run; a recorded approval is not asked again.  ``RunState.approve(item)``
  is the ledger's ``Session.approve`` of that execution (the tool, run on that
  approval, approves it by its key first); a ``RunState.reject`` leaves the
  ledger's approval pending (``session(id).reject(key)`` records it: the SDK
  answers a reused call id within one run with the earlier output, which the
  ledger cannot tell from a rejection);
- a tool that declares ``execution_id`` / ``idempotency_key`` parameters gets
  the ledger's values there; they are removed from the schema the model sees;
- resume the SDK's way (``RunState.from_string(agent, saved)``, approve,
  ``Runner.run(agent, state)``) with the agent protected again: a call with a
  recorded result returns it without running; an ``idempotent`` one is retried
  with the same key; a ``manual`` one whose outcome is unknown interrupts for
  a human and, run on that boolean approval while still unresolved, raises
  :class:`CallHalted` (nothing runs): answer it with :meth:`LedgerAgents.resolve`,
  then run the same state again;
- the ledger's store I/O never runs on the event loop: every step goes through
  the conversation's :class:`~toolledger.AsyncSession` (:meth:`LedgerAgents.asession`);
  :meth:`LedgerAgents.session` is the same session's synchronous face, for host
  code off the loop (an inbox, an operator's answer).

Identity (docs/protocol.md#placing-a-response): a tool sees the call id and the
turn's input, never a persisted message number, so the ledger places each
response itself (``record(calls, seen=keys)``).  ``seen`` is the ledger keys of
the calls whose outputs the model input holds: each ``function_call_output``
is matched with its ``function_call`` group (one response) and found in the
ledger (``Session.find(call, response=group)``).  A reused ``call_0`` after the
model saw its result is a new execution.  Not covered: a response the model
repeats identically (same ids and arguments) is found as the newest recorded
one, so a kill mid-tool of such a repeat, resumed from a state saved before it,
is placed after it rather than superseding it; a tool body's exception that
the SDK's failure handler turns into an error string is recorded as its result.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Final

from agents import Agent, AgentHooks, FunctionTool, RunContextWrapper
from agents.exceptions import UserError
from agents.items import ModelResponse, TResponseInputItem
from agents.tool_context import ToolContext
from openai.types.responses import ResponseFunctionToolCall

from .._core.async_session import AsyncSession
from .._core.protocol import InvalidInput
from .._core.session import CallStatus, Next, Outcome, Session, Tool
from .._core.stores import Store

__all__ = ["LEDGER_KEYWORDS", "CallHalted", "LedgerAgents"]

LEDGER_KEYWORDS: Final = ("execution_id", "idempotency_key")
"""Tool parameters the ledger fills in; never in the schema the model sees."""

_ASK: Final = (Next.AWAIT_APPROVAL, Next.HALTED, Next.RECONCILE)


class CallHalted(UserError):
    """A call waits for a human's answer (``LedgerAgents.resolve``); nothing was run."""

    def __init__(self, status: CallStatus) -> None:
        self.status = status
        super().__init__(
            f"tool call {status.call.tool_call_id!r} of {status.call.name!r} (ledger key "
            f"{status.key!r}, attempt {status.attempt}) may have had its effect before a crash; "
            f"the ledger waits for a human ({status.next.value}): call "
            "resolve(session_id, key, 'applied' | 'retry' | 'abandon'), then run the same "
            "RunState again. Nothing was run.")


class LedgerAgents:
    """The ledger on ``store`` for agents' ``FunctionTool``s.

    ``tools`` declares the recovery policy (and approval default) per tool name,
    as in :class:`~toolledger.Session`: a tool not named there is ``manual`` and
    requires approval.
    """

    def __init__(self, store: Store, tools: Mapping[str, Tool | str] | None = None, *,
                 max_attempts: int = 3) -> None:
        self.store = store
        self.tools = dict(tools or {})
        self.max_attempts = max_attempts
        self._sessions: dict[str, AsyncSession] = {}
        self._opening = threading.Lock()  # one Session per conversation, whoever opens it

    def _opened(self, session_id: str) -> AsyncSession:
        """The conversation's session, opened (and recovered) on first use; blocks on the
        store then: call it off the loop (:meth:`asession` does)."""
        with self._opening:
            a = self._sessions.get(session_id)
            if a is None:
                s = Session.open(self.store, session_id, self.tools,
                                 max_attempts=self.max_attempts)
                s.recover()  # as a restarted engine does: every interrupted call's decision
                a = self._sessions[session_id] = AsyncSession(s)
            return a

    async def asession(self, session_id: str) -> AsyncSession:
        """The ledger session of one conversation, for the loop (its store I/O runs off it)."""
        a = self._sessions.get(session_id)
        return a if a is not None else await asyncio.to_thread(self._opened, session_id)

    def session(self, session_id: str) -> Session:
        """The same session, synchronous: for host code off the event loop (it blocks)."""
        return self._opened(session_id).session

    def resolve(self, session_id: str, key: str, resolution: str, *,
                result: str | None = None, note: str = "", by: str | None = None
                ) -> CallStatus:
        """A human's answer to a halted call (:class:`CallHalted`'s ``status.key``);
        ``by`` names who answered (in the audit). Synchronous: from the loop, ``await
        (await ledger.asession(session_id)).resolve(...)``."""
        return self.session(session_id).resolve(key, resolution, result=result, note=note,
                                                by=by)

    def _forget(self, session_id: str) -> None:
        """The process is going away: a later run opens the conversation anew."""
        with self._opening:
            self._sessions.pop(session_id, None)

    def protect(self, agent: Agent[Any], session_id: str) -> Agent[Any]:
        """A clone of ``agent`` whose ``FunctionTool``s go through ``session_id``'s ledger."""
        if not session_id:
            raise InvalidInput("protect(agent, session_id): session_id must be a non-empty "
                               "string (the ledger session of this conversation)")
        wrapped = [_Protected(self, session_id, t).tool if isinstance(t, FunctionTool) else t
                   for t in agent.tools]
        names = frozenset(t.name for t in agent.tools if isinstance(t, FunctionTool))
        return agent.clone(tools=wrapped, hooks=_Hooks(self, session_id, names, agent.hooks))


class _Protected:
    """One ``FunctionTool``, its invocations and approvals asked of the ledger."""

    def __init__(self, ledger: LedgerAgents, session_id: str, tool: FunctionTool) -> None:
        self.ledger, self.session_id, self.inner = ledger, session_id, tool
        schema = tool.params_json_schema
        props = schema.get("properties") or {}
        self.keywords = frozenset(k for k in LEDGER_KEYWORDS if k in props)
        if self.keywords:
            schema = dict(schema)
            schema["properties"] = {k: v for k, v in props.items() if k not in self.keywords}
            if "required" in schema:
                schema["required"] = [r for r in schema["required"] if r not in self.keywords]
        self.tool = dataclasses.replace(tool, params_json_schema=schema,
                                        on_invoke_tool=self.invoke,
                                        needs_approval=self.needs_approval)

    async def _status(self, s: AsyncSession, call_id: str, arguments: object) -> CallStatus:
        call = {"id": call_id, "name": self.inner.name, "arguments": arguments}
        status = await s.find(call)
        if status is None:
            raise UserError(f"tool call {call_id!r} of {self.inner.name!r} was never recorded "
                            "by the ledger: run the agent protect() returned (its hooks record "
                            "each model response); nothing was executed")
        return status

    async def needs_approval(self, ctx: RunContextWrapper[Any], params: dict[str, Any],
                             call_id: str) -> bool:
        s = await self.ledger.asession(self.session_id)
        return (await self._status(s, call_id, params)).next in _ASK

    async def invoke(self, ctx: ToolContext[Any], args_json: str) -> Any:
        s = await self.ledger.asession(self.session_id)
        status = await self._status(s, ctx.tool_call_id, args_json)
        if status.next is Next.AWAIT_APPROVAL:
            # the SDK runs a call that needs approval only once RunState.approve was given
            status = await s.approve(status.key)
        fresh: list[Any] = []
        try:
            while status.next in (Next.EXECUTE, Next.RETRY):
                status = await self._run(s, status, ctx, args_json, fresh)
        except Exception:
            raise
        except BaseException:
            self.ledger._forget(self.session_id)  # the process is going away
            raise
        if status.next is Next.RESULT:
            assert status.result is not None
            if fresh and status.outcome is Outcome.APPLIED:
                return fresh[-1]
            return status.result.content
        raise CallHalted(status)

    async def _run(self, s: AsyncSession, status: CallStatus, ctx: ToolContext[Any],
                   args_json: str, fresh: list[Any]) -> CallStatus:
        async with s.dispatch(status.key) as a:  # dispatched is durable from here
            args = json.loads(args_json) if args_json else {}
            if "execution_id" in self.keywords:
                args["execution_id"] = a.execution_id
            if "idempotency_key" in self.keywords:
                args["idempotency_key"] = a.idempotency_key
            value = await self.inner.on_invoke_tool(ctx, json.dumps(args))
            fresh.append(value)
            a.done(value if isinstance(value, str) else str(value))
        done = a.status
        assert isinstance(done, CallStatus)
        return done


class _Hooks(AgentHooks[Any]):
    """Records each model response's calls before any runs (``on_llm_end``)."""

    def __init__(self, ledger: LedgerAgents, session_id: str, names: frozenset[str],
                 inner: AgentHooks[Any] | None) -> None:
        self.ledger, self.session_id, self.names, self.inner = ledger, session_id, names, inner
        self.seen: list[str] = []

    async def on_llm_start(self, context: RunContextWrapper[Any], agent: Agent[Any],
                           system_prompt: str | None,
                           input_items: list[TResponseInputItem]) -> None:
        self.seen = await _seen(await self.ledger.asession(self.session_id), input_items,
                                self.names)
        if self.inner is not None:
            await self.inner.on_llm_start(context, agent, system_prompt, input_items)

    async def on_llm_end(self, context: RunContextWrapper[Any], agent: Agent[Any],
                         response: ModelResponse) -> None:
        calls = [{"id": o.call_id, "name": o.name, "arguments": o.arguments}
                 for o in response.output
                 if isinstance(o, ResponseFunctionToolCall) and o.name in self.names]
        if calls:
            # placed by the ledger (docs/protocol.md#placing-a-response)
            await (await self.ledger.asession(self.session_id)).record(calls, seen=self.seen)
        if self.inner is not None:
            await self.inner.on_llm_end(context, agent, response)

    def __getattr__(self, name: str) -> Any:  # the agent's other hooks, unchanged
        if name.startswith("on_") and self.inner is not None:
            return getattr(self.inner, name)
        raise AttributeError(name)


def _field(item: object, name: str) -> Any:
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


async def _seen(s: AsyncSession, items: Sequence[TResponseInputItem], names: frozenset[str]
                ) -> list[str]:
    """The keys of the ledger calls whose outputs ``items`` hold (``seen`` of ``record``)."""
    groups: list[list[dict[str, Any]]] = []
    prev = None
    for it in items:
        kind = _field(it, "type")
        if kind == "function_call" and _field(it, "name") in names:
            if prev != "function_call":
                groups.append([])
            groups[-1].append({"id": _field(it, "call_id"), "name": _field(it, "name"),
                               "arguments": _field(it, "arguments")})
        if kind != "reasoning":
            prev = kind
    answered = {_field(it, "call_id") for it in items
                if _field(it, "type") == "function_call_output"}
    keys: list[str] = []
    for group in groups:
        for c in group:
            if c["id"] not in answered:
                continue
            try:
                st = await s.find(c, response=group)
            except InvalidInput:  # held twice in one response: no single key
                continue
            if st is None:
                continue
            keys.append(st.key)
    return keys
