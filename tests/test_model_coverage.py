"""Every safety invariant can fail, and every one is about a situation that happens.

No TLC here: the spec and the manifest are read, and `toolledger check` (which
runs every ci model below and compares its outcome with the manifest) does
the model checking.  For each safety invariant of
``spec/DurableToolExecution.tla`` (the boxed definitions of its INVARIANTS
section, TypeOK excepted: it is the variables' type, not a protocol claim):

- a ci broken twin lists it in ``witnesses``: weakening the invariant until it
  no longer fails makes that twin's expected violation drift;
- a ci reachability probe lists it in ``antecedent_of``: a refactor that makes
  the situation unreachable makes the probe pass, which is a drift too.
"""

from __future__ import annotations

import re

from checker_support import ROOT
from toolledger.check.manifest import WITNESS_PREFIX, load_manifest

SPEC = (ROOT / "spec" / "DurableToolExecution.tla").read_text()
MANIFEST = load_manifest(ROOT)

# Invariants that cannot fail in the spec as it stands, and why.  Each entry
# must be removed once a twin exists (the test below insists).
NO_TWIN_YET = {
    "ExecutionIdStable": "the id is a function of constants (ExecId(c) = ExecId(c)); "
    "issue 11 item 4 models the position the engine reads as a variable",
    "ExecutionIdUnique": "a constant formula: TLC refuses a constant invariant that is "
    "FALSE instead of reporting a violation; issue 11 item 4 moves it to an ASSUME",
}


def safety_invariants(spec: str = SPEC) -> list[str]:
    """The invariants the spec defines, with a comment box, between its
    INVARIANTS and WITNESSES headers."""
    section = spec.split("(* INVARIANTS", 1)[1].split("(* WITNESSES", 1)[0]
    names = re.findall(r"^([A-Z]\w*) ==$", section, re.MULTILINE)
    return [n for n in names if re.search(rf"\(\* {n}[: ]", section)]


def test_the_spec_section_is_read() -> None:
    names = safety_invariants()
    assert {"AtMostOnceEffect", "AttemptSentOnce", "AuditRecomputable"} <= set(names)
    assert "Protected" not in names and not any(n.startswith(WITNESS_PREFIX) for n in names)


def test_every_safety_invariant_has_a_ci_twin() -> None:
    covered: dict[str, list[str]] = {}
    for m in MANIFEST.ci_models():
        for name in m.witnesses:
            covered.setdefault(name, []).append(m.name)
            assert m.expect in m.witnesses
    missing = [n for n in safety_invariants() if n not in covered]
    assert sorted(missing) == sorted(NO_TWIN_YET), (
        f"safety invariants without a ci twin that must violate them: "
        f"{sorted(set(missing) - set(NO_TWIN_YET))}; add one to model/manifest.toml with "
        f"witnesses = [...] (or remove {sorted(set(NO_TWIN_YET) - set(missing))} from "
        "NO_TWIN_YET: they have a twin now)"
    )


def test_every_safety_invariant_has_a_reached_antecedent() -> None:
    reached = {n for m in MANIFEST.ci_models() for n in m.antecedent_of}
    missing = [n for n in safety_invariants() if n not in reached]
    assert not missing, (
        f"no ci probe reaches the antecedent of {missing}: define a Witness_* "
        "(the negated antecedent) in the spec's WITNESSES section and add a probe"
    )


def test_every_witness_of_the_spec_is_probed_on_a_must_pass_model() -> None:
    defined = set(re.findall(rf"^({WITNESS_PREFIX}\w+) ==$", SPEC, re.MULTILINE))
    probes = {m.expect: m for m in MANIFEST.ci_models() if m.antecedent_of}
    assert defined == set(probes), defined ^ set(probes)
    passing = {m.module for m in MANIFEST.ci_models() if m.expect == "pass"}
    for m in probes.values():
        assert m.module in passing and m.expected_violation == m.expect


def test_a_weakened_section_is_noticed() -> None:
    """The check bites: a spec with an extra boxed invariant lacks its twin."""
    extra = "(* NewClaim: says something. *)\nNewClaim ==\n    TRUE\n\n(* WITNESSES"
    spec = SPEC.replace("(* WITNESSES", extra, 1)
    assert "NewClaim" in safety_invariants(spec)
    twins = {n for m in MANIFEST.ci_models() for n in m.witnesses}
    assert "NewClaim" not in twins


def test_manifest_names_are_the_specs_and_pythons() -> None:
    from toolledger.check.invariants import INVARIANTS

    named = {n for m in MANIFEST.models for n in (*m.witnesses, *m.antecedent_of)}
    assert named <= set(INVARIANTS), named - set(INVARIANTS)
    assert set(safety_invariants()) == set(INVARIANTS) - {"TypeOK"}
