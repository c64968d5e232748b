"""Trace validation of engine-kit runs: what a real engine did, replayed in the spec's world.

What it is for
--------------
:mod:`toolledger.check.tracecheck` asks TLC whether runs of the closed-world model
(:mod:`toolledger.check.system`) are behaviours of ``DurableToolExecution``.  This
module brings runs of the *engine kit* (:mod:`toolledger.kit.engine`, e.g. a
``toolledger simulate`` run) to the same check:

1. :class:`KitRecorder` records, while it is active, every batch of
   :class:`~toolledger._core.protocol.Event` values a :class:`~toolledger._core.ledger.Ledger`
   applies (``step``, ``step_many`` and a human's ``resolve`` all go through
   ``Ledger._advance``, the one place that commits), with the ledger's state
   after the batch, and every process start (a new ``Ledger`` on a session:
   the previous process is gone, which the spec calls ``Crash``).
2. :func:`kit_config` builds the :class:`~toolledger.check.system.ModelConfig` of
   the recorded calls: their positions, ``tool_call_id``\\ s, tool profiles and
   the REAL argument digests (:class:`KitCallConfig` maps each spec argument
   name to the digest the engine computed from the model's JSON arguments).
3. :func:`replay` follows the recording in the closed world: at each event it
   takes the successor in ``successors(cfg, state)`` with that action, that
   call position and (for the external system's answers) that attempt.  What
   the engine cannot log, the environment's own steps (an answer applied and
   lost, a late request of a fenced attempt dropped, a late original landing),
   is inferred by a bounded search: when the logged event is not enabled, at
   most :data:`MAX_INSERTED` environment actions are inserted before it.  At
   the end, requests the model still has in flight are settled the way the
   real external system settled them (applied, deduplicated or dropped).
   The replay checks itself: after every batch, the model's engine state must
   be the ledger's (result texts aside), and at the end the model's effects
   and in-flight requests must be the real external system's.  A mismatch is
   a :class:`ReplayError`, never a silently different trace.
4. :func:`~toolledger.check.tracecheck.trace_of` and
   :func:`~toolledger.check.tracecheck.validate_traces` then let TLC check the run.

What it must never do: invent an engine step (only environment actions are
inferred), change the engine's behaviour while recording (the wrappers call
the originals and only append to a list), or leave ``Ledger`` patched after
the ``with`` block.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from .._core import protocol as p
from .._core.ledger import APPROVAL_KINDS, Ledger
from .._core.stores import working_set
from ..kit.external import CountingExternalSystem, RequestStatus
from .system import CallConfig, ModelConfig, SystemState, initial_states, successors

__all__ = [
    "ENVIRONMENT_ACTIONS",
    "MAX_INSERTED",
    "KitCallConfig",
    "KitRecorder",
    "Logged",
    "ReplayError",
    "kit_config",
    "replay",
]

MAX_INSERTED: Final = 2
"""At most this many environment actions are inferred before one logged event."""

ENVIRONMENT_ACTIONS: Final[tuple[p.Action, ...]] = (
    p.Action.ExternalApplyLoseAnswer,
    p.Action.ExternalDropFenced,
    p.Action.ExternalApply,
)
"""The actions the search may insert, in the order it tries them.  A late or
lost answer applies without reaching the engine (``ExternalApplyLoseAnswer``;
``ExternalApply`` when nobody waits leads to the same state), a fenced late
request is dropped.  ``ExternalRejectDefinite`` is never inferred: the kit's
external system rejects only synchronously, and the engine logs that."""

_EXTERNAL: Final = frozenset(
    {
        p.Action.ExternalApply,
        p.Action.ExternalApplyLoseAnswer,
        p.Action.ExternalRejectDefinite,
        p.Action.ExternalDropFenced,
    }
)


class ReplayError(Exception):
    """The recording cannot be followed in the closed world, or disagrees with it."""


# --------------------------------------------------------------------------
# The model configuration of a kit run
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KitCallConfig(CallConfig):
    """A call position whose spec arguments stand for the engine's real digests.

    ``digests`` maps each name of ``arg_choices`` to the ``args_digest`` the
    engine computed from the model's JSON arguments, so that
    :attr:`ModelConfig.arg_of_digest` and :mod:`toolledger.check.mapping` translate
    the engine's states to spec values.
    """

    digests: tuple[tuple[str, str], ...] = ()

    def digest(self, arg: str) -> str:
        for name, digest in self.digests:
            if name == arg:
                return digest
        raise KeyError(f"{self.name}: no argument {arg!r}; known: {self.arg_choices}")


@dataclass(frozen=True)
class Logged:
    """One recorded entry: a process start (``events == ()``) or one committed batch."""

    session_id: str
    events: tuple[p.Event, ...]
    state: p.SessionState  # the whole session after the batch (or as loaded at the start)
    working: p.SessionState  # what the ledger kept in memory: its working set

    @property
    def start(self) -> bool:
        return not self.events


@dataclass
class KitRecorder:
    """Records what every :class:`~toolledger._core.ledger.Ledger` does while active.

    Use as a context manager; ``entries`` are in the order they happened,
    across sessions (:meth:`of` selects one).
    """

    entries: list[Logged] = field(default_factory=list)
    _saved: dict[str, Any] = field(default_factory=dict, repr=False)

    def of(self, session_id: str) -> list[Logged]:
        return [e for e in self.entries if e.session_id == session_id]

    def __enter__(self) -> KitRecorder:
        if self._saved:
            raise RuntimeError("this KitRecorder is already recording")
        init, advance, crash = Ledger.__init__, Ledger._advance, Ledger.crash
        new = Ledger.__dict__["new"]  # the classmethod object itself, restored as such
        self._saved = {"__init__": init, "_advance": advance, "crash": crash, "new": new}
        entries = self.entries

        def recording_new(cls: type[Ledger], store: Any, session_id: str, /,
                          **kwargs: Any) -> Ledger:
            # a session its first commit creates: it starts from the initial state,
            # exactly as one created by create_session() and then loaded
            ledger: Ledger = new.__func__(cls, store, session_id, **kwargs)
            entries.append(Logged(session_id, (), ledger.full_state(), ledger.state))
            return ledger

        def recording_init(
            ledger: Ledger, store: Any, session_id: str, **kwargs: Any
        ) -> None:
            init(ledger, store, session_id, **kwargs)
            entries.append(Logged(session_id, (), ledger.full_state(), ledger.state))

        def recording_advance(
            ledger: Ledger, events: list[p.Event], *args: Any, **kwargs: Any
        ) -> p.SessionState:
            batch = tuple(events)  # the caller's list, as given
            after = advance(ledger, events, *args, **kwargs)
            entries.append(Logged(ledger.session_id, batch, ledger.full_state(), after))
            return after

        def recording_crash(ledger: Ledger) -> p.SessionState:
            after = crash(ledger)
            entries.append(Logged(ledger.session_id, (), ledger.full_state(), after))
            return after

        Ledger.__init__ = recording_init  # type: ignore[method-assign,assignment]
        Ledger._advance = recording_advance  # type: ignore[method-assign,assignment]
        Ledger.crash = recording_crash  # type: ignore[method-assign,assignment]
        Ledger.new = classmethod(recording_new)  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        for name, original in self._saved.items():
            setattr(Ledger, name, original)
        self._saved = {}


def _emitted(entries: Sequence[Logged]) -> Iterator[p.Event]:
    for entry in entries:
        for ev in entry.events:
            if ev.action is p.Action.ProviderEmitCall:
                yield ev


def kit_config(
    recordings: Sequence[Sequence[Logged]],
    *,
    max_crashes: int | None = None,
    max_attempts: int | None = None,
) -> ModelConfig:
    """The model configuration of one or more recordings of the same session's calls.

    Every call emitted in any recording becomes a call of the model (named
    ``c1``, ``c2``, ... in position order) with the tool profile and the
    ``tool_call_id`` the engine used; each distinct argument digest seen at a
    position becomes one argument choice (``a1``, ``a1_2``, ...).
    ``max_crashes`` defaults to the most process restarts in one recording,
    ``max_attempts`` to the session's.  Raises :class:`ReplayError` if the
    recordings disagree (another session, another tool at a position) or
    start from a session with legacy calls (not supported here).
    """
    entries = [e for rec in recordings for e in rec]
    if not entries:
        raise ReplayError("nothing was recorded: did the engine run under the KitRecorder?")
    sessions = {e.session_id for e in entries}
    if len(sessions) != 1:
        raise ReplayError(f"recordings of several sessions {sorted(sessions)}: one at a time")
    first = entries[0].state
    if first.marker != 0 or first.calls:
        raise ReplayError(
            f"session {first.session_id!r} starts with calls or protocol marker "
            f"{first.marker}: only sessions created by the ledger engine are replayed"
        )
    calls: dict[p.CallPosition, tuple[str, p.ToolProfile, list[str]]] = {}
    for ev in _emitted(entries):
        assert ev.position is not None and ev.tool is not None and ev.tool_call_id is not None
        assert ev.args_digest is not None
        known = calls.setdefault(ev.position, (ev.tool_call_id, ev.tool, []))
        if known[:2] != (ev.tool_call_id, ev.tool):
            raise ReplayError(
                f"position {ev.position}: {known[:2]} in one recording, "
                f"{(ev.tool_call_id, ev.tool)} in another"
            )
        if ev.args_digest not in known[2]:
            known[2].append(ev.args_digest)
    configs = []
    for i, pos in enumerate(sorted(calls), start=1):
        call_id, tool, digests = calls[pos]
        names = [f"a{i}" if k == 0 else f"a{i}_{k + 1}" for k in range(len(digests))]
        configs.append(
            KitCallConfig(
                f"c{i}", pos, call_id, tool, tuple(names),
                digests=tuple(zip(names, digests, strict=True)),
            )
        )
    crashes = max(
        (max(0, sum(1 for e in rec if e.start) - 1) for rec in recordings), default=0
    )
    return ModelConfig(
        calls=tuple(configs),
        marker=0,
        max_crashes=crashes if max_crashes is None else max_crashes,
        max_attempts=first.max_attempts if max_attempts is None else max_attempts,
        session_id=first.session_id,
    )


# --------------------------------------------------------------------------
# Replay
# --------------------------------------------------------------------------


def _no_contents(state: p.SessionState) -> p.SessionState:
    """``state`` without result texts and dispatch times (the closed world has
    neither: its time is abstract), nor the facade's approval rows (who approved,
    an approval's expiry: no spec action writes them)."""

    def bare(r: p.ToolResult | None) -> p.ToolResult | None:
        return None if r is None else replace(r, content="")

    return replace(
        state,
        calls=tuple(replace(c, result=bare(c.result)) for c in state.calls),
        ledger={
            e: replace(r, result=bare(r.result), dispatched_at=None)
            for e, r in state.ledger.items()
        },
        audit=frozenset(k for k in state.audit if k[1] not in APPROVAL_KINDS),
    )


def _same_working_set(i: int, s: SystemState, entry: Logged) -> None:
    """The ledger kept exactly the working set of the model's session in memory."""
    expected = _no_contents(working_set(s.session))
    if expected != _no_contents(entry.working):
        raise ReplayError(
            f"entry {i}: the ledger kept {entry.working} in memory, the working set of the "
            f"model's session is {expected}"
        )


def _call_of(state: p.SessionState, ev: p.Event) -> p.CallState | None:
    return None if ev.position is None else state.call(ev.position)


def _takes(cfg: ModelConfig, s: SystemState, ev: p.Event) -> SystemState | None:
    """The successor of ``s`` that is the logged event ``ev``, if it is enabled."""
    try:
        want = p.apply(s.session, ev)
    except p.ProtocolError:
        return None
    call = _call_of(s.session, ev)
    for action, nxt in successors(cfg, s):
        if action is not ev.action or nxt.session != want:
            continue
        if action in _EXTERNAL:
            if call is None or ev.attempt is None:
                continue
            e = call.execution_id
            if ev.attempt not in s.external.requests(e) or nxt.external.requests(e) != (
                s.external.requests(e) - {ev.attempt}
            ):
                continue
        return nxt
    return None


def _environment(cfg: ModelConfig, s: SystemState) -> list[tuple[p.Action, SystemState]]:
    options = [(a, n) for a, n in successors(cfg, s) if a in ENVIRONMENT_ACTIONS]
    return sorted(options, key=lambda o: ENVIRONMENT_ACTIONS.index(o[0]))


def _follow(
    cfg: ModelConfig, s: SystemState, ev: p.Event
) -> list[tuple[str, SystemState]] | None:
    """Steps that reach the logged event ``ev`` from ``s``: ``ev`` itself, or at most
    :data:`MAX_INSERTED` environment actions and then ``ev``."""
    frontier: list[tuple[list[tuple[str, SystemState]], SystemState]] = [([], s)]
    for _ in range(MAX_INSERTED + 1):
        deeper: list[tuple[list[tuple[str, SystemState]], SystemState]] = []
        for path, state in frontier:
            nxt = _takes(cfg, state, ev)
            if nxt is not None:
                return [*path, (ev.action.value, nxt)]
            deeper.extend(
                ([*path, (a.value, n)], n) for a, n in _environment(cfg, state)
            )
        frontier = deeper
    return None


# How the real system settled a request the model still has in flight.
_LATE: Final[Mapping[RequestStatus, p.Action]] = {
    RequestStatus.APPLIED: p.Action.ExternalApplyLoseAnswer,
    RequestStatus.DEDUPLICATED: p.Action.ExternalApplyLoseAnswer,
    RequestStatus.DROPPED_FENCED: p.Action.ExternalDropFenced,
}


def _settle_external(
    cfg: ModelConfig, s: SystemState, world: CountingExternalSystem
) -> list[tuple[str, SystemState]]:
    """Land the model's in-flight requests the way the real system handled them."""
    steps: list[tuple[str, SystemState]] = []
    real = {(r.execution_id, r.attempt): r.status for r in world.requests}
    for e in sorted(set(cfg.exec_ids.values())):
        for n in sorted(s.external.requests(e)):
            status = real.get((e, n))
            if status is RequestStatus.IN_FLIGHT:
                continue
            action = _LATE.get(status) if status is not None else None
            nxt = None if action is None else next(
                (
                    st
                    for a, st in successors(cfg, s)
                    if a is action and st.external.requests(e) == s.external.requests(e) - {n}
                ),
                None,
            )
            if action is None or nxt is None:
                raise ReplayError(
                    f"request {n} of {e} is in flight in the model; the real system says "
                    f"{status}, which the spec cannot follow from here"
                )
            steps.append((action.value, nxt))
            s = nxt
    return steps


def replay(
    cfg: ModelConfig,
    recording: Sequence[Logged],
    world: CountingExternalSystem | None = None,
) -> list[tuple[str, SystemState]]:
    """The closed-world run of one recording: ``[("Init", s0), (action, s1), ...]``.

    With ``world`` (the real external system, e.g. a fresh
    :class:`~toolledger.kit.external.CountingExternalSystem` on its log), requests
    still in flight in the model are settled as the real system settled them,
    and the model's effects and in-flight requests must then be the real
    system's.  Raises :class:`ReplayError` when a logged event cannot be
    followed, or the model and the kit disagree.
    """
    inits = initial_states(cfg)
    if len(inits) != 1:
        raise ReplayError(f"{len(inits)} initial states: legacy calls are not replayed here")
    s = inits[0]
    run: list[tuple[str, SystemState]] = [("Init", s)]
    started = False
    for i, entry in enumerate(recording):
        if entry.session_id != cfg.session_id:
            continue
        if entry.start:
            if started:  # a new process: the previous one is gone, the spec's Crash
                crashed = next((n for a, n in successors(cfg, s) if a is p.Action.Crash), None)
                if crashed is None:
                    raise ReplayError(
                        f"entry {i}: a restart, but the model allows no more crashes"
                    )
                s = crashed
                run.append((p.Action.Crash.value, s))
            started = True
            _same_working_set(i, s, entry)
            if _no_contents(s.session) != _no_contents(entry.state):
                raise ReplayError(f"entry {i}: the new process loaded {entry.state}, "
                                  f"the model has {s.session}")
            continue
        for ev in entry.events:
            steps = _follow(cfg, s, ev)
            if steps is None:
                raise ReplayError(
                    f"entry {i}: {ev.action.value} {ev.position} (attempt {ev.attempt}) is not "
                    f"enabled, not even after {MAX_INSERTED} environment actions"
                )
            run.extend(steps)
            s = steps[-1][1]
        _same_working_set(i, s, entry)
        if _no_contents(s.session) != _no_contents(entry.state):
            raise ReplayError(
                f"entry {i} ({', '.join(ev.action.value for ev in entry.events)}): the model's "
                f"engine state {s.session} is not the ledger's {entry.state}"
            )
    if world is not None:
        run.extend(_settle_external(cfg, s, world))
        s = run[-1][1]
        _same_world(cfg, s, world)
    return run


def _same_world(cfg: ModelConfig, s: SystemState, world: CountingExternalSystem) -> None:
    protected = {cfg.exec_ids[c.name] for c in cfg.calls if c.tool.protected}
    for e in sorted(protected):
        model = (s.external.count(e), s.external.requests(e))
        real = (
            world.effects(e),
            frozenset(r.attempt for r in world.in_flight() if r.execution_id == e),
        )
        if model != real:
            raise ReplayError(
                f"execution {e}: the model has (effects, in flight) {model}, "
                f"the real external system {real}"
            )

