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

import pytest

from checker_support import BROKEN, ROOT, model_config
from toolledger._core import protocol as p
from toolledger.check import conformance
from toolledger.check.manifest import load_manifest
from toolledger.check.mapping import from_spec
from toolledger.check.stategraph import StateGraph, load_dot
from toolledger.check.system import successors
from toolledger.check.tlc import Outcome, run_tlc

pytestmark = pytest.mark.slow

MODEL = "DeepManual"
ANSWERS = (p.Action.ExternalApply, p.Action.ExternalRejectDefinite)
RESOLVES = (p.Action.HumanResolveApplied, p.Action.HumanResolveRetry,
            p.Action.HumanResolveAbandon)


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> StateGraph:
    entry = load_manifest(ROOT).get(MODEL)
    dot = tmp_path_factory.mktemp("dump") / f"{MODEL}.dot"
    result = run_tlc(entry.module, entry.cfg_path, search_dirs=[ROOT / "spec", ROOT / "model"],
                     check_deadlock=entry.check_deadlock, dump_dot=dot)
    assert result.outcome is Outcome.PASS
    assert result.distinct_states == entry.distinct_states
    return load_dot(dot)


def test_the_real_core_conforms(graph: StateGraph) -> None:
    report = conformance.check_graph(model_config(MODEL), graph, model=MODEL)
    details = "\n".join(conformance.render_mismatch(report, m) for m in report.mismatches)
    assert report.mismatch_count == 0, details
    assert report.reference_edges == report.edges == len(graph.edges)


@pytest.mark.parametrize(
    ("variant", "actions"),
    # a late answer taken is also the spec's EngineDiscardLateReturn "missing"
    [("takes_late_answer", (*ANSWERS, p.Action.EngineDiscardLateReturn)),
     ("resolves_before_recover", RESOLVES)],
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
    and takes an answer only for the attempt its call waits for."""
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
                    assert old.stage is p.Stage.WAITING
                    assert c.stage is not p.Stage.WAITING
                elif row.from_stages:
                    assert old.stage in row.from_stages, (action, old.stage)
                checked += 1
    assert checked > 1000  # the loop saw the steps (5,252 on DeepManual)
