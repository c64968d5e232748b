"""Bug-finding power: how fast Hypothesis and TLC find the seed's duplicate delivery.

What it measures
----------------
1. Hypothesis against the legacy engine kit (``TurnEngine`` in ``legacy``
   mode, today's behaviour of issue #443).  A scenario is drawn: one or two
   approved side-effecting calls in one assistant message, the crash point
   (any of the legacy engine's crash points, or none), and whether a request
   still in flight lands before the new process resumes.  The engine runs,
   dies at the point (:class:`~toolledger.kit.engine.SimulatedCrash`), a new
   engine resumes from the durable conversation and inbox, late requests
   land, and the property is the protocol's ``AtMostOnceEffect``: the
   external system applied no execution more than once.  ``hypothesis.find``
   searches for a violating scenario (generation only, no shrinking, no
   example database) with 20 different random seeds; reported: the median
   time and number of examples until the first violation.
   The same property run against the ledger engine (all four policies) is the
   control: it must find nothing, or the property would be vacuous.
2. TLC: wall time to the ``AtMostOnceEffect`` counterexample of the
   ``LegacyResume`` model (median of repeated runs, JVM start included), and
   the counterexample's length.

Goals: Hypothesis <= 1 s, TLC <= 5 s.
``python benchmarks/bench_bugfinding.py [--smoke]``.
"""

from __future__ import annotations

import contextlib
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, Phase, find, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from benchmarks.common import ROOT, Result, cli, heading, median, rounded
from toolledger._core.protocol import RecoveryPolicy
from toolledger._core.stores import MemoryStore
from toolledger._core.tools import ToolRegistry
from toolledger.check.manifest import load_manifest
from toolledger.check.tlc import run_tlc
from toolledger.kit.engine import (
    CrashInjector,
    CrashPoint,
    EngineMode,
    MemoryConversationStore,
    ScriptedHuman,
    ScriptedProvider,
    SimulatedCrash,
    TurnEngine,
    crash_points,
    tool_call,
)
from toolledger.kit.external import CountingAdapter, CountingExternalSystem

GOAL_HYPOTHESIS_SECONDS = 1.0
GOAL_TLC_SECONDS = 5.0
SEEDS = 20


@dataclass(frozen=True)
class Scenario:
    mode: EngineMode
    policy: RecoveryPolicy
    calls: int
    crash: CrashPoint | None
    deliver_before_resume: bool


def max_effects(s: Scenario) -> int:
    """Run the scenario (crash, resume, late requests); the most effects of one execution."""
    system = CountingExternalSystem()
    store = MemoryStore() if s.mode is EngineMode.LEDGER else None
    conversations = MemoryConversationStore()
    crash = CrashInjector(s.crash)
    calls = [tool_call(f"call_{i}", "send_email", {"to": f"user{i}@example.com"})
             for i in range(s.calls)]

    def engine(injector: CrashInjector) -> TurnEngine:
        registry = ToolRegistry()
        registry.register("send_email", CountingAdapter(system, "send_email",
                                                        on_request_sent=injector.request_sent),
                          policy=s.policy, requires_approval=True)
        return TurnEngine(session_id="s", mode=s.mode, registry=registry,
                          provider=ScriptedProvider([calls, "Sent."]),
                          human=ScriptedHuman(default="approve"), conversations=conversations,
                          store=store, crash=injector)

    try:
        engine(crash).run("send the emails")
    except SimulatedCrash:
        if s.deliver_before_resume:
            system.deliver_in_flight()
        engine(CrashInjector(None)).resume()
    system.deliver_in_flight()
    return max((system.effects(r.execution_id) for r in system.requests), default=0)


def scenarios(mode: EngineMode) -> st.SearchStrategy[Scenario]:
    policies = [RecoveryPolicy.MANUAL] if mode is EngineMode.LEGACY else [
        p for p in RecoveryPolicy if p is not RecoveryPolicy.READONLY]
    return st.builds(
        Scenario,
        mode=st.just(mode),
        policy=st.sampled_from(policies),
        calls=st.integers(1, 2),
        crash=st.sampled_from([*crash_points(mode), None]),
        deliver_before_resume=st.booleans(),
    )


def _settings(max_examples: int) -> settings:
    return settings(
        database=None,
        derandomize=False,  # the seed passed to find() decides (not a test profile)
        deadline=None,
        phases=[Phase.generate],
        max_examples=max_examples,
        suppress_health_check=list(HealthCheck),
    )


@dataclass
class Search:
    examples: int = 0
    first_failure_examples: int | None = None
    first_failure_seconds: float | None = None


def hypothesis_search(seed: int, mode: EngineMode, max_examples: int = 2000) -> Search:
    """``hypothesis.find`` a scenario with a duplicate effect; what it took."""
    search = Search()
    started = time.perf_counter()

    def duplicate(s: Scenario) -> bool:
        search.examples += 1
        bad = max_effects(s) > 1
        if bad and search.first_failure_seconds is None:
            search.first_failure_seconds = time.perf_counter() - started
            search.first_failure_examples = search.examples
        return bad

    with contextlib.suppress(NoSuchExample):  # nothing found: search.first_* stay None
        find(scenarios(mode), duplicate, settings=_settings(max_examples),
             random=random.Random(seed))
    return search


def run(smoke: bool = False) -> Result:
    seeds = 3 if smoke else SEEDS
    heading(f"Hypothesis vs the legacy engine: {seeds} seeds, AtMostOnceEffect")
    found: list[Search] = []
    for seed in range(seeds):
        r = hypothesis_search(seed, EngineMode.LEGACY)
        found.append(r)
        print(f"  seed {seed:2d}: " + (
            f"duplicate after {r.first_failure_examples} examples, "
            f"{r.first_failure_seconds:.3f} s" if r.first_failure_seconds is not None
            else f"nothing found in {r.examples} examples"), flush=True)
    hits = [r for r in found if r.first_failure_seconds is not None]
    secs = median([r.first_failure_seconds for r in hits if r.first_failure_seconds is not None]
                  ) if hits else None
    exs = median([float(r.first_failure_examples) for r in hits
                  if r.first_failure_examples is not None]) if hits else None
    print(f"found with {len(hits)}/{seeds} seeds; median {secs if secs is None else f'{secs:.3f}'}"
          f" s, {exs} examples to the first duplicate")

    control_examples = 50 if smoke else 500
    t0 = time.perf_counter()
    control = hypothesis_search(0, EngineMode.LEDGER, max_examples=control_examples)
    control_s = time.perf_counter() - t0
    print(f"control, the ledger engine (all protected policies): {control.examples} examples in "
          f"{control_s:.1f} s, duplicates found: "
          f"{'NONE' if control.first_failure_examples is None else 'YES (a bug!)'}")

    heading("TLC to the LegacyResume counterexample")
    manifest = load_manifest(ROOT)
    entry = manifest.get("LegacyResume")
    tlc_runs = []
    trace_len = 0
    violated = None
    for _ in range(1 if smoke else 5):
        tr = run_tlc(entry.module, entry.cfg_path, search_dirs=manifest.search_dirs,
                     check_deadlock=entry.check_deadlock)
        tlc_runs.append(tr.wall_seconds)
        trace_len, violated = len(tr.trace), tr.violated
    tlc_s = median(tlc_runs)
    print(f"TLC: {violated} violated, {trace_len}-state counterexample, median {tlc_s:.2f} s "
          f"(of {len(tlc_runs)}; JVM start included)")
    hyp_ok = secs is not None and secs <= GOAL_HYPOTHESIS_SECONDS and len(hits) == seeds
    print(f"goals: Hypothesis <= {GOAL_HYPOTHESIS_SECONDS:.0f} s: {'met' if hyp_ok else 'NOT met'};"
          f" TLC <= {GOAL_TLC_SECONDS:.0f} s: {'met' if tlc_s <= GOAL_TLC_SECONDS else 'NOT met'}")
    return {
        "hypothesis": {
            "seeds": seeds,
            "found_with_seeds": len(hits),
            "median_seconds": None if secs is None else rounded(secs, 4),
            "median_examples": exs,
            "max_seconds": rounded(max(r.first_failure_seconds or 0.0 for r in hits), 4)
            if hits else None,
            "per_seed": [{"seed": i, "examples": r.first_failure_examples,
                          "seconds": None if r.first_failure_seconds is None
                          else rounded(r.first_failure_seconds, 4)}
                         for i, r in enumerate(found)],
            "goal_seconds": GOAL_HYPOTHESIS_SECONDS,
            "goal_met": hyp_ok,
        },
        "control_ledger_engine": {
            "examples": control.examples,
            "seconds": rounded(control_s, 2),
            "duplicates_found": control.first_failure_examples is not None,
        },
        "tlc": {
            "model": entry.name,
            "violated": violated,
            "counterexample_states": trace_len,
            "median_seconds": rounded(tlc_s, 3),
            "runs": len(tlc_runs),
            "goal_seconds": GOAL_TLC_SECONDS,
            "goal_met": tlc_s <= GOAL_TLC_SECONDS,
        },
    }


def main(argv: list[str] | None = None) -> int:
    return cli(run, "time for Hypothesis and TLC to find the seed's duplicate delivery", argv)


if __name__ == "__main__":
    sys.exit(main())
