"""A toy turn engine with openworker's seams, and no toolledger in it.

It is the integration guide's subject: :mod:`toolledger.kit.toyworker_glue`
adopts toolledger into it by overriding its seams, in a few dozen lines.
It is shaped like openworker's ``TurnEngine`` + ``SessionManager`` (written
from its documented behaviour, not from its code), small enough to read:

- **the conversation** is a JSON-lines file per session; :meth:`ToyWorker.save`
  is the save point (turn start, the assistant message, the end of an
  iteration); every assistant message gets a sequence number ``seq`` that is
  saved with it (an execution id's input, never a list index);
- **the inbox** (:class:`Inbox`) is a JSON file of approval items; the engine
  keys an item by :meth:`ToyWorker.inbox_key` (openworker: ``session_id`` +
  ``tool_call_id``);
- **phase A** (:meth:`ToyWorker.authorize`): every call of an assistant
  message is allowed (``grants``: a standing grant), denied, or waits for
  its inbox item; **phase B** runs the cleared calls one by one through
  :meth:`ToyWorker.execute_sync`, ``registry[name](**arguments)`` (an
  adopter wraps it: before the invoke, after it); any exception becomes an
  ``{"error", "error_type"}`` tool message, as in openworker;
- **durable resume** (:meth:`ToyWorker.resume`): the trailing assistant
  message's calls that have no tool message after it are handled again
  (:meth:`ToyWorker.unanswered`, the resume decision); resolving an inbox
  item (:meth:`ToyWorker.resolve_inbox`) resumes;
- ``crash(point)`` is called at the engine's points of issue #443's matrix
  (:data:`CRASH_POINTS`); a test raises a ``BaseException`` there (or in a
  tool) to kill the "process", then builds a new engine from the files.

Without the glue, a crash after the effect re-runs the tool on resume: the
issue's duplicate.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = ["CRASH_POINTS", "Inbox", "ToyCall", "ToyWorker"]

CRASH_POINTS: Final = (
    "after_assistant_saved",  # the assistant message is saved, nothing else
    "after_authorize",  # every call cleared, none run
    "after_result",  # the tool message is in memory, not saved
    "after_iteration_saved",  # the iteration's save point
)
"""Where the engine calls ``crash(point)``.  The points inside a tool (before
its effect; after it, before the tool returns: issue #443's window) belong to
the tool: a test's tool crashes there itself."""

Provider = Callable[[list[dict[str, Any]]], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class ToyCall:
    """One tool call of an assistant message: the execution id's inputs are here."""

    id: str  # the provider's tool_call_id (may repeat across messages)
    name: str
    arguments: Mapping[str, Any]
    seq: int  # the assistant message's saved sequence number
    index: int  # its index in the message


class Inbox:
    """Approval items in a JSON file: ``key -> {"tool", "arguments", "state", "answer"}``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.items: dict[str, dict[str, Any]] = (
            json.loads(path.read_text()) if path.exists() else {})

    def add(self, key: str, item: dict[str, Any]) -> dict[str, Any]:
        """The item under ``key``; a new pending one if there is none (idempotent)."""
        if key not in self.items:
            self.items[key] = {**item, "state": "pending", "answer": None}
            self.save()
        return self.items[key]

    def resolve(self, key: str, answer: str, **extra: Any) -> None:
        self.items[key].update(state="resolved", answer=answer, **extra)
        self.save()

    def pending(self) -> dict[str, dict[str, Any]]:
        return {k: i for k, i in self.items.items() if i["state"] == "pending"}

    def save(self) -> None:
        self.path.write_text(json.dumps(self.items, indent=1))


class ToyWorker:
    """One session's engine; build a new one to "restart the process"."""

    def __init__(self, base: Path, session_id: str, registry: Mapping[str, Callable[..., Any]],
                 provider: Provider, *, approval: Mapping[str, bool],
                 grants: frozenset[str] = frozenset(),
                 crash: Callable[[str], None] = lambda point: None) -> None:
        self.base, self.session_id, self.registry = base, session_id, registry
        self.provider, self.approval, self.grants, self.crash = provider, approval, grants, crash
        self.file = base / f"{session_id}.jsonl"
        self.messages: list[dict[str, Any]] = (
            [json.loads(line) for line in self.file.read_text().splitlines()]
            if self.file.exists() else [])
        self.inbox = Inbox(base / "inbox.json")

    # -- the loop --------------------------------------------------------------------

    def run(self, text: str, *, max_iterations: int = 4) -> str:
        """A user turn: ``"done"``, ``"waiting"`` for inbox items, or ``"halted"``."""
        self.messages.append({"role": "user", "content": text})
        self.save()  # turn_start
        return self.loop(max_iterations)

    def loop(self, max_iterations: int = 4) -> str:
        for _ in range(max_iterations):
            seq = 1 + max((m.get("seq", -1) for m in self.messages), default=-1)
            message = {**self.provider(self.messages), "role": "assistant", "seq": seq}
            self.messages.append(message)
            self.save()  # the assistant message is saved before any call is acted on
            self.crash("after_assistant_saved")
            if not message.get("tool_calls"):
                return "done"
            outcome = self.handle(self.calls(message))
            if outcome != "continue":
                return outcome
        return "done"

    def handle(self, calls: list[ToyCall]) -> str:
        """Phase A (authorize every call), then phase B (run the cleared ones):
        ``"continue"``, ``"waiting"`` (an inbox item) or ``"halted"`` (a call has no answer)."""
        verdicts = self.authorize(calls)
        if "wait" in verdicts:
            return "waiting"
        self.crash("after_authorize")
        for call, verdict in zip(calls, verdicts, strict=True):
            if verdict == "allow":
                self.record_result(call, self.execute_sync(call))
            elif verdict == "deny":
                self.record_result(call, {"content": '{"error": "denied"}', "status": "error"})
        self.save()  # iteration_end
        self.crash("after_iteration_saved")
        return "halted" if self.unanswered() else "continue"

    # -- the seams ---------------------------------------------------------------------

    def calls(self, message: Mapping[str, Any]) -> list[ToyCall]:
        return [ToyCall(tc["id"], tc["function"]["name"],
                        json.loads(tc["function"]["arguments"] or "{}"), message["seq"], i)
                for i, tc in enumerate(message["tool_calls"])]

    def inbox_key(self, call: ToyCall) -> str:
        return f"{self.session_id}:{call.id}"

    def authorize(self, calls: list[ToyCall]) -> list[str]:
        """Per call: ``"allow"``, ``"deny"`` or ``"wait"`` (its inbox item is pending)."""
        out = []
        for call in calls:
            if not self.approval.get(call.name, True) or call.name in self.grants:
                out.append("allow")
                continue
            item = self.inbox.add(self.inbox_key(call), {"tool": call.name,
                                                         "arguments": dict(call.arguments)})
            out.append("wait" if item["state"] == "pending" else
                       "allow" if item["answer"] == "allow" else "deny")
        return out

    def execute_sync(self, call: ToyCall) -> dict[str, Any] | None:
        """Run one call: its tool message's ``content`` and ``status`` (None: no message)."""
        try:
            content = self.registry[call.name](**call.arguments)
        except Exception as exc:  # openworker: every tool error becomes an error message
            content = json.dumps({"error": str(exc), "error_type": type(exc).__name__})
            return {"content": content, "status": "error"}
        return {"content": str(content), "status": "ok"}

    def record_result(self, call: ToyCall, result: Mapping[str, Any] | None) -> None:
        if result is not None:
            self.messages.append({"role": "tool", "tool_call_id": call.id, "seq": call.seq,
                                  **result})
            self.crash("after_result")

    def unanswered(self) -> list[ToyCall]:
        """The resume decision: the trailing assistant message's calls with no answer."""
        last = max((i for i, m in enumerate(self.messages) if m.get("tool_calls")), default=None)
        if last is None or any(m["role"] == "user" for m in self.messages[last:]):
            return []
        answered = {m["tool_call_id"] for m in self.messages[last:] if m["role"] == "tool"}
        return [c for c in self.calls(self.messages[last]) if c.id not in answered]

    def resume(self) -> str:
        """Durable resume: handle the unanswered trailing calls, then go on."""
        pending = self.unanswered()
        outcome = self.handle(pending) if pending else "continue"
        if outcome != "continue":
            return outcome
        if not self.messages or self.messages[-1]["role"] != "tool":
            return "done"  # the turn had ended
        return self.loop()

    def resolve_inbox(self, key: str, answer: str, **extra: Any) -> str:
        self.inbox.resolve(key, answer, **extra)
        return self.resume()

    def save(self) -> None:
        """The save point: the whole conversation, as JSON lines."""
        self.file.write_text("".join(json.dumps(m) + "\n" for m in self.messages))
