"""toolledger.extra.langgraph against the real LangGraph: StateGraph(MessagesState) graphs
whose "agent" node is scripted (it emits tool-calling AIMessages; no LLM, no network),
a SqliteSaver checkpointer and the ledger beside it in tmp_path.

The crash tests run real processes (toolledger.kit.frameworks): a child SIGKILLed right
after the email left, before LangGraph checkpointed the tools step (durability "sync"),
then a new child resumes the thread as the LangGraph docs say, graph.invoke(None, config).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import InjectedToolArg, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

from checker_support import MailApi
from toolledger import InvalidInput, NotApplied, NotAppliedFenced, Tool, WasApplied
from toolledger.extra.langgraph import (
    INTERRUPT_KEY,
    LedgerToolNode,
    ledger_key,
    ledger_path,
    open_saver,
    store_beside,
)
from toolledger.kit.frameworks import run

CFG: Any = {"configurable": {"thread_id": "t1"}}
NO_APPROVAL = Tool(policy="manual", requires_approval=False)


def _call(to: str, call_id: str = "c1", **extra: Any) -> dict[str, Any]:
    return {"name": "send_email", "args": {"to": to, **extra}, "id": call_id}


class Script:
    """The agent node: after a tool result, answers with it (or with the next scripted
    tool calls); otherwise asks for the first ones."""

    def __init__(self, *turns: list[dict[str, Any]]) -> None:
        self.turns = list(turns)
        self.seen: list[str] = []

    def __call__(self, state: MessagesState) -> dict[str, list[BaseMessage]]:
        last = state["messages"][-1]
        if isinstance(last, ToolMessage):
            self.seen.append(str(last.content))
            if len(self.turns) > 1:
                self.turns.pop(0)
                return {"messages": [AIMessage(content="", tool_calls=self.turns[0])]}
            return {"messages": [AIMessage(content=f"done: {last.content}")]}
        return {"messages": [AIMessage(content="", tool_calls=self.turns[0])]}


def _graph(node: Any, script: Script, saver: Any) -> Any:
    g = StateGraph(MessagesState)
    g.add_node("agent", script)
    g.add_node("tools", node)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=saver)


def _mail_tool(body: Callable[[str, str, str | None], str]) -> Any:
    def send_email(to: str, execution_id: Annotated[str, InjectedToolArg] = "",
                   idempotency_key: Annotated[str | None, InjectedToolArg] = None) -> str:
        """Send an email."""
        return body(to, execution_id, idempotency_key)

    return tool(send_email)


def _logging(log: list[str], reply: str | None) -> Callable[[str, str, str | None], str]:
    """A tool body that logs what it was sent (the recipient, or the execution id)."""
    def body(to: str, eid: str, key: str | None) -> str:
        log.append(to if reply is None else eid)
        return f"sent to {to}" if reply is None else reply
    return body


def _node(tmp_path: Path, body: Callable[[str, str, str | None], str],
          policies: dict[str, Tool | str], **kw: Any) -> tuple[LedgerToolNode, Any]:
    saver = open_saver(tmp_path / "checkpoints.sqlite")
    return LedgerToolNode([_mail_tool(body)], store=store_beside(saver), policies=policies,
                          **kw), saver


def _asks(out: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for i in out.get("__interrupt__", ()) for r in i.value[INTERRUPT_KEY]]


def _invoke(graph: Any, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = graph.invoke(value, CFG, durability="sync")
    return out


# --------------------------------------------------------------------------


def test_a_protected_call_runs_once_with_the_ledgers_execution_id(tmp_path: Path) -> None:
    got: list[tuple[str, str, str | None]] = []

    def body(to: str, eid: str, key: str | None) -> str:
        got.append((to, eid, key))
        return f"sent to {to}"

    node, saver = _node(tmp_path, body, {"send_email": NO_APPROVAL})
    out = _invoke(_graph(node, Script([_call("ada")]), saver), {"messages": [("user", "hi")]})
    assert out["messages"][-1].content == "done: sent to ada"
    [status] = node.session("t1").recover()
    assert got == [("ada", status.key, None)]  # manual: no idempotency key
    assert status.result is not None and status.result.content == "sent to ada"
    assert [row.kind for row in node.session("t1").audit()] == ["dispatch"]
    # the model never sees the ledger's arguments
    schema: Any = node.tools_by_name["send_email"].tool_call_schema
    assert set(schema.model_json_schema()["properties"]) == {"to"}
    # the ledger lives beside the checkpointer
    assert ledger_path(saver) == tmp_path / "checkpoints.toolledger.sqlite3"
    assert ledger_path(saver).exists()


def test_a_tool_that_shows_a_ledger_keyword_to_the_model_is_refused(tmp_path: Path) -> None:
    def send_email(to: str, execution_id: str = "") -> str:
        """Send an email."""
        return "sent"

    with pytest.raises(InvalidInput, match="InjectedToolArg"):
        LedgerToolNode([tool(send_email)], store=store_beside(tmp_path / "cp.sqlite"))
    with pytest.raises(InvalidInput, match="in memory"):
        store_beside(open_saver(":memory:"))


def test_a_model_that_writes_a_ledger_keyword_is_refused_and_nothing_runs(
        tmp_path: Path) -> None:
    ran: list[str] = []
    node, saver = _node(tmp_path, _logging(ran, "sent"),
                        {"send_email": NO_APPROVAL})
    forged = _call("ada", execution_id="forged")
    script = Script([forged])
    out = _invoke(_graph(node, script, saver), {"messages": [("user", "hi")]})
    assert ran == []  # never executed
    assert "reserved" in script.seen[0] and "execution_id" in script.seen[0]
    assert out["messages"][-2].status == "error"


def test_approval_is_an_interrupt_bound_to_one_execution(tmp_path: Path) -> None:
    outbox: list[str] = []
    node, saver = _node(tmp_path, _logging(outbox, None),
                        {"send_email": "manual"})  # approval required
    graph = _graph(node, Script([_call("ada")]), saver)
    out = _invoke(graph, {"messages": [("user", "mail ada")]})
    [ask] = _asks(out)
    assert ask["kind"] == "approval" and ask["allowed"] == ["approve", "reject"]
    assert [c.key for c in node.session("t1").pending_approvals()] == [ask["key"]]
    # an answer for another execution does not count: asked again, nothing runs
    out = _invoke(graph, Command(resume={"tlx1-someone-else": "approve", ask["key"]: "maybe"}))
    assert [a["key"] for a in _asks(out)] == [ask["key"]] and outbox == []
    out = _invoke(graph, Command(resume={ask["key"]: {"type": "approve", "by": "alice"}}))
    assert out["messages"][-1].content == "done: sent to ada" and outbox == ["ada"]
    [approved] = [r for r in node.session("t1").audit() if r.kind == "approved"]
    assert approved.by == "alice"  # who answered, in the approval's audit row

    # rejected: the model gets a denial, nothing is sent
    other: Any = {"configurable": {"thread_id": "t2"}}
    graph2 = _graph(node, Script([_call("bob")]), saver)
    out = graph2.invoke({"messages": [("user", "mail bob")]}, other)
    [ask2] = _asks(out)
    out = graph2.invoke(Command(resume={ask2["key"]: {"type": "reject", "by": "carol",
                                                      "note": "wrong person"}}), other)
    assert "denied" in out["messages"][-1].content and outbox == ["ada"]
    [rejected] = [r for r in node.session("t2").audit() if r.kind == "rejected"]
    assert (rejected.by, rejected.human_note) == ("carol", "wrong person")


def test_an_approval_is_used_once_a_retry_that_reuses_the_call_id_asks_again(
        tmp_path: Path) -> None:
    """The pydantic-ai #5536 shape in LangGraph: the provider re-uses the tool call id for
    the retried call; the retry must not ride on the first call's approval."""
    attempts: list[str] = []

    def body(to: str, eid: str, key: str | None) -> str:
        attempts.append(eid)
        if len(attempts) == 1:
            raise NotApplied("the server refused: try again")
        return "sent"

    node, saver = _node(tmp_path, body, {"send_email": "manual"},
                        handle_tool_errors=True)
    graph = _graph(node, Script([_call("ada")], [_call("ada")]), saver)
    [first] = _asks(_invoke(graph, {"messages": [("user", "mail ada")]}))
    out = _invoke(graph, Command(resume={first["key"]: "approve"}))
    [second] = _asks(out)  # the retry (same tool call id, new message) asks again
    assert attempts == [first["key"]]
    assert second["tool_call_id"] == "c1" and second["key"] != first["key"]
    # the host answers with the old approval (a stale resume): asked again, nothing runs
    out = _invoke(graph, Command(resume={first["key"]: "approve"}))
    assert [a["key"] for a in _asks(out)] == [second["key"]] and attempts == [first["key"]]
    out = _invoke(graph, Command(resume={second["key"]: "approve"}))
    assert out["messages"][-1].content == "done: sent"
    assert attempts == [first["key"], second["key"]]


@pytest.mark.parametrize(("answer", "model_sees", "emails"), [
    ({"type": "applied", "result": "sent (the server says)"}, "sent (the server says)", 1),
    ("retry", "sent", 2),
    ("abandon", "abandoned", 1),
])
def test_an_unknown_outcome_is_a_recovery_interrupt_that_resolve_answers(
        tmp_path: Path, answer: Any, model_sees: str, emails: int) -> None:
    outbox: list[str] = []

    def body(to: str, eid: str, key: str | None) -> str:
        outbox.append(to)
        if len(outbox) == 1:
            raise TimeoutError("the server did not answer")  # sent? nobody can tell
        return "sent"

    node, saver = _node(tmp_path, body, {"send_email": NO_APPROVAL})
    graph = _graph(node, Script([_call("ada")]), saver)
    [ask] = _asks(_invoke(graph, {"messages": [("user", "mail ada")]}))
    assert ask["kind"] == "recovery_required" and ask["tool_call_id"] == "c1"
    assert ask["decision"] == "recovery_required" and ask["attempt"] == 1
    assert ask["allowed"] == ["applied", "retry", "abandon"] and outbox == ["ada"]
    # an approval is no answer to a recovery item: asked again, nothing runs
    out = _invoke(graph, Command(resume={ask["key"]: "approve"}))
    assert [a["key"] for a in _asks(out)] == [ask["key"]] and outbox == ["ada"]
    out = _invoke(graph, Command(resume={ask["key"]: answer}))
    assert model_sees in out["messages"][-1].content
    assert len(outbox) == emails
    assert node.session("t1").halted() == []


def test_an_idempotent_call_is_retried_with_the_same_key(tmp_path: Path) -> None:
    server: dict[str, int] = {}

    def body(to: str, eid: str, key: str | None) -> str:
        assert key is not None
        server[key] = server.get(key, 0) + 1
        if server[key] == 1:
            raise ConnectionResetError("the answer was lost")
        return "charged"

    node, saver = _node(tmp_path, body,
                        {"send_email": Tool(policy="idempotent", requires_approval=False)})
    out = _invoke(_graph(node, Script([_call("ada")]), saver), {"messages": [("user", "x")]})
    assert out["messages"][-1].content == "done: charged"
    assert list(server.values()) == [2]  # two requests, one key: the server applies it once


@pytest.mark.parametrize(("answer", "emails"), [(WasApplied("sent (per the server)"), 1),
                                                (NotAppliedFenced(), 2)])
def test_a_reconcile_call_asks_its_connector(tmp_path: Path, answer: Any, emails: int) -> None:
    outbox: list[str] = []

    def body(to: str, eid: str, key: str | None) -> str:
        outbox.append(to)
        if len(outbox) == 1:
            raise TimeoutError("no answer")
        return "sent"

    asked: list[int] = []

    def connector(call: Any, attempt: int) -> Any:
        asked.append(attempt)
        return answer

    node, saver = _node(tmp_path, body,
                        {"send_email": Tool(policy="reconcile", requires_approval=False)},
                        reconcilers={"send_email": connector})
    out = _invoke(_graph(node, Script([_call("ada")]), saver), {"messages": [("user", "x")]})
    assert asked == [1] and len(outbox) == emails
    assert out["messages"][-1].content.startswith("done: sent")


def test_parallel_calls_of_one_message_each_run_once_with_their_own_execution(
        tmp_path: Path) -> None:
    got: list[tuple[str, str]] = []

    def body(to: str, eid: str, key: str | None) -> str:
        got.append((to, eid))
        return f"sent to {to}"

    node, saver = _node(tmp_path, body, {"send_email": NO_APPROVAL})
    both = [_call("ada", "c1"), _call("bob", "c2")]
    _invoke(_graph(node, Script(both), saver), {"messages": [("user", "mail both")]})
    assert sorted(to for to, _ in got) == ["ada", "bob"]
    keys = {s.key for s in node.session("t1").recover()}
    assert {eid for _, eid in got} == keys and len(keys) == 2

    # a provider that re-uses an id inside one message: the ledger cannot tell the calls
    # apart, so neither runs and the model is told
    got.clear()
    other: Any = {"configurable": {"thread_id": "t2"}}
    script = Script([_call("ada", "c1"), _call("bob", "c1")])
    _graph(node, script, saver).invoke({"messages": [("user", "x")]}, other)
    assert got == [] and "not unique" in script.seen[0]


def test_a_reconcile_call_without_a_connector_goes_to_a_human(tmp_path: Path) -> None:
    outbox: list[str] = []

    def body(to: str, eid: str, key: str | None) -> str:
        outbox.append(to)
        raise TimeoutError("no answer")

    node, saver = _node(tmp_path, body,
                        {"send_email": Tool(policy="reconcile", requires_approval=False)})
    graph = _graph(node, Script([_call("ada")]), saver)
    [ask] = _asks(_invoke(graph, {"messages": [("user", "x")]}))
    assert ask["kind"] == "recovery_required" and outbox == ["ada"]
    out = _invoke(graph, Command(resume={ask["key"]: {"type": "applied", "result": "ok"}}))
    assert out["messages"][-1].content == "done: ok" and outbox == ["ada"]


def test_a_graph_without_a_thread_id_is_refused_before_anything_runs(tmp_path: Path) -> None:
    ran: list[str] = []
    node, _ = _node(tmp_path, _logging(ran, "sent"),
                    {"send_email": NO_APPROVAL})
    g = StateGraph(MessagesState)
    g.add_node("agent", Script([_call("ada")]))
    g.add_node("tools", node)
    g.add_edge(START, "agent")
    g.add_edge("agent", "tools")
    with pytest.raises(InvalidInput, match="thread_id"):
        graph: Any = g.compile()
        graph.invoke({"messages": [("user", "x")]})
    assert ran == []


def test_the_async_path_goes_through_the_ledger_too(tmp_path: Path) -> None:
    got: list[str] = []

    async def send_email(to: str, execution_id: Annotated[str, InjectedToolArg] = "") -> str:
        """Send an email."""
        got.append(execution_id)
        return "sent"

    node = LedgerToolNode([tool(send_email)], store=store_beside(tmp_path / "cp.sqlite"),
                          policies={"send_email": "manual"})
    graph: Any = _graph(node, Script([_call("ada")]), InMemorySaver())
    [ask] = _asks(asyncio.run(graph.ainvoke({"messages": [("user", "x")]}, CFG)))
    out = asyncio.run(graph.ainvoke(Command(resume={ask["key"]: "approve"}), CFG))
    assert out["messages"][-1].content == "done: sent" and got == [ask["key"]]


# --------------------------------------------------------------------------
# Real processes: SIGKILL right after the email left, before LangGraph checkpointed the
# tools step; a new process resumes the thread with graph.invoke(None, config). The
# call needed an approval, given in the first process: the resume must not ride on it.
# --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "policy", "point", "requests", "applied", "asked", "final"), [
    # control: LangGraph alone re-runs the tools node: the email is sent twice
    ("plain", "manual", "after_effect", 2, 2, (), "sent to ada as #2"),
    # manual: halted for a human, never re-sent
    ("ledger", "manual", "after_effect", 1, 1, ("recovery_required",), None),
    # idempotent: re-sent with the same key, the server sends it once
    ("ledger", "idempotent", "after_effect", 2, 1, (), "sent to ada as #1"),
    # reconcile: the connector finds it in the server's log, nothing re-sent
    ("ledger", "reconcile", "after_effect", 1, 1, (), "sent to ada as #1"),
    # the ledger recorded the result before the kill: reconstructed, not re-sent
    ("ledger", "manual", "after_result", 1, 1, (), "sent to ada as #1"),
])
def test_a_sigkilled_graph_resumes_without_sending_twice(
        tmp_path: Path, mode: str, policy: str, point: str, requests: int, applied: int,
        asked: tuple[str, ...], final: str | None) -> None:
    r = run("langgraph", mode, policy, point, tmp_path, human=False, fork=True)
    assert r.returncodes == (-9, 0), r.stderr[-2000:]  # killed, then a clean resume
    assert (r.requests, r.applied) == (requests, applied)
    assert r.asked == asked and r.final == final
    if mode == "ledger" and policy == "idempotent":
        assert r.mail[0]["key"] == r.mail[1]["key"] and r.mail[0]["key"].startswith("tlx")


def test_the_docs_section_runs_as_printed(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/frameworks.md's LangGraph block runs (the README links it) in a graph of
    an agent node and the block's tools node: the approval is an interrupt, a human
    approves, the email is sent once."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "frameworks.md").read_text()
    section = page.split("\n## LangGraph\n", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    import toolledger.extra.langgraph as extra
    for name in ("LedgerToolNode", "store_beside", "InjectedToolArg", "Command(resume=",
                 "invoke(None"):
        assert name in section, name
    assert all(hasattr(extra, n) for n in ("LedgerToolNode", "store_beside", "open_saver"))
    assert 10 <= len(code.strip().splitlines()) <= 20
    script = Script([{"name": "send_email", "args": {"to": "ada", "body": "the report"},
                      "id": "c1"}])
    builder = StateGraph(MessagesState)  # the app's graph, but for its ToolNode
    builder.add_node("agent", script)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    asked: list[dict[str, Any]] = []
    mail = MailApi()

    def ask_a_human(item: dict[str, Any]) -> str:
        asked.append(item)
        return "approve"

    monkeypatch.chdir(tmp_path)  # the block opens checkpoints.sqlite here
    scope: dict[str, Any] = {"builder": builder, "mail_api": mail, "ask_a_human": ask_a_human}
    exec(compile(code, "docs/frameworks.md", "exec"), scope)
    assert [(a["kind"], "approve" in a["allowed"]) for a in asked] == [("approval", True)]
    assert [v[0] for v in mail.sent.values()] == ["ada"]
    assert script.seen == ["sent to ada"]
    assert scope["out"]["messages"][-1].content == "done: sent to ada"


# --------------------------------------------------------------------------
# Histories that LangGraph apps shrink, and responses lost before they were saved
# (issue 23): the ledger places each AIMessage itself; what the history shows is
# the keys on the ToolMessages the node created before it (response_metadata).
# --------------------------------------------------------------------------


def _remind_tool(outbox: list[str]) -> Any:
    @tool
    def remind(to: str) -> str:
        """Send a reminder."""
        outbox.append(to)
        return f"reminded {to} (#{len(outbox)})"

    return remind


def _shrinking_graph(node: Any, script: Script, saver: Any,
                     shrink: Callable[[list[BaseMessage]], list[Any]]) -> Any:
    """agent -> tools -> history -> agent: ``history`` shrinks the state after every tools
    step, as the LangGraph docs' trimming / summarising nodes do."""
    g = StateGraph(MessagesState)
    g.add_node("agent", script)
    g.add_node("tools", node)
    g.add_node("history", lambda state: {"messages": shrink(state["messages"])})
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "history")
    g.add_edge("history", "agent")
    return g.compile(checkpointer=saver)


def _trim_to(n: int) -> Callable[[list[BaseMessage]], list[Any]]:
    """The RemoveMessage pattern: keep the last ``n`` messages."""
    return lambda messages: [RemoveMessage(id=m.id or "") for m in messages[:-n]]


def _summarise(messages: list[BaseMessage]) -> list[Any]:
    """A summarisation node: every message but the last two becomes one summary."""
    if len(messages) <= 3:
        return []
    return [RemoveMessage(id=REMOVE_ALL_MESSAGES),
            SystemMessage(f"summary of {len(messages) - 2} messages"), *messages[-2:]]


class _Positional(LedgerToolNode):
    """The drop-in as it was (the twin the tests below must fail): a message's sequence
    number is its position in the state's messages."""

    def _settle(self, plan: Any) -> Any:
        seq = self._at
        statuses = plan.session.record(seq, plan.calls)
        return {c["id"]: st for c, st in zip(plan.calls, statuses, strict=True)}, {}

    def _plan(self, input: Any, config: Any) -> Any:
        state: Any = self._extract_state(input, config)
        self._at = len(state["messages"]) - 1
        return super()._plan(input, config)


class _Keyless(LedgerToolNode):
    """A twin that ignores the keys on the history's ToolMessages (``seen=[]``)."""

    def _plan(self, input: Any, config: Any) -> Any:
        plan = super()._plan(input, config)
        return None if plan is None else replace(plan, seen=frozenset())


@pytest.mark.parametrize("shrink", [_trim_to(3), _summarise], ids=["trim", "summarise"])
def test_a_shrinking_history_never_stalls_and_every_call_runs_once(
        tmp_path: Path, shrink: Callable[[list[BaseMessage]], list[Any]]) -> None:
    turns = [[{"name": "remind", "args": {"to": f"r{i}"}, "id": f"call_{i}"}]
             for i in range(8)]
    outbox: list[str] = []
    saver = open_saver(tmp_path / "cp.sqlite")
    node = LedgerToolNode([_remind_tool(outbox)], store=store_beside(saver),
                          policies={"remind": NO_APPROVAL})
    out = _invoke(_shrinking_graph(node, Script(*turns), saver, shrink),
                  {"messages": [("user", "remind them all")]})
    assert outbox == [f"r{i}" for i in range(8)]
    assert out["messages"][-1].content == "done: reminded r7 (#8)"
    assert len(out["messages"]) <= 4  # the history really shrank
    # every response was placed as new (its predecessor's result was in the history):
    # eight ledger messages, nothing superseded
    s = node.session("t1")
    assert sorted({st.call.position[0] for st in s.recover()})[-1] == 7
    assert [r.kind for r in s.audit()].count("superseded") == 0
    # the marks survived the checkpoint (and the summary's re-adding)
    kept = [m for m in graph_state(saver) if isinstance(m, ToolMessage)]
    assert kept and all(ledger_key(m, s.session_id) for m in kept)
    # control: the drop-in as it was, placing by list position, dead-ends on the same run
    outbox2: list[str] = []
    saver2 = open_saver(tmp_path / "cp2.sqlite")
    twin = _Positional([_remind_tool(outbox2)], store=store_beside(saver2),
                       policies={"remind": NO_APPROVAL})
    with pytest.raises(InvalidInput, match="already recorded with other calls"):
        _invoke(_shrinking_graph(twin, Script(*turns), saver2, shrink),
                {"messages": [("user", "remind them all")]})
    assert len(outbox2) < 8


def graph_state(saver: Any) -> list[BaseMessage]:
    """The messages of thread t1 as the checkpointer stored them (read back from disk)."""
    tup = saver.get_tuple(CFG)
    assert tup is not None
    messages: list[BaseMessage] = tup.checkpoint["channel_values"]["messages"]
    return messages


def test_a_reused_call_0_repeated_on_purpose_runs_every_time(tmp_path: Path) -> None:
    """Gemini's ``call_0`` with identical arguments on every turn, in a trimmed history:
    each repeat follows the previous result, so each is a new call and runs."""
    same = [{"name": "remind", "args": {"to": "ada"}, "id": "call_0"}]

    def conversation(kind: type[LedgerToolNode], where: Path) -> tuple[list[str], Script]:
        outbox: list[str] = []
        saver = open_saver(where)
        node = kind([_remind_tool(outbox)], store=store_beside(saver),
                    policies={"remind": NO_APPROVAL})
        script = Script(same, same, same, same)
        _invoke(_shrinking_graph(node, script, saver, _trim_to(2)),
                {"messages": [("user", "remind ada 4 times")]})
        return outbox, script

    outbox, script = conversation(LedgerToolNode, tmp_path / "cp.sqlite")
    assert outbox == ["ada"] * 4
    assert script.seen == [f"reminded ada (#{i})" for i in range(1, 5)]
    # control: without the keys the history carries, each repeat reads as a resume of
    # the previous call and gets its result: the model is told "reminded" 4 times, but
    # one reminder went out
    outbox2, script2 = conversation(_Keyless, tmp_path / "cp2.sqlite")
    assert outbox2 == ["ada"] and len(script2.seen) == 4


def test_an_unanswered_call_the_history_dropped_asks_nothing_more(tmp_path: Path) -> None:
    """An approval is pending; the app drops that AIMessage (RemoveMessage) and the model
    asks for something else: the lost call is voided, its interrupt does not come back,
    an answer to it runs nothing."""
    outbox: list[str] = []
    node, saver = _node(tmp_path, _logging(outbox, None), {"send_email": "manual"})
    graph = _graph(node, Script([_call("ada", "call_0")]), saver)
    [first] = _asks(_invoke(graph, {"messages": [("user", "mail ada")]}))
    state = graph.get_state(CFG)
    asked = state.values["messages"][-1]
    # the app rewinds: drops the call, the user asks for another email
    graph.update_state(CFG, {"messages": [RemoveMessage(id=asked.id)]}, as_node="agent")
    graph2 = _graph(node, Script([_call("bob", "call_1")]), saver)
    out = _invoke(graph2, {"messages": [("user", "no: mail bob")]})
    [second] = _asks(out)
    assert second["args"] == {"to": "bob"}
    assert [c.key for c in node.session("t1").pending_approvals()] == [second["key"]]
    out = _invoke(graph2, Command(resume={first["key"]: "approve", second["key"]: "approve"}))
    assert outbox == ["bob"] and out["messages"][-1].content == "done: sent to bob"
    with pytest.raises(InvalidInput):
        node.session("t1").approve(first["key"])


# -- durability="exit": a kill mid-tool loses the AIMessage that asked -------------------


class _Server:
    """The mail server: one fsynced JSON line per request; deduplicates on the key."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def log(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines()]

    def send(self, to: str, eid: str, key: str | None) -> str:
        log = self.log()
        done = next((m for m in log if key and m["key"] == key), None)
        reply = done["reply"] if done else f"sent to {to} as #{len(log) + 1}"
        with self.path.open("a") as f:
            f.write(json.dumps({"to": to, "eid": eid, "key": key, "applied": done is None,
                                "reply": reply}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return reply

    def sent(self) -> list[str]:
        return [m["to"] for m in self.log() if m["applied"]]

    def says(self, eid: str) -> str | None:
        return next((m["reply"] for m in self.log() if m["eid"] == eid and m["applied"]), None)


def _exit_graph(tmp_path: Path, server: _Server, policy: str, ledger: bool,
                first: dict[str, Any], *, kill: bool) -> Any:
    def body(to: str, eid: str, key: str | None) -> str:
        reply = server.send(to, eid, key)
        if kill:
            os.kill(os.getpid(), signal.SIGKILL)  # the email is out, nothing else is
        return reply

    saver = open_saver(tmp_path / "checkpoints.sqlite")
    node: Any = (LedgerToolNode([_mail_tool(body)], store=store_beside(saver),
                                policies={"send_email": Tool(policy=policy,
                                                             requires_approval=False)})
                 if ledger else ToolNode([_mail_tool(body)]))
    return _graph(node, Script([first]), saver)


def _killed_in_a_child(run: Callable[[], None]) -> int:
    """``run()`` in a forked process (real process, real SIGKILL); its exit code."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover  (the child)
        code = 1
        try:
            run()
            code = 0
        finally:
            os._exit(code)
    _, st = os.waitpid(pid, 0)
    return -os.WTERMSIG(st) if os.WIFSIGNALED(st) else os.WEXITSTATUS(st)


def _lost_then_rerun(tmp_path: Path, policy: str, ledger: bool,
                     again: dict[str, Any]) -> tuple[_Server, list[dict[str, Any]], Any]:
    """First process: the model asks ``send_email(ada)`` as call_0, the email leaves, the
    process is SIGKILLed; with durability="exit" LangGraph saved nothing. Then the app
    sends the user's message again and the re-run model answers with ``again``."""
    server = _Server(tmp_path / "mail.jsonl")
    ada = _call("ada", "call_0")
    user: Any = {"messages": [("user", "mail ada")]}

    def first() -> None:
        _exit_graph(tmp_path, server, policy, ledger, ada, kill=True).invoke(
            user, CFG, durability="exit")

    assert _killed_in_a_child(first) == -signal.SIGKILL
    assert server.sent() == ["ada"]
    graph = _exit_graph(tmp_path, server, policy, ledger, again, kill=False)
    assert graph.get_state(CFG).values == {}  # the AIMessage that asked is gone
    asked: list[dict[str, Any]] = []
    out = graph.invoke(user, CFG, durability="exit")
    while asks := _asks(out):  # a careful human: the server's log decides
        asked += asks
        answer = {a["key"]: {"type": "applied", "result": says} if (says := server.says(
            a["key"])) else "retry" for a in asks}
        out = graph.invoke(Command(resume=answer), CFG, durability="exit")
    return server, asked, out


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["manual", "idempotent"])
def test_a_lost_response_re_emitted_with_a_new_id_goes_on_and_sends_once(
        tmp_path: Path, policy: str) -> None:
    server, asked, out = _lost_then_rerun(tmp_path, policy, True, _call("ada", "call_9"))
    assert server.sent() == ["ada"]  # once, whatever the policy
    # the conversation goes on: the re-emitted call is answered under ITS id with the
    # lost call's result
    tool_msg = out["messages"][-2]
    assert tool_msg.tool_call_id == "call_9" and tool_msg.content == "sent to ada as #1"
    assert out["messages"][-1].content == "done: sent to ada as #1"
    lost_key = server.log()[0]["eid"]
    assert ledger_key(tool_msg) == lost_key
    if policy == "manual":  # nobody can tell: a human was asked, about the lost call
        assert [(a["kind"], a["key"], a["tool_call_id"]) for a in asked] == [
            ("recovery_required", lost_key, "call_0")]
    else:  # retried under the lost call's own key: the server deduplicated it
        assert asked == [] and [m["key"] for m in server.log()] == [lost_key, lost_key]


@pytest.mark.slow
def test_a_lost_response_without_the_ledger_sends_twice(tmp_path: Path) -> None:
    """The control: LangGraph alone, the same kill and re-run."""
    server, _, out = _lost_then_rerun(tmp_path, "manual", False, _call("ada", "call_9"))
    assert server.sent() == ["ada", "ada"]
    assert out["messages"][-1].content == "done: sent to ada as #2"


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["manual", "idempotent"])
def test_a_lost_response_replaced_by_another_call_recovers_the_lost_one(
        tmp_path: Path, policy: str) -> None:
    server, asked, out = _lost_then_rerun(tmp_path, policy, True, _call("bob", "call_9"))
    lost_key = server.log()[0]["eid"]
    # the new call ran, and the conversation ended
    assert out["messages"][-2].tool_call_id == "call_9"
    assert out["messages"][-1].content == "done: sent to bob as #2"
    assert server.sent() == ["ada", "bob"]  # the lost email never went out twice
    if policy == "manual":  # recovered by its policy: a human, who says "applied"
        assert [(a["kind"], a["key"]) for a in asked] == [("recovery_required", lost_key)]
    else:  # retried under its own key (the server deduplicates), nobody asked
        assert asked == [] and [m["key"] for m in server.log()].count(lost_key) == 2
    ledger = LedgerToolNode([_mail_tool(lambda to, e, k: "")],
                            store=store_beside(tmp_path / "checkpoints.sqlite"),
                            policies={"send_email": Tool(policy=policy,
                                                         requires_approval=False)})
    s2 = ledger.session("t1")  # a fresh process's view: the lost call is settled
    assert s2.halted() == [] and s2.pending_approvals() == []
    kinds = [r.kind for r in s2.audit() if r.execution_id == lost_key]
    assert "superseded" in kinds  # audited: the history lost its response
    assert ("human_applied" in kinds) if policy == "manual" else kinds.count("dispatch") == 2
