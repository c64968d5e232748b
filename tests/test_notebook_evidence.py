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
