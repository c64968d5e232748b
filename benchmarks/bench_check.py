"""Where the time of ``make check`` goes: JVM starts, TLC's search, conformance.

What it measures
----------------
1. The fixed cost of one TLC run (start the JVM, load TLC, parse the spec
   with SANY, set up the model checker): the smallest CI model of
   ``model/manifest.toml`` run alone with :func:`toolledger.check.tlc.run_tlc`,
   exactly as ``toolledger check`` runs it; the median of several runs.
   Its search is a few dozen states, so its wall time is almost all fixed cost.
2. One complete ``toolledger check --json`` (what ``make check`` runs: every
   CI model, every twin and witness, the conformance rows), as a child
   process: its wall time and the CPU time of it and everything it started
   (JVMs, conformance workers), from ``getrusage(RUSAGE_CHILDREN)``.  The CPU
   time does not depend on how loaded the machine is; on 2 quiet cores the
   wall time cannot be less than half of it.
3. What each speed-up buys, measured side by side: the fixed cost above
   with and without class-data sharing (TLC's classes mapped from an archive
   in the user's cache, see :func:`toolledger.check.tlc.run_tlc`), and the
   conformance check of one model (``SameTurn``, in this process, one
   worker, CPU seconds) with and without the memo of the core's answers and
   of the spec images (:mod:`toolledger.check.memo`).
4. The breakdown, from the rows of that check: per row its wall time; the
   number of TLC runs (JVM starts: rows that share one run, such as the
   witness probes of one model batched into one TLC run, name it in their
   ``tlc_run`` field and count once); ``runs x fixed cost`` (JVM start and
   parsing), the rest of the TLC time (search), and the conformance time.

The row times are wall times of runs that overlap (``toolledger check``
runs 2 TLC runs side by side), so their sum is more than the total; the
figures that matter are the total, the CPU time and the share of each part.
The floor on 2 quiet cores is the larger of CPU / 2 and the longest single
job (a TLC run or a conformance check runs on one core).

Goal: ``make check`` <= 90 s on 2 quiet cores.
``python benchmarks/bench_check.py [--smoke] [--json]``.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import ROOT, Result, cli, heading, machine_info, median, rounded, table
from toolledger.check.conformance import check_graph
from toolledger.check.manifest import ModelEntry, load_manifest
from toolledger.check.stategraph import load_dot
from toolledger.check.system import ModelConfig
from toolledger.check.tlc import C1_ONLY, run_tlc

GOAL_SECONDS = 90.0


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _toolledger() -> list[str]:
    """The ``toolledger`` command of the running interpreter's environment."""
    script = Path(sys.executable).parent / "toolledger"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from toolledger.cli import main; sys.exit(main())"]


def fixed_cost(entry: ModelEntry, search_dirs: list[Path], repeat: int,
               class_data_sharing: bool = True) -> dict[str, Any]:
    """Median wall and CPU seconds of one TLC run of a tiny model (see the
    module doc), with the JVM flags ``toolledger check`` uses."""
    if class_data_sharing:  # the first run may write the archive: not measured
        run_tlc(entry.module, entry.cfg_path, search_dirs=search_dirs,
                check_deadlock=entry.check_deadlock, workers=entry.workers,
                jvm_args=C1_ONLY)
    walls, cpus = [], []
    for _ in range(repeat):
        cpu0, t0 = _children_cpu(), time.perf_counter()
        r = run_tlc(entry.module, entry.cfg_path, search_dirs=search_dirs,
                    check_deadlock=entry.check_deadlock, workers=entry.workers,
                    jvm_args=C1_ONLY, class_data_sharing=class_data_sharing)
        walls.append(time.perf_counter() - t0)
        cpus.append(_children_cpu() - cpu0)
        if r.distinct_states != entry.distinct_states:
            raise RuntimeError(f"{entry.name}: {r.distinct_states} distinct states, "
                               f"the manifest says {entry.distinct_states}")
    return {"model": entry.name, "distinct_states": entry.distinct_states,
            "wall_seconds": rounded(median(walls)), "cpu_seconds": rounded(median(cpus)),
            "runs": repeat, "class_data_sharing": class_data_sharing}


def conformance_memo(entry: ModelEntry, search_dirs: list[Path]) -> dict[str, Any]:
    """CPU seconds of the conformance check of ``entry``, in this process with
    one worker, without and with the memo (the same verdict either way)."""
    import tempfile

    cfg = ModelConfig.from_mc_module(ROOT / "model" / f"{entry.module}.tla")
    with tempfile.TemporaryDirectory(prefix="bench-check-") as tmp:
        dot = Path(tmp) / f"{entry.name}.dot"
        run_tlc(entry.module, entry.cfg_path, search_dirs=search_dirs,
                check_deadlock=entry.check_deadlock, dump_dot=dot, jvm_args=C1_ONLY)
        graph = load_dot(dot)
    out: dict[str, Any] = {"model": entry.name, "states": len(graph.states),
                           "edges": len(graph.edges)}
    for memoise in (False, True):
        t0 = time.process_time()
        report = check_graph(cfg, graph, model=entry.name, workers=1, memoise=memoise)
        out["memo" if memoise else "no_memo"] = {
            "cpu_seconds": rounded(time.process_time() - t0),
            "mismatches": report.mismatch_count, "reference_edges": report.reference_edges}
    out["speedup"] = rounded(out["no_memo"]["cpu_seconds"] / max(out["memo"]["cpu_seconds"],
                                                                 1e-9), 2)
    return out


def full_check(args: list[str]) -> dict[str, Any]:
    """Run ``toolledger check --json ARGS``; its rows, wall and CPU seconds."""
    cmd = [*_toolledger(), "check", "--root", str(ROOT), "--json", *args]
    cpu0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          cwd=ROOT, env=dict(os.environ), check=False)
    wall = time.perf_counter() - t0
    cpu = _children_cpu() - cpu0
    try:
        rows: list[dict[str, Any]] = json.loads(proc.stdout)
    except ValueError:
        raise RuntimeError(f"toolledger check printed no JSON (exit {proc.returncode}):\n"
                           f"{proc.stderr[-2000:]}") from None
    return {"exit_status": proc.returncode, "wall_seconds": wall, "cpu_seconds": cpu,
            "rows": rows}


def breakdown(rows: list[dict[str, Any]], fixed: float) -> dict[str, Any]:
    """TLC runs, their fixed cost and search time, and the conformance time of ``rows``."""
    runs: dict[str, float] = {}
    for r in rows:
        if r.get("check", "tlc") == "tlc" and r.get("status") != "NOT CHECKED":
            # rows batched into one TLC run carry its name and its wall time
            runs[str(r.get("tlc_run") or r["model"])] = float(r["wall_seconds"])
    tlc_seconds = sum(runs.values())
    jvm_and_parse = min(tlc_seconds, fixed * len(runs))
    conformance = sum(float(r["wall_seconds"]) for r in rows if r.get("check") == "conformance")
    # the longest single job (a TLC run, or a conformance check): on 2 cores
    # the check cannot end before it, whatever the CPU total
    jobs = {**runs, **{f"{r['model']} [conformance]": float(r["wall_seconds"])
                       for r in rows if r.get("check") == "conformance"}}
    longest = max(jobs.items(), key=lambda kv: kv[1], default=("-", 0.0))
    # conformance rows report the CPU time of their process and its workers
    conformance_cpu = sum(float(r.get("cpu_seconds") or 0.0) for r in rows
                          if r.get("check") == "conformance")
    return {
        "row_count": len(rows),
        "tlc_runs": len(runs),
        "tlc_seconds": rounded(tlc_seconds),
        "jvm_start_and_parse_seconds": rounded(jvm_and_parse),
        "search_seconds": rounded(tlc_seconds - jvm_and_parse),
        "conformance_seconds": rounded(conformance),
        "conformance_cpu_seconds": rounded(conformance_cpu),
        "longest_job": longest[0],
        "longest_job_seconds": rounded(longest[1]),
    }


def floor_seconds(cpu: float, parts: dict[str, Any]) -> float:
    """What ``make check`` cannot beat on 2 quiet cores: half its CPU time,
    and its longest job (which runs on one core)."""
    return max(cpu / 2, float(parts["longest_job_seconds"]))


def run(smoke: bool = False) -> Result:
    manifest = load_manifest(ROOT)
    ci = manifest.ci_models()
    tiny = min(ci, key=lambda e: (e.distinct_states or 0, e.name))
    heading("fixed cost of one TLC run (JVM start, SANY, set-up)")
    fixed = fixed_cost(tiny, list(manifest.search_dirs), 1 if smoke else 3)
    print(f"{tiny.name} ({fixed['distinct_states']} distinct states): "
          f"{fixed['wall_seconds']:.2f} s wall, {fixed['cpu_seconds']:.2f} s CPU "
          f"(median of {fixed['runs']})")

    fixed_plain = fixed_cost(tiny, list(manifest.search_dirs), 1 if smoke else 3,
                             class_data_sharing=False)
    print(f"  without class-data sharing: {fixed_plain['wall_seconds']:.2f} s wall, "
          f"{fixed_plain['cpu_seconds']:.2f} s CPU")

    conf_models = [e for e in ci if e.conformance]
    conf_entry = (min(conf_models, key=lambda e: e.distinct_states) if smoke
                  else manifest.get("SameTurn"))
    heading(f"conformance of {conf_entry.name}, one worker, without and with the memo")
    memo = conformance_memo(conf_entry, list(manifest.search_dirs))
    print(f"{memo['states']:,} states, {memo['edges']:,} edges: "
          f"{memo['no_memo']['cpu_seconds']:.2f} s CPU without, "
          f"{memo['memo']['cpu_seconds']:.2f} s with ({memo['speedup']:.2f}x); mismatches "
          f"{memo['no_memo']['mismatches']} / {memo['memo']['mismatches']}")

    heading("toolledger check" + (f" --model {tiny.name}" if smoke else " (make check)"))
    check = full_check(["--model", tiny.name] if smoke else [])
    rows = check["rows"]
    print(table(
        ("row", "check", "run", "wall s", "status"),
        [(r["model"], r.get("check", "tlc"), r.get("tlc_run") or "-",
          f"{float(r['wall_seconds']):.2f}", r["status"]) for r in rows],
        right=(3,),
    ))
    parts = breakdown(rows, float(fixed["wall_seconds"]))
    total = float(check["wall_seconds"])
    cpu = float(check["cpu_seconds"])
    heading("where the time goes")
    print(table(
        ("part", "seconds"),
        [
            (f"TLC runs ({parts['tlc_runs']}, summed wall; 2 run side by side)",
             f"{parts['tlc_seconds']:.1f}"),
            ("  of which JVM start + parse (runs x fixed cost)",
             f"{parts['jvm_start_and_parse_seconds']:.1f}"),
            ("  of which search", f"{parts['search_seconds']:.1f}"),
            ("conformance (summed wall)", f"{parts['conformance_seconds']:.1f}"),
            ("conformance (summed CPU)", f"{parts['conformance_cpu_seconds']:.1f}"),
            ("total wall", f"{total:.1f}"),
            ("total CPU (check + children)", f"{cpu:.1f}"),
            ("lower bound on 2 quiet cores (CPU / 2)", f"{cpu / 2:.1f}"),
            (f"longest job ({parts['longest_job']}; wall, with what ran beside it)",
             f"{parts['longest_job_seconds']:.1f}"),
            ("floor on 2 quiet cores (max of the two)", f"{floor_seconds(cpu, parts):.1f}"),
        ],
        right=(1,),
    ))
    print(f"exit status {check['exit_status']}; goal <= {GOAL_SECONDS:.0f} s on 2 quiet cores; "
          f"load average at the end {os.getloadavg()[0]:.1f}")
    return {
        "machine": machine_info(),
        "fixed_cost": fixed,
        "fixed_cost_without_cds": fixed_plain,
        "conformance_memo": memo,
        "check": {
            "args": ["--model", tiny.name] if smoke else [],
            "exit_status": check["exit_status"],
            "wall_seconds": rounded(total),
            "cpu_seconds": rounded(cpu),
            "floor_seconds": rounded(floor_seconds(cpu, parts)),
            "rows": [
                {k: r.get(k) for k in ("model", "check", "tlc_run", "wall_seconds", "cpu_seconds",
                                       "status", "distinct_states")}
                for r in rows
            ],
            **parts,
        },
        "goal_seconds": GOAL_SECONDS,
        "load_average": rounded(os.getloadavg()[0], 2),
    }


def main() -> int:
    return cli(run, "where the time of `make check` goes")


if __name__ == "__main__":
    sys.exit(main())
