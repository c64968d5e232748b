"""toolledger.extra.pydantic_ai against the real pydantic-ai: scripted FunctionModel runs,
no network, no LLM, a SqliteStore in tmp_path.

A "crash" is a BaseException raised in the process (after the tool's effect, or by
the model request that follows the tool's result): the run dies before the app
persisted anything past the model response that asked for the call, as a SIGKILL
leaves it; a restart is a NEW store object, toolset and agent on the same file,
resumed from that history the way pydantic-ai documents it (the history ends with
the response, no new prompt: pydantic-ai executes its calls).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, capture_run_messages
from pydantic_ai.exceptions import ModelRetry, UserError
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests, ToolDenied
from pydantic_ai.toolsets import FunctionToolset

from checker_support import MailApi, watched
from toolledger import NotAppliedFenced, SqliteStore, Tool, WasApplied
from toolledger.extra.pydantic_ai import APPROVAL_KEY, RECOVERY, LedgerToolset

CONV = "conv-1"


class Crash(BaseException):
    """The process dies here (not an Exception: nothing may catch and record it)."""


def _returns(m: ModelMessage) -> list[Any]:
    return [p.content for p in m.parts
            if isinstance(p, ToolReturnPart) and p.outcome != "retried"]


def _retries(m: ModelMessage) -> list[str]:
    """A tool's ModelRetry, as this pydantic-ai reports it (either shape)."""
    return [str(p.content) for p in m.parts if isinstance(p, RetryPromptPart)
            or (isinstance(p, ToolReturnPart) and p.outcome == "retried")]


class Script:
    """A FunctionModel: asks for ``calls`` first; after tool results, answers with them."""

    def __init__(self, calls: list[ToolCallPart], crash_after_results: bool = False) -> None:
        self.calls = calls
        self.crash_after_results = crash_after_results
        self.schemas: list[dict[str, Any]] = []
        self.seen: list[Any] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.schemas = [t.parameters_json_schema for t in info.function_tools]
        results = _returns(messages[-1])
        if results and not _retries(messages[-1]):
            if self.crash_after_results:
                raise Crash("killed before the run checkpointed the tool result")
            self.seen = results
            return ModelResponse(parts=[TextPart(f"done: {results}")])
        return ModelResponse(parts=list(self.calls))


def _agent(model: Script, toolset: Any) -> Agent[None, str | DeferredToolRequests]:
    return Agent(FunctionModel(model), toolsets=[toolset],
                 output_type=[str, DeferredToolRequests])


def _ledger(db: Path, fns: list[Callable[..., Any]], tools: dict[str, Tool | str]
            ) -> LedgerToolset:
    return LedgerToolset(FunctionToolset(fns), store=SqliteStore(db), tools=tools)


def _until_response(messages: list[ModelMessage]) -> list[ModelMessage]:
    """The history the app had persisted: up to the response whose calls ran."""
    last = max(i for i, m in enumerate(messages) if isinstance(m, ModelResponse)
               and any(isinstance(p, ToolCallPart) for p in m.parts))
    return list(messages[:last + 1])


def _crashed_run(agent: Agent[None, str | DeferredToolRequests],
                 **kw: Any) -> list[ModelMessage]:
    with capture_run_messages() as messages, pytest.raises((Crash, BaseExceptionGroup)):
        agent.run_sync(conversation_id=CONV, **kw)
    return _until_response(messages)


NO_APPROVAL = Tool(policy="manual", requires_approval=False)


# --------------------------------------------------------------------------


def test_protected_call_runs_once_and_its_result_reaches_the_model(tmp_path: Path) -> None:
    outbox: list[str] = []

    def send_email(to: str) -> str:
        outbox.append(to)
        return f"sent to {to}"

    model = Script([ToolCallPart("send_email", {"to": "ada"}, tool_call_id="c1")])
    ts = _ledger(tmp_path / "l.db", [send_email], {"send_email": NO_APPROVAL})
    out = _agent(model, ts).run_sync("mail ada", conversation_id=CONV).output
    assert out == "done: ['sent to ada']"
    assert outbox == ["ada"]
    [status] = ts.session(CONV).recover()
    assert status.next.value == "result" and status.result is not None
    assert status.result.content == "sent to ada"
    # one durable dispatch in the audit: the call ran once, through the ledger
    assert [row.kind for row in ts.session(CONV).audit()] == ["dispatch"]


def test_ledger_keywords_are_hidden_from_the_model_and_filled_by_the_ledger(
        tmp_path: Path) -> None:
    got: list[tuple[str, str | None]] = []

    def charge(amount: int, execution_id: str = "", idempotency_key: str | None = None) -> str:
        got.append((execution_id, idempotency_key))
        return "charged"

    model = Script([ToolCallPart("charge", {"amount": 5}, tool_call_id="c1")])
    ts = _ledger(tmp_path / "l.db", [charge],
                 {"charge": Tool(policy="idempotent", requires_approval=False)})
    _agent(model, ts).run_sync("charge", conversation_id=CONV)
    [schema] = model.schemas
    assert set(schema["properties"]) == {"amount"}
    assert "execution_id" not in str(schema) and "idempotency_key" not in str(schema)
    [status] = ts.session(CONV).recover()
    assert got == [(status.key, status.key)]  # idempotent: the key is the execution id


def test_a_model_that_writes_a_ledger_keyword_is_refused_and_nothing_runs(
        tmp_path: Path) -> None:
    ran: list[str] = []

    def charge(amount: int, execution_id: str = "") -> str:
        ran.append(execution_id)
        return "charged"

    forged = ToolCallPart("charge", {"amount": 5, "execution_id": "forged"}, tool_call_id="c1")
    model = Script([forged])
    ts = _ledger(tmp_path / "l.db", [charge], {"charge": NO_APPROVAL})
    with capture_run_messages() as messages, pytest.raises(Exception, match="retries"):
        _agent(model, ts).run_sync("charge", conversation_id=CONV)
    assert ran == []  # never executed, however often the model insists
    retry_texts = [t for m in messages for t in _retries(m)]
    assert retry_texts and "execution_id" in retry_texts[0] and "reserved" in retry_texts[0]


def test_a_restart_reconstructs_a_succeeded_call_instead_of_running_it_again(
        tmp_path: Path) -> None:
    outbox: list[str] = []

    def send_email(to: str) -> str:
        outbox.append(to)
        return f"sent to {to}"

    calls = [ToolCallPart("send_email", {"to": "ada"}, tool_call_id="c1")]
    db = tmp_path / "l.db"
    tools: dict[str, Tool | str] = {"send_email": NO_APPROVAL}
    history = _crashed_run(_agent(Script(calls, crash_after_results=True),
                                  _ledger(db, [send_email], tools)), user_prompt="mail ada")
    assert outbox == ["ada"]

    # control: the plain pydantic-ai agent, same crash, same resume, sends it again
    plain_box: list[str] = []

    def plain_send(to: str) -> str:
        plain_box.append(to)
        return "sent"

    plain_calls = [ToolCallPart("plain_send", {"to": "ada"}, tool_call_id="c1")]
    plain_history = _crashed_run(_agent(Script(plain_calls, crash_after_results=True),
                                        FunctionToolset([plain_send])), user_prompt="mail ada")
    _agent(Script(plain_calls), FunctionToolset([plain_send])).run_sync(
        message_history=plain_history, conversation_id=CONV)
    assert plain_box == ["ada", "ada"]

    model = Script(calls)
    out = _agent(model, _ledger(db, [send_email], tools)).run_sync(
        message_history=history, conversation_id=CONV).output
    assert outbox == ["ada"]  # not sent again
    assert out == "done: ['sent to ada']"  # the result, reconstructed from the ledger


def test_a_manual_call_with_an_unknown_outcome_halts_for_a_human(tmp_path: Path) -> None:
    outbox: list[str] = []

    def send_email(to: str) -> str:
        outbox.append(to)
        if len(outbox) == 1:
            raise Crash("killed right after the email left")
        return "sent"

    calls = [ToolCallPart("send_email", {"to": "ada"}, tool_call_id="c1")]
    db = tmp_path / "l.db"
    tools: dict[str, Tool | str] = {"send_email": NO_APPROVAL}
    history = _crashed_run(_agent(Script(calls), _ledger(db, [send_email], tools)),
                           user_prompt="mail ada")
    assert outbox == ["ada"]

    ts = _ledger(db, [send_email], tools)
    agent = _agent(Script(calls), ts)
    result = agent.run_sync(message_history=history, conversation_id=CONV)
    requests = result.output
    assert isinstance(requests, DeferredToolRequests)
    assert outbox == ["ada"]  # halted, never re-run
    [deferred] = requests.approvals
    meta = requests.metadata[deferred.tool_call_id]
    assert meta[RECOVERY] == "recovery_required" and meta["decision"] == "recovery_required"
    answer = requests.build_results(approve_all=True, metadata=requests.metadata)

    # approved before anyone resolved it: asked again, nothing runs
    again = _agent(Script(calls), ts).run_sync(message_history=result.all_messages(),
                                               deferred_tool_results=answer)
    assert isinstance(again.output, DeferredToolRequests) and outbox == ["ada"]

    # a human checked the mail server: it was sent
    status = ts.resolve(CONV, meta[APPROVAL_KEY], "applied", result="sent (confirmed)")
    assert status.next.value == "result"
    model = Script(calls)
    out = _agent(model, ts).run_sync(
        message_history=result.all_messages(),
        deferred_tool_results=answer).output
    assert out == "done: ['sent (confirmed)']"
    assert outbox == ["ada"]


def test_an_idempotent_call_is_retried_with_the_same_key_after_a_crash(tmp_path: Path) -> None:
    server: dict[str, int] = {}  # idempotency key -> requests; applied once per key

    def charge(amount: int, idempotency_key: str | None = None) -> str:
        assert idempotency_key is not None
        server[idempotency_key] = server.get(idempotency_key, 0) + 1
        if server[idempotency_key] == 1:
            raise Crash("killed before the answer was recorded")
        return "charged"

    calls = [ToolCallPart("charge", {"amount": 5}, tool_call_id="c1")]
    db = tmp_path / "l.db"
    tools: dict[str, Tool | str] = {"charge": Tool(policy="idempotent", requires_approval=False)}
    history = _crashed_run(_agent(Script(calls), _ledger(db, [charge], tools)),
                           user_prompt="charge")
    model = Script(calls)
    out = _agent(model, _ledger(db, [charge], tools)).run_sync(
        message_history=history, conversation_id=CONV).output
    assert out == "done: ['charged']"
    assert list(server.values()) == [2]  # two requests, one key: applied once


def test_approval_goes_through_deferred_tools_and_a_denial_is_recorded(tmp_path: Path) -> None:
    outbox: list[str] = []

    def send_email(to: str) -> str:
        outbox.append(to)
        return f"sent to {to}"

    db = tmp_path / "l.db"
    ts = _ledger(db, [send_email], {"send_email": "manual"})  # approval required
    calls = [ToolCallPart("send_email", {"to": "ada"}, tool_call_id="c1")]
    agent = _agent(Script(calls), ts)
    first = agent.run_sync("mail ada", conversation_id=CONV)
    requests = first.output
    assert isinstance(requests, DeferredToolRequests) and outbox == []
    [asked] = requests.approvals
    key = requests.metadata[asked.tool_call_id][APPROVAL_KEY]
    assert [c.key for c in ts.session(CONV).pending_approvals()] == [key]
    out = agent.run_sync(message_history=first.all_messages(),
                         deferred_tool_results=requests.build_results(
                             approve_all=True, metadata=requests.metadata)).output
    assert out == "done: ['sent to ada']" and outbox == ["ada"]

    # a second conversation: denied the pydantic-ai way; the next response records it
    denied = agent.run_sync("mail bob", conversation_id="conv-2")
    req2 = denied.output
    assert isinstance(req2, DeferredToolRequests)
    [asked2] = req2.approvals
    later = _agent(_DenyThenCall(), ts).run_sync(
        message_history=denied.all_messages(),
        deferred_tool_results=req2.build_results(approvals={asked2.tool_call_id: ToolDenied()}))
    assert isinstance(later.output, DeferredToolRequests)  # the new call asks for approval
    pending = ts.session("conv-2").pending_approvals()
    assert [c.tool_call_id for c in pending] == ["c2"]  # c1's denial is in the ledger
    assert outbox == ["ada"]


class _DenyThenCall(Script):
    def __init__(self) -> None:
        super().__init__([ToolCallPart("send_email", {"to": "eve"}, tool_call_id="c2")])

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=list(self.calls))


def test_an_approval_is_used_once_a_retry_that_reuses_the_call_id_asks_again(
        tmp_path: Path) -> None:
    """pydantic-ai #5536: an approved call re-run by a retry must not ride on the approval."""
    attempts: list[str] = []

    def send_email(to: str, execution_id: str = "") -> str:
        attempts.append(execution_id)
        if len(attempts) == 1:
            raise ModelRetry("the server refused: try again")
        return "sent"

    ts = _ledger(tmp_path / "l.db", [send_email], {"send_email": "manual"})
    # the provider re-uses the tool call id for the retried call
    calls = [ToolCallPart("send_email", {"to": "ada"}, tool_call_id="c1")]
    agent = _agent(Script(calls), ts)
    first = agent.run_sync("mail ada", conversation_id=CONV)
    req = first.output
    assert isinstance(req, DeferredToolRequests)
    old_key = req.metadata["c1"][APPROVAL_KEY]
    second = agent.run_sync(message_history=first.all_messages(),
                            deferred_tool_results=req.build_results(
                                approve_all=True, metadata=req.metadata))
    req2 = second.output
    assert isinstance(req2, DeferredToolRequests), second.output  # asks again
    assert attempts == [old_key]  # the retry did not run on the old approval
    new_key = req2.metadata["c1"][APPROVAL_KEY]
    assert new_key != old_key  # same tool call id, a new execution

    # answering the new request with the OLD approval's binding is refused
    stale = agent.run_sync(message_history=second.all_messages(),
                           deferred_tool_results=req2.build_results(
                               approve_all=True, metadata={"c1": {APPROVAL_KEY: old_key}}))
    assert isinstance(stale.output, DeferredToolRequests)
    assert attempts == [old_key]
    done = agent.run_sync(message_history=second.all_messages(),
                          deferred_tool_results=req2.build_results(
                              approve_all=True, metadata=req2.metadata))
    assert done.output == "done: ['sent']"
    assert attempts == [old_key, new_key]


def test_the_core_imports_with_no_third_party_package(tmp_path: Path) -> None:
    """The extras stay optional: pydantic-ai, pydantic, LangGraph, LangChain and psycopg
    cannot be imported (the crash harness of toolledger.kit.frameworks imports them in its
    children only)."""
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent("""
        import sys
        BLOCKED = ("pydantic_ai", "pydantic", "pydantic_core", "psycopg", "langgraph",
                   "langchain_core")
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"{name} is blocked by the test")
                return None
        sys.meta_path.insert(0, Block())
    """))
    src = str(Path(__file__).resolve().parents[1] / "reference")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), src])}
    probe = ("import toolledger, toolledger.kit.frameworks, sys\n"
             "try:\n    import pydantic\nexcept ImportError:\n    pass\n"
             "else:\n    raise SystemExit('the blocker did not block')\n"
             "assert not any(m.split('.')[0] in ('pydantic_ai', 'pydantic', 'langgraph', "
             "'langchain_core') "
             "for m in sys.modules)\n"
             "print('ok', toolledger.Session.__name__)\n")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok Session"
    # the blocker works: the extra itself cannot be imported under it
    for extra in ("pydantic_ai", "langgraph"):
        bad = subprocess.run([sys.executable, "-c", f"import toolledger.extra.{extra}"],
                             env=env, capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0 and "blocked by the test" in bad.stderr, extra


def test_the_docs_section_runs_as_printed(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/frameworks.md's pydantic-ai block runs (the README links it): an approval
    comes back as a deferred request, is approved, and the email is sent once."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "frameworks.md").read_text()
    section = page.split("\n## pydantic-ai\n", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    import toolledger.extra.pydantic_ai as extra
    for name in ("LedgerToolset", "resolve", "idempotency_key", "execution_id"):
        assert name in section
    assert set(extra.LEDGER_KEYWORDS) == {"execution_id", "idempotency_key"}
    assert 10 <= len(code.strip().splitlines()) <= 20
    script = Script([ToolCallPart("send_email", {"to": "ada", "body": "the report"},
                                  tool_call_id="c1")])
    mail = MailApi()
    monkeypatch.chdir(tmp_path)  # the block opens ledger.sqlite3 in the current directory
    scope: dict[str, Any] = {"model": FunctionModel(script), "mail_api": mail}
    exec(compile(code, "docs/frameworks.md", "exec"), scope)
    assert [v[0] for v in mail.sent.values()] == ["ada"]  # one email, after the approval
    assert scope["result"].output == "done: ['sent to ada']"
    assert (tmp_path / "ledger.sqlite3").exists()


# --------------------------------------------------------------------------
# Real processes: a child SIGKILLed right after the effect, a new child resumes
# --------------------------------------------------------------------------

_CHILD = '''
import asyncio, os, signal, sys
from pathlib import Path
from pydantic_ai import Agent
from pydantic_ai.messages import (ModelMessagesTypeAdapter, ModelResponse, TextPart,
                                  ToolCallPart, ToolReturnPart)
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.tools import DeferredToolRequests
from pydantic_ai.toolsets import FunctionToolset
from toolledger import NotAppliedFenced, SqliteStore, Tool, WasApplied
from toolledger.extra.pydantic_ai import LedgerToolset

mode, policy, where, phase = sys.argv[1:5]
work = Path(sys.argv[5])
effects, checkpoint = work / "effects.log", work / "messages.json"

def send_email(to: str, idempotency_key: str | None = None) -> str:
    with effects.open("a") as f:  # the mail server: one line per email it sends
        f.write(f"{to} {idempotency_key}\\n")
        f.flush()
        os.fsync(f.fileno())
    if phase == "first" and where == "after_effect":
        os.kill(os.getpid(), signal.SIGKILL)
    return "sent"

def model(messages, info):
    if any(isinstance(p, ToolReturnPart) for p in messages[-1].parts):
        if phase == "first" and where == "after_result":
            os.kill(os.getpid(), signal.SIGKILL)  # the ledger has the result, the app not
        return ModelResponse(parts=[TextPart("done")])
    return ModelResponse(parts=[ToolCallPart("send_email", {"to": "ada"}, tool_call_id="c1")])

toolset = FunctionToolset([send_email])
if mode == "ledger":
    toolset = LedgerToolset(toolset, store=SqliteStore(work / "ledger.sqlite3"),
                            tools={"send_email": Tool(policy=policy, requires_approval=False)})
agent = Agent(FunctionModel(model), toolsets=[toolset], output_type=[str, DeferredToolRequests])

async def first():
    async with agent.iter("mail ada", conversation_id="conv-1") as run:
        async for node in run:
            if Agent.is_call_tools_node(node):  # the app checkpoints the response
                checkpoint.write_bytes(ModelMessagesTypeAdapter.dump_json(run.all_messages()))

if phase == "first":
    asyncio.run(first())
else:
    history = ModelMessagesTypeAdapter.validate_json(checkpoint.read_bytes())
    out = agent.run_sync(message_history=history, conversation_id="conv-1").output
    if isinstance(out, DeferredToolRequests):
        print("deferred", [m.get("toolledger") for m in out.metadata.values()])
    else:
        print("output", out)
'''


def _child(work: Path, mode: str, policy: str, where: str, phase: str
           ) -> subprocess.CompletedProcess[str]:
    script = work / "child.py"
    script.write_text(_CHILD)
    return subprocess.run([sys.executable, str(script), mode, policy, where, phase, str(work)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("mode", "policy", "where", "resumed", "requests", "applied"), [
    # control: pydantic-ai alone sends the email again on resume
    ("plain", "manual", "after_effect", "output done", 2, 2),
    # manual: halted for a human, never re-sent
    ("ledger", "manual", "after_effect", "deferred ['recovery_required']", 1, 1),
    # idempotent: re-sent with the same key, the server applies it once
    ("ledger", "idempotent", "after_effect", "output done", 2, 1),
    # the ledger recorded the result before the kill: reconstructed, not re-sent
    ("ledger", "manual", "after_result", "output done", 1, 1),
])
def test_a_sigkilled_process_resumes_without_sending_twice(
        tmp_path: Path, mode: str, policy: str, where: str, resumed: str, requests: int,
        applied: int) -> None:
    first = _child(tmp_path, mode, policy, where, "first")
    assert first.returncode == -9, first.stderr  # killed, not a clean exit
    second = _child(tmp_path, mode, policy, where, "resume")
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == resumed
    lines = (tmp_path / "effects.log").read_text().splitlines()
    assert len(lines) == requests
    # the server deduplicates on a key; a request without one is always applied
    keyed = {line for line in lines if not line.endswith(" None")}
    assert len(keyed) + sum(line.endswith(" None") for line in lines) == applied
    if mode == "ledger" and policy == "idempotent":
        assert lines[0].split()[1].startswith("tlx")  # a real key, the execution id


def test_parallel_calls_of_one_response_each_run_once_with_their_own_execution(
        tmp_path: Path) -> None:
    got: list[tuple[str, str]] = []

    async def send_email(to: str, execution_id: str = "") -> str:
        got.append((to, execution_id))
        return f"sent to {to}"

    calls = [ToolCallPart("send_email", {"to": "ada"}, tool_call_id="c1"),
             ToolCallPart("send_email", {"to": "bob"}, tool_call_id="c1")]  # a reused id
    ts = _ledger(tmp_path / "l.db", [send_email], {"send_email": NO_APPROVAL})
    with pytest.raises(Exception, match="unique `tool_call_id`"):  # pydantic-ai refuses
        _agent(Script(calls), ts).run_sync("mail both", conversation_id=CONV)
    assert got == []  # ambiguous ids in one response: nothing runs

    calls[1] = ToolCallPart("send_email", {"to": "bob"}, tool_call_id="c2")
    ts = _ledger(tmp_path / "l2.db", [send_email], {"send_email": NO_APPROVAL})
    out = _agent(Script(calls), ts).run_sync("mail both", conversation_id=CONV).output
    assert out == "done: ['sent to ada', 'sent to bob']"
    assert sorted(to for to, _ in got) == ["ada", "bob"]
    keys = {s.key for s in ts.session(CONV).recover()}
    assert {eid for _, eid in got} == keys and len(keys) == 2


def test_a_human_retry_runs_the_halted_call_once_more(tmp_path: Path) -> None:
    outbox: list[str] = []

    def send_email(to: str) -> str:
        outbox.append(to)
        if len(outbox) == 1:
            raise Crash("killed right after the request left")
        return "sent"

    calls = [ToolCallPart("send_email", {"to": "ada"}, tool_call_id="c1")]
    db = tmp_path / "l.db"
    tools: dict[str, Tool | str] = {"send_email": NO_APPROVAL}
    history = _crashed_run(_agent(Script(calls), _ledger(db, [send_email], tools)),
                           user_prompt="mail ada")
    ts = _ledger(db, [send_email], tools)
    halted = _agent(Script(calls), ts).run_sync(message_history=history, conversation_id=CONV)
    req = halted.output
    assert isinstance(req, DeferredToolRequests)
    key = req.metadata["c1"][APPROVAL_KEY]
    ts.resolve(CONV, key, "retry")  # the human checked: it never arrived
    answer = req.build_results(approve_all=True, metadata=req.metadata)
    out = _agent(Script(calls), ts).run_sync(message_history=halted.all_messages(),
                                             deferred_tool_results=answer).output
    assert out == "done: ['sent']" and outbox == ["ada", "ada"]
    # the same answer replayed runs nothing more: the call has its result
    again = _agent(Script(calls), ts).run_sync(message_history=halted.all_messages(),
                                               deferred_tool_results=answer).output
    assert again == "done: ['sent']" and outbox == ["ada", "ada"]


def test_the_same_toolset_resumes_after_an_interrupt_in_this_process(tmp_path: Path) -> None:
    """A KeyboardInterrupt-like end of a tool leaves its Session unusable; the next run in
    the same process opens the conversation anew and recovers instead of failing."""
    outbox: list[str] = []

    def send_email(to: str) -> str:
        outbox.append(to)
        if len(outbox) == 1:
            raise Crash("interrupted right after the request left")
        return "sent"

    calls = [ToolCallPart("send_email", {"to": "ada"}, tool_call_id="c1")]
    ts = _ledger(tmp_path / "l.db", [send_email], {"send_email": NO_APPROVAL})
    agent = _agent(Script(calls), ts)
    history = _crashed_run(agent, user_prompt="mail ada")
    out = agent.run_sync(message_history=history, conversation_id=CONV).output
    assert isinstance(out, DeferredToolRequests) and outbox == ["ada"]
    assert [s.key for s in ts.session(CONV).halted()] == [out.metadata["c1"][APPROVAL_KEY]]


@pytest.mark.parametrize(("answer", "result", "emails"), [
    (WasApplied("sent (per the server)"), "sent (per the server)", 1),
    (NotAppliedFenced(), "sent", 2),
])
def test_a_reconcile_call_is_answered_through_the_session_then_approved(
        tmp_path: Path, answer: WasApplied | NotAppliedFenced, result: str, emails: int) -> None:
    outbox: list[str] = []

    def send_email(to: str) -> str:
        outbox.append(to)
        if len(outbox) == 1:
            raise Crash("killed right after the request left")
        return "sent"

    calls = [ToolCallPart("send_email", {"to": "ada"}, tool_call_id="c1")]
    db = tmp_path / "l.db"
    tools: dict[str, Tool | str] = {
        "send_email": Tool(policy="reconcile", requires_approval=False)}
    history = _crashed_run(_agent(Script(calls), _ledger(db, [send_email], tools)),
                           user_prompt="mail ada")
    ts = _ledger(db, [send_email], tools)
    first = _agent(Script(calls), ts).run_sync(message_history=history, conversation_id=CONV)
    req = first.output
    assert isinstance(req, DeferredToolRequests) and req.metadata["c1"]["next"] == "reconcile"
    ts.session(CONV).reconcile(req.metadata["c1"][APPROVAL_KEY], lambda call, attempt: answer)
    out = _agent(Script(calls), ts).run_sync(
        message_history=first.all_messages(),
        deferred_tool_results=req.build_results(approve_all=True, metadata=req.metadata)).output
    assert out == f"done: [{result!r}]"
    assert len(outbox) == emails  # re-sent only after the server fenced the first attempt


def _approved_with_override(toolset: Any) -> tuple[Any, list[str]]:
    """A manual call for ``ada`` is deferred, then approved with
    ``ToolApproved(override_args={"to": "mallory"})``; returns (outcome, outbox)."""
    from pydantic_ai.tools import ToolApproved

    calls = [ToolCallPart("send_email", {"to": "ada"}, tool_call_id="c1")]
    agent = _agent(Script(calls), toolset)
    first = agent.run_sync("mail ada", conversation_id=CONV)
    req = first.output
    assert isinstance(req, DeferredToolRequests)
    answer = req.build_results(approvals={"c1": ToolApproved(override_args={"to": "mallory"})},
                               metadata=req.metadata)
    try:
        return agent.run_sync(message_history=first.all_messages(),
                              deferred_tool_results=answer).output, OUTBOX
    except Exception as exc:  # the run's own error
        return exc, OUTBOX


OUTBOX: list[str] = []


def send_email(to: str) -> str:
    OUTBOX.append(to)
    return f"sent to {to}"


def test_override_args_without_toolledger_runs_arguments_nobody_recorded() -> None:
    """The control: plain pydantic-ai runs the override (the model said ada)."""
    OUTBOX.clear()
    plain: FunctionToolset[None] = FunctionToolset()
    plain.add_function(send_email, requires_approval=True)  # pydantic-ai's own approval
    out, outbox = _approved_with_override(plain)
    assert out == "done: ['sent to mallory']" and outbox == ["mallory"]


def test_override_args_are_refused_and_nothing_is_approved_or_run(tmp_path: Path) -> None:
    OUTBOX.clear()
    ts = _ledger(tmp_path / "l.db", [send_email], {"send_email": "manual"})
    out, outbox = _approved_with_override(ts)
    assert outbox == []
    assert isinstance(out, UserError) and "override_args" in str(out), out
    assert "nothing was approved, written or run" in str(out)
    # the ledger still waits for an approval of the model's arguments, and has no dispatch
    [pending] = ts.session(CONV).pending_approvals()
    assert pending.arguments == {"to": "ada"}
    assert [row.kind for row in ts.session(CONV).audit()] == []


def test_an_override_equal_to_the_recorded_arguments_is_an_approval(tmp_path: Path) -> None:
    """Only a real difference is refused: the same arguments, re-stated, approve."""
    from pydantic_ai.tools import ToolApproved

    OUTBOX.clear()
    ts = _ledger(tmp_path / "l.db", [send_email], {"send_email": "manual"})
    agent = _agent(Script([ToolCallPart("send_email", {"to": "ada"}, tool_call_id="c1")]), ts)
    first = agent.run_sync("mail ada", conversation_id=CONV)
    req = first.output
    assert isinstance(req, DeferredToolRequests)
    answer = req.build_results(approvals={"c1": ToolApproved(override_args={"to": "ada"})},
                               metadata=req.metadata)
    out = agent.run_sync(message_history=first.all_messages(),
                         deferred_tool_results=answer).output
    assert out == "done: ['sent to ada']" and OUTBOX == ["ada"]


# --------------------------------------------------------------------------
# The ledger owns the identity (docs/protocol.md#placing-a-response): histories that
# pydantic-ai trims, loses or re-emits with new or reused ids (issue 23)
# --------------------------------------------------------------------------


def _keep_last(n: int) -> Any:
    """A history processor (``ProcessHistory``): the last ``n`` messages, starting at a
    request (pydantic-ai writes the trimmed list back into ``ctx.messages``)."""
    from pydantic_ai.messages import ModelRequest

    def trim(messages: list[ModelMessage]) -> list[ModelMessage]:
        kept = messages[-n:]
        while kept and not isinstance(kept[0], ModelRequest):
            kept = kept[1:]
        return kept
    return trim


class _Remind:
    """A FunctionModel: a user prompt ``remind <k>`` gets ONE call of ``remind``; its
    result gets a text.  ``call_id(k)`` names the call (``call_0`` always: Gemini);
    ``positions`` collects where each call's response sits in the list it was given."""

    def __init__(self, call_id: Callable[[int], str], same_args: bool) -> None:
        self.call_id, self.same_args = call_id, same_args
        self.positions: list[int] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        if _returns(last):
            return ModelResponse(parts=[TextPart(f"told: {_returns(last)}")])
        k = int(str(last.parts[-1].content).split()[-1])  # type: ignore[union-attr]
        self.positions.append(len(messages))
        text = "water the plants" if self.same_args else f"reminder {k}"
        return ModelResponse(parts=[ToolCallPart("remind", {"text": text},
                                                 tool_call_id=self.call_id(k))])


def _talk(db: Path, model: _Remind, turns: int, sent: list[str]
          ) -> tuple[list[str], LedgerToolset]:
    """``turns`` user turns through a trimming processor; the app persists
    ``all_messages()`` and passes it back each turn.  Returns what the model was told."""
    from pydantic_ai.capabilities import ProcessHistory

    def remind(text: str) -> str:
        sent.append(text)
        return f"sent #{len(sent)}"

    ts = _ledger(db, [remind], {"remind": NO_APPROVAL})
    agent = Agent(FunctionModel(model), toolsets=[ts], output_type=[str, DeferredToolRequests],
                  capabilities=[ProcessHistory(_keep_last(3))])
    history: list[ModelMessage] = []
    told = []
    for k in range(turns):
        result = agent.run_sync(f"remind {k}", message_history=history, conversation_id=CONV)
        assert isinstance(result.output, str), result.output
        told.append(result.output)
        history = result.all_messages()
    return told, ts


def _by_position(model: _Remind, db: Path) -> list[str]:
    """The control: the same responses recorded where the framework's list put them
    (the old drop-in's ``seq``): what the ledger would answer each one."""
    from toolledger import Session

    s = Session.open(SqliteStore(db.with_name("by-position.db")), CONV,
                     {"remind": NO_APPROVAL})
    out = []
    for k, at in enumerate(model.positions):
        text = "water the plants" if model.same_args else f"reminder {k}"
        calls = [{"id": model.call_id(k), "name": "remind", "arguments": {"text": text}}]
        try:
            [st] = s.record(at, calls)
        except Exception as exc:
            out.append(type(exc).__name__)
            continue
        if st.next.value == "execute":
            s.execute(st.key, lambda a: "sent")
            out.append("ran")
        else:
            out.append(st.next.value)  # an earlier call's answer, nothing run
    return out


def test_a_trimming_history_processor_with_new_ids_never_dead_ends(tmp_path: Path) -> None:
    sent: list[str] = []
    model = _Remind(lambda k: f"c{k}", same_args=False)
    told, ts = _talk(tmp_path / "l.db", model, 6, sent)
    assert sent == [f"reminder {k}" for k in range(6)]  # every call ran, once
    assert told == [f"told: ['sent #{k + 1}']" for k in range(6)]
    assert len(set(model.positions)) < len(model.positions)  # the list was trimmed
    assert [r.kind for r in ts.session(CONV).audit()] == ["dispatch"] * 6  # 6 executions
    # control: keyed by the list index, the conversation dead-ends at the first trim
    assert "InvalidInput" in _by_position(model, tmp_path / "l.db")


def test_a_reused_call_0_with_identical_arguments_runs_each_deliberate_repeat(
        tmp_path: Path) -> None:
    sent: list[str] = []
    model = _Remind(lambda k: "call_0", same_args=True)  # Gemini: call_0 on every response
    told, ts = _talk(tmp_path / "l.db", model, 4, sent)
    assert sent == ["water the plants"] * 4  # 4 of 4 reminders sent
    assert told == [f"told: ['sent #{k + 1}']" for k in range(4)]  # each its own result
    assert [r.kind for r in ts.session(CONV).audit()] == ["dispatch"] * 4  # 4 executions
    # control: keyed by the list index, repeats get an earlier call's result, unrun
    control = _by_position(model, tmp_path / "l.db")
    assert control.count("ran") < 4 and "result" in control


def test_denied_and_refused_calls_with_reused_ids_are_told_apart(tmp_path: Path) -> None:
    """pydantic-ai builds the results of a denial and a ModelRetry itself; the drop-in
    puts the key on them before the next model request, so the repeat that follows
    (same call_0, same arguments) is a new call, not the denied or refused one."""
    attempts: list[str] = []

    def send_email(to: str) -> str:
        attempts.append(to)
        if len(attempts) == 1:
            raise ModelRetry("the server refused: try again")
        return "sent"

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if any(isinstance(p, ToolReturnPart) and p.outcome == "success"
               for p in messages[-1].parts):
            return ModelResponse(parts=[TextPart(f"done: {_returns(messages[-1])}")])
        # a prompt, a denial or a refusal: the model insists, Gemini-style
        return ModelResponse(parts=[ToolCallPart("send_email", {"to": "ada"},
                                                 tool_call_id="call_0")])

    ts = _ledger(tmp_path / "l.db", [send_email], {"send_email": "manual"})
    agent = Agent(FunctionModel(model), toolsets=[ts], output_type=[str, DeferredToolRequests])
    first = agent.run_sync("mail ada", conversation_id=CONV)
    req = first.output
    assert isinstance(req, DeferredToolRequests)
    denied = agent.run_sync(message_history=first.all_messages(),
                            deferred_tool_results=req.build_results(
                                approvals={"call_0": ToolDenied()}))
    again = denied.output  # the model asked for the same call again: a new approval
    assert isinstance(again, DeferredToolRequests) and attempts == []
    assert again.metadata["call_0"][APPROVAL_KEY] != req.metadata["call_0"][APPROVAL_KEY]
    [pending] = ts.session(CONV).pending_approvals()  # the denial is in the ledger
    assert pending.key == again.metadata["call_0"][APPROVAL_KEY]
    refused = agent.run_sync(message_history=denied.all_messages(),
                             deferred_tool_results=again.build_results(
                                 approve_all=True, metadata=again.metadata))
    retry = refused.output  # refused by the server; the model's retry asks again
    assert isinstance(retry, DeferredToolRequests) and attempts == ["ada"]
    done = agent.run_sync(message_history=refused.all_messages(),
                          deferred_tool_results=retry.build_results(
                              approve_all=True, metadata=retry.metadata))
    assert done.output == "done: ['sent']" and attempts == ["ada", "ada"]
    # the denial, then two approvals, each before its dispatch
    assert [r.kind for r in ts.session(CONV).audit()] == [
        "rejected", "approved", "dispatch", "approved", "dispatch"]


def test_a_voided_approval_does_not_linger(tmp_path: Path) -> None:
    """A deferred approval the app lost (it never saved the run): the re-run model asks
    for another call; the lost one is voided, out of the inbox, never run."""
    OUTBOX.clear()
    ts = _ledger(tmp_path / "l.db", [send_email], {"send_email": "manual"})
    lost = _agent(Script([ToolCallPart("send_email", {"to": "ada"}, tool_call_id="c1")]), ts)
    assert isinstance(lost.run_sync("mail", conversation_id=CONV).output, DeferredToolRequests)
    agent = _agent(Script([ToolCallPart("send_email", {"to": "bob"}, tool_call_id="c2")]), ts)
    first = agent.run_sync("mail", conversation_id=CONV)  # the app saved nothing: re-run
    req = first.output
    assert isinstance(req, DeferredToolRequests)
    assert [c.arguments for c in ts.session(CONV).pending_approvals()] == [{"to": "bob"}]
    out = agent.run_sync(message_history=first.all_messages(),
                         deferred_tool_results=req.build_results(approve_all=True,
                                                                 metadata=req.metadata))
    assert out.output == "done: ['sent to bob']" and OUTBOX == ["bob"]
    assert "superseded" in {row.kind for row in ts.session(CONV).audit()}


_LOST = '''
import os, signal, sys
from pathlib import Path
from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.toolsets import FunctionToolset
from toolledger import SqliteStore, Tool
from toolledger.extra.pydantic_ai import LedgerToolset

mode, policy, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])

def send_email(to: str, idempotency_key: str | None = None) -> str:
    with (work / "effects.log").open("a") as f:  # the mail server: one line per email
        f.write(f"{to} {idempotency_key}\\n")
        f.flush()
        os.fsync(f.fileno())
    os.kill(os.getpid(), signal.SIGKILL)  # mid-tool: the app saved no message of the run
    return "sent"

def model(messages, info):
    return ModelResponse(parts=[ToolCallPart("send_email", {"to": "ada"}, tool_call_id="c1")])

toolset = FunctionToolset([send_email])
if mode == "ledger":
    toolset = LedgerToolset(toolset, store=SqliteStore(work / "ledger.sqlite3"),
                            tools={"send_email": Tool(policy=policy, requires_approval=False)})
Agent(FunctionModel(model), toolsets=[toolset]).run_sync("mail ada", conversation_id="conv-1")
'''


def _lost_then_rerun(work: Path, mode: str, policy: str, to: str
                     ) -> tuple[Any, LedgerToolset | None, list[str]]:
    """A child is SIGKILLed mid-tool before the app saved the model's response; the
    app re-runs the prompt (its history holds nothing of that run) and the model
    emits a NEW call id (``c2``) for ``to``.  Returns (run result, toolset, effects)."""
    script = work / "lost.py"
    script.write_text(_LOST)
    first = subprocess.run([sys.executable, str(script), mode, policy, str(work)],
                           capture_output=True, text=True, timeout=120)
    assert first.returncode == -9, first.stderr  # killed, not a clean exit
    effects = work / "effects.log"

    def send_email(to: str, idempotency_key: str | None = None) -> str:
        with effects.open("a") as f:
            f.write(f"{to} {idempotency_key}\n")
        return f"sent to {to}"

    calls = [ToolCallPart("send_email", {"to": to}, tool_call_id="c2")]
    ts = None if mode == "plain" else LedgerToolset(
        FunctionToolset([send_email]), store=SqliteStore(work / "ledger.sqlite3"),
        tools={"send_email": Tool(policy=policy, requires_approval=False)})
    toolset = FunctionToolset([send_email]) if ts is None else ts
    result = _agent(Script(calls), toolset).run_sync("mail ada", conversation_id=CONV)
    return result, ts, effects.read_text().splitlines()


@pytest.mark.parametrize("policy", ["manual", "idempotent"])
def test_a_response_lost_mid_tool_and_re_emitted_with_a_new_id_sends_once(
        tmp_path: Path, policy: str) -> None:
    result, ts, lines = _lost_then_rerun(tmp_path, "ledger", policy, "ada")
    assert ts is not None
    if policy == "idempotent":
        # the new c2 IS the lost call: retried under that call's key, applied once
        assert result.output == "done: ['sent to ada']"
        assert len(lines) == 2 and len({line.split()[1] for line in lines}) == 1
        return
    # manual: the new c2 IS the lost call, halted for a human; the conversation goes on
    req = result.output
    assert isinstance(req, DeferredToolRequests) and len(lines) == 1, lines
    meta = req.metadata["c2"]
    assert meta[RECOVERY] == "recovery_required"
    ts.resolve(CONV, meta[APPROVAL_KEY], "applied")  # the human saw it in the outbox
    out = _agent(Script([ToolCallPart("send_email", {"to": "ada"}, tool_call_id="c2")]),
                 ts).run_sync(message_history=result.all_messages(),
                              deferred_tool_results=req.build_results(
                                  approve_all=True, metadata=req.metadata)).output
    assert isinstance(out, str) and out.startswith("done: [") and "applied" in out
    assert lines == ["ada None"]  # sent once, by the killed process


def test_a_response_lost_mid_tool_is_sent_again_without_the_ledger(tmp_path: Path) -> None:
    """The control: the same kill and re-run, pydantic-ai alone: a second email."""
    plain, _, lines = _lost_then_rerun(tmp_path, "plain", "manual", "ada")
    assert plain.output == "done: ['sent to ada']" and lines == ["ada None", "ada None"]


def test_a_response_lost_mid_tool_and_re_emitted_with_another_call(tmp_path: Path) -> None:
    """The re-run model asks for another email: it runs, and the lost dispatched call
    keeps its record, recovered by its policy (manual: halted, for a human)."""
    result, ts, lines = _lost_then_rerun(tmp_path, "ledger", "manual", "bob")
    assert ts is not None
    assert result.output == "done: ['sent to bob']"
    assert [line.split()[0] for line in lines] == ["ada", "bob"]  # each once
    session = ts.session(CONV)
    [halted] = session.halted()
    assert halted.call.arguments == {"to": "ada"} and halted.call.tool_call_id == "c1"
    assert "superseded" in {row.kind for row in session.audit()}
    session.resolve(halted.key, "applied")
    assert session.halted() == []


def test_no_ledger_store_call_runs_on_the_event_loops_thread(tmp_path: Path) -> None:
    """Recording, parking the approval, approving, dispatching and recording the
    outcome all run off the loop (the toolset awaits its AsyncSession); the control,
    the toolset's synchronous ``session()`` called on the loop, is caught by the same
    probe (tests/test_async_session.py's)."""
    outbox: list[str] = []

    def send_email(to: str) -> str:
        outbox.append(to)
        return f"sent to {to}"

    w, store = watched(SqliteStore(tmp_path / "l.db"))
    ts = LedgerToolset(FunctionToolset([send_email]), store=store,
                       tools={"send_email": "manual"})  # approval required
    agent = _agent(Script([ToolCallPart("send_email", {"to": "ada"}, tool_call_id="c1")]), ts)

    async def main() -> tuple[int, object, int]:
        first = await agent.run("mail ada", conversation_id=CONV)
        requests = first.output
        assert isinstance(requests, DeferredToolRequests)
        done = await agent.run(message_history=first.all_messages(),
                               deferred_tool_results=requests.build_results(
                                   approve_all=True, metadata=requests.metadata))
        during = len(w.threads)
        ts.session(CONV).audit()  # the control: a blocking read on the loop
        return threading.get_ident(), done.output, during

    loop_thread, output, during = asyncio.run(main())
    assert (output, outbox) == ("done: ['sent to ada']", ["ada"])
    names = [name for name, _ in w.threads[:during]]
    assert names.count("commit") >= 4, names  # record, approve, dispatched, outcome
    assert [n for n, t in w.threads[:during] if t == loop_thread] == []
    assert [n for n, t in w.threads[during:] if t == loop_thread] == ["audit"]
