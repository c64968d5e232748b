"""toolledger adopted into :class:`~toolledger.kit.toyworker.ToyWorker`: the whole glue.

Each seam of the engine is overridden with :class:`toolledger.Session` calls
only (no protocol event, no stage); ``tests/test_toyworker.py`` counts these
lines and crashes the adopted engine at every point of the matrix.  The
ledger owns each call's identity: the engine has no sequence number, its list
positions move (compaction) and its provider ids repeat, so a response is
recorded with ``record(calls, seen=keys)``, ``keys`` being the ledger keys
this glue stashes on the tool messages (and summaries) before the response.
The seam table is in docs/adopting.md#an-engine-with-openworkers-seams.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .. import CallStatus, Next, Session, SqliteStore, Tool
from .toyworker import PermissionRequest, ToolCall, ToyWorker

__all__ = ["LEGACY", "LedgerWorker"]

LEGACY = {"allow": "approved", "once": "approved", "always": "approved", None: "pending"}
"""An old inbox resolution as ``Session.open(legacy_approvals=...)`` takes it
(anything else: ``"rejected"``)."""


# glue:begin
class LedgerWorker(ToyWorker):
    """ToyWorker whose tool calls are protected by toolledger."""

    def __init__(self, *args: Any, tools: Mapping[str, Tool | str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tools, self.status, self.asking = dict(tools), dict[int, CallStatus](), ""
        old = {i["tool_call_id"]: LEGACY.get(i["resolution"], "rejected")  # a session begun
               for i in reversed(self.inbox.items) if i["session_id"] == self.session_id}
        self.session = Session.open(  # before the ledger: its unanswered calls, ours only
            SqliteStore(self.base / f"{self.session_id}.ledger.sqlite3"), self.session_id,
            self.tools, legacy_messages=[{**m, "tool_calls": self.ours(m)} for m in self.messages],
            legacy_approvals=old)

    def ours(self, message: Mapping[str, Any]) -> list[Any]:
        """The calls the ledger protects: declared tools, arguments that parse."""
        return [tc for tc, c in zip(message.get("tool_calls") or [], self.parse(message),
                                    strict=True) if c.name in self.tools and c.arguments is not None]

    def handle_tool_calls(self, calls: list[ToolCall]) -> str:
        at, message = self.trailing() or (0, {})  # the response these calls came in
        every = self.parse({"tool_calls": self.ours(message)})
        seen = [k for m in self.messages[:at] for k in m.get("ledger_seen", [])]
        statuses = self.session.record(  # placed by the ledger; again: nothing is written
            [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in every], seen=seen,
            requires_approval=[self.permissions.evaluate(c.name) != "allow" for c in every])
        pool, self.status = list(zip(every, statuses, strict=True)), {}
        for call in calls:  # per call, in slot order (equal calls too): the call's own status
            j = next((j for j, (c, _) in enumerate(pool) if c == call), None)
            if j is not None:
                self.status[id(call)] = pool.pop(j)[1]
        return super().handle_tool_calls(calls)

    def inbox_key(self, request: PermissionRequest) -> tuple[str, str]:
        return request.session_id, self.asking  # the execution id, never a reused call id

    def authorize(self, call: ToolCall) -> str:
        status = self.status.get(id(call))
        if status is None:
            return super().authorize(call)
        if status.next is Next.AWAIT_APPROVAL:  # the permission engine (grants, mode), else
            self.asking = status.key  # the approver's inbox item keyed by this call's key
            verdict = super().authorize(call)
            if verdict == "wait":
                return "wait"
            status = (self.session.approve if verdict == "allow" else self.session.reject)(
                status.key)
        return self.settle(call, status)

    def settle(self, call: ToolCall, status: CallStatus) -> str:
        """A halted call waits on a recovery item (key and attempt); its answer resolves it."""
        while status.next is Next.HALTED:
            item = self.inbox.add((self.session_id, f"{status.key}#{status.attempt}"),
                                  "recovery", {"tool": call.name, "arguments": call.arguments})
            if item["state"] == "pending":
                return "wait"
            status = self.session.resolve(status.key, item["resolution"],
                                          result=item.get("result"))
        self.status[id(call)] = status
        return "allow"  # execute_sync runs it, or gives the result the ledger holds

    def execute_sync(self, call: ToolCall) -> dict[str, Any] | None:
        status = self.status.get(id(call))
        if status is None:
            return super().execute_sync(call)
        if status.next in (Next.EXECUTE, Next.RETRY):  # an idempotent tool gets its key
            status = self.session.execute(status.key, lambda a: self.registry[call.name](
                **a.arguments, **({"idempotency_key": a.idempotency_key}
                                  if a.idempotency_key else {})))
        if status.next is Next.HALTED:  # no "halted" turn: park it and Stop the turn
            self.stop()
            self.settle(call, status)
        return None if status.result is None else self.result(status)

    @staticmethod
    def result(status: CallStatus) -> dict[str, Any]:
        assert status.result is not None
        try:
            value = json.loads(status.result.content)
        except ValueError:
            value = status.result.content  # a human's "applied" text
        return value if isinstance(value, dict) else {"result": value}

    def record_result(self, call: ToolCall, result: Mapping[str, Any] | None) -> None:
        super().record_result(call, result)
        status = self.status.get(id(call))
        if result is not None and status is not None:  # the next response's `seen`
            self.messages[-1]["ledger_seen"] = [status.key]

    def skip(self, call: ToolCall) -> None:
        status = self.status.get(id(call))
        if status is None:
            return super().skip(call)
        if status.next is Next.EXECUTE:  # the user's Stop, approved and never dispatched
            status = self.session.cancel(status.key, note="stopped by the user")
        self.status[id(call)] = status
        self.record_result(call, None if status.result is None else self.result(status))

    def summarise(self, dropped: list[dict[str, Any]]) -> dict[str, Any]:
        return {**super().summarise(dropped),  # compaction keeps the keys it drops
                "ledger_seen": [k for m in dropped for k in m.get("ledger_seen", [])]}

    def unanswered(self) -> list[ToolCall]:
        found = self.trailing()  # only results AFTER the trailing message answer it
        if found is None or any(m["role"] == "user" for m in self.messages[found[0]:]):
            return []
        answered = {m["tool_call_id"] for m in self.messages[found[0]:] if m["role"] == "tool"}
        return [c for c in self.parse(found[1]) if c.id not in answered]
# glue:end
