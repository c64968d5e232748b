"""toolledger adopted into :class:`~toolledger.kit.toyworker.ToyWorker`: the whole glue.

Each of the engine's seams is overridden once, with :class:`toolledger.Session`
calls only (no protocol event, no stage); ``tests/test_toyworker.py`` counts
these lines and crashes the adopted engine at every point of the matrix.

Each seam and the API call it becomes:

- the engine is built (``get_engine``): ``Session.open(SqliteStore(path), sid, tools)``;
- phase A, after the assistant message is saved: ``record(seq, calls,
  requires_approval=...)`` (a standing grant: ``False`` for that call);
- the inbox key: ``status.key``, the execution id; a halted call: key + attempt;
- the approver's answer: ``approve(key)`` / ``reject(key)``;
- a halted call (``recovery_required``): an inbox item; its answer:
  ``resolve(key, "applied" | "retry" | "abandon")``;
- ``_execute_sync`` around ``registry[name](**args)``: ``execute(key, fn)``; a
  result the ledger holds is returned, never re-run; an ``idempotent`` tool
  gets the key as the keyword ``idempotency_key`` (a name the model's
  arguments can never use: ``record()`` refuses it at any depth);
- durable resume: ``record()`` of the trailing message again (a no-op write) gives
  each interrupted call its recovery decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import CallStatus, Next, Session, SqliteStore, Tool
from .toyworker import ToyCall, ToyWorker

__all__ = ["LedgerWorker"]


# glue:begin
class LedgerWorker(ToyWorker):
    """ToyWorker whose tool calls are protected by toolledger."""

    def __init__(self, *args: Any, tools: Mapping[str, Tool | str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        store = SqliteStore(self.base / f"{self.session_id}.ledger.sqlite3")
        self.session = Session.open(store, self.session_id, tools)
        self.status: dict[tuple[int, int], CallStatus] = {}

    def inbox_key(self, call: ToyCall) -> str:
        status = self.status[call.seq, call.index]
        if status.next is Next.AWAIT_APPROVAL:
            return status.key  # the approval of this execution, never a reused tool_call_id's
        return f"{status.key}#{status.attempt}"  # a halted attempt: one recovery item each

    def authorize(self, calls: list[ToyCall]) -> list[str]:
        seq = calls[0].seq  # the message is saved: record all of its calls (again: a no-op)
        every = self.calls(next(m for m in self.messages if m.get("seq") == seq))
        statuses = self.session.record(
            seq, [{"id": c.id, "name": c.name, "arguments": dict(c.arguments)} for c in every],
            requires_approval=[False if c.name in self.grants else None for c in every])
        return [self.verdict(call, statuses[call.index]) for call in calls]

    def verdict(self, call: ToyCall, status: CallStatus) -> str:
        """"wait" for an inbox item, else "allow": execute_sync runs it or returns its result."""
        while status.next in (Next.AWAIT_APPROVAL, Next.HALTED):
            self.status[call.seq, call.index] = status
            item = self.inbox.add(self.inbox_key(call), {
                "kind": status.next.value, "tool": call.name, "arguments": dict(call.arguments)})
            if item["state"] == "pending":
                return "wait"
            if status.next is Next.AWAIT_APPROVAL:
                allow = item["answer"] == "allow"
                status = (self.session.approve if allow else self.session.reject)(status.key)
            else:  # "applied" (with the human's result), "retry" or "abandon"
                status = self.session.resolve(status.key, item["answer"],
                                              result=item.get("result"))
        self.status[call.seq, call.index] = status
        return "allow"

    def execute_sync(self, call: ToyCall) -> dict[str, Any] | None:
        status = self.status[call.seq, call.index]
        if status.next in (Next.EXECUTE, Next.RETRY):  # an idempotent tool gets the key
            status = self.session.execute(status.key, lambda a: self.registry[call.name](
                **a.arguments, **({"idempotency_key": a.idempotency_key}
                                  if a.idempotency_key else {})))
        if status.next is Next.HALTED:  # an unknown outcome: a human decides
            self.verdict(call, status)
        if status.result is None:
            return None  # no tool message: the turn stops until the inbox item is answered
        return {"content": status.result.content, "status": status.result.kind.value}
# glue:end
