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
from collections.abc import Callable, Mapping, Sequence
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

__all__ = ["LEGACY_APPROVALS", "LegacyCall", "legacy_calls", "pair_answers", "write_legacy"]


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
    held: Callable[[Mapping[str, Any]], bool] | None = None,
) -> list[LegacyCall]:
    """The legacy calls of ``messages`` (see the module docstring), validated.

    ``held(call)``: whether the ledger holds that call (as the engine's
    ``record`` would be given it); ``False``: the engine's own (an interactive
    tool answered inline, a malformed or unknown call), not adopted, not
    validated, and its answer is its own (:func:`pair_answers`).  ``None``:
    every call is held.  Held calls keep their order, at slots 0..n-1 of the
    message, as the engine records them."""
    if isinstance(messages, Mapping) or not isinstance(messages, Sequence):
        raise InvalidInput("messages must be a list of message dicts")
    if held is not None and not callable(held):
        raise InvalidInput(f"legacy_held must be a function of one call dict, returning "
                           f"whether the ledger holds it, got {held!r}; nothing was written")
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
        answers: list[tuple[object, str]] = []  # before the next assistant message
        for later in messages[turn + 1:]:
            if isinstance(later, Mapping) and later.get("role") == "assistant":
                break
            if isinstance(later, Mapping) and later.get("role") == "tool":
                answers.append((later.get("tool_call_id"), _content(later.get("content"))))
        ours = [held is None or bool(held(call)) for call in raw]
        ids = [call.get("id") if isinstance(call, Mapping) else None for call in raw]
        paired = pair_answers(["" if i is None else i for i in ids], ours, answers)
        found: list[LegacyCall] = []
        for j, call in enumerate(raw):
            if not ours[j]:
                continue
            try:
                cid, name, args = parse_call(len(found), call)
            except InvalidInput as exc:
                raise InvalidInput(f"message {turn}: {exc}") from None
            answer = paired[j]
            tool = tools.get(name, _UNDECLARED)
            state = approvals.get(cid) if answer is None else None
            found.append(LegacyCall((turn, len(found)), cid, tool.profile(name), args,
                                    None if state is None else LEGACY_APPROVALS[state], answer))
        if any(lc.answer is None for lc in found):  # a message with an open call, whole
            out += found
    return out


def pair_answers(
    ids: Sequence[str], held: Sequence[bool], answers: Sequence[tuple[object, str]]
) -> list[str | None]:
    """The answer of each call of one message (``None``: unanswered), by id.

    ``answers``: ``(tool_call_id, content)`` of the tool messages after it.  An
    answer goes first to a call the ledger does not hold (``held`` False: the
    engine answered it inline, as :func:`~toolledger.answered_calls` pairs a
    live history).  Then, among held calls, the n-th answer with an id is the
    n-th call with it; but where fewer answers than held calls share an id
    (``""`` from a stream), none of those calls takes one: whose answer it is
    cannot be told, and a guessed answer would be written as the call's
    result forever.  Unanswered, the call is recovered by its policy."""
    left: dict[object, list[str]] = {}
    for cid, content in answers:
        left.setdefault(cid, []).append(content)
    out: list[str | None] = [None] * len(ids)
    for j in [j for j, h in enumerate(held) if not h]:
        if left.get(ids[j]):
            out[j] = left[ids[j]].pop(0)
    ours = [j for j, h in enumerate(held) if h]
    enough = {ids[j]: len(left.get(ids[j], [])) >= sum(ids[k] == ids[j] for k in ours)
              for j in ours}  # counted before any is taken
    for j in ours:
        if enough[ids[j]]:
            out[j] = left[ids[j]].pop(0)
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
