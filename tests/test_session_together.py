"""Session.execute_message(together=True): a message's calls in TWO commits, however many.

Under test: :meth:`toolledger.Session.execute_message` with ``together=True``
(the record commit dispatches every runnable protected call of the message;
the bodies run in order; every outcome and result goes into ONE commit).
The oracles:

- the stores' own counters (and SQLite's statement trace): a new session's
  n-call message takes exactly 2 commits on MemoryStore, SqliteStore,
  SqliteStore with group commit and PostgreSQL; so does a second message;
  calls waiting for a human, readonly calls and a resume after a crash are
  recorded in the same two commits (the resume's dispatches in one);
- crash windows, each checked by a NEW process (the store closed and
  reopened, a new Session) against the external system's own record: every
  effect at most once, every idempotent effect exactly once after resume, and
  every effect backed by a durable ``dispatched`` record;
- outcomes: definite failures ride in the one outcome commit; an unknown
  outcome has the outcomes before it recorded first, gets its recovery
  decision at once, and the calls after it still run;
- the runs with crashes are behaviours of the spec (KitRecorder, replay, TLC);
- a deliberately broken together mode (the dispatch recorded in the OUTCOME
  commit) is caught by the crash-window check and by TLC;
- a Hypothesis state machine runs messages with and without ``together``
  through crashes: no effect twice, every call settled after recover.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from test_session_fused import STORES, message, pg_store

import toolledger.check.kittrace as kt
import toolledger.check.tracecheck as tc
from checker_support import ROOT
from toolledger import (
    Attempt,
    CallStatus,
    InvalidInput,
    MemoryStore,
    Next,
    NotApplied,
    Outcome,
    Session,
    SqliteStore,
    Tool,
)
from toolledger._core.commit_plan import plan_commit
from toolledger._core.protocol import (
    Action,
    CallPosition,
    Decision,
    ResultKind,
    SessionState,
)
from toolledger._core.stores import AuditRow, Store
from toolledger._core.tools import NotAppliedFenced, WasApplied
from toolledger.check.system import successors

SID = "together"
POLICIES = ("idempotent", "manual", "reconcile")


def tools(policy: str = "idempotent") -> dict[str, Tool | str]:
    return {"send": Tool(policy, requires_approval=False)}


class External:
    """The external system's own record.  A request with an idempotency key is
    applied once per key (an email API with Idempotency-Key); one without (a
    ``manual`` or ``reconcile`` tool) is applied every time it arrives."""

    def __init__(self) -> None:
        self.effects: Counter[str] = Counter()  # execution id -> times applied
        self.requests: list[tuple[str, int]] = []  # (execution id, attempt), as received

    def body(self, a: Attempt) -> str:
        self.requests.append((a.call.key, a.attempt))
        if a.idempotency_key is None or not self.effects[a.idempotency_key]:
            self.effects[a.call.key] += 1
        return f"sent {a.call.arguments['i']}"

    def dies_at(self, k: int) -> Callable[[Attempt], str]:
        """A body that runs calls 0..k-1 and dies (the process goes away) in call k's."""

        def body(a: Attempt) -> str:
            if a.call.arguments["i"] == k:
                raise KeyboardInterrupt(f"killed in the body of call {k}")
            return self.body(a)

        return body

    def ask(self, call: Any, attempt: int) -> WasApplied | NotAppliedFenced:
        """The reconcile connector: asks this system (it fences every attempt so far)."""
        return WasApplied(f"sent {call.arguments['i']}") if self.effects[call.key] \
            else NotAppliedFenced()


def diff(before: SessionState, after: SessionState) -> list[str]:
    """What one commit made durable, per call slot: "record 0", "dispatched 0", "result 0"."""
    out = []
    for c in after.calls:
        b = before.call(c.position)
        if b is None:
            out.append(f"record {c.position[1]}")
        rb, ra = before.record(c.execution_id), after.record(c.execution_id)
        if (rb.status, rb.attempt) != (ra.status, ra.attempt):
            out.append(f"{ra.status.value} {c.position[1]}")
        if (b is None or b.result is None) and c.result is not None:
            out.append(f"result {c.position[1]}")
    return out


def commit_log(store: Store) -> list[list[str]]:
    """Every commit the store counts from now on, as :func:`diff` says it."""
    log: list[list[str]] = []
    original = store.commit

    def commit(session_id: str, before: SessionState, after: SessionState,
               *args: Any, **kwargs: Any) -> None:
        counted = store.commits
        original(session_id, before, after, *args, **kwargs)
        if store.commits > counted:
            log.append(diff(before, after))

    store.commit = commit  # type: ignore[method-assign]
    return log


class DyingSqliteStore(SqliteStore):
    """Dies (a BaseException, as a SIGKILL would stop it) just before or just after its
    ``n``-th counted commit (the fused test's CrashingSqliteStore counts every call of
    ``commit``, including the volatile steps' commits that write nothing)."""

    def __init__(self, path: Path, n: int, when: str) -> None:
        super().__init__(path)
        self.n, self.when, self.fired = n, when, False

    def commit(
        self,
        session_id: str,
        before: SessionState,
        after: SessionState,
        audit_rows: Sequence[AuditRow],
        *,
        arguments: Mapping[CallPosition, Mapping[str, Any]] | None = None,
        epoch: int | None = None,
        create: bool = False,
    ) -> None:
        if (self.when == "before" and self.commits + 1 == self.n
                and not plan_commit(session_id, before, after, audit_rows, arguments).empty):
            raise KeyboardInterrupt(f"killed before commit {self.n}")
        super().commit(session_id, before, after, audit_rows, arguments=arguments,
                       epoch=epoch, create=create)
        if self.when == "after" and self.commits == self.n and not self.fired:
            self.fired = True
            raise KeyboardInterrupt(f"killed after commit {self.n}")


def slots(what: str, n: int) -> list[str]:
    return [f"{what} {i}" for i in range(n)]


def per_call(n: int, *what: str) -> list[str]:
    return [f"{w} {i}" for i in range(n) for w in what]


def outcomes(n: int) -> list[str]:
    return per_call(n, "succeeded", "result")


# -- 1. commit counts ------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 3, 5])
@pytest.mark.parametrize("kind", sorted(STORES))
def test_a_new_sessions_message_takes_two_commits(tmp_path: Path, kind: str, n: int) -> None:
    store = STORES[kind](tmp_path)
    try:
        ext = External()
        s = Session.open(store, SID, tools(), lazy_create=True)
        assert store.commits == 0 and store.sessions() == []
        statements: list[str] = []
        if isinstance(store, SqliteStore) and kind == "sqlite":
            store.connection.set_trace_callback(statements.append)
        log = commit_log(store)
        out = s.execute_message(1, message(n), ext.body, together=True)
        assert [o.next for o in out] == [Next.RESULT] * n
        assert [o.outcome for o in out] == [Outcome.APPLIED] * n
        assert (store.commits, store.ledger_commits) == (2, 2)
        if statements:
            assert sum(1 for x in statements if x.strip().upper() == "COMMIT") == 2
        # every dispatched is durable before any body ran; every result comes after
        assert log == [per_call(n, "record", "dispatched"), outcomes(n)]
        assert ext.effects == Counter({o.key: 1 for o in out}) and len(ext.requests) == n
        assert all(x.next is Next.RESULT for x in Session.open(store, SID, tools()).recover())
    finally:
        store.close()


@pytest.mark.parametrize("n", [1, 3, 5])
def test_postgres_a_new_sessions_message_takes_two_commits(pg_cluster: Any, n: int) -> None:
    store, ext = pg_store(pg_cluster), External()
    try:
        s = Session.open(store, SID, tools(), lazy_create=True)
        assert store.sessions() == []
        out = s.execute_message(1, message(n), ext.body, together=True)
        assert [o.next for o in out] == [Next.RESULT] * n
        assert (store.commits, store.ledger_commits) == (2, 2)
        assert ext.effects == Counter({o.key: 1 for o in out})
        before = store.commits
        out = s.execute_message(2, message(n), ext.body, together=True)
        assert [o.next for o in out] == [Next.RESULT] * n and store.commits - before == 2
        assert all(x.next is Next.RESULT for x in Session.open(store, SID, tools()).recover())
    finally:
        store.close()


@pytest.mark.parametrize("kind", sorted(STORES))
def test_the_second_message_takes_two_commits_too(tmp_path: Path, kind: str) -> None:
    store, ext = STORES[kind](tmp_path), External()
    try:
        s = Session.open(store, SID, tools(), lazy_create=True)
        s.execute_message(1, message(3), ext.body, together=True)
        before = store.commits
        out = s.execute_message(2, message(4), ext.body, together=True)
        assert [o.next for o in out] == [Next.RESULT] * 4
        assert store.commits - before == 2
        assert len(ext.effects) == 7 and set(ext.effects.values()) == {1}
    finally:
        store.close()


def test_a_call_needing_approval_is_left_waiting_and_the_others_run_together() -> None:
    store, ext = MemoryStore(), External()
    ts: dict[str, Tool | str] = {"send": Tool("idempotent", requires_approval=False),
                                 "pay": Tool("manual")}
    s = Session.open(store, SID, ts, lazy_create=True)
    log = commit_log(store)
    calls = [{"id": "a", "name": "pay", "arguments": {"i": 9}}, *message(2)]
    out = s.execute_message(1, calls, ext.body, together=True)
    assert [o.next for o in out] == [Next.AWAIT_APPROVAL, Next.RESULT, Next.RESULT]
    assert [o.outcome for o in out] == [None, Outcome.APPLIED, Outcome.APPLIED]
    assert store.commits == 2
    assert log == [["record 0", "record 1", "dispatched 1", "record 2", "dispatched 2"],
                   ["succeeded 1", "result 1", "succeeded 2", "result 2"]]
    assert set(ext.effects) == {out[1].key, out[2].key}
    assert [c.key for c in s.pending_approvals()] == [out[0].key]
    assert out[0].attempt == 0  # never dispatched


def test_a_readonly_call_runs_with_no_dispatch() -> None:
    store, ext = MemoryStore(), External()
    ts: dict[str, Tool | str] = {"look": Tool("readonly", requires_approval=False),
                                 "send": Tool("idempotent", requires_approval=False)}
    s = Session.open(store, SID, ts, lazy_create=True)
    log = commit_log(store)
    calls = [{"id": "r", "name": "look", "arguments": {"i": 0}},
             {"id": "c1", "name": "send", "arguments": {"i": 1}}]
    out = s.execute_message(1, calls, ext.body, together=True)
    assert [o.next for o in out] == [Next.RESULT, Next.RESULT]
    assert store.commits == 2
    # the readonly call is never dispatched; its answer joins the outcome commit
    assert log == [["record 0", "record 1", "dispatched 1"],
                   ["result 0", "succeeded 1", "result 1"]]
    assert [r.execution_id for r in store.audit(SID) if r.kind == "dispatch"] == [out[1].key]
    assert out[0].attempt == 0 and out[0].result is not None
    assert ext.requests == [(out[0].key, 1), (out[1].key, 1)]


def test_a_resumed_message_dispatches_its_runnable_calls_in_one_commit(tmp_path: Path) -> None:
    ext, path, n = External(), tmp_path / "r.sqlite3", 3
    first = DyingSqliteStore(path, 1, "after")  # dies right after the record commit
    s = Session.open(first, SID, tools(), lazy_create=True)
    with pytest.raises(KeyboardInterrupt):
        s.execute_message(1, message(n), ext.body, together=True)
    first.close()
    with SqliteStore(path) as store:
        log = commit_log(store)
        out = Session.open(store, SID, tools(), lazy_create=True).execute_message(
            1, message(n), ext.body, together=True)
        assert [o.next for o in out] == [Next.RESULT] * n
        assert [o.attempt for o in out] == [2] * n
        dispatching = [c for c in log if any(x.startswith("dispatched") for x in c)]
        assert dispatching == [slots("dispatched", n)]  # one commit for the n retries
        assert log[-1] == outcomes(n)
        # the n recovery decisions (as recover() makes them): one commit, before it
        assert len(log) == 3, log
        assert ext.requests == [(o.key, 2) for o in out]


# -- 2. crash windows --------------------------------------------------------------------


def durable_dispatches(store: Store) -> dict[str, int]:
    """Execution id -> the highest attempt whose dispatched is durable (the store's audit)."""
    out: dict[str, int] = {}
    for r in store.audit(SID):
        if r.kind == "dispatch":
            out[r.execution_id] = max(out.get(r.execution_id, 0), r.attempt)
    return out


def check_no_effect_without_a_durable_dispatch(store: Store, ext: External) -> None:
    """Every request the external system received has its attempt's dispatched durable."""
    durable = durable_dispatches(store) if SID in store.sessions() else {}
    missing = [(e, a) for e, a in ext.requests if durable.get(e, 0) < a]
    assert not missing, f"effects with no durable dispatched record: {missing}"


def check_at_most_once(ext: External) -> None:
    twice = {e: k for e, k in ext.effects.items() if k > 1}
    assert not twice, f"effects applied twice: {twice}"


def crash(tmp: Path, policy: str, n: int, *, commit: int | None = None, when: str = "after",
          body: int | None = None) -> tuple[External, Path]:
    """A first process runs message 1 together and dies: around commit ``commit``, or in
    the body of call ``body``; its store is closed.  Nothing else survives."""
    ext, path = External(), tmp / f"{policy}-{commit}-{when}-{body}.sqlite3"
    store: SqliteStore = (DyingSqliteStore(path, commit, when) if commit is not None
                          else SqliteStore(path))
    s = Session.open(store, SID, tools(policy), lazy_create=True)
    fn = ext.dies_at(body) if body is not None else ext.body
    try:
        with pytest.raises(KeyboardInterrupt):
            s.execute_message(1, message(n), fn, together=True)
    finally:
        store.close()
    return ext, path


@pytest.mark.parametrize("policy", POLICIES)
def test_a_crash_before_the_first_commit_leaves_nothing(tmp_path: Path, policy: str) -> None:
    ext, path = crash(tmp_path, policy, 3, commit=1, when="before")
    assert ext.requests == []
    with SqliteStore(path) as store:
        assert store.sessions() == []  # not even the session
        out = Session.open(store, SID, tools(policy), lazy_create=True).execute_message(
            1, message(3), ext.body, together=True)
        assert [(o.next, o.attempt) for o in out] == [(Next.RESULT, 1)] * 3
        assert ext.effects == Counter({o.key: 1 for o in out})
        check_no_effect_without_a_durable_dispatch(store, ext)


@pytest.mark.parametrize("n", [1, 3])
def test_idempotent_crash_after_the_first_commit_retries_all_under_their_keys(
    tmp_path: Path, n: int
) -> None:
    ext, path = crash(tmp_path, "idempotent", n, commit=1)
    assert ext.requests == []  # no body ran
    with SqliteStore(path) as store:
        assert durable_dispatches(store) and set(durable_dispatches(store).values()) == {1}
        s = Session.open(store, SID, tools("idempotent"))
        decided = s.recover()
        assert [(x.next, x.decision, x.recovered) for x in decided] == [
            (Next.RETRY, Decision.RETRY_SAME_ID, True)] * n
        out = s.execute_message(1, message(n), ext.body, together=True)
        assert [(o.next, o.attempt, o.outcome) for o in out] == [
            (Next.RESULT, 2, Outcome.APPLIED)] * n
        assert ext.requests == [(o.key, 2) for o in out]
        assert ext.effects == Counter({o.key: 1 for o in out})
        check_no_effect_without_a_durable_dispatch(store, ext)


def test_manual_crash_after_the_first_commit_halts_every_call(tmp_path: Path) -> None:
    ext, path = crash(tmp_path, "manual", 3, commit=1)
    with SqliteStore(path) as store:
        out = Session.open(store, SID, tools("manual"), lazy_create=True).execute_message(
            1, message(3), ext.body, together=True)
        assert [(o.next, o.attempt) for o in out] == [(Next.HALTED, 1)] * 3
        assert ext.requests == []  # nothing sent, let alone twice
        assert len(Session.open(store, SID, tools("manual")).halted()) == 3


def test_reconcile_crash_after_the_first_commit_asks_for_every_call(tmp_path: Path) -> None:
    ext, path = crash(tmp_path, "reconcile", 3, commit=1)
    with SqliteStore(path) as store:
        s = Session.open(store, SID, tools("reconcile"))
        out = s.execute_message(1, message(3), ext.body, together=True)
        assert [o.next for o in out] == [Next.RECONCILE] * 3
        asked: list[tuple[str, int]] = []

        def ask(call: Any, attempt: int) -> WasApplied | NotAppliedFenced:
            asked.append((call.key, attempt))
            return ext.ask(call, attempt)

        answers = [s.reconcile(o.key, ask) for o in out]
        assert asked == [(o.key, 1) for o in out]
        assert [a.next for a in answers] == [Next.RETRY] * 3  # never applied, fenced
        done = [s.execute(o.key, ext.body) for o in out]
        assert [(d.next, d.attempt) for d in done] == [(Next.RESULT, 2)] * 3
        check_at_most_once(ext)
        assert len(ext.effects) == 3
        check_no_effect_without_a_durable_dispatch(store, ext)


@pytest.mark.parametrize("k", [1, 2])
def test_idempotent_crash_in_the_middle_applies_each_effect_once(tmp_path: Path,
                                                                 k: int) -> None:
    n = 4
    ext, path = crash(tmp_path, "idempotent", n, body=k)
    assert [a for _, a in ext.requests] == [1] * k  # bodies 0..k-1 ran, k.. did not
    with SqliteStore(path) as store:
        check_no_effect_without_a_durable_dispatch(store, ext)
        out = Session.open(store, SID, tools("idempotent"), lazy_create=True).execute_message(
            1, message(n), ext.body, together=True)
        assert [(o.next, o.attempt) for o in out] == [(Next.RESULT, 2)] * n
        check_at_most_once(ext)
        assert ext.effects == Counter({o.key: 1 for o in out})  # exactly once each
        check_no_effect_without_a_durable_dispatch(store, ext)


def test_manual_crash_in_the_middle_halts_all_and_sends_nothing_twice(tmp_path: Path) -> None:
    n, k = 4, 2
    ext, path = crash(tmp_path, "manual", n, body=k)
    with SqliteStore(path) as store:
        check_no_effect_without_a_durable_dispatch(store, ext)
        s = Session.open(store, SID, tools("manual"), lazy_create=True)
        out = s.execute_message(1, message(n), ext.body, together=True)
        assert [o.next for o in out] == [Next.HALTED] * n
        assert len(ext.requests) == k
        check_at_most_once(ext)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_crash_after_the_outcome_commit_leaves_every_result(tmp_path: Path,
                                                              policy: str) -> None:
    ext, path = crash(tmp_path, policy, 3, commit=2)
    with SqliteStore(path) as store:
        assert all(x.next is Next.RESULT for x in Session.open(store, SID, tools(policy))
                   .recover())
        out = Session.open(store, SID, tools(policy)).execute_message(
            1, message(3), ext.body, together=True)  # the turn re-run: nothing runs
        assert [(o.next, o.attempt) for o in out] == [(Next.RESULT, 1)] * 3
        assert len(ext.requests) == 3 and ext.effects == Counter({o.key: 1 for o in out})
        check_no_effect_without_a_durable_dispatch(store, ext)


# -- 3. outcomes -------------------------------------------------------------------------


def test_a_definite_failure_rides_in_the_one_outcome_commit() -> None:
    store, ext = MemoryStore(), External()
    s = Session.open(store, SID, tools(), lazy_create=True)
    log = commit_log(store)

    def body(a: Attempt) -> str:
        if a.call.arguments["i"] == 1:
            raise NotApplied("the API refused the request")
        return ext.body(a)

    out = s.execute_message(1, message(3), body, together=True)
    assert [o.outcome for o in out] == [Outcome.APPLIED, Outcome.NOT_APPLIED, Outcome.APPLIED]
    assert [o.next for o in out] == [Next.RESULT] * 3
    assert out[1].result is not None and out[1].result.kind is ResultKind.ERROR
    assert "the API refused the request" in (out[1].error or "")
    assert store.commits == 2
    assert log[1] == ["succeeded 0", "result 0", "failed 1", "result 1",
                      "succeeded 2", "result 2"]


@pytest.mark.parametrize(("policy", "nxt", "decision"), [
    ("idempotent", Next.RETRY, Decision.RETRY_SAME_ID),
    ("manual", Next.HALTED, Decision.RECOVERY_REQUIRED),
    ("reconcile", Next.RECONCILE, Decision.RECONCILE),
])
def test_an_unknown_outcome_is_decided_after_the_earlier_outcomes_are_recorded(
    policy: str, nxt: Next, decision: Decision
) -> None:
    store, ext = MemoryStore(), External()
    s = Session.open(store, SID, tools(policy), lazy_create=True)
    log = commit_log(store)

    def body(a: Attempt) -> str:
        if a.call.arguments["i"] == 1:
            raise TimeoutError("no answer")
        return ext.body(a)

    out = s.execute_message(1, message(3), body, together=True)
    assert [o.outcome for o in out] == [Outcome.APPLIED, Outcome.UNKNOWN, Outcome.APPLIED]
    assert [o.next for o in out] == [Next.RESULT, nxt, Next.RESULT]
    assert out[1].error == "TimeoutError: no answer"
    # the decision was applied by this call, as execute_message without together says
    assert (out[1].decision, out[1].recovered) == (decision, True)
    assert log[0] == per_call(3, "record", "dispatched")
    assert log[1] == ["succeeded 0", "result 0"]  # call 0's outcome first
    assert log[-1] == ["succeeded 2", "result 2"]  # call 2 still ran
    assert len(ext.requests) == 2
    # the same message without together reports the same statuses
    plain = Session.open(MemoryStore(), SID, tools(policy), lazy_create=True).execute_message(
        1, message(3), body)
    assert [(o.next, o.outcome, o.decision, o.recovered) for o in plain] == [
        (o.next, o.outcome, o.decision, o.recovered) for o in out]


# -- 4. bad input --------------------------------------------------------------------------


def test_bad_input_writes_nothing_and_creates_no_session() -> None:
    store, ext = MemoryStore(), External()
    s = Session.open(store, SID, tools(), lazy_create=True)
    with pytest.raises(InvalidInput, match="together must be True or False, got 'yes'"):
        s.execute_message(1, message(2), ext.body, together="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="fn must be a callable"):
        s.execute_message(1, message(2), "send", together=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="together must be True or False"):
        s.execute_message(1, message(2), ext.body, together=1)  # type: ignore[arg-type]
    assert store.commits == 0 and store.sessions() == [] and ext.requests == []
    # the session is still usable: the same message runs afterwards
    out = s.execute_message(1, message(2), ext.body, together=True)
    assert [o.next for o in out] == [Next.RESULT] * 2 and store.commits == 2


# -- 5. the runs are behaviours of the spec (TLC) -------------------------------------------


def events_of(entries: Sequence[kt.Logged]) -> list[list[str]]:
    """The committed batches of a recording (volatile single steps left out)."""
    volatile = {Action.EngineInvokeAdapter, Action.ExternalApply, Action.EngineTimeout,
                Action.EngineInvokeReadonly, Action.ExternalRejectDefinite}
    return [[ev.action.value for ev in e.events] for e in entries
            if e.events and not (len(e.events) == 1 and e.events[0].action in volatile)]


@pytest.mark.slow
def test_together_commits_are_consecutive_spec_steps_tlc_replays_them(tmp_path: Path) -> None:
    n = 2
    with kt.KitRecorder() as rec:
        clean = External()
        with SqliteStore(tmp_path / "clean.sqlite3") as store:
            Session.open(store, SID, tools(), lazy_create=True).execute_message(
                1, message(n), clean.body, together=True)
    first = rec.of(SID)
    with kt.KitRecorder() as rec:
        ext, path = crash(tmp_path, "idempotent", n, body=1)
        with SqliteStore(path) as store:
            out = Session.open(store, SID, tools(), lazy_create=True).execute_message(
                1, message(n), ext.body, together=True)
    second = rec.of(SID)
    assert [o.next for o in out] == [Next.RESULT] * n and len(ext.effects) == n
    record = ["ProviderEmitCall"] * n + ["EnginePersistCall"] * n + [
        "EnginePersistDispatched"] * n
    outcome = ["EngineRecordSucceeded", "EngineAppendResult"] * n
    assert events_of(first) == [record, outcome]
    batches = events_of(second)
    assert batches[0] == record and batches[-1] == outcome
    assert ["EnginePersistDispatched"] * n in batches  # the resume's dispatches, together
    cfg = kt.kit_config([first, second])
    runs = [kt.replay(cfg, first), kt.replay(cfg, second)]
    names = [a for a, _ in runs[1]]
    assert "Crash" in names and "Recover" in names
    result = tc.validate_traces(ROOT, cfg, [tc.trace_of(cfg, r, origin=f"together {i}")
                                            for i, r in enumerate(runs)])
    assert result.ok, result.describe() + "\n" + result.tlc.output[-2000:]


# -- 6. a broken together mode is caught -------------------------------------------------------


@pytest.fixture
def dispatch_in_the_outcome_commit(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Broken on purpose: together mode records the dispatches in the OUTCOME commit.

    The record commit dispatches nothing; the message's dispatches (stepped
    before the bodies, as the session must) are held back by the store and
    written with the next commit that writes something: the outcomes.  So the
    bodies run before their dispatched is durable.
    """
    record = Session._record

    def no_dispatch(self: Session, seq: int | None, calls: Sequence[Mapping[str, Any]],
                    requires_approval: Sequence[bool | None] | None, *,
                    dispatch: str, **kw: Any) -> list[CallStatus]:
        return record(self, seq, calls, requires_approval,
                      dispatch="none" if dispatch == "all" else dispatch, **kw)

    together = Session._execute_together
    running: list[bool] = []  # non-empty while a message runs together

    def flagged(self: Session, keys: list[str],
                fn: Callable[[Attempt], object]) -> list[CallStatus]:
        running.append(True)
        try:
            return together(self, keys, fn)
        finally:
            running.pop()

    commit = SqliteStore.commit
    held: dict[int, tuple[SessionState, list[Any]]] = {}

    def holding(self: SqliteStore, session_id: str, before: SessionState,
                after: SessionState, rows: Sequence[Any], **kwargs: Any) -> None:
        if (running and rows and all(r.kind == "dispatch" for r in rows)
                and not kwargs.get("create")):
            start = held.get(id(self), (before, []))[0]
            held[id(self)] = (start, [*held.get(id(self), (before, []))[1], *rows])
            return
        if id(self) in held and not plan_commit(session_id, before, after, rows).empty:
            start, earlier = held.pop(id(self))
            commit(self, session_id, start, after, [*earlier, *rows], **kwargs)
            return
        commit(self, session_id, before, after, rows, **kwargs)

    close = SqliteStore.close

    def closing(self: SqliteStore) -> None:  # what was held dies with the process
        held.pop(id(self), None)
        close(self)

    monkeypatch.setattr(Session, "_record", no_dispatch)
    monkeypatch.setattr(Session, "_execute_together", flagged)
    monkeypatch.setattr(SqliteStore, "commit", holding)
    monkeypatch.setattr(SqliteStore, "close", closing)
    yield


@pytest.mark.usefixtures("dispatch_in_the_outcome_commit")
def test_the_broken_variant_still_takes_two_commits_but_the_crash_check_finds_it(
    tmp_path: Path,
) -> None:
    # crash-free it looks fine: two commits, every effect once
    with SqliteStore(tmp_path / "ok.sqlite3") as store:
        ext = External()
        out = Session.open(store, SID, tools("manual"), lazy_create=True).execute_message(
            1, message(3), ext.body, together=True)
        assert [o.next for o in out] == [Next.RESULT] * 3 and store.commits == 2
    # idempotent: the effects of the first process have no durable record
    ext, path = crash(tmp_path, "idempotent", 3, body=2)
    with SqliteStore(path) as store, pytest.raises(AssertionError,
                                                   match="no durable dispatched record"):
        check_no_effect_without_a_durable_dispatch(store, ext)
    # manual: the resumed process sends the first two again
    ext, path = crash(tmp_path, "manual", 3, body=2)
    with SqliteStore(path) as store:
        Session.open(store, SID, tools("manual"), lazy_create=True).execute_message(
            1, message(3), ext.body, together=True)
    with pytest.raises(AssertionError, match="effects applied twice"):
        check_at_most_once(ext)


@pytest.mark.slow
@pytest.mark.usefixtures("dispatch_in_the_outcome_commit")
def test_tlc_rejects_the_trace_of_the_broken_variant(tmp_path: Path) -> None:
    with kt.KitRecorder() as rec:
        ext, path = crash(tmp_path, "idempotent", 2, body=1)
        with SqliteStore(path) as store:
            Session.open(store, SID, tools(), lazy_create=True).execute_message(
                1, message(2), ext.body, together=True)
    entries = rec.of(SID)
    cfg = kt.kit_config([entries])
    with pytest.raises(kt.ReplayError, match=r"entry \d+: the ledger kept .* in memory"):
        kt.replay(cfg, entries)  # the checker's own replay cannot follow it
    # the run as the implementation lived it: up to the crash, then what the new
    # process found durable (the calls recorded, none dispatched)
    restart = [i for i, e in enumerate(entries) if e.start][1]
    run = kt.replay(cfg, entries[:restart])
    crashed = next(s for a, s in successors(cfg, run[-1][1]) if a is Action.Crash)
    run.append((Action.Crash.value, replace(crashed, session=entries[restart].state)))
    result = tc.validate_traces(ROOT, cfg, [tc.trace_of(cfg, run, origin="broken together")])
    assert not result.ok
    assert result.failure is not None and result.failure.action == "Crash"
    assert result.failure.step == len(run) - 1


# -- 7. Hypothesis: messages with and without together, through crashes ---------------------


class MessageMachine(RuleBasedStateMachine):
    """One session on a SqliteStore file; every rule is a process that may die."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="toolledger-together-"))
        self.path = self.dir / "s.sqlite3"
        self.ext = External()
        self.ts: dict[str, Tool | str] = {p: Tool(p, requires_approval=False)
                                          for p in POLICIES}
        self.seq = 0
        self.pending: list[dict[str, Any]] | None = None  # the message of the last turn
        self.nonce = 0

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def _process(self, act: Callable[[Session], object],
                 die_at_commit: int | None = None) -> None:
        store = (DyingSqliteStore(self.path, die_at_commit, "after")
                 if die_at_commit is not None else SqliteStore(self.path))
        try:
            s = Session.open(store, SID, self.ts, lazy_create=True)
            with contextlib.suppress(KeyboardInterrupt):  # the process died
                act(s)
        finally:
            store.close()

    def _open(self) -> list[CallPosition]:
        with SqliteStore(self.path) as store:
            if SID not in store.sessions():
                return []
            return [c.position for c in store.load(SID).calls if c.result is None]

    def _body(self, die_in: int | None) -> Callable[[Attempt], str]:
        def body(a: Attempt) -> str:
            if a.call.arguments["n"] == die_in:
                raise KeyboardInterrupt
            return self.ext.body(a)
        return body

    @precondition(lambda self: not self._open())
    @rule(policies=st.lists(st.sampled_from(POLICIES), min_size=1, max_size=4),
          together=st.booleans(), die_in=st.none() | st.integers(0, 3),
          die_at_commit=st.none() | st.integers(1, 3))
    def turn(self, policies: list[str], together: bool, die_in: int | None,
                die_at_commit: int | None) -> None:
        self.seq += 1
        calls = []
        for i, p in enumerate(policies):
            calls.append({"id": f"c{i}", "name": p, "arguments": {"i": i, "n": self.nonce + i}})
        kill = None if die_in is None or die_in >= len(policies) else self.nonce + die_in
        self.nonce += len(policies)
        self.pending = calls
        seq = self.seq
        self._process(lambda s: s.execute_message(seq, calls, self._body(kill),
                                                  together=together),
                      die_at_commit=die_at_commit)

    @precondition(lambda self: self.pending is not None)
    @rule(together=st.booleans())
    def resume(self, together: bool) -> None:
        """A new process re-runs the last message from its conversation."""
        calls, seq = self.pending, self.seq
        assert calls is not None
        self._process(lambda s: s.execute_message(seq, calls, self.ext.body,
                                                  together=together))

    @precondition(lambda self: bool(self._open()))
    @rule()
    def settle(self) -> None:
        """A new process recovers and acts on every call: retry, reconcile, a human."""
        with SqliteStore(self.path) as store:
            s = Session.open(store, SID, self.ts)
            for x in s.recover():
                if x.next in (Next.RETRY, Next.EXECUTE):  # EXECUTE: never dispatched
                    s.execute(x.key, self.ext.body)
                elif x.next is Next.RECONCILE:
                    # "not applied, fenced" is not durable: the retry follows in this process
                    if s.reconcile(x.key, self.ext.ask).next is Next.RETRY:
                        s.execute(x.key, self.ext.body)
                elif x.next is Next.HALTED:
                    # the human looks at the external system's record
                    applied = self.ext.effects[x.key] > 0
                    s.resolve(x.key, "applied" if applied else "abandon",
                              result="checked" if applied else None)

    @invariant()
    def no_effect_twice_and_each_backed_by_a_dispatch(self) -> None:
        check_at_most_once(self.ext)
        if self.path.exists():
            with SqliteStore(self.path) as store:
                check_no_effect_without_a_durable_dispatch(store, self.ext)

    def settled_after_recover(self) -> None:
        for _ in range(3):
            if not self._open():
                break
            self.settle()
        assert not self._open(), f"unsettled after recover: {self._open()}"


class SettlingMachine(MessageMachine):
    @invariant()
    def every_call_settles(self) -> None:
        # checked on a copy of the file: the run itself goes on from where it was
        saved = self.dir / "copy.sqlite3"
        if not self.path.exists():
            return
        shutil.copyfile(self.path, saved)
        ext = Counter(self.ext.effects)
        requests = list(self.ext.requests)
        path = self.path
        try:
            self.path = saved
            self.settled_after_recover()
            check_at_most_once(self.ext)
        finally:
            self.path = path
            self.ext.effects, self.ext.requests = ext, requests
            saved.unlink()


def test_messages_with_and_without_together_through_crashes() -> None:
    profile = settings()
    run_state_machine_as_test(SettlingMachine, settings=settings(
        profile, max_examples=max(10, profile.max_examples // 20),
        stateful_step_count=min(profile.stateful_step_count, 8),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        deadline=None))


@pytest.mark.usefixtures("dispatch_in_the_outcome_commit")
def test_the_machine_finds_the_broken_variant() -> None:
    """The machine bites: with the dispatch in the outcome commit it finds an effect
    applied twice, or one with no durable dispatched record."""
    with pytest.raises(AssertionError, match=r"applied twice|no durable dispatched record"):
        run_state_machine_as_test(SettlingMachine, settings=settings(
            max_examples=60, stateful_step_count=8, derandomize=True, database=None,
            deadline=None, report_multiple_bugs=False, suppress_health_check=list(HealthCheck),
            phases=[Phase.generate]))
