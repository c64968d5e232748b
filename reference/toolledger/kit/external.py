"""A counting external system for the demo engine, the simulations and the tests.

:class:`CountingExternalSystem` and :class:`CountingAdapter`: an external
system that applies effects and counts them per execution id, deduplicates on
the idempotency key, fences attempts for reconciliation, keeps requests in
flight across engine crashes, and can be told to lose an answer, fail
definitely or time out.  With a ``path`` it is durable (one JSON line,
appended and fsynced, per event), so that a separate process can count effects
across SIGKILLs.

It answers through the adapter seam of :mod:`toolledger` (the outcomes
``Applied``, ``DefiniteFailure``, ``Unknown`` and the reconcile answers
``WasApplied``, ``NotAppliedFenced``, ``CannotTell``); an engine never needs
this module.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from .._core.tools import (
    AdapterOutcome,
    Applied,
    CannotTell,
    DefiniteFailure,
    NotAppliedFenced,
    ReconcileAnswer,
    Unknown,
    WasApplied,
)

__all__ = [
    "CountingAdapter",
    "CountingExternalSystem",
    "ExternalRequest",
    "Fault",
    "RequestStatus",
]

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
