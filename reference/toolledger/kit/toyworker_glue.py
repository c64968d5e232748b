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

from collections.abc import Mapping
from typing import Any

from .. import SEEN, CallStatus, Next, Session, SqliteStore, Tool
from .toyworker import ALLOWING, PermissionRequest, ToolCall, ToyWorker

__all__ = ["LedgerWorker"]


# glue:begin
class LedgerWorker(ToyWorker):  # ToyWorker, its tool calls protected by toolledger
    def __init__(self, *args: Any, tools: Mapping[str, Tool | str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tools = {n: t for n, t in tools.items() if n in self.registry}  # unknown: no call
        self.status, self.asking, self.placed = dict[int, CallStatus](), "", list[ToolCall]()
        old = {i["tool_call_id"]: ("approved" if i["resolution"] in ALLOWING else "rejected")
               if i["resolution"] else "pending" for i in reversed(self.inbox.items)
               if i["session_id"] == self.session_id}  # the old engine's inbox: legacy
        self.session = Session.open(  # the calls the ledger holds, as place() records them
            SqliteStore(self.base / "ledger.sqlite3"), self.session_id, self.tools,
            legacy_messages=self.messages, legacy_approvals=old, legacy_held=self.ours)

    def ours(self, raw: Mapping[str, Any]) -> bool:  # what the ledger protects (a raw call)
        [c] = self.parse({"tool_calls": [raw]})
        return c.name in self.tools and c.arguments is not None

    def handle_tool_calls(self, calls: list[ToolCall]) -> str:  # a resume's: placed already
        return super().handle_tool_calls(calls if calls is self.placed else self.place())

    def place(self) -> list[ToolCall]:  # the trailing response's calls, each its own status
        self.trail = self.session.record_trailing(  # placed by the ledger; again: no write
            self.messages, held=self.ours, requires_approval=lambda raw: self.permissions
            .evaluate(raw["function"]["name"]) != "allow")
        calls = self.parse({"tool_calls": self.trail.calls})
        self.status = {id(c): s for c, s in zip(calls, self.trail.statuses, strict=True) if s}
        return calls

    def inbox_key(self, request: PermissionRequest) -> tuple[str, str]:
        return request.session_id, self.asking  # the execution id, never a reused call id

    def authorize(self, call: ToolCall, status: CallStatus | None = None) -> str:
        if (status := status or self.status.get(id(call))) is None:
            return super().authorize(call)
        if status.next is Next.AWAIT_APPROVAL:  # the permission engine (grants, mode), else
            self.asking = status.key  # the approver, its inbox item keyed by this call's key
            verdict = super().authorize(call)
            if verdict == "wait":
                return "wait"
            status = (self.session.approve if verdict == "allow" else self.session.reject)(
                status.key)
        while status.next is Next.HALTED:  # a recovery item per attempt; its answer resolves
            item = self.inbox.add((self.session_id, f"{status.key}#{status.attempt}"),
                                  "recovery", {"tool": call.name, "arguments": call.arguments})
            if item["state"] == "pending":
                return "wait"
            status = self.session.resolve(status.key, item["resolution"], result=item.get("result"))
        self.status[id(call)] = status
        return "allow"  # execute_sync runs it, or gives the result the ledger holds

    def execute_sync(self, call: ToolCall) -> dict[str, Any] | None:
        if (status := self.status.get(id(call))) is None:
            return super().execute_sync(call)
        if status.next in (Next.EXECUTE, Next.RETRY):  # an idempotent tool gets its key
            status = self.session.execute(status.key, lambda a: self.registry[call.name](
                **a.arguments, **{k: v for k, v in [("idempotency_key", a.idempotency_key)] if v}))
        if status.next is Next.HALTED:  # no "halted" turn: Stop it, park the call
            self.stop()
            self.authorize(call, status)
        return self.result(status)

    def result(self, status: CallStatus) -> dict[str, Any] | None:  # as the engine's dict
        value = None if status.result is None else status.result_value()
        return value if status.result is None or isinstance(value, dict) else {"result": value}

    def record_result(self, call: ToolCall, result: Mapping[str, Any] | None) -> None:
        super().record_result(call, result)
        if result is not None and id(call) in self.status:  # the next response's `seen`
            self.messages[-1][SEEN] = [self.status[id(call)].key]

    def skip(self, call: ToolCall) -> None:
        if (status := self.status.get(id(call))) is None:
            return super().skip(call)
        cancel = status.next is Next.EXECUTE  # the user's Stop: approved, never dispatched
        self.record_result(call, self.result(self.session.cancel(status.key) if cancel else status))

    def summarise(self, dropped: list[dict[str, Any]]) -> dict[str, Any]:
        return {**super().summarise(dropped),  # compaction keeps the keys it drops
                SEEN: [k for m in dropped for k in m.get(SEEN, [])]}

    def unanswered(self) -> list[ToolCall]:  # only results AFTER it, by key (never an id)
        calls = self.place()  # stale (a user message after it): nothing
        self.placed = [calls[j] for j in self.trail.unanswered()]
        return self.placed
# glue:end
