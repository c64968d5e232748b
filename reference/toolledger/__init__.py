"""toolledger: crash-safe, side-effecting tool calls for AI-agent engines.

The protocol is specified in ``spec/DurableToolExecution.tla`` and checked by
TLC; this package is its reference implementation.

What an engine imports is re-exported here, and only here (stdlib only)::

    from toolledger import Session, Tool, NotApplied, SqliteStore

- :class:`Session`: the adopter's API, one session's tool calls on a store:
  record, approve, execute, recover, resolve; :class:`AsyncSession`, the same
  for asyncio, whose store I/O never runs on the event loop;
- :class:`Tool`, :class:`NotApplied`, :class:`Outcome`: what an engine declares
  per tool and how a tool says how its call ended;
- :class:`MemoryStore`, :class:`SqliteStore`, :class:`PostgresStore`: where
  the ledger lives (``PostgresStore`` needs the ``postgres`` extra only when
  one is opened: psycopg is imported then, never by ``import toolledger``);
- every error the session and the stores raise (:class:`InvalidInput`,
  :class:`StoreError` and its kinds, ...; docs/adopting.md#errors lists them).

The package is laid out by who uses what:

- ``toolledger`` (this module): the public surface an engine imports;
- ``toolledger._core``: the private, stdlib-only core behind it (the pure
  state machine ``protocol``, ``ledger``, ``session``, the adapter seam
  ``tools``, the stores); its modules may change, the names here do not;
- ``toolledger.check``: what a maintainer runs to tie the code to the spec
  (the TLC runner, TLA+ values, state graphs, the model manifest, the
  spec mapping, conformance, trace validation, invariants);
- ``toolledger.notebook``: support, evidence and figures for the notebooks,
  and the TLA+ Jupyter kernel;
- ``toolledger.kit``: the demo engine shaped like openworker, the crash
  simulation and a counting external system;
- ``toolledger.extra``: optional integrations (``pydantic_ai``, ``langgraph``);
- ``toolledger.cli``: the ``toolledger`` command (check, models, simulate,
  verify-store).
"""

from ._core.answers import SEEN, Trailing, answered_calls
from ._core.async_session import AsyncSession
from ._core.calls import (
    Attempt,
    CallBusy,
    CallRef,
    CallStatus,
    KeyAnswer,
    KeyInFlight,
    KeyParamsDiffer,
    Next,
    NotApplied,
    Outcome,
    ReplayedFailure,
    SessionInterrupted,
    Tool,
)
from ._core.pg_connection import StoreUnavailable
from ._core.postgres_store import PostgresStore, StoreExists
from ._core.protocol import (
    Decision,
    InvalidInput,
    ProtocolError,
    RecoveryInputs,
    RecoveryPolicy,
    ResultKind,
    ToolResult,
)
from ._core.session import Session
from ._core.sqlite_store import SqliteStore
from ._core.stores import (
    LeaseLost,
    MemoryStore,
    SessionExists,
    StaleState,
    StoreCorrupt,
    StoreError,
    UnknownSession,
    UnsupportedSchema,
)
from ._core.tools import CannotTell, NotAppliedFenced, WasApplied

__version__ = "0.1.0"

__all__ = [
    "SEEN",
    "AsyncSession",
    "Attempt",
    "CallBusy",
    "CallRef",
    "CallStatus",
    "CannotTell",
    "Decision",
    "InvalidInput",
    "KeyAnswer",
    "KeyInFlight",
    "KeyParamsDiffer",
    "LeaseLost",
    "MemoryStore",
    "Next",
    "NotApplied",
    "NotAppliedFenced",
    "Outcome",
    "PostgresStore",
    "ProtocolError",
    "RecoveryInputs",
    "RecoveryPolicy",
    "ReplayedFailure",
    "ResultKind",
    "Session",
    "SessionExists",
    "SessionInterrupted",
    "SqliteStore",
    "StaleState",
    "StoreCorrupt",
    "StoreError",
    "StoreExists",
    "StoreUnavailable",
    "Tool",
    "ToolResult",
    "Trailing",
    "UnknownSession",
    "UnsupportedSchema",
    "WasApplied",
    "__version__",
    "answered_calls",
]
