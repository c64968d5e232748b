"""What a session does next with a call, read off the state alone (pure).

Private module of :mod:`toolledger`, behind :class:`~toolledger._core.session.Session`:
which :class:`~toolledger._core.calls.Next` a call's stage and ledger record
mean, whether its approval lets it run, and the events that apply the core's
recovery decision (:func:`~toolledger._core.protocol.decide_recovery`, never
decided here) to a call interrupted by a restart.  Nothing here reads or
writes a store.
"""

from __future__ import annotations

from collections.abc import Sequence

from .calls import _DENIED, Next
from .ledger import APPROVAL_EXPIRED, APPROVED, REJECTED
from .protocol import (
    Action,
    ApprovalState,
    CallPosition,
    CallState,
    Decision,
    Event,
    InvalidInput,
    LedgerStatus,
    RecoveryDecision,
    SessionState,
    Stage,
    decide_recovery,
    recovery_inputs,
)

__all__ = [
    "approval_round",
    "approval_withdrawn",
    "approved",
    "denied_contents",
    "next_of",
    "recovery_decision",
    "recovery_events",
]


def approved(state: SessionState, c: CallState) -> bool:
    """``c`` needs no approval, or has one for exactly its arguments
    (docs/protocol.md#approvals-bound-to-arguments) that has not expired
    (docs/protocol.md#approvals-that-expire)."""
    return not c.tool.requires_approval or (
        state.approval(c.execution_id) is ApprovalState.APPROVED
        and state.approval_digest(c.execution_id) == c.args_digest
        and not approval_withdrawn(state, c)
    )


def approval_round(state: SessionState, execution_id: str) -> int:
    """How many human answers (approved, rejected rows) the call at ``execution_id`` has
    had: the round of its latest one (0: none recorded, e.g. a legacy approval)."""
    return max((n for e, kind, n in state.audit
                if e == execution_id and kind in (APPROVED, REJECTED)), default=0)


def approval_withdrawn(state: SessionState, c: CallState) -> bool:
    """``c``'s latest approval expired before it was dispatched (an ``approval_expired``
    row of its round; round 0: an approval from before approvals had rows, expired
    under an approval_ttl): it authorizes nothing, the call waits for a new approval."""
    n = approval_round(state, c.execution_id)
    return (c.execution_id, APPROVAL_EXPIRED, n) in state.audit


def recovery_decision(state: SessionState, c: CallState) -> RecoveryDecision:
    """The core's recovery decision for ``c``, with the inputs it looked at."""
    return decide_recovery(recovery_inputs(state, c))


def recovery_events(state: SessionState, c: CallState) -> tuple[list[Event], RecoveryDecision]:
    """The events that apply the recovery decision to ``c`` (at RESUME) and what
    follows it without any outside answer (an appended result, a parked approval)."""
    d = recovery_decision(state, c)
    pos = c.position
    events = [Event(Action.Recover, pos)]
    if d.decision is Decision.RECONSTRUCT:
        events.append(Event(Action.EngineAppendResult, pos))
    elif d.decision is Decision.EXECUTE and c.tool.requires_approval:
        approval = state.approval(c.execution_id)
        if approval is ApprovalState.NONE:
            events.append(Event(Action.EngineParkApproval, pos))
        elif approval is ApprovalState.REJECTED:
            events.append(Event(Action.EngineRecordDenied, pos))
    return events, d


def denied_contents(events: Sequence[Event]) -> dict[CallPosition, str]:
    """The tool message of every call ``events`` record as denied."""
    return {ev.position: _DENIED for ev in events
            if ev.action is Action.EngineRecordDenied and ev.position is not None}


def next_of(state: SessionState, c: CallState, *, running: bool) -> Next:
    """What the engine does next with ``c`` (``running``: its tool body runs now).

    A call interrupted by a restart has no next until the recovery decision is
    applied: :class:`~toolledger._core.protocol.InvalidInput` says so."""
    if c.result is not None:
        return Next.RESULT
    if running:
        return Next.RUNNING
    nxt = {
        Stage.RETRY: Next.RETRY,
        Stage.DISPATCHED: Next.RETRY,  # dispatched, not yet run
        Stage.RECONCILING: Next.RECONCILE,
        Stage.WAITING: Next.RUNNING,
        Stage.GOT_OK: Next.RUNNING,
        Stage.GOT_FAIL: Next.RUNNING,
    }.get(c.stage)
    if c.stage is Stage.RESUME:  # interrupted: only recover() may say what is next
        raise InvalidInput(f"call {c.execution_id} was interrupted by a restart: call "
                           "recover() and act on what it returns")
    if nxt is None:
        if state.record(c.execution_id).status is LedgerStatus.RECOVERY_REQUIRED:
            nxt = Next.HALTED
        elif c.stage is Stage.LIVE and not approved(state, c):
            nxt = Next.AWAIT_APPROVAL
        else:
            nxt = Next.EXECUTE
    return nxt
