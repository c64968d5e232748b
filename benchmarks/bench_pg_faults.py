"""Faults on PostgreSQL: killed workers, a server that goes away, a cut connection.

What it does
------------
The crash campaign's runs (``crash_campaign.py``: a two-turn session of the
demo engine in real child processes, the tool's effects counted by a
durable :class:`~toolledger.kit.external.CountingExternalSystem`, every run
checked against that system's own log) on a :class:`PostgresStore` in a
throwaway cluster (tests/pg_cluster.py: loopback, ``fsync`` on), one schema
per run, every policy, under these faults:

- ``sigkill``: the worker SIGKILLed at every crash point of the engine on
  the policy's path (:func:`toolledger.kit.crash.crash_points`);
- ``stop -m fast``: at the k-th SQL statement of the run the server gets a
  fast shutdown (SIGINT to the postmaster, what ``pg_ctl stop -m fast``
  sends) and the worker waits until it is down; then the worker goes on;
- ``kill -9 postmaster``: the same with SIGKILL of the postmaster (its
  backends exit on their own when they see it gone);
- ``pg_terminate_backend``: at the k-th statement another connection
  terminates the worker's backend (so the statement that follows, a
  ``COMMIT`` included, runs on a dead connection).

For the three server faults k is drawn over the statements of a clean run
(every statement, or a sample).  A worker hit by one must fail closed: stop
with a ``StoreError`` naming the server (never another exception, never a
half-written commit); then the server is started again (for the two stops)
and a new process resumes the session and finishes it.  Counted per fault x
policy, against the external system: ``duplicates`` (an effect applied
twice), ``lost`` (a durable result gone or changed, or missing from the
final conversation), ``unsettled`` (a call without a result or
``recovery_required``), the other crash-campaign counters, and the workers
that failed closed (and whether their error named the server).

Also what a worker sees when the server is unreachable: the error and how
long it took, for a port nobody listens on, and for a host that accepts the
TCP connection and never answers (bounded by ``connect_timeout``).

``python benchmarks/bench_pg_faults.py [--smoke]``
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from benchmarks import crash_campaign as cc
from benchmarks.common import cli, heading, table
from toolledger._core.protocol import RecoveryPolicy
from toolledger._core.stores import Store

Result = dict[str, Any]
POLICIES = (RecoveryPolicy.IDEMPOTENT, RecoveryPolicy.RECONCILE, RecoveryPolicy.MANUAL,
            RecoveryPolicy.READONLY)  # fmt: skip
SERVER_FAULTS = {
    "stop_fast": "stop -m fast",
    "kill_postmaster": "kill -9 postmaster",
    "terminate_backend": "pg_terminate_backend",
}
FAULT_NAMES = {"sigkill": "SIGKILL at crash points", **SERVER_FAULTS}
COUNTS = ("duplicates", "lost", "fabricated", "contradicted", "unsettled", "store_unusable",
          "child_errors")  # fmt: skip


# ==========================================================================
# In the worker: the fault, at the k-th statement (crash_campaign --pg-fault)
# ==========================================================================


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def _wait_gone(pid: int, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not _gone(pid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"process {pid} did not exit within {seconds:.0f} s")
        time.sleep(0.02)


def inject(kind: str, store: Store, postmaster: int, label: str) -> None:
    """Called by the worker just before it sends a statement (``label``)."""
    import psycopg

    conn = store.connection  # type: ignore[attr-defined]
    backend = int(conn.info.backend_pid)
    sys.stderr.write(f"FAULT {kind} {label}\n")
    sys.stderr.flush()
    if kind == "terminate_backend":
        with psycopg.connect(conn.info.dsn, autocommit=True) as admin:
            # the second argument: wait until the backend is gone (PostgreSQL 14+)
            admin.execute("SELECT pg_terminate_backend(%s, 30000)", (backend,))
    elif kind in ("stop_fast", "kill_postmaster"):
        os.kill(postmaster, signal.SIGINT if kind == "stop_fast" else signal.SIGKILL)
        _wait_gone(postmaster)
    else:
        raise ValueError(f"unknown PostgreSQL fault {kind!r}: one of {', '.join(SERVER_FAULTS)}")
    _wait_gone(backend)  # the worker's next statement meets a server that is gone


# ==========================================================================
# The parent
# ==========================================================================


def statements_of(policy: RecoveryPolicy, base: Path, conninfo: str) -> int:
    """SQL statements a clean run of ``policy`` sends after opening the store."""
    d = Path(tempfile.mkdtemp(prefix="clean-", dir=base))
    try:
        spec = cc.RunSpec("clean", policy, "clean", (), postgres=conninfo)
        out = cc.run_child(cc._child_cmd(spec, d, cc.Phase(), final=True, count=True))
        if out.returncode != 0:
            raise RuntimeError(f"a clean run of {policy.value} failed: {out.stderr[-800:]}")
        return int(json.loads(out.stdout.strip().splitlines()[-1])["statements"])
    finally:
        shutil.rmtree(d, ignore_errors=True)


def plan(conninfo: str, statements: dict[RecoveryPolicy, int], per_fault: int,
         rng: random.Random, points: str = "all") -> list[cc.RunSpec]:  # fmt: skip
    """The runs: every crash point per policy (``points="seed"``: the seed matrix's
    only), and ``per_fault`` statements per server fault and policy (-1: every
    statement of a clean run)."""
    policies = tuple(statements)
    specs = [
        replace(spec, postgres=conninfo, kind="sigkill")
        for spec in cc.plan(policies, dict.fromkeys(policies, (1, 0.0)), points=points, io=0,
                            timer=0, multi=0, seed=0, legacy_control=False)
    ]  # fmt: skip
    for fault in SERVER_FAULTS:
        for pol in policies:
            n = statements[pol]
            ks = range(1, n + 1) if per_fault < 0 else sorted(
                rng.sample(range(1, n + 1), min(per_fault, n)))
            for k in ks:
                specs.append(cc.RunSpec(fault, pol, f"statement {k}/{n}",
                                        (cc.Phase(pg_fault=fault, pg_fault_at=k),),
                                        postgres=conninfo))  # fmt: skip
    return specs


def run_faults(pg: Any, per_fault: int, *, points: str = "all",
               policies: Sequence[RecoveryPolicy] = POLICIES, parallel: int = 2,
               seed: int = 13, verbose: bool = True) -> Result:  # fmt: skip
    """Every run of the plan against the cluster ``pg`` (a ``PgCluster``)."""
    rng = random.Random(seed)
    started = time.perf_counter()
    lock = threading.Lock()  # the server faults stop the server: one such run at a time

    def restart_if_down(phase: cc.Phase, out: cc.ChildOutcome) -> None:
        if phase.pg_fault in ("stop_fast", "kill_postmaster") and not pg.running():
            pg.start_again()

    with tempfile.TemporaryDirectory(prefix="toolledger-pgfaults-",
                                     dir=os.environ.get("TOOLLEDGER_BENCH_DIR") or None) as tmp:
        base = Path(tmp)
        statements = {p: statements_of(p, base, pg.conninfo) for p in policies}
        specs = plan(pg.conninfo, statements, per_fault, rng, points)
        if verbose:
            print("  statements per clean run: "
                  + ", ".join(f"{p.value} {n}" for p, n in statements.items())
                  + f"; {len(specs)} runs", flush=True)  # fmt: skip
        gate = threading.Condition()
        active = [0]

        def one(spec: cc.RunSpec) -> cc.RunReport:
            stops = spec.kind in ("stop_fast", "kill_postmaster")
            if stops:  # alone on the server: wait for the others to finish
                lock.acquire()
                with gate:
                    gate.wait_for(lambda: active[0] == 0)
            else:
                with lock, gate:
                    active[0] += 1
            try:
                return cc.execute(spec, base, postmaster=pg.postmaster_pid,
                                  after_phase=restart_if_down)
            finally:
                if stops:
                    lock.release()
                else:
                    with gate:
                        active[0] -= 1
                        gate.notify_all()

        with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
            reports = list(pool.map(one, specs))
    rows: dict[tuple[str, str], Result] = {}
    for r in reports:
        row = rows.setdefault((r.kind, r.policy), {
            "fault": r.kind, "policy": r.policy, "runs": 0, "kills": 0, "fail_closed": 0,
            "fail_closed_naming_server": 0, **dict.fromkeys(COUNTS, 0), "final": {}})
        row["runs"] += 1
        row["kills"] += r.kills
        row["fail_closed"] += r.fail_closed
        # the error a worker stops with names the server (host:port) and is a StoreError
        row["fail_closed_naming_server"] += sum(
            f"127.0.0.1:{pg.port}" in e and ("StoreUnavailable" in e or "StoreError" in e
                                             or "PostgreSQL" in e)
            for e in r.fail_closed_errors)  # fmt: skip
        for k in COUNTS:
            row[k] += r.counts[k]
        status = r.final_status or "(none)"
        row["final"][status] = row["final"].get(status, 0) + 1
    totals = {k: sum(r.counts[k] for r in reports) for k in COUNTS}
    server = [r for r in reports if r.kind in SERVER_FAULTS]
    examples: dict[str, str] = {}
    for r in server:
        for e in r.fail_closed_errors:
            examples.setdefault(r.kind, e.split("fail closed: ", 1)[-1][:400])
    return {
        "runs": len(reports),
        "statements_per_clean_run": {p.value: n for p, n in statements.items()},
        "sigkills": sum(r.kills for r in reports),
        "fail_closed": sum(r.fail_closed for r in reports),
        "server_fault_runs": len(server),
        "server_fault_runs_failed_closed": sum(r.fail_closed > 0 for r in server),
        "rows": list(rows.values()),
        "totals": totals,
        "fail_closed_examples": examples,
        "problems": [f"{r.kind} {r.policy} {r.label}: {p}" for r in reports
                     for p in r.problems][:20],
        "seconds": round(time.perf_counter() - started, 1),
        "all_zero": not any(totals.values()),
    }


# ==========================================================================
# An unreachable server
# ==========================================================================


def _unreachable(conninfo: str, connect_timeout: float) -> Result:
    from toolledger._core.postgres_store import PostgresStore, StoreUnavailable

    t0 = time.monotonic()
    try:
        PostgresStore(conninfo, connect_timeout=connect_timeout).close()
    except StoreUnavailable as exc:
        return {"error": type(exc).__name__, "message": str(exc),
                "seconds": round(time.monotonic() - t0, 2), "connect_timeout": connect_timeout}
    except Exception as exc:  # reported as what it is: not the documented error
        return {"error": type(exc).__name__, "message": str(exc),
                "seconds": round(time.monotonic() - t0, 2), "connect_timeout": connect_timeout}
    return {"error": None, "message": "connected", "seconds": round(time.monotonic() - t0, 2),
            "connect_timeout": connect_timeout}


@contextlib.contextmanager
def silent_listener() -> Any:
    """A loopback port that accepts TCP connections and never says a word."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def unreachable(connect_timeout: float = 2.0) -> Result:
    """What a worker sees: a refused port, and a server that never answers."""
    with silent_listener() as port:
        silent = _unreachable(f"host=127.0.0.1 port={port} dbname=ledgers user=worker",
                              connect_timeout)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # bound, not listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        refused = _unreachable(f"host=127.0.0.1 port={port} dbname=ledgers user=worker",
                               connect_timeout)
    return {"refused": refused, "never_answers": silent}


# ==========================================================================


def run(smoke: bool = False, cluster: Any = None,
        policies: Sequence[RecoveryPolicy] = POLICIES) -> Result:
    """The figures; ``cluster``: a running ``PgCluster`` (default: a fresh one).
    ``smoke``: the seed matrix's crash points and one statement per server fault."""
    per_fault, points = (1, "seed") if smoke else (4, "all")
    heading("faults on PostgreSQL: killed workers, the server stopped or killed, a cut "
            f"connection; policies {', '.join(p.value for p in policies)}")
    if cluster is None:
        from pg_cluster import PgCluster

        with PgCluster() as pg:
            faults = run_faults(pg, per_fault, points=points, policies=policies)
    else:
        faults = run_faults(cluster, per_fault, points=points, policies=policies)
    print(table(
        ("fault", "policy", "runs", "SIGKILLs", "fail-closed errors", "duplicates", "lost",
         "unsettled", "other"),
        [(FAULT_NAMES[r["fault"]], r["policy"], r["runs"], r["kills"], r["fail_closed"],
          r["duplicates"], r["lost"], r["unsettled"],
          sum(r[k] for k in ("fabricated", "contradicted", "store_unusable", "child_errors")))
         for r in faults["rows"]],
        right=(2, 3, 4, 5, 6, 7, 8)))  # fmt: skip
    for p in faults["problems"]:
        print("  PROBLEM:", p)
    for kind, e in faults["fail_closed_examples"].items():
        print(f"  a worker at {FAULT_NAMES[kind]}: {e[:240]}")
    u = unreachable()
    for what, x in u.items():
        print(f"  unreachable ({what}): {x['error']} after {x['seconds']:.2f} s "
              f"(connect_timeout {x['connect_timeout']:g} s): {x['message'][:200]}")
    bounded = all(x["error"] == "StoreUnavailable" and x["seconds"] <= x["connect_timeout"] + 2
                  for x in u.values())
    all_closed = faults["server_fault_runs_failed_closed"] == faults["server_fault_runs"]
    ok = faults["all_zero"] and all_closed and bounded
    print(f"all counts zero: {'yes' if faults['all_zero'] else 'NO'}; server faults failed "
          f"closed: {faults['server_fault_runs_failed_closed']}/{faults['server_fault_runs']}; "
          f"unreachable bounded and typed: {'yes' if bounded else 'NO'}; {faults['seconds']:.0f} s")
    return {**faults, "policies": [p.value for p in policies], "unreachable": u,
            "unreachable_bounded": bounded, "ok": ok}


def main(argv: Sequence[str] | None = None) -> int:
    return cli(run, "faults on PostgreSQL", argv)


if __name__ == "__main__":
    sys.exit(main())
