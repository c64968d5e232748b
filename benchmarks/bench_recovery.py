"""Recovery cost vs history size: resuming one pending call in a session with a long past.

What it measures
----------------
A session of a :class:`toolledger._core.sqlite_store.SqliteStore` holds H past
calls, all completed (manual tool, approved, ``dispatched`` then
``succeeded``, tool result, one ``dispatch`` audit row each), and a last
turn of :data:`PENDING` calls that crashed after ``EnginePersistDispatched``:
their records are ``dispatched(1)`` and they have no result.  A restarted
engine then does what it must to recover one of them:

- ``SqliteStore(path)``: open the file (header, size and schema checks);
- ``Ledger(store, session)``: ``SqliteStore.load_working_set`` of the
  session (the open call and the last turn, by index, every row read
  checked against its checksum);
- ``ledger.step(Event(Recover, pos))``: the recovery decision for the
  pending call (``recovery_required`` for a manual tool) and its commit.

Each is timed separately, for H = 1k, 10k and 100k: the three stores are
built first, then recovered in interleaved rounds (1k, 10k, 100k, 1k, ...),
each round recovering the next pending call, in a new store object and a new
Ledger; the figure is the median over the rounds.  Every repetition thus
meets the same working set (the :data:`PENDING` calls of the last turn, the
ones recovered before it halted in ``recovery_required``) over the same
history, and nothing is copied between rounds: copying a 160 MB file right
before a measurement evicts the CPU caches and makes everything after it
slower for a while, whatever it reads.  The files are on disk (SQLite
checkpoints and syncs them when the building store closes) and in the page
cache: warm-cache times.

How the file is built: one complete call is driven through a real
:class:`~toolledger._core.ledger.Ledger` (on a ``MemoryStore``) to get the exact
durable shape of a completed call (its call state, ledger record, approval,
audit key and audit row).  That shape is replicated for H positions
(turn i, slot 0, the reused provider id ``call_0``, execution ids derived
from the position) and committed through the public ``Store.commit`` in
batches of 10k calls, so ``plan_commit`` validates every batch and every
row gets its checksum exactly as in normal operation.  The pending calls are
then driven through a ``Ledger`` on the ``SqliteStore`` itself.

Goal: t(100k) / t(1k) <= 1.5 (recovery must not scan the history).
``python benchmarks/bench_recovery.py [--smoke]``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import Result, cli, heading, median, rounded, scratch_dir, table
from toolledger._core.ledger import Ledger
from toolledger._core.protocol import (
    Action,
    CallState,
    Event,
    ExecutionRecord,
    RecoveryPolicy,
    SessionState,
    ToolProfile,
    args_digest,
    derive_execution_id,
)
from toolledger._core.sqlite_store import SqliteStore
from toolledger._core.stores import AuditRow, MemoryStore

GOAL_RATIO = 1.5
SESSION = "history"
TOOL = ToolProfile("send_email", RecoveryPolicy.MANUAL, True)
ARGS: dict[str, Any] = {"to": "ada@example.com", "subject": "weekly", "body": "Numbers."}
BATCH = 10_000
PENDING = 9
"""Calls of the last turn left in ``dispatched``: one is recovered per round."""


def _complete(ledger: Ledger, turn: int) -> None:
    """One approved manual call at (turn, 0), executed and recorded."""
    pos = (turn, 0)
    ledger.step(Event(Action.ProviderEmitCall, pos, "call_0", TOOL, args_digest(TOOL.name, ARGS)),
                arguments=ARGS)
    ledger.step(Event(Action.EnginePersistCall, pos))
    ledger.step(Event(Action.EngineParkApproval, pos))
    ledger.step(Event(Action.HumanApprove, pos))
    ledger.step(Event(Action.EnginePersistDispatched, pos))
    ledger.step(Event(Action.EngineInvokeAdapter, pos))
    ledger.step(Event(Action.ExternalApply, pos, attempt=1))
    ledger.step_many(
        [Event(Action.EngineRecordSucceeded, pos), Event(Action.EngineAppendResult, pos)],
        result_content={pos: '{"status": "sent"}'},
    )


def _template() -> tuple[CallState, ExecutionRecord, Any, tuple[str, int], AuditRow]:
    """The durable shape of one completed call, from a real Ledger run."""
    mem = MemoryStore()
    ledger = Ledger.create(mem, SESSION)
    _complete(ledger, 1)
    st = mem.load(SESSION)
    [call] = st.calls
    [(kind, attempt)] = [(k, a) for _, k, a in st.audit]
    [row] = mem.audit(SESSION)
    return call, st.ledger[call.execution_id], st.approvals[call.execution_id], (kind, attempt), row


def _shape(turn: int, tpl: tuple[CallState, ExecutionRecord, Any, tuple[str, int], AuditRow]
           ) -> tuple[CallState, ExecutionRecord, AuditRow]:
    call, rec, _, _, row = tpl
    pos = (turn, 0)
    eid = derive_execution_id(SESSION, turn, 0, call.tool_call_id)
    assert call.result is not None and rec.result is not None
    return (
        replace(call, position=pos, execution_id=eid,
                result=replace(call.result, execution_id=eid)),
        replace(rec, execution_id=eid, position=pos,
                result=replace(rec.result, execution_id=eid)),
        AuditRow(session_id=SESSION, execution_id=eid, tool_call_id=row.tool_call_id,
                 position=pos, kind=row.kind, attempt=row.attempt,
                 authorization=row.authorization, recovery_decision=row.recovery_decision,
                 inputs=row.inputs, note=row.note),
    )


def build(path: Path, history: int) -> list[tuple[int, int]]:
    """A store at ``path``: ``history`` completed calls, then a turn of PENDING dispatched ones.

    Returns the positions of the pending calls.
    """
    tpl = _template()
    _, _, approval, (kind, attempt), _ = tpl
    with SqliteStore(path) as store:
        store.create_session(SESSION, marker=0, max_attempts=3)
        state = store.load(SESSION)
        for start in range(1, history + 1, BATCH):
            calls, records, rows = [], {}, []
            for turn in range(start, min(start + BATCH, history + 1)):
                c, r, row = _shape(turn, tpl)
                calls.append(c)
                records[c.execution_id] = r
                rows.append(row)
            after = SessionState(
                session_id=SESSION,
                marker=state.marker,
                max_attempts=state.max_attempts,
                calls=state.calls + tuple(calls),
                approvals={**state.approvals, **{c.execution_id: approval for c in calls}},
                ledger={**state.ledger, **records},
                audit=state.audit | {(c.execution_id, kind, attempt) for c in calls},
            )
            store.commit(SESSION, state, after, rows,
                         arguments={c.position: ARGS for c in calls})
            state = after
        # the pending calls: approved and dispatched, then the process "dies"
        ledger = Ledger(store, SESSION)
        positions = [(history + 1, slot) for slot in range(PENDING)]
        for pos in positions:
            ledger.step(Event(Action.ProviderEmitCall, pos, f"call_{pos[1]}", TOOL,
                              args_digest(TOOL.name, ARGS)), arguments=ARGS)
        ledger.step_many([Event(Action.EnginePersistCall, pos) for pos in positions])
        for pos in positions:
            ledger.step(Event(Action.EngineParkApproval, pos))
            ledger.step(Event(Action.HumanApprove, pos))
            ledger.step(Event(Action.EnginePersistDispatched, pos))
    return positions


def recover_once(path: Path, pos: tuple[int, int]) -> dict[str, float]:
    """Open, load, Recover the pending call: seconds of each."""
    t0 = time.perf_counter()
    store = SqliteStore(path)
    t1 = time.perf_counter()
    try:
        ledger = Ledger(store, SESSION)
        t2 = time.perf_counter()
        after = ledger.step(Event(Action.Recover, pos))
        t3 = time.perf_counter()
    finally:
        store.close()
    assert pos in [c.position for c in after.halted()], "the pending call must halt"
    return {"open": t1 - t0, "load": t2 - t1, "recover": t3 - t2, "total": t3 - t0}


def run(smoke: bool = False) -> Result:
    sizes = [50, 500] if smoke else [1_000, 10_000, 100_000]
    rounds = 1 if smoke else PENDING
    heading(f"recovery of one pending call vs history size: {', '.join(map(str, sizes))} calls")
    results: dict[int, dict[str, Any]] = {}
    with scratch_dir("recovery") as d:
        stores: dict[int, tuple[Path, list[tuple[int, int]], float]] = {}
        for h in sizes:
            path = d / f"history-{h}.sqlite3"
            t0 = time.perf_counter()
            positions = build(path, h)
            stores[h] = (path, positions, time.perf_counter() - t0)
            print(f"  built {h:,} past calls: {path.stat().st_size / 1e6:.1f} MB in "
                  f"{stores[h][2]:.1f} s", flush=True)
        samples: dict[int, list[dict[str, float]]] = {h: [] for h in sizes}
        for r in range(rounds):
            for h in sizes:
                path, positions, _ = stores[h]
                samples[h].append(recover_once(path, positions[r]))
            print(f"  round {r + 1}: " + ", ".join(
                f"{h:,}: {samples[h][-1]['total'] * 1000:.2f} ms" for h in sizes), flush=True)
        for h in sizes:
            path, _, built = stores[h]
            med = {k: median([s[k] for s in samples[h]]) for k in samples[h][0]}
            results[h] = {"file_megabytes": rounded(path.stat().st_size / 1e6, 1),
                          "build_seconds": rounded(built, 1), "repetitions": rounds,
                          **{f"{k}_seconds": rounded(v, 6) for k, v in med.items()}}

    print(table(
        ("past calls", "file MB", "open ms", "load ms", "Recover ms", "total ms"),
        [(f"{h:,}", r["file_megabytes"], f"{r['open_seconds'] * 1000:.2f}",
          f"{r['load_seconds'] * 1000:.2f}", f"{r['recover_seconds'] * 1000:.2f}",
          f"{r['total_seconds'] * 1000:.2f}") for h, r in results.items()],
        right=(0, 1, 2, 3, 4, 5),
    ))
    small, large = results[sizes[0]], results[sizes[-1]]
    ratio = large["total_seconds"] / small["total_seconds"]
    parts = {k: large[f"{k}_seconds"] / small[f"{k}_seconds"] for k in ("open", "load", "recover")}
    print(f"t({sizes[-1]:,}) / t({sizes[0]:,}) = {ratio:.1f} (open {parts['open']:.1f}, "
          f"load {parts['load']:.1f}, Recover {parts['recover']:.1f}); goal <= {GOAL_RATIO}: "
          f"{'met' if ratio <= GOAL_RATIO else 'NOT met'}")
    return {
        "history_sizes": sizes,
        "by_history": {str(h): r for h, r in results.items()},
        "ratio_largest_to_smallest": rounded(ratio, 2),
        "ratio_parts": {k: rounded(v, 2) for k, v in parts.items()},
        "goal_ratio": GOAL_RATIO,
        "goal_met": ratio <= GOAL_RATIO,
    }


def main(argv: list[str] | None = None) -> int:
    return cli(run, "recovery time vs session history size", argv)


if __name__ == "__main__":
    sys.exit(main())
