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
from pathlib import Path

import pytest

from checker_support import (
    ROOT,
    dump_graph,
    ignores_key_retention,
    model_config,
    takes_late_answer,
)
from toolledger import InvalidInput, MemoryStore, SqliteStore, Tool
from toolledger._core import protocol as p
from toolledger._core.ledger import Ledger
from toolledger._core.stores import Store
from toolledger.check import conformance
from toolledger.check.invariants import check_all
from toolledger.check.manifest import load_manifest
from toolledger.check.mapping import spec_key, to_spec
from toolledger.check.stategraph import StateGraph
from toolledger.check.system import ModelConfig, SystemState, initial_states, successors
from toolledger.check.tlavalues import Value
from toolledger.check.tlc import Outcome

MODEL = "KeyExpiry"


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> StateGraph:
    entry = {m.name: m for m in load_manifest(ROOT).models}[MODEL]
    result, graph = dump_graph(MODEL, tmp_path_factory.mktemp("dump"))
    assert result.outcome is Outcome.PASS
    assert result.distinct_states == entry.distinct_states
    return graph


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
        (takes_late_answer, "extra", "ExternalApply"),
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


# -- the engine side: the dispatch time is durable, the clock decides --------------------


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_a_restarted_engine_halts_once_the_key_may_be_gone(
    backend: str, tmp_path: Path
) -> None:
    """The record keeps the FIRST dispatch time across retries and restarts;
    within the tool's retention window recovery retries with the same key,
    past it the call halts in recovery_required, audited with key_retained."""
    now = [1000.0]

    def clock() -> float:
        return now[0]

    path = tmp_path / "ledger.db"

    def open_store() -> Store:
        return MemoryStore() if backend == "memory" else SqliteStore(path)

    store = open_store()
    ledger = Ledger.create(store, "s", clock=clock)
    tool = p.ToolProfile("mail", p.RecoveryPolicy.IDEMPOTENT, False, 60.0)
    pos = (1, 0)
    args = {"to": "alice"}
    ledger.step(p.Event(p.Action.ProviderEmitCall, pos, "call_0", tool,
                        p.args_digest("mail", args)), arguments=args)  # fmt: skip
    for a in (p.Action.EnginePersistCall, p.Action.EnginePersistDispatched,
              p.Action.EngineInvokeAdapter):  # fmt: skip
        ledger.step(p.Event(a, pos))
    eid = ledger.state.calls[0].execution_id

    def restart(at: float) -> Ledger:
        nonlocal store
        now[0] = at
        if backend == "sqlite":
            store.close()
            store = open_store()
            return Ledger(store, "s", clock=clock)
        return Ledger(store, "s", clock=clock)  # a new process on the same store

    ledger = restart(1030.0)  # crash within the window: retry with the same key
    assert ledger.state.calls[0].tool.retention_window == 60.0
    assert ledger.state.record(eid).dispatched_at == 1000.0
    ledger.step(p.Event(p.Action.Recover, pos))
    ledger.step(p.Event(p.Action.EnginePersistDispatched, pos))
    ledger.step(p.Event(p.Action.EngineInvokeAdapter, pos))
    assert ledger.state.record(eid).attempt == 2
    assert ledger.state.record(eid).dispatched_at == 1000.0  # the first dispatch's

    ledger = restart(1061.0)  # past the window counted from the FIRST dispatch
    ledger.step(p.Event(p.Action.Recover, pos))
    assert ledger.state.record(eid).status is p.LedgerStatus.RECOVERY_REQUIRED
    rows = [r for r in ledger.audit() if r.kind in {"retry_same_id", "recovery_required"}]
    assert [(r.kind, r.inputs["key_retained"]) for r in rows] == [
        ("retry_same_id", True),
        ("recovery_required", False),
    ]
    store.close()


def test_a_tool_declares_its_retention_window() -> None:
    assert Tool("idempotent", retention_window=86_400).profile("mail").retention_window == 86_400
    assert Tool("idempotent").profile("mail").retention_window is None  # forever
    with pytest.raises(InvalidInput, match="retention_window must be a positive number"):
        Tool("idempotent", retention_window=-1)
