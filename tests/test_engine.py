"""The engine adoption kit, driven through crashes.

Under test: :mod:`toolledger.kit.engine` (legacy and ledger modes) with the
adapters of :mod:`toolledger._core.tools`, on both stores.  The oracle is the
:class:`~toolledger.kit.external.CountingExternalSystem`: it counts how often an
effect was really applied and how often an adapter sent a request, so "one
approval, one email" is measured, not assumed.  The seed issue's reproduction
and its five fault-injection rows are named tests; every crash point of both
modes is run for every policy.
"""

from __future__ import annotations

import doctest
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import toolledger.kit.engine
from toolledger._core.protocol import (
    ApprovalState,
    Authorization,
    InvalidInput,
    LedgerStatus,
    RecoveryPolicy,
)
from toolledger._core.sqlite_store import SqliteStore
from toolledger._core.stores import MemoryStore, Store
from toolledger._core.tools import (
    RESERVED_ARGUMENT_NAMES,
    Applied,
    CannotTell,
    DefiniteFailure,
    NotAppliedFenced,
    ToolRegistry,
    Unknown,
    WasApplied,
    check_arguments,
    reserved_argument_paths,
)
from toolledger.kit.engine import (
    LEDGER_STEPS,
    LEGACY_STEPS,
    SEED_MATRIX,
    CrashInjector,
    CrashPoint,
    EngineMode,
    FileConversationStore,
    MemoryConversationStore,
    ScriptedHuman,
    ScriptedProvider,
    SimulatedCrash,
    TurnEngine,
    TurnResult,
    TurnStatus,
    crash_points,
    parse_crash_point,
    tool_call,
)
from toolledger.kit.external import CountingAdapter, CountingExternalSystem, Fault, RequestStatus
from toolledger.kit.simulate import SimulationReport, run_simulation

POLICIES = [p.value for p in RecoveryPolicy]
PROTECTED = [p.value for p in RecoveryPolicy if p is not RecoveryPolicy.READONLY]
STORES = ["memory", "sqlite"]
EMAIL = {"to": "ada@example.com", "subject": "Q3"}


# --------------------------------------------------------------------------
# A world that survives crashes, and engines built from it
# --------------------------------------------------------------------------


@dataclass
class World:
    """Durable storage + the external system: what a restarted process finds."""

    kind: str
    path: Path
    system: CountingExternalSystem
    conversations: MemoryConversationStore | FileConversationStore
    store: Store

    def restart(self) -> None:
        """The process died: reopen everything that lives on disk."""
        if self.kind == "sqlite":
            self.store.close()
            self.store = SqliteStore(self.path / "ledger.sqlite3")
            self.conversations = FileConversationStore(self.path / "conversation")
            self.system = CountingExternalSystem(self.path / "external.jsonl")


@pytest.fixture(params=STORES)
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    if request.param == "memory":
        w = World("memory", tmp_path, CountingExternalSystem(), MemoryConversationStore(),
                  MemoryStore())
    else:
        w = World("sqlite", tmp_path, CountingExternalSystem(tmp_path / "external.jsonl"),
                  FileConversationStore(tmp_path / "conversation"),
                  SqliteStore(tmp_path / "ledger.sqlite3"))
    yield w
    w.store.close()


Script = list[list[dict[str, Any]] | str]


def make_engine(
    world: World,
    *,
    mode: str = "ledger",
    policy: str = "manual",
    script: Script | None = None,
    human: ScriptedHuman | None = None,
    crash: CrashInjector | None = None,
    tools: dict[str, str] | None = None,
    no_approval: tuple[str, ...] = (),
) -> TurnEngine:
    crash = crash or CrashInjector(None)
    registry = ToolRegistry()
    for name, pol in (tools or {"send_email": policy}).items():
        registry.register(name, CountingAdapter(world.system, name,
                                                on_request_sent=crash.request_sent),
                          policy=pol, requires_approval=name not in no_approval)
    return TurnEngine(
        session_id="s1",
        mode=mode,
        registry=registry,
        provider=ScriptedProvider(script or [[tool_call("call_0", "send_email", EMAIL)], "Sent."]),
        human=human or ScriptedHuman(),
        conversations=world.conversations,
        store=world.store,
        crash=crash,
    )


def crash_then_resume(
    world: World, point: str, *, mode: str = "ledger", policy: str = "manual",
    engine: Callable[..., TurnEngine] = make_engine,
) -> tuple[TurnEngine, TurnResult]:
    crash = CrashInjector(parse_crash_point(mode, point))
    with pytest.raises(SimulatedCrash):
        engine(world, mode=mode, policy=policy, crash=crash).run("email Ada")
    world.restart()
    resumed = engine(world, mode=mode, policy=policy)
    return resumed, resumed.resume()


def tool_messages(engine: TurnEngine) -> list[dict[str, Any]]:
    return [m for m in engine.messages if m.get("role") == "tool"]


# --------------------------------------------------------------------------
# The seed's reproduction (issue #443)
# --------------------------------------------------------------------------


def test_seed_reproduction_legacy_engine_sends_the_email_twice(world: World) -> None:
    human = ScriptedHuman()
    resumed, result = crash_then_resume(world, "after ExternalApply", mode="legacy")
    # approved once, delivered twice: the resolved approval was reused
    assert world.system.effects() == 2
    assert [r.status for r in world.system.requests] == [RequestStatus.APPLIED] * 2
    assert result.status is TurnStatus.DONE
    assert any("reused resolved approval" in line for line in resumed.log)
    assert human.asked == []  # the resumed engine never asked anyone
    assert json.loads(tool_messages(resumed)[-1]["content"])["effect"] == 2


@pytest.mark.parametrize("policy", ["idempotent", "reconcile"])
def test_seed_reproduction_ledger_engine_sends_once_and_keeps_the_original_result(
    world: World, policy: str
) -> None:
    resumed, result = crash_then_resume(world, "after ExternalApply", policy=policy)
    assert world.system.effects() == 1
    assert result.status is TurnStatus.DONE
    original = world.system.requests[0].result
    assert original is not None and json.loads(original)["effect"] == 1
    [message] = tool_messages(resumed)
    assert message["content"] == original
    assert message["execution_id"] == world.system.requests[0].execution_id


def test_seed_reproduction_ledger_manual_halts_instead_of_replaying(world: World) -> None:
    resumed, result = crash_then_resume(world, "after ExternalApply", policy="manual")
    assert world.system.effects() == 1 and world.system.invocations() == 1
    assert result.status is TurnStatus.RECOVERY_REQUIRED
    assert tool_messages(resumed) == []
    [item] = resumed.recovery_required()
    assert (item.tool, item.attempt, item.position) == ("send_email", 1, (1, 0))
    assert item.arguments == EMAIL


# --------------------------------------------------------------------------
# The seed's fault-injection matrix: five rows, every policy, both stores
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    effects: int
    invocations: int
    status: str
    decisions: tuple[str, ...]
    result_effect: int | None  # the "effect" number in the final tool result; None: no result


DONE_ONCE = Expect(1, 1, "done", (), 1)
LEGACY_TWICE = Expect(2, 2, "done", (), 2)
EXPECTED: dict[str, dict[str, Expect]] = {
    "before_dispatch_record": {
        **{p: Expect(1, 1, "done", ("execute",), 1) for p in POLICIES},
        "legacy": DONE_ONCE,
    },
    "after_dispatched_call_out": {
        "readonly": DONE_ONCE,  # the point is not on the readonly path
        # halted; the late original lands afterwards: still one effect
        "manual": Expect(1, 1, "recovery_required", ("recovery_required",), None),
        "idempotent": Expect(1, 2, "done", ("retry_same_id",), 1),  # late original deduplicated
        "reconcile": Expect(1, 2, "done", ("reconcile",), 1),  # late original fenced
        # resume re-sent it (effect 1), then the late original landed (effect 2)
        "legacy": Expect(2, 2, "done", (), 1),
    },
    "after_external_success": {
        "readonly": Expect(2, 2, "done", ("execute",), 2),  # declared replay-safe
        "manual": Expect(1, 1, "recovery_required", ("recovery_required",), None),
        "idempotent": Expect(1, 2, "done", ("retry_same_id",), 1),
        "reconcile": Expect(1, 1, "done", ("reconcile",), 1),
        "legacy": LEGACY_TWICE,
    },
    "after_succeeded_before_tool_message": {
        **dict.fromkeys(POLICIES, DONE_ONCE),
        "legacy": LEGACY_TWICE,
    },
    "after_tool_result_checkpoint": {
        **dict.fromkeys(POLICIES, DONE_ONCE),
        "legacy": DONE_ONCE,
    },
}


def run_row(row: str, policy: str, store: str, tmp_path: Path, mode: str) -> SimulationReport:
    db = tmp_path / f"{mode}.sqlite3" if store == "sqlite" else None
    return run_simulation(mode, policy, SEED_MATRIX[row].point(mode), store,  # type: ignore[arg-type]
                          db, crash_with="exception")


def check_row(row: str, policy: str, store: str, tmp_path: Path) -> None:
    ledger = run_row(row, policy, store, tmp_path, "ledger")
    want = EXPECTED[row][policy]
    assert ledger.crashed is SEED_MATRIX[row].ledger.reached_by(policy)
    got = (ledger.effects_applied, ledger.adapter_invocations, ledger.turn_status,
           tuple(ledger.decision_names))
    assert got == (want.effects, want.invocations, want.status, want.decisions)
    if want.result_effect is None:
        assert ledger.final_tool_result is None
        assert [i["tool"] for i in ledger.recovery_required] == ["send_email"]
    else:
        assert ledger.final_tool_result is not None
        assert json.loads(ledger.final_tool_result)["effect"] == want.result_effect
    if policy != "readonly":
        # AuditComplete: every invocation and every decision has its row
        dispatches = [a for a in ledger.audit if a["kind"] == "dispatch"]
        assert len(dispatches) == ledger.adapter_invocations
        assert [a["kind"] for a in ledger.audit if a["kind"] in want.decisions] == list(
            want.decisions
        )
        assert all(a["tool_call_id"] == "call_0" for a in ledger.audit)
    legacy = run_row(row, policy, store, tmp_path, "legacy")
    want = EXPECTED[row]["legacy"]
    assert legacy.crashed
    assert (legacy.effects_applied, legacy.adapter_invocations, legacy.turn_status) == (
        want.effects, want.invocations, want.status)
    assert legacy.final_tool_result is not None
    assert json.loads(legacy.final_tool_result)["effect"] == want.result_effect


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("policy", POLICIES)
def test_seed_row_1_crash_before_the_dispatch_record(
    policy: str, store: str, tmp_path: Path
) -> None:
    """No record: a session under the protocol executes once (legacy: once too)."""
    check_row("before_dispatch_record", policy, store, tmp_path)


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("policy", POLICIES)
def test_seed_row_2_crash_while_the_call_is_out(policy: str, store: str, tmp_path: Path) -> None:
    """dispatched: no silent replay; the declared policy decides."""
    check_row("after_dispatched_call_out", policy, store, tmp_path)


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("policy", POLICIES)
def test_seed_row_3_crash_after_external_success_before_succeeded(
    policy: str, store: str, tmp_path: Path
) -> None:
    """dispatched (but applied): the same unknown-outcome policy, no blind retry."""
    check_row("after_external_success", policy, store, tmp_path)


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("policy", POLICIES)
def test_seed_row_4_crash_after_succeeded_before_the_tool_message(
    policy: str, store: str, tmp_path: Path
) -> None:
    """succeeded: reconstruct the result from the record; never call the external system."""
    check_row("after_succeeded_before_tool_message", policy, store, tmp_path)


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("policy", POLICIES)
def test_seed_row_5_crash_after_the_tool_result_checkpoint(
    policy: str, store: str, tmp_path: Path
) -> None:
    """Completed: nothing is replayed."""
    check_row("after_tool_result_checkpoint", policy, store, tmp_path)


def test_seed_row_4_repairs_the_conversation_from_the_ledger(world: World) -> None:
    resumed, result = crash_then_resume(world, "after EngineRecordSucceeded")
    assert result.status is TurnStatus.DONE and world.system.invocations() == 1
    assert any("reconstruct (1, 0) from the ledger" in line for line in resumed.log)
    [message] = tool_messages(resumed)
    assert message["content"] == world.system.requests[0].result
    # the repaired message was checkpointed: a third process sees it too
    world.restart()
    assert tool_messages(make_engine(world)) == [message]


# --------------------------------------------------------------------------
# Every crash point, every policy
# --------------------------------------------------------------------------


def test_crash_points_are_generated_from_the_step_tables() -> None:
    for mode, steps in ((EngineMode.LEDGER, LEDGER_STEPS), (EngineMode.LEGACY, LEGACY_STEPS)):
        names = [p.name for p in crash_points(mode)]
        assert names == ["before ProviderEmitCall"] + [f"after {s.name}" for s in steps]
    point = parse_crash_point("ledger", "Before-EnginePersistDispatched")
    assert point.name == "after HumanApprove"
    assert parse_crash_point("legacy", "before:EngineInvokeAdapter").name == "after HumanApprove"
    assert set(SEED_MATRIX) == {
        "before_dispatch_record", "after_dispatched_call_out", "after_external_success",
        "after_succeeded_before_tool_message", "after_tool_result_checkpoint",
    }


def test_unknown_crash_point_lists_the_valid_ones() -> None:
    with pytest.raises(InvalidInput, match="after EnginePersistDispatched") as err:
        parse_crash_point("ledger", "after lunch")
    assert "unknown crash point 'after lunch'" in str(err.value)
    with pytest.raises(InvalidInput, match="legacy, ledger"):
        crash_points("future")


LEDGER_POINTS = list(crash_points("ledger"))
LEGACY_POINTS = list(crash_points("legacy"))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("point", LEDGER_POINTS, ids=str)
def test_every_ledger_crash_point_applies_a_protected_effect_at_most_once(
    point: CrashPoint, policy: str
) -> None:
    r = run_simulation("ledger", policy, point)
    assert r.crashed is point.reached_by(policy)
    if policy == "readonly":
        assert r.turn_status == "done"
        return
    assert r.effects_applied <= 1  # AtMostOnceEffect (0: halted before the request left)
    assert r.turn_status in ("done", "recovery_required")
    if r.turn_status == "done":
        assert r.effects_applied == 1 and r.final_tool_result is not None
        assert json.loads(r.final_tool_result)["effect"] == 1  # ResultFidelity
        assert r.ledger_record is not None and r.ledger_record["status"] == "succeeded"
    else:
        assert policy == "manual" and r.final_tool_result is None


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("point", LEGACY_POINTS, ids=str)
def test_every_legacy_crash_point_is_reached_and_replays_from_the_request_on(
    point: CrashPoint, policy: str
) -> None:
    r = run_simulation("legacy", policy, point)
    assert r.crashed and r.turn_status == "done"
    replays = point.name in {"after EngineInvokeAdapter", "after ExternalApply",
                             "after EngineAppendResult"}
    assert r.effects_applied == (2 if replays else 1)


# --------------------------------------------------------------------------
# Reused and empty tool_call_ids
# --------------------------------------------------------------------------

TWO_TURNS: Script = [
    [tool_call("call_0", "send_email", EMAIL)],
    "Sent.",
    [tool_call("call_0", "delete_repo", {"repo": "prod"})],  # Gemini numbers calls per turn
    "Deleted.",
]
TOOLS = {"send_email": "manual", "delete_repo": "manual"}


def test_reused_call_id_gets_its_own_execution_and_approval(world: World) -> None:
    human = ScriptedHuman(["approve", "reject"])
    engine = make_engine(world, script=TWO_TURNS, human=human, tools=TOOLS)
    assert engine.run("email Ada").status is TurnStatus.DONE
    assert engine.run("now delete prod").status is TurnStatus.DONE
    # the second call_0 was put to the human, who rejected it
    assert [(r.tool, r.tool_call_id) for r in human.asked] == [
        ("send_email", "call_0"), ("delete_repo", "call_0")]
    first, second = (str(r.execution_id) for r in human.asked)
    assert first != second
    assert [r.tool for r in world.system.requests] == ["send_email"]  # nothing deleted
    sent, denied = tool_messages(engine)
    assert (sent["execution_id"], sent["status"]) == (first, "ok")
    assert (denied["execution_id"], denied["status"]) == (second, "denied")
    st = engine.ledger.full_state()  # the first turn is settled: in the store only
    assert first not in {c.execution_id for c in engine.ledger.state.calls}
    assert st.approval(first) is ApprovalState.APPROVED
    assert st.approval(second) is ApprovalState.REJECTED


def test_legacy_twin_reused_call_id_reuses_the_old_approval(world: World) -> None:
    human = ScriptedHuman(["approve", "reject"])
    engine = make_engine(world, mode="legacy", script=TWO_TURNS, human=human, tools=TOOLS)
    engine.run("email Ada")
    engine.run("now delete prod")
    # the human was asked once; delete_repo ran on send_email's "allow"
    assert [r.tool for r in human.asked] == ["send_email"]
    assert [r.tool for r in world.system.requests] == ["send_email", "delete_repo"]


def test_empty_call_ids_are_distinct_calls(world: World) -> None:
    script: Script = [[tool_call("", "send_email", {"to": "a"}),
                       tool_call("", "send_email", {"to": "b"})], "Both sent."]
    human = ScriptedHuman()
    engine = make_engine(world, script=script, human=human)
    assert engine.run("email a and b").status is TurnStatus.DONE
    assert len(human.asked) == 2
    ids = {r.execution_id for r in world.system.requests}
    assert len(ids) == 2 and world.system.effects() == 2
    a, b = tool_messages(engine)
    assert {a["execution_id"], b["execution_id"]} == ids
    by_eid = {r.execution_id: r.result for r in world.system.requests}
    assert a["content"] == by_eid[a["execution_id"]] and b["content"] == by_eid[b["execution_id"]]
    assert a["content"] != b["content"]


def test_reused_call_id_resume_resolves_the_new_call_not_the_old(world: World) -> None:
    human = ScriptedHuman(["approve", None])  # the second approval waits
    engine = make_engine(world, script=TWO_TURNS, human=human, tools=TOOLS)
    engine.run("email Ada")
    waiting = engine.run("now delete prod")
    assert waiting.status is TurnStatus.WAITING_FOR_APPROVAL and waiting.waiting == ((5, 0),)
    world.restart()
    later = make_engine(world, script=TWO_TURNS, human=ScriptedHuman(), tools=TOOLS)
    assert later.pending_approvals() == [(5, 0)]
    assert later.resolve_approval((5, 0), True).status is TurnStatus.DONE
    assert [r.tool for r in world.system.requests] == ["send_email", "delete_repo"]
    assert [m["status"] for m in tool_messages(later)] == ["ok", "ok"]


def test_legacy_twin_resume_skips_a_new_call_with_a_reused_id(world: World) -> None:
    script: Script = [
        [tool_call("call_0", "read_file", {"path": "q3.csv"})],
        "Read it.",
        [tool_call("call_0", "send_email", EMAIL)],
        "Sent.",
    ]
    tools = {"read_file": "readonly", "send_email": "manual"}
    engine = make_engine(world, mode="legacy", script=script, human=ScriptedHuman([None]),
                         tools=tools, no_approval=("read_file",))
    engine.run("read q3.csv")
    assert engine.run("email it to Ada").status is TurnStatus.WAITING_FOR_APPROVAL
    world.restart()
    later = make_engine(world, mode="legacy", script=script, tools=tools,
                        no_approval=("read_file",))
    # "answered" is built from every role=tool message: turn 1's call_0 answers turn 2's
    assert later.resolve_approval((5, 0), True).text == "Sent."
    assert [r.tool for r in world.system.requests] == ["read_file"]  # the email never left
    assert len(tool_messages(later)) == 1  # and the new call has no result at all


def test_ledger_resume_runs_a_new_call_with_a_reused_id(world: World) -> None:
    script: Script = [
        [tool_call("call_0", "read_file", {"path": "q3.csv"})],
        "Read it.",
        [tool_call("call_0", "send_email", EMAIL)],
        "Sent.",
    ]
    tools = {"read_file": "readonly", "send_email": "manual"}
    engine = make_engine(world, script=script, human=ScriptedHuman([None]), tools=tools,
                         no_approval=("read_file",))
    engine.run("read q3.csv")
    assert engine.run("email it to Ada").status is TurnStatus.WAITING_FOR_APPROVAL
    world.restart()
    later = make_engine(world, script=script, tools=tools, no_approval=("read_file",))
    assert later.resolve_approval((5, 0), True).text == "Sent."
    assert [r.tool for r in world.system.requests] == ["read_file", "send_email"]
    assert [m["status"] for m in tool_messages(later)] == ["ok", "ok"]


# --------------------------------------------------------------------------
# The execution identity stays out of the model's reach
# --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["ledger", "legacy"])
@pytest.mark.parametrize(
    "arguments",
    [
        {"to": "ada", "idempotency_key": "attacker-chosen"},
        {"to": "ada", "Idempotency-Key": "x"},
        {"to": "ada", "EXECUTION_ID": "tlx1-0000"},
        {"to": "ada", "headers": {"idempotencyKey": "x"}},
    ],
    ids=["idempotency_key", "Idempotency-Key", "EXECUTION_ID", "nested"],
)
def test_model_supplied_key_argument_is_rejected_before_anything_happens(
    world: World, mode: str, arguments: dict[str, Any]
) -> None:
    human = ScriptedHuman()
    engine = make_engine(world, mode=mode, policy="idempotent", human=human,
                         script=[[tool_call("call_0", "send_email", arguments)], "Sent."])
    with pytest.raises(InvalidInput, match="named like the execution identity") as err:
        engine.run("email Ada")
    assert "nothing was recorded or executed" in str(err.value)
    assert world.system.invocations() == 0 and human.asked == []
    assert [m["role"] for m in world.conversations.load_messages("s1")] == ["user"]
    if mode == "ledger":
        assert world.store.load("s1").calls == ()
        assert world.store.audit("s1") == []


def test_reserved_argument_names_are_a_constant_matched_loosely() -> None:
    assert RESERVED_ARGUMENT_NAMES == ("idempotency_key", "execution_id", "Idempotency-Key")
    assert reserved_argument_paths({"a": [{"Execution-Id": 1}], "idempotency key": 2}) == [
        "a[0].Execution-Id", "idempotency key"]
    assert reserved_argument_paths({"key": 1, "execution": 2, "idempotent": 3}) == []
    check_arguments("t", {"to": "ada"})
    with pytest.raises(InvalidInput, match="must be a JSON object"):
        check_arguments("t", ["not", "an", "object"])


def test_idempotency_key_reaches_only_idempotent_adapters_by_keyword(world: World) -> None:
    for policy in PROTECTED:
        w = World("memory", world.path, CountingExternalSystem(), MemoryConversationStore(),
                  MemoryStore())
        make_engine(w, policy=policy).run("email Ada")
        [request] = w.system.requests
        assert request.arguments == EMAIL  # the key never rides in the arguments
        want = request.execution_id if policy == "idempotent" else None
        assert request.idempotency_key == want


# --------------------------------------------------------------------------
# Registry validation
# --------------------------------------------------------------------------


def test_unknown_policy_is_a_clear_error_and_registers_nothing() -> None:
    registry = ToolRegistry()
    adapter = CountingAdapter(CountingExternalSystem(), "send_email")
    with pytest.raises(InvalidInput) as err:
        registry.register("send_email", adapter, policy="sometimes")
    assert "unknown recovery policy 'sometimes'" in str(err.value)
    assert "readonly, manual, idempotent, reconcile" in str(err.value)
    assert len(registry) == 0


def test_reconcile_tool_needs_a_reconcile_method() -> None:
    class SendOnly:
        def invoke(self, arguments: Any, *, execution_id: str, idempotency_key: str | None,
                   attempt: int) -> Applied:
            return Applied("ok")

    registry = ToolRegistry()
    with pytest.raises(InvalidInput, match="has no reconcile"):
        registry.register("send", SendOnly(), policy="reconcile")
    assert "send" not in registry
    registry.register("send", SendOnly(), policy="idempotent")
    with pytest.raises(InvalidInput, match="already registered"):
        registry.register("send", SendOnly())
    with pytest.raises(InvalidInput, match="registered tools: send"):
        registry.get("sned")
    with pytest.raises(InvalidInput, match="has no invoke"):
        registry.register("broken", object())  # type: ignore[arg-type]


def test_unknown_tool_from_the_model_is_rejected_before_recording(world: World) -> None:
    engine = make_engine(world, script=[[tool_call("call_0", "rm_rf", {})], "Done."])
    with pytest.raises(InvalidInput, match="no tool named 'rm_rf'"):
        engine.run("clean up")
    assert world.store.load("s1").calls == ()


# --------------------------------------------------------------------------
# Humans resolve recovery_required
# --------------------------------------------------------------------------


def halted(world: World) -> TurnEngine:
    _resumed, result = crash_then_resume(world, "after ExternalApply", policy="manual")
    assert result.status is TurnStatus.RECOVERY_REQUIRED
    world.restart()
    return make_engine(world)  # the human answers later, in a new process


def test_human_says_applied(world: World) -> None:
    engine = halted(world)
    result = engine.resolve_recovery((1, 0), "applied", result_text="sent, message id 42",
                                     note="checked the outbox")
    assert result.status is TurnStatus.DONE
    [message] = tool_messages(engine)
    assert (message["content"], message["status"]) == ("sent, message id 42", "human")
    assert world.system.effects() == 1 and world.system.invocations() == 1
    kinds = [(a.kind, a.attempt, a.authorization) for a in world.store.audit("s1")]
    assert ("human_applied", 1, Authorization.HUMAN) in kinds
    assert ("reconstruct", 1, Authorization.APPROVAL) in kinds
    assert any(a.note == "checked the outbox" for a in world.store.audit("s1"))
    assert engine.recovery_required() == []


def test_human_authorizes_a_retry(world: World) -> None:
    engine = halted(world)
    result = engine.resolve_recovery((1, 0), "retry")
    assert result.status is TurnStatus.DONE
    # the human authorized a second application: attempt 2, audited as human
    assert world.system.effects() == 2
    assert [r.attempt for r in world.system.requests] == [1, 2]
    [message] = tool_messages(engine)
    assert json.loads(message["content"])["effect"] == 2
    audit = world.store.audit("s1")
    assert [(a.kind, a.attempt, a.authorization) for a in audit if a.attempt == 2] == [
        ("human_retry", 2, Authorization.HUMAN), ("dispatch", 2, Authorization.HUMAN)]
    rec = engine.ledger.state.record(engine.ledger.state.calls[0].execution_id)
    assert (rec.status, rec.attempt, rec.authorization) == (
        LedgerStatus.SUCCEEDED, 2, Authorization.HUMAN)


def test_human_abandons(world: World) -> None:
    engine = halted(world)
    result = engine.resolve_recovery((1, 0), "abandon")
    assert result.status is TurnStatus.DONE
    [message] = tool_messages(engine)
    assert message["status"] == "abandoned"
    assert world.system.invocations() == 1
    assert "human_abandon" in [a.kind for a in world.store.audit("s1")]


def test_bad_resolution_changes_nothing(world: World) -> None:
    engine = halted(world)
    before = world.store.audit("s1")
    with pytest.raises(InvalidInput, match="'applied', 'retry', 'abandon'"):
        engine.resolve_recovery((1, 0), "shrug")
    with pytest.raises(InvalidInput, match="result_text is only for resolution 'applied'"):
        engine.resolve_recovery((1, 0), "abandon", result_text="sent")
    assert world.store.audit("s1") == before
    assert len(engine.recovery_required()) == 1
    # "applied" with no text to give is allowed (Session.resolve): the model sees
    # APPLIED_NO_TEXT; the ledger-level resolve still needs a text
    with pytest.raises(InvalidInput, match="needs result_text"):
        engine.session.ledger.resolve((1, 0), "applied")
    assert world.store.audit("s1") == before


# --------------------------------------------------------------------------
# Unknown outcomes live (no crash), definite failures, upgrades
# --------------------------------------------------------------------------


def test_lost_answer_live_is_handled_like_a_crash(world: World) -> None:
    world.system.fault(Fault.LOSE_ANSWER)
    engine = make_engine(world, policy="manual")
    result = engine.run("email Ada")
    assert result.status is TurnStatus.RECOVERY_REQUIRED and world.system.effects() == 1
    assert [d.decision.value for d in engine.decisions] == ["recovery_required"]


def test_lost_answer_live_reconcile_finds_it_applied(world: World) -> None:
    world.system.fault(Fault.LOSE_ANSWER)
    engine = make_engine(world, policy="reconcile")
    assert engine.run("email Ada").status is TurnStatus.DONE
    assert world.system.effects() == 1 and world.system.invocations() == 1
    [message] = tool_messages(engine)
    assert message["content"] == world.system.requests[0].result


def test_reconcile_cannot_tell_halts(world: World) -> None:
    world.system.fault(Fault.TIME_OUT, Fault.CANNOT_TELL)
    engine = make_engine(world, policy="reconcile")
    assert engine.run("email Ada").status is TurnStatus.RECOVERY_REQUIRED
    assert "reconcile_unknown" in [a.kind for a in world.store.audit("s1")]
    assert world.system.invocations() == 1


def test_idempotent_time_outs_stop_at_max_attempts(world: World) -> None:
    world.system.fault(Fault.TIME_OUT, Fault.TIME_OUT, Fault.TIME_OUT)
    engine = make_engine(world, policy="idempotent")
    assert engine.run("email Ada").status is TurnStatus.RECOVERY_REQUIRED
    assert [r.attempt for r in world.system.requests] == [1, 2, 3]
    assert [d.decision.value for d in engine.decisions] == [
        "retry_same_id", "retry_same_id", "recovery_required"]
    late = world.system.deliver_in_flight()  # all three land late: deduplicated to one
    assert [r.status for r in late] == [RequestStatus.APPLIED] + [RequestStatus.DEDUPLICATED] * 2
    assert world.system.effects() == 1


def test_definite_failure_is_recorded_and_never_retried(world: World) -> None:
    world.system.fault(Fault.FAIL_DEFINITELY)
    engine = make_engine(world, policy="idempotent")
    assert engine.run("email Ada").status is TurnStatus.DONE
    [message] = tool_messages(engine)
    assert message["status"] == "error" and "rejected" in json.loads(message["content"])["error"]
    assert world.system.invocations() == 1 and world.system.effects() == 0
    world.restart()
    assert make_engine(world, policy="idempotent").resume().status is TurnStatus.DONE
    assert world.system.invocations() == 1


def test_an_adapter_that_raises_is_an_unknown_outcome(world: World) -> None:
    class Flaky:
        calls = 0

        def invoke(self, arguments: Any, *, execution_id: str, idempotency_key: str | None,
                   attempt: int) -> Applied:
            Flaky.calls += 1
            raise ConnectionResetError("peer went away")

    registry = ToolRegistry()
    registry.register("send_email", Flaky(), policy="manual")
    engine = TurnEngine(session_id="s1", registry=registry, human=ScriptedHuman(),
                        provider=ScriptedProvider([[tool_call("c", "send_email", EMAIL)]]),
                        conversations=world.conversations, store=world.store)
    assert engine.run("email").status is TurnStatus.RECOVERY_REQUIRED
    assert Flaky.calls == 1
    assert any("ConnectionResetError" in line for line in engine.log)


def test_rejected_approval_becomes_a_denied_result(world: World) -> None:
    engine = make_engine(world, human=ScriptedHuman(["reject"]))
    assert engine.run("email Ada").status is TurnStatus.DONE
    [message] = tool_messages(engine)
    assert message["status"] == "denied" and world.system.invocations() == 0


def test_legacy_session_upgraded_mid_way_is_conservative(world: World) -> None:
    crash = CrashInjector(parse_crash_point("legacy", "after ExternalApply"))
    with pytest.raises(SimulatedCrash):
        make_engine(world, mode="legacy", crash=crash).run("email Ada")
    world.restart()
    # the new engine takes over the session: approved, no result, no record
    upgraded = make_engine(world, mode="ledger")
    assert upgraded.ledger.state.marker == 2
    result = upgraded.resume()
    assert result.status is TurnStatus.RECOVERY_REQUIRED
    assert world.system.effects() == 1
    [decision] = upgraded.decisions
    assert decision.decision.value == "recovery_required" and decision.inputs["legacy"] is True


def test_crash_between_conversation_and_ledger_registers_the_call_once(world: World) -> None:
    resumed, result = crash_then_resume(world, "after EngineCheckpointCall")
    assert result.status is TurnStatus.DONE and world.system.effects() == 1
    assert [c.position for c in resumed.ledger.state.calls] == [(1, 0)]


def test_engine_docstring_example_runs() -> None:
    failed, attempted = doctest.testmod(toolledger.kit.engine)
    assert attempted > 5 and failed == 0


# --------------------------------------------------------------------------
# The external system itself
# --------------------------------------------------------------------------


def test_durable_external_system_counts_across_instances_and_ignores_a_torn_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ext.jsonl"
    a = CountingExternalSystem(path)
    adapter = CountingAdapter(a, "send")
    assert isinstance(adapter.invoke({}, execution_id="e1", idempotency_key="e1", attempt=1),
                      Applied)
    with path.open("a") as f:
        f.write('{"op": "apply", "num')  # killed mid-write
    b = CountingExternalSystem(path)
    assert b.effects() == 1 and b.effects("e1") == 1 and b.invocations() == 1
    again = CountingAdapter(b, "send").invoke({}, execution_id="e1", idempotency_key="e1",
                                              attempt=2)
    assert isinstance(again, Applied) and b.effects() == 1  # deduplicated


def test_reconcile_fences_per_attempt(tmp_path: Path) -> None:
    system = CountingExternalSystem()
    system.fault(Fault.TIME_OUT)
    adapter = CountingAdapter(system, "send")
    assert isinstance(adapter.invoke({}, execution_id="e", idempotency_key=None, attempt=1),
                      Unknown)
    assert isinstance(adapter.reconcile("e", attempt=1), NotAppliedFenced)
    assert system.fenced_up_to("e") == 1
    retry = adapter.invoke({}, execution_id="e", idempotency_key=None, attempt=2)
    assert isinstance(retry, Applied)  # the fence is per attempt: the retry passes
    [late] = system.deliver_in_flight()
    assert late.status is RequestStatus.DROPPED_FENCED and system.effects() == 1
    assert isinstance(adapter.reconcile("e", attempt=2), WasApplied)
    system.fault(Fault.CANNOT_TELL)
    assert isinstance(adapter.reconcile("e", attempt=2), CannotTell)
    system.fault(Fault.FAIL_DEFINITELY)
    failed = adapter.invoke({}, execution_id="f", idempotency_key=None, attempt=1)
    assert isinstance(failed, DefiniteFailure) and system.effects("f") == 0


def test_a_new_turn_waits_for_halted_calls_and_records_nothing(world: World) -> None:
    engine = halted(world)
    messages = world.conversations.load_messages("s1")
    with pytest.raises(InvalidInput, match=r"calls without a result at \[\(1, 0\)\]"):
        engine.run("and email Bob")
    assert world.conversations.load_messages("s1") == messages


def test_the_provider_never_sees_engine_metadata(world: World) -> None:
    seen: list[list[dict[str, Any]]] = []

    class Recording(ScriptedProvider):
        def complete(self, messages: Any) -> dict[str, Any]:
            seen.append(list(messages))
            return super().complete(messages)

    engine = make_engine(world)
    engine.provider = Recording([[tool_call("call_0", "send_email", EMAIL)], "Sent."])
    engine.run("email Ada")
    [tool] = [m for m in seen[-1] if m["role"] == "tool"]
    assert set(tool) == {"role", "tool_call_id", "content"}
    assert "execution_id" in tool_messages(engine)[0]  # the engine keeps it


@pytest.mark.parametrize("policy", ["readonly", "manual", "idempotent", "reconcile"])
def test_adopted_legacy_session_whose_calls_are_answered_resumes(policy: str) -> None:
    """Regression (found by notebook 03): a legacy session whose trailing calls
    all had their results when it was adopted used to make resume() raise
    'no call at (1, 0)'; those calls are answered and must be left alone."""
    from toolledger.notebook.figures_matrix import run_cell

    cell = run_cell("ledger", "legacy", policy, "after EngineCheckpoint")
    assert cell.status != "error", cell.error
    assert cell.effects == 1 and cell.decisions == ()


# --------------------------------------------------------------------------
# The kit engine runs on the adopter's API; its crash points stay meaningful
# --------------------------------------------------------------------------


def test_the_kit_engine_steps_no_ledger_and_names_no_spec_event() -> None:
    """The engine talks to the Session only: no spec action named in its code (strings
    included), no ledger step, and the few direct ledger lines are reads.  Measured by
    the same function docs/adopting.md and notebook 05 use."""
    from toolledger.notebook.kit_support import glue_of, kit_engine_glue

    glue = kit_engine_glue()
    assert glue.spec_events == ()
    assert not [line for line in glue.ledger if "step" in line or "Event" in line]
    assert len(glue.ledger) <= 8, glue.ledger
    assert len(glue.session) >= 10  # it does call the adopter's API
    # the measure sees glue that narrates the spec, in code or in a crash point's name
    narrated = glue_of('self.ledger.step(Event(Action.Recover, pos))\n'
                       'self._at("EngineParkApproval")\n'
                       '"""Prose may name ExternalApply."""\n'
                       '# so may a comment: EngineTimeout\n')
    assert len(narrated.spec_events) == 2 and len(narrated.ledger) == 1
    assert narrated.code_lines == 2


@pytest.mark.parametrize("point", ["after EnginePersistCall", "after EngineParkApproval"])
def test_a_crash_after_the_record_commit_finds_the_calls_and_their_approvals(
    world: World, point: str
) -> None:
    """Session.record writes the calls and parks their approvals in ONE commit: a crash
    after EnginePersistCall and one after EngineParkApproval are the same point, the
    moment after that commit (the approval is pending, nothing was dispatched)."""
    crash = CrashInjector(parse_crash_point("ledger", point))
    with pytest.raises(SimulatedCrash):
        make_engine(world, crash=crash, human=ScriptedHuman(default=None)).run("email Ada")
    world.restart()
    (call,) = world.store.load("s1").calls
    assert world.store.load("s1").approvals[call.execution_id].value == "pending"
    assert world.store.load("s1").ledger == {}
    resumed = make_engine(world, human=ScriptedHuman())
    assert resumed.pending_approvals() == [(1, 0)]
    assert resumed.resume().status is TurnStatus.DONE
    assert world.system.effects() == 1
