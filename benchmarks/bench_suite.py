"""Where the time of ``make test``'s pytest run goes: per test file and per kind.

``python benchmarks/bench_suite.py`` runs what ``make pytest`` runs (the same
plugins, the tests and the notebooks, ``HYPOTHESIS_PROFILE=ci``, on every
core with pytest-xdist, a file per worker at a time; ``--workers 0`` runs it
in one process, so that no test's wall time is inflated by its neighbour) with the
recording plugin :mod:`benchmarks.suite_times` (each test's wall seconds and
the CPU seconds of the pytest process and the children it waited for), then
prints, like pytest's ``--durations``, the slowest test files, the time per
kind and the slowest tests, and rewrites the block between
``<!-- suite:begin -->`` and ``<!-- suite:end -->`` of benchmarks/README.md.
``--from PATH`` renders a recorded run instead of running one (PATH is the
plugin's JSON lines, which ``--keep PATH`` saves); ``--smoke`` runs three
small tests and writes nothing.  The run has a TLC cache of its own, empty at
the start (``make test`` on a fresh clone: a model two tests run is run once;
in CI, after ``make check``, every row ``make check`` ran is answered from it).

The kind of a test (the first that applies, from what the plugin recorded):

- ``notebooks``: a notebook run by nbmake;
- ``crash campaign``: tests/test_crash_campaign.py and tests/test_power_loss.py
  (SIGKILLed child processes);
- ``TLC runs``: the test started ``java`` or the ``toolledger`` command;
- ``PostgreSQL``: the test uses the ``pg_cluster`` fixture or started a
  server program (``initdb``, ``pg_ctl``, ``postgres``);
- ``Hypothesis``: a ``@given`` test or a Hypothesis state machine;
- ``other``.

Session- and module-scoped fixtures are charged to the first test that uses
them (as in ``--durations``).  Wall time depends on the load of the machine,
CPU time much less: both are shown, and the load average with them.

Goal: ``make test`` <= 10 minutes on 2 cores (issue 24).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import suite_times
from benchmarks.common import ROOT, Result, heading, machine_info, rounded

README = ROOT / "benchmarks" / "README.md"
BEGIN, END = "<!-- suite:begin -->", "<!-- suite:end -->"
KINDS = ("TLC runs", "notebooks", "crash campaign", "PostgreSQL", "Hypothesis", "other")
CRASH_FILES = frozenset({"tests/test_crash_campaign.py", "tests/test_power_loss.py"})
PG_PROGRAMS = frozenset({"initdb", "pg_ctl", "postgres"})
TLC_PROGRAMS = frozenset({"java", "toolledger"})
GOAL_SECONDS = 600.0
TOP_FILES = 25
TOP_TESTS = 15
# what `make pytest` loads (Makefile: PYTEST_PLUGIN_ARGS), in one process:
# the recording plugin charges each test its own CPU (make pytest spreads the
# same tests over every core with pytest-xdist, so its wall time is about
# this run's CPU over the cores, never this run's wall time)
PLUGINS = ("-p", "_hypothesis_pytestplugin", "-p", "nbmake", "-p", "xdist")
# --smoke: one test of three kinds (a tiny TLC run, a Hypothesis test, a plain one)
SMOKE_TESTS = (
    "tests/test_tlc_runner.py::test_invariant_violated_by_initial_state",
    "tests/test_tlavalues.py::test_round_trip_parse_serialize",
    "tests/test_layout.py::test_every_core_module_imports_only_the_standard_library_and_the_core",
)


def kind_of(record: dict[str, Any]) -> str:
    """The kind of one recorded test (see the module doc)."""
    node = str(record["nodeid"])
    path = node.split("::", 1)[0]
    launched = set(record.get("launched", ()))
    if path.endswith(".ipynb"):
        return "notebooks"
    if path in CRASH_FILES:
        return "crash campaign"
    if launched & TLC_PROGRAMS:
        return "TLC runs"
    if "pg_cluster" in record.get("fixtures", ()) or launched & PG_PROGRAMS:
        return "PostgreSQL"
    if record.get("hypothesis"):
        return "Hypothesis"
    return "other"


def load_records(path: Path) -> list[dict[str, Any]]:
    """The plugin's JSON lines (``path``, or ``path.gw*`` of an xdist run);
    a line that is not a record is a clear error."""
    out = []
    files = suite_times.recorded_files(path) or [path]
    lines = [(f, n, line) for f in files
             for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)]
    for f, n, line in lines:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            float(rec["wall"]), float(rec["cpu"]), str(rec["nodeid"])
        except (ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"{f}:{n}: not a record of benchmarks/suite_times.py ({e}); "
                             "record a run with `python benchmarks/bench_suite.py`") from e
        out.append(rec)
    if not out:
        raise SystemExit(f"{path}: no test was recorded")
    return out


def summarize(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Per file, per kind and per test: tests, wall and CPU seconds, sorted by wall."""
    files: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"tests": 0, "wall": 0.0, "cpu": 0.0, "kinds": defaultdict(float)})
    kinds: dict[str, dict[str, Any]] = {k: {"tests": 0, "wall": 0.0, "cpu": 0.0} for k in KINDS}
    tests = []
    for r in records:
        path, kind = str(r["nodeid"]).split("::", 1)[0], kind_of(r)
        for bucket in (files[path], kinds[kind]):
            bucket["tests"] += 1
            bucket["wall"] += float(r["wall"])
            bucket["cpu"] += float(r["cpu"])
        files[path]["kinds"][kind] += float(r["wall"])
        tests.append({"nodeid": r["nodeid"], "kind": kind, "wall": float(r["wall"]),
                      "cpu": float(r["cpu"])})

    def main_kind(seconds: dict[str, float]) -> str:  # the kind with the most wall time
        return max(KINDS, key=lambda k: (seconds.get(k, 0.0), -KINDS.index(k)))

    file_rows = sorted(
        ({"file": f, "tests": v["tests"], "wall": rounded(v["wall"], 1),
          "cpu": rounded(v["cpu"], 1), "kind": main_kind(v["kinds"])} for f, v in files.items()),
        key=lambda x: (-x["wall"], x["file"]))
    kind_rows = [{"kind": k, "tests": v["tests"], "wall": rounded(v["wall"], 1),
                  "cpu": rounded(v["cpu"], 1)} for k, v in kinds.items()]
    kind_rows.sort(key=lambda x: (-x["wall"], KINDS.index(x["kind"])))
    tests.sort(key=lambda x: (-x["wall"], x["nodeid"]))
    return {
        "tests": len(tests),
        "wall_seconds": rounded(sum(t["wall"] for t in tests), 1),
        "cpu_seconds": rounded(sum(t["cpu"] for t in tests), 1),
        "files": file_rows,
        "kinds": kind_rows,
        "slowest": [{**t, "wall": rounded(t["wall"], 1), "cpu": rounded(t["cpu"], 1)}
                    for t in tests[:TOP_TESTS]],
    }


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f} %" if whole else "-"


def render(s: dict[str, Any], note: str) -> str:
    """The Markdown block of benchmarks/README.md (tables of :func:`summarize`)."""
    wall, cpu = s["wall_seconds"], s["cpu_seconds"]
    lines = [
        f"{s['tests']:,} tests and notebooks: {wall:,.1f} s wall, {cpu:,.1f} s CPU "
        f"(summed over the tests; CPU of pytest and the children it waited for). {note}",
        "",
        "| kind | tests | wall s | share | CPU s |",
        "| --- | ---: | ---: | ---: | ---: |",
        *(f"| {k['kind']} | {k['tests']:,} | {k['wall']:,.1f} | {_pct(k['wall'], wall)} | "
          f"{k['cpu']:,.1f} |" for k in s["kinds"]),
        "",
        "| test file | kind | tests | wall s | share | CPU s |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    shown, rest = s["files"][:TOP_FILES], s["files"][TOP_FILES:]
    lines += [f"| `{f['file']}` | {f['kind']} | {f['tests']:,} | {f['wall']:,.1f} | "
              f"{_pct(f['wall'], wall)} | {f['cpu']:,.1f} |" for f in shown]
    if rest:
        rw, rc = sum(f["wall"] for f in rest), sum(f["cpu"] for f in rest)
        lines.append(f"| {len(rest)} other files | | {sum(f['tests'] for f in rest):,} | "
                     f"{rw:,.1f} | {_pct(rw, wall)} | {rc:,.1f} |")
    lines += ["", "| slowest tests | kind | wall s | CPU s |", "| --- | --- | ---: | ---: |"]
    lines += [f"| `{t['nodeid']}` | {t['kind']} | {t['wall']:,.1f} | {t['cpu']:,.1f} |"
              for t in s["slowest"]]
    return "\n".join(lines)


def rewrite_readme(block: str, readme: Path = README) -> None:
    """Replace what is between the markers; refuse if they are missing."""
    text = readme.read_text(encoding="utf-8")
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise SystemExit(f"{readme}: needs one {BEGIN} and one {END} line, in that order")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{BEGIN}\n{block}\n{END}{tail}", encoding="utf-8")


def record_run(out: Path, paths: Sequence[str], workers: str = "auto",
               tlc_cache: Path | None = None) -> dict[str, Any]:
    """Run pytest as ``make pytest`` does, recording into ``out``: wall and CPU
    of the whole run and the 1-minute load average sampled every 10 s.  The
    TLC cache is ``tlc_cache`` (default: a new, empty directory beside ``out``,
    as ``make test`` on a fresh clone has: a model run twice in the suite is
    run once, nothing is carried over from an earlier run)."""
    cache = tlc_cache if tlc_cache is not None else out.parent / "tlc-cache"
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "HYPOTHESIS_PROFILE": "ci",
           "TOOLLEDGER_TLC_CACHE": str(cache)}
    cmd = [sys.executable, "-m", "pytest", *PLUGINS, "-p", "benchmarks.suite_times",
           f"--suite-times={out}", "-q", "-n", workers, "--dist", "loadfile", *paths]
    loads: list[float] = [os.getloadavg()[0]]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(10.0):
            loads.append(os.getloadavg()[0])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    before = os.times()
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, check=False)
    wall = time.perf_counter() - t0
    after = os.times()
    stop.set()
    loads.append(os.getloadavg()[0])
    cpu = (after.children_user - before.children_user) + (after.children_system
                                                          - before.children_system)
    return {"command": ["pytest", *cmd[3:]], "exit_status": done.returncode,
            "tlc_cache": "fresh" if tlc_cache is None else str(tlc_cache),
            "wall_seconds": rounded(wall, 1), "cpu_seconds": rounded(cpu, 1),
            "load_average": {"min": rounded(min(loads), 2), "max": rounded(max(loads), 2),
                             "mean": rounded(sum(loads) / len(loads), 2)}}


def run(smoke: bool = False, source: Path | None = None, note: str | None = None,
        write_readme: bool = True, workers: str = "auto", keep: Path | None = None) -> Result:
    run_info: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="bench-suite-") as tmp:
        if source is None:
            notebooks = sorted(str(p.relative_to(ROOT))
                               for p in (ROOT / "notebooks").glob("*.ipynb"))
            paths = list(SMOKE_TESTS) if smoke else ["tests", "--nbmake", *notebooks]
            source = Path(tmp) / "times.jsonl"
            run_info = record_run(source, paths, "0" if smoke else workers)
            if keep is not None:  # one file per xdist worker: keep.gw0, keep.gw1, ...
                for f in suite_times.recorded_files(source):
                    (keep.parent / (keep.name + f.name[len(source.name):])).write_bytes(
                        f.read_bytes())
        records = load_records(source)
    s = summarize(records)
    if run_info is not None:
        la = run_info["load_average"]
        whole = (f"The whole run: {run_info['wall_seconds']:,.1f} s wall, "
                 f"{run_info['cpu_seconds']:,.1f} s CPU, pytest-xdist workers: "
                 f"{workers}; 1-minute load average "
                 f"{la['min']:.2f} to {la['max']:.2f} (mean {la['mean']:.2f}) on "
                 f"{os.cpu_count()} cores.")
        # --note adds to the measured sentence; it never replaces it
        note = whole if note is None else f"{whole} {note}"
    elif note is None:
        note = "Load average: not recorded with this run."
    block = render(s, note)
    heading("make test's pytest run, per kind, per file, slowest tests")
    print(block)
    if write_readme and not smoke:
        rewrite_readme(block)
    return {"machine": machine_info(), "run": run_info, "note": note, **s,
            "goal_seconds": GOAL_SECONDS}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--smoke", action="store_true", help="three small tests; writes nothing")
    p.add_argument("--json", action="store_true", help="print the figures as JSON at the end")
    p.add_argument("--from", dest="source", type=Path, default=None, metavar="PATH",
                   help="render this recorded run (benchmarks/suite_times.py's JSON lines)")
    p.add_argument("--note", default=None,
                   help="a sentence after the measured totals (with --from, where nothing "
                        "was measured, the whole line: how loaded the machine was)")
    p.add_argument("--keep", type=Path, default=None, metavar="PATH",
                   help="also write the recorded JSON lines to PATH (PATH.gw0, ... under "
                        "xdist; for --from PATH later)")
    p.add_argument("--no-readme", action="store_true", help="do not rewrite benchmarks/README.md")
    p.add_argument("--workers", default="auto", metavar="N",
                   help="pytest-xdist workers, as make pytest's PYTEST_WORKERS (default auto; "
                        "0: one process)")
    args = p.parse_args(argv)
    result = run(smoke=args.smoke, source=args.source, note=args.note,
                 write_readme=not args.no_readme, workers=args.workers, keep=args.keep)
    if args.json:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
