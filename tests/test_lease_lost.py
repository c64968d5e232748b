"""A Session that lost its lease stops; it does not reload and decide again.

spec/ConcurrentResumers.tla's ``Refused`` leaves the refused process idle: it
must take the session again.  A Session used to reload after every store
error, LeaseLost included, under its old epoch: its engine's next
``recover()`` decided again, every commit was refused, and the session stayed
busy with a worker that could never write (the liveness twin
ConcurrentLivenessRefusedReloads, which breaks EventuallyAnswered).
docs/protocol.md#concurrent-resumers.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from toolledger import AsyncSession, Next, Session
from toolledger._core.protocol import SessionState
from toolledger._core.stores import LeaseLost, MemoryStore, StaleState

SID = "s1"
CALL = {"id": "c", "name": "pay", "arguments": {"n": 1}}


class CountingStore(MemoryStore):
    """A MemoryStore that counts the session loads and the commits it is asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.loads = 0
        self.commits = 0

    def load_working_set(self, session_id: str) -> SessionState:
        self.loads += 1
        return super().load_working_set(session_id)

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        self.commits += 1
        return super().commit(*args, **kwargs)


def _two_workers() -> tuple[CountingStore, Session, Session, str]:
    """Worker a records a call, then worker b takes the session over."""
    store = CountingStore()
    Session.open(store, SID, {"pay": "idempotent"})
    a = Session.open(store, SID, {"pay": "idempotent"}, take_session=True)
    [status] = a.record(1, [CALL], requires_approval=[False])
    b = Session.open(store, SID, {"pay": "idempotent"}, take_session=True)
    return store, a, b, status.key


def test_the_stale_worker_stops_and_the_owner_finishes() -> None:
    store, a, b, key = _two_workers()
    effects: list[str] = []
    with pytest.raises(LeaseLost, match="epoch 2, this worker holds epoch 1") as first:
        a.execute(key, lambda at: effects.append("a"))
    assert "starts nothing more" in " ".join(first.value.__notes__)
    assert effects == []  # refused at its dispatched commit, before the body
    loads, commits = store.loads, store.commits
    # every later call that would start something: refused, the store untouched
    for attempt in (a.recover, lambda: a.execute(key, lambda at: effects.append("a")),
                    lambda: a.record(2, [{**CALL, "id": "d"}], requires_approval=[False])):
        with pytest.raises(LeaseLost, match=r"lost its lease .* open a new Session"):
            attempt()
    assert (store.loads, store.commits) == (loads, commits)
    # the owner is not held up by it
    [status] = b.recover()
    assert status.next is Next.EXECUTE
    def body(at: object) -> str:
        effects.append("b")
        return "ok"

    done = b.execute(key, body)
    assert done.next is Next.RESULT and effects == ["b"]
    # and the stale worker may own the session again only by taking it
    again = Session.open(store, SID, {"pay": "idempotent"}, take_session=True)
    assert [c.next for c in again.recover()] == [Next.RESULT]


def test_control_a_refused_compare_and_set_still_reloads() -> None:
    """Without the lease a refused commit is a stale read: the session reloads
    and recover() says what to do, as before."""
    store = CountingStore()
    Session.open(store, SID, {"pay": "idempotent"})
    a = Session.open(store, SID, {"pay": "idempotent"})
    [status] = a.record(1, [CALL], requires_approval=[False])
    b = Session.open(store, SID, {"pay": "idempotent"})
    b.recover()
    b.execute(status.key, lambda at: "ok")
    loads = store.loads
    with pytest.raises(StaleState) as refused:
        a.execute(status.key, lambda at: "again")
    assert not isinstance(refused.value, LeaseLost)
    assert store.loads == loads + 1  # reloaded
    assert [c.next for c in a.recover()] == [Next.RESULT]


def test_the_async_session_stops_too() -> None:
    async def scenario() -> None:
        store = MemoryStore()
        Session.open(store, SID, {"pay": "idempotent"})
        a = await AsyncSession.open(store, SID, {"pay": "idempotent"}, take_session=True)
        [status] = await a.record(1, [CALL], requires_approval=[False])
        Session.open(store, SID, {"pay": "idempotent"}, take_session=True)
        with pytest.raises(LeaseLost):
            await a.execute(status.key, lambda at: "ok")
        with pytest.raises(LeaseLost, match="lost its lease"):
            await a.recover()

    asyncio.run(scenario())
