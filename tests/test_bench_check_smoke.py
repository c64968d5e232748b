"""benchmarks/bench_check.py still runs and splits the time as it says.

The oracle is the structure and the arithmetic, never a time: rows that
share a TLC run (``tlc_run``) count as one JVM start, conformance rows are
summed apart, and the smoke run checks one tiny model end to end.
"""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import bench_check


def test_breakdown_counts_a_shared_run_once() -> None:
    rows: list[dict[str, Any]] = [
        {"model": "Host", "check": "tlc", "tlc_run": "Host + 2 probes", "wall_seconds": 10.0,
         "status": "ok"},
        {"model": "P1", "check": "tlc", "tlc_run": "Host + 2 probes", "wall_seconds": 10.0,
         "status": "ok"},
        {"model": "P2", "check": "tlc", "tlc_run": "Host + 2 probes", "wall_seconds": 10.0,
         "status": "ok"},
        {"model": "Twin", "check": "tlc", "tlc_run": None, "wall_seconds": 2.0, "status": "ok"},
        {"model": "Host", "check": "conformance", "wall_seconds": 7.0, "status": "ok"},
    ]
    b = bench_check.breakdown(rows, fixed=1.5)
    assert b["tlc_runs"] == 2
    assert b["tlc_seconds"] == 12.0
    assert b["jvm_start_and_parse_seconds"] == 3.0
    assert b["search_seconds"] == 9.0
    assert b["conformance_seconds"] == 7.0
    # the longest job is the shared run (10 s), not a row's sum
    assert (b["longest_job"], b["longest_job_seconds"]) == ("Host + 2 probes", 10.0)
    # the floor: the longest job when it is more than CPU / 2, else CPU / 2
    assert bench_check.floor_seconds(16.0, b) == 10.0
    assert bench_check.floor_seconds(30.0, b) == 15.0


@pytest.mark.slow
def test_smoke_run_checks_one_model() -> None:
    result = bench_check.run(smoke=True)
    check = result["check"]
    assert check["exit_status"] == 0
    assert [r["status"] for r in check["rows"]] == ["ok"]
    assert check["tlc_runs"] == 1
    assert check["cpu_seconds"] > 0 and check["wall_seconds"] > 0
    assert result["fixed_cost"]["distinct_states"] == check["rows"][0]["distinct_states"]
    assert result["fixed_cost"]["class_data_sharing"] is True
    assert result["fixed_cost_without_cds"]["class_data_sharing"] is False
    memo = result["conformance_memo"]
    # the same verdict with and without the memo, on the whole graph
    assert memo["memo"]["mismatches"] == memo["no_memo"]["mismatches"] == 0
    assert memo["memo"]["reference_edges"] == memo["no_memo"]["reference_edges"] > 0
