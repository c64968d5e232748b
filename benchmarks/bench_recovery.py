"""Recovery cost vs history size: resuming one pending call in a session with a long past.

What it measures
----------------
A session of a :class:`toolledger.sqlite_store.SqliteStore` holds H past
calls, all completed (manual tool, approved, ``dispatched`` then
``succeeded``, tool result, one ``dispatch`` audit row each), and one more
call that crashed after ``EnginePersistDispatched``: its record is
``dispatched(1)`` and it has no result.  A restarted engine then does what
it must to recover that one call:

- ``SqliteStore(path)``: open the file (header, size and schema checks);
- ``Ledger(store, session)``: ``SqliteStore.load_working_set`` of the
  session (the open call and the last turn, by index, every row read
  checked against its checksum);
- ``ledger.step(Event(Recover, pos))``: the recovery decision for the
  pending call (``recovery_required`` for a manual tool) and its commit.

Each is timed separately, for H = 1k, 10k and 100k (median over repetitions;
before each repetition the file is restored from a pristine copy and
fsynced, so every repetition recovers the same pending call from a file
that is on disk, as after a restart; the copy leaves the file in the page
cache, so these are warm-cache times).  Without the fsync, the Recover
commit's own sync would also write out the megabytes the copy left dirty
(ext4's ordered mode), and t(H) would measure the copy.

How the file is built: one complete call is driven through a real
:class:`~toolledger.ledger.Ledger` (on a ``MemoryStore``) to get the exact
durable shape of a completed call (its call state, ledger record, approval,
audit key and audit row).  That shape is replicated for H positions
(turn i, slot 0, the reused provider id ``call_0``, execution ids derived
from the position) and committed through the public ``Store.commit`` in
batches of 10k calls, so ``plan_commit`` validates every batch and every
row gets its checksum exactly as in normal operation.  The pending call is
then driven through a ``Ledger`` on the ``SqliteStore`` itself.

Goal: t(100k) / t(1k) <= 1.5 (recovery must not scan the history).
``python benchmarks/bench_recovery.py [--smoke]``.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import Result, cli, heading, median, rounded, scratch_dir, table
from toolledger.ledger import Ledger
from toolledger.protocol import (
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
from toolledger.sqlite_store import SqliteStore
from toolledger.stores import AuditRow, MemoryStore

GOAL_RATIO = 1.5
SESSION = "history"
TOOL = ToolProfile("send_email", RecoveryPolicy.MANUAL, True)
ARGS: dict[str, Any] = {"to": "ada@example.com", "subject": "weekly", "body": "Numbers."}
BATCH = 10_000


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


def build(path: Path, history: int) -> tuple[int, int]:
    """A store at ``path``: ``history`` completed calls and one pending; returns its position."""
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
        # the pending call: approved and dispatched, then the process "dies"
        ledger = Ledger(store, SESSION)
        turn = history + 1
        pos = (turn, 0)
        ledger.step(Event(Action.ProviderEmitCall, pos, "call_0", TOOL,
                          args_digest(TOOL.name, ARGS)), arguments=ARGS)
        ledger.step(Event(Action.EnginePersistCall, pos))
        ledger.step(Event(Action.EngineParkApproval, pos))
        ledger.step(Event(Action.HumanApprove, pos))
        ledger.step(Event(Action.EnginePersistDispatched, pos))
    return pos


def _fsync(path: Path) -> None:
    for target, flags in ((path, os.O_RDONLY), (path.parent, os.O_RDONLY)):
        fd = os.open(target, flags)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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
    assert [c.position for c in after.halted()] == [pos], "the pending call must halt"
    return {"open": t1 - t0, "load": t2 - t1, "recover": t3 - t2, "total": t3 - t0}


def run(smoke: bool = False) -> Result:
    sizes = [50, 500] if smoke else [1_000, 10_000, 100_000]
    reps = {50: 1, 500: 1, 1_000: 7, 10_000: 5, 100_000: 3}
    heading(f"recovery of one pending call vs history size: {', '.join(map(str, sizes))} calls")
    results: dict[int, dict[str, Any]] = {}
    with scratch_dir("recovery") as d:
        for h in sizes:
            pristine = d / f"pristine-{h}.sqlite3"
            t0 = time.perf_counter()
            pos = build(pristine, h)
            built = time.perf_counter() - t0
            size_mb = pristine.stat().st_size / 1e6
            work = d / f"work-{h}.sqlite3"
            samples: list[dict[str, float]] = []
            for _ in range(reps[h]):
                for p in d.glob(f"work-{h}.sqlite3*"):
                    p.unlink()
                shutil.copyfile(pristine, work)
                _fsync(work)
                samples.append(recover_once(work, pos))
            med = {k: median([s[k] for s in samples]) for k in samples[0]}
            results[h] = {"file_megabytes": rounded(size_mb, 1), "build_seconds": rounded(built, 1),
                          "repetitions": reps[h], **{f"{k}_seconds": rounded(v, 6)
                                                     for k, v in med.items()}}
            print(f"  {h:,} past calls: file {size_mb:.1f} MB (built in {built:.1f} s); "
                  f"open {med['open'] * 1000:.2f} ms, load {med['load'] * 1000:.2f} ms, "
                  f"Recover {med['recover'] * 1000:.2f} ms", flush=True)
            for p in d.glob(f"*-{h}.sqlite3*"):
                p.unlink()

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
