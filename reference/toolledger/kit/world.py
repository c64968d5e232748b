"""What surrounds the demo engine: the provider, the human and the conversation.

Scripted stand-ins for the model provider (:class:`ScriptedProvider`) and the
human who approves (:class:`ScriptedHuman`), the host's inbox items, and the
durable conversation checkpoints (:class:`MemoryConversationStore`,
:class:`FileConversationStore`).  Used by :mod:`toolledger.kit.engine` (which
re-exports every name here).
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeAlias

from .._core.protocol import (
    CallPosition,
    InvalidInput,
)

__all__ = [
    "ApprovalRequest",
    "ConversationStore",
    "FileConversationStore",
    "Human",
    "InboxItem",
    "MemoryConversationStore",
    "Message",
    "Provider",
    "ScriptedHuman",
    "ScriptedProvider",
    "tool_call",
]


Message: TypeAlias = dict[str, Any]


# --------------------------------------------------------------------------
# Provider, human, durable conversation
# --------------------------------------------------------------------------


def tool_call(call_id: str, name: str, arguments: Mapping[str, Any]) -> Message:
    """A provider tool call: ``{id, type, function{name, arguments JSON}}``."""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(dict(arguments))},
    }


class Provider(Protocol):
    """The model: the next assistant message for a conversation."""

    def complete(self, messages: Sequence[Mapping[str, Any]]) -> Message: ...


class ScriptedProvider:
    """A deterministic model: the n-th assistant message is ``script[n]``.

    ``n`` is the number of assistant messages already in the conversation, so
    a provider asked again after a crash answers the same thing (a real model
    might not: that is why the call is durable before it is dispatched).  An
    entry is a list of tool calls (see :func:`tool_call`) or a final text.
    """

    def __init__(self, script: Sequence[Sequence[Message] | str]) -> None:
        self.script = list(script)
        self.asked = 0

    def complete(self, messages: Sequence[Mapping[str, Any]]) -> Message:
        self.asked += 1
        n = sum(1 for m in messages if m.get("role") == "assistant")
        entry = self.script[n] if n < len(self.script) else "Done."
        if isinstance(entry, str):
            return {"role": "assistant", "content": entry}
        return {"role": "assistant", "content": None, "tool_calls": copy.deepcopy(list(entry))}


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """What the human is asked: approve this call?"""

    session_id: str
    tool: str
    arguments: Mapping[str, Any]
    tool_call_id: str
    execution_id: str | None  # None in the legacy engine: it has no execution identity
    position: CallPosition


class Human(Protocol):
    """Answers approvals: ``"approve"``, ``"reject"``, or ``None`` (not yet)."""

    def decide(self, request: ApprovalRequest) -> str | None: ...


class ScriptedHuman:
    """Answers approvals from a script (in order), then with ``default``.

    ``asked`` records every request, so tests can see which calls were put to
    the human (and which silently reused an old answer).
    """

    def __init__(self, answers: Sequence[str | None] = (), default: str | None = "approve") -> None:
        for a in (*answers, default):
            if a not in ("approve", "reject", None):
                raise InvalidInput(f"a human answers 'approve', 'reject' or None, not {a!r}")
        self.answers = list(answers)
        self.default = default
        self.asked: list[ApprovalRequest] = []

    def decide(self, request: ApprovalRequest) -> str | None:
        self.asked.append(request)
        return self.answers.pop(0) if self.answers else self.default


@dataclass
class InboxItem:
    """A legacy Inbox approval item (``coworker/inbox.py``), keyed as there."""

    id: str
    session_id: str
    tool_call_id: str
    tool: str
    arguments: dict[str, Any]
    state: str = "pending"  # pending | resolved
    resolution: str | None = None  # allow | deny


@dataclass
class _Checkpoint:
    messages: list[Message] = field(default_factory=list)
    inbox: list[InboxItem] = field(default_factory=list)


class ConversationStore(Protocol):
    """Where the engine checkpoints a session's conversation and (legacy) inbox."""

    def load_messages(self, session_id: str) -> list[Message]: ...
    def save_messages(self, session_id: str, messages: Sequence[Message]) -> None: ...
    def load_inbox(self, session_id: str) -> list[InboxItem]: ...
    def save_inbox(self, session_id: str, items: Sequence[InboxItem]) -> None: ...


def _inbox_json(items: Sequence[InboxItem]) -> str:
    return json.dumps([vars(i) for i in items], sort_keys=True)


def _inbox_from(text: str) -> list[InboxItem]:
    return [InboxItem(**d) for d in json.loads(text)]


class MemoryConversationStore:
    """Checkpoints kept as JSON text in memory: survive an engine, not the process."""

    def __init__(self) -> None:
        self._messages: dict[str, str] = {}
        self._inbox: dict[str, str] = {}
        self.saves = 0

    def load_messages(self, session_id: str) -> list[Message]:
        messages: list[Message] = json.loads(self._messages.get(session_id, "[]"))
        return messages

    def save_messages(self, session_id: str, messages: Sequence[Message]) -> None:
        self._messages[session_id] = json.dumps(list(messages))
        self.saves += 1

    def load_inbox(self, session_id: str) -> list[InboxItem]:
        return _inbox_from(self._inbox.get(session_id, "[]"))

    def save_inbox(self, session_id: str, items: Sequence[InboxItem]) -> None:
        self._inbox[session_id] = _inbox_json(items)


class FileConversationStore:
    """Checkpoints as JSON files in ``directory``, replaced atomically and fsynced.

    (openworker appends JSONL without fsync; the kit writes whole files with
    rename so that a SIGKILL test measures the protocol, not torn files.)
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, session_id: str, kind: str) -> Path:
        safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in session_id)
        return self.directory / f"{safe}.{kind}.json"

    def _write(self, path: Path, text: str) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=path.name, suffix=".tmp")
        try:
            os.write(fd, text.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        dfd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def load_messages(self, session_id: str) -> list[Message]:
        path = self._path(session_id, "messages")
        messages: list[Message] = json.loads(path.read_text("utf-8")) if path.exists() else []
        return messages

    def save_messages(self, session_id: str, messages: Sequence[Message]) -> None:
        self._write(self._path(session_id, "messages"), json.dumps(list(messages)))

    def load_inbox(self, session_id: str) -> list[InboxItem]:
        path = self._path(session_id, "inbox")
        return _inbox_from(path.read_text("utf-8")) if path.exists() else []

    def save_inbox(self, session_id: str, items: Sequence[InboxItem]) -> None:
        self._write(self._path(session_id, "inbox"), _inbox_json(items))
