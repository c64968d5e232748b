"""PostgresStore: the store port on a PostgreSQL database, for many engine workers.

Private module of :mod:`toolledger`: import the public names from ``toolledger``.

What it is for
--------------
When several engine workers (processes, machines) share the sessions of one
agent platform they need one ledger they can all reach: :class:`PostgresStore`
keeps the same tables as :class:`~toolledger._core.sqlite_store.SqliteStore` (calls
with their results, approvals, the execution ledger, the append-only audit
log, the protocol marker) in one PostgreSQL schema, with the same guarantees:
every durable transition is ONE transaction (a protected call costs two
ledger commits, a readonly one none), every row carries a SHA-256
``row_checksum`` checked on every read, a schema version is checked on open,
and anything unexpected fails closed as :class:`~toolledger._core.stores.StoreCorrupt`.

psycopg 3 is an optional dependency (``pip install toolledger[postgres]``):
it is imported when a store is opened, so ``import toolledger`` never needs it.

Concurrency: the compare-and-set
--------------------------------
Every commit runs ``BEGIN ISOLATION LEVEL READ COMMITTED`` and first takes
the session's row lock (``SELECT ... FROM sessions WHERE session_id = %s FOR
UPDATE``): commits to one session are serialized by the server, and since a
READ COMMITTED statement sees everything committed before it started, the
statements that follow the lock see the last commit of any other worker.
Then :meth:`~toolledger._core.stores.CommitPlan.check_session` compares, in one
statement per call, the durable state the commit was decided on (result,
approval, ledger record by checksum, audit keys) with what is stored, exactly
as SQLite's ``BEGIN IMMEDIATE`` does for a file: a stale commit raises
:class:`~toolledger._core.stores.StaleState` before its first write, audit-only
commits included.  The writers' own checks (``UPDATE ... WHERE row_checksum =
old``, inserts refused by primary keys) stay as a second line.  Sessions do
not block each other.

Round trips: a commit runs in psycopg's pipeline mode, in three round trips
however many rows it writes: [``BEGIN``, the row lock, every check's and
every writer's read], [every INSERT/UPDATE], then ``COMMIT`` alone, sent only
after every write's row count was checked (a failed check rolls the whole
transaction back, as before: nothing of it is written).  The statements, and
their order on the server, are the ones sent one at a time before; what is
folded is the waiting (docs/benchmarks.md, "PostgreSQL round trips").

Reads run in ``REPEATABLE READ READ ONLY`` transactions (one snapshot) ended
by ``ROLLBACK``.  Durability is the server's: ``COMMIT`` returns once the WAL
is flushed (``synchronous_commit`` on, checked on open).

Connections
-----------
One connection per object, with a connect timeout and a statement (and
lock) timeout; a lost connection fails its transaction with
:class:`StoreUnavailable` (a ``COMMIT``'s outcome unknown: reload) and the
next transaction connects again (:attr:`PostgresStore.reconnects`).  The
details, and the translation of psycopg's errors, are in
:mod:`toolledger._core.pg_connection`.

Schema (version :data:`SCHEMA_VERSION`)
---------------------------------------
The tables, indexes and trigger, and the checks that open an existing store,
are in :mod:`toolledger._core.pg_schema`.  Opening a schema with no tables
creates them (under an advisory lock: concurrent openers create it once);
:meth:`PostgresStore.create` refuses an existing store.

Session ownership: ``sessions.epoch`` is the session's lease epoch.
:meth:`PostgresStore.take_session` bumps it (one transaction, under the
session's row lock); a commit carrying an epoch checks it first, under the
same row lock, and a worker that lost the session gets
:class:`~toolledger._core.stores.LeaseLost` before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, Final

from .pg_connection import PgConnection, StoreUnavailable
from .pg_schema import _COLUMNS, _SCHEMA, APPLICATION, SCHEMA_VERSION, _check_tables
from .protocol import (
    ApprovalState,
    CallPosition,
    CallState,
    ExecutionRecord,
    MessageState,
    SessionState,
)
from .rows import (
    _DATA,
    _KEY,
    _RESULT,
    Row,
    _checksum,
    _enum,
    _int,
    _json_object,
    _record_values,
    _result_values,
    stored_difference,
)
from .state import stored_approval_digests
from .stores import (
    _CREATED_SINCE,
    RELOAD,
    AuditRow,
    CallView,
    SessionExists,
    StaleState,
    StoreError,
    UnknownSession,
    _check_session_values,
    check_lease,
    check_new_session,
    plan_commit,
)

if TYPE_CHECKING:
    import psycopg

__all__ = ["SCHEMA_VERSION", "PostgresStore", "StoreExists", "StoreUnavailable"]

_IN_CHUNK: Final = 500


def _q(columns: Sequence[str]) -> str:
    """Column names quoted (``authorization`` is a reserved word in PostgreSQL)."""
    return ", ".join(f'"{c}"' for c in columns)


def _assign(columns: Sequence[str]) -> str:
    return ", ".join(f'"{c}" = %s' for c in columns)


class StoreExists(StoreError):
    """:meth:`PostgresStore.create` found a store (or other tables) in the schema."""


class PostgresStore(PgConnection):
    """A :class:`~toolledger._core.stores.Store` on a PostgreSQL database (see the module doc).

    ``PostgresStore(conninfo, schema="toolledger")`` connects (libpq
    connection string or URI), checks the schema's tables (creating them if
    the schema holds none) and raises :class:`StoreUnavailable`,
    :class:`~toolledger._core.stores.StoreCorrupt` or
    :class:`~toolledger._core.stores.UnsupportedSchema` having written nothing.
    ``connect_timeout`` and ``statement_timeout`` are in seconds (positive
    numbers; the statement timeout is also the lock timeout).  After a lost
    connection the next transaction connects again (:attr:`reconnects`
    counts it; see "Connections" in the module doc).
    ``trace``, if set, is called with the text and parameters of every
    statement this object sends (for tests and diagnostics).  The connection,
    its transactions and their errors are the base class's
    (:class:`~toolledger._core.pg_connection.PgConnection`); what is read and
    written in them is this class's.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        schema: str = "toolledger",
        connect_timeout: float = 10.0,
        statement_timeout: float = 30.0,
        _create: bool = False,
    ) -> None:
        self.commits = 0
        self.ledger_commits = 0
        super().__init__(
            conninfo,
            schema=schema,
            connect_timeout=connect_timeout,
            statement_timeout=statement_timeout,
        )
        try:
            self._open(create=_create)
        except BaseException:
            self.close()
            raise

    @classmethod
    def create(
        cls,
        conninfo: str,
        *,
        schema: str = "toolledger",
        connect_timeout: float = 10.0,
        statement_timeout: float = 30.0,
    ) -> PostgresStore:
        """Create a new store in ``schema``; :class:`StoreExists` if it holds any table."""
        return cls(
            conninfo,
            schema=schema,
            connect_timeout=connect_timeout,
            statement_timeout=statement_timeout,
            _create=True,
        )

    # -- opening ---------------------------------------------------------------------

    def _open(self, *, create: bool, again: bool = False) -> None:
        """Check (or create) the schema; ``again``: a reconnect, which never creates."""
        conn = self._live()
        try:
            setting = self._exec(conn, "SHOW synchronous_commit").fetchone()[0]
            if setting not in ("on", "remote_write", "remote_apply"):
                raise StoreError(
                    f"{self.where}: synchronous_commit is {setting!r}, so a COMMIT may return "
                    "before it is durable: set it to 'on' for this database or role"
                )
        except self._pg.Error as exc:
            raise self._error("opening", exc, reading=False) from exc

        def body(conn: psycopg.Connection[Any]) -> None:
            # one creator at a time per schema; others wait, then validate its work
            self._exec(
                conn, "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"toolledger:{self.schema}",)
            )
            tables = self._tables(conn)
            if tables and create:
                raise StoreExists(
                    f"{self.where} already holds tables ({', '.join(sorted(tables))}): a store "
                    "is never created over an existing one; open it with PostgresStore(...) "
                    "or create the store in another schema"
                )
            if tables:
                self._validate(conn, tables)
                return
            if again:  # the store this object used is gone: never start an empty one here
                raise self._corrupt("its tables are gone since this object opened the store")
            self._exec(conn, f"CREATE SCHEMA IF NOT EXISTS {self.schema}")
            for statement in _SCHEMA:
                self._exec(conn, statement)
            self._exec(
                conn,
                "INSERT INTO meta (singleton, application, schema_version, created) "
                "VALUES (1, %s, %s, %s)",
                (APPLICATION, SCHEMA_VERSION, datetime.now(UTC).isoformat(timespec="seconds")),
            )

        self._write("opening the store", body)

    def _tables(self, conn: psycopg.Connection[Any]) -> set[str]:
        rows = self._exec(
            conn,
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (self.schema,),
        ).fetchall()
        return {str(r[0]) for r in rows}

    def _validate(self, conn: psycopg.Connection[Any], tables: set[str]) -> None:
        _check_tables(
            lambda sql, params: self._exec(conn, sql, params).fetchall(),
            self.schema,
            tables,
            self._rows,
        )

    # -- lifecycle --------------------------------------------------------------------

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PostgresStore({self.where!r})"

    # -- rows: every read verifies the checksum, every write sets it -----------------

    def _select(
        self,
        conn: psycopg.Connection[Any],
        table: str,
        where: str,
        params: Sequence[object],
        *,
        lock: bool = False,
    ) -> list[Row]:
        return self._query(conn, table, where, params, lock=lock)()

    def _query(
        self,
        conn: psycopg.Connection[Any],
        table: str,
        where: str,
        params: Sequence[object],
        *,
        lock: bool = False,
    ) -> Callable[[], list[Row]]:
        """Send the SELECT of :meth:`_select` now; its checked rows when called (in a
        pipelined transaction, the reads sent before the first call share one round
        trip)."""
        columns = _COLUMNS[table]
        order = ", ".join(_KEY[table])
        cursor = self._exec(
            conn, f"SELECT {_q(columns)} FROM {table} {where} ORDER BY {order}"
            + (" FOR UPDATE" if lock else ""),
            params,
        )
        return lambda: self._checked(table, cursor.fetchall())

    def _checked(self, table: str, fetched: Sequence[Sequence[object]]) -> list[Row]:
        columns = _COLUMNS[table]
        rows = []
        for values in fetched:
            row = dict(zip(columns, values, strict=True))
            try:
                ok = row["row_checksum"] == _checksum(table, row)
            except (TypeError, ValueError):
                ok = False
            if not ok:
                key = ", ".join(f"{k}={row[k]!r}" for k in _KEY[table])
                raise self._corrupt(
                    f"the {table} row ({key}) does not match its checksum: its content was "
                    "altered or damaged"
                )
            rows.append(row)
        return rows

    def _insert(self, conn: psycopg.Connection[Any], table: str, row: Row) -> Any:
        columns = (*_DATA[table], "row_checksum")
        return self._exec(
            conn,
            f"INSERT INTO {table} ({_q(columns)}) VALUES "
            f"({', '.join(['%s'] * len(columns))}) ON CONFLICT DO NOTHING",
            (*(row[c] for c in _DATA[table]), _checksum(table, row)),
        )

    def _update(
        self, conn: psycopg.Connection[Any], table: str, current: Row, changes: Row
    ) -> None:
        new = {**current, **changes}
        sets = [*changes, "row_checksum"]
        keys = _KEY[table]
        cursor = self._exec(
            conn,
            f"UPDATE {table} SET {_assign(sets)} "
            f"WHERE {' AND '.join(f'{k} = %s' for k in keys)} AND row_checksum = %s",
            (
                *changes.values(),
                _checksum(table, new),
                *(current[k] for k in keys),
                current["row_checksum"],
            ),
        )
        self._expect_one(cursor, StaleState(f"the {table} row changed under this commit: {RELOAD}"))

    # -- the port ----------------------------------------------------------------------

    def sessions(self) -> list[str]:
        """The ids of every session in the store, sorted."""
        return self._read(
            lambda conn: [str(r["session_id"]) for r in self._select(conn, "sessions", "", ())]
        )

    def create_session(self, session_id: str, *, marker: int, max_attempts: int) -> None:
        """Create an empty session, durably; :class:`SessionExists` if it exists."""
        _check_session_values(session_id, marker, max_attempts)

        def body(conn: psycopg.Connection[Any]) -> None:
            row = {
                "session_id": session_id,
                "marker": marker,
                "max_attempts": max_attempts,
                "epoch": 0,
            }
            if self._insert(conn, "sessions", row).rowcount != 1:
                raise SessionExists(
                    f"session {session_id!r} already exists in {self.where}: open it with "
                    f"Ledger(store, {session_id!r}) instead of creating it"
                )

        self._write(f"creating session {session_id!r}", body)
        self.commits += 1

    def _epoch_row(
        self, conn: psycopg.Connection[Any], session_id: str, *, lock: bool = False
    ) -> tuple[Row, int]:
        rows = self._select(conn, "sessions", "WHERE session_id = %s", (session_id,), lock=lock)
        if not rows:
            raise UnknownSession(
                f"no session {session_id!r} in {self.where}: create it with create_session() "
                "first, or check the session id"
            )
        return rows[0], _int(rows[0]["epoch"], f"sessions[{session_id!r}].epoch", self._rows)

    def take_session(self, session_id: str) -> int:
        """Bump the session's lease epoch durably (one transaction) and return it."""
        taken: list[int] = []

        def body(conn: psycopg.Connection[Any]) -> None:
            row, epoch = self._epoch_row(conn, session_id, lock=True)
            self._update(conn, "sessions", row, {"epoch": epoch + 1})
            taken.append(epoch + 1)

        self._write(f"taking session {session_id!r}", body)
        return taken[0]

    def lease_epoch(self, session_id: str) -> int:
        """The session's current lease epoch."""
        return self._read(lambda conn: self._epoch_row(conn, session_id)[1])

    def _session_row(
        self, conn: psycopg.Connection[Any], session_id: str, *, lock: bool = False
    ) -> tuple[int, int]:
        return self._session_values(
            session_id,
            self._select(conn, "sessions", "WHERE session_id = %s", (session_id,), lock=lock),
        )

    def _session_values(self, session_id: str, rows: list[Row]) -> tuple[int, int]:
        """The marker and max_attempts of the session's row (:meth:`_session_row`)."""
        if not rows:
            raise UnknownSession(
                f"no session {session_id!r} in {self.where}: create it with create_session() "
                "first, or check the session id"
            )
        where = f"sessions[{session_id!r}]"
        return (
            _int(rows[0]["marker"], f"{where}.marker", self._rows),
            _int(rows[0]["max_attempts"], f"{where}.max_attempts", self._rows, minimum=1),
        )

    def load(self, session_id: str) -> SessionState:
        """The durable state of the session, as a restarted engine sees it (all of it)."""

        def body(conn: psycopg.Connection[Any]) -> SessionState:
            marker, max_attempts = self._session_row(conn, session_id)
            rows = self._select(conn, "calls", "WHERE session_id = %s", (session_id,))
            return self._state(conn, session_id, marker, max_attempts, rows)

        return self._read(body)

    def load_working_set(self, session_id: str) -> SessionState:
        """The open calls and those of the last turn, read through indexes only."""

        def body(conn: psycopg.Connection[Any]) -> SessionState:
            marker, max_attempts = self._session_row(conn, session_id)
            (last,) = self._exec(
                conn, "SELECT max(turn) FROM calls WHERE session_id = %s", (session_id,)
            ).fetchone()
            rows = self._select(
                conn, "calls", "WHERE session_id = %s AND result_kind IS NULL", (session_id,)
            )
            if last is not None:
                rows += self._select(
                    conn,
                    "calls",
                    "WHERE session_id = %s AND turn = %s AND result_kind IS NOT NULL",
                    (session_id, last),
                )
                rows.sort(key=lambda r: (r["turn"], r["slot"]))
            return self._state(conn, session_id, marker, max_attempts, rows)

        return self._read(body)

    def load_turn(self, session_id: str, turn: int) -> SessionState:
        """The durable calls of ``turn`` with what they own (by the primary key)."""

        def body(conn: psycopg.Connection[Any]) -> SessionState:
            marker, max_attempts = self._session_row(conn, session_id)
            rows = self._select(
                conn, "calls", "WHERE session_id = %s AND turn = %s", (session_id, turn)
            )
            rows.sort(key=lambda r: r["slot"])
            return self._state(conn, session_id, marker, max_attempts, rows)

        return self._read(body)

    def call_exists(self, session_id: str, position: CallPosition) -> bool:
        """Whether a durable call is at ``position`` (one primary-key lookup)."""

        def body(conn: psycopg.Connection[Any]) -> bool:
            self._session_row(conn, session_id)
            found = self._exec(
                conn,
                "SELECT 1 FROM calls WHERE session_id = %s AND turn = %s AND slot = %s",
                (session_id, position[0], position[1]),
            ).fetchone()
            return found is not None

        return self._read(body)

    def _state(
        self,
        conn: psycopg.Connection[Any],
        session_id: str,
        marker: int,
        max_attempts: int,
        call_rows: list[Row],
    ) -> SessionState:
        calls = tuple(self._rows._decode_call(session_id, r) for r in call_rows)
        eids = [c.execution_id for c in calls]
        approvals = {
            r["execution_id"]: _enum(
                ApprovalState, r["state"], f"approvals[{r['execution_id']!r}].state", self._rows
            )
            for r in self._owned(conn, session_id, "approvals", eids)
        }
        ledger = {}
        for r in self._owned(conn, session_id, "ledger", eids):
            rec = self._rows._decode_record(r)
            ledger[rec.execution_id] = rec
        audit = frozenset(
            self._rows._decode_audit(session_id, r).key
            for r in self._owned(conn, session_id, "audit", eids)
        )
        return SessionState(
            session_id=session_id,
            marker=marker,
            max_attempts=max_attempts,
            calls=calls,
            approvals=approvals,
            approval_digests=stored_approval_digests(calls, approvals),
            ledger=ledger,
            audit=audit,
        )

    def _owned(
        self, conn: psycopg.Connection[Any], session_id: str, table: str, eids: Sequence[str]
    ) -> list[Row]:
        rows: list[Row] = []
        for i in range(0, len(eids), _IN_CHUNK):
            chunk = list(eids[i : i + _IN_CHUNK])
            rows += self._select(conn, table, "WHERE execution_id = ANY(%s)", (chunk,))
        for r in rows:
            if r["session_id"] != session_id:
                raise self._corrupt(
                    f"the {table} row of execution {r['execution_id']!r} names session "
                    f"{r['session_id']!r}, but that execution is a call of {session_id!r}"
                )
        return rows

    def audit(self, session_id: str) -> list[AuditRow]:
        """Every audit row of the session, in the order they were written."""

        def body(conn: psycopg.Connection[Any]) -> list[AuditRow]:
            self._session_row(conn, session_id)
            rows = self._select(conn, "audit", "WHERE session_id = %s", (session_id,))
            return [self._rows._decode_audit(session_id, r) for r in rows]

        return self._read(body)

    def call_arguments(self, session_id: str, position: CallPosition) -> dict[str, Any] | None:
        """The stored arguments of the durable call at ``position`` (``None`` if not kept)."""

        def body(conn: psycopg.Connection[Any]) -> dict[str, Any] | None:
            self._session_row(conn, session_id)
            rows = self._select(
                conn,
                "calls",
                "WHERE session_id = %s AND turn = %s AND slot = %s",
                (session_id, position[0], position[1]),
            )
            if not rows or rows[0]["arguments"] is None:
                return None
            where = f"calls[{session_id!r}, {position}].arguments"
            return _json_object(rows[0]["arguments"], where, self._rows)

        return self._read(body)

    # -- committing ----------------------------------------------------------------------

    def _differs(
        self, conn: psycopg.Connection[Any], session_id: str, seen: CallView
    ) -> str | None:
        """What of the call ``seen`` describes differs from what is stored: one statement."""
        return self._differs_query(conn, session_id, seen)()

    def _differs_query(
        self, conn: psycopg.Connection[Any], session_id: str, seen: CallView
    ) -> Callable[[], str | None]:
        """Send :meth:`_differs`'s statement now; what differs when called."""
        cursor = self._exec(
            conn,
            f"SELECT c.execution_id, {', '.join(f'c.{r}' for r in _RESULT)}, "
            "(SELECT row_checksum FROM ledger WHERE execution_id = c.execution_id), "
            "(SELECT state FROM approvals WHERE execution_id = c.execution_id), "
            "(SELECT string_agg(kind || ' ' || attempt, ',') FROM audit "
            "WHERE execution_id = c.execution_id) "
            "FROM calls AS c WHERE c.session_id = %s AND c.turn = %s AND c.slot = %s",
            (session_id, *seen.position),
        )
        return lambda: stored_difference(cursor.fetchone(), session_id, seen)

    # The statement that serializes the commits of one session (see the module doc);
    # a class attribute so a test can remove the lock and watch the race get through.
    LOCK_SESSION: ClassVar[bool] = True

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
        """Make the transition ``before -> after`` durable in one transaction.

        With ``create=True`` the transaction first inserts the session's row
        (the session's first commit creates it; one that exists by then is
        :class:`~toolledger._core.stores.StaleState`, nothing written).
        Takes the session's row lock, checks the lease epoch if ``epoch`` is
        given (:class:`~toolledger._core.stores.LeaseLost` when another worker
        took the session since, nothing written), checks that what the commit was decided
        on is still stored (else :class:`~toolledger._core.stores.StaleState`,
        nothing written), writes, and returns after ``COMMIT``.
        """
        created = check_new_session(session_id, before) if create else None
        plan = plan_commit(session_id, before, after, audit_rows, arguments)
        if plan.empty:
            return

        def body(conn: psycopg.Connection[Any]) -> None:
            if created is not None:
                row = {"session_id": session_id, "marker": created[0],
                       "max_attempts": created[1], "epoch": 0}
                # RETURNING: read at once (in the pipeline too), so a session created
                # since is refused before anything else is sent
                cols = (*_DATA["sessions"], "row_checksum")
                got = self._exec(
                    conn,
                    f"INSERT INTO sessions ({_q(cols)}) VALUES ({', '.join(['%s'] * len(cols))}) "
                    "ON CONFLICT DO NOTHING RETURNING session_id",
                    (*(row[c] for c in _DATA["sessions"]), _checksum("sessions", row)),
                ).fetchone()
                if got is None:
                    raise StaleState(_CREATED_SINCE.format(session_id=session_id))
            if epoch is not None:
                check_lease(
                    session_id,
                    self._epoch_row(conn, session_id, lock=self.LOCK_SESSION)[1],
                    epoch,
                )
            # Every read the checks and the writers need is sent before the first is
            # read: in the pipeline, one round trip (the session's row lock first, so
            # the reads after it see what the lock's holder committed).
            session = self._query(conn, "sessions", "WHERE session_id = %s", (session_id,),
                                  lock=self.LOCK_SESSION)
            guards = {seen.position: self._differs_query(conn, session_id, seen)
                      for seen in plan.guards}
            prior = {new.position: self._query(
                conn, "calls", "WHERE session_id = %s AND turn = %s AND slot = %s",
                (session_id, *new.position)) for _, new in plan.results}
            approvals = {eid: self._query(conn, "approvals", "WHERE execution_id = %s", (eid,))
                         for eid, _, _ in plan.approvals}
            plan.check_session(
                session_id,
                self._session_values(session_id, session()),
                after,
                lambda seen: guards[seen.position](),
            )
            plan.write(
                call=lambda c, text: self._write_call(conn, session_id, c, text),
                result=lambda old, new: self._write_result(
                    conn, session_id, old, new, prior[new.position]()),
                approval=lambda eid, was, now: self._write_approval(
                    conn, session_id, eid, was, now, approvals[eid]()
                ),
                record=lambda old, new: self._write_record(conn, session_id, old, new),
                audit=lambda row: self._write_audit(conn, row),
            )

        # pipelined: the writes share round trips, their row counts are checked before
        # COMMIT (PgConnection._transaction)
        self._write(f"committing to session {session_id!r}", body, pipelined=True)
        self.commits += 1
        if plan.writes_ledger:
            self.ledger_commits += 1

    # -- the writes of one commit (separate so tests can inject failures) ----------------

    def _write_call(
        self, conn: psycopg.Connection[Any], session_id: str, call: CallState, arguments: str | None
    ) -> None:
        row = {
            "session_id": session_id,
            "turn": call.position[0],
            "slot": call.position[1],
            "tool_call_id": call.tool_call_id,
            "tool_name": call.tool.name,
            "policy": call.tool.policy.value,
            "requires_approval": int(call.tool.requires_approval),
            "execution_id": call.execution_id,
            "args_digest": call.args_digest,
            "arguments": arguments,
            "message_state": MessageState.DURABLE.value,
            **_result_values(call.result),
            "retention_window": call.tool.retention_window,
        }
        self._expect_one(self._insert(conn, "calls", row), StaleState(
            f"call {call.position} of session {session_id!r} is already durable: "
            f"another engine persisted it; {RELOAD}"
        ))

    def _write_result(
        self,
        conn: psycopg.Connection[Any],
        session_id: str,
        old: CallState,
        new: CallState,
        rows: list[Row] | None = None,
    ) -> None:
        """Set a call's result, only if it still is ``old``'s (``rows``: its row, read
        already in this transaction)."""
        if rows is None:
            rows = self._select(
                conn,
                "calls",
                "WHERE session_id = %s AND turn = %s AND slot = %s",
                (session_id, *new.position),
            )
        if not rows or any(rows[0][k] != v for k, v in _result_values(old.result).items()):
            raise StaleState(
                f"the result of call {new.position} of session {session_id!r} is not the one "
                f"this engine saw: another engine wrote it; {RELOAD}"
            )
        self._update(conn, "calls", rows[0], _result_values(new.result))

    def _write_approval(
        self,
        conn: psycopg.Connection[Any],
        session_id: str,
        execution_id: str,
        was: ApprovalState | None,
        now: ApprovalState,
        rows: list[Row] | None = None,
    ) -> None:
        if rows is None:  # else read already in this transaction
            rows = self._select(conn, "approvals", "WHERE execution_id = %s", (execution_id,))
        found = rows[0]["state"] if rows else None
        if found != (was.value if was is not None else None) or (
            rows and rows[0]["session_id"] != session_id
        ):
            raise StaleState(
                f"the approval of {execution_id} in session {session_id!r} is {found or 'absent'},"
                f" this engine saw {was.value if was else 'absent'}: {RELOAD}"
            )
        if rows:
            self._update(conn, "approvals", rows[0], {"state": now.value})
        else:
            row = {"execution_id": execution_id, "session_id": session_id, "state": now.value}
            self._expect_one(self._insert(conn, "approvals", row), StaleState(
                f"the approval of {execution_id} was just written: {RELOAD}"))

    def _write_record(
        self,
        conn: psycopg.Connection[Any],
        session_id: str,
        old: ExecutionRecord | None,
        new: ExecutionRecord,
    ) -> None:
        """Insert or replace a ledger row, only if it still is ``old``: one statement."""
        values = _record_values(session_id, new)
        stale = StaleState(
            f"the ledger record of {new.execution_id} in session {session_id!r} is not the "
            f"one this engine saw: another engine wrote it; {RELOAD}"
        )
        if old is None:
            self._expect_one(self._insert(conn, "ledger", values), stale)
            return
        columns = _DATA["ledger"]
        cursor = self._exec(
            conn,
            f"UPDATE ledger SET {_assign(columns)}, row_checksum = %s "
            "WHERE execution_id = %s AND row_checksum = %s",
            (
                *(values[c] for c in columns),
                _checksum("ledger", values),
                new.execution_id,
                _checksum("ledger", _record_values(session_id, old)),
            ),
        )
        self._expect_one(cursor, stale)

    def _write_audit(self, conn: psycopg.Connection[Any], row: AuditRow) -> None:
        self._insert(
            conn,
            "audit",
            {
                "session_id": row.session_id,
                "execution_id": row.execution_id,
                "tool_call_id": row.tool_call_id,
                "turn": row.position[0],
                "slot": row.position[1],
                "kind": row.kind,
                "attempt": row.attempt,
                "authorization": row.authorization.value,
                "recovery_decision": row.recovery_decision,
                "inputs": row.inputs_json(),
                "note": row.note,
                "recorded_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            },
        )
