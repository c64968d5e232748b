"""HumanCancel: a user's Stop after approval but before dispatch (issue 11, item 9).

The core gives the call a ``cancelled`` result and re-decides it (``Recover``:
``skip``); it is never dispatched afterwards.  ``CancelledNeverInvoked`` is
shown to catch an engine whose dispatch ignores the Stop (the
``CancelIgnored`` twin's switch, done to the Python core); the result kind
round-trips through both stores; the kit engine's Stop cancels the calls of
a message not dispatched yet.
"""

from __future__ import annotations

import sqlite3
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from checker_support import ROOT
from toolledger._core import protocol as p
from toolledger._core.ledger import Ledger
from toolledger._core.sqlite_store import SCHEMA_VERSION, SqliteStore
from toolledger._core.stores import MemoryStore, Store, UnsupportedSchema
from toolledger._core.tools import ToolRegistry
from toolledger.check.invariants import CancelledNeverInvoked, check_all
from toolledger.check.system import ModelConfig, initial_states, successors
from toolledger.kit.engine import (
    MemoryConversationStore,
    ScriptedHuman,
    ScriptedProvider,
    TurnEngine,
    TurnStatus,
    tool_call,
)
from toolledger.kit.external import CountingAdapter, CountingExternalSystem

A = p.Action
MAIL = p.ToolProfile("send_email", p.RecoveryPolicy.MANUAL, True)
LOOKUP = p.ToolProfile("lookup", p.RecoveryPolicy.READONLY, False)
POS = (1, 0)


def _live(tool: p.ToolProfile = MAIL, *, approve: bool = True) -> p.SessionState:
    s = p.new_session("s1")
    s = p.apply(s, p.Event(A.ProviderEmitCall, POS, "", tool, p.args_digest(tool.name, {})))
    s = p.apply(s, p.Event(A.EnginePersistCall, POS))
    if tool.requires_approval:
        s = p.apply(s, p.Event(A.EngineParkApproval, POS))
        if approve:
            s = p.apply(s, p.Event(A.HumanApprove, POS))
    return s


def _call(s: p.SessionState) -> p.CallState:
    c = s.call(POS)
    assert c is not None
    return c


def test_cancel_gives_a_cancelled_result_and_recover_skips_it() -> None:
    s = p.apply(_live(), p.Event(A.HumanCancel, POS))
    c = _call(s)
    assert c.result is not None and c.result.kind is p.ResultKind.CANCELLED
    assert (c.result.execution_id, c.result.args_digest) == (c.execution_id, c.args_digest)
    assert c.stage is p.Stage.RESUME
    assert (c.execution_id, "human_cancel", 0) in s.audit
    assert p.decide_recovery(p.recovery_inputs(s, c)).decision is p.Decision.SKIP
    s = p.apply(s, p.Event(A.Recover, POS))
    assert _call(s).stage is p.Stage.NONE
    assert s.record(c.execution_id).status is p.LedgerStatus.NONE  # never dispatched
    # never dispatched afterwards: not live, not after a crash either
    assert not p.enabled(s, p.Event(A.EnginePersistDispatched, POS))
    crashed = p.apply(s, p.Event(A.Crash))
    assert _call(crashed).stage is p.Stage.NONE
    assert not p.enabled(crashed, p.Event(A.EnginePersistDispatched, POS))
    assert not p.enabled(crashed, p.Event(A.HumanCancel, POS))


def test_a_readonly_call_and_an_auto_call_can_be_cancelled() -> None:
    for tool in (LOOKUP, p.ToolProfile("charge", p.RecoveryPolicy.IDEMPOTENT, False)):
        s = p.apply(_live(tool), p.Event(A.HumanCancel, POS))
        assert _call(s).result is not None


@pytest.mark.parametrize(
    ("prepare", "why"),
    [
        (lambda: _live(approve=False), "not approved"),
        (lambda: p.apply(_live(), p.Event(A.EnginePersistDispatched, POS)), "stage is dispatched"),
        (lambda: p.apply(_live(), p.Event(A.HumanCancel, POS)), "stage is resume"),
        (lambda: p.new_session("s1"), "no call at that position"),
    ],
)
def test_cancel_is_refused_unless_approved_and_never_dispatched(prepare: Any, why: str) -> None:
    s = prepare()
    with pytest.raises(p.ProtocolError, match=why):
        p.apply(s, p.Event(A.HumanCancel, POS))


# -- the Python invariant catches the CancelIgnored variant ----------------------------


@contextmanager
def _dispatch_ignores_the_stop() -> Iterator[None]:
    """The twin's switch, done to the core: the cancel leaves the engine's stage LIVE."""
    original = p._HANDLERS[A.HumanCancel]

    def broken(state: p.SessionState, ev: p.Event) -> p.SessionState:
        after = original(state, ev)
        c = after.call(ev.position) if ev.position is not None else None
        assert c is not None
        return after._with_call(replace(c, stage=p.Stage.LIVE))

    p._HANDLERS[A.HumanCancel] = broken
    try:
        yield
    finally:
        p._HANDLERS[A.HumanCancel] = original


def _first_violation(cfg: ModelConfig, name: str, limit: int = 20000) -> list[str]:
    seen: set[str] = set()
    queue = deque(initial_states(cfg))
    while queue and len(seen) < limit:
        s = queue.popleft()
        problems = check_all(cfg, s).get(name)
        if problems:
            return problems
        for _, nxt in successors(cfg, s):
            key = repr(nxt)
            if key not in seen:
                seen.add(key)
                queue.append(nxt)
    return []


def test_cancelled_never_invoked_catches_a_dispatch_that_ignores_the_stop() -> None:
    cfg = ModelConfig.from_mc_module(ROOT / "model" / "MCCancelIgnored.tla")
    assert _first_violation(cfg, "CancelledNeverInvoked") == []  # the real core
    with _dispatch_ignores_the_stop():
        problems = _first_violation(cfg, "CancelledNeverInvoked")
    assert problems and "cancelled, yet" in problems[0], problems


def test_cancelled_never_invoked_reads_the_invocation_history() -> None:
    cfg = ModelConfig.from_mc_module(ROOT / "model" / "MCDeepManual.tla")
    s = initial_states(cfg)[0]
    while True:  # drive c1 to a cancel along the first path that has one
        options = dict(successors(cfg, s))
        if A.HumanCancel in options:
            s = options[A.HumanCancel]
            break
        s = next(nxt for a, nxt in successors(cfg, s) if a is not A.Crash)
    assert CancelledNeverInvoked(cfg, s) == []
    eid = cfg.exec_ids["c1"]
    forged = replace(s, ghosts=replace(s.ghosts, invocations={
        "c1": frozenset({(eid, 1, p.Authorization.AUTO)})}))
    assert CancelledNeverInvoked(cfg, forged) == ["c1: cancelled, yet attempt(s) [1] were invoked"]


# -- stores and the Ledger facade ---------------------------------------------------------


def _stores(tmp_path: Path) -> list[tuple[str, Store]]:
    return [("memory", MemoryStore()), ("sqlite", SqliteStore(tmp_path / "l.db"))]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_ledger_cancel_round_trips_through_the_store(tmp_path: Path, kind: str) -> None:
    store = dict(_stores(tmp_path))[kind]
    ledger = Ledger.create(store, "s1")
    ledger.step(p.Event(A.ProviderEmitCall, POS, "", MAIL, p.args_digest("send_email", {})),
                arguments={})
    ledger.step(p.Event(A.EnginePersistCall, POS))
    ledger.step(p.Event(A.EngineParkApproval, POS))
    ledger.step(p.Event(A.HumanApprove, POS))
    state = ledger.cancel(POS, note="the user pressed Stop")
    c = state.call(POS)
    assert c is not None and c.stage is p.Stage.NONE
    again = Ledger(store, "s1").full_state().call(POS)  # what a restarted process reads
    assert again is not None and again.result is not None
    assert again.result.kind is p.ResultKind.CANCELLED
    assert again.result.content == "cancelled by the user"
    assert again.stage is p.Stage.NONE  # it has a result: nothing to recover
    rows = [(r.kind, r.attempt, r.authorization, r.note) for r in ledger.audit()]
    assert rows == [("human_cancel", 0, p.Authorization.HUMAN, "the user pressed Stop")]
    before = ledger.audit()
    with pytest.raises(p.ProtocolError, match="stage is none"):
        ledger.cancel(POS)
    assert ledger.audit() == before  # refused: nothing written
    store.close()


def test_a_version_2_sqlite_file_is_refused_by_name(tmp_path: Path) -> None:
    """Version 2 files cannot hold a cancelled result (their CHECK list lacks it)."""
    assert SCHEMA_VERSION >= 3  # 5 since the records keep their first dispatch time
    path = tmp_path / "old.db"
    SqliteStore(path).close()
    raw = sqlite3.connect(path)
    raw.execute("UPDATE meta SET schema_version = 2")
    raw.commit()
    raw.close()
    with pytest.raises(UnsupportedSchema, match="schema version 2") as refused:
        SqliteStore(path)
    assert (refused.value.found, refused.value.supported) == (2, SCHEMA_VERSION)


# -- the kit engine's Stop ----------------------------------------------------------------


def test_the_engines_stop_cancels_the_calls_not_dispatched_yet() -> None:
    """Two calls of one message, ids "": Stop while the first runs; the second is
    cancelled, never sent, and the turn ends stopped."""
    email = CountingExternalSystem()
    holder: dict[str, TurnEngine] = {}

    class StopWhileRunning(CountingAdapter):
        def invoke(self, *args: Any, **kw: Any) -> Any:
            holder["engine"].request_stop()  # the user presses Stop meanwhile
            return super().invoke(*args, **kw)

    registry = ToolRegistry()
    registry.register("send_email", StopWhileRunning(email, "send_email"), policy="manual")
    registry.register("charge", CountingAdapter(email, "charge"), policy="idempotent",
                      requires_approval=False)
    store, conversations = MemoryStore(), MemoryConversationStore()
    engine = TurnEngine(
        session_id="s1", registry=registry, store=store, conversations=conversations,
        provider=ScriptedProvider([[tool_call("", "send_email", {"to": "ada"}),
                                    tool_call("", "charge", {"n": 1})], "Done."]),
        human=ScriptedHuman(),
    )
    holder["engine"] = engine
    result = engine.run("mail and charge")
    assert result.status is TurnStatus.STOPPED
    assert email.effects() == 1  # the e-mail only: the charge was never sent
    statuses = [m.get("status") for m in engine.messages if m.get("role") == "tool"]
    assert statuses == ["ok", "cancelled"]
    # the e-mail's approval (the scripted human names nobody) before its dispatch
    assert [r.kind for r in engine.ledger.audit()] == ["approved", "dispatch", "human_cancel"]
    # a restarted engine finds nothing to do for the cancelled call
    again = TurnEngine(session_id="s1", registry=registry, store=store,
                       conversations=conversations,
                       provider=ScriptedProvider([[], "Done."]), human=ScriptedHuman())
    assert again.resume().status is TurnStatus.DONE
    assert email.effects() == 1
