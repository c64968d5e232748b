"""Two engines resuming one session: exactly one decides, the other writes nothing.

Under test: the stale-session check of every commit
(``CommitPlan.check_session``, used by ``MemoryStore`` and ``SqliteStore``).
A ``Recover`` whose decision (``retry_same_id``, ``execute``, ...) adds only
an audit row writes no ledger record, so the writers' own compare-and-set on
what they replace never sees it; before this check the losing resumer wrote
its decision row on stale inputs and the audit read ``dispatch 1,
retry_same_id 1, dispatch 2, retry_same_id 1``.

The refusals themselves are pinned on every store (memory, SQLite,
PostgreSQL) by ``tests/test_store_suite.py``; this module keeps the control
that reproduces the issue's audit without the check, and the real race of
two OS processes on one SQLite file.

Oracles: the audit rows the store holds (counted before and after), the
store's commit counters, and for SQLite the statements SQLite really ran in
the losing process (``set_trace_callback``): no INSERT or UPDATE at all.
The two-process test runs two OS processes on one file, both having loaded
the session before either recovers (files as a barrier).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from checker_support import race_two_resumers
from toolledger._core import protocol as p
from toolledger._core.ledger import Ledger
from toolledger._core.sqlite_store import SqliteStore
from toolledger._core.stores import CommitPlan, MemoryStore, Store

A = p.Action
E = p.Event
SID = "s1"
POS = (0, 0)
IDEMPOTENT = p.ToolProfile("create_ticket", p.RecoveryPolicy.IDEMPOTENT, False)
DECISIONS = {d.value for d in p.Decision}


def dispatched_before_a_crash(store: Store) -> None:
    """An idempotent call whose attempt 1 was dispatched, then the engine died."""
    ledger = Ledger.create(store, SID)
    digest = p.args_digest(IDEMPOTENT.name, {"title": "disk full"})
    ledger.step(E(A.ProviderEmitCall, POS, "call_0", IDEMPOTENT, digest),
                arguments={"title": "disk full"})  # fmt: skip
    ledger.step(E(A.EnginePersistCall, POS))
    ledger.step(E(A.EnginePersistDispatched, POS))


def audit_keys(store: Store) -> list[tuple[str, int]]:
    return [(r.kind, r.attempt) for r in store.audit(SID)]


def one_decision_per_attempt(store: Store) -> bool:
    decided = Counter(r.attempt for r in store.audit(SID) if r.kind in DECISIONS)
    return all(n == 1 for n in decided.values())


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made: Store = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "x.db")
    try:
        yield made
    finally:
        made.close()


def two_resumers(store: Store) -> tuple[Ledger, Ledger]:
    dispatched_before_a_crash(store)
    return Ledger(store, SID), Ledger(store, SID)  # both load: the call is at RESUME


def test_control_without_the_check_on_audit_only_commits_the_loser_writes(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broken variant the store suite catches: the check only on written records.

    Without the guards (the compare-and-set of what the commit was decided
    on) the loser's audit-only ``Recover`` goes through: a second
    ``retry_same_id`` for attempt 1, the audit the issue reported.
    """
    original = CommitPlan.check_session

    def records_only(self: CommitPlan, *args: object, **kwargs: object) -> None:
        from dataclasses import replace

        original(replace(self, guards=()), *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(CommitPlan, "check_session", records_only)
    winner, loser = two_resumers(store)
    winner.step(E(A.Recover, POS))
    winner.step(E(A.EnginePersistDispatched, POS))
    loser.step(E(A.Recover, POS))  # accepted: nothing stops an audit-only commit
    assert audit_keys(store) == [
        ("dispatch", 1), ("retry_same_id", 1), ("dispatch", 2), ("retry_same_id", 1),
    ]  # fmt: skip
    assert not one_decision_per_attempt(store)


# --------------------------------------------------------------------------
# Two real OS processes on one SQLite file
# --------------------------------------------------------------------------

RESUMER = """
import json, sys, time
from pathlib import Path
from toolledger._core import protocol as p
from toolledger._core.ledger import Ledger
from toolledger._core.sqlite_store import SqliteStore
from toolledger._core.stores import StaleState

path, name, sync = sys.argv[1], sys.argv[2], Path(sys.argv[3])
store = SqliteStore(path)
ledger = Ledger(store, "s1")
assert ledger.state.call((0, 0)).stage is p.Stage.RESUME
(sync / f"{name}.loaded").touch()
deadline = time.monotonic() + 60
while not (sync / "go").exists():
    if time.monotonic() > deadline:
        sys.exit("no go signal")
    time.sleep(0.0005)
statements = []
store.connection.set_trace_callback(statements.append)
outcome, message = "won", ""
try:
    ledger.step(p.Event(p.Action.Recover, (0, 0)))
    if ledger.state.call((0, 0)).stage is p.Stage.RETRY:
        ledger.step(p.Event(p.Action.EnginePersistDispatched, (0, 0)))
except StaleState as exc:
    outcome, message = "refused", str(exc)
store.connection.set_trace_callback(None)
writes = [s for s in statements if s.split()[0].upper() in ("INSERT", "UPDATE", "DELETE")]
print(json.dumps({"outcome": outcome, "message": message, "writes": len(writes),
                  "commits": store.commits}))
store.close()
"""


@pytest.mark.parametrize("round_", [1, 2])
def test_two_processes_recovering_one_call_exactly_one_decides(
    tmp_path: Path, round_: int
) -> None:
    path = tmp_path / "x.db"
    with SqliteStore(path) as store:
        dispatched_before_a_crash(store)
        assert audit_keys(store) == [("dispatch", 1)]
    results = race_two_resumers(RESUMER, [str(path)], tmp_path / "sync")
    outcomes = sorted(str(r["outcome"]) for r in results)
    assert outcomes == ["refused", "won"], results
    (winner,) = [r for r in results if r["outcome"] == "won"]
    (loser,) = [r for r in results if r["outcome"] == "refused"]
    assert winner["commits"] == 2  # the decision row, then dispatched(2)
    # The loser wrote nothing: no committed transaction, and no INSERT/UPDATE
    # statement was even run (it was refused before its first write).
    assert (loser["commits"], loser["writes"]) == (0, 0), loser
    assert "changed since this engine loaded it" in str(loser["message"])
    assert "Ledger.reload()" in str(loser["message"])
    with SqliteStore(path) as store:
        # one row before, the winner's two after: none of the loser's
        assert audit_keys(store) == [("dispatch", 1), ("retry_same_id", 1), ("dispatch", 2)]
        assert one_decision_per_attempt(store)
        assert store.load(SID).ledger[store.load(SID).calls[0].execution_id].attempt == 2


# --------------------------------------------------------------------------
# Every part of a call's durable state is compared, alone
# --------------------------------------------------------------------------

READONLY = p.ToolProfile("read_file", p.RecoveryPolicy.READONLY, False)
MANUAL = p.ToolProfile("send_email", p.RecoveryPolicy.MANUAL, True)


def emit(tool: p.ToolProfile) -> E:
    return E(A.ProviderEmitCall, POS, "call_0", tool, p.args_digest(tool.name, {}))
