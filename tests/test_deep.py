"""The deep target (``toolledger deep``): TLC's random simulation of model/deep/Deep.cfg.

Under test: :mod:`toolledger.check.deep` and its subcommand.  The target must
find a planted bug (a twin's operator swapped in), report a clean sample as
clean with what it covered, and refuse a malformed override before any TLC
run.  The long runs are ``make deep`` / ``make bench``'s, not CI's.
"""

from __future__ import annotations

import pytest

from checker_support import ROOT
from toolledger.check.deep import run_deep
from toolledger.check.invariants import INVARIANTS
from toolledger.check.tlcoutput import Outcome
from toolledger.cli import main


def test_a_planted_bug_is_found_with_its_counterexample() -> None:
    run = run_deep(ROOT, traces=300, seed=1, overrides=["DecisionFor=DecideRetriesManual"])
    assert run.violated in INVARIANTS, run.result.error_text
    assert run.result.outcome is Outcome.INVARIANT_VIOLATED
    assert len(run.result.trace) >= 2


def test_a_clean_sample_says_what_it_covered(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deep", "--root", str(ROOT), "--traces", "25", "--depth", "100"]) == 0
    out = capsys.readouterr().out
    assert "25 behaviours of up to 100 steps (seed 1)" in out
    assert "every invariant held" in out
    states = int(out.split("), ")[1].split(" states")[0].replace(",", ""))
    assert states >= 25  # every behaviour has at least its initial state


@pytest.mark.parametrize("bad", ["DecisionFor", "DecisionFor=", "A=B; rm", "=X"])
def test_a_malformed_override_is_refused_before_tlc_runs(
        bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deep", "--root", str(ROOT), "--override", bad]) == 2
    err = capsys.readouterr().err
    assert "OPERATOR=REPLACEMENT" in err
