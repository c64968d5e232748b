"""Session.execute_message(concurrency=w): a message's bodies run up to w at once.

Under test: :meth:`toolledger.Session.execute_message` with ``concurrency``
(per-call outcomes, and ``together=True``).  Bodies are synchronised with
barriers and events, never timed.  The oracles:

- overlap: a barrier of w parties completes only if w bodies run at once, and
  a gauge says no more than w ever do; a sequential run breaks the barrier;
- durability: every body reads the store (a second handle, a restarted
  engine's view) and finds its call ``dispatched`` at its attempt before it
  does anything; a variant that starts the body before its dispatch is caught;
- commits (the store's counter): n + 1 per-call, 2 together, for every w, and
  never more than the sequential path's for the same outcomes;
- a crash (BaseException) in one body while the others run: nothing more is
  recorded, a new session recovers every call, no effect twice;
- an exception in one body, and a session error in one worker while a
  sibling runs: every other outcome recorded (a variant dropping it is caught);
- a store refusing each commit in turn (the harness of
  ``tests/test_session_errors.py``): outcomes committed before it stay, no
  effect twice after recovery;
- a run with a chained dispatch and a crash is a behaviour of the spec (TLC).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_session_errors import External as ErrorsExternal
from test_session_errors import RefusingStore, judge
from test_session_errors import tools as manual_tools
from test_session_together import events_of

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
    SessionInterrupted,
    SqliteStore,
    Tool,
)
from toolledger._core.protocol import LedgerStatus
from toolledger._core.stores import StoreError

SID = "concurrent"
FORMS = (False, True)  # together
WAIT = 10.0  # a barrier's timeout: only reached when the code under test is broken


def tools(policy: str = "idempotent") -> dict[str, Tool | str]:
    return {"send": Tool(policy, requires_approval=False)}


def message(n: int) -> list[dict[str, Any]]:
    return [{"id": f"c{i}", "name": "send", "arguments": {"i": i}} for i in range(n)]


class External:
    """The external system, thread-safe: applies once per idempotency key (or per
    request, without one) and keeps what it returned."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.effects: Counter[str] = Counter()
        self.returned: dict[str, str] = {}

    def apply(self, a: Attempt) -> str:
        with self.lock:
            if a.idempotency_key is None or not self.effects[a.call.key]:
                self.effects[a.call.key] += 1
            self.returned[a.call.key] = f"sent {a.call.arguments['i']}"
            return self.returned[a.call.key]


class Gauge:
    """Bodies that meet at a barrier of ``w`` parties (the first w calls) and count
    how many run at once."""

    def __init__(self, w: int, ext: External, timeout: float = WAIT) -> None:
        self.w, self.ext = w, ext
        self.barrier = threading.Barrier(w, timeout=timeout)
        self.lock = threading.Lock()
        self.now = self.most = 0

    def body(self, a: Attempt) -> str:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            if a.call.arguments["i"] < self.w:
                self.barrier.wait()  # completes only with w bodies inside at once
            return self.ext.apply(a)
        finally:
            with self.lock:
                self.now -= 1


def run(s: Session, n: int, fn: Callable[[Attempt], object], *, together: bool,
        w: int, seq: int = 1) -> list[CallStatus]:
    return s.execute_message(seq, message(n), fn, together=together, concurrency=w)


def results(out: list[CallStatus]) -> list[str | None]:
    return [o.result.content if o.result is not None else None for o in out]


# -- 1. bodies overlap, at most w at once ---------------------------------------------------


@pytest.mark.parametrize("together", FORMS)
@pytest.mark.parametrize(("n", "w"), [(2, 2), (4, 4), (5, 2), (3, 8)])
def test_w_bodies_run_at_once_and_never_more(together: bool, n: int, w: int) -> None:
    ext = External()
    gauge = Gauge(min(w, n), ext)
    out = run(Session.open(MemoryStore(), SID, tools()), n, gauge.body, together=together, w=w)
    assert results(out) == [f"sent {i}" for i in range(n)]  # in the message's order
    assert [o.outcome for o in out] == [Outcome.APPLIED] * n
    assert gauge.most == min(w, n)


def test_the_overlap_check_catches_a_sequential_run() -> None:
    # concurrency=1 (today's path): the first body waits at the barrier for a second
    # one that never comes; the barrier breaks and no call is applied as it should be
    ext = External()
    gauge = Gauge(2, ext, timeout=0.2)
    out = run(Session.open(MemoryStore(), SID, tools()), 2, gauge.body, together=False, w=1)
    assert gauge.most == 1
    assert [o.outcome for o in out] != [Outcome.APPLIED] * 2


def test_bad_concurrency_is_refused_before_anything_is_written() -> None:
    store = MemoryStore()
    s = Session.open(store, SID, tools(), lazy_create=True)
    for bad in (0, -1, 2.0, True, "2", None):
        with pytest.raises(InvalidInput, match="concurrency must be an int >= 1"):
            run(s, 2, External().apply, together=False, w=bad)  # type: ignore[arg-type]
    assert store.commits == 0 and store.sessions() == []


def test_the_callers_context_variables_reach_the_bodies() -> None:
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="none")
    var.set("turn-7")
    seen: list[str] = []

    def body(a: Attempt) -> str:
        seen.append(var.get())
        return "ok"

    run(Session.open(MemoryStore(), SID, tools()), 3, body, together=False, w=3)
    assert seen == ["turn-7"] * 3


# -- 2. dispatched is durable before each body --------------------------------------------


class DurableCheck:
    """Each body reads the store through a second handle: its call must be durable as
    dispatched at this attempt before the request leaves."""

    def __init__(self, path: Path, ext: External, refuse: frozenset[int] = frozenset()) -> None:
        self.reader = SqliteStore(path)
        self.ext, self.refuse = ext, refuse
        self.problems: list[str] = []
        self.lock = threading.Lock()

    def body(self, a: Attempt) -> str:
        rec = self.reader.load(SID).record(a.call.key)
        if (rec.status, rec.attempt) != (LedgerStatus.DISPATCHED, a.attempt):
            with self.lock:
                self.problems.append(f"{a.call.key} attempt {a.attempt} started with "
                                     f"{rec.status.value} {rec.attempt} durable")
        if a.call.arguments["i"] in self.refuse and a.attempt == 1:
            raise NotApplied("refused")  # the next call then dispatches in its own commit
        return self.ext.apply(a)


ONE, ALL = frozenset({1}), frozenset(range(5))  # the calls refused at their first attempt


def durable_run(tmp_path: Path, together: bool, w: int, refuse: frozenset[int] = ONE
                ) -> DurableCheck:
    path = tmp_path / "d.sqlite3"
    with SqliteStore(path) as store:
        check = DurableCheck(path, External(), refuse=refuse)
        s = Session.open(store, SID, tools(), lazy_create=True)
        run(s, 5, check.body, together=together, w=w)
        # a resumed message: its first w calls dispatched in one commit, before any body
        crashed = DurableCheck(path, External())

        def dies(a: Attempt) -> str:
            if a.call.arguments["i"] == 0:
                raise KeyboardInterrupt("killed")
            return crashed.body(a)

        with pytest.raises(KeyboardInterrupt):
            run(s, 5, dies, together=together, w=1, seq=2)
    with SqliteStore(path) as store:
        s = Session.open(store, SID, tools())
        out = run(s, 5, crashed.body, together=together, w=w, seq=2)
        assert [o.next for o in out] == [Next.RESULT] * 5
    check.problems += crashed.problems
    return check


@pytest.mark.parametrize("together", FORMS)
@pytest.mark.parametrize("w", [2, 5])
@pytest.mark.parametrize("refuse", [ONE, ALL])
def test_every_body_starts_after_its_dispatched_is_durable(tmp_path: Path, together: bool,
                                                           w: int, refuse: frozenset[int]
                                                           ) -> None:
    assert durable_run(tmp_path, together, w, refuse).problems == []


def test_the_durability_check_catches_a_body_started_before_its_dispatch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Broken on purpose: a worker starts the request before it dispatches the call
    (to overlap the dispatch's sync with the network call), then records its value."""
    execute = Session.execute

    def early(self: Session, key: str, fn: Callable[[Attempt], object]) -> CallStatus:
        c = self._find(key)
        rec = self._ledger.state.record(key)
        due = rec.attempt if rec.status is LedgerStatus.DISPATCHED else rec.attempt + 1
        key_ = key if c.tool.policy.value == "idempotent" else None
        try:
            value = fn(Attempt(self._ref(c), due, key_, None))
        except Exception as exc:
            err = exc

            def again(a: Attempt) -> object:
                raise err

            return execute(self, key, again)
        return execute(self, key, lambda a: value)

    monkeypatch.setattr(Session, "execute", early)
    # every first attempt refused: no success chains the next call's dispatched, so
    # each worker's next call is one it must dispatch itself, whatever the threads'
    # order (with one refusal, a fast sibling could chain them all: no early start)
    problems = durable_run(tmp_path, False, 2, ALL).problems
    assert any("started with" in p for p in problems), problems


# -- 3. commits -------------------------------------------------------------------------


def commits(together: bool, w: int, n: int, fn: Callable[[Attempt], object],
            policy: str = "idempotent") -> tuple[int, list[CallStatus]]:
    store = MemoryStore()
    s = Session.open(store, SID, tools(policy), lazy_create=True)
    out = run(s, n, fn, together=together, w=w)
    return store.commits, out


@pytest.mark.parametrize("together", FORMS)
@pytest.mark.parametrize("n", [2, 5])
def test_a_message_of_n_protected_calls_costs_what_it_did(together: bool, n: int) -> None:
    for w in range(1, n + 2):
        got, out = commits(together, w, n, External().apply)
        assert [o.next for o in out] == [Next.RESULT] * n
        assert got == (2 if together else n + 1), (w, got)


def outcome_body(fails: dict[int, str]) -> Callable[[Attempt], object]:
    ext = External()

    def body(a: Attempt) -> str:
        how = fails.get(a.call.arguments["i"])
        if how == "not applied":
            raise NotApplied("refused")
        if how == "unknown":
            ext.apply(a)
            raise TimeoutError("the answer was lost")
        return ext.apply(a)

    return body


OUTCOMES = [{}, {0: "not applied"}, {1: "not applied"}, {3: "not applied"},
            {0: "unknown"}, {2: "unknown"}, {0: "not applied", 1: "unknown", 2: "not applied"}]


@pytest.mark.parametrize("together", FORMS)
@pytest.mark.parametrize("fails", OUTCOMES, ids=str)
def test_never_more_commits_than_the_sequential_path(together: bool,
                                                      fails: dict[int, str]) -> None:
    sequential, seq_out = commits(together, 1, 4, outcome_body(fails))
    for w in (2, 3, 4):
        got, out = commits(together, w, 4, outcome_body(fails))
        assert got <= sequential, (w, got, sequential)
        assert [(o.next, o.outcome) for o in out] == [(o.next, o.outcome) for o in seq_out]


# -- 4. a crash in one body while the others run -----------------------------------------


class Crash(BaseException):
    """The process goes away (as SIGKILL would stop it)."""


def until(cond: Callable[[], bool]) -> None:
    """Wait (polling) until ``cond`` holds; a broken session makes it time out."""
    done = threading.Event()
    for _ in range(int(WAIT * 1000)):
        if cond():
            return
        done.wait(0.001)
    raise AssertionError("waited in vain: the session never got there")


@pytest.mark.parametrize("together", FORMS)
@pytest.mark.parametrize("policy", ["idempotent", "manual"])
def test_a_crash_in_one_body_records_nothing_more(tmp_path: Path, together: bool,
                                                  policy: str) -> None:
    """Call 0 ends first (per-call: its outcome is committed); then call 1 dies while
    calls 2 and 3 are inside their bodies; they apply their effect after the crash and
    end, unrecorded, as a killed process would leave them."""
    path, ext, n = tmp_path / "c.sqlite3", External(), 4
    store = SqliteStore(path)
    s = Session.open(store, SID, tools(policy), lazy_create=True)
    inside = threading.Barrier(3, timeout=WAIT)  # calls 1, 2, 3 in their bodies at once

    def body(a: Attempt) -> str:
        i = a.call.arguments["i"]
        if i == 0:
            return ext.apply(a)
        inside.wait()
        if i == 1:
            if together:
                until(lambda: "sent 0" in ext.returned.values())
            else:  # call 0's outcome is durable before the crash
                until(lambda: store.load(SID).calls[0].result is not None)
            raise Crash("killed in call 1")
        until(lambda: s._interrupted_by is not None)  # the crash is taken first
        return ext.apply(a)

    with pytest.raises(Crash, match="killed in call 1"):
        run(s, n, body, together=together, w=n)
    assert len(ext.returned) == 3  # calls 0, 2 and 3 applied their effect
    with pytest.raises(SessionInterrupted, match=r"\(Crash in call "):
        s.recover()  # the crash's own account, not an abandoned sibling's
    store.close()
    with SqliteStore(path) as store:
        state = store.load(SID)
        kept = {c.position[1] for c in state.calls if c.result is not None}
        assert kept == (set() if together else {0})
        assert all(state.record(c.execution_id).status is LedgerStatus.DISPATCHED
                   for c in state.calls if c.position[1] not in kept)
        s2 = Session.open(store, SID, tools(policy))
        todo = {st.key: st.next for st in s2.recover() if st.result is None}
        assert set(todo) == {c.execution_id for c in state.calls
                             if c.position[1] not in kept}
        assert set(todo.values()) == ({Next.RETRY} if policy == "idempotent"
                                      else {Next.HALTED})
        for key in todo:
            if todo[key] is Next.RETRY:
                s2.execute(key, ext.apply)
    assert set(ext.effects.values()) == {1}  # no effect twice (idempotent: under its key)
    if policy == "idempotent":
        assert len(ext.effects) == n


# -- 5. an exception in one body, a session error in one worker ----------------------------


@pytest.mark.parametrize("together", FORMS)
@pytest.mark.parametrize("how", ["not applied", "unknown"])
def test_an_exception_in_one_body_keeps_every_other_outcome(together: bool, how: str) -> None:
    n = 4
    gauge_ext = External()
    inside = threading.Barrier(n, timeout=WAIT)

    def body(a: Attempt) -> str:
        inside.wait()  # every body is running when call 1 raises
        if a.call.arguments["i"] == 1:
            if how == "unknown":
                gauge_ext.apply(a)
                raise TimeoutError("the answer was lost")
            raise NotApplied("refused")
        return gauge_ext.apply(a)

    store = MemoryStore()
    out = run(Session.open(store, SID, tools(), lazy_create=True), n, body,
              together=together, w=n)
    assert results(out)[:1] + results(out)[2:] == ["sent 0", "sent 2", "sent 3"]
    assert out[1].outcome is (Outcome.NOT_APPLIED if how == "not applied"
                              else Outcome.UNKNOWN)
    assert out[1].next is (Next.RESULT if how == "not applied" else Next.RETRY)
    durable = store.load(SID)
    assert [c.result is not None for c in durable.calls] == [True, how == "not applied",
                                                             True, True]


@pytest.fixture
def failing_start(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """The session's own step fails when call 1 starts; the event is set then."""
    original, failed = Session._start, threading.Event()

    def start(self: Session, key: str) -> Any:
        if self._find(key).position[1] == 1:
            failed.set()
            raise RuntimeError("injected: the session failed starting call 1")
        return original(self, key)

    monkeypatch.setattr(Session, "_start", start)
    return failed


def sibling_running_at_the_error(failed: threading.Event, together: bool
                                 ) -> tuple[RefusingStore, ErrorsExternal]:
    """Calls 0 and 1 start at once; call 1's start fails while call 0's body runs."""
    store, ext = RefusingStore(0), ErrorsExternal()

    def body(a: Attempt) -> str:
        assert failed.wait(WAIT)
        return ext.body(a)

    s = Session.open(store, "errors", manual_tools())
    with pytest.raises(RuntimeError, match="injected"):
        s.execute_message(1, [{"id": f"c{i}", "name": "send", "arguments": {"i": i}}
                              for i in range(3)], body, together=together, concurrency=2)
    return store, ext


@pytest.mark.parametrize("together", FORMS)
def test_a_session_error_in_one_worker_keeps_the_running_siblings_outcome(
    failing_start: threading.Event, monkeypatch: pytest.MonkeyPatch, together: bool
) -> None:
    store, ext = sibling_running_at_the_error(failing_start, together)
    assert list(ext.returned.values()) == ["sent 0"]  # call 0 ran
    monkeypatch.undo()
    state = store.load("errors")
    assert state.calls[0].result is not None  # kept
    # call 2 never started: not dispatched (together: dispatched with the message)
    assert state.calls[2].result is None and state.record(state.calls[2].execution_id
                                                          ).status is (
        LedgerStatus.DISPATCHED if together else LedgerStatus.NONE)
    assert judge(store, ext) == []


def test_the_check_catches_a_worker_that_drops_a_siblings_outcome_on_error(
    failing_start: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Broken on purpose: once the run has stopped on an error, a worker drops the
    outcome of the call it was running instead of committing it."""
    commit = Session._commit_outcome

    def dropping(self: Session, run: Any, key: str, st: CallStatus) -> Any:
        if run.stopped:
            self._deferred.pop(key, None)
            return st, None
        return commit(self, run, key, st)

    monkeypatch.setattr(Session, "_commit_outcome", dropping)
    store, ext = sibling_running_at_the_error(failing_start, False)
    monkeypatch.undo()
    problems = judge(store, ext)
    assert any("dispatched with no result" in p for p in problems), problems


# -- 6. a store refusing each commit in turn -------------------------------------------------


class Ordered:
    """Bodies that all start at once, then end in the message's order: call i returns
    only once a commit about call i-1 was attempted after its body ended (or a commit
    was refused)."""

    def __init__(self, store: RefusingStore, ext: ErrorsExternal, n: int, together: bool):
        self.ext, self.together = ext, together
        self.ended = [threading.Event() for _ in range(n)]
        self.refused = threading.Event()
        self.returned_at_refusal: set[str] = set()
        commit = store.commit

        def watching(session_id: str, before: Any, after: Any, *args: Any, **kw: Any) -> None:
            try:
                commit(session_id, before, after, *args, **kw)
            except StoreError:
                self.returned_at_refusal = set(ext.returned)
                self.refused.set()
                raise
            finally:  # every call whose body ended and that this commit changed
                for c in after.calls:
                    if c.execution_id in ext.effects and c != before.call(c.position):
                        self.ended[c.position[1]].set()

        store.commit = watching  # type: ignore[method-assign]

    def body(self, a: Attempt) -> str:
        i = a.call.arguments["i"]
        if i > 0 and not self.together:
            while not (self.ended[i - 1].wait(0.001) or self.refused.is_set()):
                pass
        return self.ext.body(a)


def ordered_commits(together: bool, unknown: int | None) -> int:
    store = RefusingStore(0)
    ext = ErrorsExternal(unknown)
    s = Session.open(store, "errors", manual_tools())
    s.execute_message(1, [{"id": f"c{i}", "name": "send", "arguments": {"i": i}}
                          for i in range(3)], Ordered(store, ext, 3, together).body,
                      together=together, concurrency=3)
    return store.writing


def store_cases() -> list[tuple[bool, int | None, int]]:
    return [(together, unknown, n) for together in FORMS for unknown in (None, 1)
            for n in range(1, ordered_commits(together, unknown) + 1)]


@pytest.mark.parametrize(("together", "unknown", "n"), store_cases())
def test_a_refused_commit_anywhere_loses_no_committed_outcome(together: bool,
                                                              unknown: int | None,
                                                              n: int) -> None:
    store, ext = RefusingStore(n), ErrorsExternal(unknown)
    ordered = Ordered(store, ext, 3, together)
    with pytest.raises(StoreError, match="injected"):
        Session.open(store, "errors", manual_tools()).execute_message(
            1, [{"id": f"c{i}", "name": "send", "arguments": {"i": i}} for i in range(3)],
            ordered.body, together=together, concurrency=3)
    # a body still running when the refusal reloaded the session ends unrecorded (its
    # call dispatched-and-unknown, as after a crash): judge the others strictly
    late = set(ext.returned) - ordered.returned_at_refusal
    for k in late:
        del ext.returned[k]
    assert judge(store, ext) == []


def test_the_store_matrix_is_not_empty() -> None:
    assert {(t, u): ordered_commits(t, u) for t in FORMS for u in (None, 1)} == {
        (False, None): 4, (False, 1): 4, (True, None): 2, (True, 1): 4}


# -- 7. the runs are behaviours of the spec (TLC) -------------------------------------------


@pytest.mark.slow
def test_concurrent_runs_with_a_chain_and_a_crash_are_spec_behaviours(tmp_path: Path) -> None:
    n, w = 3, 2
    with kt.KitRecorder() as rec, SqliteStore(tmp_path / "clean.sqlite3") as store:
        run(Session.open(store, SID, tools(), lazy_create=True), n, External().apply,
            together=False, w=w)
    clean = rec.of(SID)
    # the first two dispatched with the record; the first success carries call 2's
    assert events_of(clean)[0][-2:] == ["EnginePersistDispatched"] * 2
    assert ["EngineRecordSucceeded", "EngineAppendResult",
            "EnginePersistDispatched"] in events_of(clean)
    ext = External()
    with kt.KitRecorder() as rec:
        path = tmp_path / "crash.sqlite3"
        with SqliteStore(path) as store:
            s = Session.open(store, SID, tools(), lazy_create=True)

            def dies(a: Attempt) -> str:
                if a.call.arguments["i"] == 1:
                    until(lambda: store.load(SID).calls[0].result is not None)
                    raise Crash("killed in call 1")
                return ext.apply(a)

            with pytest.raises(Crash):
                run(s, n, dies, together=False, w=w)
        with SqliteStore(path) as store:
            s = Session.open(store, SID, tools())
            for st in s.recover():
                if st.next in (Next.EXECUTE, Next.RETRY):
                    s.execute(st.key, ext.apply)
            out = run(s, n, ext.apply, together=True, w=w)
            assert [o.next for o in out] == [Next.RESULT] * n
    crashed = rec.of(SID)
    cfg = kt.kit_config([clean, crashed])
    runs = [kt.replay(cfg, clean), kt.replay(cfg, crashed)]
    assert "Crash" in [a for a, _ in runs[1]]
    result = tc.validate_traces(ROOT, cfg, [tc.trace_of(cfg, r, origin=f"concurrent {i}")
                                            for i, r in enumerate(runs)])
    assert result.ok, result.describe() + "\n" + result.tlc.output[-2000:]
