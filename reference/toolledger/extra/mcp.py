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

Not covered: MCP tasks as the reconcile source.  mcp 2.3.0's ``ClientSession``
has no tasks API (``tasks/get`` is only a 2025-11-25 wire type, tasks an
extension in 2026-07-28), so a ``reconcile`` tool needs the host's own
connector (``ledger.reconcile(key, ask)``); its call comes back with
``next == "reconcile"``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CallToolResult,
    PaginatedRequestParams,
    RequestParamsMeta,
    TextContent,
    ToolAnnotations,
)
from mcp_types import Tool as McpTool
from mcp_types.jsonrpc import INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR
from pydantic import ValidationError

from .._core.async_session import AsyncSession
from .._core.protocol import ResultKind
from .._core.session import Attempt, CallStatus, Next, NotApplied, Tool
from .._core.stores import Store

__all__ = ["ATTEMPT_META", "IDEMPOTENCY_META", "LedgerClientSession", "McpCall",
           "policies_from_listing", "policy_from_annotations"]

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
                          *, trust_read_only: bool = False) -> dict[str, Tool | str]:
    """The engine's declarations, plus an annotation default for every listed tool it
    did not declare (a declared tool keeps its declaration: never weakened)."""
    out: dict[str, Tool | str] = {t.name: policy_from_annotations(
        t.annotations, trust_read_only=trust_read_only) for t in listed}
    out.update(declared)
    return out


@dataclass(frozen=True)
class McpCall:
    """One call of a response, as :meth:`LedgerClientSession.call_tools` leaves it.

    ``status.next`` says what is next (``result``, ``await_approval``, ``halted``,
    ``reconcile``); ``result`` is the tool result for the model when there is
    one (``None`` otherwise)."""

    status: CallStatus
    result: CallToolResult | None

    @property
    def key(self) -> str:
        """The execution id: the ``seen`` key, the inbox item's key, the ``_meta`` key."""
        return self.status.key


class LedgerClientSession:
    """The ledger in front of one MCP client session; see the module documentation.

    Build it with :meth:`open`.  ``ledger`` is the :class:`~toolledger.AsyncSession`
    underneath (``approve``, ``reject``, ``recover``, ``halted``, ``resolve``,
    ``reconcile``); ``policies`` what each tool was declared or defaulted to."""

    def __init__(self, client: ClientSession, ledger: AsyncSession,
                 policies: Mapping[str, Tool | str], *,
                 read_timeout_seconds: float | None = None) -> None:
        self.client = client
        self.ledger = ledger
        self.policies = dict(policies)
        self.read_timeout_seconds = read_timeout_seconds

    @classmethod
    async def open(cls, client: ClientSession, store: Store, session_id: str,
                   tools: Mapping[str, Tool | str] | None = None, *,
                   trust_read_only: bool = False, max_attempts: int = 3,
                   read_timeout_seconds: float | None = None) -> LedgerClientSession:
        """List the server's tools (every page), merge their annotation defaults under
        the engine's ``tools``, and open the ledger session ``session_id`` on ``store``."""
        listed: list[McpTool] = []
        cursor: str | None = None
        while True:
            page = await client.list_tools(
                params=None if cursor is None else PaginatedRequestParams(cursor=cursor))
            listed += page.tools
            cursor = page.next_cursor
            if cursor is None:
                break
        policies = policies_from_listing(listed, tools or {}, trust_read_only=trust_read_only)
        ledger = await AsyncSession.open(store, session_id, policies, max_attempts=max_attempts)
        return cls(client, ledger, policies, read_timeout_seconds=read_timeout_seconds)

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
            if st.next in (Next.EXECUTE, Next.RETRY):
                st = await self.ledger.execute(st.key, self._send)
            out.append(McpCall(st, _result_of(st)))
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
