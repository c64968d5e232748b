"""The notebooks' evidence functions measure what their names say.

Under test: ``toolledger.notebook.evidence``.  Each function is run on a small
input whose figures are known, and, where it checks something, on a
deliberately broken variant it must report (a cell whose counts were tampered
with, a trace with a step cut out, ...).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from toolledger._core import protocol as p
from toolledger._core.tools import ToolRegistry
from toolledger.check.manifest import load_manifest
from toolledger.check.stategraph import StateGraph
from toolledger.kit.simulate import ARGUMENTS, run_simulation
from toolledger.notebook import evidence as ev
from toolledger.notebook import support as ns
from toolledger.notebook.figures_matrix import SpecRun, run_cell

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- notebook 03


def test_ledger_runs_map_to_the_model_and_a_tampered_count_is_reported() -> None:
    reconcile = run_cell("ledger", "new", "reconcile", "after EngineInvokeAdapter")
    answered = run_cell("ledger", "legacy", "manual", "after EngineCheckpoint")
    legacy = run_cell("legacy", "new", "manual", "after ExternalApply")  # not a ledger cell
    runs = ev.every_ledger_run_is_a_run_of_the_model([legacy, reconcile, answered])
    assert [c for c, _ in runs.mapped] == [reconcile]
    assert [c for c, _ in runs.unmapped] == [answered]
    assert runs.unmapped_rows()[0][0] == answered.label and runs.unmapped_rows()[0][1]
    assert runs.invariant_breaks == () and runs.count_mismatches == ()
    assert runs.states == len(runs.mapped[0][1].steps) > 2

    # The kit claims one more effect than the model applied: reported, by label.
    tampered = dataclasses.replace(reconcile, effects=reconcile.effects + 1)
    assert ev.every_ledger_run_is_a_run_of_the_model([tampered]).count_mismatches == (
        tampered.label,)


@pytest.mark.slow
def test_tlc_accepts_a_mapped_run_and_refuses_one_with_a_step_cut_out() -> None:
    cell = run_cell("ledger", "new", "idempotent", "after ExternalApply")
    (mapped,) = ev.every_ledger_run_is_a_run_of_the_model([cell]).mapped
    good = ev.tlc_accepts_every_mapped_run_as_a_behaviour_of_the_spec(ROOT, [mapped])
    assert good.refused == [] and good.traces == 1 and len(good.rows()) == 1
    assert good.rows()[0][:3] == ["idempotent", 0, 1]

    _, run = mapped
    cut = SpecRun(run.config, run.steps[:2] + run.steps[3:])   # a state jumps a step
    bad = ev.tlc_accepts_every_mapped_run_as_a_behaviour_of_the_spec(ROOT, [(cell, cut)])
    assert [key for key, _ in bad.refused] == [("idempotent", 0)]


# --------------------------------------------------------------------------- notebook 05


def test_a_crash_after_the_email_halts_and_a_crash_after_the_record_does_not(
        tmp_path: Path) -> None:
    halted = ev.a_crash_after_the_email_went_out_is_resumed_from_the_files_only(tmp_path, "a")
    assert "after ExternalApply" in halted.crash
    assert halted.result.status.value == "recovery_required"
    assert (halted.world.system.effects(), halted.world.system.invocations()) == (1, 1)
    assert [row[1] for row in halted.item_rows()] == ["send_email"]
    assert len(halted.item_rows()[0]) == len(ev.ITEM_HEADERS)
    halted.world.close()

    # Once succeeded is durable the outcome is known: nothing halts, nothing is re-sent.
    known = ev.a_crash_after_the_email_went_out_is_resumed_from_the_files_only(
        tmp_path, "b", crash_at="after EngineRecordSucceeded")
    assert known.result.status.value == "done" and known.items == []
    assert known.world.system.effects() == 1
    known.world.close()


def test_a_human_resolution_is_measured_from_the_store(tmp_path: Path) -> None:
    retry = ev.a_human_resolves_the_halted_call(tmp_path, "retry")
    assert (retry.turn, retry.effects, retry.invocations) == ("done", 2, 2)
    assert (retry.record.attempt, retry.record.authorization.value) == (2, "human")
    # the opening's decision, the grant, Recover honouring it, the dispatch
    assert [r.kind for r in retry.new_rows] == [
        "recovery_required", "human_retry", "recovery_required", "dispatch"]
    assert len(retry.row()) == len(ev.RESOLUTION_HEADERS)
    abandon = ev.a_human_resolves_the_halted_call(tmp_path, "abandon")
    assert (abandon.tool_message["status"], abandon.invocations) == ("abandoned", 1)


def test_a_reused_call_id_gets_its_own_execution_id_and_approval(tmp_path: Path) -> None:
    from toolledger.kit.engine import ScriptedHuman

    turn = ns.SqliteWorld(tmp_path, "turn")
    turn.open_engine(human=ScriptedHuman(default="approve")).run(ev.EMAIL_ADA)
    reuse = ev.a_reused_call_id_on_the_next_turn_asks_the_human_again(turn)
    first, second = reuse.calls
    assert first.tool_call_id == second.tool_call_id == "call_0"
    assert first.execution_id != second.execution_id
    assert reuse.ledger_asked == ((second.position, "bob@example.com"),)
    assert reuse.working_set == (second.position,) and (reuse.status, reuse.effects) == ("done", 2)
    assert len(reuse.legacy_asked) == 1 and reuse.legacy_effects == 2 and reuse.legacy_reuse_log
    assert "bob@example.com" in reuse.describe() and len(reuse.call_rows()) == 2
    turn.close()


# --------------------------------------------------------------------------- notebook 06


@pytest.mark.slow
def test_the_one_call_models_answer_and_a_cut_lasso_is_not_a_stutter(tmp_path: Path) -> None:
    manifest = load_manifest(ROOT)
    workspace = ns.TLCWorkspace(ROOT)
    try:
        runs = ev.tlc_checks_the_models_behind_the_five_answers(
            manifest, workspace, manifest_models=("SuccessOnlyRecord",))
    finally:
        workspace.close()
    assert list(runs) == ["SuccessOnlyRecord", *ev.ONE_CALL_QUESTIONS]
    assert [r.verdict.split(":")[0] for r in runs.values()] == [
        "AtMostOnceEffect is violated", "no error", "no error", "EventuallySettled is violated"]
    unfair = runs["OneManualCallNoHuman"].result
    stuck = ev.where_the_behaviour_stutters(unfair)
    assert stuck.last_action == "Stuttering" and "pending" in stuck.approvals
    assert "pending" in stuck.describe()
    # The same counterexample without its stuttering step does not end in a stutter.
    cut = dataclasses.replace(unfair, trace=unfair.trace[:-1])
    assert ev.where_the_behaviour_stutters(cut).last_action != "Stuttering"


def test_without_the_record_every_one_of_rows_1_to_4_needs_a_human() -> None:
    reviews = ev.without_the_record_never_replay_needs_a_human_at_every_row()
    assert (reviews.reviews_with_record, reviews.reviews_without_record) == (2, 4)
    assert [row[0] for row in reviews.rows()] == [1, 2, 3, 4]
    assert reviews.rows()[0][2] == "recovery_required, effects 0"   # nothing was sent


def test_the_policy_crash_rows_and_where_each_policy_halts() -> None:
    idempotent = run_simulation("ledger", "idempotent", "after ExternalApply")
    (row,) = ev.policy_crash_rows([idempotent])
    assert row[:5] == ["idempotent", "retry_same_id", "done", 2, 1]
    assert str(row[5]).count("…") == 2
    halts = ev.crash_points_where_each_policy_halts_for_a_human(("manual", "idempotent"))
    assert "after ExternalApply" in halts["manual"] and len(halts["manual"]) == 3
    assert halts["idempotent"] == []


def test_the_policy_decides_and_a_spent_retry_budget_changes_the_decision() -> None:
    assert ev.the_policy_decides_an_unknown_outcome() == {
        "readonly": "execute", "manual": "recovery_required", "idempotent": "retry_same_id",
        "reconcile": "reconcile"}
    assert ev.the_policy_decides_an_unknown_outcome(max_attempts=1)["idempotent"] != (
        "retry_same_id")


def test_the_registry_check_reports_a_registry_that_accepts_anything() -> None:
    real = ev.the_registry_checks_each_tools_policy()
    assert real.default_policy is p.RecoveryPolicy.MANUAL and real.names == ["send_email"]
    assert all(real.refused.values()) and "at_most_once" in str(real.refused["send_sms"])

    class Permissive(ToolRegistry):      # broken: ignores the declared policy
        def register(self, name: str, adapter: Any, **_: Any) -> p.ToolProfile:
            return super().register(name, adapter)

    lax = ev.the_registry_checks_each_tools_policy(Permissive())
    assert lax.refused == {"send_sms": None, "create_ticket": None} and len(lax.names) == 3


def test_a_model_supplied_key_is_refused_and_plain_arguments_are_not() -> None:
    key = ev.a_key_in_the_models_arguments_is_refused_before_anything_is_recorded()
    assert key.refusal and (key.calls_recorded, key.invocations) == (0, 0)
    plain = ev.a_key_in_the_models_arguments_is_refused_before_anything_is_recorded(ARGUMENTS)
    assert plain.refusal is None and (plain.calls_recorded, plain.invocations) == (1, 1)


def test_a_halted_call_stays_halted_and_one_halted_before_sending_has_no_effect() -> None:
    halt = ev.a_halted_call_stays_halted_across_restarts(restarts=3)
    assert [(r.status, len(r.items), r.invocations) for r in halt.restarts] == [
        ("recovery_required", 1, 1)] * 3
    assert halt.new_turn_refusal and (halt.answered, halt.effects) == ("done", 1)
    assert "restart 3" in halt.describe()
    before = ev.a_halted_call_stays_halted_across_restarts(
        restarts=1, crash_at="after EnginePersistDispatched")
    assert before.restarts[0].invocations == 0 and before.effects == 0


def test_the_legacy_default_cells_and_a_retry_after_the_email_went_out() -> None:
    legacy = ev.the_ledger_engine_halts_an_adopted_call_the_legacy_engine_sends_twice()
    assert (legacy.legacy_resume.effects, legacy.adopted.effects, legacy.not_sent.effects,
            legacy.pending.effects) == (2, 1, 0, 1)
    assert all(len(row) == len(ev.LEGACY_DEFAULT_HEADERS) for row in legacy.rows())
    retry = ev.a_human_retry_of_an_adopted_call_sends_it_once()
    assert (retry.done, retry.effects, retry.attempt, retry.authorization) == (
        "done", 1, 1, "human")
    # A human who says "retry" after the email went out is obeyed: the effect is counted twice.
    assert ev.a_human_retry_of_an_adopted_call_sends_it_once("after ExternalApply").effects == 2


# --------------------------------------------------------------------------- notebook 04


@pytest.mark.slow
def test_graph_checks_pass_on_tlcs_graph_and_fail_on_a_graph_missing_steps() -> None:
    manifest = load_manifest(ROOT)
    with ns.TLCWorkspace(ROOT) as ws:
        tiny = ns.every_state_of(ws, ns.manual_calls_model(1, 0, max_attempts=1), "Small",
                                 ns.invariants_of(manifest.get("TwoCalls")))
    eid = tiny.config.spec_exec_ids["c1"]
    checks = ev.the_reference_agrees_with_every_state_and_every_end_is_settled(
        tiny.config, tiny.graph, eid)
    assert checks.report.ok and checks.report.states == len(tiny.graph.states)
    assert not checks.broken and checks.unsettled == ()
    assert sum(checks.ends.values()) == len(tiny.graph.terminal()) > 0
    assert [len(row) for row in checks.end_rows()] == [len(ev.END_HEADERS)] * len(checks.ends)
    assert checks.wrong_human == sum(n for (kind, _, applied), n in checks.ends.items()
                                     if kind == "human" and applied == 0)

    # A graph with the steps out of Init cut: the reference allows steps the graph lacks.
    cut = StateGraph(tiny.graph.states,
                     [e for e in tiny.graph.edges if e[0] not in tiny.graph.initial],
                     set(tiny.graph.initial))
    broken = ev.the_reference_agrees_with_every_state_and_every_end_is_settled(
        tiny.config, cut, eid)
    assert not broken.report.ok and broken.report.mismatch_count > 0
    assert broken.unsettled                       # Init is now an end state, and not settled


@pytest.mark.slow
def test_state_space_growth_is_measured_and_a_shrinking_count_is_reported() -> None:
    with ns.TLCWorkspace(ROOT) as ws:
        growth = ev.the_state_space_grows_with_every_call_and_crash(
            ws, ["TypeOK", "AtMostOnceEffect"], [(1, 1), (1, 0)])
    assert growth.failed == [] and growth.not_growing == [] and growth.per_call == []
    (factor,) = growth.per_crash
    assert factor == growth.counts[1, 1] / growth.counts[1, 0] > 1
    assert [row[:2] for row in growth.rows()] == [[1, 0], [1, 1]]

    fewer = dataclasses.replace(growth.results[1, 1], distinct_states=growth.counts[1, 0])
    flat = ev.StateSpaceGrowth({**growth.results, (1, 1): fewer}, growth.seconds)
    assert flat.not_growing == [((1, 0), (1, 1))]


@pytest.mark.slow
def test_the_way_into_the_violating_region_is_drawn_and_counted() -> None:
    manifest = load_manifest(ROOT)
    with ns.TLCWorkspace(ROOT) as ws:
        study = ns.study_broken_twin(manifest, ws, "UnfencedReconcile",
                                     ns.spec_at_most_once_effect, "fence_on_reconcile")
    key = study.twin.spec_exec_ids["c1"]
    way = ev.the_shortest_way_into_the_violating_region(
        study, key, ringed="effect applied twice", legend_title="ledger status of c1")
    assert way.drawn.highlighted == len(study.violating)
    assert way.drawn.path_edges == len(study.path) - 1
    assert sum(way.violating_status.values()) == len(study.violating)
    assert f"{len(study.violating)} of them ringed in red (effect applied twice)" in way.alt
    assert "AtMostOnceEffect" in way.path_table_html
    # Nothing violating: nothing ringed, and the alt text says so.
    none = ev.the_shortest_way_into_the_violating_region(
        dataclasses.replace(study, violating=frozenset()), key, ringed="x", legend_title="")
    assert none.drawn.highlighted == 0 and "0 of them ringed" in none.alt
    plt.close("all")


def test_simulate_measures_a_cell_the_same_and_a_tampered_cell_differs() -> None:
    cell = run_cell("ledger", "new", "manual", "after ExternalApply")
    adopted = run_cell("ledger", "legacy", "manual", "after ExternalApply")  # no twin
    same = ev.toolledger_simulate_measures_every_new_session_cell_the_same([cell, adopted])
    assert (same.compared, same.differing) == (1, ())
    tampered = dataclasses.replace(cell, decisions=("retry_same_id",))
    assert ev.toolledger_simulate_measures_every_new_session_cell_the_same(
        [tampered]).differing == (tampered.label,)
