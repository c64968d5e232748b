"""Real SIGKILLs for agent frameworks: the framework alone (control) vs with toolledger.

One *run* is one conversation of a framework's agent, driven by a scripted model
(no LLM, no network), whose one tool call ``send_email(to="ada")`` is a request to
a mail server: a JSON-lines file in the run's directory, appended and fsynced per
request, the independent record of every email sent (``applied``: the server
deduplicates on an idempotency key; a request without one is always sent).

The first process runs the conversation and is killed with SIGKILL at a crash
point; the next one resumes it the way the framework documents (LangGraph:
``graph.invoke(None, config)`` on the same thread of a ``SqliteSaver`` with
durability ``"sync"``; pydantic-ai: the saved message history, no new prompt) and,
with ``human=True``, answers what the ledger asks as a careful human would (an
approval: approve; a ``recovery_required`` call: ``applied`` with the server's
reply if the server's log has the email, else ``retry``) until the conversation
ends. Crash points (:data:`POINTS`): after the calls were recorded, after the
approval, after ``dispatched``, right after the effect (before anything records
it), after the ledger recorded the result (before the framework checkpointed it),
and right after the effect AND again in the resuming process's first ledger
commit (a crash in recovery itself).

:func:`run` returns what the mail server and the final conversation show;
:func:`check` counts what went wrong (duplicates, fabricated or lost results,
unsettled calls, processes that died of an error). The children import the
framework; this module itself is stdlib-only.

``python -m toolledger.kit.frameworks --child ...`` is the child's entry point.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

__all__ = [
    "COUNTERS",
    "FRAMEWORKS",
    "POINTS",
    "RunResult",
    "campaign",
    "check",
    "points_on_path",
    "run",
    "side_by_side",
]

FRAMEWORKS: Final = ("langgraph", "pydantic-ai")
POINTS: Final = ("after_record", "after_approval", "after_dispatch", "after_effect",
                 "after_result", "after_effect+in_recovery")
COUNTERS: Final = ("duplicates", "fabricated", "lost", "unsettled", "child_errors")
MAIL: Final = "mail.jsonl"
THREAD: Final = "thread-1"
TIMEOUT: Final = 120.0


def points_on_path(framework: str, policy: str) -> tuple[str, ...]:
    """The crash points a run of ``policy`` passes through."""
    del framework, policy  # every run records, is approved, dispatches, applies, records
    return POINTS


@dataclass(frozen=True, slots=True)
class RunResult:
    framework: str
    mode: str  # "plain" (the framework alone), "ledger", or "late-dispatch" (a broken twin)
    policy: str
    point: str
    returncodes: tuple[int, ...]  # one per process, in order (-9: SIGKILLed)
    mail: tuple[Mapping[str, Any], ...]  # the server's log
    final: str | None  # the tool result the model saw at the end (None: never)
    asked: tuple[str, ...]  # what the resuming process was asked (kinds)
    stderr: str = ""
    seconds: float = 0.0

    @property
    def requests(self) -> int:
        return len(self.mail)

    @property
    def applied(self) -> int:
        """Emails the server really sent."""
        return sum(1 for m in self.mail if m["applied"])


@dataclass
class Counts:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    problems: list[str] = field(default_factory=list)

    def bad(self, counter: str, what: str) -> None:
        self.counts[counter] += 1
        self.problems.append(f"{counter}: {what}")


def check(r: RunResult) -> Counts:
    """What went wrong in a finished run (``human=True``), against the server's log."""
    out = Counts()
    killed = r.returncodes[:-1]
    if any(code != -signal.SIGKILL for code in killed) or r.returncodes[-1] != 0:
        out.bad("child_errors", f"exit codes {r.returncodes}: {r.stderr[-800:]}")
    sent = [m for m in r.mail if m["applied"]]
    if len(sent) > 1:
        out.bad("duplicates", f"the email was sent {len(sent)} times")
    if r.final is None:
        out.bad("unsettled", "the conversation never got the call's result")
    elif sent and r.final != sent[0]["reply"]:
        out.bad("fabricated" if "sent" in r.final else "lost",
                f"the model saw {r.final!r}, the server replied {sent[0]['reply']!r}")
    elif not sent and "sent" in r.final:
        out.bad("fabricated", f"the model saw {r.final!r}, the server sent nothing")
    elif not sent:
        out.bad("lost", f"the email was never sent, the model saw {r.final!r}")
    return out


def run(framework: str, mode: str, policy: str, point: str, work: Path, *,
        human: bool = True, approval: bool = True, fork: bool = False) -> RunResult:
    """One run in ``work`` (a fresh directory): a killed process, then resuming ones.

    Each process is a new interpreter (``python -m toolledger.kit.frameworks --child``),
    or, with ``fork=True``, a fork of this one with the framework already imported
    (much faster; only from a process with no other threads running)."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"unknown framework {framework!r}; one of {FRAMEWORKS}")
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}; one of {POINTS}")
    work.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    first_point, _, again = point.partition("+")
    phases = [("first", first_point), ("resume", again or "none")]
    if again:
        phases.append(("resume", "none"))
    codes, err, final, asked = [], "", None, ()
    for phase, kill in phases:
        args = [framework, mode, policy, kill, phase, str(work), "1" if human else "0",
                "1" if approval else "0"]
        code, stdout, stderr = _forked(args) if fork else _spawned(args)
        codes.append(code)
        err += stderr
        if code == 0 and stdout.strip():
            out = json.loads(stdout.strip().splitlines()[-1])
            final, asked = out["final"], tuple(out["asked"])
    return RunResult(framework, mode, policy, point, tuple(codes), tuple(_mail(work)), final,
                     asked, err, time.monotonic() - start)


def _spawned(args: list[str]) -> tuple[int, str, str]:
    p = subprocess.run([sys.executable, "-m", "toolledger.kit.frameworks", "--child", *args],
                       capture_output=True, text=True, timeout=TIMEOUT,
                       env={**os.environ, "PYTHONPATH": _pythonpath()})
    return p.returncode, p.stdout, p.stderr


def _forked(args: list[str]) -> tuple[int, str, str]:
    """The child in a fork of this process: a real process, really SIGKILLed."""
    _preload(args[0])
    work = Path(args[5])
    out, err = work / "child.out", work / "child.err"
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        code = 70
        try:
            signal.alarm(int(TIMEOUT))  # a hung child dies
            with out.open("w") as o, err.open("w") as e:
                os.dup2(o.fileno(), 1)
                os.dup2(e.fileno(), 2)
                sys.stdout, sys.stderr = o, e
                try:
                    code = child_main(args)
                except BaseException:
                    import traceback
                    traceback.print_exc()
                    code = 1
                o.flush()
                e.flush()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return code, out.read_text(), err.read_text()


def _preload(framework: str) -> None:
    """Import the framework once, in the parent, so that forks start warm."""
    if framework == "langgraph":
        import langgraph.prebuilt  # noqa: F401

        import toolledger.extra.langgraph
    else:
        import pydantic_ai  # noqa: F401

        import toolledger.extra.pydantic_ai  # noqa: F401


def _pythonpath() -> str:
    here = str(Path(__file__).resolve().parents[2])  # reference/
    return os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])])


def _mail(work: Path) -> list[dict[str, Any]]:
    path = work / MAIL
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def campaign(frameworks: Sequence[str], policies: Sequence[str], base: Path, *,
             points: Callable[[str, str], Sequence[str]] = points_on_path,
             ) -> list[tuple[RunResult, Counts]]:
    """Every crash point on each policy's path (``points(framework, policy)``), per
    framework, plus the control at ``after_effect`` (its duplicate must be seen, or the
    checks would be blind). Forked children, one at a time."""
    specs = [(fw, "ledger", pol, pt) for fw in frameworks for pol in policies
             for pt in points(fw, pol)]
    specs += [(fw, "plain", "manual", "after_effect") for fw in frameworks]
    out = []
    for i, (fw, mode, pol, pt) in enumerate(specs):
        r = run(fw, mode, pol, pt, base / f"{i:03d}-{fw}-{mode}-{pol}-{pt}", fork=True)
        out.append((r, check(r)))
    return out


def side_by_side(framework: str, base: Path, *, workers: int = 2) -> list[dict[str, Any]]:
    """The table of a notebook: the framework alone vs with toolledger, SIGKILLed right
    after the email left, then resumed the framework's way (a human answers what the
    ledger asks). One row per run: requests the server got, emails it sent, what the
    resuming process asked, what the model saw at the end."""
    specs = [("plain", "manual"), ("ledger", "manual"), ("ledger", "idempotent"),
             ("ledger", "reconcile")]

    def one(i: int) -> dict[str, Any]:
        mode, pol = specs[i]
        r = run(framework, mode, pol, "after_effect", base / f"{framework}-{mode}-{pol}",
                approval=False)
        return {"framework": framework, "with": "toolledger" if mode == "ledger" else
                "nothing (control)", "policy": pol if mode == "ledger" else "-",
                "requests": r.requests, "emails sent": r.applied,
                "asked a human": ", ".join(r.asked) or "-", "model saw": r.final,
                **check(r).counts}

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, range(len(specs))))


# ==========================================================================
# The child process
# ==========================================================================


@dataclass
class _Child:
    framework: str
    mode: str
    policy: str
    kill: str  # the crash point of this process ("none": never)
    phase: str  # "first" or "resume"
    work: Path
    human: bool
    approval: bool
    asked: list[str] = field(default_factory=list)
    in_tool: bool = False

    def die(self, where: str) -> None:
        if where == self.kill or (self.kill == "in_recovery" and where.startswith("commit")):
            sys.stderr.write(f"KILLED-AT {where}\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    # -- the mail server -------------------------------------------------------------

    def send(self, to: str, execution_id: str, idempotency_key: str | None) -> str:
        """The server: sends (or deduplicates on the key), logs it fsynced, replies."""
        log = _mail(self.work)
        done = next((m for m in log if idempotency_key and m["key"] == idempotency_key
                     and m["applied"]), None)
        reply = done["reply"] if done else f"sent to {to} as #{len(log) + 1}"
        with (self.work / MAIL).open("a") as f:
            f.write(json.dumps({"to": to, "eid": execution_id, "key": idempotency_key,
                                "applied": done is None, "reply": reply}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.die("after_effect")
        return reply

    def server_says(self, execution_id: str) -> str | None:
        """What a human (or the reconcile connector) finds in the server's log."""
        return next((m["reply"] for m in _mail(self.work)
                     if m["eid"] == execution_id and m["applied"]), None)

    def reconcile(self, call: Any, attempt: int) -> Any:
        from toolledger import NotAppliedFenced, WasApplied
        reply = self.server_says(call.key)
        # no request can be in flight: the process that sent it is dead
        return WasApplied(reply) if reply is not None else NotAppliedFenced()

    def resolution(self, key: str) -> Any:
        reply = self.server_says(key)
        return {"type": "applied", "result": reply} if reply is not None else "retry"

    def store(self, path: Path) -> Any:
        """A SqliteStore that dies right after the commits of the crash points."""
        from toolledger import SqliteStore
        child = self

        class KillingStore(SqliteStore):
            def commit(self, session_id: str, before: Any, after: Any, audit_rows: Any, *,
                       arguments: Any = None, epoch: int | None = None,
                       create: bool = False) -> None:
                super().commit(session_id, before, after, audit_rows, arguments=arguments,
                               epoch=epoch, create=create)
                for where in _points_of(before, after):
                    child.die(where)
                child.die("commit")

        return KillingStore(path)

    def tool(self) -> Callable[..., str]:
        return self.send

    def policies(self) -> dict[str, Any]:
        from toolledger import Tool
        return {"send_email": Tool(policy=self.policy, requires_approval=self.approval)}

    def emit(self, final: str | None) -> None:
        print(json.dumps({"final": final, "asked": self.asked}))


def _points_of(before: Any, after: Any) -> list[str]:
    from toolledger._core.state import ApprovalState, LedgerStatus, MessageState
    out = []
    if any(c.message is MessageState.DURABLE for c in after.calls) and not any(
            c.message is MessageState.DURABLE for c in before.calls):
        out.append("after_record")
    if any(v is ApprovalState.APPROVED and before.approvals.get(k) is not v
           for k, v in after.approvals.items()):
        out.append("after_approval")
    for eid, rec in after.ledger.items():
        old = before.ledger.get(eid)
        if rec.status is LedgerStatus.DISPATCHED and (
                old is None or (old.status, old.attempt) != (rec.status, rec.attempt)):
            out.append("after_dispatch")
        if rec.status is LedgerStatus.SUCCEEDED and (old is None or old.status is not
                                                     rec.status):
            out.append("after_result")
    return out


def _langgraph(c: _Child) -> None:
    from typing import Annotated

    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import InjectedToolArg, tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition
    from langgraph.types import Command

    from toolledger.extra.langgraph import LedgerToolNode, ledger_path, open_saver

    def send(to: str, execution_id: str = "", idempotency_key: str | None = None) -> str:
        """Send an email to ``to``."""
        return c.send(to, execution_id, idempotency_key)

    # the ledger's arguments, injected (hidden from the model), the LangChain way; set as
    # objects because this module's annotations are strings its globals cannot resolve
    send.__annotations__ = {"to": str, "execution_id": Annotated[str, InjectedToolArg],
                            "idempotency_key": Annotated[str | None, InjectedToolArg],
                            "return": str}
    send.__name__ = "send_email"
    send_email = tool(send)

    def agent(state: MessagesState) -> dict[str, Any]:
        last = state["messages"][-1]
        if isinstance(last, ToolMessage):
            return {"messages": [AIMessage(content=f"done: {last.content}")]}
        return {"messages": [AIMessage(content="", tool_calls=[
            {"name": "send_email", "args": {"to": "ada"}, "id": "call_0"}])]}

    saver = open_saver(c.work / "checkpoints.sqlite")
    node: ToolNode
    if c.mode in ("ledger", "late-dispatch"):
        kind = LedgerToolNode if c.mode == "ledger" else _late_dispatch_node()
        node = kind([send_email], store=c.store(ledger_path(saver)),
                    policies=c.policies(), reconcilers={"send_email": c.reconcile}
                    if c.policy == "reconcile" else None)
    else:
        node = ToolNode([send_email])
    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", node)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    graph: Any = g.compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": THREAD}}
    if c.phase == "first":
        out = graph.invoke({"messages": [("user", "Mail Ada the report")]}, config,
                           durability="sync")
    else:
        out = graph.invoke(None, config, durability="sync")  # resume, as the docs say
    while out.get("__interrupt__"):
        requests = [r for i in out["__interrupt__"] for r in i.value["toolledger"]]
        c.asked += [r["kind"] for r in requests]
        if c.phase == "resume" and not c.human:
            c.emit(None)
            return
        answer = {r["key"]: "approve" if r["kind"] == "approval" else c.resolution(r["key"])
                  for r in requests}
        out = graph.invoke(Command(resume=answer), config, durability="sync")
    last = out["messages"][-1].content
    c.emit(last.removeprefix("done: ") if isinstance(last, str) else str(last))


def _late_dispatch_node() -> Any:
    """A broken twin of ``LedgerToolNode`` for the checks to catch: the tool runs BEFORE
    ``dispatched`` is durable (the order a hand-rolled integration easily gets wrong), so
    a crash right after the effect leaves no trace of it in the ledger."""
    from langgraph.prebuilt.tool_node import ToolCallRequest

    from toolledger import Next
    from toolledger.extra.langgraph import LedgerToolNode

    class LateDispatch(LedgerToolNode):
        def _wrap(self, request: ToolCallRequest, execute: Any) -> Any:
            run, status = self._call_of(request)
            if run is None or status is None or status.next is not Next.EXECUTE:
                return super()._wrap(request, execute)
            value = execute(request)  # the effect, with nothing durable about it yet
            with run.session.dispatch(status.key) as a:
                a.done(value.content)
            return value

    return LateDispatch


def _pydantic_ai(c: _Child) -> None:
    import asyncio

    from pydantic_ai import Agent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelMessagesTypeAdapter,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.tools import DeferredToolRequests
    from pydantic_ai.toolsets import FunctionToolset

    from toolledger.extra.pydantic_ai import APPROVAL_KEY, LedgerToolset

    def send_email(to: str, execution_id: str = "", idempotency_key: str | None = None) -> str:
        return c.send(to, execution_id, idempotency_key)

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        results = [p.content for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        if results:
            return ModelResponse(parts=[TextPart(f"done: {results[0]}")])
        return ModelResponse(parts=[ToolCallPart("send_email", {"to": "ada"},
                                                 tool_call_id="call_0")])

    checkpoint = c.work / "messages.json"
    ledger: LedgerToolset | None = None
    toolset: Any = FunctionToolset([send_email])
    if c.mode == "ledger":
        ledger = LedgerToolset(toolset, store=c.store(c.work / "ledger.sqlite3"),
                               tools=c.policies())
        toolset = ledger
    agent = Agent(FunctionModel(model), toolsets=[toolset],
                  output_type=[str, DeferredToolRequests])

    async def first() -> Any:
        async with agent.iter("Mail Ada the report", conversation_id=THREAD) as run:
            async for node in run:
                if Agent.is_call_tools_node(node):  # the app checkpoints the response
                    checkpoint.write_bytes(ModelMessagesTypeAdapter.dump_json(
                        run.all_messages()))
            return run.result

    if c.phase == "first":
        result = asyncio.run(first())
    else:
        history = ModelMessagesTypeAdapter.validate_json(checkpoint.read_bytes())
        result = agent.run_sync(message_history=history, conversation_id=THREAD)
    while isinstance(result.output, DeferredToolRequests):
        assert ledger is not None  # only the ledger defers
        req = result.output
        metas = [req.metadata.get(a.tool_call_id, {}) for a in req.approvals]
        c.asked += [m.get("toolledger", "approval") for m in metas]
        if c.phase == "resume" and not c.human:
            c.emit(None)
            return
        session = ledger.session(THREAD)
        for m in metas:
            if m.get("next") == "reconcile":
                session.reconcile(m[APPROVAL_KEY], c.reconcile)
            elif m.get("toolledger") == "recovery_required":
                r = c.resolution(m[APPROVAL_KEY])
                if isinstance(r, dict):
                    ledger.resolve(THREAD, m[APPROVAL_KEY], "applied", result=r["result"])
                else:
                    ledger.resolve(THREAD, m[APPROVAL_KEY], r)
        result = agent.run_sync(message_history=result.all_messages(),
                                deferred_tool_results=req.build_results(
                                    approve_all=True, metadata=req.metadata))
    out = result.output
    c.emit(out.removeprefix("done: ") if isinstance(out, str) else None)


def child_main(argv: Sequence[str]) -> int:
    framework, mode, policy, kill, phase, work, human, approval = argv
    c = _Child(framework, mode, policy, kill, phase, Path(work), human == "1",
               approval == "1" and mode != "plain")
    {"langgraph": _langgraph, "pydantic-ai": _pydantic_ai}[framework](c)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        raise SystemExit(child_main(sys.argv[2:]))
    raise SystemExit("usage: python -m toolledger.kit.frameworks --child FRAMEWORK MODE "
                     "POLICY KILL PHASE WORK HUMAN APPROVAL (see the module doc)")
