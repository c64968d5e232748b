"""A real API's key answers are unknown outcomes (issue 25, point 5).

Under test: the core takes "in flight", "parameters differ" and a replayed
failure (the spec's ``ExternalAnswerInFlight``, ``ExternalAnswerParamsDiffer``,
``ExternalReplayFailure``; docs/protocol.md#real-apis-answers) only as the
answer of the attempt an idempotent call waits for, and resumes the call as
after a time-out; the closed world reaches all three on the twins' model (one
idempotent call, no crash, 2 attempts: seconds) with every invariant holding,
and a core that takes a key answer for success breaks ``ResultFidelity``
(the spec's twin ``InFlightAsApplied``); the Session classifies the typed
exceptions a tool raises for them as unknown whatever its hooks say.  The
fresh-key twins (``*NewKey``) are the adapter's mistake, not the core's: the
connector kit catches them (tests/test_extra_pytest.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest

from toolledger import (
    Attempt,
    KeyAnswer,
    KeyInFlight,
    KeyParamsDiffer,
    MemoryStore,
    Next,
    Outcome,
    ReplayedFailure,
    Session,
    Tool,
)
from toolledger._core import protocol as p
from toolledger.check.invariants import check_all
from toolledger.check.mapping import spec_key, to_spec
from toolledger.check.system import CallConfig, ModelConfig, SystemState, initial_states, successors

A = p.Action
POS = (1, 0)
KEY_ANSWERS = (A.ExternalAnswerInFlight, A.ExternalAnswerParamsDiffer, A.ExternalReplayFailure)


def _one_call(policy: p.RecoveryPolicy = p.RecoveryPolicy.IDEMPOTENT) -> ModelConfig:
    """The twins' model (model/InFlightAsApplied.cfg): one call, no crash, 2 attempts."""
    tool = p.ToolProfile(f"{policy.value}_tool_c1", policy, False)
    return ModelConfig(calls=(CallConfig("c1", POS, "call_0", tool, ("a1",)),),
                       marker=0, max_crashes=0, max_attempts=2, key_answers=True)


def _explore(cfg: ModelConfig) -> tuple[set[str], set[str]]:
    """Every action taken and every invariant violated in the model's closed world."""
    seen: set[object] = set()
    todo: list[SystemState] = list(initial_states(cfg))
    actions: set[str] = set()
    violated: set[str] = set()
    while todo:
        s = todo.pop()
        key = spec_key(to_spec(cfg, s))
        if key in seen:
            continue
        seen.add(key)
        violated |= set(check_all(cfg, s))
        for action, nxt in successors(cfg, s):
            actions.add(str(action))
            todo.append(nxt)
    return actions, violated


@contextmanager
def key_answer_taken_for_success() -> Iterator[None]:
    """Broken: a key answer is taken for the request's success ("409: already
    done"), the spec's InFlightAsApplied twin."""
    handlers = p._HANDLERS
    originals = {a: handlers[a] for a in KEY_ANSWERS}

    def broken(state: p.SessionState, ev: p.Event) -> p.SessionState:
        nxt = originals[ev.action](state, ev)
        c = nxt.call(ev.position) if ev.position else None
        assert c is not None
        return nxt._with_call(replace(c, stage=p.Stage.GOT_OK))

    for a in originals:
        handlers[a] = broken
    try:
        yield
    finally:
        handlers.update(originals)


def _waiting(policy: p.RecoveryPolicy, attempts: int = 1) -> p.SessionState:
    """One call dispatched and invoked ``attempts`` times (timed out and retried
    in between): it waits for attempt ``attempts``."""
    cfg = _one_call(policy)
    (cc,) = cfg.calls
    s = initial_states(cfg)[0].session
    s = p.apply(s, p.Event(A.ProviderEmitCall, POS, cc.tool_call_id, cc.tool, cc.digest("a1")))
    s = p.apply(s, p.Event(A.EnginePersistCall, POS))
    for n in range(attempts):
        if n:
            s = p.apply(s, p.Event(A.EngineTimeout, POS))
            s = p.apply(s, p.Event(A.Recover, POS))
        s = p.apply(s, p.Event(A.EnginePersistDispatched, POS))
        s = p.apply(s, p.Event(A.EngineInvokeAdapter, POS))
    return s


def _stage(s: p.SessionState) -> p.Stage:
    c = s.call(POS)
    assert c is not None
    return c.stage


@pytest.mark.parametrize("answer", KEY_ANSWERS)
def test_a_key_answer_resumes_the_waiting_call_as_a_time_out(answer: p.Action) -> None:
    s = _waiting(p.RecoveryPolicy.IDEMPOTENT, attempts=2)
    after = p.apply(s, p.Event(answer, POS, attempt=2))
    assert _stage(after) is p.Stage.RESUME
    assert after == p.apply(s, p.Event(A.EngineTimeout, POS))
    # the answer of another attempt, or one to a call that does not wait, is refused
    assert not p.enabled(s, p.Event(answer, POS, attempt=1))
    assert not p.enabled(after, p.Event(answer, POS, attempt=2))


@pytest.mark.parametrize("policy", [p.RecoveryPolicy.MANUAL, p.RecoveryPolicy.RECONCILE])
def test_only_a_request_with_a_key_gets_a_key_answer(policy: p.RecoveryPolicy) -> None:
    s = _waiting(policy)
    for answer in KEY_ANSWERS:
        with pytest.raises(p.ProtocolError, match="only an idempotent tool's request"):
            p.apply(s, p.Event(answer, POS, attempt=1))


def test_the_closed_world_reaches_every_key_answer_and_keeps_every_invariant() -> None:
    actions, violated = _explore(_one_call())
    assert {a.value for a in KEY_ANSWERS} <= actions
    assert violated == set()


def test_a_core_taking_a_key_answer_for_success_breaks_result_fidelity() -> None:
    """InFlightAsApplied in Python: an ok result for an effect that never happened."""
    with key_answer_taken_for_success():
        _, violated = _explore(_one_call())
    assert "ResultFidelity" in violated, violated


# -- the adapter seam: what a tool body raises --------------------------------------


def _session(tool: Tool) -> tuple[Session, str]:
    s = Session.open(MemoryStore(), "s", {"pay": tool})
    [st] = s.record(1, [{"id": "call_0", "name": "pay", "arguments": {"amount": 1}}])
    return s, st.key


@pytest.mark.parametrize("exc", [KeyInFlight("409: a request with this key is in progress"),
                                 KeyParamsDiffer("idempotency_error: parameters differ"),
                                 ReplayedFailure("500 replayed for this key")])
def test_a_key_answer_is_unknown_whatever_the_tools_hooks_say(exc: KeyAnswer) -> None:
    """Even a classify hook that answers NOT_APPLIED, and a marks_send tool that
    raised before sending(), do not make a key answer definite."""

    def says_not_applied(e: Exception, sent: bool) -> Outcome:
        return Outcome.NOT_APPLIED

    tool = Tool(policy="idempotent", requires_approval=False, marks_send=True,
                classify=says_not_applied)
    s, key = _session(tool)

    def body(a: Attempt) -> Any:
        raise exc

    st = s.execute(key, body)
    assert st.outcome is Outcome.UNKNOWN
    assert st.next is Next.RETRY  # the same key again, never a fresh one
    seen: list[str | None] = []

    def retry(a: Attempt) -> str:
        seen.append(a.idempotency_key)
        return "ok"

    st = s.execute(key, retry)
    assert st.outcome is Outcome.APPLIED and seen == [key]


def test_trace_validation_quantifies_every_action_as_the_specs_next_does() -> None:
    """The trace modules step with each action's disjunct of Next, quantifier
    and all (a key answer ranges over ExecIds, not Calls)."""
    from checker_support import ROOT
    from toolledger.check.tracecheck import _STEP

    spec = (ROOT / "spec" / "DurableToolExecution.tla").read_text()
    body = spec.split("\nNext ==", 1)[1].split("\n\n", 1)[0]
    disjuncts = {line.strip()[3:] for line in body.splitlines() if line.strip().startswith("\\/")}
    assert disjuncts == set(_STEP.values())
