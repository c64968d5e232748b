"""toolledger against its peers: LangGraph and DBOS, side by side in one run.

The workload
------------
One "turn" is one assistant message of 5 independent, durably recorded calls
of a side-effecting tool whose effect is trivial (a counter in memory); most
rows run them one after the other, the ``-together`` and ``-parallel`` rows
each system's own way of running a message's calls together.  Every system runs it on
SQLite in the same scratch directory (``$TOOLLEDGER_BENCH_DIR``, see
``benchmarks/common.py``), its own file each, the way its documentation says:

- ``toolledger``: :class:`toolledger.Session` on a :class:`toolledger.SqliteStore`
  (WAL, ``synchronous=FULL``): open the session (one commit creates it),
  ``record`` the 5 calls of the assistant message (one commit), then
  ``execute`` each (the ``dispatched`` commit before the tool runs,
  ``succeeded`` + the result after: two commits per call); idempotent tool,
  no approval: 2n + 2 commits;
- ``toolledger-batched``: the same turn as an engine runs it with
  ``Session.open(..., lazy_create=True)`` and ``Session.execute_message``: the
  session's creation, the message's record and the first call's
  ``dispatched`` are one commit, then ``succeeded(k)`` + its result and
  ``dispatched(k+1)`` share one commit: n + 1 commits for n calls in all
  (the sequential fused path; its ratios are reported beside the reference's);
- ``toolledger-together``: the same with ``execute_message(1, message, body,
  together=True)``: [create + record + ``dispatched`` of all 5 calls] is one
  commit, the 5 bodies run in the message's order, then [all 5 outcomes +
  results] is one commit: 2 commits per message however many calls (the
  store's counter says so: ``commits_per_message``).  The ratios and the goals
  are computed from this row.  Its price is the crash window: a crash between
  its two commits leaves EVERY call of the message dispatched-and-unknown,
  including those whose body had not started, and recovery decides each by
  its policy (idempotent: retried under its key, the external system
  deduplicates; reconcile: asked; manual: halted for a human, one item per
  call, where the sequential path would leave one call);
- ``langgraph``: a LangGraph functional ``@entrypoint`` calling a ``@task``
  5 times, each ``.result()`` awaited before the next is launched,
  checkpointer ``SqliteSaver`` (its own ``setup()``: WAL),
  ``durability="sync"`` (each task's write is durable before the run goes on);
- ``langgraph-parallel``: LangGraph's own concurrent form of the same message:
  the entrypoint launches the 5 ``@task`` futures first, then collects their
  ``.result()``s; LangGraph runs them concurrently and saves each one's write
  as it completes;
- ``dbos``: a DBOS ``@DBOS.workflow`` calling a ``@DBOS.step`` 5 times, the
  SQLite system database as shipped (``system_database_url="sqlite:///..."``);
- ``dbos-wal``: the same, every connection of DBOS's engine set to
  ``journal_mode=WAL`` and ``synchronous=FULL`` (an SQLAlchemy connect hook);
- ``dbos-wal-parallel``: DBOS's documented way to run a workflow's steps
  concurrently, on the same WAL database: an ``async`` workflow starts 5
  ``async`` steps with ``asyncio.create_task`` in a deterministic order (each
  keeps its step id for recovery), then ``asyncio.gather``s them; every step's
  output is recorded as it completes, as in the sequential form (one
  ``operation_outputs`` row per step; checked by reading the database).

So the comparison is like for like: toolledger's message dispatched together
against each peer's own concurrent form as well as its sequential loop.  The
goals judge ``toolledger-together`` against each peer's BEST form for the
workload (``langgraph`` or ``langgraph-parallel``, ``dbos-wal`` or
``dbos-wal-parallel``: the higher calls/s, rate by rate), and report
``toolledger-batched``'s ratios against the same forms beside it.  On SQLite
a database's commits are serialized (the write lock is held through the
sync), so the peers' concurrent forms run their bodies concurrently but not
their syncs: the model below stays additive for them, and its error against
the measured slow disk says how well that holds.

Each measurement is a child process (DBOS is one instance per process) that
runs some untimed turns first (files created, caches warm), then the timed
turns, and reports wall time, CPU time (``getrusage``: user + system, all its
threads) and ``/proc/self/io`` (``write_bytes``: bytes it sent to the storage
layer; ``wchar``: bytes it passed to ``write``-family calls) for the timed
turns only.  Rounds are interleaved (every system once per round, the order
rotated), so a noisy minute on the shared machine hits all of them; the
figures are medians over rounds, the ratios toolledger / peer are of those
medians.

Syncs per call
--------------
Counted by the kernel: the child runs under ``strace -f --seccomp-bpf``
tracing ``fsync``, ``fdatasync``, ``sync_file_range`` and ``msync``; the
child marks the start and the end of its timed turns with an ``access()`` of
a marker path, and only the sync calls between the two marks are counted
(every thread of the process: a background thread's sync is the system's
too).  Without ``strace`` the column says so (no guess).

The slow disk (reproducible)
----------------------------
The same strace run injects a delay into every ``fsync``/``fdatasync`` exit
(``-e inject=fsync,fdatasync:delay_exit=DELAY_US``): a disk whose sync takes
that much longer, for every system alike, with no LD_PRELOAD, FUSE or device
mapper.  On a loaded machine the delay a process really sees is longer than
the one asked for (the tracer must be scheduled to resume it), so the run
also measures it: a raw ``write`` + ``fdatasync`` loop in the same directory,
under the same injection, each round (``slow_sync_ms``), against the same
loop without it (``fast_sync_ms``).  The model

    t_slow(call) = t_fast(call) + syncs_per_call * (slow_sync_ms - fast_sync_ms)

is printed next to the measured slow rate (its error says how far the
model can be trusted), and evaluated at a 3 ms sync (a slow cloud volume)
for every system: that is the slow-disk ratio of the issue, from measured
syncs per call and measured fast-disk time per call.

The crash table
---------------
For each system (and toolledger's recovery policies): a child runs one call
(toolledger: the ``toolledger-batched`` turn, so the session is created, the
call recorded and dispatched in one commit; toolledger-together: its own
turn, the same first commit, the outcome due in the second), its effect is
appended to a file and fsynced, and the child SIGKILLs itself
before the system records the outcome (between the effect and the
checkpoint); a second child resumes the way the system's documentation says
(toolledger: ``Session.recover()`` and act on its ``Next``; LangGraph:
``invoke(None, config)`` on the same thread; DBOS: ``DBOS.launch()`` recovers
pending workflows).  The table counts the effects the external system applied.
The idempotent tool's external system deduplicates on the idempotency key
(as an email API with ``Idempotency-Key`` does); the peers send no key.
The rows are one-call turns, so ``duplicates`` is ``effects - 1``; the
together row's wider window (every call of a multi-call message left
unknown) is described above, not counted here (``tests/test_benchmarks_smoke.py``
checks it: killed after the first of 5 effects, recovery finds all 5 calls to
retry, to reconcile or halted, by policy).  The peers' parallel rows run the
same one-call turn through their concurrent form (its recovery path).

Tools that take time
--------------------
Real tools are network calls of tens to thousands of milliseconds; there, how
a message's calls are scheduled matters more than any sync.  A second table
runs the same 5-call turn with a tool that sleeps ``LATENCIES_MS`` (0, 20 and
200 ms; the peers' async forms ``await asyncio.sleep``), fast disk only, for
toolledger's message paths, sequential (``toolledger-batched``,
``toolledger-together``) and concurrent (``toolledger-concurrent``,
``toolledger-together-concurrent``: ``execute_message(..., concurrency=5)``,
the 5 bodies in 5 worker threads, with and without ``together``), against the
peers' parallel forms (``langgraph-parallel``, ``dbos-wal-parallel``).  One
child per system and round runs every latency (warm turns first at each),
rounds interleaved as above.  The goal (``LATENCY_GOAL``): every concurrent
toolledger row >= 1.0x each peer's parallel form at 20 and 200 ms; the
sequential rows' ratios are printed beside them (they run the 5 bodies one
after the other, so they tend to 1/5 of a parallel form as the tool slows).

call4agents
-----------
``call4agents`` (0.5, stdlib only, the closest competitor library: an intent
row before the action and a result row after it, approvals bound to exact
arguments) runs the same turn as one ``c4a.run("turn-n")`` calling an
``@c4a.effect(idempotent_for=...)`` tool 5 times (the tool sends
``c4a.idempotency_key()``; its SQLite run record in WAL with
``synchronous=FULL``, as shipped).  Its goal: the plain toolledger path >=
1.5x.  Its crash row: resumed in the same run, the action in doubt is resent
under the same key and the external system deduplicates it.

PostgreSQL
----------
A second table runs the same workload on one throwaway PostgreSQL server
(``tests/pg_cluster.py``: loopback, ``fsync`` on), each child on a fresh
database: toolledger's :class:`toolledger.PostgresStore` on the plain
(``toolledger-pg``), message (``toolledger-batched-pg``) and together
(``toolledger-together-pg``) paths; DBOS with its system database there
(``dbos-pg``, ``dbos-parallel-pg``: its primary configuration); LangGraph's
``PostgresSaver`` (``langgraph-pg``, ``langgraph-parallel-pg``; the
connection its documentation asks for: autocommit, ``prepare_threshold=0``,
``dict_row``; ``durability="sync"``); call4agents' PostgreSQL run record
(``call4agents-pg``, reported, not judged).  Interleaved rounds as above,
fast disk only.  The server counts the WAL: a child idles
:data:`PG_STATS_IDLE_S` after its untimed turns (an idle backend reports its
counts after 10 s), says ``ready``, the parent reads ``pg_stat_wal.wal_sync``
and the WAL insert position, the child runs its timed turns and exits (its
backends report as they exit), the parent reads them again: WAL flushes and
WAL bytes per call over the timed turns only.  CPU is the client's.  The goal
(``PG_GOAL``): every toolledger path >= 1.2x DBOS's and LangGraph's best form.

``python benchmarks/bench_peers.py [--smoke] [--json]``; needs the
``peers`` extra (``pip install -e '.[peers]'``); a peer that is not installed
is reported as such and skipped.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (
    ROOT,
    Result,
    cli,
    filesystem_of,
    heading,
    median,
    postgres,
    scratch_dir,
    table,
)

CALLS_PER_TURN = 5
SYSTEMS = ("toolledger", "toolledger-batched", "toolledger-together", "langgraph",
           "langgraph-parallel", "dbos", "dbos-wal", "dbos-wal-parallel", "call4agents")
REFERENCE = "toolledger-together"
"""The toolledger row the ratios (tl/it) and the goals are computed from: an engine that
runs a message's calls with ``Session.execute_message(..., together=True)`` (two commits
per message)."""
SEQUENTIAL_REFERENCE = "toolledger-batched"
"""The sequential fused toolledger row (n + 1 commits per n-call message): its ratios
are reported beside the reference's, against the same peer forms."""
PLAIN_REFERENCE = "toolledger"
"""The plain per-call row (``record``, then one ``execute`` per call: the README's path, an
adopter's first code): its ratios are reported beside the others', against the same peer
forms, so no path's users are quoted another path's ratio."""
JUDGED_ROWS = {"": REFERENCE, "sequential_": SEQUENTIAL_REFERENCE, "plain_": PLAIN_REFERENCE}
"""Each toolledger row the goals report, by the prefix of its keys in a goal."""
TOOLLEDGER_MODES = {"toolledger": "sequential", "toolledger-batched": "batched",
                    "toolledger-together": "together"}
CONCURRENT_MODES = {"toolledger-concurrent": "concurrent",
                    "toolledger-together-concurrent": "together-concurrent"}
"""toolledger's message paths with ``execute_message(..., concurrency=CALLS_PER_TURN)``:
the rows of the latency table only."""
ALL_MODES = {**TOOLLEDGER_MODES, **CONCURRENT_MODES}
LATENCIES_MS = (0, 20, 200)
"""How long the tool takes in the latency table (a sleep in the body)."""
LATENCY_SYSTEMS = ("toolledger-batched", "toolledger-together", "toolledger-concurrent",
                   "toolledger-together-concurrent", "langgraph-parallel", "dbos-wal-parallel")
LATENCY_JUDGED = ("toolledger-concurrent", "toolledger-together-concurrent")
"""The rows the latency goal judges (the sequential ones are reported beside them)."""
LATENCY_PEERS = ("langgraph-parallel", "dbos-wal-parallel")
LATENCY_GOAL = 1.0
"""toolledger / each peer's parallel form, calls/s, at every latency > 0."""
TOOL_LATENCY_S = [0.0]
"""How long every system's tool body sleeps now (the latency child sets it)."""
PEER_FORMS = {"langgraph": ("langgraph", "langgraph-parallel"),
              "dbos-wal": ("dbos-wal", "dbos-wal-parallel"),
              "call4agents": ("call4agents",)}
"""Each judged peer's forms of the same message: its sequential loop and its own
concurrent form; a goal is judged against the better of the two, metric by metric."""
SLOW_SYNC_DELAY_US = 3000
"""The delay strace adds to every fsync/fdatasync exit in the slow-disk runs."""
SLOW = f"delay_exit={SLOW_SYNC_DELAY_US}"
NO_SYNC = "retval=0"
"""strace skips the system call and returns 0: the same work with every sync free."""
MODEL_SYNC_MS = {"fast": 0.14, "slow": 3.0}
"""The sync latencies the model evaluates every system at: the issue's fast disk (a
one-row SQLite commit ~0.14 ms) and its slow one (~3 ms, as on many cloud volumes)."""
MARK_BEGIN = "/toolledger-bench-mark-begin"
MARK_END = "/toolledger-bench-mark-end"
SYNC_CALLS = ("fdatasync", "fsync", "sync_file_range", "msync")
GOALS = {"langgraph": 1.2, "dbos-wal": 2.0, "call4agents": 1.5}
"""toolledger / peer calls/s the issue asks for, on both kinds of disk."""
PG_SUFFIX = "-pg"
PG_SYSTEMS = ("toolledger-pg", "toolledger-batched-pg", "toolledger-together-pg", "langgraph-pg",
              "langgraph-parallel-pg", "dbos-pg", "dbos-parallel-pg", "call4agents-pg")
"""The PostgreSQL table's rows: each SQLite row's workload on one throwaway server
(``base_system`` names the SQLite row)."""
PG_JUDGED = ("toolledger-pg", "toolledger-batched-pg", "toolledger-together-pg")
PG_PEER_FORMS = {"langgraph-pg": ("langgraph-pg", "langgraph-parallel-pg"),
                 "dbos-pg": ("dbos-pg", "dbos-parallel-pg"),
                 "call4agents-pg": ("call4agents-pg",)}
PG_GOAL_PEERS = ("langgraph-pg", "dbos-pg")
"""The peers the PostgreSQL goal judges (call4agents' row is reported beside them)."""
PG_GOAL = 1.2
"""Every toolledger path on PostgreSQL / each peer's best form on the same server, calls/s."""
PG_STATS_IDLE_S = 11.0
"""How long a PostgreSQL child idles after its untimed turns: a backend reports its WAL
counts to ``pg_stat_wal`` when it has been idle 10 s (or exits), so the counts read then
hold every untimed turn and none of the timed ones."""


def _requirements(system: str) -> list[str]:
    base, pg = base_system(system)
    if base in ALL_MODES:
        return ["psycopg"] if pg else []
    if base.startswith("langgraph"):
        return ["langgraph", "langgraph.checkpoint.postgres" if pg else
                "langgraph.checkpoint.sqlite", *(["psycopg"] if pg else [])]
    if base == "call4agents":
        return ["call4agents", *(["psycopg"] if pg else [])]
    return ["dbos", *(["psycopg"] if pg else [])]


def base_system(system: str) -> tuple[str, bool]:
    """``(the SQLite row's name, whether the row runs on PostgreSQL)``: ``dbos-pg`` ->
    ``("dbos-wal", True)`` (on PostgreSQL there is no journal mode to choose)."""
    if not system.endswith(PG_SUFFIX):
        return system, False
    base = system[: -len(PG_SUFFIX)]
    return {"dbos": "dbos-wal", "dbos-parallel": "dbos-wal-parallel"}.get(base, base), True


def installed(system: str) -> bool:
    """Whether the packages ``system`` needs can be imported here."""
    try:
        return all(importlib.util.find_spec(m) is not None for m in _requirements(system))
    except ModuleNotFoundError:
        return False


# --------------------------------------------------------------------------
# The workloads (run in a child process)
# --------------------------------------------------------------------------

Turn = Callable[..., None]
"""Run turn number ``n``: its 5 calls, each durably recorded."""
Workload = tuple[Turn, Callable[[], None]]
"""A system's turn, and how to close it."""
Hook = Callable[[], None] | None


class Effects:
    """The external system: applies an effect, deduplicating on a key if given.

    In memory for the throughput runs; on a file (appended and fsynced
    before the call returns) for the crash table.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.count = 0
        self.keys: set[str] = set()
        if path is not None and path.exists():
            lines = path.read_text().splitlines()
            self.count = len(lines)
            self.keys = {x for x in lines if x != "-"}

    def apply(self, key: str | None = None) -> bool:
        if key is not None and key in self.keys:
            return False  # deduplicated: already applied under this key
        self.count += 1
        if key is not None:
            self.keys.add(key)
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(f"{key or '-'}\n")
                f.flush()
                os.fsync(f.fileno())
        return True


def toolledger_turns(directory: Path, effects: Effects, policy: str = "idempotent",
                     after_effect: Hook = None, *, mode: str = "sequential",
                     pg: str | None = None) -> Workload:
    turn, store = toolledger_workload(directory, effects, policy, after_effect, mode=mode, pg=pg)
    return turn, store.close


def toolledger_workload(directory: Path, effects: Effects, policy: str = "idempotent",
                        after_effect: Hook = None, *, mode: str = "sequential",
                        pg: str | None = None) -> tuple[Turn, Any]:
    """toolledger's turn in ``mode`` (``sequential``: record, then one ``execute`` per
    call; ``batched``: ``lazy_create`` + ``execute_message``; ``together``: the same with
    ``together=True``; ``concurrent`` / ``together-concurrent``: those two with
    ``concurrency=`` the message's calls), and its store (whose ``commits`` counter the
    worker reads).  The tool sleeps ``TOOL_LATENCY_S[0]`` (a network call).  ``pg``: a
    libpq connection string: the store is a :class:`toolledger.PostgresStore` there."""
    from toolledger import PostgresStore, Session, SqliteStore, Tool

    if mode not in ALL_MODES.values():
        raise ValueError(f"unknown toolledger mode {mode!r}; one of "
                         f"{', '.join(ALL_MODES.values())}")
    store: Any = (SqliteStore(directory / "toolledger.sqlite3") if pg is None
                  else PostgresStore(pg))
    tools = {"send": Tool(policy, requires_approval=False)}

    def turn(n: int, calls: int = CALLS_PER_TURN) -> None:
        message = [{"id": f"c{i}", "name": "send", "arguments": {"i": i}} for i in range(calls)]

        def body(a: Any) -> str:
            # idempotent: the external system deduplicates on the key; reconcile: it
            # keeps the execution id it was sent, to answer reconcile(); manual: nothing
            if TOOL_LATENCY_S[0]:
                time.sleep(TOOL_LATENCY_S[0])
            effects.apply(a.idempotency_key or (a.call.key if policy == "reconcile"
                                                else None))
            if after_effect is not None:
                after_effect()
            return "sent"

        # batched: [create + record + dispatched(1)], [succeeded(k) + dispatched(k+1)]...
        if mode == "batched":
            Session.open(store, f"turn-{n}", tools, lazy_create=True).execute_message(
                1, message, body)
        elif mode == "together":  # [create + record + dispatched(1..n)], [succeeded(1..n)]
            Session.open(store, f"turn-{n}", tools, lazy_create=True).execute_message(
                1, message, body, together=True)
        elif mode in ("concurrent", "together-concurrent"):  # n + 1 / 2 commits, n at once
            Session.open(store, f"turn-{n}", tools, lazy_create=True).execute_message(
                1, message, body, together=mode == "together-concurrent", concurrency=calls)
        else:
            s = Session.open(store, f"turn-{n}", tools)
            for st in s.record(1, message):
                s.execute(st.call.key, body)

    return turn, store


def langgraph_turns(directory: Path, effects: Effects,
                    after_effect: Hook = None, *, parallel: bool = False,
                    pg: str | None = None) -> Workload:
    import sqlite3

    from langgraph.func import entrypoint, task

    saver: Any
    conn: Any
    if pg is None:
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(str(directory / "langgraph.sqlite"), check_same_thread=False)
        saver = SqliteSaver(conn)
    else:  # the connection PostgresSaver's documentation asks for
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        conn = psycopg.Connection.connect(pg, autocommit=True, prepare_threshold=0,
                                          row_factory=dict_row)
        saver = PostgresSaver(conn)
    saver.setup()

    @task
    def send(i: int) -> str:
        if TOOL_LATENCY_S[0]:
            time.sleep(TOOL_LATENCY_S[0])
        effects.apply()
        if after_effect is not None:
            after_effect()
        return "sent"

    @entrypoint(checkpointer=saver)
    def agent(calls: int) -> list[str]:
        if parallel:
            # LangGraph's own concurrent form: every @task future is launched before any
            # result is awaited; the tasks run concurrently and each one's write is saved
            # as it completes
            futures = [send(i) for i in range(calls)]
            return [f.result() for f in futures]
        return [send(i).result() for i in range(calls)]

    def turn(n: int, calls: int = CALLS_PER_TURN) -> None:
        agent.invoke(calls, {"configurable": {"thread_id": f"turn-{n}"}}, durability="sync")

    return turn, conn.close


def dbos_turns(directory: Path, effects: Effects, *, wal: bool,
               after_effect: Callable[[], None] | None = None,
               parallel: bool = False, pg: str | None = None) -> tuple[Turn, Callable[[], None]]:
    import asyncio

    from dbos import DBOS, SetWorkflowID

    if wal and pg is None:
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        def pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.close()

        event.listen(Engine, "connect", pragmas)
    name = ("dbos-wal" if wal else "dbos") + ("-parallel" if parallel else "")
    url = (f"sqlite:///{directory / (name + '.sqlite')}" if pg is None
           else pg_url(pg))  # its primary system database: PostgreSQL
    DBOS(config={"name": "toolledger-bench", "log_level": "WARNING",
                 "system_database_url": url})

    @DBOS.step()
    def send(i: int) -> str:
        if TOOL_LATENCY_S[0]:
            time.sleep(TOOL_LATENCY_S[0])
        effects.apply()
        if after_effect is not None:
            after_effect()
        return "sent"

    @DBOS.workflow()
    def agent(calls: int) -> list[str]:
        return [send(i) for i in range(calls)]

    @DBOS.step()
    async def send_async(i: int) -> str:
        if TOOL_LATENCY_S[0]:
            await asyncio.sleep(TOOL_LATENCY_S[0])  # an async tool: its own way to wait
        effects.apply()
        if after_effect is not None:
            after_effect()
        return "sent"

    @DBOS.workflow()
    async def agent_parallel(calls: int) -> list[str]:
        # DBOS's documented way to run a workflow's steps concurrently: an async
        # workflow starts its async steps as tasks in a deterministic order (so each
        # keeps its step id on recovery), then gathers them; each step's output is
        # recorded as it completes, as in the sequential form
        tasks = [asyncio.create_task(send_async(i)) for i in range(calls)]
        return list(await asyncio.gather(*tasks))

    DBOS.launch()
    loop = asyncio.new_event_loop()

    def turn(n: int, calls: int = CALLS_PER_TURN) -> None:
        with SetWorkflowID(f"turn-{n}"):
            if parallel:
                loop.run_until_complete(agent_parallel(calls))
            else:
                agent(calls)

    def close() -> None:
        DBOS.destroy(destroy_registry=True)
        loop.close()

    return turn, close


def call4agents_turns(directory: Path, effects: Effects, after_effect: Hook = None, *,
                      pg: str | None = None) -> Workload:
    """call4agents (a stdlib-only library: an intent row before the action, a result row
    after it): one ``c4a.run`` per turn, the tool an ``@c4a.effect(idempotent_for=...)``
    that sends ``c4a.idempotency_key()`` (an action in doubt after a crash is resent
    under the same key, the external system deduplicates, as toolledger's idempotent
    policy)."""
    c4a: Any = importlib.import_module("call4agents")  # untyped
    if pg is None:
        c4a.init(str(directory / "call4agents.sqlite"))
    else:  # a shared run record takes the secret its machines share
        c4a.init(pg_url(pg), secret=b"toolledger-bench-shared-secret")

    def body(i: int) -> str:
        if TOOL_LATENCY_S[0]:
            time.sleep(TOOL_LATENCY_S[0])
        effects.apply(c4a.idempotency_key())
        if after_effect is not None:
            after_effect()
        return "sent"

    send = c4a.effect(body, name="send", idempotent_for=24 * 3600)

    def turn(n: int, calls: int = CALLS_PER_TURN) -> None:
        with c4a.run(f"turn-{n}"):
            for i in range(calls):
                send(i)

    return turn, lambda: None  # its connections are per thread, closed with the process


def make(system: str, directory: Path, effects: Effects, policy: str = "idempotent",
         after_effect: Callable[[], None] | None = None,
         pg: str | None = None) -> tuple[Turn, Callable[[], None]]:
    """``system``'s turn and how to close it; a ``-pg`` row needs ``pg`` (its database)."""
    base, on_pg = base_system(system)
    if on_pg and pg is None:
        raise ValueError(f"{system} runs on PostgreSQL: pass pg=<connection string>")
    if base in ALL_MODES:
        return toolledger_turns(directory, effects, policy, after_effect,
                                mode=ALL_MODES[base], pg=pg)
    if base in ("langgraph", "langgraph-parallel"):
        return langgraph_turns(directory, effects, after_effect,
                               parallel=base == "langgraph-parallel", pg=pg)
    if base in ("dbos", "dbos-wal", "dbos-wal-parallel"):
        return dbos_turns(directory, effects, wal=base != "dbos", after_effect=after_effect,
                          parallel=base == "dbos-wal-parallel", pg=pg)
    if base == "call4agents":
        return call4agents_turns(directory, effects, after_effect, pg=pg)
    raise ValueError(f"unknown system {system!r}; one of {', '.join(SYSTEMS + PG_SYSTEMS)}")


def _io() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            k, _, v = line.partition(":")
            out[k.strip()] = int(v)
    except OSError:
        pass
    return out


def _cpu() -> float:
    # RUSAGE_SELF covers every thread of the process (DBOS has background ones)
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def worker(system: str, directory: Path, warm: int, turns: int) -> Result:
    """Child process: ``warm`` untimed turns, then ``turns`` timed ones."""
    effects = Effects()
    turn, close, store = build(system, directory, effects)
    try:
        return measure(turn, store, effects, warm, turns)
    finally:
        close()


def build(system: str, directory: Path, effects: Effects, pg: str | None = None
          ) -> tuple[Turn, Callable[[], None], Any]:
    """``system``'s turn, how to close it, and its store (toolledger: the counters the
    measurement reads; None for a peer)."""
    base, _ = base_system(system)
    if base in ALL_MODES:
        turn, store = toolledger_workload(directory, effects, mode=ALL_MODES[base], pg=pg)
        return turn, store.close, store
    turn, close = make(system, directory, effects, pg=pg)
    return turn, close, None


def measure(turn: Turn, store: Any, effects: Effects, warm: int, turns: int,
            start: int = 0) -> Result:
    """``warm`` untimed turns, then ``turns`` timed ones, numbered from ``start`` (a child
    measuring several times in a row): wall, CPU, I/O and the store's commits."""
    counted = effects.count
    for n in range(start, start + warm):
        turn(n)
    commits0 = None if store is None else (store.commits, store.ledger_commits)
    io0, cpu0 = _io(), _cpu()
    os.access(MARK_BEGIN, os.F_OK)  # the strace mark: timed turns begin
    t0 = time.perf_counter()
    for n in range(start + warm, start + warm + turns):
        turn(n)
    wall = time.perf_counter() - t0
    os.access(MARK_END, os.F_OK)
    cpu, io1 = _cpu() - cpu0, _io()
    commits = None if store is None or commits0 is None else (
        store.commits - commits0[0], store.ledger_commits - commits0[1])
    calls = turns * CALLS_PER_TURN
    assert effects.count - counted == (warm + turns) * CALLS_PER_TURN, \
        "an effect was lost or repeated"
    out: Result = {"calls": calls, "seconds": wall, "cpu_seconds": cpu,
                   "write_bytes": io1.get("write_bytes", 0) - io0.get("write_bytes", 0),
                   "wchar": io1.get("wchar", 0) - io0.get("wchar", 0)}
    if commits is not None:  # counted by the store: every commit, and the ledger's
        out["commits"], out["ledger_commits"] = commits
    return out


def latency_worker(system: str, directory: Path, plan: list[tuple[float, int, int]]
                   ) -> dict[str, Result]:
    """Child process of the latency table: one workload, and for each ``(latency_ms,
    warm, turns)`` of ``plan`` the tool sleeps that long (:data:`TOOL_LATENCY_S`) while
    :func:`measure` runs ``warm`` untimed, then ``turns`` timed turns (one process:
    DBOS is one instance per process)."""
    effects = Effects()
    turn, close, store = build(system, directory, effects)
    out: dict[str, Result] = {}
    start = 0
    try:
        for latency_ms, warm, turns in plan:
            TOOL_LATENCY_S[0] = latency_ms / 1000
            out[f"{latency_ms:g}"] = measure(turn, store, effects, warm, turns, start)
            start += warm + turns
    finally:
        TOOL_LATENCY_S[0] = 0.0
        close()
    return out


def latency_plan(smoke: bool) -> list[tuple[float, int, int]]:
    """``(latency_ms, warm turns, timed turns)``: about the same time at each latency."""
    if smoke:
        return [(ms, 1, 1) for ms in LATENCIES_MS[:2]]
    return [(ms, 2 if ms < 100 else 1, {0: 30, 20: 10}.get(ms, 3)) for ms in LATENCIES_MS]


def latency_goals(per: dict[str, dict[str, Result]]) -> Result:
    """Each toolledger message row / each peer's parallel form, calls/s, per latency; the
    goal: every judged (concurrent) row >= ``LATENCY_GOAL`` at every latency > 0."""
    ratios: Result = {}
    met = True
    for ms, rows in per.items():
        at: Result = {}
        for tl in (s for s in LATENCY_SYSTEMS if s in ALL_MODES and s in rows):
            at[tl] = {peer: rows[tl]["calls_per_second"] / rows[peer]["calls_per_second"]
                      for peer in LATENCY_PEERS if peer in rows}
            if float(ms) > 0 and tl in LATENCY_JUDGED:
                met = met and bool(at[tl]) and all(r >= LATENCY_GOAL for r in at[tl].values())
        ratios[ms] = at
    judged = any(float(ms) > 0 and any(p in rows for p in LATENCY_PEERS)
                 for ms, rows in per.items())
    return {"target": LATENCY_GOAL, "rows": list(LATENCY_JUDGED), "peers": list(LATENCY_PEERS),
            "ratios": ratios, "met": met if judged else None}


def latency_table(d: Path, smoke: bool) -> Result:
    """The latency table (see the module doc): interleaved rounds, fast disk only."""
    rounds = 1 if smoke else 3
    plan = latency_plan(smoke)
    systems = [s for s in LATENCY_SYSTEMS if installed(s)]
    raw: dict[str, list[dict[str, Result]]] = {s: [] for s in systems}
    load = [os.getloadavg()[0]]
    for r in range(rounds):
        for s in systems[r % len(systems):] + systems[:r % len(systems)]:
            work = d / f"latency-{s}-{time.monotonic_ns()}"
            work.mkdir()
            try:
                raw[s].append(_run_json(_child_code(
                    f"print(json.dumps(b.latency_worker({s!r}, b.Path({str(work)!r}), "
                    f"{plan!r})))"), s))
            finally:
                shutil.rmtree(work, ignore_errors=True)
        load.append(os.getloadavg()[0])
    per: dict[str, dict[str, Result]] = {}
    for ms, _, _ in plan:
        key = f"{ms:g}"
        per[key] = {}
        for s in systems:
            xs = [x[key] for x in raw[s]]
            row: Result = {"calls_per_second": median([x["calls"] / x["seconds"] for x in xs]),
                           "cpu_ms_per_call": _per_call(xs, "cpu_seconds") * 1000}
            if all("commits" in x for x in xs):
                row["commits_per_message"] = median(
                    [x["commits"] / x["calls"] for x in xs]) * CALLS_PER_TURN
            per[key][s] = row
    goals = latency_goals(per)
    print(f"\ntools that take time: {CALLS_PER_TURN}-call turns, {rounds} interleaved rounds, "
          f"fast disk; toolledger / each peer's parallel form (load {min(load):.2f} to "
          f"{max(load):.2f}):")
    head = ["system"]
    for ms, _, _ in plan:
        head += [f"{ms:g} ms calls/s"] + [f"/{p.split('-')[0]}" for p in LATENCY_PEERS]
    body = []
    for s in systems:
        line = [s]
        for ms, _, _ in plan:
            key = f"{ms:g}"
            line.append(format(per[key][s]["calls_per_second"], ".0f"))
            rs = goals["ratios"][key].get(s, {})
            line += [format(rs[p], ".2f") if p in rs else "-" for p in LATENCY_PEERS]
        body.append(tuple(line))
    print(table(tuple(head), body, right=range(1, len(head))))
    print(f"goal: {', '.join(LATENCY_JUDGED)} >= {LATENCY_GOAL:g}x each of "
          f"{', '.join(LATENCY_PEERS)} at every latency > 0: "
          + {True: "met", False: "not met", None: "not judged"}[goals["met"]])
    return {"plan": [list(x) for x in plan], "rounds": rounds, "load_average_1min": load,
            "systems": per, "goals": goals}


# --------------------------------------------------------------------------
# PostgreSQL: the same workload on one throwaway server
# --------------------------------------------------------------------------


def pg_url(conninfo: str) -> str:
    """``conninfo`` (libpq ``key=value`` pairs) as the URL DBOS takes."""
    from psycopg.conninfo import conninfo_to_dict

    d = conninfo_to_dict(conninfo)
    auth = str(d.get("user", "")) + (f":{d['password']}" if d.get("password") else "")
    return (f"postgresql://{auth}{'@' if auth else ''}{d.get('host', 'localhost')}:"
            f"{d.get('port', 5432)}/{d['dbname']}")


def pg_worker(system: str, conninfo: str, warm: int, turns: int, idle: float) -> None:
    """Child of the PostgreSQL table: ``warm`` untimed turns, ``idle`` seconds without a
    statement (see :data:`PG_STATS_IDLE_S`), ``ready`` on stdout, then, once the parent
    has read the server's counters and written a line, ``turns`` timed turns; the
    measurement is its last line of output."""
    import tempfile

    effects = Effects()
    with tempfile.TemporaryDirectory() as d:
        turn, close, store = build(system, Path(d), effects, pg=conninfo)
        try:
            for n in range(warm):
                turn(n)
            time.sleep(idle)
            print("ready", flush=True)
            sys.stdin.readline()
            res = measure(turn, store, effects, 0, turns, start=warm)
        finally:
            close()
    print(json.dumps(res), flush=True)


def wal_counters(admin: str) -> tuple[int, int]:
    """``(WAL flushes, WAL bytes)`` of the server so far: ``pg_stat_wal.wal_sync`` (every
    backend's and the WAL writer's, read until two reads 0.2 s apart agree) and the WAL
    insert position (exact)."""
    import psycopg

    last = -1
    with psycopg.connect(admin, autocommit=True) as conn:
        for _ in range(30):
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()
            now = int(row[0]) if row else 0
            if now == last:
                break
            last = now
            time.sleep(0.2)
        lsn = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
    return last, int(lsn[0]) if lsn else 0


def pg_run_child(system: str, admin: str, warm: int, turns: int, idle: float) -> Result:
    """One measurement of ``system`` in a fresh child, on a fresh database of the server
    ``admin`` connects to; the server's WAL flushes and bytes over the timed turns."""
    import uuid

    import psycopg
    from psycopg.conninfo import make_conninfo

    db = f"peers_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}")
    proc = subprocess.Popen(
        _child_code(f"b.pg_worker({system!r}, {make_conninfo(admin, dbname=db)!r}, {warm}, "
                    f"{turns}, {idle!r})"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        for line in proc.stdout:
            if line.strip() == "ready":
                break
        else:
            raise RuntimeError(f"{system} child failed before its timed turns:\n"
                               f"{proc.communicate(timeout=60)[1][-3000:]}")
        before = wal_counters(admin)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"{system} child failed ({proc.returncode}):\n{err[-3000:]}")
        after = wal_counters(admin)  # the child's backends reported as they exited
        res: Result = json.loads(out.strip().splitlines()[-1])
        res["wal_flushes"], res["wal_bytes"] = after[0] - before[0], after[1] - before[1]
        return res
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def pg_goals(per: dict[str, Result]) -> Result:
    """Every toolledger path on PostgreSQL / each peer's best form there (the higher
    calls/s of its forms); met when every ratio is >= :data:`PG_GOAL`."""
    ratios: Result = {}
    best: Result = {}
    for peer, forms in PG_PEER_FORMS.items():
        have = [f for f in forms if f in per]
        if have:
            best[peer] = max(have, key=lambda f: per[f]["calls_per_second"])
    for row in PG_JUDGED:
        if row in per:
            ratios[row] = {peer: per[row]["calls_per_second"] / per[b]["calls_per_second"]
                           for peer, b in best.items()}
    judged = any(p in best for p in PG_GOAL_PEERS) and bool(ratios)
    return {"target": PG_GOAL, "rows": list(PG_JUDGED), "judged_peers": list(PG_GOAL_PEERS),
            "forms": {k: list(v) for k, v in PG_PEER_FORMS.items()},
            "best_form": best, "ratios": ratios,
            "met": all(r >= PG_GOAL for x in ratios.values() for p, r in x.items()
                       if p in PG_GOAL_PEERS) if judged else None}


def pg_table(smoke: bool, conninfo: str | None = None) -> Result:
    """The PostgreSQL table (see the module doc): interleaved rounds on one server."""
    rounds, warm, turns = (1, 1, 2) if smoke else (3, 5, 30)
    idle = 0.0 if smoke else PG_STATS_IDLE_S
    systems = [s for s in PG_SYSTEMS if installed(s)]
    missing = [s for s in PG_SYSTEMS if s not in systems]
    raw: dict[str, list[Result]] = {s: [] for s in systems}
    load = [os.getloadavg()[0]]

    def rounds_on(admin: str) -> None:
        for r in range(rounds):
            for s in systems[r % len(systems):] + systems[:r % len(systems)]:
                raw[s].append(pg_run_child(s, admin, warm, turns, idle))
            load.append(os.getloadavg()[0])
            print(f"  postgres round {r + 1}/{rounds}: " + ", ".join(
                f"{s} {raw[s][-1]['calls'] / raw[s][-1]['seconds']:.0f}/s" for s in systems),
                flush=True)

    sys.path.insert(0, str(ROOT / "tests"))
    from pg_cluster import NoPostgres

    try:
        with postgres(conninfo) as server:
            rounds_on(server)
    except NoPostgres as exc:
        print(f"\npostgres rows not run: {exc}")
        return {"not_run": str(exc), "not_installed": missing}
    per: dict[str, Result] = {}
    for s in systems:
        xs = raw[s]
        row: Result = {"calls_per_second": median([x["calls"] / x["seconds"] for x in xs]),
                       "cpu_ms_per_call": _per_call(xs, "cpu_seconds") * 1000,
                       "wal_flushes_per_call": _per_call(xs, "wal_flushes"),
                       "wal_bytes_per_call": _per_call(xs, "wal_bytes")}
        if all("commits" in x for x in xs):
            row["commits_per_message"] = median(
                [x["commits"] / x["calls"] for x in xs]) * CALLS_PER_TURN
        per[s] = row
    goals = pg_goals(per)
    print(f"\nPostgreSQL (one throwaway server on loopback, fsync on): {CALLS_PER_TURN}-call "
          f"turns, {rounds} interleaved rounds of {turns} timed turns after {warm} untimed; "
          f"load {min(load):.2f} to {max(load):.2f}"
          + (f"; not installed: {', '.join(missing)}" if missing else "")
          + ("" if idle >= 10 else "; WAL counts include the untimed turns (smoke)"))
    peers = list(goals["best_form"])
    print(table(
        ("system", "calls/s", *(f"/{p} best" for p in peers), "WAL flushes/call",
         "WAL KB/call", "commits/msg", "client CPU ms/call"),
        [(s, format(r["calls_per_second"], ".0f"),
          *(format(goals["ratios"][s][p], ".2f") if s in goals["ratios"] else "-"
            for p in peers),
          format(r["wal_flushes_per_call"], ".2f"), format(r["wal_bytes_per_call"] / 1024, ".1f"),
          format(r["commits_per_message"], ".1f") if "commits_per_message" in r else "-",
          format(r["cpu_ms_per_call"], ".2f"))
         for s, r in per.items()], right=range(1, 6 + len(peers))))
    print(f"goal: every toolledger path >= {PG_GOAL:g}x each peer's best form on PostgreSQL: "
          + {True: "met", False: "not met", None: "not judged"}[goals["met"]])
    return {"rounds": rounds, "warm_turns": warm, "timed_turns": turns, "idle_seconds": idle,
            "wal_counts_timed_turns_only": idle >= 10, "not_installed": missing,
            "load_average_1min": load,
            "wal_counted_by": "pg_stat_wal.wal_sync and pg_current_wal_insert_lsn() of the "
                              "server, before and after the child's timed turns",
            "systems": per, "goals": goals}


# --------------------------------------------------------------------------
# Running the children
# --------------------------------------------------------------------------


def _child_code(call: str) -> list[str]:
    return [sys.executable, "-c",
            f"import sys, json; sys.path.insert(0, {str(ROOT)!r}); "
            f"from benchmarks import bench_peers as b; {call}"]


def run_child(system: str, directory: Path, warm: int, turns: int,
              strace: str | None = None, inject: str | None = None) -> Result:
    """One measurement in a fresh child; under strace: syncs counted, and ``inject``
    (``delay_exit=US``: every sync slowed; ``retval=0``: every sync skipped)."""
    work = directory / f"{system}-{time.monotonic_ns()}"
    work.mkdir()
    cmd = _child_code(f"print(json.dumps(b.worker({system!r}, b.Path({str(work)!r}), "
                      f"{warm}, {turns})))")
    log = work / "strace.log"
    if strace is not None:
        injected = ["-e", f"inject=fsync,fdatasync:{inject}"] if inject else []
        cmd = [strace, "-f", "-qq", "--seccomp-bpf", "-e",
               "trace=" + ",".join((*SYNC_CALLS, "access", "faccessat", "faccessat2")),
               *injected, "-o", str(log), *cmd]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"{system} child failed ({out.returncode}):\n{out.stderr[-3000:]}")
        res: Result = json.loads(out.stdout.strip().splitlines()[-1])
        if strace is not None:
            res["syncs"] = count_marked_syncs(log.read_text())
        return res
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_json(cmd: list[str], system: str) -> Any:
    """A child's last line of output, as JSON."""
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{system} child failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def count_marked_syncs(log: str) -> dict[str, int]:
    """Sync system calls in an strace log between the begin and end marks."""
    counts: dict[str, int] = {}
    inside = False
    for line in log.splitlines():
        if MARK_BEGIN in line:
            inside = True
        elif MARK_END in line:
            inside = False
        elif inside:
            for call in SYNC_CALLS:
                if f"{call}(" in line:
                    counts[call] = counts.get(call, 0) + 1
                    break
    return counts


def raw_sync_ms(directory: Path, n: int, strace: str | None = None, delay_us: int = 0) -> float:
    """Milliseconds per ``write(100 B)`` + ``fdatasync`` in ``directory`` (in a child)."""
    code = (f"fd = b.os.open({str(directory / 'raw.bin')!r}, b.os.O_WRONLY | b.os.O_CREAT "
            "| b.os.O_APPEND, 0o644)\nb.os.fdatasync(fd); t = b.time.perf_counter()\n"
            f"for _ in range({n}):\n    b.os.write(fd, b'x' * 100); b.os.fdatasync(fd)\n"
            f"print((b.time.perf_counter() - t) / {n} * 1000)")
    cmd = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
           f"from benchmarks import bench_peers as b\n{code}"]
    if strace is not None:
        cmd = [strace, "-f", "-qq", "--seccomp-bpf", "-e", "trace=fsync,fdatasync",
               "-e", f"inject=fsync,fdatasync:delay_exit={delay_us}", "-o", os.devnull, *cmd]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
        return float(out.stdout.strip().splitlines()[-1])
    finally:
        (directory / "raw.bin").unlink(missing_ok=True)


# --------------------------------------------------------------------------
# The crash table
# --------------------------------------------------------------------------


def crash_child(system: str, directory: Path, policy: str, phase: str) -> None:
    """Child: ``first`` runs one call and dies by SIGKILL right after its effect;
    ``resume`` recovers the way the system says and finishes the call."""
    effects = Effects(directory / "effects.log")

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if phase == "first":
        # toolledger: the engine-shaped path of the ratios' row (the session created,
        # the call recorded and dispatched in one commit), killed after the effect
        first = "toolledger-batched" if system == "toolledger" else system
        turn, _close = make(first, directory, effects, policy, after_effect=die)
        turn(0, 1)
        raise AssertionError("the child outlived its SIGKILL")
    if system in TOOLLEDGER_MODES:
        from toolledger import CannotTell, Next, Session, SqliteStore, Tool, WasApplied

        def ask(call: Any, attempt: int) -> WasApplied | CannotTell:
            # the external system answers from what it applied (the key is the execution id)
            applied = call.key in effects.keys
            return WasApplied("sent") if applied else CannotTell("no record of the key")

        with SqliteStore(directory / "toolledger.sqlite3") as store:
            s = Session.open(store, "turn-0", {"send": Tool(policy, requires_approval=False)})
            for st in s.recover():
                if st.next in (Next.RETRY, Next.EXECUTE):
                    def body(a: Any) -> str:
                        effects.apply(a.idempotency_key)
                        return "sent"
                    s.execute(st.call.key, body)
                elif st.next is Next.RECONCILE:
                    s.reconcile(st.call.key, ask)
                # HALTED: a human decides; nothing is sent again without one
        return
    if system.startswith("langgraph") or system == "call4agents":
        turn, close = make(system, directory, effects)
        turn(0, 1)  # the same thread (run): LangGraph resumes it, call4agents resends its key
        close()
        return
    turn, close = make(system, directory, effects)  # DBOS.launch() recovers turn-0
    deadline = time.monotonic() + 30
    while effects.count < 2 and time.monotonic() < deadline:
        # recovery runs in the background; wait for the workflow to finish
        from dbos import DBOS

        status = DBOS.get_workflow_status("turn-0")
        if status is not None and status.status == "SUCCESS":
            break
        time.sleep(0.05)
    close()


def crash_row(system: str, directory: Path, policy: str) -> Result:
    work = directory / f"crash-{system}-{policy}"
    work.mkdir()
    try:
        first = subprocess.run(
            _child_code(f"b.crash_child({system!r}, b.Path({str(work)!r}), {policy!r}, 'first')"),
            capture_output=True, text=True, timeout=300, check=False)
        killed = first.returncode == -signal.SIGKILL
        resume = subprocess.run(
            _child_code(f"b.crash_child({system!r}, b.Path({str(work)!r}), {policy!r}, "
                        "'resume')"), capture_output=True, text=True, timeout=300, check=False)
        if resume.returncode != 0:
            raise RuntimeError(f"{system} resume failed:\n{resume.stderr[-3000:]}")
        effects = Effects(work / "effects.log").count
        return {"system": system, "policy": policy, "killed_after_effect": killed,
                "effects": effects, "duplicates": max(0, effects - 1)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


CRASH_CASES = (("toolledger", "idempotent"), ("toolledger", "manual"), ("toolledger", "reconcile"),
               ("toolledger-together", "idempotent"), ("toolledger-together", "manual"),
               ("toolledger-together", "reconcile"),
               ("langgraph", "as shipped"), ("langgraph-parallel", "as shipped"),
               ("dbos", "as shipped"), ("dbos-wal", "as shipped"),
               ("dbos-wal-parallel", "as shipped"), ("call4agents", "idempotent_for"))


# --------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------


RATIO_OF = {"calls_per_second": "ratio_measured_fast",
            "slow_calls_per_second": "ratio_measured_slow",
            "model_fast_disk_calls_per_second": "ratio_model_fast_disk",
            "model_slow_disk_calls_per_second": "ratio_model_slow_disk"}
"""Each rate, and the name of the ratio toolledger / it of that rate."""


def peer_goals(per: dict[str, Result]) -> Result:
    """The issue's goals from the rows ``per``: toolledger's best row (``REFERENCE``)
    against each judged peer's best form for the workload (the higher of its sequential
    and parallel rows, rate by rate), with the sequential fused row's and the plain row's
    ratios beside it; syncs and bytes per call of each row."""
    goals: Result = {}
    rows = {prefix: per.get(row) for prefix, row in JUDGED_ROWS.items()}
    for peer, target in GOALS.items():
        forms = [f for f in PEER_FORMS[peer] if f in per]
        if not forms:
            continue
        gl: Result = {"target": target, "row": REFERENCE,
                      "sequential_row": SEQUENTIAL_REFERENCE, "plain_row": PLAIN_REFERENCE,
                      "forms": forms,
                      "best_form": {}}
        for rate, rk in RATIO_OF.items():
            have = [f for f in forms if rate in per[f]]
            best = max(have, key=lambda f: per[f][rate]) if have else None
            gl["best_form"][rk] = best
            for prefix, tl in rows.items():
                gl[prefix + rk] = (tl[rate] / per[best][rate]
                                   if best is not None and tl is not None and rate in tl
                                   else None)
        for prefix in rows:
            gl[prefix + "met"] = all(gl[prefix + rk] is not None and gl[prefix + rk] >= target
                                     for rk in RATIO_OF.values())
        gl["met_by"] = [row for prefix, row in JUDGED_ROWS.items() if gl[prefix + "met"]]
        peer_syncs = [per[f]["syncs_per_call"] for f in forms if "syncs_per_call" in per[f]]
        if peer_syncs:
            # Where syncs bound the work (the sync latency dominates every call), the
            # ratio tends to the peer's syncs per call (its form with the fewest) over
            # ours: no CPU saved can pass it.  For sequential calls one sync per
            # protected call is the protocol's floor (dispatched is durable before the
            # tool runs); a message's calls dispatched together share their syncs.
            for prefix, tl in rows.items():
                if tl is not None and "syncs_per_call" in tl:
                    gl[prefix + "ratio_sync_bound"] = min(peer_syncs) / tl["syncs_per_call"]
            gl["ratio_sync_bound_at_one_sync_per_call"] = min(peer_syncs) / 1.0
        goals[peer] = gl
    for key, target, ok in (("syncs_per_call", 1.3, "syncs_per_call"),
                            ("bytes_per_call", 16 * 1024, "write_bytes_per_call")):
        got = {row: per[row][ok] for row in JUDGED_ROWS.values()
               if row in per and ok in per[row]}
        if REFERENCE in got:
            goals[key] = {"target": target, "row": REFERENCE, "measured": got[REFERENCE],
                          "sequential_measured": got.get(SEQUENTIAL_REFERENCE),
                          "plain_measured": got.get(PLAIN_REFERENCE),
                          "met": got[REFERENCE] <= target,
                          "met_by": [row for row, v in got.items() if v <= target]}
    return goals


def _per_call(rows: list[Result], key: str) -> float:
    return median([r[key] / r["calls"] for r in rows])


def run(smoke: bool = False) -> Result:
    rounds, warm, turns, raw_n = (1, 1, 2, 5) if smoke else (3, 10, 30, 100)
    systems = [s for s in SYSTEMS if installed(s)]
    missing = [s for s in SYSTEMS if s not in systems]
    strace = shutil.which("strace")
    heading(f"peers: {CALLS_PER_TURN}-call turns, {rounds} interleaved rounds of {turns} timed "
            f"turns after {warm} untimed" + (f"; not installed: {', '.join(missing)}"
                                             if missing else ""))
    fast: dict[str, list[Result]] = {s: [] for s in systems}
    slow: dict[str, list[Result]] = {s: [] for s in systems}
    nosync: dict[str, list[Result]] = {s: [] for s in systems}
    fast_ms: list[float] = []
    slow_ms: list[float] = []
    load = [os.getloadavg()[0]]  # the 1-minute load average, sampled at every round's ends
    with scratch_dir("peers") as d:
        fs = filesystem_of(d)
        for r in range(rounds):
            order = systems[r % len(systems):] + systems[:r % len(systems)]
            fast_ms.append(raw_sync_ms(d, raw_n))
            for s in order:
                fast[s].append(run_child(s, d, warm, turns))
            if strace is not None:
                slow_ms.append(raw_sync_ms(d, raw_n, strace, SLOW_SYNC_DELAY_US))
                for s in order:
                    slow[s].append(run_child(s, d, warm, turns, strace, SLOW))
                for s in order:
                    nosync[s].append(run_child(s, d, warm, turns, strace, NO_SYNC))
            load.append(os.getloadavg()[0])
            print(f"  round {r + 1}/{rounds}: " + ", ".join(
                f"{s} {fast[s][-1]['calls'] / fast[s][-1]['seconds']:.0f}/s" for s in order),
                flush=True)
        crash = [crash_row(s, d, p) for s, p in CRASH_CASES if s in systems]
        latency = latency_table(d, smoke)
    postgres = pg_table(smoke)

    f_ms = median(fast_ms)
    s_ms = median(slow_ms) if slow_ms else None
    per: dict[str, Result] = {}
    for s in systems:
        rate = median([x["calls"] / x["seconds"] for x in fast[s]])
        row: Result = {
            "calls_per_second": rate,
            "cpu_ms_per_call": _per_call(fast[s], "cpu_seconds") * 1000,
            "write_bytes_per_call": _per_call(fast[s], "write_bytes"),
            "wchar_per_call": _per_call(fast[s], "wchar"),
        }
        if all("commits" in x for x in fast[s]):  # toolledger: its store's counters
            row["commits_per_message"] = median([x["commits"] / x["calls"] for x in fast[s]]
                                                ) * CALLS_PER_TURN
            row["ledger_commits_per_message"] = median(
                [x["ledger_commits"] / x["calls"] for x in fast[s]]) * CALLS_PER_TURN
        if slow[s] and nosync[s] and s_ms is not None:
            syncs = median([sum(x["syncs"].values()) / x["calls"] for x in slow[s]])
            # the model: a call costs its work without syncs plus its syncs' latency
            t0 = 1 / median([x["calls"] / x["seconds"] for x in nosync[s]])
            row.update({
                "syncs_per_call": syncs,
                "sync_calls": sorted({k for x in slow[s] for k in x["syncs"]}),
                "nosync_calls_per_second": 1 / t0,
                "nosync_cpu_ms_per_call": _per_call(nosync[s], "cpu_seconds") * 1000,
                "slow_calls_per_second": median([x["calls"] / x["seconds"] for x in slow[s]]),
                "model_at_measured_fast": 1 / (t0 + syncs * f_ms / 1000),
                "model_at_measured_slow": 1 / (t0 + syncs * s_ms / 1000),
            })
            row["model_error_fast"] = row["model_at_measured_fast"] / rate - 1
            row["model_error_slow"] = (row["model_at_measured_slow"]
                                       / row["slow_calls_per_second"] - 1)
            for disk, ms in MODEL_SYNC_MS.items():
                row[f"model_{disk}_disk_calls_per_second"] = 1 / (t0 + syncs * ms / 1000)
        per[s] = row
    for prefix, name in JUDGED_ROWS.items():
        tl = per.get(name)
        for row in per.values():
            for k, rk in RATIO_OF.items():
                if tl is not None and k in row and k in tl:
                    row[prefix + rk] = tl[k] / row[k]

    def f(row: Result, k: str, fmt: str) -> str:
        return "-" if k not in row else format(row[k], fmt)

    print(f"\nload average (1 min) {min(load):.2f} to {max(load):.2f} during the run")
    print(f"scratch on {fs}; raw write+fdatasync {f_ms:.2f} ms"
          + ("" if s_ms is None else f", under the injected delay {s_ms:.2f} ms "
             f"(asked for {SLOW_SYNC_DELAY_US / 1000:g} ms more)"))
    print(f"measured (this disk, and this disk with every sync slowed by strace); tl/it: "
          f"{REFERENCE} / it, seq/it: {SEQUENTIAL_REFERENCE} / it, plain/it: "
          f"{PLAIN_REFERENCE} / it:")
    print(table(
        ("system", "calls/s", "tl/it", "seq/it", "plain/it", "slow calls/s", "tl/it",
         "seq/it", "plain/it", "syncs/call", "commits/msg", "KB/call", "wchar KB/call",
         "CPU ms/call"),
        [(s, f(r, "calls_per_second", ".0f"), f(r, "ratio_measured_fast", ".2f"),
          f(r, "sequential_ratio_measured_fast", ".2f"),
          f(r, "plain_ratio_measured_fast", ".2f"),
          f(r, "slow_calls_per_second", ".0f"), f(r, "ratio_measured_slow", ".2f"),
          f(r, "sequential_ratio_measured_slow", ".2f"),
          f(r, "plain_ratio_measured_slow", ".2f"),
          f(r, "syncs_per_call", ".2f"), f(r, "commits_per_message", ".1f"),
          format(r["write_bytes_per_call"] / 1024, ".1f"),
          format(r["wchar_per_call"] / 1024, ".1f"), format(r["cpu_ms_per_call"], ".2f"))
         for s, r in per.items()], right=range(1, 14)))
    fast_l, slow_l = MODEL_SYNC_MS["fast"], MODEL_SYNC_MS["slow"]
    print("model 1 / (t_nosync + syncs x latency), checked against the measured rates:")
    print(table(
        ("system", "no-sync calls/s", "CPU ms/call", "model err fast", "model err slow",
         f"@{fast_l:g} ms", "tl/it", f"@{slow_l:g} ms", "tl/it"),
        [(s, f(r, "nosync_calls_per_second", ".0f"), f(r, "nosync_cpu_ms_per_call", ".2f"),
          f(r, "model_error_fast", "+.0%"), f(r, "model_error_slow", "+.0%"),
          f(r, "model_fast_disk_calls_per_second", ".0f"), f(r, "ratio_model_fast_disk", ".2f"),
          f(r, "model_slow_disk_calls_per_second", ".0f"), f(r, "ratio_model_slow_disk", ".2f"))
         for s, r in per.items()], right=range(1, 9)))
    print("\ncrash between effect and checkpoint (SIGKILL), effects the external system applied:")
    print(table(("system", "policy", "killed", "effects", "duplicates"),
                [(c["system"], c["policy"], c["killed_after_effect"], c["effects"],
                  c["duplicates"]) for c in crash], right=(3, 4)))
    goals = peer_goals(per)
    for peer, gl in goals.items():
        if peer in PEER_FORMS:
            print(f"goal toolledger / {peer} (best of {', '.join(gl['forms'])}) >= "
                  f"{gl['target']:g}x: " + "; ".join(
                      f"{row} " + ", ".join(f"{gl[p + k]:.2f}" if gl.get(p + k) is not None
                                            else "-" for k in RATIO_OF.values())
                      + (" (met)" if gl[p + "met"] else " (not met)")
                      for p, row in JUDGED_ROWS.items())
                  + " [measured fast, slow; model fast, slow]")
            if "ratio_sync_bound" in gl:
                print("  where syncs bound the work it tends to the peer's fewest syncs per "
                      "call over ours: " + ", ".join(
                          f"{row} {gl[p + 'ratio_sync_bound']:.2f}"
                          for p, row in JUDGED_ROWS.items() if p + "ratio_sync_bound" in gl))
    return {
        "calls_per_turn": CALLS_PER_TURN, "rounds": rounds, "warm_turns": warm,
        "timed_turns": turns, "scratch_fs": fs, "not_installed": missing,
        "load_average_1min": load,
        "syncs_counted_by": ("strace -f --seccomp-bpf, sync calls between the child's marks"
                             if strace else None),
        "bytes_counted_by": "/proc/self/io write_bytes (and wchar) of the child",
        "slow_disk": None if strace is None else {
            "how": f"strace -e inject=fsync,fdatasync:{SLOW}",
            "no_sync": f"strace -e inject=fsync,fdatasync:{NO_SYNC}",
            "fast_sync_ms": f_ms, "slow_sync_ms": s_ms, "model_sync_ms": MODEL_SYNC_MS},
        "systems": per, "crash": crash, "goals": goals, "latency": latency,
        "postgres": postgres,
    }


def main() -> int:
    return cli(run, "toolledger vs LangGraph and DBOS: calls/s, syncs, bytes, CPU, crashes")


if __name__ == "__main__":
    sys.exit(main())
