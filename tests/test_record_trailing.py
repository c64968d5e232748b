"""``Session.record_trailing``: a chat history's trailing response, recorded and paired by key.

The seam every engine with an OpenAI-style message list re-implements
(docs/adopting.md#an-engine-with-openworkers-seams): find the last message
with tool calls, record the calls the ledger holds (placed by the ledger from
the :data:`~toolledger.SEEN` keys before it), and tell which of its calls
the tool messages after it answer, by key, never by a reused or empty id.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

import toolledger._core.session
from toolledger import SEEN, AsyncSession, InvalidInput, MemoryStore, Next, Session

ASK = {"id": "", "function": {"name": "ask_user", "arguments": '{"q": "who?"}'}}
EMAIL = {"id": "", "function": {"name": "send_email", "arguments": '{"to": "ada"}'}}


def held(tc: Mapping[str, Any]) -> bool:
    return bool(tc["function"]["name"] == "send_email")  # ask_user: the engine's own


def history() -> list[dict[str, Any]]:
    return [{"role": "user", "content": "email someone"},
            {"role": "assistant", "tool_calls": [ASK, EMAIL]},
            {"role": "tool", "tool_call_id": "", "content": "ada"}]  # ask_user's, inline


def test_the_inline_answer_with_the_empty_id_never_answers_the_ledger_call() -> None:
    s = Session.open(MemoryStore(), "s1", {"send_email": "manual"})
    messages = history()
    t = s.record_trailing(messages, held=held)
    ask, email = t.statuses
    assert t.index == 1 and t.calls == (ASK, EMAIL) and not t.stale
    assert ask is None and email is not None
    assert email.next is Next.AWAIT_APPROVAL and t.answered == (True, False)
    assert t.unanswered() == [1]  # the resume re-drives the email
    assert s.record_trailing(messages, held=held).statuses[1] == email  # again: no write
    assert len(s.ledger.state.calls) == 1
    done = s.execute(s.approve(email.key).key, lambda a: "sent")
    messages.append({"role": "tool", "tool_call_id": "", "content": "sent", SEEN: done.key})
    t = s.record_trailing(messages, held=held)  # one key, not in a list: read the same
    assert t.answered == (True, True) and t.unanswered() == []
    assert t.statuses[1] is not None and t.statuses[1].next is Next.RESULT
    # the next response: the model saw the email's result (its key), a new call
    messages += [{"role": "assistant", "tool_calls": [EMAIL]}]
    [again] = s.record_trailing(messages, held=held).statuses
    assert again is not None and again.key != done.key


def test_a_user_message_after_it_is_a_finished_turn_nothing_recorded() -> None:
    s = Session.open(MemoryStore(), "s1", {"send_email": "manual"})
    t = s.record_trailing([*history(), {"role": "user", "content": "thanks"}], held=held)
    assert t.stale and t.statuses == (None, None) and t.unanswered() == []
    assert s.ledger.state.calls == ()
    assert s.record_trailing([{"role": "user", "content": "hi"}]).index == -1


def test_requires_approval_is_asked_per_held_call() -> None:
    s = Session.open(MemoryStore(), "s1", {"send_email": "manual"})
    asked: list[str] = []

    def granted(tc: Mapping[str, Any]) -> bool:
        asked.append(tc["function"]["name"])
        return False  # a standing grant: no approval needed

    [_, email] = s.record_trailing(history(), held=held, requires_approval=granted).statuses
    assert asked == ["send_email"] and email is not None and email.next is Next.EXECUTE


def test_async_session_awaits_it() -> None:
    async def main() -> tuple[Any, ...]:
        s = await AsyncSession.open(MemoryStore(), "s1", {"send_email": "manual"})
        return (await s.record_trailing(history(), held=held)).statuses

    ask, email = asyncio.run(main())
    assert ask is None and email is not None and email.next is Next.AWAIT_APPROVAL


def test_bad_input_is_refused_and_nothing_is_recorded() -> None:
    s = Session.open(MemoryStore(), "s1", {"send_email": "manual"})
    with pytest.raises(InvalidInput, match="list of message dicts"):
        s.record_trailing({"role": "user"})  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="held must be a function"):
        s.record_trailing(history(), held="send_email")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="must be a list of ledger keys"):
        s.record_trailing([{"role": "tool", SEEN: 7}, {"role": "assistant",
                                                         "tool_calls": [EMAIL]}])
    with pytest.raises(InvalidInput, match="tool_calls must be a list"):
        s.record_trailing([{"role": "assistant", "tool_calls": "send_email"}])
    assert s.ledger.state.calls == ()


def test_control_pairing_by_id_takes_the_inline_answer_for_the_email(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    # broken on purpose: answered by any tool message with the call's id
    monkeypatch.setattr(toolledger._core.session, "answered_calls", lambda calls, results: [
        cid in {r for r, _ in results} for cid, _ in calls])
    s = Session.open(MemoryStore(), "s1", {"send_email": "manual"})
    t = s.record_trailing(history(), held=held)
    assert t.answered == (True, True) and t.unanswered() == []  # the email never re-driven
