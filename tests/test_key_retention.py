"""Issue 11 item 8: the external-system assumptions, checked on the KeyExpiry model.

KeyExpiry is one idempotent call whose external system forgets the key once
the tool's retention window has passed (``RetentionWindowPasses``,
``ExternalExpireKey``).  The reference must allow exactly the spec's steps
from every state of its graph, every reachable state of the reference must
satisfy the invariants, and two deliberately broken cores must be caught:
one that retries whether or not the key is retained (the
``RetryAfterKeyExpiry`` twin) and one that takes an older attempt's late
return as the current answer (instead of ``EngineDiscardLateReturn``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest

from checker_support import ROOT, ignores_key_retention, model_config, takes_late_returns
from toolledger._core import protocol as p
from toolledger.check import conformance
from toolledger.check.invariants import check_all
from toolledger.check.manifest import load_manifest
from toolledger.check.mapping import spec_key, to_spec
from toolledger.check.stategraph import StateGraph, load_dot
from toolledger.check.system import ModelConfig, SystemState, initial_states, successors
from toolledger.check.tlavalues import Value
from toolledger.check.tlc import Outcome, run_tlc

MODEL = "KeyExpiry"


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> StateGraph:
    entry = {m.name: m for m in load_manifest(ROOT).models}[MODEL]
    dot = tmp_path_factory.mktemp("dump") / f"{MODEL}.dot"
    result = run_tlc(
        entry.module,
        ROOT / "model" / entry.cfg,
        search_dirs=[ROOT / "spec", ROOT / "model"],
        check_deadlock=entry.check_deadlock,
        dump_dot=dot,
    )
    assert result.outcome is Outcome.PASS
    assert result.distinct_states == entry.distinct_states
    return load_dot(dot)


def _reachable(cfg: ModelConfig) -> tuple[int, dict[str, list[str]], set[p.Action]]:
    """Breadth-first over the reference's own closed world: states, the first
    invariant violations found, and the actions taken."""
    seen: set[tuple[Value, ...]] = set()
    frontier = list(initial_states(cfg))
    actions: set[p.Action] = set()
    while frontier:
        nxt: list[SystemState] = []
        for s in frontier:
            key = spec_key(to_spec(cfg, s))  # states compare as the spec's values
            if key in seen:
                continue
            seen.add(key)
            bad = check_all(cfg, s)
            if bad:
                return len(seen), bad, actions
            for a, t in successors(cfg, s):
                actions.add(a)
                nxt.append(t)
        frontier = nxt
    return len(seen), {}, actions


def test_the_model_reads_the_key_retention_switch() -> None:
    assert model_config(MODEL).keys_expire
    assert not model_config("TwoCalls").keys_expire


def test_reference_allows_exactly_the_specs_steps(graph: StateGraph) -> None:
    report = conformance.check_graph(model_config(MODEL), graph, model=MODEL, workers=1)
    details = "\n".join(conformance.render_mismatch(report, m) for m in report.mismatches)
    assert report.mismatch_count == 0, details
    labels = {label for edges in graph._successor_index().values() for _, label in edges}
    assert {"RetentionWindowPasses", "ExternalExpireKey", "EngineDiscardLateReturn"} <= labels


def test_the_reference_satisfies_the_invariants_everywhere() -> None:
    states, bad, actions = _reachable(model_config(MODEL))
    assert bad == {}
    # the reference's own closed world reaches exactly the spec's states
    entry = {m.name: m for m in load_manifest(ROOT).models}[MODEL]
    assert states == entry.distinct_states
    assert {p.Action.RetentionWindowPasses, p.Action.ExternalExpireKey,
            p.Action.EngineDiscardLateReturn} <= actions  # fmt: skip


@pytest.mark.parametrize(
    ("broken", "expected_kind", "expected_action"),
    [
        (ignores_key_retention, "extra", "Recover"),
        (takes_late_returns, "extra", "ExternalApply"),
    ],
)
def test_conformance_catches_a_broken_core(
    graph: StateGraph,
    broken: Callable[[], AbstractContextManager[None]],
    expected_kind: str,
    expected_action: str,
) -> None:
    with broken():
        report = conformance.check_graph(
            model_config(MODEL), graph, model=MODEL, workers=1, fail_fast=True
        )
    assert not report.ok
    found = [(m.kind, m.action) for m in report.mismatches]
    assert (expected_kind, expected_action) in found, found


def test_the_invariants_catch_a_retry_after_the_key_expired() -> None:
    """The Python AtMostOnceEffect sees what the RetryAfterKeyExpiry twin shows."""
    with ignores_key_retention():
        _, bad, _ = _reachable(model_config(MODEL))
    assert "AtMostOnceEffect" in bad, bad
    assert bad["AtMostOnceEffect"] == ["c1: effect applied 2 times, at most 1 allowed"]
