"""Late answers are recorded, and a human's abandon is final (issue 25, points 1-2).

Under test: the core takes an answer that arrives after a time-out while the
call's record is still at that attempt with no outcome (the spec's
``HoldsUnanswered``, docs/protocol.md#late-answers), from every stage a
time-out leaves it in, and refuses to discard it; the closed world's ghost of
a dropped answer and the Python ``HumanSeesKnownOutcome`` catch the old rule
(``drops_late_answer``, the spec's twin ``LateReturnDropped``); the Python
``NoReinvokeAfterKnownOutcome`` catches a core that re-reconciles an abandoned
call (``reconciles_abandoned``, twin ``ReconcileAbandoned``).  Conformance
against TLC's graph of the broken core is in tests/test_closed_world.py.
The models here are the twins' constants (one call, no crash): seconds.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from checker_support import drops_late_answer, reconciles_abandoned
from toolledger._core import protocol as p
from toolledger.check.invariants import check_all
from toolledger.check.mapping import spec_key, to_spec
from toolledger.check.system import CallConfig, ModelConfig, SystemState, initial_states, successors

A = p.Action
POS = (1, 0)


def _one_call(policy: p.RecoveryPolicy) -> ModelConfig:
    """The twins' model: one call needing no approval, no crash, 2 attempts."""
    tool = p.ToolProfile(f"{policy.value}_tool_c1", policy, False)
    return ModelConfig(calls=(CallConfig("c1", POS, "call_0", tool, ("a1",)),),
                       marker=0, max_crashes=0, max_attempts=2)


def _explore(cfg: ModelConfig) -> Iterator[SystemState]:
    seen: set[object] = set()
    todo = list(initial_states(cfg))
    while todo:
        s = todo.pop()
        key = spec_key(to_spec(cfg, s))
        if key not in seen:
            seen.add(key)
            yield s
            todo.extend(n for _, n in successors(cfg, s))


def _violations(cfg: ModelConfig) -> set[str]:
    return {name for s in _explore(cfg) for name in check_all(cfg, s)}


def _timed_out(policy: p.RecoveryPolicy) -> p.SessionState:
    """One call dispatched, invoked and timed out: its answer is still out."""
    cfg = _one_call(policy)
    (cc,) = cfg.calls
    s = initial_states(cfg)[0].session
    s = p.apply(s, p.Event(A.ProviderEmitCall, POS, cc.tool_call_id, cc.tool, cc.digest("a1")))
    for action in (A.EnginePersistCall, A.EnginePersistDispatched, A.EngineInvokeAdapter,
                   A.EngineTimeout):
        s = p.apply(s, p.Event(action, POS))
    return s


def _stage(s: p.SessionState) -> p.Stage:
    c = s.call(POS)
    assert c is not None
    return c.stage


@pytest.mark.parametrize(
    ("policy", "after_recover"),
    [(p.RecoveryPolicy.MANUAL, p.Stage.NONE), (p.RecoveryPolicy.IDEMPOTENT, p.Stage.RETRY),
     (p.RecoveryPolicy.RECONCILE, p.Stage.RECONCILING)],
)
def test_a_late_answer_of_the_current_attempt_is_taken_and_recorded(
    policy: p.RecoveryPolicy, after_recover: p.Stage
) -> None:
    s = _timed_out(policy)
    for state in (s, p.apply(s, p.Event(A.Recover, POS))):  # before and after Recover
        assert _stage(state) in (p.Stage.RESUME, after_recover)
        with pytest.raises(p.ProtocolError, match="deliver it instead of discarding it"):
            p.apply(state, p.Event(A.EngineDiscardLateReturn, POS, attempt=1))
        got = p.apply(state, p.Event(A.ExternalApply, POS, attempt=1))
        assert _stage(got) is p.Stage.GOT_OK
        done = p.apply(p.apply(got, p.Event(A.EngineRecordSucceeded, POS)),
                       p.Event(A.EngineAppendResult, POS))
        c = done.call(POS)
        assert c is not None and c.result is not None and c.result.kind is p.ResultKind.OK
        assert done.record(c.execution_id).status is p.LedgerStatus.SUCCEEDED
        failed = p.apply(state, p.Event(A.ExternalRejectDefinite, POS, attempt=1))
        assert _stage(failed) is p.Stage.GOT_FAIL


def test_the_human_is_not_asked_once_the_halted_attempts_answer_arrives() -> None:
    """The issue's trace: the manual call halts for a human, then its answer
    arrives: the engine records it, and no human choice is open any more."""
    halted = p.apply(_timed_out(p.RecoveryPolicy.MANUAL), p.Event(A.Recover, POS))
    c = halted.call(POS)
    assert c is not None
    assert halted.record(c.execution_id).status is p.LedgerStatus.RECOVERY_REQUIRED
    assert p.enabled(halted, p.Event(A.HumanResolveRetry, POS))
    got = p.apply(halted, p.Event(A.ExternalApply, POS, attempt=1))
    for human in (A.HumanResolveRetry, A.HumanResolveApplied, A.HumanResolveAbandon):
        assert not p.enabled(got, p.Event(human, POS))
    recorded = p.apply(got, p.Event(A.EngineRecordSucceeded, POS))
    assert recorded.record(c.execution_id).status is p.LedgerStatus.SUCCEEDED


def test_an_older_attempts_answer_is_still_discarded() -> None:
    """Once a newer attempt is dispatched, attempt 1's return is late for good."""
    s = p.apply(_timed_out(p.RecoveryPolicy.IDEMPOTENT), p.Event(A.Recover, POS))
    s = p.apply(s, p.Event(A.EnginePersistDispatched, POS))
    for answer in (A.ExternalApply, A.ExternalRejectDefinite):
        assert not p.enabled(s, p.Event(answer, POS, attempt=1))
    assert p.apply(s, p.Event(A.EngineDiscardLateReturn, POS, attempt=1)) == s


def test_the_old_rule_drops_the_answer_and_the_core_refuses_it() -> None:
    s = _timed_out(p.RecoveryPolicy.MANUAL)
    with drops_late_answer():
        assert not p.enabled(s, p.Event(A.ExternalApply, POS, attempt=1))
        assert p.apply(s, p.Event(A.EngineDiscardLateReturn, POS, attempt=1)) == s


@pytest.mark.parametrize("policy", [p.RecoveryPolicy.MANUAL, p.RecoveryPolicy.RECONCILE])
def test_human_sees_known_outcome_catches_the_old_rule(policy: p.RecoveryPolicy) -> None:
    """LateReturnDropped in Python: the real core keeps every invariant; the
    core that drops the late answer breaks HumanSeesKnownOutcome (and, on the
    manual call, nothing else: a human retried, so AtMostOnceEffect holds)."""
    cfg = _one_call(policy)
    assert _violations(cfg) == set()
    with drops_late_answer():
        found = _violations(cfg)
    assert "HumanSeesKnownOutcome" in found, found
    if policy is p.RecoveryPolicy.MANUAL:
        assert found == {"HumanSeesKnownOutcome"}, found


def test_an_abandon_overridden_breaks_no_reinvoke_after_known_outcome() -> None:
    """ReconcileAbandoned in Python: a core that reconciles an abandoned
    reconcile call sends attempt 2 after the human gave up."""
    cfg = _one_call(p.RecoveryPolicy.RECONCILE)
    with reconciles_abandoned():
        found = _violations(cfg)
    assert "NoReinvokeAfterKnownOutcome" in found, found
