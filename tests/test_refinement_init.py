"""The refinement's initial states are states the main spec reaches.

``StepsRefine`` (model/MCConcurrentRefinesMain.tla) checks every step of the
concurrent spec against the main spec's, but from the concurrent ``Init``,
which is not the main spec's ``Init``.  model/MCMappedInitReachable.tla closes
that gap: the concurrent variables stay at one of the four initial states
while a copy of the main spec runs from its own ``Init``, and
``Witness_MappedInitReachable`` is violated when the copy equals the mapped
state.  The manifest runs the manual policy (MappedInitReachable1..4); these
tests run the other two, and show the check can answer "not reached": with no
crash counted before the concurrent ``Init`` (``HInitNoCrash``, the mapping's
first form) the "no record yet" and "dispatched, nothing sent" states are not
reached.  docs/protocol.md#concurrent-resumers.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from checker_support import ROOT
from toolledger.check.manifest import load_manifest
from toolledger.check.tlc import Outcome, TLCResult, run_tlc
from toolledger.check.tlccache import cache_from_env

MANIFEST = load_manifest(ROOT)
MODULE = "MCMappedInitReachable"
WITNESS = "Witness_MappedInitReachable"
PROTOCOL = " ".join((ROOT / "docs" / "protocol.md").read_text(encoding="utf-8").split())


def _constants(policy: str) -> str:
    """The CONSTANTS block of the Refines<Policy> row (same model, same bounds)."""
    text = MANIFEST.get(f"Refines{policy.capitalize()}").cfg_path.read_text(encoding="utf-8")
    return _block(text)


def _block(cfg_text: str) -> str:
    return "CONSTANTS" + cfg_text.split("CONSTANTS", 1)[1].split("SPECIFICATION", 1)[0].rstrip()


def _run(tmp_path: Path, policy: str, which: int, *, spec: str = "PSpec",
         invariant: str = WITNESS, extra: str = "") -> TLCResult:
    cfg = tmp_path / f"Init_{policy}_{which}.cfg"
    cfg.write_text(f"{_constants(policy)}\n    Which = {which}\n{extra}"
                   f"SPECIFICATION {spec}\nINVARIANTS\n    {invariant}\n", encoding="utf-8")
    return run_tlc(MODULE, cfg, search_dirs=MANIFEST.search_dirs, check_deadlock=False,
                   cache=cache_from_env())


def _instance_constants(module: str, instance: str) -> list[str]:
    """The constant substitutions of ``instance == INSTANCE DurableToolExecution WITH``."""
    text = (ROOT / "model" / f"{module}.tla").read_text(encoding="utf-8")
    block = text.split(f"{instance} == INSTANCE DurableToolExecution WITH", 1)[1]
    lines = [ln.strip().rstrip(",") for ln in block.splitlines()]
    constants = [ln for ln in lines if re.match(r"[A-Z]\w* <- ", ln)]
    assert len(constants) >= 10, constants
    return constants


def test_the_main_specs_copy_has_the_mappings_constants() -> None:
    """M (the copy that runs from Init) is written out again beside Main (the
    mapping's instance): the same constants, or the check asks about another spec."""
    assert (_instance_constants(MODULE, "M")
            == _instance_constants("MCConcurrentRefinesMain", "Main"))


def test_the_manifest_rows_cover_every_initial_state_of_the_manual_model() -> None:
    rows = [MANIFEST.get(f"MappedInitReachable{k}") for k in range(1, 5)]
    assert all(r.module == MODULE and r.expect == WITNESS and r.ci for r in rows)
    for k, row in enumerate(rows, 1):
        text = row.cfg_path.read_text(encoding="utf-8")
        assert _block(text) == f"{_constants('manual')}\n    Which = {k}"
    assert MANIFEST.get("MappedInitPartition").expect == "pass"


@pytest.mark.parametrize("policy", ["idempotent", "reconcile"])
def test_each_initial_state_picked_once(tmp_path: Path, policy: str) -> None:
    result = _run(tmp_path, policy, 1, spec="PartitionSpec", invariant="PickedOnce")
    assert result.outcome is Outcome.PASS, result.output[-2000:]
    assert result.distinct_states == 4


def test_an_overlapping_pick_breaks_the_partition(tmp_path: Path) -> None:
    """Pick(3) without "nothing applied" also names the applied state."""
    (tmp_path / "MCMappedInitOverlap.tla").write_text(
        "---- MODULE MCMappedInitOverlap ----\nEXTENDS MCMappedInitReachable\n"
        "OverlapPick(k) == IF k = 3 THEN rec # NoRecord /\\ sent[1] = 1 ELSE Pick(k)\n"
        "OverlapOnce == Cardinality({k \\in 1..4 : OverlapPick(k)}) = 1\n====\n",
        encoding="utf-8")
    cfg = tmp_path / "Overlap.cfg"
    cfg.write_text(f"{_constants('manual')}\n    Which = 1\nSPECIFICATION PartitionSpec\n"
                   "INVARIANTS\n    OverlapOnce\n", encoding="utf-8")
    result = run_tlc("MCMappedInitOverlap", cfg, search_dirs=[*MANIFEST.search_dirs, tmp_path],
                     check_deadlock=False)
    assert result.outcome is Outcome.INVARIANT_VIOLATED, result.output[-2000:]
    assert result.violated == "OverlapOnce"


@pytest.mark.parametrize("which", [1, 2, 3, 4])
@pytest.mark.parametrize("policy", ["idempotent", "reconcile"])
def test_the_main_spec_reaches_each_mapped_initial_state(
        tmp_path: Path, policy: str, which: int) -> None:
    result = _run(tmp_path, policy, which)
    assert result.outcome is Outcome.INVARIANT_VIOLATED, result.output[-2000:]
    assert result.violated == WITNESS


@pytest.mark.parametrize(("which", "reached"), [(1, False), (2, False), (3, True)])
def test_without_the_crash_before_init_two_states_are_not_reached(
        tmp_path: Path, which: int, reached: bool) -> None:
    """The control: the mapping's first form (lost = 0) maps "no record yet"
    and "dispatched, nothing sent" to states the main spec never reaches (it
    needs a crash to leave a call there with no engine), and TLC, searching
    every state, says so."""
    result = _run(tmp_path, "manual", which, extra="    HInit <- HInitNoCrash\n")
    if reached:
        assert result.outcome is Outcome.INVARIANT_VIOLATED, result.output[-2000:]
        assert result.violated == WITNESS
    else:
        assert result.outcome is Outcome.PASS, result.output[-2000:]
        # the whole search, the figure docs/protocol.md gives
        assert result.distinct_states is not None
        assert f"all {result.distinct_states:,} states of the manual copy" in PROTOCOL
