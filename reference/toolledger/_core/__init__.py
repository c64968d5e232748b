"""The private, stdlib-only core of toolledger: import from :mod:`toolledger`.

An engine imports the public names re-exported by the ``toolledger`` package
(``from toolledger import Session, Tool, SqliteStore``), never from here: the
modules of this package are internals and may be split or renamed.  They are

- ``protocol``: the pure, I/O-free state machine (events, transitions),
  re-exporting ``state`` (its vocabulary and state values) and ``recovery``
  (the recovery decision ``decide_recovery``);
- ``ledger``: the durable ledger of one session on a store;
- ``session``: the adopter's API over the ledger (``Session``), with
  ``calls``: what it takes and gives per tool and call (``Tool``, ``Outcome``, ...),
  ``session_guard``: its lock and store-error guard, ``call_input``: the
  validation of what an engine hands it, ``next_step``: what a call's state
  says to do next, and ``legacy``: legacy adoption; ``async_session``: the
  same API for asyncio (``AsyncSession``), with no store I/O on the event loop;
- ``tools``: the adapter seam, the tool registry and the reserved argument names;
- ``stores``: the store port and ``MemoryStore``, re-exporting ``store_errors``
  (what a store raises, the lease check) and ``commit_plan`` (the audit rows
  and the checked plan of a commit every store writes); ``sqlite_store`` and
  ``postgres_store``: the durable stores (psycopg is imported only when a
  ``PostgresStore`` is opened, by ``pg_connection``: its connection and
  transactions; ``pg_schema``: its tables), with ``rows``: their shared
  columns, checksums and row decoding; the SQLite store's schema in
  ``sqlite_schema``, its row layer in ``sqlite_rows``, ``verify_file`` in
  ``sqlite_verify`` and its opt-in group commit in ``groupcommit``.

Nothing here imports a third-party package at import time.
"""
