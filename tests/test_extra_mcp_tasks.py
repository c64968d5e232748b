"""MCP tasks as the reconcile source of toolledger.extra.mcp, against a real MCP server:
the ``mcp`` package's MCPServer over stdio serving 2025-11-25 tasks through its
extension and middleware mechanisms (tests/fixtures/mcp/task_server.py), its tasks
in a file so they outlive the client's connection.

The crash tests run the agent loop (tests/fixtures/mcp/mail_agent.py) in a
subprocess and SIGKILL it once the task has sent the email and ended, before the
ledger records the outcome; the resumed agent asks the task (``tasks/get``,
``tasks/result``) and sends nothing again: 1 email, the model gets the task's
result. The controls on the same server: toolledger without tasks halts for a
human, no toolledger sends the email twice. Then one test per task status, each
from a seeded task and a ledger left ``dispatched`` as a crash leaves it (on one
server process for them all), and the broken variant that reads ``working`` as
not applied, caught.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp_support import connected, run_with_server
from mcp_types import (
    ServerCapabilities,
    ServerTasksCapability,
    ServerTasksRequestsCapability,
    TasksCallCapability,
    TasksToolsCapability,
    TextContent,
    ToolExecution,
)
from mcp_types import Tool as McpTool

import toolledger.extra.mcp as mcp_extra
from checker_support import ROOT
from toolledger import AsyncSession, MemoryStore, Next, Session, SqliteStore, Tool
from toolledger.extra.mcp import (
    LedgerClientSession,
    McpCall,
    MemoryTaskBook,
    SqliteTaskBook,
    policies_from_listing,
    task_tools,
)

FIXTURES = ROOT / "tests" / "fixtures" / "mcp"
SERVER = FIXTURES / "task_server.py"
AGENT = FIXTURES / "mail_agent.py"
EMAIL = {"id": "call_0", "name": "send_email", "arguments": {"to": "ada", "body": "Q3"}}
WAIT = 60.0  # seconds: every wait is bounded (the runs take a few seconds on a busy box)
RECONCILE = {"send_email": Tool("reconcile", requires_approval=False)}


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _tasks(tmp_path: Path) -> dict[str, dict[str, Any]]:
    path = tmp_path / "tasks.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _env(tmp_path: Path, *, hang: bool = False, end: str = "completed") -> dict[str, str]:
    return dict(os.environ, MAIL_OUTBOX=str(tmp_path / "outbox.jsonl"),
                MAIL_REQUESTS=str(tmp_path / "requests.jsonl"),
                MAIL_TASKS=str(tmp_path / "tasks.json"), MAIL_HANG="1" if hang else "0",
                MAIL_TASK_STATUS=end, MAIL_SERVER_SCRIPT=str(SERVER))


def _with_server(tmp_path: Path, body: Callable[[ClientSession], Awaitable[None]], *,
                 end: str = "completed") -> None:
    run_with_server(SERVER, _env(tmp_path, end=end), body, WAIT)


# ----------------------------------------------------------------------- the live path


def test_a_task_capable_tool_goes_as_a_task_its_id_kept_and_the_model_gets_the_result(
        tmp_path: Path) -> None:
    store = MemoryStore()

    async def body(client: ClientSession) -> None:
        led = await LedgerClientSession.open(client, store, "s1")
        assert led.task_tools == {"send_email"} and isinstance(led.task_book, MemoryTaskBook)
        tool = led.policies["send_email"]
        assert isinstance(tool, Tool) and (str(tool.policy), tool.requires_approval) == (
            "reconcile", True)  # undeclared, no hints: its task is the reconcile source
        [one] = await led.call_tools([EMAIL], seen=[])
        await led.approve(one.key)
        [one] = await led.call_tools([EMAIL], seen=[])
        assert one.status.next is Next.RESULT and one.result is not None
        assert isinstance(one.result.content[0], TextContent)
        assert one.result.content[0].text == "sent to ada (#1)"
        [task_id] = _tasks(tmp_path)
        assert led.task_book is not None and led.task_book.task_of(one.key, 1) == task_id
        keys.append(one.key)

    keys: list[str] = []
    _with_server(tmp_path, body)
    [request] = _lines(tmp_path / "requests.jsonl")
    assert (request["task"], request["key"], request["attempt"]) == (True, keys[0], 1)
    assert len(_lines(tmp_path / "outbox.jsonl")) == 1


def test_a_live_time_out_on_a_running_task_leaves_the_call_at_reconcile_not_resent(
        tmp_path: Path) -> None:
    async def body(client: ClientSession) -> None:
        led = await LedgerClientSession.open(client, MemoryStore(), "s1", RECONCILE,
                                             read_timeout_seconds=0.5)
        [one] = await led.call_tools([EMAIL], seen=[])  # tasks/result times out: unknown
        assert (one.status.next, one.task_status) == (Next.RECONCILE, "working")
        [again] = await led.call_tools([EMAIL], seen=[])  # asks the task again
        assert (again.status.next, again.task_status) == (Next.RECONCILE, "working")

    _with_server(tmp_path, body, end="working")
    assert len(_lines(tmp_path / "requests.jsonl")) == 1


def test_which_tools_go_as_tasks_and_the_policies_they_default_to() -> None:
    def tool(name: str, support: str | None) -> McpTool:
        return McpTool(name=name, input_schema={"type": "object"},
                       execution=None if support is None else ToolExecution(
                           task_support=support))  # type: ignore[arg-type]

    listed = [tool("a", "optional"), tool("b", "required"), tool("c", "forbidden"),
              tool("d", None)]
    offered = ServerCapabilities(tasks=ServerTasksCapability(requests=(
        ServerTasksRequestsCapability(tools=TasksToolsCapability(call=TasksCallCapability())))))
    assert task_tools(offered, listed) == {"a", "b"}
    assert task_tools(ServerCapabilities(), listed) == set()  # no tasks capability: none
    assert task_tools(ServerCapabilities(tasks=ServerTasksCapability()), listed) == set()
    got = policies_from_listing(listed, {"b": "manual"}, task_tools={"a", "b"})
    assert got["b"] == "manual"  # the engine's declaration wins, as it is
    assert [str(t.policy) for n, t in got.items() if isinstance(t, Tool)] == [
        "reconcile", "manual", "manual"]  # a; c, d: no task, no hints: manual


def test_the_sqlite_task_book_survives_a_reopen(tmp_path: Path) -> None:
    SqliteTaskBook(tmp_path / "book").bind("tlx1-k", 2, "task-9")
    assert SqliteTaskBook(tmp_path / "book").task_of("tlx1-k", 2) == "task-9"
    assert SqliteTaskBook(tmp_path / "book").task_of("tlx1-k", 1) is None


# ---------------------------------------------------------------- killed, then resumed


def _agent(tmp_path: Path, mode: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(AGENT), mode, str(tmp_path / "ledger.sqlite3"),
         str(tmp_path / "conversation.json"), json.dumps([[EMAIL]])],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _bound(tmp_path: Path) -> bool:
    """Whether the agent's task book holds a task id (its own checkpoint)."""
    book = tmp_path / "ledger.sqlite3-mcp-tasks"
    if not book.exists():
        return False
    with closing(sqlite3.connect(book, timeout=WAIT)) as db:
        try:
            return bool(db.execute("SELECT count(*) FROM tasks").fetchone()[0])
        except sqlite3.OperationalError:  # the table is not there yet
            return False


def _killed_after_the_email(tmp_path: Path, mode: str) -> None:
    """Run the agent until the email is fsynced, its task (if any) ended and bound
    to the attempt in the agent's task book, then SIGKILL the client before it
    records the outcome."""
    proc = _agent(tmp_path, mode, _env(tmp_path, hang=True))
    deadline = time.monotonic() + WAIT
    try:
        while not _lines(tmp_path / "outbox.jsonl") or any(
                t["status"] == "working" for t in _tasks(tmp_path).values()) or (
                mode == "ledger" and not _bound(tmp_path)):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the email never left"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)  # the client, between effect and outcome commit
        proc.communicate(timeout=WAIT)
    assert proc.returncode == -signal.SIGKILL


def _resumed(tmp_path: Path, mode: str) -> tuple[int, dict[str, Any]]:
    proc = _agent(tmp_path, mode, _env(tmp_path))
    out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode in (0, 3), err
    return proc.returncode, json.loads(out.splitlines()[-1])


def test_with_tasks_a_resumed_agent_asks_the_task_and_sends_nothing_again(
        tmp_path: Path) -> None:
    _killed_after_the_email(tmp_path, "ledger")
    [email] = _lines(tmp_path / "outbox.jsonl")
    assert (tmp_path / "ledger.sqlite3-mcp-tasks").exists()  # the task id, kept beside
    code, run = _resumed(tmp_path, "ledger")
    assert code == 0 and run["halted"] == [] and run["pending"] == []
    assert _lines(tmp_path / "outbox.jsonl") == [email]  # 1 effect
    assert len(_lines(tmp_path / "requests.jsonl")) == 1  # nothing sent again
    last = run["messages"][-1]
    assert last["key"] == email["key"]
    assert last["content"]["content"][0]["text"] == "sent to ada (#1)"  # the real result
    audit = Session.open(SqliteStore(tmp_path / "ledger.sqlite3"), "conv-1").ledger.audit()
    assert "reconcile_applied" in [row.kind for row in audit]


def test_control_toolledger_without_tasks_halts_the_resumed_agent_for_a_human(
        tmp_path: Path) -> None:
    _killed_after_the_email(tmp_path, "ledger-notasks")  # a plain tools/call, no hints
    code, run = _resumed(tmp_path, "ledger-notasks")
    assert code == 3 and len(run["halted"]) == 1  # nobody can tell: a human decides
    assert len(_lines(tmp_path / "outbox.jsonl")) == 1


def test_control_without_toolledger_the_resumed_agent_sends_the_email_twice(
        tmp_path: Path) -> None:
    _killed_after_the_email(tmp_path, "control")
    code, _ = _resumed(tmp_path, "control")
    assert code == 0 and [r["to"] for r in _lines(tmp_path / "outbox.jsonl")] == ["ada", "ada"]


# -------------------------------------------------- each task status, after a crash


class _Shared:
    """One task server for the per-status tests (a process per test would cost seconds
    each): its client session runs on an event loop in a thread of its own; each
    test seeds its own task and uses its own ledger session (so its own key)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.stop = asyncio.Event()
        ready: concurrent.futures.Future[ClientSession] = concurrent.futures.Future()
        self.held = asyncio.run_coroutine_threadsafe(self._hold(ready), self.loop)
        self.client = ready.result(timeout=WAIT)

    async def _hold(self, ready: concurrent.futures.Future[ClientSession]) -> None:
        try:
            async with connected(SERVER, _env(self.root)) as client:
                ready.set_result(client)
                await self.stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

    def run(self, body: Callable[[ClientSession], Awaitable[None]]) -> None:
        asyncio.run_coroutine_threadsafe(
            asyncio.wait_for(body(self.client), WAIT), self.loop).result(timeout=WAIT + 5)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.held.result(timeout=WAIT)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=WAIT)
        self.loop.close()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Shared]:
    server = _Shared(tmp_path_factory.mktemp("tasks"))
    yield server
    server.close()


def _crashed_after_dispatch(store: MemoryStore, session_id: str) -> str:
    """The ledger as a crash after ``dispatched`` leaves it; the call's key."""
    session = Session.open(store, session_id, RECONCILE)
    [st] = session.record([EMAIL], seen=[])
    with pytest.raises(KeyboardInterrupt), session.dispatch(st.key):
        raise KeyboardInterrupt  # the process goes away: nothing recorded
    return st.key


def _resume_with(shared: _Shared, task: dict[str, Any] | None, *, bound: bool = True,
                 twice: bool = False) -> tuple[McpCall, list[dict[str, Any]]]:
    """Resume a call whose attempt 1 is bound to the seeded task ``task`` (``None``: the
    server does not know it; ``bound=False``: no id was recorded); what the resumed
    call_tools returns, and the requests it sent."""
    store, session_id = MemoryStore(), f"s-{uuid.uuid4()}"
    key = _crashed_after_dispatch(store, session_id)
    book, task_id = MemoryTaskBook(), f"task-{uuid.uuid4()}"
    if bound:
        book.bind(key, 1, task_id)
    if task is not None:
        path = shared.root / "tasks.json"
        seeded = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps({**seeded, task_id: task}))
    got: list[McpCall] = []

    async def body(client: ClientSession) -> None:
        ledger = await AsyncSession.open(store, session_id, RECONCILE)
        led = LedgerClientSession(client, ledger, RECONCILE, task_tools={"send_email"},
                                  task_book=book)
        [one] = await led.call_tools([EMAIL], seen=[])
        if twice:  # still pending: asking again writes nothing
            commits = store.ledger_commits
            [again] = await led.call_tools([EMAIL], seen=[])
            assert again.status.next is one.status.next and store.ledger_commits == commits
        got.append(one)

    shared.run(body)
    return got[0], [r for r in _lines(shared.root / "requests.jsonl") if r["key"] == key]


def _text(text: str, *, error: bool = False) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": error}


def test_completed_is_applied_with_the_tasks_result_and_nothing_is_sent(shared: _Shared
                                                                       ) -> None:
    one, sent = _resume_with(shared, {"status": "completed",
                                      "result": _text("sent to ada (#7)")})
    assert one.status.next is Next.RESULT and sent == [] and one.result is not None
    assert not one.result.is_error and _first_text(one) == "sent to ada (#7)"


def test_failed_with_a_tool_error_is_the_tools_answer_and_nothing_is_sent(shared: _Shared
                                                                         ) -> None:
    one, sent = _resume_with(shared, {"status": "failed",
                                      "result": _text("mailbox full", error=True)})
    assert one.status.next is Next.RESULT and sent == [] and one.result is not None
    assert one.result.is_error and _first_text(one) == "mailbox full"


def test_failed_with_a_refused_request_is_not_applied_and_retried_under_the_same_key(
        shared: _Shared) -> None:
    one, sent = _resume_with(shared, {"status": "failed",
                                      "error": {"code": -32602, "message": "bad params"}})
    assert one.status.next is Next.RESULT and one.status.attempt == 2
    assert [(r["attempt"], r["task"]) for r in sent] == [(2, True)]  # same key, attempt 2
    assert _first_text(one).startswith("sent to ada")


@pytest.mark.parametrize(("task", "bound", "why"), [
    ({"status": "failed", "error": {"code": -32603, "message": "boom"}}, True, "-32603"),
    ({"status": "cancelled"}, True, "cancelled"),
    (None, True, "Task not found"),  # the server forgot it (a ttl may end any task)
    (None, False, "no task id was recorded"),  # killed before the CreateTaskResult was kept
])
def test_what_nobody_can_tell_halts_for_a_human_and_nothing_is_sent(
        shared: _Shared, task: dict[str, Any] | None, bound: bool, why: str) -> None:
    one, sent = _resume_with(shared, task, bound=bound)
    assert one.status.next is Next.HALTED and sent == []
    assert one.task_note is not None and why in one.task_note


@pytest.mark.parametrize("status", ["working", "input_required"])
def test_a_task_still_running_stays_unknown_nothing_written_nothing_sent(
        shared: _Shared, status: str) -> None:
    one, sent = _resume_with(shared, {"status": status}, twice=True)
    assert one.status.next is Next.RECONCILE and one.task_status == status and sent == []


def test_the_broken_variant_reading_working_as_not_applied_is_caught(
        shared: _Shared, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above, on a drop-in that takes ``working`` for a definite "not applied":
    it re-sends the call whose task is still running (the effect may land twice)."""
    real = mcp_extra.task_answer
    monkeypatch.setattr(mcp_extra, "task_answer",
                        lambda s: "not_applied" if s == "working" else real(s))
    one, sent = _resume_with(shared, {"status": "working"})
    assert len(sent) == 1 and one.status.attempt == 2  # the still-working call, sent again
    assert not (one.status.next is Next.RECONCILE and sent == [])  # the check fails on it


def test_a_refusal_from_tasks_result_counts_only_while_the_task_is_still_there(
        shared: _Shared) -> None:
    async def body(client: ClientSession) -> None:
        ledger = await AsyncSession.open(MemoryStore(), "s1", RECONCILE)
        led = LedgerClientSession(client, ledger, RECONCILE, task_tools={"send_email"},
                                  task_book=MemoryTaskBook())
        answer = await led._payload("no-such-task")  # -32602 on a task that is gone
        assert type(answer).__name__ == "CannotTell"

    shared.run(body)


def _first_text(one: McpCall) -> str:
    assert one.result is not None and isinstance(one.result.content[0], TextContent)
    return one.result.content[0].text
