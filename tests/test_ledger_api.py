"""The Ledger's Python API at its edges: typed refusals whose advice works when followed.

Under test: ``toolledger._core.ledger.Ledger``, ``protocol.Event`` and the stores'
error messages.  Each trap: a result recorded without its content, a
position given as a list, an error that names a method that does not exist
(``load()``), and "reload the session" without saying how.  Oracles: the
exception's type and text, the store's counters and audit rows (nothing
written), and following the advice a message gives (calling what it names).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import toolledger
from toolledger._core import protocol as p
from toolledger._core.ledger import Ledger
from toolledger._core.sqlite_store import SqliteStore
from toolledger._core.stores import RELOAD, MemoryStore, SessionExists, StaleState, Store

A = p.Action
E = p.Event
SID = "s1"
IDEMPOTENT = p.ToolProfile("create_ticket", p.RecoveryPolicy.IDEMPOTENT, False)
READONLY = p.ToolProfile("read_file", p.RecoveryPolicy.READONLY, False)
MANUAL = p.ToolProfile("send_email", p.RecoveryPolicy.MANUAL, True)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made: Store = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "x.db")
    try:
        yield made
    finally:
        made.close()


def emit(pos: p.CallPosition, tool: p.ToolProfile) -> E:
    return E(A.ProviderEmitCall, pos, f"call_{pos[1]}", tool, p.args_digest(tool.name, {}))


def answered_by_the_adapter(store: Store, tool: p.ToolProfile = IDEMPOTENT) -> Ledger:
    """A call whose adapter answered: the next step records the answer."""
    ledger = Ledger.create(store, SID)
    ledger.step(emit((0, 0), tool))
    ledger.step(E(A.EnginePersistCall, (0, 0)))
    if tool.protected:
        ledger.step(E(A.EnginePersistDispatched, (0, 0)))
        ledger.step(E(A.EngineInvokeAdapter, (0, 0)))
        ledger.step(E(A.ExternalApply, (0, 0), attempt=1))
    else:
        ledger.step(E(A.EngineInvokeReadonly, (0, 0)))
    return ledger


def written(store: Store) -> tuple[int, int, int]:
    return (store.commits, store.ledger_commits, len(store.audit(SID)))


# --------------------------------------------------------------------------
# (a) a result without its content
# --------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [False, True])
def test_succeeded_without_result_content_is_refused(store: Store, batch: bool) -> None:
    ledger = answered_by_the_adapter(store)
    kept, before = ledger.state, written(store)
    succeeded, append = E(A.EngineRecordSucceeded, (0, 0)), E(A.EngineAppendResult, (0, 0))
    with pytest.raises(p.InvalidInput, match=r"EngineRecordSucceeded at \(0, 0\) creates the "
                       r"call's tool result, but no result content was given: pass"):
        if batch:
            ledger.step_many([succeeded, append])
        else:
            ledger.step(succeeded)
    assert ledger.state is kept and written(store) == before
    # What the message says to pass works, and the content is what is stored.
    ledger.step_many([succeeded, append], result_content={(0, 0): "ticket 7"})
    result = store.load(SID).calls[0].result
    assert result is not None and result.content == "ticket 7"


def test_a_readonly_answer_without_content_is_refused(store: Store) -> None:
    ledger = answered_by_the_adapter(store, READONLY)
    with pytest.raises(p.InvalidInput, match=r"EngineAppendResult at .* no result content"):
        ledger.step(E(A.EngineAppendResult, (0, 0)))
    assert store.load(SID).calls[0].result is None
    ledger.step(E(A.EngineAppendResult, (0, 0)), result_content="")  # said explicitly: kept
    assert store.load(SID).calls[0].result is not None


def test_a_human_applied_step_without_text_points_at_resolve(store: Store) -> None:
    ledger = Ledger.create(store, SID)
    ledger.step(emit((0, 0), MANUAL))
    for action in (A.EnginePersistCall, A.EngineParkApproval, A.HumanApprove,
                   A.EnginePersistDispatched, A.EngineInvokeAdapter):  # fmt: skip
        ledger.step(E(action, (0, 0)))
    ledger.step(E(A.EngineTimeout, (0, 0)))
    ledger.step(E(A.Recover, (0, 0)))  # manual: recovery_required
    with pytest.raises(p.InvalidInput, match=r"use resolve\(\(0, 0\), 'applied', result_text="):
        ledger.step(E(A.HumanResolveApplied, (0, 0)))
    ledger.resolve((0, 0), "applied", result_text="sent")
    # abandon has no content to give: it is not refused
    assert [r.kind for r in store.audit(SID)][-1] == "human_applied"


# --------------------------------------------------------------------------
# (b) a position given as a list
# --------------------------------------------------------------------------

LIST_MESSAGE = r"must be a call position, a \(turn, slot\) tuple of two non-negative ints"


def test_an_event_with_a_list_position_is_invalid_input_naming_the_field() -> None:
    with pytest.raises(p.InvalidInput, match=rf"Event.position {LIST_MESSAGE}.*got \[0, 0\] "
                       r"of type list \(a list: pass a tuple\)"):
        E(A.Recover, [0, 0])  # type: ignore[arg-type]
    with pytest.raises(p.InvalidInput, match=r"Event\.position"):
        E(A.Recover, (0, -1))
    assert not issubclass(p.InvalidInput, TypeError)  # a ValueError, never a TypeError


def test_ledger_methods_given_a_list_position_are_invalid_input(store: Store) -> None:
    ledger = answered_by_the_adapter(store)
    before = written(store)
    as_list: Any = [0, 0]  # what a position read back from JSON is
    calls: list[tuple[Callable[[], object], str]] = [
        (lambda: ledger.call_arguments(as_list), "call_arguments"),  # was a TypeError
        (lambda: ledger.state.call(as_list), "SessionState.call"),  # was a silent None
        (lambda: ledger.resolve(as_list, "retry"), "resolve"),
    ]
    for call, field in calls:
        with pytest.raises(p.InvalidInput, match=rf"{field}.* position {LIST_MESSAGE}"):
            call()
    assert written(store) == before


# --------------------------------------------------------------------------
# (c) SessionExists names a method that exists
# --------------------------------------------------------------------------


def test_session_exists_names_a_real_way_to_open_the_session(store: Store) -> None:
    Ledger.create(store, SID)
    with pytest.raises(SessionExists) as info:
        Ledger.create(store, SID)
    message = str(info.value)
    assert "load() it" not in message
    advice = re.search(r"open it with (Ledger\(store, '[^']*'\))", message)
    assert advice is not None, message
    opened = eval(advice.group(1), {"Ledger": Ledger, "store": store})  # follow the advice
    assert isinstance(opened, Ledger) and opened.session_id == SID


# --------------------------------------------------------------------------
# (d) reloading has an obvious name, and every message that asks for it names it
# --------------------------------------------------------------------------


def test_reload_drops_volatile_state_and_rereads_the_durable_one(store: Store) -> None:
    ledger = Ledger.create(store, SID)
    ledger.step(emit((0, 0), IDEMPOTENT))
    ledger.step(E(A.EnginePersistCall, (0, 0)))
    ledger.step(emit((0, 1), IDEMPOTENT))  # volatile: never persisted
    state = ledger.reload()
    assert state == ledger.state == store.load_working_set(SID)
    assert [(c.position, c.stage) for c in state.calls] == [((0, 0), p.Stage.RESUME)]
    # crash() is the same thing, named for the protocol's Crash in tests
    ledger.step(emit((0, 1), IDEMPOTENT))
    assert ledger.crash() == state


def test_a_stale_state_error_names_reload_and_following_it_works(store: Store) -> None:
    first, second = Ledger.create(store, SID), Ledger(store, SID)
    first.step(emit((0, 0), IDEMPOTENT))
    first.step(E(A.EnginePersistCall, (0, 0)))
    second.step(emit((0, 0), IDEMPOTENT))
    with pytest.raises(StaleState, match=r"call recover\(\).*call Ledger\.reload\(\)"):
        second.step(E(A.EnginePersistCall, (0, 0)))
    assert second.reload() == store.load_working_set(SID)
    second.step(E(A.Recover, (0, 0)))  # it now decides on the durable call: execute
    second.step(E(A.EnginePersistDispatched, (0, 0)))
    assert [r.kind for r in store.audit(SID)] == ["execute", "dispatch"]


def _raised_texts(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """The text of every string in a ``raise`` statement, f-string parts joined;
    the name ``RELOAD`` stands for its value."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Raise) or node.exc is None:
            continue
        parts: list[str] = []
        for sub in ast.walk(node.exc):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                parts.append(sub.value)
            elif isinstance(sub, ast.Name) and sub.id == "RELOAD":
                parts.append(RELOAD)
        yield node.lineno, "".join(parts)


def test_every_error_that_asks_for_a_reload_names_the_method() -> None:
    """An error asking for a reload names the method, and a store's error (which a
    Session user meets too) says what a Session user does: the Session reloaded
    by itself, call recover(), never only the internal Ledger.reload()."""
    package = Path(toolledger.__file__).parent
    asking, bad = 0, []
    for module in sorted(package.rglob("*.py")):
        for line, text in _raised_texts(ast.parse(module.read_text(encoding="utf-8"))):
            if re.search(r"\b(reload (the session|it)|call reload|Ledger\.reload\(\)|"
                         r"must be read again)", text, re.IGNORECASE):
                asking += 1
                if "Ledger.reload()" not in text:
                    bad.append(f"{module.name}:{line}: {text}")
                if module.name != "ledger.py" and "recover()" not in text:
                    bad.append(f"{module.name}:{line}: says nothing to a Session user: {text}")
            if "load() it" in text or "call crash()" in text:
                bad.append(f"{module.name}:{line}: names no real method: {text}")
    assert asking >= 8, asking  # the stale-state errors of both stores
    assert bad == []
    assert callable(Ledger.reload)
