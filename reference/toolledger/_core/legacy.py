"""Legacy adoption: the calls of a session that ran without the ledger, put under it.

Private module of :mod:`toolledger`, behind :meth:`~toolledger._core.session.Session.adopt`
(and :meth:`~toolledger._core.session.Session.open` with ``legacy_messages``).
:func:`legacy_calls` finds, in plain message dicts, every call no tool message
answered (validating every call before anything is written), and the answered
calls of the same messages with their answers; :func:`write_legacy` writes
the unanswered ones as the spec's initial legacy state and the answered ones
settled, so that a partly answered message keeps slots 0..n-1 and is found by
a re-record (docs/protocol.md#placing-a-response).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from .call_input import parse_call
from .calls import _UNDECLARED, Tool
from .ledger import Ledger
from .protocol import (
    ApprovalState,
    CallPosition,
    CallState,
    InvalidInput,
    MessageState,
    ResultKind,
    Stage,
    ToolProfile,
    ToolResult,
    args_digest,
    derive_execution_id,
)

__all__ = ["LEGACY_APPROVALS", "LegacyCall", "legacy_calls", "write_legacy"]


@dataclass(frozen=True, slots=True)
class LegacyCall:
    position: CallPosition
    tool_call_id: str
    profile: ToolProfile
    arguments: dict[str, Any]
    approval: ApprovalState | None
    # the content of the tool message that answered it before the ledger (None: open)
    answer: str | None = None


LEGACY_APPROVALS: Final = {
    "approved": ApprovalState.APPROVED,
    "rejected": ApprovalState.REJECTED,
    "pending": ApprovalState.PENDING,
}


def legacy_calls(
    messages: Sequence[Mapping[str, Any]],
    tools: Mapping[str, Tool],
    approvals: Mapping[str, str],
) -> list[LegacyCall]:
    if isinstance(messages, Mapping) or not isinstance(messages, Sequence):
        raise InvalidInput("messages must be a list of message dicts")
    for cid, value in approvals.items():
        if value not in LEGACY_APPROVALS:
            raise InvalidInput(f"approval of {cid!r} is {value!r}; use one of "
                               f"{', '.join(LEGACY_APPROVALS)}")
    out = []
    for turn, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise InvalidInput(f"message {turn} is not a dict: {m!r}")
        raw = m.get("tool_calls") or []
        if m.get("role") != "assistant" or not raw:
            continue
        if not isinstance(raw, Sequence):
            raise InvalidInput(f"message {turn}: tool_calls must be a list")
        # answered: a tool message with the id before the next assistant message; the
        # n-th answer with an id is the n-th call with it (ids repeat: "" in a stream)
        answers: dict[object, list[str]] = {}
        for later in messages[turn + 1:]:
            if isinstance(later, Mapping) and later.get("role") == "assistant":
                break
            if isinstance(later, Mapping) and later.get("role") == "tool":
                answers.setdefault(later.get("tool_call_id"), []).append(
                    _content(later.get("content")))
        found = []
        for slot, call in enumerate(raw):
            try:
                cid, name, args = parse_call(slot, call)
            except InvalidInput as exc:
                raise InvalidInput(f"message {turn}: {exc}") from None
            answer = answers[cid].pop(0) if answers.get(cid) else None
            tool = tools.get(name, _UNDECLARED)
            state = approvals.get(cid) if answer is None else None
            found.append(LegacyCall((turn, slot), cid, tool.profile(name), args,
                                    None if state is None else LEGACY_APPROVALS[state], answer))
        if any(lc.answer is None for lc in found):  # a message with an open call, whole
            out += found
    return out


def _content(content: object) -> str:
    return content if isinstance(content, str) else json.dumps(content, default=str)


def write_legacy(ledger: Ledger, calls: Sequence[LegacyCall]) -> None:
    """The spec's initial state of legacy calls: durable, no record, maybe approved.

    An answered call (``answer``) is written settled, its answer as its result:
    it has run and is never run again.  The core has no event that adds a
    legacy call (they exist from ``Init``), so they go to the store in one
    commit, with no audit row."""
    if not calls:
        return
    sid = ledger.session_id
    before = ledger.state
    states, approvals, digests = [], {}, {}
    for lc in calls:
        eid = derive_execution_id(sid, *lc.position, lc.tool_call_id)
        digest = args_digest(lc.profile.name, lc.arguments)
        if lc.answer is not None:
            states.append(CallState(lc.position, lc.tool_call_id, lc.profile, eid, digest,
                                    MessageState.DURABLE,
                                    ToolResult(ResultKind.OK, eid, digest, lc.answer)))
            continue
        states.append(CallState(lc.position, lc.tool_call_id, lc.profile, eid,
                                digest, MessageState.DURABLE, None, Stage.RESUME))
        if lc.approval is not None and lc.profile.requires_approval:
            # the old engine's approval was given for the call's own arguments
            approvals[eid], digests[eid] = lc.approval, digest
    after = replace(before, calls=tuple(states), approvals=approvals,
                    approval_digests=digests)
    ledger.store.commit(sid, before, after, [],
                        arguments={lc.position: lc.arguments for lc in calls})
