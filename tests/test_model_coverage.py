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
from toolledger.check.invariants import PROPERTIES
from toolledger.check.manifest import WITNESS_PREFIX, ModelEntry, load_manifest

SPEC = (ROOT / "spec" / "DurableToolExecution.tla").read_text()
MANIFEST = load_manifest(ROOT)

# spec/ConcurrentResumers.tla is a spec of its own (two engine processes on
# one session); its models are checked against its own sections below, the
# others against DurableToolExecution.
CONCURRENT = (ROOT / "spec" / "ConcurrentResumers.tla").read_text()
CONCURRENT_MODULES = {"MCConcurrentResumers", "MCConcurrentDecideTie", "MCConcurrentLiveness",
                      "MCConcurrentRefinesMain"}
# Invariants of ConcurrentResumers no twin of that module violates, and why.
# Empty: every one has a twin there (the clause twins of model/clauses.toml
# gave NoBlindReplay and AuditComplete theirs).
CONCURRENT_NO_TWIN: dict[str, str] = {}


# spec/ResponsePlacement.tla is a spec of its own too (the ledger places the
# engine's responses); its models are checked against its sections below.
PLACEMENT = (ROOT / "spec" / "ResponsePlacement.tla").read_text()
PLACEMENT_MODULES = {"MCResponsePlacement", "MCPlacementTable"}


def main_models() -> list[ModelEntry]:
    return [m for m in MANIFEST.ci_models()
            if m.module not in CONCURRENT_MODULES | PLACEMENT_MODULES]


def placement_models() -> list[ModelEntry]:
    return [m for m in MANIFEST.ci_models() if m.module in PLACEMENT_MODULES]


def concurrent_models() -> list[ModelEntry]:
    return [m for m in MANIFEST.ci_models() if m.module in CONCURRENT_MODULES]

# Invariants that cannot fail in the spec as it stands, and why.  Each entry
# must be removed once a twin exists (the test below insists).  Empty: every
# safety invariant has a twin (ExecutionIdUnique is an ASSUME of the main spec,
# checked as an invariant by spec/ResponsePlacement.tla, below).
NO_TWIN_YET: dict[str, str] = {}


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
    for m in main_models():
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
    reached = {n for m in main_models() for n in m.antecedent_of}
    missing = [n for n in safety_invariants() if n not in reached]
    assert not missing, (
        f"no ci probe reaches the antecedent of {missing}: define a Witness_* "
        "(the negated antecedent) in the spec's WITNESSES section and add a probe"
    )


def test_every_witness_of_the_spec_is_probed_on_a_must_pass_model() -> None:
    defined = set(re.findall(rf"^({WITNESS_PREFIX}\w+) ==$", SPEC, re.MULTILINE))
    probes = {m.expect: m for m in main_models() if m.antecedent_of}
    assert defined == set(probes), defined ^ set(probes)
    passing = {m.module for m in main_models() if m.expect == "pass"}
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

    named = {
        n
        for m in MANIFEST.models
        if m.module not in CONCURRENT_MODULES | PLACEMENT_MODULES
        for n in (*m.witnesses, *m.antecedent_of)
    }
    assert named <= set(INVARIANTS), named - set(INVARIANTS)
    assert set(safety_invariants()) == set(INVARIANTS) - {"TypeOK"}


def test_concurrent_invariants_are_the_main_specs_plus_the_lease() -> None:
    """Same names, same meaning: every invariant ConcurrentResumers shares with
    the main spec is spelled as there; the two it adds are the lease's and the
    compare-and-set's."""
    names = set(safety_invariants(CONCURRENT))
    assert {"AtMostOnceEffect", "AttemptSentOnce", "ApprovalSingleUse",
            "NoReinvokeAfterKnownOutcome", "ResultFidelity", "RecoveryRequiredHalts"} <= names
    assert names - set(safety_invariants()) == {"StaleWorkerNeverCommits", "NoCommitOnStaleView"}


def test_every_concurrent_invariant_has_a_twin_and_a_reached_antecedent() -> None:
    names = safety_invariants(CONCURRENT)
    twins = {n for m in concurrent_models() for n in m.witnesses}
    reached = {n for m in concurrent_models() for n in m.antecedent_of}
    assert sorted(n for n in names if n not in twins) == sorted(CONCURRENT_NO_TWIN)
    assert not [n for n in names if n not in reached]
    for m in concurrent_models():
        assert set(m.witnesses) | set(m.antecedent_of) <= set(names)


def test_every_witness_of_the_concurrent_spec_is_probed_on_a_must_pass_model() -> None:
    defined = set(re.findall(rf"^({WITNESS_PREFIX}\w+) ==$", CONCURRENT, re.MULTILINE))
    probes = {m.expect: m for m in concurrent_models() if m.antecedent_of}
    assert defined == set(probes), defined ^ set(probes)
    passing = {m.module for m in concurrent_models() if m.expect == "pass"}
    for m in probes.values():
        assert m.module in passing and m.expected_violation == m.expect


def test_the_resume_without_cas_twin_is_in_ci() -> None:
    """The name fixed across the project: the twin whose writes are blind."""
    twin = {m.name: m for m in concurrent_models()}["ResumeWithoutCAS"]
    assert twin.expect == "AtMostOnceEffect" and twin.witnesses


def test_every_placement_invariant_has_a_twin_and_a_reached_antecedent() -> None:
    """spec/ResponsePlacement.tla: each invariant fails on a twin that violates it
    first, and each is about a situation a probe on the must-pass model reaches."""
    names = safety_invariants(PLACEMENT)
    assert set(names) == {"ExecutionIdUnique", "NoAlias", "NoDuplicateDispatch",
                          "PlacementTotal", "SequenceMonotone"}
    twins = {n for m in placement_models() for n in m.witnesses}
    reached = {n for m in placement_models() for n in m.antecedent_of}
    assert [n for n in names if n not in twins] == []
    assert [n for n in names if n not in reached] == []
    for m in placement_models():
        assert set(m.witnesses) | set(m.antecedent_of) <= set(names)
        if m.witnesses:
            assert m.expect in m.witnesses


def test_every_witness_of_the_placement_spec_is_probed_on_a_must_pass_model() -> None:
    defined = set(re.findall(rf"^({WITNESS_PREFIX}\w+) ==$", PLACEMENT, re.MULTILINE))
    probes = {m.expect: m for m in placement_models() if m.antecedent_of}
    assert defined == set(probes), defined ^ set(probes)
    passing = {m.module for m in placement_models() if m.expect == "pass"}
    for m in probes.values():
        assert m.module in passing and m.expected_violation == m.expect


def test_execution_id_unique_is_checked_not_assumed() -> None:
    """The main spec's ASSUME ExecutionIdUnique is discharged by ResponsePlacement:
    there it is a state invariant of the must-pass models (LostTwoResponses: also
    when one crash loses two responses), and three twins break it."""
    assert re.search(r"^ASSUME KeyByPosition => ExecutionIdUnique", SPEC, re.MULTILINE)
    must_pass = [m for m in placement_models() if m.name == "ResponsePlacement"]
    assert must_pass and must_pass[0].expect == "pass"
    assert "ExecutionIdUnique" in must_pass[0].cfg_path.read_text()
    lost_two = [m for m in placement_models() if m.name == "LostTwoResponses"]
    assert lost_two and lost_two[0].expect == "pass"
    assert "ExecutionIdUnique" in lost_two[0].cfg_path.read_text()
    twins = [m.name for m in placement_models() if m.witnesses == ("ExecutionIdUnique",)]
    assert sorted(twins) == ["FirstKeyByProviderId", "KeyByListIndex", "KeyByProviderId",
                             "PlaceAgainstLatestOnly"]


# --- clause-level twins (model/clauses.toml, toolledger.check.clauses) -------

from toolledger.check.clauses import (  # noqa: E402
    ClauseEntry,
    bounds,
    clauses,
    load_clauses,
    weakened_text,
)
from toolledger.check.tlc import parse_cfg  # noqa: E402

CLAUSES = load_clauses(ROOT)
LEGACY = (ROOT / "spec" / "LegacyResume.tla").read_text()
# (spec module, its text, the operators whose every clause needs a twin).
CLAUSE_SCOPE = (
    ("DurableToolExecution", SPEC, (*safety_invariants(), *PROPERTIES)),
    ("LegacyResume", LEGACY, ("AtMostOnceEffect",)),
    ("ResponsePlacement", PLACEMENT, tuple(safety_invariants(PLACEMENT))),
    ("ConcurrentResumers", CONCURRENT, tuple(safety_invariants(CONCURRENT))),
)


def undeclared_clauses(spec_name: str, spec: str, operators: tuple[str, ...],
                       entries: tuple[ClauseEntry, ...]) -> list[str]:
    """Clauses of ``operators`` in ``spec`` with no entry (a twin or a reason)."""
    declared = {(e.operator, " ".join(e.clause.split()), e.occurrence)
                for e in entries if e.spec == spec_name}
    return [f"{op}: {c.text}" + (f" (occurrence {c.occurrence})" if c.occurrence > 1 else "")
            for op in operators for c in clauses(spec, op)
            if (op, c.text, c.occurrence) not in declared]


# Each bound of a safety invariant (toolledger.check.clauses.bounds) gets both
# narrowings an off-by-one of a loop over its domain makes: "rest" (every
# value but the first) and "first" (the first value alone).
NARROWINGS = ("rest", "first")


def undeclared_bounds(spec_name: str, spec: str, operators: tuple[str, ...],
                      entries: tuple[ClauseEntry, ...]) -> list[str]:
    """Narrowings of the bounds of ``operators`` in ``spec`` with no entry."""
    declared = {(e.operator, " ".join(e.clause.split()), e.occurrence, e.weakened or "rest")
                for e in entries if e.spec == spec_name and e.kind == "bound"}
    return [f"{op}: {b.text} -> {w}" for op in operators for b in bounds(spec, op)
            for w in NARROWINGS if (op, b.text, b.occurrence, w) not in declared]


def test_every_bound_of_every_invariant_has_both_narrowings() -> None:
    missing = [m for name, spec, ops in CLAUSE_SCOPE
               for m in undeclared_bounds(name, spec, tuple(o for o in ops
                                                            if o not in PROPERTIES), CLAUSES)]
    assert missing == [], (
        f"quantifier bounds without an entry in model/clauses.toml: {missing}; add a "
        '[[clause]] with kind = "bound" and weakened = "rest" or "first", naming the ci twin '
        "whose violations lie only in what the narrowing drops, or the reason none can")


def test_the_bound_reader_finds_every_descended_quantifier() -> None:
    assert [b.text for b in bounds(SPEC, "NoBlindReplay")] == [
        "c \\in Calls", "i \\in invocations[c]"]
    assert [b.text for b in bounds(SPEC, "AuditComplete")] == [
        "c \\in Calls", "i \\in invocations[c]", "d \\in decided[c]"]
    assert [b.text for b in bounds(CONCURRENT, "RecoveryRequiredHalts")] == ["p \\in Procs"]
    assert bounds(CONCURRENT, "AtMostOnceEffect") == []
    _, rest = weakened_text(SPEC, ClauseEntry("DurableToolExecution", "AttemptSentOnce",
                                              "n \\in 1..MaxAttempts", kind="bound"))
    assert "\\A n \\in (LET TLDomain == (1..MaxAttempts) IN" in rest
    assert "TLDomain \\ {CHOOSE TLValue \\in TLDomain : TRUE}" in rest
    _, first = weakened_text(SPEC, ClauseEntry("DurableToolExecution", "AttemptSentOnce",
                                               "n \\in 1..MaxAttempts", weakened="first",
                                               kind="bound"))
    assert "ELSE {CHOOSE TLValue \\in TLDomain : TRUE})" in first
    spec = SPEC.replace("\\A n \\in 1..MaxAttempts : sent[c][n] <= 1",
                        "\\A n \\in 1..MaxAttempts : \\A m \\in 1..n : sent[c][m] <= 1", 1)
    assert spec != SPEC  # a new quantifier is noticed
    before = set(undeclared_bounds("DurableToolExecution", SPEC, ("AttemptSentOnce",), CLAUSES))
    after = undeclared_bounds("DurableToolExecution", spec, ("AttemptSentOnce",), CLAUSES)
    assert [m for m in after if m not in before] == [
        "AttemptSentOnce: m \\in 1..n -> rest", "AttemptSentOnce: m \\in 1..n -> first"]


def test_the_clause_reader_splits_junctions_implications_and_quantifiers() -> None:
    got = [(c.text, c.positive) for c in clauses(SPEC, "NoBlindReplay")]
    assert got == [("i[2] > 1", False), ('i[3] = "human"', True), ('i[3] = "policy"', True),
                   ('Policy[c] = "idempotent"', True), ('i[3] = "policy"', True),
                   ('Policy[c] = "reconcile"', True), ("fenced[i[1]] >= i[2] - 1", True)]
    legacy = [c.text for c in clauses(SPEC, "LegacyConservative")]
    assert legacy == ["Protected(c)", 'i[3] = "human"', 'i[3] = "policy"',
                      'row[1] = "human_retry"', "row[2] < i[2]"]
    # a parenthesised antecedent with a continuation line, after a LET
    bound = [(c.text, c.positive) for c in clauses(SPEC, "ApprovalBoundToArgs")]
    assert [p for _, p in bound] == [False, False, False, True]
    _, weak = weakened_text(SPEC, ClauseEntry("DurableToolExecution", "NoBlindReplay",
                                              "fenced[i[1]] >= i[2] - 1"))
    assert 'Policy[c] = "reconcile" /\\ (TRUE)' in weak and "fenced" not in weak
    _, vacuous = weakened_text(SPEC, ClauseEntry("DurableToolExecution", "NoBlindReplay",
                                                 "i[2] > 1"))
    assert "(FALSE) =>" in vacuous


def test_every_clause_of_every_invariant_has_a_twin_or_a_reason() -> None:
    missing = [m for name, spec, ops in CLAUSE_SCOPE
               for m in undeclared_clauses(name, spec, ops, CLAUSES)]
    assert missing == [], (
        f"clauses without an entry in model/clauses.toml: {missing}; add a [[clause]] "
        "naming the ci twin that violates the invariant only through it (check it with "
        "`python -m toolledger.check.clauses`), or the reason none can"
    )
    scoped = {(name, op) for name, _, ops in CLAUSE_SCOPE for op in ops}
    stray = [e.label for e in CLAUSES if e.kind != "guard" and (e.spec, e.operator) not in scoped]
    assert stray == []


# The clauses still waiting for a twin (reason = 'open: ...'): a ratchet.  A
# new entry may not be left open, and a closed one (a twin built, or the reason
# none can be written) leaves this list; when it is empty, no reason may be open.
OPEN_CLAUSES: set[tuple[str, str, str]] = set()


def test_open_clauses_are_only_the_known_ones() -> None:
    open_ = {(e.operator, " ".join(e.clause.split()), e.weakened or "rest")
             for e in CLAUSES if not e.twin and e.reason.startswith("open:")}
    assert open_ == OPEN_CLAUSES, (
        f"entries of model/clauses.toml with an 'open:' reason: {sorted(open_)}; expected "
        f"{sorted(OPEN_CLAUSES)}: build the twin, or say why none can (no 'open:')")


def test_every_clause_twin_is_a_ci_row_that_fails_that_invariant() -> None:
    for e in CLAUSES:
        if not e.twin:
            assert len(e.reason) > 20, e.label
            continue
        row = MANIFEST.get(e.twin)
        assert row.ci, f"{e.label}: twin {e.twin} must be a ci row (make check runs it)"
        if e.kind == "guard":
            continue  # any drift of its row kills a deleted guard
        assert row.expect == e.operator, f"{e.label}: {e.twin} must expect {e.operator}"
        info = parse_cfg(row.cfg_path)
        checked = info.properties if e.kind == "property" else info.invariants
        # other invariants the cfg checks do no harm: with the clause deleted
        # the row passes or violates another one, a drift either way
        assert e.operator in checked, f"{e.label}: model/{row.cfg} must check {e.operator}"


def test_the_issue_28_survivors_have_killers() -> None:
    """The weakened invariants issue 28 found surviving each have a twin."""
    by = {(e.operator, e.clause, e.weakened): e.twin for e in CLAUSES}
    assert by[("NoBlindReplay", "fenced[i[1]] >= i[2] - 1", "")] == "UnfencedRetry"
    assert by[("EventuallySettled", "<>[]Settled(c)", "<>Settled(c)")] == "RepollForever"
    assert by[("LegacyConservative", 'row[1] = "human_retry"', "")] == "LegacyRetried"
    assert by[("AuditComplete", "d \\in audit[ExecId(c)]",
               'd[1] = "recovery_required" \\/ d \\in audit[ExecId(c)]')] == "AuditSkipsHalts"
    assert by[("ExternalApply", "~Fenced(e, n)", "")] == "OneReconcile"


def test_a_new_clause_is_noticed() -> None:
    """The check bites: a conjunct added to an invariant has no entry."""
    spec = SPEC.replace("        /\\ sentAfterOutcome[c] = 0\n",
                        "        /\\ sentAfterOutcome[c] = 0\n        /\\ crashes >= 0\n", 1)
    assert spec != SPEC
    assert undeclared_clauses("DurableToolExecution", spec, ("NoReinvokeAfterKnownOutcome",),
                              CLAUSES) == ["NoReinvokeAfterKnownOutcome: crashes >= 0"]
    assert undeclared_clauses("DurableToolExecution", SPEC, ("NoReinvokeAfterKnownOutcome",),
                              CLAUSES) == []


def test_the_models_page_counts_the_clause_table() -> None:
    """docs/models.md's counts of model/clauses.toml are the file's."""
    text = " ".join((ROOT / "docs" / "models.md").read_text(encoding="utf-8").split())
    m = re.search(r"\((\d+) clause entries, (\d+) of them bound narrowings, below: (\d+) "
                  r"killed by their twins, with TLC or by shape, (\d+) with the reason", text)
    assert m, "docs/models.md no longer counts the clause table"
    counts = tuple(int(g) for g in m.groups())
    assert counts == (len(CLAUSES), sum(e.kind == "bound" for e in CLAUSES),
                      sum(bool(e.twin) for e in CLAUSES), sum(not e.twin for e in CLAUSES))
