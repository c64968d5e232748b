"""How long the ledger stalls an asyncio event loop: Session called from coroutines vs AsyncSession.

What it measures
----------------
Several conversations run at once on one event loop, each a coroutine doing
``record`` + ``execute`` of one ``idempotent`` call per message (an async tool
with a trivial effect), on one SqliteStore file (real fsyncs; put
``$TOOLLEDGER_BENCH_DIR`` on the disk to measure).  Two measures of how long
the loop is held, per mode:

- **the loop thread's CPU per step**: every callback the loop runs (a task's
  step is one) is timed in the loop thread's own CPU time
  (``time.thread_time``): what the loop itself spent in that step, the
  ledger's commits included when they run there, and never the machine's
  preemptions.  Per call: its largest step (median over the calls), and the
  largest step of the run;
- **wall-clock stalls**: a ticker coroutine yields to the loop again and again
  and notes how long each yield took: the largest gap, the 99th percentile,
  and the largest gap of each call (median over the calls).  These include
  the OS scheduler giving the core to another thread or process (the worker
  threads of AsyncSession among them) and the interpreter's lock: on a shared
  machine they are noise-bound, so the 1-minute load average is reported.

Also ticks of the loop per call, calls/s (beside a spinning ticker, which
takes CPU from the workers: not a throughput figure) and commits per call.

- ``no ledger``: the same coroutines and the same tool body, no ledger: the floor;
- ``Session``: the synchronous API called directly from the coroutines
  (what an adopter without an async API does): every commit holds the loop;
- ``AsyncSession``: the same calls awaited; commits run in worker threads.

Rounds interleave the two modes; the figures are medians over rounds.  Times
are for comparison side by side on the same machine, and nothing asserts one.
``python benchmarks/bench_async.py [--smoke] [--json]``.
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import os
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any

from benchmarks.common import cli, filesystem_of, heading, median, rounded, scratch_dir, table
from toolledger import AsyncSession, Attempt, CallRef, RecoveryPolicy, Session, SqliteStore, Tool

Result = dict[str, Any]
MODES = ("no ledger", "Session", "AsyncSession")
TOOLS: dict[str, Tool | str] = {"send": Tool(policy="idempotent", requires_approval=False)}


async def _send(a: Attempt) -> str:
    await asyncio.sleep(0)
    return f"sent {a.arguments['n']}"


async def _conversation(mode: str, store: SqliteStore, sid: str, calls: int,
                        spans: list[tuple[float, float]]) -> None:
    t: AsyncSession | None = None
    s: Session | None = None
    if mode == "Session":
        s = Session.open(store, sid, TOOLS)
    elif mode == "AsyncSession":
        t = await AsyncSession.open(store, sid, TOOLS)
    for n in range(calls):
        call = {"id": f"c{n}", "name": "send", "arguments": {"n": n}}
        t0 = time.perf_counter()
        if s is not None:
            [c] = s.record(n + 1, [call])
            # a coroutine body cannot run under the sync API: the same effect, in line
            s.execute(c.key, lambda a: f"sent {a.arguments['n']}")
        elif t is not None:
            [c] = await t.record(n + 1, [call])
            await t.execute(c.key, _send)
        else:  # the floor: the same coroutines, no ledger
            await _send(Attempt(CallRef("k", "c", "send", (n, 0), MappingProxyType({"n": n}),
                                        RecoveryPolicy.IDEMPOTENT, False), 1, None))
        spans.append((t0, time.perf_counter()))
        await asyncio.sleep(0)  # the conversation's other awaits (the model, ...)


def _largest(spans: list[tuple[float, float]], ends: list[float], t0: float, t1: float
             ) -> float:
    """The largest of ``spans`` ((end, length) pairs, in order, one after the other;
    ``ends`` their ends) overlapping [t0, t1]: those ending from t0 on, up to the first
    ending after t1."""
    lo, hi = bisect.bisect_left(ends, t0), bisect.bisect_right(ends, t1) + 1
    return max((length for _, length in spans[lo:hi]), default=0.0)


async def _round(mode: str, path: Path, conversations: int, calls: int) -> Result:
    store = SqliteStore(path)
    gaps: list[tuple[float, float]] = []  # (end of the gap, its length), in order
    spans: list[tuple[float, float]] = []  # (start, end) of every call
    done = False

    async def ticker() -> None:
        while not done:
            t0 = time.perf_counter()
            await asyncio.sleep(0)
            t1 = time.perf_counter()
            gaps.append((t1, t1 - t0))

    # every callback the loop runs (a task's step is one), timed in the loop thread's
    # CPU time: what the loop itself spent, without the machine's preemptions
    steps: list[tuple[float, float]] = []  # (wall end, CPU seconds of the step)
    run_handle = asyncio.events.Handle._run

    collecting = False  # from the calls' start to their end only

    def timed_run(handle: asyncio.events.Handle) -> None:
        c0 = time.thread_time()
        run_handle(handle)
        if collecting:
            steps.append((time.perf_counter(), time.thread_time() - c0))

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    commits0 = store.commits
    asyncio.events.Handle._run = timed_run  # type: ignore[method-assign,assignment]
    gc.disable()  # the figures' own lists would make the collector pause the loop
    try:
        collecting = True
        start = time.perf_counter()
        await asyncio.gather(*(_conversation(mode, store, f"{mode}-{i}", calls, spans)
                               for i in range(conversations)))
        wall = time.perf_counter() - start
        collecting = False
    finally:
        asyncio.events.Handle._run = run_handle  # type: ignore[method-assign]
        gc.enable()
    done = True
    await tick
    commits = store.commits - commits0
    store.close()
    # the largest stall of each call: of the gaps overlapping the call (the gaps follow
    # one another: those ending from its start on, up to the first ending after its end)
    per_call, cpu_per_call = [], []
    gap_ends, step_ends = [end for end, _ in gaps], [end for end, _ in steps]
    for t0, t1 in spans:
        per_call.append(_largest(gaps, gap_ends, t0, t1))
        cpu_per_call.append(_largest(steps, step_ends, t0, t1))
    lengths = sorted(g for _, g in gaps)
    n = conversations * calls
    return {
        "max_stall_ms": lengths[-1] * 1e3,
        "p99_stall_ms": lengths[int(0.99 * (len(lengths) - 1))] * 1e3,
        "largest_stall_per_call_median_ms": median(per_call) * 1e3,
        "largest_step_cpu_per_call_median_ms": median(cpu_per_call) * 1e3,
        "largest_step_cpu_ms": max(c for _, c in steps) * 1e3,
        "ticks_per_call": len(gaps) / n,
        "calls_per_s": n / wall,
        "commits_per_call": commits / n,
    }


def run(smoke: bool = False) -> Result:
    conversations, calls, rounds = (2, 3, 1) if smoke else (4, 25, 5)
    per: dict[str, list[Result]] = {m: [] for m in MODES}
    with scratch_dir("async") as d:
        fs = filesystem_of(d)
        for mode in MODES:  # warm up: the store threads, the imports, the caches
            asyncio.run(_round(mode, d / f"warm-{mode}.db", conversations, 2))
        for r in range(rounds):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:  # interleaved
                per[mode].append(asyncio.run(
                    _round(mode, d / f"{mode}-{r}.db", conversations, calls)))
    figures = {m: {k: rounded(median([x[k] for x in rows]))
                   for k in rows[0]} for m, rows in per.items()}
    heading(f"how long the ledger holds the event loop: {conversations} conversations at once, "
            f"{calls} calls each, SqliteStore on {fs}, median of {rounds} rounds")
    keys = list(figures["Session"])
    print(table(["figure", *MODES], [[k, *(figures[m][k] for m in MODES)] for k in keys],
                right=(1, 2, 3)))
    sync, asy = figures["Session"], figures["AsyncSession"]
    print(f"largest stall per call (median over calls, wall clock): Session "
          f"{sync['largest_stall_per_call_median_ms']} ms, AsyncSession "
          f"{asy['largest_stall_per_call_median_ms']} ms, no ledger "
          f"{figures['no ledger']['largest_stall_per_call_median_ms']} ms; the loop thread's "
          f"CPU in its largest step per call: Session "
          f"{sync['largest_step_cpu_per_call_median_ms']} ms, AsyncSession "
          f"{asy['largest_step_cpu_per_call_median_ms']} ms")
    load = os.getloadavg()[0]
    print(f"1-minute load average at the end: {load:.2f} on {os.cpu_count()} cores")
    return {"conversations": conversations, "calls": calls, "rounds": rounds,
            "filesystem": fs, "load_average": rounded(load, 2), "modes": figures}


def main(argv: list[str] | None = None) -> int:
    return cli(run, __doc__.splitlines()[0] if __doc__ else "", argv)


if __name__ == "__main__":
    raise SystemExit(main())
