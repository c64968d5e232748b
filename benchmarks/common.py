"""Helpers shared by the benchmark scripts: timing, medians, tables, machine facts.

Every benchmark script has the same shape: ``run(smoke=False) -> dict`` prints
its figures and returns them (``run_all.py`` collects the dicts into
``benchmarks/results.json``), and ``main()`` runs it from the command line
(``--smoke`` for the tiny mode the tests use, ``--json`` to print the dict).

Absolute times on a shared machine are noisy: the scripts report medians of
repeated runs, and ratios of quantities measured side by side in the same
run (interleaved, so a noisy minute hits both).  Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
"""The repository root (``benchmarks/..``)."""

Result = dict[str, Any]


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (which must not be empty)."""
    if not values:
        raise ValueError("median of no values")
    return float(statistics.median(values))


def rounded(x: float, digits: int = 3) -> float:
    """``x`` rounded for the results file (figures, not noise)."""
    return round(float(x), digits)


def timed(fn: Callable[[], Any]) -> float:
    """Wall-clock seconds ``fn()`` took."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def table(head: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[int] = ()) -> str:
    """A plain-text table; the columns in ``right`` are right-aligned."""
    cells = [[str(c) for c in head], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]

    def line(r: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()

    return "\n".join([line(cells[0]), line(["-" * w for w in widths]), *map(line, cells[1:])])


def heading(text: str) -> None:
    print(f"\n== {text}", flush=True)


def fmt_int(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


# --------------------------------------------------------------------------
# Where benchmarks write
# --------------------------------------------------------------------------


def filesystem_of(path: Path) -> str:
    """The file system type of ``path`` from /proc/mounts (``"?"`` if unknown).

    Reported with every durability figure: on ``tmpfs`` an fsync costs nothing
    and the figures would mean nothing.
    """
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return "?"
    best, fstype = "", "?"
    target = str(path.resolve())
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        mnt = parts[1].replace("\\040", " ")
        inside = target == mnt or target.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= len(best):
            best, fstype = mnt, parts[2]
    return fstype


@contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A fresh temporary directory, removed afterwards.

    ``$TOOLLEDGER_BENCH_DIR`` picks the parent (put it on the disk you want to
    measure); by default the system temporary directory.
    """
    parent = os.environ.get("TOOLLEDGER_BENCH_DIR") or None
    with tempfile.TemporaryDirectory(prefix=f"toolledger-bench-{prefix}-", dir=parent) as d:
        yield Path(d)


# --------------------------------------------------------------------------
# The machine
# --------------------------------------------------------------------------


@contextmanager
def postgres(conninfo: str | None = None) -> Iterator[str]:
    """The server a benchmark runs on: ``conninfo`` if given, else a throwaway
    cluster started as the tests start it (tests/pg_cluster.py: own data
    directory, loopback, a free port, ``fsync`` on), stopped on exit.
    Raises ``pg_cluster.NoPostgres`` when the server binaries are missing."""
    if conninfo is not None:
        yield conninfo
        return
    sys.path.insert(0, str(ROOT / "tests"))
    from pg_cluster import PgCluster

    with PgCluster() as pg:
        yield pg.conninfo


def _java_version() -> str:
    java = shutil.which("java")
    if java is None:
        return "not found"
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    first = (out.stderr or out.stdout).strip().splitlines()
    return first[0] if first else "unknown"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
            text=True, timeout=30, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return out.stdout.strip() or "?"


def code_state() -> Result:
    """The commit checked out and the uncommitted changes of the code being measured."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--", "reference", "spec", "model"], cwd=ROOT,
            capture_output=True, text=True, timeout=30, check=False,
        )
        dirty = [line[3:] for line in out.stdout.splitlines() if line.strip()]
    except (OSError, subprocess.TimeoutExpired):
        dirty = ["? (git status failed)"]
    return {"commit": _git_commit(), "uncommitted": dirty}


def _tlc_version() -> str:
    try:
        from toolledger.check.tlc import find_jar

        jar = find_jar()
    except Exception as exc:  # the jar is optional for some benchmarks
        return f"not found ({exc})"
    return f"tla2tools.jar from {jar.parent.name} ({jar.stat().st_size:,} bytes)"


def machine_info() -> Result:
    """Facts about the machine and the toolchain the figures were produced with."""
    mem = "?"
    try:
        m = re.search(r"MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text())
        if m:
            mem = f"{int(m.group(1)) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    scratch = Path(os.environ.get("TOOLLEDGER_BENCH_DIR") or tempfile.gettempdir())
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "memory": mem,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "java": _java_version(),
        "tlc": _tlc_version(),
        "sqlite": __import__("sqlite3").sqlite_version,
        "scratch_dir": str(scratch),
        "scratch_fs": filesystem_of(scratch),
        "git_commit": _git_commit(),
    }


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


def cli(run: Callable[..., Result], description: str, argv: Sequence[str] | None = None) -> int:
    """The ``main()`` of a benchmark script: ``--smoke`` and ``--json``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--smoke", action="store_true", help="tiny run: checks the script works")
    p.add_argument("--json", action="store_true", help="print the figures as JSON at the end")
    args = p.parse_args(argv)
    result = run(smoke=args.smoke)
    if args.json:
        print(json.dumps(result, indent=2))
    return 0
