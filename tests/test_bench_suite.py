"""benchmarks/bench_suite.py: the kinds, the arithmetic, the README block's form.

The oracle is structure, never a time: a synthetic run's sums, the kind each
recorded fact gives, a real run of three tests through the recording plugin
(benchmarks/suite_times.py), and the block in benchmarks/README.md parsed
back (its totals are the sums of its rows: it is the script's output, not
figures typed in).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from benchmarks import bench_suite

README = Path(__file__).resolve().parents[1] / "benchmarks" / "README.md"


def rec(nodeid: str, wall: float = 1.0, cpu: float = 0.5, **kw: Any) -> dict[str, Any]:
    return {"nodeid": nodeid, "wall": wall, "cpu": cpu, **kw}


@pytest.mark.parametrize(("record", "kind"), [
    (rec("notebooks/01_the_bug.ipynb::"), "notebooks"),
    (rec("tests/test_crash_campaign.py::test_x", launched=["java"]), "crash campaign"),
    (rec("tests/test_x.py::t", launched=["git", "java"]), "TLC runs"),
    (rec("tests/test_x.py::t", launched=["toolledger"], fixtures=["pg_cluster"]), "TLC runs"),
    (rec("tests/test_x.py::t", fixtures=["pg_cluster", "tmp_path"]), "PostgreSQL"),
    (rec("tests/test_x.py::t", launched=["initdb"]), "PostgreSQL"),
    (rec("tests/test_x.py::t", hypothesis=True), "Hypothesis"),
    (rec("tests/test_x.py::t", launched=["git"], fixtures=["tmp_path"]), "other"),
])
def test_kind_of(record: dict[str, Any], kind: str) -> None:
    assert bench_suite.kind_of(record) == kind


def test_summarize_sums_per_file_and_kind() -> None:
    s = bench_suite.summarize([
        rec("tests/test_a.py::t1", 10.0, 4.0, launched=["java"]),
        rec("tests/test_a.py::t2", 1.0, 1.0),
        rec("tests/test_a.py::t3", 1.0, 1.0),
        rec("tests/test_b.py::t", 3.0, 2.0, hypothesis=True),
    ])
    assert (s["tests"], s["wall_seconds"], s["cpu_seconds"]) == (4, 15.0, 8.0)
    assert [(f["file"], f["tests"], f["wall"], f["kind"]) for f in s["files"]] == [
        ("tests/test_a.py", 3, 12.0, "TLC runs"),  # the kind with the most time
        ("tests/test_b.py", 1, 3.0, "Hypothesis")]
    kinds = {k["kind"]: (k["tests"], k["wall"]) for k in s["kinds"]}
    assert kinds["TLC runs"] == (1, 10.0) and kinds["other"] == (2, 2.0)
    assert kinds["notebooks"] == (0, 0.0) and set(kinds) == set(bench_suite.KINDS)
    assert s["slowest"][0]["nodeid"] == "tests/test_a.py::t1"


def test_a_bad_record_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"nodeid": "x", "wall": 1}\n')
    with pytest.raises(SystemExit, match=r"t\.jsonl:1: not a record"):
        bench_suite.load_records(bad)


def test_an_xdist_run_is_read_from_every_workers_file(tmp_path: Path) -> None:
    base = tmp_path / "t.jsonl"
    for worker, node in (("gw0", "tests/test_a.py::t"), ("gw1", "tests/test_b.py::t")):
        (tmp_path / f"t.jsonl.{worker}").write_text(
            json.dumps({"nodeid": node, "wall": 1.0, "cpu": 0.5}) + "\n")
    assert sorted(r["nodeid"] for r in bench_suite.load_records(base)) == [
        "tests/test_a.py::t", "tests/test_b.py::t"]
    (tmp_path / "t.jsonl.gw1").write_text("not json\n")
    with pytest.raises(SystemExit, match=r"t\.jsonl\.gw1:1: not a record"):
        bench_suite.load_records(base)


def test_the_readme_markers_are_refused_when_missing(tmp_path: Path) -> None:
    page = tmp_path / "README.md"
    page.write_text("# no markers\n")
    with pytest.raises(SystemExit, match="needs one"):
        bench_suite.rewrite_readme("x", page)
    page.write_text(f"a\n{bench_suite.BEGIN}\nold\n{bench_suite.END}\nb\n")
    bench_suite.rewrite_readme("new", page)
    assert page.read_text() == f"a\n{bench_suite.BEGIN}\nnew\n{bench_suite.END}\nb\n"


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_the_readme_block_is_the_scripts_output() -> None:
    text = README.read_text(encoding="utf-8")
    block = text.split(bench_suite.BEGIN, 1)[1].split(bench_suite.END, 1)[0].strip()
    lines = block.splitlines()
    m = re.match(r"([\d,]+) tests and notebooks: ([\d,.]+) s wall, ([\d,.]+) s CPU", lines[0])
    assert m, lines[0]
    tests, wall = int(m.group(1).replace(",", "")), float(m.group(2).replace(",", ""))
    head = lines.index("| kind | tests | wall s | share | CPU s |")
    kinds = [_cells(ln) for ln in lines[head + 2:head + 2 + len(bench_suite.KINDS)]]
    assert sorted(k[0] for k in kinds) == sorted(bench_suite.KINDS)
    assert sum(int(k[1].replace(",", "")) for k in kinds) == tests
    assert abs(sum(float(k[2].replace(",", "")) for k in kinds) - wall) <= 0.1 * len(kinds)
    files = lines.index("| test file | kind | tests | wall s | share | CPU s |")
    rows = [_cells(ln) for ln in lines[files + 2:] if ln.startswith("| ")]
    rows = rows[:next((i for i, r in enumerate(rows) if r[0] == "slowest tests"), len(rows))]
    assert sum(int(r[2].replace(",", "")) for r in rows) == tests
    assert "| slowest tests | kind | wall s | CPU s |" in lines


@pytest.mark.slow
def test_smoke_records_three_kinds_through_the_plugin(tmp_path: Path) -> None:
    keep = tmp_path / "kept.jsonl"
    result = bench_suite.run(smoke=True, note="A remark.", keep=keep)
    assert result["run"]["exit_status"] == 0
    assert result["run"]["tlc_cache"] == "fresh"  # as make test on a fresh clone
    # --note is added to the measured sentence, never in its place
    assert result["note"].startswith("The whole run: ") and result["note"].endswith(" A remark.")
    # --keep writes what the run recorded (one file per worker, here one): --from renders it
    kept = bench_suite.load_records(keep)
    assert len(kept) == 3 and bench_suite.summarize(kept)["tests"] == 3
    assert result["tests"] == 3
    kinds = {k["kind"]: k["tests"] for k in result["kinds"]}
    assert (kinds["TLC runs"], kinds["Hypothesis"], kinds["other"]) == (1, 1, 1)
    assert result["run"]["cpu_seconds"] > 0 and result["cpu_seconds"] > 0
    assert result["run"]["load_average"]["max"] >= result["run"]["load_average"]["min"] >= 0
