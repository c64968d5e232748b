"""Group commit across sessions: 1, 4 and 16 concurrent sessions in one process.

The workload is ``bench_peers``'s toolledger-batched turn (5 protected calls
of an idempotent tool with a trivial effect, ``Session.open(...,
lazy_create=True)`` then ``Session.execute_message``: n + 1 commits), run by
N threads at once, one session each per turn, on ONE
``SqliteStore(path, group_commit=True)``.  Each measurement is a fresh child
process (``bench_peers``' way: marks around the timed turns, ``strace``
counting the sync system calls between them, ``getrusage`` for CPU):

- on this disk, and on a slow disk (every ``fsync``/``fdatasync`` delayed by
  ``bench_peers.SLOW_SYNC_DELAY_US`` with ``strace -e inject``), for 1, 4 and
  16 sessions; the control: 16 sessions on a store without group commit;
- one session with every sync skipped (``retval=0``): the CPU ceiling.  The
  threads share one interpreter (the GIL), so N sessions can never run
  faster than that: it bounds the speed-up of 16 sessions over one at
  ``ceiling / one session`` on each disk (printed per disk; where that is
  below the goal, the goal cannot be met on this machine).

Per row: calls/s, syncs per call (strace) and the store's own ``syncs`` and
``commits`` per call (``commits`` is the per-session count, the same with and
without grouping), commits per sync (the grouping achieved).

``python benchmarks/bench_group.py [--smoke] [--json]``
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_peers import (
    CALLS_PER_TURN,
    MARK_BEGIN,
    MARK_END,
    NO_SYNC,
    SLOW,
    SYNC_CALLS,
    _cpu,
    count_marked_syncs,
)
from benchmarks.common import ROOT, Result, cli, filesystem_of, heading, median, scratch_dir, table

SESSIONS = (1, 4, 16)
GOAL = 4.0
"""16 concurrent sessions' calls/s over one session's (issue 15), on the slow disk."""


def worker(directory: Path, sessions: int, turns: int, group: bool) -> Result:
    """Child process: ``sessions`` threads, each ``turns`` timed turns after one untimed."""
    import os

    from toolledger import Attempt, Session, SqliteStore, Tool

    store = SqliteStore(directory / "group.sqlite3", group_commit=group)
    tools = {"send": Tool("idempotent", requires_approval=False)}
    sent: set[str] = set()

    def send(a: Attempt) -> str:
        sent.add(str(a.idempotency_key))  # the external system's own dedup key
        return "sent"

    def turn(name: str) -> None:
        # bench_peers' toolledger-batched turn, as an engine runs it: n + 1 commits
        Session.open(store, name, tools, lazy_create=True).execute_message(
            1, [{"id": f"c{i}", "name": "send", "arguments": {"i": i}}
                for i in range(CALLS_PER_TURN)], send)

    def thread(i: int, first: int, n: int, errors: list[BaseException]) -> None:
        try:
            for t in range(first, first + n):
                turn(f"s{i}-t{t}")
        except BaseException as exc:
            errors.append(exc)

    def wave(first: int, n: int) -> None:
        errors: list[BaseException] = []
        threads = [threading.Thread(target=thread, args=(i, first, n, errors))
                   for i in range(sessions)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if errors:
            raise errors[0]

    try:
        wave(0, 1)
        commits0, syncs0, cpu0 = store.commits, store.syncs, _cpu()
        os.access(MARK_BEGIN, os.F_OK)
        t0 = time.perf_counter()
        wave(1, turns)
        wall = time.perf_counter() - t0
        os.access(MARK_END, os.F_OK)
        cpu = _cpu() - cpu0
        commits, syncs = store.commits - commits0, store.syncs - syncs0
    finally:
        store.close()
    calls = sessions * turns * CALLS_PER_TURN
    assert len(sent) == sessions * (turns + 1) * CALLS_PER_TURN, "an effect was lost or repeated"
    return {"calls": calls, "seconds": wall, "cpu_seconds": cpu, "commits": commits,
            "store_syncs": syncs}


def run_child(directory: Path, sessions: int, turns: int, group: bool,
              strace: str | None, inject: str | None) -> Result:
    work = directory / f"g-{time.monotonic_ns()}"
    work.mkdir()
    code = (f"import sys, json; sys.path.insert(0, {str(ROOT)!r}); "
            "from benchmarks import bench_group as b; "
            f"print(json.dumps(b.worker(b.Path({str(work)!r}), {sessions}, {turns}, {group})))")
    cmd = [sys.executable, "-c", code]
    log = work / "strace.log"
    if strace is not None:
        injected = ["-e", f"inject=fsync,fdatasync:{inject}"] if inject else []
        cmd = [strace, "-f", "-qq", "--seccomp-bpf", "-e",
               "trace=" + ",".join((*SYNC_CALLS, "access", "faccessat", "faccessat2")),
               *injected, "-o", str(log), *cmd]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"group child failed ({out.returncode}):\n{out.stderr[-3000:]}")
        res: Result = json.loads(out.stdout.strip().splitlines()[-1])
        if strace is not None:
            res["syncs"] = sum(count_marked_syncs(log.read_text()).values())
        return res
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(smoke: bool = False) -> Result:
    rounds, calls_per_row = (1, 20) if smoke else (3, 600)
    strace = shutil.which("strace")
    disks = {"this disk": None, "slow disk": SLOW} if strace else {"this disk": None}
    configs = [(d, n, True) for d in disks for n in SESSIONS]
    configs.append(("this disk", max(SESSIONS), False))
    if strace:
        configs += [("slow disk", max(SESSIONS), False), ("no sync", 1, True)]
    heading(f"group commit: {', '.join(map(str, SESSIONS))} sessions in one process, "
            f"{rounds} interleaved rounds, ~{calls_per_row} calls per row")
    samples: dict[tuple[str, int, bool], list[Result]] = {c: [] for c in configs}
    with scratch_dir("group") as d:
        fs = filesystem_of(d)
        for r in range(rounds):
            order = configs[r % len(configs):] + configs[:r % len(configs)]
            for disk, n, group in order:
                turns = max(1, calls_per_row // (n * CALLS_PER_TURN))
                inject = NO_SYNC if disk == "no sync" else disks.get(disk)
                samples[(disk, n, group)].append(
                    run_child(d, n, turns, group, strace, inject))
            print(f"  round {r + 1}/{rounds} done", flush=True)

    rows: list[Result] = []
    for (disk, n, group), xs in samples.items():
        row: Result = {
            "disk": disk, "sessions": n, "group_commit": group,
            "calls_per_second": median([x["calls"] / x["seconds"] for x in xs]),
            "cpu_ms_per_call": median([x["cpu_seconds"] / x["calls"] for x in xs]) * 1000,
            "commits_per_call": median([x["commits"] / x["calls"] for x in xs]),
            "store_syncs_per_call": median([x["store_syncs"] / x["calls"] for x in xs]),
            "syncs_per_call": (median([x["syncs"] / x["calls"] for x in xs])
                               if strace else None),
        }
        row["commits_per_sync"] = row["commits_per_call"] / row["store_syncs_per_call"]
        rows.append(row)

    def rate(disk: str, n: int, group: bool = True) -> float | None:
        return next((r["calls_per_second"] for r in rows
                     if (r["disk"], r["sessions"], r["group_commit"]) == (disk, n, group)), None)

    speedup = {}
    for disk in disks:
        one, many = rate(disk, 1), rate(disk, max(SESSIONS))
        if one and many:
            speedup[disk] = many / one
    ceiling = rate("no sync", 1)
    fast_one = rate("this disk", 1)
    bound = ceiling / fast_one if ceiling and fast_one else None
    bounds = {disk: ceiling / one for disk in disks
              if ceiling and (one := rate(disk, 1))}
    goal_disk = "slow disk" if "slow disk" in speedup else "this disk"
    print(f"\nscratch on {fs}")
    print(table(("disk", "sessions", "group commit", "calls/s", "syncs/call (strace)",
                 "store syncs/call", "commits/call", "commits per sync", "CPU ms/call"),
                [(r["disk"], r["sessions"], "yes" if r["group_commit"] else "no",
                  f"{r['calls_per_second']:.0f}",
                  "-" if r["syncs_per_call"] is None else f"{r['syncs_per_call']:.2f}",
                  f"{r['store_syncs_per_call']:.2f}", f"{r['commits_per_call']:.2f}",
                  f"{r['commits_per_sync']:.1f}", f"{r['cpu_ms_per_call']:.2f}")
                 for r in rows], right=(1, 3, 4, 5, 6, 7, 8)))
    for disk, x in speedup.items():
        print(f"{disk}: {max(SESSIONS)} sessions / 1 session = {x:.2f}x (goal >= {GOAL:g}x)")
    for disk, b in bounds.items():
        print(f"CPU ceiling (1 session, syncs skipped) / 1 session on the {disk} = {b:.2f}x: "
              f"the most any number of threads of one interpreter can gain on the {disk}")
    return {"filesystem": fs, "rows": rows, "speedup": speedup,
            "cpu_ceiling_over_one_session_this_disk": bound,
            "cpu_ceiling_over_one_session": bounds, "goal": GOAL,
            "goal_disk": goal_disk,
            "goal_met": speedup.get(goal_disk, 0) >= GOAL}


def main() -> int:
    return cli(run, "group commit: 1, 4, 16 sessions in one process")


if __name__ == "__main__":
    sys.exit(main())
