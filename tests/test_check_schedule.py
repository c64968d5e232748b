"""``toolledger check`` starts the longest chains of work first.

On 2 cores the check is as long as its CPU time / 2 only if no big run is
left alone at the end; the jobs are started longest first by an estimate
(:func:`toolledger.cli.job_cost`).  The estimate once counted a Liveness run
(a temporal property on 40,574 states, ~15-20 s) as a 5.6 s job, so both
Liveness runs started after every bigger safety model and ran last, side by
side, while the conformance checks queued behind them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from checker_support import ROOT
from toolledger.check.manifest import load_manifest
from toolledger.check.tlc import Cancellation, parse_cfg
from toolledger.cli import _CheckRun, _Job, job_cost

MANIFEST = load_manifest(ROOT)


def _ci_plan(tmp_path: Path, every_tier: bool = False, every_conformance: bool | None = None
             ) -> tuple[_CheckRun, list[_Job]]:
    """The jobs of `make check` (``toolledger check``), or of ``check --all``
    (``every_tier``); ``every_conformance=False`` keeps the conformance rows
    of the check tier only."""
    models = MANIFEST.ci_models() if every_tier else MANIFEST.check_models()
    every_conformance = every_tier if every_conformance is None else every_conformance
    conform = [e for e in models if e.conformance
               and (every_conformance or e.conformance_tier == "check")]
    args = argparse.Namespace(jobs=2, trace=False, timeout=None, json=False,
                              no_conformance=False, all=every_tier, model=None)
    run = _CheckRun(MANIFEST, models, conform, None, tmp_path, args, Cancellation())
    run.to_run = list(models)
    return run, run._plan()


def test_a_temporal_property_and_a_state_graph_dump_cost_more() -> None:
    plain = job_cost("tlc", 40_000)
    assert job_cost("tlc", 40_000, temporal=True) > plain
    assert job_cost("tlc", 40_000, dump=True) > plain
    # a run whose conformance check waits for it carries that check too
    assert job_cost("tlc", 40_000, dump=True, then_conformance=True) == (
        job_cost("tlc", 40_000, dump=True) + job_cost("conformance", 40_000))


def test_the_liveness_runs_and_the_conformance_chain_start_first(tmp_path: Path) -> None:
    # every TLC row (the big liveness models are of the test tier), the check's conformance
    _, jobs = _ci_plan(tmp_path, every_tier=True, every_conformance=False)
    order = [j.name for j in sorted(jobs, key=_Job.cost, reverse=True)]
    live = {"Liveness", "LivenessNoHumanFairness", "ConcurrentLivenessManual",
            "ConcurrentLivenessRefusedReloads"}
    assert live <= set(order[:4]), order[:6]
    # the biggest check-tier conformance model's TLC run (it dumps its graph,
    # and its conformance check waits for it) starts before bigger plain runs
    # such as DeepReconcile (58,846 states, no dump)
    assert order.index("SameTurn") < order.index("DeepReconcile"), order[:8]
    # the old estimate put both Liveness runs after DeepReconcile (58,846 states)
    cost = {j.name: j.cost() for j in jobs}
    assert cost["Liveness"] > cost["DeepReconcile"]


def test_the_jobs_know_what_they_dump_and_check(tmp_path: Path) -> None:
    run, jobs = _ci_plan(tmp_path)
    conform = {e.name for e in run.conform}
    for j in jobs:
        host = j.batch.host if j.batch is not None else j.entries[0]
        assert j.dumps == (host is not None and host.name in conform), j.name
        # temporal: its cfg checks PROPERTIES (the liveness models and their twins)
        assert j.temporal == bool(parse_cfg(j.entries[0].cfg_path).properties), j.name
    assert {"LivenessReconcile", "LivenessKeyExpiry"} <= {j.name for j in jobs if j.temporal}


def test_make_check_leaves_the_test_tier_to_make_test(tmp_path: Path) -> None:
    """The rows of ``tier = "test"`` are not jobs of `make check` (their probes
    are, run without their host), and are jobs of ``check --all``."""
    left = {e.name for e in MANIFEST.ci_models() if e.tier == "test"}
    assert {"TwoCalls", "Liveness"} <= left
    for every_tier in (False, True):
        _, jobs = _ci_plan(tmp_path / str(every_tier), every_tier)
        names = {e.name for j in jobs for e in j.entries}
        assert (left <= names) if every_tier else not (left & names), sorted(left & names)
        assert "Witness_ReusedIdsInvoked" in names  # TwoCalls' probe, in both


def test_the_rows_most_likely_to_fail_start_first(tmp_path: Path) -> None:
    """After the head job (the longest, beside the parse): a ready conformance
    check before any TLC run, the TLC runs that dump a graph for one smallest
    first, then the plain runs longest first. A reference bug found by a small
    model's conformance row was reported 435 s into a 440 s check when every
    job was ranked by cost alone."""
    run, jobs = _ci_plan(tmp_path)
    order = sorted(jobs, key=_Job.priority, reverse=True)
    dumping = [j for j in order if j.dumps]
    assert dumping and order[: len(dumping)] == dumping  # every conformance chain first
    assert [j.cost() for j in dumping] == sorted(j.cost() for j in dumping)  # small first
    assert dumping[0].name.startswith("Renumbered"), [j.name for j in dumping]  # 1,192 states
    plain = order[len(dumping):]
    assert [j.cost() for j in plain] == sorted((j.cost() for j in plain), reverse=True)
    [renumbered] = [e for e in run.conform if e.name == "Renumbered"]
    check = _Job("conformance", (renumbered,))
    assert max([*jobs, check], key=_Job.priority) is check  # ready: it starts next
