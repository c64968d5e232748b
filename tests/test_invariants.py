"""Each invariant added or strengthened for issue 11 catches a state that breaks it.

Under test: ``toolledger.check.invariants``.  A legitimate state is reached by a
walk of the closed-world model (TwoCalls constants); the violating state is
that state with the one thing a broken engine would change: an attempt sent
twice, a request sent after a known outcome, a decision without its audit
row, a decision row that does not recompute, an error or denied result that
says something false.  Each check must pass on the legitimate state and
name the problem on the broken one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest

from checker_support import model_config
from toolledger._core import protocol as p
from toolledger.check.invariants import (
    INVARIANTS,
    AtMostOnceEffect,
    AttemptSentOnce,
    AuditComplete,
    AuditRecomputable,
    NoReinvokeAfterKnownOutcome,
    ResultFidelity,
    check_all,
)
from toolledger.check.system import ModelConfig, SystemState, initial_states, successors
from toolledger.check.tlavalues import FnValue

CFG = model_config("TwoCalls")
A = p.Action


def walk(cfg: ModelConfig, *plan: p.Action) -> SystemState:
    s = initial_states(cfg)[0]
    for action in plan:
        s = next(n for a, n in successors(cfg, s) if a is action)
    assert check_all(cfg, s) == {}, check_all(cfg, s)
    return s


SENT = (A.ProviderEmitCall, A.EnginePersistCall, A.EngineParkApproval, A.HumanApprove,
        A.EnginePersistDispatched, A.EngineInvokeAdapter)  # fmt: skip


def test_the_new_names_are_registered() -> None:
    assert {"AttemptSentOnce", "AuditRecomputable"} <= set(INVARIANTS)


def test_attempt_sent_once_sees_a_resent_attempt() -> None:
    s = walk(CFG, *SENT, A.Crash)
    assert s.ghosts.sent == {("c1", 1): 1}
    # a resume path re-sends attempt 1: inflight and invocations are sets and
    # do not change; only the count per (call, attempt) does
    resent = replace(s, ghosts=replace(s.ghosts, sent={("c1", 1): 2}))
    assert AttemptSentOnce(CFG, resent) == ["c1: attempt 1 sent 2 times"]
    assert set(check_all(CFG, resent)) == {"AttemptSentOnce"}


def test_no_reinvoke_is_about_history() -> None:
    s = walk(CFG, *SENT, A.ExternalApply, A.EngineRecordSucceeded)
    assert s.ghosts.known_outcome == {"c1"}
    assert NoReinvokeAfterKnownOutcome(CFG, s) == []
    # the record was overwritten (dispatched again) and the call sent again:
    # the record's current status no longer says "succeeded", the history does
    later = replace(s, ghosts=replace(s.ghosts, sent_after_outcome={"c1": 1}))
    assert NoReinvokeAfterKnownOutcome(CFG, later) == [
        "c1: 1 request(s) sent after its outcome was durable"
    ]


def test_audit_complete_needs_a_row_for_every_decision() -> None:
    s = walk(CFG, *SENT, A.EngineTimeout, A.Recover)
    [(kind, n, inputs)] = s.ghosts.decisions("c1")
    assert (kind, n) == ("recovery_required", 1) and inputs is not None
    assert AuditComplete(CFG, s) == []
    e = CFG.exec_ids["c1"]
    unaudited = replace(
        s,
        session=replace(s.session, audit=s.session.audit - {(e, "recovery_required", 1)}),
    )
    assert AuditComplete(CFG, unaudited) == [
        "c1: decision recovery_required (attempt 1) has no audit row"
    ]


def test_audit_recomputable_recomputes_every_decision_row() -> None:
    s = walk(CFG, *SENT, A.EngineTimeout, A.Recover)
    e = CFG.exec_ids["c1"]
    key = (e, "recovery_required", 1)
    [inputs] = s.audit_inputs[key]
    assert inputs.status is p.LedgerStatus.DISPATCHED and inputs.policy is p.RecoveryPolicy.MANUAL
    assert AuditRecomputable(CFG, s) == []
    # inputs that decide something else: an idempotent tool would be retried
    wrong = replace(
        s, audit_inputs={key: frozenset({replace(inputs, policy=p.RecoveryPolicy.IDEMPOTENT)})}
    )
    assert AuditRecomputable(CFG, wrong) == [
        f"audit row recovery_required (attempt 1) of {e} recomputes to retry_same_id"
    ]
    missing = replace(s, audit_inputs={})
    assert AuditRecomputable(CFG, missing) == [
        f"audit row recovery_required (attempt 1) of {e} has no inputs"
    ]


def test_result_fidelity_covers_error_and_denied() -> None:
    s = walk(CFG, *SENT, A.ExternalRejectDefinite, A.EngineRecordFailed, A.EngineAppendResult)
    e = CFG.exec_ids["c1"]
    assert s.session.calls[0].result is not None
    assert ResultFidelity(CFG, s) == []
    # a manual call's error beside an applied effect no human retry explains
    applied = replace(
        s,
        external=replace(s.external, applied={e: 1}),
        ghosts=replace(s.ghosts, effects={"c1": 1}),
    )
    assert ResultFidelity(CFG, applied) == [
        "c1: shows an error beside 1 applied effect(s), 0 explained by human retries and "
        "the policy"
    ]
    retried = replace(applied, ghosts=replace(applied.ghosts, human_retries={e: 1}))
    assert ResultFidelity(CFG, retried) == []
    # a denied result for a call that was sent
    c1 = s.session.calls[0]
    assert c1.result is not None
    denied = replace(c1, result=replace(c1.result, kind=p.ResultKind.DENIED))
    lying = replace(s, session=replace(s.session, calls=(denied, *s.session.calls[1:])))
    assert ResultFidelity(CFG, lying) == ["c1: shows denied, yet it was sent"]


def test_result_fidelity_reads_the_calls_own_effect() -> None:
    """Issue 11 item 3: an "ok" answered from another call's deduplicated
    request (the key was applied, this call's own request never was) is caught:
    the effects are keyed by the call, not by the execution id."""
    s = walk(CFG, *SENT, A.ExternalApply, A.EngineRecordSucceeded, A.EngineAppendResult)
    e = CFG.exec_ids["c1"]
    assert s.external.applied == {e: 1} and s.ghosts.effects == {"c1": 1}
    assert ResultFidelity(CFG, s) == [] and AtMostOnceEffect(CFG, s) == []
    # the key holds an effect, but not this call's: another call's request
    borrowed = replace(s, ghosts=replace(s.ghosts, effects={}))
    assert ResultFidelity(CFG, borrowed) == [
        "c1: shows a successful result that was never applied"
    ]
    # two effects of the key, one per call, are not one call applied twice
    twice_key = replace(s, external=replace(s.external, applied={e: 2}))
    assert AtMostOnceEffect(CFG, twice_key) == []
    twice_call = replace(s, ghosts=replace(s.ghosts, effects={"c1": 2}))
    assert AtMostOnceEffect(CFG, twice_call) == [
        "c1: effect applied 2 times, at most 1 allowed"
    ]


def _rows(cfg: ModelConfig, s: SystemState) -> dict[str, FnValue]:
    """The spec audit rows of c1's execution: kind -> inputs record."""
    from toolledger.check.mapping import to_spec

    audit = to_spec(cfg, s)["audit"]
    assert isinstance(audit, FnValue)
    rows = audit[CFG.spec_exec_ids["c1"]]
    assert isinstance(rows, frozenset)
    out = {}
    for row in rows:
        assert isinstance(row, tuple) and isinstance(row[2], FnValue)
        out[str(row[0])] = row[2]
    return out


def test_the_mapping_writes_row_inputs_as_the_model_does() -> None:
    """A model whose .cfg writes decision rows without inputs
    (MCDecisionRowsWithInputs == FALSE) maps to NoInputs rows; the others to
    the DecisionInputs record, and back."""
    from toolledger.check.mapping import from_spec, to_spec

    assert CFG.decision_rows_with_inputs is False  # TwoCalls
    full = replace(CFG, decision_rows_with_inputs=True)
    s = walk(full, *SENT, A.EngineTimeout, A.Recover)
    rows = _rows(full, s)
    assert rows["recovery_required"]["status"] == "dispatched"
    assert rows["recovery_required"]["policy"] == "manual"
    assert rows["dispatch"]["policy"] == "none"
    assert from_spec(full, to_spec(full, s)).audit_inputs == s.audit_inputs
    bare = _rows(CFG, s)
    assert bare["recovery_required"] == bare["dispatch"]
    assert from_spec(CFG, to_spec(CFG, s)).audit_inputs == {}


def test_answered_is_stronger_than_settled() -> None:
    """A halted call with no result is settled (recovery_required) but not answered:
    EventuallyAnswered's predicate names it, EventuallySettled's does not."""
    from toolledger.check.invariants import answered, settled

    s = walk(CFG, *SENT, A.Crash)
    s = next(n for a, n in successors(CFG, s) if a is A.Recover)
    halted = [c for c in s.session.calls if c.result is None
              and s.session.record(c.execution_id).status is p.LedgerStatus.RECOVERY_REQUIRED]
    assert halted, "the manual call halts after a crash with its attempt dispatched"
    name = next(cc.name for cc in CFG.calls if cc.position == halted[0].position)
    assert not any(line.startswith(f"{name}:") for line in settled(CFG, s))
    assert any(line.startswith(f"{name}: no result") for line in answered(CFG, s))


# A halted manual call (recovery_required, attempt 1) that a crash hands to
# Recover again: the same decision for the same attempt, on other inputs (the
# record is halted now, not dispatched).
HALTED_TWICE = (*SENT, A.EngineTimeout, A.Recover, A.Crash, A.Recover)


def test_every_decision_keeps_its_row() -> None:
    """Issue 25 point 2: a decision taken again for the same attempt is a row of
    its own (the audit key, execution/kind/attempt, is the same), and so is a
    decision of the complete model, through the mapping and back."""
    from toolledger.check.mapping import from_spec, to_spec

    full = replace(CFG, decision_rows_with_inputs=True)
    s = walk(full, *HALTED_TWICE)
    key = (full.exec_ids["c1"], "recovery_required", 1)
    rows = s.audit_inputs[key]
    assert {i.status for i in rows} == {p.LedgerStatus.DISPATCHED,
                                        p.LedgerStatus.RECOVERY_REQUIRED}
    assert {i for _, _, i in s.ghosts.decisions("c1")} == rows
    spec_rows = [r for r in _spec_rows(full, s) if r[0] == "recovery_required"]
    assert len(spec_rows) == 2
    back = from_spec(full, to_spec(full, s))
    assert back.audit_inputs == s.audit_inputs and back.ghosts.decided == s.ghosts.decided


def _spec_rows(cfg: ModelConfig, s: SystemState) -> list[tuple[object, ...]]:
    from toolledger.check.mapping import to_spec

    audit = to_spec(cfg, s)["audit"]
    assert isinstance(audit, FnValue)
    rows = audit[cfg.spec_exec_ids["c1"]]
    assert isinstance(rows, frozenset)
    return [r for r in rows if isinstance(r, tuple)]


Rows = Mapping[p.AuditKey, frozenset[p.RecoveryInputs]]


def _first_row_only(rows: Rows, key: p.AuditKey | None, inputs: p.RecoveryInputs) -> Rows:
    """A broken store: the old keying, one decision row per audit key."""
    if key is None or key in rows:
        return rows
    return {**rows, key: frozenset({inputs})}


def _last_row_only(rows: Rows, key: p.AuditKey | None, inputs: p.RecoveryInputs) -> Rows:
    """A broken store: a decision row written over the earlier one of its key."""
    return rows if key is None else {**rows, key: frozenset({inputs})}


def test_audit_complete_catches_a_store_that_drops_or_overwrites_a_repeated_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from toolledger.check import system

    assert check_all(CFG, walk(CFG, *HALTED_TWICE)) == {}
    for broken, lost in ((_first_row_only, p.LedgerStatus.RECOVERY_REQUIRED),
                         (_last_row_only, p.LedgerStatus.DISPATCHED)):
        with monkeypatch.context() as m:
            m.setattr(system, "append_decision_row", broken)
            s = initial_states(CFG)[0]
            for action in HALTED_TWICE:
                s = next(n for a, n in successors(CFG, s) if a is action)
        assert check_all(CFG, s) == {"AuditComplete": [
            f"c1: decision recovery_required (attempt 1) on status {lost.value} has no "
            "audit row of its own"
        ]}, broken.__name__


def _re_halts_abandoned(i: p.RecoveryInputs) -> p.RecoveryDecision:
    """A broken core (the ReHaltAbandoned twin): a call a human abandoned is
    halted for a human again instead of reconstructed."""
    got = _DECIDE(i)
    if not i.has_result and i.status is p.LedgerStatus.ABANDONED:
        return replace(got, decision=p.Decision.RECOVERY_REQUIRED)
    return got


_DECIDE = p.decide_recovery
ABANDON_THEN_RECOVER = (*SENT, A.EngineTimeout, A.Recover, A.HumanResolveAbandon, A.Recover)


def test_audit_recomputable_sees_a_repeated_wrong_decision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The issue's case: a wrong decision taken again for an attempt that an
    earlier row of that kind covers.  With every row kept AuditRecomputable
    sees it; with the old keying (first row only) it cannot, and only the
    complete AuditComplete notices the dropped row."""
    from toolledger.check import system

    def run(*patches: tuple[object, str, object]) -> SystemState:
        with monkeypatch.context() as m:
            for target, name, value in patches:
                m.setattr(target, name, value)
            s = initial_states(CFG)[0]
            for action in ABANDON_THEN_RECOVER:
                s = next(n for a, n in successors(CFG, s) if a is action)
            return s

    # the core's Recover, its audit key and the checker's ghost all read it
    broken = [(p, "decide_recovery", _re_halts_abandoned)]
    s = run(*broken)
    assert s.session.record(CFG.exec_ids["c1"]).status is p.LedgerStatus.RECOVERY_REQUIRED
    e = CFG.exec_ids["c1"]
    assert check_all(CFG, s) == {"AuditRecomputable": [
        f"audit row recovery_required (attempt 1) of {e} recomputes to reconstruct"
    ]}
    # the old keying: the repeated row is dropped, so AuditRecomputable cannot
    # see the decision (with the old AuditComplete, by kind and attempt only,
    # nothing did); the complete AuditComplete names the row that is missing
    hidden = run(*broken, (system, "append_decision_row", _first_row_only))
    assert check_all(CFG, hidden) == {"AuditComplete": [
        "c1: decision recovery_required (attempt 1) on status abandoned has no audit row "
        "of its own"
    ]}
