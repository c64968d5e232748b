"""The asyncio API (:mod:`toolledger._core.async_session`): Session's promises, awaited.

Under test: :class:`toolledger.AsyncSession` on MemoryStore, SqliteStore files
and a real PostgreSQL server (``pg_cluster``; a crash is a new session on a new
store handle: what a restarted process sees).

- the sync API's main behaviours: 2 commits per protected call, 0 ledger
  commits per readonly one; the outcome classification (return, NotApplied,
  the send marker, unknown); a ``BaseException`` in the body is a crash
  (reopen, recover, retry under the same key); halt and resolve; reconcile
  (a sync or an async ``ask``); ``dispatch`` as an async context manager;
  ``execute_many`` / ``execute_message`` with their commit counts (the same as
  the sync API's); bad input refused with nothing written; the runs are runs
  of the spec's closed-world model (``kittrace.replay``);
- **the event loop is never blocked by the ledger**: no store call runs on the
  loop's thread, and while a commit is held in its worker thread another
  coroutine runs (it is what lets the commit go: a commit on the loop's thread
  could never be let go); the same two checks fail for the synchronous
  Session called from a coroutine (the control);
- concurrent sessions on one loop: four conversations whose commits are all in
  flight at once (a barrier no serial design can pass) keep correct,
  independent ledgers;
- what cancellation means: in the body, during the ``dispatched`` commit,
  while waiting in the lane, during the outcome commit, in ``execute_message``.

No test asserts on elapsed time: every waiting is on an event.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from checker_support import Watched, watched
from pg_cluster import PgCluster
from toolledger import (
    AsyncSession,
    Attempt,
    CallRef,
    CallStatus,
    CannotTell,
    Decision,
    InvalidInput,
    MemoryStore,
    Next,
    NotApplied,
    Outcome,
    PostgresStore,
    ResultKind,
    Session,
    SessionInterrupted,
    SqliteStore,
    Tool,
    WasApplied,
)
from toolledger._core.stores import Store
from toolledger.check import kittrace as kt

SID = "s1"
TOOL = "send_email"
CALL = {"id": "call_0", "name": TOOL, "arguments": {"to": "ada@example.com"}}
PATIENCE = 30.0  # seconds an event is waited for before the test fails (never when it works)


class Crash(BaseException):
    """The process dies here (a BaseException: nothing may catch it)."""


def run(main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return asyncio.run(main())


# --------------------------------------------------------------------------
# Stores: a new handle is a restarted process
# --------------------------------------------------------------------------


class Backend:
    def __init__(self, name: str, open_: Callable[[], Store]) -> None:
        self.name = name
        self._open = open_
        self.opened: list[Store] = []

    def open(self) -> Store:
        store = self._open()
        self.opened.append(store)
        return store


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "memory":
        memory = MemoryStore()
        b = Backend("memory", lambda: memory)
    elif request.param == "sqlite":
        b = Backend("sqlite", lambda: SqliteStore(tmp_path / "ledger.db"))
    else:
        cluster: PgCluster = request.getfixturevalue("pg_cluster")
        schema = f"t_{uuid.uuid4().hex[:16]}"
        b = Backend("postgres", lambda: PostgresStore(cluster.conninfo, schema=schema))
    yield b
    for store in b.opened:
        store.close()


def counts(store: Store) -> tuple[int, int]:
    return store.commits, store.ledger_commits


async def one_call(s: AsyncSession, seq: int = 1, call: dict[str, Any] = CALL) -> str:
    [status] = await s.record(seq, [call])
    if status.next is Next.AWAIT_APPROVAL:
        status = await s.approve(status.key)
    assert status.next is Next.EXECUTE, status
    return status.key


async def sent(a: Attempt) -> str:
    a.sending()
    await asyncio.sleep(0)  # a real await: the body gives the loop away
    return f"sent to {a.arguments['to']} as {a.idempotency_key}"


# --------------------------------------------------------------------------
# The sync API's main behaviours
# --------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["manual", "idempotent", "reconcile"])
def test_a_protected_call_costs_two_commits_a_readonly_one_no_ledger_commit(
    backend: Backend, policy: str
) -> None:
    async def main() -> None:
        store = backend.open()
        s = await AsyncSession.open(store, SID, {TOOL: policy, "read": "readonly"})
        key = await one_call(s)
        before = counts(store)
        done = await s.execute(key, sent)
        assert counts(store) == (before[0] + 2, before[1] + 2)
        assert (done.next, done.outcome, done.attempt) == (Next.RESULT, Outcome.APPLIED, 1)
        key_ = key if policy == "idempotent" else None
        assert done.tool_message()["content"] == f"sent to ada@example.com as {key_}"
        [read] = await s.record(2, [{"id": "r", "name": "read", "arguments": {}}])
        before = counts(store)
        got = await s.execute(read.key, lambda a: "file text")  # a plain function
        assert counts(store) == (before[0] + 1, before[1])  # the result only
        assert got.tool_message()["content"] == "file text"

    run(main)


def test_a_coroutine_body_runs_on_the_loop_a_plain_one_in_a_thread() -> None:
    async def main() -> None:
        loop_thread = threading.get_ident()
        s = await AsyncSession.open(MemoryStore(), SID, {TOOL: Tool("idempotent", False)})
        where: dict[str, tuple[bool, bool]] = {}

        async def on_loop(a: Attempt) -> str:
            where["async"] = (threading.get_ident() == loop_thread, caller is not None and
                              asyncio.current_task() is caller)
            return "a"

        def in_thread(a: Attempt) -> str:
            where["plain"] = (threading.get_ident() == loop_thread, False)
            return "p"

        async def later(a: Attempt) -> str:
            return "returned an awaitable"

        caller = asyncio.current_task()
        keys = [await one_call(s, seq, {**CALL, "id": f"c{seq}"}) for seq in (1,)]
        assert (await s.execute(keys[0], on_loop)).tool_message()["content"] == "a"
        k2 = await one_call(s, 2, {**CALL, "id": "c2"})
        assert (await s.execute(k2, in_thread)).tool_message()["content"] == "p"
        k3 = await one_call(s, 3, {**CALL, "id": "c3"})
        got = await s.execute(k3, lambda a: later(a))  # a lambda returning a coroutine
        assert got.tool_message()["content"] == "returned an awaitable"
        assert where == {"async": (True, True), "plain": (False, False)}
        # execute_message: a plain body in the method's own thread, a coroutine on the loop
        threads: dict[str, bool] = {}

        def plain_body(a: Attempt) -> str:
            threads["plain"] = threading.get_ident() == loop_thread
            return "p"

        async def async_body(a: Attempt) -> str:
            threads["async"] = threading.get_ident() == loop_thread
            return "a"

        await s.execute_message(4, [{**CALL, "id": "c4"}], plain_body)
        await s.execute_message(5, [{**CALL, "id": "c5"}], async_body)
        assert threads == {"plain": False, "async": True}

    run(main)


def test_the_outcome_is_classified_as_the_sync_api_does() -> None:
    async def main() -> list[tuple[Next, Outcome | None, ResultKind | None]]:
        out: list[tuple[Next, Outcome | None, ResultKind | None]] = []
        tools = {TOOL: Tool("manual", requires_approval=False, marks_send=True)}
        bodies: list[Callable[[Attempt], Awaitable[object]]] = []

        async def refused(a: Attempt) -> object:
            a.sending()
            raise NotApplied("550 mailbox unknown")

        async def before_send(a: Attempt) -> object:
            raise ConnectionError("no route")  # marks_send: the request never left

        async def after_send(a: Attempt) -> object:
            a.sending()
            raise TimeoutError("no answer")  # unknown: manual halts

        bodies += [refused, before_send, after_send]
        for i, body in enumerate(bodies):
            s = await AsyncSession.open(MemoryStore(), f"s{i}", tools)
            st = await s.execute(await one_call(s), body)
            out.append((st.next, st.outcome, st.result.kind if st.result else None))
        return out

    assert run(main) == [
        (Next.RESULT, Outcome.NOT_APPLIED, ResultKind.ERROR),
        (Next.RESULT, Outcome.NOT_APPLIED, ResultKind.ERROR),
        (Next.HALTED, Outcome.UNKNOWN, None),
    ]


def test_dispatch_is_an_async_context_manager() -> None:
    async def main() -> None:
        s = await AsyncSession.open(MemoryStore(), SID, {TOOL: Tool("idempotent", False)})
        key = await one_call(s)
        async with s.dispatch(key) as a:
            await asyncio.sleep(0)
            a.done({"id": a.idempotency_key, "attempt": a.attempt})
        assert a.status is not None and a.status.next is Next.RESULT
        assert a.status.tool_message()["content"] == f'{{"id": "{key}", "attempt": 1}}'
        key = await one_call(s, 2)
        async with s.dispatch(key) as a:
            raise NotApplied("refused")  # recorded, not re-raised
        assert a.status is not None and a.status.outcome is Outcome.NOT_APPLIED
        key = await one_call(s, 3)
        with pytest.raises(RuntimeError, match="without done"):
            async with s.dispatch(key) as a:
                a.sending()
        assert a.status is not None and (a.status.next, a.status.outcome) == (
            Next.RETRY, Outcome.UNKNOWN)

    run(main)


def test_bad_input_is_refused_with_nothing_written() -> None:
    async def main() -> None:
        store = MemoryStore()
        s = await AsyncSession.open(store, SID, {TOOL: "manual"})
        key = await one_call(s)
        before = counts(store)
        with pytest.raises(InvalidInput, match="fn must be a callable"):
            await s.execute(key, cast(Any, "not callable"))
        with pytest.raises(InvalidInput, match="must be a"):
            await s.execute_many(cast(Any, [(key, "not callable")]))
        with pytest.raises(InvalidInput, match="ask must be a callable"):
            await s.reconcile(key, cast(Any, None))
        with pytest.raises(InvalidInput, match="no open or recent call"):
            await s.execute("no such key", sent)
        with pytest.raises(TypeError, match="unexpected keyword"):
            await s.record(2, [CALL], no_such_keyword=True)  # type: ignore[call-arg]
        assert counts(store) == before
        assert (await s.status(key)).next is Next.EXECUTE  # the approval is not used up

    run(main)


def test_a_crash_in_the_body_then_reopen_recover_and_retry_with_the_same_key(
    backend: Backend,
) -> None:
    keys: list[str | None] = []

    async def dies(a: Attempt) -> str:
        keys.append(a.idempotency_key)
        a.sending()
        raise Crash("the process dies before the outcome is recorded")

    async def main() -> None:
        store = backend.open()
        s = await AsyncSession.open(store, SID, {TOOL: "idempotent"})
        key = await one_call(s)
        before = counts(store)
        with pytest.raises(Crash):
            await s.execute(key, dies)
        assert counts(store) == (before[0] + 1, before[1] + 1)  # the dispatch only
        with pytest.raises(SessionInterrupted, match="open a new Session"):
            await s.recover()
        s = await AsyncSession.open(backend.open(), SID, {TOOL: "idempotent"})
        [todo] = await s.recover()
        assert (todo.next, todo.decision, todo.attempt) == (Next.RETRY, Decision.RETRY_SAME_ID, 1)
        done = await s.execute(todo.key, sent)
        assert (done.next, done.attempt) == (Next.RESULT, 2)
        keys.append(key)
        assert done.tool_message()["content"].endswith(key)
        assert keys == [key, key]  # both attempts carried the execution id

    run(main)


def test_a_keyboard_interrupt_in_the_body_stops_the_loop_and_records_nothing(
    tmp_path: Path,
) -> None:
    db = tmp_path / "ledger.db"
    tools = {TOOL: "idempotent"}

    async def interrupted(a: Attempt) -> str:
        a.sending()
        raise KeyboardInterrupt

    async def main() -> None:
        s = await AsyncSession.open(SqliteStore(db), SID, tools)
        await s.execute(await one_call(s), interrupted)

    with pytest.raises(KeyboardInterrupt):
        run(main)  # out of asyncio.run, as a Ctrl-C does
    store = SqliteStore(db)  # a new process
    try:
        [todo] = Session.open(store, SID, tools).recover()
        assert (todo.next, todo.attempt, todo.recovered) == (Next.RETRY, 1, True)
    finally:
        store.close()


def test_a_halted_call_is_resolved_by_a_human(backend: Backend) -> None:
    async def main() -> None:
        s = await AsyncSession.open(backend.open(), SID, {TOOL: "manual"})
        key = await one_call(s)

        async def lost(a: Attempt) -> str:
            a.sending()
            raise TimeoutError("the mail server did not answer")

        assert (await s.execute(key, lost)).next is Next.HALTED
        s = await AsyncSession.open(backend.open(), SID, {TOOL: "manual"})  # a restart
        [item] = await s.halted()
        assert (item.key, item.decision) == (key, Decision.RECOVERY_REQUIRED)
        done = await s.resolve(key, "applied", result="the mail log shows it sent")
        assert done.tool_message()["content"] == "the mail log shows it sent"
        assert await s.halted() == []

    run(main)


def test_find_returns_the_recorded_call_as_the_sync_api_does() -> None:
    async def main() -> None:
        s = await AsyncSession.open(MemoryStore(), SID, {TOOL: "manual"})
        assert await s.find(CALL) is None  # not recorded yet
        [st] = await s.record([CALL], seen=[])
        found = await s.find(CALL)
        assert found is not None and found.key == st.call.key
        assert found.next is Next.AWAIT_APPROVAL

    run(main)


def test_reconcile_with_an_async_or_a_plain_ask() -> None:
    async def main() -> None:
        s = await AsyncSession.open(MemoryStore(), SID, {TOOL: Tool("reconcile", False)})

        async def unknown(a: Attempt) -> str:
            a.sending()
            raise TimeoutError("no answer")

        async def found(call: CallRef, attempt: int) -> WasApplied:
            await asyncio.sleep(0)
            return WasApplied(f"found {call.key} attempt {attempt}")

        key = await one_call(s)
        assert (await s.execute(key, unknown)).next is Next.RECONCILE
        got = await s.reconcile(key, found)
        assert got.tool_message()["content"] == f"found {key} attempt 1"
        key = await one_call(s, 2)
        assert (await s.execute(key, unknown)).next is Next.RECONCILE
        got = await s.reconcile(key, lambda call, n: CannotTell("status endpoint down"))
        assert got.next is Next.HALTED

    run(main)


def test_execute_many_and_execute_message_take_the_sync_apis_commits() -> None:
    calls = [{**CALL, "id": f"c{i}", "arguments": {"to": f"u{i}"}} for i in range(3)]
    tools = {TOOL: Tool("idempotent", requires_approval=False)}

    def sync_counts(**kw: Any) -> tuple[int, int]:
        store = MemoryStore()
        s = Session.open(store, SID, tools, lazy_create=True)
        s.execute_message(1, calls, lambda a: "ok", **kw)
        return counts(store)

    async def main(**kw: Any) -> tuple[tuple[int, int], list[str]]:
        store = MemoryStore()
        s = await AsyncSession.open(store, SID, tools, lazy_create=True)
        out = await s.execute_message(1, calls, sent, **kw)
        return counts(store), [st.tool_message()["content"] for st in out]

    got, contents = asyncio.run(main())
    assert got == sync_counts() == (4, 4)  # n + 1, the session's creation included
    assert [c.split(" as ")[0] for c in contents] == ["sent to u0", "sent to u1", "sent to u2"]
    assert all(c.split(" as ")[1].startswith("tlx1-") for c in contents)  # the idempotency key
    got, _ = asyncio.run(main(together=True))
    assert got == sync_counts(together=True) == (2, 2)

    async def many() -> tuple[int, int]:
        store = MemoryStore()
        s = await AsyncSession.open(store, SID, tools)
        statuses = await s.record(1, calls)
        before = counts(store)
        done = await s.execute_many([(st.key, sent) for st in statuses])
        assert [st.next for st in done] == [Next.RESULT] * 3
        return store.commits - before[0], store.ledger_commits - before[1]

    assert asyncio.run(many()) == (4, 4)  # n + 1 for n protected calls


def test_async_runs_are_runs_of_the_spec_model() -> None:
    """Every step an AsyncSession makes is followed by the spec's closed-world model
    (kittrace.replay checks the ledger's state after every commit), the marking
    tool's invocation included, in the sync API's order."""
    tools = {TOOL: Tool("manual", requires_approval=False, marks_send=True),
             "idem": Tool("idempotent", requires_approval=False)}

    async def main() -> None:
        s = await AsyncSession.open(MemoryStore(), SID, tools)
        await s.execute(await one_call(s), sent)
        idem = [{"id": f"i{i}", "name": "idem", "arguments": {"n": i}} for i in range(2)]
        for seq, together in ((2, False), (3, True)):
            done = await s.execute_message(seq, idem, sent_n, together=together)
            assert [st.next for st in done] == [Next.RESULT] * 2

    async def sent_n(a: Attempt) -> str:
        await asyncio.sleep(0)
        return f"n={a.arguments['n']}"

    with kt.KitRecorder() as recorder:
        run(main)
    recording = recorder.of(SID)
    actions = [ev.action.value for e in recording for ev in e.events]
    first = actions.index("EnginePersistDispatched")
    assert actions[first:first + 5] == ["EnginePersistDispatched", "EngineInvokeAdapter",
                                        "ExternalApply", "EngineRecordSucceeded",
                                        "EngineAppendResult"]
    kt.replay(kt.kit_config([recording]), recording)  # ReplayError if it cannot follow


# --------------------------------------------------------------------------
# The event loop is never blocked by the ledger
# --------------------------------------------------------------------------


async def every_step(s: Session | AsyncSession) -> None:
    """Every method of the API once, on a session of tools ``manual`` and ``reconcile``;
    for a Session, called from this coroutine as it is (the control)."""

    async def call(method: str, *args: Any, **kwargs: Any) -> Any:
        got = getattr(s, method)(*args, **kwargs)
        return await got if asyncio.iscoroutine(got) else got

    async def lost(a: Attempt) -> str:
        a.sending()
        raise TimeoutError("no answer")

    def plain(a: Attempt) -> str:
        return "ok"

    body = plain if isinstance(s, Session) else sent
    c = [{**CALL, "id": f"c{i}"} for i in range(3)]
    [a, b, r] = await call("record", 1, [c[0], c[1], {"id": "r", "name": "rec", "arguments": {}}])
    await call("approve", a.key)
    await call("reject", b.key)
    await call("execute", a.key, body)
    await call("execute", r.key, lambda a: (_ for _ in ()).throw(TimeoutError("lost")))
    await call("reconcile", r.key, lambda call_, n: WasApplied("found"))
    [m] = await call("record", 2, [c[2]])
    await call("approve", m.key)
    await call("cancel", m.key)
    await call("status", m.key)
    await call("pending_approvals")
    [x] = await call("record", 3, [{**CALL, "id": "x"}])
    await call("approve", x.key)
    if isinstance(s, Session):
        s.execute(x.key, lambda a: (_ for _ in ()).throw(TimeoutError("lost")))
    else:
        await s.execute(x.key, lost)
    [h] = await call("halted")
    await call("resolve", h.key, "abandon")
    await call("recover")
    await call("audit")
    await call("execute_many", [])
    await call("execute_message", 4, [{"id": "y", "name": "free", "arguments": {}}], body)


TOOLS: dict[str, Tool | str] = {TOOL: "manual", "rec": Tool("reconcile", False),
                                "free": Tool("idempotent", False)}


@pytest.mark.parametrize("sync", [False, True], ids=["AsyncSession", "control-Session"])
def test_no_store_call_runs_on_the_loops_thread(backend: Backend, sync: bool) -> None:
    async def main() -> tuple[int, list[tuple[str, int]]]:
        w, store = watched(backend.open())
        s: Session | AsyncSession = (Session.open(store, SID, TOOLS) if sync
                                     else await AsyncSession.open(store, SID, TOOLS))
        await every_step(s)
        return threading.get_ident(), w.threads

    loop_thread, calls = run(main)
    names = {name for name, _ in calls}
    assert {"commit", "load_working_set"} <= names and len(calls) >= 15, calls
    on_loop = sorted({name for name, thread in calls if thread == loop_thread})
    if sync:
        assert "commit" in on_loop  # the control: the sync Session commits on the loop
    else:
        assert on_loop == []


class Gate:
    """Holds every commit in its thread until a coroutine on the loop lets it go.

    A commit made on the loop's own thread can never be let go (the loop is
    stuck in it): after ``patience`` seconds it goes on, noted as not freed.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, patience: float) -> None:
        self.loop = loop
        self.patience = patience
        self.freed: list[bool] = []
        self.waiting: asyncio.Queue[threading.Event] = asyncio.Queue()

    def hold(self, name: str, args: tuple[Any, ...]) -> None:
        if name != "commit":
            return
        let_go = threading.Event()
        self.loop.call_soon_threadsafe(self.waiting.put_nowait, let_go)
        self.freed.append(let_go.wait(self.patience))

    async def serve(self) -> None:
        """The other coroutine: it runs while a commit is held, and lets it go."""
        while True:
            (await self.waiting.get()).set()


@pytest.mark.parametrize("sync", [False, True], ids=["AsyncSession", "control-Session"])
def test_another_coroutine_runs_while_a_commit_is_in_progress(sync: bool) -> None:
    async def main() -> list[bool]:
        w, store = watched(MemoryStore())
        gate = Gate(asyncio.get_running_loop(), 0.05 if sync else PATIENCE)
        w.hold = gate.hold
        server = asyncio.create_task(gate.serve())
        s: Session | AsyncSession = (Session.open(store, SID, TOOLS) if sync
                                     else await AsyncSession.open(store, SID, TOOLS))
        await every_step(s)
        server.cancel()
        return gate.freed

    freed = run(main)
    assert len(freed) >= 10
    # every commit was let go by the other coroutine, so it ran during the commit; for
    # the sync Session none was: the loop stood still inside each commit
    assert freed == [not sync] * len(freed)


# --------------------------------------------------------------------------
# Concurrent sessions, one per conversation
# --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_concurrent_sessions_keep_correct_independent_ledgers(kind: str, tmp_path: Path) -> None:
    n = 4
    shared = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "ledger.db")
    w, store = watched(shared)
    barrier = threading.Barrier(n, timeout=PATIENCE)
    held: dict[str, int] = {}

    def in_step(name: str, args: tuple[Any, ...]) -> None:
        sid = args[0] if name == "commit" else None
        if sid is not None and held.setdefault(sid, 0) < 4:
            held[sid] += 1  # record, approve, dispatched, outcome: one of every
            barrier.wait()  # conversation in flight at once, or this never passes

    async def conversation(i: int) -> list[CallStatus]:
        sid = f"conv{i}"
        s = await AsyncSession.open(store, sid, {TOOL: "manual"})
        key = await one_call(s, call={**CALL, "arguments": {"to": sid}})

        async def body(a: Attempt) -> str:
            await asyncio.sleep(0)
            a.sending()
            if i % 3 == 1:
                raise NotApplied(f"{sid} refused")
            if i % 3 == 2:
                raise TimeoutError(f"{sid} lost")
            return f"sent to {a.arguments['to']}"

        done = await s.execute(key, body)
        return [done, *(await s.recover())]

    created = 0

    async def main() -> list[list[CallStatus]]:
        for sid in (f"conv{i}" for i in range(n)):
            Session.open(shared, sid, {TOOL: "manual"})  # created first: commits align
        nonlocal created
        created = shared.commits
        w.hold = in_step
        return list(await asyncio.gather(*(conversation(i) for i in range(n))))

    try:
        results = run(main)
        assert held == {f"conv{i}": 4 for i in range(n)}
        # record, approve, dispatched, the outcome (of a halted call: its recovery decision)
        assert shared.commits - created == 4 * n
        for i, (done, *todo) in enumerate(results):
            sid = f"conv{i}"
            want = [(Next.RESULT, f"sent to {sid}"), (Next.RESULT, f"{sid} refused"),
                    (Next.HALTED, None)][i % 3]
            content = done.result and done.result.content
            if content and i % 3 == 1:
                content = json.loads(content)["error"]
            assert (done.next, content) == want, (i, done)
            assert [t.key for t in todo] == [done.key]
            restarted = Session.open(shared, sid, {TOOL: "manual"})
            [again] = restarted.recover()
            assert (again.key, again.next) == (done.key, want[0])
            assert {row.execution_id for row in restarted.audit()} == {done.key}
        assert len({done.key for done, *_ in results}) == n
    finally:
        shared.close()


# --------------------------------------------------------------------------
# Cancellation
# --------------------------------------------------------------------------


def test_cancelled_in_the_body_is_a_crash() -> None:
    async def main() -> None:
        store = MemoryStore()
        s = await AsyncSession.open(store, SID, {TOOL: "manual"})
        key = await one_call(s)
        started = asyncio.Event()

        async def forever(a: Attempt) -> str:
            a.sending()
            started.set()
            await asyncio.Event().wait()
            return "never"

        task = asyncio.create_task(s.execute(key, forever))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(SessionInterrupted, match="CancelledError"):
            await s.status(key)
        [todo] = await (await AsyncSession.open(store, SID, {TOOL: "manual"})).recover()
        assert (todo.next, todo.attempt) == (Next.HALTED, 1)  # dispatched: as a crash

    run(main)


def held_store() -> tuple[Watched, Store, threading.Event, threading.Event]:
    """A store whose next commit waits for ``let_go``; ``entered`` when it is held."""
    w, store = watched(MemoryStore())
    entered, let_go = threading.Event(), threading.Event()

    def hold(name: str, args: tuple[Any, ...]) -> None:
        if name == "commit" and not let_go.is_set():
            entered.set()
            assert let_go.wait(PATIENCE)

    w.hold = hold
    return w, store, entered, let_go


async def until(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, PATIENCE)


def test_cancelled_during_the_dispatched_commit_is_a_crash_once_it_is_durable() -> None:
    async def main() -> None:
        _, store, entered, let_go = held_store()
        let_go.set()
        s = await AsyncSession.open(store, SID, {TOOL: "idempotent"})
        key = await one_call(s)
        let_go.clear()
        ran: list[str] = []

        async def body(a: Attempt) -> str:
            ran.append("body")
            return "ok"

        task = asyncio.create_task(s.execute(key, body))
        await until(entered)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        let_go.set()  # the dispatched commit completes in its thread
        with pytest.raises(SessionInterrupted):
            await s.status(key)
        assert ran == []
        [todo] = await (await AsyncSession.open(store, SID, {TOOL: "idempotent"})).recover()
        assert (todo.next, todo.attempt) == (Next.RETRY, 1)

    run(main)


def test_cancelled_while_waiting_in_the_lane_nothing_happens() -> None:
    async def main() -> None:
        _, store, entered, let_go = held_store()
        let_go.set()
        tools = {TOOL: Tool("idempotent", requires_approval=False)}
        s = await AsyncSession.open(store, SID, tools)
        [a, b] = await s.record(1, [CALL, {**CALL, "id": "call_1"}])
        let_go.clear()
        first = asyncio.create_task(s.execute(a.key, sent))
        await until(entered)  # a's dispatched commit holds the lane
        second = asyncio.create_task(s.execute(b.key, sent))
        await asyncio.sleep(0)  # b's dispatch waits in the lane behind it
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        let_go.set()
        assert (await first).next is Next.RESULT
        assert (await s.status(b.key)).next is Next.EXECUTE  # never dispatched
        assert (await s.execute(b.key, sent)).next is Next.RESULT  # not interrupted

    run(main)


def test_cancelled_during_the_outcome_commit_the_outcome_is_recorded() -> None:
    async def main() -> None:
        _, store, entered, let_go = held_store()
        let_go.set()
        s = await AsyncSession.open(store, SID, {TOOL: "manual"})
        key = await one_call(s)
        body_done = asyncio.Event()

        async def body(a: Attempt) -> str:
            let_go.clear()  # the outcome commit is held
            body_done.set()
            return "ok"

        task = asyncio.create_task(s.execute(key, body))
        await body_done.wait()
        await until(entered)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        let_go.set()
        got = await s.status(key)  # after the outcome commit: the lane is in order
        assert (got.next, got.tool_message()["content"]) == (Next.RESULT, "ok")

    run(main)


def test_cancelled_in_execute_message_the_rest_is_left_as_a_crash_leaves_it() -> None:
    async def main() -> None:
        store = MemoryStore()
        tools = {TOOL: Tool("idempotent", requires_approval=False)}
        s = await AsyncSession.open(store, SID, tools)
        started = asyncio.Event()
        ran: list[str] = []

        async def body(a: Attempt) -> str:
            ran.append(a.call.tool_call_id)
            started.set()
            await asyncio.Event().wait()
            return "never"

        calls = [CALL, {**CALL, "id": "call_1"}]
        task = asyncio.create_task(s.execute_message(1, calls, body))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(SessionInterrupted):
            await s.recover()  # interrupted when the cancelled task returned
        assert ran == ["call_0"]
        todo = await (await AsyncSession.open(store, SID, tools)).recover()
        assert [(t.next, t.attempt) for t in todo] == [(Next.RETRY, 1), (Next.EXECUTE, 0)]

    run(main)


def test_the_stall_benchmark_runs_and_counts_the_same_commits() -> None:
    """benchmarks/bench_async.py in its tiny mode: its figures are there (no time is
    asserted), and both APIs made the same commits for the same calls."""
    from benchmarks import bench_async

    got = bench_async.run(smoke=True)
    modes = got["modes"]
    assert set(modes) == set(bench_async.MODES)
    assert modes["Session"]["commits_per_call"] == modes["AsyncSession"]["commits_per_call"] > 2
    assert modes["no ledger"]["commits_per_call"] == 0
    assert all(set(m) == set(modes["Session"]) for m in modes.values())


def test_a_forked_child_runs_its_steps_on_a_pool_of_its_own() -> None:
    """A pre-fork server's worker (or a crash harness's child) forked after the parent used
    an AsyncSession inherits the shared store pool's object but none of its threads: every
    step would wait for ever.  The child gets its own pool (the control: the parent's pool
    object, restored in the child, never runs the step)."""
    import os
    import signal

    from toolledger._core import async_session as mod

    async def one(store: MemoryStore) -> None:
        s = await AsyncSession.open(store, SID, {TOOL: "manual"})
        await one_call(s)

    run(lambda: one(MemoryStore()))  # the parent's pool now has threads
    inherited = mod._pool
    assert inherited is not None

    def in_child(restore: bool) -> int:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.alarm(3)  # a hung child dies of SIGALRM
                if restore:
                    mod._pool = inherited
                asyncio.run(one(MemoryStore()))
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

    assert in_child(restore=False) == 0
    assert in_child(restore=True) == -signal.SIGALRM
