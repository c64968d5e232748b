"""Trace validation: TLC replays recorded reference runs against the spec.

CI validates a fixed, derandomized sample: 20 seeded random runs of the
reference with bigger bounds than any exhaustive model (4 calls, all
policies, a legacy call, up to 5 crashes, 3 attempts), plus every edge
case the seed's matrix names, recorded as runs of the closed-world model.
A reference that retries a manual call must be caught at the Recover step.
"""

from __future__ import annotations

from checker_support import ROOT, big_config, manual_retries, model_config
from toolledger._core import protocol as p
from toolledger.check import tracecheck as tc
from toolledger.check.system import ModelConfig, SystemState, initial_states, successors


def _seed_matrix_runs(cfg: ModelConfig) -> list[tc.Trace]:
    """The seed's five crash points, for the manual call c1 of TwoCalls: a
    run to the point, Crash, then Recover and whatever the engine does next."""
    plan = [
        p.Action.ProviderEmitCall, p.Action.EnginePersistCall, p.Action.EngineParkApproval,
        p.Action.HumanApprove, p.Action.EnginePersistDispatched, p.Action.EngineInvokeAdapter,
        p.Action.ExternalApply, p.Action.EngineRecordSucceeded, p.Action.EngineAppendResult,
    ]  # fmt: skip
    crash_after = {
        "before the dispatch record": p.Action.HumanApprove,
        "after dispatched, call out": p.Action.EngineInvokeAdapter,
        "after external success, before succeeded": p.Action.ExternalApply,
        "after succeeded, before the tool message": p.Action.EngineRecordSucceeded,
        "after the tool result checkpoint": p.Action.EngineAppendResult,
    }
    traces = []
    for name, point in crash_after.items():
        s: SystemState = initial_states(cfg)[0]
        run: list[tuple[str, SystemState]] = [("Init", s)]

        def do(
            action: p.Action, s: SystemState, run: list[tuple[str, SystemState]] = run
        ) -> SystemState:
            nxt = next(n for a, n in successors(cfg, s) if a is action)
            run.append((action.value, nxt))
            return nxt

        for action in plan:
            s = do(action, s)
            if action is point:
                break
        s = do(p.Action.Crash, s)
        for _ in range(6):  # the engine's own steps after the restart
            engine = [(a, n) for a, n in successors(cfg, s)
                      if p.TRANSITIONS[a].actor is p.Actor.ENGINE]
            if not engine:
                break
            s = do(engine[0][0], s)
        traces.append(tc.trace_of(cfg, run, origin=f"seed matrix: {name}"))
    return traces


def test_reference_runs_are_spec_behaviours() -> None:
    big = big_config()
    walks = [tc.random_walk(big, seed, 60) for seed in range(20)]
    result = tc.validate_traces(ROOT, big, walks)
    assert result.ok, result.describe() + "\n" + result.tlc.output[-2000:]
    # the walks end where the model does: since a late answer of the current
    # attempt is recorded, calls settle sooner (594 steps over the 20, was > 600)
    assert result.traces == 20 and result.steps > 20 * 25

    two = model_config("TwoCalls")
    seeds = _seed_matrix_runs(two)
    result = tc.validate_traces(ROOT, two, seeds)
    assert result.ok, result.describe()
    assert result.traces == 5


def test_trace_validation_catches_a_broken_reference() -> None:
    cfg = model_config("TwoCalls")
    with manual_retries():
        walks = [tc.random_walk(cfg, seed, 80) for seed in range(40)]
    result = tc.validate_traces(ROOT, cfg, walks)
    assert not result.ok
    assert result.failure is not None
    assert result.failure.action == "Recover"
    assert "is not a behaviour of the spec" in result.describe()
    assert "step" in result.describe() and "(Recover)" in result.describe()


def test_a_tampered_first_state_is_caught() -> None:
    cfg = model_config("TwoCalls")
    good = tc.random_walk(cfg, 1, 5)
    action, state = good.steps[0]
    bad_state = dict(state, crashes=1)
    bad = tc.Trace(((action, bad_state), *good.steps[1:]), origin="tampered")
    result = tc.validate_traces(ROOT, cfg, [bad])
    assert not result.ok
    assert result.failure is not None and result.failure.action == "Init"
