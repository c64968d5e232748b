"""toolledger.extra.langgraph against the real LangGraph: StateGraph(MessagesState) graphs
whose "agent" node is scripted (it emits tool-calling AIMessages; no LLM, no network),
a SqliteSaver checkpointer and the ledger beside it in tmp_path.

The crash tests run real processes (toolledger.kit.frameworks): a child SIGKILLed right
after the email left, before LangGraph checkpointed the tools step (durability "sync"),
then a new child resumes the thread as the LangGraph docs say, graph.invoke(None, config).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import InjectedToolArg, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command

from toolledger import InvalidInput, NotApplied, NotAppliedFenced, Tool, WasApplied
from toolledger.extra.langgraph import (
    INTERRUPT_KEY,
    LedgerToolNode,
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
    out = _invoke(graph, Command(resume={ask["key"]: "approve"}))
    assert out["messages"][-1].content == "done: sent to ada" and outbox == ["ada"]

    # rejected: the model gets a denial, nothing is sent
    other: Any = {"configurable": {"thread_id": "t2"}}
    graph2 = _graph(node, Script([_call("bob")]), saver)
    out = graph2.invoke({"messages": [("user", "mail bob")]}, other)
    [ask2] = _asks(out)
    out = graph2.invoke(Command(resume={ask2["key"]: "reject"}), other)
    assert "denied" in out["messages"][-1].content and outbox == ["ada"]


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


class _MailApi:
    """The docs block's ``mail_api``: one entry per email it really sends, deduplicated
    on the idempotency key as a real mail API that takes one would."""

    def __init__(self) -> None:
        self.sent: dict[str, tuple[str, str]] = {}

    def send(self, to: str, body: str, key: str | None) -> str:
        assert key is not None and key.startswith("tlx"), key  # the ledger filled it in
        self.sent.setdefault(key, (to, body))
        return f"sent to {to}"


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
    mail = _MailApi()

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
