"""Probes batched into one TLC run keep their meaning and their pinned counts.

:mod:`toolledger.check.batch` runs rows that share a model (a must-pass host
and the probes whose cfg differs from it only in the one invariant they
expect violated) as ONE TLC run.  Checked here: the plan of the real manifest;
that a batch reports, for each probe, exactly the outcome and distinct-state
count of the probe's own run; that a batch without a host stops once every
probe was reached; and that a probe that is never violated (vacuous) is
reported as not violated, so its row drifts.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from checker_support import ROOT
from toolledger.check.batch import Batch, batch_files, plan, split_result
from toolledger.check.manifest import ModelEntry, drift, load_manifest
from toolledger.check.tlc import Outcome, TLCResult, run_tlc

MANIFEST = load_manifest(ROOT)


def _run(batch: Batch, tmp: Path) -> tuple[TLCResult, dict[str, TLCResult]]:
    _, cfg = batch_files(batch, tmp)
    result = run_tlc(batch.module, cfg, search_dirs=[*MANIFEST.search_dirs, tmp],
                     check_deadlock=batch.base.check_deadlock)
    return result, split_result(batch, result)


def _alone(e: ModelEntry) -> TLCResult:
    return run_tlc(e.module, e.cfg_path, search_dirs=MANIFEST.search_dirs,
                   check_deadlock=e.check_deadlock)


def test_the_plan_covers_every_row_once_and_hosts_the_witness_probes() -> None:
    ci = MANIFEST.ci_models()
    batches, alone = plan(ci)
    names = [e.name for b in batches for e in b.entries] + [e.name for e in alone]
    assert sorted(names) == sorted(e.name for e in ci)
    by_host = {b.host.name: b for b in batches if b.host is not None}
    rr = by_host["ReconcileReadonly"]
    probes = {e.name for e in ci if e.module == "MCReconcileReadonly" and e.antecedent_of}
    assert {p.name for p in rr.probes} == probes and len(probes) >= 10
    for b in batches:
        for e in b.probes:  # a probe checks exactly the invariant it expects violated
            assert e.expected_outcome is Outcome.INVARIANT_VIOLATED
        assert len({e.module for e in b.entries}) == 1
        assert re.fullmatch(r"TLBatch\d+_\w+", b.module)


@pytest.mark.slow
def test_a_hosted_batch_reports_what_each_row_alone_reports(tmp_path: Path) -> None:
    batches, _ = plan(MANIFEST.ci_models())
    [batch] = [b for b in batches if b.host is not None and b.host.name == "DeepManual"]
    assert len(batch.probes) >= 3
    result, rows = _run(batch, tmp_path)
    assert result.outcome is Outcome.PASS
    for e in batch.entries:
        alone = _alone(e) if e is not batch.host else result
        assert (rows[e.name].outcome, rows[e.name].violated, rows[e.name].distinct_states) == (
            alone.outcome, alone.violated, alone.distinct_states), e.name
        assert drift(e, rows[e.name]) == []


@pytest.mark.slow
def test_without_a_host_the_run_stops_once_every_probe_is_reached(tmp_path: Path) -> None:
    probes = tuple(e for e in MANIFEST.ci_models()
                   if e.module == "MCDeepManual" and e.expect != "pass")
    batch = Batch(None, probes, "TLBatch0_MCDeepManual")
    result, rows = _run(batch, tmp_path)
    assert (result.outcome, result.violated) == (Outcome.INVARIANT_VIOLATED, "TLBatchInvariant")
    host = MANIFEST.get("DeepManual")
    assert result.distinct_states is not None and result.distinct_states < host.distinct_states
    for e in probes:
        assert drift(e, rows[e.name]) == [], e.name


@pytest.mark.slow
def test_a_vacuous_probe_is_reported_not_violated(tmp_path: Path) -> None:
    """A probe whose invariant (here TypeOK) no state violates: the batch
    explores the whole model, the probe's row says "pass" and drifts; the
    other probe of the batch is still reported violated at its own count."""
    real = MANIFEST.get("DeepManualDecideSkip")
    cfg = tmp_path / "cfgs" / "Vacuous.cfg"
    cfg.parent.mkdir()
    cfg.write_text(real.cfg_path.read_text().replace(real.expect, "TypeOK"))
    vacuous = replace(real, name="Vacuous", cfg="Vacuous.cfg", cfg_path=cfg, expect="TypeOK")
    batch = Batch(None, (real, vacuous), "TLBatch0_MCDeepManual")
    result, rows = _run(batch, tmp_path / "run")
    assert result.outcome is Outcome.PASS
    assert result.distinct_states == MANIFEST.get("DeepManual").distinct_states
    assert rows["Vacuous"].outcome is Outcome.PASS
    assert drift(vacuous, rows["Vacuous"])[0] == "expected TypeOK, got pass"
    assert drift(real, rows[real.name]) == []
