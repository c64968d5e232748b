"""Shared pieces of the checker tests: model configurations and broken references.

Each broken variant is a context manager that swaps one piece of the protocol
core for a deliberately wrong one; every checker must catch each of them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from toolledger._core import protocol as p
from toolledger._core.stores import Store
from toolledger.check.system import CallConfig, ModelConfig

if TYPE_CHECKING:
    from toolledger.check.stategraph import StateGraph
    from toolledger.check.tlc import TLCResult

ROOT = Path(__file__).resolve().parents[1]


def model_config(name: str) -> ModelConfig:
    return ModelConfig.from_mc_module(ROOT / "model" / f"MC{name}.tla")


def big_config() -> ModelConfig:
    """Bigger than any exhaustive model: 4 calls, all policies, reused ids, a
    legacy call, 5 crashes, 3 attempts."""

    def call(name: str, turn: int, slot: int, tcid: str, policy: str, approval: bool,
             args: tuple[str, ...]) -> CallConfig:
        pol = p.RecoveryPolicy(policy)
        return CallConfig(name, (turn, slot), tcid,
                          p.ToolProfile(f"{policy}_tool_{name}", pol, approval), args)

    return ModelConfig(
        calls=(
            call("c1", 0, 0, "call_0", "manual", True, ("a1",)),
            call("c2", 1, 0, "call_0", "idempotent", True, ("a2", "a5")),
            call("c3", 1, 1, "", "reconcile", False, ("a3",)),
            call("c4", 2, 0, "call_0", "readonly", False, ("a4",)),
        ),
        marker=1,
        max_crashes=5,
        max_attempts=3,
    )


@contextmanager
def manual_retries() -> Iterator[None]:
    """Broken: recovery retries a ``manual`` call found in ``dispatched``."""
    original = p.decide_recovery

    def broken(inputs: p.RecoveryInputs) -> p.RecoveryDecision:
        i = inputs
        if i.status is p.LedgerStatus.DISPATCHED and i.policy is p.RecoveryPolicy.MANUAL \
                and not i.has_result and i.attempt < i.max_attempts:
            return p.RecoveryDecision(p.Decision.RETRY_SAME_ID, i)
        return original(i)

    p.decide_recovery = broken
    try:
        yield
    finally:
        p.decide_recovery = original


@contextmanager
def skips_dispatched_write() -> Iterator[None]:
    """Broken: the attempt is not made durable before the adapter runs."""
    handlers = p._HANDLERS
    original = handlers[p.Action.EnginePersistDispatched]

    def broken(state: p.SessionState, ev: p.Event) -> p.SessionState:
        after = original(state, ev)
        call = after.call(ev.position) if ev.position else None
        assert call is not None
        ledger = dict(after.ledger)
        ledger.pop(call.execution_id, None)  # nothing durable
        return replace(after, ledger=ledger)

    handlers[p.Action.EnginePersistDispatched] = broken
    try:
        yield
    finally:
        handlers[p.Action.EnginePersistDispatched] = original


@contextmanager
def keyed_by_tool_call_id() -> Iterator[None]:
    """Broken: the execution id is derived from (session_id, tool_call_id) only."""
    original = p.derive_execution_id

    def broken(session_id: str, turn: int, slot: int, tool_call_id: str) -> str:
        return original(session_id, 0, 0, tool_call_id)

    p.derive_execution_id = broken
    try:
        yield
    finally:
        p.derive_execution_id = original


@contextmanager
def ignores_key_retention() -> Iterator[None]:
    """Broken: recovery retries an idempotent call with the same id whether or
    not its key is still retained (the RetryAfterKeyExpiry twin)."""
    original = p.decide_recovery

    def broken(inputs: p.RecoveryInputs) -> p.RecoveryDecision:
        return p.RecoveryDecision(original(replace(inputs, key_retained=True)).decision, inputs)

    p.decide_recovery = broken
    try:
        yield
    finally:
        p.decide_recovery = original


@contextmanager
def takes_late_answer() -> Iterator[None]:
    """Broken: an answer is taken whatever attempt it belongs to, so a late
    answer of an older attempt passes for the current attempt's."""
    handlers = p._HANDLERS
    originals = {a: handlers[a] for a in (p.Action.ExternalApply, p.Action.ExternalRejectDefinite)}

    def broken(action: p.Action) -> p.Handler:
        def handle(state: p.SessionState, ev: p.Event) -> p.SessionState:
            c = state.call(ev.position) if ev.position else None
            current = state.record(c.execution_id).attempt if c is not None else ev.attempt
            return originals[action](state, replace(ev, attempt=current))

        return handle

    for action in originals:
        handlers[action] = broken(action)
    try:
        yield
    finally:
        handlers.update(originals)


@contextmanager
def resolves_before_recover() -> Iterator[None]:
    """Broken: a human may resolve a recovery_required call that a restart
    left in ``resume``, before ``Recover`` re-decided it (the engine's plan for
    the call is then stale: both may act on it)."""
    handlers = p._HANDLERS
    actions = (p.Action.HumanResolveApplied, p.Action.HumanResolveRetry,
               p.Action.HumanResolveAbandon)
    originals = {a: handlers[a] for a in actions}

    def broken(action: p.Action) -> p.Handler:
        def handle(state: p.SessionState, ev: p.Event) -> p.SessionState:
            c = state.call(ev.position) if ev.position else None
            if c is not None and c.stage is p.Stage.RESUME:
                state = state._with_call(replace(c, stage=p.Stage.NONE))  # skip the stage guard
            return originals[action](state, ev)

        return handle

    for action in actions:
        handlers[action] = broken(action)
    try:
        yield
    finally:
        handlers.update(originals)




def race_two_resumers(script: str, args: list[str], sync: Path) -> list[dict[str, object]]:
    """Run ``script`` (``python -c``) as two processes, ``a`` and ``b``, and start them together.

    Each child gets ``*args, name, sync`` on its command line, touches
    ``sync/<name>.loaded`` once it has loaded the session, waits for ``sync/go``,
    then acts and prints one JSON object; the JSON objects are returned in the
    order a, b.  Both have loaded before either acts: a real race.
    """
    sync.mkdir()
    children = [
        subprocess.Popen(
            [sys.executable, "-c", script, *args, name, str(sync)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    try:
        deadline = time.monotonic() + 60
        while not all((sync / f"{n}.loaded").exists() for n in ("a", "b")):
            assert time.monotonic() < deadline, "the resumers did not load the session"
            assert all(c.poll() is None for c in children), [c.communicate() for c in children]
            time.sleep(0.005)
        (sync / "go").touch()  # both have loaded the session: now both act
        results = []
        for child in children:
            out, err = child.communicate(timeout=60)
            assert child.returncode == 0, err
            results.append(json.loads(out))
        return results
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


@contextmanager
def halt_rebinds_record() -> Iterator[None]:
    """Broken: the old rule (the HaltRebindsRecord twin).  A halt rebinds the
    record to the call now at its position (its digest and position, whatever
    the record held), and a human retry is offered on every halted record: the
    spec's grant (the ``human_retry`` row only), which Recover honours on any
    halted record (the twin's RetryGranted reads HumanMayRetry, TRUE there)."""
    handlers = p._HANDLERS
    original_halt, original_retry = p._halt_record, handlers[p.Action.HumanResolveRetry]
    original_granted = p.SessionState.retry_granted

    def rebinding(state: p.SessionState, c: p.CallState) -> p.ExecutionRecord:
        return replace(
            state.record(c.execution_id),
            status=p.LedgerStatus.RECOVERY_REQUIRED,
            args_digest=c.args_digest,
            position=c.position,
        )

    def any_retry(state: p.SessionState, ev: p.Event) -> p.SessionState:
        c, rec = p._halted_call(state, ev)
        n = rec.attempt + 1
        if n > state.max_attempts:
            raise p.ProtocolError(ev.action, ev.position, f"attempt {n} exceeds max_attempts")
        if (c.execution_id, "human_retry", n) in state.audit:
            raise p.ProtocolError(ev.action, ev.position, f"attempt {n} is granted already")
        return state._with_audit((c.execution_id, "human_retry", n))._with_call(
            replace(c, stage=p.Stage.RESUME))

    def any_granted(self: p.SessionState, c: p.CallState) -> bool:
        rec = self.record(c.execution_id)
        return (
            c.message is p.MessageState.DURABLE and c.result is None
            and rec.status is p.LedgerStatus.RECOVERY_REQUIRED
            and (c.execution_id, "human_retry", rec.attempt + 1) in self.audit
        )

    p._halt_record = rebinding
    handlers[p.Action.HumanResolveRetry] = any_retry
    p.SessionState.retry_granted = any_granted  # type: ignore[method-assign]
    try:
        yield
    finally:
        p._halt_record = original_halt
        handlers[p.Action.HumanResolveRetry] = original_retry
        p.SessionState.retry_granted = original_granted  # type: ignore[method-assign]


BROKEN = {
    "manual_retries": manual_retries,
    "skips_dispatched_write": skips_dispatched_write,
    "keyed_by_tool_call_id": keyed_by_tool_call_id,
    "takes_late_answer": takes_late_answer,
    "resolves_before_recover": resolves_before_recover,
    "ignores_key_retention": ignores_key_retention,
    "halt_rebinds_record": halt_rebinds_record,
}


@contextmanager
def approval_by_position() -> Iterator[None]:
    """Broken: an approval binds the position only (the ApprovalByPosition
    twin).  Any call at an approved execution id is dispatched on it, whatever
    arguments the approval was asked for, and none is ever asked again."""
    original = p._approval_for
    p._approval_for = lambda state, c: True
    try:
        yield
    finally:
        p._approval_for = original


BROKEN["approval_by_position"] = approval_by_position


@contextmanager
def drops_late_answer() -> Iterator[None]:
    """Broken: the old rule (the LateReturnDropped twin).  An answer that
    arrives after the engine timed out is discarded even while the call's
    record is still at that attempt with no outcome: the human is then asked
    to resolve a call whose applied answer the engine had."""
    original = p._holds_unanswered
    p._holds_unanswered = lambda state, c, attempt: False
    try:
        yield
    finally:
        p._holds_unanswered = original


BROKEN["drops_late_answer"] = drops_late_answer


@contextmanager
def reconciles_abandoned() -> Iterator[None]:
    """Broken: recovery reconciles a reconcile call a human abandoned instead
    of reconstructing it (the ReconcileAbandoned twin): the connector's "not
    applied" then sends attempt 2 after the human gave up."""
    original = p.decide_recovery

    def broken(inputs: p.RecoveryInputs) -> p.RecoveryDecision:
        i = inputs
        if i.status is p.LedgerStatus.ABANDONED and i.policy is p.RecoveryPolicy.RECONCILE \
                and not i.has_result:
            return p.RecoveryDecision(p.Decision.RECONCILE, i)
        return original(i)

    p.decide_recovery = broken
    try:
        yield
    finally:
        p.decide_recovery = original


BROKEN["reconciles_abandoned"] = reconciles_abandoned


class MailApi:
    """The frameworks docs blocks' ``mail_api``: one entry per email it really sends, deduplicated
    on the idempotency key as a real mail API that takes one would."""

    def __init__(self) -> None:
        self.sent: dict[str, tuple[str, str]] = {}

    def send(self, to: str, body: str, key: str | None) -> str:
        assert key is not None and key.startswith("tlx"), key  # the ledger filled it in
        self.sent.setdefault(key, (to, body))
        return f"sent to {to}"


class Watched:
    """A store that notes the thread of every call, and may hold a call in it: the
    async tests' probe that no store I/O runs on the event loop's thread."""

    def __init__(self, store: Store) -> None:
        self.inner = store
        self.threads: list[tuple[str, int]] = []
        self.hold: Callable[[str, tuple[Any, ...]], None] | None = None

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.threads.append((name, threading.get_ident()))
            if self.hold is not None:
                self.hold(name, args)
            return attr(*args, **kwargs)

        return call


def watched(store: Store) -> tuple[Watched, Store]:
    w = Watched(store)
    return w, cast(Store, w)


def dump_graph(name: str, where: Path) -> tuple[TLCResult, StateGraph]:
    """Manifest row ``name``'s TLC result and state graph, from the very run
    ``make check`` makes of it (:func:`toolledger.check.batch.run_as_check`):
    under ``make test`` (``TOOLLEDGER_TLC_CACHE``) a graph ``make check`` or
    another test already dumped is copied from the cache, not re-explored."""
    from toolledger.check.batch import run_as_check
    from toolledger.check.manifest import load_manifest
    from toolledger.check.stategraph import load_dot
    from toolledger.check.tlccache import cache_from_env

    dot = where / f"{name}.dot"
    result = run_as_check(load_manifest(ROOT), name, where, dump_dot=dot, cache=cache_from_env())
    return result, load_dot(dot)
