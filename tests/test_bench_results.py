"""benchmarks/results.json and the docs/benchmarks.md block that quotes it (no benchmark runs).

``run_all.py --only NAME`` reruns one benchmark: the other figures keep the
run, machine and commit they were measured on, and the rerun is listed with
its own (``reruns``), so the page's header never claims a machine or a date
for figures it did not measure.  The power-loss harness's figures (states
explored, each outcome counted) are recorded and quoted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import render_readme, run_all
from checker_support import ROOT

RESULTS = json.loads((ROOT / "benchmarks" / "results.json").read_text())
PAGE = (ROOT / "docs" / "benchmarks.md").read_text()


def test_the_page_block_is_the_rendering_of_results_json() -> None:
    block = PAGE.split("<!-- bench:begin -->\n", 1)[1].split("<!-- bench:end -->", 1)[0]
    assert block.strip() == render_readme.render(RESULTS).strip(), (
        "docs/benchmarks.md's block drifted from benchmarks/results.json: run "
        "`python benchmarks/render_readme.py`")


def test_the_power_loss_figures_are_recorded_and_quoted() -> None:
    pl = RESULTS["benchmarks"]["power_loss"]
    assert pl["states_explored"] == sum(r["states"] for r in pl["rows"]) > 0
    for r in pl["rows"]:  # every state judged once: the outcome counts add up
        assert sum(r["outcomes"].values()) == r["states"], r
    assert {r["variant"] for r in pl["rows"]} >= {"real", "no-dir-fsync", "replace"}
    assert pl["real_incorrect"] == 0 and pl["planted_found"]["no-dir-fsync"]
    assert f"{pl['states_explored']:,} states explored" in PAGE
    real = next(r for r in pl["rows"] if r["variant"] == "real")
    row = (f"| real | {real['workload']} | {real['operations']} | {real['syncs']} | "
           f"{real['states']} | {real['outcomes'].get('no_store', 0)} | ")
    assert row in PAGE


def test_only_keeps_the_other_figures_run_and_lists_the_rerun(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "results.json"
    before: dict[str, Any] = {
        "generated_by": "python benchmarks/run_all.py",
        "machine": {**RESULTS["machine"], "cpu": "the full run's CPU"},
        "code": {"at_start": {"commit": "aaaaaaa", "uncommitted": []}},
        "seconds": {"other": 100.0, "total": 900.0},
        "goals": [], "benchmarks": {"other": {"figure": 1}},
    }
    out.write_text(json.dumps(before))
    monkeypatch.setattr(run_all, "BENCHMARKS", {"stub": lambda smoke=False: {"figure": 2},
                                                "other": lambda smoke=False: {"figure": 3}})
    assert run_all.main(["--only", "stub", "--out", str(out), "--no-readme"]) == 0
    after = json.loads(out.read_text())
    assert after["benchmarks"] == {"other": {"figure": 1}, "stub": {"figure": 2}}
    assert after["machine"]["cpu"] == "the full run's CPU"
    assert after["code"] == before["code"] and after["seconds"]["total"] == 900.0
    assert set(after["reruns"]) == {"stub"} and after["seconds"]["other"] == 100.0
    header = render_readme.render({**RESULTS, **after, "benchmarks": RESULTS["benchmarks"]})
    assert "`stub` was rerun alone since" in header.split("\n", 1)[0]
