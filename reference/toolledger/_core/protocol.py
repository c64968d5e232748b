"""The toolledger protocol core: a pure, I/O-free state machine.

Private module of :mod:`toolledger`: import the public names from ``toolledger``.

Theory of operation
-------------------
One :class:`SessionState` holds what an agent engine knows about the tool
calls of one session: the calls at their positions in the conversation, the
approvals, the execution ledger, the audit keys and the protocol marker (all
*durable*), plus one *volatile* :class:`Stage` per call (what the engine was
doing in memory).  Every change is one named transition; the names are the
actions of the TLA+ spec ``spec/DurableToolExecution.tla``, one to one, and
:data:`TRANSITIONS` lists them all as data, with who performs them, the
stages they start from and the stage they lead to.  Diagrams and docs are
generated from that table.

:func:`apply` takes a state and an :class:`Event` and returns the next state.
An event whose guard does not hold raises :class:`ProtocolError`, naming the
event, the call and the state, and the state is unchanged (states are
immutable).  The caller (the :mod:`toolledger._core.ledger` facade, the engine kit,
the checkers) performs the I/O: it makes the durable part of each new state
durable in ONE transaction before acting on it, invokes adapters, asks
connectors.  :func:`durable_changes` says what changed.

What this module deliberately does not know: SQLite, files, threads, asyncio,
the external system's own state (whether an effect was really applied is the
business of :mod:`toolledger.check.system`, the closed-world model used by the
checkers), and the content of tool results beyond their kind, execution and
argument digest.  It must never perform I/O or read a clock.

:func:`decide_recovery` is the total recovery function of ``docs/protocol.md#recovery``;
it returns the decision together with the inputs it used, so an
audit row can carry them and anyone can recompute it.

This module holds the events, the transition table and the transition
functions; the vocabulary and the state values are in
:mod:`toolledger._core.state`, the recovery decision in
:mod:`toolledger._core.recovery`.  It re-exports every name of both, so
``protocol`` stays the one module a checker imports for the state machine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Final

from .recovery import (
    RecoveryDecision,
    RecoveryInputs,
    decide_recovery,
    recovery_inputs,
)
from .state import (
    Action,
    Actor,
    ApprovalState,
    AuditKey,
    Authorization,
    CallPosition,
    CallState,
    Decision,
    ExecutionRecord,
    InvalidInput,
    LedgerStatus,
    MessageState,
    ProtocolError,
    RecoveryPolicy,
    ResultKind,
    SessionState,
    Stage,
    ToolProfile,
    ToolResult,
    _check_position,
    args_digest,
    check_call_position,
    derive_execution_id,
    new_session,
)

__all__ = [
    "TRANSITIONS",
    "Action",
    "Actor",
    "ApprovalState",
    "AuditKey",
    "Authorization",
    "CallPosition",
    "CallState",
    "Decision",
    "Event",
    "ExecutionRecord",
    "InvalidInput",
    "LedgerStatus",
    "MessageState",
    "ProtocolError",
    "RecoveryDecision",
    "RecoveryInputs",
    "RecoveryPolicy",
    "ResultKind",
    "SessionState",
    "Stage",
    "ToolProfile",
    "ToolResult",
    "TransitionSpec",
    "apply",
    "args_digest",
    "check_call_position",
    "decide_recovery",
    "decision_audit_key",
    "derive_execution_id",
    "durable_changes",
    "enabled",
    "new_session",
    "recovery_inputs",
    "retry_granted",
]


_STAGE_AFTER: Final[Mapping[Decision, Stage]] = {
    Decision.SKIP: Stage.NONE,
    Decision.EXECUTE: Stage.LIVE,
    Decision.RECONSTRUCT: Stage.RECORDED,
    Decision.RETRY_SAME_ID: Stage.RETRY,
    Decision.RECONCILE: Stage.RECONCILING,
    Decision.RECOVERY_REQUIRED: Stage.NONE,
}


# --------------------------------------------------------------------------
# Events and the transition table
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Event:
    """One occurrence of an action.

    ``position`` names the call (every action but ``Crash``).  For
    ``ProviderEmitCall`` also give ``tool_call_id``, ``tool`` and
    ``args_digest``; for the external actions, ``attempt`` is the attempt
    whose answer (or silence) it is.
    """

    action: Action
    position: CallPosition | None = None
    tool_call_id: str | None = None
    tool: ToolProfile | None = None
    args_digest: str | None = None
    attempt: int | None = None
    # EnginePersistDispatched, HumanResolveRetry: the time of the dispatch
    # (seconds since the epoch), kept in the record as its first dispatch
    # time; None where time is abstract (the closed-world model).
    at: float | None = None

    def __post_init__(self) -> None:
        # A list (e.g. a position read back from JSON) would be unhashable and
        # never equal to a stored position: refuse it here, by name.
        if self.position is not None:
            check_call_position(self.position, "Event.position")


@dataclass(frozen=True, slots=True)
class TransitionSpec:
    """One row of the transition table: the documentation of an action as data."""

    action: Action
    actor: Actor
    from_stages: frozenset[Stage]
    to_stage: Stage | None  # None: decided (Recover) or unchanged
    durable: str  # what becomes durable, in the same transaction
    summary: str


def _row(
    action: Action,
    actor: Actor,
    src: tuple[Stage, ...],
    dst: Stage | None,
    durable: str,
    summary: str,
) -> TransitionSpec:
    return TransitionSpec(action, actor, frozenset(src), dst, durable, summary)


S = Stage
# The stages an answer is taken from: the attempt's wait, and every stage a
# time-out leaves the call in while its record is still at that attempt with
# no outcome (the spec's HoldsUnanswered).
_LATE_STAGES: Final = (S.RESUME, S.NONE, S.RECONCILING, S.RETRY)
_ANSWERED_FROM: Final = (S.WAITING, *_LATE_STAGES)
TRANSITIONS: Final[Mapping[Action, TransitionSpec]] = {
    t.action: t
    for t in (
        _row(Action.ProviderEmitCall, Actor.PROVIDER, (), S.NONE, "-",
             "the model emits a call (in memory only)"),
        _row(Action.EnginePersistCall, Actor.ENGINE, (S.NONE,), None, "the call",
             "the assistant message holding the call is checkpointed; live, or "
             "Recover if its id already has a record"),
        _row(Action.EngineParkApproval, Actor.ENGINE, (S.LIVE,), S.LIVE, "approval pending",
             "the approval is parked in the inbox"),
        _row(Action.HumanApprove, Actor.HUMAN, (), None, "approval approved",
             "a human approves this call"),
        _row(Action.HumanReject, Actor.HUMAN, (), None, "approval rejected",
             "a human rejects this call"),
        _row(Action.EngineRecordDenied, Actor.ENGINE, (S.LIVE,), S.NONE, "denied result",
             "a rejected approval becomes a denied tool result"),
        _row(Action.EnginePersistDispatched, Actor.ENGINE, (S.LIVE, S.RETRY), S.DISPATCHED,
             "dispatched(n) + audit row", "the attempt is recorded BEFORE the adapter runs"),
        _row(Action.EngineInvokeAdapter, Actor.ENGINE, (S.DISPATCHED,), S.WAITING, "-",
             "the adapter is invoked with the execution id"),
        _row(Action.EngineInvokeReadonly, Actor.ENGINE, (S.LIVE,), S.GOT_OK, "-",
             "a readonly tool runs, bypassing the ledger"),
        _row(Action.ExternalApply, Actor.EXTERNAL, _ANSWERED_FROM, S.GOT_OK, "-",
             "the external system applies (or deduplicates) and answers; a late answer "
             "of the attempt the record is still at is taken too"),
        _row(Action.ExternalApplyLoseAnswer, Actor.EXTERNAL, (), None, "-",
             "the external system applies; the answer is lost"),
        _row(Action.ExternalRejectDefinite, Actor.EXTERNAL, _ANSWERED_FROM, S.GOT_FAIL, "-",
             "a definite failure: known not applied (late, as for ExternalApply)"),
        _row(Action.ExternalDropFenced, Actor.EXTERNAL, (), None, "-",
             "a late request of a fenced attempt is dropped"),
        _row(Action.EngineRecordSucceeded, Actor.ENGINE, (S.GOT_OK,), S.RECORDED,
             "succeeded(result)", "the result is recorded right after the adapter returns"),
        _row(Action.EngineRecordFailed, Actor.ENGINE, (S.GOT_FAIL,), S.RECORDED,
             "failed(error)", "a definite failure is recorded"),
        _row(Action.EngineAppendResult, Actor.ENGINE, (S.RECORDED, S.GOT_OK), S.NONE,
             "role=tool result", "the tool result is appended to the conversation"),
        _row(Action.EngineTimeout, Actor.ENGINE, (S.WAITING,), S.RESUME, "-",
             "the live engine gives up waiting: unknown outcome"),
        _row(Action.Recover, Actor.ENGINE, (S.RESUME,), None, "decision + audit row",
             "the recovery decision is applied"),
        _row(Action.EngineReconcileApplied, Actor.ENGINE, (S.RECONCILING,), S.RECORDED,
             "succeeded(result) + audit row", "the connector says: applied"),
        _row(Action.EngineReconcileNotApplied, Actor.ENGINE, (S.RECONCILING,), S.RETRY,
             "audit row (fence at the connector)", "the connector fences and says: not applied"),
        _row(Action.EngineReconcileUnknown, Actor.ENGINE, (S.RECONCILING,), S.NONE,
             "recovery_required + audit row", "the connector cannot tell"),
        _row(Action.HumanResolveApplied, Actor.HUMAN, (S.NONE,), S.RESUME,
             "succeeded(human result) + audit row", "a human says it was applied"),
        _row(Action.HumanResolveRetry, Actor.HUMAN, (S.NONE,), S.RESUME,
             "human_retry(n+1) audit row: the grant",
             "a human grants one retry; the next Recover runs it (RetryGranted)"),
        _row(Action.HumanResolveAbandon, Actor.HUMAN, (S.NONE,), S.RESUME,
             "abandoned + audit row", "a human abandons the call"),
        _row(Action.HumanCancel, Actor.HUMAN, (S.LIVE,), S.RESUME, "cancelled result + audit row",
             "a user's Stop before dispatch: cancelled, re-decided (skip), never dispatched"),
        _row(Action.Crash, Actor.ENVIRONMENT, (), S.RESUME, "-",
             "the process dies and restarts: volatile state is lost"),
        _row(Action.ConversationRepair, Actor.ENVIRONMENT, (S.RESUME,), None, "-",
             "the conversation's load-time repair removes an unanswered call "
             "(the ledger keeps its record and approval)"),
        _row(Action.ConversationRenumber, Actor.ENVIRONMENT, (S.RESUME,), S.RESUME, "-",
             "compaction or repair moves an unanswered call's turn (its id stays)"),
        _row(Action.EngineDiscardLateReturn, Actor.ENGINE, (), None, "-",
             "a return for an older attempt, or after a time-out or a crash, is discarded"),
        _row(Action.RetentionWindowPasses, Actor.ENVIRONMENT, (), None, "-",
             "the clock passes the end of the key's retention window: keyRetained is false"),
        _row(Action.ExternalExpireKey, Actor.EXTERNAL, (), None, "-",
             "the external system forgets an idempotency key after its window"),
        _row(Action.ExternalAnswerInFlight, Actor.EXTERNAL, (S.WAITING,), S.RESUME, "-",
             "409: another request under the key is in flight; unknown, as a time-out"),
        _row(Action.ExternalAnswerParamsDiffer, Actor.EXTERNAL, (S.WAITING,), S.RESUME, "-",
             "the key holds a request with other parameters; unknown, as a time-out"),
        _row(Action.ExternalReplayFailure, Actor.EXTERNAL, (S.WAITING,), S.RESUME, "-",
             "the key's stored failure is replayed; unknown, as a time-out"),
    )
}
del S


# --------------------------------------------------------------------------
# Transition functions (one per action; guards first, as in the spec)
# --------------------------------------------------------------------------

Handler = Callable[[SessionState, Event], SessionState]
_HANDLERS: dict[Action, Handler] = {}


def _handles(action: Action) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        _HANDLERS[action] = fn
        return fn

    return register


def _require(cond: bool, ev: Event, why: str) -> None:
    if not cond:
        raise ProtocolError(ev.action, ev.position, why)


def _call(state: SessionState, ev: Event) -> CallState:
    if ev.position is None:
        raise ProtocolError(ev.action, None, "the event names no call position")
    c = state.call(ev.position)
    if c is None:
        raise ProtocolError(ev.action, ev.position, "no call at that position")
    return c


def _stage(c: CallState, ev: Event, *allowed: Stage) -> None:
    _require(
        c.stage in allowed,
        ev,
        f"stage is {c.stage.value}, expected {' or '.join(s.value for s in allowed)}",
    )


def _approval_for(state: SessionState, c: CallState) -> bool:
    """The spec's ApprovalFor: the approval at c's id was asked for exactly c's
    arguments.  An approval given to a call the conversation lost binds only
    that call's arguments, never another call later emitted at its position."""
    return state.approval_digest(c.execution_id) == c.args_digest


def _approval_ok(state: SessionState, c: CallState) -> bool:
    return not c.tool.requires_approval or (
        state.approval(c.execution_id) is ApprovalState.APPROVED and _approval_for(state, c)
    )


def _needs_new_approval(state: SessionState, c: CallState) -> bool:
    """The spec's NeedsNewApproval: no approval yet, or one for other arguments."""
    return state.approval(c.execution_id) is ApprovalState.NONE or not _approval_for(state, c)


@_handles(Action.ProviderEmitCall)
def _emit(state: SessionState, ev: Event) -> SessionState:
    pos = ev.position
    _require(pos is not None, ev, "the event names no call position")
    assert pos is not None
    _check_position(*pos)
    _require(state.call(pos) is None, ev, "a call is already at that position")
    _require(not state.is_legacy(pos), ev, f"turn {pos[0]} is before the protocol marker")
    _require(
        all(c.result is not None or state.superseded(c.execution_id)
            for c in state.calls if c.position[0] < pos[0]),
        ev,
        "an earlier turn still has a call without a result",
    )
    if ev.tool is None or ev.args_digest is None or ev.tool_call_id is None:
        raise InvalidInput("ProviderEmitCall needs tool_call_id, tool and args_digest")
    eid = derive_execution_id(state.session_id, pos[0], pos[1], ev.tool_call_id)
    new = CallState(pos, ev.tool_call_id, ev.tool, eid, ev.args_digest, MessageState.VOLATILE)
    calls = tuple(sorted((*state.calls, new), key=lambda c: c.position))
    return state._evolve(calls=calls)


@_handles(Action.EnginePersistCall)
def _persist_call(state: SessionState, ev: Event) -> SessionState:
    c = _call(state, ev)
    _require(c.message is MessageState.VOLATILE, ev, "the call is already durable")
    # A fresh call goes through the same decision as a resumed one: with no
    # record at its id the decision is "execute" (the live stage); a call
    # whose id already has a record (the conversation lost an unanswered
    # call and the provider emitted one at its position) goes to Recover,
    # where the record's argument digest is compared with this call's.
    # Dispatching it live would overwrite that record blindly.
    fresh = state.record(c.execution_id).status is LedgerStatus.NONE
    stage = Stage.LIVE if fresh else Stage.RESUME
    return state._with_call(replace(c, message=MessageState.DURABLE, stage=stage))


@_handles(Action.EngineParkApproval)
def _park(state: SessionState, ev: Event) -> SessionState:
    c = _call(state, ev)
    _stage(c, ev, Stage.LIVE)
    _require(c.tool.requires_approval, ev, f"tool {c.tool.name!r} needs no approval")
    _require(
        _needs_new_approval(state, c),
        ev,
        f"approval is already {state.approval(c.execution_id).value} for these arguments",
    )
    # An approval at this id for other arguments (given to a call the
    # conversation lost, or still pending for it) is replaced: the human is
    # asked again, for the arguments that will be sent.
    return state._with_approval(c.execution_id, ApprovalState.PENDING, c.args_digest)


def _resolve_approval(state: SessionState, ev: Event, value: ApprovalState) -> SessionState:
    c = _call(state, ev)
    _require(c.message is MessageState.DURABLE, ev, "the call is not durable")
    _require(
        state.approval(c.execution_id) is ApprovalState.PENDING,
        ev,
        f"approval is {state.approval(c.execution_id).value}, not pending",
    )
    return state._with_approval(c.execution_id, value)


@_handles(Action.HumanApprove)
def _approve(state: SessionState, ev: Event) -> SessionState:
    return _resolve_approval(state, ev, ApprovalState.APPROVED)


@_handles(Action.HumanReject)
def _reject(state: SessionState, ev: Event) -> SessionState:
    return _resolve_approval(state, ev, ApprovalState.REJECTED)


@_handles(Action.EngineRecordDenied)
def _denied(state: SessionState, ev: Event) -> SessionState:
    c = _call(state, ev)
    _stage(c, ev, Stage.LIVE)
    _require(
        c.tool.requires_approval
        and state.approval(c.execution_id) is ApprovalState.REJECTED,
        ev,
        "the approval is not rejected",
    )
    _require(
        _approval_for(state, c),
        ev,
        "the rejection was for other arguments than this call's: park a new approval",
    )
    res = ToolResult(ResultKind.DENIED, c.execution_id, c.args_digest, "denied by a human")
    return state._with_call(replace(c, result=res, stage=Stage.NONE))


@_handles(Action.EnginePersistDispatched)
def _dispatch(state: SessionState, ev: Event) -> SessionState:
    c = _call(state, ev)
    _require(c.tool.protected, ev, f"tool {c.tool.name!r} is readonly: it bypasses the ledger")
    _require(c.message is MessageState.DURABLE, ev, "the call is not durable yet")
    _stage(c, ev, Stage.LIVE, Stage.RETRY)
    if c.stage is Stage.LIVE:
        _require(
            _approval_ok(state, c),
            ev,
            "the call is not approved"
            + ("" if state.approval(c.execution_id) is not ApprovalState.APPROVED
               else " for these arguments (its approval was given for others): "
               "park a new approval"),
        )
        auth = Authorization.APPROVAL if c.tool.requires_approval else Authorization.AUTO
    else:  # a retry: the policy's, or the human's whose grant it uses
        auth = Authorization.HUMAN if retry_granted(state, c) else Authorization.POLICY
    rec = state.record(c.execution_id)
    n = rec.attempt + 1
    _require(n <= state.max_attempts, ev, f"attempt {n} exceeds max_attempts")
    new_rec = ExecutionRecord(
        c.execution_id, LedgerStatus.DISPATCHED, n, c.args_digest, auth, None, c.position,
        _first_dispatch(rec, ev),
    )
    return (
        state._with_record(new_rec)
        ._with_audit((c.execution_id, "dispatch", n))
        ._with_call(c._staged(Stage.DISPATCHED))
    )


@_handles(Action.EngineInvokeAdapter)
def _invoke(state: SessionState, ev: Event) -> SessionState:
    c = _call(state, ev)
    _stage(c, ev, Stage.DISPATCHED)
    return state._with_call(c._staged(Stage.WAITING))


@_handles(Action.EngineInvokeReadonly)
def _invoke_readonly(state: SessionState, ev: Event) -> SessionState:
    c = _call(state, ev)
    _stage(c, ev, Stage.LIVE)
    _require(not c.tool.protected, ev, f"tool {c.tool.name!r} is not readonly")
    _require(_approval_ok(state, c), ev, "the call is not approved")
    return state._with_call(c._staged(Stage.GOT_OK))


def _holds_unanswered(state: SessionState, c: CallState, attempt: int | None) -> bool:
    """The spec's HoldsUnanswered: the engine no longer waits for ``attempt``
    (it timed out), but the call's record is still at that attempt with no
    outcome.  Its late answer is then this attempt's answer, and it is taken
    and recorded: dropping it would leave a human to decide on the call
    knowing less than the engine did (HumanSeesKnownOutcome)."""
    rec = state.record(c.execution_id)
    return (
        c.message is MessageState.DURABLE
        and c.result is None
        and c.stage in _LATE_STAGES
        and rec.attempt == attempt
        and rec.status in (LedgerStatus.DISPATCHED, LedgerStatus.RECOVERY_REQUIRED)
        # the record is this call's own (not one of a call the conversation lost)
        and rec.args_digest == c.args_digest
    )


def _answer(state: SessionState, ev: Event, to: Stage) -> SessionState:
    c = _call(state, ev)
    if c.stage is not Stage.WAITING and _holds_unanswered(state, c, ev.attempt):
        # late, but still the current attempt's answer (docs/protocol.md#late-answers)
        return state._with_call(c._staged(to))
    _stage(c, ev, Stage.WAITING)
    _require(
        ev.attempt == state.record(c.execution_id).attempt,
        ev,
        f"the answer is for attempt {ev.attempt}, the engine waits for "
        f"{state.record(c.execution_id).attempt}",
    )
    return state._with_call(c._staged(to))


@_handles(Action.ExternalApply)
def _answer_ok(state: SessionState, ev: Event) -> SessionState:
    return _answer(state, ev, Stage.GOT_OK)


@_handles(Action.ExternalRejectDefinite)
def _answer_fail(state: SessionState, ev: Event) -> SessionState:
    return _answer(state, ev, Stage.GOT_FAIL)


@_handles(Action.EngineRecordSucceeded)
def _record_succeeded(state: SessionState, ev: Event) -> SessionState:
    c = _call(state, ev)
    _stage(c, ev, Stage.GOT_OK)
    _require(c.tool.protected, ev, "a readonly result is appended, not recorded")
    rec = state.record(c.execution_id)
    res = ToolResult(ResultKind.OK, c.execution_id, rec.args_digest or "")
    new_rec = replace(rec, status=LedgerStatus.SUCCEEDED, result=res)
    return state._with_record(new_rec)._with_call(c._staged(Stage.RECORDED))


@_handles(Action.EngineRecordFailed)
def _record_failed(state: SessionState, ev: Event) -> SessionState:
    c = _call(state, ev)
    _stage(c, ev, Stage.GOT_FAIL)
    rec = state.record(c.execution_id)
    res = ToolResult(ResultKind.ERROR, c.execution_id, rec.args_digest or "")
    new_rec = replace(rec, status=LedgerStatus.FAILED, result=res)
    return state._with_record(new_rec)._with_call(c._staged(Stage.RECORDED))


@_handles(Action.EngineAppendResult)
def _append(state: SessionState, ev: Event) -> SessionState:
    c = _call(state, ev)
    if c.stage is Stage.GOT_OK and not c.tool.protected:
        res: ToolResult | None = ToolResult(ResultKind.OK, c.execution_id, c.args_digest)
    else:
        _stage(c, ev, Stage.RECORDED)
        res = state.record(c.execution_id).result
        _require(res is not None, ev, "the record holds no result to append")
    return state._with_call(replace(c, result=res, stage=Stage.NONE))


@_handles(Action.EngineTimeout)
def _timeout(state: SessionState, ev: Event) -> SessionState:
    c = _call(state, ev)
    _stage(c, ev, Stage.WAITING)
    return state._with_call(c._staged(Stage.RESUME))


def _key_answer(state: SessionState, ev: Event) -> SessionState:
    """A key answer of a real API ("in flight", "parameters differ", a replayed
    failure: docs/protocol.md#real-apis-answers) to the attempt the engine waits
    for.  None of them says whether the effect happened: the adapter seam
    classifies each as unknown, so the call resumes as after a time-out and
    Recover decides.  Only a request that carries a key (an idempotent tool's)
    gets one."""
    c = _call(state, ev)
    _stage(c, ev, Stage.WAITING)
    _require(c.tool.policy is RecoveryPolicy.IDEMPOTENT, ev,
             "only an idempotent tool's request carries an idempotency key")
    _require(
        ev.attempt == state.record(c.execution_id).attempt,
        ev,
        f"the answer is for attempt {ev.attempt}, the engine waits for "
        f"{state.record(c.execution_id).attempt}",
    )
    return state._with_call(c._staged(Stage.RESUME))


for _a in (Action.ExternalAnswerInFlight, Action.ExternalAnswerParamsDiffer,
           Action.ExternalReplayFailure):
    _handles(_a)(_key_answer)
del _a


def retry_granted(state: SessionState, c: CallState) -> bool:
    """The spec's RetryGranted (:meth:`SessionState.retry_granted`): a human's
    unused retry grant, which Recover honours."""
    return state.retry_granted(c)


def _halt_record(state: SessionState, c: CallState) -> ExecutionRecord:
    # The spec's Halt: a halt never rebinds a record to another call.  The
    # record keeps the argument digest it was written for and, when it is
    # halted on a digest mismatch after its outcome was known, its result:
    # that result is what says "this execution's outcome was known", so no
    # human retry is offered on it (_human_retry).  Only a call with no record
    # yet (a legacy call) is bound to its own arguments by the halt.
    rec = state.record(c.execution_id)
    if rec.status is not LedgerStatus.NONE:
        return replace(rec, status=LedgerStatus.RECOVERY_REQUIRED)
    return replace(
        rec,
        status=LedgerStatus.RECOVERY_REQUIRED,
        args_digest=c.args_digest,
        position=c.position,
    )



def decision_audit_key(state: SessionState, call: CallState) -> AuditKey | None:
    """The audit key of the decision ``Recover`` takes on ``call`` in ``state``.

    ``None`` where ``Recover`` audits nothing (a readonly tool, or ``skip``).
    EVERY decision gets its own audit row, also one taken again for an
    attempt that an earlier row of the same kind covers (after another crash,
    or after a human resolved the call): the key is then already in
    ``state.audit`` and the facade writes the row all the same, with this
    decision's inputs, so ``AuditRecomputable`` and ``AuditComplete`` are
    about every decision (docs/protocol.md#invariants).
    """
    d = decide_recovery(recovery_inputs(state, call)).decision
    if not call.tool.protected or d is Decision.SKIP:
        return None
    return (call.execution_id, d.value, state.record(call.execution_id).attempt)


@_handles(Action.Recover)
def _recover(state: SessionState, ev: Event) -> SessionState:
    c = _call(state, ev)
    _stage(c, ev, Stage.RESUME)
    rec = state.record(c.execution_id)
    d = decide_recovery(recovery_inputs(state, c)).decision
    # a halt with a human's unused retry grant: the retry, not the human again
    granted = d is Decision.RECOVERY_REQUIRED and retry_granted(state, c)
    out = state._with_call(c._staged(Stage.RETRY if granted else _STAGE_AFTER[d]))
    if d is Decision.RECOVERY_REQUIRED and rec.status is not LedgerStatus.RECOVERY_REQUIRED:
        out = out._with_record(_halt_record(state, c))
    key = decision_audit_key(state, c)
    if key is not None:
        out = out._with_audit(key)
    return out


@_handles(Action.EngineReconcileApplied)
def _reconcile_applied(state: SessionState, ev: Event) -> SessionState:
    c = _call(state, ev)
    _stage(c, ev, Stage.RECONCILING)
    rec = state.record(c.execution_id)
    res = ToolResult(ResultKind.OK, c.execution_id, rec.args_digest or "")
    return (
        state._with_record(replace(rec, status=LedgerStatus.SUCCEEDED, result=res))
        ._with_audit((c.execution_id, "reconcile_applied", rec.attempt))
        ._with_call(c._staged(Stage.RECORDED))
    )


@_handles(Action.EngineReconcileNotApplied)
def _reconcile_not_applied(state: SessionState, ev: Event) -> SessionState:
    c = _call(state, ev)
    _stage(c, ev, Stage.RECONCILING)
    rec = state.record(c.execution_id)
    _require(rec.attempt < state.max_attempts, ev, "the retry budget is spent")
    return state._with_audit((c.execution_id, "reconcile_not_applied", rec.attempt))._with_call(
        c._staged(Stage.RETRY)
    )


@_handles(Action.EngineReconcileUnknown)
def _reconcile_unknown(state: SessionState, ev: Event) -> SessionState:
    c = _call(state, ev)
    _stage(c, ev, Stage.RECONCILING)
    rec = state.record(c.execution_id)
    return (
        state._with_record(_halt_record(state, c))
        ._with_audit((c.execution_id, "reconcile_unknown", rec.attempt))
        ._with_call(c._staged(Stage.NONE))
    )


def _halted_call(state: SessionState, ev: Event) -> tuple[CallState, ExecutionRecord]:
    c = _call(state, ev)
    _require(c.message is MessageState.DURABLE, ev, "the call is not durable")
    _require(c.result is None, ev, "the call already has a result")
    rec = state.record(c.execution_id)
    _require(
        rec.status is LedgerStatus.RECOVERY_REQUIRED,
        ev,
        f"the record is {rec.status.value}, not recovery_required",
    )
    _stage(c, ev, Stage.NONE)
    return c, rec


@_handles(Action.HumanResolveApplied)
def _human_applied(state: SessionState, ev: Event) -> SessionState:
    c, rec = _halted_call(state, ev)
    res = ToolResult(ResultKind.HUMAN, c.execution_id, c.args_digest)
    # the human resolves the call at the position: the record is bound to it
    # (a no-op unless the halt was a digest mismatch); nothing is invoked
    resolved = replace(
        rec, status=LedgerStatus.SUCCEEDED, result=res,
        args_digest=c.args_digest, position=c.position,
    )
    return (
        state._with_record(resolved)
        ._with_audit((c.execution_id, "human_applied", rec.attempt))
        ._with_call(c._staged(Stage.RESUME))
    )


@_handles(Action.HumanResolveRetry)
def _human_retry(state: SessionState, ev: Event) -> SessionState:
    c, rec = _halted_call(state, ev)
    n = rec.attempt + 1
    _require(n <= state.max_attempts, ev, f"attempt {n} exceeds max_attempts")
    # HumanMayRetry: a retry would otherwise send an attempt of an execution
    # whose outcome is known, or these arguments under another call's
    # execution id and approval; the human's other choices invoke nothing
    known = None if rec.result is None else rec.result.kind.value
    _require(
        known is None,
        ev,
        f"the execution's outcome is known (its record holds a {known} result): "
        "a retry would invoke it again; resolve it as applied or abandon it",
    )
    _require(
        rec.args_digest == c.args_digest,
        ev,
        "the record was written for other arguments than the call at its position "
        "(the conversation lost that call): a retry would send these arguments under "
        "the other call's execution id and approval; resolve it as applied or abandon it",
    )
    _require((c.execution_id, "human_retry", n) not in state.audit, ev,
             f"a retry (attempt {n}) is granted already")
    # the grant only: the record stays halted at attempt n-1 until the engine's
    # Recover honours the grant (retry_granted) and dispatches attempt n
    return (
        state._with_audit((c.execution_id, "human_retry", n))
        ._with_call(c._staged(Stage.RESUME))
    )


@_handles(Action.HumanResolveAbandon)
def _human_abandon(state: SessionState, ev: Event) -> SessionState:
    c, rec = _halted_call(state, ev)
    res = ToolResult(ResultKind.ABANDONED, c.execution_id, c.args_digest, "abandoned by a human")
    resolved = replace(
        rec, status=LedgerStatus.ABANDONED, result=res,
        args_digest=c.args_digest, position=c.position,
    )
    return (
        state._with_record(resolved)
        ._with_audit((c.execution_id, "human_abandon", rec.attempt))
        ._with_call(c._staged(Stage.RESUME))
    )


@_handles(Action.HumanCancel)
def _cancel(state: SessionState, ev: Event) -> SessionState:
    # A user's Stop after approval (or for a call that needs none), before
    # dispatch.  The cancelled result is durable in the same transition; the
    # call goes to RESUME so that the engine re-decides it from the durable
    # state (Recover: it has a result, so "skip") instead of acting on the
    # plan it held in memory.  Its approval authorizes nothing any more: only
    # a dispatch from LIVE reads it, and a call with a result is never LIVE.
    c = _call(state, ev)
    _require(c.message is MessageState.DURABLE, ev, "the call is not durable")
    _stage(c, ev, Stage.LIVE)
    _require(c.result is None, ev, "the call already has a result")
    _require(_approval_ok(state, c), ev, "the call is not approved: reject it instead")
    rec = state.record(c.execution_id)
    _require(
        not c.tool.protected or rec.status is LedgerStatus.NONE,
        ev,
        f"the call was already dispatched (its record is {rec.status.value})",
    )
    res = ToolResult(ResultKind.CANCELLED, c.execution_id, c.args_digest, "cancelled by the user")
    return state._with_audit((c.execution_id, "human_cancel", rec.attempt))._with_call(
        replace(c, result=res, stage=Stage.RESUME)
    )


def _first_dispatch(rec: ExecutionRecord, ev: Event) -> float | None:
    """The execution's first dispatch time: kept from the earlier attempts."""
    return rec.dispatched_at if rec.dispatched_at is not None else ev.at


@_handles(Action.EngineDiscardLateReturn)
def _discard_late_return(state: SessionState, ev: Event) -> SessionState:
    """An adapter's return for ``ev.attempt`` that no engine takes is
    dropped: nothing changes.  The core REFUSES to discard the answer of the
    attempt the call waits for, or of the attempt its record is still at after
    a time-out (``_holds_unanswered``): deliver it (ExternalApply or
    ExternalRejectDefinite), so a return can never be both taken and dropped.
    A return for a call the conversation no longer holds (ConversationRepair
    removed it) is late by definition: no engine can wait for it."""
    _require(ev.attempt is not None, ev, "a return names the attempt that sent it")
    if ev.position is not None and state.call(ev.position) is None:
        return state
    c = _call(state, ev)
    rec = state.record(c.execution_id)
    _require(
        not (c.stage is Stage.WAITING and rec.attempt == ev.attempt),
        ev,
        f"the engine waits for attempt {ev.attempt}: its return is the current answer, "
        "deliver it instead of discarding it",
    )
    _require(
        not _holds_unanswered(state, c, ev.attempt),
        ev,
        f"the record is still at attempt {ev.attempt} with no outcome: its late return is "
        "the attempt's answer, deliver it instead of discarding it",
    )
    return state


@_handles(Action.RetentionWindowPasses)
def _window_passes(state: SessionState, ev: Event) -> SessionState:
    c = _call(state, ev)
    rec = state.record(c.execution_id)
    _require(
        c.tool.policy is RecoveryPolicy.IDEMPOTENT,
        ev,
        "only an idempotent tool's key has a retention window",
    )
    _require(rec.status is not LedgerStatus.NONE, ev, "the execution was never dispatched")
    _require(
        c.execution_id not in state.retention_passed, ev, "the window has already passed"
    )
    return replace(state, retention_passed=state.retention_passed | {c.execution_id})


@_handles(Action.Crash)
def _crash(state: SessionState, ev: Event) -> SessionState:
    calls = tuple(
        replace(
            c,
            stage=Stage.RESUME if c.result is None else Stage.NONE,
        )
        for c in state.calls
        if c.message is MessageState.DURABLE
    )
    return replace(state, calls=calls)


def _unanswered_loaded(state: SessionState, ev: Event) -> CallState:
    # The conversation's rewrites happen when the engine loads it: to a
    # durable call without a result, which the loader hands to Recover.
    c = _call(state, ev)
    _require(c.message is MessageState.DURABLE, ev, "the call is not durable")
    _require(c.result is None, ev, "the call already has a result")
    _stage(c, ev, Stage.RESUME)
    return c


@_handles(Action.ConversationRepair)
def _repair(state: SessionState, ev: Event) -> SessionState:
    # The conversation drops the call; the ledger's records, approvals and
    # audit (keyed by execution id) stay.  The provider may emit another
    # call at the position: its persist meets the record (EnginePersistCall).
    c = _unanswered_loaded(state, ev)
    _require(not state.is_legacy(c.position), ev, "a legacy call is not re-emitted")
    return replace(state, calls=tuple(d for d in state.calls if d is not c))


@_handles(Action.ConversationRenumber)
def _renumber(state: SessionState, ev: Event) -> SessionState:
    # The turn the conversation reports for the call moves.  The core keeps
    # the execution id derived when the call was emitted (CallState) and
    # never derives it again, so nothing it holds changes: the call keeps
    # its id, its position as the core knows it, its record and approval.
    _unanswered_loaded(state, ev)
    return state


# Actions with no effect on the engine's state: the external system's own
# moves (an answer that is lost, a fenced request dropped).
_ENGINE_SILENT: Final = frozenset(
    {Action.ExternalApplyLoseAnswer, Action.ExternalDropFenced, Action.ExternalExpireKey}
)


def apply(state: SessionState, event: Event) -> SessionState:
    """The state after ``event``; raises :class:`ProtocolError` if not allowed."""
    if not isinstance(event, Event):
        raise InvalidInput(f"expected an Event, got {type(event).__name__}")
    pos: object = event.position
    if pos is not None and not (
        isinstance(pos, tuple)
        and len(pos) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in pos)
    ):
        raise InvalidInput(
            f"{event.action}: position must be a (turn, slot) tuple of non-negative ints, "
            f"got {pos!r}"
        )
    if event.action in _ENGINE_SILENT:
        return state
    handler = _HANDLERS.get(event.action)
    if handler is None:
        raise InvalidInput(f"unknown action {event.action!r}")
    return handler(state, event)


def enabled(state: SessionState, event: Event) -> bool:
    """Whether ``event`` is allowed now (its guard holds)."""
    try:
        apply(state, event)
    except ProtocolError:
        return False
    return True


def durable_changes(
    before: SessionState, after: SessionState
) -> tuple[
    list[CallState], list[tuple[str, ApprovalState]], list[ExecutionRecord], list[AuditKey]
]:
    """What a transition made durable: calls (message or result changed),
    approvals, ledger records and audit keys.  The store writes exactly these,
    in one transaction, before the engine acts on ``after``."""
    old_calls = {c.position: c for c in before.calls}
    calls = [
        c
        for c in after.calls
        if c.message is MessageState.DURABLE
        and (
            (o := old_calls.get(c.position)) is None
            or o.message is not c.message
            or o.result != c.result
        )
    ]
    approvals = [
        (k, v) for k, v in after.approvals.items() if before.approvals.get(k) is not v
    ]
    records = [r for k, r in after.ledger.items() if before.ledger.get(k) != r]
    audit = sorted(after.audit - before.audit)
    return calls, approvals, records, audit


assert set(_HANDLERS) | _ENGINE_SILENT == set(Action), "every action has a handler"
assert set(TRANSITIONS) == set(Action), "every action has a row in TRANSITIONS"
