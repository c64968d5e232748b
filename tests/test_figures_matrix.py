"""The fault matrix measures what the engine kit does, and maps it to the spec faithfully.

Under test: ``toolledger.notebook.figures_matrix``. The oracles are the engine kit's
own counters and the cases whose answer issue #443 and docs/protocol.md fix
(a legacy engine delivers twice after the external success; the ledger halts
a ``manual`` call; the conservative legacy rule halts an adopted call), the
store's commit counters for the tape, the closed-world model and TLC for the
spec mapping (a tampered run must be refused), and the cells' own categories
for the picture and the tables.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import cast

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import ListedColormap, to_hex

from checker_support import ROOT
from toolledger._core import protocol as p
from toolledger._core.stores import MemoryStore
from toolledger.check.tracecheck import trace_of, validate_traces
from toolledger.kit.engine import (
    SEED_MATRIX,
    CrashInjector,
    MemoryConversationStore,
    crash_points,
)
from toolledger.kit.external import CountingExternalSystem
from toolledger.kit.simulate import ARGUMENTS, TOOL, USER_TEXT, run_simulation
from toolledger.notebook.figures_matrix import (
    CATEGORY_COLOURS,
    POLICIES,
    CellCategory,
    ConversationTap,
    EmailCall,
    LedgerTape,
    MatrixCell,
    SpecMismatch,
    category,
    email_model,
    fault_matrix_figure,
    html_table,
    invariant_violations,
    matrix_table_html,
    panels,
    run_cell,
    run_matrix,
    scenario_engine,
    seed_row_of,
    spec_run,
    spec_run_of_tape,
)
from toolledger.notebook.support import MIN_TEXT_PT, PAGE_WIDTH_PX, smallest_text


@pytest.fixture(autouse=True)
def _close_figures() -> None:
    plt.close("all")


def test_the_tape_holds_every_event_and_every_commit_in_order() -> None:
    store, tape = MemoryStore(), LedgerTape()
    conversations = ConversationTap(MemoryConversationStore(), tape)
    engine = scenario_engine("ledger", "manual", store=store, conversations=conversations,
                             system=CountingExternalSystem(), crash=CrashInjector(None),
                             tape=tape)
    assert engine.run(USER_TEXT).status.value == "done"
    assert [ev.action.value for ev in tape.events] == [
        "ProviderEmitCall", "EnginePersistCall", "EngineParkApproval", "HumanApprove",
        "EnginePersistDispatched", "EngineInvokeAdapter", "ExternalApply",
        "EngineRecordSucceeded", "EngineAppendResult",
    ]  # fmt: skip
    assert tape.commits == store.commits
    assert tape.ledger_commits == store.ledger_commits == 2
    kinds = [e.kind for e in tape.entries]
    assert kinds[0] == "open" and kinds.count("conversation") == 4
    # the assistant message is checkpointed before the ledger hears of the call
    first_event = kinds.index("commit")
    assert "tool calls" in tape.entries[first_event - 1].note
    assert tape.entries[-2].note.startswith("3 messages saved, the last: tool result (ok)")


def test_a_legacy_engine_cell_needs_no_store() -> None:
    cell = run_cell("legacy", "new", "manual", "after ExternalApply")
    assert cell.tape is None and cell.crashed
    assert (cell.effects, cell.invocations, cell.status) == (2, 2, "done")
    assert cell.seed_row == "after_external_success"


def test_the_seed_rows_measure_what_the_issue_expects() -> None:
    halted = run_cell("ledger", "new", "manual", "after ExternalApply")
    assert halted.decisions == ("recovery_required",)
    assert (halted.effects, halted.invocations, halted.status) == (1, 1, "recovery_required")
    retried = run_cell("ledger", "new", "idempotent", "after EngineInvokeAdapter")
    assert retried.decisions == ("retry_same_id",) and retried.effects == 1
    assert [status for *_, status in retried.late] == ["deduplicated"]
    adopted = run_cell("ledger", "legacy", "manual", "after HumanApprove")
    assert adopted.crash_mode == "legacy" and adopted.seed_row == "before_dispatch_record"
    assert (adopted.decisions, adopted.effects, adopted.status) == (
        ("recovery_required",), 0, "recovery_required")
    adopted_sent = run_cell("ledger", "legacy", "idempotent", "after ExternalApply")
    assert adopted_sent.legacy_effects == adopted_sent.effects == 1
    assert adopted_sent.legacy_invocations == adopted_sent.invocations == 1


def test_a_cell_off_the_policys_path_does_not_crash() -> None:
    cell = run_cell("ledger", "new", "readonly", "after EnginePersistDispatched")
    assert not cell.on_path and not cell.crashed and cell.status == "done"
    assert category(cell) is CellCategory.NOT_ON_PATH


def test_a_new_session_cell_agrees_with_toolledger_simulate() -> None:
    for engine in ("legacy", "ledger"):
        for point in crash_points(engine)[::3]:
            cell = run_cell(engine, "new", "reconcile", point)
            sim = run_simulation(engine, "reconcile", point)
            assert (sim.effects_applied, sim.adapter_invocations, tuple(sim.decision_names),
                    sim.turn_status, sim.final_tool_status) == (
                cell.effects, cell.invocations, cell.decisions, cell.status, cell.tool_status)


def test_only_the_ledger_engine_resumes_a_legacy_session() -> None:
    with pytest.raises(ValueError, match="ledger engine"):
        run_cell("legacy", "legacy", "manual", "after ExternalApply")


def test_the_seed_rows_are_found_on_both_engines() -> None:
    for name, row in SEED_MATRIX.items():
        assert seed_row_of("ledger", row.ledger) == name
        assert seed_row_of("legacy", row.legacy.name) == name
    assert seed_row_of("ledger", "after EnginePersistCall") is None


def test_the_email_call_digests_the_scenarios_arguments() -> None:
    cfg = email_model("manual", 0)
    (call,) = cfg.calls
    assert isinstance(call, EmailCall)
    assert call.digest("a1") == p.args_digest(TOOL, ARGUMENTS)
    assert cfg.arg_of_digest == {p.args_digest(TOOL, ARGUMENTS): "a1"}
    assert email_model("manual", 0) is cfg and email_model("manual", 2) is not cfg
    with pytest.raises(ValueError, match="one argument choice"):
        call.digest("a2")


def test_a_ledger_run_maps_to_the_model_and_keeps_the_invariants() -> None:
    cell = run_cell("ledger", "new", "reconcile", "after EngineInvokeAdapter")
    run = spec_run(cell)
    assert run.mapped and run.config is not None
    assert [a for a, _ in run.steps][:2] == ["Init", "ProviderEmitCall"]
    assert "Crash" in [a for a, _ in run.steps]
    assert [a for a, _ in run.steps][-1] == "ExternalDropFenced"      # the late original
    assert not invariant_violations(run)
    eid = run.config.exec_ids["c1"]
    assert run.final.external.count(eid) == cell.effects == 1
    assert run.final.external.fence(eid) == 1


def test_an_adopted_legacy_call_starts_in_the_specs_init() -> None:
    cell = run_cell("ledger", "legacy", "manual", "after ExternalApply")
    run = spec_run(cell)
    assert run.mapped and run.config is not None and run.config.marker == 2
    eid = run.config.exec_ids["c1"]
    assert run.steps[0][1].external.count(eid) == 1      # the legacy engine's effect
    assert [a for a, _ in run.steps] == ["Init", "Recover"]


def test_cells_the_spec_does_not_start_from_say_why() -> None:
    assert spec_run(run_cell("legacy", "new", "manual", "after HumanApprove")).note == (
        "no ledger engine ran")
    pending = spec_run(run_cell("ledger", "legacy", "manual", "after EngineParkApproval"))
    assert not pending.mapped and "not an initial state" in pending.note


def test_a_tampered_run_is_refused() -> None:
    cell = run_cell("ledger", "new", "manual", "after ExternalApply")
    assert cell.tape is not None
    entries = cell.tape.entries
    skipped = [e for e in entries if e.note != "EnginePersistDispatched"]
    tampered = LedgerTape(entries=skipped)
    with pytest.raises(SpecMismatch, match="EngineInvokeAdapter"):
        spec_run_of_tape(tampered, "manual")
    # a manual call that was retried instead of halted
    recover = next(i for i, e in enumerate(entries) if e.note == "Recover")
    halted = entries[recover]
    assert halted.before is not None and halted.after is not None
    (call,) = halted.after.calls
    retried = dataclasses.replace(halted, after=dataclasses.replace(
        halted.after, calls=(dataclasses.replace(call, stage=p.Stage.RETRY),)))
    with pytest.raises(SpecMismatch, match="Recover"):
        spec_run_of_tape(LedgerTape(entries=[*entries[:recover], retried]), "manual")


@pytest.mark.slow
def test_tlc_accepts_a_mapped_run_and_refuses_a_reordered_one() -> None:
    cell = run_cell("ledger", "new", "idempotent", "after EngineInvokeAdapter")
    run = spec_run(cell)
    assert run.config is not None
    good = trace_of(run.config, run.steps, origin="good")
    assert validate_traces(ROOT, run.config, [good]).ok
    steps = list(run.steps)
    steps[3], steps[4] = steps[4], steps[3]
    bad = trace_of(run.config, steps, origin="reordered")
    verdict = validate_traces(ROOT, run.config, [bad])
    assert not verdict.ok and verdict.failure is not None and verdict.failure.step == 3


def test_the_picture_shows_each_cells_category() -> None:
    cells = run_matrix(policies=("manual", "readonly"))
    fig, drawn = fault_matrix_figure(cells, policies=("manual", "readonly"), title="t")
    assert len(drawn.panels) == 3
    assert fig.axes[0].get_title(loc="left") == " ".join(drawn.panels[0].split())
    # Stacked one page wide: every text reads at 10 pt or more in a notebook.
    assert fig.get_figwidth() <= PAGE_WIDTH_PX / 96
    assert smallest_text(fig)[0] >= MIN_TEXT_PT
    for (engine, session, mode), title in zip(panels(), drawn.panels, strict=True):
        mine = [c for c in cells if (c.engine, c.session) == (engine, session)]
        assert drawn.counts[title] == dict(Counter(category(c) for c in mine))
        assert drawn.rows[title] == tuple(cp.name for cp in crash_points(mode))
        assert len(drawn.seed_rows[title]) == 5
    legacy_title = drawn.panels[0]
    assert drawn.texts[legacy_title, "after ExternalApply", "manual"] == "—\n2\u00d7"
    assert drawn.counts[legacy_title][CellCategory.DUPLICATE] == 3
    ledger_title = drawn.panels[1]
    assert drawn.texts[ledger_title, "after ExternalApply", "manual"] == "halt\n1\u00d7"
    assert drawn.texts[ledger_title, "after EngineInvokeReadonly", "manual"] == "·"
    # the colour of a cell is its category's
    image = fig.axes[1].images[0]
    array = image.get_array()
    assert array is not None
    index = int(array[drawn.rows[ledger_title].index("after ExternalApply")][0])
    assert list(CellCategory)[index] is CellCategory.ONE_EFFECT
    cmap = image.cmap
    assert isinstance(cmap, ListedColormap)
    assert (image.norm.vmin, image.norm.vmax) == (0, len(CellCategory) - 1)
    colours = [to_hex(c) for c in cast(list[str], cmap.colors)]
    assert colours[index] == CATEGORY_COLOURS[CellCategory.ONE_EFFECT]
    assert colours == [CATEGORY_COLOURS[c] for c in CellCategory]


def test_the_categories() -> None:
    base = run_cell("ledger", "new", "manual", "after ExternalApply")
    assert category(base) is CellCategory.ONE_EFFECT
    assert category(dataclasses.replace(base, effects=2)) is CellCategory.DUPLICATE
    assert category(dataclasses.replace(base, effects=0)) is CellCategory.NO_EFFECT
    assert category(dataclasses.replace(base, effects=2, policy="readonly")) is (
        CellCategory.READONLY_REPLAY)
    assert category(dataclasses.replace(base, status="error")) is CellCategory.ERROR
    assert set(CATEGORY_COLOURS) == set(CellCategory)


def test_the_tables_shade_the_seed_rows_and_escape_text() -> None:
    cells: list[MatrixCell] = run_matrix(policies=("manual",))
    text = matrix_table_html(cells, "ledger", "new", policies=("manual",))
    assert text.count("background:#fff3bf") == 5 * 3          # five rows, three cells each
    assert "seed row 3: After external success" in text
    assert "recovery_required" in text
    with pytest.raises(ValueError, match="no cells"):
        matrix_table_html(cells, "legacy", "legacy")
    table = html_table(["a<b"], [["x & y\nz"]], highlight=[0], caption="c<")
    assert "a&lt;b" in table and "x &amp; y<br>z" in table and "c&lt;" in table


def test_the_matrix_has_every_cell_once() -> None:
    cells = run_matrix()
    assert len(cells) == (8 + 13 + 8) * len(POLICIES)
    keys = [(c.engine, c.session, c.policy, c.point) for c in cells]
    assert len(set(keys)) == len(keys)
