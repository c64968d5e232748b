"""The Ledger facade over both stores: what it commits, when, and with which audit rows.

Under test: ``toolledger._core.ledger.Ledger`` on ``MemoryStore`` and ``SqliteStore``.
The oracle for durability is the core itself: after every step, what the
store loads (and what a freshly reopened store loads) must equal
``durable_projection(ledger.state)``, the core's own ``Crash`` of the
in-memory state.  Hypothesis drives random valid sequences of protocol events,
found by trying ``protocol.enabled`` on every candidate event, with crashes,
batches, result contents, arguments and human resolutions mixed in.  The
costs (commits and ledger commits per protected and readonly call) are
counted by the stores and, for SQLite, cross-checked against the COMMIT
statements SQLite really ran in ``test_sqlite_store.py``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from toolledger._core import protocol as p
from toolledger._core.ledger import RESOLUTIONS, Ledger
from toolledger._core.sqlite_store import SqliteStore
from toolledger._core.stores import (
    MemoryStore,
    StaleState,
    Store,
    UnknownSession,
    durable_projection,
    working_set,
)

A = p.Action
E = p.Event
SID = "s1"

MANUAL = p.ToolProfile("send_email", p.RecoveryPolicy.MANUAL, True)
IDEMPOTENT = p.ToolProfile("create_ticket", p.RecoveryPolicy.IDEMPOTENT, False)
RECONCILE = p.ToolProfile("move_money", p.RecoveryPolicy.RECONCILE, True)
READONLY = p.ToolProfile("read_file", p.RecoveryPolicy.READONLY, False)
PROFILES = (
    MANUAL,
    IDEMPOTENT,
    RECONCILE,
    READONLY,
    p.ToolProfile("manual_auto", p.RecoveryPolicy.MANUAL, False),
    p.ToolProfile("idem_approved", p.RecoveryPolicy.IDEMPOTENT, True),
    p.ToolProfile("reconcile_auto", p.RecoveryPolicy.RECONCILE, False),
    p.ToolProfile("readonly_approved", p.RecoveryPolicy.READONLY, True),
)


class Harness:
    """A store of one kind, what a restart of the process does to it, and an observer.

    The observer is a second store object on the same file, open for the
    whole test (another process): it sees exactly what was committed.
    """

    def __init__(self, kind: str, directory: Path | None) -> None:
        self.kind = kind
        self.path = (directory or Path("unused")) / "ledger.db"
        self.store: MemoryStore | SqliteStore = self._open()
        self._observer: SqliteStore | None = None

    def _open(self) -> MemoryStore | SqliteStore:
        return MemoryStore() if self.kind == "memory" else SqliteStore(self.path)

    def restart(self) -> MemoryStore | SqliteStore:
        """The process dies and a new one opens the store."""
        if isinstance(self.store, MemoryStore):
            self.store.crash()
        else:
            self.store.close()
            self.store = SqliteStore(self.path)
        return self.store

    def fresh_view(self) -> p.SessionState:
        """What another process reading the store now loads."""
        if isinstance(self.store, MemoryStore):
            return self.store.load(SID)
        if self._observer is None:
            self._observer = SqliteStore(self.path)
        return self._observer.load(SID)

    def reopened_view(self) -> p.SessionState:
        """What a process that opens the store file now loads."""
        if isinstance(self.store, MemoryStore):
            return self.store.load(SID)
        with SqliteStore(self.path) as other:
            return other.load(SID)

    def close(self) -> None:
        self.store.close()
        if self._observer is not None:
            self._observer.close()


@pytest.fixture(params=["memory", "sqlite"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    h = Harness(str(request.param), tmp_path)
    yield h
    h.close()


def emit(
    pos: p.CallPosition, tool: p.ToolProfile, args: Mapping[str, object], tcid: str = "call_0"
) -> E:
    return E(A.ProviderEmitCall, pos, tcid, tool, p.args_digest(tool.name, args))


def dispatch_protected(ledger: Ledger, pos: p.CallPosition, tool: p.ToolProfile) -> None:
    """Emit, persist, approve (if needed) and dispatch one call."""
    args = {"n": pos[1]}
    ledger.step(emit(pos, tool, args), arguments=args)
    ledger.step(E(A.EnginePersistCall, pos))
    if tool.requires_approval:
        ledger.step(E(A.EngineParkApproval, pos))
        ledger.step(E(A.HumanApprove, pos))
    ledger.step(E(A.EnginePersistDispatched, pos))


def assert_durable_agrees(h: Harness, ledger: Ledger) -> None:
    full = ledger.full_state()
    # The ledger keeps exactly the working set in memory, and a restart loads it back.
    assert ledger.state == working_set(full)
    assert h.store.load_working_set(SID) == durable_projection(ledger.state)
    expected = durable_projection(full)
    assert h.store.load(SID) == expected
    assert h.fresh_view() == expected
    rows = ledger.audit()
    assert {r.key for r in rows} == set(expected.audit)
    calls = {c.execution_id: c for c in expected.calls}
    for r in rows:
        assert (calls[r.execution_id].tool_call_id, calls[r.execution_id].position) == (
            r.tool_call_id,
            r.position,
        )


def counts(store: Store) -> tuple[int, int]:
    return store.commits, store.ledger_commits


# --------------------------------------------------------------------------
# What a call costs
# --------------------------------------------------------------------------


def test_protected_call_costs_exactly_two_ledger_commits(harness: Harness) -> None:
    ledger = Ledger.create(harness.store, SID)
    pos = (0, 0)
    args = {"to": "a@example.com"}
    ledger.step(emit(pos, MANUAL, args), arguments=args)
    assert counts(harness.store) == (1, 0)  # create_session only: the emit is volatile
    ledger.step(E(A.EnginePersistCall, pos))
    ledger.step(E(A.EngineParkApproval, pos))
    ledger.step(E(A.HumanApprove, pos))
    assert counts(harness.store) == (4, 0)
    ledger.step(E(A.EnginePersistDispatched, pos))
    assert counts(harness.store) == (5, 1)
    ledger.step(E(A.EngineInvokeAdapter, pos))
    ledger.step(E(A.ExternalApply, pos, attempt=1))
    assert counts(harness.store) == (5, 1)  # invoking and the answer write nothing
    ledger.step_many(
        [E(A.EngineRecordSucceeded, pos), E(A.EngineAppendResult, pos)],
        result_content={pos: "queued as 42"},
    )
    assert counts(harness.store) == (6, 2)
    loaded = harness.restart().load(SID)
    call = loaded.call(pos)
    assert call is not None and call.result is not None
    assert (call.result.kind, call.result.content) == (p.ResultKind.OK, "queued as 42")
    assert loaded.record(call.execution_id).status is p.LedgerStatus.SUCCEEDED


def test_readonly_call_costs_no_ledger_commit(harness: Harness) -> None:
    ledger = Ledger.create(harness.store, SID)
    pos = (0, 0)
    ledger.step(emit(pos, READONLY, {"path": "a"}))
    ledger.step(E(A.EnginePersistCall, pos))
    before = counts(harness.store)
    ledger.step(E(A.EngineInvokeReadonly, pos))
    assert counts(harness.store) == before  # running a readonly tool commits nothing
    ledger.step(E(A.EngineAppendResult, pos), result_content="file text")
    assert counts(harness.store) == (before[0] + 1, 0)
    assert harness.store.ledger_commits == 0
    assert ledger.state.ledger == {}
    call = harness.restart().load(SID).call(pos)
    assert call is not None and call.result is not None
    assert call.result.content == "file text"


def test_timeout_commits_nothing_and_halts_on_recover(harness: Harness) -> None:
    ledger = Ledger.create(harness.store, SID)
    pos = (0, 0)
    dispatch_protected(ledger, pos, MANUAL)
    ledger.step(E(A.EngineInvokeAdapter, pos))
    before = counts(harness.store)
    ledger.step(E(A.EngineTimeout, pos))
    assert counts(harness.store) == before
    ledger.step(E(A.Recover, pos))
    assert counts(harness.store) == (before[0] + 1, before[1] + 1)  # recovery_required record
    assert [c.position for c in ledger.recovery_required()] == [pos]


# --------------------------------------------------------------------------
# Refused input writes nothing
# --------------------------------------------------------------------------


def test_refused_event_changes_nothing(harness: Harness) -> None:
    ledger = Ledger.create(harness.store, SID)
    pos = (0, 0)
    ledger.step(emit(pos, MANUAL, {}))
    ledger.step(E(A.EnginePersistCall, pos))
    state, before = ledger.state, counts(harness.store)
    with pytest.raises(p.ProtocolError, match=r"EnginePersistDispatched.*not approved"):
        ledger.step(E(A.EnginePersistDispatched, pos))
    assert ledger.state is state
    assert counts(harness.store) == before
    assert harness.store.load(SID) == durable_projection(state)


def test_batch_refused_part_way_writes_none_of_it(harness: Harness) -> None:
    ledger = Ledger.create(harness.store, SID)
    pos = (0, 0)
    ledger.step(emit(pos, MANUAL, {}))
    state, before = ledger.state, counts(harness.store)
    with pytest.raises(p.ProtocolError, match="HumanApprove"):
        ledger.step_many(
            [E(A.EnginePersistCall, pos), E(A.EngineParkApproval, pos), E(A.HumanApprove, (0, 1))]
        )
    assert ledger.state is state
    assert counts(harness.store) == before
    assert harness.store.load(SID).calls == ()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"result_content": "x"}, "no event creates a result"),
        ({"arguments": {"a": 1}}, "emit no call there"),
    ],
)
def test_content_or_arguments_without_their_event_are_refused(
    harness: Harness, kwargs: dict[str, object], message: str
) -> None:
    ledger = Ledger.create(harness.store, SID)
    pos = (0, 0)
    ledger.step(emit(pos, MANUAL, {}))
    state = ledger.state
    with pytest.raises(p.InvalidInput, match=message):
        ledger.step(E(A.EnginePersistCall, pos), **kwargs)  # type: ignore[arg-type]
    assert ledger.state is state
    assert harness.store.load(SID).calls == ()


def test_arguments_must_match_the_digest(harness: Harness) -> None:
    ledger = Ledger.create(harness.store, SID)
    with pytest.raises(p.InvalidInput, match="do not match"):
        ledger.step(emit((0, 0), MANUAL, {"to": "a"}), arguments={"to": "b"})
    assert ledger.state.calls == ()


def test_silent_external_moves_commit_nothing(harness: Harness) -> None:
    ledger = Ledger.create(harness.store, SID)
    dispatch_protected(ledger, (0, 0), RECONCILE)
    ledger.step(E(A.EngineInvokeAdapter, (0, 0)))
    state, before = ledger.state, counts(harness.store)
    for action in (A.ExternalApplyLoseAnswer, A.ExternalDropFenced):
        assert ledger.step(E(action, (0, 0), attempt=1)) == state
    assert counts(harness.store) == before


def test_batch_cannot_hold_a_crash(harness: Harness) -> None:
    ledger = Ledger.create(harness.store, SID)
    with pytest.raises(p.InvalidInput, match="Crash cannot be part of a batch"):
        ledger.step_many([E(A.Crash)])


def test_unknown_session(harness: Harness) -> None:
    with pytest.raises(UnknownSession, match="no session 'nope'") as info:
        Ledger(harness.store, "nope")
    assert isinstance(info.value, KeyError)


# --------------------------------------------------------------------------
# Crashes, arguments, stale engines
# --------------------------------------------------------------------------


def test_crash_keeps_durable_calls_and_their_arguments_only(harness: Harness) -> None:
    ledger = Ledger.create(harness.store, SID)
    durable_args = {"to": "a", "body": "é"}
    ledger.step(emit((0, 0), MANUAL, durable_args), arguments=durable_args)
    ledger.step(emit((0, 1), MANUAL, {"to": "b"}), arguments={"to": "b"})
    ledger.step(E(A.EnginePersistCall, (0, 0)))
    assert ledger.call_arguments((0, 1)) == {"to": "b"}  # volatile, in memory
    state = ledger.step(E(A.Crash))
    assert [c.position for c in state.calls] == [(0, 0)]
    assert state.calls[0].stage is p.Stage.RESUME
    assert ledger.call_arguments((0, 0)) == durable_args
    assert ledger.call_arguments((0, 1)) is None
    store = harness.restart()
    assert store.call_arguments(SID, (0, 0)) == durable_args


def test_two_engines_on_one_session_cannot_both_write(harness: Harness) -> None:
    first = Ledger.create(harness.store, SID)
    second = Ledger(harness.store, SID)
    first.step(emit((0, 0), MANUAL, {}))
    first.step(E(A.EnginePersistCall, (0, 0)))
    second.step(emit((0, 0), MANUAL, {"other": 1}))
    with pytest.raises(StaleState, match="already durable"):
        second.step(E(A.EnginePersistCall, (0, 0)))
    assert second.crash() == harness.store.load(SID)
    # An approval decided by one engine cannot be overwritten by the other.
    first.step(E(A.EngineParkApproval, (0, 0)))
    second.crash()
    first.step(E(A.HumanApprove, (0, 0)))
    with pytest.raises(StaleState, match="approval"):
        second.step(E(A.HumanReject, (0, 0)))  # it still sees the approval pending
    assert harness.store.load(SID).approval(first.state.calls[0].execution_id) is (
        p.ApprovalState.APPROVED
    )


# --------------------------------------------------------------------------
# Audit rows
# --------------------------------------------------------------------------


def recompute(row_inputs: dict[str, object]) -> p.Decision:
    i = row_inputs
    inputs = p.RecoveryInputs(
        status=p.LedgerStatus(str(i["status"])),
        attempt=int(str(i["attempt"])),
        digest_matches=bool(i["digest_matches"]),
        approval=p.ApprovalState(str(i["approval"])),
        has_result=bool(i["has_result"]),
        policy=p.RecoveryPolicy(str(i["policy"])),
        legacy=bool(i["legacy"]),
        requires_approval=bool(i["requires_approval"]),
        max_attempts=int(str(i["max_attempts"])),
    )
    return p.decide_recovery(inputs).decision


def test_recover_row_carries_decision_and_recomputable_inputs(harness: Harness) -> None:
    ledger = Ledger.create(harness.store, SID)
    pos = (0, 0)
    dispatch_protected(ledger, pos, MANUAL)
    ledger.crash()
    ledger.step(E(A.Recover, pos))
    rows = harness.restart().audit(SID)
    assert [(r.kind, r.attempt, r.recovery_decision) for r in rows] == [
        ("dispatch", 1, None),
        ("recovery_required", 1, "recovery_required"),
    ]
    decision_row = rows[1]
    assert decision_row.authorization is p.Authorization.APPROVAL
    assert decision_row.tool_call_id == "call_0" and decision_row.position == pos
    assert decision_row.inputs["status"] == "dispatched"
    assert recompute(decision_row.inputs) is p.Decision.RECOVERY_REQUIRED


def test_a_decision_taken_again_for_the_same_attempt_keeps_its_own_row(
    harness: Harness,
) -> None:
    """Issue 25 point 2: the audit key (execution, kind, attempt) of a halted
    call re-decided after a restart is the first halt's, yet the second
    decision is a row of its own, with its own inputs (the record is halted
    now): the audit shows every decision, so a repeated wrong one recomputes
    wrong (AuditRecomputable).  The old facade derived rows from new keys only
    and wrote nothing here."""
    ledger = Ledger.create(harness.store, SID)
    pos = (0, 0)
    dispatch_protected(ledger, pos, MANUAL)
    ledger.crash()
    ledger.step(E(A.Recover, pos))
    commits = counts(harness.store)[0]
    ledger.crash()
    ledger.step(E(A.Recover, pos))
    assert counts(harness.store)[0] == commits + 1  # an audit-only commit
    assert_durable_agrees(harness, ledger)
    rows = harness.restart().audit(SID)
    decisions = [r for r in rows if r.kind == "recovery_required"]
    assert [(r.attempt, r.inputs["status"]) for r in decisions] == [
        (1, "dispatched"), (1, "recovery_required"),
    ]
    assert all(recompute(r.inputs) is p.Decision.RECOVERY_REQUIRED for r in decisions)


def test_idempotent_retry_is_audited_as_policy_authorized(harness: Harness) -> None:
    ledger = Ledger.create(harness.store, SID)
    pos = (0, 0)
    dispatch_protected(ledger, pos, IDEMPOTENT)
    ledger.crash()
    ledger.step(E(A.Recover, pos))
    before = counts(harness.store)
    ledger.step(E(A.EnginePersistDispatched, pos))
    assert counts(harness.store) == (before[0] + 1, before[1] + 1)
    rows = ledger.audit()
    assert [(r.kind, r.attempt, r.authorization, r.recovery_decision) for r in rows] == [
        ("dispatch", 1, p.Authorization.AUTO, None),
        ("retry_same_id", 1, p.Authorization.AUTO, "retry_same_id"),
        ("dispatch", 2, p.Authorization.POLICY, "retry_same_id"),
    ]
    assert recompute(rows[1].inputs) is p.Decision.RETRY_SAME_ID


def test_reconcile_outcomes_are_audited(harness: Harness) -> None:
    ledger = Ledger.create(harness.store, SID)
    pos = (0, 0)
    dispatch_protected(ledger, pos, RECONCILE)
    ledger.crash()
    ledger.step(E(A.Recover, pos))
    ledger.step(E(A.EngineReconcileNotApplied, pos))
    ledger.step(E(A.EnginePersistDispatched, pos))
    ledger.step(E(A.EngineInvokeAdapter, pos))
    ledger.step(E(A.EngineTimeout, pos))
    ledger.step(E(A.Recover, pos))
    ledger.step(E(A.EngineReconcileApplied, pos), result_content="moved")
    ledger.step(E(A.EngineAppendResult, pos))
    rows = ledger.audit()
    assert [(r.kind, r.attempt, r.recovery_decision) for r in rows] == [
        ("dispatch", 1, None),
        ("reconcile", 1, "reconcile"),
        ("reconcile_not_applied", 1, "reconcile"),
        ("dispatch", 2, "reconcile"),
        ("reconcile", 2, "reconcile"),
        ("reconcile_applied", 2, "reconcile"),
    ]
    assert rows[3].authorization is p.Authorization.POLICY
    call = harness.restart().load(SID).call(pos)
    assert call is not None and call.result is not None and call.result.content == "moved"


# --------------------------------------------------------------------------
# Human resolutions
# --------------------------------------------------------------------------


def halted(harness: Harness) -> Ledger:
    ledger = Ledger.create(harness.store, SID)
    dispatch_protected(ledger, (0, 0), MANUAL)
    ledger.step(E(A.EngineInvokeAdapter, (0, 0)))
    ledger.crash()
    ledger.step(E(A.Recover, (0, 0)))
    harness.restart()
    ledger = Ledger(harness.store, SID)  # a new process: the halted call is at RESUME
    assert [c.position for c in ledger.recovery_required()] == [(0, 0)]
    assert ledger.state.calls[0].stage is p.Stage.RESUME
    return ledger


def test_resolve_applied_keeps_the_humans_result_text(harness: Harness) -> None:
    ledger = halted(harness)
    ledger.resolve((0, 0), "applied", result_text="sent, message id 7", note="checked inbox")
    assert ledger.recovery_required() == []
    ledger.step(E(A.Recover, (0, 0)))
    ledger.step(E(A.EngineAppendResult, (0, 0)))
    call = harness.restart().load(SID).call((0, 0))
    assert call is not None and call.result is not None
    assert (call.result.kind, call.result.content) == (p.ResultKind.HUMAN, "sent, message id 7")
    human = [r for r in harness.store.audit(SID) if r.kind == "human_applied"]
    assert len(human) == 1
    assert human[0].authorization is p.Authorization.HUMAN
    assert human[0].note == "checked inbox"
    assert human[0].recovery_decision == "recovery_required"


def test_resolve_retry_grants_an_attempt_the_next_process_dispatches(harness: Harness) -> None:
    """``retry`` is a grant (the ``human_retry`` row for attempt 2), committed alone:
    the record stays halted at attempt 1.  A new process's Recover honours it and
    the dispatch of attempt 2 is the human's; after it the grant is used."""
    ledger = halted(harness)
    before = counts(harness.store)
    ledger.resolve((0, 0), "retry")
    assert counts(harness.store) == (before[0] + 1, before[1])  # one commit, no record
    e = ledger.state.calls[0].execution_id
    rec = harness.store.load(SID).ledger[e]
    assert (rec.status, rec.attempt) == (p.LedgerStatus.RECOVERY_REQUIRED, 1)
    assert [(r.kind, r.attempt, r.authorization) for r in ledger.audit()][-1] == (
        "human_retry", 2, p.Authorization.HUMAN)
    assert ledger.state.calls[0].stage is p.Stage.RESUME
    assert ledger.recovery_required() == []  # it waits for an engine, not a human
    harness.restart()
    ledger = Ledger(harness.store, SID)  # the next engine process
    ledger.step(E(A.Recover, (0, 0)))
    assert ledger.state.calls[0].stage is p.Stage.RETRY
    ledger.step(E(A.EnginePersistDispatched, (0, 0)))
    rec = harness.store.load(SID).ledger[e]
    assert (rec.status, rec.attempt, rec.authorization) == (
        p.LedgerStatus.DISPATCHED, 2, p.Authorization.HUMAN)
    assert [(r.kind, r.attempt, r.authorization) for r in ledger.audit()][-1] == (
        "dispatch", 2, p.Authorization.HUMAN)
    assert not ledger.state.retry_granted(ledger.state.calls[0])  # used


def test_resolve_abandon(harness: Harness) -> None:
    ledger = halted(harness)
    ledger.resolve((0, 0), "abandon")
    rec = harness.store.load(SID).ledger[ledger.state.calls[0].execution_id]
    assert rec.status is p.LedgerStatus.ABANDONED


@pytest.mark.parametrize(
    ("resolution", "text", "message"),
    [
        ("done", None, "unknown resolution 'done'.*'applied', 'retry', 'abandon'"),
        ("applied", None, "needs result_text"),
        ("retry", "x", "only for resolution 'applied'"),
    ],
)
def test_invalid_resolutions_change_nothing(
    harness: Harness, resolution: str, text: str | None, message: str
) -> None:
    ledger = halted(harness)
    state, before = ledger.state, counts(harness.store)
    with pytest.raises(p.InvalidInput, match=message):
        ledger.resolve((0, 0), resolution, result_text=text)
    assert ledger.state is state and counts(harness.store) == before


def test_resolving_a_call_that_is_not_halted_is_refused(harness: Harness) -> None:
    ledger = Ledger.create(harness.store, SID)
    dispatch_protected(ledger, (0, 0), MANUAL)
    with pytest.raises(p.ProtocolError, match="HumanResolveAbandon"):
        ledger.resolve((0, 0), "abandon")


def test_resolutions_name_the_core_actions() -> None:
    assert set(RESOLUTIONS.values()) == {
        A.HumanResolveApplied,
        A.HumanResolveRetry,
        A.HumanResolveAbandon,
    }


# --------------------------------------------------------------------------
# Random valid behaviours: the store always holds the durable projection
# --------------------------------------------------------------------------

ARG_CHOICES = ({"x": 1}, {"x": 2, "y": ["é", None]})
TOOL_CALL_IDS = ("call_0", "", "call_salvaged_0")
CONTENTS = ("", "ok", "é\n✓ \"quoted\"", "x" * 300)
RESULT_EVENTS = frozenset(
    {
        A.EngineRecordSucceeded,
        A.EngineRecordFailed,
        A.EngineReconcileApplied,
        A.EngineRecordDenied,
    }
)


# Crashes are drawn separately; the external system's silent moves change
# nothing the engine holds (test_silent_external_moves_commit_nothing).
# Engine-silent events change nothing a ledger holds (EngineDiscardLateReturn
# too: the core only checks the return is late; tests/test_protocol.py), and
# RetentionWindowPasses is the Ledger's own, from its clock and the records'
# dispatch times (tests/test_key_retention.py), never a caller's event.  The
# conversation's rewrites are not ledger steps either (Ledger.step refuses
# them: tests/test_lost_conversation.py); the checkers' closed world plays them.
SKIPPED = frozenset({A.ProviderEmitCall, A.Crash, A.ExternalApplyLoseAnswer, A.ExternalDropFenced,
                     A.ExternalExpireKey, A.EngineDiscardLateReturn,
                     A.RetentionWindowPasses,
                     A.ConversationRepair, A.ConversationRenumber})  # fmt: skip


def candidates(state: p.SessionState, emits: list[E]) -> list[E]:
    """Every event worth trying now; ``protocol.enabled`` filters them."""
    events: list[E] = list(emits)
    for c in state.calls:
        attempt = state.record(c.execution_id).attempt
        for action in A:
            if action in SKIPPED:
                continue
            events.append(E(action, c.position, attempt=attempt))
    return [e for e in events if p.enabled(state, e)]


def legacy_state(
    marker: int, max_attempts: int, tools: list[p.ToolProfile]
) -> p.SessionState:
    """Durable calls of turns before the marker, as an upgraded session holds them."""
    calls, approvals = [], {}
    for slot, tool in enumerate(tools):
        pos = (marker - 1, slot)
        eid = p.derive_execution_id(SID, *pos, "call_0")
        digest = p.args_digest(tool.name, {"legacy": slot})
        calls.append(
            p.CallState(pos, "call_0", tool, eid, digest, p.MessageState.DURABLE)
        )
        if tool.requires_approval:
            approvals[eid] = p.ApprovalState.APPROVED
    return p.SessionState(SID, marker, max_attempts, tuple(calls), approvals)


def _tool(state: p.SessionState, pos: p.CallPosition) -> p.ToolProfile:
    call = state.call(pos)
    assert call is not None
    return call.tool


def run_random_behaviour(h: Harness, data: st.DataObject) -> None:
    marker = data.draw(st.sampled_from([0, 1]), label="marker")
    max_attempts = data.draw(st.integers(1, 3), label="max_attempts")
    h.store.create_session(SID, marker=marker, max_attempts=max_attempts)
    if marker:
        tools = data.draw(st.lists(st.sampled_from(PROFILES), max_size=2), label="legacy")
        seeded = legacy_state(marker, max_attempts, tools)
        h.store.commit(SID, h.store.load(SID), seeded, [])
    ledger = Ledger(h.store, SID)
    assert_durable_agrees(h, ledger)
    steps = data.draw(st.integers(1, 40), label="steps")
    for _ in range(steps):
        if data.draw(st.integers(0, 9), label="crash?") == 0:
            note("Crash")
            if data.draw(st.booleans(), label="restart the store too"):
                ledger = Ledger(h.restart(), SID)
            else:
                ledger.crash()
            assert ledger.state == durable_projection(ledger.state)
            assert_durable_agrees(h, ledger)
            continue
        state = ledger.full_state()  # events are drawn from the whole session's core
        settled = [
            c.position
            for c in state.calls
            if c.position[0] < marker + 2 and ledger.state.call(c.position) is None
        ]
        if settled and data.draw(st.integers(0, 4), label="emit over a settled call?") == 0:
            # Outside the working set, but taken: refused as the core refuses it.
            event("emit over a settled call: refused")
            kept, before = ledger.state, counts(h.store)
            with pytest.raises(p.ProtocolError, match="a call is already at that position"):
                ledger.step(emit(settled[0], MANUAL, {"x": 0}), arguments={"x": 0})
            assert ledger.state is kept and counts(h.store) == before
            continue
        # Emit candidates carry a placeholder tool; the real one is drawn below.
        emits = [
            emit((turn, slot), MANUAL, {"x": turn})
            for turn in range(marker, marker + 2)
            for slot in range(2)
            if state.call((turn, slot)) is None
        ]
        options = candidates(state, emits)
        if not options:
            break
        # First the action, uniformly among the enabled ones, so that rare
        # actions are drawn as often as the always-enabled ones.
        action = data.draw(st.sampled_from(sorted({e.action for e in options})), label="action")
        ev = data.draw(st.sampled_from([e for e in options if e.action is action]), label="event")
        pos = ev.position
        assert pos is not None
        if ev.action is A.ProviderEmitCall:
            tool = data.draw(st.sampled_from(PROFILES), label="tool")
            tcid = data.draw(st.sampled_from(TOOL_CALL_IDS), label="tool_call_id")
            ev = emit(pos, tool, {"x": pos[0]}, tcid)

        def text() -> str:
            return data.draw(st.sampled_from(CONTENTS), label="content")

        note(f"{ev.action.value} {pos} attempt={ev.attempt}")
        event(ev.action.value)
        if ev.action is A.ProviderEmitCall:
            assert ev.tool is not None
            args = {"x": pos[0]}
            ledger.step(ev, arguments=args if data.draw(st.booleans(), label="args") else None)
        elif ev.action in RESULT_EVENTS or (
            ev.action is A.EngineAppendResult and not _tool(state, pos).protected
        ):
            after = p.apply(state, ev)
            append = E(A.EngineAppendResult, pos)
            if ev.action is not A.EngineAppendResult and p.enabled(after, append) and (
                data.draw(st.booleans(), label="batch with the append")
            ):
                ledger.step_many([ev, append], result_content={pos: text()})
            else:
                ledger.step(ev, result_content=text())
        elif ev.action is A.HumanResolveApplied:
            ledger.resolve(pos, "applied", result_text=text())
        elif ev.action is A.HumanResolveRetry and data.draw(st.booleans(), label="resolve()"):
            ledger.resolve(pos, "retry")
        else:
            ledger.step(ev)
        assert_durable_agrees(h, ledger)
    assert h.reopened_view() == durable_projection(ledger.full_state())


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(data=st.data())
def test_memory_store_always_holds_the_durable_projection(data: st.DataObject) -> None:
    h = Harness("memory", None)
    try:
        run_random_behaviour(h, data)
    finally:
        h.close()


# Each SQLite example creates a database and fsyncs every commit: an eighth of
# the profile's examples keeps the suite fast (the deep profile still runs
# hundreds); the memory machine above runs the same behaviours in full, and
# test_sqlite_store.py round-trips every field value through the file.
@settings(
    suppress_health_check=[HealthCheck.too_slow],
    deadline=None,
    max_examples=max(10, settings().max_examples // 8),
)
@given(data=st.data())
def test_sqlite_store_always_holds_the_durable_projection(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    h = Harness("sqlite", tmp_path_factory.mktemp("sqlite"))
    try:
        run_random_behaviour(h, data)
    finally:
        h.close()


def test_resolve_does_not_recover_a_call_that_is_not_halted(harness: Harness) -> None:
    ledger = Ledger.create(harness.store, SID)
    dispatch_protected(ledger, (0, 0), MANUAL)
    ledger.crash()  # dispatched, at RESUME, but no human has been asked yet
    state, before = ledger.state, counts(harness.store)
    with pytest.raises(p.ProtocolError, match="HumanResolveRetry"):
        ledger.resolve((0, 0), "retry")
    assert ledger.state is state and counts(harness.store) == before
