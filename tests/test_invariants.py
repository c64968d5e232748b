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

from dataclasses import replace

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
    assert s.ghosts.decisions("c1") == {("recovery_required", 1)}
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
    inputs = s.audit_inputs[key]
    assert inputs.status is p.LedgerStatus.DISPATCHED and inputs.policy is p.RecoveryPolicy.MANUAL
    assert AuditRecomputable(CFG, s) == []
    # inputs that decide something else: an idempotent tool would be retried
    wrong = replace(s, audit_inputs={key: replace(inputs, policy=p.RecoveryPolicy.IDEMPOTENT)})
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
