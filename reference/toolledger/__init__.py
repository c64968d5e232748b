"""toolledger: crash-safe, side-effecting tool calls for AI-agent engines.

The protocol is specified in ``spec/DurableToolExecution.tla`` and checked by
TLC; this package is its reference implementation.

What an engine imports is re-exported here (stdlib only)::

    from toolledger import Session, Tool, NotApplied, SqliteStore

- :class:`Session` (:mod:`toolledger.session`): the adopter's API, one
  session's tool calls on a store: record, approve, execute, recover, resolve;
- :class:`Tool`, :class:`NotApplied`, :class:`Outcome`: what an engine declares
  per tool and how a tool says how its call ended;
- :class:`MemoryStore`, :class:`SqliteStore`: where the ledger lives.

The modules underneath: :mod:`toolledger.protocol` (the pure, I/O-free state
machine and :func:`~toolledger.protocol.decide_recovery`),
:mod:`toolledger.ledger`, :mod:`toolledger.stores`,
:mod:`toolledger.sqlite_store` (durable storage),
:mod:`toolledger.postgres_store` (the same store on PostgreSQL for many
workers; it needs the ``postgres`` extra, so it is not re-exported here);
:mod:`toolledger.engine` (a demo engine shaped like openworker); :mod:`toolledger.system`,
:mod:`toolledger.mapping`, :mod:`toolledger.invariants`,
:mod:`toolledger.conformance` (the ties between code and spec used by the
checkers).
"""

from .adapters import CannotTell, NotAppliedFenced, WasApplied
from .protocol import (
    Decision,
    InvalidInput,
    ProtocolError,
    RecoveryInputs,
    RecoveryPolicy,
    ResultKind,
    ToolResult,
)
from .session import (
    Attempt,
    CallBusy,
    CallRef,
    CallStatus,
    Next,
    NotApplied,
    Outcome,
    Session,
    SessionInterrupted,
    Tool,
)
from .sqlite_store import SqliteStore
from .stores import MemoryStore, StoreError

__version__ = "0.1.0"

__all__ = [
    "Attempt",
    "CallBusy",
    "CallRef",
    "CallStatus",
    "CannotTell",
    "Decision",
    "InvalidInput",
    "MemoryStore",
    "Next",
    "NotApplied",
    "NotAppliedFenced",
    "Outcome",
    "ProtocolError",
    "RecoveryInputs",
    "RecoveryPolicy",
    "ResultKind",
    "Session",
    "SessionInterrupted",
    "SqliteStore",
    "StoreError",
    "Tool",
    "ToolResult",
    "WasApplied",
    "__version__",
]
