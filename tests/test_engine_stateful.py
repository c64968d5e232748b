"""Hypothesis stateful test of the engine adoption kit on a real SqliteStore, through crashes.

Under test: :class:`toolledger.kit.engine.TurnEngine` in ``ledger`` mode, as an
engine that adopts toolledger would run it: every step of the machine is a
user turn, a durable resume, a human's answer or an event of the outside
world, and every engine is a *process*: it is built from durable things
only (a :class:`~toolledger._core.sqlite_store.SqliteStore` file, a
:class:`~toolledger.kit.engine.FileConversationStore` directory and the
external system), may be reused by the next step or replaced by a new one,
and dies at crash points drawn from :func:`~toolledger.kit.engine.crash_points`
(a :class:`~toolledger.kit.engine.SimulatedCrash`: its store is closed and
never used again).  The model (a scripted provider) emits one or two tool
calls per turn, of tools of all four recovery policies, with and without
approval, and with ``tool_call_id``s reused across turns (``call_0``,
``call_1``, ``""``, ``call_salvaged_0``).  The external system
(:class:`~toolledger.kit.external.CountingExternalSystem`, durable JSON-lines
mode) can be told to lose an answer, fail definitely, time out (the request
stays in flight) or not know the answer to a reconcile question, and it
delivers requests still in flight when the machine says so (late originals).
Humans approve or reject parked approvals and resolve ``recovery_required``
items ("applied", "retry", "abandon").

The oracle: after every step, the spec's invariants (docs/protocol.md#invariants,
under the names of ``toolledger.check.invariants.INVARIANTS``), checked on what
SURVIVES: a freshly opened ``SqliteStore`` on the file (calls, approvals,
records, audit rows), the conversation file and a fresh
``CountingExternalSystem`` replaying its log (requests, effects per
execution id, fences), plus what the humans outside the engine did.  Never
the engine's memory.  At the end of every run a crash-free process with a
human who approves everything must settle every call (``EventuallySettled``).

``test_the_machine_finds_the_seed_duplicate_in_the_legacy_engine`` runs the
same machine against the ``legacy`` engine (today's behaviour, issue #443),
where only ``AtMostOnceEffect`` is observable (the legacy engine keeps no
ledger, audit or execution ids; effects are attributed to calls by a unique
argument), and asserts that Hypothesis finds the duplicate delivery.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, Phase, event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import toolledger._core.ledger
import toolledger._core.next_step
import toolledger._core.protocol
from toolledger._core.protocol import (
    ApprovalState,
    Authorization,
    CallPosition,
    Decision,
    LedgerStatus,
    ProtocolError,
    RecoveryDecision,
    RecoveryInputs,
    RecoveryPolicy,
    ResultKind,
    SessionState,
    args_digest,
    decide_recovery,
    derive_execution_id,
)
from toolledger._core.sqlite_store import SqliteStore
from toolledger._core.stores import AuditRow
from toolledger._core.tools import ToolRegistry
from toolledger.check.invariants import INVARIANTS
from toolledger.kit.engine import (
    ApprovalRequest,
    CrashInjector,
    CrashPoint,
    EngineMode,
    FileConversationStore,
    InboxItem,
    ScriptedProvider,
    SimulatedCrash,
    TurnEngine,
    TurnResult,
    TurnStatus,
    crash_points,
    tool_call,
)
from toolledger.kit.external import (
    CountingAdapter,
    CountingExternalSystem,
    ExternalRequest,
    Fault,
    RequestStatus,
)

SESSION = "s1"
MAX_ATTEMPTS = 3

# Every policy, with and without a human approval: the engine's declarations.
TOOLS: dict[str, tuple[RecoveryPolicy, bool]] = {
    f"{policy.value}_{'ask' if approval else 'auto'}": (policy, approval)
    for policy in RecoveryPolicy
    for approval in (True, False)
}
# Providers reuse ids: Gemini's call_0/call_1 on every turn, salvaged calls, "".
CALL_IDS = ["call_0", "call_1", "", "call_salvaged_0"]
FAULTS = [Fault.LOSE_ANSWER, Fault.FAIL_DEFINITELY, Fault.TIME_OUT, Fault.CANNOT_TELL]
KNOWN_OUTCOME = (LedgerStatus.SUCCEEDED, LedgerStatus.FAILED)
DECISIONS = frozenset(d.value for d in Decision)
# Where the process dies: None (it does not), or an index into crash_points(mode),
# i.e. the enumerated points of the machine's engine mode.
CRASH_AT = st.none() | st.integers(0, len(crash_points("ledger")) - 1)


def _scratch_root() -> str | None:
    """tmpfs when there is one: the crashes here are simulated in-process, so the
    OS never loses a write and an fsync buys nothing but time."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() else None


# --------------------------------------------------------------------------
# The people and the model around the engine
# --------------------------------------------------------------------------


class Human:
    """Answers approvals from a queue, then with ``default``; remembers what it approved.

    ``approved`` is outside the engine (a ghost, like the spec's
    ``humanApproved``): the positions a human really said "approve" to.
    """

    def __init__(self) -> None:
        self.answers: list[str | None] = []
        self.default: str | None = None
        self.approved: set[CallPosition] = set()
        self.asked: list[ApprovalRequest] = []

    def script(self, answers: Sequence[str | None], default: str | None) -> None:
        self.answers, self.default = list(answers), default

    def decide(self, request: ApprovalRequest) -> str | None:
        self.asked.append(request)
        answer = self.answers.pop(0) if self.answers else self.default
        note(f"    human asked about {request.tool} at {request.position}: {answer}")
        if answer == "approve":
            self.approved.add(request.position)
        return answer


class Model(ScriptedProvider):
    """The scripted provider, reading the machine's script (which grows turn by turn)."""

    def __init__(self, script: list[Sequence[dict[str, Any]] | str]) -> None:
        super().__init__([])
        self.script = script  # shared, not copied


@dataclass
class Process:
    """One engine process: its engine, its own store connection, its crash injector."""

    engine: TurnEngine
    store: SqliteStore | None
    crash: CrashInjector
    number: int

    def die(self) -> None:
        if self.store is not None:
            self.store.close()


@dataclass
class View:
    """What survives, read back from the files by fresh objects."""

    messages: list[dict[str, Any]]
    inbox: list[InboxItem]
    state: SessionState | None
    audit: list[AuditRow]
    arguments: dict[CallPosition, dict[str, Any] | None]
    requests: list[ExternalRequest]
    effects: dict[str, int]
    fences: dict[str, int]
    in_flight: list[ExternalRequest] = field(default_factory=list)

    def rows(self, e: str, kind: str) -> list[AuditRow]:
        return [r for r in self.audit if r.execution_id == e and r.kind == kind]

    def row(self, e: str, kind: str, attempt: int) -> AuditRow | None:
        return next((r for r in self.rows(e, kind) if r.attempt == attempt), None)

    def requests_of(self, e: str) -> list[ExternalRequest]:
        return [r for r in self.requests if r.execution_id == e]

    def halted(self) -> list[CallPosition]:
        st_ = self.state
        return [] if st_ is None else [c.position for c in st_.halted()]

    def pending_approvals(self) -> list[CallPosition]:
        st_ = self.state
        if st_ is not None:
            return [c.position for c in st_.calls if c.result is None
                    and st_.approval(c.execution_id) is ApprovalState.PENDING]
        # legacy: the engine finds an inbox item's call by tool_call_id (last one wins)
        by_id: dict[str, CallPosition] = {}
        for turn, m in enumerate(self.messages):
            for slot, tc in enumerate(m.get("tool_calls") or []):
                by_id[str(tc.get("id") or "")] = (turn, slot)
        return [by_id[i.tool_call_id] for i in self.inbox
                if i.state == "pending" and i.tool_call_id in by_id]

    def turn_complete(self) -> bool:
        if not self.messages:
            return True
        last = self.messages[-1]
        return last.get("role") == "assistant" and not last.get("tool_calls")


def _describe(view: View) -> str:
    """The external requests and the audit rows, for a failure message."""
    requests = "; ".join(
        f"#{r.number} {r.tool} {r.execution_id[-6:]} attempt {r.attempt} {r.status.value}"
        for r in view.requests)
    audit = "; ".join(f"{r.execution_id[-6:]} {r.kind}/{r.attempt}/{r.authorization.value}"
                      for r in view.audit)
    return f"requests: {requests or 'none'}\naudit: {audit or 'none'}"


# --------------------------------------------------------------------------
# The machine
# --------------------------------------------------------------------------


class EngineMachine(RuleBasedStateMachine):
    """Drives the engine kit (``mode``) through turns, crashes, resumes, humans and faults."""

    mode: ClassVar[EngineMode] = EngineMode.LEDGER
    examples: ClassVar[int] = 0  # machines built (one per example), for the bite figures
    steps: ClassVar[int] = 0  # engine runs (processes driven), for the steps/s figure
    moves: ClassVar[int] = 0  # machine steps (every rule), for the steps/s figure

    def __init__(self) -> None:
        super().__init__()
        type(self).examples += 1
        self.dir = Path(tempfile.mkdtemp(prefix="toolledger-engine-machine-",
                                         dir=_scratch_root()))
        self.db = self.dir / "ledger.sqlite3"
        self.conversation_dir = self.dir / "conversation"
        self.external_log = self.dir / "external.jsonl"
        # the outside world: one instance for the whole run (it survives every
        # crash); the checks read its log back through a fresh instance
        self.system = CountingExternalSystem(self.external_log)
        self.script: list[Sequence[dict[str, Any]] | str] = []
        self.human = Human()
        self.live: Process | None = None
        self.processes = 0
        self.nonce = 0
        self.turns = 0
        self.step_no = 0
        self.tool_of_nonce: dict[int, str] = {}
        self.human_retries: dict[str, int] = {}
        self._view: View | None = None
        # history the invariants compare against (what an earlier step saw)
        self.ids: dict[CallPosition, str] = {}
        self.known: dict[str, int] = {}  # execution id -> requests when its outcome was known
        self.halted_at: dict[str, tuple[int, int]] = {}  # id -> (requests, attempt) when halted

    # -- processes ------------------------------------------------------------------

    def _start(self, crash_at: CrashPoint | None, fresh: bool) -> Process:
        if self.live is not None and not fresh:
            proc = self.live
            proc.crash.point, proc.crash.fired = crash_at, False
            note(f"  (process {proc.number} goes on"
                 + (f"; it will die at {crash_at.name!r})" if crash_at else ")"))
            return proc
        self._kill_live()
        self.processes += 1
        crash = CrashInjector(crash_at)
        registry = ToolRegistry()
        for name, (policy, approval) in TOOLS.items():
            registry.register(
                name, CountingAdapter(self.system, name, on_request_sent=crash.request_sent),
                policy=policy, requires_approval=approval,
            )
        store = SqliteStore(self.db) if self.mode is EngineMode.LEDGER else None
        engine = TurnEngine(
            session_id=SESSION, mode=self.mode, registry=registry, provider=Model(self.script),
            human=self.human, conversations=FileConversationStore(self.conversation_dir),
            store=store, crash=crash, max_attempts=MAX_ATTEMPTS,
        )
        note(f"  (new process {self.processes}"
             + (f"; it will die at {crash_at.name!r})" if crash_at else ")"))
        return Process(engine, store, crash, self.processes)

    def _kill_live(self) -> None:
        if self.live is not None:
            self.live.die()
            self.live = None

    def _drive(self, proc: Process, act: Callable[[TurnEngine], TurnResult]) -> TurnResult | None:
        type(self).steps += 1
        self._view = None
        logged = len(proc.engine.log)
        try:
            result = act(proc.engine)
        except SimulatedCrash as died:
            self._tell_log(proc.engine, logged)
            note(f"  ** {died}: process {proc.number} is gone")
            event(f"crash {died.point.name}")
            proc.die()
            if self.live is proc:
                self.live = None
            return None
        self._tell_log(proc.engine, logged)
        note(f"  -> {result.status.value}"
             + (f", halted {list(result.halted)}" if result.halted else "")
             + (f", waiting {list(result.waiting)}" if result.waiting else ""))
        event(f"ended {result.status.value}")
        self.live = proc
        self._check_result(result)
        return result

    @staticmethod
    def _tell_log(engine: TurnEngine, start: int) -> None:
        for line in engine.log[start:]:
            note(f"    engine: {line}")

    def _check_result(self, result: TurnResult) -> None:
        """What the engine said agrees with what is durable."""
        view = self.view()
        assert result.status is not TurnStatus.MAX_ITERATIONS, "the engine loops"
        if self.mode is EngineMode.LEDGER:
            assert sorted(result.halted) == sorted(view.halted()), (
                f"RecoveryRequiredHalts: the engine reports {result.halted} halted, "
                f"the store {view.halted()}")
        if result.status is TurnStatus.DONE:
            assert view.turn_complete(), "the engine says done, the conversation file is not"
        if result.status is TurnStatus.WAITING_FOR_APPROVAL:
            assert set(result.waiting) <= set(view.pending_approvals()), (
                f"waiting for {result.waiting}, pending approvals {view.pending_approvals()}")

    # -- reading what survived ------------------------------------------------------

    def view(self) -> View:
        if self._view is None:
            self._view = self._read()
        return self._view

    def _read(self) -> View:
        conversations = FileConversationStore(self.conversation_dir)
        state: SessionState | None = None
        audit: list[AuditRow] = []
        arguments: dict[CallPosition, dict[str, Any] | None] = {}
        if self.mode is EngineMode.LEDGER and self.db.exists():
            with SqliteStore(self.db) as store:
                if SESSION in store.sessions():
                    state = store.load(SESSION)
                    audit = store.audit(SESSION)
                    arguments = {c.position: store.call_arguments(SESSION, c.position)
                                 for c in state.calls}
        world = CountingExternalSystem(self.external_log)
        requests = list(world.requests)
        ids = {r.execution_id for r in requests}
        return View(
            messages=conversations.load_messages(SESSION),
            inbox=conversations.load_inbox(SESSION),
            state=state, audit=audit, arguments=arguments, requests=requests,
            effects={e: world.effects(e) for e in ids},
            fences={e: world.fenced_up_to(e) for e in ids},
            in_flight=world.in_flight(),
        )

    # -- preconditions ----------------------------------------------------------------

    def idle(self) -> bool:
        v = self.view()
        open_calls = v.state is not None and any(c.result is None for c in v.state.calls)
        return v.turn_complete() and not open_calls and not v.pending_approvals()

    # -- rules ------------------------------------------------------------------------

    @precondition(lambda self: self.idle())
    @rule(
        calls=st.lists(st.tuples(st.sampled_from(sorted(TOOLS)), st.sampled_from(CALL_IDS)),
                       min_size=1, max_size=2),
        answers=st.lists(st.sampled_from(["approve", "reject", None]), max_size=2),
        default=st.sampled_from(["approve", "approve", None, "reject"]),
        crash_at=CRASH_AT,
        fresh=st.booleans(),
        stop=st.sampled_from([False, False, False, True]),
    )
    def user_turn(self, calls: list[tuple[str, str]], answers: list[str | None],
                  default: str | None, crash_at: int | None, fresh: bool,
                  stop: bool = False) -> None:
        """The user speaks; the model answers with 1-2 tool calls, then with text."""
        self.turns += 1
        emitted = []
        for tool, call_id in calls:
            self.nonce += 1
            self.tool_of_nonce[self.nonce] = tool
            emitted.append(tool_call(call_id, tool, {"to": f"x{self.nonce}", "n": self.nonce}))
        self.script.extend([emitted, f"Turn {self.turns} done."])
        self.step_no += 1
        note(f"step {self.step_no}: user turn {self.turns}; the model will call "
             + ", ".join(f"{tool}(n={self.nonce - len(calls) + i + 1}) id={cid!r}"
                         for i, (tool, cid) in enumerate(calls))
             + f"; human answers {answers}, then {default}")
        self.human.script(answers, default)
        stop = stop and self.mode is EngineMode.LEDGER
        if stop:
            note("  the user presses Stop as soon as the calls are approved (HumanCancel)")

        def act(e: TurnEngine) -> TurnResult:
            if stop:
                e.request_stop()
            return e.run(f"turn {self.turns}")

        self._drive(self._start(self._point(crash_at), fresh), act)

    @precondition(lambda self: bool(self.script))
    @rule(crash_at=CRASH_AT, fresh=st.booleans(),
          default=st.sampled_from(["approve", None, "reject"]))
    def resume(self, crash_at: int | None, fresh: bool, default: str | None) -> None:
        """Durable resume (after a crash, or spuriously: it must then change nothing)."""
        self.step_no += 1
        note(f"step {self.step_no}: resume; human answers {default}")
        self.human.script([], default)
        self._drive(self._start(self._point(crash_at), fresh), lambda e: e.resume())

    @precondition(lambda self: bool(self.view().pending_approvals()))
    @rule(pick=st.integers(0, 3), approve=st.booleans(),
          default=st.sampled_from(["approve", None]),
          crash_at=CRASH_AT, fresh=st.booleans())
    def human_answers_approval(self, pick: int, approve: bool, default: str | None,
                               crash_at: int | None, fresh: bool) -> None:
        """A human answers a parked approval while no engine waits; the session resumes."""
        pending = self.view().pending_approvals()
        pos = pending[pick % len(pending)]
        self.step_no += 1
        note(f"step {self.step_no}: a human {'approves' if approve else 'rejects'} the call "
             f"at {pos} (then answers {default})")
        self.human.script([], default)
        if approve:
            self.human.approved.add(pos)
        self._drive(self._start(self._point(crash_at), fresh),
                    lambda e: e.resolve_approval(pos, approve))

    @precondition(lambda self: self.mode is EngineMode.LEDGER and bool(self.view().halted()))
    @rule(pick=st.integers(0, 3), resolution=st.sampled_from(["applied", "retry", "abandon"]),
          crash_at=CRASH_AT, fresh=st.booleans())
    def human_resolves_recovery(self, pick: int, resolution: str,
                                crash_at: int | None, fresh: bool) -> None:
        """A human resolves a call halted in recovery_required."""
        view = self.view()
        halted = view.halted()
        pos = halted[pick % len(halted)]
        assert view.state is not None
        call = view.state.call(pos)
        assert call is not None
        e = call.execution_id
        attempt = view.state.record(e).attempt
        self.step_no += 1
        note(f"step {self.step_no}: a human resolves {call.tool.name} at {pos} "
             f"(attempt {attempt}): {resolution}")
        self.human.script([], "approve")
        proc = self._start(self._point(crash_at), fresh)
        if resolution == "retry" and attempt >= MAX_ATTEMPTS:
            # no budget left: refused, and nothing is written
            with pytest.raises(ProtocolError, match="exceeds max_attempts"):
                proc.engine.resolve_recovery(pos, "retry")
            self.live = proc
            self._view = None
            after = self.view()
            assert after.audit == view.audit and after.state == view.state
            note("  -> refused: the retry budget is spent; nothing written")
            return
        if resolution == "retry":
            self.human_retries[e] = self.human_retries.get(e, 0) + 1
        text = f"a human checked: {pos} was applied" if resolution == "applied" else None
        self._drive(proc, lambda eng: eng.resolve_recovery(pos, resolution, result_text=text))

    @rule()
    def process_dies_idle(self) -> None:
        """The engine process dies between two requests (the next one starts a new one)."""
        self.step_no += 1
        note(f"step {self.step_no}: "
             + (f"process {self.live.number} dies while idle" if self.live else "(no process)"))
        self._kill_live()

    def faults_queued(self) -> int:
        # (the external system's own script; no public count: read it, never write it)
        return len(self.system._faults) + len(self.system._reconcile_faults)

    @precondition(lambda self: self.faults_queued() < 2)
    @rule(fault=st.sampled_from(FAULTS))
    def external_fault(self, fault: Fault) -> None:
        """The outside world: the next request (or reconcile question) goes wrong."""
        self.step_no += 1
        self.system.fault(fault)
        note(f"step {self.step_no}: the external system will {fault.value} next")

    @precondition(lambda self: bool(self.view().in_flight))
    @rule()
    def network_delivers_late_requests(self) -> None:
        """Requests still in flight (time-outs, crashes mid-call) finally land."""
        self.step_no += 1
        late = self.system.deliver_in_flight()
        self._view = None
        note(f"step {self.step_no}: late requests land: "
             + "; ".join(f"#{r.number} {r.tool} attempt {r.attempt} -> {r.status.value}"
                         for r in late))

    def _point(self, crash_at: int | None) -> CrashPoint | None:
        """The drawn crash point of this machine's engine mode (``None``: no crash)."""
        if crash_at is None:
            return None
        points = crash_points(self.mode)
        return points[crash_at % len(points)]

    # -- the spec's invariants, on what survived ---------------------------------------

    @invariant()
    def spec_invariants(self) -> None:
        view = self.view()
        checks: list[tuple[str, Callable[[View], list[str]]]] = [
            ("AtMostOnceEffect", self.AtMostOnceEffect)]
        if self.mode is EngineMode.LEDGER:
            checks += [
                ("NoReinvokeAfterKnownOutcome", self.NoReinvokeAfterKnownOutcome),
                ("AttemptSentOnce", self.AttemptSentOnce),
                ("NoBlindReplay", self.NoBlindReplay),
                ("ResultFidelity", self.ResultFidelity),
                ("ApprovalGate", self.ApprovalGate),
                ("ApprovalSingleUse", self.ApprovalSingleUse),
                ("RecoveryRequiredHalts", self.RecoveryRequiredHalts),
                ("ExecutionIdStable", self.ExecutionIdStable),
                ("AuditComplete", self.AuditComplete),
                ("AuditRecomputable", self.AuditRecomputable),
                ("CancelledNeverInvoked", self.CancelledNeverInvoked),
            ]
        for name, check in checks:
            assert name in INVARIANTS, name
            problems = check(view)
            assert not problems, f"{name} violated: {problems}\n{_describe(view)}"
        if self.mode is EngineMode.LEDGER:
            # an ASSUME of the spec (the id's derivation), not an invariant:
            # checked here because the kit derives the ids itself
            problems = self.ExecutionIdUnique(view)
            assert not problems, f"ExecutionIdUnique violated: {problems}\n{_describe(view)}"

    def _calls(self, view: View) -> dict[str, Any]:
        return {} if view.state is None else {c.execution_id: c for c in view.state.calls}

    def AtMostOnceEffect(self, view: View) -> list[str]:
        """Effects per call <= 1 + the human retries the audit records for it."""
        out = []
        applied: dict[int, int] = {}  # effects per call, by its unique argument
        for r in view.requests:
            if r.status is RequestStatus.APPLIED:
                n = int(r.arguments["n"])
                applied[n] = applied.get(n, 0) + 1
        for n, count in sorted(applied.items()):
            tool = self.tool_of_nonce[n]
            if TOOLS[tool][0] is RecoveryPolicy.READONLY:
                continue  # declared replay-safe
            eids = {r.execution_id for r in view.requests if r.arguments.get("n") == n}
            retries = sum(len(view.rows(e, "human_retry")) for e in eids)
            if count > 1 + retries:
                out.append(f"the call {tool}(n={n}) was applied {count} times, "
                           f"{retries} human retries recorded")
        for e, c in self._calls(view).items():
            if c.tool.protected and view.effects.get(e, 0) > 1 + len(view.rows(e, "human_retry")):
                out.append(f"execution {e} applied {view.effects[e]} times")
        return out

    def NoReinvokeAfterKnownOutcome(self, view: View) -> list[str]:
        out = []
        assert view.state is not None or not view.requests
        for e, c in self._calls(view).items():
            assert view.state is not None
            rec = view.state.record(e)
            sent = view.requests_of(e)
            if rec.status in KNOWN_OUTCOME and c.tool.protected:
                late = [r.attempt for r in sent if r.attempt > rec.attempt]
                if late:
                    out.append(f"{c.position}: attempts {late} sent after {rec.status.value} "
                               f"at attempt {rec.attempt}")
                before = self.known.setdefault(e, len(sent))
                if len(sent) > before:
                    out.append(f"{c.position}: {len(sent) - before} request(s) after the "
                               f"outcome was durable")
        return out

    def AttemptSentOnce(self, view: View) -> list[str]:
        """Each attempt of a protected call is sent once: keyed by the CALL (its unique
        argument ``n``), not by the execution id."""
        out = []
        seen: set[tuple[int, int]] = set()
        for r in view.requests:
            n = int(r.arguments["n"])
            if TOOLS[self.tool_of_nonce[n]][0] is RecoveryPolicy.READONLY:
                continue  # bypasses the ledger: replaying it is declared safe
            key = (n, r.attempt)
            if key in seen:
                out.append(f"the call n={key[0]}: attempt {r.attempt} sent twice")
            seen.add(key)
        return out

    def NoBlindReplay(self, view: View) -> list[str]:
        out = []
        calls = self._calls(view)
        for r in view.requests:
            c = calls.get(r.execution_id)
            if c is None or not c.tool.protected:
                continue
            policy = c.tool.policy
            key = r.execution_id if policy is RecoveryPolicy.IDEMPOTENT else None
            if r.idempotency_key != key:
                out.append(f"{c.position} attempt {r.attempt}: key {r.idempotency_key!r} "
                           f"under {policy.value}")
            if r.attempt <= 1:
                continue
            row = view.row(r.execution_id, "dispatch", r.attempt)
            auth = None if row is None else row.authorization
            if auth is Authorization.HUMAN and view.row(r.execution_id, "human_retry", r.attempt):
                continue
            if auth is Authorization.POLICY and policy is RecoveryPolicy.IDEMPOTENT:
                continue
            if (auth is Authorization.POLICY and policy is RecoveryPolicy.RECONCILE
                    and view.fences.get(r.execution_id, 0) >= r.attempt - 1
                    and view.row(r.execution_id, "reconcile_not_applied", r.attempt - 1)):
                continue
            out.append(f"{c.position} attempt {r.attempt} of a {policy.value} tool, "
                       f"authorized by {auth}")
        return out

    def ResultFidelity(self, view: View) -> list[str]:
        """A successful result is exactly what the external system returned for THAT id."""
        out = []
        assert view.state is not None or not view.messages or not view.requests
        calls = self._calls(view)
        returned: dict[str, set[str | None]] = {}
        for r in view.requests:
            if r.status in (RequestStatus.APPLIED, RequestStatus.DEDUPLICATED):
                returned.setdefault(r.execution_id, set()).add(r.result)
        owner: dict[str, CallPosition] = {}
        for i, m in enumerate(view.messages):
            if m.get("role") != "tool":
                continue
            e = m.get("execution_id")
            c = calls.get(str(e))
            if c is None:
                out.append(f"message {i} answers unknown execution {e}")
                continue
            turn = max(j for j in range(i) if view.messages[j].get("role") == "assistant")
            if c.position[0] != turn or m.get("tool_call_id") != c.tool_call_id:
                out.append(f"message {i} ({m.get('tool_call_id')!r}) answers {c.position}, "
                           f"not a call of message {turn}")
            if e in owner:
                out.append(f"message {i}: a second result for {c.position}")
            owner[str(e)] = c.position
            if (m.get("status") == ResultKind.OK.value and c.tool.protected
                    and m.get("content") not in returned.get(c.execution_id, set())):
                out.append(f"{c.position} shows {m.get('content')!r}; the external system "
                           f"returned {sorted(map(str, returned.get(str(e), set())))} for it")
            if c.result is not None and m.get("content") != c.result.content:
                out.append(f"{c.position}: the conversation and the store disagree on the result")
        for e, c in calls.items():
            r = c.result
            if r is None:
                continue
            if r.execution_id != e or r.args_digest != c.args_digest:
                out.append(f"{c.position} holds a result of {r.execution_id}/{r.args_digest}")
            if (r.kind is ResultKind.OK and c.tool.protected
                    and r.content not in returned.get(e, set())):
                out.append(f"{c.position}: stored ok result {r.content!r} was never returned")
        return out

    def ApprovalGate(self, view: View) -> list[str]:
        out = []
        calls = self._calls(view)
        assert view.state is not None or not view.requests
        for r in view.requests:
            c = calls.get(r.execution_id)
            if c is None or not c.tool.requires_approval:
                continue
            row = view.row(r.execution_id, "dispatch", r.attempt)
            human = row is not None and row.authorization is Authorization.HUMAN
            assert view.state is not None
            if not human and (c.position not in self.human.approved
                              or view.state.approval(r.execution_id) is not ApprovalState.APPROVED):
                out.append(f"{c.tool.name} at {c.position} attempt {r.attempt} sent without "
                           f"an approval of this call (approval "
                           f"{view.state.approval(r.execution_id).value})")
        return out

    def ApprovalSingleUse(self, view: View) -> list[str]:
        out = []
        for e, c in self._calls(view).items():
            used = [r.attempt for r in view.rows(e, "dispatch")
                    if r.authorization is Authorization.APPROVAL]
            if c.tool.protected and len(used) > 1:
                out.append(f"{c.position}: one approval authorized attempts {used}")
        return out

    def RecoveryRequiredHalts(self, view: View) -> list[str]:
        out = []
        assert view.state is not None or not view.requests
        for e, c in self._calls(view).items():
            assert view.state is not None
            rec = view.state.record(e)
            sent = view.requests_of(e)
            was = self.halted_at.get(e)
            if was is not None and len(sent) > was[0]:
                retried = [r.attempt for r in view.rows(e, "human_retry") if r.attempt > was[1]]
                if not retried:
                    out.append(f"{c.position}: sent again while recovery_required, "
                               f"no human retry")
            if rec.status is LedgerStatus.RECOVERY_REQUIRED:
                self.halted_at[e] = (len(sent), rec.attempt)
                if any(r.attempt > rec.attempt for r in sent):
                    out.append(f"{c.position}: an attempt beyond {rec.attempt} while halted")
                if any(m.get("execution_id") == e for m in view.messages):
                    out.append(f"{c.position}: halted, yet it has a tool message")
            else:
                self.halted_at.pop(e, None)
        return out

    def ExecutionIdStable(self, view: View) -> list[str]:
        """Derived from the persisted position and tool_call_id; never changes; every
        request was sent under the id of the call whose arguments it carries."""
        out = []
        calls = self._calls(view)
        for e, c in calls.items():
            turn, slot = c.position
            msg = view.messages[turn] if turn < len(view.messages) else {}
            tcs = msg.get("tool_calls") or []
            if msg.get("role") != "assistant" or slot >= len(tcs):
                out.append(f"{c.position} is durable in the ledger, not in the conversation")
                continue
            tc = tcs[slot]
            args = json.loads(tc["function"]["arguments"])
            if (tc.get("id") or "") != c.tool_call_id or tc["function"]["name"] != c.tool.name:
                out.append(f"{c.position}: the ledger's call is not the conversation's")
            if args_digest(c.tool.name, args) != c.args_digest or view.arguments.get(
                    c.position) != args:
                out.append(f"{c.position}: arguments differ between the ledger and the "
                           "conversation")
            if e != derive_execution_id(SESSION, turn, slot, c.tool_call_id):
                out.append(f"{c.position}: id {e} is not derived from its position")
            if self.ids.setdefault(c.position, e) != e:
                out.append(f"{c.position}: id changed from {self.ids[c.position]} to {e}")
        for r in view.requests:
            c = calls.get(r.execution_id)
            if c is None:
                out.append(f"request #{r.number} under unknown id {r.execution_id}")
            elif r.arguments != view.arguments.get(c.position):
                out.append(f"request #{r.number} carries other arguments than {c.position}")
        for asked in self.human.asked:
            if asked.execution_id is not None and self.ids.get(asked.position,
                                                               asked.execution_id) != (
                    asked.execution_id):
                out.append(f"the human was asked about {asked.position} under "
                           f"{asked.execution_id}")
        return out

    def ExecutionIdUnique(self, view: View) -> list[str]:
        ids = [c.execution_id for c in (view.state.calls if view.state else ())]
        return [] if len(ids) == len(set(ids)) else [f"shared ids among {ids}"]

    def AuditComplete(self, view: View) -> list[str]:
        out = []
        calls = self._calls(view)
        for r in view.requests:
            c = calls.get(r.execution_id)
            if c is None or not c.tool.protected:
                continue
            if view.row(r.execution_id, "dispatch", r.attempt) is None:
                out.append(f"{c.position} attempt {r.attempt} sent with no dispatch row")
        for row in view.audit:
            c = calls.get(row.execution_id)
            if c is None or (row.tool_call_id, row.position) != (c.tool_call_id, c.position):
                out.append(f"audit row {row.kind}/{row.attempt} names no call of the store")
        for e, c in calls.items():
            assert view.state is not None
            if view.state.record(e).status is LedgerStatus.RECOVERY_REQUIRED and not (
                    view.rows(e, "recovery_required") or view.rows(e, "reconcile_unknown")):
                out.append(f"{c.position}: recovery_required without a decision row")
            if len(view.rows(e, "human_retry")) != self.human_retries.get(e, 0):
                out.append(f"{c.position}: {self.human_retries.get(e, 0)} human retries, "
                           f"{len(view.rows(e, 'human_retry'))} rows")
        return out

    def AuditRecomputable(self, view: View) -> list[str]:
        """Every recovery-decision row's inputs recompute to its decision."""
        out = []
        for row in view.audit:
            if row.kind not in DECISIONS:
                continue
            decided = decide_recovery(RecoveryInputs(
                **{**row.inputs,
                   "status": LedgerStatus(row.inputs["status"]),
                   "approval": ApprovalState(row.inputs["approval"]),
                   "policy": RecoveryPolicy(row.inputs["policy"])}))
            if decided.decision.value != row.kind:
                out.append(f"audit row {row.kind} recomputes to {decided.decision.value}")
        return out

    def CancelledNeverInvoked(self, view: View) -> list[str]:
        """A call the user stopped was never sent, never dispatched, and its Stop is audited."""
        out = []
        for e, c in self._calls(view).items():
            if c.result is None or c.result.kind is not ResultKind.CANCELLED:
                continue
            if view.requests_of(e):
                out.append(f"{c.position}: cancelled, yet {len(view.requests_of(e))} request(s)")
            if view.rows(e, "dispatch"):
                out.append(f"{c.position}: cancelled, yet it has a dispatch row")
            if not view.rows(e, "human_cancel"):
                out.append(f"{c.position}: cancelled with no human_cancel row")
        return out

    # -- the end of a run -----------------------------------------------------------------

    def teardown(self) -> None:
        type(self).moves += self.step_no
        try:
            if self.script and self.mode is EngineMode.LEDGER:
                self._settle()
        finally:
            self._kill_live()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _settle(self) -> None:
        """EventuallySettled: a crash-free process with an approving human settles every
        call (a result, or recovery_required waiting for a human)."""
        note("end: a crash-free process resumes; the human approves everything")
        self.human.script([], "approve")
        result = self._drive(self._start(None, fresh=True), lambda e: e.resume())
        assert result is not None
        view = self.view()
        assert view.state is not None
        unsettled = [c.position for c in view.state.calls if c.result is None
                     and view.state.record(c.execution_id).status
                     is not LedgerStatus.RECOVERY_REQUIRED]
        assert not unsettled, f"EventuallySettled violated: {unsettled} neither answered nor halted"
        assert (result.status is TurnStatus.RECOVERY_REQUIRED) == bool(view.halted())
        self.spec_invariants()


class LegacyEngineMachine(EngineMachine):
    """The same machine against today's engine (issue #443)."""

    mode = EngineMode.LEGACY


def _engine_settings() -> settings:
    """The loaded profile, with fewer examples: every step here is a real engine run."""
    profile = settings()
    return settings(
        profile,
        max_examples=max(10, profile.max_examples // 4),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        deadline=None,
    )


def test_engine_machine() -> None:
    """Hypothesis drives the ledger engine on a real SqliteStore; the invariants hold."""
    EngineMachine.examples = EngineMachine.steps = EngineMachine.moves = 0
    started = time.perf_counter()
    run_state_machine_as_test(EngineMachine, settings=_engine_settings())
    seconds = time.perf_counter() - started
    m = EngineMachine
    print(f"\nengine machine: {m.examples} runs, {m.moves} steps ({m.steps} of them engine "
          f"processes driven) in {seconds:.1f} s: {m.moves / seconds:.1f} steps/s, "
          f"{m.steps / seconds:.1f} engine runs/s")
    assert EngineMachine.steps > EngineMachine.examples  # it really drove engines


def _find_a_bug(machine: type[EngineMachine], max_examples: int = 200) -> None:
    """Run ``machine`` until it fails (the first failure, unshrunk: finding it is the point)."""
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=max_examples,
            stateful_step_count=30,
            derandomize=True,
            database=None,
            deadline=None,
            report_multiple_bugs=False,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.explicit, Phase.generate],
        ),
    )


def test_the_machine_finds_the_seed_duplicate_in_the_legacy_engine() -> None:
    """The machine bites: against the legacy engine it finds issue #443's duplicate delivery."""
    LegacyEngineMachine.examples = 0
    started = time.perf_counter()
    with pytest.raises(AssertionError, match="AtMostOnceEffect violated") as found:
        _find_a_bug(LegacyEngineMachine)
    seconds = time.perf_counter() - started
    print(f"\nlegacy engine: Hypothesis found the duplicate delivery after "
          f"{LegacyEngineMachine.examples} examples in {seconds:.1f} s")
    assert "applied 2 times" in str(found.value)
    assert LegacyEngineMachine.examples <= 200



def test_the_machine_catches_a_ledger_engine_that_replays_a_manual_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Broken on purpose: recovery retries a ``manual`` call found in ``dispatched``."""
    original = decide_recovery

    def broken(i: RecoveryInputs) -> RecoveryDecision:
        if (i.status is LedgerStatus.DISPATCHED and i.policy is RecoveryPolicy.MANUAL
                and not i.has_result and i.attempt < i.max_attempts):
            return RecoveryDecision(Decision.RETRY_SAME_ID, i)
        return original(i)

    # the core decides; the Ledger and the Session recompute it for the audit and the engine
    # next_step: where the Session looks the decision up (recover(), its status)
    for module in (toolledger._core.protocol, toolledger._core.ledger, toolledger._core.next_step):
        monkeypatch.setattr(module, "decide_recovery", broken)
    EngineMachine.examples = 0
    with pytest.raises(AssertionError, match=r"NoBlindReplay violated|AtMostOnceEffect violated"):
        _find_a_bug(EngineMachine, max_examples=100)
    print(f"\nbroken ledger engine: caught after {EngineMachine.examples} examples")
