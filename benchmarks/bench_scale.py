"""Scale: protected calls/s with many sessions at once, on SQLite and on PostgreSQL.

What it measures
----------------
S concurrent sessions (1, 8, 32) spread evenly over P worker processes (1,
2, 4), on two stores side by side in one run: PostgreSQL (a throwaway
cluster, tests/pg_cluster.py, as the races benchmark starts it; loopback,
``fsync`` on) and SQLite (one file shared by every process, WAL,
``synchronous=FULL``).  Each session is a real :class:`toolledger.Session`
in its own thread, with its own store object (one connection each), doing
5-call turns of a protected tool (``idempotent``, no approval) whose effect
is trivial: one line appended to the worker process's file at the "external
system".  ``Session.execute`` per call: two ledger commits per call, plus the
turn's one ``record`` commit.

All S sessions open their stores and sessions, then wait on one barrier
(across processes) and run turns for a fixed window; a turn in progress at
the end of the window is finished.  calls/s = calls completed / (the last
session's end - the barrier).  Cells run in the order (P, S), SQLite and
PostgreSQL interleaved, each in a fresh SQLite file or PostgreSQL schema.

Counted: store commits per call (every store object counts its own); on
PostgreSQL the WAL flushes the server made (``pg_stat_wal.wal_sync``, the
backends' and the WAL writer's: group commit lets one flush serve several
sessions' commits); on SQLite the sync system calls of the worker processes
(``fsync``/``fdatasync``/``sync_file_range``/``msync``), counted by ``strace
-f --seccomp-bpf`` (only those calls stop, so the others run at full speed)
between each session's begin and end marks (an ``access()`` of a marker
path, as bench_peers.py does); without strace on the machine, not counted.

Checked afterwards, for every session of every cell: its durable state has
every recorded call with its ``ok`` result, the audit has exactly one
``dispatch`` of attempt 1 per call and nothing else, and the external
system applied every call exactly once (its own files, read by the parent),
as many as the worker reported.  One session cannot be spread over 2 or 4
processes: those two cells of each store are marked ``n/a``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shlex
import shutil
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import cli, filesystem_of, heading, postgres, rounded, scratch_dir, table

Result = dict[str, Any]
SESSIONS = (1, 8, 32)
PROCESSES = (1, 2, 4)
STORES = ("sqlite", "postgres")
MARK_BEGIN = "/toolledger-bench-scale-begin"
MARK_END = "/toolledger-bench-scale-end"
SYNC_CALLS = ("fdatasync", "fsync", "sync_file_range", "msync")
CALLS_PER_TURN = 5
WINDOW_SECONDS = 2.0
TOOL = "create_ticket"


def open_store(kind: str, where: str) -> Any:
    if kind == "sqlite":
        from toolledger import SqliteStore

        return SqliteStore(where, busy_timeout=60)
    from toolledger import PostgresStore

    conninfo, schema = where.rsplit("|", 1)
    return PostgresStore(conninfo, schema=schema)


def session_thread(
    kind: str, where: str, sid: str, barrier: Any, window: float, effects: Path,
    lock: threading.Lock, out: dict[str, Any], broken: bool = False,
) -> None:  # fmt: skip
    """One session: open it, wait for every other one, run 5-call turns for ``window``.

    ``broken``: the variant the checks must catch: the session's first effect is
    applied twice (an engine that re-sends a call it already sent)."""
    from toolledger import Session, Tool

    store = open_store(kind, where)
    try:
        session = Session.open(store, sid, {TOOL: Tool("idempotent", requires_approval=False)})
        commits = store.commits
        barrier.wait()
        os.access(MARK_BEGIN, os.F_OK)  # the strace mark: this session's window begins
        start = time.time()
        deadline = start + window
        calls = turns = 0

        def body(attempt: Any) -> str:
            # the external system: one line per applied effect, keyed by the idempotency key
            with lock, open(effects, "a") as f:
                f.write(f"{sid} {attempt.idempotency_key}\n")
                if broken and calls == 0:
                    f.write(f"{sid} {attempt.idempotency_key}\n")
            return "ok"

        while time.time() < deadline:
            recorded = session.record(turns, [
                {"id": f"c{i}", "name": TOOL, "arguments": {"turn": turns, "i": i}}
                for i in range(CALLS_PER_TURN)
            ])  # fmt: skip
            for status in recorded:
                session.execute(status.call.key, body)
                calls += 1
            turns += 1
        os.access(MARK_END, os.F_OK)
        out.update(sid=sid, start=start, end=time.time(), calls=calls, turns=turns,
                   commits=store.commits - commits)  # fmt: skip
    except BaseException as exc:  # reported to the parent, which fails the cell
        out.update(sid=sid, error=f"{type(exc).__name__}: {exc}")
    finally:
        store.close()


def worker_main(
    kind: str, where: str, sids: list[str], barrier: Any, window: float, effects: str,
    results: Any, broken: bool = False,
) -> None:  # fmt: skip
    lock = threading.Lock()
    outs: list[dict[str, Any]] = [{} for _ in sids]
    threads = [
        threading.Thread(target=session_thread,
                         args=(kind, where, sid, barrier, window, Path(effects), lock, out, broken))
        for sid, out in zip(sids, outs, strict=True)
    ]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.put(outs)


def wal_syncs(conninfo: str) -> int:
    """The server's WAL flushes so far (every backend's and the WAL writer's), once stable.

    Backends report their counts when they go idle or exit, the WAL writer
    periodically: read until two reads 0.2 s apart agree."""
    import psycopg

    last = -1
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for _ in range(20):
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()
            now = int(row[0]) if row else 0
            if now == last:
                break
            last = now
            time.sleep(0.2)
    return last


def count_syncs(log: str) -> int:
    """Sync system calls in an strace log while any session of the process is in its window."""
    inside = syncs = 0
    for line in log.splitlines():
        if MARK_BEGIN in line:
            inside += 1
        elif MARK_END in line:
            inside -= 1
        elif inside > 0 and any(f"{call}(" in line for call in SYNC_CALLS):
            syncs += 1  # "<... fdatasync resumed>" lines have no "(" after the name
    return syncs


@contextmanager
def under_strace(ctx: Any, scratch: Path, tag: str) -> Iterator[bool]:
    """Processes started by ``ctx`` inside run under strace, logging to
    ``scratch/strace-TAG.PID``; yields False (and traces nothing) without strace."""
    strace = shutil.which("strace")
    if strace is None:
        yield False
        return
    wrapper = scratch / f"python-under-strace-{tag}"
    calls = ",".join((*SYNC_CALLS, "access", "faccessat", "faccessat2"))
    # $$: the shell's pid, which exec hands to strace: one log per worker process
    wrapper.write_text(
        "#!/bin/sh\n"
        f'exec {shlex.quote(strace)} -f -qq --seccomp-bpf -e trace={calls} '
        f'-o "{scratch}/strace-{tag}.$$" {shlex.quote(sys.executable)} "$@"\n'
    )  # fmt: skip
    wrapper.chmod(0o755)
    ctx.set_executable(str(wrapper))
    try:
        yield True
    finally:  # the executable is global to multiprocessing: only these processes
        ctx.set_executable(sys.executable)


def verify(kind: str, where: str, sessions: list[Result], effect_files: list[Path]) -> list[str]:
    """What must hold after the run (see the module doc); the problems found."""
    applied: Counter[tuple[str, str]] = Counter()
    for path in effect_files:
        if path.exists():
            for line in path.read_text().splitlines():
                sid, key = line.split()
                applied[(sid, key)] += 1
    problems: list[str] = []
    store = open_store(kind, where)
    try:
        for s in sessions:
            sid = s["sid"]
            state = store.load(sid)
            keys = [c.execution_id for c in state.calls]
            results = Counter(c.result.kind.value if c.result else "none" for c in state.calls)
            audit = Counter((a.kind, a.attempt) for a in store.audit(sid))
            mine = {key: n for (who, key), n in applied.items() if who == sid}
            checks = {
                "every call recorded": len(keys) == s["calls"] == s["turns"] * CALLS_PER_TURN,
                "every call has its ok result": results == Counter({"ok": s["calls"]}),
                "one dispatch per call, nothing else": audit == Counter(
                    {("dispatch", 1): s["calls"]}),
                "applied exactly once": sorted(mine) == sorted(keys)
                and all(n == 1 for n in mine.values()),
            }
            problems += [f"{sid}: {name}" for name, ok in checks.items() if not ok]
    finally:
        store.close()
    return problems


def run_cell(kind: str, where: str, sessions: int, processes: int, window: float,
             scratch: Path, conninfo: str | None, *, broken: bool = False) -> Result:  # fmt: skip
    """One cell of the table; ``broken``: the variant the checks must catch (see
    :func:`session_thread`)."""
    tag = uuid.uuid4().hex[:8]
    sids = [f"{kind}-{processes}p-{sessions}s-{i}-{tag}" for i in range(sessions)]
    per = [sids[i::processes] for i in range(processes)]
    effect_files = [scratch / f"effects-{tag}-{i}.txt" for i in range(processes)]
    open_store(kind, where).close()  # create the store once, before the workers race to
    syncs_before = wal_syncs(conninfo) if conninfo else None
    ctx = mp.get_context("spawn")  # fresh interpreters: nothing inherited
    barrier = ctx.Barrier(sessions)
    results: Any = ctx.Queue()
    procs = [
        ctx.Process(target=worker_main,
                    args=(kind, where, mine, barrier, window, str(path), results, broken))
        for mine, path in zip(per, effect_files, strict=True)
    ]  # fmt: skip
    with under_strace(ctx, scratch, tag) if conninfo is None else nullcontext(False) as traced:
        for proc in procs:
            proc.start()
    outs: list[Result] = []
    for _ in procs:
        outs += results.get(timeout=600)
    for proc in procs:
        proc.join(60)
    if conninfo:
        syncs_after = wal_syncs(conninfo)
    elif traced:  # read once every worker (and so its strace) has exited
        logs = sorted(scratch.glob(f"strace-{tag}.*"))
        syncs_before, syncs_after = 0, sum(count_syncs(log.read_text()) for log in logs)
    else:
        syncs_after = None
    errors = [f"{o.get('sid')}: {o['error']}" for o in outs if "error" in o]
    problems = errors or verify(kind, where, outs, effect_files)
    calls = sum(o.get("calls", 0) for o in outs)
    seconds = (max(o["end"] for o in outs) - min(o["start"] for o in outs)) if not errors else 0
    commits = sum(o.get("commits", 0) for o in outs)
    syncs = None if syncs_before is None or syncs_after is None else syncs_after - syncs_before
    return {
        "store": kind,
        "sessions": sessions,
        "processes": processes,
        "calls": calls,
        "seconds": rounded(seconds, 2),
        "calls_per_second": rounded(calls / seconds, 1) if seconds else None,
        "commits_per_call": rounded(commits / calls, 2) if calls else None,
        "syncs_per_call": rounded(syncs / calls, 2) if syncs is not None and calls else None,
        "problems": problems[:10],
        "ok": not problems and calls > 0,
    }


def run(smoke: bool = False, conninfo: str | None = None) -> Result:
    sessions = (1, 4) if smoke else SESSIONS
    processes = (1, 2) if smoke else PROCESSES
    window = 0.3 if smoke else WINDOW_SECONDS
    heading(f"scale: {', '.join(map(str, sessions))} sessions over "
            f"{', '.join(map(str, processes))} processes, {CALLS_PER_TURN}-call turns of a "
            f"protected tool, {window:g} s per cell, SQLite and PostgreSQL")  # fmt: skip
    cells: list[Result] = []
    with scratch_dir("scale") as d:
        fs = filesystem_of(d)

        def grid(pg_conninfo: str) -> None:
            for procs in processes:
                for sess in sessions:
                    for kind in STORES:
                        if sess < procs:  # one session cannot be spread over processes
                            cells.append({"store": kind, "sessions": sess, "processes": procs,
                                          "applicable": False})  # fmt: skip
                            continue
                        if kind == "sqlite":
                            where = str(d / f"scale-{procs}p-{sess}s.db")
                        else:
                            where = f"{pg_conninfo}|scale_{uuid.uuid4().hex[:12]}"
                        cell = run_cell(kind, where, sess, procs, window, d,
                                        pg_conninfo if kind == "postgres" else None)
                        cells.append({**cell, "applicable": True})
                        print(f"  {kind:8} {procs} proc x {sess:2} sessions: "
                              f"{cell['calls_per_second']} calls/s, ok {cell['ok']}", flush=True)

        with postgres(conninfo) as server:
            grid(server)

    def show(c: Result, key: str) -> str:
        if not c["applicable"]:
            return "n/a"
        return "-" if c.get(key) is None else f"{c[key]:g}"

    print(table(
        ("processes", "sessions", *(f"{k} calls/s" for k in STORES), "sqlite commits/call",
         "postgres commits/call", "sqlite syncs/call", "postgres WAL flushes/call", "ok"),
        [(p_, s_, *(show(by[k], "calls_per_second") for k in STORES),
          show(by["sqlite"], "commits_per_call"), show(by["postgres"], "commits_per_call"),
          show(by["sqlite"], "syncs_per_call"), show(by["postgres"], "syncs_per_call"),
          all(c.get("ok", True) for c in by.values()))
         for p_ in processes for s_ in sessions
         for by in [{c["store"]: c for c in cells
                     if c["processes"] == p_ and c["sessions"] == s_}]],
        right=(0, 1, 2, 3, 4, 5, 6, 7),
    ))  # fmt: skip
    for c in cells:
        for problem in c.get("problems", []):
            print(f"  PROBLEM ({c['store']}, {c['processes']}p x {c['sessions']}s):", problem)
    return {
        "sessions": list(sessions),
        "processes": list(processes),
        "calls_per_turn": CALLS_PER_TURN,
        "window_seconds": window,
        "scratch_fs": fs,
        "cpus": os.cpu_count(),
        "sqlite_syncs_counted_by": "strace -f --seccomp-bpf" if shutil.which("strace") else None,
        "cells": cells,
        "ok": all(c.get("ok", True) for c in cells),
    }


def main(argv: list[str] | None = None) -> int:
    return cli(run, "protected calls/s with many sessions and processes, SQLite and PostgreSQL",
               argv)


if __name__ == "__main__":
    sys.exit(main())
