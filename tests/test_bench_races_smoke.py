"""benchmarks/bench_races.py still runs, and its checks catch a broken store.

Under test: the race benchmark in its tiny mode (8 races per store, 4
worker processes, every policy) on SQLite and on the session's throwaway
PostgreSQL server.  Oracles: the structure and the exact counts of the
results (never a time), and a deliberately broken variant (workers that
commit without the compare-and-set of what they read) that the benchmark
must report as failing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks import bench_races
from pg_cluster import PgCluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke(pg_cluster: PgCluster) -> dict[str, Any]:
    return bench_races.run(smoke=True, conninfo=pg_cluster.conninfo)


def test_every_race_has_one_winner_and_silent_losers(smoke: dict[str, Any]) -> None:
    assert smoke["ok"] and smoke["workers"] >= 4
    assert set(smoke["stores"]) == {"sqlite", "postgres"}
    for result in smoke["stores"].values():
        races = result["races"]
        assert result["problems"] == []
        assert result["refused_losers"] == races * (smoke["workers"] - 1)
        assert (result["losers_that_wrote"], result["duplicate_effects"]) == (0, 0)
        assert set(result["by_policy"]) == {"idempotent", "reconcile", "manual", "readonly"}
        assert sum(s["races"] for s in result["by_policy"].values()) == races
        assert all(s["max_dispatches_per_attempt"] <= 1 for s in result["by_policy"].values())
        assert all(s.get("losers_that_wrote", 0) == 0 for s in result["by_policy"].values())
    # the server's own count of rows written: the winners' statements and nothing else
    pg = smoke["stores"]["postgres"]
    assert pg["server_rows_written"] == pg["winners_write_statements"] > 0


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_control_workers_without_the_guards_are_caught(
    kind: str, pg_cluster: PgCluster, tmp_path: Path
) -> None:
    where = str(tmp_path / "r.db") if kind == "sqlite" else f"{pg_cluster.conninfo}|broken_{kind}"
    result = bench_races.race_store(kind, where, 4, 4, tmp_path, broken=True)
    assert not result["ok"]
    assert result["losers_that_wrote"] > 0 or any(
        "one decision per attempt" in problem for problem in result["problems"]
    )
