"""Group commit: concurrent sessions' commits share one SQLite transaction and one fsync.

Private module of :mod:`toolledger`: used by ``SqliteStore(path, group_commit=True)``.

Theory of operation
-------------------
Without it, every :meth:`~toolledger._core.sqlite_store.SqliteStore.commit` is
its own ``BEGIN IMMEDIATE ... COMMIT``, and with ``synchronous=FULL`` each
``COMMIT`` waits for one fsync of the WAL; sessions of one process that commit
at the same time queue behind each other's fsyncs.  A :class:`GroupCommitter`
lets them share: a thread that commits puts its transaction body (a *job*) in
a queue and waits.  The first waiter that finds no group running becomes the
*leader*: it takes every queued job (at most ``max_group``), runs them on the
store's one connection inside ONE ``BEGIN IMMEDIATE ... COMMIT``, each in its
own ``SAVEPOINT``, and wakes every waiter of the group when the ``COMMIT`` has
returned, then hands the leader's role to the job at the head of the queue.
While it waits for that fsync, other sessions queue the next group.  No
thread of its own: the leader is always a thread that has a commit to make.

What each waiter is told, and why it is safe
--------------------------------------------
- *Acknowledged only after the fsync that covers it.*  A job's ``run`` returns
  only once the ``COMMIT`` of the transaction holding its writes has returned;
  with ``synchronous=FULL`` that ``COMMIT`` has fsynced the WAL (the store
  refuses to open otherwise).  So an engine acts (invokes a tool after
  ``dispatched``) only on a durable commit, exactly as without grouping.
- *Its own refusal is its own.*  A body that raises (``StaleState``,
  ``LeaseLost``, a bad plan) is rolled back to its savepoint: its writes are
  undone, the others' stay, and only that waiter gets the error.  The bodies
  run one after the other on one connection, so a later body sees the earlier
  ones' writes: a stale writer is refused by the same compare-and-set as
  without grouping, also when the winner is in the same group.
- *A failed group fails every waiter closed.*  If ``BEGIN``, a savepoint, the
  ``COMMIT`` or the rollback fails, or SQLite itself ended the transaction
  (it rolls back on some I/O and memory errors), the whole transaction is
  rolled back (nothing of any job is written: SQLite's atomic commit) and
  every waiter of the group, including those whose bodies had succeeded, gets
  an error saying nothing was written.  A crash of the process during the
  group leaves all of it or none of it, like any SQLite transaction.

Counters: ``groups`` (transactions committed, i.e. fsyncs of the WAL) and
``jobs`` (bodies committed); ``jobs / groups`` is the grouping achieved.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from typing import Final

from .stores import StoreError

__all__ = ["GroupCommitter"]

Body = Callable[[sqlite3.Connection], None]

_SAVEPOINT: Final = "toolledger_job"


class _Job:
    """One waiter's transaction body and, once its group ended, how it ended.

    Mutable on purpose (not protocol state): it is the rendezvous between the
    waiter and the leader, written only by the leader under the condition's lock.
    """

    __slots__ = ("body", "done", "error", "wake", "what")

    def __init__(self, what: str, body: Body) -> None:
        self.what = what
        self.body = body
        self.done = False
        self.error: BaseException | None = None
        # Set when the job is done, or when it is handed the leader's role: each
        # waiter sleeps on its own event, so a finished group wakes its own
        # waiters and one next leader, not every thread (no thundering herd).
        self.wake = threading.Event()


class GroupCommitter:
    """Runs the write transactions of several threads as one SQLite transaction.

    ``connection`` returns the live connection (it raises if the store is
    closed or broken); ``lock`` is the store's connection lock, held by the
    leader for the whole group; ``sql_error`` turns a SQLite error into the
    store's typed error; ``rollback`` rolls back (and marks the store broken
    if that fails).  ``max_group`` bounds the jobs of one transaction.
    """

    def __init__(
        self,
        *,
        connection: Callable[[], sqlite3.Connection],
        lock: threading.RLock,
        sql_error: Callable[[str, sqlite3.Error], StoreError],
        rollback: Callable[[sqlite3.Connection, str], None],
        max_group: int = 64,
    ) -> None:
        if not isinstance(max_group, int) or isinstance(max_group, bool) or max_group < 1:
            raise ValueError(f"max_group must be an integer >= 1, got {max_group!r}")
        self._connection = connection
        self._lock = lock
        self._sql_error = sql_error
        self._rollback = rollback
        self.max_group = max_group
        self._mutex = threading.Lock()  # the queue and the leader's role
        self._queue: list[_Job] = []
        self._leading = False
        self.groups = 0
        self.jobs = 0
        self.largest_group = 0

    def run(self, what: str, body: Body) -> None:
        """Run ``body`` in a shared transaction; return once it is durable, or raise."""
        job = _Job(what, body)
        with self._mutex:
            self._queue.append(job)
            lead = not self._leading
            self._leading = True
        while True:
            if not lead:
                job.wake.wait()
                job.wake.clear()
                if job.done:
                    break
                # else: handed the leader's role (it is at the head of the queue)
            with self._mutex:
                group, self._queue = (
                    self._queue[: self.max_group],
                    self._queue[self.max_group :],
                )
            try:
                self._commit_group(group)
            finally:
                with self._mutex:
                    if self._queue:
                        self._queue[0].wake.set()  # the next group's leader
                    else:
                        self._leading = False
            if job.done:
                break
            lead = False  # more than max_group were queued before it: wait for its turn
        if job.error is not None:
            raise job.error

    def _commit_group(self, group: list[_Job]) -> None:
        """One transaction for ``group``; every job ends ``done``, with or without error."""
        try:
            committed = self._transaction(group)
        except BaseException as exc:  # an interrupt in the leader: nobody is left waiting
            for job in group:
                if job.error is None:
                    job.error = StoreError(
                        f"{job.what} failed: the shared transaction was interrupted ({exc!r}); "
                        "nothing was written"
                    )
            raise
        finally:
            with self._mutex:
                for job in group:
                    job.done = True
                    job.wake.set()
        if committed:
            self.groups += 1
            self.jobs += sum(1 for job in group if job.error is None)
            self.largest_group = max(self.largest_group, len(group))

    def _transaction(self, group: list[_Job]) -> bool:
        """Run the group; True if a COMMIT made some of it durable."""
        what = f"a group commit of {len(group)} transactions"
        with self._lock:
            try:
                conn = self._connection()
                conn.execute("BEGIN IMMEDIATE")
            except StoreError as exc:
                self._fail(group, exc)
                return False
            except sqlite3.Error as exc:
                self._fail(group, self._sql_error(what, exc))
                return False
            try:
                for job in group:
                    self._run_job(conn, job)
                if all(job.error is not None for job in group):
                    conn.execute("ROLLBACK")  # nothing to make durable
                    return False
                self._commit(conn)
            except BaseException as exc:
                self._rollback(conn, what)
                error = self._sql_error(what, exc) if isinstance(exc, sqlite3.Error) else exc
                self._fail(group, error)
                if not isinstance(exc, Exception):
                    raise
                return False
        return True

    def _run_job(self, conn: sqlite3.Connection, job: _Job) -> None:
        """The job's body in its savepoint; its own error rolls back only its writes."""
        conn.execute(f"SAVEPOINT {_SAVEPOINT}")
        try:
            job.body(conn)
        except Exception as exc:
            if not conn.in_transaction:
                # SQLite ended the whole transaction (an I/O or memory error):
                # the earlier jobs' writes are gone too.  Fail the group.
                raise
            conn.execute(f"ROLLBACK TO {_SAVEPOINT}")
            conn.execute(f"RELEASE {_SAVEPOINT}")
            job.error = self._sql_error(job.what, exc) if isinstance(exc, sqlite3.Error) else exc
            return
        conn.execute(f"RELEASE {_SAVEPOINT}")

    def _commit(self, conn: sqlite3.Connection) -> None:
        """The group's COMMIT: returns after SQLite's fsync (a seam for fault injection)."""
        conn.execute("COMMIT")

    @staticmethod
    def _fail(group: list[_Job], error: BaseException) -> None:
        for job in group:
            job.error = StoreError(
                f"{job.what} failed: the shared transaction of {len(group)} commits was rolled "
                f"back ({error}); nothing of it was written. Reload the session (or open a new "
                "store) and try again"
            )
            job.error.__cause__ = error
