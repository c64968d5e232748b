"""The adopter's API for asyncio: a :class:`Session` whose store I/O never runs on the loop.

Private module of :mod:`toolledger`: import :class:`AsyncSession` from ``toolledger``.
The protocol and its guarantees are the synchronous :class:`~toolledger._core.session.Session`'s
(its module documentation; the spec in docs/protocol.md): an :class:`AsyncSession`
wraps one and re-implements none of it, it only decides on which thread each
piece runs.

Theory of operation
-------------------
- **Steps off the loop.** Every method that may touch the store (a commit, a
  load; a read too, since it takes the session's lock, which a commit of
  another call may hold) runs in a worker thread, on the session's *lane*: its
  steps one at a time, in the order they were called, on a thread pool shared
  by every session (a module pool, or ``AsyncSession.open(..., executor=...)``).
  The loop only awaits; sessions of different conversations commit in
  parallel, and one session's commits stay ordered.
- **Tool bodies.** :meth:`AsyncSession.dispatch` is ``Session.dispatch`` entered
  and exited on the lane: ``dispatched`` is durable before the ``async with``
  block starts, the block is the body, the outcome is classified and recorded
  exactly as there.  :meth:`AsyncSession.execute` runs ``fn(attempt)`` in that
  block: a coroutine function is awaited on the loop, in the caller's task; a
  plain function runs in a worker thread (``asyncio.to_thread``); an awaitable
  it returns is awaited on the loop.
- **Many calls at once.** :meth:`AsyncSession.execute_many`,
  :meth:`AsyncSession.execute_message` and :meth:`AsyncSession.reconcile` run the
  synchronous method in a thread of their own (it waits for the bodies, so it
  never takes a pool thread) and hand every awaitable body (or ``ask``) back to
  the loop: the same commits as the synchronous API, its batching included.
  They start after every step sent to the lane before them; the session's
  lock (``Session``'s "Threads") orders their commits with the lane's.
- ``a.sending()`` (a ``marks_send`` tool) in a body on the loop only marks the
  attempt; the in-memory step it makes in ``Session`` (which needs the session's
  lock) is made right before the outcome, in the worker: nothing durable
  depends on when.

Cancellation
------------
A task cancelled while a call's body runs (``CancelledError`` in a coroutine
body; a plain function's thread cannot be stopped, the task stops waiting for
it) is the ``BaseException`` case of ``Session.dispatch``: the process going
away.  Nothing is recorded, the call stays ``dispatched``, the session starts
nothing more (:class:`~toolledger._core.calls.SessionInterrupted`): open a new
AsyncSession and :meth:`~AsyncSession.recover`, as after a crash.  A task
cancelled during a call's ``dispatched`` commit: the commit finishes in its
thread, then the same.  During the outcome commit: the outcome is recorded,
the task gets ``CancelledError``.  Any other step: cancelled before it started,
nothing happened; once started it completes in its thread (a commit is never
torn), only its return is lost.  In :meth:`~AsyncSession.execute_many` and
:meth:`~AsyncSession.execute_message`, the body on the loop is cancelled (as
above: the session is interrupted when the task's ``CancelledError`` reaches
its awaiter) and no further call starts; a plain function runs to its end, its
outcome is recorded, and the next call is interrupted before its body.  So a
deadline belongs inside the body
(``async with asyncio.timeout(s)``: ``TimeoutError`` is an ``Exception``,
classified as unknown and decided by the tool's policy), not around
``execute()``; ``asyncio.shield(s.execute(...))`` lets a call finish whatever
happens to its caller.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import os
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

from .calls import Attempt, CallRef, CallStatus, Tool
from .protocol import InvalidInput
from .session import Session
from .stores import Store
from .tools import ReconcileAnswer

__all__ = ["AsyncSession"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

_POOL_SIZE = 32  # store threads shared by every AsyncSession without an executor of its own
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _shared_pool() -> concurrent.futures.Executor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=_POOL_SIZE, thread_name_prefix="toolledger-store")
        return _pool


def _forget_pool_in_child() -> None:
    """A forked child has none of the pool's threads (a pre-fork server's workers, a
    crash harness's children): a pool inherited from the parent would queue every step
    for threads that do not exist and hang.  The child starts its own on first use."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


class _Lane:
    """One session's steps: one at a time, in the order submitted, on a shared pool."""

    def __init__(self, pool: concurrent.futures.Executor) -> None:
        self.pool = pool
        self._mutex = threading.Lock()
        self._queue: deque[tuple[concurrent.futures.Future[Any], Callable[[], Any]]] = deque()
        self._draining = False

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._mutex:
            self._queue.append((fut, fn))
            if self._draining:
                return fut
            self._draining = True
        try:
            self.pool.submit(self._drain)
        except BaseException:  # a pool shut down: nothing of this lane runs
            with self._mutex:
                self._draining = False
                self._queue.clear()
            raise
        return fut

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the lane; cancelled while it waits there, it never runs."""
        return await asyncio.wrap_future(self.submit(fn))

    def _drain(self) -> None:
        while True:
            with self._mutex:
                if not self._queue:
                    self._draining = False
                    return
                fut, fn = self._queue.popleft()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                result = fn()
            except BaseException as exc:  # the step's own error, for its awaiter
                fut.set_exception(exc)
            else:
                fut.set_result(result)


def _is_coroutine_function(fn: object) -> bool:
    # a coroutine function, a partial of one, or an object with an async __call__
    return inspect.iscoroutinefunction(fn) or (
        callable(fn) and inspect.iscoroutinefunction(type(fn).__call__))


async def _run_body(fn: Callable[..., object], *args: Any) -> object:
    """A coroutine function on the loop, a plain one in a worker thread; an
    awaitable it returns is awaited on the loop."""
    value = fn(*args) if _is_coroutine_function(fn) else await asyncio.to_thread(fn, *args)
    if inspect.isawaitable(value):
        value = await value
    return value


def _off_loop(
    method: Callable[Concatenate[Session, P], R],
) -> Callable[Concatenate[AsyncSession, P], Coroutine[Any, Any, R]]:
    """``Session.<method>`` as a coroutine method: the same parameters, run on the lane."""

    async def step(self: AsyncSession, /, *args: P.args, **kwargs: P.kwargs) -> R:
        session = self._session
        return await self._lane.run(lambda: method(session, *args, **kwargs))

    step.__name__ = method.__name__
    step.__qualname__ = f"AsyncSession.{method.__name__}"
    step.__doc__ = (f"``await`` :meth:`Session.{method.__name__}`, off the event loop "
                    f"(the same arguments and return).\n\n{inspect.getdoc(method) or ''}")
    return step


class AsyncSession:
    """One session's tool calls on a store, for asyncio; see the module documentation.

    Build it with ``await AsyncSession.open(store, session_id, tools, ...)``
    (the keywords of :meth:`Session.open`).  Every method is the synchronous
    Session's, awaited; nothing of it runs on the event loop but the awaiting
    (and an async tool body).  Protocol: docs/protocol.md.
    """

    def __init__(self, session: Session, *, executor: concurrent.futures.Executor | None = None
                 ) -> None:
        """Wrap a :class:`Session` (prefer :meth:`open`; do not use ``session`` from the loop)."""
        self._session = session
        self._lane = _Lane(executor if executor is not None else _shared_pool())

    @classmethod
    async def open(
        cls,
        store: Store,
        session_id: str,
        tools: Mapping[str, Tool | str] | None = None,
        *,
        executor: concurrent.futures.Executor | None = None,
        **options: Any,
    ) -> AsyncSession:
        """``await`` :meth:`Session.open` off the loop (``options``: its keywords).

        ``executor``: the threads this session's store steps run on (default: a
        pool shared by every AsyncSession); its steps stay ordered on any executor.
        """
        opening = _Lane(executor if executor is not None else _shared_pool())
        session = await opening.run(lambda: Session.open(store, session_id, tools, **options))
        return cls(session, executor=executor)

    @classmethod
    async def adopt(
        cls,
        store: Store,
        session_id: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Mapping[str, Tool | str] | None = None,
        *,
        executor: concurrent.futures.Executor | None = None,
        **options: Any,
    ) -> AsyncSession:
        """``await`` :meth:`Session.adopt` off the loop (``options``: its keywords)."""
        opening = _Lane(executor if executor is not None else _shared_pool())
        session = await opening.run(
            lambda: Session.adopt(store, session_id, messages, tools, **options))
        return cls(session, executor=executor)

    # -- reading (in memory, no lock: safe on the loop) ---------------------------------

    @property
    def session(self) -> Session:
        """The synchronous Session underneath: its methods block, call them off the loop."""
        return self._session

    @property
    def session_id(self) -> str:
        return self._session.session_id

    @property
    def marker(self) -> int:
        """The first message sequence number governed by the ledger."""
        return self._session.marker

    # -- the synchronous methods, awaited (same parameters, same returns) ---------------

    record = _off_loop(Session.record)
    record_trailing = _off_loop(Session.record_trailing)
    approve = _off_loop(Session.approve)
    reject = _off_loop(Session.reject)
    cancel = _off_loop(Session.cancel)
    recover = _off_loop(Session.recover)
    halted = _off_loop(Session.halted)
    resolve = _off_loop(Session.resolve)
    status = _off_loop(Session.status)
    find = _off_loop(Session.find)
    call = _off_loop(Session.call)
    pending_approvals = _off_loop(Session.pending_approvals)
    audit = _off_loop(Session.audit)

    # -- running calls --------------------------------------------------------------------

    def dispatch(self, key: str, **kwargs: Any) -> _Dispatch:
        """Run the call ``key``: ``async with s.dispatch(key) as a: ... a.done(value)``.

        :meth:`Session.dispatch` (``kwargs``: its keywords), entered and exited
        off the loop: ``dispatched`` is durable before the block runs; the
        block's end is classified and recorded, an ``Exception`` NOT re-raised
        (``a.status``), a ``BaseException`` (a cancellation) leaves the call
        dispatched and the session interrupted (module documentation).
        """
        return _Dispatch(self, key, kwargs)

    async def execute(
        self, key: str, fn: Callable[[Attempt], object], **kwargs: Any
    ) -> CallStatus:
        """Run the call ``key`` as ``fn(attempt)``; its return is the result.

        ``fn`` may be a coroutine function (awaited on the loop) or a plain
        function (run in a worker thread); see :meth:`Session.execute`
        (``kwargs``: its keywords).  A ``fn`` that is not callable is refused
        before anything is written.
        """
        if not callable(fn):
            raise InvalidInput(f"execute({key!r}, fn): fn must be a callable taking the "
                               f"Attempt, got {fn!r}; nothing was written or run")
        async with self.dispatch(key, **kwargs) as attempt:
            attempt.done(await _run_body(fn, attempt))
        assert attempt.status is not None
        return attempt.status

    async def execute_many(
        self, calls: Sequence[tuple[str, Callable[[Attempt], object]]], **kwargs: Any
    ) -> list[CallStatus]:
        """:meth:`Session.execute_many` (n + 1 commits for n protected calls); a body may
        be a coroutine function (awaited on the loop) or a plain one (run in a thread)."""
        return await self._in_thread(
            lambda bridge: self._session.execute_many(bridge.pairs(calls), **kwargs))

    async def execute_message(
        self,
        seq: int,
        calls: Sequence[Mapping[str, Any]],
        fn: Callable[[Attempt], object],
        **kwargs: Any,
    ) -> list[CallStatus]:
        """:meth:`Session.execute_message` (``kwargs``: ``requires_approval``, ``together``,
        ...); ``fn`` may be a coroutine function (awaited on the loop) or a plain one."""
        return await self._in_thread(
            lambda bridge: self._session.execute_message(seq, calls, bridge.wrap(fn), **kwargs))

    async def reconcile(
        self,
        key: str,
        ask: Callable[[CallRef, int], ReconcileAnswer | Awaitable[ReconcileAnswer]],
        **kwargs: Any,
    ) -> CallStatus:
        """:meth:`Session.reconcile`; ``ask(call, attempt)`` may be a coroutine function."""
        return await self._in_thread(
            lambda bridge: self._session.reconcile(key, bridge.wrap(ask), **kwargs))

    async def _in_thread(self, run: Callable[[_Bridge], T]) -> T:
        """``run(bridge)`` in a thread of its own, its awaitable bodies on this loop."""
        await self._lane.run(lambda: None)  # what was sent to the lane before goes first
        bridge = _Bridge(asyncio.get_running_loop())
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        context = contextvars.copy_context()

        def main() -> None:
            if not fut.set_running_or_notify_cancel():
                return  # cancelled before it started: nothing happened
            try:
                fut.set_result(context.run(run, bridge))
            except BaseException as exc:  # the session's (or a body's) error, for the awaiter
                fut.set_exception(exc)

        thread = threading.Thread(target=main, name=f"toolledger-{self.session_id}", daemon=True)
        # started from a pool thread: Thread.start() waits until the new thread runs
        self._lane.pool.submit(thread.start)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            # no further body starts; a body running on this loop is cancelled, and the
            # thread then ends at once (Session's interrupt): wait for that, so that the
            # session is interrupted when this returns.  A plain function runs on.
            if bridge.stop():
                with contextlib.suppress(BaseException):
                    await asyncio.wrap_future(fut)
            raise


class _Dispatch:
    """``AsyncSession.dispatch(key)``: ``Session.dispatch`` entered and exited on the lane."""

    def __init__(self, owner: AsyncSession, key: str, kwargs: Mapping[str, Any]) -> None:
        self._owner = owner
        self._key = key
        self._kwargs = dict(kwargs)
        self._cm: AbstractContextManager[Attempt] | None = None
        self._attempt: Attempt | None = None
        self._on_send: Callable[[], None] | None = None

    async def __aenter__(self) -> Attempt:
        if self._cm is not None:
            raise RuntimeError(f"the dispatch block of call {self._key} was entered already")
        cm = self._cm = self._owner._session.dispatch(self._key, **self._kwargs)
        fut = self._owner._lane.submit(cm.__enter__)
        try:
            attempt = await asyncio.wrap_future(fut)
        except BaseException as exc:
            if not fut.cancel():  # cancelled still waiting in the lane: it never runs
                # it runs or ran: right after it (the lane is in order, so before any
                # later step), a dispatched call whose body will never run is left as a
                # crash leaves it (Session's interrupt); an enter that failed did nothing
                self._owner._lane.submit(functools.partial(self._abandon, cm, fut, exc))
            raise
        # The body may run on the loop: the step sending() makes in Session takes the
        # session's lock; it is made in the worker, before the outcome (__aexit__).
        self._on_send, attempt._on_send = attempt._on_send, None
        self._attempt = attempt
        return attempt

    @staticmethod
    def _abandon(cm: AbstractContextManager[Attempt], fut: concurrent.futures.Future[Attempt],
                 exc: BaseException) -> None:
        if fut.exception() is None:  # done by now: the lane runs its steps in order
            cm.__exit__(type(exc), exc, exc.__traceback__)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        cm, attempt, on_send = self._cm, self._attempt, self._on_send
        assert cm is not None and attempt is not None

        def finish() -> bool | None:
            try:
                if on_send is not None and attempt.sent:
                    on_send()  # the request was out: the step sending() left for here
            finally:
                handled = cm.__exit__(exc_type, exc, tb)
            return handled

        recorded = asyncio.wrap_future(self._owner._lane.submit(finish))
        # the outcome is recorded even if this task is cancelled while it waits
        recorded.add_done_callback(lambda f: f.cancelled() or f.exception())
        return bool(await asyncio.shield(recorded))


class _Bridge:
    """The bodies of a synchronous Session method running in its own thread: every
    awaitable one is awaited on the loop, and :meth:`stop` cancels it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._mutex = threading.Lock()
        self._stopped = False
        self._current: concurrent.futures.Future[Any] | None = None  # the body on the loop
        self._plain = False  # a plain function runs in the thread now

    def stop(self) -> bool:
        """Start no more bodies and cancel the one on the loop.  False while a plain
        function runs in the thread (it cannot be stopped): the thread is not waited for."""
        with self._mutex:
            self._stopped = True
            current, plain = self._current, self._plain
        if current is not None:
            current.cancel()
        return not plain

    def pairs(
        self, calls: Sequence[tuple[str, Callable[[Attempt], object]]]
    ) -> Sequence[tuple[str, Callable[[Attempt], object]]]:
        """``execute_many``'s ``(key, fn)`` pairs with each fn bridged (anything else
        unchanged, for Session to refuse)."""
        given: object = calls  # checked at run time: engines pass what they parsed
        if isinstance(given, (str, bytes)) or not isinstance(given, Sequence):
            return calls
        return [(item[0], self.wrap(item[1]))
                if isinstance(item, tuple) and len(item) == 2 and callable(item[1]) else item
                for item in given]

    def wrap(self, fn: Callable[..., object]) -> Callable[..., Any]:
        """``fn`` called in this thread; an awaitable it returns is awaited on the loop.
        Anything not callable is returned unchanged (Session refuses it)."""
        given: object = fn  # checked at run time, as Session does
        if not callable(given):
            return fn

        def bridged(*args: Any) -> object:
            with self._mutex:
                if self._stopped:
                    raise asyncio.CancelledError("the task awaiting this session was cancelled")
                self._plain = True
            try:
                value = fn(*args)  # a plain function runs here; a coroutine function makes one
            finally:
                with self._mutex:
                    self._plain = False
            if not inspect.isawaitable(value):
                return value
            attempt = args[0] if args and isinstance(args[0], Attempt) else None
            on_send = None
            if attempt is not None:  # as in _Dispatch: the step is made here, after the body
                on_send, attempt._on_send = attempt._on_send, None
            try:
                return self._on_loop(value)
            finally:
                if on_send is not None and attempt is not None and attempt.sent:
                    on_send()

        return bridged

    def _on_loop(self, value: Awaitable[object]) -> object:
        async def awaited() -> object:
            return await value

        with self._mutex:  # stop() sees either this body or _stopped, never neither
            if self._stopped:
                if inspect.iscoroutine(value):
                    value.close()  # never started
                raise asyncio.CancelledError("the task awaiting this session was cancelled")
            cf = asyncio.run_coroutine_threadsafe(awaited(), self._loop)
            self._current = cf
        try:
            return cf.result()
        except concurrent.futures.CancelledError:
            # the body was cancelled: a BaseException, as Session takes a crash
            raise asyncio.CancelledError("the tool body was cancelled") from None
        finally:
            with self._mutex:
                self._current = None
