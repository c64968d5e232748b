"""The notebooks' long evidence, folded into functions named for what they show.

Each function here runs one piece of evidence a notebook shows (a cross-check
of the fault matrix against the spec, a recovery resolved three ways, ...) and
returns a small frozen result with the figures the notebook prints and
asserts.  The ``assert`` statements themselves stay in the notebook cells, so
a reviewer sees what is claimed next to the call that measures it; the
functions only measure.  :mod:`toolledger.notebook_support` holds the generic
helpers (tables, figures, TLC runs); this module holds the evidence.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolledger import protocol as p
from toolledger.adapters import CountingExternalSystem
from toolledger.engine import (
    CrashInjector,
    MemoryConversationStore,
    RecoveryItem,
    ScriptedHuman,
    SimulatedCrash,
    TurnEngine,
    TurnResult,
    tool_call,
)
from toolledger.figures_matrix import (
    LedgerTape,
    MatrixCell,
    SpecRun,
    invariant_violations,
    scenario_engine,
    spec_run,
)
from toolledger.notebook_support import SqliteWorld, short_id
from toolledger.simulate import ARGUMENTS, HUMAN_RESULT, TOOL
from toolledger.stores import AuditRow
from toolledger.tracecheck import Trace, TraceValidation, trace_of, validate_traces

# --------------------------------------------------------------------------
# Notebook 03: the fault matrix against the spec and TLC
# --------------------------------------------------------------------------


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
