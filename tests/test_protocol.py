"""The protocol core: decide_recovery is total, illegal events change nothing,
execution ids do not alias, bad input is refused with a clear message."""

from __future__ import annotations

import itertools
import re
from dataclasses import replace
from pathlib import Path

import pytest

from toolledger._core import protocol as p

ROOT = Path(__file__).resolve().parents[1]


def _all_inputs() -> list[p.RecoveryInputs]:
    return [
        p.RecoveryInputs(status, attempt, match, appr, has, pol, legacy, needs, 3, kept)
        for status, attempt, match, appr, has, pol, legacy, needs, kept in itertools.product(
            p.LedgerStatus, range(4), (True, False), p.ApprovalState, (True, False),
            p.RecoveryPolicy, (True, False), (True, False), (True, False),
        )
    ]  # fmt: skip


def test_decide_recovery_is_total_and_deterministic() -> None:
    inputs = _all_inputs()
    assert len(inputs) == 6 * 4 * 2 * 4 * 2 * 4 * 2 * 2 * 2
    for i in inputs:
        d = p.decide_recovery(i)
        assert isinstance(d.decision, p.Decision)
        assert d.inputs == i
        assert p.decide_recovery(i) == d  # a pure function of its inputs
    seen = {p.decide_recovery(i).decision for i in inputs}
    assert seen == set(p.Decision), "every decision is reachable"


@pytest.mark.parametrize(
    ("status", "policy", "expected"),
    [
        (p.LedgerStatus.SUCCEEDED, p.RecoveryPolicy.MANUAL, p.Decision.RECONSTRUCT),
        (p.LedgerStatus.FAILED, p.RecoveryPolicy.IDEMPOTENT, p.Decision.RECONSTRUCT),
        (p.LedgerStatus.DISPATCHED, p.RecoveryPolicy.IDEMPOTENT, p.Decision.RETRY_SAME_ID),
        (p.LedgerStatus.DISPATCHED, p.RecoveryPolicy.RECONCILE, p.Decision.RECONCILE),
        (p.LedgerStatus.DISPATCHED, p.RecoveryPolicy.MANUAL, p.Decision.RECOVERY_REQUIRED),
        (p.LedgerStatus.RECOVERY_REQUIRED, p.RecoveryPolicy.IDEMPOTENT,
         p.Decision.RECOVERY_REQUIRED),
        (p.LedgerStatus.NONE, p.RecoveryPolicy.MANUAL, p.Decision.EXECUTE),
    ],
)
def test_recovery_table_of_protocol_md(
    status: p.LedgerStatus, policy: p.RecoveryPolicy, expected: p.Decision
) -> None:
    i = p.RecoveryInputs(status, 1, True, p.ApprovalState.APPROVED, False, policy, False, True, 3)
    assert p.decide_recovery(i).decision is expected


def test_legacy_and_contradictions_fail_closed() -> None:
    base = p.RecoveryInputs(
        p.LedgerStatus.NONE, 0, True, p.ApprovalState.APPROVED, False,
        p.RecoveryPolicy.MANUAL, True, True, 3,
    )  # fmt: skip
    assert p.decide_recovery(base).decision is p.Decision.RECOVERY_REQUIRED
    no_approval_needed = replace(base, approval=p.ApprovalState.NONE, requires_approval=False)
    assert p.decide_recovery(no_approval_needed).decision is p.Decision.RECOVERY_REQUIRED
    pending = replace(base, approval=p.ApprovalState.PENDING)
    assert p.decide_recovery(pending).decision is p.Decision.EXECUTE
    mismatch = replace(base, status=p.LedgerStatus.SUCCEEDED, legacy=False, digest_matches=False)
    assert p.decide_recovery(mismatch).decision is p.Decision.RECOVERY_REQUIRED
    spent = replace(
        base, status=p.LedgerStatus.DISPATCHED, attempt=3, legacy=False,
        policy=p.RecoveryPolicy.IDEMPOTENT,
    )  # fmt: skip
    assert p.decide_recovery(spent).decision is p.Decision.RECOVERY_REQUIRED
    answered = replace(base, has_result=True)
    assert p.decide_recovery(answered).decision is p.Decision.SKIP


def test_transition_table_names_are_the_specs_actions() -> None:
    spec = (ROOT / "spec" / "DurableToolExecution.tla").read_text()
    next_body = spec.split("\nNext ==", 1)[1].split("\n\n", 1)[0]
    names = set(re.findall(r"(?:\\E [^:]+:\s*)?(\w+)\(", next_body)) | (
        {"Crash"} if re.search(r"\\/ Crash\b", next_body) else set()
    )
    assert names == {a.value for a in p.Action}
    assert set(p.TRANSITIONS) == set(p.Action)


def _session_with_call(policy: p.RecoveryPolicy = p.RecoveryPolicy.MANUAL) -> p.SessionState:
    s = p.new_session("sess", max_attempts=2)
    tool = p.ToolProfile("send_email", policy, True)
    digest = p.args_digest("send_email", {"to": "alice"})
    s = p.apply(s, p.Event(p.Action.ProviderEmitCall, (1, 0), "call_0", tool, digest))
    return p.apply(s, p.Event(p.Action.EnginePersistCall, (1, 0)))


def test_illegal_event_raises_and_changes_nothing() -> None:
    s = _session_with_call()
    before = s
    with pytest.raises(p.ProtocolError) as err:
        p.apply(s, p.Event(p.Action.EnginePersistDispatched, (1, 0)))
    assert "EnginePersistDispatched" in str(err.value)
    assert "(1, 0)" in str(err.value)
    assert "not approved" in str(err.value)
    assert s == before and s.ledger == {} and s.call((1, 0)) == before.call((1, 0))
    with pytest.raises(p.ProtocolError, match="stage is live, expected dispatched"):
        p.apply(s, p.Event(p.Action.EngineInvokeAdapter, (1, 0)))
    with pytest.raises(p.ProtocolError, match="no call at that position"):
        p.apply(s, p.Event(p.Action.HumanApprove, (9, 9)))


def test_happy_path_writes_dispatched_before_invoke_and_audits_it() -> None:
    s = _session_with_call()
    for a in (p.Action.EngineParkApproval, p.Action.HumanApprove,
              p.Action.EnginePersistDispatched):  # fmt: skip
        s = p.apply(s, p.Event(a, (1, 0)))
    call = s.call((1, 0))
    assert call is not None
    rec = s.record(call.execution_id)
    assert rec.status is p.LedgerStatus.DISPATCHED and rec.attempt == 1
    assert rec.authorization is p.Authorization.APPROVAL
    assert (call.execution_id, "dispatch", 1) in s.audit
    changes = p.durable_changes(_session_with_call(), s)
    assert [r.status for r in changes[2]] == [p.LedgerStatus.DISPATCHED]


def test_crash_keeps_durable_and_drops_volatile() -> None:
    s = p.new_session("sess")
    tool = p.ToolProfile("t", p.RecoveryPolicy.IDEMPOTENT, False)
    s = p.apply(s, p.Event(p.Action.ProviderEmitCall, (1, 0), "call_0", tool, "d"))
    crashed = p.apply(s, p.Event(p.Action.Crash))
    assert crashed.calls == ()  # the call was only in memory
    s = p.apply(s, p.Event(p.Action.EnginePersistCall, (1, 0)))
    crashed = p.apply(s, p.Event(p.Action.Crash))
    assert [c.stage for c in crashed.calls] == [p.Stage.RESUME]


@pytest.mark.parametrize("tool_call_id", ["call_0", "", "call_salvaged_0"])
def test_reused_provider_ids_get_distinct_execution_ids(tool_call_id: str) -> None:
    ids = {
        p.derive_execution_id("sess", turn, slot, tool_call_id)
        for turn in range(3)
        for slot in range(3)
    }
    assert len(ids) == 9
    assert p.derive_execution_id("sess", 1, 0, tool_call_id) == p.derive_execution_id(
        "sess", 1, 0, tool_call_id
    )
    assert p.derive_execution_id("other", 1, 0, tool_call_id) not in ids


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("", 1, 0, "x"), "session_id must be a non-empty string"),
        (("s", -1, 0, "x"), "turn must be a non-negative int"),
        (("s", 1, True, "x"), "slot must be a non-negative int"),
        (("s", 1, 0, 7), "tool_call_id must be a string"),
        (("s", 1, 0, None), "tool_call_id must be a string"),
        (("s", 1, 0, "x" * 513), "at most 512 are accepted"),
    ],
)
def test_malformed_ids_are_refused(args: tuple[object, ...], message: str) -> None:
    with pytest.raises(p.InvalidInput, match=message):
        p.derive_execution_id(*args)  # type: ignore[arg-type]


def test_unknown_policy_is_refused_with_the_valid_ones() -> None:
    with pytest.raises(p.InvalidInput, match="declare one of: readonly, manual, idempotent"):
        p.ToolProfile("t", "yolo")  # type: ignore[arg-type]
    assert p.ToolProfile("t", "idempotent").policy is p.RecoveryPolicy.IDEMPOTENT  # type: ignore[arg-type]
    with pytest.raises(p.InvalidInput, match="not JSON-serializable"):
        p.args_digest("t", {"x": object()})


def test_an_idempotent_retry_needs_the_key_retained() -> None:
    """Row 6' of the recovery table: past the key's retention window the
    external system may have forgotten the key, so no retry with the same id."""
    kept = p.RecoveryInputs(
        p.LedgerStatus.DISPATCHED, 1, True, p.ApprovalState.APPROVED, False,
        p.RecoveryPolicy.IDEMPOTENT, False, True, 3,
    )  # fmt: skip
    assert kept.key_retained  # the default: keys are kept forever
    assert p.decide_recovery(kept).decision is p.Decision.RETRY_SAME_ID
    expired = replace(kept, key_retained=False)
    assert p.decide_recovery(expired).decision is p.Decision.RECOVERY_REQUIRED
    assert expired.as_dict()["key_retained"] is False
    # keyRetained matters for nothing but an idempotent retry
    for status, policy in [(p.LedgerStatus.SUCCEEDED, p.RecoveryPolicy.IDEMPOTENT),
                           (p.LedgerStatus.DISPATCHED, p.RecoveryPolicy.RECONCILE)]:
        i = replace(kept, status=status, policy=policy)
        assert p.decide_recovery(i).decision is p.decide_recovery(
            replace(i, key_retained=False)).decision  # fmt: skip


def _waiting(policy: p.RecoveryPolicy) -> p.SessionState:
    s = _session_with_call(policy)
    for a in (p.Action.EngineParkApproval, p.Action.HumanApprove,
              p.Action.EnginePersistDispatched, p.Action.EngineInvokeAdapter):  # fmt: skip
        s = p.apply(s, p.Event(a, (1, 0), at=1000.0))
    return s


def test_a_late_return_is_refused_as_an_answer_and_discarded() -> None:
    """A return for an older attempt is discarded: the core refuses to take it
    as the current attempt's answer, and refuses to discard the answer of the
    attempt the call waits for, or (after a time-out) of the attempt its record
    is still at: that one is taken (docs/protocol.md#late-answers)."""
    s = _waiting(p.RecoveryPolicy.IDEMPOTENT)
    with pytest.raises(p.ProtocolError, match="deliver it instead of discarding it"):
        p.apply(s, p.Event(p.Action.EngineDiscardLateReturn, (1, 0), attempt=1))
    # time-out, retry_same_id: attempt 2 is sent while attempt 1 may still land
    for a in (p.Action.EngineTimeout, p.Action.Recover, p.Action.EnginePersistDispatched,
              p.Action.EngineInvokeAdapter):  # fmt: skip
        s = p.apply(s, p.Event(a, (1, 0)))
    call = s.call((1, 0))
    assert call is not None and s.record(call.execution_id).attempt == 2
    for answer in (p.Action.ExternalApply, p.Action.ExternalRejectDefinite):
        with pytest.raises(p.ProtocolError, match="for attempt 1, the engine waits for 2"):
            p.apply(s, p.Event(answer, (1, 0), attempt=1))
    assert p.apply(s, p.Event(p.Action.EngineDiscardLateReturn, (1, 0), attempt=1)) == s
    # after a time-out nothing waits: attempt 1's return is still late, but
    # attempt 2's is the answer of the attempt the record is at, and is taken
    timed_out = p.apply(s, p.Event(p.Action.EngineTimeout, (1, 0)))
    with pytest.raises(p.ProtocolError, match="expected waiting"):
        p.apply(timed_out, p.Event(p.Action.ExternalApply, (1, 0), attempt=1))
    assert p.apply(
        timed_out, p.Event(p.Action.EngineDiscardLateReturn, (1, 0), attempt=1)
    ) == timed_out
    with pytest.raises(p.ProtocolError, match="its late return is the attempt's answer"):
        p.apply(timed_out, p.Event(p.Action.EngineDiscardLateReturn, (1, 0), attempt=2))
    taken = p.apply(timed_out, p.Event(p.Action.ExternalApply, (1, 0), attempt=2))
    assert taken.call((1, 0)).stage is p.Stage.GOT_OK  # type: ignore[union-attr]


def test_the_first_dispatch_time_is_kept_and_the_window_passes_once() -> None:
    s = _waiting(p.RecoveryPolicy.IDEMPOTENT)
    call = s.call((1, 0))
    assert call is not None
    eid = call.execution_id
    assert s.record(eid).dispatched_at == 1000.0
    s = p.apply(s, p.Event(p.Action.EngineTimeout, (1, 0)))
    s = p.apply(s, p.Event(p.Action.Recover, (1, 0)))
    s = p.apply(s, p.Event(p.Action.EnginePersistDispatched, (1, 0), at=2000.0))
    assert s.record(eid).attempt == 2 and s.record(eid).dispatched_at == 1000.0
    passed = p.apply(s, p.Event(p.Action.RetentionWindowPasses, (1, 0)))
    assert passed.retention_passed == {eid}
    with pytest.raises(p.ProtocolError, match="already passed"):
        p.apply(passed, p.Event(p.Action.RetentionWindowPasses, (1, 0)))
    # the clock survives a crash; the restarted engine halts instead of retrying
    crashed = p.apply(passed, p.Event(p.Action.Crash))
    assert not p.recovery_inputs(crashed, crashed.calls[0]).key_retained
    halted = p.apply(crashed, p.Event(p.Action.Recover, (1, 0)))
    assert halted.record(eid).status is p.LedgerStatus.RECOVERY_REQUIRED
    # a manual call has no key, an undispatched call no window
    manual = _waiting(p.RecoveryPolicy.MANUAL)
    with pytest.raises(p.ProtocolError, match="only an idempotent tool's key"):
        p.apply(manual, p.Event(p.Action.RetentionWindowPasses, (1, 0)))
    fresh = _session_with_call(p.RecoveryPolicy.IDEMPOTENT)
    with pytest.raises(p.ProtocolError, match="never dispatched"):
        p.apply(fresh, p.Event(p.Action.RetentionWindowPasses, (1, 0)))


@pytest.mark.parametrize("window", [0, -5, True, "1h"])
def test_a_bad_retention_window_is_refused(window: object) -> None:
    with pytest.raises(p.InvalidInput, match="retention_window of 'mail' must be a positive"):
        p.ToolProfile("mail", p.RecoveryPolicy.IDEMPOTENT, True, window)  # type: ignore[arg-type]
    assert p.ToolProfile("mail", p.RecoveryPolicy.IDEMPOTENT, True, 86400).retention_window == 86400
