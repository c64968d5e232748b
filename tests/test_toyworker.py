"""An engine as awkward as openworker adopts toolledger in <= 80 lines of glue.

Under test: :class:`toolledger.kit.toyworker.ToyWorker` (the engine, no
toolledger in it: per-call approval, no sequence number, compaction, reused
and empty provider ids, checkpoint-only saves, grants, Stop, concurrent
low-risk calls, a whole-thread answered set) and
:class:`toolledger.kit.toyworker_glue.LedgerWorker` (the glue).  The glue's
lines are counted and scanned for spec names; the crash matrix kills the
adopted engine at every point (the engine's points and, inside the tool,
before and after its effect), restarts it from the files, lets a human answer
whatever the inbox shows and checks each email went out exactly once.  Every
scenario runs on the engine without the glue too, which sends an email twice
(issue #443): the scenarios can fail.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import toolledger._core.protocol
from checker_support import ROOT
from toolledger import NotApplied, Outcome, Tool
from toolledger.kit.toyworker import CRASH_POINTS, PermissionRequest, ToyWorker
from toolledger.kit.toyworker_glue import LedgerWorker

GLUE = ROOT / "reference" / "toolledger" / "kit" / "toyworker_glue.py"
TOOL_POINTS = ("before_effect", "after_effect")
SID = "s1"


class Crash(BaseException):
    """The process dies here (a SIGKILL: no ``finally`` saves anything)."""


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


# -- the world -------------------------------------------------------------------------

def call(name: str, cid: str = "call_0", **args: Any) -> dict[str, Any]:
    return {"id": cid, "function": {"name": name, "arguments": json.dumps(args)}}


class World:
    """The email server (it survives every crash), a scripted model, the user."""

    def __init__(self, crash_at: str | None = None, *, turns: int = 1) -> None:
        self.outbox: list[str] = []
        self.keys: set[str] = set()
        self.threads: set[str] = set()
        self.crash_at, self.crashes, self.crash_turn = crash_at, 0, turns
        self.script: Callable[[int], list[dict[str, Any]]] = (
            lambda turn: [call("send_email", to="ada")])
        self.engine: ToyWorker | None = None
        self.stop_once = False
        self.lock = threading.Lock()
        self.mark = 0  # the outbox's length when the current turn began

    def crash(self, point: str) -> None:
        with self.lock:  # tools run in the engine's thread pool too: one crash only
            if point != self.crash_at or self.crashes or self.turn() != self.crash_turn:
                return
            self.crashes += 1
        raise Crash(point)

    def turn(self) -> int:
        return 0 if self.engine is None else sum(
            m["role"] == "user" for m in self.engine.messages)

    def send_email(self, to: str, idempotency_key: str | None = None) -> dict[str, Any]:
        self.crash("before_effect")
        if idempotency_key is None or idempotency_key not in self.keys:
            self.outbox.append(to)  # the server deduplicates on the key it is given
        if idempotency_key is not None:
            self.keys.add(idempotency_key)
        self.threads.add(threading.current_thread().name)
        self.crash("after_effect")  # the email is out; the engine never hears back
        return {"sent": to, "_display": f"<b>sent to {to}</b>"}

    def lookup(self, q: str) -> dict[str, Any]:
        self.threads.add(threading.current_thread().name)
        if self.stop_once and self.engine is not None:
            self.stop_once = False
            self.engine.stop()  # the user presses Stop while this runs
        return {"found": q}

    def provider(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        if messages[-1]["role"] == "user":
            turn = sum(m["role"] == "user" for m in messages)
            return {"content": "", "tool_calls": self.script(turn)}
        return {"content": "Sent."}


TOOLS: dict[str, Tool | str] = {"send_email": "manual", "lookup": "readonly"}


def factory(kind: type[ToyWorker], base: Path, world: World, *,
            tools: dict[str, Tool | str] | None = None, approval: bool = True,
            **extra: Any) -> Callable[[], ToyWorker]:
    if kind is LedgerWorker:
        extra["tools"] = {**TOOLS, **(tools or {})}

    def engine() -> ToyWorker:
        e = kind(base, SID, {"send_email": world.send_email, "lookup": world.lookup},
                 world.provider, approval={"send_email": approval, "lookup": False},
                 crash=world.crash, **{"risk": {"lookup": "low"}, **extra})
        world.engine = e
        return e

    return engine


def human(world: World, item: dict[str, Any], answers: dict[str, str]) -> tuple[str, Any]:
    """A human answers an inbox item, looking at the outside world for a recovery one."""
    if item["kind"] == "approval":
        return answers.get(item["data"]["arguments"].get("to", ""), "allow"), {}
    if item["data"]["arguments"]["to"] in world.outbox[world.mark:]:  # since the turn began
        return "applied", {"result": "ada has it (checked the outbox)"}
    return "retry", {}


def drive(engine: Callable[[], ToyWorker], world: World, text: str = "email ada",
          answers: dict[str, str] | None = None) -> ToyWorker:
    """One turn to its end through crashes, restarts and the human's inbox answers."""
    started = False
    for _ in range(16):
        e = engine()  # a (re)started process: everything from the files
        try:
            if not started:
                started, world.mark = True, len(world.outbox)
                e.run(text)
            elif e.inbox.pending():
                key, item = next(iter(e.inbox.pending().items()))
                answer, extra = human(world, item, answers or {})
                e.resolve_inbox(key, answer, **extra)
            else:
                e.resume()
        except Crash:
            continue
        last = engine().messages[-1]
        if not e.inbox.pending() and last["role"] == "assistant" and not last.get("tool_calls"):
            return e
    raise AssertionError(f"the turn did not end: {e.messages}, inbox {e.inbox.items}")


def tool_messages(e: ToyWorker) -> list[dict[str, Any]]:
    return [m for m in e.messages if m["role"] == "tool"]


# -- the crash matrix --------------------------------------------------------------------

POINTS = [None, *CRASH_POINTS, *TOOL_POINTS]


@pytest.mark.parametrize("approval", [True, False], ids=["approved", "no-approval"])
@pytest.mark.parametrize("crash_at", POINTS)
def test_the_adopted_engine_sends_once_at_every_crash_point(
    tmp_path: Path, crash_at: str | None, approval: bool
) -> None:
    world = World(crash_at)
    tools: dict[str, Tool | str] | None = (
        None if approval else {"send_email": Tool(requires_approval=False)})
    e = drive(factory(LedgerWorker, tmp_path, world, tools=tools, approval=approval), world)
    assert world.outbox == ["ada"]
    assert crash_at is None or world.crashes or (crash_at == "after_permission_saved"
                                                 and not approval)
    [tool] = tool_messages(e)
    assert "sent" in tool["content"] or "ada has it" in tool["content"]
    assert "_display" not in tool["content"]  # display-only: never in the conversation
    recovery = [i for i in e.inbox.items if i["kind"] == "recovery"]
    assert len(recovery) == (crash_at in TOOL_POINTS)  # a human was asked only when unknown


@pytest.mark.parametrize("crash_at", POINTS)
def test_the_live_approval_path_sends_once_at_every_crash_point(
    tmp_path: Path, crash_at: str | None
) -> None:
    # a human answers while the turn waits (openworker's live WebSocket path): no
    # inbox item for the approval; after a crash only the recovery item shows
    asked: list[str] = []

    def live(request: PermissionRequest) -> str:
        asked.append(request.tool_call_id)
        return "allow"

    lost = crash_at in ("after_effect", "after_result", "before_iteration_saved")
    for kind, emails in ((ToyWorker, 2 if lost else 1),  # #443 on the live path too
                         (LedgerWorker, 1)):
        world = World(crash_at)
        base = tmp_path / kind.__name__
        base.mkdir()
        e = drive(factory(kind, base, world, approver=live), world)
        assert len(world.outbox) == emails, kind
        if kind is LedgerWorker:
            assert [i["kind"] for i in e.inbox.items] == ["recovery"] * (crash_at in TOOL_POINTS)
            assert asked[-1] == "call_0"


@pytest.mark.parametrize("crash_at", ["after_effect", "after_result", "before_iteration_saved"])
def test_the_engine_without_the_glue_sends_twice(tmp_path: Path, crash_at: str) -> None:
    world = World(crash_at)
    drive(factory(ToyWorker, tmp_path, world), world)
    assert world.outbox == ["ada", "ada"]  # issue #443: resumed, re-authorized, re-run


def test_a_lost_response_is_replaced_without_a_dead_end(tmp_path: Path) -> None:
    # no approval: nothing saves the response before the iteration ends; the re-run
    # model emits the call under a new id; the ledger knows it is the same call
    for kind, emails in ((ToyWorker, 2), (LedgerWorker, 1)):
        world = World("after_effect")

        def reemitted(turn: int, w: World = world) -> list[dict[str, Any]]:
            return [call("send_email", f"call_{w.crashes}", to="ada")]  # a new id after it

        world.script = reemitted
        base = tmp_path / kind.__name__
        base.mkdir()
        drive(factory(kind, base, world, approval=False,
                      tools={"send_email": Tool(requires_approval=False)}), world)
        assert world.crashes == 1 and world.outbox == ["ada"] * emails


@pytest.mark.parametrize("crash_at", [*CRASH_POINTS, *TOOL_POINTS])
def test_an_idempotent_tool_is_retried_with_its_key_and_no_human(
    tmp_path: Path, crash_at: str
) -> None:
    world = World(crash_at)
    e = drive(factory(LedgerWorker, tmp_path, world, tools={"send_email": "idempotent"}),
              world)
    assert world.outbox == ["ada"] and world.crashes
    assert len(world.keys) == 1  # every attempt carried the same key
    assert [i["kind"] for i in e.inbox.items] == ["approval"]  # no recovery item


def test_the_idempotent_matrix_catches_glue_that_drops_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = World.send_email  # broken on purpose: the retry goes without its key
    monkeypatch.setattr(World, "send_email",
                        lambda self, to, idempotency_key=None: real(self, to))
    world = World("after_effect")
    drive(factory(LedgerWorker, tmp_path, world, tools={"send_email": "idempotent"}), world)
    assert world.outbox == ["ada", "ada"]


# -- reused ids, trimming, several calls ------------------------------------------------

@pytest.mark.parametrize("crash_at", POINTS)
@pytest.mark.parametrize("compact", [None, 2], ids=["whole", "compacted"])
def test_a_reused_call_0_on_the_next_turn_is_a_new_call(
    tmp_path: Path, crash_at: str | None, compact: int | None
) -> None:
    # Gemini numbers every turn's calls call_0; compaction drops old messages, so
    # list positions move: the second email is asked for and sent, once, whatever
    # the second turn's crash
    kinds = (ToyWorker, LedgerWorker) if crash_at in (None, "after_effect") else (LedgerWorker,)
    for kind in kinds:
        world = World(crash_at, turns=2)
        base = tmp_path / kind.__name__
        base.mkdir()
        engine = factory(kind, base, world, compact_after=compact, keep=1)
        drive(engine, world)
        e = drive(engine, world, "email ada again")
        asked = [i for i in e.inbox.items if i["kind"] == "approval"]
        if kind is ToyWorker:  # the old "allow" answered the second call unasked
            assert len(asked) == 1 and len(world.outbox) == 2
            continue
        assert world.outbox == ["ada", "ada"] and len(asked) == 2
        assert len(tool_messages(e)) == (2 if compact is None else 1)
        if compact is not None:
            assert e.messages[0]["role"] == "system"  # it did compact


def test_glue_that_keeps_the_whole_thread_answered_set_loses_a_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # broken on purpose: turn 1's call_0 result "answers" turn 2's call_0, so the
    # resume skips it; the call never gets its tool message, and the next turn's call_0
    # is placed as a re-record of it
    monkeypatch.setattr(LedgerWorker, "unanswered", ToyWorker.unanswered)
    world = World("before_iteration_saved", turns=2)
    engine = factory(LedgerWorker, tmp_path, world)
    drive(engine, world)
    e = drive(engine, world, "email ada again")
    assert len(tool_messages(e)) == 1  # turn 2's call has no result in the conversation
    drive(engine, world, "email ada once more")
    assert world.outbox == ["ada", "ada"]  # turn 3's call was taken for turn 2's: not sent


def test_compaction_that_drops_the_keys_aliases_the_new_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # broken on purpose: the summary keeps no key, so the ledger cannot tell the new
    # call_0 from a resume of the old one and gives it the old result (not sent)
    monkeypatch.setattr(LedgerWorker, "summarise", ToyWorker.summarise)
    world = World(None)
    engine = factory(LedgerWorker, tmp_path, world, compact_after=2, keep=1)
    drive(engine, world)
    drive(engine, world, "email ada again")
    assert world.outbox == ["ada"]


@pytest.mark.parametrize("crash_at", [None, "after_effect", "before_iteration_saved"])
def test_per_call_approval_with_empty_ids_never_shares_an_approval(
    tmp_path: Path, crash_at: str | None
) -> None:
    # one response, two calls with the id "" (an OpenAI stream): ada's is approved,
    # bob's rejected; the inbox keyed by (session, "") gives bob's call ada's "allow"
    for kind, sent in ((ToyWorker, ["ada", "bob"]), (LedgerWorker, ["ada"])):
        world = World(crash_at)
        world.script = lambda turn: [call("send_email", "", to="ada"),
                                     call("send_email", "", to="bob")]
        base = tmp_path / kind.__name__
        base.mkdir()
        e = drive(factory(kind, base, world), world, answers={"bob": "deny"})
        assert sorted(set(world.outbox)) == sent, kind
        if kind is LedgerWorker:
            assert world.outbox == ["ada"]
            assert len([i for i in e.inbox.items if i["kind"] == "approval"]) == 2


def test_each_of_two_equal_calls_is_asked_for(tmp_path: Path) -> None:
    world = World()
    world.script = lambda turn: [call("send_email", "", to="ada")] * 2
    answers = iter(["allow", "deny"])
    e = factory(LedgerWorker, tmp_path, world)()
    assert e.run("email ada") == "waiting"
    for _ in range(2):
        e = factory(LedgerWorker, tmp_path, world)()
        [item] = e.inbox.pending().values()
        e.resolve_inbox(item["id"], next(answers))
    assert world.outbox == ["ada"]  # one approval, one email
    assert [json.loads(m["content"]).get("sent") for m in tool_messages(e)] == ["ada", None]


def test_concurrent_low_risk_calls_run_in_threads_and_crash_safely(tmp_path: Path) -> None:
    world = World("after_effect")
    world.script = lambda turn: [call("lookup", "a", q="x"), call("lookup", "b", q="y"),
                                 call("send_email", "c", to="ada")]
    e = drive(factory(LedgerWorker, tmp_path, world), world)
    assert world.outbox == ["ada"]
    assert any(t != threading.main_thread().name for t in world.threads)
    assert sorted(m["tool_call_id"] for m in tool_messages(e)) == ["a", "b", "c"]


def test_concurrent_protected_calls_crash_and_each_email_goes_once(tmp_path: Path) -> None:
    # two low-risk sends that need no approval run in the thread pool; the process
    # dies after one of them sent, while the other completes
    for kind, emails in ((ToyWorker, 4), (LedgerWorker, 2)):
        world = World("after_effect")
        world.script = lambda turn: [call("send_email", "call_0", to="ada"),
                                     call("send_email", "call_1", to="bob")]
        base = tmp_path / kind.__name__
        base.mkdir()
        e = drive(factory(kind, base, world, approval=False, risk={"send_email": "low"},
                          tools={"send_email": Tool(policy="idempotent",
                                                    requires_approval=False)}), world)
        assert world.crashes == 1 and len(world.outbox) == emails, kind
        assert threading.main_thread().name not in world.threads  # both ran in the pool
        if kind is LedgerWorker:
            assert sorted(world.outbox) == ["ada", "bob"] and len(world.keys) == 2
            assert sorted(m["tool_call_id"] for m in tool_messages(e)) == ["call_0", "call_1"]


def test_interactive_malformed_and_unknown_calls_bypass_approval(tmp_path: Path) -> None:
    world = World()
    bad = {"id": "m", "function": {"name": "send_email", "arguments": "{not json"}}
    world.script = lambda turn: [call("ask_user", "q", question="who?"), bad,
                                 call("delete_repo", "u", repo="x"),
                                 call("send_email", "s", to="ada")]
    # delete_repo is declared to the ledger but no tool of the registry: unknown
    e = drive(factory(LedgerWorker, tmp_path, world, tools={"delete_repo": "manual"}), world)
    assert world.outbox == ["ada"]
    assert [i["kind"] for i in e.inbox.items] == ["approval"]  # only the real call asked
    assert [m["status"] for m in tool_messages(e)] == ["ok", "error", "error", "ok"]
    assert isinstance(e, LedgerWorker)
    [row] = e.session.ledger.state.calls
    assert row.tool_call_id == "s"  # the ledger holds the one call it protects


# -- grants, modes, Stop ----------------------------------------------------------------

def test_a_grant_allows_without_the_inbox_and_never_resends(tmp_path: Path) -> None:
    # "always" on turn 1 grants send_email; turn 2's call is allowed unasked, and the
    # process dies after its email: on resume the grant would allow it again
    for kind, emails in ((ToyWorker, 3), (LedgerWorker, 2)):
        world = World("after_effect", turns=2)
        base = tmp_path / kind.__name__
        base.mkdir()
        engine = factory(kind, base, world)
        drive(engine, world, answers={"ada": "always"})
        e = drive(engine, world, "email ada again")
        assert len(world.outbox) == emails, kind
        assert len([i for i in e.inbox.items if i["kind"] == "approval"]) == 1


def test_auto_mode_runs_unasked_and_a_restart_halts_the_unknown(tmp_path: Path) -> None:
    world = World("after_effect")
    e = drive(factory(LedgerWorker, tmp_path, world, mode="auto"), world)
    assert world.outbox == ["ada"]
    assert [i["kind"] for i in e.inbox.items] == ["recovery"]


@pytest.mark.parametrize("crash_at", [None, "before_iteration_saved"])
def test_stop_mid_turn_is_never_undone_by_a_resume(tmp_path: Path, crash_at: str | None) -> None:
    # the approved email waits behind a lookup; the user presses Stop while it runs
    for kind, emails in ((ToyWorker, 1 if crash_at else 0), (LedgerWorker, 0)):
        world = World(crash_at)
        world.script = lambda turn: [call("lookup", "a", q="x"), call("send_email", "b", to="ada")]
        base = tmp_path / kind.__name__
        base.mkdir()
        engine = factory(kind, base, world)
        assert engine().run("email ada") == "waiting"
        world.stop_once = True
        e = engine()
        try:
            assert e.resolve_inbox(next(iter(e.inbox.pending())), "allow") == "cancelled"
        except Crash:
            engine().resume()
        assert len(world.outbox) == emails, kind
        if kind is LedgerWorker:
            e = engine()
            assert isinstance(e, LedgerWorker)
            assert "cancelled" in tool_messages(e)[-1]["content"]  # the ledger's cancel
            assert e.session.halted() == [] and not e.inbox.pending()


# -- legacy adoption ----------------------------------------------------------------------

def test_a_session_begun_before_the_ledger_is_adopted_without_a_replay(tmp_path: Path) -> None:
    # the old engine approved call_0 and died after the email; no ledger file exists
    world = World("after_effect")
    old = factory(ToyWorker, tmp_path, world)
    assert old().run("email ada") == "waiting"
    e = old()
    with pytest.raises(Crash):
        e.resolve_inbox(next(iter(e.inbox.pending())), "allow")
    assert world.outbox == ["ada"]
    assert not (tmp_path / "ledger.sqlite3").exists()
    new = factory(LedgerWorker, tmp_path, world)
    e = new()
    assert e.resume() == "waiting"  # halted for a human, never replayed
    [item] = e.inbox.pending().values()
    assert item["kind"] == "recovery"
    e.resolve_inbox(item["id"], "applied", result="ada has it")
    assert world.outbox == ["ada"]
    # later calls use the same identity scheme: a reused call_0 is a new call, asked for
    e = drive(new, world, "email ada again")
    assert world.outbox == ["ada", "ada"]
    assert len(tool_messages(e)) == 2


def test_legacy_control_the_old_engine_resumed_sends_twice(tmp_path: Path) -> None:
    world = World("after_effect")
    old = factory(ToyWorker, tmp_path, world)
    old().run("email ada")
    e = old()
    with pytest.raises(Crash):
        e.resolve_inbox(next(iter(e.inbox.pending())), "allow")
    old().resume()
    assert world.outbox == ["ada", "ada"]


def test_an_ordinary_tool_error_is_an_error_message_not_a_halt(tmp_path: Path) -> None:
    def write_file(path: str) -> str:
        raise FileNotFoundError(f"no such directory: {path}")

    def provider(messages: list[dict[str, Any]]) -> dict[str, Any]:
        if messages[-1]["role"] == "user":
            return {"content": "", "tool_calls": [call("write_file", "c", path="/nope/x")]}
        return {"content": "Could not write it."}

    def not_applied(exc: Exception, sent: bool) -> Outcome | None:
        return Outcome.NOT_APPLIED if isinstance(exc, (FileNotFoundError, NotApplied)) else None

    e = LedgerWorker(tmp_path, SID, {"write_file": write_file}, provider,
                     approval={"write_file": False},
                     tools={"write_file": Tool(requires_approval=False, classify=not_applied)})
    assert e.run("write it") == "done"
    [tool] = tool_messages(e)
    assert tool["status"] == "error" and "FileNotFoundError" in tool["content"]
    assert e.session.halted() == [] and e.inbox.items == []
