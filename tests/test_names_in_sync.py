"""Spec, Python and docs use the same names: read them from the .cfg files."""

from __future__ import annotations

import re

from checker_support import ROOT
from toolledger._core import protocol as p
from toolledger.check.invariants import INVARIANTS, PROPERTIES
from toolledger.check.manifest import WITNESS_PREFIX, load_manifest


def _names(section: str, text: str) -> set[str]:
    m = re.search(rf"^{section}S?\b(.*?)(?=^[A-Z]+\b|\Z)", text, re.MULTILINE | re.DOTALL)
    return set(re.findall(r"\b[A-Z]\w+\b", m.group(1))) if m else set()


# The models of spec/ConcurrentResumers.tla (two engine processes) check that
# spec's invariants, which the single-engine Python checkers do not carry.
CONCURRENT_MODULES = {"MCConcurrentResumers", "MCConcurrentDecideTie", "MCConcurrentLiveness"}
# Those of spec/ResponsePlacement.tla (the ledger places responses) check its own.
PLACEMENT_MODULES = {"MCResponsePlacement", "MCPlacementTable"}
# The refinement mapping of the concurrent spec to the main one checks its own
# step property and the concurrent spec's invariants (test below).
REFINEMENT_MODULES = {"MCConcurrentRefinesMain"}
# The refinement's initial states: the main spec runs beside a fixed mapped state.
INIT_MODULES = {"MCMappedInitReachable"}


def test_python_invariants_are_exactly_the_specs() -> None:
    invariants: set[str] = set()
    properties: set[str] = set()
    cfgs = sorted((ROOT / "model").glob("*.cfg"))
    models = load_manifest(ROOT).models
    assert {c.name for c in cfgs} == {m.cfg for m in models}
    concurrent = {m.cfg for m in models
                  if m.module in CONCURRENT_MODULES | PLACEMENT_MODULES | REFINEMENT_MODULES
                  | INIT_MODULES}
    for cfg in cfgs:
        if cfg.name in concurrent:
            continue
        text = cfg.read_text()
        invariants |= _names("INVARIANT", text)
        properties |= _names("PROPERT(?:Y|IE)", text)
    # Witnesses (negated reachability probes) are not invariants of the protocol:
    # each is the expected violation of a model; the Witness_* probes are the
    # spec's own (checked below), the others are defined in their MC module.
    witnesses = {n for n in invariants if n.startswith("Witness")}
    expected = {m.expect for m in load_manifest(ROOT).models}
    assert witnesses <= expected, witnesses - expected
    invariants -= witnesses
    # A lemma of the fairness formulation, not of the protocol: the guards
    # Liveness.cfg's FairSpecByGuards uses equal the ENABLEDs of FairSpec
    # (tests/test_fairness_guards.py); it says nothing about a state's safety.
    lemmas = {"FairnessGuardsExact"}
    assert lemmas <= invariants, lemmas - invariants
    invariants -= lemmas
    assert invariants == set(INVARIANTS), invariants ^ set(INVARIANTS)
    spec = (ROOT / "spec" / "DurableToolExecution.tla").read_text()
    for name in sorted(n for n in witnesses if n.startswith(WITNESS_PREFIX)):
        assert re.search(rf"^{name} ==", spec, re.MULTILINE), f"{name} is not defined in the spec"
    assert properties == set(PROPERTIES)


# ConcurrentResumers' own invariants: the lease's and the compare-and-set's.
CONCURRENT_OWN = {"StaleWorkerNeverCommits", "NoCommitOnStaleView"}


def test_the_concurrent_models_check_the_concurrent_specs_names() -> None:
    """Their invariants are ConcurrentResumers' (its shared ones spelled as the
    main spec's), its witnesses, or the Decide tie."""
    spec = (ROOT / "spec" / "ConcurrentResumers.tla").read_text()
    models = [m for m in load_manifest(ROOT).models if m.module in CONCURRENT_MODULES]
    assert len(models) >= 10
    for m in models:
        for name in _names("INVARIANT", m.cfg_path.read_text()):
            if name == "DecideAgrees":
                assert m.module == "MCConcurrentDecideTie"
                continue
            assert re.search(rf"^{name} ==", spec, re.MULTILINE), f"{m.cfg}: {name}"
            if name != "TypeOK" and not name.startswith(WITNESS_PREFIX):
                assert re.search(rf"\(\* {name}[: ]", spec), f"{name} has no comment box"
                assert name in INVARIANTS or name in CONCURRENT_OWN, name
        # its properties are the main spec's, restated for the one call
        for name in _names("PROPERT(?:Y|IE)", m.cfg_path.read_text()):
            assert re.search(rf"^{name} ==", spec, re.MULTILINE), f"{m.cfg}: {name}"
            assert re.search(rf"\(\* {name}[: ]", spec), f"{name} has no comment box"
            assert name in PROPERTIES, name


def test_the_placement_models_check_the_placement_specs_names() -> None:
    """Their invariants are ResponsePlacement's, each with a comment box, and
    docs/protocol.md names each (the table model's own check excepted)."""
    spec = (ROOT / "spec" / "ResponsePlacement.tla").read_text()
    protocol = (ROOT / "docs" / "protocol.md").read_text()
    models = [m for m in load_manifest(ROOT).models if m.module in PLACEMENT_MODULES]
    assert len(models) >= 10
    for m in models:
        for name in _names("INVARIANT", m.cfg_path.read_text()):
            if name == "PlacementTotalOnInputs":
                assert m.module == "MCPlacementTable"
                continue
            assert re.search(rf"^{name} ==", spec, re.MULTILINE), f"{m.cfg}: {name}"
            if name != "TypeOK" and not name.startswith(WITNESS_PREFIX):
                assert re.search(rf"\(\* {name}[: ]", spec), f"{name} has no comment box"
                assert f"`{name}`" in protocol, f"docs/protocol.md does not name {name}"


def test_every_invariant_is_defined_in_the_spec_with_a_comment_box() -> None:
    spec = (ROOT / "spec" / "DurableToolExecution.tla").read_text()
    for name in [*INVARIANTS, *PROPERTIES]:
        assert re.search(rf"^{name} ==", spec, re.MULTILINE), name
        if name != "TypeOK":
            assert re.search(rf"\(\* {name}[: ]", spec), f"{name} has no comment box"


def test_the_protocol_summary_and_protocol_use_the_same_names() -> None:
    """docs/models.md's "The protocol in short" (the README links it) names them all."""
    summary = (ROOT / "docs" / "models.md").read_text()
    for name in INVARIANTS:
        assert name in summary, f"docs/models.md does not mention {name}"
    for action in (p.Action.EnginePersistDispatched, p.Action.Recover, p.Action.Crash):
        assert action.value in summary


def test_the_refinement_models_check_the_mapping_and_the_concurrent_names() -> None:
    """Their property is the mapping's step relation, defined with its comment in
    the mapping module; their invariants the mapped TypeOK or the concurrent spec's."""
    module = (ROOT / "model" / "MCConcurrentRefinesMain.tla").read_text()
    spec = (ROOT / "spec" / "ConcurrentResumers.tla").read_text()
    models = [m for m in load_manifest(ROOT).models if m.module in REFINEMENT_MODULES]
    assert {m.expect for m in models} >= {"pass", "StepsRefine"}
    for m in models:
        text = m.cfg_path.read_text()
        assert _names("PROPERT(?:Y|IE)", text) <= {"StepsRefine"}, m.cfg
        for name in _names("INVARIANT", text) - {"MappedTypeOK"}:
            if name.startswith("Mapped"):  # a main-spec invariant on the mapped state
                main = re.search(rf"^{name} == Main!(\w+)$", module, re.MULTILINE)
                assert main is None or main.group(1) == name.removeprefix("Mapped"), name
                assert re.search(rf"^{name} ==", module, re.MULTILINE), f"{m.cfg}: {name}"
            else:
                assert re.search(rf"^{name} ==", spec, re.MULTILINE), f"{m.cfg}: {name}"
    # the lease models check every main-spec safety invariant on the mapped state but
    # the two the module's comment names (rows without inputs; the zombie's send)
    main_invariants = set(_names("INVARIANT", (ROOT / "model" / "TwoCalls.cfg").read_text()))
    for name in ("RefinesManual", "RefinesIdempotent", "RefinesReconcile"):
        mapped = {n.removeprefix("Mapped") for n in
                  _names("INVARIANT", load_manifest(ROOT).get(name).cfg_path.read_text())}
        assert mapped >= main_invariants - {"NoReinvokeAfterKnownOutcome"}, name
        assert "NoReinvokeStage" in mapped, name
    zombie = load_manifest(ROOT).get("RefinesZombieAfterOutcome")
    assert zombie.expect == "MappedNoReinvokeAfterKnownOutcome"
    for name in ("StepsRefine", "MappedTypeOK"):
        assert re.search(rf"^{name} ==", module, re.MULTILINE), name
        assert re.search(rf"\(\* {name}[: ]", module), f"{name} has no comment box"


def test_the_initial_state_models_check_their_modules_names() -> None:
    """Their invariants are the partition's and the witness's, each defined in
    model/MCMappedInitReachable.tla with its comment box."""
    module = (ROOT / "model" / "MCMappedInitReachable.tla").read_text()
    models = [m for m in load_manifest(ROOT).models if m.module in INIT_MODULES]
    assert {m.expect for m in models} == {"pass", "Witness_MappedInitReachable"}
    for m in models:
        for name in _names("INVARIANT", m.cfg_path.read_text()):
            assert name in {"PickedOnce", "Witness_MappedInitReachable"}, f"{m.cfg}: {name}"
            assert re.search(rf"^{name} ==", module, re.MULTILINE), f"{m.cfg}: {name}"
            assert re.search(rf"\(\* {name}[: ]", module), f"{name} has no comment box"
