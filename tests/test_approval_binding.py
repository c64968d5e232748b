"""Approvals and records bound to the arguments (issue 23, points 5 and 6).

Under test: ``Session.execute(key, fn, arguments=...)`` /
``Session.dispatch(key, arguments=...)`` refuse to run a call with other
arguments than the recorded (and approved) ones, before ``dispatched`` is
written; and an approval read back from a store is bound to its call's digest
(``stored_approval_digests``), so a restarted engine dispatches on it exactly
as the one that parked it.  The closed-world side (the spec's
``ApprovalBoundToArgs``, its twin ``ApprovalByPosition``) is in
tests/test_lost_conversation.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toolledger import Attempt, InvalidInput, MemoryStore, Next, Session, SqliteStore, Tool
from toolledger._core.stores import Store

SID = "s1"
ARGS = {"to": "ada@example.com", "subject": "Q3"}
CALL = {"id": "call_0", "name": "send_email", "arguments": ARGS}


def _approved(store: Store) -> tuple[Session, str]:
    s = Session.open(store, SID, {"send_email": "manual"})
    [st] = s.record(1, [CALL])
    assert st.next is Next.AWAIT_APPROVAL
    s.approve(st.key)
    return s, st.key


def test_other_arguments_are_refused_before_anything_is_written() -> None:
    store = MemoryStore()
    s, key = _approved(store)
    commits, sent = store.commits, []

    def send(a: Attempt) -> str:
        sent.append(dict(a.arguments))
        return "sent"

    other = {**ARGS, "subject": "Q4"}
    with pytest.raises(InvalidInput) as err:
        s.execute(key, send, arguments=other)
    msg = str(err.value)
    assert "'subject'" in msg and "approved and recorded" in msg
    assert "nothing was written or run" in msg and "have that one approved" in msg
    assert sent == [] and store.commits == commits
    assert [row.kind for row in s.audit()] == ["approved"] and s.status(key).next is Next.EXECUTE
    with pytest.raises(InvalidInput, match="'cc'"), s.dispatch(key, arguments={**ARGS, "cc": "x"}):
        raise AssertionError("the body must not run")  # pragma: no cover
    assert store.commits == commits
    # the recorded arguments (given or not) run, once
    assert s.execute(key, send, arguments=dict(ARGS)).next is Next.RESULT
    assert sent == [ARGS] and [row.kind for row in s.audit()] == ["approved", "dispatch"]


@pytest.mark.parametrize("bad", [["to"], {"to": object()}])
def test_arguments_that_are_no_json_mapping_are_refused(bad: Any) -> None:
    s, key = _approved(MemoryStore())
    with pytest.raises(InvalidInput, match="nothing was written or run"):
        s.execute(key, lambda a: "sent", arguments=bad)
    assert s.status(key).next is Next.EXECUTE


def test_a_call_needing_no_approval_is_checked_against_its_record() -> None:
    s = Session.open(MemoryStore(), SID,
                     {"send_email": Tool(policy="idempotent", requires_approval=False)})
    [st] = s.record(1, [CALL])
    with pytest.raises(InvalidInput) as err:
        s.execute(st.key, lambda a: "sent", arguments={"to": "eve@example.com"})
    assert "recorded ones" in str(err.value) and "approved" not in str(err.value)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_an_approval_read_back_from_a_store_is_bound_to_its_call(
        tmp_path: Path, kind: str) -> None:
    """The stores keep no digest column: the approval's digest is its durable
    call's, read back on load, so a restarted engine dispatches on it."""
    store: Store = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "l.db")
    s, key = _approved(store)
    state = s.ledger.state
    eid_digest = {c.execution_id: c.args_digest for c in state.calls}
    assert dict(state.approval_digests) == eid_digest
    loaded = store.load(SID)
    assert dict(loaded.approval_digests) == eid_digest
    again = Session.open(store, SID, {"send_email": "manual"})
    [st] = again.recover()
    assert st.next is Next.EXECUTE
    assert again.execute(key, lambda a: "sent").next is Next.RESULT
