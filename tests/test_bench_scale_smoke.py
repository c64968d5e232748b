"""benchmarks/bench_scale.py still runs, and its checks catch a duplicated effect.

Under test: the scale benchmark in its tiny mode (1 and 4 sessions over 1
and 2 processes, short windows) on SQLite and on the session's throwaway
PostgreSQL server.  Oracles: the shape of the table, the exact commit count
of a 5-call turn (one ``record`` commit + two per call), SQLite's syncs
(strace: at least one per commit), and the external
system's own files: every recorded call applied exactly once (never a
time).  Control: workers whose first effect is applied twice must be
reported as failing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks import bench_scale
from pg_cluster import PgCluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke(pg_cluster: PgCluster) -> dict[str, Any]:
    return bench_scale.run(smoke=True, conninfo=pg_cluster.conninfo)


def test_the_table_has_every_cell_and_every_call_applied_once(smoke: dict[str, Any]) -> None:
    assert smoke["ok"]
    cells = {(c["store"], c["processes"], c["sessions"]): c for c in smoke["cells"]}
    assert set(cells) == {
        (k, p, s) for k in ("sqlite", "postgres") for p in smoke["processes"]
        for s in smoke["sessions"]
    }  # fmt: skip
    for (_, procs, sessions), c in cells.items():
        # one session cannot be spread over two processes: that cell is n/a, not a figure
        assert c["applicable"] is (sessions >= procs)
        if not c["applicable"]:
            continue
        assert c["problems"] == [] and c["ok"]
        assert c["calls"] > 0 and c["calls"] % bench_scale.CALLS_PER_TURN == 0
        assert c["calls_per_second"] > 0
        # Session.execute: 2 commits per call, plus the turn's record commit
        assert c["commits_per_call"] == 2 + 1 / bench_scale.CALLS_PER_TURN
    # the server's WAL flushes on PostgreSQL; SQLite's sync calls under strace (WAL,
    # synchronous=FULL: at least one per commit)
    assert all(c["syncs_per_call"] > 0 for c in cells.values()
               if c["applicable"] and c["store"] == "postgres")  # fmt: skip
    assert smoke["sqlite_syncs_counted_by"] is not None, "strace is missing"
    assert all(c["syncs_per_call"] >= c["commits_per_call"] for c in cells.values()
               if c["applicable"] and c["store"] == "sqlite")  # fmt: skip


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_control_an_effect_applied_twice_is_caught(
    kind: str, pg_cluster: PgCluster, tmp_path: Path
) -> None:
    where = str(tmp_path / "s.db") if kind == "sqlite" else f"{pg_cluster.conninfo}|broken_scale"
    cell = bench_scale.run_cell(kind, where, 2, 2, 0.2, tmp_path, None, broken=True)
    assert not cell["ok"]
    # each session's first effect, and nothing else: the durable side is intact
    assert len(cell["problems"]) == 2, cell["problems"]
    assert all(problem.endswith(": applied exactly once") for problem in cell["problems"])
