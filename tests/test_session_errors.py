"""Session errors inside the batched paths: no known outcome lost, no effect twice.

Under test: :meth:`toolledger.Session.execute_message` (with and without
``together=True``) and :meth:`toolledger.Session.execute_many`, when the
session itself fails in the middle (not a tool body): a store that refuses
its n-th commit (``StoreError``, nothing written: a full disk, a lock held
past the busy timeout), for EVERY n of the path's commits, and a session
step that raises when the second call starts (call 1 ran and sent its
email).  After each, the durable state is judged by a new session on the
same store (what a restarted engine sees), against the external system's
own record:

- no known outcome lost: every call whose effect was applied has its result
  durable, unless the refused commit was the one carrying it (the store
  refused it: then it is dispatched-and-unknown, which recovery handles);
- no effect twice: recovery, then running what it says to run, applies no
  effect a second time (manual tools: a second request is a second email).

The single-call path's own injections are in ``tests/test_session_api.py``;
a together message killed around its commits in ``tests/test_session_together.py``.
A session without the flush of known outcomes on its own error is shown
to fail the check.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from toolledger import Attempt, MemoryStore, Next, Session, Tool
from toolledger._core.commit_plan import plan_commit
from toolledger._core.protocol import CallPosition, SessionState
from toolledger._core.stores import AuditRow, StoreError

SID = "errors"
N = 3


def tools() -> dict[str, Tool | str]:
    return {"send": Tool("manual", requires_approval=False)}


def message(seq: int = 1) -> list[dict[str, Any]]:
    return [{"id": f"c{i}", "name": "send", "arguments": {"i": i}} for i in range(N)]


class RefusingStore(MemoryStore):
    """Refuses its ``n``-th commit that would write (``StoreError``, nothing written),
    and remembers which results that refused commit carried."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n, self.writing, self.refused_results = n, 0, set[CallPosition]()

    def commit(self, session_id: str, before: SessionState, after: SessionState,
               audit_rows: Sequence[AuditRow], *,
               arguments: Mapping[CallPosition, Mapping[str, Any]] | None = None,
               epoch: int | None = None, create: bool = False) -> None:
        if not plan_commit(session_id, before, after, audit_rows, arguments).empty:
            self.writing += 1
            if self.writing == self.n:
                self.refused_results = {
                    c.position for c in after.calls if c.result is not None
                    and (before.call(c.position) is None
                         or before.call(c.position).result is None)}  # type: ignore[union-attr]
                raise StoreError(f"injected: the store refused commit {self.n}; nothing "
                                 "was written, try again")
        super().commit(session_id, before, after, audit_rows, arguments=arguments,
                       epoch=epoch, create=create)


class External:
    """The external system's own record: every request applied (manual: no key)."""

    def __init__(self, unknown: int | None = None) -> None:
        self.effects: Counter[str] = Counter()
        self.returned: dict[str, str] = {}
        self.unknown = unknown

    def body(self, a: Attempt) -> str:
        self.effects[a.call.key] += 1
        if a.call.arguments["i"] == self.unknown:
            raise TimeoutError("the answer was lost")  # applied, outcome unknown
        self.returned[a.call.key] = f"sent {a.call.arguments['i']}"
        return self.returned[a.call.key]


def run_path(path: str, s: Session, ext: External) -> None:
    if path == "execute_many":
        refs = s.record(1, message())
        s.execute_many([(r.key, ext.body) for r in refs])
    else:
        s.execute_message(1, message(), ext.body, together=path == "together")


PATHS = ("together", "execute_message", "execute_many")


def commits_of(path: str, unknown: int | None) -> int:
    """How many writing commits the path makes when nothing fails."""
    store = RefusingStore(0)
    run_path(path, Session.open(store, SID, tools()), External(unknown))
    return store.writing


def judge(store: RefusingStore, ext: External) -> list[str]:
    """What a restarted engine finds wrong (see the module doc)."""
    problems = []
    if SID not in store.sessions():
        return [f"effects with no session: {dict(ext.effects)}"] if ext.effects else []
    s = Session.open(store, SID, tools())
    state = store.load(SID)
    for c in state.calls:
        if c.execution_id in ext.returned and c.position not in store.refused_results:
            if c.result is None:
                known = ext.returned[c.execution_id]
                problems.append(f"call {c.position}: its outcome was known ({known!r}) but is "
                                "not durable: dispatched with no result")
            elif c.result.content != ext.returned[c.execution_id]:
                problems.append(f"call {c.position}: result {c.result.content!r}, the system "
                                f"returned {ext.returned[c.execution_id]!r}")
    before = Counter(ext.effects)
    for status in s.recover():
        if status.next in (Next.EXECUTE, Next.RETRY):
            s.execute(status.key, ext.body)
    twice = {k: v for k, v in ext.effects.items() if v > 1}
    if twice:
        problems.append(f"effects applied twice after recovery: {twice} (before: {dict(before)})")
    return problems


def cases() -> list[tuple[str, int | None, int]]:
    return [(path, unknown, n) for path in PATHS for unknown in (None, 1)
            for n in range(1, commits_of(path, unknown) + 1)]


@pytest.mark.parametrize(("path", "unknown", "n"), cases())
def test_a_refused_commit_anywhere_loses_no_known_outcome(path: str, unknown: int | None,
                                                           n: int) -> None:
    store, ext = RefusingStore(n), External(unknown)
    with pytest.raises(StoreError, match="injected"):
        run_path(path, Session.open(store, SID, tools()), ext)
    assert judge(store, ext) == []


def test_every_path_makes_several_commits_to_refuse() -> None:
    # the matrix above is not empty: each path, with and without an unknown outcome
    assert {(p, u): commits_of(p, u) for p in PATHS for u in (None, 1)} == {
        ("together", None): 2, ("together", 1): 4,
        ("execute_message", None): N + 1, ("execute_message", 1): N + 2,
        # execute_many after its own record commit: one more
        ("execute_many", None): N + 2, ("execute_many", 1): N + 3,
    }


def fail_second_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """The session's own step fails when call 1 starts (call 0 ran and sent its email)."""
    original = Session._start

    def start(self: Session, key: str) -> Any:
        if self._find(key).position[1] == 1:
            raise RuntimeError("injected: the session failed starting call 1")
        return original(self, key)

    monkeypatch.setattr(Session, "_start", start)


@pytest.mark.parametrize("path", PATHS)
def test_a_session_error_at_the_second_calls_start_keeps_the_first_outcome(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    store, ext = RefusingStore(0), External()
    fail_second_start(monkeypatch)
    with pytest.raises(RuntimeError, match="injected"):
        run_path(path, Session.open(store, SID, tools()), ext)
    assert len(ext.returned) == 1  # call 0 ran
    monkeypatch.undo()
    assert judge(store, ext) == []


def test_the_check_catches_a_together_path_that_drops_known_outcomes(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broken variant: a session error in a together message loses the deferred
    outcomes (no flush before the error propagates)."""
    real_flush: Callable[..., None] = Session._flush_deferred
    monkeypatch.setattr(Session, "_flush_deferred", lambda self, keys=None: None)
    store, ext = RefusingStore(0), External()
    fail_second_start(monkeypatch)
    with pytest.raises(RuntimeError, match="injected"):
        run_path("together", Session.open(store, SID, tools()), ext)
    monkeypatch.undo()
    assert Session._flush_deferred is real_flush
    problems = judge(store, ext)
    assert any("dispatched with no result" in p for p in problems), problems
