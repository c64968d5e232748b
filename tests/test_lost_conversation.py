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
from pathlib import Path

import pytest

from checker_support import approval_by_position, halt_rebinds_record, model_config
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
    assert states == 11437  # the manifest's count for LostConversation
    assert repaired and mismatched


def test_the_old_halt_and_retry_break_no_reinvoke_after_known_outcome() -> None:
    """HaltRebindsRecord in Python: the Python invariants catch the core that
    rebinds a halted record and offers a retry on any halted record."""
    with halt_rebinds_record():
        found = violations(model_config("LostConversation"))
    assert "NoReinvokeAfterKnownOutcome" in found, found


def test_a_position_only_approval_breaks_approval_bound_to_args() -> None:
    """ApprovalByPosition in Python: the core that dispatches any call at an
    approved id on that approval is caught by ApprovalBoundToArgs, and only by
    it (ApprovalGate reads positions: it holds, as in the spec's twin)."""
    with approval_by_position():
        found = violations(model_config("LostConversation"))
    assert set(found) == {"ApprovalBoundToArgs"}, found


def _approved_then_lost() -> tuple[ModelConfig, p.SessionState, p.CallState]:
    """The issue's scenario: a1 approved, crash, the repair drops it, a2 is
    emitted at the same (turn, slot, call_0) and persisted (no record: live)."""
    cfg = model_config("LostConversation")
    (cc,) = cfg.calls
    pos = cc.position
    s = initial_states(cfg)[0].session
    s = p.apply(s, p.Event(A.ProviderEmitCall, pos, cc.tool_call_id, cc.tool, cc.digest("a1")))
    for action in (A.EnginePersistCall, A.EngineParkApproval, A.HumanApprove):
        s = p.apply(s, p.Event(action, pos))
    s = p.apply(s, p.Event(A.Crash))
    s = p.apply(s, p.Event(A.ConversationRepair, pos))
    s = p.apply(s, p.Event(A.ProviderEmitCall, pos, cc.tool_call_id, cc.tool, cc.digest("a2")))
    s = p.apply(s, p.Event(A.EnginePersistCall, pos))
    (c,) = s.calls
    assert c.stage is p.Stage.LIVE and s.approval(c.execution_id) is p.ApprovalState.APPROVED
    return cfg, s, c


def test_a_call_at_an_approved_position_with_other_arguments_is_asked_again() -> None:
    cfg, s, c = _approved_then_lost()
    (cc,) = cfg.calls
    assert s.approval_digest(c.execution_id) == cc.digest("a1") != c.args_digest
    with pytest.raises(p.ProtocolError, match="approval was given for others"):
        p.apply(s, p.Event(A.EnginePersistDispatched, c.position))
    s = p.apply(s, p.Event(A.EngineParkApproval, c.position))
    assert s.approval(c.execution_id) is p.ApprovalState.PENDING
    assert s.approval_digest(c.execution_id) == c.args_digest
    with pytest.raises(p.ProtocolError, match="already pending for these arguments"):
        p.apply(s, p.Event(A.EngineParkApproval, c.position))
    s = p.apply(s, p.Event(A.HumanApprove, c.position))
    s = p.apply(s, p.Event(A.EnginePersistDispatched, c.position))
    rec = s.record(c.execution_id)
    assert (rec.args_digest, rec.authorization) == (c.args_digest, p.Authorization.APPROVAL)


def test_a_rejection_of_other_arguments_is_not_a_denial() -> None:
    """A rejection binds the arguments it was given for too: the new call is
    asked again, never answered "denied" for what the human saw of another."""
    cfg, s, c = _approved_then_lost()
    s = p.apply(s, p.Event(A.EngineParkApproval, c.position))
    s = replace(s, approvals={c.execution_id: p.ApprovalState.REJECTED},
                approval_digests={c.execution_id: cfg.calls[0].digest("a1")})
    with pytest.raises(p.ProtocolError, match="rejection was for other arguments"):
        p.apply(s, p.Event(A.EngineRecordDenied, c.position))
    assert p.enabled(s, p.Event(A.EngineParkApproval, c.position))


def _halted_after_mismatch(known: bool) -> tuple[ModelConfig, p.SessionState, p.CallState]:
    """The call at the position after a digest-mismatch halt: the lost call
    (args a1) was dispatched and halted; if ``known``, a human resolved it as
    applied before the conversation lost it; then a2 is emitted there."""
    cfg = model_config("LostConversation")
    (cc,) = cfg.calls
    pos = cc.position
    s = initial_states(cfg)[0].session

    def step(state: p.SessionState, action: p.Action, **kw: object) -> p.SessionState:
        return p.apply(state, p.Event(action, pos, **kw))  # type: ignore[arg-type]

    s = p.apply(s, p.Event(A.ProviderEmitCall, pos, cc.tool_call_id, cc.tool, cc.digest("a1")))
    for action in (A.EnginePersistCall, A.EngineParkApproval, A.HumanApprove,
                   A.EnginePersistDispatched):
        s = step(s, action)
    s = p.apply(s, p.Event(A.Crash))
    s = step(s, A.Recover)
    # known: a human resolves it as applied; else another crash leaves it halted
    s = step(s, A.HumanResolveApplied) if known else p.apply(s, p.Event(A.Crash))
    s = step(s, A.ConversationRepair)
    s = p.apply(s, p.Event(A.ProviderEmitCall, pos, cc.tool_call_id, cc.tool, cc.digest("a2")))
    s = step(s, A.EnginePersistCall)
    s = step(s, A.Recover)
    (c,) = s.calls
    return cfg, s, c


@pytest.mark.parametrize("known", [True, False])
def test_a_mismatched_halt_keeps_the_record_and_refuses_a_retry(known: bool) -> None:
    cfg, s, c = _halted_after_mismatch(known)
    (cc,) = cfg.calls
    rec = s.record(c.execution_id)
    assert rec.status is p.LedgerStatus.RECOVERY_REQUIRED
    assert rec.args_digest == cc.digest("a1") != c.args_digest  # not rebound
    assert (rec.result is not None) is known  # a known outcome stays known
    why = "outcome is known" if known else "written for other arguments"
    with pytest.raises(p.ProtocolError, match=why):
        p.apply(s, p.Event(A.HumanResolveRetry, c.position))
    # the choices that invoke nothing bind the record to the call they resolve
    for action, kind in ((A.HumanResolveApplied, p.ResultKind.HUMAN),
                         (A.HumanResolveAbandon, p.ResultKind.ABANDONED)):
        out = p.apply(s, p.Event(action, c.position))
        res = out.record(c.execution_id)
        assert res.args_digest == c.args_digest and res.result is not None
        assert res.result.kind is kind
        nxt = p.apply(out, p.Event(A.Recover, c.position))
        assert nxt.call(c.position).stage is p.Stage.RECORDED  # type: ignore[union-attr]


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
    assert states == 1544 and renumbered_after_invoke


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


def test_tlc_pins_the_old_rules_counterexample() -> None:
    """The HaltRebindsRecord twin's counterexample is the one found by the
    review: a human's "applied" resolution, the conversation loses the call,
    other arguments at its position, the digest halt, and a human retry grant
    that Recover holds to send attempt 2 of the execution whose outcome was known."""
    from checker_support import ROOT
    from toolledger.check.tlc import Outcome, run_tlc

    result = run_tlc(
        "MCLostConversation",
        ROOT / "model" / "HaltRebindsRecord.cfg",
        search_dirs=[ROOT / "spec", ROOT / "model"],
        check_deadlock=False,
    )
    assert result.outcome is Outcome.INVARIANT_VIOLATED
    assert result.violated == "NoReinvokeAfterKnownOutcome"
    assert [s.action for s in result.trace] == [
        "Init", "ProviderEmitCall", "EnginePersistCall", "EngineParkApproval",
        "HumanApprove", "EnginePersistDispatched", "Crash",
        "Recover",  # manual, dispatched: recovery_required
        "HumanResolveApplied",  # the outcome is known
        "ConversationRepair",  # the conversation loses the call
        "ProviderEmitCall", "EnginePersistCall",  # other arguments at its position
        "Recover",  # the digest differs: recovery_required
        "HumanResolveRetry",  # a grant of attempt 2 of a known outcome
        "Recover",  # honoured: attempt 2 is held to be sent
    ]
    first, last = result.trace[1].state["args"], result.trace[10].state["args"]
    assert first != last  # the provider emitted other arguments
    assert result.trace[-1].state["ledger"]  # the record was rewritten for them


def test_conformance_catches_the_old_halt(tmp_path: Path) -> None:
    """The LostConversation graph against the core with the old rule: the
    core allows a human retry the spec does not have (an extra step)."""
    from checker_support import dump_graph
    from toolledger.check import conformance
    from toolledger.check.tlc import Outcome

    result, graph = dump_graph("LostConversation", tmp_path)  # make check's dump, if cached
    assert result.outcome is Outcome.PASS
    cfg = model_config("LostConversation")
    assert conformance.check_graph(cfg, graph, model="LostConversation").ok
    with halt_rebinds_record():
        report = conformance.check_graph(cfg, graph, model="LostConversation",
                                         max_mismatches=1000)
    assert not report.ok
    # the halt writes another record than the spec's Halt (Recover), and a
    # retry grant is offered where HumanMayRetry forbids it (where both grant,
    # the helper's grant is the spec's: nothing missing)
    found = {(m.kind, m.action) for m in report.mismatches}
    assert found == {("extra", "Recover"), ("missing", "Recover"),
                     ("extra", "HumanResolveRetry")}, found


def _scripted_walk(cfg: ModelConfig, script: list[tuple[p.Action, str | None]]) -> list[
        tuple[str, SystemState]]:
    """The reference's run that takes each scripted action (an emission with
    the given argument); fails if the core does not enable a step."""
    (cc,) = cfg.calls
    s = initial_states(cfg)[0]
    run: list[tuple[str, SystemState]] = [("Init", s)]
    for action, arg in script:
        options = [n for a, n in successors(cfg, s) if a is action and (
            arg is None or any(c.args_digest == cc.digest(arg) for c in n.session.calls))]
        assert options, f"{action.value} is not enabled"
        s = options[0]
        run.append((action.value, s))
    return run


_OLD_RULES_WALK: list[tuple[p.Action, str | None]] = [
    (A.ProviderEmitCall, "a1"), (A.EnginePersistCall, None), (A.EngineParkApproval, None),
    (A.HumanApprove, None), (A.EnginePersistDispatched, None), (A.Crash, None),
    (A.Recover, None), (A.HumanResolveApplied, None), (A.ConversationRepair, None),
    (A.ProviderEmitCall, "a2"), (A.EnginePersistCall, None), (A.Recover, None),
]


def test_trace_validation_catches_the_old_halt() -> None:
    """Trace validation: the run up to the digest halt is a spec behaviour
    with today's core; with the old rule its halt is not a spec step, and the
    core goes on to the retry TLC's counterexample ends with."""
    from checker_support import ROOT
    from toolledger.check import tracecheck as tc

    cfg = model_config("LostConversation")
    good = tc.trace_of(cfg, _scripted_walk(cfg, _OLD_RULES_WALK))
    assert tc.validate_traces(ROOT, cfg, [good]).ok
    with halt_rebinds_record():
        run = _scripted_walk(cfg, [*_OLD_RULES_WALK, (A.HumanResolveRetry, None)])
    report = tc.validate_traces(ROOT, cfg, [tc.trace_of(cfg, run)])
    assert not report.ok
    assert report.failure is not None, report.describe()
    assert (report.failure.step, report.failure.action) == (12, "Recover"), report.describe()
