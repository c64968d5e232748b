"""Crash-safe tool calls for pydantic-ai agents: a toolset wrapper over ``toolledger.Session``.

``LedgerToolset(toolset, store, tools)`` wraps any pydantic-ai toolset (a
``FunctionToolset``, an agent's ``@agent.tool`` functions collected in one)
so that every call of its tools goes through the ledger of the run's
conversation (``RunContext.conversation_id``, the session id):

- the calls of one model response are recorded (durable, approvals parked)
  before any of them runs;
- ``dispatched`` is durable before the tool body runs, the outcome is
  recorded after it (a protected call costs two transactions);
- a tool that declares a parameter named ``execution_id`` and/or
  ``idempotency_key`` gets the ledger's values there; those parameters are
  removed from the JSON schema the model sees, and a model that writes them
  anyway is refused (the core's reserved-name check) and told to retry;
- a restarted run (the history ends with the response whose calls were
  interrupted, run with no new prompt: pydantic-ai then executes its calls)
  gets the ledger's recovery decision: a call with a recorded result returns
  it without running again; a ``manual`` call whose outcome is unknown is
  deferred for a human (``ApprovalRequired``: in ``DeferredToolRequests.approvals``,
  with ``metadata["toolledger"] == "recovery_required"``), who answers with
  :meth:`LedgerToolset.resolve`, then the run resumes with the call approved;
  an ``idempotent`` call is retried with the same key;
- approvals are pydantic-ai's deferred approvals (``ApprovalRequired``), bound
  to one execution: the request's metadata carries the execution id
  (``metadata["toolledger_key"]``), and an approval counts only when it comes
  back with that metadata (``requests.build_results(approvals=...,
  metadata=requests.metadata)``). A bare ``tool_call_approved`` (a retry that
  re-uses a provider's tool call id, pydantic-ai #5536) asks again.

The ledger names each call, never the position pydantic-ai's message list
gives it (docs/protocol.md#placing-a-response), so a new call is never
confused with an earlier one: every tool return this toolset builds carries
its call's ledger key (``ToolReturn(value, metadata={"toolledger_key": key})``,
so ``ToolReturnPart.metadata``; the denied and retried returns pydantic-ai
builds itself get it in ``get_tools``, before the next model request), and
each model response is recorded with ``Session.record(calls, seen=keys)``,
``seen`` being the keys on the returns before it in ``RunContext.messages``.
Hence:

- a history processor (``ProcessHistory``) that trims or summarises old
  messages changes nothing, as long as the newest returns keep their metadata;
- a provider that re-uses a tool call id (Gemini's ``call_0``), even with the
  same arguments, after the model saw the earlier result gets a new execution,
  never the old one's result or approval;
- a response lost before the app saved it (a kill mid-tool) and re-emitted
  with new ids supersedes the lost one: a call that is the same call (tool and
  arguments) as a lost dispatched call is answered with that call's status
  under its own id (its result, or its recovery: halted, retried with the
  same key), never sent anew; another call runs; the lost dispatched call
  keeps its record for its policy (``halted()``, ``recover()``); the lost
  response's undispatched calls are voided (their approvals leave
  ``pending_approvals()``).

Persist the whole history (``result.all_messages()``) with the parts'
metadata and pass it back.

An approval binds the arguments the ledger recorded (the model's): a
``ToolApproved(override_args=...)`` that changes them is refused with a
:class:`~pydantic_ai.exceptions.UserError` before anything is approved, written
or run (the tool would otherwise run with arguments no approval and no record
was given for).  Deny the call instead (``ToolDenied``, with a message that
says what to send) and let the model emit the call anew: that call is
recorded and asked for with its own arguments.

Not covered yet: a ``reconcile`` tool has no connector here (its call
comes back as a recovery item with ``metadata["next"] == "reconcile"``: answer
it with ``session(conversation_id).reconcile(key, ask)``, then approve); a
lost response's dispatched call that the re-run model does not emit again is
not run by this toolset (an idempotent one's retry is the host's:
``session(conversation_id).execute(key, fn)``).

The ledger's store I/O never runs on the event loop: every step goes through the
conversation's :class:`~toolledger.AsyncSession` (:meth:`LedgerToolset.asession`);
:meth:`LedgerToolset.session` is the same session's synchronous face, for host
code off the loop (an inbox, an operator's answer).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from pydantic_ai import RunContext
from pydantic_ai.exceptions import ApprovalRequired, ModelRetry, UserError
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    ToolCallPart,
    ToolReturn,
    ToolReturnPart,
)
from pydantic_ai.toolsets import WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

from .._core.async_session import AsyncSession
from .._core.protocol import InvalidInput
from .._core.session import CallStatus, Next, NotApplied, Outcome, Session, Tool
from .._core.stores import Store

__all__ = ["APPROVAL_KEY", "LEDGER_KEYWORDS", "RECOVERY", "LedgerToolset"]

LEDGER_KEYWORDS: Final = ("execution_id", "idempotency_key")
"""Tool parameters the ledger fills in; never in the schema the model sees."""

APPROVAL_KEY: Final = "toolledger_key"
"""The metadata key that binds a deferred request (and its answer) to one execution."""

RECOVERY: Final = "toolledger"
"""The metadata key of a deferred call that needs a human (value: ``"recovery_required"``)."""


class _Refused(NotApplied):
    """The tool raised ``ModelRetry``: it refused these arguments, nothing was applied."""


@dataclass
class LedgerToolset(WrapperToolset[Any]):
    """Every call of ``wrapped``'s tools goes through the ledger on ``store``.

    ``tools`` declares the recovery policy (and approval default) per tool name,
    as in :class:`~toolledger.Session`: a tool not named there is ``manual`` and
    requires approval. ``max_attempts`` bounds an ``idempotent`` tool's retries.
    """

    store: Store = field(kw_only=True)
    tools: Mapping[str, Tool | str] = field(default_factory=dict, kw_only=True)
    max_attempts: int = field(default=3, kw_only=True)
    _sessions: dict[str, AsyncSession] = field(default_factory=dict, init=False, repr=False)
    _keywords: dict[str, frozenset[str]] = field(default_factory=dict, init=False, repr=False)
    _opening: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    # -- the conversation's session -------------------------------------------------

    def _opened(self, conversation_id: str) -> AsyncSession:
        """The conversation's session, opened on first use; blocks on the store then:
        call it off the loop (:meth:`asession` does)."""
        with self._opening:
            a = self._sessions.get(conversation_id)
            if a is None:
                a = self._sessions[conversation_id] = AsyncSession(Session.open(
                    self.store, conversation_id, self.tools, max_attempts=self.max_attempts))
            return a

    async def asession(self, conversation_id: str) -> AsyncSession:
        """The ledger session of one conversation, for the loop (its store I/O runs off it)."""
        a = self._sessions.get(conversation_id)
        return a if a is not None else await asyncio.to_thread(self._opened, conversation_id)

    def session(self, conversation_id: str) -> Session:
        """The same session, synchronous: for host code off the event loop (it blocks)."""
        return self._opened(conversation_id).session

    def resolve(self, conversation_id: str, key: str, resolution: str, *,
                result: str | None = None, note: str = "", by: str | None = None
                ) -> CallStatus:
        """A human's answer to a deferred ``recovery_required`` call (``key``: its
        ``metadata["toolledger_key"]``): ``"applied"`` (``result``: what the external
        system answered), ``"retry"`` or ``"abandon"``. Then resume the run with the
        call approved (``requests.build_results(approvals={id: True},
        metadata=requests.metadata)``): the ledger returns the result, or runs
        the retry, once; approved without a resolution, it asks again.  ``by`` names
        who answered (in the audit).  Synchronous: from the loop, ``await (await
        toolset.asession(conversation_id)).resolve(...)``."""
        return self.session(conversation_id).resolve(key, resolution, result=result, note=note,
                                                     by=by)

    # -- what the model sees ---------------------------------------------------------

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        tools = await self.wrapped.get_tools(ctx)
        out = {}
        for name, tool in tools.items():
            schema = tool.tool_def.parameters_json_schema
            props = schema.get("properties") or {}
            declared = frozenset(k for k in LEDGER_KEYWORDS if k in props)
            self._keywords[name] = declared
            if declared:
                # the ledger fills these in; the model must not even see them
                stripped = dict(schema)
                stripped["properties"] = {k: v for k, v in props.items() if k not in declared}
                if "required" in schema:
                    stripped["required"] = [r for r in schema["required"] if r not in declared]
                tool = replace(tool, tool_def=replace(tool.tool_def,
                                                      parameters_json_schema=stripped))
            out[name] = tool
        if ctx.conversation_id and _untagged(ctx.messages, set(out)):
            # before the next model request: the last response's results are final here
            await self._tag(await self.asession(ctx.conversation_id), ctx.messages, set(out))
        return out

    # -- a call ---------------------------------------------------------------------------

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> Any:
        conversation = ctx.conversation_id
        if not conversation:
            raise UserError("LedgerToolset needs the run's conversation_id (the ledger session); "
                            "pass conversation_id=... to agent.run, or a message history that "
                            "carries one")
        session = await self.asession(conversation)
        at, slot, calls = await self._position(ctx, name)
        mine = set(self._keywords)
        await self._tag(session, ctx.messages[:at], mine, response=calls)
        seen = self._seen(ctx.messages[:at], mine)
        try:
            # placed by the ledger (docs/protocol.md#placing-a-response): never by where
            # the framework's list puts the response now, which history processors move
            status = (await session.record(calls, seen=seen))[slot]
        except InvalidInput as exc:
            if "reserved" in str(exc):
                # the model wrote an argument only the ledger may set: nothing was recorded
                raise ModelRetry(str(exc)) from None
            raise
        if _overridden(tool, status.call.arguments, tool_args):
            # ToolApproved(override_args=...): the human approved other arguments than the
            # ones the ledger recorded; approving or running the recorded call on that
            # answer would send arguments nobody approved, so nothing is done
            raise UserError(
                f"tool call {ctx.tool_call_id!r} of {name!r} was approved with override_args, "
                "but toolledger binds an approval to the arguments it recorded (the model's): "
                "nothing was approved, written or run. Approve it without override_args, or "
                "deny it (ToolDenied) and let the model emit the call with the new arguments, "
                "which is recorded and asked for on its own")
        if status.next is Next.AWAIT_APPROVAL:
            meta = ctx.tool_call_metadata if isinstance(ctx.tool_call_metadata, dict) else {}
            if not (ctx.tool_call_approved and meta.get(APPROVAL_KEY) == status.key):
                # no approval, or one given for another execution (a retry that re-uses
                # a tool call id): ask for this execution
                raise ApprovalRequired(metadata={APPROVAL_KEY: status.key})
            status = await session.approve(status.key)
        fresh: list[Any] = []
        try:
            while status.next in (Next.EXECUTE, Next.RETRY):
                status = await self._run(session, status, name, tool_args, ctx, tool, fresh)
        except Exception:
            raise
        except BaseException:
            # the process is going away (the Session refuses to start anything more):
            # a later run in this process opens the conversation anew, as a restart does
            with self._opening:
                self._sessions.pop(conversation, None)
            raise
        if status.next is Next.RESULT:
            assert status.result is not None
            if fresh and status.outcome is Outcome.APPLIED:
                return _carry(fresh[-1], status.key)  # the live value, as the plain toolset

            if fresh and status.outcome is Outcome.NOT_APPLIED and isinstance(
                    fresh[-1], BaseException):
                raise fresh[-1]  # a definite failure ends as it would without the ledger
            # reconstructed from the ledger, never re-run (for a call that is the same call
            # as a dispatched call of a lost response: that call's result, under this id)
            return _carry(status.result.content, status.key)
        # Halted (or a reconcile, which needs a connector this wrapper has not got): a
        # human decides. It is asked as an approval because an approval is the deferred
        # request whose answer makes pydantic-ai call this toolset again: the ledger then
        # returns the resolved result, or runs the resolved retry, and an answer without
        # a resolution asks again, running nothing.
        raise ApprovalRequired(metadata={
            RECOVERY: "recovery_required", APPROVAL_KEY: status.key,
            "next": status.next.value, "attempt": status.attempt,
            "decision": None if status.decision is None else status.decision.value,
            "error": status.error,
        })

    async def _run(self, session: AsyncSession, status: CallStatus, name: str,
                   tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any],
                   fresh: list[Any]) -> CallStatus:
        args = dict(tool_args)
        async with session.dispatch(status.key) as a:  # dispatched is durable from here
            keywords = self._keywords.get(name, frozenset())
            if "execution_id" in keywords:
                args["execution_id"] = a.execution_id
            if "idempotency_key" in keywords:
                args["idempotency_key"] = a.idempotency_key
            try:
                value = await self.wrapped.call_tool(name, args, ctx, tool)
            except ModelRetry as exc:
                fresh.append(exc)
                raise _Refused(str(exc)) from exc
            except Exception as exc:
                fresh.append(exc)
                raise
            fresh.append(value)
            a.done(value)
        assert a.status is not None
        return a.status

    # -- identities ---------------------------------------------------------------------

    async def _position(self, ctx: RunContext[Any], name: str
                        ) -> tuple[int, int, list[dict[str, Any]]]:
        """(index in ``ctx.messages``, slot, this toolset's calls) of the current call's
        response.  The index only says where the history before it ends; the ledger
        places the response itself.

        The response is the LAST one carrying the tool call id: a provider that
        re-uses an id names the newest call with it."""
        call_id = ctx.tool_call_id
        mine = set(self._keywords) or set(await self.get_tools(ctx))
        for at in range(len(ctx.messages) - 1, -1, -1):
            m = ctx.messages[at]
            if not isinstance(m, ModelResponse):
                continue
            calls = _calls_of(m, mine)
            slots = [i for i, c in enumerate(calls) if c["id"] == call_id]
            if not slots:
                continue
            if len(slots) > 1:
                raise UserError(f"tool call id {call_id!r} appears {len(slots)} times in one "
                                "model response: the ledger cannot tell those calls apart; "
                                "nothing was executed")
            return at, slots[0], calls
        raise UserError(f"call {call_id!r} of tool {name!r} is in no model response of the "
                        "run's messages; nothing was executed")

    @staticmethod
    async def _tag(session: AsyncSession, messages: list[ModelMessage], mine: set[str],
                   response: list[dict[str, Any]] | None = None) -> None:
        """Put its ledger key on every result of the last response in ``messages`` that
        pydantic-ai built itself and so carries none (``ToolDenied``: outcome
        ``denied``; a ``ModelRetry``: ``retried``); record a denial the ledger still
        waits an approval for (``ToolDenied`` never reaches a toolset).

        The call is found by that response's calls (``Session.find(call,
        response=...)``: the newest recorded response with those calls).  That is
        that response while no later one was recorded, which holds when the
        messages end with its results (``get_tools``, before the next model
        request); from ``call_tool`` (``response``: the calls being placed) a
        result is only tagged when that response has other calls, never where the
        newest recorded one could be the response being placed."""
        last = -1
        for i, m in enumerate(messages):
            if isinstance(m, ModelResponse) and _calls_of(m, mine):
                last = i
        if last < 0:
            return
        calls = _calls_of(messages[last], mine)  # type: ignore[arg-type]  # a response
        if response is not None and _same(calls, response):
            return
        for m in messages[last + 1:]:
            if isinstance(m, ModelResponse):
                continue
            for p in m.parts:
                if (not isinstance(p, ToolReturnPart) or p.tool_name not in mine
                        or _key_on(p) is not None
                        or not (p.metadata is None or isinstance(p.metadata, dict))):
                    continue
                matched = [c for c in calls if c["id"] == p.tool_call_id]
                if len(matched) != 1:
                    continue
                try:
                    status = await session.find(matched[0], response=calls)
                except InvalidInput:  # held twice in the response, or awaiting recovery
                    continue
                if status is None:  # never recorded (a reserved argument was refused)
                    continue
                if p.outcome == "denied" and status.next is Next.AWAIT_APPROVAL:
                    status = await session.reject(status.key)
                p.metadata = {**(p.metadata or {}), APPROVAL_KEY: status.key}

    @staticmethod
    def _seen(before: list[ModelMessage], mine: set[str]) -> list[str]:
        """The ``seen`` of ``record``: the keys on the results the history before the
        response holds.  This toolset puts the key on every result it returns
        (:func:`_carry`) and on those pydantic-ai builds for its calls
        (:meth:`_tag`), so a history processor that trims old messages keeps the
        newest results' keys, which are the ones that count."""
        return [key for m in before if not isinstance(m, ModelResponse) for p in m.parts
                if isinstance(p, ToolReturnPart) and p.tool_name in mine
                and (key := _key_on(p)) is not None]


def _calls_of(m: ModelResponse, mine: set[str]) -> list[dict[str, Any]]:
    """The calls of this toolset's tools in one response, as the ledger records them."""
    return [{"id": p.tool_call_id, "name": p.tool_name, "arguments": p.args_as_dict()}
            for p in m.parts if isinstance(p, ToolCallPart) and p.tool_name in mine]


def _untagged(messages: list[ModelMessage], mine: set[str]) -> bool:
    """Whether a result after the last response lacks a key (nothing to tag otherwise)."""
    for m in reversed(messages):
        if isinstance(m, ModelResponse):
            return False
        if any(isinstance(p, ToolReturnPart) and p.tool_name in mine and _key_on(p) is None
               for p in m.parts):
            return True
    return False


def _same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Two responses' calls are the same calls (ids, names, arguments, slot by slot)."""
    return [(c["id"], c["name"], c["arguments"]) for c in a] == [
        (c["id"], c["name"], c["arguments"]) for c in b]


def _key_on(p: ToolReturnPart) -> str | None:
    """The ledger key a tool return carries (None: none was put on it)."""
    meta = p.metadata
    key = meta.get(APPROVAL_KEY) if isinstance(meta, Mapping) else None
    return key if isinstance(key, str) else None


def _carry(value: Any, key: str) -> Any:
    """``value`` as a tool return that carries the call's ledger key in its metadata
    (the model sees only the value).  A tool that returns its own ``ToolReturn``
    keeps its metadata, with the key added when that metadata is a dict (other
    metadata is left alone: the result is then found by its response, as a
    denial is)."""
    if isinstance(value, ToolReturn):
        meta = value.metadata
        if meta is None or isinstance(meta, dict):
            return replace(value, metadata={**(meta or {}), APPROVAL_KEY: key})
        return value
    return ToolReturn(value, metadata={APPROVAL_KEY: key})


def _overridden(tool: ToolsetTool[Any], recorded: Mapping[str, Any],
                tool_args: Mapping[str, Any]) -> bool:
    """Whether pydantic-ai calls the tool with other arguments than the recorded ones.

    ``tool_args`` are validated (``ToolApproved.override_args`` replaces the
    model's before validation); the recorded arguments go through the same
    validator, so only a real difference counts, never a default or a coercion."""
    try:
        expected = tool.args_validator.validate_python(dict(recorded))
    except Exception:  # the model's own arguments do not validate: they were replaced
        return True
    return bool(expected != dict(tool_args))
