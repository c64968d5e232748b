"""A legacy session's trailing message is found by ``record(calls, seen=...)``.

``Session.open(legacy_messages=...)`` writes a session's unanswered calls at
legacy positions (message index, slot), before the protocol marker; an engine
that places its responses by the ledger (``record(calls, seen=keys)``) then
re-records its trailing message on resume.  That must find the legacy calls
(their recovery decision: an approved, unanswered call halts for a human, it
is never replayed), and a later response must be new, in the same identity
scheme.  Also ``CallStatus.result_value``, for engines whose results are dicts.
"""

from __future__ import annotations

from typing import Any

import pytest

import toolledger._core.session
from toolledger import InvalidInput, MemoryStore, Next, NotApplied, Session
from toolledger._core.legacy import legacy_calls, pair_answers

SEND = {"id": "call_0", "name": "send_email", "arguments": {"to": "ada"}}
BOB = {"id": "call_1", "name": "send_email", "arguments": {"to": "bob"}}


def adopted(*calls: dict[str, Any], answered: tuple[str, ...] = ()) -> Session:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "email ada"},
        {"role": "assistant", "tool_calls": list(calls)},
        *({"role": "tool", "tool_call_id": cid, "content": "ok"} for cid in answered)]
    return Session.open(MemoryStore(), "s1", {"send_email": "manual"},
                        legacy_messages=messages, legacy_approvals={"call_0": "approved"})


def test_rerecording_the_trailing_legacy_message_finds_its_calls() -> None:
    s = adopted(SEND)
    [legacy] = s.ledger.state.calls
    [status] = s.record([SEND], seen=[])  # the engine resumes its trailing message
    assert status.key == legacy.execution_id and status.call.position == (1, 0)
    assert status.next is Next.HALTED and status.recovered  # approved, unanswered: a human
    assert len(s.ledger.state.calls) == 1  # nothing new was recorded
    assert s.record([SEND], seen=[])[0].key == legacy.execution_id  # again: the same
    done = s.resolve(status.key, "applied", result="ada has it")
    assert done.next is Next.RESULT
    # the history now holds its result (the key on the tool message): a new response,
    # even with the same call_0, gets a new key at the marker, and asks again
    [new] = s.record([SEND], seen=[status.key])
    assert new.key != status.key and new.call.position == (s.marker, 0)
    assert new.next is Next.AWAIT_APPROVAL


def test_without_the_legacy_candidate_the_resume_is_a_dead_end(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    # broken on purpose (the placement before this change): the trailing legacy
    # message is no candidate, so re-recording it is refused for good
    monkeypatch.setattr(toolledger._core.session, "_legacy_candidate", lambda turn: False)
    s = adopted(SEND)
    with pytest.raises(InvalidInput, match="unanswered"):
        s.record([SEND], seen=[])


def test_the_tool_message_lost_after_the_resolution_is_a_rerecord_not_a_new_call() -> None:
    s = adopted(SEND)
    [status] = s.record([SEND], seen=[])
    s.resolve(status.key, "applied")
    [again] = s.record([SEND], seen=[])  # crash before the engine saved the result
    assert again.key == status.key and again.next is Next.RESULT


def test_another_response_never_supersedes_an_open_legacy_call() -> None:
    s = adopted(SEND)
    with pytest.raises(InvalidInput, match="unanswered"):
        s.record([BOB], seen=[])
    [legacy] = s.ledger.state.calls
    assert legacy.result is None  # not voided: still halted for a human after recover
    assert [st.next for st in s.recover()] == [Next.HALTED]


def test_a_partly_answered_legacy_message_is_rerecorded_with_its_answer() -> None:
    # slot 0 was answered before the ledger: it is written settled, with the old
    # tool message's content as its result, so the message keeps its slots and the
    # engine's re-record finds both calls: the answered one is never run again
    s = adopted(BOB, {**SEND, "id": "call_2"}, answered=("call_1",))
    answered, open_ = s.record([BOB, {**SEND, "id": "call_2"}], seen=[])
    assert answered.next is Next.RESULT and answered.result_value() == "ok"
    assert answered.call.position == (1, 0) and open_.call.position == (1, 1)
    assert open_.next is Next.AWAIT_APPROVAL  # its approval was not in the old inbox
    assert [st.next for st in s.recover()] == [Next.RESULT, Next.AWAIT_APPROVAL]
    found = s.find({**SEND, "id": "call_2"})
    assert found is not None and found.key == open_.key  # one by one, too
    done = s.execute(s.approve(open_.key).key, lambda a: "sent")
    [new] = s.record([SEND], seen=[done.key])  # its result in the history: a new response
    assert new.call.position == (s.marker, 0) and new.next is Next.AWAIT_APPROVAL


def test_control_without_the_answered_call_the_legacy_message_is_a_dead_end(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    # broken on purpose (adoption before this change): only the unanswered call is
    # written, the message has a gap, is no candidate, and the resume is refused
    monkeypatch.setattr("toolledger._core.session.legacy_calls", lambda *a: [
        lc for lc in legacy_calls(*a) if lc.answer is None])
    s = adopted(BOB, {**SEND, "id": "call_2"}, answered=("call_1",))
    with pytest.raises(InvalidInput, match="unanswered"):
        s.record([BOB, {**SEND, "id": "call_2"}], seen=[])


def test_a_repeated_id_with_too_few_answers_answers_none_of_its_calls() -> None:
    # two calls with the id "" (an OpenAI stream), one tool message "": it may be
    # either call's (bob denied in phase A, before ada ran), so neither takes it;
    # both stay open and are recovered by their policy (tests/test_legacy_inline_answers.py)
    ada, bob = ({"id": "", "name": "send_email", "arguments": {"to": w}} for w in ("ada", "bob"))
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "email both"}, {"role": "assistant", "tool_calls": [ada, bob]},
        {"role": "tool", "tool_call_id": "", "content": "sent to ada"}]
    s = Session.open(MemoryStore(), "s1", {"send_email": "manual"}, legacy_messages=messages,
                     legacy_approvals={"": "approved"})
    first, second = s.record([ada, bob], seen=[])
    assert first.result is None and second.result is None
    assert first.next is Next.HALTED and second.next is Next.HALTED  # a human decides
    # as many answers as calls with the id: each call its own, in slot order
    assert pair_answers(["", ""], [True, True], [("", "to ada"), ("", "to bob")]) == [
        "to ada", "to bob"]
    assert pair_answers(["", ""], [True, False], [("", "inline")]) == [None, "inline"]


def test_result_value_decodes_json_and_keeps_text() -> None:
    s = Session.open(MemoryStore(), "s1", {"t": "idempotent"})
    calls = [{"id": str(i), "name": "t", "arguments": {"i": i}} for i in range(3)]
    statuses = s.record(calls, seen=[])
    assert all(st.next is Next.AWAIT_APPROVAL for st in statuses)
    with pytest.raises(InvalidInput, match="no result"):
        statuses[0].result_value()
    keys = [s.approve(st.key).key for st in statuses]
    assert s.execute(keys[0], lambda a: {"sent": True}).result_value() == {"sent": True}
    assert s.execute(keys[1], lambda a: "plain text").result_value() == "plain text"

    def refused(a: object) -> None:
        raise NotApplied("the server said no")

    failed = s.execute(keys[2], refused).result_value()
    assert failed["error_type"] == "NotApplied" and "said no" in failed["error"]
