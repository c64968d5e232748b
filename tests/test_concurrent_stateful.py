"""Two engines at once on one store, driven by Hypothesis (spec/ConcurrentResumers.tla).

Each engine is its own :class:`Ledger` (for SQLite: its own connection to the
one file), deciding on what IT loaded.  They resume one idempotent call a
crashed engine left dispatched and interleave freely: recover, dispatch, send,
time out, get the answer, record it, restart (a new process, which takes the
session's lease when the run uses one).  After every step:

- AttemptSentOnce: each attempt was sent at most once, by both engines
  together (the test counts the requests the engines put out);
- a refused commit (``StaleState``, ``LeaseLost``) wrote nothing: the
  durable session is exactly what it was before the step.

The control runs the same machine on a store whose compare-and-set is removed
(every writer is handed what is stored as "what this engine saw"): the
machine must find two engines sending one attempt.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from toolledger._core import protocol as p
from toolledger._core.ledger import Ledger
from toolledger._core.sqlite_store import SqliteStore
from toolledger._core.stores import (
    AuditRow,
    LeaseLost,
    MemoryStore,
    StaleState,
    Store,
    _MemorySession,
    plan_commit,
)

A = p.Action
E = p.Event
SID = "s1"
POS = (0, 0)
TOOL = p.ToolProfile("create_ticket", p.RecoveryPolicy.IDEMPOTENT, False)
ARGS = {"title": "disk full"}
ENGINES = (0, 1)


class BlindMemoryStore(MemoryStore):
    """The broken variant: a MemoryStore without its compare-and-set.

    Every writer is handed what is stored as "what the engine saw", and the
    session guards and the lease are not checked: a commit is a blind write
    of what the engine computed from its (possibly stale) state.
    """

    def commit(
        self,
        session_id: str,
        before: p.SessionState,
        after: p.SessionState,
        audit_rows: Sequence[AuditRow],
        *,
        arguments: Mapping[p.CallPosition, Mapping[str, Any]] | None = None,
        epoch: int | None = None,
        create: bool = False,
    ) -> None:
        assert not create, "the engines of this test open sessions that exist"
        s = self._session(session_id)
        plan = plan_commit(session_id, before, after, audit_rows, arguments)
        if plan.empty:
            return
        staged: _MemorySession = s.copy()
        plan.write(
            call=lambda c, text: self._write_call(session_id, staged, c, text),
            result=lambda old, new: self._write_result(
                session_id, staged, staged.calls[new.position], new
            ),
            approval=lambda eid, was, now: self._write_approval(
                session_id, staged, eid, staged.approvals.get(eid), now
            ),
            record=lambda old, new: self._write_record(
                session_id, staged, staged.ledger.get(new.execution_id), new
            ),
            audit=lambda row: self._write_audit(staged, row),
        )
        self._sessions[session_id] = staged
        self.commits += 1


class TwoEngines(RuleBasedStateMachine):
    """Two engines resuming one session's dispatched idempotent call."""

    blind = False  # the control: a store without compare-and-set
    sqlite = False  # each engine on its own connection to one SQLite file

    def __init__(self) -> None:
        super().__init__()
        self.tmp: TemporaryDirectory[str] | None = None
        self.handles: list[Store] = []
        self.engines: list[Ledger | None] = []
        self.sent: Counter[int] = Counter()
        self.lease = False

    def teardown(self) -> None:
        for h in self.handles:
            h.close()
        if self.tmp is not None:
            self.tmp.cleanup()

    def _handle(self) -> Store:
        if not self.sqlite:
            return self.handles[0]
        assert self.tmp is not None
        handle = SqliteStore(Path(self.tmp.name) / "s.db")
        self.handles.append(handle)
        return handle

    def _open(self) -> Ledger:
        return Ledger(self._handle(), SID, take_session=True) if self.lease else Ledger(
            self._handle(), SID
        )

    @initialize(lease=st.booleans())
    def start(self, lease: bool) -> None:
        self.lease = lease and not self.blind
        if self.sqlite:
            self.tmp = TemporaryDirectory()
            self.handles = [SqliteStore(Path(self.tmp.name) / "s.db")]
        else:
            self.handles = [BlindMemoryStore() if self.blind else MemoryStore()]
        first = Ledger.create(self.handles[0], SID, max_attempts=3)
        emit = E(A.ProviderEmitCall, POS, "call_0", TOOL, p.args_digest(TOOL.name, ARGS))
        first.step(emit, arguments=ARGS)
        first.step(E(A.EnginePersistCall, POS))
        first.step(E(A.EnginePersistDispatched, POS))  # then the engine crashed, unsent
        self.engines = [self._open(), self._open()]

    @property
    def store(self) -> Store:
        return self.handles[0]

    def _attempt(self, ledger: Ledger) -> int:
        call = ledger.state.call(POS)
        assert call is not None
        rec = ledger.state.ledger.get(call.execution_id)
        return 0 if rec is None else rec.attempt

    def _try(self, i: int, events: list[p.Event], content: str | None = None) -> None:
        ledger = self.engines[i]
        if ledger is None:
            return
        durable_before = (self.store.load(SID), self.store.audit(SID))
        kept = ledger.state
        try:
            if content is None:
                ledger.step_many(events)
            else:
                ledger.step_many(events, result_content={POS: content})
        except StaleState as refused:
            # Refused before it wrote: nothing durable changed, the engine's
            # state is as before; it reloads (a lost lease: it stops).
            assert (self.store.load(SID), self.store.audit(SID)) == durable_before, refused
            assert ledger.state is kept
            if isinstance(refused, LeaseLost):
                self.engines[i] = None
            else:
                ledger.reload()
            return
        except p.ProtocolError:
            assert (self.store.load(SID), self.store.audit(SID)) == durable_before
            return
        if events[0].action is A.EngineInvokeAdapter:
            self.sent[self._attempt(ledger)] += 1

    @rule(i=st.sampled_from(ENGINES))
    def recover(self, i: int) -> None:
        self._try(i, [E(A.Recover, POS)])

    @rule(i=st.sampled_from(ENGINES))
    def persist_dispatched(self, i: int) -> None:
        self._try(i, [E(A.EnginePersistDispatched, POS)])

    @rule(i=st.sampled_from(ENGINES))
    def invoke_adapter(self, i: int) -> None:
        self._try(i, [E(A.EngineInvokeAdapter, POS)])

    @rule(i=st.sampled_from(ENGINES))
    def resume_and_send(self, i: int) -> None:
        """The three steps in a row (other rules interleave them one by one)."""
        self._try(i, [E(A.EngineTimeout, POS)])
        self._try(i, [E(A.Recover, POS)])
        self._try(i, [E(A.EnginePersistDispatched, POS)])
        self._try(i, [E(A.EngineInvokeAdapter, POS)])

    @rule(i=st.sampled_from(ENGINES))
    def timeout(self, i: int) -> None:
        self._try(i, [E(A.EngineTimeout, POS)])

    @rule(i=st.sampled_from(ENGINES))
    def answer_and_record(self, i: int) -> None:
        ledger = self.engines[i]
        if ledger is None:
            return
        n = self._attempt(ledger)
        if n >= 1 and self.sent[n] >= 1:
            self._try(i, [E(A.ExternalApply, POS, attempt=n)])
            self._try(i, [E(A.EngineRecordSucceeded, POS), E(A.EngineAppendResult, POS)], "ok")

    @rule(i=st.sampled_from(ENGINES))
    def restart(self, i: int) -> None:
        """Engine i dies and a new process resumes (taking the lease if the run uses one)."""
        self.engines[i] = self._open()

    @invariant()
    def attempt_sent_once(self) -> None:
        assert all(n <= 1 for n in self.sent.values()), f"AttemptSentOnce: {dict(self.sent)}"


class TwoEnginesOnSqlite(TwoEngines):
    sqlite = True


class TwoEnginesBlind(TwoEngines):
    blind = True


_QUICK = settings(
    settings.default,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TwoEngines.TestCase.settings = _QUICK
TestTwoEngines = TwoEngines.TestCase
TwoEnginesOnSqlite.TestCase.settings = settings(
    _QUICK, max_examples=min(_QUICK.max_examples, 25), stateful_step_count=25
)
TestTwoEnginesOnSqlite = TwoEnginesOnSqlite.TestCase


def test_the_machine_catches_a_store_without_compare_and_set() -> None:
    with pytest.raises(AssertionError, match="AttemptSentOnce"):
        run_state_machine_as_test(
            TwoEnginesBlind,
            settings=settings(
                max_examples=300,
                stateful_step_count=40,
                derandomize=True,
                database=None,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                phases=[Phase.explicit, Phase.generate],  # finding it is the point
            ),
        )
