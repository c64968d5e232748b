"""toolledger.extra.openai_agents against the real openai-agents package, offline.

The SDK's own test model (``agents.testing.ScriptedModel``) plays the LLM. The
crash test SIGKILLs a real child process right after the tool's effect (a line
fsynced to a file outbox) and before the outcome is recorded, then resumes the
SDK's way (``RunState.from_string`` of the state saved at the interruption,
``approve``, ``Runner.run``): 2 emails without the ledger, 1 with it.
See docs/frameworks.md#openai-agents-sdk and docs/protocol.md.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, FunctionTool, Runner, function_tool, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext

from checker_support import watched
from toolledger import MemoryStore, Next, SqliteStore, Tool
from toolledger.extra.openai_agents import CallHalted, LedgerAgents

set_tracing_disabled(True)

CHILD = textwrap.dedent('''
    import asyncio, json, os, signal, sys
    from agents import Agent, RunState, Runner, function_tool, set_tracing_disabled
    from agents.testing import ScriptedModel, assistant_message, function_call
    from toolledger import SqliteStore
    from toolledger.extra.openai_agents import CallHalted, LedgerAgents
    set_tracing_disabled(True)
    mode, phase, d = sys.argv[1], sys.argv[2], sys.argv[3]

    @function_tool(needs_approval=True)
    def send_email(to: str) -> str:
        """Send an email (an API that takes no idempotency key)."""
        with open(os.path.join(d, "outbox"), "a") as f:
            f.write(to + "\\n"); f.flush(); os.fsync(f.fileno())
        if phase == "approve":                 # the effect is out; the outcome is not recorded
            os.kill(os.getpid(), signal.SIGKILL)
        return "sent to " + to

    first = [function_call("send_email", {"to": "ada"}, call_id="call_0")]
    steps = [first] if phase == "start" else []
    agent = Agent("mailer", model=ScriptedModel(steps + [[assistant_message("Sent.")]]),
                  tools=[send_email])
    ledger = None
    if mode == "ledger":
        store = SqliteStore(os.path.join(d, "ledger.sqlite3"))
        ledger = LedgerAgents(store, {"send_email": "manual"})
        agent = ledger.protect(agent, "c-42")

    async def main():
        saved = os.path.join(d, "state.json")
        if phase == "start":
            r = await Runner.run(agent, "Mail Ada")
            with open(saved, "w") as f:
                f.write(r.to_state().to_string())
            return {"asks": [i.raw_item.call_id for i in r.interruptions]}
        if phase == "resolve":
            [h] = ledger.session("c-42").halted()
            ledger.resolve("c-42", h.key, "applied", result="sent to ada")
            return {"resolved": h.key}
        with open(saved) as f:
            state = await RunState.from_string(agent, f.read())
        for item in state.get_interruptions():
            state.approve(item)
        try:
            r = await Runner.run(agent, state)
        except CallHalted as exc:
            return {"halted": exc.status.key}
        return {"final": r.final_output}

    print(json.dumps(asyncio.run(main())))
''')


def _child(tmp: Path, mode: str, phase: str) -> tuple[int, dict[str, Any]]:
    p = subprocess.run([sys.executable, "-c", CHILD, mode, phase, str(tmp)],
                       capture_output=True, text=True, timeout=120)
    out = p.stdout.strip().splitlines()
    return p.returncode, (json.loads(out[-1]) if out and p.returncode == 0 else {"err": p.stderr})


def _emails(tmp: Path) -> int:
    return len((tmp / "outbox").read_text().splitlines())


@pytest.mark.parametrize("mode", ["plain", "ledger"])
def test_kill_after_the_email_resume_with_the_same_approval(tmp_path: Path, mode: str) -> None:
    assert _child(tmp_path, mode, "start") == (0, {"asks": ["call_0"]})
    code, _ = _child(tmp_path, mode, "approve")
    assert code == -signal.SIGKILL and _emails(tmp_path) == 1   # sent, then killed
    code, out = _child(tmp_path, mode, "resume")              # the same saved state, approved
    assert code == 0, out
    if mode == "plain":
        assert out == {"final": "Sent."} and _emails(tmp_path) == 2   # the control: duplicate
        return
    assert "halted" in out and _emails(tmp_path) == 1   # the ledger: a human decides, nothing ran
    assert _child(tmp_path, mode, "resolve") == (0, {"resolved": out["halted"]})
    assert _child(tmp_path, mode, "resume") == (0, {"final": "Sent."})
    assert _emails(tmp_path) == 1


def _agent(steps: list[Any], ledger: LedgerAgents, sent: list[str],
           seen_by_tool: list[list[Any]] | None = None) -> Agent[Any]:
    @function_tool
    def send_email(to: str, idempotency_key: str | None = None) -> str:
        """Send an email."""
        sent.append(to)
        if seen_by_tool is not None:   # what the ledger holds while this body runs
            seen_by_tool.append([c.call.tool_call_id for c in ledger.session("c1").recover()])
        return f"sent to {to} ({idempotency_key})"
    return ledger.protect(Agent("a", model=ScriptedModel(steps), tools=[send_email]), "c1")


def test_two_calls_in_one_response_are_recorded_before_either_runs() -> None:
    ledger = LedgerAgents(MemoryStore(), {"send_email": Tool("idempotent",
                                                             requires_approval=False)})
    sent: list[str] = []
    held: list[list[Any]] = []
    agent = _agent([[function_call("send_email", {"to": "ada"}, call_id="call_0"),
                     function_call("send_email", {"to": "bob"}, call_id="call_1")],
                    [assistant_message("Sent.")]], ledger, sent, held)
    tool = agent.tools[0]
    assert isinstance(tool, FunctionTool)
    assert tool.params_json_schema["properties"].keys() == {"to"}  # the key is hidden
    r = asyncio.run(Runner.run(agent, "Mail both"))
    assert r.final_output == "Sent." and sorted(sent) == ["ada", "bob"]
    assert held[0] == ["call_0", "call_1"]      # both durable before the first body ran
    done = ledger.session("c1").recover()
    assert [(d.call.position, d.next) for d in done] == [((0, 0), Next.RESULT),
                                                         ((0, 1), Next.RESULT)]
    outputs = [i.output for i in r.new_items if i.type == "tool_call_output_item"]
    assert sorted(outputs) == sorted(f"sent to {d.call.arguments['to']} ({d.key})" for d in done)


def test_reused_call_id_on_a_later_turn_is_a_new_execution() -> None:
    ledger = LedgerAgents(MemoryStore(), {"send_email": "manual"})   # approval required
    sent: list[str] = []
    again = function_call("send_email", {"to": "ada"}, call_id="call_0")
    agent = _agent([[function_call("send_email", {"to": "ada"}, call_id="call_0")],
                    [assistant_message("Sent.")], [again], [assistant_message("Sent again.")]],
                   ledger, sent)

    async def run_approving(inp: Any) -> Any:
        r = await Runner.run(agent, inp)
        asks = [getattr(i.raw_item, "call_id", None) for i in r.interruptions]
        state = r.to_state()
        for item in state.get_interruptions():
            state.approve(item)
        return asks, await Runner.run(agent, state)

    asks1, r = asyncio.run(run_approving("Mail Ada"))
    # call_0 again, after the model saw its result: asked again, run again, its own key
    again_input = [*r.to_input_list(), {"role": "user", "content": "again"}]
    asks2, r = asyncio.run(run_approving(again_input))
    assert (asks1, asks2, r.final_output, sent) == (["call_0"], ["call_0"], "Sent again.",
                                                    ["ada", "ada"])
    keys = {row.execution_id for row in ledger.session("c1").audit()}
    assert len(keys) == 2


def test_a_halted_call_interrupts_and_refuses_to_run(tmp_path: Path) -> None:
    ledger = LedgerAgents(MemoryStore(), {"send_email": "manual"})
    s = ledger.session("c1")
    [st] = s.record([{"id": "call_0", "name": "send_email", "arguments": {"to": "ada"}}], seen=[])
    s.approve(st.key)
    with pytest.raises(KeyboardInterrupt), s.dispatch(st.key):
        raise KeyboardInterrupt   # the process went away mid-call: outcome unknown
    ledger = LedgerAgents(ledger.store, {"send_email": "manual"})   # a restart
    sent: list[str] = []
    agent = _agent([], ledger, sent)
    tool = agent.tools[0]
    assert isinstance(tool, FunctionTool) and callable(tool.needs_approval)
    ctx: ToolContext[None] = ToolContext(context=None, tool_name="send_email",
                                         tool_call_id="call_0", tool_arguments='{"to": "ada"}')
    ask = tool.needs_approval

    async def asks() -> bool:
        return bool(await ask(ctx, {"to": "ada"}, "call_0"))

    async def invoke() -> Any:
        return await tool.on_invoke_tool(ctx, '{"to": "ada"}')
    assert asyncio.run(asks())   # a halted call interrupts the run for a human
    with pytest.raises(CallHalted, match="resolve"):
        asyncio.run(invoke())
    assert sent == [] and ledger.session("c1").halted()[0].key == st.key


def test_no_ledger_store_call_runs_on_the_event_loops_thread(tmp_path: Path) -> None:
    """Recording, asking, approving, dispatching and recording the outcome all run off
    the loop (the drop-in awaits its AsyncSession); the control, the drop-in's
    synchronous ``session()`` called on the loop, is caught by the same probe."""
    w, store = watched(SqliteStore(tmp_path / "ledger.db"))
    ledger = LedgerAgents(store, {"send_email": "manual"})   # approval required
    sent: list[str] = []
    agent = _agent([[function_call("send_email", {"to": "ada"}, call_id="call_0")],
                    [assistant_message("Sent.")]], ledger, sent)

    async def main() -> tuple[int, Any, int]:
        r = await Runner.run(agent, "Mail Ada")
        state = r.to_state()
        for item in state.get_interruptions():
            state.approve(item)
        done = await Runner.run(agent, state)
        during = len(w.threads)
        ledger.session("c1").audit()  # the control: a blocking read on the loop
        return threading.get_ident(), done.final_output, during

    loop_thread, output, during = asyncio.run(main())
    assert (output, sent) == ("Sent.", ["ada"])
    names = [name for name, _ in w.threads[:during]]
    assert names.count("commit") >= 4, names  # record, approve, dispatched, outcome
    assert [n for n, t in w.threads[:during] if t == loop_thread] == []
    assert [n for n, t in w.threads[during:] if t == loop_thread] == ["audit"]
