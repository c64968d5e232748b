"""What an engine declares per tool, and a counting external system for demos and tests.

An engine that adopts toolledger declares, for every tool, a
:class:`~toolledger.protocol.ToolProfile` (its recovery policy and whether it
needs a human's approval) and an adapter that talks to the external system.
This module holds:

- the adapter seam: :class:`ToolAdapter` (``invoke``), and for ``reconcile``
  tools :class:`ReconcilingAdapter` (``invoke`` and ``reconcile``), with the
  closed sets of answers they may give (:data:`AdapterOutcome`,
  :data:`ReconcileAnswer`).  An adapter *classifies* what happened:
  :class:`Applied`, :class:`DefiniteFailure` (known NOT applied) or
  :class:`Unknown` (a time-out, a reset connection, anything ambiguous).  The
  engine treats :class:`Unknown` exactly like a crash (``EngineTimeout`` then
  ``Recover``), and so does it with an exception raised by an adapter;
- :class:`ToolRegistry`: tool name -> (profile, adapter), validated when a
  tool is registered, and the check that keeps the execution identity out of
  the model's reach (:func:`check_arguments`, :data:`RESERVED_ARGUMENT_NAMES`);
- :class:`CountingExternalSystem` and :class:`CountingAdapter`: an external
  system that applies effects and counts them per execution id, deduplicates
  on the idempotency key, fences attempts for reconciliation, keeps requests
  in flight across engine crashes, and can be told to lose an answer, fail
  definitely or time out.  With a ``path`` it is durable (one JSON line,
  appended and fsynced, per event), so that a separate process can count
  effects across SIGKILLs.

The idempotency key reaches an adapter through the ``idempotency_key`` keyword
only, never through ``arguments``: the arguments are model-controlled text,
and a model that could write the key could make two different calls share one
execution, or make one call look like a new one.  The ``attempt`` keyword
carries the attempt number so that a reconcile connector can fence attempts
*per attempt* (``docs/protocol.md#subtleties``): the late original (attempt n) is
rejected, the retry (attempt n+1) is not.

This module must never decide recovery (that is
:func:`toolledger.protocol.decide_recovery`'s job), never derive an execution
id, and never forward a model-supplied argument named like the key.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Protocol, TypeAlias, runtime_checkable

from .protocol import InvalidInput, RecoveryPolicy, ToolProfile

__all__ = [
    "RESERVED_ARGUMENT_NAMES",
    "AdapterOutcome",
    "Applied",
    "CannotTell",
    "CountingAdapter",
    "CountingExternalSystem",
    "DefiniteFailure",
    "ExternalRequest",
    "Fault",
    "NotAppliedFenced",
    "ReconcileAnswer",
    "ReconcilingAdapter",
    "RegisteredTool",
    "RequestStatus",
    "ToolAdapter",
    "ToolRegistry",
    "Unknown",
    "WasApplied",
    "check_arguments",
    "frozen_arguments",
    "reserved_argument_paths",
]


# --------------------------------------------------------------------------
# What an adapter may answer
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Applied:
    """The external system applied the effect (or deduplicated it) and answered."""

    result: str


@dataclass(frozen=True, slots=True)
class DefiniteFailure:
    """The external system definitely did NOT apply the effect (e.g. rejected it)."""

    error: str


@dataclass(frozen=True, slots=True)
class Unknown:
    """Nobody knows whether the effect was applied (time-out, lost answer, ...).

    The engine handles it like a crash: ``EngineTimeout`` then ``Recover``.
    """

    reason: str


AdapterOutcome: TypeAlias = Applied | DefiniteFailure | Unknown


@dataclass(frozen=True, slots=True)
class WasApplied:
    """Reconciliation: execution X was applied; ``result`` is what it returned."""

    result: str


@dataclass(frozen=True, slots=True)
class NotAppliedFenced:
    """Reconciliation: execution X was not applied, and every attempt so far is fenced.

    Only this answer allows a retry: a late original request can no longer land.
    """


@dataclass(frozen=True, slots=True)
class CannotTell:
    """Reconciliation: the connector cannot say (unreachable, no such query, ...)."""

    reason: str


ReconcileAnswer: TypeAlias = WasApplied | NotAppliedFenced | CannotTell


@runtime_checkable
class ToolAdapter(Protocol):
    """Talks to the external system for one tool.

    ``arguments`` are the model's (already checked by :func:`check_arguments`,
    read-only).  ``execution_id`` is the engine's stable identity of the call's
    execution (for logs and for reconciliation).  ``idempotency_key`` is the
    execution id when the tool's policy is ``idempotent`` and ``None``
    otherwise; an idempotent adapter must send it to the external system as
    its deduplication key (e.g. an ``Idempotency-Key`` header).  ``attempt``
    numbers the attempts of one execution (1, 2, ...).

    Return :class:`Applied`, :class:`DefiniteFailure` only when the effect is
    known not to have happened, and :class:`Unknown` for anything else.  An
    exception is treated as :class:`Unknown`.
    """

    def invoke(
        self,
        arguments: Mapping[str, Any],
        *,
        execution_id: str,
        idempotency_key: str | None,
        attempt: int,
    ) -> AdapterOutcome: ...


@runtime_checkable
class ReconcilingAdapter(ToolAdapter, Protocol):
    """An adapter of a ``reconcile`` tool: it can also answer "was X applied?".

    ``reconcile(execution_id, attempt=n)`` must, before it answers
    :class:`NotAppliedFenced`, make the external system reject every request
    of attempts ``<= n`` of that execution that may still arrive.
    """

    def reconcile(self, execution_id: str, *, attempt: int) -> ReconcileAnswer: ...


# --------------------------------------------------------------------------
# The execution identity stays out of the model's reach
# --------------------------------------------------------------------------

RESERVED_ARGUMENT_NAMES: Final[tuple[str, ...]] = (
    "idempotency_key",
    "execution_id",
    "Idempotency-Key",
)
"""Argument names a model may not use: they look like the execution identity.

Matched case-insensitively and ignoring separators, so ``IDEMPOTENCY_KEY``,
``idempotencyKey``, ``execution-id`` and ``ExecutionId`` are reserved too; at
any depth of the arguments (a ``headers`` object may hold one)."""


def _normalized(name: str) -> str:
    return "".join(ch for ch in name.casefold() if ch.isalnum())


_RESERVED: Final = frozenset(_normalized(n) for n in RESERVED_ARGUMENT_NAMES)


def reserved_argument_paths(arguments: Mapping[str, Any]) -> list[str]:
    """Where ``arguments`` use a reserved name, as JSON-ish paths (``headers.Idempotency-Key``)."""
    found: list[str] = []

    def walk(value: object, path: str) -> None:
        if isinstance(value, Mapping):
            for key, inner in value.items():
                where = f"{path}.{key}" if path else str(key)
                if isinstance(key, str) and _normalized(key) in _RESERVED:
                    found.append(where)
                walk(inner, where)
        elif isinstance(value, list | tuple):
            for i, inner in enumerate(value):
                walk(inner, f"{path}[{i}]")

    walk(arguments, "")
    return found


def check_arguments(tool_name: str, arguments: object) -> None:
    """Reject model-supplied arguments that the engine must not forward.

    Raises :class:`~toolledger.protocol.InvalidInput` if ``arguments`` is not
    a JSON object, or uses a name of :data:`RESERVED_ARGUMENT_NAMES`.  The
    engine calls it before anything about the call is recorded or executed.
    """
    if not isinstance(arguments, Mapping):
        raise InvalidInput(
            f"arguments of {tool_name!r} must be a JSON object, got {type(arguments).__name__}: "
            "the provider adapter must parse the call's arguments JSON into a dict"
        )
    paths = reserved_argument_paths(arguments)
    if paths:
        raise InvalidInput(
            f"call of {tool_name!r} has a model-supplied argument named like the execution "
            f"identity ({', '.join(paths)}); reserved names: "
            f"{', '.join(RESERVED_ARGUMENT_NAMES)} (any case, any separator). The engine "
            "passes the idempotency key to the adapter itself: remove that argument from the "
            "tool's schema; nothing was recorded or executed"
        )


# --------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RegisteredTool:
    """One tool as the engine knows it: engine-owned profile and its adapter."""

    profile: ToolProfile
    adapter: ToolAdapter

    @property
    def name(self) -> str:
        return self.profile.name


def _policy(name: str, policy: object) -> RecoveryPolicy:
    if isinstance(policy, RecoveryPolicy):
        return policy
    try:
        return RecoveryPolicy(str(policy))
    except ValueError:
        valid = ", ".join(p.value for p in RecoveryPolicy)
        raise InvalidInput(
            f"unknown recovery policy {policy!r} for tool {name!r}; declare one of: {valid} "
            f"(use {RecoveryPolicy.MANUAL.value!r} when unsure: it never replays)"
        ) from None


class ToolRegistry:
    """Tool name -> (:class:`~toolledger.protocol.ToolProfile`, adapter).

    The recovery policy is declared here by the engine, per tool, and is never
    inferred from a category or taken from the model.  Registration validates:
    an unknown policy string, a ``reconcile`` tool whose adapter has no
    ``reconcile()``, an adapter without ``invoke()`` and a duplicate name are
    errors that change nothing.
    """

    def __init__(self) -> None:
        self._tools: dict[str, RegisteredTool] = {}

    def register(
        self,
        name: str,
        adapter: ToolAdapter,
        *,
        policy: RecoveryPolicy | str = RecoveryPolicy.MANUAL,
        requires_approval: bool = True,
    ) -> ToolProfile:
        """Declare tool ``name``; returns its profile."""
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"tool name must be a non-empty string, got {name!r}")
        if name in self._tools:
            raise InvalidInput(
                f"tool {name!r} is already registered; register each tool once"
            )
        pol = _policy(name, policy)
        if not callable(getattr(adapter, "invoke", None)):
            raise InvalidInput(
                f"adapter of {name!r} ({type(adapter).__name__}) has no invoke(): "
                "implement toolledger.adapters.ToolAdapter"
            )
        if pol is RecoveryPolicy.RECONCILE and not callable(getattr(adapter, "reconcile", None)):
            raise InvalidInput(
                f"tool {name!r} declares policy 'reconcile' but its adapter "
                f"({type(adapter).__name__}) has no reconcile(execution_id, *, attempt): "
                "implement it, or declare 'manual'"
            )
        profile = ToolProfile(name, pol, requires_approval)
        self._tools[name] = RegisteredTool(profile, adapter)
        return profile

    def get(self, name: str) -> RegisteredTool:
        """The registered tool ``name``; :class:`InvalidInput` naming the known ones if none."""
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(sorted(self._tools)) or "(none)"
            raise InvalidInput(
                f"no tool named {name!r} is registered; registered tools: {known}"
            )
        return tool

    def profile(self, name: str) -> ToolProfile:
        return self.get(name).profile

    def check_call(self, name: str, arguments: object) -> RegisteredTool:
        """Validate one model call (known tool, arguments a JSON object, no reserved names)."""
        tool = self.get(name)
        check_arguments(name, arguments)
        return tool

    def names(self) -> list[str]:
        return sorted(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[RegisteredTool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)


# --------------------------------------------------------------------------
# A counting external system
# --------------------------------------------------------------------------


class Fault(StrEnum):
    """What the external system does with the next request it receives."""

    NONE = "none"
    LOSE_ANSWER = "lose_answer"  # applies it; the answer never reaches the engine
    FAIL_DEFINITELY = "fail_definitely"  # rejects it before applying: known not applied
    TIME_OUT = "time_out"  # leaves it in flight (it may land later); the engine hears nothing
    CANNOT_TELL = "cannot_tell"  # for the next reconcile() question: no answer


class RequestStatus(StrEnum):
    IN_FLIGHT = "in_flight"
    APPLIED = "applied"
    DEDUPLICATED = "deduplicated"
    REJECTED = "rejected"
    DROPPED_FENCED = "dropped_fenced"


@dataclass
class ExternalRequest:
    """One request the external system received."""

    number: int
    tool: str
    execution_id: str
    attempt: int
    idempotency_key: str | None
    arguments: dict[str, Any]
    status: RequestStatus = RequestStatus.IN_FLIGHT
    result: str | None = None


@dataclass
class _Ledger:
    requests: list[ExternalRequest] = field(default_factory=list)
    applied: dict[str, int] = field(default_factory=dict)  # execution id -> applications
    results: dict[str, str] = field(default_factory=dict)  # execution id -> first result
    keys: dict[str, str] = field(default_factory=dict)  # idempotency key -> result
    fences: dict[str, int] = field(default_factory=dict)  # execution id -> fenced up to
    applications: int = 0


class CountingExternalSystem:
    """An external system (an email server, say) that counts what it really did.

    - Every request is first *received* (in flight), then *processed*:
      applied (counted per execution id), deduplicated (an idempotency key it
      has applied before: no new effect, the original answer), rejected
      (a scripted definite failure) or dropped (its attempt is fenced).
    - ``fault(...)`` scripts what happens to the next requests; a
      ``TIME_OUT`` leaves a request in flight, and :meth:`deliver_in_flight`
      later lands it (the late original).
    - :meth:`reconcile` answers "was execution X applied?" and, when it was
      not, fences attempts ``<= attempt`` of X before it says so.
    - With ``path``, every event is appended to a JSON-lines file and fsynced
      before the call returns, and a new instance on the same path replays
      it: effects are counted across processes and SIGKILLs.  A torn last
      line (a kill in the middle of a write) is ignored.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = None if path is None else Path(path)
        self._faults: list[Fault] = []
        self._reconcile_faults: list[Fault] = []
        self._state = _Ledger()
        if self.path is not None and self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines(keepends=True):
                if not line.endswith("\n"):
                    break  # torn by a kill mid-write: the event did not happen
                self._replay(json.loads(line))

    # -- scripting ----------------------------------------------------------

    def fault(self, *faults: Fault | str) -> None:
        """Script the fate of the next requests (or reconcile questions), in order."""
        for f in faults:
            value = Fault(f)
            if value is Fault.CANNOT_TELL:
                self._reconcile_faults.append(value)
            else:
                self._faults.append(value)

    # -- the wire ------------------------------------------------------------

    def receive(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        execution_id: str,
        attempt: int,
        idempotency_key: str | None,
    ) -> ExternalRequest:
        """A request arrives; it is in flight until :meth:`process` handles it."""
        event = {
            "op": "receive",
            "number": len(self._state.requests) + 1,
            "tool": tool,
            "execution_id": execution_id,
            "attempt": attempt,
            "idempotency_key": idempotency_key,
            "arguments": dict(arguments),
        }
        self._record(event)
        return self._state.requests[-1]

    def process(self, request: ExternalRequest) -> AdapterOutcome:
        """Handle an in-flight request now; returns what its sender hears."""
        fault = self._faults.pop(0) if self._faults else Fault.NONE
        if fault is Fault.TIME_OUT:
            return Unknown("the external system did not answer in time")
        return self._handle(request, fault)

    def deliver_in_flight(self) -> list[ExternalRequest]:
        """Land every request still in flight (late originals); returns them, handled."""
        late = [r for r in self._state.requests if r.status is RequestStatus.IN_FLIGHT]
        for r in late:
            self._handle(r, Fault.NONE)
        return late

    def _handle(self, r: ExternalRequest, fault: Fault) -> AdapterOutcome:
        st = self._state
        if r.attempt <= st.fences.get(r.execution_id, 0):
            self._record({"op": "drop", "number": r.number})
            return DefiniteFailure(f"attempt {r.attempt} of {r.execution_id} is fenced")
        if r.idempotency_key is not None and r.idempotency_key in st.keys:
            self._record({"op": "dedup", "number": r.number})
            return Applied(st.keys[r.idempotency_key])
        if fault is Fault.FAIL_DEFINITELY:
            self._record({"op": "reject", "number": r.number})
            return DefiniteFailure(f"{r.tool} rejected the request before applying it")
        self._record({"op": "apply", "number": r.number})
        result = r.result or ""
        if fault is Fault.LOSE_ANSWER:
            return Unknown("the connection was reset before the answer arrived")
        return Applied(result)

    def reconcile(self, execution_id: str, *, attempt: int) -> ReconcileAnswer:
        """Was ``execution_id`` applied?  If not, fence attempts ``<= attempt`` first."""
        if self._reconcile_faults:
            self._reconcile_faults.pop(0)
            return CannotTell("the connector's status endpoint did not answer")
        if self._state.applied.get(execution_id, 0) >= 1:
            return WasApplied(self._state.results[execution_id])
        self.fence(execution_id, attempt)
        return NotAppliedFenced()

    def fence(self, execution_id: str, up_to_attempt: int) -> None:
        """Reject from now on every request of attempts ``<= up_to_attempt`` of this execution."""
        if up_to_attempt > self._state.fences.get(execution_id, 0):
            self._record({"op": "fence", "execution_id": execution_id, "up_to": up_to_attempt})

    # -- what happened ---------------------------------------------------------

    def effects(self, execution_id: str | None = None) -> int:
        """How many times an effect was really applied (for one execution, or in all)."""
        if execution_id is None:
            return self._state.applications
        return self._state.applied.get(execution_id, 0)

    @property
    def requests(self) -> Sequence[ExternalRequest]:
        """Every request received, in order (deduplicated and dropped ones too)."""
        return tuple(self._state.requests)

    def invocations(self, execution_id: str | None = None) -> int:
        """How many requests arrived (for one execution, or in all)."""
        return sum(
            1 for r in self._state.requests if execution_id in (None, r.execution_id)
        )

    def in_flight(self) -> list[ExternalRequest]:
        return [r for r in self._state.requests if r.status is RequestStatus.IN_FLIGHT]

    def fenced_up_to(self, execution_id: str) -> int:
        return self._state.fences.get(execution_id, 0)

    # -- durability --------------------------------------------------------------

    def _record(self, event: dict[str, Any]) -> None:
        if self.path is not None:
            line = json.dumps(event, sort_keys=True) + "\n"
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
        self._replay(event)

    def _replay(self, event: Mapping[str, Any]) -> None:
        st = self._state
        op = event["op"]
        if op == "receive":
            st.requests.append(
                ExternalRequest(
                    number=int(event["number"]),
                    tool=str(event["tool"]),
                    execution_id=str(event["execution_id"]),
                    attempt=int(event["attempt"]),
                    idempotency_key=event["idempotency_key"],
                    arguments=dict(event["arguments"]),
                )
            )
            return
        if op == "fence":
            st.fences[str(event["execution_id"])] = int(event["up_to"])
            return
        r = st.requests[int(event["number"]) - 1]
        if op == "apply":
            st.applications += 1
            st.applied[r.execution_id] = st.applied.get(r.execution_id, 0) + 1
            r.result = json.dumps(
                {"status": "applied", "tool": r.tool, "effect": st.applications},
                sort_keys=True,
            )
            r.status = RequestStatus.APPLIED
            st.results.setdefault(r.execution_id, r.result)
            if r.idempotency_key is not None:
                st.keys.setdefault(r.idempotency_key, r.result)
        elif op == "dedup":
            r.status = RequestStatus.DEDUPLICATED
            r.result = st.keys[str(r.idempotency_key)]
        elif op == "reject":
            r.status = RequestStatus.REJECTED
        elif op == "drop":
            r.status = RequestStatus.DROPPED_FENCED
        else:
            raise ValueError(f"unknown event {op!r} in {self.path}: the file is not ours")


class CountingAdapter:
    """The adapter of one tool of a :class:`CountingExternalSystem`.

    ``on_request_sent`` is called after the request reached the external
    system and before it is processed: the moment "the request is out, not
    answered" where the simulation injects a crash (the engine itself cannot
    see inside ``invoke``).  It implements ``reconcile`` too; register it
    with whatever policy the test needs.
    """

    def __init__(
        self,
        system: CountingExternalSystem,
        tool: str,
        *,
        on_request_sent: Callable[[], None] | None = None,
    ) -> None:
        self.system = system
        self.tool = tool
        self.on_request_sent = on_request_sent

    def invoke(
        self,
        arguments: Mapping[str, Any],
        *,
        execution_id: str,
        idempotency_key: str | None,
        attempt: int,
    ) -> AdapterOutcome:
        request = self.system.receive(
            self.tool,
            arguments,
            execution_id=execution_id,
            attempt=attempt,
            idempotency_key=idempotency_key,
        )
        if self.on_request_sent is not None:
            self.on_request_sent()
        return self.system.process(request)

    def reconcile(self, execution_id: str, *, attempt: int) -> ReconcileAnswer:
        return self.system.reconcile(execution_id, attempt=attempt)


def frozen_arguments(arguments: Mapping[str, Any]) -> Mapping[str, Any]:
    """A read-only deep copy of ``arguments`` (an adapter cannot change the call)."""
    copied = json.loads(json.dumps(arguments))
    assert isinstance(copied, dict)
    return MappingProxyType(copied)
