"""An engine with openworker's seams adopts toolledger in <= 80 lines of glue.

Under test: :class:`toolledger.kit.toyworker.ToyWorker` (the engine, no
toolledger in it) and :class:`toolledger.kit.toyworker_glue.LedgerWorker`
(the glue).  The glue's lines are counted and scanned for spec names; the
crash matrix kills the adopted engine at every point (the engine's save
points and, inside the tool, before and after its effect), restarts it from
the files, lets a human answer whatever the inbox shows, and checks the email
went out exactly once with one tool message.  The same matrix on the engine
without the glue finds issue #443's duplicate: the matrix can fail.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import toolledger._core.protocol
from checker_support import ROOT
from toolledger import NotApplied, Outcome, Tool
from toolledger.kit.toyworker import CRASH_POINTS, ToyWorker
from toolledger.kit.toyworker_glue import LedgerWorker

GLUE = ROOT / "reference" / "toolledger" / "kit" / "toyworker_glue.py"
TOOL_POINTS = ("before_effect", "after_effect")
SID = "s1"


class Crash(BaseException):
    """The process dies here."""


def glue_lines() -> list[str]:
    code = GLUE.read_text().split("# glue:begin\n", 1)[1].split("# glue:end", 1)[0]
    return [line for line in code.splitlines() if line.strip()
            and not line.strip().startswith("#")]


def spec_names_in(code: str) -> list[str]:
    names = [a.value for a in toolledger._core.protocol.Action] + ["Stage", "Event", "Ledger"]
    return [name for name in names if re.search(rf"\b{name}\b", code)]


def test_the_glue_is_at_most_80_lines_and_names_no_spec_event() -> None:
    lines = glue_lines()
    assert 20 < len(lines) <= 80, len(lines)
    assert spec_names_in(GLUE.read_text()) == []
    # the scan sees glue that narrates the spec
    assert spec_names_in("ledger.step(Event(Action.ExternalApply, pos))") == [
        "ExternalApply", "Event"]


class World:
    """The email server (it survives every crash) and a scripted model."""

    def __init__(self, crash_at: str | None) -> None:
        self.outbox: list[str] = []
        self.keys: set[str] = set()
        self.crash_at, self.crashed = crash_at, False

    def crash(self, point: str) -> None:
        if point == self.crash_at and not self.crashed:
            self.crashed = True
            raise Crash(point)

    def send_email(self, to: str, idempotency_key: str | None = None) -> str:
        self.crash("before_effect")
        if idempotency_key is None or idempotency_key not in self.keys:
            self.outbox.append(to)  # the server deduplicates on the key it is given
        if idempotency_key is not None:
            self.keys.add(idempotency_key)
        self.crash("after_effect")  # the email is out; the engine never hears back
        return f"sent to {to}"

    @staticmethod
    def provider(messages: list[dict[str, Any]]) -> dict[str, Any]:
        if messages[-1]["role"] == "user":
            call = {"id": "call_0", "function": {"name": "send_email",
                                                 "arguments": json.dumps({"to": "ada"})}}
            return {"content": "", "tool_calls": [call]}
        return {"content": "Sent."}


def engine_factory(kind: type[ToyWorker], base: Path, world: World,
                   **extra: Any) -> Callable[[], ToyWorker]:
    if kind is LedgerWorker:
        extra.setdefault("tools", {"send_email": "manual"})

    def engine() -> ToyWorker:
        return kind(base, SID, {"send_email": world.send_email}, world.provider,
                    approval={"send_email": True}, crash=world.crash, **extra)

    return engine


def human(world: World, item: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A human answers an inbox item, looking at the outside world for a halted one."""
    if item.get("kind", "await_approval") == "await_approval":
        return "allow", {}
    if world.outbox:
        return "applied", {"result": "ada has it (checked the outbox)"}
    return "retry", {}


def drive(kind: type[ToyWorker], base: Path, crash_at: str | None,
          **extra: Any) -> tuple[World, ToyWorker]:
    """One turn to its end through crashes, restarts and the human's inbox answers."""
    world = World(crash_at)
    engine = engine_factory(kind, base, world, **extra)
    started = False
    for _ in range(12):
        e = engine()  # a (re)started process: everything from the files
        try:
            if not started:
                started = True
                e.run("email ada")
            elif e.inbox.pending():
                key, item = next(iter(e.inbox.pending().items()))
                answer, extra = human(world, item)
                e.resolve_inbox(key, answer, **extra)
            else:
                e.resume()
        except Crash:
            continue
        if not e.inbox.pending() and e.messages[-1].get("content") == "Sent.":
            return world, e
    raise AssertionError(f"the turn did not end: {e.messages}, inbox {e.inbox.items}")


@pytest.mark.parametrize("crash_at", [None, *CRASH_POINTS, *TOOL_POINTS])
def test_the_adopted_engine_sends_once_at_every_crash_point(
    tmp_path: Path, crash_at: str | None
) -> None:
    world, e = drive(LedgerWorker, tmp_path, crash_at)
    assert world.outbox == ["ada"]
    assert crash_at is None or world.crashed
    [tool] = [m for m in e.messages if m["role"] == "tool"]
    expected = "human" if crash_at == "after_effect" else "ok"  # the human said "applied"
    assert tool["status"] == expected
    halted = [k for k, i in e.inbox.items.items() if i.get("kind") == "halted"]
    assert len(halted) == (crash_at in TOOL_POINTS)  # a human was asked only when unknown


@pytest.mark.parametrize("crash_at", [*CRASH_POINTS, *TOOL_POINTS])
def test_an_idempotent_tool_is_retried_with_its_key_and_no_human(
    tmp_path: Path, crash_at: str
) -> None:
    world, e = drive(LedgerWorker, tmp_path, crash_at, tools={"send_email": "idempotent"})
    assert world.outbox == ["ada"] and world.crashed
    assert len(world.keys) == 1  # every attempt carried the same key
    [tool] = [m for m in e.messages if m["role"] == "tool"]
    assert tool["status"] == "ok"
    assert [i["kind"] for i in e.inbox.items.values()] == ["await_approval"]  # no halt


def test_the_idempotent_matrix_catches_glue_that_drops_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # broken on purpose: the tool is run without its key, so the retry sends again
    real = World.send_email
    monkeypatch.setattr(World, "send_email",
                        lambda self, to, idempotency_key=None: real(self, to))
    world, _ = drive(LedgerWorker, tmp_path, "after_effect", tools={"send_email": "idempotent"})
    assert world.outbox == ["ada", "ada"]


def test_the_matrix_catches_the_engine_without_the_glue(tmp_path: Path) -> None:
    for name in ("calm", "crash"):
        (tmp_path / name).mkdir()
    world, _ = drive(ToyWorker, tmp_path / "calm", None)
    assert world.outbox == ["ada"]
    world, _ = drive(ToyWorker, tmp_path / "crash", "after_effect")
    assert world.outbox == ["ada", "ada"]  # issue #443: resumed, re-run, sent twice


def test_a_reused_call_id_never_finds_another_calls_approval(tmp_path: Path) -> None:
    # Gemini numbers every turn's calls call_0: openworker's inbox key finds the
    # first turn's resolved "allow" and sends the second email unasked.
    for kind, asked in ((ToyWorker, False), (LedgerWorker, True)):
        base = tmp_path / kind.__name__
        base.mkdir()
        world, e = drive(kind, base, None)
        assert e.run("email ada again") == ("waiting" if asked else "done")
        assert world.outbox == (["ada"] if asked else ["ada", "ada"])


def test_an_ordinary_tool_error_is_an_error_message_not_a_halt(tmp_path: Path) -> None:
    def write_file(path: str) -> str:
        raise FileNotFoundError(f"no such directory: {path}")

    def provider(messages: list[dict[str, Any]]) -> dict[str, Any]:
        if messages[-1]["role"] == "user":
            call = {"id": "c", "function": {"name": "write_file",
                                            "arguments": json.dumps({"path": "/nope/x"})}}
            return {"content": "", "tool_calls": [call]}
        return {"content": "Could not write it."}

    def not_applied(exc: Exception, sent: bool) -> Outcome | None:
        return Outcome.NOT_APPLIED if isinstance(exc, (FileNotFoundError, NotApplied)) else None

    e = LedgerWorker(tmp_path, SID, {"write_file": write_file}, provider,
                     approval={"write_file": False},
                     tools={"write_file": Tool(requires_approval=False, classify=not_applied)})
    assert e.run("write it") == "done"
    [tool] = [m for m in e.messages if m["role"] == "tool"]
    assert tool["status"] == "error" and "FileNotFoundError" in tool["content"]
    assert e.session.halted() == [] and e.inbox.items == {}
