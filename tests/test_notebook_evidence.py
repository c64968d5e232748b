"""The notebooks' evidence functions measure what their names say.

Under test: ``toolledger.notebook_evidence``.  Each function is run on a small
input whose figures are known, and, where it checks something, on a
deliberately broken variant it must report (a cell whose counts were tampered
with, a trace with a step cut out, ...).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from toolledger import notebook_evidence as ev
from toolledger import notebook_support as ns
from toolledger.figures_matrix import SpecRun, run_cell

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
    assert [r.kind for r in retry.new_rows] == ["human_retry", "dispatch"]
    assert len(retry.row()) == len(ev.RESOLUTION_HEADERS)
    abandon = ev.a_human_resolves_the_halted_call(tmp_path, "abandon")
    assert (abandon.tool_message["status"], abandon.invocations) == ("abandoned", 1)


def test_a_reused_call_id_gets_its_own_execution_id_and_approval(tmp_path: Path) -> None:
    from toolledger.engine import ScriptedHuman

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
