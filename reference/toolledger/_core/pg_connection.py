"""The PostgreSQL store's connection: connect, run one transaction, reconnect, type errors.

Private module of :mod:`toolledger`: import the public names from ``toolledger``.

:class:`PgConnection` is the base of
:class:`~toolledger._core.postgres_store.PostgresStore`: the one connection an
object holds (psycopg is imported here, when a store is opened, never by
``import toolledger``), the explicit ``BEGIN ... COMMIT``/``ROLLBACK`` around
every read and write, and the translation of psycopg's errors into the
store's typed ones (:class:`StoreUnavailable`,
:class:`~toolledger._core.stores.StoreCorrupt`,
:class:`~toolledger._core.stores.StoreError`).  What a transaction reads or
writes, and what opening checks, is the store's.

Connections
-----------
One object holds one connection (guarded by a lock), opened with a connect
timeout and a ``statement_timeout`` (also the ``lock_timeout``: a commit
waiting for another worker's session lock gives up after it).  A server that
cannot be reached raises :class:`StoreUnavailable` naming host, port and
database, within ``connect_timeout``.  If the connection drops inside a
transaction the server rolls it back: nothing of it is written.  If it drops
during ``COMMIT`` the outcome is unknown to the client, and the error says
so: a Session reloads what is durable by itself (then ``recover()`` says
what to do); a bare Ledger is reloaded with ``Ledger.reload()``.

The transaction that meets a lost connection always fails (closed, with
:class:`StoreUnavailable`): it is never retried behind the caller's back.
The NEXT transaction on the same object connects again (a server restart
costs a worker one failed operation, not its store: a new Session on the
same store works once the server is back; :attr:`PgConnection.reconnects`
counts them), and checks the schema again as opening does.  That is safe
for an engine that did not reload: every commit is a compare-and-set on the
durable state it was decided on, so a commit decided before the loss is
refused (:class:`~toolledger._core.stores.StaleState`) if that state changed,
by another worker or by the lost ``COMMIT`` itself.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

from .pg_schema import _Rows
from .protocol import InvalidInput
from .stores import RELOAD, StoreCorrupt, StoreError

if TYPE_CHECKING:
    import psycopg

__all__ = ["PgConnection", "StoreUnavailable"]

_T = TypeVar("_T")
_SCHEMA_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class StoreUnavailable(StoreError):
    """The PostgreSQL server could not be reached, or the connection was lost.

    ``host``, ``port`` and ``dbname`` name the server.  Nothing was written,
    unless the message says a ``COMMIT``'s outcome is unknown: then reload.
    """

    def __init__(self, message: str, *, host: str, port: str, dbname: str) -> None:
        super().__init__(message)
        self.host, self.port, self.dbname = host, port, dbname


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # the core package works without it
        raise StoreError(
            "PostgresStore needs psycopg 3: pip install 'toolledger[postgres]'"
        ) from exc
    return psycopg


class PgConnection:
    """One guarded connection to a PostgreSQL schema, and the transactions on it.

    Checks the arguments (a plain schema name, positive timeouts, in seconds),
    imports psycopg and connects, naming the server in :attr:`where`, or
    raises :class:`StoreUnavailable` having written nothing.  A subclass
    provides :meth:`_open`, which checks the schema (``again=True`` after a
    reconnect).
    """

    def __init__(
        self,
        conninfo: str,
        *,
        schema: str,
        connect_timeout: float,
        statement_timeout: float,
    ) -> None:
        if not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema):
            raise InvalidInput(
                f"schema {schema!r} is not a plain lower-case SQL identifier "
                "([a-z_][a-z0-9_]*, at most 63 characters): pass one"
            )
        for name, value in (("connect_timeout", connect_timeout),
                            ("statement_timeout", statement_timeout)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise InvalidInput(
                    f"{name} must be a positive number of seconds, got {value!r}; nothing "
                    "was connected"
                )  # fmt: skip
        self._pg = _psycopg()
        self._conninfo = conninfo
        self.connect_timeout = float(connect_timeout)
        self.statement_timeout = float(statement_timeout)
        self.reconnects = 0
        self.schema = schema
        self.trace: Callable[[str, Sequence[object]], None] | None = None
        self._lock = threading.RLock()
        self._broken: str | None = None
        self._conn: psycopg.Connection[Any] | None = None
        # the row-count checks of a pipelined transaction, made before its COMMIT
        self._pending_checks: list[tuple[Any, Exception]] | None = None
        info = self._pg.conninfo.conninfo_to_dict(conninfo)
        self.host = str(info.get("host", "localhost"))
        self.port = str(info.get("port", "5432"))
        self.dbname = str(info.get("dbname", info.get("user", "")))
        self.where = f"PostgreSQL {self.host}:{self.port}/{self.dbname} schema {schema}"
        self._rows = _Rows(self.where)
        self._conn = self._connect()

    def _open(self, *, create: bool, again: bool = False) -> None:
        """Check (or create) the schema; the store's (``again``: a reconnect, never creates)."""
        raise NotImplementedError

    # -- errors -----------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        """A new connection with the timeouts; :class:`StoreUnavailable` if none."""
        ms = round(self.statement_timeout * 1000)
        try:
            conn: psycopg.Connection[Any] = self._pg.connect(
                self._conninfo,
                autocommit=True,  # every transaction is an explicit BEGIN ... COMMIT
                # libpq takes whole seconds (and treats 1 as 2)
                connect_timeout=max(1, round(self.connect_timeout)),
                options=f"-c statement_timeout={ms} -c search_path={self.schema} "
                f"-c lock_timeout={ms}",
            )
        except self._pg.Error as exc:
            raise self._unavailable(
                f"cannot connect (connect_timeout={self.connect_timeout:g} s): {exc}"
            ) from exc
        return conn

    def _reconnect(self) -> None:
        """Replace a lost connection (see "Connections" in the module doc)."""
        old, lost = self._conn, self._broken
        self._conn = None
        if old is not None:
            # the server rolls back whatever it still had open; a dead socket: nothing to do
            with contextlib.suppress(Exception):
                old.close()
        try:
            self._conn = self._connect()
            self._broken = None
            self._open(create=False, again=True)
        except BaseException:
            self._broken = lost or "a lost connection"
            if self._conn is not None:
                self._conn.close()
            self._conn = old  # closed: the next transaction tries again
            raise
        self.reconnects += 1

    def _unavailable(self, what: str, *, written: str = "nothing was written") -> StoreUnavailable:
        return StoreUnavailable(
            f"PostgreSQL at {self.host}:{self.port}, database {self.dbname!r}: {what}. "
            f"Check that the server runs and is reachable, then retry; {written}",
            host=self.host,
            port=self.port,
            dbname=self.dbname,
        )

    def _corrupt(self, what: str) -> StoreCorrupt:
        return self._rows._corrupt(what)

    def _error(self, what: str, exc: Exception, *, reading: bool) -> StoreError:
        """The typed error for a psycopg error (see the module doc)."""
        pg = self._pg
        conn = self._conn
        state = getattr(exc, "sqlstate", None) or ""
        # 08: connection exceptions; 57: the server shut down or cancelled us
        if (
            isinstance(exc, pg.OperationalError)
            and (conn is None or conn.closed or conn.broken)
        ) or (state[:2] in ("08", "57") and not isinstance(exc, pg.errors.QueryCanceled)):
            self._broken = f"the connection was lost during {what} ({exc})"
            return self._unavailable(f"the connection was lost during {what} ({exc})")
        if state.startswith("53"):  # insufficient resources (disk full, out of memory)
            return StoreError(
                f"{self.where}: {what} failed: the server is out of resources ({exc}); "
                "nothing was written, free space or memory on the server and try again"
            )
        if isinstance(exc, pg.errors.QueryCanceled | pg.errors.LockNotAvailable):
            return StoreError(
                f"{self.where}: {what} timed out after statement_timeout="
                f"{self.statement_timeout:g} s (a statement ran, or waited for another "
                f"worker's lock, that long: {exc}); nothing was written. Reload the session "
                "and try again, or raise statement_timeout if such waits are expected"
            )
        if reading or state.startswith("XX"):  # XX001 data_corrupted, XX002 index_corrupted
            return self._corrupt(f"{what} failed: {exc}")
        return StoreError(f"{self.where}: {what} failed ({exc}); nothing was written")

    # -- statements -----------------------------------------------------------------

    def _exec(self, conn: psycopg.Connection[Any], sql: str, params: Sequence[object] = ()) -> Any:
        if self.trace is not None:
            self.trace(sql, params)
        return conn.execute(sql, params)

    def _live(self) -> psycopg.Connection[Any]:
        if self._conn is None and self._broken is None:
            raise StoreError(f"{self.where}: this store is closed; open a new PostgresStore")
        if self._broken is not None or self._conn is None or self._conn.broken:
            # lost earlier (that transaction failed): connect again before this one
            self._reconnect()
        assert self._conn is not None
        return self._conn

    def _transaction(
        self,
        what: str,
        begin: str,
        body: Callable[[psycopg.Connection[Any]], _T],
        *,
        read: bool,
        pipelined: bool = False,
    ) -> _T:
        """``begin``, ``body``, then ``COMMIT`` (or ``ROLLBACK``: ``read``, or an error).

        ``pipelined=True`` (a commit, docs/benchmarks.md): ``begin`` and ``body``
        run in psycopg's pipeline mode, so a statement whose result ``body``
        does not read at once shares a round trip with the next one read (a
        read's ``fetch`` sends everything queued before it); ``body`` registers
        the checks on its writes' row counts with :meth:`_expect_one`, made once
        the pipeline has sent everything and BEFORE ``COMMIT`` is sent on its
        own: a failed check rolls the whole transaction back, as before.
        """
        with self._lock:
            conn = self._live()
            try:
                try:
                    if pipelined:
                        self._pending_checks = []
                        with conn.pipeline():
                            self._exec(conn, begin)
                            value = body(conn)
                        checks, self._pending_checks = self._pending_checks, None
                        for cursor, error in checks:
                            if cursor.rowcount != 1:
                                raise error
                    else:
                        self._exec(conn, begin)
                        value = body(conn)
                except BaseException:
                    self._pending_checks = None
                    self._rollback(conn)
                    raise
                if read:
                    self._exec(conn, "ROLLBACK")
                else:
                    try:
                        self._exec(conn, "COMMIT")
                    except self._pg.OperationalError as exc:
                        if conn.closed or conn.broken:
                            self._broken = f"a connection lost during COMMIT ({exc})"
                            raise self._unavailable(
                                f"the connection was lost during COMMIT of {what} ({exc})",
                                written="whether it was committed is unknown: once the "
                                f"server is back, {RELOAD}",
                            ) from exc
                        raise
                return value
            except self._pg.Error as exc:
                raise self._error(what, exc, reading=read) from exc

    def _rollback(self, conn: psycopg.Connection[Any]) -> None:
        if conn.closed or conn.broken:
            return  # the server rolls back a transaction whose connection is gone
        try:
            self._exec(conn, "ROLLBACK")
        except self._pg.Error as exc:
            self._broken = f"a failed rollback ({exc})"

    def _read(self, body: Callable[[psycopg.Connection[Any]], _T]) -> _T:
        return self._transaction(
            "reading", "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", body, read=True
        )

    def _write(
        self, what: str, body: Callable[[psycopg.Connection[Any]], None], *,
        pipelined: bool = False,
    ) -> None:
        self._transaction(what, "BEGIN ISOLATION LEVEL READ COMMITTED", body, read=False,
                          pipelined=pipelined)

    def _expect_one(self, cursor: Any, error: Exception) -> None:
        """``error`` unless the statement of ``cursor`` touched exactly one row: checked
        now, or, inside a pipelined transaction, once its result is back (before
        ``COMMIT``; see :meth:`_transaction`)."""
        if self._pending_checks is not None:
            self._pending_checks.append((cursor, error))
        elif cursor.rowcount != 1:
            raise error

    # -- lifecycle --------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection; idempotent.  Everything committed stays durable."""
        with self._lock:
            conn, self._conn, self._broken = self._conn, None, None
            if conn is not None:
                conn.close()

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """The underlying connection, for inspection only (never write through it)."""
        return self._live()
