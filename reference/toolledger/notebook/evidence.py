"""The notebooks' long evidence, folded into functions named for what they show.

Each function here runs one piece of evidence a notebook shows (a cross-check
of the fault matrix against the spec, a recovery resolved three ways, ...) and
returns a small frozen result with the figures the notebook prints and
asserts.  The ``assert`` statements themselves stay in the notebook cells, so
a reviewer sees what is claimed next to the call that measures it; the
functions only measure.  :mod:`toolledger.notebook.support` holds the generic
helpers (tables, figures, TLC runs); this module holds the evidence.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolledger._core import protocol as p
from toolledger._core.stores import AuditRow, MemoryStore
from toolledger._core.tools import ToolRegistry
from toolledger.check.conformance import ConformanceReport, check_graph
from toolledger.check.invariants import INVARIANTS, settled
from toolledger.check.manifest import Manifest
from toolledger.check.mapping import from_spec
from toolledger.check.stategraph import StateGraph
from toolledger.check.system import ModelConfig
from toolledger.check.tlavalues import Value
from toolledger.check.tlc import Outcome, TLCResult
from toolledger.check.tracecheck import Trace, TraceValidation, trace_of, validate_traces
from toolledger.kit.engine import (
    CrashInjector,
    MemoryConversationStore,
    RecoveryItem,
    ScriptedHuman,
    SimulatedCrash,
    TurnEngine,
    TurnResult,
    crash_points,
    parse_crash_point,
    tool_call,
)
from toolledger.kit.external import CountingAdapter, CountingExternalSystem
from toolledger.kit.simulate import (
    ARGUMENTS,
    HUMAN_RESULT,
    TOOL,
    USER_TEXT,
    SimulationReport,
    run_simulation,
)
from toolledger.notebook.figures import (
    GraphDrawing,
    draw_state_graph,
    ledger_status,
    trace_table_html,
)
from toolledger.notebook.figures_matrix import (
    LedgerTape,
    MatrixCell,
    SpecRun,
    invariant_violations,
    run_cell,
    scenario_engine,
    spec_run,
)
from toolledger.notebook.support import (
    ModelRun,
    SqliteWorld,
    TLCWorkspace,
    TwinStudy,
    invariants_of,
    manual_calls_model,
    one_call_model,
    run_manifest_model,
    short_id,
    step_value,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# --------------------------------------------------------------------------
# Notebook 03: the fault matrix against the spec and TLC
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class SimulateTwins:
    """The new-session cells of the fault matrix, measured again by ``run_simulation``."""

    compared: int
    differing: tuple[str, ...]  # labels of the cells toolledger simulate measured otherwise


def toolledger_simulate_measures_every_new_session_cell_the_same(
        cells: Sequence[MatrixCell]) -> SimulateTwins:
    """Run ``toolledger simulate`` (in-process, exception mode) for every new-session cell and
    compare effects, invocations, decisions, turn status, tool result status and crash."""
    differing, compared = [], 0
    for c in cells:
        if c.session != "new":
            continue       # run_simulation has no legacy-session mode
        sim = run_simulation(c.engine, c.policy, c.point)
        if ((sim.effects_applied, sim.adapter_invocations, tuple(sim.decision_names),
             sim.turn_status, sim.final_tool_status, sim.crashed)
                != (c.effects, c.invocations, c.decisions, c.status, c.tool_status, c.crashed)):
            differing.append(c.label)
        compared += 1
    return SimulateTwins(compared, tuple(differing))


@dataclass(frozen=True)
class LedgerRunsAsSpecRuns:
    """The ledger-engine cells of the fault matrix mapped to runs of the model.

    ``invariant_breaks`` and ``count_mismatches`` name the mapped cells where a
    Python invariant fails in some state, or where the model's counts (effects
    applied, invocations sent by the ledger engine) differ from the external
    system's; both are empty when the kit and the model agree.
    """

    mapped: tuple[tuple[MatrixCell, SpecRun], ...]
    unmapped: tuple[tuple[MatrixCell, SpecRun], ...]
    invariant_breaks: tuple[str, ...]
    count_mismatches: tuple[str, ...]

    @property
    def states(self) -> int:
        return sum(len(run.steps) for _, run in self.mapped)

    def unmapped_rows(self) -> list[list[str]]:
        """``[cell label, why it has no spec run]`` per unmapped cell."""
        return [[c.label, run.note] for c, run in self.unmapped]


def every_ledger_run_is_a_run_of_the_model(cells: Sequence[MatrixCell]) -> LedgerRunsAsSpecRuns:
    """Map every ledger-engine cell (new and legacy sessions) to a run of the model, and
    check the Python invariants in each state and the model's counts against the kit's."""
    ledger_cells = ([c for c in cells if (c.engine, c.session) == ("ledger", "new")]
                    + [c for c in cells if (c.engine, c.session) == ("ledger", "legacy")])
    mapped: list[tuple[MatrixCell, SpecRun]] = []
    unmapped: list[tuple[MatrixCell, SpecRun]] = []
    for c in ledger_cells:
        run = spec_run(c)
        (mapped if run.mapped else unmapped).append((c, run))
    breaks, mismatches = [], []
    for c, run in mapped:
        if invariant_violations(run):
            breaks.append(c.label)
        assert run.config is not None  # a mapped run always has its model
        eid = run.config.exec_ids["c1"]
        # The spec's ghost history has one invocation per request the ledger engine sent;
        # the legacy engine's requests are part of the model's initial state.
        if c.protected and (run.final.external.count(eid) != c.effects
                            or len(run.final.ghosts.invoked("c1"))
                            != c.invocations - c.legacy_invocations):
            mismatches.append(c.label)
    return LedgerRunsAsSpecRuns(tuple(mapped), tuple(unmapped), tuple(breaks),
                                tuple(mismatches))


@dataclass(frozen=True)
class TraceVerdicts:
    """TLC's verdict on the mapped runs, one TLC run per (policy, marker)."""

    verdicts: dict[tuple[str, int], TraceValidation]
    seconds: float

    @property
    def traces(self) -> int:
        return sum(v.traces for v in self.verdicts.values())

    @property
    def refused(self) -> list[tuple[tuple[str, int], str]]:
        """The (policy, marker) groups TLC did not accept, with what TLC said."""
        return [(key, v.describe()) for key, v in sorted(self.verdicts.items()) if not v.ok]

    def rows(self) -> list[list[object]]:
        return [[policy, marker, v.traces, v.steps, f"{v.tlc.wall_seconds:.1f}", v.describe()]
                for (policy, marker), v in sorted(self.verdicts.items())]


def tlc_accepts_every_mapped_run_as_a_behaviour_of_the_spec(
        root: Path, mapped: Sequence[tuple[MatrixCell, SpecRun]], *,
        workers: int = 2) -> TraceVerdicts:
    """Hand the mapped runs to TLC as traces of ``spec/DurableToolExecution.tla``.

    A trace needs its model's constants, so the runs are grouped by policy and
    marker (one TLC run each, ``workers`` at a time, the biggest first);
    identical traces are sent once.
    """
    groups: dict[tuple[str, int], dict[str, Trace]] = {}
    configs = {}
    for c, run in mapped:
        assert run.config is not None, c.label
        key = (c.policy, run.config.marker)
        configs[key] = run.config
        trace = trace_of(run.config, run.steps, origin=c.label)
        groups.setdefault(key, {}).setdefault(repr(trace.steps), trace)

    def validate(key: tuple[str, int]) -> tuple[tuple[str, int], TraceValidation]:
        return key, validate_traces(root, configs[key], list(groups[key].values()))

    started = time.monotonic()
    order = sorted(groups, key=lambda k: -sum(len(t.steps) for t in groups[k].values()))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        verdicts = dict(pool.map(validate, order))
    return TraceVerdicts(verdicts, time.monotonic() - started)


# --------------------------------------------------------------------------
# Notebook 04: the state space
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class GraphChecks:
    """A state graph checked three more ways: conformance, Python invariants, end states.

    ``ends`` counts the end states (no successor) by (tool result kind in the conversation,
    ledger status, times the effect was applied) of the call ``exec_id``.
    """

    report: ConformanceReport
    broken: Mapping[str, int]  # Python invariant -> states where it fails
    unsettled: tuple[int, ...]  # end states that are not settled
    ends: Mapping[tuple[str, str, int], int]

    @property
    def wrong_human(self) -> int:
        """End states where a human said "applied" although the effect never happened."""
        return sum(n for (kind, _, applied), n in self.ends.items()
                   if kind == "human" and applied == 0)

    def end_rows(self) -> list[list[object]]:
        return [[kind, status, applied, n] for (kind, status, applied), n in
                sorted(self.ends.items())]


END_HEADERS: tuple[str, ...] = ("tool result in the conversation", "ledger status",
                                "effect applied (times)", "end states")


def the_reference_agrees_with_every_state_and_every_end_is_settled(
        cfg: ModelConfig, graph: StateGraph, exec_id: Value, *, model: str = "Tiny"
) -> GraphChecks:
    """Check ``graph`` (TLC's whole state graph of ``cfg``) against the Python reference: its
    steps (:func:`~toolledger.check.conformance.check_graph`), its invariants in every state, and
    :func:`~toolledger.check.invariants.settled` in every end state; count the end states."""
    report = check_graph(cfg, graph, model=model)
    broken: Counter[str] = Counter(
        name for s in graph.states.values() for name in INVARIANTS
        if INVARIANTS[name](cfg, from_spec(cfg, s)))
    unsettled, ends = [], Counter[tuple[str, str, int]]()
    for node in graph.terminal():
        state = graph.states[node]
        if settled(cfg, from_spec(cfg, state)):   # settled() lists what is not settled
            unsettled.append(node)
        result, applied = state["result"], state["applied"]
        assert isinstance(result, Mapping) and isinstance(applied, Mapping)
        kind, times = result["c1"], applied[exec_id]
        assert isinstance(kind, Mapping) and isinstance(times, int)
        ends[(str(kind["kind"]), ledger_status(state, exec_id), times)] += 1
    return GraphChecks(report, dict(broken), tuple(unsettled), dict(ends))


@dataclass(frozen=True)
class StateSpaceGrowth:
    """TLC's distinct states for manual-call models, by (calls, MaxCrashes)."""

    results: dict[tuple[int, int], TLCResult]
    seconds: float

    @property
    def counts(self) -> dict[tuple[int, int], int]:
        """(calls, crashes) -> distinct states (0 where TLC reported none)."""
        return {pt: r.distinct_states or 0 for pt, r in self.results.items()}

    @property
    def failed(self) -> list[tuple[tuple[int, int], Outcome]]:
        """The models where TLC found an error (every invariant must hold)."""
        return [(pt, r.outcome) for pt, r in sorted(self.results.items())
                if r.outcome is not Outcome.PASS]

    @property
    def not_growing(self) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        """Pairs (smaller, bigger) where one more call or crash did not add states."""
        c = self.counts
        return [(pt, nxt) for pt in sorted(c) for nxt in ((pt[0], pt[1] + 1), (pt[0] + 1, pt[1]))
                if nxt in c and c[nxt] <= c[pt]]

    @property
    def per_call(self) -> list[float]:
        """How much a second call multiplies the states, per MaxCrashes both models have."""
        c = self.counts
        return [c[2, k] / c[1, k] for k in sorted({k for _, k in c}) if (1, k) in c and (2, k) in c]

    @property
    def per_crash(self) -> list[float]:
        """How much one more crash multiplies the states, per model and crash count."""
        c = self.counts
        return [c[n, k + 1] / c[n, k] for n, k in sorted(c) if (n, k + 1) in c]

    def rows(self) -> list[list[object]]:
        return [[n, k, f"{self.counts[n, k]:,}", r.depth, f"{r.wall_seconds:.1f} s"]
                for (n, k), r in sorted(self.results.items())]


GROWTH_HEADERS: tuple[str, ...] = ("calls", "MaxCrashes", "distinct states", "depth",
                                   "TLC time")


def the_state_space_grows_with_every_call_and_crash(
        workspace: TLCWorkspace, invariants: Sequence[str],
        points: Sequence[tuple[int, int]], *, workers: int = 2) -> StateSpaceGrowth:
    """Model-check :func:`~toolledger.notebook.support.manual_calls_model` at each
    ``(calls, crashes)`` of ``points`` with ``invariants``, ``workers`` at a time (give the
    biggest first)."""
    def check(point: tuple[int, int]) -> tuple[tuple[int, int], TLCResult]:
        calls, crashes = point
        run = workspace.model_check(manual_calls_model(calls, crashes),
                                    f"Family{calls}x{crashes}", invariants=invariants)
        return point, run.result

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = dict(pool.map(check, points))
    return StateSpaceGrowth(results, time.monotonic() - started)


@dataclass(frozen=True)
class WayIntoTheViolatingRegion:
    """A broken twin's state graph drawn with its violating states and the shortest path to
    them, and that path as a table."""

    violating_status: Mapping[str, int]  # ledger status -> violating states with it
    figure: Figure
    drawn: GraphDrawing
    alt: str
    path_table_html: str


def the_shortest_way_into_the_violating_region(
        study: TwinStudy, exec_id: Value, *, ringed: str, legend_title: str,
        hide: Sequence[str] = ()) -> WayIntoTheViolatingRegion:
    """Draw ``study``'s graph coloured by the ledger status of ``exec_id``, the violating states
    ringed (``ringed`` says what they are, for the alt text) and the shortest path to the
    nearest one thick; and the path as a table (``hide``: variables left out)."""
    graph = study.graph
    status = {n: ledger_status(s, exec_id) for n, s in graph.states.items()}
    fig, drawn = draw_state_graph(
        graph, status, highlight=study.violating, path=study.path, legend_title=legend_title,
        title=f"{study.name} (0 crashes): where {study.invariant} breaks")
    alt = (f"State graph of {study.name} without crashes: {len(graph.states)} faint states, "
           f"{len(study.violating)} of them ringed in red ({ringed}), and a thick numbered path "
           f"of {len(study.path)} states from Init to the nearest one.")
    table = trace_table_html(graph.trace_to(study.nearest), violated=study.invariant,
                             show_init=False, hide=tuple(hide),
                             caption="the numbered path: the shortest way into the violating "
                                     "region")
    return WayIntoTheViolatingRegion(dict(Counter(status[n] for n in study.violating)), fig,
                                     drawn, alt, table)


# --------------------------------------------------------------------------
# Notebook 05: the engine kit on a real SQLite store
# --------------------------------------------------------------------------

#: The user's request in notebook 05's turns.
EMAIL_ADA: str = "Email Ada the Q3 report."


@dataclass(frozen=True)
class HaltedAfterCrash:
    """A turn that died at ``crash_at`` and the restarted process's resume of it."""

    world: SqliteWorld
    crash: str  # what the dying process reported
    resumed: TurnEngine  # the restarted process
    result: TurnResult  # what its resume() returned

    @property
    def items(self) -> list[RecoveryItem]:
        """What a human is shown: ``TurnEngine.recovery_required()``."""
        return self.resumed.recovery_required()

    def item_rows(self) -> list[list[object]]:
        return [[i.position, i.tool, json.dumps(dict(i.arguments)), i.tool_call_id,
                 short_id(i.execution_id), i.attempt] for i in self.items]


ITEM_HEADERS: tuple[str, ...] = ("position", "tool", "arguments", "tool_call_id",
                                 "execution_id", "attempt")


def a_crash_after_the_email_went_out_is_resumed_from_the_files_only(
        workdir: Path, name: str, *, crash_at: str = "after ExternalApply") -> HaltedAfterCrash:
    """Run the approved turn on a new SQLite world named ``name``, kill it at ``crash_at``, and
    resume it in a new process that has only the files."""
    world = SqliteWorld(workdir, name)
    crash = "(no crash)"
    try:
        world.open_engine(crash_at=crash_at).run(EMAIL_ADA)
    except SimulatedCrash as died:
        world.tape.crashed()
        crash = str(died)
    resumed = world.open_engine()
    return HaltedAfterCrash(world, crash, resumed, resumed.resume())


@dataclass(frozen=True)
class Resolution:
    """A halted call after a human answered it in a new process."""

    resolution: str
    turn: str  # the turn status after the session resumed
    tool_message: Mapping[str, Any]  # the call's tool result in the conversation
    record: p.ExecutionRecord
    effects: int
    invocations: int
    new_rows: tuple[AuditRow, ...]  # the audit rows the resolution added

    def row(self) -> list[object]:
        return [self.resolution, self.turn, self.tool_message["content"],
                self.tool_message["status"],
                f"{self.record.status.value}, attempt {self.record.attempt}, "
                f"by {self.record.authorization.value}", self.effects, self.invocations]


RESOLUTION_HEADERS: tuple[str, ...] = (
    "resolution", "turn", "tool result in the conversation", "status", "ledger record",
    "effects", "invocations")


def a_human_resolves_the_halted_call(workdir: Path, resolution: str) -> Resolution:
    """Crash after the email went out, then a human answers ``resolution`` (``applied`` with
    the simulator's result text, ``retry`` or ``abandon``) in yet another process."""
    halted = a_crash_after_the_email_went_out_is_resumed_from_the_files_only(
        workdir, f"resolve-{resolution}")
    w = halted.world
    before = len(w.store.audit(halted.resumed.session_id))
    engine = w.open_engine()                 # the human answers later, in a new process
    text = HUMAN_RESULT if resolution == "applied" else None
    after = engine.resolve_recovery(halted.result.halted[0], resolution, result_text=text)
    tool_message = [m for m in engine.messages if m.get("role") == "tool"][-1]
    record = engine.ledger.state.record(tool_message["execution_id"])
    return Resolution(resolution, after.status.value, tool_message, record,
                      w.system.effects(), w.system.invocations(),
                      tuple(w.store.audit(engine.session_id)[before:]))


@dataclass(frozen=True)
class ReusedCallId:
    """The second turn of notebook 05: the model reuses ``call_0`` for an email to Bob."""

    calls: tuple[p.CallState, ...]  # the whole session's calls, from the store
    session: p.SessionState
    status: str  # the second turn's status
    effects: int  # effects of both turns on the ledger engine's external system
    ledger_asked: tuple[tuple[p.CallPosition, str], ...]  # (position, recipient) put to a human
    working_set: tuple[p.CallPosition, ...]  # the calls the ledger keeps in memory
    legacy_asked: tuple[tuple[p.CallPosition, str], ...]
    legacy_effects: int
    legacy_reuse_log: tuple[str, ...]  # the legacy engine's log lines about reusing an approval

    def call_rows(self) -> list[list[object]]:
        return [[c.position, c.tool_call_id, c.execution_id,
                 self.session.approval(c.execution_id).value,
                 self.session.record(c.execution_id).status.value,
                 c.result.kind.value if c.result else ""] for c in self.calls]

    def describe(self) -> str:
        return (f"ledger engine: the human was asked about {list(self.ledger_asked)}\n"
                f"legacy engine: the human was asked about {list(self.legacy_asked)}\n"
                f"legacy engine log: {list(self.legacy_reuse_log)}\n"
                f"ledger engine, kept in memory (the working set): {list(self.working_set)}")


CALL_HEADERS: tuple[str, ...] = ("position", "tool_call_id", "execution_id", "approval",
                                 "ledger record", "tool result")

#: The second turn's script: the model answers turn 1, then emits ``call_0`` again for Bob.
SECOND_TURN_SCRIPT: list[list[dict[str, Any]] | str] = [
    [tool_call("call_0", TOOL, ARGUMENTS)], "The email is sent.",
    [tool_call("call_0", TOOL, {**ARGUMENTS, "to": "bob@example.com"})], "Bob has it too."]


def a_reused_call_id_on_the_next_turn_asks_the_human_again(turn: SqliteWorld) -> ReusedCallId:
    """Run a second turn on ``turn`` (whose first turn sent Ada's email) in which the model
    reuses ``call_0``; run both turns on the legacy engine too, for comparison."""
    turn.tape = LedgerTape()
    human = ScriptedHuman(default="approve")
    engine = turn.open_engine(human=human, script=SECOND_TURN_SCRIPT)
    again = engine.run("Now email Bob the same.")
    session = engine.ledger.full_state()  # the whole session; memory keeps the working set
    legacy_system, legacy_human = CountingExternalSystem(), ScriptedHuman(default="approve")
    conversations = MemoryConversationStore()
    legacy: TurnEngine | None = None
    for text in (EMAIL_ADA, "Now email Bob the same."):
        legacy = scenario_engine("legacy", "manual", store=None, conversations=conversations,
                                 system=legacy_system, crash=CrashInjector(None),
                                 human=legacy_human, script=SECOND_TURN_SCRIPT)
        legacy.run(text)
    assert legacy is not None
    return ReusedCallId(
        calls=session.calls, session=session, status=again.status.value,
        effects=turn.system.effects(),
        ledger_asked=tuple((r.position, r.arguments["to"]) for r in human.asked),
        working_set=tuple(c.position for c in engine.ledger.state.calls),
        legacy_asked=tuple((r.position, r.arguments["to"]) for r in legacy_human.asked),
        legacy_effects=legacy_system.effects(),
        legacy_reuse_log=tuple(line for line in legacy.log if "reused" in line))


# --------------------------------------------------------------------------
# Notebook 06: the five questions
# --------------------------------------------------------------------------

#: The manifest models notebook 06 runs as they are.
MANIFEST_MODELS: tuple[str, ...] = ("LegacyUpgrade", "SuccessOnlyRecord", "KeyByToolCallId")

#: The one-call models notebook 06 builds: name -> (specification, properties, question).
#: ``OneManualCall`` checks every safety invariant; the two others check liveness.
ONE_CALL_QUESTIONS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "OneManualCall": ("Spec", (), "one manual call, a crash anywhere, a human who may retry: "
                      "does every invariant hold?"),
    "OneManualCallFair": ("FairSpec", ("EventuallySettled",), "with fair engine steps and "
                          "humans who answer: does every call settle?"),
    "OneManualCallNoHuman": ("EngineFairSpec", ("EventuallySettled",), "fair engine steps, no "
                             "fairness for humans: does every call settle?"),
}


def tlc_checks_the_models_behind_the_five_answers(
        manifest: Manifest, workspace: TLCWorkspace, *, workers: int = 2,
        manifest_models: Sequence[str] = MANIFEST_MODELS) -> dict[str, ModelRun]:
    """Run ``manifest_models`` (by default :data:`MANIFEST_MODELS`) and the one-call models of
    :data:`ONE_CALL_QUESTIONS` (one manual ``send_email`` call, 1 crash, 2 attempts),
    ``workers`` TLC runs at a time.

    Returned in that order, by name.  ``OneManualCall`` checks every safety invariant the CI
    models check (``TwoCalls``'s); the liveness models check ``TypeOK`` and their property.
    """
    safety = invariants_of(manifest.get("TwoCalls"))
    one_manual = one_call_model("manual")
    with ThreadPoolExecutor(max_workers=workers) as pool:
        jobs = [pool.submit(run_manifest_model, manifest, name) for name in manifest_models]
        jobs += [pool.submit(workspace.model_check, one_manual, name, specification=spec,
                             invariants=list(safety) if not props else ["TypeOK"],
                             properties=list(props), question=question)
                 for name, (spec, props, question) in ONE_CALL_QUESTIONS.items()]
        return {run.name: run for run in (job.result() for job in jobs)}


@dataclass(frozen=True)
class HumanReviews:
    """After a crash at the issue's rows 1-4, with a ``manual`` tool: the ledger engine with
    its record (a new session) against the conservative no-replay rule without a record (the
    ledger engine on an adopted legacy session, where it has no record to read)."""

    with_record: tuple[MatrixCell, ...]
    without_record: tuple[MatrixCell, ...]

    @property
    def reviews_with_record(self) -> int:
        return sum(c.status == "recovery_required" for c in self.with_record)

    @property
    def reviews_without_record(self) -> int:
        return sum(c.status == "recovery_required" for c in self.without_record)

    def rows(self) -> list[list[object]]:
        return [[n, f"{a.status}, effects {a.effects}", f"{b.status}, effects {b.effects}"]
                for n, (a, b) in enumerate(zip(self.with_record, self.without_record,
                                               strict=True), 1)]


#: The issue's rows 1-4 as (ledger crash point, legacy crash point): row 4, "succeeded but
#: not in the conversation", is a different step on each engine.
ISSUE_ROWS_1_TO_4: tuple[tuple[str, str], ...] = (
    ("after HumanApprove", "after HumanApprove"),
    ("after EngineInvokeAdapter", "after EngineInvokeAdapter"),
    ("after ExternalApply", "after ExternalApply"),
    ("after EngineRecordSucceeded", "after EngineAppendResult"))


def without_the_record_never_replay_needs_a_human_at_every_row() -> HumanReviews:
    """Run the issue's rows 1-4 with a ``manual`` tool with and without the record."""
    return HumanReviews(
        tuple(run_cell("ledger", "new", "manual", ledger) for ledger, _ in ISSUE_ROWS_1_TO_4),
        tuple(run_cell("ledger", "legacy", "manual", legacy) for _, legacy in ISSUE_ROWS_1_TO_4))


def policy_crash_rows(reports: Sequence[SimulationReport]) -> list[list[object]]:
    """One row per simulation: policy, decisions, turn, invocations, effects, the
    idempotency keys the external system received (cut to 13 characters)."""
    return [[r.policy, ", ".join(r.decision_names), r.turn_status, r.adapter_invocations,
             r.effects_applied,
             ", ".join(str(q["idempotency_key"])[:13] + "…" if q["idempotency_key"] else "(none)"
                       for q in r.external_requests)] for r in reports]


def crash_points_where_each_policy_halts_for_a_human(
        policies: Sequence[str] = ("manual", "idempotent", "reconcile")) -> dict[str, list[str]]:
    """For each policy, the ledger crash points after which the resumed turn ends in
    ``recovery_required`` (a new session, one crash)."""
    return {policy: [cp.name for cp in crash_points("ledger")
                     if run_cell("ledger", "new", policy, cp).status == "recovery_required"]
            for policy in policies}


def the_policy_decides_an_unknown_outcome(max_attempts: int = 3) -> dict[str, str]:
    """``decide_recovery`` for an approved call found ``dispatched`` (outcome unknown, first
    attempt), per policy: policy -> decision."""
    out = {}
    for policy in p.RecoveryPolicy:
        inputs = p.RecoveryInputs(status=p.LedgerStatus.DISPATCHED, attempt=1,
                                  digest_matches=True, approval=p.ApprovalState.APPROVED,
                                  has_result=False, policy=policy, legacy=False,
                                  requires_approval=True, max_attempts=max_attempts)
        out[policy.value] = p.decide_recovery(inputs).decision.value
    return out


class _InvokeOnly:
    """An adapter with ``invoke`` but no ``reconcile``: not enough for a ``reconcile`` tool."""

    def invoke(self, arguments: Mapping[str, Any], *, execution_id: str, idempotency_key: str,
               attempt: int) -> Any:
        raise AssertionError("never called")


@dataclass(frozen=True)
class RegistryCheck:
    """What a registry did with one good and two bad declarations."""

    default_policy: p.RecoveryPolicy  # the policy of a tool registered without one
    refused: dict[str, str | None]  # tool name -> the refusal, or None if it was registered
    names: list[str]  # what the registry holds afterwards


def the_registry_checks_each_tools_policy(registry: ToolRegistry | None = None) -> RegistryCheck:
    """Register ``send_email`` without a policy, then ``send_sms`` with an unknown policy and
    ``create_ticket`` as ``reconcile`` with an adapter that cannot reconcile."""
    registry = ToolRegistry() if registry is None else registry
    adapter = CountingAdapter(CountingExternalSystem(), TOOL)
    default = registry.register("send_email", adapter).policy
    refused: dict[str, str | None] = {}
    for name, tool_adapter, policy in (("send_sms", adapter, "at_most_once"),
                                       ("create_ticket", _InvokeOnly(), "reconcile")):
        try:
            registry.register(name, tool_adapter, policy=policy)  # type: ignore[arg-type]
            refused[name] = None
        except p.InvalidInput as refusal:
            refused[name] = str(refusal)
    return RegistryCheck(default, refused, registry.names())


@dataclass(frozen=True)
class ModelSuppliedKey:
    """A turn whose model wrote ``arguments``: refused or not, and what it left behind."""

    refusal: str | None
    calls_recorded: int  # calls in the session's durable ledger
    invocations: int


def a_key_in_the_models_arguments_is_refused_before_anything_is_recorded(
        arguments: Mapping[str, Any] | None = None) -> ModelSuppliedKey:
    """Run an ``idempotent`` ``send_email`` turn whose model put ``arguments`` in its call
    (by default, the email's arguments plus an ``Idempotency-Key`` header)."""
    if arguments is None:
        arguments = {**ARGUMENTS, "headers": {"Idempotency-Key": "k1"}}
    store, system = MemoryStore(), CountingExternalSystem()
    engine = scenario_engine("ledger", "idempotent", store=store,
                             conversations=MemoryConversationStore(), system=system,
                             crash=CrashInjector(None),
                             script=[[tool_call("call_0", TOOL, dict(arguments))], "Sent."])
    try:
        engine.run(USER_TEXT)
        refusal = None
    except p.InvalidInput as refused:
        refusal = str(refused)
    return ModelSuppliedKey(refusal, len(engine.ledger.full_state().calls), system.invocations())


@dataclass(frozen=True)
class Stutter:
    """Where a liveness counterexample ends: the state it stutters in forever."""

    last_action: str
    msg: object
    stage: object
    approvals: frozenset[str]
    result: object

    def describe(self) -> str:
        return (f"msg {self.msg}, stage {self.stage}, approval {set(self.approvals)}, "
                f"result {self.result}")


def where_the_behaviour_stutters(result: TLCResult) -> Stutter:
    """The last state of ``result``'s lasso counterexample before it stutters (for ``c1``)."""
    stuck = result.trace[-2]
    approvals = stuck.state["approval"]
    assert isinstance(approvals, Mapping)   # TLC's function values map keys to values
    call_result = step_value(stuck, "result")
    assert isinstance(call_result, Mapping)
    return Stutter(result.trace[-1].action, step_value(stuck, "msg"), step_value(stuck, "stage"),
                   frozenset(str(a) for a in approvals.values()), call_result["kind"])


@dataclass(frozen=True)
class Restart:
    status: str  # what resume() returned
    items: tuple[tuple[str, p.CallPosition, int], ...]  # (tool, position, attempt) per item
    invocations: int  # the external system's count after the restart


@dataclass(frozen=True)
class HaltAcrossRestarts:
    """A manual call halted by a crash after the email went out, then restarted and answered."""

    ended: TurnResult  # the first resume
    restarts: tuple[Restart, ...]
    new_turn_refusal: str | None  # why a new turn was refused (None: it was not)
    answered: str  # the turn status after a human answered "applied"
    effects: int  # the external system's count at the end

    def describe(self) -> str:
        lines = [f"turn ends: {self.ended.status.value}, halted {self.ended.halted}"]
        lines += [f"restart {n}: {r.status}; the item: {list(r.items)}; invocations "
                  f"{r.invocations}" for n, r in enumerate(self.restarts, 1)]
        lines.append(f"new turn refused: {(self.new_turn_refusal or '(not refused)')[:90]}…")
        lines.append(f"a human answers 'applied': {self.answered}; effects {self.effects}")
        return "\n".join(lines)


def a_halted_call_stays_halted_across_restarts(
        restarts: int = 2, *, crash_at: str = "after ExternalApply") -> HaltAcrossRestarts:
    """Crash a ``manual`` call at ``crash_at``; resume; restart ``restarts`` more times; try a
    new turn; then a human answers ``applied``.  Every process shares only durable things."""
    store, conversations, system = (MemoryStore(), MemoryConversationStore(),
                                    CountingExternalSystem())

    def process(crash: str | None = None) -> TurnEngine:   # a (re)started process
        return scenario_engine("ledger", "manual", store=store, conversations=conversations,
                               system=system, crash=CrashInjector(
                                   parse_crash_point("ledger", crash) if crash else None))

    with contextlib.suppress(SimulatedCrash):
        process(crash_at).run(USER_TEXT)
    ended = process().resume()
    seen = []
    items: list[RecoveryItem] = []
    for _ in range(restarts):
        later = process()
        again = later.resume()
        items = later.recovery_required()
        seen.append(Restart(again.status.value,
                            tuple((i.tool, i.position, i.attempt) for i in items),
                            system.invocations()))
    try:
        process().run("Email Bob too.")
        refusal = None
    except p.InvalidInput as refused:
        refusal = str(refused)
    position = items[0].position if items else ended.halted[0]
    answered = process().resolve_recovery(position, "applied", result_text="sent")
    return HaltAcrossRestarts(ended, tuple(seen), refusal, answered.status.value,
                              system.effects())


@dataclass(frozen=True)
class LegacyDefault:
    """The seed's crashes on a legacy session, resumed by either engine (``manual`` tool)."""

    legacy_resume: MatrixCell  # the legacy engine resumes its own session
    adopted: MatrixCell  # the ledger engine adopts it: the email went out
    not_sent: MatrixCell  # the ledger engine adopts it: approved, nothing sent
    pending: MatrixCell  # the ledger engine adopts it: the approval still pending

    def rows(self) -> list[list[object]]:
        def row(died: str, by: str, c: MatrixCell) -> list[object]:
            return [died, by, ", ".join(c.decisions) or "(none)", c.status, c.effects]
        adopted = "the ledger engine (adopted)"
        return [row("after the email went out", "the legacy engine", self.legacy_resume),
                row("after the email went out", adopted, self.adopted),
                row("after approval, nothing sent", adopted, self.not_sent),
                row("approval still pending", adopted, self.pending)]


LEGACY_DEFAULT_HEADERS: tuple[str, ...] = ("the legacy engine died", "resumed by", "decision",
                                           "turn", "effects")


def the_ledger_engine_halts_an_adopted_call_the_legacy_engine_sends_twice() -> LegacyDefault:
    """Run the four legacy-session cells of notebook 06's question 5 (a ``manual`` tool)."""
    return LegacyDefault(
        run_cell("legacy", "new", "manual", "after ExternalApply"),
        run_cell("ledger", "legacy", "manual", "after ExternalApply"),
        run_cell("ledger", "legacy", "manual", "after HumanApprove"),
        run_cell("ledger", "legacy", "manual", "after EngineParkApproval"))


@dataclass(frozen=True)
class HumanRetry:
    """A legacy call adopted by the ledger engine, halted, and retried by a human."""

    marker: int  # the protocol marker the adoption set
    halted: str
    done: str
    effects: int
    attempt: int
    authorization: str

    def describe(self) -> str:
        return (f"adopted at marker {self.marker}; {self.halted} -> human retry -> {self.done}; "
                f"effects {self.effects}; record attempt {self.attempt} authorized by "
                f"{self.authorization}")


def a_human_retry_of_an_adopted_call_sends_it_once(
        legacy_crash_at: str = "after HumanApprove") -> HumanRetry:
    """The legacy engine dies at ``legacy_crash_at``; the ledger engine adopts the session,
    halts the call, and a human answers ``retry``."""
    store, conversations, system = (MemoryStore(), MemoryConversationStore(),
                                    CountingExternalSystem())
    with contextlib.suppress(SimulatedCrash):
        scenario_engine("legacy", "manual", store=None, conversations=conversations,
                        system=system, crash=CrashInjector(
                            parse_crash_point("legacy", legacy_crash_at))).run(USER_TEXT)
    tape = LedgerTape()
    engine = scenario_engine("ledger", "manual", store=store, conversations=conversations,
                             system=system, crash=CrashInjector(None), tape=tape)
    halted = engine.resume()
    done = engine.resolve_recovery(halted.halted[0], "retry")
    record = engine.ledger.state.record(engine.ledger.state.calls[0].execution_id)
    opened = tape.entries[0].after       # the session as the adoption left it
    assert opened is not None
    return HumanRetry(opened.marker, halted.status.value, done.status.value,
                      system.effects(), record.attempt, record.authorization.value)
