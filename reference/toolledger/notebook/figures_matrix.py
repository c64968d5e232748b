"""The fault matrix: every crash point run through the engine kit, mapped to the spec, drawn.

What it is for
--------------
Notebooks 03, 05 and 06 show what the engine kit (:mod:`toolledger.kit.engine`)
does when the process dies at each of its crash points, for every recovery
policy, on both engines, and for a session the legacy engine started and the
ledger engine adopted (:func:`~toolledger.kit.engine.adopt_legacy_session`).
This module runs those cells and turns them into the notebooks' tables and
pictures; it also records what the ledger engine fed to its
:class:`~toolledger._core.ledger.Ledger`, so that a run can be mapped to a
behaviour of ``spec/DurableToolExecution.tla`` and handed to TLC
(:func:`toolledger.check.tracecheck.validate_traces`).

- :class:`RecordingTurnEngine` is the kit's ``TurnEngine`` with a
  :class:`RecordingLedger`: every ledger call is written to a
  :class:`LedgerTape` with the protocol events it applied, the state before
  and after, and the commits it made (counted by the store's own
  ``commits`` / ``ledger_commits`` counters).
- :func:`run_cell` runs the scenario of ``toolledger simulate`` (one approved
  ``send_email``, a crash, a resume, late requests delivered) for one
  (engine, session kind, policy, crash point) and measures it: effects and
  invocations are counted by the external system, results read back from the
  engine.  :func:`run_matrix` runs every cell.
- :func:`spec_run` maps the ledger engine's part of a cell to a run of the
  closed-world model (:mod:`toolledger.check.system`): each recorded event must be a
  step the model allows whose engine state is exactly the one the engine
  recorded; the external system and the ghosts are the model's.  The result
  goes to :func:`~toolledger.check.tracecheck.trace_of` and TLC.
- :func:`fault_matrix_figure`, :func:`matrix_table_html`, :func:`html_table`:
  the picture and the tables.

What it must never do: edit or decide anything about the protocol (the kit
decides; this module only watches and counts), type in a number it did not
measure, or run TLC itself (the notebooks do, with the functions above).
"""

from __future__ import annotations

import html
import textwrap
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final

from .._core import protocol as p
from .._core.ledger import Ledger, Void
from .._core.session import Session, Tool
from .._core.stores import MemoryStore, Store
from .._core.tools import ToolRegistry
from ..check.invariants import check_all
from ..check.mapping import to_spec
from ..check.system import CallConfig, ExternalState, Ghosts, ModelConfig, SystemState
from ..check.system import initial_states as model_initial_states
from ..check.system import successors as model_successors
from ..check.tlavalues import Value
from ..kit.engine import (
    SEED_MATRIX,
    ConversationStore,
    CrashInjector,
    CrashPoint,
    EngineMode,
    InboxItem,
    MemoryConversationStore,
    ScriptedHuman,
    ScriptedProvider,
    SimulatedCrash,
    TurnEngine,
    TurnResult,
    crash_points,
    parse_crash_point,
    tool_call,
)
from ..kit.external import CountingAdapter, CountingExternalSystem, RequestStatus
from ..kit.simulate import ARGUMENTS, SESSION_ID, TOOL, USER_TEXT
from .figures import FIGURE_WIDTH_IN, FONT_PT, TITLE_PT

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "CATEGORY_COLOURS",
    "DECISION_SHORT",
    "POLICIES",
    "CellCategory",
    "ConversationTap",
    "EmailCall",
    "LedgerTape",
    "MatrixCell",
    "MatrixFigure",
    "RecordingLedger",
    "RecordingTurnEngine",
    "SessionKind",
    "SpecMismatch",
    "SpecRun",
    "TapeEntry",
    "category",
    "email_model",
    "fault_matrix_figure",
    "html_table",
    "invariant_violations",
    "matrix_table_html",
    "panels",
    "run_cell",
    "run_matrix",
    "scenario_engine",
    "seed_row_of",
    "spec_run",
    "spec_run_of_tape",
]

POLICIES: Final[tuple[str, ...]] = tuple(x.value for x in p.RecoveryPolicy)
"""Every recovery policy, in the order of :class:`~toolledger._core.protocol.RecoveryPolicy`."""

_SPEC_SESSION_VARIABLES: Final = (
    "msg", "args", "result", "approval", "ledger", "audit", "marker", "stage",
)  # fmt: skip


# --------------------------------------------------------------------------
# Recording what the ledger engine does
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class TapeEntry:
    """One thing that happened to the durable state of a session.

    ``kind`` is

    - ``"open"``: an engine opened the session's ledger (created it, loaded it,
      or adopted a legacy session); ``after`` is what it found;
    - ``"commit"``: one ``step``/``step_many``/``resolve`` call of the ledger;
      ``events`` were applied in order, from ``before`` to ``after``;
    - ``"conversation"``: the engine checkpointed the conversation
      (:class:`ConversationTap`); ``note`` says what it saved;
    - ``"crash"``: the process died here; nothing was written.

    ``commits`` and ``ledger_commits`` are how much the store's own counters
    grew (0 for a volatile step and for a conversation checkpoint).
    """

    kind: str
    events: tuple[p.Event, ...] = ()
    before: p.SessionState | None = None
    after: p.SessionState | None = None
    commits: int = 0
    ledger_commits: int = 0
    note: str = ""


@dataclass
class LedgerTape:
    """Everything that happened to one session's ledger, across engines and crashes."""

    entries: list[TapeEntry] = field(default_factory=list)

    def opened(self, state: p.SessionState, commits: int = 0, ledger_commits: int = 0) -> None:
        self.entries.append(TapeEntry("open", after=state, commits=commits,
                                      ledger_commits=ledger_commits))

    def crashed(self) -> None:
        """The process died: what the ledger held in memory is gone."""
        self.entries.append(TapeEntry("crash", note="the process died"))

    @property
    def ledger_entries(self) -> list[TapeEntry]:
        """The entries about the ledger (conversation checkpoints left out)."""
        return [e for e in self.entries if e.kind != "conversation"]

    @property
    def events(self) -> list[p.Event]:
        """Every event applied, in order (crashes and opens left out)."""
        return [ev for e in self.entries for ev in e.events]

    @property
    def commits(self) -> int:
        return sum(e.commits for e in self.entries)

    @property
    def ledger_commits(self) -> int:
        return sum(e.ledger_commits for e in self.entries)


class RecordingLedger(Ledger):
    """A :class:`~toolledger._core.ledger.Ledger` that writes every transition to a tape.

    It overrides the Ledger's one commit funnel (``_advance``, behind
    ``step``, ``step_many`` and ``resolve``) only to watch it: the events,
    the state before and after, and how much the store's commit counters grew.
    """

    def __init__(self, store: Store, session_id: str, tape: LedgerTape) -> None:
        super().__init__(store, session_id)
        self.tape = tape

    def _advance(
        self,
        events: list[p.Event],
        contents: dict[p.CallPosition, str],
        arguments: dict[p.CallPosition, Mapping[str, Any]],
        human_note: str | None,
        voids: list[Void] | None = None,
    ) -> p.SessionState:
        before = self.full_state()
        commits, ledger_commits = self.store.commits, self.store.ledger_commits
        kept = super()._advance(events, contents, arguments, human_note, voids)
        after = self.full_state()
        self.tape.entries.append(
            TapeEntry(
                "commit",
                tuple(events),
                before,
                after,
                self.store.commits - commits,
                self.store.ledger_commits - ledger_commits,
                ", ".join(ev.action.value for ev in events),
            )
        )
        return kept


class RecordingTurnEngine(TurnEngine):
    """The kit's :class:`~toolledger.kit.engine.TurnEngine` (ledger mode) on a
    :class:`RecordingLedger`.

    The ledger the engine opens (created, loaded or adopted from a legacy
    session, exactly as the plain engine does it) is reloaded from the store
    as a :class:`RecordingLedger`: nothing is volatile at that moment, so the
    two are the same state.
    """

    def __init__(self, *, tape: LedgerTape, **kwargs: Any) -> None:
        self.tape = tape
        super().__init__(**kwargs)

    def _open_session(
        self, tools: Mapping[str, Tool], observe: Callable[[Sequence[Any]], None]
    ) -> Session:
        assert self.store is not None
        commits, ledger_commits = self.store.commits, self.store.ledger_commits
        opened = super()._open_session(tools, observe)
        recording = RecordingLedger(self.store, self.session_id, self.tape)
        if recording.state != opened.ledger.state:
            raise AssertionError("the reloaded ledger differs from the one the engine opened")
        self.tape.opened(recording.full_state(), self.store.commits - commits,
                         self.store.ledger_commits - ledger_commits)
        return Session(recording, tools, observe=observe)


class ConversationTap:
    """A :class:`~toolledger.kit.engine.ConversationStore` that notes every checkpoint on a tape.

    It passes everything to ``inner``; a ``save_messages`` also appends a
    ``"conversation"`` entry saying how many messages were saved and what the
    last one is, so a turn's ledger commits and conversation checkpoints can
    be read in the order they happened.
    """

    def __init__(self, inner: ConversationStore, tape: LedgerTape) -> None:
        self.inner = inner
        self.tape = tape

    def load_messages(self, session_id: str) -> list[dict[str, Any]]:
        return self.inner.load_messages(session_id)

    def save_messages(self, session_id: str, messages: Sequence[dict[str, Any]]) -> None:
        self.inner.save_messages(session_id, messages)
        last = messages[-1] if messages else {}
        what = str(last.get("role", "nothing"))
        if what == "assistant" and last.get("tool_calls"):
            what = "assistant message with tool calls"
        elif what == "tool":
            what = f"tool result ({last.get('status', 'ok')})"
        self.tape.entries.append(
            TapeEntry("conversation", note=f"{len(messages)} message"
                      f"{'' if len(messages) == 1 else 's'} saved, the last: {what}"))

    def load_inbox(self, session_id: str) -> list[InboxItem]:
        return self.inner.load_inbox(session_id)

    def save_inbox(self, session_id: str, items: Sequence[InboxItem]) -> None:
        self.inner.save_inbox(session_id, items)


# --------------------------------------------------------------------------
# The scenario (toolledger simulate's), one cell at a time
# --------------------------------------------------------------------------


class SessionKind(StrEnum):
    """Who started the session the ledger engine resumes."""

    NEW = "new"  # the ledger engine, from its first message (marker 0)
    LEGACY = "legacy"  # the legacy engine; the ledger engine adopts it on resume


def scenario_engine(
    mode: EngineMode | str,
    policy: p.RecoveryPolicy | str,
    *,
    store: Store | None,
    conversations: ConversationStore,
    system: CountingExternalSystem,
    crash: CrashInjector,
    tape: LedgerTape | None = None,
    human: ScriptedHuman | None = None,
    script: Sequence[Sequence[dict[str, Any]] | str] | None = None,
) -> TurnEngine:
    """The engine ``toolledger simulate`` builds: ``send_email`` needing approval, one call.

    ``script`` replaces the model's answers (default: one ``send_email`` call
    with ``call_0``, then a final text); ``tape`` records the ledger (ledger
    mode only).
    """
    registry = ToolRegistry()
    registry.register(
        TOOL,
        CountingAdapter(system, TOOL, on_request_sent=crash.request_sent),
        policy=policy,
        requires_approval=True,
    )
    if script is None:
        script = [[tool_call("call_0", TOOL, ARGUMENTS)], "The email is sent."]
    kwargs: dict[str, Any] = {
        "session_id": SESSION_ID,
        "mode": mode,
        "registry": registry,
        "provider": ScriptedProvider(script),
        "human": human or ScriptedHuman(default="approve"),
        "conversations": conversations,
        "store": store,
        "crash": crash,
    }
    if tape is not None and EngineMode(str(mode)) is EngineMode.LEDGER:
        return RecordingTurnEngine(tape=tape, **kwargs)
    return TurnEngine(**kwargs)


@dataclass(frozen=True)
class MatrixCell:
    """One cell of the fault matrix, as measured.

    ``engine`` is the engine that resumes (and, for a new session, ran the
    turn); ``point`` is a crash point of ``crash_mode``, the engine that died
    (the legacy engine for a legacy session).  ``status`` is the turn status
    after the resume, or ``"error"`` if the resume raised (``error`` says
    what).  ``effects`` and ``invocations`` are the external system's counts
    after the late requests landed; ``legacy_effects`` and
    ``legacy_invocations`` are the parts of them that the legacy engine's
    requests account for.
    """

    engine: str
    session: str
    policy: str
    point: str
    crash_mode: str
    seed_row: str | None
    on_path: bool
    crashed: bool
    status: str
    error: str | None
    decisions: tuple[str, ...]
    effects: int
    invocations: int
    legacy_effects: int
    legacy_invocations: int
    tool_status: str | None
    tool_result: str | None
    late: tuple[tuple[int, str, int, str], ...]  # (number, execution id, attempt, status)
    tape: LedgerTape | None = field(default=None, compare=False, repr=False)

    @property
    def protected(self) -> bool:
        """The tool has a side effect (its policy is not ``readonly``)."""
        return self.policy != p.RecoveryPolicy.READONLY.value

    @property
    def label(self) -> str:
        return f"{self.engine} engine, {self.session} session, {self.policy}, {self.point}"


def seed_row_of(mode: EngineMode | str, point: CrashPoint | str) -> str | None:
    """The name of the seed matrix row (issue #443) at this crash point, if any."""
    cp = parse_crash_point(mode, point)
    for row in SEED_MATRIX.values():
        if row.point(mode) == cp:
            return row.name
    return None


def run_cell(
    engine: EngineMode | str,
    session: SessionKind | str,
    policy: p.RecoveryPolicy | str,
    point: CrashPoint | str,
) -> MatrixCell:
    """Run one cell: the turn, a crash at ``point``, a resume, late requests; measure.

    For a legacy session the legacy engine runs the turn and dies at
    ``point`` (a legacy crash point); the ``engine`` that resumes must be the
    ledger engine, which adopts the session when it opens it.  Only a
    :class:`~toolledger.kit.engine.SimulatedCrash` is expected; anything the
    resume raises is measured as ``status="error"``.
    """
    mode = EngineMode(str(engine))
    kind = SessionKind(str(session))
    pol = p.RecoveryPolicy(str(policy))
    if kind is SessionKind.LEGACY and mode is not EngineMode.LEDGER:
        raise ValueError("a legacy session is resumed by the ledger engine (engine='ledger')")
    first_mode = EngineMode.LEGACY if kind is SessionKind.LEGACY else mode
    cp = parse_crash_point(first_mode, point)
    store = MemoryStore() if mode is EngineMode.LEDGER else None
    conversations = MemoryConversationStore()
    system = CountingExternalSystem()
    tape = LedgerTape() if mode is EngineMode.LEDGER else None

    crash = CrashInjector(cp)
    first = scenario_engine(first_mode, pol, store=store if first_mode is mode else None,
                            conversations=conversations, system=system, crash=crash, tape=tape)
    result: TurnResult | None
    try:
        result = first.run(USER_TEXT)
    except SimulatedCrash:
        result = None
        if tape is not None and first_mode is EngineMode.LEDGER:
            tape.crashed()
    decisions = [d.decision.value for d in first.decisions]
    error: str | None = None
    resumed = scenario_engine(mode, pol, store=store, conversations=conversations,
                              system=system, crash=CrashInjector(None), tape=tape)
    status: str
    try:
        if result is None:
            result = resumed.resume()
        status = result.status.value
    except (p.InvalidInput, p.ProtocolError) as exc:
        status, error = "error", f"{type(exc).__name__}: {exc}"
    decisions += [d.decision.value for d in resumed.decisions]
    late = system.deliver_in_flight()
    tool_messages = [m for m in resumed.messages if m.get("role") == "tool"]
    final = tool_messages[-1] if tool_messages else None
    legacy_ids = {r.execution_id for r in system.requests if r.execution_id.startswith("legacy:")}
    return MatrixCell(
        engine=mode.value,
        session=kind.value,
        policy=pol.value,
        point=cp.name,
        crash_mode=first_mode.value,
        seed_row=seed_row_of(first_mode, cp),
        on_path=cp.reached_by(pol),
        crashed=crash.fired,
        status=status,
        error=error,
        decisions=tuple(decisions),
        effects=system.effects(),
        invocations=system.invocations(),
        legacy_effects=sum(system.effects(e) for e in legacy_ids),
        legacy_invocations=sum(system.invocations(e) for e in legacy_ids),
        tool_status=None if final is None else final.get("status"),
        tool_result=None if final is None else final.get("content"),
        late=tuple((r.number, r.execution_id, r.attempt, r.status.value) for r in late),
        tape=tape,
    )


def panels() -> list[tuple[str, str, str]]:
    """The three panels of the matrix: (engine, session kind, crash mode), left to right."""
    return [
        (EngineMode.LEGACY.value, SessionKind.NEW.value, EngineMode.LEGACY.value),
        (EngineMode.LEDGER.value, SessionKind.NEW.value, EngineMode.LEDGER.value),
        (EngineMode.LEDGER.value, SessionKind.LEGACY.value, EngineMode.LEGACY.value),
    ]


def run_matrix(policies: Sequence[str] = POLICIES) -> list[MatrixCell]:
    """Every cell: each panel's every crash point (see :func:`panels`) x ``policies``."""
    cells = []
    for engine, session, crash_mode in panels():
        for cp in crash_points(crash_mode):
            for pol in policies:
                cells.append(run_cell(engine, session, pol, cp))
    return cells


# --------------------------------------------------------------------------
# From a cell to a behaviour of the spec
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EmailCall(CallConfig):
    """The scenario's call as a model call: argument choice ``"a1"`` is :data:`ARGUMENTS`.

    The closed-world model names arguments (``"a1"``) and digests them as
    ``{"arg": "a1"}``; the engine kit's call has real arguments.  This call
    digests ``"a1"`` as the kit does, so the kit's state maps to the spec
    through :func:`toolledger.check.mapping.to_spec` unchanged.
    """

    def digest(self, arg: str) -> str:
        if arg != "a1":
            raise ValueError(f"the scenario has one argument choice, 'a1', not {arg!r}")
        return p.args_digest(self.tool.name, ARGUMENTS)


_MODELS: dict[tuple[str, int], ModelConfig] = {}


def email_model(policy: p.RecoveryPolicy | str, marker: int) -> ModelConfig:
    """The model of the scenario: call ``c1`` at (1, 0), ``call_0``, one crash, 3 attempts.

    One object per (policy, marker), so that traces of the same model share it.
    """
    pol = p.RecoveryPolicy(str(policy))
    key = (pol.value, marker)
    cfg = _MODELS.get(key)
    if cfg is None:
        call = EmailCall("c1", (1, 0), "call_0", p.ToolProfile(TOOL, pol, True), ("a1",))
        cfg = ModelConfig(calls=(call,), marker=marker, max_crashes=1, max_attempts=3,
                          session_id=SESSION_ID)
        _MODELS[key] = cfg
    return cfg


class SpecMismatch(AssertionError):
    """A recorded step of the engine kit is not a step of the closed-world model."""


@dataclass(frozen=True)
class SpecRun:
    """The ledger part of a cell as a run of the model, or why it has none.

    ``steps[0]`` is ``("Init", state)``.  ``note`` says why ``steps`` is empty
    (the cell never reached the ledger engine, or started where the spec's
    ``Init`` does not).
    """

    config: ModelConfig | None
    steps: tuple[tuple[str, SystemState], ...]
    note: str = ""

    @property
    def mapped(self) -> bool:
        return bool(self.steps)

    @property
    def final(self) -> SystemState:
        return self.steps[-1][1]


def _session_view(cfg: ModelConfig, session: p.SessionState) -> tuple[Value, ...]:
    spec = to_spec(cfg, SystemState(session, ExternalState(), Ghosts()))
    return tuple(spec[v] for v in _SPEC_SESSION_VARIABLES)


def _step(
    cfg: ModelConfig,
    state: SystemState,
    action: p.Action,
    expected: p.SessionState,
    accept: Callable[[SystemState], bool] = lambda _: True,
) -> SystemState:
    want = _session_view(cfg, expected)
    for a, nxt in model_successors(cfg, state):
        if a is action and accept(nxt) and _session_view(cfg, nxt.session) == want:
            return nxt
    raise SpecMismatch(
        f"{action.value}: no step of the model from the state before leads to the engine "
        "state the kit recorded"
    )


_EXTERNAL: Final = frozenset({p.Action.ExternalApply, p.Action.ExternalRejectDefinite})
_LATE_ACTION: Final[Mapping[str, p.Action]] = {
    RequestStatus.APPLIED.value: p.Action.ExternalApplyLoseAnswer,
    RequestStatus.DEDUPLICATED.value: p.Action.ExternalApplyLoseAnswer,
    RequestStatus.DROPPED_FENCED.value: p.Action.ExternalDropFenced,
}


def _takes(eid: str, attempt: int, before: SystemState) -> Callable[[SystemState], bool]:
    """The model step processed request ``attempt`` of ``eid`` (it left the in-flight set)."""

    def accept(nxt: SystemState) -> bool:
        return attempt in before.external.requests(eid) and attempt not in (
            nxt.external.requests(eid)
        )

    return accept


def spec_run(cell: MatrixCell) -> SpecRun:
    """Map the ledger engine's part of ``cell`` to a run of :func:`email_model`.

    See :func:`spec_run_of_tape`; the legacy engine's effects and the late
    requests are the cell's.
    """
    if cell.tape is None:
        return SpecRun(None, (), "no ledger engine ran")
    return spec_run_of_tape(cell.tape, cell.policy, legacy_effects=cell.legacy_effects,
                            late=cell.late)


def spec_run_of_tape(
    tape: LedgerTape,
    policy: p.RecoveryPolicy | str,
    *,
    legacy_effects: int = 0,
    late: Sequence[tuple[int, str, int, str]] = (),
) -> SpecRun:
    """Map a recorded run of the scenario's call to a run of :func:`email_model`.

    The initial state is the ledger the engine opened first (for a legacy
    session: the adopted one), with ``legacy_effects`` (what the legacy
    engine's requests did) as ``applied``: the spec's ``Init`` lets an
    approved legacy call have been applied 0 or 1 times.  Every recorded
    event, every crash and every ``late`` request (number, execution id,
    attempt, status, as :class:`MatrixCell` has them) must then be a step of
    the model whose engine state is exactly the recorded one;
    :class:`SpecMismatch` says which was not.  The model supplies the
    external system and the ghosts.
    """
    entries = tape.ledger_entries
    if not entries:
        return SpecRun(None, (), "no ledger engine ran")
    start = entries[0].after
    assert start is not None
    pol = p.RecoveryPolicy(str(policy))
    protected = pol is not p.RecoveryPolicy.READONLY
    cfg = email_model(pol, start.marker)
    eid = cfg.exec_ids["c1"]
    candidates = [
        s for s in model_initial_states(cfg)
        if _session_view(cfg, s.session) == _session_view(cfg, start)
    ]  # fmt: skip
    if not candidates:
        return SpecRun(cfg, (), "the ledger the engine opened is not an initial state of the "
                                "spec (its Init has approved, unanswered legacy calls only)")
    legacy = min(legacy_effects, 1) if protected else 0
    init = next((s for s in candidates if s.external.count(eid) == legacy), candidates[0])
    state = replace(init, session=start)
    run: list[tuple[str, SystemState]] = [("Init", state)]
    for n, entry in enumerate(entries):
        if entry.kind == "crash":
            reopened = entries[n + 1] if n + 1 < len(entries) else None
            if reopened is None or reopened.kind != "open" or reopened.after is None:
                raise SpecMismatch("a crash that no engine recovered from")
            loaded = reopened.after
            nxt = _step(cfg, state, p.Action.Crash, loaded)
            state = replace(nxt, session=loaded)
            run.append((p.Action.Crash.value, state))
            continue
        if entry.kind != "commit":
            continue
        assert entry.before is not None and entry.after is not None
        session = entry.before
        for i, ev in enumerate(entry.events):
            # the states between the events of one commit are the core's; the last one
            # is the ledger's own (it carries the result contents, which the spec drops)
            session = entry.after if i == len(entry.events) - 1 else p.apply(session, ev)
            accept = (
                _takes(eid, ev.attempt, state)
                if ev.action in _EXTERNAL and ev.attempt is not None
                else (lambda _: True)
            )
            nxt = _step(cfg, state, ev.action, session, accept)
            state = replace(nxt, session=session)
            run.append((ev.action.value, state))
    for _, execution_id, attempt, status in late:
        if execution_id != eid or not protected:
            # a legacy request: its effect is the spec's Init (applied 0 or 1); a readonly
            # request: the spec does not count readonly effects (replaying one is safe)
            continue
        action = _LATE_ACTION.get(status)
        if action is None:
            raise SpecMismatch(f"a late request ended {status!r}: not a step of the scenario")
        nxt = _step(cfg, state, action, state.session, _takes(eid, attempt, state))
        state = nxt
        run.append((action.value, state))
    return SpecRun(cfg, tuple(run))


def invariant_violations(run: SpecRun) -> dict[str, list[str]]:
    """The Python invariants broken in any state of ``run`` (empty: none)."""
    assert run.config is not None
    found: dict[str, list[str]] = {}
    for _, state in run.steps:
        for name, problems in check_all(run.config, state).items():
            if problems:
                found.setdefault(name, []).extend(problems)
    return found


# --------------------------------------------------------------------------
# The picture
# --------------------------------------------------------------------------


class CellCategory(StrEnum):
    """What a cell's colour says."""

    NOT_ON_PATH = "not on this policy's path"
    NO_EFFECT = "no effect"
    ONE_EFFECT = "effect applied once"
    DUPLICATE = "side effect applied twice"
    READONLY_REPLAY = "readonly replayed (allowed)"
    ERROR = "the resume raised"


CATEGORY_COLOURS: Final[Mapping[CellCategory, str]] = {
    CellCategory.NOT_ON_PATH: "#eeeeee",
    CellCategory.NO_EFFECT: "#cfe3f7",
    CellCategory.ONE_EFFECT: "#7fc97f",
    CellCategory.DUPLICATE: "#e34a33",
    CellCategory.READONLY_REPLAY: "#fdd49e",
    CellCategory.ERROR: "#6a3d9a",
}

DECISION_SHORT: Final[Mapping[str, str]] = {
    p.Decision.EXECUTE.value: "exec",
    p.Decision.RECONSTRUCT.value: "reconstr",
    p.Decision.RETRY_SAME_ID.value: "retry id",
    p.Decision.RECONCILE.value: "reconcile",
    p.Decision.RECOVERY_REQUIRED.value: "halt",
    p.Decision.SKIP.value: "skip",
}
"""How a recovery decision is written in a cell of the picture."""


def category(cell: MatrixCell) -> CellCategory:
    """The colour class of ``cell``."""
    if not cell.on_path:
        return CellCategory.NOT_ON_PATH
    if cell.status == "error":
        return CellCategory.ERROR
    if cell.effects == 0:
        return CellCategory.NO_EFFECT
    if cell.effects == 1:
        return CellCategory.ONE_EFFECT
    return CellCategory.DUPLICATE if cell.protected else CellCategory.READONLY_REPLAY


def _cell_text(cell: MatrixCell) -> str:
    if not cell.on_path:
        return "·"
    if cell.status == "error":
        return "error"
    decided = "+".join(DECISION_SHORT[d] for d in cell.decisions) or "—"
    return f"{decided}\n{cell.effects}\u00d7"


@dataclass(frozen=True)
class MatrixFigure:
    """What :func:`fault_matrix_figure` drew, for checks next to the picture."""

    panels: tuple[str, ...]
    rows: Mapping[str, tuple[str, ...]]  # panel title -> crash points, top to bottom
    counts: Mapping[str, Mapping[CellCategory, int]]  # panel title -> cells per colour
    seed_rows: Mapping[str, tuple[str, ...]]  # panel title -> crash points framed as seed rows
    texts: Mapping[tuple[str, str, str], str]  # (panel, point, policy) -> text in the cell


def _panel_title(engine: str, session: str) -> str:
    if engine == EngineMode.LEGACY.value:
        return "legacy engine\n(today's, issue #443)"
    if session == SessionKind.NEW.value:
        return "ledger engine,\nnew session"
    return "ledger engine resumes a session\nthe legacy engine started (adopted)"


def fault_matrix_figure(
    cells: Sequence[MatrixCell],
    *,
    policies: Sequence[str] = POLICIES,
    title: str | None = None,
) -> tuple[Figure, MatrixFigure]:
    """Draw the matrix: one panel per (engine, session kind), crash points x policies.

    A cell's colour is its :class:`CellCategory` (effects counted by the
    external system); its text is the recovery decisions taken and the
    effects.  Rows of the seed's fault-injection matrix are framed in black
    and labelled with their row number.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch, Rectangle

    order = list(CellCategory)
    cmap = ListedColormap([CATEGORY_COLOURS[c] for c in order])
    layout = [pan for pan in panels()
              if any((c.engine, c.session) == pan[:2] for c in cells)]
    heights = [len(crash_points(mode)) for _, _, mode in layout]
    # Panels stacked, one page wide (10 in): every text is then read at FONT_PT or more.
    row_in, panel_in, legend_in = 0.46, 0.75, 1.9
    total_in = row_in * sum(heights) + panel_in * len(layout) + legend_in + 0.4
    fig, axes = plt.subplots(len(layout), 1, figsize=(FIGURE_WIDTH_IN, total_in),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    seed_numbers = {name: i + 1 for i, name in enumerate(SEED_MATRIX)}
    titles: list[str] = []
    rows: dict[str, tuple[str, ...]] = {}
    counts: dict[str, Counter[CellCategory]] = {}
    framed: dict[str, tuple[str, ...]] = {}
    texts: dict[tuple[str, str, str], str] = {}
    for ax, (engine, session, mode) in zip(axes[:, 0], layout, strict=True):
        name = _panel_title(engine, session)
        titles.append(name)
        points = [cp.name for cp in crash_points(mode)]
        by_key = {(c.point, c.policy): c for c in cells
                  if c.engine == engine and c.session == session}
        grid = [[order.index(category(by_key[pt, pol])) for pol in policies] for pt in points]
        ax.imshow(grid, cmap=cmap, vmin=0, vmax=len(order) - 1, aspect="auto")
        counts[name] = Counter(category(by_key[pt, pol]) for pt in points for pol in policies)
        labels = []
        seeds = []
        for r, pt in enumerate(points):
            seed = seed_row_of(mode, pt)
            if seed is not None:
                seeds.append(pt)
                labels.append(f"[seed {seed_numbers[seed]}] {pt}")
                ax.add_patch(Rectangle((-0.5, r - 0.5), len(policies), 1, fill=False,
                                       ec="black", lw=2.2))
            else:
                labels.append(pt)
            for k, pol in enumerate(policies):
                text = _cell_text(by_key[pt, pol])
                texts[name, pt, pol] = text
                dark = category(by_key[pt, pol]) in (CellCategory.DUPLICATE, CellCategory.ERROR)
                ax.text(k, r, text, ha="center", va="center", fontsize=FONT_PT,
                        color="white" if dark else "#222")
        rows[name] = tuple(points)
        framed[name] = tuple(seeds)
        ax.set_yticks(range(len(points)), labels, fontsize=FONT_PT)
        ax.set_xticks(range(len(policies)), list(policies), fontsize=FONT_PT)
        ax.xaxis.tick_top()
        ax.set_title(" ".join(name.split()), fontsize=TITLE_PT, pad=24, loc="left")
        ax.tick_params(length=0)
    handles = [Patch(facecolor=CATEGORY_COLOURS[c], edgecolor="#999", label=c.value)
               for c in order]
    handles.append(Patch(facecolor="white", edgecolor="black", lw=2,
                         label="row of the seed's matrix"))
    taken = {d for c in cells for d in c.decisions}
    legend_decisions = ", ".join(f"{v} = {k}" for k, v in DECISION_SHORT.items() if k in taken)
    fig.legend(handles=handles, loc="lower left", ncol=2, fontsize=FONT_PT, frameon=False,
               title="cell: the recovery decisions taken (— none was needed), then the effects "
                     f"applied\n{legend_decisions}",
               title_fontsize=FONT_PT, alignment="left")
    top = 1.0
    if title:
        fig.suptitle(textwrap.fill(title, 80), fontsize=TITLE_PT, x=0.01, ha="left")
        top = 1.0 - (0.2 + 0.25 * (1 + len(title) // 80)) / total_in
    fig.tight_layout(rect=(0, legend_in / total_in, 1, top))
    return fig, MatrixFigure(
        panels=tuple(titles),
        rows=rows,
        counts={k: dict(v) for k, v in counts.items()},
        seed_rows=framed,
        texts=texts,
    )


# --------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------

# 14 px (10.5 pt), the size of the notebook's own text: tables are read, not glanced at.
_TABLE: Final = "border-collapse:collapse;font-size:14px;margin:4px 0 12px 0"
_TD: Final = "border:1px solid #ccc;padding:2px 6px;vertical-align:top;text-align:left"
_HIGHLIGHT: Final = "background:#fff3bf"


def html_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    highlight: Iterable[int] = (),
    caption: str | None = None,
) -> str:
    """A plain HTML table (cells escaped; rows whose index is in ``highlight`` shaded)."""
    marked = set(highlight)
    out = [f'<table style="{_TABLE}">']
    if caption:
        out.append(f'<caption style="text-align:left;font-weight:bold">{html.escape(caption)}'
                   "</caption>")
    out.append("<tr>" + "".join(f'<th style="{_TD}">{html.escape(h)}</th>' for h in headers)
               + "</tr>")
    for i, row in enumerate(rows):
        style = _TD + (";" + _HIGHLIGHT if i in marked else "")
        cells = "".join(
            f'<td style="{style}">{html.escape(str(v)).replace(chr(10), "<br>")}</td>'
            for v in row
        )
        out.append(f"<tr>{cells}</tr>")
    out.append("</table>")
    return "\n".join(out)


def _table_cell(cell: MatrixCell) -> str:
    if not cell.on_path:
        return "(not on this path)"
    if cell.status == "error":
        return f"ERROR\n{cell.error}"
    decided = ", ".join(cell.decisions) or "(none)"
    return (f"{decided}\neffects {cell.effects}, invocations {cell.invocations}\n"
            f"turn {cell.status}, result {cell.tool_status or '(none)'}")


def matrix_table_html(
    cells: Sequence[MatrixCell],
    engine: str,
    session: str,
    *,
    policies: Sequence[str] = POLICIES,
) -> str:
    """One panel of the matrix as a table: crash point, what is durable there, one column per
    policy (decisions; effects and invocations; turn status and tool result).  Seed rows are
    shaded and named."""
    chosen = [c for c in cells if c.engine == engine and c.session == session]
    if not chosen:
        raise ValueError(f"no cells for the {engine} engine on a {session} session")
    mode = chosen[0].crash_mode
    by_key = {(c.point, c.policy): c for c in chosen}
    seed_numbers = {name: i + 1 for i, name in enumerate(SEED_MATRIX)}
    rows = []
    marked = []
    for i, cp in enumerate(crash_points(mode)):
        seed = seed_row_of(mode, cp)
        where = cp.name if seed is None else (
            f"{cp.name}\n[seed row {seed_numbers[seed]}: {SEED_MATRIX[seed].crash_point}]")
        if seed is not None:
            marked.append(i)
        rows.append([where, cp.durable, *(_table_cell(by_key[cp.name, pol]) for pol in policies)])
    caption = " ".join(_panel_title(engine, session).split())
    return html_table(["crash point", "durable at that moment", *policies], rows,
                      highlight=marked, caption=caption)
