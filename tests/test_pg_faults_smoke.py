"""benchmarks/bench_pg_faults.py still runs, and what it counts is zero.

Under test: the PostgreSQL fault benchmark in its tiny mode (the seed
matrix's crash points, one statement per server fault: a fast shutdown, a
kill -9 of the postmaster, ``pg_terminate_backend`` of the worker's backend)
for two policies, on its own throwaway cluster (it stops and kills that
server: the session's shared one must not be touched).  Oracles: the exact
safety counts against the counting external system (0 duplicates, 0 lost,
every call settled), every worker hit by a server fault stopped with a
``StoreError`` naming the server; never a time.  And a worker facing a
server that accepts the connection and never answers gets
``StoreUnavailable`` naming it, bounded by ``connect_timeout``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from benchmarks import bench_pg_faults
from pg_cluster import NoPostgres, PgCluster
from toolledger import PostgresStore
from toolledger._core.postgres_store import StoreUnavailable
from toolledger._core.protocol import RecoveryPolicy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke() -> Any:
    try:
        cluster = PgCluster()
    except NoPostgres as exc:
        pytest.fail(str(exc), pytrace=False)
    with cluster as pg:
        yield bench_pg_faults.run(
            smoke=True, cluster=pg,
            policies=(RecoveryPolicy.IDEMPOTENT, RecoveryPolicy.MANUAL),
        )  # fmt: skip


def test_no_fault_loses_or_duplicates_anything(smoke: Any) -> None:
    assert smoke["problems"] == []
    assert smoke["totals"] == dict.fromkeys(bench_pg_faults.COUNTS, 0)
    faults = {r["fault"] for r in smoke["rows"]}
    assert faults == {"sigkill", *bench_pg_faults.SERVER_FAULTS}
    assert {r["policy"] for r in smoke["rows"]} == {"idempotent", "manual"}
    assert smoke["sigkills"] >= 2
    assert all(r["final"] and "(none)" not in r["final"] for r in smoke["rows"])


def test_workers_hit_by_a_server_fault_fail_closed_naming_the_server(smoke: Any) -> None:
    assert smoke["server_fault_runs"] == 3 * 2
    assert smoke["server_fault_runs_failed_closed"] == smoke["server_fault_runs"]
    for row in smoke["rows"]:
        if row["fault"] != "sigkill":
            assert row["fail_closed"] == row["runs"] == row["fail_closed_naming_server"]
    assert smoke["ok"]


def test_a_server_that_never_answers_is_unavailable_within_the_connect_timeout() -> None:
    with bench_pg_faults.silent_listener() as port:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            PostgresStore(f"host=127.0.0.1 port={port} dbname=ledgers user=w", connect_timeout=1)
        waited = time.monotonic() - started
    # bounded: without a connect timeout libpq would wait for the server forever
    assert waited < 30
    assert f"127.0.0.1:{port}, database 'ledgers'" in str(info.value)
    assert "timeout" in str(info.value) and "reachable" in str(info.value)
