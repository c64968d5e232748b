"""A toy turn engine as awkward as openworker's, and no toolledger in it.

It is the integration guide's subject: :mod:`toolledger.kit.toyworker_glue`
adopts toolledger into it by overriding its seams (docs/adopting.md).  It is
shaped like openworker's ``TurnEngine`` + ``SessionManager`` (from their
documented behaviour, not their code), with the seams that made the real
adoption hard:

- **no sequence number**: assistant messages carry a timestamp only; the
  conversation is a JSON-lines file that :meth:`ToyWorker.save` appends to
  and rewrites when the list shrank (:meth:`ToyWorker.compact` summarises old
  messages at an iteration's start), so list positions move; provider ids
  may repeat (``call_0`` every turn) or be empty;
- **the engine never saves**: :meth:`ToyWorker.checkpoint` is the manager's
  save at ``turn_start``, ``permission_required`` and ``iteration_end``
  (:data:`CHECKPOINTS`); tool results are durable only at ``iteration_end``;
  a durable resume saves nothing until its end (an approver that parks a new
  item saves);
- **phase A, one call at a time**: interactive tools (:data:`INTERACTIVE`),
  malformed calls (bad JSON) and unknown tools bypass approval; every other
  call goes through :class:`PermissionEngine` (modes ``ask`` / ``auto``,
  session grants, re-evaluated on resume: a grant allows without the
  inbox) and, if it needs the user, the approver, which gets a
  :class:`PermissionRequest` with no position (``approver=``: a live one
  answering at once; by default the inbox's, which keys its item by
  :meth:`ToyWorker.inbox_key` ``(session_id, tool_call_id)``); the
  :class:`Inbox` returns the first item with that key, resolved or not;
- **phase B**: low-risk calls that need no approval run concurrently in a
  thread pool when more than one call was cleared, the others one by one,
  through :meth:`ToyWorker.execute_sync`; results are dicts, ``_display`` is
  stripped, an exception becomes ``{"error", "error_type"}``;
- **Stop** (:meth:`ToyWorker.stop`): the calls not started get a "stopped"
  message and the turn ends ``"cancelled"``; a turn has no "halted" state;
- **durable resume** (:meth:`ToyWorker.resume`, run by
  :meth:`ToyWorker.resolve_inbox`): the trailing assistant message's calls
  with no tool message are handled again; openworker's answered set spans
  the whole thread (:meth:`ToyWorker.unanswered`), so a reused id looks
  answered.

``crash(point)`` is called at :data:`CRASH_POINTS`; a test raises a
``BaseException`` there (or in a tool) to kill the "process", then builds a
new engine from the files.  Without the glue, a crash after the effect
re-runs the tool on resume: issue #443's duplicate.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

__all__ = ["ALLOWING", "CHECKPOINTS", "CRASH_POINTS", "INTERACTIVE", "Inbox", "PermissionEngine",
           "PermissionRequest", "ToolCall", "ToyWorker"]

CHECKPOINTS: Final = frozenset({"turn_start", "permission_required", "iteration_end"})
"""The events on which the manager saves the conversation (openworker's ``_CHECKPOINTS``)."""

ALLOWING: Final = frozenset({"allow", "once", "always"})
"""The approver's answers that allow the call (``always`` also grants the tool)."""

INTERACTIVE: Final = frozenset({"ask_user", "propose_plan"})
"""Tools whose callback does the work inline in phase A, with no permission check."""

CRASH_POINTS: Final = (
    "after_permission_saved",  # the assistant message saved at permission_required
    "after_authorize",  # phase A done, nothing run
    "after_result",  # a tool message in memory, not saved
    "before_iteration_saved",  # the batch ran, iteration_end not saved
    "after_iteration_saved",  # the iteration's save point
)
"""Where the engine calls ``crash(point)``; the points inside a tool (before
its effect; after it, before it returns: issue #443's window) are the tool's."""

Provider = Callable[[list[dict[str, Any]]], dict[str, Any]]
Approver = Callable[["PermissionRequest"], "str | None"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A provider's call: no position (``arguments`` None: its JSON did not parse)."""

    id: str
    name: str
    arguments: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class PermissionRequest:
    """What the approver is given: the call, by its (possibly reused) provider id."""

    session_id: str
    tool_call_id: str
    tool: str
    arguments: Mapping[str, Any]


@dataclass
class PermissionEngine:
    """``evaluate``: ``"allow"`` (mode ``auto``, no approval needed, a session
    grant) or ``"needs_user"``; grants are saved with the session."""

    requires_approval: Mapping[str, bool]
    mode: str = "ask"
    grants: set[str] = field(default_factory=set)

    def evaluate(self, tool: str) -> str:
        if self.mode == "auto" or not self.requires_approval.get(tool, True):
            return "allow"
        return "allow" if tool in self.grants else "needs_user"


class Inbox:
    """Inbox items in a JSON file, idempotent by ``key`` only (openworker: the
    ``(session_id, tool_call_id)`` pair): the first item with it comes back."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.items: list[dict[str, Any]] = json.loads(path.read_text()) if path.exists() else []

    def add(self, key: tuple[str, str], kind: str, data: Mapping[str, Any]) -> dict[str, Any]:
        for item in self.items:
            if (item["session_id"], item["tool_call_id"]) == key:
                return item
        item = {"id": uuid.uuid4().hex, "session_id": key[0], "tool_call_id": key[1],
                "kind": kind, "state": "pending", "resolution": None, "data": dict(data)}
        self.items.append(item)
        self.save()
        return item

    def resolve(self, item_id: str, resolution: str, **extra: Any) -> None:
        [item] = [i for i in self.items if i["id"] == item_id]
        item.update(state="resolved", resolution=resolution, **extra)
        self.save()

    def pending(self) -> dict[str, dict[str, Any]]:
        return {i["id"]: i for i in self.items if i["state"] == "pending"}

    def save(self) -> None:
        self.path.write_text(json.dumps(self.items, indent=1))


class ToyWorker:
    """One session's engine and its manager; build a new one to "restart the process"."""

    def __init__(self, base: Path, session_id: str, registry: Mapping[str, Callable[..., Any]],
                 provider: Provider, *, approval: Mapping[str, bool],
                 risk: Mapping[str, str] | None = None, mode: str = "ask",
                 crash: Callable[[str], None] = lambda point: None,
                 compact_after: int | None = None, keep: int = 3,
                 approver: Approver | None = None) -> None:
        self.base, self.session_id, self.registry = base, session_id, registry
        self.provider, self.risk, self.crash = provider, dict(risk or {}), crash
        self.compact_after, self.keep = compact_after, keep
        self.file, self.index = base / f"{session_id}.jsonl", base / f"{session_id}.session.json"
        self.messages: list[dict[str, Any]] = (
            [json.loads(line) for line in self.file.read_text().splitlines()]
            if self.file.exists() else [])
        saved = json.loads(self.index.read_text()) if self.index.exists() else {}
        self.permissions = PermissionEngine(approval, saved.get("mode", mode),
                                            set(saved.get("grants", [])))
        self.inbox = Inbox(base / "inbox.json")
        # the live path (a human answering while the turn waits) or the inbox
        self.approver: Approver = approver or self.inbox_approver
        self.cancelled, self.resuming, self.shrunk = False, False, False

    # -- the manager -------------------------------------------------------------

    def run(self, text: str) -> str:
        """A user turn: ``"done"``, ``"waiting"`` (an inbox item) or ``"cancelled"``."""
        self.cancelled = False
        self.messages.append({"role": "user", "content": text})
        self.checkpoint("turn_start")
        return self.finish(self.loop)

    def resume(self) -> str:
        """Durable resume: the unanswered trailing calls again, then the loop; no
        checkpoint saves until the end."""
        self.cancelled, self.resuming = False, True

        def body() -> str:
            pending = self.unanswered()
            outcome = self.handle_tool_calls(pending) if pending else "continue"
            last = self.messages[-1] if self.messages else {}
            if outcome != "continue" or (last.get("role") == "assistant"
                                         and not last.get("tool_calls")):
                return outcome if outcome != "continue" else "done"
            return self.loop()

        return self.finish(body)

    def resolve_inbox(self, item_id: str, resolution: str, **extra: Any) -> str:
        self.inbox.resolve(item_id, resolution, **extra)
        return self.resume()

    def finish(self, body: Callable[[], str]) -> str:
        """The turn's ``finally``: saved on any end but the process dying."""
        try:
            outcome = body()
        except Exception:
            self.save()
            raise
        self.resuming = False
        self.save()
        return outcome

    def checkpoint(self, event: str) -> None:
        if event in CHECKPOINTS and not self.resuming:
            self.save()

    def save(self) -> None:
        """Append the new messages; rewrite the file if the list shrank.  Grants too."""
        have = len(self.file.read_text().splitlines()) if self.file.exists() else 0
        if self.shrunk or len(self.messages) < have:
            self.file.write_text("".join(json.dumps(m) + "\n" for m in self.messages))
        else:
            with self.file.open("a") as f:
                f.write("".join(json.dumps(m) + "\n" for m in self.messages[have:]))
        self.shrunk = False
        self.index.write_text(json.dumps({"mode": self.permissions.mode,
                                          "grants": sorted(self.permissions.grants)}))

    def inbox_key(self, request: PermissionRequest) -> tuple[str, str]:
        return request.session_id, request.tool_call_id

    def inbox_approver(self, request: PermissionRequest) -> str | None:
        """Park (or find) the approval item: its resolution, None while pending."""
        before = len(self.inbox.items)
        item = self.inbox.add(self.inbox_key(request), "approval",
                              {"tool": request.tool, "arguments": dict(request.arguments)})
        if len(self.inbox.items) > before:
            self.save()  # persist_session() when a new item parks
        return None if item["state"] == "pending" else str(item["resolution"])

    def stop(self) -> None:
        """The user's Stop: calls not started yet are not run; the turn ends."""
        self.cancelled = True

    # -- the engine ----------------------------------------------------------------

    def loop(self, max_iterations: int = 6) -> str:
        for _ in range(max_iterations):
            if self.cancelled:
                return "cancelled"
            self.compact()
            message = {**self.provider(list(self.messages)), "role": "assistant",
                       "ts": time.time()}
            self.messages.append(message)
            if not message.get("tool_calls"):
                return "done"
            outcome = self.handle_tool_calls(self.parse(message))
            if outcome != "continue":
                return outcome
        return "done"

    def compact(self) -> None:
        """Due past ``compact_after`` messages: the older ones become one summary."""
        if self.compact_after is None or len(self.messages) <= self.compact_after:
            return
        cut = len(self.messages) - self.keep
        while cut > 0 and self.messages[cut]["role"] == "tool":
            cut -= 1  # never part an assistant message from its results
        if cut > 1:
            self.messages[:cut] = [self.summarise(self.messages[:cut])]
            self.shrunk = True

    def summarise(self, dropped: list[dict[str, Any]]) -> dict[str, Any]:
        return {"role": "system", "content": f"(summary of {len(dropped)} messages)"}

    @staticmethod
    def parse(message: Mapping[str, Any]) -> list[ToolCall]:
        out = []
        for tc in message.get("tool_calls") or []:
            try:
                args = json.loads(tc["function"]["arguments"] or "{}")
            except ValueError:
                args = None
            out.append(ToolCall(tc["id"], tc["function"]["name"],
                                args if isinstance(args, dict) else None))
        return out

    def handle_tool_calls(self, calls: list[ToolCall]) -> str:
        """Phase A, one call at a time, then phase B: ``"continue"``, ``"waiting"``
        or ``"cancelled"``."""
        cleared = []
        for call in calls:
            if call.name in INTERACTIVE:
                self.record_result(call, {"answer": "(the user answered inline)"})
            elif call.arguments is None or call.name not in self.registry:
                self.record_result(call, {"error": f"invalid call to {call.name!r}",
                                          "error_type": "InvalidToolCall"})
            else:
                verdict = self.authorize(call)
                if verdict == "wait":
                    return "waiting"
                if verdict == "deny":
                    self.record_result(call, {"error": "denied by the user",
                                              "error_type": "PermissionDenied"})
                else:
                    cleared.append(call)
        self.crash("after_authorize")
        safe = [c for c in cleared if self.parallel_safe(c)] if len(cleared) > 1 else []
        done: dict[int, dict[str, Any] | None] = {}
        if safe:
            with ThreadPoolExecutor(max_workers=4) as pool:  # gather(to_thread(...)): every
                futures = [pool.submit(self.execute_sync, c) for c in safe]  # call runs
                done = {id(c): f.result() for c, f in zip(safe, futures, strict=True)}
        for call in cleared:
            if id(call) in done:
                self.record_result(call, done[id(call)])
            elif self.cancelled:
                self.skip(call)
            else:
                self.record_result(call, self.execute_sync(call))
        self.crash("before_iteration_saved")
        self.checkpoint("iteration_end")
        self.crash("after_iteration_saved")
        return "cancelled" if self.cancelled else "continue"

    def parallel_safe(self, call: ToolCall) -> bool:
        return (self.risk.get(call.name) == "low"
                and not self.permissions.requires_approval.get(call.name, True))

    def authorize(self, call: ToolCall) -> str:
        """``"allow"``, ``"deny"`` or ``"wait"`` (the approver parked an item)."""
        if self.permissions.evaluate(call.name) == "allow":
            return "allow"
        self.checkpoint("permission_required")
        self.crash("after_permission_saved")
        outcome = self.approver(PermissionRequest(self.session_id, call.id, call.name,
                                                  call.arguments or {}))
        if outcome is None:
            return "wait"
        if outcome == "always":
            self.permissions.grants.add(call.name)
        return "allow" if outcome in ALLOWING else "deny"

    def execute_sync(self, call: ToolCall) -> dict[str, Any] | None:
        """``registry[name](**arguments)`` as a result dict (None: no tool message)."""
        try:
            value = self.registry[call.name](**(call.arguments or {}))
        except Exception as exc:  # openworker: every tool error is an error result
            return {"error": str(exc), "error_type": type(exc).__name__}
        return value if isinstance(value, dict) else {"result": value}

    def record_result(self, call: ToolCall, result: Mapping[str, Any] | None) -> None:
        if result is None:
            return
        shown = {k: v for k, v in result.items() if k != "_display"}
        self.messages.append({"role": "tool", "tool_call_id": call.id,
                              "content": json.dumps(shown),
                              "status": "error" if "error" in shown else "ok",
                              "ts": time.time()})
        self.crash("after_result")

    def skip(self, call: ToolCall) -> None:
        """A cleared call the user's Stop kept from running."""
        self.record_result(call, {"error": "stopped by the user", "error_type": "Cancelled"})

    def trailing(self) -> tuple[int, dict[str, Any]] | None:
        """The last assistant message with tool calls, and its index."""
        at = max((i for i, m in enumerate(self.messages) if m.get("tool_calls")), default=None)
        return None if at is None else (at, self.messages[at])

    def unanswered(self) -> list[ToolCall]:
        """The resume decision: the trailing message's calls no tool message answers
        (openworker's answered set spans the WHOLE thread)."""
        found = self.trailing()
        if found is None or any(m["role"] == "user" for m in self.messages[found[0]:]):
            return []
        answered = {m["tool_call_id"] for m in self.messages if m["role"] == "tool"}
        return [c for c in self.parse(found[1]) if c.id not in answered]
