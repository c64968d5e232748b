"""The recovery decision: what a restarted engine does with each unanswered call.

Private module of :mod:`toolledger`: import the public names from ``toolledger``.

:func:`decide_recovery` is the total recovery function of
``docs/protocol.md#recovery``; it returns the decision together with the
inputs it used (:class:`RecoveryInputs`), so an audit row can carry them and
anyone can recompute it.  It is pure: the ``Recover`` transition of
:mod:`toolledger._core.protocol` (which re-exports every name here) applies it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from .state import (
    ApprovalState,
    CallState,
    Decision,
    LedgerStatus,
    RecoveryPolicy,
    SessionState,
)

__all__ = [
    "RecoveryDecision",
    "RecoveryInputs",
    "decide_recovery",
    "recovery_inputs",
]


# --------------------------------------------------------------------------
# The recovery decision
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecoveryInputs:
    """Everything :func:`decide_recovery` looks at; written to the audit row."""

    status: LedgerStatus
    attempt: int
    digest_matches: bool
    approval: ApprovalState
    has_result: bool
    policy: RecoveryPolicy
    legacy: bool
    requires_approval: bool
    max_attempts: int
    # the execution's idempotency key is still within the tool's declared
    # retention window (the spec's keyRetained); past it, no retry_same_id
    key_retained: bool = True

    def as_dict(self) -> dict[str, object]:
        return {
            "status": self.status.value,
            "attempt": self.attempt,
            "digest_matches": self.digest_matches,
            "approval": self.approval.value,
            "has_result": self.has_result,
            "policy": self.policy.value,
            "legacy": self.legacy,
            "requires_approval": self.requires_approval,
            "max_attempts": self.max_attempts,
            "key_retained": self.key_retained,
        }


@dataclass(frozen=True, slots=True)
class RecoveryDecision:
    decision: Decision
    inputs: RecoveryInputs


_KNOWN_OUTCOME: Final = frozenset(
    {LedgerStatus.SUCCEEDED, LedgerStatus.FAILED, LedgerStatus.ABANDONED}
)


def decide_recovery(inputs: RecoveryInputs) -> RecoveryDecision:
    """The recovery decision of ``docs/protocol.md#recovery``: total and deterministic.

    Mirrors ``Decide`` in the spec line by line.  A record whose argument
    digest disagrees with the call at its position is a contradiction and
    fails closed.  A legacy call (before the marker) that is approved, or that
    needed no approval, may have run under the old engine: it is never
    executed without a human.
    """
    i = inputs
    d: Decision
    if i.has_result:
        d = Decision.SKIP
    elif i.policy is RecoveryPolicy.READONLY:
        d = Decision.EXECUTE
    elif i.status is not LedgerStatus.NONE and not i.digest_matches:
        d = Decision.RECOVERY_REQUIRED
    elif i.status in _KNOWN_OUTCOME:
        d = Decision.RECONSTRUCT
    elif i.status is LedgerStatus.RECOVERY_REQUIRED:
        d = Decision.RECOVERY_REQUIRED
    elif i.status is LedgerStatus.DISPATCHED:
        if i.policy is RecoveryPolicy.IDEMPOTENT:
            d = (
                Decision.RETRY_SAME_ID
                if i.attempt < i.max_attempts and i.key_retained
                else Decision.RECOVERY_REQUIRED
            )
        elif i.policy is RecoveryPolicy.RECONCILE:
            d = Decision.RECONCILE
        else:
            d = Decision.RECOVERY_REQUIRED
    elif i.legacy and (i.approval is ApprovalState.APPROVED or not i.requires_approval):
        d = Decision.RECOVERY_REQUIRED
    else:
        d = Decision.EXECUTE
    return RecoveryDecision(d, inputs)


def recovery_inputs(state: SessionState, call: CallState) -> RecoveryInputs:
    rec = state.record(call.execution_id)
    return RecoveryInputs(
        status=rec.status,
        attempt=rec.attempt,
        digest_matches=rec.args_digest == call.args_digest,
        approval=state.approval(call.execution_id),
        has_result=call.result is not None,
        policy=call.tool.policy,
        legacy=state.is_legacy(call.position),
        requires_approval=call.tool.requires_approval,
        max_attempts=state.max_attempts,
        key_retained=call.execution_id not in state.retention_passed,
    )
