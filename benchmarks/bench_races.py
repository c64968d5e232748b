"""Many workers resuming the same sessions at once, on SQLite and on PostgreSQL.

What it measures
----------------
N >= 4 worker processes share one store.  For every race, the parent
prepares a session whose one call was cut short by a crash (every policy in
turn: an ``idempotent`` and a ``reconcile`` call dispatched as attempt 1
that never reached the external system, a ``manual`` one dispatched, a
``readonly`` one persisted), then all N workers load that session (a
barrier: none recovers before all have loaded it, so all decide on the same
durable state) and all resume it at once: ``Recover``, then whatever the
decision asks (dispatch attempt 2 and invoke the adapter; reconcile, find it
not applied, retry; execute the readonly call; or stop at
``recovery_required``).  The adapter's "external system" is an append-only
file: one line per invocation.

Checked for every race, and counted:

- exactly one worker wins; every other one gets ``StaleState`` having run
  no INSERT/UPDATE/DELETE at all (each worker's store traces its
  statements: SQLite's trace callback, PostgresStore's ``trace``);
- at most one ``dispatch`` audit row per attempt, one decision per attempt;
- 0 duplicate effects: the external system saw each execution at most once
  (exactly once for the policies that execute, never for ``manual``);
- the audit rows are exactly the winner's (consistent with its steps).

The PostgreSQL server is a throwaway cluster started for the run
(tests/pg_cluster.py): loopback, fsync on.  Times are printed for scale
only; nothing asserts a time.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.common import cli, heading, postgres, rounded, scratch_dir, table
from toolledger._core import protocol as p
from toolledger._core.ledger import Ledger
from toolledger._core.stores import StaleState, Store

Result = dict[str, Any]
A = p.Action
E = p.Event
POS = (0, 0)
WORKERS = 4
POLICIES = (
    p.RecoveryPolicy.IDEMPOTENT,
    p.RecoveryPolicy.RECONCILE,
    p.RecoveryPolicy.MANUAL,
    p.RecoveryPolicy.READONLY,
)
DECISIONS = {d.value for d in p.Decision}
# The audit each race must leave: the prepared dispatch, then the winner's rows only.
AUDIT: dict[p.RecoveryPolicy, list[tuple[str, int]]] = {
    p.RecoveryPolicy.IDEMPOTENT: [("dispatch", 1), ("retry_same_id", 1), ("dispatch", 2)],
    p.RecoveryPolicy.RECONCILE: [
        ("dispatch", 1), ("reconcile", 1), ("reconcile_not_applied", 1), ("dispatch", 2),
    ],
    p.RecoveryPolicy.MANUAL: [("dispatch", 1), ("recovery_required", 1)],
    p.RecoveryPolicy.READONLY: [],  # a readonly call's re-execution writes no audit row
}  # fmt: skip


def open_store(kind: str, where: str) -> Store:
    if kind == "sqlite":
        from toolledger._core.sqlite_store import SqliteStore

        return SqliteStore(where, busy_timeout=30)
    from toolledger._core.postgres_store import PostgresStore

    conninfo, schema = where.rsplit("|", 1)
    return PostgresStore(conninfo, schema=schema)


def tool(policy: p.RecoveryPolicy) -> p.ToolProfile:
    return p.ToolProfile(f"tool_{policy.value}", policy, policy is p.RecoveryPolicy.MANUAL)


def prepare(store: Store, sid: str, policy: p.RecoveryPolicy) -> None:
    """A session whose call was cut short by a crash, before any effect."""
    ledger = Ledger.create(store, sid)
    t = tool(policy)
    ledger.step(E(A.ProviderEmitCall, POS, "call_0", t, p.args_digest(t.name, {})), arguments={})
    ledger.step(E(A.EnginePersistCall, POS))
    if policy is p.RecoveryPolicy.READONLY:
        return
    if t.requires_approval:
        ledger.step(E(A.EngineParkApproval, POS))
        ledger.step(E(A.HumanApprove, POS))
    ledger.step(E(A.EnginePersistDispatched, POS))


def effect(effects: Path, sid: str, eid: str, attempt: int, worker: int) -> None:
    line = json.dumps({"sid": sid, "eid": eid, "attempt": attempt, "worker": worker}) + "\n"
    fd = os.open(effects, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def applied(effects: Path, eid: str) -> bool:
    if not effects.exists():
        return False
    return any(json.loads(line)["eid"] == eid for line in effects.read_text().splitlines())


def resume(ledger: Ledger, sid: str, effects: Path, worker: int) -> None:
    """What a resuming engine does with the call (the adapter writes to ``effects``)."""
    ledger.step(E(A.Recover, POS))
    call = ledger.state.call(POS)
    assert call is not None
    if call.stage is p.Stage.RECONCILING:
        if applied(effects, call.execution_id):
            ledger.step(E(A.EngineReconcileApplied, POS), result_content="applied")
            return
        ledger.step(E(A.EngineReconcileNotApplied, POS))
        call = ledger.state.call(POS)
        assert call is not None
    if call.stage is p.Stage.RETRY:
        ledger.step(E(A.EnginePersistDispatched, POS))
        attempt = ledger.state.ledger[call.execution_id].attempt
        ledger.step(E(A.EngineInvokeAdapter, POS))
        effect(effects, sid, call.execution_id, attempt, worker)
        ledger.step(E(A.ExternalApply, POS, attempt=attempt))
        ledger.step_many(
            [E(A.EngineRecordSucceeded, POS), E(A.EngineAppendResult, POS)],
            result_content={POS: "done"},
        )
    elif call.stage is p.Stage.LIVE:  # readonly: execute again
        ledger.step(E(A.EngineInvokeReadonly, POS))
        effect(effects, sid, call.execution_id, 0, worker)
        ledger.step(E(A.EngineAppendResult, POS), result_content="read")


def trace_writes(store: Store) -> list[str]:
    out: list[str] = []
    if hasattr(store, "trace"):
        store.trace = lambda sql, params: out.append(sql)
    else:
        store.connection.set_trace_callback(out.append)  # type: ignore[attr-defined]
    return out


def without_guards() -> None:
    """The broken variant the checks must catch: no compare-and-set of what was read."""
    from dataclasses import replace

    from toolledger._core.stores import CommitPlan

    original = CommitPlan.check_session

    def records_only(self: CommitPlan, *args: Any, **kwargs: Any) -> None:
        original(replace(self, guards=()), *args, **kwargs)

    CommitPlan.check_session = records_only  # type: ignore[method-assign]


def worker_main(
    kind: str, where: str, sids: list[str], effects: str, index: int,
    barrier: Any, results: Any, broken: bool = False,
) -> None:  # fmt: skip
    if broken:
        without_guards()
    store = open_store(kind, where)
    out = []
    try:
        for sid in sids:
            barrier.wait()
            ledger = Ledger(store, sid)  # every worker loads before any recovers
            barrier.wait()
            statements = trace_writes(store)
            commits = store.commits
            try:
                resume(ledger, sid, Path(effects), index)
                outcome = "won"
            except StaleState:
                outcome = "refused"
            writes = sum(s.split()[0].upper() in ("INSERT", "UPDATE", "DELETE") for s in statements)
            out.append({"sid": sid, "worker": index, "outcome": outcome, "writes": writes,
                        "commits": store.commits - commits})  # fmt: skip
    finally:
        results.put(out)
        store.close()


def server_writes(store: Store) -> int | None:
    """Rows inserted, updated or deleted in the store's schema, as the server counts
    them (PostgreSQL; None for SQLite).  Statistics of ended backends are flushed."""
    if not hasattr(store, "schema"):
        return None
    conn = store.connection  # type: ignore[attr-defined]
    # this connection's own counts are flushed when it next goes idle; the
    # workers' when their backends exit (shortly after they disconnect): read
    # until two reads half a second apart agree
    conn.execute("SELECT pg_stat_force_next_flush()")
    last: int | None = None
    for _ in range(20):
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) "
            "FROM pg_stat_user_tables WHERE schemaname = %s",
            (store.schema,),
        ).fetchone()
        if int(row[0]) == last:
            break
        last = int(row[0])
        time.sleep(0.5)
    return last


def race_store(
    kind: str, where: str, races: int, workers: int, scratch: Path, *, broken: bool = False
) -> Result:
    """``races`` races of ``workers`` processes on one store; ``broken``: workers without
    the guards (to show the checks catch it)."""
    setup = open_store(kind, where)
    sids = [f"race-{r}" for r in range(races)]
    policy_of = {sid: POLICIES[r % len(POLICIES)] for r, sid in enumerate(sids)}
    for sid in sids:
        prepare(setup, sid, policy_of[sid])
    effects = scratch / f"effects-{kind}.jsonl"
    server_before = server_writes(setup)
    ctx = mp.get_context("spawn")  # a fresh interpreter: no inherited connections
    barrier = ctx.Barrier(workers)
    results: Any = ctx.Queue()
    procs = [
        ctx.Process(target=worker_main,
                    args=(kind, where, sids, str(effects), i, barrier, results, broken))
        for i in range(workers)
    ]  # fmt: skip
    t0 = time.perf_counter()
    for proc in procs:
        proc.start()
    rows: list[dict[str, Any]] = []
    for _ in procs:
        rows += results.get(timeout=600)
    for proc in procs:
        proc.join(60)
    seconds = time.perf_counter() - t0
    server_after = server_writes(setup)
    invocations = Counter(
        json.loads(line)["sid"] for line in (effects.read_text().splitlines()
                                             if effects.exists() else [])
    )  # fmt: skip
    problems: list[str] = []
    by_policy: dict[str, Counter[str]] = {pol.value: Counter() for pol in POLICIES}
    for sid in sids:
        policy = policy_of[sid]
        mine = [r for r in rows if r["sid"] == sid]
        won = [r for r in mine if r["outcome"] == "won"]
        lost = [r for r in mine if r["outcome"] == "refused"]
        audit = setup.audit(sid)
        dispatches = Counter(a.attempt for a in audit if a.kind == "dispatch")
        decisions = Counter(a.attempt for a in audit if a.kind in DECISIONS)
        # A read may run again (that is what readonly declares); a side effect may not.
        side_effecting = policy is not p.RecoveryPolicy.READONLY
        expected_effects = 0 if policy is p.RecoveryPolicy.MANUAL else 1
        checks = {
            "one winner": len(won) == 1 and len(mine) == workers,
            "losers wrote nothing": all(r["writes"] == 0 and r["commits"] == 0 for r in lost),
            "at most one dispatch per attempt": all(n == 1 for n in dispatches.values()),
            "one decision per attempt": all(n == 1 for n in decisions.values()),
            "effects": invocations[sid] == expected_effects
            if side_effecting
            else 1 <= invocations[sid] <= workers,
            "audit is the winner's": [(a.kind, a.attempt) for a in audit] == AUDIT[policy],
        }
        for name, ok in checks.items():
            if not ok:
                problems.append(f"{sid} ({policy.value}): {name}: {mine} {audit}")
        stats = by_policy[policy.value]
        stats["races"] += 1
        stats["refused"] += len(lost)
        stats["losers_that_wrote"] += sum(r["writes"] > 0 for r in lost)
        if side_effecting:
            stats["duplicate_effects"] += max(0, invocations[sid] - expected_effects)
        else:
            stats["reads_repeated"] += invocations[sid] - 1
        stats["max_dispatches_per_attempt"] = max(
            stats["max_dispatches_per_attempt"], max(dispatches.values(), default=0)
        )
    setup.close()
    if server_before is not None and server_after is not None:
        winners = sum(r["writes"] for r in rows if r["outcome"] == "won")
        if server_after - server_before != winners:
            problems.append(f"the server counts {server_after - server_before} rows written, "
                            f"the winners' write statements are {winners}")
    return {
        "store": kind,
        "workers": workers,
        "races": races,
        "seconds": rounded(seconds, 2),
        "races_per_second": rounded(races / seconds, 1),
        "refused_losers": sum(r["outcome"] == "refused" for r in rows),
        "losers_that_wrote": sum(r["outcome"] == "refused" and r["writes"] > 0 for r in rows),
        "duplicate_effects": sum(s["duplicate_effects"] for s in by_policy.values()),
        # PostgreSQL, counted by the server (pg_stat_user_tables, rolled-back rows
        # included): the rows the workers inserted, updated or deleted, against the
        # rows of the winners' traced write statements (one row each)
        "server_rows_written": None if server_before is None or server_after is None
        else server_after - server_before,
        "winners_write_statements": sum(r["writes"] for r in rows if r["outcome"] == "won"),
        "by_policy": {k: dict(v) for k, v in by_policy.items()},
        "problems": problems[:10],
        "ok": not problems,
    }


def run(smoke: bool = False, conninfo: str | None = None) -> Result:
    races = 8 if smoke else 200
    heading(f"races: {WORKERS} worker processes resume each session at once, {races} races "
            "per store, policies " + ", ".join(pol.value for pol in POLICIES))  # fmt: skip
    out: dict[str, Result] = {}
    with scratch_dir("races") as d:
        out["sqlite"] = race_store("sqlite", str(d / "races.db"), races, WORKERS, d)
        schema = f"races_{uuid.uuid4().hex[:12]}"
        with postgres(conninfo) as server:
            out["postgres"] = race_store("postgres", f"{server}|{schema}", races, WORKERS, d)
    print(table(
        ("store", "races", "losers refused", "losers that wrote", "duplicate effects",
         "max dispatch/attempt", "races/s", "ok"),
        [(k, r["races"], r["refused_losers"], r["losers_that_wrote"], r["duplicate_effects"],
          max(s["max_dispatches_per_attempt"] for s in r["by_policy"].values()),
          r["races_per_second"], r["ok"]) for k, r in out.items()],
        right=(1, 2, 3, 4, 5, 6),
    ))  # fmt: skip
    for r in out.values():
        for problem in r["problems"]:
            print("  PROBLEM:", problem)
    return {"workers": WORKERS, "races_per_store": races, "stores": out,
            "ok": all(r["ok"] for r in out.values())}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    return cli(run, "many workers resuming the same sessions at once", argv)


if __name__ == "__main__":
    sys.exit(main())
