"""What an engine declares per tool and gets back per call, in the session API.

Private module of :mod:`toolledger`: import the public names from ``toolledger``.

:class:`Tool` (a tool's recovery policy, approval, retention window and
outcome classification), :class:`Outcome`, :class:`NotApplied` and
:class:`KeyAnswer` (how a call ended, how a tool says "definitely not
applied", and an API's key answers that never are), :class:`CallRef`,
:class:`CallStatus` and :class:`Next` (where a call stands and what to do
with it), :class:`Attempt` (what a tool body gets), and the session's errors.
:class:`~toolledger._core.session.Session`, which uses them, re-exports
every name here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, TypeAlias

from .protocol import (
    CallPosition,
    Decision,
    InvalidInput,
    RecoveryInputs,
    RecoveryPolicy,
    ToolProfile,
    ToolResult,
)
from .tools import (
    frozen_arguments,
)

__all__ = [
    "Attempt",
    "CallBusy",
    "CallRef",
    "CallStatus",
    "Classifier",
    "KeyAnswer",
    "KeyInFlight",
    "KeyParamsDiffer",
    "Next",
    "NotApplied",
    "Outcome",
    "ReplayedFailure",
    "SessionInterrupted",
    "Tool",
]


# --------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------


class NotApplied(Exception):
    """Raised by a tool to say: the effect definitely did NOT happen.

    For example the external system answered 4xx, or the request was never
    sent.  The call is recorded as failed (no recovery, no human); its text
    becomes the tool result the model sees.
    """


class KeyAnswer(Exception):
    """An idempotent tool's API answered under its key without saying whether the
    effect happened (docs/protocol.md#real-apis-answers).  Raise a subclass from
    the tool body; the session classifies it UNKNOWN whatever the tool's
    ``classify`` hook or ``marks_send`` say: an idempotent call is retried with
    the SAME key (never a fresh one), or halts for a human.  The spec's
    ``ExternalAnswerInFlight``, ``ExternalAnswerParamsDiffer``,
    ``ExternalReplayFailure``.
    """


class KeyInFlight(KeyAnswer):
    """"In flight" (e.g. 409 Conflict): another request with this key is still being
    processed.  This request was not applied; the other one may still be."""


class KeyParamsDiffer(KeyAnswer):
    """"Parameters differ" (Stripe's ``idempotency_error``, EC2's
    ``IdempotentParameterMismatch``): the key holds an earlier request with other
    parameters, processed with an outcome this answer does not give.  Under the
    engine's own key it is a bug (request bodies not byte-stable across attempts,
    or two calls sharing a key): never re-send under a fresh key."""


class ReplayedFailure(KeyAnswer):
    """The API replayed the stored FAILURE answer of an earlier request with this
    key (Stripe replays a stored ``500``), whose effect may have been applied.
    A stored failure the API guarantees had no effect (a refusal before
    execution) is a definite one: raise :class:`NotApplied` for it instead."""


class CallBusy(InvalidInput):
    """The call is running (in another thread): it is never dispatched twice at once."""


class SessionInterrupted(RuntimeError):
    """A tool body of this session was interrupted (``KeyboardInterrupt``, a crash):
    the process is going away, so this Session starts nothing more.  Open a new
    one on the store, as a restarted engine would, and :meth:`Session.recover`."""


class Outcome(StrEnum):
    """How the end of one attempt was classified."""

    APPLIED = "applied"
    NOT_APPLIED = "not_applied"
    UNKNOWN = "unknown"


class Next(StrEnum):
    """What the engine does next with a call."""

    RESULT = "result"  # the ledger holds its result: make sure the tool message is there
    AWAIT_APPROVAL = "await_approval"  # put it in the inbox; approve() or reject()
    EXECUTE = "execute"  # run it: execute() / dispatch()
    RETRY = "retry"  # run it again, same execution id and key: execute() / dispatch()
    RECONCILE = "reconcile"  # ask the external system: reconcile()
    HALTED = "halted"  # a human decides: resolve(key, "applied" | "retry" | "abandon")
    RUNNING = "running"  # a tool body is running it right now (another thread)


Classifier: TypeAlias = Callable[[Exception, bool], "Outcome | None"]
"""``classify(exc, sent)``: a tool's verdict on an exception its body raised.

``sent`` says whether the body called :meth:`Attempt.sending`.  Return
:attr:`Outcome.NOT_APPLIED`, :attr:`Outcome.UNKNOWN`, or ``None`` to leave it to
the default rules.  A classifier that raises, or answers anything else,
counts as :attr:`Outcome.UNKNOWN`."""


@dataclass(frozen=True, slots=True)
class Tool:
    """What the engine declares about one tool (never inferred, never from the model).

    ``policy``: how an unknown outcome may be recovered; ``manual`` (the
    default: a human decides, nothing is ever replayed), ``idempotent`` (the
    tool sends :attr:`Attempt.idempotency_key` and the external system
    deduplicates on it), ``reconcile`` (:meth:`Session.reconcile` can ask the
    external system) or ``readonly`` (no side effect: bypasses the ledger).
    ``requires_approval``: default True unless ``readonly``; a call may
    override it (:meth:`Session.record`).  ``marks_send`` and ``classify``:
    see the module's "Outcome classification".  ``retention_window``: for an
    ``idempotent`` tool, how many seconds its external system keeps an
    idempotency key, minus a margin for a retry's whole path (``None``, the
    default: it deduplicates forever).  Once that long has passed since the
    execution's first dispatch, recovery halts the call in
    ``recovery_required`` instead of retrying with the same key
    (``RecoveryInputs.key_retained``; docs/protocol.md#assumptions).
    ``approval_ttl``: seconds an approval of this tool's calls holds (``None``:
    the session's ``approval_ttl``, else forever); a call not dispatched by then
    waits for a new approval (docs/protocol.md#approvals-that-expire).
    """

    policy: RecoveryPolicy | str = RecoveryPolicy.MANUAL
    requires_approval: bool | None = None
    marks_send: bool = False
    classify: Classifier | None = field(default=None, compare=False)
    retention_window: float | None = None
    approval_ttl: float | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        policy: object = self.policy
        if not isinstance(policy, RecoveryPolicy):
            try:
                object.__setattr__(self, "policy", RecoveryPolicy(str(policy)))
            except ValueError:
                valid = ", ".join(p.value for p in RecoveryPolicy)
                raise InvalidInput(
                    f"unknown recovery policy {policy!r}; declare one of: {valid} "
                    "(use 'manual' when unsure: it never replays)"
                ) from None
        approval: object = self.requires_approval
        if approval is None:
            readonly = self.policy is RecoveryPolicy.READONLY
            object.__setattr__(self, "requires_approval", not readonly)
        elif not isinstance(approval, bool):
            raise InvalidInput(f"requires_approval must be a bool or None, got {approval!r}")
        if not isinstance(self.marks_send, bool):
            raise InvalidInput(f"marks_send must be a bool, got {self.marks_send!r}")
        window: object = self.retention_window
        if window is not None and (
            isinstance(window, bool) or not isinstance(window, (int, float)) or not window > 0
        ):
            raise InvalidInput(
                f"retention_window must be a positive number of seconds, or None when the "
                f"external system deduplicates forever; got {window!r}"
            )
        check_ttl(self.approval_ttl, "approval_ttl")
        if self.classify is not None and not callable(self.classify):
            raise InvalidInput(f"classify must be callable (exc, sent) -> Outcome | None, got "
                               f"{self.classify!r}")

    def profile(self, name: str, requires_approval: bool | None = None) -> ToolProfile:
        """The core's profile of one call of this tool."""
        approval = self.requires_approval if requires_approval is None else requires_approval
        assert isinstance(self.policy, RecoveryPolicy) and isinstance(approval, bool)
        return ToolProfile(name, self.policy, approval, self.retention_window)


def check_ttl(value: object, what: str) -> float | None:
    """``value`` as an approval's time to live in seconds (positive, finite) or None."""
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or not value > 0):
        raise InvalidInput(f"{what} must be a positive number of seconds an approval holds, "
                           f"or None (it holds until the call runs); got {value!r}")
    return float(value)


_UNDECLARED: Final = Tool()  # a tool nobody declared: manual, approval required


@dataclass(frozen=True, slots=True)
class CallRef:
    """One recorded call, as the engine knows it.

    ``key`` is the execution id: stable across restarts, the key of the
    call's inbox item, and (for ``idempotent`` tools) the idempotency key.
    ``epoch`` is the lease epoch of the session's owner (``None`` without a
    lease), so that the reconcile query (``ask(call, attempt)``) and the
    epoch announcement (``Session.open(..., announce_epoch=...)``) carry it
    as ``Attempt.epoch`` does for the tool body: an epoch-aware connector
    refuses a request of an older epoch than one it has seen
    (docs/protocol.md#concurrent-resumers).
    """

    key: str
    tool_call_id: str
    name: str
    position: CallPosition
    arguments: Mapping[str, Any]
    policy: RecoveryPolicy
    requires_approval: bool
    epoch: int | None = None


@dataclass(frozen=True, slots=True)
class CallStatus:
    """Where a call stands and what the engine does next.

    ``result`` is set when ``next`` is :attr:`Next.RESULT` (its ``kind`` is
    ok, error, denied, human or abandoned; ``content`` is the text).
    ``decision`` and ``inputs`` are the core's recovery decision for the call
    and what it looked at (always set by :meth:`Session.recover`; on the live
    path only after an unknown outcome); ``recovered`` says the decision was
    applied (and audited) by the call that returned this status; otherwise
    ``decision`` is the one a restart would make now.  ``outcome``
    is how the attempt that just ended was classified, ``error`` its exception
    text.  ``attempt`` is the attempt the ledger record is at (0: never
    dispatched).
    """

    call: CallRef
    next: Next
    attempt: int = 0
    result: ToolResult | None = None
    decision: Decision | None = None
    inputs: RecoveryInputs | None = None
    outcome: Outcome | None = None
    error: str | None = None
    recovered: bool = False  # the recovery decision was applied just now

    @property
    def key(self) -> str:
        return self.call.key

    def result_value(self) -> Any:
        """The result as a value: its content decoded from JSON (a dict the tool
        returned, the ledger's own ``{"error", ...}`` objects), else the text
        itself (a tool's plain string, a human's ``applied`` answer).  For an
        engine whose results are values, not text (openworker's dicts).  A call
        with no result yet raises :class:`InvalidInput`, as :meth:`tool_message`."""
        content = self.tool_message()["content"]
        try:
            return json.loads(content)
        except ValueError:
            return content

    def tool_message(self) -> dict[str, Any]:
        """The ``role="tool"`` message of a call with a result, openworker-shaped."""
        if self.result is None:
            raise InvalidInput(
                f"call {self.call.key} has no result yet (next: {self.next.value}): "
                "only a call whose next is 'result' has a tool message"
            )
        return {
            "role": "tool",
            "tool_call_id": self.call.tool_call_id,
            "content": self.result.content,
            "status": self.result.kind.value,
        }


class Attempt:
    """What a tool body gets in :meth:`Session.dispatch` / :meth:`Session.execute`.

    ``execution_id`` identifies the execution (for logs, reconciliation);
    ``idempotency_key`` is the same id for ``idempotent`` tools (send it as
    the external system's deduplication key, e.g. an ``Idempotency-Key``
    header) and ``None`` otherwise; ``attempt`` numbers the attempts (1, 2,
    ...; a reconcile connector fences per attempt).  ``epoch`` is the lease
    epoch of the session's owner (``Session.open(..., take_session=True)``;
    ``None`` without a lease): send it beside the execution id to a
    connector that can refuse a request of an older epoch than one it has
    seen (a worker declared dead that still runs).  ``arguments`` are the
    model's, read-only.
    """

    def __init__(
        self,
        call: CallRef,
        attempt: int,
        idempotency_key: str | None,
        epoch: int | None = None,
    ) -> None:
        self.call = call
        self.execution_id = call.key
        self.idempotency_key = idempotency_key
        self.attempt = attempt
        self.epoch = epoch
        self.arguments: Mapping[str, Any] = frozen_arguments(dict(call.arguments))
        self.sent = False
        self.status: CallStatus | None = None  # set when the with block ends
        self._value: object = None
        self._done = False
        self._on_send: Callable[[], None] | None = None

    def sending(self) -> None:
        """Mark that the request is about to leave: from here on an exception is
        no longer "definitely not applied" for a ``marks_send`` tool."""
        if not self.sent:
            self.sent = True
            if self._on_send is not None:
                self._on_send()

    def done(self, value: object) -> None:
        """The tool returned ``value``: applied.  A ``str`` is the result text;
        anything else is stored as JSON (``str()`` for what JSON cannot hold)."""
        self._value, self._done = value, True


def _result_text(value: object) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def _error_text(exc: BaseException) -> str:
    return json.dumps({"error": str(exc), "error_type": type(exc).__name__}, ensure_ascii=False)


_DENIED: Final = json.dumps({"error": "denied by the user"})
