"""What the deep target covers: ``toolledger deep``'s random simulation, recorded.

The deep model (model/deep/Deep.cfg: 3 calls, 3 crashes, 3 attempts,
expiring keys, every safety invariant) is too big to enumerate; TLC samples
N behaviours of up to D steps with a fixed seed.  This records, for the
spec as it is, the behaviours, states and time of one run, that no
invariant broke, and (the control) that the same run with a planted twin
(``DecisionFor <- DecideRetriesManual``) finds a violation, and how many
states that took.  One worker: the same seed simulates the same behaviours.

``python benchmarks/bench_deep.py [--smoke] [--json]``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import ROOT, Result, cli, heading, table
from toolledger.check.deep import run_deep

TWIN = "DecisionFor=DecideRetriesManual"


def run(smoke: bool = False) -> Result:
    traces = 20 if smoke else 5000
    heading(f"toolledger deep: {traces:,} behaviours, depth 120, seed 1")
    rows: list[tuple[str, ...]] = []
    out: Result = {}
    for label, overrides in (("spec", []), (f"twin {TWIN}", [TWIN])):
        t0 = os.times()
        r = run_deep(ROOT, traces=traces, depth=120, seed=1, overrides=overrides)
        t1 = os.times()
        cpu = (t1.children_user + t1.children_system) - (t0.children_user + t0.children_system)
        out[label.split()[0]] = {
            "traces": r.traces, "depth": r.depth, "seed": r.seed, "states": r.states,
            "wall_seconds": round(r.seconds, 2), "cpu_seconds": round(cpu, 2),
            "violated": r.violated,
        }
        rows.append((label, f"{r.states:,}", f"{r.seconds:.1f}", f"{cpu:.1f}",
                     r.violated or "none"))
    print(table(("run", "states", "wall s", "CPU s", "violated"), rows, right=(1, 2, 3)))
    out["goal"] = "the spec: no violation; the twin: a violation found"
    out["goal_met"] = out["spec"]["violated"] is None and out["twin"]["violated"] is not None
    return out


def main() -> int:
    return cli(run, "what the deep target covers")


if __name__ == "__main__":
    sys.exit(main())
