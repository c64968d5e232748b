"""The one mapping between reference states and spec states, both ways.

:func:`to_spec` turns a :class:`~toolledger.check.system.SystemState` into the
values of the spec's variables, exactly as TLC prints and
:mod:`toolledger.check.tlavalues` parses them; :func:`from_spec` builds the
reference state that corresponds to a spec state.  Every checker (the
exhaustive conformance check, the Hypothesis machines, trace validation, the
notebooks) goes through these two functions and no other translation, so a
disagreement between spec and code cannot hide in a second copy.

The mapping is total on the states the protocol can reach; what the spec does
not have (result contents, audit-row details) is dropped on the way to the
spec and filled with neutral values on the way back.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Final

from .._core import protocol as p
from .._core.ledger import APPROVAL_KINDS
from .system import Decided, ExternalState, Ghosts, ModelConfig, SystemState
from .tlavalues import FnValue, Value

__all__ = ["NO_INPUTS", "SPEC_VARIABLES", "from_spec", "spec_key", "to_spec"]

SPEC_VARIABLES: Final = (
    "msg", "args", "result", "approval", "approvalArgs", "ledger", "audit", "marker", "stage",
    "inflight", "fenced", "applied", "invocations", "humanApproved",
    "humanRetries", "crashes", "sent", "knownOutcome", "sentAfterOutcome",
    "decided", "turnOf", "storedId", "renumbers", "repairs",
    "effects", "windowPassed", "keyForgotten", "droppedAnswers",
)  # fmt: skip

NONE: Final = "none"
_NO_RESULT: Final = FnValue({"kind": NONE, "exec": (), "args": NONE})
# The spec's NoInputs: the inputs column of an audit row that records no
# recovery decision (a placeholder: counterexamples do not print it).
NO_INPUTS: Final = FnValue(
    {
        "status": NONE, "attempt": 0, "digestMatches": True, "approval": NONE,
        "hasResult": False, "policy": NONE, "legacy": False, "requiresApproval": False,
        "keyRetained": True,
    }
)  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _inputs(i: p.RecoveryInputs | None) -> FnValue:
    """The spec's ``DecisionInputs`` record of a decision's inputs."""
    if i is None:
        return NO_INPUTS
    return FnValue(
        {
            "status": i.status.value, "attempt": i.attempt, "digestMatches": i.digest_matches,
            "approval": i.approval.value, "hasResult": i.has_result, "policy": i.policy.value,
            "legacy": i.legacy, "requiresApproval": i.requires_approval,
            "keyRetained": i.key_retained,
        }
    )  # fmt: skip


def _inputs_back(v: Value, max_attempts: int) -> p.RecoveryInputs | None:
    if not isinstance(v, FnValue):
        raise ValueError(f"expected an inputs record, got {v!r}")
    if v == NO_INPUTS:
        return None
    return p.RecoveryInputs(
        status=p.LedgerStatus(str(v["status"])),
        attempt=_int(v["attempt"]),
        digest_matches=bool(v["digestMatches"]),
        approval=p.ApprovalState(str(v["approval"])),
        has_result=bool(v["hasResult"]),
        policy=p.RecoveryPolicy(str(v["policy"])),
        legacy=bool(v["legacy"]),
        requires_approval=bool(v["requiresApproval"]),
        max_attempts=max_attempts,
        key_retained=bool(v["keyRetained"]),
    )


def spec_key(state: Mapping[str, Value]) -> tuple[Value, ...]:
    """A hashable key of a spec state, in :data:`SPEC_VARIABLES` order."""
    return tuple(state[v] for v in SPEC_VARIABLES)


class _Tables:
    """Id and argument translations of one model, computed once."""

    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg
        self.spec_eid: dict[str, tuple[int, int, str]] = {}
        self.py_eid: dict[tuple[int, int, str], str] = {}
        for c in cfg.calls:
            py, spec = cfg.exec_ids[c.name], cfg.spec_exec_ids[c.name]
            # with a broken id derivation two positions may share a python id;
            # the first wins, and the states then differ visibly
            self.spec_eid.setdefault(py, spec)
            self.py_eid.setdefault(spec, py)
        # The spec's ExecIds: every id a call can derive, at its turn and at
        # each turn a renumbering may move it to (IdAt(c, t), t in
        # Renumberings(c)); the core uses only the first, the others map to
        # the ids the same derivation gives there.
        for c in cfg.calls:
            turn, slot = c.position
            for t in range(turn + 1, turn + cfg.max_renumbers + 1):
                spec = (t, slot, c.tool_call_id) if cfg.key_by_position else (0, 0, c.tool_call_id)
                py = p.derive_execution_id(cfg.session_id, t, slot, c.tool_call_id)
                self.spec_eid.setdefault(py, spec)
                self.py_eid.setdefault(spec, py)
        self.spec_eids = sorted(set(self.py_eid))
        # Equal reference values map to one shared (hash-cached) spec value.
        self.results: dict[p.ToolResult | None, FnValue] = {None: _NO_RESULT}
        self.records: dict[p.ExecutionRecord, FnValue] = {}

    def arg(self, digest: str | None) -> str:
        if digest is None:
            return NONE
        return self.cfg.arg_of_digest.get(digest, f"<unknown digest {digest[:15]}>")

    def result(self, r: p.ToolResult | None) -> FnValue:
        v = self.results.get(r)
        if v is None:
            assert r is not None
            exec_id: Value = self.spec_eid.get(r.execution_id, ("<unknown id>",))
            v = FnValue({"kind": r.kind.value, "exec": exec_id, "args": self.arg(r.args_digest)})
            self.results[r] = v
        return v

    def record(self, rec: p.ExecutionRecord) -> FnValue:
        v = self.records.get(rec)
        if v is None:
            call_name: str = NONE
            if rec.position is not None:
                owner = self.cfg.by_position.get(rec.position)
                call_name = owner.name if owner is not None else f"<position {rec.position}>"
            v = FnValue(
                {
                    "status": rec.status.value,
                    "attempt": rec.attempt,
                    "args": self.arg(rec.args_digest),
                    "auth": rec.authorization.value,
                    "result": self.result(rec.result),
                    "call": call_name,
                }
            )
            self.records[rec] = v
        return v


_TABLES: dict[int, _Tables] = {}


def _tables(cfg: ModelConfig) -> _Tables:
    t = _TABLES.get(id(cfg))
    if t is None or t.cfg is not cfg:
        if len(_TABLES) > 64:  # many short-lived configs (Hypothesis): stay bounded
            _TABLES.clear()
        t = _Tables(cfg)
        _TABLES[id(cfg)] = t
    return t


def to_spec(cfg: ModelConfig, s: SystemState) -> dict[str, Value]:
    """The spec variables' values for reference state ``s``."""
    t = _tables(cfg)
    session, ext, gh = s.session, s.external, s.ghosts
    by_pos = {c.position: c for c in session.calls}
    msg: dict[Value, Value] = {}
    args: dict[Value, Value] = {}
    result: dict[Value, Value] = {}
    stage: dict[Value, Value] = {}
    invocations: dict[Value, Value] = {}
    sent: dict[Value, Value] = {}
    after_outcome: dict[Value, Value] = {}
    decided: dict[Value, Value] = {}
    turn_of: dict[Value, Value] = {}
    stored_id: dict[Value, Value] = {}
    for cc in cfg.calls:
        call = by_pos.get(cc.position)
        if call is None:
            msg[cc.name], args[cc.name], result[cc.name] = "absent", NONE, _NO_RESULT
            stage[cc.name] = NONE
        else:
            msg[cc.name] = call.message.value
            args[cc.name] = t.arg(call.args_digest)
            result[cc.name] = t.result(call.result)
            stage[cc.name] = call.stage.value
        invocations[cc.name] = frozenset(
            (t.spec_eid.get(e, ("<unknown id>",)), n, a.value) for e, n, a in gh.invoked(cc.name)
        )
        sent[cc.name] = tuple(
            gh.sent_count(cc.name, n) for n in range(1, cfg.max_attempts + 1)
        )
        after_outcome[cc.name] = gh.sent_after_outcome.get(cc.name, 0)
        decided[cc.name] = frozenset(
            (kind, n, _inputs(i if cfg.decision_rows_with_inputs else None))
            for kind, n, i in gh.decisions(cc.name)
        )
        turn_of[cc.name] = cc.position[0] + s.turn_shift.get(cc.name, 0)
        # the core keeps the id it derived at emit; the ledger store keeps it
        # for every call ever persisted (the spec's NoId is the empty tuple)
        stored_id[cc.name] = cfg.spec_exec_ids[cc.name] if cc.name in s.stored else ()
    approval: dict[Value, Value] = {}
    approval_args: dict[Value, Value] = {}
    ledger: dict[Value, Value] = {}
    audit: dict[Value, Value] = {}
    inflight: dict[Value, Value] = {}
    fenced: dict[Value, Value] = {}
    applied: dict[Value, Value] = {}
    retries: dict[Value, Value] = {}
    with_inputs = cfg.decision_rows_with_inputs
    for se in t.spec_eids:
        e = t.py_eid[se]
        approval[se] = session.approval(e).value
        approval_args[se] = t.arg(session.approval_digest(e))
        ledger[se] = t.record(session.record(e))
        # one row per decision written under a key (the inputs of each), one
        # NoInputs row for a key with none (every other row, or no inputs kept)
        audit[se] = frozenset(
            (k, n, _inputs(i))
            for (ae, k, n) in session.audit
            if ae == e and k not in APPROVAL_KINDS  # the facade's rows: no spec action
            for i in (sorted(s.audit_inputs.get((ae, k, n), ()), key=repr) if with_inputs
                      else ()) or (None,)
        )
        inflight[se] = ext.requests(e)
        fenced[se] = ext.fence(e)
        applied[se] = ext.count(e)
        retries[se] = gh.human_retries.get(e, 0)
    return {
        "msg": FnValue(msg),
        "args": FnValue(args),
        "result": FnValue(result),
        "approval": FnValue(approval),
        "approvalArgs": FnValue(approval_args),
        "ledger": FnValue(ledger),
        "audit": FnValue(audit),
        "marker": session.marker,
        "stage": FnValue(stage),
        "inflight": FnValue(inflight),
        "fenced": FnValue(fenced),
        "applied": FnValue(applied),
        "invocations": FnValue(invocations),
        "humanApproved": frozenset((name, t.arg(d)) for name, d in gh.human_approved),
        "humanRetries": FnValue(retries),
        "crashes": s.ghosts.crashes,
        "sent": FnValue(sent),
        "knownOutcome": gh.known_outcome,
        "sentAfterOutcome": FnValue(after_outcome),
        "decided": FnValue(decided),
        "turnOf": FnValue(turn_of),
        "storedId": FnValue(stored_id),
        "renumbers": s.renumbers,
        "repairs": s.repairs,
        "effects": FnValue({cc.name: gh.effects.get(cc.name, 0) for cc in cfg.calls}),
        "windowPassed": frozenset(t.spec_eid[e] for e in session.retention_passed),
        "keyForgotten": frozenset(t.spec_eid[e] for e in ext.key_forgotten),
        "droppedAnswers": frozenset((t.spec_eid[e], n) for e, n in gh.dropped_answers),
    }


def _fn(state: Mapping[str, Value], var: str) -> FnValue:
    v = state[var]
    if not isinstance(v, FnValue):
        raise ValueError(f"spec variable {var} is not a function: {v!r}")
    return v


def _int(v: Value) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"expected an integer, got {v!r}")
    return v


def _tuple(v: Value) -> tuple[Value, ...]:
    if not isinstance(v, tuple):
        raise ValueError(f"expected a tuple, got {v!r}")
    return v


def _set(v: Value) -> frozenset[Value]:
    if not isinstance(v, frozenset):
        raise ValueError(f"expected a set, got {v!r}")
    return v


def _eid(t: _Tables, v: Value) -> str:
    return t.py_eid[_tuple(v)]  # type: ignore[index]


def _result(t: _Tables, v: Value) -> p.ToolResult | None:
    assert isinstance(v, FnValue)
    if v["kind"] == NONE:
        return None
    exec_id = _tuple(v["exec"])
    cc = next(c for c in t.cfg.calls if t.cfg.spec_exec_ids[c.name] == exec_id)
    return p.ToolResult(p.ResultKind(str(v["kind"])), _eid(t, exec_id), cc.digest(str(v["args"])))


def _digest_of(t: _Tables, e: str, arg: str) -> str:
    """The digest of argument ``arg`` for the call whose execution id is ``e``."""
    cc = next(c for c in t.cfg.calls if t.cfg.exec_ids[c.name] == e)
    return cc.digest(arg)


def from_spec(cfg: ModelConfig, state: Mapping[str, Value]) -> SystemState:
    """The reference state corresponding to a spec state."""
    t = _tables(cfg)
    msg, args, result, stage = (_fn(state, v) for v in ("msg", "args", "result", "stage"))
    calls = []
    for cc in cfg.calls:
        m = msg[cc.name]
        if m == "absent":
            continue
        calls.append(
            p.CallState(
                cc.position,
                cc.tool_call_id,
                cc.tool,
                cfg.exec_ids[cc.name],
                cc.digest(str(args[cc.name])),
                p.MessageState(str(m)),
                _result(t, result[cc.name]),
                p.Stage(str(stage[cc.name])),
            )
        )
    approvals: dict[str, p.ApprovalState] = {}
    approval_digests: dict[str, str] = {}
    ledger: dict[str, p.ExecutionRecord] = {}
    audit: set[p.AuditKey] = set()
    audit_inputs: dict[p.AuditKey, frozenset[p.RecoveryInputs]] = {}
    inflight: dict[str, frozenset[int]] = {}
    numbers: dict[str, dict[str, int]] = {"fenced": {}, "applied": {}, "humanRetries": {}}
    for se, a in _fn(state, "approval").items():
        e = _eid(t, se)
        if a != NONE:
            approvals[e] = p.ApprovalState(str(a))
            approval_digests[e] = _digest_of(t, e, str(_fn(state, "approvalArgs")[se]))
        rec = _fn(state, "ledger")[se]
        assert isinstance(rec, FnValue)
        if rec["status"] != NONE:
            owner = t.cfg.by_name.get(str(rec["call"]))
            digest = None
            if rec["args"] != NONE and owner is not None:
                digest = owner.digest(str(rec["args"]))
            ledger[e] = p.ExecutionRecord(
                e,
                p.LedgerStatus(str(rec["status"])),
                _int(rec["attempt"]),
                digest,
                p.Authorization(str(rec["auth"])),
                _result(t, rec["result"]),
                None if owner is None else owner.position,
            )
        for row in _set(_fn(state, "audit")[se]):
            kind, n, row_inputs = _tuple(row)
            key = (e, str(kind), _int(n))
            audit.add(key)
            decision_inputs = _inputs_back(row_inputs, cfg.max_attempts)
            if decision_inputs is not None:
                audit_inputs[key] = audit_inputs.get(key, frozenset()) | {decision_inputs}
        reqs = _set(_fn(state, "inflight")[se])
        if reqs:
            inflight[e] = frozenset(_int(n) for n in reqs)
        for var, target in numbers.items():
            n = _int(_fn(state, var)[se])
            if n:
                target[e] = n
    invocations = {}
    for name, invs in _fn(state, "invocations").items():
        found = set()
        for inv in _set(invs):
            se, n, a = _tuple(inv)
            found.add((_eid(t, se), _int(n), p.Authorization(str(a))))
        if found:
            invocations[str(name)] = frozenset(found)
    sent: dict[tuple[str, int], int] = {}
    for name, counts in _fn(state, "sent").items():
        for n, k in enumerate(_tuple(counts), start=1):
            if _int(k):
                sent[(str(name), n)] = _int(k)
    after_outcome = {
        str(name): _int(k) for name, k in _fn(state, "sentAfterOutcome").items() if _int(k)
    }
    decided: dict[str, frozenset[Decided]] = {}
    for name, rows in _fn(state, "decided").items():
        found_rows = frozenset(
            (str(kind), _int(n), _inputs_back(i, cfg.max_attempts))
            for kind, n, i in (_tuple(r) for r in _set(rows))
        )
        if found_rows:
            decided[str(name)] = found_rows
    session = p.SessionState(
        session_id=cfg.session_id,
        marker=_int(state["marker"]),
        max_attempts=cfg.max_attempts,
        calls=tuple(sorted(calls, key=lambda c: c.position)),
        approvals=approvals,
        approval_digests=approval_digests,
        ledger=ledger,
        audit=frozenset(audit),
        retention_passed=frozenset(_eid(t, se) for se in _set(state["windowPassed"])),
    )
    effects = {str(name): _int(k) for name, k in _fn(state, "effects").items() if _int(k)}
    return SystemState(
        session,
        ExternalState(
            inflight=inflight,
            fenced=numbers["fenced"],
            applied=numbers["applied"],
            key_forgotten=frozenset(_eid(t, se) for se in _set(state["keyForgotten"])),
        ),
        Ghosts(
            invocations=invocations,
            human_approved=frozenset(
                (str(c), cfg.by_name[str(c)].digest(str(a)))
                for c, a in (_tuple(v) for v in _set(state["humanApproved"]))
            ),
            human_retries=numbers["humanRetries"],
            crashes=_int(state["crashes"]),
            sent=sent,
            known_outcome=frozenset(str(c) for c in _set(state["knownOutcome"])),
            sent_after_outcome=after_outcome,
            decided=decided,
            effects=effects,
            dropped_answers=frozenset(
                (_eid(t, _tuple(v)[0]), _int(_tuple(v)[1])) for v in _set(state["droppedAnswers"])
            ),
        ),
        audit_inputs,
        turn_shift={
            str(name): _int(t) - cfg.by_name[str(name)].position[0]
            for name, t in _fn(state, "turnOf").items()
            if _int(t) != cfg.by_name[str(name)].position[0]
        },
        renumbers=_int(state["renumbers"]),
        repairs=_int(state["repairs"]),
        stored=frozenset(str(c) for c, e in _fn(state, "storedId").items() if e != ()),
    )
