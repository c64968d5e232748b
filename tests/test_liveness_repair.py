"""The repair's liveness twin is a twin of the repair (TLC).

ApprovalNotReasked (model/MCLivenessRepair.tla, a manifest row that must
violate EventuallyAnswered) parks an approval only where none exists.  Its
manifest question says only the conversation's repair shows the bug: with
MaxRepairs 0 the same twin passes, so the LivenessLostConversation row, not
the other liveness rows, is what catches it.
"""

from __future__ import annotations

from pathlib import Path

from checker_support import ROOT
from toolledger.check.manifest import load_manifest
from toolledger.check.tlc import Outcome, run_tlc


def _run(tmp_path: Path, max_repairs: str) -> tuple[Outcome, str | None, int | None]:
    entry = load_manifest(ROOT).get("ApprovalNotReasked")
    cfg = entry.cfg_path.read_text(encoding="utf-8")
    assert "MaxRepairs <- MCMaxRepairs" in cfg
    (tmp_path / "MCNoRepair.tla").write_text(
        "---- MODULE MCNoRepair ----\nEXTENDS MCLivenessRepair\n"
        f"Repairs == {max_repairs}\n====\n", encoding="utf-8")
    (tmp_path / "NoRepair.cfg").write_text(
        cfg.replace("MaxRepairs <- MCMaxRepairs", "MaxRepairs <- Repairs"), encoding="utf-8")
    r = run_tlc("MCNoRepair", tmp_path / "NoRepair.cfg",
                search_dirs=[ROOT / "spec", ROOT / "model", tmp_path], check_deadlock=False)
    return r.outcome, r.violated, r.distinct_states


def test_without_a_repair_the_twin_answers_every_call(tmp_path: Path) -> None:
    assert _run(tmp_path, "0") == (Outcome.PASS, None, 2210)


def test_with_one_repair_it_leaves_a_call_unanswered(tmp_path: Path) -> None:
    # the manifest row's own run, through the same override: the control above
    # differs from it in MaxRepairs alone
    assert _run(tmp_path, "1") == (Outcome.PROPERTY_VIOLATED, "EventuallyAnswered", 11109)
