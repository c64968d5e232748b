"""SqliteStore: the store port on one SQLite file, durable when a commit returns.

Private module of :mod:`toolledger`: import the public names from ``toolledger``.

What it is for
--------------
:class:`SqliteStore` keeps the sessions of the protocol core (calls with their
tool results, approvals, the execution ledger, the audit log and the protocol
marker) in ONE SQLite database, so that every transition the
:class:`~toolledger._core.ledger.Ledger` commits is one SQLite transaction.  The
conversation's tool calls and tool results live in the same database as the
ledger on purpose: ``succeeded(result)`` and the ``role="tool"`` result are
then written together, and a protected call costs exactly two ledger commits
(``dispatched``; ``succeeded`` + tool result).

Durability choice
-----------------
WAL journal with ``PRAGMA synchronous=FULL``: every ``COMMIT`` fsyncs the
write-ahead log before it returns, so a transition that returned is durable
across a process crash *and* a power loss, with one fsync per commit (the
rollback journal needs at least two).  ``synchronous=NORMAL`` would be wrong
here: in WAL mode it may lose the last commits on power loss, and the engine
invokes the adapter right after ``dispatched`` returns.  ``fullfsync`` is on
too (it only matters on macOS).  If the file system cannot do WAL (no shared
memory, e.g. some network file systems), SQLite stays in its rollback
journal, which with ``synchronous=FULL`` is equally durable;
:attr:`SqliteStore.journal_mode` says which one is in use.  In WAL mode
committed transactions may sit in the ``-wal`` file next to the database
until a checkpoint: copy or move the files together, and only while no store
has the file open.  The syncs are observed, not assumed:
``tests/test_sqlite_durability.py`` traces them (``strace``) in order, and
``benchmarks/power_loss.py`` opens every file state a power cut may leave.

Every durable transition is ``BEGIN IMMEDIATE ... COMMIT`` on a connection in
autocommit mode (``isolation_level=None``), so Python never opens or commits
a transaction behind our back.  Reads (``load``, ``audit``) run in a deferred
read transaction that ends with ``ROLLBACK``: they see one snapshot and can
never write.

Schema (version :data:`SCHEMA_VERSION`)
---------------------------------------
==========  ===============================================================
table       columns (every table but ``meta`` ends with ``row_checksum``)
==========  ===============================================================
meta        singleton (=1), schema_version, created
sessions    session_id PK, marker, max_attempts, epoch (the lease epoch)
calls       session_id, turn, slot (PK together), tool_call_id, tool_name,
            policy, requires_approval, execution_id, args_digest,
            arguments, message_state, result_kind, result_content,
            result_execution_id, result_args_digest, retention_window,
            row_checksum; then the call's execution record:
            record_status, record_attempt, record_args_digest,
            record_authorization, record_result_kind, record_result_content,
            record_result_execution_id, record_result_args_digest,
            record_turn, record_slot, record_dispatched_at, record_checksum
            (all NULL: no record yet)
approvals   execution_id PK, session_id, state (WITHOUT ROWID)
audit       id (rowid: increasing, rows are never deleted), session_id,
            execution_id, tool_call_id, turn, slot, kind, attempt,
            authorization, recovery_decision, inputs (JSON), note,
            recorded_at; append-only (triggers refuse UPDATE and DELETE)
==========  ===============================================================

A record always belongs to a durable call of its session, so it is kept in
that call's row (schema 7; PostgreSQL keeps a ``ledger`` table): the
``record_*`` columns hold the columns of a ``ledger`` row and
``record_checksum`` its checksum, the same value PostgreSQL's ``ledger`` row
has.  Values that repeat the call's own (the record's digest; once there is
a result, its execution id, digest and content, and the same for the call's
result) are stored as NULL and read back from the call's columns; every
checksum is over the values, so damage either way fails its check.

Indexes: ``calls_open`` (the calls without a result, partial) and
``audit_by_session`` (session_id, turn, slot).  They are what keeps a recovery independent of
the history: :meth:`SqliteStore.load_working_set` reads the open calls and
the last turn through them (with their records), and the approvals and
audit keys of those calls by execution id and by position.  A protected
call's two commits touch a handful of pages (the call's row, with its record
and result, and its ``calls_open`` entry; the audit row and its index
entry), which is what each fsync carries.

``calls.arguments`` keeps the JSON arguments the model emitted (NULL if the
engine did not give them): only their digest is protocol-relevant, but a
retry after a crash must invoke the adapter with the same arguments, and the
engine's memory is gone by then.  ``row_checksum`` is a SHA-256 of the row's
values (all but ``audit.id``): SQLite keeps no checksums of its own, and a
flipped byte inside a stored value must fail closed rather than drive a
recovery decision.  The file carries ``PRAGMA application_id`` =
:data:`APPLICATION_ID`.

Opening fails closed
--------------------
Opening a missing path creates the schema.  Opening an existing file first
checks, without writing anything: the SQLite header and the file size (a
file truncated to less than the pages its header announces), the
application id, the schema version, every table's columns and the named
indexes and triggers.  That costs the same for any size of file.  Then
every row read, by any operation, is checked against its checksum and
decoded strictly (enum values, execution ids re-derived from their
position, argument digests) before anything acts on it, and SQLite reports
a damaged page it has to read ("malformed").  So a recovery reads, and
checks, exactly the rows its decision depends on: the open calls and their
records, never the settled history.  :meth:`SqliteStore.verify` checks the
whole file (``PRAGMA quick_check``, every row, ownership of every record),
for operators and backups; :func:`verify_file` (``toolledger verify-store``)
runs it on a private copy of the file and its ``-wal``, because opening a
store whose last writer was killed folds its ``-wal`` into the file.  A
damaged, truncated, empty or foreign file raises
:class:`~toolledger._core.stores.StoreCorrupt`; a file from a newer (or unknown)
schema raises :class:`~toolledger._core.stores.UnsupportedSchema`.  Both name the
file, say what was found and what to do; the file is left byte for byte as
it was, and nothing was executed.

What it must never do: decide anything, write while opening a file it has
not validated, write outside one transaction, update or delete an audit row,
or return from a commit before SQLite has made it durable.

The schema (DDL, version, application id) and the checks on a file's bytes
before it is opened are in :mod:`toolledger._core.sqlite_schema`; the columns,
checksums and row decoding shared with PostgreSQL in :mod:`toolledger._core.rows`;
the checked reads and writes of rows and the assembly of a session's state
from them in :mod:`toolledger._core.sqlite_rows`; :func:`verify_file` in
:mod:`toolledger._core.sqlite_verify`; group commit in
:mod:`toolledger._core.groupcommit`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from .groupcommit import GroupCommitter
from .protocol import (
    ApprovalState,
    CallPosition,
    CallState,
    ExecutionRecord,
    InvalidInput,
    MessageState,
    SessionState,
)
from .rows import (
    Row,
    _checksum,
    _int,
    _json_object,
    _record_values,
    _result_values,
)
from .sqlite_rows import SqliteRows, packed_record
from .sqlite_schema import (
    _COLUMNS,
    _OBJECTS,
    _SCHEMA,
    APPLICATION_ID,
    PAGE_SIZE,
    SCHEMA_VERSION,
    _check_file,
    schema_text,
)
from .stores import (
    _CREATED_SINCE,
    RELOAD,
    AuditRow,
    SessionExists,
    StaleState,
    StoreCorrupt,
    StoreError,
    UnknownSession,
    UnsupportedSchema,
    _check_session_values,
    check_lease,
    check_new_session,
    plan_commit,
)

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "SqliteStore"]

_T = TypeVar("_T")


def _not_utf8(exc: UnicodeDecodeError) -> str:
    # sqlite3 decodes TEXT as UTF-8 before any checksum can be compared: a
    # damaged byte in a name, a schema text or a row's text shows up here
    return f"a stored text is not valid UTF-8, a damaged byte ({exc})"


def _creator_alive(rest: str) -> bool:
    """Whether the process that named a temporary store file ``<pid>.<...>`` still runs."""
    pid = rest.split(".", 1)[0]
    if not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return True  # this process: another thread of it may be creating the store
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


class SqliteStore(SqliteRows):
    """A :class:`~toolledger._core.stores.Store` on one SQLite file (see the module doc).

    ``SqliteStore(path)`` opens or creates the store at ``path`` (a file path;
    its directory must exist).  It raises
    :class:`~toolledger._core.stores.StoreCorrupt` or
    :class:`~toolledger._core.stores.UnsupportedSchema` for a file it must not use,
    having written nothing.  One object holds one connection, guarded by a
    lock, so it may be used from several threads; several objects (or
    processes) may open the same file: writes are serialized by SQLite, and a
    commit whose ``before`` is stale raises :class:`~toolledger._core.stores.StaleState`.

    ``commits`` counts the transactions made by :meth:`create_session` and
    :meth:`commit` (not the schema creation); ``ledger_commits`` the commits
    that wrote a ledger record; :attr:`syncs` the SQLite ``COMMIT`` statements
    that made them durable (one fsync of the WAL each).

    ``group_commit=True`` (opt-in): commits made at the same time by several
    threads of this process (one session each, sharing this store object)
    share one SQLite transaction and one fsync
    (:class:`~toolledger._core.groupcommit.GroupCommitter`): each ``commit``
    still returns only after the fsync that covers it, a stale writer is still
    refused alone, and a failed shared transaction fails every commit in it
    with nothing written.  Then ``syncs`` < ``commits``.  Without it (the
    default) ``syncs == commits``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 5.0,
        group_commit: bool = False,
    ) -> None:
        if not isinstance(group_commit, bool):
            raise InvalidInput(f"group_commit must be True or False, got {group_commit!r}")
        text = os.fspath(path)
        if not isinstance(text, str) or text in ("", ":memory:") or text.startswith("file:"):
            raise InvalidInput(
                f"SqliteStore needs a file path, got {path!r}: an in-memory SQLite database "
                "is not durable (use MemoryStore for tests) and URIs are not accepted"
            )
        self.path = Path(text)
        self.commits = 0
        self.ledger_commits = 0
        self.journal_mode = ""
        self._lock = threading.RLock()
        self._counting = threading.Lock()  # commits of several threads (group commit)
        self._syncs = 0
        self._group = (
            GroupCommitter(
                connection=self._live,
                lock=self._lock,
                sql_error=self._sql_error,
                rollback=self._rollback,
            )
            if group_commit
            else None
        )
        self._broken: str | None = None
        self._conn: sqlite3.Connection | None = None
        if not self.path.exists():
            if not self.path.parent.is_dir():
                raise StoreError(
                    f"cannot create the store {self.path}: directory {self.path.parent} does "
                    "not exist; create it first"
                )
            self._create_atomically()
        if not self.path.is_file():
            raise StoreError(f"{self.path} exists but is not a regular file: pass a file path")
        _check_file(self.path)
        try:
            conn = sqlite3.connect(
                self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StoreError(
                f"cannot open {self.path} ({exc}): check the path and permissions"
            ) from exc
        try:
            fresh = self._validate(conn)
            self._configure(conn)
            if fresh:
                self._create_schema(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    # -- opening ----------------------------------------------------------------

    def _create_atomically(self) -> None:
        """Create the file with its schema so that no crash can leave it half made.

        The schema is written to a temporary file beside it, fsynced, and
        linked into place (``os.link`` fails if the path appeared meanwhile:
        a concurrent creator wins, nothing is overwritten), then the directory
        is fsynced.  A SIGKILL at any point leaves either no store (and a
        stray temporary file, removed by the next creator) or a complete one:
        never the empty file that an in-place creation leaves behind, which
        is refused as corrupt.  The temporary file is named after its
        creator's process (and a random token, for threads): a stray is a
        file whose process is gone, so a creator never removes the files of
        one creating the same store at the same time
        (tests/test_sqlite_durability.py races two processes).
        """
        tmp = self.path.with_name(
            f".{self.path.name}.{os.getpid()}.{secrets.token_hex(4)}.creating")
        for stray in self.path.parent.glob(f".{self.path.name}.*.creating*"):
            if not _creator_alive(stray.name[len(self.path.name) + 2:]):
                stray.unlink(missing_ok=True)
        try:
            conn = sqlite3.connect(tmp, isolation_level=None)
            try:
                conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")  # before WAL: fixed after
                self._configure(conn)
                self._create_schema(conn)
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                conn.close()  # the last connection: the WAL is folded into the file
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            # another process may have created it first: then use theirs
            with contextlib.suppress(FileExistsError):
                os.link(tmp, self.path)
            dfd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot create the store {self.path} ({exc})") from exc
        finally:
            for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
                leftover.unlink(missing_ok=True)

    def _corrupt(self, what: str) -> StoreCorrupt:
        return StoreCorrupt(
            f"{self.path} is not a usable toolledger store: {what}. Nothing was executed or "
            "written. Restore the file from a backup, or move it aside to start an empty "
            "store (every session in it would be lost).",
            path=str(self.path),
        )

    def _unsupported(self, what: str, found: int | None) -> UnsupportedSchema:
        return UnsupportedSchema(
            f"{self.path} {what} Nothing was executed or written.",
            path=str(self.path),
            found=found,
            supported=SCHEMA_VERSION,
        )

    def _validate(self, conn: sqlite3.Connection) -> bool:
        """Check an opened file without writing; True if it is an empty database."""
        try:
            conn.execute("PRAGMA query_only = ON")
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            tables = {
                str(r[0])
                for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            } - {"sqlite_sequence"}
            if not tables and app_id == 0:
                conn.execute("PRAGMA query_only = OFF")
                return True
            if app_id not in (0, APPLICATION_ID):
                raise self._unsupported(
                    f"is a SQLite database of another application (application_id "
                    f"{app_id:#x}; a toolledger store has {APPLICATION_ID:#x}): point the "
                    "store at its own file.",
                    None,
                )
            if "meta" not in tables:
                if app_id == APPLICATION_ID:
                    raise self._corrupt("its meta table is missing")
                raise self._unsupported(
                    f"is a SQLite database but not a toolledger store (its tables: "
                    f"{', '.join(sorted(tables))}): point the store at its own file.",
                    None,
                )
            rows = conn.execute("SELECT schema_version FROM meta").fetchall()
            if len(rows) != 1 or isinstance(rows[0][0], bool) or not isinstance(rows[0][0], int):
                raise self._corrupt(f"its meta table holds {rows!r}, not one schema version")
            version: int = rows[0][0]
            if version != SCHEMA_VERSION:
                raise self._unsupported(
                    f"has toolledger schema version {version}; this toolledger reads version "
                    f"{SCHEMA_VERSION} only. "
                    + (
                        "It was written by a newer toolledger: open it with that version "
                        "(upgrade toolledger)."
                        if version > SCHEMA_VERSION
                        else "No migration from that version exists: open it with the "
                        "toolledger that wrote it."
                    ),
                    version,
                )
            for table, expected in _COLUMNS.items():
                found = tuple(str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})"))
                if found != expected:
                    raise self._corrupt(
                        f"table {table} has columns {found or '(none: it is missing)'}, "
                        f"schema version {SCHEMA_VERSION} has {expected}"
                    )
            objects = {
                str(r[0])
                for r in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type IN ('index', 'trigger')"
                )
            }
            missing = sorted(_OBJECTS - objects)
            if missing:
                raise self._corrupt(f"its indexes or triggers {', '.join(missing)} are missing")
            texts = schema_text()
            for name, sql in conn.execute(
                "SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL"
            ):
                if name in texts and sql != texts[name]:
                    raise self._corrupt(
                        f"the schema text of {name} is not schema version {SCHEMA_VERSION}'s "
                        "(a damaged byte changes what SQLite enforces)"
                    )
            conn.execute("PRAGMA query_only = OFF")
        except sqlite3.DatabaseError as exc:
            raise self._corrupt(f"SQLite cannot read it ({exc})") from exc
        except UnicodeDecodeError as exc:
            raise self._corrupt(_not_utf8(exc)) from exc
        return False

    def _configure(self, conn: sqlite3.Connection) -> None:
        try:
            mode = str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]).lower()
            if mode not in ("wal", "delete", "truncate", "persist"):
                raise StoreError(
                    f"{self.path}: SQLite uses journal mode {mode!r}, which is not durable: "
                    "use a regular file on a local file system"
                )
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA fullfsync = ON")
            conn.execute("PRAGMA checkpoint_fullfsync = ON")
            conn.execute("PRAGMA foreign_keys = ON")
            if conn.execute("PRAGMA synchronous").fetchone()[0] != 2:
                raise StoreError(f"{self.path}: SQLite refused synchronous=FULL")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot configure {self.path} ({exc})") from exc
        self.journal_mode = mode

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                exists = conn.execute(
                    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
                ).fetchone()[0]
                if not exists:  # another process may have created it since we looked
                    for statement in _SCHEMA:
                        conn.execute(statement)
                    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                    conn.execute(
                        "INSERT INTO meta (singleton, schema_version, created) VALUES (1, ?, ?)",
                        (SCHEMA_VERSION, datetime.now(UTC).isoformat(timespec="seconds")),
                    )
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise StoreError(f"cannot create the schema in {self.path} ({exc})") from exc
        if exists:
            self._validate(conn)

    # -- lifecycle ----------------------------------------------------------------

    @property
    def syncs(self) -> int:
        """The write transactions committed (each one fsync of the WAL): ``commits``
        without group commit, fewer with it when commits of several threads overlap."""
        return self._syncs + (self._group.groups if self._group is not None else 0)

    @property
    def group_commit(self) -> bool:
        """Whether commits of concurrent threads share transactions (see the class doc)."""
        return self._group is not None

    @property
    def connection(self) -> sqlite3.Connection:
        """The underlying connection, for inspection (pragmas, tracing) only.

        Never write through it: the store's checks and counters would not see it.
        """
        return self._live()

    def close(self) -> None:
        """Close the connection; idempotent.  Everything committed stays durable."""
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    def _live(self) -> sqlite3.Connection:
        if self._broken is not None:
            raise StoreError(
                f"{self.path}: this store object is unusable after {self._broken}; open a new "
                "SqliteStore (what a restarted engine does)"
            )
        if self._conn is None:
            raise StoreError(f"{self.path}: this store is closed; open a new SqliteStore")
        return self._conn

    def _sql_error(self, what: str, exc: sqlite3.Error, *, reading: bool = False) -> StoreError:
        """The typed error for a SQLite error.

        Locked or busy: a plain :class:`StoreError` (try again).  Damage SQLite
        reports (a malformed page, text that is not UTF-8, ...) is
        :class:`StoreCorrupt`; so is any other database error while reading
        a file whose schema was checked on open (``reading``): a read that
        fails there has met a damaged file.  Other write errors (a full disk,
        a read-only file) stay plain :class:`StoreError`.
        """
        text = str(exc)
        if isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text):
            return StoreError(
                f"{self.path}: {what} failed: the database stayed locked by another "
                f"connection beyond the busy timeout ({text}); nothing was written, try again"
            )
        damaged = ("malformed", "not a database", "corrupt", "could not decode")
        if isinstance(exc, sqlite3.DatabaseError) and (
            reading or any(word in text.lower() for word in damaged)
        ):
            return self._corrupt(f"{what} failed: {text}")
        return StoreError(f"{self.path}: {what} failed ({text}); nothing was written")

    def _write_transaction(self, what: str, body: Callable[[sqlite3.Connection], None]) -> None:
        """Run ``body`` in ``BEGIN IMMEDIATE ... COMMIT``: all of it or nothing.

        With group commit, ``body`` runs in a transaction shared with other
        threads' bodies (in its own savepoint); either way this returns only
        after the ``COMMIT`` that made it durable.
        """
        if self._group is not None:
            self._group.run(what, body)
            return
        with self._lock:
            conn = self._live()
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise self._sql_error(what, exc) from exc
            try:
                body(conn)
                conn.execute("COMMIT")
                self._syncs += 1
            except BaseException as exc:
                self._rollback(conn, what)
                if isinstance(exc, sqlite3.Error):
                    raise self._sql_error(what, exc) from exc
                if isinstance(exc, UnicodeDecodeError):
                    raise self._corrupt(_not_utf8(exc)) from exc
                raise

    def _rollback(self, conn: sqlite3.Connection, what: str) -> None:
        if not conn.in_transaction:
            return
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            # The connection's state is unknown now: refuse to go on with it.
            self._broken = f"a failed rollback during {what} ({exc})"
            self._conn = None
            conn.close()

    def _read(self, body: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``body`` in a read transaction (one snapshot) that ends with ROLLBACK."""
        with self._lock:
            conn = self._live()
            try:
                conn.execute("BEGIN")
                try:
                    return body(conn)
                finally:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
            except sqlite3.Error as exc:
                raise self._sql_error("reading", exc, reading=True) from exc
            except UnicodeDecodeError as exc:
                raise self._corrupt(_not_utf8(exc)) from exc

    # -- the port -----------------------------------------------------------------

    def sessions(self) -> list[str]:
        """The ids of every session in the store, sorted."""
        return self._read(
            lambda conn: [str(r["session_id"]) for r in self._select(conn, "sessions", "", ())]
        )

    def create_session(self, session_id: str, *, marker: int, max_attempts: int) -> None:
        """Create an empty session, durably; :class:`SessionExists` if it exists."""
        _check_session_values(session_id, marker, max_attempts)

        def body(conn: sqlite3.Connection) -> None:
            if self._select(conn, "sessions", "WHERE session_id = ?", (session_id,)):
                raise SessionExists(
                    f"session {session_id!r} already exists in {self.path}: open it with "
                    f"Ledger(store, {session_id!r}) instead of creating it"
                )
            self._insert(
                conn,
                "sessions",
                {
                    "session_id": session_id,
                    "marker": marker,
                    "max_attempts": max_attempts,
                    "epoch": 0,
                },
            )

        self._write_transaction(f"creating session {session_id!r}", body)
        with self._counting:
            self.commits += 1

    def _epoch_row(self, conn: sqlite3.Connection, session_id: str) -> tuple[Row, int]:
        rows = self._select(conn, "sessions", "WHERE session_id = ?", (session_id,))
        if not rows:
            raise UnknownSession(
                f"no session {session_id!r} in {self.path}: create it with create_session() "
                "first, or check the session id"
            )
        return rows[0], _int(rows[0]["epoch"], f"sessions[{session_id!r}].epoch", self)

    def take_session(self, session_id: str) -> int:
        """Bump the session's lease epoch durably (one transaction) and return it."""
        taken: list[int] = []

        def body(conn: sqlite3.Connection) -> None:
            row, epoch = self._epoch_row(conn, session_id)
            self._update(conn, "sessions", row, {"epoch": epoch + 1})
            taken.append(epoch + 1)

        self._write_transaction(f"taking session {session_id!r}", body)
        return taken[0]

    def lease_epoch(self, session_id: str) -> int:
        """The session's current lease epoch."""
        return self._read(lambda conn: self._epoch_row(conn, session_id)[1])

    def _session_row(self, conn: sqlite3.Connection, session_id: str) -> tuple[int, int]:
        rows = self._select(conn, "sessions", "WHERE session_id = ?", (session_id,))
        if not rows:
            raise UnknownSession(
                f"no session {session_id!r} in {self.path}: create it with create_session() "
                "first, or check the session id"
            )
        where = f"sessions[{session_id!r}]"
        return (
            _int(rows[0]["marker"], f"{where}.marker", self),
            _int(rows[0]["max_attempts"], f"{where}.max_attempts", self, minimum=1),
        )

    def load(self, session_id: str) -> SessionState:
        """The durable state of the session, as a restarted engine sees it (all of it)."""
        return self._read(lambda conn: self._load(conn, session_id))

    def load_working_set(self, session_id: str) -> SessionState:
        """The calls without a result and those of the last turn, with what belongs to them.

        Read through indexes (``calls_open`` and the primary keys): the cost
        does not grow with the settled history.  Every row read is checked
        against its checksum.
        """
        return self._read(lambda conn: self._load_working_set(conn, session_id))

    def load_turn(self, session_id: str, turn: int) -> SessionState:
        """The durable calls of ``turn`` with what they own (by the primary key)."""

        def body(conn: sqlite3.Connection) -> SessionState:
            marker, max_attempts = self._session_row(conn, session_id)
            rows = self._select(
                conn, "calls", "WHERE session_id = ? AND turn = ?", (session_id, turn)
            )
            rows.sort(key=lambda r: r["slot"])
            return self._state(conn, session_id, marker, max_attempts, rows)

        return self._read(body)

    def call_exists(self, session_id: str, position: CallPosition) -> bool:
        """Whether a durable call is at ``position`` (one primary-key lookup)."""

        def body(conn: sqlite3.Connection) -> bool:
            self._session_row(conn, session_id)
            found = conn.execute(
                "SELECT 1 FROM calls WHERE session_id = ? AND turn = ? AND slot = ?",
                (session_id, position[0], position[1]),
            ).fetchone()
            return found is not None

        return self._read(body)

    def verify(self) -> None:
        """Read and check the whole file; raise ``StoreCorrupt`` on the first problem.

        Opening checks only what every use needs (header, size, schema), and
        every later read checks the rows it reads, so a recovery never reads
        the settled history.  ``verify`` is the full check, for backups,
        audits and operators (``toolledger verify-store PATH``): SQLite's
        ``PRAGMA quick_check``, every row's checksum, that every approval,
        ledger record and audit row belongs to a call of its session, and
        that every session decodes into a valid state.  Writes nothing itself,
        but opening the store may have folded a ``-wal`` into the file: to
        leave every file of a store untouched use :func:`verify_file`.
        """

        def body(conn: sqlite3.Connection) -> None:
            problems = [str(r[0]) for r in conn.execute("PRAGMA quick_check(5)")]
            if problems != ["ok"]:
                raise self._corrupt("PRAGMA quick_check found: " + "; ".join(problems))
            # every row's checksum (a call's record too: schema 7 keeps it in the call's row,
            # so a record always belongs to its call)
            rows = {table: self._select(conn, table, "", ()) for table in _COLUMNS
                    if table != "meta"}
            owner = {r["execution_id"]: r["session_id"] for r in rows["calls"]}
            for table in ("approvals", "audit"):
                for r in rows[table]:
                    if owner.get(r["execution_id"]) != r["session_id"]:
                        raise self._corrupt(
                            f"the {table} row of execution {r['execution_id']!r} belongs to "
                            f"no call of session {r['session_id']!r}"
                        )
            for r in rows["sessions"]:
                self._load(conn, r["session_id"])  # every session decodes into a valid state

        self._read(body)

    def audit(self, session_id: str) -> list[AuditRow]:
        """Every audit row of the session, in the order they were written."""

        def body(conn: sqlite3.Connection) -> list[AuditRow]:
            self._session_row(conn, session_id)
            rows = self._select(conn, "audit", "WHERE session_id = ?", (session_id,))
            return [self._decode_audit(session_id, r) for r in rows]

        return self._read(body)

    def call_arguments(self, session_id: str, position: CallPosition) -> dict[str, Any] | None:
        """The stored arguments of the durable call at ``position`` (``None`` if not kept)."""

        def body(conn: sqlite3.Connection) -> dict[str, Any] | None:
            self._session_row(conn, session_id)
            rows = self._select(
                conn,
                "calls",
                "WHERE session_id = ? AND turn = ? AND slot = ?",
                (session_id, position[0], position[1]),
            )
            if not rows or rows[0]["arguments"] is None:
                return None
            where = f"calls[{session_id!r}, {position}].arguments"
            return _json_object(rows[0]["arguments"], where, self)

        return self._read(body)

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
        Then, inside the transaction, the lease: with ``epoch`` given, a
        session taken since by another worker raises
        :class:`~toolledger._core.stores.LeaseLost` before anything is written.
        Writes ``durable_changes(before, after)`` and ``audit_rows`` (see
        :func:`~toolledger._core.stores.plan_commit` for the checks), each row only
        if what is stored is still what ``before`` says (else
        :class:`~toolledger._core.stores.StaleState`, nothing written).  Returns
        after ``COMMIT``, i.e. after the fsync.
        """
        created = check_new_session(session_id, before) if create else None
        plan = plan_commit(session_id, before, after, audit_rows, arguments)
        if plan.empty:
            return

        # plan_commit refuses a record that is not a durable call's of ``after``
        owners = {c.execution_id: c for c in after.calls}
        # A record written in the same commit as its call's row (a new call
        # dispatched at once) or as its call's result (an outcome) rides in that
        # row's one statement: one INSERT, or one UPDATE, per call
        # (bench_peers: statements per call).
        new_ids = {c.execution_id for c, _ in plan.new_calls}
        result_ids = {new.execution_id for _, new in plan.results}
        riding = {new.execution_id: (old, new) for old, new in plan.records
                  if (old is None and new.execution_id in new_ids)
                  or new.execution_id in result_ids}

        def body(conn: sqlite3.Connection) -> None:
            if created is not None:
                if self._select(conn, "sessions", "WHERE session_id = ?", (session_id,)):
                    raise StaleState(_CREATED_SINCE.format(session_id=session_id))
                self._insert(conn, "sessions", {"session_id": session_id, "marker": created[0],
                                                "max_attempts": created[1], "epoch": 0})
            if epoch is not None:
                check_lease(session_id, self._epoch_row(conn, session_id)[1], epoch)
            plan.check_session(
                session_id,
                self._session_row(conn, session_id),
                after,
                lambda seen: self._differs(conn, session_id, seen),
            )
            plan.write(
                call=lambda c, text: self._write_call(
                    conn, session_id, c, text, riding.get(c.execution_id, (None, None))[1]
                ),
                result=lambda old, new: self._write_result(
                    conn, session_id, old, new, riding.get(new.execution_id)
                ),
                approval=lambda eid, was, now: self._write_approval(
                    conn, session_id, eid, was, now
                ),
                record=lambda old, new: None if new.execution_id in riding else (
                    self._write_record(conn, session_id, owners[new.execution_id], old, new)
                ),
                audit=lambda row: self._write_audit(conn, row),
            )

        self._write_transaction(f"committing to session {session_id!r}", body)
        with self._counting:
            self.commits += 1
            if plan.writes_ledger:
                self.ledger_commits += 1

    # -- the writes of one commit (separate so tests can inject failures) ---------

    def _write_call(
        self,
        conn: sqlite3.Connection,
        session_id: str,
        call: CallState,
        arguments: str | None,
        record: ExecutionRecord | None = None,
    ) -> None:
        """Insert a new call's row; with ``record`` (its first, written in the same
        commit) the record's columns and checksum go into the same INSERT."""
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
        extra: Row = {}
        if record is not None:
            values = _record_values(session_id, record)
            extra = {**packed_record(call, values), "record_checksum": _checksum("ledger", values)}
        try:
            self._insert(conn, "calls", row, extra)
        except sqlite3.IntegrityError as exc:
            raise StaleState(
                f"call {call.position} of session {session_id!r} is already durable ({exc}): "
                f"another engine persisted it; {RELOAD}"
            ) from exc

    def _write_result(
        self,
        conn: sqlite3.Connection,
        session_id: str,
        old: CallState,
        new: CallState,
        record: tuple[ExecutionRecord | None, ExecutionRecord] | None = None,
    ) -> None:
        """Set a call's result, only if it still is ``old``'s; with ``record`` (the
        call's record, ``(before, after)``, changed in the same commit) the
        record's columns go into the same UPDATE, only if the stored record is
        still ``before`` (the check :meth:`_write_record` makes)."""
        rows = self._select(
            conn,
            "calls",
            "WHERE session_id = ? AND turn = ? AND slot = ?",
            (session_id, *new.position),
        )
        if not rows or any(rows[0][k] != v for k, v in _result_values(old.result).items()):
            raise StaleState(
                f"the result of call {new.position} of session {session_id!r} is not the one "
                f"this engine saw: another engine wrote it; {RELOAD}"
            )
        extra: Row = {}
        if record is not None:
            was, rec = record
            expected = None if was is None else _checksum("ledger", _record_values(session_id, was))
            if rows[0]["record_checksum"] != expected:
                raise StaleState(
                    f"the ledger record of {rec.execution_id} in session {session_id!r} is not "
                    f"the one this engine saw: another engine wrote it; {RELOAD}"
                )
            values = _record_values(session_id, rec)
            extra = {**packed_record(new, values), "record_checksum": _checksum("ledger", values)}
        self._update(conn, "calls", rows[0], _result_values(new.result), extra)

    def _write_approval(
        self,
        conn: sqlite3.Connection,
        session_id: str,
        execution_id: str,
        was: ApprovalState | None,
        now: ApprovalState,
    ) -> None:
        rows = self._select(conn, "approvals", "WHERE execution_id = ?", (execution_id,))
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
            self._insert(conn, "approvals", row)

    def _write_record(
        self,
        conn: sqlite3.Connection,
        session_id: str,
        call: CallState,
        old: ExecutionRecord | None,
        new: ExecutionRecord,
    ) -> None:
        """Set the record in its call's row, only if it still is ``old``: one statement.

        The record's columns hold nothing but the record, so the checksum of
        the record this engine saw is known without reading it: the UPDATE
        matches only the call's row whose ``record_checksum`` is that one
        (NULL: no record yet).  Only non-indexed columns are SET (the key and
        ``result_kind``, which ``calls_open`` names, are not), so SQLite
        rewrites no index entry (bench_bytes: pages per commit).
        """
        values = _record_values(session_id, new)
        expected = None if old is None else _checksum("ledger", _record_values(session_id, old))
        columns = list(packed_record(call, values).items())
        cursor = conn.execute(
            f"UPDATE calls SET {', '.join(f'{c} = ?' for c, _ in columns)}, "
            "record_checksum = ? WHERE session_id = ? AND turn = ? AND slot = ? "
            "AND execution_id = ? AND record_checksum IS ?",
            (
                *(v for _, v in columns),
                _checksum("ledger", values),
                session_id,
                *call.position,
                new.execution_id,
                expected,
            ),
        )
        if cursor.rowcount != 1:
            raise StaleState(
                f"the ledger record of {new.execution_id} in session {session_id!r} is not the "
                f"one this engine saw: another engine wrote it; {RELOAD}"
            )

    def _write_audit(self, conn: sqlite3.Connection, row: AuditRow) -> None:
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
