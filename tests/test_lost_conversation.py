"""The conversation against the ledger, and renumbered positions (issue 11, items 2 and 4).

Under test: the core's ``EnginePersistCall`` (a fresh call whose id already
has a record goes to ``Recover``), ``ConversationRepair`` and
``ConversationRenumber``, and ``toolledger.check.invariants``.  The closed
world of the ``LostConversation`` and ``Renumbered`` models is explored
completely (a few thousand states): every state of the reference passes every
invariant, the situations the models are about are reached, and each broken
core (the one mistake the spec's twins make, or the guard removed) is caught
by the Python invariant the manifest names for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from checker_support import model_config
from toolledger._core import protocol as p
from toolledger._core.ledger import Ledger
from toolledger._core.stores import MemoryStore
from toolledger.check.invariants import check_all
from toolledger.check.mapping import spec_key, to_spec
from toolledger.check.system import ModelConfig, SystemState, initial_states, successors

A = p.Action


def explore(cfg: ModelConfig) -> Iterator[tuple[p.Action | None, SystemState, SystemState]]:
    """Every reachable (action, state before, state after), breadth first;
    the initial states come as (None, s, s)."""
    seen: set[object] = set()
    todo: list[tuple[p.Action | None, SystemState, SystemState]] = [
        (None, s, s) for s in initial_states(cfg)
    ]
    while todo:
        action, before, s = todo.pop()
        key = spec_key(to_spec(cfg, s))
        if key in seen:
            continue
        seen.add(key)
        yield action, before, s
        todo.extend((a, s, n) for a, n in successors(cfg, s))


def violations(cfg: ModelConfig) -> dict[str, int]:
    found: dict[str, int] = {}
    for _, _, s in explore(cfg):
        for name in check_all(cfg, s):
            found[name] = found.get(name, 0) + 1
    return found


def test_lost_conversation_holds_and_reaches_the_digest_rule() -> None:
    cfg = model_config("LostConversation")
    assert cfg.max_repairs == 1 and cfg.max_renumbers == 0
    mismatched = repaired = states = 0
    for action, _before, s in explore(cfg):
        states += 1
        assert check_all(cfg, s) == {}
        repaired += action is A.ConversationRepair
        for c in s.session.calls:
            if c.stage is p.Stage.RESUME and s.session.record(c.execution_id).status \
                    is not p.LedgerStatus.NONE:
                mismatched += not p.recovery_inputs(s.session, c).digest_matches
    assert states == 1884  # the manifest's count for LostConversation
    assert repaired and mismatched


def test_a_fresh_call_meeting_a_record_is_recovered_not_dispatched() -> None:
    cfg = model_config("LostConversation")
    # the lost call's record survives; the call emitted at its position is
    # persisted into RESUME, and Recover halts it on the digest
    for action, before, s in explore(cfg):
        if action is not A.EnginePersistCall:
            continue
        (c,) = s.session.calls
        had_record = before.session.record(c.execution_id).status is not p.LedgerStatus.NONE
        assert c.stage is (p.Stage.RESUME if had_record else p.Stage.LIVE)
        if had_record and not p.recovery_inputs(s.session, c).digest_matches:
            nxt = p.apply(s.session, p.Event(A.Recover, c.position))
            rec = nxt.record(c.execution_id)
            assert rec.status is p.LedgerStatus.RECOVERY_REQUIRED
            return
    pytest.fail("no fresh call met a record of other arguments")


def test_repair_refuses_what_the_loader_would_not_touch() -> None:
    cfg = model_config("LostConversation")
    s = initial_states(cfg)[0]
    (cc,) = cfg.calls
    ev = p.Event(A.ProviderEmitCall, cc.position, cc.tool_call_id, cc.tool, cc.digest("a1"))
    session = p.apply(p.apply(s.session, ev), p.Event(A.EnginePersistCall, cc.position))
    with pytest.raises(p.ProtocolError, match="stage is live, expected resume"):
        p.apply(session, p.Event(A.ConversationRepair, cc.position))
    with pytest.raises(p.ProtocolError, match="stage is live, expected resume"):
        p.apply(session, p.Event(A.ConversationRenumber, cc.position))


def test_renumbered_holds_with_the_stored_id() -> None:
    cfg = model_config("Renumbered")
    states = 0
    renumbered_after_invoke = False
    for _action, _, s in explore(cfg):
        states += 1
        assert check_all(cfg, s) == {}
        if s.turn_shift and any(s.ghosts.invoked(c.name) for c in cfg.calls):
            renumbered_after_invoke = True
    assert states == 1192 and renumbered_after_invoke


def _patched(monkeypatch: pytest.MonkeyPatch, action: p.Action,
             wrap: Callable[[p.Handler], p.Handler]) -> None:
    monkeypatch.setitem(p._HANDLERS, action, wrap(p._HANDLERS[action]))


def test_a_recovery_that_ignores_the_digest_breaks_result_fidelity(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DigestIgnored in Python: Recover's inputs always say the digest matches."""
    real = p.recovery_inputs

    def trusting(state: p.SessionState, call: p.CallState) -> p.RecoveryInputs:
        return replace(real(state, call), digest_matches=True)

    monkeypatch.setattr(p, "recovery_inputs", trusting)
    found = violations(model_config("LostConversation"))
    assert "ResultFidelity" in found, found


def test_a_live_dispatch_over_an_existing_record_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The guard removed: every persisted call goes live, and with a second
    attempt in the budget the new call is dispatched on the lost call's
    approval and record."""

    def always_live(state: p.SessionState, ev: p.Event) -> p.SessionState:
        c = next(c for c in state.calls if c.position == ev.position)
        if c.message is not p.MessageState.VOLATILE:
            raise p.ProtocolError(ev.action, ev.position, "the call is already durable")
        return state._with_call(replace(c, message=p.MessageState.DURABLE, stage=p.Stage.LIVE))

    _patched(monkeypatch, A.EnginePersistCall, lambda _real: always_live)
    cfg = replace(model_config("LostConversation"), max_attempts=2)
    found = violations(cfg)
    assert {"ApprovalSingleUse", "NoBlindReplay"} <= set(found), found


def test_an_id_derived_from_the_renumbered_position_breaks_execution_id_stable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """IdFromPosition in Python: a renumbering makes the core derive the id again."""

    def rederive(real: p.Handler) -> p.Handler:
        def step(state: p.SessionState, ev: p.Event) -> p.SessionState:
            out = real(state, ev)
            c = next(c for c in out.calls if c.position == ev.position)
            turn, slot = c.position
            moved = p.derive_execution_id(out.session_id, turn + 1, slot, c.tool_call_id)
            return out._with_call(replace(c, execution_id=moved))

        return step

    _patched(monkeypatch, A.ConversationRenumber, rederive)
    found = violations(model_config("Renumbered"))
    assert "ExecutionIdStable" in found, found


@pytest.mark.parametrize("action", [A.ConversationRepair, A.ConversationRenumber])
def test_a_ledger_refuses_the_conversations_rewrites(action: p.Action) -> None:
    ledger = Ledger.create(MemoryStore(), "s1")
    before = ledger.state
    with pytest.raises(p.InvalidInput, match="rewrite of the engine's conversation"):
        ledger.step(p.Event(action, (1, 0)))
    assert ledger.state == before


@pytest.mark.parametrize("model", ["LostConversation", "Renumbered"])
def test_trace_validation_replays_the_rewrites(model: str) -> None:
    """Random runs that repair or renumber the conversation are behaviours of
    the spec (TLC replays them), and a run whose rewrite is dropped is not."""
    from checker_support import ROOT
    from toolledger.check import tracecheck as tc

    cfg = model_config(model)
    rewrite = A.ConversationRepair if cfg.max_repairs else A.ConversationRenumber
    walks = [tc.random_walk(cfg, seed, 30) for seed in range(60)]
    with_rewrite = [w for w in walks if any(a == rewrite.value for a, _ in w.steps)]
    assert with_rewrite, f"no random walk took {rewrite}"
    assert tc.validate_traces(ROOT, cfg, walks).ok
    # the state after the rewrite replaced by the one before: not a spec step
    w = with_rewrite[0]
    i = next(i for i, (a, _) in enumerate(w.steps) if a == rewrite.value)
    broken = tc.Trace((*w.steps[:i], (rewrite.value, w.steps[i - 1][1]), *w.steps[i + 1:]))
    assert not tc.validate_traces(ROOT, cfg, [broken]).ok


def test_a_late_return_of_a_repaired_away_call_is_discarded() -> None:
    # The spec's EngineDiscardLateReturn is enabled for a request still in
    # flight when ConversationRepair dropped its call (nobody waits for it):
    # the core must accept the discard and change nothing.  A core that
    # refuses it (no call at that position) misses these spec edges: without
    # the rule the LostConversation conformance reports 72 mismatches.
    cfg = model_config("LostConversation")
    discarded_gone = 0
    for action, before, s in explore(cfg):
        if action is not A.EngineDiscardLateReturn:
            continue
        if before.session.calls:
            continue
        discarded_gone += 1
        assert s.session == before.session  # nothing the engine holds changes
    assert discarded_gone
    # the core's own rule, directly: a position the conversation no longer
    # holds is late by definition; an event without the attempt is refused
    empty = replace(initial_states(cfg)[0].session, calls=())
    ev = p.Event(A.EngineDiscardLateReturn, (1, 0), attempt=1)
    assert p.apply(empty, ev) == empty
    with pytest.raises(p.ProtocolError):
        p.apply(empty, p.Event(A.EngineDiscardLateReturn, (1, 0)))
