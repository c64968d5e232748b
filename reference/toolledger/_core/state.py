"""The protocol's vocabulary and state: what one session's tool calls look like.

Private module of :mod:`toolledger`: import the public names from ``toolledger``.

The closed sets of the spec (:class:`Stage`, :class:`LedgerStatus`,
:class:`Action`, ...), the protocol's errors, and the immutable values of one
session (:class:`SessionState` with its :class:`CallState`,
:class:`ExecutionRecord`, approvals and audit keys), with the execution id
derivation and the argument digest.  The transitions between states are in
:mod:`toolledger._core.protocol`, the recovery decision in
:mod:`toolledger._core.recovery`; ``protocol`` re-exports every name here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Final

__all__ = [
    "MAX_TOOL_CALL_ID_LENGTH",
    "Action",
    "Actor",
    "ApprovalState",
    "AuditKey",
    "Authorization",
    "CallPosition",
    "CallState",
    "Decision",
    "ExecutionRecord",
    "InvalidInput",
    "LedgerStatus",
    "MessageState",
    "ProtocolError",
    "RecoveryPolicy",
    "ResultKind",
    "SessionState",
    "Stage",
    "ToolProfile",
    "ToolResult",
    "args_digest",
    "check_call_position",
    "derive_execution_id",
    "new_session",
]


# --------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------


class RecoveryPolicy(StrEnum):
    """How an unknown outcome of a tool may be recovered; declared by the engine."""

    READONLY = "readonly"
    MANUAL = "manual"
    IDEMPOTENT = "idempotent"
    RECONCILE = "reconcile"


class LedgerStatus(StrEnum):
    NONE = "none"
    DISPATCHED = "dispatched"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RECOVERY_REQUIRED = "recovery_required"
    ABANDONED = "abandoned"


class ApprovalState(StrEnum):
    NONE = "none"
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"


class Authorization(StrEnum):
    """Who authorized an attempt: nobody needed to, the approval, the policy, a human."""

    NONE = "none"
    AUTO = "auto"
    APPROVAL = "approval"
    POLICY = "policy"
    HUMAN = "human"


class Decision(StrEnum):
    EXECUTE = "execute"
    RECONSTRUCT = "reconstruct"
    RETRY_SAME_ID = "retry_same_id"
    RECONCILE = "reconcile"
    RECOVERY_REQUIRED = "recovery_required"
    SKIP = "skip"


class Stage(StrEnum):
    """The engine's volatile progress on one call (lost on a crash)."""

    NONE = "none"
    RESUME = "resume"
    LIVE = "live"
    RETRY = "retry"
    DISPATCHED = "dispatched"
    WAITING = "waiting"
    GOT_OK = "got_ok"
    GOT_FAIL = "got_fail"
    RECORDED = "recorded"
    RECONCILING = "reconciling"


class MessageState(StrEnum):
    VOLATILE = "volatile"
    DURABLE = "durable"


class ResultKind(StrEnum):
    OK = "ok"
    ERROR = "error"
    DENIED = "denied"
    HUMAN = "human"
    ABANDONED = "abandoned"
    CANCELLED = "cancelled"  # a user's Stop before the call was ever dispatched


class Actor(StrEnum):
    PROVIDER = "provider"
    ENGINE = "engine"
    HUMAN = "human"
    EXTERNAL = "external"
    ENVIRONMENT = "environment"


class Action(StrEnum):
    """The actions of ``DurableToolExecution.tla``, spelled as there."""

    ProviderEmitCall = "ProviderEmitCall"
    EnginePersistCall = "EnginePersistCall"
    EngineParkApproval = "EngineParkApproval"
    HumanApprove = "HumanApprove"
    HumanReject = "HumanReject"
    EngineRecordDenied = "EngineRecordDenied"
    EnginePersistDispatched = "EnginePersistDispatched"
    EngineInvokeAdapter = "EngineInvokeAdapter"
    EngineInvokeReadonly = "EngineInvokeReadonly"
    ExternalApply = "ExternalApply"
    ExternalApplyLoseAnswer = "ExternalApplyLoseAnswer"
    ExternalRejectDefinite = "ExternalRejectDefinite"
    ExternalDropFenced = "ExternalDropFenced"
    EngineRecordSucceeded = "EngineRecordSucceeded"
    EngineRecordFailed = "EngineRecordFailed"
    EngineAppendResult = "EngineAppendResult"
    EngineTimeout = "EngineTimeout"
    Recover = "Recover"
    EngineReconcileApplied = "EngineReconcileApplied"
    EngineReconcileNotApplied = "EngineReconcileNotApplied"
    EngineReconcileUnknown = "EngineReconcileUnknown"
    HumanResolveApplied = "HumanResolveApplied"
    HumanResolveRetry = "HumanResolveRetry"
    HumanResolveAbandon = "HumanResolveAbandon"
    HumanCancel = "HumanCancel"
    Crash = "Crash"
    ConversationRepair = "ConversationRepair"
    ConversationRenumber = "ConversationRenumber"
    # the external-system assumptions (docs/protocol.md#assumptions)
    EngineDiscardLateReturn = "EngineDiscardLateReturn"
    RetentionWindowPasses = "RetentionWindowPasses"
    ExternalExpireKey = "ExternalExpireKey"
    # the key answers of real APIs (docs/protocol.md#real-apis-answers)
    ExternalAnswerInFlight = "ExternalAnswerInFlight"
    ExternalAnswerParamsDiffer = "ExternalAnswerParamsDiffer"
    ExternalReplayFailure = "ExternalReplayFailure"


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


class ProtocolError(Exception):
    """An event that the protocol does not allow in the current state.

    The state it was applied to is unchanged (states are immutable); the
    message names the event, the call and the state it met.
    """

    def __init__(self, action: Action | str, position: CallPosition | None, why: str) -> None:
        self.action = str(action)
        self.position = position
        self.why = why
        where = f" for call {position}" if position is not None else ""
        super().__init__(f"can't handle {self.action}{where}: {why}")


class InvalidInput(ValueError):
    """Bad input from outside (a malformed id, a reused key argument, ...).

    Raised before anything is changed or executed; the message says what was
    wrong and what to do.
    """


# --------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------

CallPosition = tuple[int, int]
"""(turn, slot): the persisted assistant-message sequence number and the index in it."""

MAX_TOOL_CALL_ID_LENGTH: Final = 512
_ID_PREFIX: Final = "tlx1-"
# Encoders built once (json.dumps with options builds one per call): the same text.
_COMPACT_ASCII: Final = json.JSONEncoder(separators=(",", ":"))
_CANONICAL: Final = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


def _check_position(turn: object, slot: object) -> None:
    for name, value in (("turn", turn), ("slot", slot)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidInput(
                f"{name} must be a non-negative int (the persisted message sequence number "
                f"and the index of the call in it), got {value!r}"
            )


def check_call_position(value: object, field: str) -> CallPosition:
    """``value`` if it is a call position, a ``(turn, slot)`` tuple of two
    non-negative ints; else :class:`InvalidInput` naming ``field``."""
    if (
        not isinstance(value, tuple)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    ):
        hint = " (a list: pass a tuple)" if isinstance(value, list) else ""
        raise InvalidInput(
            f"{field} must be a call position, a (turn, slot) tuple of two non-negative "
            f"ints, e.g. (0, 1); got {value!r} of type {type(value).__name__}{hint}"
        )
    return (value[0], value[1])


def derive_execution_id(session_id: str, turn: int, slot: int, tool_call_id: str) -> str:
    """The internal, stable identity of the execution of one call.

    It binds the provider's ``tool_call_id`` to the call's persisted position,
    because providers reuse ids (Gemini's ``call_0`` on every turn, salvaged
    ``call_salvaged_0``, and ``""`` from some streams).  It is derived by the
    engine from data the model does not control, and is the same on every
    resume because the position is durable before anything is dispatched.
    """
    if not isinstance(session_id, str) or not session_id:
        raise InvalidInput(f"session_id must be a non-empty string, got {session_id!r}")
    _check_position(turn, slot)
    if not isinstance(tool_call_id, str):
        raise InvalidInput(
            f"tool_call_id must be a string (use '' when the provider gave none), "
            f"got {type(tool_call_id).__name__}"
        )
    if len(tool_call_id) > MAX_TOOL_CALL_ID_LENGTH:
        raise InvalidInput(
            f"tool_call_id is {len(tool_call_id)} characters long; at most "
            f"{MAX_TOOL_CALL_ID_LENGTH} are accepted: truncate or hash it in the provider adapter"
        )
    material = _COMPACT_ASCII.encode([session_id, turn, slot, tool_call_id])
    return _ID_PREFIX + hashlib.sha256(material.encode()).hexdigest()[:32]


def args_digest(tool_name: str, arguments: Mapping[str, Any]) -> str:
    """Digest of a call's tool name and arguments (canonical JSON)."""
    try:
        text = _CANONICAL.encode([tool_name, arguments])
    except (TypeError, ValueError) as exc:
        raise InvalidInput(
            f"arguments of {tool_name!r} are not JSON-serializable ({exc}): "
            "pass the parsed JSON object the model emitted"
        ) from exc
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ToolProfile:
    """Engine-owned metadata of a tool: never inferred, never model-controlled."""

    name: str
    policy: RecoveryPolicy = RecoveryPolicy.MANUAL
    requires_approval: bool = True
    # How long (seconds) the external system keeps an idempotency key, minus
    # a margin for a retry's whole path; None: it deduplicates forever.  Past
    # it, recovery halts instead of retrying with the same id (keyRetained).
    retention_window: float | None = None

    def __post_init__(self) -> None:
        name: object = self.name
        window: object = self.retention_window
        if window is not None and (
            isinstance(window, bool) or not isinstance(window, (int, float)) or not window > 0
        ):
            raise InvalidInput(
                f"retention_window of {name!r} must be a positive number of seconds "
                f"or None (the external system deduplicates forever), got {window!r}"
            )
        policy: object = self.policy
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"tool name must be a non-empty string, got {name!r}")
        if not isinstance(policy, RecoveryPolicy):
            try:
                object.__setattr__(self, "policy", RecoveryPolicy(str(policy)))
            except ValueError:
                valid = ", ".join(p.value for p in RecoveryPolicy)
                raise InvalidInput(
                    f"unknown recovery policy {policy!r} for tool {name!r}; "
                    f"declare one of: {valid}"
                ) from None
        requires_approval: object = self.requires_approval
        if not isinstance(requires_approval, bool):
            raise InvalidInput(
                f"requires_approval of {self.name!r} must be a bool, got {self.requires_approval!r}"
            )

    @property
    def protected(self) -> bool:
        """True if the tool has external side effects (goes through the ledger)."""
        return self.policy is not RecoveryPolicy.READONLY


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A tool result: its kind, the execution and the argument digest it belongs to."""

    kind: ResultKind
    execution_id: str
    args_digest: str
    content: str = ""


@dataclass(frozen=True, slots=True)
class ExecutionRecord:
    """The durable ledger record of one execution."""

    execution_id: str
    status: LedgerStatus = LedgerStatus.NONE
    attempt: int = 0
    args_digest: str | None = None
    authorization: Authorization = Authorization.NONE
    result: ToolResult | None = None
    position: CallPosition | None = None
    # When the execution was first dispatched (seconds since the epoch), the
    # earliest time its idempotency key can have been stored: a restarted
    # engine computes keyRetained from it and the tool's retention_window.
    # Not part of the spec's record (time is abstract there).
    dispatched_at: float | None = None


AuditKey = tuple[str, str, int]
"""(execution id, kind, attempt): the protocol-relevant part of an audit row."""


@dataclass(frozen=True, slots=True)
class CallState:
    """One call at its position: durable message and result, volatile stage."""

    position: CallPosition
    tool_call_id: str
    tool: ToolProfile
    execution_id: str
    args_digest: str
    message: MessageState
    result: ToolResult | None = None
    stage: Stage = Stage.NONE

    def _staged(self, stage: Stage) -> CallState:
        """``replace(self, stage=stage)``, without ``replace``'s field walk: the core's
        most frequent step (bench_bytes' profile)."""
        return CallState(self.position, self.tool_call_id, self.tool, self.execution_id,
                         self.args_digest, self.message, self.result, stage)



@dataclass(frozen=True)
class SessionState:
    """Everything the engine knows about one session's tool calls.

    ``calls`` is ordered by position; ``approvals`` and ``ledger`` are keyed by
    execution id (a missing key is the ``none`` state); ``marker`` is the
    protocol marker: calls of turns before it are legacy.

    ``approval_digests`` (the spec's ``approvalArgs``): the argument digest
    each approval was asked and given for.  Only an approval of exactly the
    call's digest dispatches it (docs/protocol.md#approvals-bound-to-arguments).
    A store keeps no column for it: an approval belongs to a durable call
    (``plan_commit``), whose digest never changes, so a store reads it back
    as that call's digest.
    """

    session_id: str
    marker: int = 0
    max_attempts: int = 3
    calls: tuple[CallState, ...] = ()
    approvals: Mapping[str, ApprovalState] = field(default_factory=dict)
    ledger: Mapping[str, ExecutionRecord] = field(default_factory=dict)
    audit: frozenset[AuditKey] = frozenset()
    # The spec's windowPassed: executions whose key-retention window has
    # passed (RetentionWindowPasses).  Derived from the clock and the
    # records' dispatch times, never stored: recomputed after a restart.
    retention_passed: frozenset[str] = frozenset()
    # The spec's approvalArgs (see the class docstring); last, so that a
    # positional construction of the other fields keeps its meaning.
    approval_digests: Mapping[str, str] = field(default_factory=dict)

    # -- lookups ----------------------------------------------------------

    def call(self, position: CallPosition) -> CallState | None:
        given: object = position  # typed as a tuple, but callers pass what they have
        if not isinstance(given, tuple):  # a list would silently match no call
            check_call_position(given, "SessionState.call() position")
        for c in self.calls:
            if c.position == position:
                return c
        return None

    def record(self, execution_id: str) -> ExecutionRecord:
        rec = self.ledger.get(execution_id)
        return rec if rec is not None else ExecutionRecord(execution_id)

    def approval(self, execution_id: str) -> ApprovalState:
        return self.approvals.get(execution_id, ApprovalState.NONE)

    def approval_digest(self, execution_id: str) -> str | None:
        """The argument digest the approval at ``execution_id`` was given for
        (``None``: no approval)."""
        return self.approval_digests.get(execution_id)

    def is_legacy(self, position: CallPosition) -> bool:
        return position[0] < self.marker

    def superseded(self, execution_id: str) -> bool:
        """The call's response was superseded: the engine's history lost it and a new
        response replaced it (an audit key of kind ``"superseded"``; the facade's
        ``Void``, docs/protocol.md#superseding-a-lost-response).  It no longer
        holds later turns back (``ProviderEmitCall``); a dispatched one is still
        recovered by its policy."""
        return any(k[0] == execution_id and k[1] == "superseded" for k in self.audit)

    def halted(self) -> Iterator[CallState]:
        """Calls in ``recovery_required`` waiting for a human: not those a human
        granted a retry the engine has not run yet (:meth:`retry_granted`)."""
        for c in self.calls:
            if (
                c.result is None
                and self.record(c.execution_id).status is LedgerStatus.RECOVERY_REQUIRED
                and not self.retry_granted(c)
            ):
                yield c

    def retry_granted(self, c: CallState) -> bool:
        """The spec's RetryGranted: a human granted one more attempt of ``c``'s
        halted record (its ``human_retry`` audit row for the attempt after the
        record's) and it is unused: the record is still halted there, its outcome
        unknown, its digest the call's.  Recover honours it
        (docs/protocol.md#a-humans-retry-is-a-grant)."""
        rec = self.record(c.execution_id)
        return (
            c.message is MessageState.DURABLE and c.result is None
            and rec.status is LedgerStatus.RECOVERY_REQUIRED and rec.result is None
            and rec.args_digest == c.args_digest
            and (c.execution_id, "human_retry", rec.attempt + 1) in self.audit
        )

    # -- functional updates -------------------------------------------------

    def _evolve(self, **changes: Any) -> SessionState:
        """``dataclasses.replace(self, **changes)`` without re-running ``__init__``: a
        SessionState has no ``__post_init__`` (nothing to check), and the core makes
        several of these per step (bench_bytes' profile: ``replace`` was the top
        Python function)."""
        new = object.__new__(SessionState)
        fields_ = new.__dict__
        fields_.update(self.__dict__)
        fields_.update(changes)
        return new

    def _with_call(self, new: CallState) -> SessionState:
        pos = new.position
        calls = tuple(new if c.position == pos else c for c in self.calls)
        return self._evolve(calls=calls)

    def _with_record(self, rec: ExecutionRecord) -> SessionState:
        ledger = dict(self.ledger)
        ledger[rec.execution_id] = rec
        return self._evolve(ledger=ledger)

    def _with_approval(
        self, execution_id: str, value: ApprovalState, digest: str | None = None
    ) -> SessionState:
        """``value`` for the approval; ``digest``: the arguments it is asked for
        (a new approval), ``None``: it keeps the ones it was asked for."""
        approvals = dict(self.approvals)
        approvals[execution_id] = value
        if digest is None:
            return replace(self, approvals=approvals)
        digests = dict(self.approval_digests)
        digests[execution_id] = digest
        return replace(self, approvals=approvals, approval_digests=digests)

    def _with_audit(self, *keys: AuditKey) -> SessionState:
        return self._evolve(audit=self.audit | frozenset(keys))


def stored_approval_digests(
    calls: Iterable[CallState], approvals: Mapping[str, ApprovalState]
) -> dict[str, str]:
    """The digests of stored approvals, read back from their calls.

    A store keeps an approval by execution id and no digest column: an
    approval belongs to a durable call of its session (``plan_commit``), and a
    durable call's digest never changes (it only ever gains a result), so the
    digest the approval was asked for is its call's."""
    return {c.execution_id: c.args_digest for c in calls if c.execution_id in approvals}


def new_session(session_id: str, *, marker: int = 0, max_attempts: int = 3) -> SessionState:
    """A session governed by the ledger from turn ``marker`` on (0: from the start)."""
    if not isinstance(session_id, str) or not session_id:
        raise InvalidInput(f"session_id must be a non-empty string, got {session_id!r}")
    if isinstance(marker, bool) or not isinstance(marker, int) or marker < 0:
        raise InvalidInput(f"marker must be a non-negative turn number, got {marker!r}")
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise InvalidInput(f"max_attempts must be an int >= 1, got {max_attempts!r}")
    return SessionState(session_id=session_id, marker=marker, max_attempts=max_attempts)
