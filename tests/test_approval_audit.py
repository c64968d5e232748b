"""Who approved (``approve/reject(key, by=...)``) and approvals that expire.

Every human answer to an approval gets its own audit row (kinds ``approved`` /
``rejected``; ``approval_expired`` when an approval ran out before its call was
dispatched), who gave it and until when in the structured note: no schema
change, on every store.  Expiry is decided where a call is about to be
dispatched, with the session's clock (injected here: no sleeps).  An expired
approval authorizes nothing; the call waits for a new approval (or a rejection,
which cancels it): the spec's approval stays ``approved``, the engine just never
takes ``EnginePersistDispatched`` on it (docs/protocol.md#approvals-that-expire).
Oracles: the stored audit rows, the calls the tool saw, ``Next``, the CLI's output.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from pg_cluster import PgCluster
from toolledger import (
    AsyncSession,
    Attempt,
    InvalidInput,
    MemoryStore,
    Next,
    PostgresStore,
    Session,
    SqliteStore,
    Tool,
)
from toolledger._core.protocol import ApprovalState, Authorization
from toolledger._core.stores import Store

CALL = {"id": "call_0", "name": "send_email", "arguments": {"to": "ada"}}
T0 = 1_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def opened(store: Store, clock: Clock, **options: Any) -> Session:
    return Session.open(store, "s1", {"send_email": "manual"}, clock=clock, **options)


def mailer(sent: list[str]) -> Any:
    def send(a: Attempt) -> str:
        sent.append(a.call.arguments["to"])
        return "sent"
    return send


def rows(store: Store) -> list[tuple[str, int, str, str | None, float | None]]:
    return [(r.kind, r.attempt, r.authorization.value, r.by, r.expires_at)
            for r in store.audit("s1")]


# -- who approved --------------------------------------------------------------------------


def test_who_approved_and_who_rejected_are_durable_rows(tmp_path: Path) -> None:
    db, clock, sent = tmp_path / "l.db", Clock(), list[str]()
    with SqliteStore(db) as store:
        s = opened(store, clock)
        a, b = s.record(0, [CALL, {**CALL, "id": "call_1", "arguments": {"to": "bob"}}])
        s.approve(a.key, by="alice", note="checked the address")
        s.reject(b.key, by="carol")
        s.execute(a.key, mailer(sent))
    with SqliteStore(db) as store:  # reopened: what a later process reads
        store.verify()  # the full check (verify-store) accepts the approval rows
        got = {(r.execution_id, r.kind): r for r in store.audit("s1")}
        approved, rejected = got[(a.key, "approved")], got[(b.key, "rejected")]
        assert (approved.by, approved.human_note, approved.authorization) == (
            "alice", "checked the address", Authorization.HUMAN)
        assert (rejected.by, rejected.human_note) == ("carol", "rejected by a human")
        assert approved.attempt == rejected.attempt == 1  # the first round of each
        assert approved.expires_at is None  # no ttl anywhere: it holds until the call runs
        [kinds] = [[r.kind for r in store.audit("s1") if r.execution_id == a.key]]
        assert kinds == ["approved", "dispatch"]  # the approval before what it authorized
    assert sent == ["ada"]


def test_bad_attributions_and_expiries_are_refused_before_anything_is_written() -> None:
    store, clock = MemoryStore(), Clock()
    s = opened(store, clock)
    [st] = s.record(0, [CALL])
    before = (store.commits, store.audit("s1"))
    for bad in ({"by": ""}, {"by": "a\nb"}, {"by": 7}, {"expires_at": "tomorrow"},
                {"expires_at": float("nan")}, {"expires_at": True}, {"note": None}):
        with pytest.raises(InvalidInput) as err:
            s.approve(st.key, **bad)
        assert "nothing was" in str(err.value) or "must be" in str(err.value)
    with pytest.raises(InvalidInput, match="by must name"):
        s.reject(st.key, by=" ")
    assert (store.commits, store.audit("s1")) == before
    assert s.status(st.key).next is Next.AWAIT_APPROVAL
    bad_ttls: list[Any] = [0, -1, "1h", float("inf")]
    for ttl in bad_ttls:
        with pytest.raises(InvalidInput, match="approval_ttl must be a positive number"):
            Tool("manual", approval_ttl=ttl)
        with pytest.raises(InvalidInput, match="approval_ttl must be a positive number"):
            opened(store, clock, approval_ttl=ttl)


def test_async_session_records_who_and_expires_the_same_way() -> None:
    store, clock, sent = MemoryStore(), Clock(), list[str]()

    async def main() -> tuple[Next, Next, Next]:
        s = await AsyncSession.open(store, "s1", {"send_email": "manual"}, clock=clock,
                                    approval_ttl=60)
        [st] = await s.record(0, [CALL])
        await s.approve(st.key, by="alice")
        clock.now += 61
        with pytest.raises(InvalidInput, match="approval expired"):
            await s.execute(st.key, mailer(sent))
        waiting = (await s.status(st.key)).next
        again = (await s.approve(st.key, by="bob")).next
        return waiting, again, (await s.execute(st.key, mailer(sent))).next

    assert asyncio.run(main()) == (Next.AWAIT_APPROVAL, Next.EXECUTE, Next.RESULT)
    assert sent == ["ada"]
    assert rows(store) == [("approved", 1, "human", "alice", T0 + 60),
                           ("approval_expired", 1, "none", None, None),
                           ("approved", 2, "human", "bob", T0 + 61 + 60),
                           ("dispatch", 1, "approval", None, None)]


# -- approvals that expire -----------------------------------------------------------------


def test_an_approval_not_dispatched_before_it_expires_is_not_used() -> None:
    store, clock, sent = MemoryStore(), Clock(), list[str]()
    s = opened(store, clock, approval_ttl=300)
    [st] = s.record(0, [CALL])
    assert s.approve(st.key, by="alice").next is Next.EXECUTE
    clock.now += 299.9  # the control: just before it expires, it holds
    assert s.status(st.key).next is Next.EXECUTE
    clock.now += 0.1    # expired at the dispatch: refused, audited once, nothing sent
    for _ in range(2):
        with pytest.raises(InvalidInput, match="approval expired before it was dispatched"):
            s.execute(st.key, mailer(sent))
    assert sent == [] and [r[0] for r in rows(store)] == ["approved", "approval_expired"]
    assert s.status(st.key).next is Next.AWAIT_APPROVAL
    assert [c.key for c in s.pending_approvals()] == [st.key]  # back in the inbox
    assert s.ledger.state.approval(st.key) is ApprovalState.APPROVED  # the spec's state
    s.approve(st.key, by="bob", expires_at=clock.now + 5)  # a new approval, its own expiry
    assert s.execute(st.key, mailer(sent)).next is Next.RESULT and sent == ["ada"]
    assert rows(store)[2:] == [("approved", 2, "human", "bob", clock.now + 5),
                               ("dispatch", 1, "approval", None, None)]


def test_expiry_survives_a_restart_and_is_decided_by_the_process_that_dispatches() -> None:
    store, clock, sent = MemoryStore(), Clock(), list[str]()
    s = opened(store, clock)
    [st] = s.record(0, [CALL])
    s.approve(st.key, by="alice", expires_at=T0 + 60)
    # a restarted engine before the expiry runs the call on that approval
    early = opened(store, clock)
    early.recover()
    assert early.status(st.key).next is Next.EXECUTE
    # one after it: the expiry is read from the audit, the call is not run
    clock.now = T0 + 60
    late = opened(store, clock)
    [after] = late.recover()
    assert after.next is Next.EXECUTE  # recover() never dispatches; the dispatch decides
    with pytest.raises(InvalidInput, match="approval expired"):
        late.execute(st.key, mailer(sent))
    assert sent == [] and opened(store, clock).recover()[0].next is Next.AWAIT_APPROVAL
    # approved again right after a restart (the call not recovered yet): its recovery
    # decision and the new approval are one commit, and the call runs on the new one
    again = opened(store, clock)
    assert again.approve(st.key, by="carol").next is Next.EXECUTE
    assert again.execute(st.key, mailer(sent)).next is Next.RESULT and sent == ["ada"]


def test_rejecting_an_expired_approval_cancels_the_call() -> None:
    store, clock, sent = MemoryStore(), Clock(), list[str]()
    s = opened(store, clock, approval_ttl=10)
    [st] = s.record(0, [CALL])
    s.approve(st.key, by="alice")
    clock.now += 10
    with pytest.raises(InvalidInput, match="approval expired"):
        s.execute(st.key, mailer(sent))
    done = s.reject(st.key, by="bob", note="too late now")
    assert done.next is Next.RESULT and done.result is not None
    assert done.result.kind.value == "cancelled"  # the spec's HumanCancel: never dispatched
    assert [r[:4] for r in rows(store)] == [("approved", 1, "human", "alice"),
                                            ("approval_expired", 1, "none", None),
                                            ("human_cancel", 0, "human", None),
                                            ("rejected", 2, "human", "bob")]
    with pytest.raises(InvalidInput, match="already has its result"):
        s.execute(st.key, mailer(sent))
    assert sent == []


def test_a_batch_stops_at_the_expired_call_after_running_the_ones_before() -> None:
    store, clock, sent = MemoryStore(), Clock(), list[str]()
    tools: dict[str, Tool | str] = {"send_email": Tool("manual", approval_ttl=30),
                                    "post": "manual"}
    s = Session.open(store, "s1", tools, clock=clock, approval_ttl=3600)
    a, b = s.record(0, [CALL, {"id": "call_1", "name": "post", "arguments": {"to": "bob"}}])
    s.approve(a.key, by="alice")  # the tool's 30 s, not the session's hour
    s.approve(b.key, by="alice")
    assert [r.expires_at for r in store.audit("s1")] == [T0 + 30, T0 + 3600]
    clock.now += 31
    # b runs; its success commit would carry a's dispatched (execute_many's chaining):
    # a's approval expired, so it is not dispatched, and execute(a) refuses, as for
    # any call not approved
    with pytest.raises(InvalidInput, match="approval expired"):
        s.execute_many([(b.key, mailer(sent)), (a.key, mailer(sent))])
    assert sent == ["bob"] and s.status(a.key).next is Next.AWAIT_APPROVAL
    assert [r.kind for r in store.audit("s1")] == [
        "approved", "approved", "dispatch", "approval_expired"]


# -- PostgreSQL ----------------------------------------------------------------------------


def test_postgresql_keeps_who_and_the_expiry(pg_cluster: PgCluster) -> None:
    schema, clock, sent = f"t_{uuid.uuid4().hex[:16]}", Clock(), list[str]()
    with PostgresStore(pg_cluster.conninfo, schema=schema) as store:
        s = opened(store, clock)
        a, b = s.record(0, [CALL, {**CALL, "id": "call_1", "arguments": {"to": "bob"}}])
        s.approve(a.key, by="alice", expires_at=T0 + 60)
        s.reject(b.key, by="carol")
    clock.now = T0 + 60
    with PostgresStore(pg_cluster.conninfo, schema=schema) as store:
        late = opened(store, clock)  # another process: reads the expiry from the audit
        late.recover()
        with pytest.raises(InvalidInput, match="approval expired"):
            late.execute(a.key, mailer(sent))
        late.approve(a.key, by="dan")
        assert late.execute(a.key, mailer(sent)).next is Next.RESULT
    with PostgresStore(pg_cluster.conninfo, schema=schema) as store:
        assert [(r.kind, r.attempt, r.by, r.expires_at) for r in store.audit("s1")] == [
            ("approved", 1, "alice", T0 + 60), ("rejected", 1, "carol", None),
            ("execute", 0, None, None),  # late's recover(): the decision for the restart
            ("approval_expired", 1, None, None), ("approved", 2, "dan", None),
            ("dispatch", 1, None, None)]
    assert sent == ["ada"]


# -- the on-call commands show who ---------------------------------------------------------


def toolledger(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "toolledger.cli", *args], capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def test_status_and_halted_show_who_approved_and_an_expired_approval(tmp_path: Path) -> None:
    db, clock, sent = tmp_path / "l.db", Clock(), list[str]()
    with SqliteStore(db) as store:
        s = opened(store, clock, approval_ttl=60)
        a, b, c = s.record(0, [CALL, {**CALL, "id": "call_1"}, {**CALL, "id": "call_2"}])
        s.approve(a.key, by="alice")
        s.approve(b.key, by="bob")
        s.reject(c.key, by="carol")
        clock.now += 60
        with pytest.raises(InvalidInput, match="approval expired"):
            s.execute(b.key, mailer(sent))
    shown = toolledger("status", str(db), "s1")
    assert shown.returncode == 0, shown.stderr
    line = {k: next(x for x in shown.stdout.splitlines() if k in x) for k in (a.key, b.key,
                                                                              c.key)}
    assert line[a.key].endswith("[approved by alice, until 1970-01-12T13:47:40Z]")
    assert "its approval expired" in line[b.key] and line[b.key].endswith("[approval expired]")
    assert line[c.key].endswith("[rejected by carol]")
    halted = toolledger("halted", str(db))
    assert halted.returncode == 3 and halted.stdout.splitlines()[-1] == (
        "0 halted, 1 waiting for approval")
    assert b.key in halted.stdout and "[approval expired]" in halted.stdout


def approved_without_a_row(store: Store) -> str:
    """A call approved the way stores were before approvals had audit rows: the
    spec's HumanApprove alone, committed through the ledger (no ``approved`` row)."""
    from toolledger._core.protocol import Action, Event

    s = Session.open(store, "s1", {"send_email": "manual"})
    [st] = s.record(0, [CALL])
    ledger = s._ledger  # the older engine's write path: the step, no row
    ledger.step(Event(Action.HumanApprove, st.call.position))
    assert ledger.state.approval(st.call.key) is ApprovalState.APPROVED
    assert not [r for r in store.audit("s1") if r.kind in ("approved", "approval_expired")]
    return st.call.key


def test_an_approval_from_before_approval_rows_expires_under_a_ttl() -> None:
    """Its time is unknown, so under an approval_ttl it cannot be shown to hold:
    it fails closed (expires before dispatch, round 0) and a new approval runs the
    call.  The control: without an expiry it holds, as every approval does."""
    store, clock, sent = MemoryStore(), Clock(), list[str]()
    key = approved_without_a_row(store)
    s = opened(store, clock, approval_ttl=3600)
    [st] = s.recover()  # the upgraded engine restarts: the call is live, approved
    assert st.next is Next.EXECUTE
    with pytest.raises(InvalidInput, match="approval expired before it was dispatched"):
        s.execute(key, mailer(sent))
    assert sent == []
    [row] = [r for r in store.audit("s1") if r.kind == "approval_expired"]
    assert row.attempt == 0 and "no approved row" in row.note
    assert s.status(key).next is Next.AWAIT_APPROVAL
    s.approve(key, by="alice")  # round 1, with its row and its expiry
    assert s.execute(key, mailer(sent)).next is Next.RESULT
    assert sent == ["ada"]

    control, sent2 = MemoryStore(), list[str]()
    key2 = approved_without_a_row(control)
    plain = opened(control, clock)
    [st] = plain.recover()
    assert plain.execute(key2, mailer(sent2)).next is Next.RESULT
    assert sent2 == ["ada"]
