"""Legacy adoption never hands a protected call an interactive tool's inline answer.

A legacy message (recorded before the ledger owned identity) is adopted with
its answered calls written settled, their old tool messages as results.  The
old engine answered interactive tools (``ask_user``) inline, and an OpenAI
stream gives every call the id ``""``: the ``""`` answer after such a message
may be the interactive call's.  Written as the email's result, it would
settle an approved email that may never have been sent (the model told
"the user answered", no human asked).  The protected call must stay
unanswered and be recovered by its policy (an approved legacy call halts for
a human).  ``legacy_held`` tells adoption which calls the engine answers
itself; without it, an answer an id cannot place settles nothing
(docs/protocol.md#placing-a-response).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

import toolledger._core.legacy
from toolledger import InvalidInput, MemoryStore, Next, Session

EMAIL = {"id": "", "function": {"name": "send_email", "arguments": '{"to": "ada"}'}}
ASK = {"id": "", "function": {"name": "ask_user", "arguments": '{"question": "who?"}'}}
INLINE = {"role": "tool", "tool_call_id": "", "content": '{"answer": "ada"}'}


def engines_own(tc: Mapping[str, Any]) -> bool:
    return bool(tc["function"]["name"] != "ask_user")  # ask_user: answered inline, not the ledger's


def adopt(calls: list[dict[str, Any]], held: bool) -> Session:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "email someone"},
                {"role": "assistant", "tool_calls": calls}, INLINE]
    extra: dict[str, Any] = {"legacy_held": engines_own} if held else {}
    return Session.open(MemoryStore(), "s1", {"send_email": "manual"},
                        legacy_messages=messages, legacy_approvals={"": "approved"}, **extra)


def the_email(s: Session) -> Any:
    [email] = [c for c in s.ledger.state.calls if c.tool.name == "send_email"]
    return email


@pytest.mark.parametrize("order", ["email first", "ask first"])
@pytest.mark.parametrize("held", [True, False], ids=["legacy_held", "default"])
def test_an_inline_answer_with_the_empty_id_never_settles_the_email(
    order: str, held: bool
) -> None:
    calls = [EMAIL, ASK] if order == "email first" else [ASK, EMAIL]
    s = adopt(calls, held)
    email = the_email(s)
    assert email.result is None  # not answered by ask_user's answer
    ours = [EMAIL] if held else calls  # the calls the glue records
    statuses = s.record(ours, seen=[])
    [status] = [st for st in statuses if st.call.name == "send_email"]
    assert status.key == email.execution_id  # the legacy call, re-recorded
    assert status.next is Next.HALTED and status.recovered  # its policy: a human decides
    assert status.result is None
    done = s.resolve(status.key, "applied", result="ada has it (checked)")
    assert done.next is Next.RESULT and done.result_value() == "ada has it (checked)"


def test_with_legacy_held_the_engines_calls_are_not_adopted() -> None:
    s = adopt([ASK, EMAIL], held=True)
    assert [(c.position, c.tool.name) for c in s.ledger.state.calls] == [((1, 0), "send_email")]


def test_an_answer_the_ids_can_place_still_settles_its_call() -> None:
    # the email answered (its own id), ask_user's inline answer with its own: adoption
    # writes the email settled with its answer, nothing is asked again
    email = {**EMAIL, "id": "call_e"}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "x"},
                {"role": "assistant", "tool_calls": [{**ASK, "id": "call_a"}, email,
                                                     {**EMAIL, "id": "call_f"}]},
                {"role": "tool", "tool_call_id": "call_a", "content": "inline"},
                {"role": "tool", "tool_call_id": "call_e", "content": "sent"}]
    s = Session.open(MemoryStore(), "s1", {"send_email": "manual"}, legacy_messages=messages,
                     legacy_held=engines_own)
    sent, open_ = s.ledger.state.calls
    assert sent.result is not None and sent.result.content == "sent"
    assert open_.result is None and open_.position == (1, 1)  # slots among held calls


def test_legacy_held_must_be_callable() -> None:
    with pytest.raises(InvalidInput, match="legacy_held"):
        Session.open(MemoryStore(), "s1", legacy_messages=[{"role": "user"}],
                     legacy_held="ask_user")  # type: ignore[arg-type]


def test_control_pairing_by_slot_order_settles_the_email_with_the_inline_answer(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    # broken on purpose (the pairing before this change): the n-th answer with an id
    # is the n-th call with it, whoever's answer it was
    def by_slot(ids: list[str], held: list[bool], answers: list[tuple[Any, str]]) -> list[
            str | None]:
        left = list(answers)
        out: list[str | None] = []
        for cid in ids:
            hit = next((a for a in left if a[0] == cid), None)
            if hit is not None:
                left.remove(hit)
            out.append(None if hit is None else hit[1])
        return out

    monkeypatch.setattr(toolledger._core.legacy, "pair_answers", by_slot)
    email = the_email(adopt([EMAIL, ASK], held=False))
    assert email.result is not None and email.result.content == INLINE["content"]
