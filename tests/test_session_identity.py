"""The ledger owns a call's identity: re-recording, placing, superseding, finding (issue 23).

Under test (docs/protocol.md#placing-a-response,
docs/protocol.md#superseding-a-lost-response): re-recording any recorded
message writes nothing, on every store; ``record(calls, seen=...)`` places
a response at the ledger's own sequence number, never reused; a response
the history shows follows the latest one is new even when its calls are
identical (Gemini's ``call_0``); a re-emission replacing a lost response
supersedes it (void rows), never a dead end, and a call of it that IS a
dispatched call of the lost response gets that call's identity; ``find``;
``resolve("applied")`` without a result text.

Oracles: the store's commit counters (a re-record commits nothing), what a
restarted process reads back, the external system's own count of requests
(never two for one approval), and controls that show each rule is what
decides (the same scenario with the other signal takes the other branch).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_store_suite import Backend, store_factory  # noqa: F401  (the fixture: every store)

from toolledger import Attempt, CallStatus, InvalidInput, Next, Session, SqliteStore, Tool
from toolledger._core.ledger import SAME_CALL, SUPERSEDED
from toolledger._core.protocol import ResultKind
from toolledger._core.session import APPLIED_NO_TEXT
from toolledger._core.stores import MemoryStore, Store

SID = "conv"
SEND = {"id": "call_0", "name": "send_email", "arguments": {"to": "ada", "body": "hi"}}
OTHER = {"id": "call_0", "name": "send_email", "arguments": {"to": "bob", "body": "yo"}}
READ = {"id": "call_1", "name": "read_file", "arguments": {"path": "a.txt"}}
TOOLS: dict[str, Tool | str] = {"send_email": "manual", "read_file": "readonly",
                                "create_ticket": Tool(policy="idempotent",
                                                      requires_approval=False)}


class Crash(BaseException):
    """The process dies here."""


class Outbox:
    """The external system: every request that reached it."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def tool(self, crash: bool = False) -> Callable[[Attempt], str]:
        def send(a: Attempt) -> str:
            self.sent.append((a.execution_id, dict(a.arguments)))
            if crash:
                raise Crash("the process dies with the request out")
            return json.dumps({"sent": a.arguments.get("to", a.arguments.get("title"))})

        return send


def counts(store: Store) -> tuple[int, int]:
    return store.commits, store.ledger_commits


def run_approved(s: Session, status: CallStatus, outbox: Outbox) -> CallStatus:
    if status.next is Next.AWAIT_APPROVAL:
        status = s.approve(status.key)
    assert status.next is Next.EXECUTE, status
    return s.execute(status.key, outbox.tool())


# --------------------------------------------------------------------------
# 1. Re-recording writes nothing, on every store
# --------------------------------------------------------------------------


def test_rerecording_any_settled_message_writes_nothing(store_factory: Backend) -> None:  # noqa: F811
    store = store_factory.new()
    outbox = Outbox()
    s = Session.open(store, SID, TOOLS)
    first = [run_approved(s, st, outbox) for st in s.record(1, [SEND])]
    second = [run_approved(s, st, outbox) for st in s.record(2, [OTHER, READ])[:1]]
    s.execute(s.record(2, [OTHER, READ])[1].key, lambda a: "file text")
    third = s.record(3, [READ])
    s.execute(third[0].key, lambda a: "file text")
    before = counts(store)
    # the bug of issue 23 point 3: message 1 is behind the working set now
    again = s.record(1, [SEND])
    assert [(st.key, st.next, st.result) for st in again] == [
        (first[0].key, Next.RESULT, first[0].result)]
    assert again[0].result is not None and json.loads(again[0].result.content) == {"sent": "ada"}
    # a restarted process (another handle on the same store) re-records every message
    other = store_factory.new()
    r = Session.open(other, SID, TOOLS)
    other_before = counts(other)
    for seq, calls in ((1, [SEND]), (2, [OTHER, READ]), (3, [READ]), (1, [SEND])):
        statuses = r.record(seq, calls)
        assert all(st.next is Next.RESULT for st in statuses), statuses
    assert r.record(2, [OTHER, READ])[0].key == second[0].key
    assert counts(store) == before and counts(other) == other_before
    assert len(outbox.sent) == 2  # nothing ran again
    # control: other calls at a recorded number are refused, nothing written
    with pytest.raises(InvalidInput, match="already recorded with other calls"):
        r.record(1, [OTHER])
    with pytest.raises(InvalidInput, match="already recorded with other calls"):
        r.record(2, [OTHER])  # fewer calls than recorded
    assert counts(other) == other_before


# --------------------------------------------------------------------------
# 2. The ledger's own sequence
# --------------------------------------------------------------------------


def test_the_ledger_assigns_the_sequence_in_the_record_commit(store_factory: Backend) -> None:  # noqa: F811
    store = store_factory.new()
    outbox = Outbox()
    s = Session.open(store, SID, TOOLS, lazy_create=True)
    assert counts(store) == (0, 0)
    # execute_message without seq: session created, message recorded at 0, dispatched: 1 tx
    [done] = s.execute_message([{"id": "t", "name": "create_ticket",
                                 "arguments": {"title": "disk"}}], outbox.tool(), seen=[])
    assert done.call.position == (0, 0) and done.next is Next.RESULT
    assert counts(store) == (2, 2)  # n + 1 commits for a new session's one protected call
    [st] = s.record([SEND], seen=[done.key])
    assert st.call.position == (1, 0)
    assert counts(store) == (3, 2)  # the record: one commit, no ledger record yet
    st = s.approve(st.key)
    before = counts(store)
    s.execute(st.key, outbox.tool())
    assert counts(store)[0] - before[0] == 2  # still two commits per protected call
    # an engine's own number still works, and the ledger's next number follows it
    [own] = s.record(10, [READ])
    s.execute(own.key, lambda a: "text")
    [nxt] = s.record([READ], seen=[own.key])
    assert nxt.call.position == (11, 0)
    # a restarted process reads the same sequence back from the store
    r = Session.open(store_factory.new(), SID, TOOLS)
    assert r.ledger.next_turn() == 12
    with pytest.raises(InvalidInput, match="needs seen="):
        r.record([READ])


def test_a_number_is_never_reused_after_a_response_is_superseded() -> None:
    store = MemoryStore()
    s = Session.open(store, SID, TOOLS)
    [lost] = s.record([SEND], seen=[])
    [new] = s.record([OTHER], seen=[])  # the history lost the first response
    assert (lost.call.position, new.call.position) == ((0, 0), (1, 0))
    assert Session.open(store, SID, TOOLS).ledger.next_turn() == 2
    [third] = s.record([SEND], seen=[])  # lost again: a third number
    assert third.call.position == (2, 0) and third.key not in (lost.key, new.key)


# --------------------------------------------------------------------------
# 3. Placement without aliasing
# --------------------------------------------------------------------------


def test_a_deliberate_repeat_of_call_0_runs_again() -> None:
    store, outbox = MemoryStore(), Outbox()
    s = Session.open(store, SID, TOOLS)
    [a] = s.record([SEND], seen=[])
    a = run_approved(s, a, outbox)
    # the model saw the result (the history holds it before the response) and repeats
    [b] = s.record([SEND], seen=[a.key])
    assert b.key != a.key and b.next is Next.AWAIT_APPROVAL
    b = run_approved(s, b, outbox)
    assert [eid for eid, _ in outbox.sent] == [a.key, b.key]
    # control: the same repeat where the history holds no result before it is a
    # re-record of the latest response (a resume): nothing written, a's status back
    store2, outbox2 = MemoryStore(), Outbox()
    s2 = Session.open(store2, SID, TOOLS)
    [a2] = s2.record([SEND], seen=[])
    a2 = run_approved(s2, a2, outbox2)
    before = counts(store2)
    [again] = s2.record([SEND], seen=[])
    assert (again.key, again.next, counts(store2)) == (a2.key, Next.RESULT, before)
    assert len(outbox2.sent) == 1


def test_the_latest_response_is_new_only_if_its_results_precede_it() -> None:
    store, outbox = MemoryStore(), Outbox()
    s = Session.open(store, SID, TOOLS)
    [a] = s.record([SEND], seen=[])
    a = run_approved(s, a, outbox)
    [b] = s.record([SEND], seen=[a.key])  # new: a's result is in the history before it
    before = counts(store)
    [b2] = s.record([SEND], seen=[a.key])  # b presented again (a resume): a re-record
    assert (b2.key, counts(store)) == (b.key, before)
    # a trim that dropped a's result AND its key (which the docs require a processor
    # to keep): nothing seen, so the place is the session start: a re-record of a,
    # its result back, nothing written and nothing sent (docs/protocol.md#placing-a-response)
    [b3] = s.record([SEND], seen=[])
    assert (b3.key, b3.next, counts(store), len(outbox.sent)) == (a.key, Next.RESULT, before, 1)
    b = run_approved(s, b, outbox)
    [c] = s.record([SEND], seen=[a.key, b.key])  # b's result seen: a third send
    assert c.key not in (a.key, b.key) and c.call.position == (2, 0)


def test_one_crash_losing_two_responses_sends_x_once() -> None:
    """LostTwoResponses (spec/ResponsePlacement.tla), on the real Session: the
    history is not saved before the model is asked again (pydantic-ai,
    LangGraph durability="exit"), so one crash loses two responses."""
    store, outbox = MemoryStore(), Outbox()
    s = Session.open(store, SID, TOOLS)
    [a] = s.record([SEND], seen=[])
    a = run_approved(s, a, outbox)  # (1) x sent under a's key
    [b] = s.record([SEND], seen=[a.key])  # (2) a deliberate repeat: new, not yet sent
    assert b.key != a.key and b.next is Next.AWAIT_APPROVAL
    # (3) the crash loses both responses; (4) the re-run model re-emits send(x) for the
    # first one, seen=[]: its place is the session start, the candidate a: a re-record
    r = Session.open(store, SID, TOOLS)
    before = counts(store)
    [a2] = r.record([SEND], seen=[])
    assert (a2.key, a2.next, counts(store)) == (a.key, Next.RESULT, before)
    assert [eid for eid, _ in outbox.sent] == [a.key]  # x sent once (the old rule: b's key)
    # the model sees a's result and repeats: b's place again, a re-record of b
    # (the first re-record after the restart applies its recovery decision: one commit)
    [b2] = r.record([SEND], seen=[a.key])
    assert b2.key == b.key and counts(store)[1] == before[1]
    run_approved(r, b2, outbox)
    assert [eid for eid, _ in outbox.sent] == [a.key, b.key]  # one send per intent


@pytest.mark.parametrize("store_kind", ["memory", "sqlite"])
def test_a_reemission_with_new_ids_supersedes_settled_responses_outside_the_working_set(
    store_kind: str, tmp_path: Path
) -> None:
    """LostTwoResponses with new ids: both lost responses (a settled, outside the
    ledger's working set; b recorded) are superseded in ONE commit, nothing is sent
    again, and the conversation goes on (was: InvalidInput, a Void naming no call)."""
    def opened() -> Store:
        return MemoryStore() if store_kind == "memory" else SqliteStore(tmp_path / "l.db")
    store, outbox = opened(), Outbox()
    s = Session.open(store, SID, TOOLS)
    [a] = s.record([SEND], seen=[])
    a = run_approved(s, a, outbox)
    [b] = s.record([SEND], seen=[a.key])  # a deliberate repeat, not yet approved
    store = store if store_kind == "memory" else opened()
    r = Session.open(store, SID, TOOLS)  # the crash lost both responses
    before = counts(store)
    fresh = {**SEND, "id": "toolu_7"}  # the re-run model: the same email, a new id
    [a2] = r.record([fresh], seen=[])
    assert counts(store) == (before[0] + 1, before[1])  # supersede both + record: ONE commit
    # the same call as a's (dispatched, settled): a's identity and result, never re-sent
    assert (a2.key, a2.next) == (a.key, Next.RESULT)
    assert [eid for eid, _ in outbox.sent] == [a.key]
    superseded = {row.execution_id for row in r.audit() if row.kind == SUPERSEDED}
    assert superseded == {a.key, b.key}
    assert r.pending_approvals() == []  # b, never dispatched, is voided
    [c] = r.record([OTHER], seen=[a2.key])  # the conversation goes on
    run_approved(r, c, outbox)
    assert [eid for eid, _ in outbox.sent] == [a.key, c.key]


def test_a_resume_after_a_crash_before_the_results_were_saved() -> None:
    store, outbox = MemoryStore(), Outbox()
    tools: dict[str, Tool | str] = {**TOOLS, "send_email": Tool(policy="idempotent",
                                                               requires_approval=False)}
    s = Session.open(store, SID, tools)
    with pytest.raises(Crash):
        s.execute_message([SEND], outbox.tool(crash=True), seen=[])
    r = Session.open(store, SID, tools)
    # the engine saved the response, not its result: it presents it again
    [st] = r.record([SEND], seen=[])
    assert (st.next, st.recovered) == (Next.RETRY, True)
    r.execute(st.key, outbox.tool())
    assert [eid for eid, _ in outbox.sent] == [st.key, st.key]  # same key: one effect


# --------------------------------------------------------------------------
# 4. Superseding a lost response
# --------------------------------------------------------------------------


def test_a_lost_response_never_dispatched_is_superseded_in_one_commit() -> None:
    store = MemoryStore()
    s = Session.open(store, SID, TOOLS)
    [lost] = s.record([SEND], seen=[])
    assert [r.key for r in s.pending_approvals()] == [lost.key]
    before = counts(store)
    new_id = {**OTHER, "id": "toolu_9"}
    [new] = s.record([new_id], seen=[])  # the model asked again; the history lost `lost`
    assert counts(store) == (before[0] + 1, before[1])  # void + record: ONE commit
    assert new.next is Next.AWAIT_APPROVAL and new.call.position == (1, 0)
    assert [r.key for r in s.pending_approvals()] == [new.key]
    rows = [row for row in s.audit() if row.kind == SUPERSEDED]
    assert [(row.execution_id, row.attempt) for row in rows] == [(lost.key, 0)]
    full = s.ledger.full_state()
    voided = full.call(lost.call.position)
    assert voided is not None and voided.result is not None
    assert voided.result.kind is ResultKind.CANCELLED
    # every retry of the same re-emission is a re-record: never a dead end, nothing written
    # (after a restart, the first one applies the waiting call's recovery decision, as
    # recover() would: one audited commit; then nothing)
    r = Session.open(store, SID, TOOLS)
    [again] = r.record([new_id], seen=[])
    assert (again.key, again.recovered) == (new.key, True)
    before = counts(store)
    for _ in range(3):
        [again] = r.record([new_id], seen=[])
        assert again.key == new.key
    assert counts(store) == before
    # a voided call never runs
    with pytest.raises(InvalidInput):
        s.approve(lost.key)


def test_a_dispatched_call_of_a_lost_response_keeps_its_identity_and_never_blocks() -> None:
    store, outbox = MemoryStore(), Outbox()
    tools: dict[str, Tool | str] = {**TOOLS, "send_email": Tool(policy="manual",
                                                               requires_approval=False)}
    s = Session.open(store, SID, tools)
    with pytest.raises(Crash):  # the email may be out; the framework never saved the response
        s.execute_message([SEND, READ], outbox.tool(crash=True), seen=[])
    lost_key = outbox.sent[0][0]
    r = Session.open(store, SID, tools)
    # the re-run model emits a new id for the same email, and a new call
    again = {**SEND, "id": "call_new"}
    ticket = {"id": "call_t", "name": "create_ticket", "arguments": {"title": "x"}}
    same, fresh = r.record([again, ticket], seen=[])
    assert same.key == lost_key and same.next is Next.HALTED  # its policy: a human decides
    assert fresh.key != lost_key and fresh.next is Next.EXECUTE
    assert [h.key for h in r.halted()] == [lost_key]
    kinds = {row.kind for row in r.audit()}
    assert {SUPERSEDED, SAME_CALL} <= kinds
    r.execute(fresh.key, outbox.tool())
    # the conversation goes on while the lost call waits for its human
    [nxt] = r.record([READ], seen=[same.key, fresh.key])
    assert nxt.call.position == (2, 0)
    r.execute(nxt.key, lambda a: "text")
    assert [eid for eid, _ in outbox.sent].count(lost_key) == 1  # never sent again
    # the human resolves it, with no result text to give
    done = r.resolve(lost_key, "applied")
    assert done.result is not None and done.result.content == APPLIED_NO_TEXT
    assert json.loads(APPLIED_NO_TEXT)["status"] == "applied"
    # re-recording the re-emission: its status follows the lost call's, nothing written
    before = counts(store)
    same2, fresh2 = Session.open(store, SID, tools).record(1, [again, ticket])
    assert (same2.key, same2.next, fresh2.key) == (lost_key, Next.RESULT, fresh.key)
    assert counts(store) == before


def test_an_idempotent_call_of_a_lost_response_is_retried_under_its_own_key() -> None:
    store, outbox = MemoryStore(), Outbox()
    tools: dict[str, Tool | str] = {**TOOLS, "send_email": Tool(policy="idempotent",
                                                               requires_approval=False)}
    s = Session.open(store, SID, tools)
    with pytest.raises(Crash):
        s.execute_message([SEND], outbox.tool(crash=True), seen=[])
    r = Session.open(store, SID, tools)
    # control: other arguments are another call; the lost one is retried by its policy
    [other] = r.record([{**OTHER, "id": "x"}], seen=[])
    lost = [st for st in r.recover() if st.key == outbox.sent[0][0]]
    assert [st.next for st in lost] == [Next.RETRY]
    r.execute(lost[0].key, outbox.tool())
    r.execute(other.key, outbox.tool())
    assert [eid for eid, _ in outbox.sent] == [lost[0].key, lost[0].key, other.key]


# --------------------------------------------------------------------------
# 5. find: by what the engine has
# --------------------------------------------------------------------------


def test_find_by_the_providers_call_with_or_without_its_response() -> None:
    store, outbox = MemoryStore(), Outbox()
    s = Session.open(store, SID, TOOLS)
    assert s.find(SEND) is None
    [a, b] = s.record([SEND, READ], seen=[])
    found = s.find(SEND, response=[SEND, READ])
    assert found is not None and found.key == a.key
    found_b = s.find(READ)
    assert found_b is not None and found_b.key == b.key
    run_approved(s, a, outbox)
    s.execute(b.key, lambda x: "t")
    [c] = s.record([SEND], seen=[a.key, b.key])  # call_0 again, a new call
    found = s.find(SEND)
    assert found is not None and (found.key, found.next) == (c.key, Next.AWAIT_APPROVAL)
    # the earlier message is settled behind the latest: not a call to act on any more
    assert s.find(SEND, response=[SEND, READ]) is None
    [old, _] = s.record(a.call.position[0], [SEND, READ])  # its status, by its number
    assert (old.key, old.next) == (a.key, Next.RESULT)
    before = counts(store)
    assert s.find(OTHER) is None and s.find(SEND, response=[SEND, OTHER]) is None
    assert counts(store) == before
    with pytest.raises(InvalidInput, match="not one of"):
        s.find(OTHER, response=[SEND])
