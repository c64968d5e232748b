"""Exhaustive conformance of the reference against TLC's state graph.

The graph of the TwoCalls model (>= 100,000 states) is dumped once per
module; the reference must allow exactly the spec's steps from every state,
and each deliberately broken reference must be caught, with the expected
message and a reproduction that starts from an initial state.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from checker_support import BROKEN, ROOT, dump_graph, model_config
from toolledger.check import conformance
from toolledger.check.manifest import load_manifest
from toolledger.check.stategraph import StateGraph, load_dot
from toolledger.check.tlc import Outcome
from toolledger.check.tlccache import cache_from_env

MODEL = "TwoCalls"


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> StateGraph:
    entry = {m.name: m for m in load_manifest(ROOT).models}[MODEL]
    result, graph = dump_graph(MODEL, tmp_path_factory.mktemp("dump"))
    assert result.outcome is Outcome.PASS
    assert result.distinct_states == entry.distinct_states
    return graph


def test_reference_allows_exactly_the_specs_steps(graph: StateGraph) -> None:
    report = conformance.check_graph(model_config(MODEL), graph, model=MODEL, workers=2)
    details = "\n".join(conformance.render_mismatch(report, m) for m in report.mismatches)
    assert report.mismatch_count == 0, details
    assert report.states >= 100_000
    assert report.states == len(graph.states)
    assert report.reference_edges == report.edges == len(graph.edges)


@pytest.mark.parametrize(
    ("variant", "expected_kind", "expected_action"),
    [
        ("manual_retries", "extra", "Recover"),
        ("skips_dispatched_write", "extra", "EnginePersistDispatched"),
        ("keyed_by_tool_call_id", "roundtrip", None),
    ],
)
def test_conformance_catches_a_broken_reference(
    graph: StateGraph, variant: str, expected_kind: str, expected_action: str | None
) -> None:
    broken: Callable[[], AbstractContextManager[None]] = BROKEN[variant]
    with broken():
        cfg = model_config(MODEL)  # derived ids follow the broken derivation
        report = conformance.check_graph(cfg, graph, model=MODEL, workers=2, fail_fast=True)
    assert not report.ok
    kinds = {m.kind for m in report.mismatches}
    assert expected_kind in kinds, [conformance.render_mismatch(report, m)
                                    for m in report.mismatches]
    m = next(m for m in report.mismatches if m.kind == expected_kind)
    if expected_action is not None:
        assert any(x.action == expected_action for x in report.mismatches)
        m = next(x for x in report.mismatches if x.action == expected_action)
    text = conformance.render_mismatch(report, m)
    assert text.startswith(f"{expected_kind}: ")
    assert "path from an initial state:" in text and "Init" in text


def test_initial_states_are_compared(graph: StateGraph) -> None:
    cfg = model_config(MODEL)
    report = conformance.check_graph(
        cfg, graph, model=MODEL, initial_fn=lambda c: [], fail_fast=True
    )
    assert any(m.kind == "initial" and "reference lacks" in m.detail for m in report.mismatches)


def test_the_manifest_marks_a_big_conformance_model() -> None:
    models = load_manifest(ROOT).models
    big = [m for m in models if m.conformance and m.ci and m.distinct_states >= 100_000]
    assert [m.name for m in big] == [MODEL]


def test_graph_file_missing_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(Exception, match=r"nope\.dot"):
        load_dot(tmp_path / "nope.dot")


def test_the_rows_left_to_make_test_conform() -> None:
    """The conformance rows `make check` leaves to `make test`
    (conformance_tier = "test", except TwoCalls: checked above, with the
    broken variants) run here, exhaustively, exactly as `toolledger check
    --all` would run them."""
    left = [m for m in load_manifest(ROOT).ci_models()
            if m.conformance and m.conformance_tier == "test" and m.name != MODEL]
    for entry in left:
        report = conformance.run_conformance(ROOT, entry, cache=cache_from_env())
        details = "\n".join(conformance.render_mismatch(report, m) for m in report.mismatches)
        assert report.tlc is not None and report.tlc.distinct_states == entry.distinct_states
        assert report.mismatch_count == 0 and report.states == entry.distinct_states, details
