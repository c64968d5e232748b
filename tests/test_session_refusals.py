"""Bad arguments to ``execute`` / ``reconcile`` are refused before anything is written,
and a stale state met through a :class:`~toolledger.Session` says what its user does.

Oracles: the store's own commit counter (``MemoryStore.commits``: one per
durable transaction), the audit rows, and what the call does afterwards: an
approval that was not used up still lets the call run once, with the effect
counted by the tool itself.  The control (a non-callable handed straight to the
dispatch block, as ``execute`` did before the check) shows the harm the check
prevents: a commit, the approval used up, a manual call halted.
"""

from __future__ import annotations

from typing import Any

import pytest

from toolledger import (
    Attempt,
    InvalidInput,
    MemoryStore,
    Next,
    Session,
    StaleState,
    WasApplied,
)

CALL = {"id": "call_0", "name": "send_email", "arguments": {"to": "ada"}}


def approved(store: MemoryStore, policy: str = "manual") -> tuple[Session, str]:
    s = Session.open(store, "s1", {"send_email": policy})
    [call] = s.record(1, [CALL])
    s.approve(call.key)
    return s, call.key


@pytest.mark.parametrize("fn", ["not callable", None, 42, ["a", "list"]])
def test_execute_refuses_a_non_callable_before_the_dispatch_commit(fn: Any) -> None:
    store = MemoryStore()
    s, key = approved(store)
    commits, rows = store.commits, len(s.audit())
    with pytest.raises(InvalidInput, match=r"fn must be a callable.*nothing was written"):
        s.execute(key, fn)
    assert store.commits - commits == 0
    assert len(s.audit()) == rows
    assert s.status(key).next is Next.EXECUTE  # not halted, not dispatched
    sent: list[int] = []

    def send(a: Attempt) -> str:
        sent.append(a.attempt)
        return "sent"

    done = s.execute(key, send)  # the approval still works
    assert (done.next, sent) == (Next.RESULT, [1])


def test_the_control_without_the_check_uses_up_the_approval_and_halts() -> None:
    """What ``execute(key, "not callable")`` did before the check: the body fails
    after ``dispatched`` is durable, so a manual call halts for a human."""
    store = MemoryStore()
    s, key = approved(store)
    commits, fn = store.commits, "not callable"
    with s.dispatch(key) as a:
        a.done(fn(a))  # type: ignore[operator]
    # dispatched(attempt 1), then the unknown outcome's decision: two commits
    assert store.commits - commits == 2
    assert s.status(key).next is Next.HALTED
    assert [r.kind for r in s.audit()][-2:] == ["dispatch", "recovery_required"]


@pytest.mark.parametrize("key", [7, None, b"bytes", "no-such-key"])
def test_execute_and_dispatch_refuse_a_key_that_names_no_call(key: Any) -> None:
    store = MemoryStore()
    s, real = approved(store)
    commits = store.commits
    with pytest.raises(InvalidInput):
        s.execute(key, lambda a: "sent")
    with pytest.raises(InvalidInput), s.dispatch(key) as a:
        a.done("sent")
    assert store.commits - commits == 0
    assert s.status(real).next is Next.EXECUTE


def test_reconcile_refuses_a_non_callable_ask_before_anything_is_written() -> None:
    store = MemoryStore()
    s, key = approved(store, "reconcile")
    with pytest.raises(KeyboardInterrupt), s.dispatch(key):
        raise KeyboardInterrupt  # the process dies with the request out
    s = Session.open(store, "s1", {"send_email": "reconcile"})
    [todo] = s.recover()
    assert todo.next is Next.RECONCILE
    commits = store.commits
    with pytest.raises(InvalidInput, match=r"ask must be a callable.*nothing was written"):
        s.reconcile(key, "not callable")  # type: ignore[arg-type]
    assert store.commits - commits == 0
    assert s.status(key).next is Next.RECONCILE  # not halted: the connector can still answer
    done = s.reconcile(key, lambda call, attempt: WasApplied("sent"))
    assert done.next is Next.RESULT


def test_a_stale_state_through_a_session_says_recover_and_recover_works() -> None:
    """Two restarted workers on one store: the one that commits second loses the race.
    Its error tells a Session user to call recover() (never the internal
    Ledger.reload() alone); doing so gives the call's truth, and it runs once."""
    store = MemoryStore()
    approved(store, "idempotent")
    tools = {"send_email": "idempotent"}
    a, b = Session.open(store, "s1", tools), Session.open(store, "s1", tools)
    [winner] = a.recover()
    rows = len(a.audit())
    with pytest.raises(StaleState) as info:
        b.recover()
    assert "call recover()" in str(info.value)
    assert len(b.audit()) == rows  # the loser wrote nothing
    [todo] = b.recover()  # as the message says: the session reloaded, recover() decides
    assert (todo.key, todo.next) == (winner.key, Next.EXECUTE)
    effects: list[int] = []

    def send(at: Attempt) -> str:
        effects.append(at.attempt)
        return "sent"

    assert b.execute(todo.key, send).next is Next.RESULT
    assert effects == [1]
