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
from collections.abc import Callable, Iterable, Mapping
from typing import Final, TypeVar

from .._core import protocol as p
from .._core.ledger import APPROVAL_KINDS
from .system import Decided, ExternalState, Ghosts, ModelConfig, SystemState
from .tlavalues import FnValue, Value

__all__ = ["NO_INPUTS", "SPEC_VARIABLES", "SpecMapper", "from_spec", "spec_key", "to_spec"]

_T = TypeVar("_T")

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


# The spec variables each part of a reference state maps to, in the order the
# part functions below return them: the session (with the audit rows' inputs,
# which the stores write beside it), the external system, the ghosts, and the
# conversation's rewrites.
SESSION_VARS: Final = ("msg", "args", "result", "approval", "approvalArgs", "ledger", "audit",
                       "marker", "stage", "windowPassed")
EXTERNAL_VARS: Final = ("inflight", "fenced", "applied", "keyForgotten")
GHOST_VARS: Final = ("invocations", "humanApproved", "humanRetries", "crashes", "sent",
                     "knownOutcome", "sentAfterOutcome", "decided", "effects", "droppedAnswers")
REWRITE_VARS: Final = ("turnOf", "storedId", "renumbers", "repairs")
_PARTS: Final = SESSION_VARS + EXTERNAL_VARS + GHOST_VARS + REWRITE_VARS
assert sorted(_PARTS) == sorted(SPEC_VARIABLES), "every spec variable in exactly one part"
# where each variable of SPEC_VARIABLES sits in the concatenated parts
_ORDER: Final = tuple(_PARTS.index(v) for v in SPEC_VARIABLES)


def _session_part(t: _Tables, session: p.SessionState,
                  audit_inputs: Mapping[p.AuditKey, frozenset[p.RecoveryInputs]]
                  ) -> tuple[Value, ...]:
    cfg = t.cfg
    by_pos = {c.position: c for c in session.calls}
    msg: dict[Value, Value] = {}
    args: dict[Value, Value] = {}
    result: dict[Value, Value] = {}
    stage: dict[Value, Value] = {}
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
    approval: dict[Value, Value] = {}
    approval_args: dict[Value, Value] = {}
    ledger: dict[Value, Value] = {}
    audit: dict[Value, Value] = {}
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
            for i in (sorted(audit_inputs.get((ae, k, n), ()), key=repr) if with_inputs
                      else ()) or (None,)
        )
    return (FnValue(msg), FnValue(args), FnValue(result), FnValue(approval),
            FnValue(approval_args), FnValue(ledger), FnValue(audit), session.marker,
            FnValue(stage), frozenset(t.spec_eid[e] for e in session.retention_passed))


def _external_part(t: _Tables, ext: ExternalState) -> tuple[Value, ...]:
    inflight: dict[Value, Value] = {}
    fenced: dict[Value, Value] = {}
    applied: dict[Value, Value] = {}
    for se in t.spec_eids:
        e = t.py_eid[se]
        inflight[se] = ext.requests(e)
        fenced[se] = ext.fence(e)
        applied[se] = ext.count(e)
    return (FnValue(inflight), FnValue(fenced), FnValue(applied),
            frozenset(t.spec_eid[e] for e in ext.key_forgotten))


def _ghost_part(t: _Tables, gh: Ghosts) -> tuple[Value, ...]:
    cfg = t.cfg
    invocations: dict[Value, Value] = {}
    sent: dict[Value, Value] = {}
    after_outcome: dict[Value, Value] = {}
    decided: dict[Value, Value] = {}
    for cc in cfg.calls:
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
    retries: dict[Value, Value] = {se: gh.human_retries.get(t.py_eid[se], 0)
                                   for se in t.spec_eids}
    return (
        FnValue(invocations),
        frozenset((name, t.arg(d)) for name, d in gh.human_approved),
        FnValue(retries),
        gh.crashes,
        FnValue(sent),
        gh.known_outcome,
        FnValue(after_outcome),
        FnValue(decided),
        FnValue({cc.name: gh.effects.get(cc.name, 0) for cc in cfg.calls}),
        frozenset((t.spec_eid[e], n) for e, n in gh.dropped_answers),
    )


def _rewrite_part(t: _Tables, s: SystemState) -> tuple[Value, ...]:
    cfg = t.cfg
    # the core keeps the id it derived at emit; the ledger store keeps it
    # for every call ever persisted (the spec's NoId is the empty tuple)
    return (
        FnValue({cc.name: cc.position[0] + s.turn_shift.get(cc.name, 0) for cc in cfg.calls}),
        FnValue({cc.name: cfg.spec_exec_ids[cc.name] if cc.name in s.stored else ()
                 for cc in cfg.calls}),
        s.renumbers,
        s.repairs,
    )


def to_spec(cfg: ModelConfig, s: SystemState) -> dict[str, Value]:
    """The spec variables' values for reference state ``s``."""
    t = _tables(cfg)
    parts = (_session_part(t, s.session, s.audit_inputs) + _external_part(t, s.external)
             + _ghost_part(t, s.ghosts) + _rewrite_part(t, s))
    return {v: parts[i] for v, i in zip(SPEC_VARIABLES, _ORDER, strict=True)}


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


_AuditInputs = dict[p.AuditKey, frozenset[p.RecoveryInputs]]


def _session_back(t: _Tables, v: Mapping[str, Value]) -> tuple[p.SessionState, _AuditInputs]:
    """The session (and the audit rows' inputs) of the :data:`SESSION_VARS`."""
    cfg = t.cfg
    msg, args, result, stage = (_fn(v, n) for n in ("msg", "args", "result", "stage"))
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
    audit_inputs: _AuditInputs = {}
    approval_args, records, rows = (_fn(v, n) for n in ("approvalArgs", "ledger", "audit"))
    for se, a in _fn(v, "approval").items():
        e = _eid(t, se)
        if a != NONE:
            approvals[e] = p.ApprovalState(str(a))
            approval_digests[e] = _digest_of(t, e, str(approval_args[se]))
        rec = records[se]
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
        for row in _set(rows[se]):
            kind, n, row_inputs = _tuple(row)
            key = (e, str(kind), _int(n))
            audit.add(key)
            decision_inputs = _inputs_back(row_inputs, cfg.max_attempts)
            if decision_inputs is not None:
                audit_inputs[key] = audit_inputs.get(key, frozenset()) | {decision_inputs}
    session = p.SessionState(
        session_id=cfg.session_id,
        marker=_int(v["marker"]),
        max_attempts=cfg.max_attempts,
        calls=tuple(sorted(calls, key=lambda c: c.position)),
        approvals=approvals,
        approval_digests=approval_digests,
        ledger=ledger,
        audit=frozenset(audit),
        retention_passed=frozenset(_eid(t, se) for se in _set(v["windowPassed"])),
    )
    return session, audit_inputs


def _external_back(t: _Tables, v: Mapping[str, Value]) -> ExternalState:
    """The external system of the :data:`EXTERNAL_VARS`."""
    inflight: dict[str, frozenset[int]] = {}
    for se, reqs in _fn(v, "inflight").items():
        if _set(reqs):
            inflight[_eid(t, se)] = frozenset(_int(n) for n in _set(reqs))
    fenced, applied = ({_eid(t, se): _int(n) for se, n in _fn(v, var).items() if _int(n)}
                       for var in ("fenced", "applied"))
    return ExternalState(
        inflight=inflight,
        fenced=fenced,
        applied=applied,
        key_forgotten=frozenset(_eid(t, se) for se in _set(v["keyForgotten"])),
    )


def _ghosts_back(t: _Tables, v: Mapping[str, Value]) -> Ghosts:
    """The ghosts of the :data:`GHOST_VARS`."""
    cfg = t.cfg
    invocations = {}
    for name, invs in _fn(v, "invocations").items():
        found = set()
        for inv in _set(invs):
            se, n, a = _tuple(inv)
            found.add((_eid(t, se), _int(n), p.Authorization(str(a))))
        if found:
            invocations[str(name)] = frozenset(found)
    sent: dict[tuple[str, int], int] = {}
    for name, counts in _fn(v, "sent").items():
        for n, k in enumerate(_tuple(counts), start=1):
            if _int(k):
                sent[(str(name), n)] = _int(k)
    after_outcome = {
        str(name): _int(k) for name, k in _fn(v, "sentAfterOutcome").items() if _int(k)
    }
    decided: dict[str, frozenset[Decided]] = {}
    for name, rows in _fn(v, "decided").items():
        found_rows = frozenset(
            (str(kind), _int(n), _inputs_back(i, cfg.max_attempts))
            for kind, n, i in (_tuple(r) for r in _set(rows))
        )
        if found_rows:
            decided[str(name)] = found_rows
    return Ghosts(
        invocations=invocations,
        human_approved=frozenset(
            (str(c), cfg.by_name[str(c)].digest(str(a)))
            for c, a in (_tuple(x) for x in _set(v["humanApproved"]))
        ),
        human_retries={_eid(t, se): _int(n) for se, n in _fn(v, "humanRetries").items()
                       if _int(n)},
        crashes=_int(v["crashes"]),
        sent=sent,
        known_outcome=frozenset(str(c) for c in _set(v["knownOutcome"])),
        sent_after_outcome=after_outcome,
        decided=decided,
        effects={str(name): _int(k) for name, k in _fn(v, "effects").items() if _int(k)},
        dropped_answers=frozenset(
            (_eid(t, _tuple(x)[0]), _int(_tuple(x)[1])) for x in _set(v["droppedAnswers"])
        ),
    )


def _rewrites_back(t: _Tables, v: Mapping[str, Value]
                   ) -> tuple[dict[str, int], int, int, frozenset[str]]:
    """turn_shift, renumbers, repairs and stored of the :data:`REWRITE_VARS`."""
    by_name = t.cfg.by_name
    turn_shift = {
        str(name): _int(turn) - by_name[str(name)].position[0]
        for name, turn in _fn(v, "turnOf").items()
        if _int(turn) != by_name[str(name)].position[0]
    }
    stored = frozenset(str(c) for c, e in _fn(v, "storedId").items() if e != ())
    return turn_shift, _int(v["renumbers"]), _int(v["repairs"]), stored


def from_spec(cfg: ModelConfig, state: Mapping[str, Value]) -> SystemState:
    """The reference state corresponding to a spec state."""
    t = _tables(cfg)
    session, audit_inputs = _session_back(t, state)
    turn_shift, renumbers, repairs, stored = _rewrites_back(t, state)
    return SystemState(session, _external_back(t, state), _ghosts_back(t, state), audit_inputs,
                       turn_shift=turn_shift, renumbers=renumbers, repairs=repairs, stored=stored)


class SpecMapper:
    """:func:`to_spec` and :func:`from_spec` of one model, each part kept.

    A checker maps the same parts again and again: a successor shares its
    parent's session, external system or ghosts unless the step changed them,
    and the states of a TLC graph share each variable's parsed value.  So the
    image of each part (:data:`SESSION_VARS`, :data:`EXTERNAL_VARS`,
    :data:`GHOST_VARS`, :data:`REWRITE_VARS`) is kept by the identity of
    what it was computed from (the entry holds those objects, so an id is
    never reused while it lives), and every value handed out is interned:
    equal values are one object, those of the graph once it is adopted, so
    comparing keys compares identities.  The results are the functions'
    own (``tests/test_mapping.py`` compares them on every state of a graph).
    """

    def __init__(self, cfg: ModelConfig, limit: int = 100_000) -> None:
        self.t = _tables(cfg)
        self._limit = limit
        self._to: dict[tuple[object, ...], tuple[tuple[object, ...], tuple[Value, ...]]] = {}
        self._back: dict[tuple[object, ...], tuple[tuple[object, ...], object]] = {}
        self._canon: dict[Value, Value] = {}

    def adopt(self, states: Iterable[Mapping[str, Value]]) -> None:
        """Intern to the values of ``states`` (a graph's): keys then share them."""
        seen: set[int] = set()
        canon = self._canon
        for st in states:
            for v in st.values():
                if id(v) not in seen:
                    seen.add(id(v))
                    canon.setdefault(v, v)

    def canonical(self, values: tuple[Value, ...]) -> tuple[Value, ...]:
        """``values`` with each replaced by the one object of its value (a
        graph's states may hold equal values parsed apart)."""
        canon = self._canon
        return tuple(canon.setdefault(v, v) for v in values)

    def _to_part(self, part: str, of: tuple[object, ...], fn: Callable[[], tuple[Value, ...]]
                 ) -> tuple[Value, ...]:
        k = (part, *map(id, of))
        got = self._to.get(k)
        if got is None:
            if len(self._to) >= self._limit:
                self._to.clear()
            got = self._to[k] = (of, self.canonical(fn()))
        return got[1]

    def key(self, s: SystemState) -> tuple[Value, ...]:
        """:func:`spec_key` of :func:`to_spec` of ``s``."""
        t = self.t
        parts = (
            self._to_part("session", (s.session, s.audit_inputs),
                          lambda: _session_part(t, s.session, s.audit_inputs))
            + self._to_part("external", (s.external,), lambda: _external_part(t, s.external))
            + self._to_part("ghosts", (s.ghosts,), lambda: _ghost_part(t, s.ghosts))
            + self._to_part("rewrites", (s.turn_shift, s.stored, s.renumbers, s.repairs),
                            lambda: _rewrite_part(t, s))
        )
        return tuple(parts[i] for i in _ORDER)

    def to_spec(self, s: SystemState) -> dict[str, Value]:
        """:func:`to_spec` of ``s``."""
        return self.state(self.key(s))

    @staticmethod
    def state(key: tuple[Value, ...]) -> dict[str, Value]:
        """The spec state (variable -> value) of a key."""
        return dict(zip(SPEC_VARIABLES, key, strict=True))

    def _back_part(self, state: Mapping[str, Value], names: tuple[str, ...],
                   fn: Callable[[_Tables, Mapping[str, Value]], _T]) -> _T:
        of = tuple(state[n] for n in names)
        k = (fn, *map(id, of))
        got = self._back.get(k)
        if got is None:
            if len(self._back) >= self._limit:
                self._back.clear()
            got = self._back[k] = (of, fn(self.t, state))
        return got[1]  # type: ignore[return-value]

    def from_spec(self, state: Mapping[str, Value]) -> SystemState:
        """:func:`from_spec` of ``state``; equal parts come back as one object."""
        session, audit_inputs = self._back_part(state, SESSION_VARS, _session_back)
        turn_shift, renumbers, repairs, stored = self._back_part(state, REWRITE_VARS,
                                                                 _rewrites_back)
        return SystemState(session, self._back_part(state, EXTERNAL_VARS, _external_back),
                           self._back_part(state, GHOST_VARS, _ghosts_back), audit_inputs,
                           turn_shift=turn_shift, renumbers=renumbers, repairs=repairs,
                           stored=stored)
