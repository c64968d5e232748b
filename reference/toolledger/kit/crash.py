"""The demo engine's steps and crash points, and the crash injector.

The steps of one approved call in each :class:`EngineMode` (:data:`LEDGER_STEPS`,
:data:`LEGACY_STEPS`), every point between them where a process can die
(:func:`crash_points`, :func:`parse_crash_point`), the seed issue's
fault-injection matrix (:data:`SEED_MATRIX`) and :class:`CrashInjector`, which
raises :class:`SimulatedCrash` at the point or SIGKILLs the process.  Used by
:mod:`toolledger.kit.engine` (which re-exports every name here).
"""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Literal

from .._core.protocol import (
    Action,
    Event,
    InvalidInput,
    RecoveryPolicy,
)

__all__ = [
    "LEDGER_STEPS",
    "LEGACY_STEPS",
    "SEED_MATRIX",
    "CrashInjector",
    "CrashPoint",
    "EngineMode",
    "EngineStep",
    "Moment",
    "SeedRow",
    "SimulatedCrash",
    "crash_points",
    "parse_crash_point",
]


class EngineMode(StrEnum):
    LEGACY = "legacy"
    LEDGER = "ledger"


def _mode(value: object) -> EngineMode:
    try:
        return EngineMode(str(value))
    except ValueError:
        valid = ", ".join(m.value for m in EngineMode)
        raise InvalidInput(f"unknown engine mode {value!r}; use one of: {valid}") from None


# --------------------------------------------------------------------------
# The steps of one approved call, and the crash points between them
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EngineStep:
    """One step the engine performs on the path of an approved call.

    ``name`` is the spec's action name (``EngineCheckpointCall`` and
    ``EngineCheckpoint`` are the engine's own conversation checkpoints);
    ``paths`` says on which paths it lies (``protected``: manual, idempotent,
    reconcile; ``readonly``; ``legacy``); ``durable_after`` is what is durable
    once it is done, i.e. what a crash right after it leaves behind.
    """

    name: str
    paths: frozenset[str]
    durable_after: str


def _step(name: str, paths: str, durable_after: str) -> EngineStep:
    return EngineStep(name, frozenset(paths.split()), durable_after)


LEDGER_STEPS: Final[tuple[EngineStep, ...]] = (
    _step("ProviderEmitCall", "protected readonly",
          "the user message; the assistant message is in memory only"),
    _step("EngineCheckpointCall", "protected readonly",
          "the assistant message is in the conversation; the ledger does not know the call"),
    _step("EnginePersistCall", "protected readonly",
          "the call is durable in the ledger (with its arguments) and its approval is parked: "
          "Session.record writes both in ONE commit"),
    _step("EngineParkApproval", "protected readonly",
          "the approval is pending (the same commit as EnginePersistCall: a crash after "
          "either is the same point)"),
    _step("HumanApprove", "protected readonly", "the approval is approved; no ledger record"),
    _step("EnginePersistDispatched", "protected",
          "dispatched(attempt 1) + its audit row; the adapter is not invoked yet"),
    _step("EngineInvokeAdapter", "protected",
          "dispatched(1); the request is out at the external system, not processed"),
    _step("EngineInvokeReadonly", "readonly",
          "approved, no record (readonly bypasses the ledger); the request is out"),
    _step("ExternalApply", "protected readonly",
          "the effect is applied and its answer is in the engine's memory only"),
    _step("EngineRecordSucceeded", "protected",
          "succeeded(result) and the tool result, ONE commit with EngineAppendResult; "
          "the conversation file lacks the role=tool message"),
    _step("EngineAppendResult", "protected readonly",
          "the tool result is in the ledger (protected: same commit as "
          "EngineRecordSucceeded); the conversation file lacks it"),
    _step("EngineCheckpoint", "protected readonly",
          "the role=tool message is in the conversation file too: the call is complete"),
)
"""The ledger engine's steps for one approved call, in order."""

LEGACY_STEPS: Final[tuple[EngineStep, ...]] = (
    _step("ProviderEmitCall", "legacy", "the user message; the assistant message is in memory"),
    _step("EngineParkApproval", "legacy",
          "the inbox item is pending; the session (with the call) is saved"),
    _step("HumanApprove", "legacy", "the inbox item is resolved 'allow'"),
    _step("EngineInvokeAdapter", "legacy",
          "registry.execute(...) sent the request; nothing about it is durable"),
    _step("ExternalApply", "legacy", "the effect is applied; the answer is in memory only"),
    _step("EngineAppendResult", "legacy",
          "_record_result appended the role=tool message in memory only"),
    _step("EngineCheckpoint", "legacy", "iteration_end: the role=tool message is saved"),
)
"""The legacy engine's steps for one approved call, in order (``LegacyResume.tla``)."""


class Moment(StrEnum):
    """The engine's own moments that are crash points: what it does outside the ledger.

    The engine names its moments in its own words; the value is the crash
    point (a spec step's name) the moment is.  The points after the ledger's
    steps are not here: the session reports its commits and
    :meth:`CrashInjector.stepped` finds the points they pass.
    """

    MODEL_CALLED = "before ProviderEmitCall"  # the provider is about to answer
    MODEL_ANSWERED = "after ProviderEmitCall"  # its message is in memory only
    CALLS_SAVED = "after EngineCheckpointCall"  # the assistant message is checkpointed
    INBOX_PARKED = "after EngineParkApproval"  # legacy: the inbox item is saved
    INBOX_RESOLVED = "after HumanApprove"  # legacy: the inbox item is resolved
    REQUEST_OUT = "after EngineInvokeAdapter"  # the request left (fired by the transport)
    READONLY_REQUEST_OUT = "after EngineInvokeReadonly"
    ANSWERED = "after ExternalApply"  # the answer is in memory only
    RESULT_IN_MEMORY = "after EngineAppendResult"  # legacy: the tool message in memory
    RESULT_SAVED = "after EngineCheckpoint"  # the tool message is checkpointed


# The ledger steps a Session commit may contain whose "after" is a crash point.
# ProviderEmitCall is left out (its point is the model's answer, before the
# conversation is saved: Moment.MODEL_ANSWERED) and so are the invoke steps (the
# request leaves inside the adapter: Moment.REQUEST_OUT, fired by the transport).
_AFTER_COMMIT: Final = frozenset({
    Action.EnginePersistCall, Action.EngineParkApproval, Action.HumanApprove,
    Action.EnginePersistDispatched, Action.ExternalApply, Action.EngineRecordSucceeded,
    Action.EngineAppendResult,
})


def _steps(mode: EngineMode) -> tuple[EngineStep, ...]:
    return LEDGER_STEPS if mode is EngineMode.LEDGER else LEGACY_STEPS


@dataclass(frozen=True, slots=True)
class CrashPoint:
    """A point between two steps where the process may die.

    ``name`` is ``"after S"`` (or ``"before ProviderEmitCall"``); ``aliases``
    are its other names (``"before T"`` for the step T that follows S on some
    path).  ``paths`` are the paths that pass through it: a run on another
    path never reaches it.
    """

    mode: EngineMode
    name: str
    step: str | None  # None: before the first step
    aliases: tuple[str, ...]
    paths: frozenset[str]
    durable: str

    def __str__(self) -> str:
        return self.name

    def reached_by(self, policy: RecoveryPolicy | str) -> bool:
        """Whether a run of one call with ``policy`` passes through this point."""
        if self.mode is EngineMode.LEGACY:
            return True
        path = "readonly" if str(policy) == RecoveryPolicy.READONLY.value else "protected"
        return path in self.paths


def _build_points(mode: EngineMode) -> tuple[CrashPoint, ...]:
    steps = _steps(mode)
    all_paths = frozenset().union(*(s.paths for s in steps))
    before: dict[str, list[str]] = {}
    for path in sorted(all_paths):
        on_path = [s.name for s in steps if path in s.paths]
        for prev, nxt in itertools.pairwise(on_path):
            before.setdefault(prev, [])
            if f"before {nxt}" not in before[prev]:
                before[prev].append(f"before {nxt}")
    # an alias must name one point only
    counts: dict[str, int] = {}
    for names in before.values():
        for n in names:
            counts[n] = counts.get(n, 0) + 1
    points = [
        CrashPoint(
            mode,
            f"before {steps[0].name}",
            None,
            (),
            all_paths,
            "the user message only (the provider has not answered)",
        )
    ]
    for s in steps:
        aliases = tuple(n for n in before.get(s.name, []) if counts[n] == 1)
        points.append(
            CrashPoint(mode, f"after {s.name}", s.name, aliases, s.paths, s.durable_after)
        )
    return tuple(points)


_POINTS: Final[Mapping[EngineMode, tuple[CrashPoint, ...]]] = {
    m: _build_points(m) for m in EngineMode
}


def crash_points(mode: EngineMode | str) -> tuple[CrashPoint, ...]:
    """Every crash point of ``mode``, in the order the engine passes them."""
    return _POINTS[_mode(mode)]


def _canon(text: str) -> str:
    return " ".join(text.replace("-", " ").replace(":", " ").replace("_", " ").split()).casefold()


def parse_crash_point(mode: EngineMode | str, text: str | CrashPoint) -> CrashPoint:
    """The crash point of ``mode`` named ``text`` (a name or an alias; any case,
    ``-``/``:``/``_`` for the space).  :class:`InvalidInput` lists the valid names."""
    m = _mode(mode)
    if isinstance(text, CrashPoint):
        if text.mode is not m:
            raise InvalidInput(f"crash point {text} is a {text.mode} point, not a {m} one")
        return text
    wanted = _canon(str(text))
    for p in _POINTS[m]:
        if wanted in {_canon(n) for n in (p.name, *p.aliases)}:
            return p
    valid = "; ".join(
        p.name + (f" (= {', '.join(p.aliases)})" if p.aliases else "") for p in _POINTS[m]
    )
    raise InvalidInput(f"unknown crash point {text!r} for the {m} engine; valid points: {valid}")


@dataclass(frozen=True, slots=True)
class SeedRow:
    """One row of the seed issue's fault-injection matrix, as crash points."""

    name: str
    crash_point: str  # the seed's words
    durable_state: str  # the seed's words
    expected: str  # the seed's words
    ledger: CrashPoint
    legacy: CrashPoint

    def point(self, mode: EngineMode | str) -> CrashPoint:
        return self.ledger if _mode(mode) is EngineMode.LEDGER else self.legacy


def _seed(
    name: str, words: str, durable: str, expected: str, ledger: str, legacy: str
) -> tuple[str, SeedRow]:
    return name, SeedRow(
        name,
        words,
        durable,
        expected,
        parse_crash_point(EngineMode.LEDGER, ledger),
        parse_crash_point(EngineMode.LEGACY, legacy),
    )


SEED_MATRIX: Final[Mapping[str, SeedRow]] = dict(
    (
        _seed("before_dispatch_record", "Before the dispatch record", "No record",
              "Execute once only when the session is known to use the new protocol; "
              "otherwise require recovery review",
              "before EnginePersistDispatched", "before EngineInvokeAdapter"),
        _seed("after_dispatched_call_out",
              "After dispatched, before/while the external call returns", "dispatched",
              "Do not silently replay; apply the declared recovery policy",
              "after EngineInvokeAdapter", "after EngineInvokeAdapter"),
        _seed("after_external_success", "After external success, before succeeded is stored",
              "dispatched", "Same unknown-outcome policy; no blind retry",
              "after ExternalApply", "after ExternalApply"),
        _seed("after_succeeded_before_tool_message",
              'After succeeded, before role="tool"/iteration_end', "succeeded",
              "Reconstruct the result; do not call the external system",
              "after EngineRecordSucceeded", "after EngineAppendResult"),
        _seed("after_tool_result_checkpoint", "After the normal tool result checkpoint",
              "Completed", "Preserve the current no-replay behavior",
              "after EngineCheckpoint", "after EngineCheckpoint"),
    )
)
"""The seed's five fault-injection rows (issue #443), row name -> crash point per mode.

In the legacy engine there is no dispatch record and no ``succeeded``: row 1
is the same moment (approved, nothing sent), row 4 the moment the result
exists in memory only."""


class SimulatedCrash(BaseException):
    """The process "dies" here (raised by :class:`CrashInjector`).

    A ``BaseException`` on purpose: the engine treats an adapter's
    ``Exception`` as an unknown outcome, and a crash must not be handled by
    anything; drop the engine and build a new one from durable storage.
    """

    def __init__(self, point: CrashPoint) -> None:
        self.point = point
        super().__init__(f"simulated crash at {point.name!r} ({point.mode} engine)")


class CrashInjector:
    """Kills the run once, at one crash point: raises or SIGKILLs itself.

    ``how="raise"`` raises :class:`SimulatedCrash`; ``how="sigkill"`` sends
    SIGKILL to the current process (a real crash: no ``finally``, no flush).
    It fires the first time the point is reached, then disarms.
    """

    def __init__(
        self, point: CrashPoint | None, *, how: Literal["raise", "sigkill"] = "raise"
    ) -> None:
        if how not in ("raise", "sigkill"):
            raise InvalidInput(f"how must be 'raise' or 'sigkill', got {how!r}")
        self.point = point
        self.how = how
        self.fired = False
        self._sending: tuple[EngineMode, str] | None = None

    @property
    def armed(self) -> bool:
        return self.point is not None and not self.fired

    def reached(self, mode: EngineMode, name: str) -> None:
        """The engine of ``mode`` is at crash point ``name`` (``"after S"``)."""
        p = self.point
        if p is None or self.fired or p.mode is not mode or p.name != name:
            return
        self.fired = True
        if self.how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise SimulatedCrash(p)

    def at(self, mode: EngineMode, moment: Moment) -> None:
        """The engine of ``mode`` is at one of its own moments."""
        self.reached(mode, moment.value)

    def stepped(self, events: Sequence[Event]) -> None:
        """A ledger engine's session made a step (its ``observe`` hook): the
        points right after it.  Steps committed together (``Session.record``:
        ``EnginePersistCall`` + ``EngineParkApproval``; ``Session.recover``:
        ``Recover`` + what follows it, for every call) share one point: the
        moment after the commit, so a crash "after" any of them leaves the
        whole commit durable."""
        for ev in events:
            if ev.action in _AFTER_COMMIT:
                self.reached(EngineMode.LEDGER, f"after {ev.action.value}")

    # The request-out moment is inside the adapter: the engine announces the
    # step, the transport calls request_sent() once the request left.
    def sending(self, mode: EngineMode, step: str | Moment) -> None:
        self._sending = (mode, step.value if isinstance(step, Moment) else f"after {step}")

    def request_sent(self) -> None:
        """Call from a transport once a request reached the external system."""
        if self._sending is not None:
            mode, name = self._sending
            self._sending = None
            self.reached(mode, name)

    def done_sending(self) -> None:
        self._sending = None
