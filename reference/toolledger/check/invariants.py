"""The spec's invariants, in Python, under the spec's names.

Each function takes a model configuration and a
:class:`~toolledger.check.system.SystemState` and returns the list of ways the
state breaks the invariant (empty: it holds), so a failing check can tell
its story.  They are written against the reference's own state, not against
the spec mapping, and mirror the definitions in
``spec/DurableToolExecution.tla`` one to one; a test asserts that the names
here are exactly the names the ``.cfg`` files check.

``EventuallySettled`` and ``EventuallyAnswered`` are liveness properties;
:func:`settled` and :func:`answered` are their state predicates, which the
Hypothesis machines check once a run has been driven to quiescence.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from .._core import protocol as p
from .system import ModelConfig, SystemState

__all__ = ["INVARIANTS", "PROPERTIES", "answered", "check_all", "settled"]

Check = Callable[[ModelConfig, SystemState], list[str]]
_KNOWN = frozenset({p.LedgerStatus.SUCCEEDED, p.LedgerStatus.FAILED, p.LedgerStatus.ABANDONED})


def _present(cfg: ModelConfig, s: SystemState) -> list[tuple[str, p.CallState]]:
    return [
        (cfg.by_position[c.position].name, c)
        for c in s.session.calls
        if c.position in cfg.by_position
    ]


def TypeOK(cfg: ModelConfig, s: SystemState) -> list[str]:
    out = []
    ses = s.session
    for name, c in _present(cfg, s):
        stage: object = c.stage
        message: object = c.message
        if not isinstance(stage, p.Stage) or not isinstance(message, p.MessageState):
            out.append(f"{name}: stage/message of the wrong type")
        kind: object = None if c.result is None else c.result.kind
        if kind is not None and not isinstance(kind, p.ResultKind):
            out.append(f"{name}: result kind of the wrong type")
    for e, rec in ses.ledger.items():
        if not 0 <= rec.attempt <= ses.max_attempts:
            out.append(f"record {e}: attempt {rec.attempt} outside 0..{ses.max_attempts}")
        status: object = rec.status
        if not isinstance(status, p.LedgerStatus):
            out.append(f"record {e}: status of the wrong type")
    for e, reqs in s.external.inflight.items():
        if any(not 1 <= n <= ses.max_attempts for n in reqs):
            out.append(f"in flight {e}: attempts {sorted(reqs)} outside 1..{ses.max_attempts}")
    if not 0 <= s.ghosts.crashes <= cfg.max_crashes:
        out.append(f"crashes = {s.ghosts.crashes} outside 0..{cfg.max_crashes}")
    return out


def AtMostOnceEffect(cfg: ModelConfig, s: SystemState) -> list[str]:
    """The call's OWN effects (the effects ghost, keyed by the call) are at
    most one plus one per human retry."""
    out = []
    for c in cfg.calls:
        if not c.tool.protected:
            continue
        e = cfg.exec_ids[c.name]
        n, allowed = s.ghosts.effects.get(c.name, 0), 1 + s.ghosts.human_retries.get(e, 0)
        if n > allowed:
            out.append(f"{c.name}: effect applied {n} times, at most {allowed} allowed")
    return out


def NoReinvokeAfterKnownOutcome(cfg: ModelConfig, s: SystemState) -> list[str]:
    """Once a succeeded/failed outcome of a call was durable (ever), it is never sent again."""
    out = []
    by_pos = {c.position: c for c in s.session.calls}
    for cc in cfg.calls:
        if cc.name not in s.ghosts.known_outcome:
            continue
        late = s.ghosts.sent_after_outcome.get(cc.name, 0)
        if late:
            out.append(f"{cc.name}: {late} request(s) sent after its outcome was durable")
        c = by_pos.get(cc.position)
        if c is not None and c.stage in (p.Stage.DISPATCHED, p.Stage.RETRY):
            out.append(f"{cc.name}: about to invoke again ({c.stage.value}) after its outcome")
    return out


def AttemptSentOnce(cfg: ModelConfig, s: SystemState) -> list[str]:
    """Each attempt of a call (keyed by the call, not the execution id) is sent at most once."""
    return [
        f"{name}: attempt {n} sent {k} times"
        for (name, n), k in sorted(s.ghosts.sent.items())
        if k > 1
    ]


def NoBlindReplay(cfg: ModelConfig, s: SystemState) -> list[str]:
    out = []
    for c in cfg.calls:
        for e, n, auth in s.ghosts.invoked(c.name):
            if n <= 1 or auth is p.Authorization.HUMAN:
                continue
            policy = c.tool.policy
            if auth is p.Authorization.POLICY and policy is p.RecoveryPolicy.IDEMPOTENT:
                continue
            if (
                auth is p.Authorization.POLICY
                and policy is p.RecoveryPolicy.RECONCILE
                and s.external.fence(e) >= n - 1
            ):
                continue
            out.append(f"{c.name}: attempt {n} authorized by {auth.value} under {policy.value}")
    return out


def ResultFidelity(cfg: ModelConfig, s: SystemState) -> list[str]:
    """Every result belongs to this call and says what happened (see the spec's box:
    which result kinds may stand beside an applied effect, and why)."""
    out = []
    for name, c in _present(cfg, s):
        r = c.result
        if r is None:
            continue
        if r.execution_id != c.execution_id:
            out.append(f"{name}: shows the result of execution {r.execution_id}")
        if r.args_digest != c.args_digest:
            out.append(f"{name}: shows a result computed from other arguments")
        # the call's own effects, not the key's: an "ok" deduplicated from
        # another call's request under a shared id is not this call's
        applied = s.ghosts.effects.get(name, 0)
        if r.kind is p.ResultKind.OK and c.tool.protected and applied < 1:
            out.append(f"{name}: shows a successful result that was never applied")
        if r.kind is p.ResultKind.DENIED and s.ghosts.invoked(name):
            out.append(f"{name}: shows denied, yet it was sent")
        if r.kind is p.ResultKind.ERROR and c.tool.protected:
            allowed = s.ghosts.human_retries.get(c.execution_id, 0) + (
                1 if c.tool.policy is p.RecoveryPolicy.IDEMPOTENT else 0
            )
            if applied > allowed:
                out.append(f"{name}: shows an error beside {applied} applied effect(s), "
                           f"{allowed} explained by human retries and the policy")
    return out


def ApprovalGate(cfg: ModelConfig, s: SystemState) -> list[str]:
    out = []
    approved = {name for name, _ in s.ghosts.human_approved}
    for c in cfg.calls:
        if not (c.tool.requires_approval and c.tool.protected):
            continue
        for _, n, auth in s.ghosts.invoked(c.name):
            if c.name not in approved and auth is not p.Authorization.HUMAN:
                out.append(f"{c.name}: attempt {n} invoked without an approval of this call")
    return out


_ON_APPROVAL: Final = frozenset({p.Authorization.APPROVAL, p.Authorization.POLICY})


def ApprovalBoundToArgs(cfg: ModelConfig, s: SystemState) -> list[str]:
    """Every dispatched record sent on the strength of an approval (its first
    attempt, or a policy retry of it) is of a (call, digest) a human approved:
    the arguments the human was shown are exactly the ones sent."""
    out = []
    for e, rec in sorted(s.session.ledger.items()):
        if rec.status is not p.LedgerStatus.DISPATCHED or rec.authorization not in _ON_APPROVAL:
            continue
        owner = None if rec.position is None else cfg.by_position.get(rec.position)
        if owner is None or not owner.tool.requires_approval:
            continue
        if (owner.name, rec.args_digest) not in s.ghosts.human_approved:
            out.append(
                f"{owner.name}: attempt {rec.attempt} of {e} dispatched on "
                f"{rec.authorization.value} for arguments no human approved"
            )
    return out


def ApprovalSingleUse(cfg: ModelConfig, s: SystemState) -> list[str]:
    out = []
    for c in cfg.calls:
        used = sorted(n for (_, n, a) in s.ghosts.invoked(c.name) if a is p.Authorization.APPROVAL)
        if len(used) > 1:
            out.append(f"{c.name}: one approval authorized attempts {used}")
    return out


def RecoveryRequiredHalts(cfg: ModelConfig, s: SystemState) -> list[str]:
    return [
        f"{name}: recovery_required but the engine holds it in stage {c.stage.value}"
        for name, c in _present(cfg, s)
        if s.session.record(c.execution_id).status is p.LedgerStatus.RECOVERY_REQUIRED
        # the attempt's own late answer, held to be recorded, invokes nothing
        and c.stage not in (p.Stage.NONE, p.Stage.RESUME, p.Stage.GOT_OK, p.Stage.GOT_FAIL)
        # a retry a human granted, held to be dispatched: the human moved it on
        and not (c.stage is p.Stage.RETRY and p.retry_granted(s.session, c))
    ]


def RetryGrantHonoured(cfg: ModelConfig, s: SystemState) -> list[str]:
    """A human's unused retry grant is never met by another halt: no call holding
    one is left waiting for a human (stage none)."""
    return [
        f"{name}: a human granted attempt {s.session.record(c.execution_id).attempt + 1}, "
        "yet the call is halted for a human again"
        for name, c in _present(cfg, s)
        if p.retry_granted(s.session, c) and c.stage is p.Stage.NONE
    ]


def HumanSeesKnownOutcome(cfg: ModelConfig, s: SystemState) -> list[str]:
    """A record waits for a human (recovery_required) only if no applied
    answer of its attempt reached the engine and was dropped: the human
    decides knowing what the engine knew."""
    return [
        f"record {e} waits for a human at attempt {rec.attempt}, but the engine dropped "
        f"that attempt's applied answer"
        for e, rec in sorted(s.session.ledger.items())
        if rec.status is p.LedgerStatus.RECOVERY_REQUIRED
        and (e, rec.attempt) in s.ghosts.dropped_answers
    ]


def LegacyConservative(cfg: ModelConfig, s: SystemState) -> list[str]:
    out = []
    for c in cfg.calls:
        if not (cfg.is_legacy(c) and c.tool.protected):
            continue
        e = cfg.exec_ids[c.name]
        human = [k for (ae, kind, k) in s.session.audit if ae == e and kind == "human_retry"]
        for _, n, a in s.ghosts.invoked(c.name):
            if a is p.Authorization.HUMAN:
                continue
            if a is p.Authorization.POLICY and any(k < n for k in human):
                continue
            out.append(f"{c.name} (legacy): attempt {n} executed on {a.value}, not by a human")
    return out


def ExecutionIdStable(cfg: ModelConfig, s: SystemState) -> list[str]:
    """Every request a call ever sent carries the one id the engine uses for
    the call now: the id kept with the call from its persist on (the core's
    CallState while the conversation holds the call, the ledger store's after
    a ConversationRepair), whatever the conversation's renumbering did."""
    out = []
    by_name = dict(_present(cfg, s))
    for cc in cfg.calls:
        call = by_name.get(cc.name)
        if call is not None:
            now = call.execution_id
        elif cc.name in s.stored:
            now = cfg.exec_ids[cc.name]
        else:
            continue  # never persisted: never invoked
        other = {e for (e, _, _) in s.ghosts.invoked(cc.name)} - {now}
        if other:
            out.append(f"{cc.name}: uses id {now} now, invoked under {sorted(other)} before")
    return out


def AuditComplete(cfg: ModelConfig, s: SystemState) -> list[str]:
    """Every invocation has its dispatch row; every decision taken on a call has its own row.

    A recovery decision's row is the one with its inputs: a decision taken
    again for the same attempt needs a row of its own, so a store that kept
    only the first row of a key, or wrote the last one over it, is caught.
    """
    out = []
    audit = s.session.audit
    for c in cfg.calls:
        e = cfg.exec_ids[c.name]
        for ie, n, _ in s.ghosts.invoked(c.name):
            if (ie, "dispatch", n) not in audit:
                out.append(f"{c.name}: attempt {n} invoked with no dispatch row")
        for kind, n, inputs in sorted(s.ghosts.decisions(c.name), key=repr):
            if (e, kind, n) not in audit:
                out.append(f"{c.name}: decision {kind} (attempt {n}) has no audit row")
            elif inputs is not None and inputs not in s.audit_inputs.get((e, kind, n), ()):
                out.append(
                    f"{c.name}: decision {kind} (attempt {n}) on status {inputs.status.value} "
                    "has no audit row of its own"
                )
    return out


_DECISIONS = frozenset(d.value for d in p.Decision)


def AuditRecomputable(cfg: ModelConfig, s: SystemState) -> list[str]:
    """Every recovery-decision row carries its inputs, and they recompute to its decision.

    Every row: a decision taken again for the same attempt is a row of its own
    (``SystemState.audit_inputs`` keeps the inputs of each).
    """
    out = []
    for key in sorted(s.session.audit):
        e, kind, n = key
        if kind not in _DECISIONS:
            continue
        rows = s.audit_inputs.get(key)
        if not rows:
            out.append(f"audit row {kind} (attempt {n}) of {e} has no inputs")
            continue
        for inputs in sorted(rows, key=repr):
            got = p.decide_recovery(inputs).decision.value
            if got != kind:
                out.append(f"audit row {kind} (attempt {n}) of {e} recomputes to {got}")
    return out


_MAY_INVOKE: Final = frozenset({p.Stage.LIVE, p.Stage.RETRY, p.Stage.DISPATCHED, p.Stage.WAITING})


def CancelledNeverInvoked(cfg: ModelConfig, s: SystemState) -> list[str]:
    out = []
    for name, c in _present(cfg, s):
        if c.result is None or c.result.kind is not p.ResultKind.CANCELLED:
            continue
        sent = sorted(n for (_, n, _) in s.ghosts.invoked(name))
        if sent:
            out.append(f"{name}: cancelled, yet attempt(s) {sent} were invoked")
        if c.stage in _MAY_INVOKE:
            out.append(f"{name}: cancelled, yet the engine holds it in stage {c.stage.value}")
    return out


INVARIANTS: Final[Mapping[str, Check]] = {
    f.__name__: f
    for f in (
        TypeOK,
        AtMostOnceEffect,
        NoReinvokeAfterKnownOutcome,
        AttemptSentOnce,
        NoBlindReplay,
        ResultFidelity,
        ApprovalGate,
        ApprovalBoundToArgs,
        ApprovalSingleUse,
        RecoveryRequiredHalts,
        HumanSeesKnownOutcome,
        LegacyConservative,
        ExecutionIdStable,
        AuditComplete,
        AuditRecomputable,
        CancelledNeverInvoked,
        RetryGrantHonoured,
    )
}


def _unfinished(cfg: ModelConfig, s: SystemState, halted_counts: bool) -> list[str]:
    """The calls with no result in the conversation (``halted_counts``: a call in
    recovery_required is finished too); calls not emitted yet never are."""
    by_pos = {c.position: c for c in s.session.calls}
    out = []
    for cc in cfg.calls:
        c = by_pos.get(cc.position)
        if c is None:
            out.append(f"{cc.name}: not emitted")
        elif c.result is None and not (halted_counts and s.session.record(
                c.execution_id).status is p.LedgerStatus.RECOVERY_REQUIRED):
            what = "neither answered nor in recovery_required" if halted_counts else (
                "no result in the conversation")
            out.append(f"{cc.name}: {what} ({c.stage.value})")
    return out


def settled(cfg: ModelConfig, s: SystemState) -> list[str]:
    """The state predicate of ``EventuallySettled``: every call has a result
    or is in recovery_required (calls not emitted yet are not settled)."""
    return _unfinished(cfg, s, halted_counts=True)


def answered(cfg: ModelConfig, s: SystemState) -> list[str]:
    """The state predicate of ``EventuallyAnswered``: every call has a result in
    the conversation (a call in recovery_required is settled, not answered)."""
    return _unfinished(cfg, s, halted_counts=False)


PROPERTIES: Final[Mapping[str, Check]] = {
    "EventuallySettled": settled,
    "EventuallyAnswered": answered,
}


def check_all(cfg: ModelConfig, s: SystemState) -> dict[str, list[str]]:
    """Every invariant's violations (only the broken ones appear)."""
    out = {}
    for name, check in INVARIANTS.items():
        problems = check(cfg, s)
        if problems:
            out[name] = problems
    return out
