"""The closed world offers every event and lets the core refuse it.

:func:`toolledger.check.system.successors` tries every per-call action on
every call from every stage, every emission of the model, and offers every
answer of the external system to every call of its execution id; only the
core's own guards (``ProtocolError``) decide what is enabled.  So a core that
is too permissive shows up in conformance as an ``extra`` step: here, a core
that takes a late answer of an older attempt as the current one's, and one
that lets a human resolve a call a restart left in ``resume`` before
``Recover`` re-decided it.  Both passed every checker while the closed world
pre-checked the attempt of an answer and tried actions only from the stages
the transition table lists.

DeepManual (one manual call, 3 crashes, 3 attempts) reaches both situations:
a human retry sends attempt 2 while attempt 1 is still in flight, and a
crash leaves a recovery_required call in ``resume``.
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest

from checker_support import BROKEN, ROOT, dump_graph, model_config
from toolledger._core import protocol as p
from toolledger.check import conformance, memo
from toolledger.check.manifest import load_manifest
from toolledger.check.mapping import from_spec
from toolledger.check.stategraph import StateGraph
from toolledger.check.system import successors
from toolledger.check.tlc import Outcome

pytestmark = pytest.mark.slow

MODEL = "DeepManual"
ANSWERS = (p.Action.ExternalApply, p.Action.ExternalRejectDefinite)
RESOLVES = (p.Action.HumanResolveApplied, p.Action.HumanResolveRetry,
            p.Action.HumanResolveAbandon)


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> StateGraph:
    entry = load_manifest(ROOT).get(MODEL)
    result, graph = dump_graph(MODEL, tmp_path_factory.mktemp("dump"))
    assert result.outcome is Outcome.PASS
    assert result.distinct_states == entry.distinct_states
    return graph


def test_the_real_core_conforms(graph: StateGraph) -> None:
    report = conformance.check_graph(model_config(MODEL), graph, model=MODEL)
    details = "\n".join(conformance.render_mismatch(report, m) for m in report.mismatches)
    assert report.mismatch_count == 0, details
    assert report.reference_edges == report.edges == len(graph.edges)


@pytest.mark.parametrize(
    ("variant", "actions"),
    # a late answer taken is also the spec's EngineDiscardLateReturn "missing"
    [("takes_late_answer", (*ANSWERS, p.Action.EngineDiscardLateReturn)),
     ("resolves_before_recover", RESOLVES),
     # the old rule: a late answer of the attempt the record is still at is
     # discarded (an extra EngineDiscardLateReturn) instead of taken (missing)
     ("drops_late_answer", (*ANSWERS, p.Action.EngineDiscardLateReturn))],
)
def test_a_too_permissive_core_is_an_extra_step(
    graph: StateGraph, variant: str, actions: tuple[p.Action, ...]
) -> None:
    with BROKEN[variant]():
        report = conformance.check_graph(model_config(MODEL), graph, model=MODEL,
                                         max_mismatches=1000)
    extra = [m for m in report.mismatches if m.kind == "extra"]
    shown = [conformance.render_mismatch(report, m) for m in report.mismatches[:3]]
    assert extra, shown
    # every mismatch is a step of the broken guard's actions, nothing else
    assert {m.kind for m in report.mismatches} <= {"extra", "missing"}, shown
    assert {m.action for m in report.mismatches} <= {str(a) for a in actions}, shown
    text = conformance.render_mismatch(report, extra[0])
    assert "path from an initial state:" in text and "the spec has no such step" in text


def test_the_situations_are_reached(graph: StateGraph) -> None:
    """The two variants are caught because DeepManual reaches their situations
    (not vacuously): a waiting call with an older attempt still in flight, and
    a recovery_required call in ``resume``."""
    cfg = model_config(MODEL)
    late = resume_halted = 0
    for state in graph.states.values():
        s = from_spec(cfg, state)
        for c in s.session.calls:
            attempt = s.session.record(c.execution_id).attempt
            if c.stage is p.Stage.WAITING and any(
                n < attempt for n in s.external.requests(c.execution_id)
            ):
                late += 1
            if (c.stage is p.Stage.RESUME and c.result is None
                    and s.session.record(c.execution_id).status
                    is p.LedgerStatus.RECOVERY_REQUIRED):
                resume_halted += 1
    assert late > 0 and resume_halted > 0, (late, resume_halted)


def test_the_transition_table_lists_every_stage_the_core_allows(graph: StateGraph) -> None:
    """The real core enables a per-call action only from the stages its row of
    ``TRANSITIONS`` lists (the table the docs are generated from is exact),
    and takes an answer only for the attempt its call waits for or (late)
    the attempt its record is still at."""
    cfg = model_config(MODEL)
    checked = 0
    for state in graph.states.values():
        s = from_spec(cfg, state)
        before = {c.position: c for c in s.session.calls}
        for action, nxt in successors(cfg, s):
            row = p.TRANSITIONS[action]
            for c in nxt.session.calls:
                old = before.get(c.position)
                if old is None or old == c or action is p.Action.Crash:
                    continue
                if action in ANSWERS:
                    # the wait, or a time-out's stage with the record still at
                    # the answer's attempt (a late answer is taken, not dropped)
                    assert old.stage in row.from_stages, (action, old.stage)
                    assert c.stage in (p.Stage.GOT_OK, p.Stage.GOT_FAIL)
                elif row.from_stages:
                    assert old.stage in row.from_stages, (action, old.stage)
                checked += 1
    assert checked > 1000  # the loop saw the steps (5,252 on DeepManual)


@pytest.mark.parametrize("variant", [None, "takes_late_answer", "resolves_before_recover"])
def test_the_memo_changes_no_verdict(graph: StateGraph, variant: str | None) -> None:
    """The conformance check memoises the core's answers per (session, event)
    and the spec image per reference state (toolledger.check.memo); asking
    every question afresh gives the same edges and the same mismatches, for
    the real core and for each too-permissive one."""

    def run(memoise: bool) -> conformance.ConformanceReport:
        with BROKEN[variant]() if variant is not None else nullcontext():
            return conformance.check_graph(model_config(MODEL), graph, model=MODEL,
                                           max_mismatches=10_000, memoise=memoise)

    fast, slow = run(True), run(False)
    assert fast.mismatch_count == slow.mismatch_count
    assert (variant is None) == (fast.mismatch_count == 0)
    assert fast.reference_edges == slow.reference_edges
    assert sorted((m.kind, m.node or 0, m.action or "") for m in fast.mismatches) == sorted(
        (m.kind, m.node or 0, m.action or "") for m in slow.mismatches)
    assert memo.active() is None  # dropped with its check: the next check asks its own core


def test_the_memo_answers_repeated_questions_once(graph: StateGraph) -> None:
    cfg = model_config(MODEL)
    states = [from_spec(cfg, s) for s in graph.states.values()]
    with memo.core_memo() as m:
        with_memo = [sorted(str(a) for a, _ in successors(cfg, s)) for s in states]
    without = [sorted(str(a) for a, _ in successors(cfg, s)) for s in states]
    assert with_memo == without
    # DeepManual: 5,708 states but a few hundred distinct sessions
    assert m.computed * 10 < m.asked, (m.computed, m.asked)
