"""The session's new owner makes its lease epoch known on every request.

Under test: ``Session.open(..., take_session=True, announce_epoch=...)`` (the
spec's ``AnnounceEpoch``, spec/ConcurrentResumers.tla), ``CallRef.epoch`` on
the reconcile query and ``Attempt.epoch`` on the tool body, against the
epoch-aware ``PaymentsFake``.  Oracles: the fake's effect count and the calls
the hook receives.  The scenario is the one the ``EpochOnQueryOnly`` twin
finds: a worker declared dead between its dispatched commit and its send sends
after the new owner's human resolved the call; with the announcement the
request is refused, and the control without it (an epoch-blind client, or no
hook) lets it land.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from toolledger import (
    CallRef,
    InvalidInput,
    MemoryStore,
    NotAppliedFenced,
    Session,
    StaleState,
    Tool,
)
from toolledger.kit.connectors import EpochBlindPaymentsClient, PaymentsClient, PaymentsFake

SID = "epochs"
TOOLS = {"charge": Tool(policy="manual", requires_approval=False)}
CALL = {"id": "call_0", "name": "charge", "arguments": {"amount": 5}}


def _stale_send_after_resolution(fake: PaymentsFake, client: PaymentsClient,
                                 announce: bool) -> tuple[int, list[tuple[str, int]]]:
    """The stale worker dispatches, the owner takes over and its human says
    "abandon", then the stale worker sends: the effects and the announcements."""
    store = MemoryStore()
    [st] = Session.open(store, SID, TOOLS).record(1, [CALL])
    stale = Session.open(store, SID, TOOLS, take_session=True)
    stale.recover()
    seen: list[tuple[str, int]] = []

    def hook(call: CallRef, epoch: int) -> None:
        seen.append((call.key, epoch))
        client.announce_epoch(call, epoch)

    with pytest.raises(StaleState), stale.dispatch(st.key) as attempt:
        owner = Session.open(store, SID, TOOLS, take_session=True,
                             announce_epoch=hook if announce else None)
        owner.recover()  # manual, dispatched: halted for a human
        owner.resolve(st.key, "abandon")
        with contextlib.suppress(Exception):
            client.charge(attempt)  # the stale worker's request leaves now
        attempt.done(None)  # its outcome's commit is refused: the lease
    return fake.effects(st.key), seen


def test_the_announced_epoch_refuses_the_stale_workers_request(tmp_path: Path) -> None:
    fake = PaymentsFake(tmp_path / "p.sqlite3")
    effects, seen = _stale_send_after_resolution(fake, PaymentsClient(fake), announce=True)
    assert effects == 0
    assert [epoch for _, epoch in seen] == [2]  # the owner's, once, for the dispatched call


@pytest.mark.parametrize("how", ["no_announcement", "epoch_blind_client"])
def test_control_without_the_announcement_the_request_lands(tmp_path: Path, how: str) -> None:
    fake = PaymentsFake(tmp_path / "p.sqlite3")
    client = EpochBlindPaymentsClient(fake) if how == "epoch_blind_client" else PaymentsClient(fake)
    effects, _ = _stale_send_after_resolution(fake, client, announce=how != "no_announcement")
    assert effects == 1  # applied after a human abandoned the call


def test_the_reconcile_query_carries_the_epoch(tmp_path: Path) -> None:
    fake = PaymentsFake(tmp_path / "p.sqlite3")
    client = PaymentsClient(fake)
    store = MemoryStore()
    tools = {"charge": Tool(policy="reconcile", requires_approval=False)}
    [st] = Session.open(store, SID, tools).record(1, [CALL])
    s = Session.open(store, SID, tools, take_session=True)
    s.recover()
    asked: list[int | None] = []

    def ask(call: CallRef, attempt: int) -> NotAppliedFenced:
        asked.append(call.epoch)
        answer = client.reconcile(call, attempt)
        assert isinstance(answer, NotAppliedFenced)
        return answer

    with pytest.raises(StaleState), s.dispatch(st.key) as attempt:
        s2 = Session.open(store, SID, tools, take_session=True)
        [c] = s2.recover()
        assert s2.reconcile(c.key, ask).next.value == "retry"
        with contextlib.suppress(Exception):
            client.charge(attempt)  # epoch 1, after the query told the fake epoch 2
        attempt.done(None)
    assert asked == [2]
    assert fake.effects(st.key) == 0


def test_announce_without_the_lease_is_refused_before_anything_is_written() -> None:
    store = MemoryStore()
    Session.open(store, SID, TOOLS)
    before = store.commits if hasattr(store, "commits") else None
    with pytest.raises(InvalidInput, match="needs take_session=True"):
        Session.open(store, SID, TOOLS, announce_epoch=lambda call, epoch: None)
    with pytest.raises(InvalidInput, match="must be callable"):
        Session.open(store, SID, TOOLS, take_session=True, announce_epoch="hook")  # type: ignore[arg-type]
    assert store.lease_epoch(SID) == 0  # the lease was not taken either
    if before is not None:
        assert store.commits == before
