"""The store port's rules, on MemoryStore (SqliteStore is held to the same ones).

Under test: ``toolledger._core.stores``: ``AuditRow``, ``plan_commit`` (what every
store checks before writing), ``durable_projection`` and ``MemoryStore``.
The oracle is the protocol core: a store must hold exactly
``durable_changes`` of each committed transition, refuse what would break
``AuditComplete`` or ``ExecutionIdStable``, never let a caller's later
mutation reach what it stores, and make a commit all or nothing.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from toolledger._core import protocol as p
from toolledger._core.ledger import Ledger
from toolledger._core.sqlite_store import SqliteStore
from toolledger._core.stores import (
    AuditRow,
    MemoryStore,
    SessionExists,
    StaleState,
    Store,
    StoreError,
    UnknownSession,
    durable_projection,
    plan_commit,
)

A = p.Action
E = p.Event
SID = "s1"
TOOL = p.ToolProfile("send_email", p.RecoveryPolicy.MANUAL, False)
POS = (0, 0)


def emit(pos: p.CallPosition = POS, args: dict[str, Any] | None = None) -> E:
    return E(A.ProviderEmitCall, pos, "call_0", TOOL, p.args_digest(TOOL.name, args or {}))


def row_for(state: p.SessionState, key: p.AuditKey, **changes: Any) -> AuditRow:
    eid, kind, attempt = key
    call = next(c for c in state.calls if c.execution_id == eid)
    row = AuditRow(SID, eid, call.tool_call_id, call.position, kind, attempt,
                   p.Authorization.AUTO, None, {"why": "test"})  # fmt: skip
    return replace(row, **changes)


def dispatched(store: MemoryStore) -> tuple[p.SessionState, p.SessionState]:
    """(state with a durable approved call, the state after dispatching it)."""
    ledger = Ledger.create(store, SID)
    ledger.step(emit())
    ledger.step(E(A.EnginePersistCall, POS))
    before = ledger.state
    return before, p.apply(before, E(A.EnginePersistDispatched, POS))


def test_both_stores_implement_the_port(tmp_path: Any) -> None:
    assert isinstance(MemoryStore(), Store)
    with SqliteStore(tmp_path / "x.db") as store:
        assert isinstance(store, Store)


# --------------------------------------------------------------------------
# Sessions
# --------------------------------------------------------------------------


def test_create_and_load_an_empty_session() -> None:
    store = MemoryStore()
    store.create_session(SID, marker=2, max_attempts=5)
    assert store.load(SID) == p.new_session(SID, marker=2, max_attempts=5)
    assert store.sessions() == [SID]
    assert store.commits == 1 and store.ledger_commits == 0


def test_creating_a_session_twice_is_refused() -> None:
    store = MemoryStore()
    store.create_session(SID, marker=0, max_attempts=3)
    with pytest.raises(SessionExists, match=r"'s1' already exists: open it with Ledger\("):
        store.create_session(SID, marker=1, max_attempts=3)
    assert store.load(SID).marker == 0


@pytest.mark.parametrize(
    ("session_id", "marker", "max_attempts", "message"),
    [("", 0, 3, "session_id"), (SID, -1, 3, "marker"), (SID, 0, 0, "max_attempts")],
)
def test_bad_session_values_are_refused(
    session_id: str, marker: int, max_attempts: int, message: str
) -> None:
    store = MemoryStore()
    with pytest.raises(p.InvalidInput, match=message):
        store.create_session(session_id, marker=marker, max_attempts=max_attempts)
    assert store.sessions() == []


def test_unknown_session_is_a_key_error_with_a_clear_message() -> None:
    store = MemoryStore()
    with pytest.raises(UnknownSession) as info:
        store.load("ghost")
    assert isinstance(info.value, KeyError)
    assert str(info.value) == (
        "no session 'ghost' in this MemoryStore: create it with create_session() first"
    )
    for call in (lambda: store.audit("ghost"), lambda: store.call_arguments("ghost", POS)):
        with pytest.raises(UnknownSession):
            call()


def test_closed_store_refuses_everything() -> None:
    store = MemoryStore()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.sessions()


# --------------------------------------------------------------------------
# What is stored, and that nothing leaks in or out
# --------------------------------------------------------------------------


def test_load_is_the_durable_projection() -> None:
    store = MemoryStore()
    ledger = Ledger.create(store, SID)
    ledger.step(emit((0, 0)))
    ledger.step(emit((0, 1)))
    ledger.step(E(A.EnginePersistCall, (0, 1)))
    loaded = store.load(SID)
    assert loaded == durable_projection(ledger.state)
    assert [(c.position, c.stage) for c in loaded.calls] == [((0, 1), p.Stage.RESUME)]


def test_crash_loses_nothing_stored() -> None:
    store = MemoryStore()
    before, after = dispatched(store)
    rows = [row_for(after, k) for k in after.audit - before.audit]
    store.commit(SID, before, after, rows)
    kept = store.load(SID), store.audit(SID)
    store.crash()
    assert (store.load(SID), store.audit(SID)) == kept
    assert store.crashes == 1


def test_mutating_inputs_or_outputs_changes_nothing_stored() -> None:
    store = MemoryStore()
    ledger = Ledger.create(store, SID)
    args: dict[str, Any] = {"to": ["a@example.com"]}
    ledger.step(emit(args=args), arguments=args)
    ledger.step(E(A.EnginePersistCall, POS))
    args["to"].append("intruder")
    assert store.call_arguments(SID, POS) == {"to": ["a@example.com"]}
    store.call_arguments(SID, POS)["to"].append("intruder")  # type: ignore[index]
    assert store.call_arguments(SID, POS) == {"to": ["a@example.com"]}

    before = ledger.state
    after = p.apply(before, E(A.EnginePersistDispatched, POS))
    inputs: dict[str, Any] = {"nested": {"n": 1}}
    (key,) = after.audit - before.audit
    row = row_for(after, key, inputs=inputs)
    inputs["nested"]["n"] = 2
    assert row.inputs == {"nested": {"n": 1}}  # copied on construction
    store.commit(SID, before, after, [row])
    row.inputs["nested"]["n"] = 3
    store.audit(SID)[0].inputs["nested"]["n"] = 4
    assert store.audit(SID)[0].inputs == {"nested": {"n": 1}}

    loaded = store.load(SID)
    dict.clear(loaded.ledger)  # type: ignore[arg-type]
    dict.clear(loaded.approvals)  # type: ignore[arg-type]
    assert store.load(SID) == durable_projection(after)


def test_an_empty_commit_writes_and_counts_nothing() -> None:
    store = MemoryStore()
    store.create_session(SID, marker=0, max_attempts=3)
    state = store.load(SID)
    store.commit(SID, state, state, [])
    assert (store.commits, store.ledger_commits) == (1, 0)


def test_a_failure_inside_a_commit_leaves_nothing_of_it() -> None:
    class Failing(MemoryStore):
        def _write_record(self, *args: Any) -> None:
            super()._write_record(*args)
            raise RuntimeError("power cut after the first write")

    store = Failing()
    before, after = dispatched(store)
    rows = [row_for(after, k) for k in after.audit - before.audit]
    counted = (store.commits, store.ledger_commits)
    with pytest.raises(RuntimeError, match="power cut"):
        store.commit(SID, before, after, rows)
    assert store.load(SID) == durable_projection(before)
    assert store.audit(SID) == []
    assert (store.commits, store.ledger_commits) == counted


def test_a_stale_before_is_refused() -> None:
    store = MemoryStore()
    before, after = dispatched(store)
    rows = [row_for(after, k) for k in after.audit - before.audit]
    store.commit(SID, before, after, rows)
    with pytest.raises(
        StaleState,
        match=r"changed since this engine loaded it \(audit keys written since: "
        r"\[\('dispatch', 1\)\]; its record differs\)",
    ):
        store.commit(SID, before, after, rows)  # a second engine, same decision
    assert len(store.audit(SID)) == 1


# --------------------------------------------------------------------------
# plan_commit: what every store refuses before writing anything
# --------------------------------------------------------------------------


def test_every_new_audit_key_needs_its_row() -> None:
    store = MemoryStore()
    before, after = dispatched(store)
    with pytest.raises(p.InvalidInput, match="without their audit rows"):
        store.commit(SID, before, after, [])
    assert store.load(SID) == durable_projection(before)


def test_rows_must_describe_audit_keys_of_the_call_they_name() -> None:
    store = MemoryStore()
    before, after = dispatched(store)
    (key,) = after.audit - before.audit
    for bad, message in [
        (row_for(after, key, kind="dispatched"), "no audit key in the new state"),
        (row_for(after, key, attempt=2), "no audit key in the new state"),
        (row_for(after, key, tool_call_id="call_9"), "not the call with that execution id"),
        (row_for(after, key, position=(0, 1)), "not the call with that execution id"),
        (row_for(after, key, session_id="s2"), "for session 's2'"),
    ]:
        with pytest.raises(p.InvalidInput, match=message):
            store.commit(SID, before, after, [bad])
    assert store.audit(SID) == []


def test_states_must_belong_to_the_session_and_keep_its_marker() -> None:
    store = MemoryStore()
    before, after = dispatched(store)
    with pytest.raises(p.InvalidInput, match="state of session 's1', not of 's2'"):
        plan_commit("s2", before, after, [])
    with pytest.raises(p.InvalidInput, match="never changes the protocol marker"):
        plan_commit(SID, before, replace(after, marker=1), [])


def test_a_call_must_carry_the_derived_execution_id() -> None:
    start = p.new_session(SID)
    call = p.CallState(POS, "call_0", TOOL, "tlx1-forged", "sha256:x", p.MessageState.DURABLE)
    with pytest.raises(p.InvalidInput, match="must be derived by the engine"):
        plan_commit(SID, start, replace(start, calls=(call,)), [])


def test_a_durable_call_only_ever_gains_a_result() -> None:
    store = MemoryStore()
    before, _ = dispatched(store)
    (call,) = before.calls
    changed = replace(before, calls=(replace(call, args_digest="sha256:other"),))
    with pytest.raises(p.InvalidInput, match="only ever gains a result"):
        plan_commit(SID, before, changed, [])
    with pytest.raises(p.InvalidInput, match="was removed"):
        plan_commit(SID, before, replace(before, calls=()), [])


def test_nothing_durable_disappears() -> None:
    store = MemoryStore()
    before, after = dispatched(store)
    rows = [row_for(after, k) for k in after.audit - before.audit]
    store.commit(SID, before, after, rows)
    with pytest.raises(p.InvalidInput, match="drops ledger records and audit keys"):
        plan_commit(SID, after, replace(after, ledger={}, audit=frozenset()), [])


def test_records_and_approvals_belong_to_a_durable_call() -> None:
    store = MemoryStore()
    before, after = dispatched(store)
    (call,) = after.calls
    stray = "tlx1-" + "0" * 32
    record = replace(after.ledger[call.execution_id], execution_id=stray)
    with pytest.raises(p.InvalidInput, match=r"records for \['tlx1-0+'\], which are not durable"):
        plan_commit(SID, before, replace(before, ledger={stray: record}), [])
    volatile = p.apply(p.new_session(SID), emit())
    (fresh,) = volatile.calls
    approved = replace(volatile, approvals={fresh.execution_id: p.ApprovalState.APPROVED})
    with pytest.raises(p.InvalidInput, match="not durable calls of the session"):
        plan_commit(SID, volatile, approved, [])
    assert store.load(SID) == p.apply(before, E(A.Crash))  # nothing was written


def test_arguments_only_with_the_commit_that_persists_the_call() -> None:
    store = MemoryStore()
    before, after = dispatched(store)
    rows = [row_for(after, k) for k in after.audit - before.audit]
    with pytest.raises(p.InvalidInput, match="no call becomes durable there"):
        store.commit(SID, before, after, rows, arguments={POS: {}})
    start = p.new_session(SID)
    emitted = p.apply(start, emit(args={"a": 1}))
    persisted = p.apply(emitted, E(A.EnginePersistCall, POS))
    with pytest.raises(p.InvalidInput, match="do not match its argument digest"):
        plan_commit(SID, start, persisted, [], {POS: {"a": 2}})
    with pytest.raises(p.InvalidInput, match="not JSON-serializable"):
        plan_commit(SID, start, persisted, [], {POS: {"a": object()}})
    plan = plan_commit(SID, start, persisted, [], {POS: {"a": 1}})
    assert plan.new_calls[0][1] == '{"a":1}' and not plan.writes_ledger


# --------------------------------------------------------------------------
# AuditRow
# --------------------------------------------------------------------------


def test_audit_row_coerces_and_checks_its_fields() -> None:
    row = AuditRow(SID, "e1", "", [1, 2], "dispatch", 1, "approval",  # type: ignore[arg-type]
                   p.Decision.RETRY_SAME_ID, {"a": (1, 2)})  # fmt: skip
    assert row.position == (1, 2)
    assert row.authorization is p.Authorization.APPROVAL
    assert row.recovery_decision == "retry_same_id"
    assert row.inputs == {"a": [1, 2]}  # what a store reads back
    assert row.key == ("e1", "dispatch", 1)
    assert hash(row) == hash(replace(row, inputs={}))  # inputs don't take part in hashing
    base = {"session_id": SID, "execution_id": "e1", "tool_call_id": "", "position": (0, 0),
            "kind": "dispatch", "attempt": 1, "authorization": p.Authorization.AUTO,
            "recovery_decision": None}  # fmt: skip
    for field, value, message in [
        ("authorization", "boss", "authorization 'boss' is not one of"),
        ("recovery_decision", "maybe", "not a recovery decision"),
        ("inputs", {"x": float("nan")}, "not JSON-serializable"),
        ("inputs", {1: "x"}, "string keys"),
        ("attempt", -1, "attempt must be a non-negative int"),
        ("position", (0,), r"position must be \(turn, slot\)"),
        ("kind", "", "kind must be a non-empty string"),
        ("tool_call_id", None, "tool_call_id must be a string"),
    ]:
        with pytest.raises(p.InvalidInput, match=message):
            AuditRow(**{**base, field: value})  # type: ignore[arg-type]
