"""The closed world around the protocol core, for the checkers.

The TLA+ spec describes more than the engine: the provider that emits calls,
the humans, the external system (requests in flight, fences, how often each
effect was really applied) and ghost history (every invocation with its
authorization).  This module composes the pure core of
:mod:`toolledger._core.protocol` with a model of exactly those, so that the Python
reference can be compared with the spec state by state.  It is used by the
conformance checker, the Hypothesis machines, trace validation and the
notebooks; the engine kit uses real adapters instead.

:class:`ModelConfig` is read from a TLC model's ``MC*.tla`` module (its
constants are literals).  :func:`successors` enumerates every enabled action
with every parameter, as TLC's ``Next`` does.  It offers the core every event
the environment can produce (every per-call action on every call from every
stage, every emission of the model, every answer of the external system to
every call of its execution id) and repeats none of the core's guards: what
the core refuses (``ProtocolError``) is not enabled.  So a core that allows a
step the spec does not is an ``extra`` edge for the conformance checker, not
a step nobody tried.  The only conditions checked here are the environment's
own: which requests are in flight, what the connector answers, the crash
bound.  Nothing here performs I/O except :meth:`ModelConfig.from_mc_module`,
which reads one file.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

from .._core import protocol as p
from .memo import active as active_memo
from .tlavalues import FnValue, Value, parse_value

__all__ = [
    "CallConfig",
    "ExternalState",
    "Ghosts",
    "ModelConfig",
    "SystemState",
    "initial_states",
    "successors",
]

SESSION_ID: Final = "s1"


@dataclass(frozen=True, slots=True)
class CallConfig:
    """One call position of a model: the spec's per-call constants."""

    name: str  # the spec's call name, e.g. "c1"
    position: p.CallPosition
    tool_call_id: str
    tool: p.ToolProfile
    arg_choices: tuple[str, ...]

    def digest(self, arg: str) -> str:
        return _digest(self.tool.name, arg)


@functools.lru_cache(maxsize=4096)
def _digest(tool_name: str, arg: str) -> str:
    return p.args_digest(tool_name, {"arg": arg})


@dataclass(frozen=True)
class ModelConfig:
    """The constants of one TLC model of ``DurableToolExecution``."""

    calls: tuple[CallConfig, ...]
    marker: int
    max_crashes: int
    max_attempts: int
    session_id: str = SESSION_ID
    key_by_position: bool = True
    fence_on_reconcile: bool = True
    # False: the model's .cfg writes decision rows without their inputs
    # (RowInputs <- WithoutInputs), so the mapping drops them too
    decision_rows_with_inputs: bool = True
    # bounds of the conversation's rewrites (the spec's MaxRepairs and
    # MaxRenumbers; 0 unless the model overrides them)
    max_repairs: int = 0
    max_renumbers: int = 0
    # the spec's KeysExpire: the key-retention window may pass and the
    # external system may forget keys (RetentionWindowPasses, ExternalExpireKey)
    keys_expire: bool = False
    # the spec's KeyAnswers: the external system may answer a request under a
    # key it knows "in flight", "parameters differ" or with a replayed failure
    key_answers: bool = False
    # derived tables
    by_name: Mapping[str, CallConfig] = field(init=False)
    by_position: Mapping[p.CallPosition, CallConfig] = field(init=False)
    exec_ids: Mapping[str, str] = field(init=False)  # call name -> python id
    spec_exec_ids: Mapping[str, tuple[int, int, str]] = field(init=False)
    arg_of_digest: Mapping[str, str] = field(init=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "by_name", {c.name: c for c in self.calls})
        set_(self, "by_position", {c.position: c for c in self.calls})
        set_(
            self,
            "exec_ids",
            {
                # looked up at call time, so a checker test can swap in a
                # broken derivation for the core and the model alike
                c.name: p.derive_execution_id(self.session_id, *c.position, c.tool_call_id)
                for c in self.calls
            },
        )
        set_(
            self,
            "spec_exec_ids",
            {
                c.name: (*c.position, c.tool_call_id)
                if self.key_by_position
                else (0, 0, c.tool_call_id)
                for c in self.calls
            },
        )
        set_(
            self,
            "arg_of_digest",
            {c.digest(a): a for c in self.calls for a in c.arg_choices},
        )

    def is_legacy(self, c: CallConfig) -> bool:
        return c.position[0] < self.marker

    def dedups(self, execution_id: str) -> bool:
        """The external system deduplicates on this id (an idempotent tool)."""
        return any(
            self.exec_ids[c.name] == execution_id
            and c.tool.policy is p.RecoveryPolicy.IDEMPOTENT
            for c in self.calls
        )

    @classmethod
    def from_mc_module(cls, path: Path) -> ModelConfig:
        """Read the ``MC*`` literal definitions of a TLC model module."""
        text = path.read_text()
        defs: dict[str, Value] = {}
        for m in re.finditer(r"^MC(\w+)\s*==\s*(.+)$", text, re.MULTILINE):
            defs[m.group(1)] = parse_value(m.group(2).strip())
        needed = [
            *("Calls", "Turn", "Slot", "ToolCallId", "Policy", "NeedsApproval"),
            *("ArgChoices", "MarkerTurn", "MaxCrashes", "MaxAttempts"),
            *("KeyByPosition", "FenceOnReconcile"),
        ]
        missing = [n for n in needed if n not in defs]
        if missing:
            raise ValueError(
                f"{path}: no literal definition of {', '.join('MC' + n for n in missing)}; "
                "a conformance model must define every constant as a literal"
            )

        def fn(name: str) -> FnValue:
            v = defs[name]
            if not isinstance(v, FnValue):
                raise ValueError(f"{path}: MC{name} must be a record/function literal")
            return v

        calls = []
        for name in sorted(str(c) for c in defs["Calls"]):  # type: ignore[union-attr]
            turn, slot = fn("Turn")[name], fn("Slot")[name]
            assert isinstance(turn, int) and isinstance(slot, int)
            choices = fn("ArgChoices")[name]
            assert isinstance(choices, frozenset)
            policy = p.RecoveryPolicy(str(fn("Policy")[name]))
            calls.append(
                CallConfig(
                    name=name,
                    position=(turn, slot),
                    tool_call_id=str(fn("ToolCallId")[name]),
                    tool=p.ToolProfile(
                        f"{policy.value}_tool_{name}",
                        policy,
                        bool(fn("NeedsApproval")[name]),
                    ),
                    arg_choices=tuple(sorted(str(a) for a in choices)),
                )
            )
        def num(name: str) -> int:
            v = defs[name]
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"{path}: MC{name} must be an integer literal")
            return v

        return cls(
            calls=tuple(calls),
            marker=num("MarkerTurn"),
            max_crashes=num("MaxCrashes"),
            max_attempts=num("MaxAttempts"),
            key_by_position=bool(defs["KeyByPosition"]),
            fence_on_reconcile=bool(defs["FenceOnReconcile"]),
            decision_rows_with_inputs=bool(defs.get("DecisionRowsWithInputs", True)),
            max_repairs=num("MaxRepairs") if "MaxRepairs" in defs else 0,
            max_renumbers=num("MaxRenumbers") if "MaxRenumbers" in defs else 0,
            keys_expire=bool(defs.get("KeysExpire", False)),
            key_answers=bool(defs.get("KeyAnswers", False)),
        )


# --------------------------------------------------------------------------
# The external system and the ghosts
# --------------------------------------------------------------------------

Invocation = tuple[str, int, p.Authorization]
"""(execution id, attempt, authorization) of one adapter invocation."""


@dataclass(frozen=True)
class ExternalState:
    """What the external system holds: requests in flight, fences, effects."""

    inflight: Mapping[str, frozenset[int]] = field(default_factory=dict)
    fenced: Mapping[str, int] = field(default_factory=dict)
    applied: Mapping[str, int] = field(default_factory=dict)
    # executions whose idempotency key the system forgot (ExternalExpireKey)
    key_forgotten: frozenset[str] = frozenset()

    def requests(self, execution_id: str) -> frozenset[int]:
        return self.inflight.get(execution_id, frozenset())

    def fence(self, execution_id: str) -> int:
        return self.fenced.get(execution_id, 0)

    def count(self, execution_id: str) -> int:
        return self.applied.get(execution_id, 0)

    def remembers(self, cfg: ModelConfig, execution_id: str) -> bool:
        """The spec's KeyRemembered: a request with this key is deduplicated."""
        return (
            cfg.dedups(execution_id)
            and self.count(execution_id) >= 1
            and execution_id not in self.key_forgotten
        )


# A decision taken on a call: (kind, attempt, inputs its row must carry).
Decided = tuple[str, int, p.RecoveryInputs | None]


@dataclass(frozen=True)
class Ghosts:
    """History the invariants need and no implementation keeps.

    ``sent``, ``known_outcome``, ``sent_after_outcome`` and ``decided`` are
    keyed by the CALL (its spec name), the real-world identity, not by the
    design's execution id: they are the spec's ghosts of the same names.
    """

    invocations: Mapping[str, frozenset[Invocation]] = field(default_factory=dict)
    # (call name, argument digest) a human approved: what the inbox showed
    human_approved: frozenset[tuple[str, str]] = frozenset()
    human_retries: Mapping[str, int] = field(default_factory=dict)
    crashes: int = 0
    # (call, attempt) -> requests sent for that attempt (AttemptSentOnce)
    sent: Mapping[tuple[str, int], int] = field(default_factory=dict)
    # calls whose succeeded/failed outcome was ever durable, and the requests
    # of each sent after that (NoReinvokeAfterKnownOutcome)
    known_outcome: frozenset[str] = frozenset()
    sent_after_outcome: Mapping[str, int] = field(default_factory=dict)
    # call -> (kind, attempt, inputs) of every decision taken on it, with the
    # inputs its row must carry (a recovery decision's; None for the others):
    # AuditComplete
    decided: Mapping[str, frozenset[Decided]] = field(default_factory=dict)
    # call -> how many times the call's OWN request was applied (a request
    # deduplicated on another call's key is not the call's effect)
    effects: Mapping[str, int] = field(default_factory=dict)
    # (execution id, attempt) of an applied answer the engine discarded while
    # the record was still at that attempt with no outcome (the spec's
    # droppedAnswers; HumanSeesKnownOutcome): only a core with the old
    # discard rule ever adds one
    dropped_answers: frozenset[tuple[str, int]] = frozenset()

    def invoked(self, call: str) -> frozenset[Invocation]:
        return self.invocations.get(call, frozenset())

    def sent_count(self, call: str, attempt: int) -> int:
        return self.sent.get((call, attempt), 0)

    def decisions(self, call: str) -> frozenset[Decided]:
        return self.decided.get(call, frozenset())


@dataclass(frozen=True)
class SystemState:
    session: p.SessionState
    external: ExternalState
    ghosts: Ghosts
    # The inputs column of the recovery-decision audit rows, as the stores
    # write it (the core keeps only the audit keys): the inputs of EVERY
    # decision written under the key, one row each (a decision taken again
    # for the same attempt appends its own row: AuditRecomputable,
    # AuditComplete).
    audit_inputs: Mapping[p.AuditKey, frozenset[p.RecoveryInputs]] = field(default_factory=dict)
    # What the conversation's rewrites change outside the core (the spec's
    # turnOf, renumbers, repairs): how far each call's turn moved, and how
    # many rewrites happened.  The core never reads them: it keeps the id it
    # derived at ProviderEmitCall.
    turn_shift: Mapping[str, int] = field(default_factory=dict)
    renumbers: int = 0
    repairs: int = 0
    # Calls whose execution id the ledger store keeps (the spec's storedId):
    # every call ever persisted.  The core's CallState carries the id while
    # the conversation holds the call; after a ConversationRepair the ledger
    # store still has it (records, approvals and audit rows are keyed by it).
    stored: frozenset[str] = frozenset()


def _upd(m: Mapping[str, object], k: str, v: object) -> dict[str, object]:
    d = dict(m)
    d[k] = v
    return d


# --------------------------------------------------------------------------
# Init and Next
# --------------------------------------------------------------------------


def initial_states(cfg: ModelConfig) -> list[SystemState]:
    """The spec's ``Init``: legacy calls durable, approved, maybe applied."""
    session = p.new_session(cfg.session_id, marker=cfg.marker, max_attempts=cfg.max_attempts)
    calls = []
    approvals: dict[str, p.ApprovalState] = {}
    digests: dict[str, str] = {}
    for c in cfg.calls:
        if cfg.is_legacy(c):
            eid = cfg.exec_ids[c.name]
            calls.append(
                p.CallState(
                    c.position,
                    c.tool_call_id,
                    c.tool,
                    eid,
                    c.digest(c.arg_choices[0]),
                    p.MessageState.DURABLE,
                    None,
                    p.Stage.RESUME,
                )
            )
            if c.tool.requires_approval:
                approvals[eid] = p.ApprovalState.APPROVED
                digests[eid] = c.digest(c.arg_choices[0])
    session = replace(
        session, calls=tuple(calls), approvals=approvals, approval_digests=digests
    )
    ghosts = Ghosts(
        human_approved=frozenset(
            (c.name, c.digest(c.arg_choices[0]))
            for c in cfg.calls
            if cfg.is_legacy(c) and c.tool.requires_approval
        )
    )
    maybe_applied = sorted(
        {cfg.exec_ids[c.name] for c in cfg.calls if cfg.is_legacy(c) and c.tool.protected}
    )
    stored = frozenset(c.name for c in cfg.calls if cfg.is_legacy(c))
    out = []
    for mask in range(2 ** len(maybe_applied)):
        applied = {e: 1 for i, e in enumerate(maybe_applied) if mask >> i & 1}
        # the old engine applied the legacy call's OWN request
        effects = {
            c.name: 1
            for c in cfg.calls
            if cfg.is_legacy(c) and applied.get(cfg.exec_ids[c.name], 0)
        }
        out.append(
            SystemState(session, ExternalState(applied=applied), replace(ghosts, effects=effects),
                        stored=stored)
        )
    return out


Successor = tuple[p.Action, SystemState]


@functools.lru_cache(maxsize=4096)
def _event(action: p.Action, position: p.CallPosition, attempt: int | None = None) -> p.Event:
    # Events are immutable: built (and validated) once, then offered from
    # every state; successors offers each of them many times per state.
    return p.Event(action, position, attempt=attempt)


def _try(state: p.SessionState, ev: p.Event) -> p.SessionState | None:
    memo = active_memo()
    if memo is not None:  # a checker's run: the core's answer, computed once
        got = memo.answer(state, ev)
        return None if isinstance(got, p.ProtocolError) else got
    try:
        return p.apply(state, ev)
    except p.ProtocolError:
        return None


_CRASH: Final = p.Event(p.Action.Crash)

_PER_CALL: Final = (
    p.Action.EnginePersistCall,
    p.Action.EngineParkApproval,
    p.Action.HumanApprove,
    p.Action.HumanReject,
    p.Action.EngineRecordDenied,
    p.Action.EnginePersistDispatched,
    p.Action.EngineInvokeAdapter,
    p.Action.EngineInvokeReadonly,
    p.Action.EngineRecordSucceeded,
    p.Action.EngineRecordFailed,
    p.Action.EngineAppendResult,
    p.Action.EngineTimeout,
    p.Action.Recover,
    p.Action.EngineReconcileApplied,
    p.Action.EngineReconcileNotApplied,
    p.Action.EngineReconcileUnknown,
    p.Action.HumanResolveApplied,
    p.Action.HumanResolveRetry,
    p.Action.HumanResolveAbandon,
    p.Action.HumanCancel,
)


def _emissions(cfg: ModelConfig, s: SystemState) -> Iterator[Successor]:
    # Every call of the model with every argument, whether or not its
    # position is taken, legacy, or after a turn still unanswered: the core
    # refuses what the spec's guards (a free position, after the marker, an
    # earlier turn's call without a result) refuse.  The one condition kept
    # here is the provider's, which the core cannot know: a model's call of a
    # later turn comes only after every call of the earlier turns was emitted
    # (the spec's PriorTurnsAnswered ranges over calls not yet emitted too).
    present = {c.position for c in s.session.calls}
    for c in cfg.calls:
        if any(d.position[0] < c.position[0] and d.position not in present
               for d in cfg.calls):
            continue
        for a in c.arg_choices:
            ev = p.Event(
                p.Action.ProviderEmitCall, c.position, c.tool_call_id, c.tool, c.digest(a)
            )
            nxt = _try(s.session, ev)
            if nxt is not None:
                yield p.Action.ProviderEmitCall, replace(s, session=nxt)


def _call_step(cfg: ModelConfig, s: SystemState, call: p.CallState, action: p.Action
               ) -> SystemState | None:
    """One per-call action: the core's transition plus its external/ghost part."""
    ext, gh = s.external, s.ghosts
    eid = call.execution_id
    name = cfg.by_position[call.position].name
    # The connector's answer is the environment's, not a guard of the core:
    # it says "applied" only if the effect was applied, "not applied" only if
    # it was not (and fences); the core decides whether it asks at all.
    if action is p.Action.EngineReconcileApplied and ext.count(eid) < 1:
        return None
    if action is p.Action.EngineReconcileNotApplied and ext.count(eid) != 0:
        return None
    nxt = _try(s.session, _event(action, call.position))
    if nxt is None:
        return None
    inputs = s.audit_inputs
    if action in _DECISION_KIND or action is p.Action.Recover:
        kind = _DECISION_KIND.get(action)
        taken: p.RecoveryInputs | None = None
        if action is p.Action.Recover:
            # the decision taken (audited or not: AuditComplete compares the two)
            taken = p.recovery_inputs(s.session, call)
            d = p.decide_recovery(taken).decision
            if call.tool.protected and d is not p.Decision.SKIP:
                kind = d.value
            # the store appends the decision's row with the inputs it was computed
            # from (the facade writes one per decision: Ledger._rows)
            inputs = append_decision_row(inputs, p.decision_audit_key(s.session, call), taken)
        if kind is not None:
            # a human's retry grants the attempt after the record's
            n = s.session.record(eid).attempt + (action is p.Action.HumanResolveRetry)
            got = gh.decisions(name) | {(kind, n, taken if kind in _RECOVERY_DECISIONS else None)}
            gh = replace(gh, decided=_upd(gh.decided, name, got))  # type: ignore[arg-type]
    if action in _OUTCOME_KNOWN:
        gh = replace(gh, known_outcome=gh.known_outcome | {name})
    if action is p.Action.EngineInvokeAdapter:
        rec = nxt.record(eid)
        ext = replace(ext, inflight=_upd(ext.inflight, eid, ext.requests(eid) | {rec.attempt}))  # type: ignore[arg-type]
        inv = (eid, rec.attempt, rec.authorization)
        gh = replace(
            gh,
            invocations=_upd(gh.invocations, name, gh.invoked(name) | {inv}),  # type: ignore[arg-type]
            sent=_upd(gh.sent, (name, rec.attempt), gh.sent_count(name, rec.attempt) + 1),  # type: ignore[arg-type]
        )
        if name in gh.known_outcome:
            after = _upd(gh.sent_after_outcome, name, gh.sent_after_outcome.get(name, 0) + 1)
            gh = replace(gh, sent_after_outcome=after)  # type: ignore[arg-type]
    elif action is p.Action.HumanApprove:
        # the human approves what the inbox shows: the parked digest
        shown = s.session.approval_digest(eid)
        assert shown is not None, "a pending approval carries its digest"
        gh = replace(gh, human_approved=gh.human_approved | {(name, shown)})
    elif action is p.Action.HumanResolveRetry:
        retries = _upd(gh.human_retries, eid, gh.human_retries.get(eid, 0) + 1)
        gh = replace(gh, human_retries=retries)  # type: ignore[arg-type]
    elif action is p.Action.EngineReconcileNotApplied and cfg.fence_on_reconcile:
        ext = replace(ext, fenced=_upd(ext.fenced, eid, s.session.record(eid).attempt))  # type: ignore[arg-type]
    stored = s.stored | {name} if action is p.Action.EnginePersistCall else s.stored
    return replace(s, session=nxt, external=ext, ghosts=gh, audit_inputs=inputs, stored=stored)


def append_decision_row(
    rows: Mapping[p.AuditKey, frozenset[p.RecoveryInputs]],
    key: p.AuditKey | None,
    inputs: p.RecoveryInputs,
) -> Mapping[p.AuditKey, frozenset[p.RecoveryInputs]]:
    """The stores' decision rows after ``Recover`` appended the row of ``key``.

    Every decision keeps its row (the stores append, never replace): a
    decision taken again for an attempt a row of that kind covers adds its
    own inputs beside the earlier ones.  Module-level so that a checker test
    can swap in a broken store (one that drops or overwrites the repeated
    row) and see ``AuditComplete`` and ``AuditRecomputable`` catch it.
    """
    if key is None:
        return rows
    out = dict(rows)
    out[key] = rows.get(key, frozenset()) | {inputs}
    return out


# Per-call actions that take a decision, with the decision's audit kind
# (Recover's kind is the decision it computes).
_DECISION_KIND: Final[Mapping[p.Action, str]] = {
    p.Action.EngineReconcileApplied: "reconcile_applied",
    p.Action.EngineReconcileNotApplied: "reconcile_not_applied",
    p.Action.EngineReconcileUnknown: "reconcile_unknown",
    p.Action.HumanResolveApplied: "human_applied",
    p.Action.HumanResolveRetry: "human_retry",
    p.Action.HumanResolveAbandon: "human_abandon",
    p.Action.HumanCancel: "human_cancel",
}
_RECOVERY_DECISIONS: Final = frozenset(d.value for d in p.Decision)
# Per-call actions that make a succeeded, failed or abandoned outcome of the
# call durable (a human's abandon is as final as an answer).
_OUTCOME_KNOWN: Final = frozenset({
    p.Action.EngineRecordSucceeded,
    p.Action.EngineRecordFailed,
    p.Action.EngineReconcileApplied,
    p.Action.HumanResolveApplied,
    p.Action.HumanResolveAbandon,
})


def _deliver(session: p.SessionState, eid: str, n: int,
             action: p.Action) -> p.SessionState | None:
    """Offer the answer for attempt n of eid to every call of that execution id.

    Whatever the call's stage and attempt: the core takes the answer only if
    the call waits for exactly that attempt, and refuses (``ProtocolError``)
    a late answer of an older attempt, one after a time-out or a crash, or one
    for a call that never sent it.  Routing by the execution id is the
    adapter's (an answer comes back on the invocation that sent it); nothing
    else of the core's guard is repeated here.  None: no call took it, the
    return is late (the spec's ``~Delivered``), and the engine must discard
    it (``EngineDiscardLateReturn``).
    """
    taken = False
    for c in session.calls:
        if c.execution_id != eid:
            continue
        nxt = _try(session, _event(action, c.position, n))
        if nxt is not None:
            session, taken = nxt, True
    return session if taken else None


_LATE: Final = frozenset({p.Stage.RESUME, p.Stage.NONE, p.Stage.RECONCILING, p.Stage.RETRY})


def holds_unanswered(session: p.SessionState, eid: str, n: int) -> bool:
    """The spec's ``\\E c : HoldsUnanswered(c, e, n)``, written here apart
    from the core's own guard (a core that drops such an answer must not also
    decide what the ghost sees): a durable call of ``eid`` without a result,
    not waiting, whose record is at attempt ``n`` with no outcome."""
    rec = session.record(eid)
    return (
        rec.attempt == n
        and rec.status in (p.LedgerStatus.DISPATCHED, p.LedgerStatus.RECOVERY_REQUIRED)
        and any(
            c.execution_id == eid and c.message is p.MessageState.DURABLE
            and c.result is None and c.stage in _LATE and c.args_digest == rec.args_digest
            for c in session.calls
        )
    )


def _discard(cfg: ModelConfig, s: SystemState, sender: CallConfig, n: int,
             after: SystemState, applied: bool) -> Iterator[Successor]:
    """The engine discards a late return: the core must agree it is late.  An
    applied answer discarded while the engine held its attempt unanswered is
    the ghost droppedAnswers."""
    eid = cfg.exec_ids[sender.name]
    nxt = _try(s.session, _event(p.Action.EngineDiscardLateReturn, sender.position, n))
    if nxt is not None:
        if applied and holds_unanswered(s.session, eid, n):
            gh = after.ghosts
            after = replace(after, ghosts=replace(
                gh, dropped_answers=gh.dropped_answers | {(eid, n)}))
        yield p.Action.EngineDiscardLateReturn, replace(after, session=nxt)


def _external(cfg: ModelConfig, s: SystemState) -> Iterator[Successor]:
    ext, gh = s.external, s.ghosts
    for eid in sorted(set(cfg.exec_ids.values())):
        for n in sorted(ext.requests(eid)):
            rest = _upd(ext.inflight, eid, ext.requests(eid) - {n})
            fenced = n <= ext.fence(eid)
            if fenced:
                yield p.Action.ExternalDropFenced, replace(
                    s, external=replace(ext, inflight=rest)  # type: ignore[arg-type]
                )
                continue
            remembered = ext.remembers(cfg, eid)
            # which call sent this attempt (a ghost: the request carries only
            # the execution id and the attempt)
            senders = [
                c for c in cfg.calls
                if cfg.exec_ids[c.name] == eid and gh.sent_count(c.name, n) >= 1
            ]
            for sender in senders:
                if remembered:  # deduplicated: no effect, none of the sender's own
                    after_ext = replace(ext, inflight=rest)  # type: ignore[arg-type]
                    after_gh = gh
                else:
                    applied = _upd(ext.applied, eid, ext.count(eid) + 1)
                    after_ext = replace(
                        ext, inflight=rest, applied=applied,  # type: ignore[arg-type]
                        key_forgotten=ext.key_forgotten - {eid},
                    )
                    effects = _upd(gh.effects, sender.name, gh.effects.get(sender.name, 0) + 1)
                    after_gh = replace(gh, effects=effects)  # type: ignore[arg-type]
                after = replace(s, external=after_ext, ghosts=after_gh)
                delivered = _deliver(s.session, eid, n, p.Action.ExternalApply)
                if delivered is not None:
                    yield p.Action.ExternalApply, replace(after, session=delivered)
                else:
                    yield from _discard(cfg, s, sender, n, after, applied=True)
                yield p.Action.ExternalApplyLoseAnswer, after
                if not remembered:
                    rejected = replace(
                        s, external=replace(ext, inflight=rest)  # type: ignore[arg-type]
                    )
                    delivered = _deliver(s.session, eid, n, p.Action.ExternalRejectDefinite)
                    if delivered is not None:
                        yield p.Action.ExternalRejectDefinite, replace(rejected, session=delivered)
                    else:
                        yield from _discard(cfg, s, sender, n, rejected, applied=False)
    if cfg.key_answers:
        yield from _key_answers(cfg, s)
    if cfg.keys_expire:
        yield from _key_retention(cfg, s)


def _key_answers(cfg: ModelConfig, s: SystemState) -> Iterator[Successor]:
    """The key answers of a real API (docs/protocol.md#real-apis-answers), each
    to the call that sent attempt n and waits for it (the core refuses any
    other): "in flight" while another request under a key not yet stored is
    in flight, "parameters differ" and a replayed failure under a key the
    system remembers.  None applies the request."""
    ext, gh = s.external, s.ghosts
    for eid in sorted(set(cfg.exec_ids.values())):
        if not cfg.dedups(eid):
            continue
        remembered = ext.remembers(cfg, eid)
        for n in sorted(ext.requests(eid)):
            if n <= ext.fence(eid):
                continue
            after = replace(s, external=replace(
                ext, inflight=_upd(ext.inflight, eid, ext.requests(eid) - {n})))  # type: ignore[arg-type]
            answers: tuple[p.Action, ...]
            if remembered:
                answers = (p.Action.ExternalAnswerParamsDiffer, p.Action.ExternalReplayFailure)
            elif ext.requests(eid) - {n}:
                answers = (p.Action.ExternalAnswerInFlight,)
            else:
                continue
            for c in s.session.calls:
                name = cfg.by_position[c.position].name
                if c.execution_id != eid or gh.sent_count(name, n) < 1:
                    continue
                for action in answers:
                    nxt = _try(s.session, _event(action, c.position, n))
                    if nxt is not None:
                        yield action, replace(after, session=nxt)


def _key_retention(cfg: ModelConfig, s: SystemState) -> Iterator[Successor]:
    """The clock passes a key's retention window (the core records it, and
    refuses it for a call that has no key), and the external system forgets
    a key whose window passed, if nothing under it is in flight or held for
    a retry (the margin the declared window leaves: docs/protocol.md)."""
    for c in s.session.calls:
        nxt = _try(s.session, _event(p.Action.RetentionWindowPasses, c.position))
        if nxt is not None:
            yield p.Action.RetentionWindowPasses, replace(s, session=nxt)
    ext = s.external
    busy = (p.Stage.RETRY, p.Stage.DISPATCHED, p.Stage.WAITING)
    for eid in sorted(s.session.retention_passed):
        if (
            ext.remembers(cfg, eid)
            and not ext.requests(eid)
            and not any(c.execution_id == eid and c.stage in busy for c in s.session.calls)
        ):
            nxt = p.apply(s.session, p.Event(p.Action.ExternalExpireKey))
            yield p.Action.ExternalExpireKey, replace(
                s, session=nxt, external=replace(ext, key_forgotten=ext.key_forgotten | {eid})
            )


def successors(cfg: ModelConfig, s: SystemState) -> list[Successor]:
    """Every (action, next state) the spec's ``Next`` allows from ``s``."""
    out: list[Successor] = list(_emissions(cfg, s))
    # Every per-call action on every call, from every stage: the core's guards
    # (ProtocolError) alone decide what is enabled.  Trying only the stages
    # the transition table lists would hide a core that also allows an action
    # elsewhere (a human resolving a call before Recover re-decided it).
    for call in s.session.calls:
        for action in _PER_CALL:
            nxt = _call_step(cfg, s, call, action)
            if nxt is not None:
                out.append((action, nxt))
    out.extend(_external(cfg, s))
    if s.ghosts.crashes < cfg.max_crashes:
        crashed = _try(s.session, _CRASH)
        if crashed is None:  # a crash is always possible: a core refusing it is broken
            raise RuntimeError("the core refused a Crash")
        out.append(
            (p.Action.Crash, replace(s, session=crashed,
                                     ghosts=replace(s.ghosts, crashes=s.ghosts.crashes + 1)))
        )
    out.extend(_rewrites(cfg, s))
    return out


def _rewrites(cfg: ModelConfig, s: SystemState) -> Iterator[Successor]:
    """The conversation's own rewrites, offered for every call and refused by
    the core where they do not apply (ConversationRepair,
    ConversationRenumber)."""
    for call in s.session.calls:
        name = cfg.by_position[call.position].name
        if s.repairs < cfg.max_repairs:
            nxt = _try(s.session, p.Event(p.Action.ConversationRepair, call.position))
            if nxt is not None:
                yield p.Action.ConversationRepair, replace(s, session=nxt, repairs=s.repairs + 1)
        if s.renumbers < cfg.max_renumbers:
            nxt = _try(s.session, p.Event(p.Action.ConversationRenumber, call.position))
            if nxt is not None:
                shift = _upd(s.turn_shift, name, s.turn_shift.get(name, 0) + 1)
                yield p.Action.ConversationRenumber, replace(
                    s, session=nxt, renumbers=s.renumbers + 1, turn_shift=shift  # type: ignore[arg-type]
                )
