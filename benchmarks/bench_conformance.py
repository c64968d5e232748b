"""Exhaustive conformance vs TLC: what checking the reference against every state costs.

What it measures
----------------
On the ``TwoCalls`` model (the biggest CI model with ``conformance = true``),
in each repetition and side by side:

- TLC without a state-graph dump (what checking the model alone costs);
- TLC with ``-dump dot,actionlabels`` (what ``toolledger check`` runs, the
  dump being the input of the conformance check);
- loading the dump (:func:`toolledger.check.stategraph.load_dot`) and the check
  itself (:func:`toolledger.check.conformance.check_graph`, 2 worker processes as
  in ``toolledger check``).

The ratio is (load + check) / TLC, reported against both TLC times, so it
cannot flatter itself by picking the slower TLC run.  Medians over the
repetitions; the ratio is the median of the per-repetition ratios.

Goal: ratio <= 3.  ``python benchmarks/bench_conformance.py [--smoke]``.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_models import growth_config
from benchmarks.common import ROOT, Result, cli, heading, median, rounded, scratch_dir, table
from toolledger.check.conformance import check_graph
from toolledger.check.manifest import load_manifest
from toolledger.check.stategraph import load_dot
from toolledger.check.system import ModelConfig
from toolledger.check.tlc import TLCResult, run_tlc
from toolledger.check.tracecheck import config_module

GOAL_RATIO = 3.0


@dataclass(frozen=True)
class Model:
    """What TLC needs to check one model, and its constants for the reference."""

    name: str
    module: str
    cfg_path: Path
    dirs: list[Path]
    check_deadlock: bool
    config: ModelConfig


def _tlc(m: Model, dot: Path | None) -> TLCResult:
    return run_tlc(m.module, m.cfg_path, search_dirs=m.dirs, check_deadlock=m.check_deadlock,
                   dump_dot=dot)


def _two_calls() -> Model:
    manifest = load_manifest(ROOT)
    e = manifest.get("TwoCalls")
    return Model(e.name, e.module, e.cfg_path, manifest.search_dirs, e.check_deadlock,
                 ModelConfig.from_mc_module(ROOT / "model" / f"{e.module}.tla"))


def _tiny(d: Path) -> Model:
    """Smoke mode: one manual call, no crash (131 states), generated in ``d``."""
    # TwoCalls.cfg writes decision rows without their inputs: so must the mapping.
    cfg = replace(growth_config(1, 0), decision_rows_with_inputs=False)
    module = config_module(cfg, "MCTiny").replace(
        "====", "MCDecisionRowsWithInputs == FALSE\n====", 1)  # read by from_mc_module
    (d / "MCTiny.tla").write_text(module)
    (d / "MCTiny.cfg").write_text((ROOT / "model" / "TwoCalls.cfg").read_text())
    return Model("1 call, 0 crashes", "MCTiny", d / "MCTiny.cfg", [ROOT / "spec", d], False, cfg)


def run(smoke: bool = False) -> Result:
    with scratch_dir("conformance-model") as d:
        return _measure(_tiny(d) if smoke else _two_calls(), 1 if smoke else 3)


def _measure(model: Model, reps: int) -> Result:
    name = model.name
    cfg = model.config
    workers = min(2, os.cpu_count() or 1)
    heading(f"conformance vs TLC on {name}: {reps} repetition(s), {workers} conformance workers")

    plain: list[float] = []
    dumped: list[float] = []
    load: list[float] = []
    check: list[float] = []
    states = edges = mismatches = 0
    for i in range(reps):
        plain.append(_tlc(model, None).wall_seconds)
        with scratch_dir("conformance") as d:
            dot = d / "graph.dot"
            r = _tlc(model, dot)
            dumped.append(r.wall_seconds)
            dump_mb = dot.stat().st_size / 1e6
            t0 = time.perf_counter()
            graph = load_dot(dot)
            load.append(time.perf_counter() - t0)
        report = check_graph(cfg, graph, model=name, workers=workers)
        check.append(report.seconds)
        states, edges, mismatches = report.states, report.edges, report.mismatch_count
        del graph, report
        print(f"  repetition {i + 1}: TLC {plain[-1]:.1f} s, TLC+dump {dumped[-1]:.1f} s, "
              f"load {load[-1]:.1f} s, check {check[-1]:.1f} s", flush=True)

    conf = [a + b for a, b in zip(load, check, strict=True)]
    vs_plain = median([c / t for c, t in zip(conf, plain, strict=True)])
    vs_dump = median([c / t for c, t in zip(conf, dumped, strict=True)])
    print(table(
        ("what", "median s"),
        [("TLC, no dump", f"{median(plain):.2f}"),
         ("TLC with -dump dot", f"{median(dumped):.2f}"),
         ("load the dump (load_dot)", f"{median(load):.2f}"),
         (f"check_graph ({workers} workers)", f"{median(check):.2f}"),
         ("conformance = load + check", f"{median(conf):.2f}")],
        right=(1,),
    ))
    print(f"{states:,} states, {edges:,} edges, {dump_mb:.0f} MB dump, {mismatches} mismatches")
    print(f"ratio conformance / TLC: {vs_plain:.2f}x vs TLC without dump, {vs_dump:.2f}x vs "
          f"TLC with dump; goal <= {GOAL_RATIO:.0f}x: "
          f"{'met' if vs_plain <= GOAL_RATIO else 'NOT met'} (against TLC without dump)")
    return {
        "model": name,
        "repetitions": reps,
        "states": states,
        "edges": edges,
        "mismatches": mismatches,
        "dump_megabytes": rounded(dump_mb, 1),
        "conformance_workers": workers,
        "tlc_seconds": rounded(median(plain), 2),
        "tlc_with_dump_seconds": rounded(median(dumped), 2),
        "load_seconds": rounded(median(load), 2),
        "check_seconds": rounded(median(check), 2),
        "conformance_seconds": rounded(median(conf), 2),
        "ratio_vs_tlc": rounded(vs_plain, 2),
        "ratio_vs_tlc_with_dump": rounded(vs_dump, 2),
        "goal_ratio": GOAL_RATIO,
        "goal_met": vs_plain <= GOAL_RATIO,
    }


def main(argv: list[str] | None = None) -> int:
    return cli(run, "exhaustive conformance time vs TLC time", argv)


if __name__ == "__main__":
    sys.exit(main())
