"""Model checking cost: wall time and distinct states of every model, and how they grow.

What it measures
----------------
1. Every model of ``model/manifest.toml`` (the CI set and the bigger non-CI
   ones), run with :func:`toolledger.check.tlc.run_tlc` exactly as ``toolledger
   check`` runs it (one TLC worker, ``-fp 0``): outcome, distinct states,
   wall time (median over the repetitions; it includes the JVM's start, about
   a second) and distinct states per second.
2. The CI set's total, two ways, in the same repetition: the sequential sum
   of the models' wall times, and the wall time of running them 2 at a time
   (what ``toolledger check`` does on 2 cores).  Full mode also times one
   complete ``toolledger check`` (TLC with state-graph dumps, then the
   exhaustive conformance check of the reference), the real CI cost.
3. Growth: generated models of ``DurableToolExecution`` with 1 to 3
   calls and 0 to 2 crashes (written with
   :func:`toolledger.check.tracecheck.config_module` into a temporary directory),
   the distinct states and wall time of each; a cell that exceeds the time
   limit is stopped and reported with the states seen so far.  The calls:
   manual + idempotent in turn 1, reconcile reusing ``call_0`` in turn 2,
   all approved, as in ``MCThreeCalls`` (c2 at slot 1 of turn 1, as in a
   real assistant message).

Goal: the CI set in <= 60 s.  ``python benchmarks/bench_models.py [--smoke]``.
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (
    ROOT,
    Result,
    cli,
    fmt_int,
    heading,
    median,
    rounded,
    scratch_dir,
    table,
)
from toolledger._core.protocol import RecoveryPolicy, ToolProfile
from toolledger.check.manifest import ModelEntry, load_manifest
from toolledger.check.system import CallConfig, ModelConfig
from toolledger.check.tlc import Outcome, TLCResult, run_tlc
from toolledger.check.tracecheck import config_module

CI_GOAL_SECONDS = 60.0
PARALLEL = 2  # toolledger check's default on a 2-core machine


@dataclass(frozen=True)
class Run:
    outcome: str
    violated: str | None
    distinct: int | None
    seconds: float


def _run(entry: ModelEntry, search_dirs: list[Path], timeout: float | None = None) -> Run:
    r = run_tlc(
        entry.module,
        entry.cfg_path,
        search_dirs=search_dirs,
        check_deadlock=entry.check_deadlock,
        workers=entry.workers,
        timeout=timeout,
        expected_states=entry.distinct_states,
    )
    return _as_run(r)


def _as_run(r: TLCResult) -> Run:
    return Run(r.outcome.value, r.violated, r.distinct_states, r.wall_seconds)


def _as_expected(entry: ModelEntry, run: Run) -> bool:
    if entry.expected_violation is None:
        ok_outcome = run.outcome == Outcome.PASS.value
    else:
        ok_outcome = run.violated == entry.expected_violation
    return ok_outcome and run.distinct == entry.distinct_states


# --------------------------------------------------------------------------
# Growth table
# --------------------------------------------------------------------------

_GROWTH_CALLS = (
    ("c1", (1, 0), "call_0", RecoveryPolicy.MANUAL, "a1"),
    ("c2", (1, 1), "call_1", RecoveryPolicy.IDEMPOTENT, "a2"),
    ("c3", (2, 0), "call_0", RecoveryPolicy.RECONCILE, "a3"),
)


def growth_config(calls: int, crashes: int) -> ModelConfig:
    """The first ``calls`` calls of ThreeCalls with ``crashes`` crashes."""
    return ModelConfig(
        calls=tuple(
            CallConfig(
                name,
                pos,
                tcid,
                ToolProfile(f"{pol.value}_tool_{name}", pol, True),
                (arg,),
            )
            for name, pos, tcid, pol, arg in _GROWTH_CALLS[:calls]
        ),
        marker=0,
        max_crashes=crashes,
        max_attempts=2,
    )


def run_growth_cell(calls: int, crashes: int, timeout: float) -> Run:
    """Model-check the generated model; the cfg is TwoCalls.cfg (same constants, invariants)."""
    name = f"MCGrowth{calls}x{crashes}"
    with scratch_dir("growth") as d:
        (d / f"{name}.tla").write_text(config_module(growth_config(calls, crashes), name))
        cfg = d / f"{name}.cfg"
        cfg.write_text((ROOT / "model" / "TwoCalls.cfg").read_text())
        r = run_tlc(name, cfg, search_dirs=[ROOT / "spec", d], check_deadlock=False,
                    timeout=timeout, jvm_args=())  # C2: the growth cells are the big runs
    return _as_run(r)


# --------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------


def _ci_pass(entries: list[ModelEntry], search_dirs: list[Path]) -> tuple[dict[str, Run], float]:
    """All CI models sequentially; returns their runs and the summed time."""
    runs = {e.name: _run(e, search_dirs) for e in entries}
    return runs, sum(r.seconds for r in runs.values())


def _ci_parallel(entries: list[ModelEntry], search_dirs: list[Path]) -> float:
    """Wall time of the CI models run PARALLEL at a time (as toolledger check does)."""
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        list(pool.map(lambda e: _run(e, search_dirs), entries))
    return time.perf_counter() - t0


def _toolledger_check() -> tuple[float, int]:
    """One complete ``toolledger check`` (TLC + dumps + conformance): wall s, exit code."""
    exe = Path(sys.executable).with_name("toolledger")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "toolledger.cli"]
    t0 = time.perf_counter()
    done = subprocess.run([*cmd, "check"], cwd=ROOT, capture_output=True, text=True,
                          check=False, timeout=3600)
    return time.perf_counter() - t0, done.returncode


def run(smoke: bool = False) -> Result:
    manifest = load_manifest(ROOT)
    dirs = manifest.search_dirs
    ci = manifest.ci_models()
    big = [e for e in manifest.models if not e.ci]
    if smoke:
        ci = [manifest.get("LegacyResume"), manifest.get("KeyByToolCallId")]
        big = []
    reps = 1 if smoke else 3

    heading(f"model checking: {len(ci)} CI models, {reps} repetition(s), sequential and "
            f"{PARALLEL} at a time")
    per_model: dict[str, list[Run]] = {e.name: [] for e in ci}
    seq_totals: list[float] = []
    par_totals: list[float] = []
    for i in range(reps):
        runs, total = _ci_pass(ci, dirs)
        for name, r in runs.items():
            per_model[name].append(r)
        seq_totals.append(total)
        par_totals.append(_ci_parallel(ci, dirs))
        print(f"  repetition {i + 1}: sequential sum {total:.1f} s, "
              f"{PARALLEL} at a time {par_totals[-1]:.1f} s", flush=True)

    big_reps = 1 if any(e.distinct_states > 1_000_000 for e in big) else reps
    for e in big:
        n = 1 if e.distinct_states > 1_000_000 else big_reps
        per_model[e.name] = [_run(e, dirs) for _ in range(n)]

    models: list[dict[str, Any]] = []
    rows = []
    for e in [*ci, *big]:
        rs = per_model[e.name]
        secs = median([r.seconds for r in rs])
        distinct = rs[0].distinct
        ok = all(_as_expected(e, r) for r in rs)
        rate = (distinct or 0) / secs if secs else 0.0
        got = rs[0].violated or rs[0].outcome
        models.append({
            "name": e.name, "ci": e.ci, "expect": e.expect, "got": got,
            "as_expected": ok, "distinct_states": distinct, "seconds": rounded(secs, 2),
            "states_per_second": round(rate), "runs": len(rs),
        })
        rows.append((e.name, "yes" if e.ci else "no", e.expect, got, fmt_int(distinct),
                     f"{secs:.2f}", fmt_int(round(rate)), "ok" if ok else "UNEXPECTED"))
    print(table(("model", "ci", "expected", "got", "distinct states", "wall s (median)",
                 "states/s", "vs manifest"), rows, right=(4, 5, 6)))

    seq = median(seq_totals)
    par = median(par_totals)
    check_s: float | None = None
    check_rc: int | None = None
    if not smoke:
        check_s, check_rc = _toolledger_check()
    print(f"CI set: sequential sum {seq:.1f} s, {PARALLEL} at a time {par:.1f} s "
          f"(medians of {reps}); goal <= {CI_GOAL_SECONDS:.0f} s: "
          f"{'met' if par <= CI_GOAL_SECONDS else 'NOT met'} for the parallel run")
    if check_s is not None:
        print(f"one complete `toolledger check` (TLC with dumps + conformance): {check_s:.1f} s, "
              f"exit {check_rc}")

    heading("growth of the state space: manual + idempotent (turn 1), reconcile (turn 2); "
            "1-3 calls x 0-2 crashes")
    cells = [(1, 0)] if smoke else [(n, k) for n in (1, 2, 3) for k in (0, 1, 2)]
    limit = 60.0 if smoke else 120.0
    growth: list[dict[str, Any]] = []
    grows = []
    for n, k in cells:
        r = run_growth_cell(n, k, limit)
        done = r.outcome != Outcome.TIMEOUT.value
        rate = (r.distinct or 0) / r.seconds if r.seconds else 0.0
        growth.append({"calls": n, "crashes": k, "outcome": r.outcome,
                       "distinct_states": r.distinct if done else None,
                       "distinct_states_seen": r.distinct, "seconds": rounded(r.seconds, 2),
                       "complete": done, "time_limit": limit})
        states = fmt_int(r.distinct) if done else f"> {fmt_int(r.distinct)}"
        wall = f"{r.seconds:.1f}" if done else f"> {limit:.0f} (stopped)"
        grows.append((n, k, r.outcome, states, wall, fmt_int(round(rate))))
        print(f"  {n} call(s), {k} crash(es): {states} states, {wall} s", flush=True)
    print(table(("calls", "crashes", "outcome", "distinct states", "wall s", "states/s"),
                grows, right=(0, 1, 3, 4, 5)))

    return {
        "models": models,
        "ci_set": {
            "models": len(ci),
            "repetitions": reps,
            "sequential_sum_seconds": rounded(seq, 2),
            "parallel_seconds": rounded(par, 2),
            "parallel_jobs": PARALLEL,
            "toolledger_check_seconds": None if check_s is None else rounded(check_s, 2),
            "toolledger_check_exit": check_rc,
            "goal_seconds": CI_GOAL_SECONDS,
            "goal_met": par <= CI_GOAL_SECONDS,
        },
        "growth": growth,
        "all_as_expected": all(m["as_expected"] for m in models),
    }


def main(argv: list[str] | None = None) -> int:
    return cli(run, "model checking time and state counts", argv)


if __name__ == "__main__":
    sys.exit(main())
