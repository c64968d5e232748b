"""What the notebooks show is computed, readable and read from the repository as it is.

Under test: ``toolledger.notebook.support``: figures refused when their text would
render below 10 pt or when they have no alt text; spec excerpts cut at the right
place from the real spec and from hand-made text; the recovery table against
``decide_recovery``; the TLC cross-check of ``Decide`` on the real spec and on a
deliberately broken copy (which it must catch); the TLC summary table; the guard
that a manifest model's answer drifted.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from toolledger._core import protocol as p
from toolledger.check.manifest import Manifest, load_manifest
from toolledger.check.tlc import Outcome
from toolledger.notebook import support as ns

ROOT = Path(__file__).resolve().parent.parent
SPEC = (ROOT / "spec" / "DurableToolExecution.tla").read_text()


@pytest.fixture(autouse=True)
def _close_figures() -> None:
    plt.close("all")


# ----------------------------------------------------------------------------
# Figures


def figure(width_in: float, fontsize: float) -> matplotlib.figure.Figure:
    fig, ax = plt.subplots(figsize=(width_in, 3))
    ax.set_title("a title", fontsize=max(fontsize, 12) + 2)
    ax.text(0.5, 0.5, "the smallest text", fontsize=fontsize)
    ax.tick_params(labelsize=max(fontsize, 11) + 2)
    return fig


def test_a_figure_is_an_img_with_its_alt_text_at_most_the_page_width() -> None:
    out = ns.figure_html(figure(8, 10), 'one "quoted" <finding>')
    assert out.startswith('<img src="data:image/png;base64,')
    assert 'alt="one &quot;quoted&quot; &lt;finding&gt;"' in out
    assert "width:768px" in out  # 8 in at 96 px/in: shown at its natural size
    wide = ns.figure_html(figure(20, 22), "wide")
    assert f"width:{ns.PAGE_WIDTH_PX}px" in wide


def test_text_below_10_pt_at_the_shown_width_is_refused() -> None:
    with pytest.raises(ns.SmallTextError, match=r"'the smallest text' would render at 9\.0 pt"):
        ns.figure_html(figure(8, 9), "small")
    # 12 pt in a 20 in figure shrunk to the page width is 12 * 960 / 1920 = 6 pt.
    with pytest.raises(ns.SmallTextError, match=r"6\.0 pt"):
        ns.figure_html(figure(20, 12), "shrunk")
    size, text = ns.smallest_text(figure(20, 24))
    assert (size, text) == (12.0, "the smallest text")


def test_a_figure_without_alt_text_is_refused() -> None:
    with pytest.raises(ValueError, match="alt text"):
        ns.figure_html(figure(8, 10), "  ")


def test_show_figure_closes_the_figure() -> None:
    fig = figure(8, 10)
    shown = ns.show_figure(fig, "alt")
    assert shown._repr_html_().startswith("<img ")
    assert repr(shown) == "[figure: alt]"  # the text/plain copy is not a second image
    assert not plt.fignum_exists(fig.number)


# ----------------------------------------------------------------------------
# Spec excerpts

TOY = r"""---- MODULE Toy ----
VARIABLES
    x,   \* a counter
    y

(***************************************************************************)
(* Step: x grows.                                                          *)
(***************************************************************************)
Step == x' = x + 1 /\ UNCHANGED y

\* Other(n): y takes n.
Other(n) ==
    /\ y' = n
    /\ UNCHANGED x

\* comment that belongs to Next
Next == \/ Step
        \/ \E n \in 1..2 : Other(n)
====
"""


def test_definitions_are_cut_before_the_next_comment_and_definition() -> None:
    assert ns.definition_names(TOY) == ["Step", "Other", "Next"]
    assert ns.definition(TOY, "Other") == "Other(n) ==\n    /\\ y' = n\n    /\\ UNCHANGED x"
    assert ns.leading_comment(TOY, "Step") == "Step: x grows."
    assert ns.leading_comment(TOY, "Other") == "Other(n): y takes n."
    assert ns.next_actions(TOY) == ["Step", "Other"]
    assert ns.variables_block(TOY) == "VARIABLES\n    x,   \\* a counter\n    y"
    with pytest.raises(KeyError, match="Nope"):
        ns.definition(TOY, "Nope")


def test_the_real_spec_excerpts() -> None:
    decide = ns.definition(SPEC, "Decide")
    assert decide.startswith("Decide(") and "DecisionFor" not in decide
    actions = ns.next_actions(SPEC)
    body = SPEC.split("\nNext ==", 1)[1].split("\n\n", 1)[0]
    assert set(actions) == set(re.findall(r"\\/\s+(?:\\E [^:]+:\s*)?(\w+)", body))
    assert {"Crash", "Recover", "ProviderEmitCall"} <= set(actions)
    for inv in ("AtMostOnceEffect", "ApprovalGate", "LegacyConservative"):
        assert ns.leading_comment(SPEC, inv).startswith(f"{inv}:")
    block = ns.spec_excerpt_markdown(SPEC, ["Decide"], source="spec/x.tla")
    assert block.startswith("From `spec/x.tla` (`Decide`):\n\n```\nDecide(")
    assert "```tla" not in block  # nbconvert would print the tag inside the code


def test_invariants_of_reads_the_models_cfg() -> None:
    manifest = load_manifest(ROOT)
    invariants = ns.invariants_of(manifest.get("TwoCalls"))
    assert "AtMostOnceEffect" in invariants and "TypeOK" in invariants
    assert set(invariants) <= set(ns.definition_names(SPEC))


# ----------------------------------------------------------------------------
# The recovery table


def decide(status: p.LedgerStatus, policy: p.RecoveryPolicy, **kw: object) -> str:
    fields: dict[str, object] = {
        "status": status, "attempt": 1, "digest_matches": True,
        "approval": p.ApprovalState.APPROVED, "has_result": False, "policy": policy,
        "legacy": False, "requires_approval": True, "max_attempts": 2}
    fields.update(kw)
    return p.decide_recovery(p.RecoveryInputs(**fields)).decision.value  # type: ignore[arg-type]


def test_the_recovery_table_is_decide_recovery() -> None:
    table = {row[0]: row[1:] for row in ns.recovery_table(max_attempts=2)}
    policies = list(p.RecoveryPolicy)
    assert len(table) == len(ns.RECOVERY_ROWS) + 3
    for label, status, legacy, approval in ns.RECOVERY_ROWS:
        for pol, cell in zip(policies, table[label], strict=True):
            first = decide(status, pol, legacy=legacy, approval=approval,
                           attempt=0 if status is p.LedgerStatus.NONE else 1)
            assert cell.split("\n")[0] == first, (label, pol)
    dispatched = table["dispatched (outcome unknown)"]
    assert dispatched[policies.index(p.RecoveryPolicy.IDEMPOTENT)] == (
        "retry_same_id\n(at the last attempt: recovery_required)")
    assert set(table[ns.RESULT_ROW]) == {"skip"}
    # past the key's retention window an idempotent call halts: the key may be gone
    expired = table[ns.KEY_EXPIRED_ROW]
    assert expired[policies.index(p.RecoveryPolicy.IDEMPOTENT)] == "recovery_required"
    assert expired[policies.index(p.RecoveryPolicy.RECONCILE)] == "reconcile"
    html = ns.recovery_table_html()
    assert "<th" in html and "dispatched (outcome unknown)" in html
    tds = re.findall(r"<t[dh] style=\"([^\"]*)\"", html)
    assert tds and all("text-align:left" in style for style in tds)


def test_the_input_space_covers_every_status_policy_and_attempt() -> None:
    inputs = list(ns.recovery_inputs_space(max_attempts=2))
    assert len(inputs) == len(set(inputs))
    assert {i.status for i in inputs} == set(p.LedgerStatus)
    assert {i.policy for i in inputs} == set(p.RecoveryPolicy)
    assert {i.attempt for i in inputs if i.status is not p.LedgerStatus.NONE} == {1, 2}
    assert {i.key_retained for i in inputs if i.status is p.LedgerStatus.DISPATCHED} == {
        True, False}
    # 5 statuses with a record x 2 attempts x 2 digests x 2 (key retained or not),
    # plus "none", for each of 4 policies x 4 approvals x 2 x 2 x 2 flags
    assert len(inputs) == (5 * 2 * 2 * 2 + 1) * 4 * 4 * 8


@pytest.mark.slow
def test_decide_through_tlc_agrees_with_python_on_the_real_spec() -> None:
    with ns.TLCWorkspace(ROOT) as ws:
        compared = ns.compare_decide_with_spec(ws, max_attempts=2)
    assert compared.inputs == 41 * 4 * 4 * 8
    assert compared.disagreements == ()
    assert compared.run.result.outcome is Outcome.PASS


@pytest.mark.slow
def test_decide_through_tlc_catches_a_spec_whose_decide_differs(tmp_path: Path) -> None:
    # The broken variant: a spec whose reconcile policy retries blindly on "dispatched".
    (tmp_path / "spec").mkdir()
    broken = SPEC.replace('[] i.policy = "reconcile" -> "reconcile"',
                          '[] i.policy = "reconcile" -> "retry_same_id"')
    assert broken != SPEC
    (tmp_path / "spec" / "DurableToolExecution.tla").write_text(broken)
    with ns.TLCWorkspace(tmp_path) as ws:
        compared = ns.compare_decide_with_spec(ws, max_attempts=2)
        workdir = ws.dir
    assert not workdir.exists()  # the workspace cleans up after itself
    assert compared.disagreements
    assert {(i.status, i.policy, py, spec) for i, py, spec in compared.disagreements} == {
        (p.LedgerStatus.DISPATCHED, p.RecoveryPolicy.RECONCILE, "reconcile", "retry_same_id")}


# ----------------------------------------------------------------------------
# TLC runs


@pytest.mark.slow
def test_a_generated_one_call_model_and_its_summary() -> None:
    manifest = load_manifest(ROOT)
    invariants = ns.invariants_of(manifest.get("TwoCalls"))
    with ns.TLCWorkspace(ROOT) as ws:
        run = ws.model_check(ns.one_call_model("idempotent"), "OneIdempotent",
                             question="q?", invariants=invariants)
        with pytest.raises(ValueError, match="taken"):
            ws.model_check(ns.one_call_model("idempotent"), "OneIdempotent")
    assert run.result.outcome is Outcome.PASS and run.result.distinct_states
    html = ns.tlc_summary_html([run])
    assert f"{run.result.distinct_states:,}" in html and "no error" in html
    assert "/tmp" not in html and "TLC2 Version" not in html


@pytest.mark.slow
def test_run_manifest_model_refuses_an_answer_that_drifted(tmp_path: Path) -> None:
    manifest = load_manifest(ROOT)
    run = ns.run_manifest_model(manifest, "LegacyResume")
    assert run.result.violated == "AtMostOnceEffect" and run.result.trace
    assert run.verdict == "AtMostOnceEffect is violated"
    entry = manifest.get("LegacyResume")
    drifted = Manifest(manifest.root, tuple(
        dataclasses.replace(m, distinct_states=m.distinct_states + 1) if m is entry else m
        for m in manifest.models))
    with pytest.raises(AssertionError, match="distinct states, the manifest records"):
        ns.run_manifest_model(drifted, "LegacyResume")


def test_workspace_model_names_must_be_identifiers() -> None:
    ws = ns.TLCWorkspace(ROOT)
    try:
        with pytest.raises(ValueError, match="identifier"):
            ws.model_check(ns.one_call_model("manual"), "../escape")
    finally:
        ws.close()
    assert not ws.dir.exists()
    assert shutil.which("java") or True  # TLC is only needed by the slow tests


# ----------------------------------------------------------------------------
# The notebooks' evidence functions


@pytest.mark.slow
def test_the_issues_six_steps_are_found_in_tlcs_trace_and_a_wrong_trace_is_refused() -> None:
    manifest = load_manifest(ROOT)
    trace = ns.run_manifest_model(manifest, "LegacyResume").result.trace
    found = ns.find_issue_443_steps(trace)
    assert [text for text, _ in found] == list(ns.ISSUE_443_STEPS)
    indices = [step.index for _, step in found]
    assert indices == sorted(indices) and indices[-1] == trace[-1].index
    assert [step.action for _, step in found][:3] == ["HumanApprove", "ExternalApply", "Crash"]
    assert "TLC step" in ns.issue_443_steps_html(found)
    # The broken variant: the trace cut before the second delivery is not the reproduction.
    with pytest.raises(AssertionError, match="the second delivery"):
        ns.find_issue_443_steps(trace[:-1])
    with pytest.raises(AssertionError, match="no Crash"):
        ns.find_issue_443_steps([s for s in trace if s.action != "Crash"])


def test_the_matrix_summary_counts_every_cell_once() -> None:
    from toolledger.notebook.figures_matrix import run_matrix

    cells = run_matrix(policies=("manual", "readonly"))
    rows = ns.matrix_summary(cells)
    assert [r[1] for r in rows] == [16, 26, 16]
    assert sum(sum(int(v) for v in r[2:]) for r in rows) == len(cells)
    legacy, new, adopted = rows
    assert legacy[2] == 3 and new[2] == adopted[2] == 0  # duplicates: legacy manual only


def test_a_sqlite_world_survives_a_crash_and_its_tape_and_audit_render(tmp_path: Path) -> None:
    from toolledger.kit.engine import ScriptedHuman, SimulatedCrash
    from toolledger.kit.simulate import SESSION_ID

    world = ns.SqliteWorld(tmp_path, "w")
    with pytest.raises(RuntimeError, match="open_engine"):
        _ = world.store
    result = world.open_engine(human=ScriptedHuman(default="approve")).run("Email Ada.")
    assert result.status.value == "done" and world.system.effects() == 1
    table = ns.tape_table_html(world.tape)
    assert world.store.ledger_commits == 2  # two shaded rows of five cells each
    assert table.count("background:#fff3bf") == 5 * 2
    crashed = ns.SqliteWorld(tmp_path, "crashed")
    with pytest.raises(SimulatedCrash):
        crashed.open_engine(crash_at="after ExternalApply").run("Email Ada.")
    halted = crashed.open_engine().resume()  # a new process: the files only
    assert halted.status.value == "recovery_required" and crashed.system.effects() == 1
    rows = crashed.store.audit(SESSION_ID)
    html = ns.audit_table_html(rows, caption="c")
    assert "recovery_required" in html and ns.short_id(rows[0].execution_id) in html
    world.close()
    crashed.close()


@pytest.mark.slow
def test_every_state_of_a_tiny_model_is_drawn_once() -> None:
    manifest = load_manifest(ROOT)
    with ns.TLCWorkspace(ROOT) as ws:
        tiny = ns.every_state_of(ws, ns.manual_calls_model(1, 1, max_attempts=1), "Tiny",
                                 ns.invariants_of(manifest.get("TwoCalls")))
    assert len(tiny.status) == len(tiny.graph.states) == tiny.run.result.distinct_states
    assert tiny.figure._repr_html_().startswith("<img ")


@pytest.mark.slow
def test_a_broken_twin_is_located_and_its_fixed_twin_passes() -> None:
    manifest = load_manifest(ROOT)
    with ns.TLCWorkspace(ROOT) as ws:
        study = ns.study_broken_twin(manifest, ws, "UnfencedReconcile",
                                     ns.spec_at_most_once_effect, "fence_on_reconcile")
        with pytest.raises(ValueError, match="no design switch"):
            ns.study_broken_twin(manifest, ws, "UnfencedReconcile",
                                 ns.spec_at_most_once_effect, "fence")
    assert study.violating and study.nearest in study.violating
    assert len(study.path) == len(study.verdict.trace) and study.fixed_states > 0
    assert "AtMostOnceEffect holds in all of them" in study.describe()
    # The spec's condition and the Python invariant must agree: a check that sees nothing
    # (a broken variant of the condition) is refused.
    with ns.TLCWorkspace(ROOT) as ws, pytest.raises(AssertionError, match="Python invariant"):
        ns.study_broken_twin(manifest, ws, "UnfencedReconcile", lambda _cfg, _s: True,
                             "fence_on_reconcile")


def test_models_of_spec_tells_the_two_specs_models_apart() -> None:
    manifest = load_manifest(ROOT)
    ours = {m.name for m in ns.models_of_spec(manifest)}
    legacy = {m.name for m in ns.models_of_spec(manifest, "LegacyResume")}
    concurrent = {m.name for m in ns.models_of_spec(manifest, "ConcurrentResumers")}
    # the Decide tie instantiates both specs and extends neither
    tie = {m.name for m in manifest.models if m.module == "MCConcurrentDecideTie"}
    placement = {m.name for m in ns.models_of_spec(manifest, "ResponsePlacement")}
    # the placement table instantiates ResponsePlacement and extends it not
    table = {m.name for m in manifest.models if m.module == "MCPlacementTable"}
    assert "TwoCalls" in ours and "LegacyResume" in legacy
    assert "ConcurrentReconcile" in concurrent and "ConcurrentDecideTie" in tie
    assert "ResponsePlacement" in placement and "PlacementTable" in table
    groups = (ours, legacy, concurrent, tie, placement, table)
    assert sum(map(len, groups)) == len(set().union(*groups)) == len(manifest.names())


def test_the_matrix_claims_hold_and_each_refuses_a_matrix_that_breaks_it() -> None:
    from toolledger.notebook.figures_matrix import run_matrix

    cells = run_matrix()
    claims = (ns.legacy_engine_duplicates_where_the_result_is_not_checkpointed,
              ns.ledger_engine_never_applies_a_protected_call_twice,
              ns.an_unknown_outcome_is_decided_by_the_policy,
              ns.an_adopted_legacy_call_halts_without_a_second_effect,
              ns.the_ledger_engine_does_what_the_issue_expects_at_each_seed_row)
    for claim in claims:
        assert claim(cells)
    assert "1. " in ns.seed_rows_html(cells)
    # The broken variant: one ledger cell that applied its email twice, as a blind replay would.
    victim = ns.find_cell(cells, "ledger", "new", "manual", "after ExternalApply")
    broken = [dataclasses.replace(c, effects=2) if c is victim else c for c in cells]
    for claim in claims[1:3]:
        with pytest.raises(AssertionError):
            claim(broken)
    adopted = ns.find_cell(cells, "ledger", "legacy", "manual", "after ExternalApply")
    resent = [dataclasses.replace(c, effects=c.effects + 1) if c is adopted else c for c in cells]
    with pytest.raises(AssertionError):
        ns.an_adopted_legacy_call_halts_without_a_second_effect(resent)
    with pytest.raises(KeyError, match="0 cells"):
        ns.find_cell(cells, "ledger", "new", "manual", "after nothing")
