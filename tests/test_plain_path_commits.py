"""Where the plain path's commits go: one count per step, on every store kind.

Under test: :class:`toolledger.Session`'s plain path (``open``, ``record``,
``approve``, ``execute`` per call), the path of the README and of
``benchmarks/bench_peers.py``'s ``toolledger`` row (2.4 syncs per call on
5-call turns).  The oracle is the store's own commit counter, step by step:
the session's creation and the message's record are one commit each (0.2 +
0.2 per call of a 5-call message), ``execute`` two, ``approve`` one.
``lazy_create=True`` moves the creation into the record's commit (2.2); the
record cannot move into the first ``dispatched`` on this path (record()
returns before any dispatch is asked for; docs/benchmarks.md, "The plain
path's syncs"), which ``execute_message`` does (1.2).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from toolledger import MemoryStore, Session, SqliteStore, Tool

N = 5
MESSAGE = [{"id": f"c{i}", "name": "send", "arguments": {"i": i}} for i in range(N)]


def stores(tmp_path: Path) -> dict[str, Callable[[], Any]]:
    return {"memory": MemoryStore, "sqlite": lambda: SqliteStore(tmp_path / "l.sqlite3")}


def per_step(store: Any, approval: bool, lazy: bool) -> list[tuple[str, int]]:
    """(step, commits it made) for one new session's 5-call message on ``store``."""
    steps: list[tuple[str, int]] = []
    seen = [store.commits]

    def note(name: str) -> None:
        steps.append((name, store.commits - seen[0]))
        seen[0] = store.commits

    s = Session.open(store, f"s-{approval}-{lazy}",
                     {"send": Tool("idempotent", requires_approval=approval)}, lazy_create=lazy)
    note("open")
    for st in s.record(1, MESSAGE):
        if approval:
            s.approve(st.call.key)
            note("approve")
        s.execute(st.call.key, lambda a: "sent")
        note("execute")
    return steps


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_the_plain_paths_commits_step_by_step(tmp_path: Path, kind: str) -> None:
    store = stores(tmp_path)[kind]()
    # bench_peers' plain row: no approval, the session created by open
    steps = per_step(store, approval=False, lazy=False)
    assert steps[0] == ("open", 1)  # the session's creation: 0.2 per call of 5
    # record's own commit (0.2 per call) lands in the first step after open
    assert steps[1] == ("execute", 1 + 2)
    assert steps[2:] == [("execute", 2)] * (N - 1)
    assert sum(c for _, c in steps) / N == 2.4
    # lazy_create: the record's commit creates the session; still one record commit
    lazy = per_step(store, approval=False, lazy=True)
    assert lazy[0] == ("open", 0)
    assert sum(c for _, c in lazy) / N == 2.2
    # the README's path: every approval is its own commit (HumanApprove)
    approved = per_step(store, approval=True, lazy=False)
    assert [c for name, c in approved if name == "approve"] == [1 + 1] + [1] * (N - 1)
    assert sum(c for _, c in approved) / N == 3.4


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_the_message_path_folds_the_record_into_the_first_dispatch(
    tmp_path: Path, kind: str
) -> None:
    store = stores(tmp_path)[kind]()
    before = store.commits
    Session.open(store, "m", {"send": Tool("idempotent", requires_approval=False)},
                 lazy_create=True).execute_message(1, MESSAGE, lambda a: "sent")
    assert (store.commits - before) / N == 1.2  # n + 1: creation + record + dispatched(1)
