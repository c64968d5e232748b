"""TLC checks that runs of the engine kit (``toolledger simulate`` and friends) are spec behaviours.

Under test: :mod:`toolledger.kit.engine` in ``ledger`` mode on a real
:class:`~toolledger._core.sqlite_store.SqliteStore`, as ``toolledger simulate``
runs it (:func:`toolledger.kit.simulate.run_simulation`), and a few runs with
external faults and human resolutions driven the same way.  Every event the
engine feeds its :class:`~toolledger._core.ledger.Ledger` is recorded
(:class:`toolledger.check.kittrace.KitRecorder`), a new process is the spec's
``Crash``, and :func:`toolledger.check.kittrace.replay` follows the recording in
the closed-world model, inferring the environment's own steps the engine
cannot log (a lost answer, a late original landing or dropped by its fence)
by a bounded search.  The replay checks itself against the kit (the model's
engine state after every batch is the ledger's; its effects at the end are
the real external system's).

The oracle is TLC: :func:`toolledger.check.tracecheck.validate_traces` replays
each trace against ``DurableToolExecution`` and fails at the first step the
spec does not allow.  For every policy, the five rows of the seed's
fault-injection matrix (``SEED_MATRIX``) and the fault runs of that policy are
validated in one TLC run; a run of two turns with reused and empty
``tool_call_id``\\ s, every policy and a crash in one more; the engine's fused and
together paths (``TurnEngine(fused=True)``, ``TurnEngine(together=True)``: two calls
dispatched in the record commit, both outcomes in one commit) with crashes, each
policy in one TLC run; and a run recorded
from a deliberately broken engine (recovery retries a ``manual`` call found
``dispatched``) must fail at its ``Recover`` step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import toolledger._core.ledger
import toolledger._core.next_step
import toolledger._core.protocol
from checker_support import ROOT
from toolledger._core.protocol import (
    Decision,
    InvalidInput,
    LedgerStatus,
    RecoveryDecision,
    RecoveryInputs,
    RecoveryPolicy,
    decide_recovery,
)
from toolledger._core.sqlite_store import SqliteStore
from toolledger._core.tools import ToolRegistry
from toolledger.check import kittrace as kt
from toolledger.check import tracecheck as tc
from toolledger.check.system import ModelConfig
from toolledger.kit.engine import (
    SEED_MATRIX,
    CrashInjector,
    FileConversationStore,
    ScriptedHuman,
    ScriptedProvider,
    SimulatedCrash,
    TurnEngine,
    TurnResult,
    TurnStatus,
    parse_crash_point,
    tool_call,
)
from toolledger.kit.external import CountingAdapter, CountingExternalSystem, Fault
from toolledger.kit.simulate import ARGUMENTS, SESSION_ID, TOOL, USER_TEXT, run_simulation

POLICIES = [p.value for p in RecoveryPolicy]


@dataclass
class KitRun:
    """One recorded run, with the real external system read back from its log."""

    name: str
    recording: list[kt.Logged]
    world: CountingExternalSystem

    def actions(self, cfg: ModelConfig) -> list[str]:
        return [a for a, _ in kt.replay(cfg, self.recording, self.world)]


def simulate_row(row: str, policy: str, tmp: Path) -> KitRun:
    """``toolledger simulate --engine ledger --store sqlite`` at the row's crash point."""
    db = tmp / f"{policy}-{row}.sqlite3"
    point = SEED_MATRIX[row].ledger
    with kt.KitRecorder() as recorder:
        report = run_simulation("ledger", policy, point, "sqlite", db, crash_with="exception")
    assert report.crashed is point.reached_by(policy)
    return KitRun(f"simulate {policy} {row}", recorder.of(SESSION_ID),
                  CountingExternalSystem(Path(f"{db}.external.jsonl")))


# --------------------------------------------------------------------------
# Runs with faults, driven like simulate drives the engine
# --------------------------------------------------------------------------


class Kit:
    """Durable storage and the external system of one run, and engines (processes) on them."""

    def __init__(self, tmp: Path, name: str) -> None:
        self.dir = tmp / name
        self.dir.mkdir()
        self.system = CountingExternalSystem(self.dir / "external.jsonl")
        self.stores: list[SqliteStore] = []

    def engine(
        self,
        tools: dict[str, tuple[str, bool]],
        script: Sequence[Sequence[dict[str, Any]] | str],
        *,
        crash_at: str | None = None,
        human: ScriptedHuman | None = None,
        fused: bool = False,
        together: bool = False,
    ) -> TurnEngine:
        for store in self.stores:
            store.close()  # the previous process is gone
        crash = CrashInjector(None if crash_at is None else parse_crash_point("ledger", crash_at))
        registry = ToolRegistry()
        for name, (policy, approval) in tools.items():
            registry.register(name, CountingAdapter(self.system, name,
                                                    on_request_sent=crash.request_sent),
                              policy=policy, requires_approval=approval)
        store = SqliteStore(self.dir / "ledger.sqlite3")
        self.stores.append(store)
        return TurnEngine(session_id=SESSION_ID, registry=registry,
                          provider=ScriptedProvider(script), human=human or ScriptedHuman(),
                          conversations=FileConversationStore(self.dir / "conversation"),
                          store=store, crash=crash, fused=fused, together=together)

    def close(self) -> None:
        for store in self.stores:
            store.close()


def fault_run(
    tmp: Path,
    name: str,
    policy: str,
    faults: Sequence[Fault],
    *,
    late: bool = False,
    resolve: str | None = None,
    expect: TurnStatus = TurnStatus.DONE,
) -> KitRun:
    """simulate's one call (same session, tool, arguments), with scripted faults; the
    late requests land at the end; a halted call is resolved by a human in a new process."""
    kit = Kit(tmp, name)
    tools = {TOOL: (policy, True)}
    script: list[Sequence[dict[str, Any]] | str] = [
        [tool_call("call_0", TOOL, ARGUMENTS)], "The email is sent."]
    kit.system.fault(*faults)
    with kt.KitRecorder() as recorder:
        result = kit.engine(tools, script).run(USER_TEXT)
        if resolve is not None:
            assert result.status is TurnStatus.RECOVERY_REQUIRED, result
            text = "a human checked the outbox" if resolve == "applied" else None
            result = kit.engine(tools, script).resolve_recovery(result.halted[0], resolve,
                                                                result_text=text)
    if late:
        assert kit.system.deliver_in_flight(), "nothing was in flight"
    kit.close()
    assert result.status is expect, result
    return KitRun(name, recorder.of(SESSION_ID), CountingExternalSystem(kit.system.path))


FAULT_RUNS: dict[str, list[Callable[[Path], KitRun]]] = {
    "manual": [
        lambda tmp: fault_run(tmp, "manual-lost-answer-human-retry", "manual",
                              [Fault.LOSE_ANSWER], resolve="retry"),
        lambda tmp: fault_run(tmp, "manual-time-out-human-applied-late", "manual",
                              [Fault.TIME_OUT], resolve="applied", late=True),
    ],
    "idempotent": [
        lambda tmp: fault_run(tmp, "idempotent-two-time-outs-late-dedup", "idempotent",
                              [Fault.TIME_OUT, Fault.TIME_OUT], late=True),
        lambda tmp: fault_run(tmp, "idempotent-definite-failure", "idempotent",
                              [Fault.FAIL_DEFINITELY]),
    ],
    "reconcile": [
        lambda tmp: fault_run(tmp, "reconcile-lost-answer-found-applied", "reconcile",
                              [Fault.LOSE_ANSWER]),
        lambda tmp: fault_run(tmp, "reconcile-time-out-fenced-late-dropped", "reconcile",
                              [Fault.TIME_OUT], late=True),
        lambda tmp: fault_run(tmp, "reconcile-cannot-tell-human-abandons", "reconcile",
                              [Fault.TIME_OUT, Fault.CANNOT_TELL], resolve="abandon", late=True),
    ],
    "readonly": [
        lambda tmp: fault_run(tmp, "readonly-time-out", "readonly", [Fault.TIME_OUT], late=True),
    ],
}


def validate(cfg: ModelConfig, runs: Sequence[KitRun]) -> tuple[tc.TraceValidation, float]:
    traces = [tc.trace_of(cfg, kt.replay(cfg, r.recording, r.world), origin=r.name)
              for r in runs]
    started = time.perf_counter()
    result = tc.validate_traces(ROOT, cfg, traces)
    return result, time.perf_counter() - started


# --------------------------------------------------------------------------
# The tests
# --------------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_seed_matrix_runs_of_simulate_are_spec_behaviours(policy: str, tmp_path: Path) -> None:
    seed = [simulate_row(row, policy, tmp_path) for row in SEED_MATRIX]
    faulty = [make(tmp_path) for make in FAULT_RUNS[policy]]
    cfg = kt.kit_config([r.recording for r in (*seed, *faulty)])
    [call] = cfg.calls
    assert (call.position, call.tool_call_id, call.tool.name, call.tool.policy.value) == (
        (1, 0), "call_0", TOOL, policy)
    digest = toolledger._core.protocol.args_digest(TOOL, ARGUMENTS)
    assert call.digest(call.arg_choices[0]) == digest

    result, seconds = validate(cfg, [*seed, *faulty])
    print(f"\n{policy}: {result.traces} kit traces ({result.steps} steps) validated by TLC "
          f"in {seconds:.1f} s")
    assert result.ok, result.describe() + "\n" + result.tlc.output[-2000:]
    assert result.traces == len(SEED_MATRIX) + len(FAULT_RUNS[policy])

    # every crash the engine survived is a Crash of the trace, and what the
    # engine did after it is the recovery decision the seed's matrix names
    rows = {row: r.actions(cfg) for row, r in zip(SEED_MATRIX, seed, strict=True)}
    assert all(actions.count("Crash") == 1 for actions in rows.values())
    after = {row: actions[actions.index("Crash") + 1:] for row, actions in rows.items()}
    if policy != "readonly":
        assert after["after_succeeded_before_tool_message"] == []  # reconstructed, not invoked
        assert after["after_external_success"][0] == "Recover"
        assert "EngineInvokeAdapter" not in after["after_tool_result_checkpoint"]


def test_the_search_infers_what_the_engine_cannot_log(tmp_path: Path) -> None:
    """A lost answer the reconcile connector finds applied, and a late original dropped
    by its fence, are environment steps inferred where the spec needs them."""
    found = fault_run(tmp_path, "lost", "reconcile", [Fault.LOSE_ANSWER])
    dropped = fault_run(tmp_path, "dropped", "reconcile", [Fault.TIME_OUT], late=True)
    deduplicated = fault_run(tmp_path, "dedup", "idempotent", [Fault.TIME_OUT], late=True)
    cfg = kt.kit_config([found.recording])
    actions = found.actions(cfg)
    i = actions.index("EngineReconcileApplied")
    assert actions[i - 3:i] == ["EngineTimeout", "Recover", "ExternalApplyLoseAnswer"]
    actions = dropped.actions(kt.kit_config([dropped.recording]))
    assert actions[-1] == "ExternalDropFenced" and "EngineReconcileNotApplied" in actions
    actions = deduplicated.actions(kt.kit_config([deduplicated.recording]))
    assert actions[-1] == "ExternalApplyLoseAnswer"  # the late original, deduplicated
    assert deduplicated.world.effects() == 1


def test_replay_refuses_a_recording_it_cannot_follow(tmp_path: Path) -> None:
    run = simulate_row("after_external_success", "manual", tmp_path)
    cfg = kt.kit_config([run.recording])
    # the approval never happened: dispatching is not an engine step the spec allows,
    # and no environment action makes it one
    tampered = [e for e in run.recording
                if not any(ev.action.value == "HumanApprove" for ev in e.events)]
    with pytest.raises(kt.ReplayError, match=r"EnginePersistDispatched .* is not enabled"):
        kt.replay(cfg, tampered, run.world)
    # a world that saw a second effect is not the world the engine's steps lead to
    other = fault_run(tmp_path, "twice", "manual", [Fault.LOSE_ANSWER], resolve="retry")
    with pytest.raises(kt.ReplayError, match="the real external system"):
        kt.replay(cfg, run.recording, other.world)


def two_turn_run(tmp_path: Path) -> KitRun:
    """call_0 reused across turns, two "" ids in one message, every policy, a crash, a
    rejection and a human resolution: one kit run."""
    tools = {"send_email": ("manual", True), "read_file": ("readonly", False),
             "charge_card": ("idempotent", True), "create_ticket": ("reconcile", False)}
    script: list[Sequence[dict[str, Any]] | str] = [
        [tool_call("call_0", "send_email", {"to": "ada"}),
         tool_call("call_1", "read_file", {"path": "q3.csv"})],
        "Sent, and read.",
        [tool_call("call_0", "charge_card", {"amount": 5}),
         tool_call("", "create_ticket", {"title": "refund"}),
         tool_call("", "send_email", {"to": "bob"})],
        "Charged, ticketed, not emailed.",
    ]
    kit = Kit(tmp_path, "two-turns")
    with kt.KitRecorder() as recorder:
        first = kit.engine(tools, script, crash_at="after ExternalApply")
        with pytest.raises(SimulatedCrash):
            first.run("email Ada the report you read")
        halted = kit.engine(tools, script).resume()  # manual: halted, nothing replayed
        assert halted.status is TurnStatus.RECOVERY_REQUIRED
        done = kit.engine(tools, script).resolve_recovery(halted.halted[0], "applied",
                                                          result_text="sent, id 7")
        assert done.status is TurnStatus.DONE
        kit.system.fault(Fault.TIME_OUT)  # the charge times out, then is retried
        second = kit.engine(tools, script, human=ScriptedHuman(["approve", "reject"]))
        result: TurnResult = second.run("charge 5, open a ticket, email Bob")
        assert result.status is TurnStatus.DONE
    kit.system.deliver_in_flight()
    kit.close()
    run = KitRun("two turns", recorder.of(SESSION_ID), CountingExternalSystem(kit.system.path))
    return run


def test_two_turns_with_reused_ids_and_every_policy_are_spec_behaviours(
    tmp_path: Path,
) -> None:
    """The two-turn run, validated by TLC."""
    run = two_turn_run(tmp_path)
    cfg = kt.kit_config([run.recording])
    assert [(c.position, c.tool_call_id) for c in cfg.calls] == [
        ((1, 0), "call_0"), ((1, 1), "call_1"), ((6, 0), "call_0"), ((6, 1), ""), ((6, 2), "")]
    assert len(set(cfg.exec_ids.values())) == 5  # reused ids, five executions
    result_, seconds = validate(cfg, [run])
    print(f"\ntwo turns: {result_.steps} steps validated by TLC in {seconds:.1f} s")
    assert result_.ok, result_.describe() + "\n" + result_.tlc.output[-2000:]
    actions = run.actions(cfg)
    for action in ("Crash", "HumanResolveApplied", "HumanReject", "EngineRecordDenied",
                   "EngineInvokeReadonly", "EngineTimeout"):
        assert action in actions, action


def test_replay_catches_a_ledger_that_keeps_settled_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Broken on purpose: the ledger never prunes its memory to the working set."""
    monkeypatch.setattr(toolledger._core.ledger, "working_set", lambda state: state)
    run = two_turn_run(tmp_path)
    with pytest.raises(kt.ReplayError, match=r"the ledger kept .* in memory, the working set"):
        kt.replay(kt.kit_config([run.recording]), run.recording, run.world)


@pytest.fixture
def manual_retries(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Broken on purpose: recovery retries a ``manual`` call found in ``dispatched``."""
    original = decide_recovery

    def broken(i: RecoveryInputs) -> RecoveryDecision:
        if (i.status is LedgerStatus.DISPATCHED and i.policy is RecoveryPolicy.MANUAL
                and not i.has_result and i.attempt < i.max_attempts):
            return RecoveryDecision(Decision.RETRY_SAME_ID, i)
        return original(i)

    # the core decides; the Ledger and the Session recompute it for the audit and the engine
    # next_step: where the Session looks the decision up (recover(), its status)
    for module in (toolledger._core.protocol, toolledger._core.ledger, toolledger._core.next_step):
        monkeypatch.setattr(module, "decide_recovery", broken)
    yield


def test_trace_validation_catches_a_broken_engine(manual_retries: None, tmp_path: Path) -> None:
    run = simulate_row("after_external_success", "manual", tmp_path)
    assert run.world.effects() == 2  # the broken engine really sent the email twice
    cfg = kt.kit_config([run.recording])
    actions = run.actions(cfg)  # the model follows the broken core
    result, _ = validate(cfg, [run])
    assert not result.ok
    assert result.failure is not None
    assert result.failure.action == "Recover"
    assert actions[result.failure.step] == "Recover"
    assert actions[result.failure.step + 1] == "EnginePersistDispatched"
    assert "(Recover) is not a step the spec allows" in result.describe()


def test_a_fence_the_spec_does_not_have_is_reported(tmp_path: Path) -> None:
    """Pins a kit/spec divergence (reported, not fixed here).  A reconcile call that
    timed out three times: on the third reconcile the connector fences attempt 3 and
    answers "not applied", but the retry budget is spent, so the engine records
    EngineReconcileUnknown, which in the spec fences nothing.  The late attempt 3 is then
    dropped by a fence the spec's state does not have: no spec step explains it."""
    run = fault_run(tmp_path, "fence", "reconcile", [Fault.TIME_OUT] * 3, late=True,
                    expect=TurnStatus.RECOVERY_REQUIRED)
    [e] = {r.execution_id for r in run.world.requests}
    assert run.world.fenced_up_to(e) == 3
    assert [r.status.value for r in run.world.requests] == ["dropped_fenced"] * 3
    cfg = kt.kit_config([run.recording])
    with pytest.raises(kt.ReplayError, match=r"request 3 .* says dropped_fenced"):
        kt.replay(cfg, run.recording, run.world)
    # without the external system's word, the engine's own steps are spec steps
    actions = [a for a, _ in kt.replay(cfg, run.recording)]
    assert actions.count("EngineReconcileNotApplied") == 2
    assert actions[-1] == "EngineReconcileUnknown"


def test_a_stop_before_dispatch_is_a_spec_behaviour(tmp_path: Path) -> None:
    """Two calls of one message (ids ""), approved or auto, then the user's Stop: both
    are cancelled (HumanCancel, then Recover's skip) and never sent; TLC validates it."""
    tools = {"send_email": ("manual", True), "charge_card": ("idempotent", False)}
    script: list[Sequence[dict[str, Any]] | str] = [
        [tool_call("", "send_email", {"to": "ada"}),
         tool_call("", "charge_card", {"amount": 5})],
        "Stopped, as you asked.",
    ]
    kit = Kit(tmp_path, "stop")
    with kt.KitRecorder() as recorder:
        engine = kit.engine(tools, script)
        engine.request_stop()  # pressed once the calls are approved, before any dispatch
        assert engine.run("email Ada and charge 5").status is TurnStatus.STOPPED
        assert kit.engine(tools, script).resume().status is TurnStatus.DONE
    kit.close()
    world = CountingExternalSystem(kit.system.path)
    assert world.effects() == 0 and not list(world.requests)
    run = KitRun("stop", recorder.of(SESSION_ID), world)
    cfg = kt.kit_config([run.recording])
    result_, _ = validate(cfg, [run])
    assert result_.ok, result_.describe() + "\n" + result_.tlc.output[-2000:]
    actions = run.actions(cfg)
    assert actions.count("HumanCancel") == 2
    assert "EnginePersistDispatched" not in actions and "EngineInvokeAdapter" not in actions
    i = actions.index("HumanCancel")
    assert actions[i + 1] == "Recover"


@pytest.mark.parametrize("policy", ["manual", "idempotent", "reconcile"])
def test_fused_runs_of_the_engine_are_spec_behaviours(policy: str, tmp_path: Path) -> None:
    """TurnEngine(fused=True), a tool needing no approval: the first commit creates the
    session, records the call and dispatches it.  A clean run, a run with a lost answer,
    and a run that crashes right after that first commit (then a new process resumes;
    a halted manual call is resolved by a human who looked at the outbox) are
    validated by TLC; the fused batch is one
    ``Logged`` entry whose actions are consecutive spec steps."""
    tools = {TOOL: (policy, False)}
    script: list[Sequence[dict[str, Any]] | str] = [
        [tool_call("call_0", TOOL, ARGUMENTS)], "The email is sent."]
    runs = []
    for name, faults, crash_at in (("clean", [], None),
                                   ("lost-answer", [Fault.LOSE_ANSWER], None),
                                   ("crash", [], "after EnginePersistDispatched")):
        kit = Kit(tmp_path, f"fused-{policy}-{name}")
        kit.system.fault(*faults)
        with kt.KitRecorder() as recorder:
            try:
                result = kit.engine(tools, script, crash_at=crash_at, fused=True).run(USER_TEXT)
            except SimulatedCrash:
                result = kit.engine(tools, script, fused=True).resume()
            if result.status is TurnStatus.RECOVERY_REQUIRED:
                # manual: a careful human looks at the outbox first
                applied = CountingExternalSystem(kit.system.path).effects() > 0
                result = kit.engine(tools, script, fused=True).resolve_recovery(
                    result.halted[0], "applied" if applied else "retry",
                    result_text="a human checked the outbox" if applied else None)
        kit.close()
        assert result.status is TurnStatus.DONE, (name, result)
        world = CountingExternalSystem(kit.system.path)
        assert world.effects() == 1, name  # once, whatever happened
        runs.append(KitRun(f"fused {policy} {name}", recorder.of(SESSION_ID), world))
    first = next([ev.action.value for ev in e.events] for e in runs[0].recording if e.events)
    assert first == ["ProviderEmitCall", "EnginePersistCall", "EnginePersistDispatched"]
    cfg = kt.kit_config([r.recording for r in runs])
    result_, _ = validate(cfg, runs)
    assert result_.ok, result_.describe() + "\n" + result_.tlc.output[-2000:]
    assert "Crash" in runs[2].actions(cfg)


def _resolve_as_a_careful_human(kit: Kit, engine: Callable[[], TurnEngine],
                                result: TurnResult) -> TurnResult:
    """Every halted call: "applied" with what the outbox shows if its effect is there,
    else "retry" (nothing is in flight in these runs)."""
    for _ in range(4):
        if result.status is not TurnStatus.RECOVERY_REQUIRED:
            return result
        e = engine()
        item = next(i for i in e.recovery_required() if i.position == result.halted[0])
        world = CountingExternalSystem(kit.system.path)
        applied = [r for r in world.requests if r.execution_id == item.execution_id
                   and r.result is not None]
        result = e.resolve_recovery(item.position, "applied" if applied else "retry",
                                    result_text=applied[0].result if applied else None)
    return result


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["manual", "idempotent", "reconcile"])
def test_together_runs_of_the_engine_are_spec_behaviours(policy: str, tmp_path: Path) -> None:
    """TurnEngine(together=True), two calls of a tool needing no approval in one message:
    ONE commit creates the session, records both calls and dispatches both; both bodies
    run; ONE commit records both outcomes and results.  A clean run, a lost answer of
    the first call (decided at once, no outcome recorded before it), a crash right
    after the record commit and a crash between the two effects (both calls
    dispatched-and-unknown; a new process resumes, a careful human answers what halts)
    are recorded, replayed and validated by TLC: the batches are consecutive spec steps."""
    tools = {TOOL: (policy, False)}
    script: list[Sequence[dict[str, Any]] | str] = [
        [tool_call("call_0", TOOL, ARGUMENTS),
         tool_call("call_1", TOOL, {**ARGUMENTS, "to": "bob@example.com"})],
        "Both emails are sent."]
    runs = []
    for name, faults, crash_at in (("clean", [], None),
                                   ("lost-answer", [Fault.LOSE_ANSWER], None),
                                   ("crash-after-record", [], "after EnginePersistDispatched"),
                                   ("crash-between-effects", [], "after ExternalApply")):
        kit = Kit(tmp_path, f"together-{policy}-{name}")
        kit.system.fault(*faults)

        def engine(crash: str | None = None, k: Kit = kit) -> TurnEngine:
            return k.engine(tools, script, crash_at=crash, together=True)

        with kt.KitRecorder() as recorder:
            try:
                result = engine(crash_at).run(USER_TEXT)
            except SimulatedCrash:
                result = engine().resume()
            result = _resolve_as_a_careful_human(kit, engine, result)
        kit.close()
        assert result.status is TurnStatus.DONE, (name, result)
        world = CountingExternalSystem(kit.system.path)
        assert world.effects() == 2, name  # each email once, whatever happened
        runs.append(KitRun(f"together {policy} {name}", recorder.of(SESSION_ID), world))
    batches = [[ev.action.value for ev in e.events] for e in runs[0].recording
               if len(e.events) > 1]
    assert batches == [
        ["ProviderEmitCall", "ProviderEmitCall", "EnginePersistCall", "EnginePersistCall",
         "EnginePersistDispatched", "EnginePersistDispatched"],
        ["EngineRecordSucceeded", "EngineAppendResult", "EngineRecordSucceeded",
         "EngineAppendResult"]], batches
    cfg = kt.kit_config([r.recording for r in runs])
    assert [c.position for c in cfg.calls] == [(1, 0), (1, 1)]
    result_, _ = validate(cfg, runs)
    assert result_.ok, result_.describe() + "\n" + result_.tlc.output[-2000:]
    for run in runs[2:]:
        actions = run.actions(cfg)
        crash = actions.index("Crash")
        # both calls were dispatched before the crash; after it, Recover decides both
        assert actions[:crash].count("EnginePersistDispatched") == 2, (run.name, actions)
        assert actions[crash + 1:].count("Recover") >= 2, (run.name, actions)
    between = runs[3].actions(cfg)
    assert between[:between.index("Crash")].count("ExternalApply") == 1  # one effect was out


def test_together_implies_fused_and_a_flag_that_is_not_a_bool_is_refused(
    tmp_path: Path,
) -> None:
    kit = Kit(tmp_path, "flags")
    script: list[Sequence[dict[str, Any]] | str] = ["hi"]
    engine = kit.engine({TOOL: ("manual", False)}, script, together=True)
    assert engine.fused and engine.together
    assert not kit.engine({TOOL: ("manual", False)}, script, fused=True).together
    with pytest.raises(InvalidInput, match="together must be True or False"):
        TurnEngine(session_id=SESSION_ID, registry=ToolRegistry(),
                   provider=ScriptedProvider(script), human=ScriptedHuman(),
                   conversations=FileConversationStore(tmp_path / "c"),
                   store=kit.stores[-1], together="yes")  # type: ignore[arg-type]
    kit.close()
