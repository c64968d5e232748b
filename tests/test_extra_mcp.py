"""toolledger.extra.mcp against a real MCP server: the ``mcp`` package's MCPServer over
stdio (tests/fixtures/mcp/mail_server.py), whose tool appends an "email" to an fsynced
outbox. The crash tests run the agent loop (tests/fixtures/mcp/mail_agent.py) in a
subprocess and SIGKILL it once the server's email is on disk, before the ledger
records the outcome; then they resume it the way an agent does (run the same call
again): 2 emails without toolledger, 1 with it. Also checked here: the execution
id reaches the server in ``_meta``, reused call ids across two responses, two calls
in one response, the policies the annotations give, and the docs/frameworks.md
example (its MCP block).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp_support import run_with_server, server_params
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from mcp_types.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS

from checker_support import ROOT
from toolledger import MemoryStore, Next, Outcome, Session, SqliteStore, Tool
from toolledger.extra.mcp import (
    IDEMPOTENCY_META,
    LedgerClientSession,
    policies_from_listing,
    policy_from_annotations,
)

FIXTURES = ROOT / "tests" / "fixtures" / "mcp"
SERVER = FIXTURES / "mail_server.py"
AGENT = FIXTURES / "mail_agent.py"
EMAIL = {"id": "call_0", "name": "send_email", "arguments": {"to": "ada", "body": "Q3"}}
WAIT = 60.0  # seconds: every wait is bounded (the runs take a few seconds on a busy box)


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _env(tmp_path: Path, *, dedupe: bool, hang: bool = False) -> dict[str, str]:
    env = dict(os.environ, MAIL_OUTBOX=str(tmp_path / "outbox.jsonl"),
               MAIL_REQUESTS=str(tmp_path / "requests.jsonl"),
               MAIL_DEDUPE="1" if dedupe else "0", MAIL_HANG="1" if hang else "0")
    return env


# ------------------------------------------------------------------ in-process sessions


def _with_server(tmp_path: Path, *, dedupe: bool,
                 body: Callable[[ClientSession], Awaitable[None]]) -> None:
    run_with_server(SERVER, _env(tmp_path, dedupe=dedupe), body, WAIT)


def test_the_execution_id_reaches_the_server_in_meta_and_a_rerun_sends_nothing(
        tmp_path: Path) -> None:
    store = MemoryStore()

    async def body(client: ClientSession) -> None:
        led = await LedgerClientSession.open(client, store, "s1",
                                             {"send_email": Tool("manual",
                                                                 requires_approval=False)})
        [one] = await led.call_tools([EMAIL], seen=[])
        assert one.status.next is Next.RESULT and one.result is not None
        assert not one.result.is_error
        assert isinstance(one.result.content[0], TextContent)
        assert one.result.content[0].text == "sent to ada (#1)"
        commits = store.ledger_commits
        [again] = await led.call_tools([EMAIL], seen=[])  # a restart re-runs the response
        assert again.key == one.key and again.result == one.result
        assert store.ledger_commits == commits  # the ledger's result: no request, no write

    _with_server(tmp_path, dedupe=False, body=body)
    requests = _lines(tmp_path / "requests.jsonl")
    assert len(_lines(tmp_path / "outbox.jsonl")) == 1 and len(requests) == 1
    [call] = Session.open(store, "s1").recover()
    assert requests[0]["key"] == call.key and requests[0]["attempt"] == 1


def test_a_reused_call_id_on_the_next_response_is_a_new_call(tmp_path: Path) -> None:
    async def body(client: ClientSession) -> None:
        led = await LedgerClientSession.open(client, MemoryStore(), "s1",
                                             {"send_email": Tool("manual",
                                                                 requires_approval=False)})
        [first] = await led.call_tools([EMAIL], seen=[])
        # the model saw the result and repeats call_0 word for word (Gemini's ids):
        # a deliberate second email, under its own key, never the first call's result
        [second] = await led.call_tools([EMAIL], seen=[first.key])
        assert second.key != first.key and second.result is not None
        assert isinstance(second.result.content[0], TextContent)
        assert second.result.content[0].text == "sent to ada (#2)"
        [again] = await led.call_tools([EMAIL], seen=[first.key])  # a re-run of the second
        assert again.key == second.key

    _with_server(tmp_path, dedupe=False, body=body)
    keys = [row["key"] for row in _lines(tmp_path / "outbox.jsonl")]
    assert len(keys) == 2 and len(set(keys)) == 2


def test_two_calls_in_one_response_each_run_once_under_their_own_key(tmp_path: Path) -> None:
    bob = {"id": "call_1", "name": "send_email", "arguments": {"to": "bob", "body": "Q3"}}

    async def body(client: ClientSession) -> None:
        led = await LedgerClientSession.open(client, MemoryStore(), "s1")
        out = await led.call_tools([EMAIL, bob], seen=[])
        assert [o.status.next for o in out] == [Next.AWAIT_APPROVAL] * 2  # undeclared: manual
        for o in out:
            await led.approve(o.key)
        out = await led.call_tools([EMAIL, bob], seen=[])
        assert [o.status.next for o in out] == [Next.RESULT] * 2
        again = await led.call_tools([EMAIL, bob], seen=[])
        assert [o.key for o in again] == [o.key for o in out]

    _with_server(tmp_path, dedupe=False, body=body)
    rows = _lines(tmp_path / "outbox.jsonl")
    assert [r["to"] for r in rows] == ["ada", "bob"] and rows[0]["key"] != rows[1]["key"]


def test_annotations_set_the_default_policy_never_over_the_engines(tmp_path: Path) -> None:
    def kind(t: Tool) -> tuple[str, bool | None]:
        return (str(t.policy), t.requires_approval)

    # a missing hint is the worst case: manual, approval required
    assert kind(policy_from_annotations(None)) == ("manual", True)
    assert kind(policy_from_annotations(ToolAnnotations())) == ("manual", True)
    assert kind(policy_from_annotations(ToolAnnotations(destructive_hint=False))) == (
        "manual", True)
    assert kind(policy_from_annotations(ToolAnnotations(idempotent_hint=True))) == (
        "idempotent", True)
    ro = ToolAnnotations(read_only_hint=True)
    assert kind(policy_from_annotations(ro)) == ("idempotent", True)  # untrusted by default
    assert kind(policy_from_annotations(ro, trust_read_only=True)) == ("readonly", False)
    contradictory = ToolAnnotations(read_only_hint=True, destructive_hint=True)
    assert kind(policy_from_annotations(contradictory, trust_read_only=True)) == (
        "manual", True)

    async def body(client: ClientSession) -> None:
        listed = (await client.list_tools()).tools
        merged = policies_from_listing(listed, {"send_email": "manual"})
        assert merged["send_email"] == "manual"  # declared: kept, not the idempotent hint
        got = policies_from_listing(listed, {})
        assert {n: kind(t) for n, t in got.items() if isinstance(t, Tool)} == {
            "send_email": ("idempotent", True), "outbox_size": ("idempotent", True)}
        led = await LedgerClientSession.open(client, MemoryStore(), "s1", trust_read_only=True)
        assert kind(led.policies["outbox_size"]) == ("readonly", False)  # type: ignore[arg-type]
        [size] = await led.call_tools([{"id": "c9", "name": "outbox_size", "arguments": {}}],
                                      seen=[])
        assert size.status.next is Next.RESULT  # read-only, trusted: no approval asked

    _with_server(tmp_path, dedupe=True, body=body)


class _Refusing:
    """A client whose server answers tools/call with a JSON-RPC error."""

    def __init__(self, code: int) -> None:
        self.code = code
        self.sent = 0

    async def call_tool(self, *args: Any, **kwargs: Any) -> CallToolResult:
        self.sent += 1
        raise MCPError(self.code, "no")


@pytest.mark.parametrize(("code", "next_", "outcome"), [
    (INVALID_PARAMS, Next.RESULT, Outcome.NOT_APPLIED),  # the request itself was refused
    (INTERNAL_ERROR, Next.HALTED, Outcome.UNKNOWN),      # the tool may have run: a human
])
def test_a_jsonrpc_refusal_is_not_applied_any_other_error_is_unknown(
        code: int, next_: Next, outcome: Outcome) -> None:
    async def main() -> None:
        from toolledger import AsyncSession
        fake = _Refusing(code)
        ledger = await AsyncSession.open(MemoryStore(), "s1",
                                         {"send_email": Tool("manual", requires_approval=False)})
        led = LedgerClientSession(fake, ledger, {})  # type: ignore[arg-type]
        [one] = await led.call_tools([EMAIL], seen=[])
        assert (one.status.next, one.status.outcome, fake.sent) == (next_, outcome, 1)
        if next_ is Next.RESULT:
            assert one.result is not None and one.result.is_error
    anyio.run(main)


# ---------------------------------------------------------------- killed, then resumed


def _agent(tmp_path: Path, mode: str, turns: list[list[dict[str, Any]]], env: dict[str, str]
           ) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(AGENT), mode, str(tmp_path / "ledger.sqlite3"),
         str(tmp_path / "conversation.json"), json.dumps(turns)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _killed_after_the_email(tmp_path: Path, mode: str, *, dedupe: bool) -> None:
    """Run the agent until the server's email is fsynced, then SIGKILL the client."""
    proc = _agent(tmp_path, mode, [[EMAIL]], _env(tmp_path, dedupe=dedupe, hang=True))
    outbox = tmp_path / "outbox.jsonl"
    deadline = time.monotonic() + WAIT
    try:
        while not _lines(outbox):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the email never left"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)  # the client, between effect and outcome commit
        proc.communicate(timeout=WAIT)
    assert proc.returncode == -signal.SIGKILL


def _resumed(tmp_path: Path, mode: str, *, dedupe: bool) -> tuple[int, dict[str, Any]]:
    proc = _agent(tmp_path, mode, [[EMAIL]], _env(tmp_path, dedupe=dedupe))
    out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode in (0, 3), err
    return proc.returncode, json.loads(out.splitlines()[-1])


def test_control_without_toolledger_the_resumed_agent_sends_the_email_twice(
        tmp_path: Path) -> None:
    # even on the deduplicating server: the agent's re-run carries no stable key
    _killed_after_the_email(tmp_path, "control", dedupe=True)
    code, _ = _resumed(tmp_path, "control", dedupe=True)
    assert code == 0
    assert [r["to"] for r in _lines(tmp_path / "outbox.jsonl")] == ["ada", "ada"]


def test_manual_a_resumed_agent_halts_for_a_human_and_the_email_goes_once(
        tmp_path: Path) -> None:
    _killed_after_the_email(tmp_path, "ledger", dedupe=False)  # no hints: manual
    code, run = _resumed(tmp_path, "ledger", dedupe=False)
    assert code == 3 and len(run["halted"]) == 1
    assert len(_lines(tmp_path / "outbox.jsonl")) == 1
    # the human on call looks at the outbox and answers: it was applied
    human = Session.open(SqliteStore(tmp_path / "ledger.sqlite3"), "conv-1")
    [halted] = human.halted()
    assert halted.key == run["halted"][0] == _lines(tmp_path / "outbox.jsonl")[0]["key"]
    human.resolve(halted.key, "applied", result="sent to ada (#1), confirmed")
    human.ledger.store.close()
    code, run = _resumed(tmp_path, "ledger", dedupe=False)
    assert code == 0 and run["messages"][-1]["content"]["content"][0]["text"] == (
        "sent to ada (#1), confirmed")
    assert len(_lines(tmp_path / "outbox.jsonl")) == 1


def test_idempotent_a_resumed_agent_retries_under_the_same_key_which_the_server_dedupes(
        tmp_path: Path) -> None:
    _killed_after_the_email(tmp_path, "ledger", dedupe=True)  # idempotentHint: idempotent
    code, run = _resumed(tmp_path, "ledger", dedupe=True)
    assert code == 0 and run["halted"] == []
    [email] = _lines(tmp_path / "outbox.jsonl")
    requests = _lines(tmp_path / "requests.jsonl")
    assert [(r["key"], r["attempt"]) for r in requests] == [(email["key"], 1),
                                                            (email["key"], 2)]
    assert run["messages"][-1]["key"] == email["key"]
    assert run["messages"][-1]["content"]["content"][0]["text"] == "sent to ada (#1)"


def test_the_mcp_block_of_docs_frameworks_md_runs(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/frameworks.md's MCP block (test_docs.py leaves it here): against the real
    server, a human approves, the email is sent once, the tool message carries its key."""
    page = (ROOT / "docs" / "frameworks.md").read_text()
    section = page.split("\n## MCP\n", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert IDEMPOTENCY_META in section and "LedgerClientSession" in code
    assert 10 <= len(code.strip().splitlines()) <= 25
    asked: list[Any] = []

    def ask_a_human(call: Any) -> bool:
        asked.append(call.name)
        return True

    monkeypatch.chdir(tmp_path)  # the block opens ledger.sqlite3 here
    params = server_params(SERVER, _env(tmp_path, dedupe=False))
    scope: dict[str, Any] = {"server_params": params, "model_calls": [EMAIL],
                             "ask_a_human": ask_a_human}
    exec(compile(code, "docs/frameworks.md", "exec"), scope)
    [email] = _lines(tmp_path / "outbox.jsonl")
    [message] = scope["tool_messages"]
    assert asked == ["send_email"] and message["toolledger_key"] == email["key"]
    assert message["tool_call_id"] == "call_0" and "sent to ada (#1)" in message["content"]
