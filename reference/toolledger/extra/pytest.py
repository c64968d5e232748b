"""A pytest plugin that proves a connector keeps the promises the spec assumes.

The protocol's guarantees rest on the external system's side of it
(``docs/protocol.md#assumptions``): an ``idempotent`` tool's system
deduplicates on the execution id for as long as the declared retention window;
a ``reconcile`` connector answers "was attempt n applied?" truthfully and fences
the attempts it reports as not applied, atomically with the answer; an adapter
classifies how a call ended (applied / definitely not applied / unknown)
honestly; and the execution identity never comes from model-written arguments.
This plugin turns those assumptions into a test-suite for YOUR connector::

    @pytest.fixture
    def connector(tmp_path):                  # your adapter and your sandbox
        fake = PaymentsFake(tmp_path / "payments.sqlite3", retention_window=0.25)
        return Connector(call=PaymentsClient(fake).charge, sandbox=fake)

    @pytest.mark.connector_contract(Tool(policy="idempotent"), retention_window=0.25)
    def test_payments(obligation, connector):  # one test per obligation of the policy
        obligation.check(connector)

Every test the marker generates is one :class:`Obligation`: an external-system
action of ``spec/DurableToolExecution.tla`` (``ExternalApply``,
``ExternalApplyLoseAnswer``, ``ExternalRejectDefinite``, ``ExternalDropFenced``,
``ExternalExpireKey``, and a real API's key answers ``ExternalAnswerInFlight``,
``ExternalAnswerParamsDiffer``, ``ExternalReplayFailure``), what the connector
must do in it, and the invariant whose proof assumes it; the test id is
``Action-obligation-Invariant``
(``test_payments[ExternalApply-duplicate_applies_once-AtMostOnceEffect]``) and a
failure says which promise was broken and what it costs.

What the developer provides (:class:`Connector`):

- ``call``: the tool body an engine runs through ``Session.execute``: it gets a
  :class:`~toolledger.Attempt` (execution id, idempotency key, attempt number,
  arguments) and returns the result, raises :class:`~toolledger.NotApplied` for
  a definite failure, or raises anything else (unknown).  The plugin runs it
  through a real :class:`~toolledger.Session` where the outcome matters, so the
  engine's own classification (``marks_send``, ``classify``) is what is tested;
- ``reconcile`` (``reconcile`` policy): ``Session.reconcile``'s ``ask(call,
  attempt)`` answering :class:`~toolledger.WasApplied`,
  :class:`~toolledger.NotAppliedFenced` or :class:`~toolledger.CannotTell`;
- ``sandbox`` (:class:`Sandbox`): the way to observe and script the external
  system (a sandbox account, a recorded fake, a real local service): how many
  times an execution's effect was applied, the fate of the next request
  (:class:`Fault`), landing the requests it held (late originals), and, for the
  obligations that need them, landing them right after it answers a status
  query (``deliver_late_on_next_query``) and moving its clock (``advance``).

Loaded by the ``pytest11`` entry point when toolledger is installed, or
explicitly with ``pytest -p toolledger.extra.pytest``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final, Protocol

import pytest

from toolledger import (
    Attempt,
    CallRef,
    CannotTell,
    Decision,
    InvalidInput,
    MemoryStore,
    Next,
    NotApplied,
    NotAppliedFenced,
    Outcome,
    RecoveryPolicy,
    Session,
    StaleState,
    Tool,
    WasApplied,
)

__all__ = [
    "MARKER",
    "OBLIGATIONS",
    "Connector",
    "Fault",
    "ManualClock",
    "Obligation",
    "ObligationViolated",
    "Sandbox",
    "obligations_for",
    "obligations_table",
]

MARKER: Final = "connector_contract"
"""``@pytest.mark.connector_contract(tool, *, retention_window=None)``."""

_SPEC: Final = "spec/DurableToolExecution.tla"
_CONCURRENT_SPEC: Final = "spec/ConcurrentResumers.tla"  # the stale-epoch drop
_DOCS: Final = "docs/protocol.md#assumptions"

# --------------------------------------------------------------------------
# What the developer provides
# --------------------------------------------------------------------------


class Fault(StrEnum):
    """The fate of the next request the sandbox receives (one per ``inject``)."""

    RESET_AFTER_APPLY = "reset_after_apply"
    """ExternalApplyLoseAnswer: applied, then the connection is reset before the answer."""
    TIMEOUT_AFTER_APPLY = "timeout_after_apply"
    """ExternalApplyLoseAnswer: applied, and the answer comes after the client gave up."""
    HOLD = "hold"
    """In flight: the client times out; it lands at ``deliver_late`` (a late original:
    ExternalApply, or ExternalDropFenced once its attempt is fenced)."""
    REJECT = "reject"
    """ExternalRejectDefinite: the system refuses it with a typed error, nothing applied."""
    IN_FLIGHT = "in_flight"
    """ExternalAnswerInFlight: the system answers that another request with this key is
    still being processed (a 409); nothing applied by this one."""
    PARAMS_DIFFER = "params_differ"
    """ExternalAnswerParamsDiffer: the system answers that the key holds a request with
    other parameters (an idempotency error); nothing applied by this one."""
    FAIL_AFTER_APPLY = "fail_after_apply"
    """ExternalReplayFailure: the system applies it, answers a 500 and stores that
    failure under the key: a retry with the key gets the stored 500 replayed."""


class Sandbox(Protocol):
    """How the plugin observes and scripts the external system.

    Optional, needed only by the obligations that use them (the test says so
    if missing): ``deliver_late_on_next_query()`` (``reconcile``: land the held
    requests right after the system answers its next status query, the moment
    a query-then-fence connector is between its two steps) and
    ``advance(seconds)`` (a retention window: move the system's clock; without
    it the plugin sleeps).
    """

    def effects(self, execution_id: str) -> int:
        """How many times the effect of ``execution_id`` was really applied."""
        ...

    def inject(self, fault: Fault) -> None:
        """Script the fate of the next request (faults queue up in order)."""
        ...

    def deliver_late(self) -> None:
        """Land every request the system holds (``Fault.HOLD``), answers ignored."""
        ...


@dataclass(frozen=True)
class Connector:
    """The connector under test: its tool body, its reconcile query, its sandbox.

    ``arguments`` are what a model would pass (a JSON object the tool accepts);
    ``name`` is the tool's name in the test sessions.
    """

    call: Callable[[Attempt], object]
    sandbox: Sandbox
    reconcile: Callable[[CallRef, int], object] | None = None
    announce_epoch: Callable[[CallRef, int], object] | None = None
    """``Session.open(..., announce_epoch=...)``'s hook: the new owner of a session
    makes its lease epoch known (an epoch-aware connector, ``epoch_aware=True``)."""
    arguments: Mapping[str, Any] = field(default_factory=lambda: {"amount": 1})
    name: str = "connector"

    def __post_init__(self) -> None:
        if not callable(self.call):
            raise InvalidInput(f"Connector(call=...) must be the tool body, a callable taking "
                               f"a toolledger.Attempt; got {self.call!r}")
        if self.announce_epoch is not None and not callable(self.announce_epoch):
            raise InvalidInput(f"Connector(announce_epoch=...) must be announce(call, epoch) "
                               f"or None; got {self.announce_epoch!r}")
        if self.reconcile is not None and not callable(self.reconcile):
            raise InvalidInput(f"Connector(reconcile=...) must be ask(call, attempt) or None; "
                               f"got {self.reconcile!r}")
        missing = [m for m in ("effects", "inject", "deliver_late")
                   if not callable(getattr(self.sandbox, m, None))]
        if missing:
            raise InvalidInput(
                f"Connector(sandbox=...) {type(self.sandbox).__name__} has no "
                f"{', '.join(m + '()' for m in missing)}: a sandbox counts effects per "
                "execution id, takes injected faults and lands held requests "
                "(toolledger.extra.pytest.Sandbox)")
        if not isinstance(self.arguments, Mapping):
            raise InvalidInput(f"Connector(arguments=...) must be a JSON object (a dict) the "
                               f"tool accepts; got {type(self.arguments).__name__}")


class ManualClock:
    """An injectable clock for sandboxes with a retention window: ``advance`` moves it.

    Starts at 0.0; ``now()`` is read by the sandbox, ``advance(seconds)`` by the
    plugin (through the sandbox's ``advance``), so retention windows cost no
    wall-clock time.
    """

    def __init__(self) -> None:
        self._now = 0.0
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock only moves forward, got {seconds!r} seconds")
        with self._lock:
            self._now += seconds


# --------------------------------------------------------------------------
# Obligations
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Obligation:
    """One promise of the external system / adapter that the spec assumes.

    ``action``: the spec's external-system action it is about; ``invariant``:
    the invariant whose proof depends on it; ``promise``: what the connector
    must do, in words; ``policies``: the tool policies it applies to;
    ``windowed``: generated only when the tool declares a retention window.
    """

    action: str
    name: str
    invariant: str
    promise: str
    policies: frozenset[RecoveryPolicy]
    run: Callable[[_Run], None] = field(repr=False, compare=False)
    windowed: bool = False
    epoch_aware: bool = False
    """Generated only when the connector declares it knows lease epochs."""
    tool: Tool | None = field(default=None, compare=False)
    """The tool's declaration, from the marker (generated tests) or :meth:`bind`."""
    retention_window: float | None = field(default=None, compare=False)

    @property
    def id(self) -> str:
        return f"{self.action}-{self.name}-{self.invariant}"

    def bind(self, tool: Tool, retention_window: float | None = None) -> Obligation:
        """This obligation for a tool declared ``tool`` (what the marker does)."""
        return dataclasses.replace(self, tool=tool, retention_window=retention_window)

    def check(self, connector: Connector) -> None:
        """Run this obligation against ``connector``; a broken promise fails the test
        with a message naming the obligation, what was observed and the invariant."""
        tool = self.tool
        if tool is None:
            raise InvalidInput(
                f"obligation {self.id} does not know the tool's declaration: use it in a test "
                f"marked @pytest.mark.{MARKER}(Tool(...)), or obligation.bind(Tool(...))"
            )
        if not isinstance(connector, Connector):
            raise InvalidInput(
                f"obligation {self.id} checks a toolledger.extra.pytest.Connector, got "
                f"{type(connector).__name__}: return Connector(call=..., sandbox=...) "
                "from your connector fixture"
            )
        policy = RecoveryPolicy(tool.policy)
        if policy not in self.policies:
            raise InvalidInput(f"obligation {self.id} is not one of a {policy.value!r} tool")
        if policy is RecoveryPolicy.RECONCILE and connector.reconcile is None:
            raise InvalidInput(
                "the tool declares policy 'reconcile' but the Connector has no reconcile= "
                "(ask(call, attempt) -> WasApplied | NotAppliedFenced | CannotTell)"
            )
        try:
            self.run(_Run(self, connector, tool, self.retention_window))
        except ObligationViolated as exc:
            # The message is the report; the plugin's own frames would only hide it.
            pytest.fail(str(exc), pytrace=False)


class ObligationViolated(AssertionError):
    """A connector broke an obligation; the message names it and its invariant."""


_sessions = itertools.count(1)


class _Run:
    """One run of one obligation: sessions, attempts, and the failure message."""

    def __init__(self, ob: Obligation, connector: Connector, tool: Tool,
                 window: float | None) -> None:
        self.ob = ob
        self.c = connector
        self.tool = _no_approval(tool)
        self.policy = RecoveryPolicy(tool.policy)
        self.window = window
        # The engine's clock: the wall clock plus every advance() of the
        # sandbox's, so a window that passes for the external system passes
        # for the engine's ledger too, without waiting it out.
        self._advanced = 0.0

    # -- failing ------------------------------------------------------------

    def fail(self, what: str) -> None:
        ob = self.ob
        raise ObligationViolated(
            f"connector broke obligation {ob.id}\n"
            f"  promise ({ob.action}, {_CONCURRENT_SPEC if ob.epoch_aware else _SPEC}): "
            f"{ob.promise}\n"
            f"  observed: {what}\n"
            f"  depends on it: {ob.invariant} (see {_DOCS})"
        )

    def expect(self, ok: bool, what: str) -> None:
        if not ok:
            self.fail(what)

    # -- the engine side: a real Session ------------------------------------

    def now(self) -> float:
        return time.time() + self._advanced

    def session(self, store: MemoryStore | None = None, sid: str | None = None) -> Session:
        return Session.open(MemoryStore() if store is None else store,
                            sid or f"contract-{next(_sessions)}", {self.c.name: self.tool},
                            clock=self.now)

    def record(self, s: Session, arguments: Mapping[str, Any] | None = None) -> str:
        call = {"id": "call_0", "name": self.c.name,
                "arguments": dict(self.c.arguments if arguments is None else arguments)}
        [st] = s.record(1, [call])
        return st.key

    def attempt(self, key: str, n: int, epoch: int | None = None) -> Attempt:
        """Attempt n of execution ``key`` as the Session would hand it to the tool."""
        ref = CallRef(key, "call_0", self.c.name, (1, 0),
                      MappingProxyType(dict(self.c.arguments)), self.policy, False, epoch)
        return Attempt(ref, n, key if self.policy is RecoveryPolicy.IDEMPOTENT else None,
                       epoch)

    def effects(self, key: str) -> int:
        return int(self.c.sandbox.effects(key))

    def inject(self, fault: Fault) -> None:
        self.c.sandbox.inject(fault)

    def optional(self, name: str) -> Callable[..., None]:
        fn = getattr(self.c.sandbox, name, None)
        if not callable(fn):
            raise InvalidInput(
                f"obligation {self.ob.id} needs the sandbox's {name}(): "
                f"{type(self.c.sandbox).__name__} has none (see toolledger.extra.pytest.Sandbox)"
            )
        return fn  # type: ignore[no-any-return]

    def advance(self, seconds: float) -> None:
        fn = getattr(self.c.sandbox, "advance", None)
        if callable(fn):
            fn(seconds)
            self._advanced += seconds
        else:
            time.sleep(seconds)  # a sandbox on real time: both clocks are the wall clock


def _no_approval(tool: Tool) -> Tool:
    # The contract is about the external system, not the approval gate.
    return dataclasses.replace(tool, requires_approval=False)


_PROTECTED: Final = frozenset(
    {RecoveryPolicy.MANUAL, RecoveryPolicy.IDEMPOTENT, RecoveryPolicy.RECONCILE})
_IDEMPOTENT: Final = frozenset({RecoveryPolicy.IDEMPOTENT})
_RECONCILE: Final = frozenset({RecoveryPolicy.RECONCILE})

# -- classification: every protected policy ------------------------------------


def _answer_is_applied(r: _Run) -> None:
    s = r.session()
    key = r.record(s)
    st = s.execute(key, r.c.call)
    r.expect(st.outcome is Outcome.APPLIED,
             f"a request the system applied and answered ended {_outcome(st.outcome)}"
             f"{_err(st.error)}, expected applied")
    n = r.effects(key)
    r.expect(n == 1, f"{n} effects for one request answered 'applied', expected 1")


def _lose_answer(fault: Fault) -> Callable[[_Run], None]:
    def run(r: _Run) -> None:
        s = r.session()
        key = r.record(s)
        r.inject(fault)
        st = s.execute(key, r.c.call)
        n = r.effects(key)
        r.expect(n == 1, f"the sandbox applied {n} effects for a request scripted "
                         f"{fault.value}: it must apply it once (check the sandbox)")
        r.expect(st.outcome is Outcome.UNKNOWN,
                 f"the request was applied and its answer lost ({fault.value}), and the "
                 f"attempt ended {_outcome(st.outcome)}{_err(st.error)}: only 'unknown' is "
                 "true; 'not applied' records a failed result for an effect that happened")
    return run


def _late_original_is_unknown(r: _Run) -> None:
    s = r.session()
    key = r.record(s)
    r.inject(Fault.HOLD)
    st = s.execute(key, r.c.call)
    r.c.sandbox.deliver_late()
    n = r.effects(key)
    r.expect(st.outcome is Outcome.UNKNOWN,
             f"a request still in flight when the client timed out ended "
             f"{_outcome(st.outcome)}{_err(st.error)}, and later landed ({n} effect(s)): a "
             "time-out is 'unknown', the request may still be applied")


def _typed_error_is_not_applied(r: _Run) -> None:
    s = r.session()
    key = r.record(s)
    r.inject(Fault.REJECT)
    st = s.execute(key, r.c.call)
    n = r.effects(key)
    r.expect(n == 0, f"the sandbox applied a request it was told to reject ({n} effects)")
    r.expect(st.outcome is Outcome.NOT_APPLIED,
             f"a typed refusal (nothing applied) ended {_outcome(st.outcome)}"
             f"{_err(st.error)}: raise toolledger.NotApplied for it, or the call halts "
             "or is recovered as if the effect might have happened")


_RESERVED_SPOTS: Final[tuple[tuple[str, Callable[[str], dict[str, Any]]], ...]] = (
    ("top level", lambda n: {n: "forged"}),
    ("nested object", lambda n: {"headers": {n: "forged"}}),
    ("object in a list", lambda n: {"items": [{"sku": "a"}, {"meta": {n: "forged"}}]}),
)
_RESERVED_SPELLINGS: Final = ("idempotency_key", "Idempotency-Key", "executionId",
                              "EXECUTION_ID")


def _reserved_names_refused(r: _Run) -> None:
    for spot, make in _RESERVED_SPOTS:
        for spelling in _RESERVED_SPELLINGS:
            s = r.session()
            args = {**r.c.arguments, **make(spelling)}
            try:
                r.record(s, args)
            except InvalidInput:
                pass
            else:
                r.fail(f"a call whose arguments carry {spelling!r} ({spot}) was recorded: "
                       "a model could choose the execution identity")
            r.expect(not s.ledger.state.calls,
                     f"refusing {spelling!r} ({spot}) left a call in the ledger")
    # Two calls with identical arguments are two executions: the connector must
    # key its requests on the engine's execution id, not on anything the model wrote.
    keys = []
    for _ in range(2):
        s = r.session()
        key = r.record(s)
        st = s.execute(key, r.c.call)
        r.expect(st.outcome is Outcome.APPLIED,
                 f"a plain call ended {_outcome(st.outcome)}{_err(st.error)}")
        keys.append(key)
    counts = [r.effects(k) for k in keys]
    r.expect(counts == [1, 1],
             f"two executions with the same arguments applied {counts} effects, expected "
             "[1, 1]: the connector merges executions by their arguments, not their id")


# -- idempotent -------------------------------------------------------------------


def _duplicate_applies_once(r: _Run) -> None:
    key = f"exec-{next(_sessions)}"
    first = r.c.call(r.attempt(key, 1))
    second = r.c.call(r.attempt(key, 2))
    n = r.effects(key)
    r.expect(n == 1, f"{n} effects after 2 requests with one idempotency key, expected 1")
    r.expect(second == first, f"the duplicate answered {second!r}, the original {first!r}: "
                              "a duplicate must get the original answer")


def _retry_applies_once(r: _Run) -> None:
    s = r.session()
    key = r.record(s)
    r.inject(Fault.RESET_AFTER_APPLY)
    st = s.execute(key, r.c.call)
    r.expect(st.next is Next.RETRY,
             f"after a lost answer the engine's next step is {st.next.value} (outcome "
             f"{_outcome(st.outcome)}{_err(st.error)}), expected a retry with the same key")
    st = s.execute(key, r.c.call)
    r.expect(st.outcome is Outcome.APPLIED,
             f"the retry with the same key ended {_outcome(st.outcome)}{_err(st.error)}, "
             "expected the original answer")
    n = r.effects(key)
    r.expect(n == 1, f"{n} effects after a lost answer and its retry with the same key, "
                     "expected 1")


_THREADS: Final = 8


def _concurrent_duplicates(r: _Run) -> None:
    key = f"exec-{next(_sessions)}"
    gate = threading.Barrier(_THREADS)
    answers: list[object] = []
    refused: list[str] = []
    lock = threading.Lock()

    def deliver(n: int) -> None:
        a = r.attempt(key, n)
        gate.wait()
        try:
            value = r.c.call(a)
        except NotApplied as exc:
            with lock:
                refused.append(str(exc))
        except Exception:  # unknown: the engine would retry; not this obligation's concern
            return
        else:
            with lock:
                answers.append(value)

    threads = [threading.Thread(target=deliver, args=(n,)) for n in range(1, _THREADS + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    n = r.effects(key)
    r.expect(n == 1, f"{n} effects from {_THREADS} concurrent requests with one idempotency "
                     "key, expected 1")
    r.expect(not refused, f"a concurrent duplicate was answered 'not applied' ({refused[:1]}) "
                          "while the effect was applied")
    r.expect(len({repr(a) for a in answers}) <= 1,
             f"concurrent duplicates got different answers: {answers!r}")


def _dedup_within_window(r: _Run) -> None:
    assert r.window is not None
    key = f"exec-{next(_sessions)}"
    first = r.c.call(r.attempt(key, 1))
    r.advance(r.window * 0.9)
    second = r.c.call(r.attempt(key, 2))
    n = r.effects(key)
    r.expect(n == 1, f"{n} effects for a duplicate sent {r.window * 0.9:g} s after the "
                     f"original, inside the declared retention window of {r.window:g} s: "
                     "the system forgets keys before the window ends")
    r.expect(second == first, f"the duplicate answered {second!r}, the original {first!r}")


def _retry_after_window_halts(r: _Run) -> None:
    assert r.window is not None
    store = MemoryStore()
    # The engine's side is the core's own: the tool declares the window, the
    # ledger records the first dispatch, and Recover's decision reads
    # key_retained (the protocol's RetentionWindowPasses and Decide).
    r.tool = dataclasses.replace(r.tool, retention_window=r.window)
    s = r.session(store, "expire")
    key = r.record(s)
    r.inject(Fault.RESET_AFTER_APPLY)
    st = s.execute(key, r.c.call)
    r.expect(st.outcome is Outcome.UNKNOWN, f"a lost answer ended {_outcome(st.outcome)}")
    # ExternalExpireKey: the window passes for the system and for the engine.
    r.advance(r.window * 1.5)
    [todo] = r.session(store, "expire").recover()
    decision = todo.decision
    r.expect(decision is Decision.RECOVERY_REQUIRED,
             f"after the key's retention window ({r.window:g} s) the recovery decision is "
             f"{decision.value if decision else None}: a retry now is not deduplicated "
             "(it would apply the effect again); the engine must halt for a human")
    if decision is Decision.RECOVERY_REQUIRED:
        # and why: the expired key no longer deduplicates the retry (shown, not required)
        r.expect(r.effects(key) == 1, f"{r.effects(key)} effects before any retry")


# -- idempotent: a real API's key answers (docs/protocol.md#real-apis-answers) --------


def _held_then(r: _Run, first: Fault, what: str) -> tuple[Session, str]:
    """Attempt 1 meets ``first`` and must leave a retry with the same key."""
    s = r.session()
    key = r.record(s)
    r.inject(first)
    st = s.execute(key, r.c.call)
    r.expect(st.next is Next.RETRY,
             f"after {what} the engine's next step is {st.next.value} (outcome "
             f"{_outcome(st.outcome)}{_err(st.error)}), expected a retry with the same key")
    return s, key


def _in_flight_is_unknown(r: _Run) -> None:
    s, key = _held_then(r, Fault.HOLD, "a request still in flight at the time-out")
    r.inject(Fault.IN_FLIGHT)
    st = s.execute(key, r.c.call)
    n = r.effects(key)
    r.expect(n == 0, f"{n} effect(s) before the original landed: the sandbox applied a "
                     "request scripted in_flight (it must answer 'in flight' without "
                     "applying: check the sandbox), or the connector re-sent it under a "
                     "fresh key")
    r.c.sandbox.deliver_late()  # the original, still being processed, lands
    n = r.effects(key)
    r.expect(n == 1, f"{n} effects after the system answered the retry 'in flight' and the "
                     "original landed, expected 1: the connector re-sent the request under "
                     "a fresh key (toolledger.KeyInFlight: retry with the SAME key)")
    r.expect(st.outcome is Outcome.UNKNOWN,
             f"the system answered 'in flight' (another request with this key is still "
             f"being processed) and the attempt ended {_outcome(st.outcome)}"
             f"{_err(st.error)}: only 'unknown' is true, the original may still land or "
             "fail; raise toolledger.KeyInFlight for it")


def _params_differ_is_unknown(r: _Run) -> None:
    s, key = _held_then(r, Fault.RESET_AFTER_APPLY, "a lost answer")
    r.inject(Fault.PARAMS_DIFFER)
    st = s.execute(key, r.c.call)
    n = r.effects(key)
    r.expect(n == 1, f"{n} effects after the system answered the retry 'parameters "
                     "differ', expected 1: the connector re-sent the request under a fresh "
                     "key, and the earlier attempt had been applied")
    r.expect(st.outcome is Outcome.UNKNOWN,
             f"the system answered 'parameters differ' (the key holds an earlier request, "
             f"processed with an outcome the answer does not give) and the attempt ended "
             f"{_outcome(st.outcome)}{_err(st.error)}: only 'unknown' is true; raise "
             "toolledger.KeyParamsDiffer for it (and make the request body byte-stable "
             "across attempts)")


def _replayed_failure_is_unknown(r: _Run) -> None:
    s, key = _held_then(r, Fault.FAIL_AFTER_APPLY, "a 500 answered after the request was "
                                                  "applied")
    st = s.execute(key, r.c.call)  # the system replays the stored 500
    n = r.effects(key)
    r.expect(n == 1, f"{n} effects after the system replayed the stored failure to the "
                     "retry, expected 1: the connector re-sent the request under a fresh "
                     "key (or without the key), and the failed request had been applied")
    r.expect(st.outcome is Outcome.UNKNOWN,
             f"the system replayed the stored failure of a request that had been applied, "
             f"and the attempt ended {_outcome(st.outcome)}{_err(st.error)}: only "
             "'unknown' is true; raise toolledger.ReplayedFailure for it (NotApplied only "
             "if the API guarantees its stored failure had no effect)")


# -- reconcile -----------------------------------------------------------------------


def _reconcile(r: _Run, s: Session, key: str) -> object:
    assert r.c.reconcile is not None
    answer: object = None

    def ask(call: CallRef, attempt: int) -> Any:
        nonlocal answer
        assert r.c.reconcile is not None
        answer = r.c.reconcile(call, attempt)
        return answer

    st = s.reconcile(key, ask)
    r.expect(isinstance(answer, WasApplied | NotAppliedFenced | CannotTell),
             f"reconcile answered {answer!r}: answer WasApplied(result), NotAppliedFenced() "
             f"or CannotTell(reason) (next: {st.next.value})")
    return answer


def _lost_then_reconcile(r: _Run, fault: Fault) -> tuple[Session, str]:
    s = r.session()
    key = r.record(s)
    r.inject(fault)
    st = s.execute(key, r.c.call)
    r.expect(st.next is Next.RECONCILE,
             f"after {fault.value} the engine's next step is {st.next.value} (outcome "
             f"{_outcome(st.outcome)}{_err(st.error)}), expected a reconcile")
    return s, key


def _reconcile_reports_applied(r: _Run) -> None:
    s, key = _lost_then_reconcile(r, Fault.RESET_AFTER_APPLY)
    answer = _reconcile(r, s, key)
    r.expect(isinstance(answer, WasApplied),
             f"the request was applied and its answer lost; reconcile answered {answer!r}, "
             "expected WasApplied(result)")


def _fenced_late_original_dropped(r: _Run) -> None:
    s, key = _lost_then_reconcile(r, Fault.HOLD)
    answer = _reconcile(r, s, key)
    r.expect(isinstance(answer, NotAppliedFenced),
             f"nothing was applied yet (the request is held); reconcile answered {answer!r}, "
             "expected NotAppliedFenced()")
    r.c.sandbox.deliver_late()
    n = r.effects(key)
    r.expect(n == 0, f"reconcile said 'not applied, fenced' and the late original then "
                     f"landed: {n} effect(s); a fenced attempt must be dropped")


def _fence_is_per_attempt(r: _Run) -> None:
    s, key = _lost_then_reconcile(r, Fault.HOLD)
    answer = _reconcile(r, s, key)
    r.expect(isinstance(answer, NotAppliedFenced),
             f"nothing was applied yet; reconcile answered {answer!r}")
    st = s.execute(key, r.c.call)
    r.expect(st.outcome is Outcome.APPLIED,
             f"the retry (attempt {st.attempt}) after 'not applied, fenced' ended "
             f"{_outcome(st.outcome)}{_err(st.error)}: the fence must reject attempts <= n "
             "only, not the retry")
    r.c.sandbox.deliver_late()
    n = r.effects(key)
    r.expect(n == 1, f"{n} effects after the retry and the late original, expected 1")


def _query_and_fence_atomic(r: _Run) -> None:
    s, key = _lost_then_reconcile(r, Fault.HOLD)
    r.optional("deliver_late_on_next_query")()
    answer = _reconcile(r, s, key)
    r.c.sandbox.deliver_late()  # whatever is still held lands now
    n = r.effects(key)
    if isinstance(answer, NotAppliedFenced):
        r.expect(n == 0,
                 f"the late original landed right after the system answered the status "
                 f"query, and reconcile still answered NotAppliedFenced(): {n} effect(s). "
                 "The query and the fence are two steps; make them one atomic step (one "
                 "request, one transaction) so that the retry cannot apply it twice")


def _older_epoch_refused(r: _Run) -> None:
    announce = r.c.announce_epoch
    if announce is None:
        raise InvalidInput(
            f"obligation {r.ob.id} needs Connector(announce_epoch=...): the hook "
            "Session.open(..., take_session=True, announce_epoch=...) calls with the new "
            "owner's epoch (see docs/protocol.md#concurrent-resumers)")
    store, sid = MemoryStore(), f"contract-{next(_sessions)}"
    tools = {r.c.name: r.tool}
    key = r.record(r.session(store, sid))
    stale = Session.open(store, sid, tools, take_session=True, clock=r.now)
    stale.recover()  # a resumed session decides first: execute (nothing dispatched yet)
    owner_epoch: int | None = None
    n: int | None = None
    try:
        with stale.dispatch(key) as attempt:  # dispatched is durable under the stale epoch
            # the worker is declared dead here; the new owner takes the session
            owner = Session.open(store, sid, tools, take_session=True, clock=r.now,
                                 announce_epoch=announce)
            owner_epoch = owner.epoch
            with contextlib.suppress(Exception):  # the stale worker's request leaves only now
                r.c.call(attempt)
            n = r.effects(key)
            attempt.done(None)
    except StaleState:
        pass  # the stale worker's record of its outcome is refused: the lease
    r.expect(n == 0,
             f"a request of epoch {attempt.epoch}, sent after the session's new owner "
             f"announced epoch {owner_epoch}, was applied: {n} effect(s). An epoch-aware "
             "connector must refuse a request of an older epoch than one it has seen: this "
             "one may land after a human resolved the call")
    assert owner_epoch is not None
    fresh = r.attempt(key, attempt.attempt + 1, owner_epoch)
    try:
        r.c.call(fresh)
    except Exception as exc:
        r.fail(f"the new owner's own request (epoch {owner_epoch}) raised "
               f"{type(exc).__name__}: {exc}; only OLDER epochs are refused")
    n = r.effects(key)
    r.expect(n == 1, f"{n} effect(s) after the new owner's request of epoch {owner_epoch}, "
                     "expected 1: only older epochs are refused")


# -- the catalogue --------------------------------------------------------------------


def _ob(action: str, name: str, invariant: str, promise: str,
        policies: frozenset[RecoveryPolicy], run: Callable[[_Run], None],
        windowed: bool = False, epoch_aware: bool = False) -> Obligation:
    return Obligation(action, name, invariant, promise, policies, run, windowed, epoch_aware)


OBLIGATIONS: Final[tuple[Obligation, ...]] = (
    _ob("ExternalApply", "answer_is_applied", "ResultFidelity",
        "a request the system applied and answered is classified applied, one effect",
        _PROTECTED, _answer_is_applied),
    _ob("ExternalApplyLoseAnswer", "reset_is_unknown", "ResultFidelity",
        "an applied request whose connection was reset is classified unknown",
        _PROTECTED, _lose_answer(Fault.RESET_AFTER_APPLY)),
    _ob("ExternalApplyLoseAnswer", "timeout_is_unknown", "ResultFidelity",
        "an applied request whose answer timed out is classified unknown",
        _PROTECTED, _lose_answer(Fault.TIMEOUT_AFTER_APPLY)),
    _ob("ExternalApply", "late_original_is_unknown", "ResultFidelity",
        "a request in flight at the time-out (it may land later) is classified unknown",
        _PROTECTED, _late_original_is_unknown),
    _ob("ExternalRejectDefinite", "typed_error_is_not_applied", "EventuallySettled",
        "a typed refusal, nothing applied, is classified definitely not applied",
        _PROTECTED, _typed_error_is_not_applied),
    _ob("ExternalApply", "reserved_names_refused", "ExecutionIdUnique",
        "argument names like the execution identity are refused at any depth, and the "
        "connector keys requests on the engine's execution id",
        _PROTECTED, _reserved_names_refused),
    _ob("ExternalApply", "duplicate_applies_once", "AtMostOnceEffect",
        "a second request with the idempotency key has no new effect and gets the "
        "original answer",
        _IDEMPOTENT, _duplicate_applies_once),
    _ob("ExternalApplyLoseAnswer", "retry_applies_once", "AtMostOnceEffect",
        "after a lost answer, the engine's retry with the same key has no new effect",
        _IDEMPOTENT, _retry_applies_once),
    _ob("ExternalApply", "concurrent_duplicates_apply_once", "AtMostOnceEffect",
        "concurrent deliveries of one idempotency key apply once",
        _IDEMPOTENT, _concurrent_duplicates),
    _ob("ExternalApply", "dedup_within_retention_window", "AtMostOnceEffect",
        "the system keeps the key for the whole declared retention window",
        _IDEMPOTENT, _dedup_within_window, windowed=True),
    _ob("ExternalExpireKey", "retry_after_window_halts", "AtMostOnceEffect",
        "once the window has passed the key is gone: a retry would not be deduplicated, "
        "so the recovery decision halts for a human",
        _IDEMPOTENT, _retry_after_window_halts, windowed=True),
    _ob("ExternalAnswerInFlight", "in_flight_is_unknown", "ResultFidelity",
        "an 'in flight' answer (another request with the key is being processed) is "
        "classified unknown, and the retry keeps the key: one effect once the original lands",
        _IDEMPOTENT, _in_flight_is_unknown),
    _ob("ExternalAnswerParamsDiffer", "params_differ_is_unknown", "AtMostOnceEffect",
        "a 'parameters differ' answer is classified unknown and never re-sent under a "
        "fresh key",
        _IDEMPOTENT, _params_differ_is_unknown),
    _ob("ExternalReplayFailure", "replayed_failure_is_unknown", "AtMostOnceEffect",
        "a replayed stored failure (of a request that was applied) is classified unknown "
        "and never re-sent under a fresh key",
        _IDEMPOTENT, _replayed_failure_is_unknown),
    _ob("ExternalApplyLoseAnswer", "reconcile_reports_applied", "ResultFidelity",
        "after a lost answer, reconcile reports the truth: applied, with its result",
        _RECONCILE, _reconcile_reports_applied),
    _ob("ExternalDropFenced", "fenced_late_original_dropped", "AtMostOnceEffect",
        "after 'not applied, fenced', a late original of a fenced attempt is dropped",
        _RECONCILE, _fenced_late_original_dropped),
    _ob("ExternalApply", "fence_is_per_attempt", "NoBlindReplay",
        "the fence rejects attempts <= n only: the retry (attempt n+1) applies",
        _RECONCILE, _fence_is_per_attempt),
    _ob("ExternalDropFenced", "query_and_fence_atomic", "AtMostOnceEffect",
        "the status query and the fence are one atomic step: a late original cannot "
        "land between them",
        _RECONCILE, _query_and_fence_atomic),
    _ob("ExternalDrop", "older_epoch_refused", "NoReinvokeAfterKnownOutcome",
        "once the session's new owner announced its lease epoch, a request of an older "
        "epoch (a worker declared dead that still sends) is refused, nothing applied; the "
        "owner's own request applies",
        _PROTECTED, _older_epoch_refused, epoch_aware=True),
)


def obligations_for(tool: Tool, retention_window: float | None = None, *,
                    epoch_aware: bool = False) -> list[Obligation]:
    """The obligations of a tool declared ``tool`` (with its key-retention window,
    and with a connector that knows the session owner's lease epoch)."""
    policy = RecoveryPolicy(tool.policy)
    return [ob for ob in OBLIGATIONS
            if policy in ob.policies and (retention_window is not None or not ob.windowed)
            and (epoch_aware or not ob.epoch_aware)]


def obligations_table() -> str:
    """docs/connectors.md's table of obligations (Markdown), from :data:`OBLIGATIONS`."""
    rows = ["| Test id (spec action - obligation - invariant) | Policies | The promise |",
            "| --- | --- | --- |"]
    for ob in OBLIGATIONS:
        policies = ", ".join(p.value for p in RecoveryPolicy if p in ob.policies)
        if ob.windowed:
            policies += " with a `retention_window`"
        if ob.epoch_aware:
            policies += " with `epoch_aware=True`"
        rows.append(f"| `{ob.id}` | {policies} | {ob.promise} |")
    return "\n".join(rows)


def _outcome(o: Outcome | None) -> str:
    return "with no outcome" if o is None else repr(o.value)


def _err(error: str | None) -> str:
    return f" ({error})" if error else ""


# --------------------------------------------------------------------------
# The plugin
# --------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(tool, *, retention_window=None, epoch_aware=False): generate one "
        "test per connector "
        "obligation of the tool's policy (parametrizes 'obligation'; "
        "toolledger.extra.pytest)",
    )


def _declaration(marker: pytest.Mark, where: str) -> tuple[Tool, float | None, bool]:
    args: Sequence[Any] = marker.args
    kwargs = dict(marker.kwargs)
    tool = args[0] if args else kwargs.pop("tool", None)
    window = kwargs.pop("retention_window", None)
    epoch_aware = kwargs.pop("epoch_aware", False)
    if not isinstance(epoch_aware, bool):
        raise pytest.UsageError(f"{where}: epoch_aware must be True or False (the connector "
                                f"refuses requests of an older lease epoch), got {epoch_aware!r}")
    usage = (f"@pytest.mark.{MARKER}(Tool(policy='idempotent'), retention_window=None) on "
             f"{where}")
    if isinstance(tool, str):
        tool = Tool(policy=tool)
    if not isinstance(tool, Tool) or len(args) > 1 or kwargs:
        raise pytest.UsageError(f"{where}: expected {usage}; got args={args!r}, "
                                f"kwargs={marker.kwargs!r}")
    if RecoveryPolicy(tool.policy) is RecoveryPolicy.READONLY:
        raise pytest.UsageError(f"{where}: a readonly tool has no side effect and so no "
                                "connector obligation; declare its real policy")
    if window is None:
        window = getattr(tool, "retention_window", None)
    if window is not None and (isinstance(window, bool) or not isinstance(window, int | float)
                               or window <= 0):
        raise pytest.UsageError(f"{where}: retention_window must be a positive number of "
                                f"seconds or None (deduplicates forever), got {window!r}")
    if window is not None and RecoveryPolicy(tool.policy) is not RecoveryPolicy.IDEMPOTENT:
        raise pytest.UsageError(f"{where}: retention_window is the idempotency key's; the "
                                f"tool's policy is {RecoveryPolicy(tool.policy).value!r}")
    return tool, None if window is None else float(window), epoch_aware


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is None:
        return
    where = metafunc.definition.nodeid
    if "obligation" not in metafunc.fixturenames:
        raise pytest.UsageError(f"{where} is marked {MARKER} but takes no 'obligation' "
                                "argument: def test_x(obligation, connector): "
                                "obligation.check(connector)")
    tool, window, epoch_aware = _declaration(marker, where)
    obs = [ob.bind(tool, window) for ob in obligations_for(tool, window, epoch_aware=epoch_aware)]
    metafunc.parametrize("obligation", obs, ids=[ob.id for ob in obs])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # junitxml and other reporters see which obligation and invariant each test is.
    for item in items:
        callspec = getattr(item, "callspec", None)
        ob = None if callspec is None else callspec.params.get("obligation")
        if isinstance(ob, Obligation) and item.get_closest_marker(MARKER) is not None:
            item.user_properties.append(("obligation", ob.id))
            item.user_properties.append(("spec_action", ob.action))
            item.user_properties.append(("invariant", ob.invariant))
