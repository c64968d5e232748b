"""The notebooks' tables and pictures show what their input says, and nothing else.

Under test: ``toolledger.notebook.figures`` (step tables, sequence diagrams, state-graph
drawings, the state-space chart) on small hand-made traces and graphs whose
right answer is known, plus one real TLC counterexample; and the guard that keeps
``notebooks/02_the_protocol.ipynb`` reading the spec from ``spec/`` when it runs
instead of holding a pasted copy.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.collections import PathCollection
from matplotlib.colors import to_hex
from matplotlib.text import Annotation

from toolledger._core.protocol import TRANSITIONS, Actor
from toolledger.check.stategraph import StateGraph
from toolledger.check.tlavalues import FnValue, Value
from toolledger.check.tlc import TraceStep
from toolledger.notebook.figures import (
    LIFELINE_TITLES,
    LIFELINES,
    STATUS_COLOURS,
    bfs_depths,
    draw_state_graph,
    ledger_status,
    sender_of,
    sequence_arrows,
    sequence_diagram,
    state_space_chart,
    trace_rows,
    trace_table_html,
)

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "spec" / "DurableToolExecution.tla"
LEGACY_SPEC = ROOT / "spec" / "LegacyResume.tla"
NOTEBOOK_02 = ROOT / "notebooks" / "02_the_protocol.ipynb"


@pytest.fixture(autouse=True)
def _close_figures() -> None:
    plt.close("all")


def legacy_state(**changes: Value) -> dict[str, Value]:
    """A one-call state of spec/LegacyResume.tla, with ``changes`` (var -> value of c1)."""
    base: dict[str, Value] = {
        "msg": "absent",
        "result": "none",
        "approval": "none",
        "ledger": "none",
        "stage": "none",
        "inflight": False,
        "applied": 0,
    }
    base.update(changes)
    state: dict[str, Value] = {k: FnValue({"c1": v}) for k, v in base.items()}
    state["crashes"] = 0
    return state


def seed_trace() -> list[TraceStep]:
    """The seed's reproduction (LegacyResume's counterexample), written out by hand."""
    states = [
        ("Init", legacy_state()),
        ("ProviderEmitCall", legacy_state(msg="volatile", stage="live")),
        ("EngineParkApproval", legacy_state(msg="durable", stage="live", approval="pending")),
        ("HumanApprove", legacy_state(msg="durable", stage="live", approval="approved")),
        ("EngineInvokeAdapter",
         legacy_state(msg="durable", stage="waiting", approval="approved", inflight=True)),
        ("ExternalApply",
         legacy_state(msg="durable", stage="got_ok", approval="approved", applied=1)),
        ("Crash", {**legacy_state(msg="durable", stage="resume", approval="approved",
                                  applied=1), "crashes": 1}),
        ("Recover", {**legacy_state(msg="durable", stage="live", approval="approved",
                                    applied=1), "crashes": 1}),
        ("EngineInvokeAdapter", {**legacy_state(msg="durable", stage="waiting",
                                                approval="approved", inflight=True,
                                                applied=1), "crashes": 1}),
        ("ExternalApply", {**legacy_state(msg="durable", stage="got_ok", approval="approved",
                                          applied=2), "crashes": 1}),
    ]
    return [TraceStep(i, a, s) for i, (a, s) in enumerate(states, 1)]


# ----------------------------------------------------------------------------
# Step tables.


def test_step_rows_list_every_variable_first_then_only_changes() -> None:
    trace = seed_trace()
    rows = trace_rows(trace)
    assert [r.action for r in rows] == [s.action for s in trace]
    assert len(rows[0].changes) == len(trace[0].state)
    assert set(rows[2].changes) == {'approval.c1 = "pending"', 'msg.c1 = "durable"'}
    assert set(rows[-1].changes) == {"inflight.c1 = FALSE", "applied.c1 = 2",
                                     'stage.c1 = "got_ok"'}
    assert all(not c.startswith("crashes") for r in trace_rows(trace, hide=["crashes"])
               for c in r.changes)


def test_html_table_escapes_values_and_marks_the_violating_step() -> None:
    trace = seed_trace()
    text = trace_table_html(trace, violated="AtMostOnceEffect", show_init=False)
    assert text.count("<tr>") == len(trace) + 1  # header + one row per step
    assert f"initial state ({len(trace[0].state)} variables set, not shown)" in text
    assert text.count("violates AtMostOnceEffect") == 1
    last_row = text.rsplit("<tr>", 1)[1]
    assert "applied.c1 = 2" in last_row and "violates" in last_row
    step = TraceStep(1, "Init", {"x": FnValue({("a", 1): "<b>"})})
    html = trace_table_html([step])
    assert "&lt;&lt;" in html and "<b>" not in html.replace("<b>Init</b>", "")


# ----------------------------------------------------------------------------
# Sequence diagrams.


def test_sender_is_the_actor_of_the_action_in_the_transition_table() -> None:
    expected = {
        Actor.PROVIDER: "provider",
        Actor.ENGINE: "engine",
        Actor.HUMAN: "inbox",
        Actor.EXTERNAL: "external",
        Actor.ENVIRONMENT: "engine",
    }
    for action, row in TRANSITIONS.items():
        assert sender_of(action.value) == expected[row.actor], action
    assert sender_of("EngineCheckpoint") == "engine"  # LegacyResume only
    with pytest.raises(ValueError, match="no lifeline"):
        sender_of("Tick")


def next_actions(spec: Path) -> set[str]:
    """The operator names that are disjuncts of ``Next`` in ``spec``."""
    text = spec.read_text()
    body = text.split("\nNext ==", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"\\/\s+(?:\\E [^:]+:\s*)?(\w+)", body))


def test_every_action_of_both_specs_has_a_sender_lifeline() -> None:
    actions = next_actions(SPEC) | next_actions(LEGACY_SPEC)
    assert {"ProviderEmitCall", "Crash", "EngineCheckpoint", "HumanResolveRetry"} <= actions
    assert {sender_of(a) for a in actions} <= set(LIFELINES)


def test_one_arrow_per_step_from_actor_to_the_lifeline_it_changed() -> None:
    trace = seed_trace()
    arrows = sequence_arrows(trace)
    assert [a.step for a in arrows] == [s.index for s in trace[1:]]
    route = [(a.action, a.sender, a.receiver, a.kind) for a in arrows]
    assert route == [
        ("ProviderEmitCall", "provider", "engine", "message"),  # msg volatile: in memory
        ("EngineParkApproval", "engine", "inbox", "message"),
        ("HumanApprove", "inbox", "inbox", "self"),
        ("EngineInvokeAdapter", "engine", "external", "message"),
        ("ExternalApply", "external", "engine", "message"),
        ("Crash", "engine", "engine", "crash"),
        ("Recover", "engine", "engine", "self"),
        ("EngineInvokeAdapter", "engine", "external", "message"),
        ("ExternalApply", "external", "engine", "message"),
    ]
    assert arrows[-1].changes[0] == "applied.c1 = 2"  # the effect count comes first


def test_sequence_diagram_draws_lifelines_and_one_labelled_arrow_per_step() -> None:
    trace = seed_trace()
    fig, arrows = sequence_diagram(trace, violated="AtMostOnceEffect")
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    for name in LIFELINES:
        assert LIFELINE_TITLES[name] in texts
    drawn = [t for t in ax.texts if isinstance(t, Annotation) and t.arrow_patch is not None]
    assert len(drawn) == sum(1 for a in arrows if a.kind != "crash") == len(trace) - 2
    labels = [t for t in ax.texts if t.get_text() in {s.action for s in trace}]
    by_height = [t.get_text() for t in sorted(labels, key=lambda t: -t.get_position()[1])]
    assert by_height == [a.action for a in arrows if a.kind != "crash"]
    assert any(t.startswith("Crash:") for t in texts)
    assert "violates\nAtMostOnceEffect" in texts
    edge = [to_hex(patch.get_edgecolor()) for t in drawn if (patch := t.arrow_patch)]
    assert edge[-1] == "#bb0000" and "#bb0000" not in edge[:-1]


def test_a_grown_set_shows_only_what_was_added() -> None:
    key = (1, 0, "call_0")

    def state(rows: frozenset[Value], stage: str) -> dict[str, Value]:
        return {"audit": FnValue({key: rows}), "stage": FnValue({"c1": stage})}

    before = state(frozenset({("dispatch", 1)}), "resume")
    after = state(frozenset({("dispatch", 1), ("reconcile", 1)}), "reconciling")
    (arrow,) = sequence_arrows([TraceStep(1, "Init", before), TraceStep(2, "Recover", after)])
    assert arrow.receiver == "store"
    assert arrow.changes == ('audit[1,0,call_0] += {<<"reconcile", 1>>}',
                             "stage.c1 = reconciling")


# ----------------------------------------------------------------------------
# State graphs.


def ledger_state(status: str) -> dict[str, Value]:
    key = (1, 0, "call_0")
    return {"ledger": FnValue({key: FnValue({"status": status, "attempt": 1})})}


def small_graph() -> StateGraph:
    statuses = {1: "none", 2: "dispatched", 3: "dispatched", 4: "succeeded",
                5: "recovery_required", 6: "succeeded"}
    edges = [(1, 2, "EnginePersistDispatched"), (2, 3, "Crash"), (2, 4, "EngineRecordSucceeded"),
             (3, 5, "Recover"), (5, 6, "HumanResolveApplied"), (4, 4, "Stutter"),
             (2, 4, "EngineRecordSucceeded")]
    return StateGraph(states={n: ledger_state(s) for n, s in statuses.items()}, edges=edges,
                      initial={1})


def test_bfs_depths_are_distances_from_init() -> None:
    assert bfs_depths(small_graph()) == {1: 0, 2: 1, 3: 2, 4: 2, 5: 3, 6: 4}


def test_state_graph_colours_every_state_by_its_status() -> None:
    graph = small_graph()
    key = (1, 0, "call_0")
    category = {n: ledger_status(s, key) for n, s in graph.states.items()}
    fig, drawn = draw_state_graph(graph, category, highlight=[5, 5], path=[1, 2, 3, 5])
    assert drawn.nodes == 6
    assert drawn.edges == 4 + 1  # distinct pairs; the self-loop is left out
    assert drawn.colour_counts == Counter(category.values())
    assert drawn.highlighted == 1 and drawn.path_edges == 3
    dots: Counter[str] = Counter()
    for coll in fig.axes[0].collections:
        faces = np.asarray(coll.get_facecolor())
        if isinstance(coll, PathCollection) and len(faces):
            (colour,) = {to_hex(tuple(c)) for c in faces}
            dots[colour] += len(np.asarray(coll.get_offsets()))
    assert dots == Counter({STATUS_COLOURS[s]: n for s, n in Counter(category.values()).items()})
    box = fig.axes[0].get_legend()
    assert box is not None
    legend = [t.get_text() for t in box.get_texts()]
    assert "dispatched (2)" in legend and "violating (1)" in legend


def test_every_figure_reads_at_10_pt_on_a_notebook_page() -> None:
    # What notebook_support.figure_html would refuse: text under 10 pt at the width shown.
    from toolledger.notebook.support import MIN_TEXT_PT, smallest_text

    graph = small_graph()
    category = {n: ledger_status(s, (1, 0, "call_0")) for n, s in graph.states.items()}
    figures = [
        sequence_diagram(seed_trace(), violated="AtMostOnceEffect", title="t")[0],
        draw_state_graph(graph, category, title="t")[0],
        draw_state_graph(graph, category, highlight=[5], path=[1, 2, 3, 5], title="t")[0],
        state_space_chart({(1, 0): 131, (1, 1): 517, (2, 0): 4161}, title="t"),
    ]
    for fig in figures:
        size, text = smallest_text(fig)
        assert size >= MIN_TEXT_PT, (text, size)


def test_the_path_through_a_state_graph_is_numbered_by_step() -> None:
    graph = small_graph()
    category = {n: ledger_status(s, (1, 0, "call_0")) for n, s in graph.states.items()}
    fig, _ = draw_state_graph(graph, category, highlight=[5], path=[1, 2, 3, 5])
    numbers = [t.get_text() for t in fig.axes[0].texts]
    assert numbers == ["1", "2", "3", "4"]  # as graph.trace_to numbers the steps
    fig, _ = draw_state_graph(graph, category)
    assert len(fig.axes[0].texts) == 0


def test_state_graph_refuses_states_without_a_category_or_colour() -> None:
    graph = small_graph()
    with pytest.raises(ValueError, match="no category"):
        draw_state_graph(graph, {1: "none"})
    with pytest.raises(ValueError, match="no colour"):
        draw_state_graph(graph, dict.fromkeys(graph.states, "purple"))


def test_state_space_chart_has_one_line_per_number_of_calls() -> None:
    counts = {(1, 0): 131, (1, 1): 517, (2, 0): 4161, (2, 1): 23632}
    fig = state_space_chart(counts)
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.get_lines()] == ["1 call", "2 calls"]
    assert [np.asarray(line.get_ydata()).tolist() for line in ax.get_lines()] == [
        [131, 517], [4161, 23632]]
    assert sorted(t.get_text() for t in ax.texts) == sorted(f"{v:,}" for v in counts.values())


# ----------------------------------------------------------------------------
# A real counterexample.


@pytest.mark.slow
def test_the_legacy_counterexample_is_drawn_step_by_step() -> None:
    from toolledger.check.manifest import load_manifest
    from toolledger.check.tlc import run_tlc

    manifest = load_manifest(ROOT)
    entry = manifest.get("LegacyResume")
    result = run_tlc(entry.module, entry.cfg_path, search_dirs=manifest.search_dirs,
                     check_deadlock=entry.check_deadlock)
    assert result.violated == "AtMostOnceEffect"
    _fig, arrows = sequence_diagram(result.trace, violated=result.violated)
    assert len(arrows) == len(result.trace) - 1
    assert [a.action for a in arrows].count("EngineInvokeAdapter") == 2
    assert arrows[-1].changes[0] == "applied.c1 = 2"


# ----------------------------------------------------------------------------
# Notebook 02 shows the spec as it is in spec/, never a pasted copy.


def notebook_cells(path: Path) -> list[dict[str, object]]:
    cells: list[dict[str, object]] = json.loads(path.read_text())["cells"]
    return cells


def source(cell: dict[str, object]) -> str:
    src = cell["source"]
    return "".join(src) if isinstance(src, list) else str(src)


def test_notebook_02_reads_the_spec_from_spec_instead_of_pasting_it() -> None:
    # A protocol change must reach notebook 02 by re-executing it, never by re-pasting:
    # no cell may hold a module or any definition line of the spec.
    code = [source(c) for c in notebook_cells(NOTEBOOK_02) if c["cell_type"] == "code"]
    everything = "\n".join(source(c) for c in notebook_cells(NOTEBOOK_02))
    assert json.loads(NOTEBOOK_02.read_text())["metadata"]["kernelspec"]["name"] == "python3"
    assert not re.search(r"-{4,}\s*MODULE\s", everything), "notebook 02 holds a TLA+ module"
    definition_lines = {ln.strip() for ln in SPEC.read_text().splitlines()
                        if re.match(r"[A-Za-z]\w*(\([^)]*\))?\s*==", ln)}
    pasted = sorted(ln for ln in definition_lines if ln in everything)
    assert not pasted, f"notebook 02 pastes spec definitions instead of reading them: {pasted}"
    joined = "\n".join(code)
    assert '"spec/DurableToolExecution.tla"' in joined and ".read_text()" in joined
    # Actions, invariants and the recovery decision are computed from the spec and the
    # manifest when the notebook runs, not listed by hand.
    for call in ("ns.next_actions(spec)", "ns.invariants_of(", "ns.definition", "Decide",
                 "ns.compare_decide_with_spec("):
        assert call in joined, call
