"""Trace validation: TLC checks that recorded reference runs are spec behaviours.

A run of the reference (a Hypothesis example, a random walk, an engine-kit
simulation) is recorded as a :class:`Trace`: the action of every step and
the spec state after it, through :func:`toolledger.check.mapping.to_spec`.  This
module writes the traces into a TLA+ module that replays them against
``DurableToolExecution`` (the technique of Cirstea, Kuppe, Loillier and Merz,
2024): the first state must satisfy ``Init``, and each step must be a step
of the named action whose successor is exactly the recorded state.  TLC
then reports either success (every trace is a behaviour of the spec) or a
deadlock at the first step that is not, which is turned into a
:class:`TraceFailure` naming the trace, the step and the action.

Traces may use bigger constants than the exhaustive models (more calls, more
crashes): following a trace costs TLC almost nothing.  The generated files
live in a temporary directory; nothing in the repository is written.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .._core import protocol as p
from .mapping import SPEC_VARIABLES, to_spec
from .system import ModelConfig, SystemState, initial_states, successors
from .tlavalues import FnValue, Value, serialize
from .tlc import Outcome, TLCResult, run_tlc

__all__ = [
    "Trace",
    "TraceFailure",
    "TraceValidation",
    "config_module",
    "random_walk",
    "trace_of",
    "validate_traces",
]

# Every action of Next with its quantifier, as written in the spec.
_STEP: dict[str, str] = {
    "ProviderEmitCall": r"\E c \in Calls, a \in Args : ProviderEmitCall(c, a)",
    **{
        a.value: rf"\E e \in ExecIds : {a.value}(e)"
        for a in (
            p.Action.ExternalApply,
            p.Action.ExternalApplyLoseAnswer,
            p.Action.ExternalRejectDefinite,
            p.Action.ExternalDropFenced,
            p.Action.EngineDiscardLateReturn,
            p.Action.RetentionWindowPasses,
            p.Action.ExternalExpireKey,
            p.Action.ExternalAnswerInFlight,
            p.Action.ExternalAnswerParamsDiffer,
            p.Action.ExternalReplayFailure,
        )
    },
    "Crash": "Crash",
}
for _a in p.Action:
    _STEP.setdefault(_a.value, rf"\E c \in Calls : {_a.value}(c)")


@dataclass(frozen=True)
class Trace:
    """A recorded run: ``steps[0]`` is ``("Init", state)``."""

    steps: tuple[tuple[str, dict[str, Value]], ...]
    origin: str = ""

    def __len__(self) -> int:
        return len(self.steps)


def trace_of(
    cfg: ModelConfig, run: Sequence[tuple[str, SystemState]], origin: str = ""
) -> Trace:
    """Map a run of reference states (first action ``"Init"``) to a trace."""
    return Trace(tuple((a, to_spec(cfg, s)) for a, s in run), origin)


def random_walk(
    cfg: ModelConfig,
    seed: int,
    length: int,
    *,
    successors_fn: Callable[[ModelConfig, SystemState], list[tuple[p.Action, SystemState]]]
    = successors,
) -> Trace:
    """A seeded random run of the reference (deterministic for a seed)."""
    rng = random.Random(seed)
    state = rng.choice(initial_states(cfg))
    run: list[tuple[str, SystemState]] = [("Init", state)]
    for _ in range(length):
        options = successors_fn(cfg, state)
        if not options:
            break
        action, state = rng.choice(options)
        run.append((action.value, state))
    return trace_of(cfg, run, origin=f"random walk seed={seed}")


@dataclass(frozen=True)
class TraceFailure:
    trace: int  # 0-based index into the validated traces
    step: int  # index of the first step that is not a spec step
    action: str
    origin: str


@dataclass
class TraceValidation:
    traces: int
    steps: int
    ok: bool
    failure: TraceFailure | None
    tlc: TLCResult
    module_text: str = field(repr=False, default="")

    def describe(self) -> str:
        if self.ok:
            return f"{self.traces} traces ({self.steps} steps) are behaviours of the spec"
        f = self.failure
        if f is None:
            return f"TLC did not validate the traces: {self.tlc.outcome.name} {self.tlc.error_text}"
        return (
            f"trace {f.trace} ({f.origin}) is not a behaviour of the spec: "
            f"step {f.step} ({f.action}) is not a step the spec allows from the state before it"
        )


def _fn(d: dict[str, Value]) -> str:
    return serialize(FnValue(d))


def config_module(cfg: ModelConfig, name: str) -> str:
    """A model module with ``cfg``'s constants as literals (like ``model/MC*.tla``)."""
    calls = cfg.calls
    lines = [
        f"---- MODULE {name} ----",
        "EXTENDS DurableToolExecution",
        f"MCCalls == {serialize(frozenset(c.name for c in calls))}",
        f"MCTurn == {_fn({c.name: c.position[0] for c in calls})}",
        f"MCSlot == {_fn({c.name: c.position[1] for c in calls})}",
        f"MCToolCallId == {_fn({c.name: c.tool_call_id for c in calls})}",
        f"MCPolicy == {_fn({c.name: c.tool.policy.value for c in calls})}",
        f"MCNeedsApproval == {_fn({c.name: c.tool.requires_approval for c in calls})}",
        f"MCArgChoices == {_fn({c.name: frozenset(c.arg_choices) for c in calls})}",
        f"MCMarkerTurn == {cfg.marker}",
        f"MCMaxCrashes == {cfg.max_crashes}",
        f"MCMaxAttempts == {cfg.max_attempts}",
        f"MCKeyByPosition == {serialize(cfg.key_by_position)}",
        f"MCFenceOnReconcile == {serialize(cfg.fence_on_reconcile)}",
        f"MCMaxRepairs == {cfg.max_repairs}",
        f"MCMaxRenumbers == {cfg.max_renumbers}",
        f"MCKeysExpire == {serialize(cfg.keys_expire)}",
        f"MCKeyAnswers == {serialize(cfg.key_answers)}",
        "====",
    ]
    return "\n".join(lines) + "\n"


_CONSTANTS = (
    "Calls", "Turn", "Slot", "ToolCallId", "Policy", "NeedsApproval", "ArgChoices",
    "MarkerTurn", "MaxCrashes", "MaxAttempts", "KeyByPosition", "FenceOnReconcile",
)  # fmt: skip


def _trace_module(config: str, traces: Sequence[Trace]) -> str:
    # One definition per recorded state: SANY parses many small definitions
    # in linear time, but one big nested literal in super-linear time (a
    # 1.6 MB TraceData took 100 s to parse; split, about a second).
    states = []
    rows = []
    for i, t in enumerate(traces, 1):
        names = []
        for j, (_, s) in enumerate(t.steps, 1):
            states.append(f"T{i}S{j} == {_fn(s)}")
            names.append(f"T{i}S{j}")
        rows.append(
            "<<" + ", ".join(f"<<{serialize(a)}, {n}>>" for (a, _), n in
                             zip(t.steps, names, strict=True)) + ">>"
        )
    data = "\n".join(states) + "\n\nTraceData == <<\n  " + ",\n  ".join(rows) + "\n>>"

    def assign(prime: str, idx: object) -> str:
        return "\n".join(
            f"    /\\ {v}{prime} = TraceData[tNum][{idx}][2].{v}" for v in SPEC_VARIABLES
        )

    cases = "\n    [] ".join(f'l = "{a}" -> {body}' for a, body in _STEP.items())
    return f"""---- MODULE TraceCheck ----
EXTENDS {config}, TLC, Sequences
VARIABLES tNum, tIdx

{data}

Step(l) ==
    CASE {cases}
    [] OTHER -> FALSE

TraceInit ==
    /\\ tNum \\in 1..Len(TraceData)
    /\\ tIdx = 1
{assign("", 1)}

TraceNext ==
    /\\ tIdx < Len(TraceData[tNum])
    /\\ tIdx' = tIdx + 1
    /\\ tNum' = tNum
{assign("'", "tIdx + 1")}
    /\\ Step(TraceData[tNum][tIdx + 1][1])

TraceDone == tIdx = Len(TraceData[tNum]) /\\ UNCHANGED <<vars, tNum, tIdx>>
TraceStep == TraceNext \\/ TraceDone

TraceStartsInInit == tIdx = 1 => Init
====
"""


def _trace_cfg(cfg: ModelConfig) -> str:
    subs = "\n".join(f"    {c} <- MC{c}" for c in _CONSTANTS)
    if not cfg.decision_rows_with_inputs:  # as the model's own .cfg does
        subs += "\n    RowInputs <- WithoutInputs"
    # definitions, 0 unless overridden, as the LostConversation and
    # Renumbered models' .cfg files do
    if cfg.max_repairs:
        subs += "\n    MaxRepairs <- MCMaxRepairs"
    if cfg.max_renumbers:
        subs += "\n    MaxRenumbers <- MCMaxRenumbers"
    if cfg.keys_expire:  # KeysExpire is a definition, FALSE unless overridden
        subs += "\n    KeysExpire <- MCKeysExpire"
    if cfg.key_answers:  # KeyAnswers too
        subs += "\n    KeyAnswers <- MCKeyAnswers"
    return f"CONSTANTS\n{subs}\nINIT TraceInit\nNEXT TraceStep\nINVARIANT TraceStartsInInit\n"


def validate_traces(
    root: Path, cfg: ModelConfig, traces: Sequence[Trace], *, timeout: float = 300
) -> TraceValidation:
    """Ask TLC whether every trace is a behaviour of ``DurableToolExecution``."""
    if not traces:
        raise ValueError("no traces to validate: record at least one run")
    with tempfile.TemporaryDirectory(prefix="toolledger-trace-") as tmp:
        d = Path(tmp)
        (d / "MCTrace.tla").write_text(config_module(cfg, "MCTrace"))
        text = _trace_module("MCTrace", traces)
        (d / "TraceCheck.tla").write_text(text)
        (d / "TraceCheck.cfg").write_text(_trace_cfg(cfg))
        result = run_tlc(
            "TraceCheck",
            d / "TraceCheck.cfg",
            search_dirs=[root / "spec", d],
            check_deadlock=True,
            timeout=timeout,
        )
    steps = sum(len(t) for t in traces)
    failure = None
    if result.outcome is Outcome.DEADLOCK and result.trace:
        last = result.trace[-1].state
        n, i = last.get("tNum"), last.get("tIdx")
        if isinstance(n, int) and isinstance(i, int):
            t = traces[n - 1]
            failure = TraceFailure(n - 1, i, t.steps[i][0], t.origin)
    elif result.outcome is Outcome.INVARIANT_VIOLATED and result.trace:
        n = result.trace[0].state.get("tNum")
        if isinstance(n, int):
            failure = TraceFailure(n - 1, 0, "Init", traces[n - 1].origin)
    return TraceValidation(
        traces=len(traces),
        steps=steps,
        ok=result.outcome is Outcome.PASS,
        failure=failure,
        tlc=result,
        module_text=text,
    )
