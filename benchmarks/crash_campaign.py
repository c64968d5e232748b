"""The crash campaign: real processes, real SIGKILLs, on SqliteStore, for every policy.

What it does
------------
A *run* is one session of the engine adoption kit (``TurnEngine``, ledger
mode) on a :class:`~toolledger._core.sqlite_store.SqliteStore`, with the
conversation in a :class:`~toolledger.kit.engine.FileConversationStore` and the
tool's external system a :class:`~toolledger.kit.external.CountingExternalSystem`
in its durable mode: its own fsynced JSON-lines file, a separate record of
every request it received and every effect it applied.  The session has two
user turns, each asking for one approved call of the tool, both with the
provider id ``call_0`` (reused, as Gemini does).  Every run happens in child
processes (``python benchmarks/crash_campaign.py --child ...``): the first
runs the session and is killed with SIGKILL, each next one resumes from what
is on disk (and may be killed too), the last one finishes (resume, answer
``recovery_required`` items as a careful human would: "applied" with the
result the external system really returned if the effect is there, "abandon"
if it is not and nothing is in flight).  Late requests still in flight land
before some resumes and at the end.

How the child dies:

- ``point``: at each enumerated crash point of the ledger engine
  (:func:`toolledger.kit.engine.crash_points`, the ones on the policy's path),
  through :class:`~toolledger.kit.engine.CrashInjector` with ``how="sigkill"``;
- ``io``: at the k-th I/O boundary, for EVERY k of a complete run (or k
  drawn at random): before every SQL statement the store runs (so also
  between ``BEGIN`` and ``COMMIT``, and while the store is being created),
  before and after every conversation checkpoint, before and after every
  event of the external system's log.  Between two such boundaries nothing
  durable changes, so for a single crash these are all the crash moments
  that differ in what survives;
- ``timer``: by the parent, a random delay after the child said it is ready
  (which can land inside a system call, a write or an fsync);
- ``multi``: ``io`` kills in the first AND in later (resuming) processes,
  with scripted external faults (lost answers, time-outs, definite
  rejections, a connector that cannot tell), so crashes hit recovery itself;
- ``fused``: ``io`` kills of the engine's fused path (``TurnEngine(fused=True)``,
  the tool needs no approval): the first commit creates the session, records
  the call and dispatches it;
- ``together``: ``io`` kills of the together path (``TurnEngine(together=True)``,
  ``Session.execute_message(..., together=True)``) on a script whose messages
  have TWO calls each (:data:`SCRIPT_TOGETHER`): [record + both
  ``dispatched``], both bodies, [both outcomes + results], so a kill between
  the two commits leaves both calls dispatched-and-unknown.

After every process the parent reads what survived (a copy of the store,
the conversation file, the external log) and checks, against the external
system's own record:

- ``duplicates``: a protected call's effect applied more than once, counted
  both per execution id and, independently of ids, per arguments (each call
  of the scenario has its own arguments: the same arguments applied twice
  are the same email sent twice);
- ``lost``: a result that was durable (in the ledger or the conversation)
  later gone or changed, or a result the ledger holds missing from the final
  conversation;
- ``fabricated``: a success result whose text is not what the external
  system returned for that execution (or for an execution never applied);
- ``contradicted``: an error/abandoned result for an execution that was applied;
- ``unsettled``: a call left with neither a result nor ``recovery_required``;
- ``store_unusable``: the store refused to open after a plain crash;
- ``child_errors``: a process that died of an exception rather than the kill.

Goal: all zero, with at least 200 kills.  The legacy engine is run through
the same harness at its crash points as a control: the checks must see its
duplicates, or they would be blind.

Also: the store file truncated at, or corrupted in, a random byte: a
resuming process must fail closed (a clear ``StoreCorrupt`` error, exit
status 3, nothing executed: the external log and the store byte for byte
unchanged), unless the damage hit bytes the store does not use (then the
data read back must be identical) or rows the resume does not read, such as
an audit row's index entry (then the resume may complete, must apply no
effect twice, and every later read of those rows must fail closed with
``StoreCorrupt``).  Anything else is ``silent``.  And a fuzz of bad inputs through the
public API (tool-call ids, arguments, policies, events, resolutions, paths):
only the documented typed errors may come out.

``python benchmarks/crash_campaign.py [--smoke]``: the full campaign takes a
few minutes with 2 runs in parallel.

A SIGKILL loses no write the kernel accepted: what a power cut leaves (unsynced
writes lost or torn, unsynced directory entries missing) is the power-loss
harness's, :mod:`benchmarks.power_loss`, which replays this store's recorded
writes and syncs into every such state and opens each one.

The same runs on PostgreSQL: ``RunSpec(postgres=conninfo)`` (the child's
``--postgres``) puts the run's store in its own schema of that server, the
I/O boundaries being the statements the ``PostgresStore`` sends;
``bench_pg_faults.py`` uses it, with server faults at the k-th statement
(``--pg-fault``): a child that stops on a ``StoreError`` other than
corruption exits with ``EXIT_UNAVAILABLE`` and the next process resumes.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from toolledger._core.commit_plan import AuditRow, plan_commit, working_set
from toolledger._core.protocol import (
    CallPosition,
    InvalidInput,
    LedgerStatus,
    ProtocolError,
    RecoveryPolicy,
    ResultKind,
)
from toolledger._core.sqlite_store import SqliteStore
from toolledger._core.state import SessionState
from toolledger._core.stores import Store, StoreCorrupt, StoreError, UnsupportedSchema
from toolledger._core.tools import ToolRegistry
from toolledger.kit.engine import (
    SEED_MATRIX,
    CrashInjector,
    EngineMode,
    FileConversationStore,
    ScriptedHuman,
    ScriptedProvider,
    TurnEngine,
    TurnResult,
    TurnStatus,
    crash_points,
    parse_crash_point,
    tool_call,
)
from toolledger.kit.external import CountingAdapter, CountingExternalSystem, Fault, RequestStatus

SESSION = "campaign"
TOOL = "send_email"
USERS = ("Email Ada the Q3 report.", "Now email Bob the Q4 report.")
SCRIPT: list[Any] = [
    [tool_call("call_0", TOOL, {"to": "ada@example.com", "subject": "Q3"})],
    "Sent to Ada.",
    [tool_call("call_0", TOOL, {"to": "bob@example.com", "subject": "Q4"})],
    "Sent to Bob.",
]
# The together runs: two calls per assistant message (ids reused across turns,
# each call with its own arguments), so one message's record commit dispatches
# both and one commit records both outcomes.
SCRIPT_TOGETHER: list[Any] = [
    [tool_call("call_0", TOOL, {"to": "ada@example.com", "subject": "Q3"}),
     tool_call("call_1", TOOL, {"to": "cy@example.com", "subject": "Q3"})],
    "Sent to Ada and Cy.",
    [tool_call("call_0", TOOL, {"to": "bob@example.com", "subject": "Q4"}),
     tool_call("call_1", TOOL, {"to": "dee@example.com", "subject": "Q4"})],
    "Sent to Bob and Dee.",
]
STORE = "ledger.sqlite3"
CONVERSATION = "conversation"
EXTERNAL = "external.jsonl"
EXIT_FAIL_CLOSED = 3
EXIT_UNAVAILABLE = 4  # a StoreError other than corruption: the server went away (PostgreSQL)
THIS = Path(__file__).resolve()

# ==========================================================================
# Broken cores: the checks must see them (tests/test_crash_campaign.py)
# ==========================================================================


def _break_together_dispatch() -> None:
    """Broken on purpose: a together message's ``dispatched`` joins its OUTCOME commit.

    The record commit of a message (calls that become durable in it) makes the
    calls durable but holds back their ``dispatched`` records and audit rows;
    the bodies run; the held rows are written with the next commit (the
    message's outcomes).  In memory the session believes they are durable, so
    the engine acts as usual; on disk a kill between the two commits leaves
    the calls recorded and never dispatched, though their effects may be out:
    a restarted engine runs them again.  Installed in the child
    (``--broken late-dispatch``) by patching :meth:`SqliteStore.commit`.
    """
    real = SqliteStore.commit
    held: dict[int, tuple[SessionState, list[AuditRow]]] = {}  # by store object

    def commit(self: SqliteStore, session_id: str, before: SessionState,
               after: SessionState, audit_rows: Sequence[AuditRow], *,
               arguments: Mapping[CallPosition, Mapping[str, Any]] | None = None,
               epoch: int | None = None, create: bool = False) -> None:
        rows = list(audit_rows)
        if id(self) in held and plan_commit(session_id, before, after, rows, arguments).empty:
            return  # a volatile step: nothing to write, the dispatches stay held
        late = held.pop(id(self), None)
        if late is not None:  # the held dispatches go with this (the outcome) commit
            before, rows = late[0], [*late[1], *rows]
        new_calls = ({c.execution_id for c in after.calls}
                     - {c.execution_id for c in before.calls})
        hold = [r for r in rows if r.kind == "dispatch" and r.execution_id in new_calls]
        if late is None and hold:
            eids = {r.execution_id for r in hold}
            ledger = {e: rec for e, rec in after.ledger.items() if e not in eids}
            ledger.update({e: before.ledger[e] for e in eids if e in before.ledger})
            mid = replace(after, ledger=ledger, audit=after.audit - {
                (r.execution_id, r.kind, r.attempt) for r in hold})
            real(self, session_id, before, mid, [r for r in rows if r not in hold],
                 arguments=arguments, epoch=epoch, create=create)
            held[id(self)] = (working_set(mid), hold)  # what the ledger keeps, as it does
            return
        real(self, session_id, before, after, rows, arguments=arguments, epoch=epoch,
             create=create)

    SqliteStore.commit = commit  # type: ignore[method-assign]


BROKEN: Mapping[str, Callable[[], None]] = {"late-dispatch": _break_together_dispatch}

# ==========================================================================
# The child process
# ==========================================================================


class Killer:
    """Counts I/O boundaries; SIGKILLs this process at the k-th (0: never)."""

    def __init__(self, kill_at: int) -> None:
        self.kill_at = kill_at
        self.count = 0
        self.labels: list[str] = []  # of a counting run (--count-io): where each boundary is

    def boundary(self, label: str) -> None:
        self.count += 1
        self.labels.append(label)
        if self.count == self.kill_at:
            sys.stderr.write(f"KILLED-AT {self.count} {label}\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def sql_label(sql: str) -> str:
    """A short name of a statement: ``before SQL INSERT calls``, ``before SQL COMMIT``."""
    words = sql.replace("(", " ").split()
    head = words[0].upper() if words else "?"
    upper = [w.upper() for w in words]
    target = ""
    for marker in ("FROM", "INTO", "UPDATE"):
        if marker in upper[:-1]:
            target = words[upper.index(marker) + 1]
            break
    if head == "PRAGMA":
        target = words[1].split("=")[0] if len(words) > 1 else ""
    elif head == "CREATE":
        target = "(schema)"
    elif head == "BEGIN" and len(words) > 1:
        target = words[1].upper()
    return f"before SQL {head} {target}".rstrip()


def _install_sql_hook(killer: Killer) -> None:
    """Every connection SqliteStore opens counts its statements as boundaries."""

    class Counting(sqlite3.Connection):
        def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
            killer.boundary(sql_label(sql))
            return super().execute(sql, parameters)

    real = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        kwargs.setdefault("factory", Counting)
        conn: sqlite3.Connection = real(*args, **kwargs)
        return conn

    sqlite3.connect = connect  # type: ignore[assignment]


class KilledConversations(FileConversationStore):
    def __init__(self, directory: Path, killer: Killer) -> None:
        super().__init__(directory)
        self.killer = killer

    def _write(self, path: Path, text: str) -> None:
        self.killer.boundary(f"before conversation write {path.name}")
        super()._write(path, text)
        self.killer.boundary(f"after conversation write {path.name}")


class KilledExternal(CountingExternalSystem):
    def __init__(self, path: Path, killer: Killer) -> None:
        self.killer = killer
        super().__init__(path)

    def _record(self, event: dict[str, Any]) -> None:
        self.killer.boundary(f"before external {event['op']}")
        super()._record(event)
        self.killer.boundary(f"after external {event['op']}")


def _human_resolves(engine: TurnEngine, system: CountingExternalSystem,
                    halted: Sequence[tuple[int, int]]) -> TurnResult | None:
    """A careful human looks at the external system before answering a halted call."""
    items = {i.position: i for i in engine.recovery_required()}
    for pos in halted:
        item = items.get(pos)
        if item is None:
            continue
        mine = [r for r in system.requests if r.execution_id == item.execution_id]
        applied = [r for r in mine if r.status in (RequestStatus.APPLIED,
                                                    RequestStatus.DEDUPLICATED)]
        if applied and applied[0].result is not None:
            return engine.resolve_recovery(pos, "applied", result_text=applied[0].result)
        if not any(r.status is RequestStatus.IN_FLIGHT for r in mine):
            return engine.resolve_recovery(pos, "abandon")
    return None


def pg_schema(d: Path) -> str:
    """The PostgreSQL schema of the run in directory ``d`` (one schema per run)."""
    return "run_" + "".join(c if c.isalnum() else "_" for c in d.name.lower())[:50]


def open_store(d: Path, postgres: str | None) -> Store:
    """The run's store: the SQLite file in ``d``, or its schema on a PostgreSQL server."""
    if postgres is None:
        return SqliteStore(d / STORE)
    from toolledger._core.postgres_store import PostgresStore

    return PostgresStore(postgres, schema=pg_schema(d), connect_timeout=5)


def _drive(mode: EngineMode, policy: RecoveryPolicy, store: Store | None,
           conversations: FileConversationStore, system: CountingExternalSystem,
           crash: CrashInjector, final: bool, fused: bool = False,
           together: bool = False) -> str:
    # fused: the tool needs no approval and the engine runs each message with
    # Session.execute_message on a lazily created session, so the first commit
    # creates the session, records the call and dispatches it (TurnEngine(fused=True));
    # together: the same with execute_message(together=True) (TurnEngine(together=True)),
    # on the two-call messages of SCRIPT_TOGETHER
    registry = ToolRegistry()
    registry.register(TOOL, CountingAdapter(system, TOOL, on_request_sent=crash.request_sent),
                      policy=policy, requires_approval=not (fused or together))
    engine = TurnEngine(session_id=SESSION, mode=mode, registry=registry,
                        provider=ScriptedProvider(SCRIPT_TOGETHER if together else SCRIPT),
                        human=ScriptedHuman(default="approve"),
                        conversations=conversations, store=store, crash=crash, fused=fused,
                        together=together)

    def users() -> int:
        return sum(1 for m in engine.messages if m.get("role") == "user")

    result = engine.run(USERS[0]) if users() == 0 else engine.resume()
    for _ in range(10):
        if result.status is TurnStatus.RECOVERY_REQUIRED:
            if final:
                system.deliver_in_flight()  # the network catches up before the human looks
            answered = _human_resolves(engine, system, result.halted)
            if answered is None:
                break
            result = answered
        elif result.status is TurnStatus.DONE and users() < len(USERS):
            result = engine.run(USERS[users()])
        else:
            break
    return result.status.value


def child_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="crash_campaign.py --child")
    p.add_argument("--child", action="store_true", required=True)
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--mode", default="ledger")
    p.add_argument("--policy", required=True)
    p.add_argument("--crash-at")
    p.add_argument("--kill-at-io", type=int, default=0)
    p.add_argument("--count-io", action="store_true")
    p.add_argument("--fault", action="append", default=[])
    p.add_argument("--deliver-first", action="store_true")
    p.add_argument("--final", action="store_true")
    p.add_argument("--fused", action="store_true", help="TurnEngine(fused=True), no approval")
    p.add_argument("--together", action="store_true",
                   help="TurnEngine(together=True), no approval, two calls per message")
    p.add_argument("--broken", default="", choices=["", *BROKEN],
                   help="a deliberately broken core (tests only: the checks must see it)")
    p.add_argument("--postgres", help="conninfo: the store is a PostgresStore on this server")
    p.add_argument("--pg-fault", default="", help="a server fault (bench_pg_faults.FAULTS)")
    p.add_argument("--pg-fault-at", type=int, default=0, help="... at this SQL statement")
    p.add_argument("--pg-postmaster", type=int, default=0)
    a = p.parse_args(argv)
    mode, policy = EngineMode(a.mode), RecoveryPolicy(a.policy)
    if a.broken:
        BROKEN[a.broken]()
    killer = Killer(a.kill_at_io)
    statements = Killer(0)  # counts the statements a PostgresStore sends
    if (a.kill_at_io or a.count_io) and a.postgres is None:
        _install_sql_hook(killer)
    print("ready", flush=True)
    started = time.perf_counter()
    try:
        store = open_store(a.dir, a.postgres) if mode is EngineMode.LEDGER else None
    except (StoreCorrupt, UnsupportedSchema) as exc:
        print(f"fail closed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAIL_CLOSED
    except StoreError as exc:
        print(f"fail closed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if store is not None and a.postgres is not None:
        # PostgreSQL: the boundaries are the statements the store sends (its trace hook)
        def before(sql: str, params: Sequence[object]) -> None:
            statements.count += 1
            if a.pg_fault and statements.count == a.pg_fault_at:
                from benchmarks.bench_pg_faults import inject

                inject(a.pg_fault, store, a.pg_postmaster, sql_label(sql))
            if a.kill_at_io or a.count_io:
                killer.boundary(sql_label(sql))

        store.trace = before  # type: ignore[attr-defined]
    conversations = KilledConversations(a.dir / CONVERSATION, killer)
    system = KilledExternal(a.dir / EXTERNAL, killer)
    if a.deliver_first:
        system.deliver_in_flight()
    for f in a.fault:
        system.fault(Fault(f))
    point = parse_crash_point(mode, a.crash_at) if a.crash_at else None
    crash = CrashInjector(point, how="sigkill")
    try:
        status = _drive(mode, policy, store, conversations, system, crash, a.final, a.fused,
                        a.together)
    except (StoreCorrupt, UnsupportedSchema) as exc:
        # The store checks what it reads when it reads it: damage in the rows
        # a recovery needs is found on the first read of them, before any
        # decision.  The parent checks that nothing was executed or written.
        print(f"fail closed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAIL_CLOSED
    except StoreError as exc:
        # PostgreSQL: the server went away or the connection was cut mid-transaction.
        # The worker stops; the next process reloads what is durable.
        print(f"fail closed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if store is not None:
        store.close()
    print(json.dumps({"status": status, "boundaries": killer.count,
                      "labels": killer.labels if a.count_io else [],
                      "statements": statements.count,
                      "seconds": time.perf_counter() - started}), flush=True)
    return 0


# ==========================================================================
# The parent: runs, kills, checks
# ==========================================================================


@dataclass(frozen=True)
class Phase:
    """One process of a run: how it may die, what the network does first."""

    crash_at: str | None = None
    kill_at_io: int = 0
    timer: float | None = None
    faults: tuple[str, ...] = ()
    deliver_first: bool = False
    pg_fault: str = ""  # PostgreSQL runs: a server fault at statement pg_fault_at
    pg_fault_at: int = 0


@dataclass(frozen=True)
class RunSpec:
    kind: str  # point | io | timer | multi | fused | together | legacy-control
    policy: RecoveryPolicy
    label: str
    phases: tuple[Phase, ...]
    mode: EngineMode = EngineMode.LEDGER
    postgres: str | None = None  # conninfo: PostgresStore instead of SqliteStore
    fused: bool = False  # the engine's fused path (no approval, Session.execute_message)
    together: bool = False  # the together path (execute_message(together=True), SCRIPT_TOGETHER)
    broken: str = ""  # a name of BROKEN: the child runs a deliberately broken core

    def __post_init__(self) -> None:
        if self.broken and self.broken not in BROKEN:
            raise ValueError(f"RunSpec.broken: {self.broken!r} is not a broken variant; "
                             f"known: {sorted(BROKEN)}")


COUNTERS = ("duplicates", "lost", "fabricated", "contradicted", "unsettled",
            "store_unusable", "child_errors")


@dataclass
class RunReport:
    kind: str
    policy: str
    label: str
    kills: int = 0
    killed_at: list[str] = field(default_factory=list)
    final_status: str | None = None
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    problems: list[str] = field(default_factory=list)
    readonly_replays: int = 0
    fail_closed: int = 0  # processes that stopped on a StoreError (PostgreSQL faults)
    fail_closed_errors: list[str] = field(default_factory=list)

    def bad(self, counter: str, what: str) -> None:
        self.counts[counter] += 1
        self.problems.append(f"{counter}: {what}")


def _child_cmd(spec: RunSpec, d: Path, phase: Phase, final: bool, count: bool = False,
               postmaster: int = 0) -> list[str]:
    cmd = [sys.executable, str(THIS), "--child", "--dir", str(d), "--mode", spec.mode.value,
           "--policy", spec.policy.value]
    if spec.postgres is not None:
        cmd += ["--postgres", spec.postgres]
    if spec.fused:
        cmd.append("--fused")
    if spec.together:
        cmd.append("--together")
    if spec.broken:
        cmd += ["--broken", spec.broken]
    if phase.pg_fault:
        cmd += ["--pg-fault", phase.pg_fault, "--pg-fault-at", str(phase.pg_fault_at),
                "--pg-postmaster", str(postmaster)]
    if phase.crash_at:
        cmd += ["--crash-at", phase.crash_at]
    if phase.kill_at_io:
        cmd += ["--kill-at-io", str(phase.kill_at_io)]
    if count:
        cmd.append("--count-io")
    for f in phase.faults:
        cmd += ["--fault", f]
    if phase.deliver_first:
        cmd.append("--deliver-first")
    if final:
        cmd.append("--final")
    return cmd


@dataclass
class ChildOutcome:
    returncode: int
    stdout: str
    stderr: str


def run_child(cmd: list[str], timer: float | None = None, timeout: float = 120) -> ChildOutcome:
    """Run one child; with ``timer``, SIGKILL it that long after it printed ``ready``."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        if timer is not None:
            first = proc.stdout.readline()
            if first.strip() == "ready":
                time.sleep(timer)
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
            out, err = proc.communicate(timeout=timeout)
            out = first + out
        else:
            out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err += "\n(timed out: killed by the campaign)"
    return ChildOutcome(proc.returncode, out, err)


# -- what survived -----------------------------------------------------------


@dataclass
class Snapshot:
    usable: bool
    error: str = ""
    results: dict[str, tuple[str, str]] = field(default_factory=dict)  # eid -> kind, text
    halted: set[str] = field(default_factory=set)
    calls: dict[tuple[int, int], str] = field(default_factory=dict)  # position -> eid
    records: dict[str, str] = field(default_factory=dict)  # eid -> ledger status
    conversation: dict[str, str] = field(default_factory=dict)  # eid -> tool message text
    conversation_calls: list[tuple[int, int]] = field(default_factory=list)
    legacy_tool_messages: int = 0


def snapshot(d: Path, mode: EngineMode, postgres: str | None = None) -> Snapshot:
    """Read what survived, without touching the originals (the store is read from a copy)."""
    snap = Snapshot(usable=True)
    conv = FileConversationStore(d / CONVERSATION) if (d / CONVERSATION).exists() else None
    messages = conv.load_messages(SESSION) if conv is not None else []
    for turn, m in enumerate(messages):
        for slot, _ in enumerate(m.get("tool_calls") or []):
            snap.conversation_calls.append((turn, slot))
        if m.get("role") == "tool":
            snap.legacy_tool_messages += 1
            eid = m.get("execution_id")
            if isinstance(eid, str):
                snap.conversation[eid] = str(m.get("content"))
    if mode is not EngineMode.LEDGER:
        return snap
    if postgres is not None:
        try:
            store = open_store(d, postgres)
            try:
                if SESSION not in store.sessions():
                    return snap
                st = store.load(SESSION)
            finally:
                store.close()
        except StoreError as exc:
            return Snapshot(usable=False, error=f"{type(exc).__name__}: {exc}")
        return _from_state(snap, st)
    if not (d / STORE).exists():
        return snap
    with tempfile.TemporaryDirectory(prefix="campaign-snap-") as tmp:
        for suffix in ("", "-wal"):  # not -shm: SQLite rebuilds the index from the WAL
            src = Path(f"{d / STORE}{suffix}")
            if src.exists():
                shutil.copyfile(src, Path(tmp) / f"{STORE}{suffix}")
        try:
            with SqliteStore(Path(tmp) / STORE) as store:
                if SESSION not in store.sessions():
                    return snap
                st = store.load(SESSION)
        except StoreError as exc:
            text = str(exc).replace(str(Path(tmp) / STORE), str(d / STORE))
            return Snapshot(usable=False, error=f"{type(exc).__name__}: {text}")
    return _from_state(snap, st)


def _from_state(snap: Snapshot, st: Any) -> Snapshot:
    for c in st.calls:
        snap.calls[c.position] = c.execution_id
        if c.result is not None:
            snap.results[c.execution_id] = (c.result.kind.value, c.result.content)
    for eid, rec in st.ledger.items():
        snap.records[eid] = rec.status.value
        if rec.status is LedgerStatus.RECOVERY_REQUIRED:
            snap.halted.add(eid)
    return snap


def check_monotonic(report: RunReport, before: Snapshot, after: Snapshot) -> None:
    """A result that was durable stays, unchanged."""
    for eid, res in before.results.items():
        if after.results.get(eid) != res:
            report.bad("lost", f"ledger result of {eid[:12]} {res} became "
                               f"{after.results.get(eid)}")
    for eid, text in before.conversation.items():
        if after.conversation.get(eid) != text:
            report.bad("lost", f"conversation result of {eid[:12]} disappeared or changed")


def check_final(report: RunReport, spec: RunSpec, snap: Snapshot,
                system: CountingExternalSystem) -> None:
    by_eid: dict[str, list[Any]] = {}
    for r in system.requests:
        by_eid.setdefault(r.execution_id, []).append(r)
    # Independent of execution ids: every call of the scenario has its own
    # arguments, so the same arguments applied twice is the same email twice.
    by_args: dict[str, int] = {}
    for r in system.requests:
        if r.status is RequestStatus.APPLIED:
            key = json.dumps([r.tool, r.arguments], sort_keys=True)
            by_args[key] = by_args.get(key, 0) + 1
    protected = spec.policy is not RecoveryPolicy.READONLY
    for key, n in by_args.items():
        if n > 1 and protected:
            report.bad("duplicates", f"{key}: applied {n} times")
    if spec.mode is EngineMode.LEGACY:
        return
    if not snap.usable:
        report.bad("store_unusable", snap.error[:300])
        return
    for eid in by_eid:
        if eid not in snap.calls.values():
            report.bad("fabricated", f"the external system saw execution {eid[:12]}, which no "
                                     "call of the ledger has")
    for pos, eid in snap.calls.items():
        effects = system.effects(eid)
        if effects > 1:
            if protected:
                if not any(n > 1 for n in by_args.values()):  # not already counted above
                    report.bad("duplicates", f"{pos} {eid[:12]}: {effects} effects")
            else:
                report.readonly_replays += effects - 1
        res = snap.results.get(eid)
        if res is None:
            if eid not in snap.halted:
                report.bad("unsettled", f"{pos}: no result, record "
                                        f"{snap.records.get(eid, 'none')}, not recovery_required")
            continue
        kind, text = res
        answers = {r.result for r in by_eid.get(eid, [])
                   if r.status in (RequestStatus.APPLIED, RequestStatus.DEDUPLICATED)}
        if kind in (ResultKind.OK.value, ResultKind.HUMAN.value) and text not in answers:
            report.bad("fabricated", f"{pos}: {kind} result {text[:60]!r} is not what the "
                                     f"external system returned ({sorted(map(str, answers))})")
        if kind in (ResultKind.ERROR.value, ResultKind.ABANDONED.value) and effects:
            report.bad("contradicted", f"{pos}: {kind} result but the effect was applied")
        if snap.conversation.get(eid) != text:
            report.bad("lost", f"{pos}: the ledger's result is not in the final conversation")
    for pos in snap.conversation_calls:
        if pos not in snap.calls:
            report.bad("unsettled", f"call {pos} of the conversation is unknown to the ledger")


def execute(spec: RunSpec, base: Path, *, postmaster: Callable[[], int] | None = None,
            after_phase: Callable[[Phase, ChildOutcome], None] | None = None) -> RunReport:
    """Run the phases of ``spec`` in a fresh directory under ``base``; check everything.

    PostgreSQL runs: ``postmaster`` gives the server's process id (for the
    faults that stop it), ``after_phase`` brings the server back after one."""
    report = RunReport(spec.kind, spec.policy.value, spec.label)
    d = Path(tempfile.mkdtemp(prefix="run-", dir=base))
    try:
        prev = Snapshot(usable=True)
        phases = [*spec.phases, Phase(deliver_first=True)]
        for i, phase in enumerate(phases):
            final = i == len(phases) - 1
            pid = postmaster() if postmaster is not None and phase.pg_fault else 0
            out = run_child(_child_cmd(spec, d, phase, final, postmaster=pid), timer=phase.timer)
            if after_phase is not None:
                after_phase(phase, out)
            if out.returncode == -signal.SIGKILL:
                report.kills += 1
                where = next((ln.split(" ", 2)[2] for ln in out.stderr.splitlines()
                              if ln.startswith("KILLED-AT")), None)
                report.killed_at.append(where or phase.crash_at or
                                        (f"timer {phase.timer:.3f} s" if phase.timer else "?"))
            elif out.returncode != 0:
                tail = out.stderr.strip().splitlines()[-3:]
                if out.returncode == EXIT_FAIL_CLOSED:
                    report.bad("store_unusable", " | ".join(tail)[:300])
                elif out.returncode == EXIT_UNAVAILABLE and not final:
                    # failed closed on a server fault: the next process resumes
                    report.fail_closed += 1
                    said = [ln for ln in out.stderr.splitlines() if ln.startswith("fail closed")]
                    report.fail_closed_errors.append((said or tail or ["?"])[-1][:600])
                    snap = snapshot(d, spec.mode, spec.postgres)
                    if not snap.usable:
                        report.bad("store_unusable", snap.error[:300])
                        break
                    check_monotonic(report, prev, snap)
                    prev = snap
                    continue
                else:
                    report.bad("child_errors", f"phase {i} exit {out.returncode}: "
                                               + " | ".join(tail)[:400])
                break
            elif final:
                last = out.stdout.strip().splitlines()[-1]
                report.final_status = json.loads(last)["status"]
            snap = snapshot(d, spec.mode, spec.postgres)
            if not snap.usable:
                report.bad("store_unusable", snap.error[:300])
                break
            check_monotonic(report, prev, snap)
            prev = snap
        else:
            system = CountingExternalSystem(d / EXTERNAL)
            system.deliver_in_flight()  # late originals land after everything
            check_final(report, spec, prev, system)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return report


def clean_profile(policy: RecoveryPolicy, base: Path, postgres: str | None = None,
                  fused: bool = False, together: bool = False) -> tuple[int, float]:
    """I/O boundaries and seconds (after ready) of one complete run without a crash."""
    n, secs, _ = clean_run(policy, base, postgres, fused, together)
    return n, secs


def clean_run(policy: RecoveryPolicy, base: Path, postgres: str | None = None,
              fused: bool = False, together: bool = False, broken: str = ""
              ) -> tuple[int, float, list[str]]:
    """:func:`clean_profile`, and the label of every I/O boundary, in order."""
    d = Path(tempfile.mkdtemp(prefix="clean-", dir=base))
    try:
        spec = RunSpec("clean", policy, "clean", (), postgres=postgres, fused=fused,
                       together=together, broken=broken)
        out = run_child(_child_cmd(spec, d, Phase(), final=True, count=True))
        if out.returncode != 0:
            raise RuntimeError(f"a clean run of {policy} failed: {out.stderr[-800:]}")
        data = json.loads(out.stdout.strip().splitlines()[-1])
        return int(data["boundaries"]), float(data["seconds"]), list(data["labels"])
    finally:
        shutil.rmtree(d, ignore_errors=True)


# -- the plan -------------------------------------------------------------------


_FAULTS: Mapping[RecoveryPolicy, tuple[str, ...]] = {
    RecoveryPolicy.READONLY: (),
    RecoveryPolicy.MANUAL: ("lose_answer", "time_out"),
    RecoveryPolicy.IDEMPOTENT: ("lose_answer", "time_out"),
    RecoveryPolicy.RECONCILE: ("lose_answer", "time_out", "cannot_tell"),
}


def plan(policies: Sequence[RecoveryPolicy], profiles: Mapping[RecoveryPolicy, tuple[int, float]],
         *, points: str, io: int, timer: int, multi: int, seed: int,
         legacy_control: bool,
         fused: Mapping[RecoveryPolicy, tuple[int, float]] | None = None,
         together: Mapping[RecoveryPolicy, tuple[int, float]] | None = None) -> list[RunSpec]:
    """The runs of a campaign (deterministic for a seed).

    ``fused``: the clean profiles of the engine's fused path per policy; each
    gets a kill at every one of its I/O boundaries (with ``io < 0``; else
    ``io`` random ones), so also before, inside and after the commit that
    creates the session, records the call and dispatches it.  ``together``:
    the same for the together path (two calls per message), so also between
    the message's record commit (both ``dispatched``) and its outcome commit."""
    rng = random.Random(seed)
    specs: list[RunSpec] = []
    for pol, (n, _) in (fused or {}).items():
        ks = range(1, n + 1) if io < 0 else [rng.randint(1, n) for _ in range(io)]
        for k in ks:
            specs.append(RunSpec("fused", pol, f"fused io boundary {k}/{n}",
                                 (Phase(kill_at_io=k),), fused=True))
    for pol, (n, _) in (together or {}).items():
        ks = range(1, n + 1) if io < 0 else [rng.randint(1, n) for _ in range(io)]
        for k in ks:
            specs.append(RunSpec("together", pol, f"together io boundary {k}/{n}",
                                 (Phase(kill_at_io=k),), together=True))
    for pol in policies:
        if points == "all":
            chosen = [p for p in crash_points("ledger") if p.reached_by(pol)]
        else:
            chosen = [r.ledger for r in SEED_MATRIX.values() if r.ledger.reached_by(pol)]
        for p in chosen:
            specs.append(RunSpec("point", pol, p.name, (Phase(crash_at=p.name),)))
        n, secs = profiles[pol]
        ks = range(1, n + 1) if io < 0 else [rng.randint(1, n) for _ in range(io)]
        for k in ks:
            specs.append(RunSpec("io", pol, f"io boundary {k}/{n}", (Phase(kill_at_io=k),)))
        for _ in range(timer):
            delay = rng.uniform(0.0, secs)
            specs.append(RunSpec("timer", pol, f"after {delay * 1000:.0f} ms",
                                 (Phase(timer=delay),)))
        faults = _FAULTS[pol]
        for _ in range(multi):
            phases = []
            for j in range(rng.randint(2, 3)):
                fault: tuple[str, ...] = ()
                if faults and rng.random() < 0.5:
                    fault = (rng.choice(faults),)
                if j == 0 and pol is not RecoveryPolicy.READONLY and rng.random() < 0.2:
                    fault = ("fail_definitely",)  # only ever the first request: attempt 1
                phases.append(Phase(kill_at_io=rng.randint(1, n), faults=fault,
                                    deliver_first=j > 0 and rng.random() < 0.5))
            specs.append(RunSpec("multi", pol, f"{len(phases)} processes killed at random I/O",
                                 tuple(phases)))
    if legacy_control:
        specs.append(RunSpec("legacy-control", RecoveryPolicy.MANUAL, "no crash", (),
                             EngineMode.LEGACY))
        for p in crash_points("legacy"):
            specs.append(RunSpec("legacy-control", RecoveryPolicy.MANUAL, p.name,
                                 (Phase(crash_at=p.name),), EngineMode.LEGACY))
    return specs


# ==========================================================================
# Corruption: fail closed
# ==========================================================================


def _logical(path: Path) -> str | None:
    """The store's content as text (None if it does not open)."""
    try:
        with SqliteStore(path) as store:
            st = store.load(SESSION)
            audit = store.audit(SESSION)
    except StoreError:
        return None
    return repr((st, [asdict(a) for a in audit]))


def corruption_base(base: Path) -> Path:
    """A store with a pending idempotent call (killed after dispatched): a resume would retry."""
    d = Path(tempfile.mkdtemp(prefix="corrupt-base-", dir=base))
    spec = RunSpec("corrupt", RecoveryPolicy.IDEMPOTENT, "base", ())
    out = run_child(_child_cmd(spec, d, Phase(crash_at="after EnginePersistDispatched"), False))
    if out.returncode != -signal.SIGKILL:
        raise RuntimeError(f"the corruption base run did not die: {out.stderr[-600:]}")
    with SqliteStore(d / STORE):  # checkpoint the WAL into the file: one file to damage
        pass
    return d


@dataclass
class CorruptionReport:
    trials: int = 0
    detected: int = 0  # fail closed: StoreCorrupt, exit 3, nothing written or executed
    harmless: int = 0  # damage in bytes the store does not use: same data read back
    # damage in rows the resume never reads (e.g. an audit row): the resume
    # completed, applied no effect twice, and the store refuses the damaged
    # rows with StoreCorrupt whenever they are read (audit(), verify-store)
    detected_on_read: int = 0
    silent: int = 0  # opened with different data that no read refuses: BAD
    wrote_anyway: int = 0  # failed closed but the external log or the store changed: BAD
    problems: list[str] = field(default_factory=list)


def corruption_trial(base_dir: Path, work: Path, how: str, rng: random.Random,
                     report: CorruptionReport, at: int | None = None) -> None:
    """Damage a copy of the base store (``how``: truncate or flip; ``at``: a fixed byte), resume."""
    d = Path(tempfile.mkdtemp(prefix="corrupt-", dir=work))
    try:
        shutil.copytree(base_dir, d, dirs_exist_ok=True)
        db = d / STORE
        data = bytearray(db.read_bytes())
        original = _logical(db)
        if how == "truncate":
            cut = rng.randrange(0, len(data))
            db.write_bytes(bytes(data[:cut]))
            what = f"truncated to {cut} of {len(data)} bytes"
        else:
            at = rng.randrange(0, len(data)) if at is None else at
            data[at] = (data[at] + rng.randint(1, 255)) % 256
            db.write_bytes(bytes(data))
            what = f"byte {at} of {len(data)} changed"
        damaged = db.read_bytes()
        external = _read(d / EXTERNAL)
        spec = RunSpec("corrupt", RecoveryPolicy.IDEMPOTENT, what, ())
        out = run_child(_child_cmd(spec, d, Phase(), final=True))
        report.trials += 1
        if out.returncode == EXIT_FAIL_CLOSED:
            if _read(d / EXTERNAL) != external or db.read_bytes() != damaged:
                report.wrote_anyway += 1
                report.problems.append(f"{what}: failed closed but something was written")
            elif "StoreCorrupt" not in out.stderr or str(db) not in out.stderr:
                report.wrote_anyway += 1
                report.problems.append(f"{what}: the error does not name StoreCorrupt and the "
                                       f"file: {out.stderr[-300:].replace(str(d), '<run>')}")
            else:
                report.detected += 1
        elif out.returncode == 0 and _logical_of_copy(base_dir, db, damaged) == original:
            report.harmless += 1
        elif (out.returncode == 0 and _store_corrupt(db)
              and not _applied_twice(d / EXTERNAL)):
            report.detected_on_read += 1
        else:
            report.silent += 1
            # the run's scratch directory is no part of the finding (results.json is tracked)
            said = out.stderr[-300:].replace(str(d), "<run>")
            report.problems.append(f"{what}: exit {out.returncode}, not failed closed: {said}")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _store_corrupt(db: Path) -> bool:
    """Does the store, read whole after the resume, refuse the damage (StoreCorrupt)?"""
    try:
        with SqliteStore(db) as store:
            store.load(SESSION)
            store.audit(SESSION)
    except StoreCorrupt as e:
        return str(db) in str(e)
    return False


def _applied_twice(external: Path) -> bool:
    """Did the external system apply any arguments more than once?"""
    seen: set[str] = set()
    for r in CountingExternalSystem(external).requests:
        if r.status is RequestStatus.APPLIED:
            key = json.dumps([r.tool, r.arguments], sort_keys=True)
            if key in seen:
                return True
            seen.add(key)
    return False


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def _logical_of_copy(base_dir: Path, db: Path, damaged: bytes) -> str | None:
    """What the damaged file held before the resume wrote to it."""
    with tempfile.TemporaryDirectory(prefix="corrupt-read-") as tmp:
        copy = Path(tmp) / STORE
        copy.write_bytes(damaged)
        return _logical(copy)


def corruption_campaign(base: Path, trials: int, seed: int) -> CorruptionReport:
    report = CorruptionReport()
    rng = random.Random(seed)
    base_dir = corruption_base(base)
    try:
        for i in range(trials):
            corruption_trial(base_dir, base, "truncate" if i % 2 == 0 else "flip", rng, report)
    finally:
        shutil.rmtree(base_dir, ignore_errors=True)
    return report


# ==========================================================================
# Fuzz: bad inputs through the public API
# ==========================================================================


def fuzz(examples: int, seed: int, base: Path) -> dict[str, Any]:
    """Bad inputs into the public API; counts exceptions that are not the documented ones."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import Phase as HPhase
    from hypothesis import seed as hseed
    from hypothesis import strategies as st

    from toolledger._core.ledger import Ledger
    from toolledger._core.protocol import Action, Event, ToolProfile
    from toolledger._core.stores import MemoryStore
    from toolledger.kit.engine import MemoryConversationStore
    from toolledger.kit.simulate import run_simulation

    documented = (InvalidInput, ProtocolError, StoreError)
    outcome: dict[str, Any] = {"examples": 0, "typed_errors": 0, "accepted": 0,
                               "unhandled": 0, "by_target": {}, "unhandled_kinds": {}}

    def attempt(target: str, fn: Callable[[], object]) -> None:
        outcome["examples"] += 1
        row = outcome["by_target"].setdefault(
            target, {"examples": 0, "typed_errors": 0, "accepted": 0, "unhandled": 0})
        row["examples"] += 1
        try:
            fn()
        except documented:
            outcome["typed_errors"] += 1
            row["typed_errors"] += 1
        except Exception as exc:
            outcome["unhandled"] += 1
            row["unhandled"] += 1
            kind = f"{target}: {type(exc).__name__}: {str(exc)[:80]}"
            outcome["unhandled_kinds"][kind] = outcome["unhandled_kinds"].get(kind, 0) + 1
        else:
            outcome["accepted"] += 1
            row["accepted"] += 1

    # Inputs as they reach the API from outside: provider messages and config
    # files carry JSON values, so every argument is drawn from JSON values.
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                   max_size=3),
        max_leaves=6,
    )
    names = st.sampled_from(["idempotency_key", "Idempotency-Key", "executionId", "to", "", "x"])
    objects = st.dictionaries(names | st.text(max_size=6), json_values, max_size=3)
    arguments = st.one_of(objects, objects.map(json.dumps), json_values.map(json.dumps),
                          st.text(max_size=12), json_values)
    ids = st.one_of(st.sampled_from(["call_0", "", "call_salvaged_0"]), json_values)
    policies = st.one_of(st.sampled_from([p.value for p in RecoveryPolicy]), json_values)
    tool_names = st.one_of(st.just(TOOL), json_values)
    anything = json_values

    cfg = settings(max_examples=examples, database=None, deadline=None,
                   phases=[HPhase.generate], suppress_health_check=list(HealthCheck))

    def engine_with(calls: list[Any], policy: Any) -> TurnEngine:
        registry = ToolRegistry()
        system = CountingExternalSystem()
        registry.register(TOOL, CountingAdapter(system, TOOL), policy=policy)
        return TurnEngine(session_id="fuzz", mode="ledger", registry=registry,
                          provider=ScriptedProvider([calls, "ok"]), human=ScriptedHuman(),
                          conversations=MemoryConversationStore(), store=MemoryStore())

    @settings(cfg)
    @given(cid=ids, name=tool_names, args=arguments, policy=policies)
    def provider_calls(cid: Any, name: Any, args: Any, policy: Any) -> None:
        call = {"id": cid, "type": "function",
                "function": {"name": name, "arguments": args}}
        attempt("TurnEngine.run (provider call)",
                lambda: engine_with([call], policy).run("go"))

    @settings(cfg)
    @given(raw=st.one_of(anything, st.lists(anything, max_size=2)))
    def raw_tool_calls(raw: Any) -> None:
        attempt("TurnEngine.run (tool_calls shape)",
                lambda: engine_with(raw if isinstance(raw, list) else [raw],
                                    "manual").run("go"))

    @settings(cfg)
    @given(name=tool_names, policy=policies, approval=anything)
    def profiles(name: Any, policy: Any, approval: Any) -> None:
        attempt("ToolProfile", lambda: ToolProfile(name, policy, approval))
        attempt("ToolRegistry.register",
                lambda: ToolRegistry().register(name, CountingAdapter(CountingExternalSystem(),
                                                                      TOOL), policy=policy))

    actions = st.sampled_from(list(Action))
    positions = st.one_of(st.tuples(st.integers(-1, 3), st.integers(-1, 2)), anything)

    @settings(cfg)
    @given(events=st.lists(st.tuples(actions, positions, ids, st.one_of(st.none(), anything)),
                           max_size=6),
           resolution=st.one_of(st.sampled_from(["applied", "retry", "abandon"]), anything),
           text=st.one_of(st.none(), anything))
    def ledger_steps(events: list[tuple[Any, Any, Any, Any]], resolution: Any, text: Any) -> None:
        store = MemoryStore()
        ledger = Ledger.create(store, "fuzz")
        tool = ToolProfile(TOOL, RecoveryPolicy.MANUAL, True)
        for action, pos, cid, attempt_no in events:
            def step(a: Any = action, p: Any = pos, c: Any = cid, n: Any = attempt_no) -> object:
                return ledger.step(Event(a, p, c, tool, "digest", n))

            attempt("Ledger.step", step)
        attempt("Ledger.resolve", lambda: ledger.resolve((1, 0), resolution, result_text=text))

    @settings(cfg)
    @given(path=st.sampled_from(["", ":memory:", "file:x.db", "/nonexistent/d/x.db", str(base)]),
           answers=st.lists(json_values, max_size=2),
           engine=st.one_of(st.sampled_from(["ledger", "legacy"]), st.text(max_size=6)),
           policy=policies, point=st.one_of(st.text(max_size=12), st.sampled_from(
               ["after ExternalApply", "before nothing", "none"])))
    def paths_and_names(path: Any, answers: Any, engine: Any, policy: Any, point: Any) -> None:
        attempt("SqliteStore(path)", lambda: SqliteStore(path).close())
        attempt("ScriptedHuman(answers)", lambda: ScriptedHuman(answers))
        attempt("parse_crash_point", lambda: parse_crash_point(engine, point))
        attempt("run_simulation", lambda: run_simulation(engine, policy, point))

    for test in (provider_calls, raw_tool_calls, profiles, ledger_steps, paths_and_names):
        hseed(seed)(test)()
    return outcome


# ==========================================================================
# The campaign
# ==========================================================================


def summarize(reports: Sequence[RunReport]) -> dict[str, Any]:
    """Counts per (kind, policy, label) row and in total."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in reports:
        if r.kind in ("point", "legacy-control"):
            label = r.label
        elif r.kind in ("io", "fused", "together"):
            label = r.killed_at[0] if r.killed_at else "(not reached)"
        else:
            label = r.kind
        row = rows.setdefault((r.kind, r.policy, label), {
            "kind": r.kind, "policy": r.policy, "where": label, "runs": 0, "kills": 0,
            "readonly_replays": 0, **dict.fromkeys(COUNTERS, 0), "final": {}})
        row["runs"] += 1
        row["kills"] += r.kills
        row["readonly_replays"] += r.readonly_replays
        for k in COUNTERS:
            row[k] += r.counts[k]
        if r.final_status is not None:
            row["final"][r.final_status] = row["final"].get(r.final_status, 0) + 1
    return {"rows": list(rows.values())}


def run_campaign(
    *,
    policies: Sequence[RecoveryPolicy] = tuple(RecoveryPolicy),
    points: str = "all",
    io: int = -1,
    timer: int = 12,
    multi: int = 15,
    corruption_trials: int = 40,
    fuzz_examples: int = 300,
    legacy_control: bool = True,
    fused: bool = True,
    together: bool = True,
    parallel: int = 2,
    seed: int = 443,
    verbose: bool = True,
) -> dict[str, Any]:
    """Run a campaign and return its figures (see the module doc)."""
    def say(text: str) -> None:
        if verbose:
            print(text, flush=True)

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="toolledger-campaign-",
                                     dir=os.environ.get("TOOLLEDGER_BENCH_DIR") or None) as tmp:
        base = Path(tmp)
        profiles = {p: clean_profile(p, base) for p in policies}
        for p, (n, secs) in profiles.items():
            say(f"  clean run, {p.value}: {n} I/O boundaries, {secs * 1000:.0f} ms after ready")
        fused_profiles = {p: clean_profile(p, base, fused=True) for p in policies} if fused \
            else {}
        for p, (n, secs) in fused_profiles.items():
            say(f"  clean run, fused, {p.value}: {n} I/O boundaries, "
                f"{secs * 1000:.0f} ms after ready")
        together_profiles = {p: clean_profile(p, base, together=True) for p in policies} \
            if together else {}
        for p, (n, secs) in together_profiles.items():
            say(f"  clean run, together, {p.value}: {n} I/O boundaries, "
                f"{secs * 1000:.0f} ms after ready")
        specs = plan(policies, profiles, points=points, io=io, timer=timer, multi=multi,
                     seed=seed, legacy_control=legacy_control, fused=fused_profiles,
                     together=together_profiles)
        say(f"  {len(specs)} runs, {parallel} at a time")
        reports: list[RunReport] = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
            def one(spec: RunSpec) -> RunReport:
                return execute(spec, base)

            for r in pool.map(one, specs):
                reports.append(r)
                if r.problems and r.kind != "legacy-control":
                    say(f"  PROBLEM {r.kind} {r.policy} {r.label}, killed at {r.killed_at}: "
                        f"{r.problems[0][:160]}")
        runs_s = time.perf_counter() - started
        corruption = corruption_campaign(base, corruption_trials, seed) if corruption_trials \
            else CorruptionReport()
        fuzzed = fuzz(fuzz_examples, seed, base) if fuzz_examples else None
    ledger_reports = [r for r in reports if r.kind != "legacy-control"]
    control = [r for r in reports if r.kind == "legacy-control"]
    totals = {k: sum(r.counts[k] for r in ledger_reports) for k in COUNTERS}
    kills = sum(r.kills for r in ledger_reports)
    by_kind = {k: sum(r.kills for r in ledger_reports if r.kind == k)
               for k in ("point", "io", "timer", "multi", "fused", "together")}
    control_dups = sum(r.counts["duplicates"] for r in control)
    all_zero = (not any(totals.values()) and corruption.silent == 0
                and corruption.wrote_anyway == 0
                and (fuzzed is None or fuzzed["unhandled"] == 0))
    return {
        "seconds": round(time.perf_counter() - started, 1),
        "runs_seconds": round(runs_s, 1),
        "runs": len(ledger_reports),
        "policies": [p.value for p in policies],
        "kills": kills,
        "kills_by_kind": by_kind,
        "processes_per_run_max": 4,
        "totals": totals,
        "readonly_replays": sum(r.readonly_replays for r in ledger_reports),
        "final_status": _count(r.final_status or "(none)" for r in ledger_reports),
        "summary": summarize(ledger_reports)["rows"],
        "problems": [f"{r.kind} {r.policy} {r.label} (killed at {r.killed_at}): {p}"
                     for r in ledger_reports for p in r.problems][:30],
        "findings": findings(ledger_reports),
        "legacy_control": {
            "runs": len(control), "kills": sum(r.kills for r in control),
            "duplicates_found": control_dups,
            "points_with_duplicates": sorted({r.label for r in control
                                              if r.counts["duplicates"]}),
        },
        "corruption": asdict(corruption),
        "fuzz": fuzzed,
        "all_zero": all_zero,
    }


EMPTY_FILE_CAUSE = ("a 0-byte store file, left by a kill while SqliteStore was creating it "
                    "(before PRAGMA journal_mode=WAL wrote the SQLite header), refused as "
                    "corrupt by every later open")


def _cause(counter: str, problem: str) -> str:
    text = problem.split(": ", 1)[-1]
    if counter == "store_unusable" and "is empty (0 bytes)" in text:
        return EMPTY_FILE_CAUSE
    return text[:120]


def findings(reports: Sequence[RunReport]) -> dict[str, dict[str, Any]]:
    """Per counter that is not zero: how many runs, their causes, the first as an example."""
    out: dict[str, dict[str, Any]] = {}
    for r in reports:
        for counter in COUNTERS:
            if not r.counts[counter]:
                continue
            first = next(p for p in r.problems if p.startswith(counter))
            f = out.setdefault(counter, {"count": 0, "kind": r.kind, "policy": r.policy,
                                         "killed_at": r.killed_at, "example": first,
                                         "causes": {}})
            f["count"] += 1
            cause = _cause(counter, first)
            f["causes"][cause] = f["causes"].get(cause, 0) + 1
    return out


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return out


def render(result: Mapping[str, Any]) -> str:
    """The campaign's figures as text tables."""
    lines = []
    rows = result["summary"]
    head = ("kind", "policy", "where", "runs", "kills", *COUNTERS)
    body = [(r["kind"], r["policy"], r["where"], r["runs"], r["kills"],
             *(r[k] for k in COUNTERS)) for r in rows]
    widths = [max(len(str(x[i])) for x in (head, *body)) for i in range(len(head))]
    for cells in (head, tuple("-" * w for w in widths), *body):
        lines.append("  ".join(str(c).ljust(w) if i < 3 else str(c).rjust(w)
                               for i, (c, w) in enumerate(zip(cells, widths, strict=True))))
    t = result["totals"]
    lines.append(f"runs {result['runs']}, kills {result['kills']} "
                 f"({', '.join(f'{k} {v}' for k, v in result['kills_by_kind'].items())}); "
                 f"totals: " + ", ".join(f"{k} {v}" for k, v in t.items()))
    lines.append(f"final turn status: {result['final_status']}; readonly replays (allowed): "
                 f"{result['readonly_replays']}")
    lc = result["legacy_control"]
    lines.append(f"control, legacy engine: {lc['kills']} kills, {lc['duplicates_found']} "
                 f"duplicate effects seen, at {lc['points_with_duplicates']}")
    c = result["corruption"]
    lines.append(f"corruption: {c['trials']} trials: {c['detected']} failed closed, "
                 f"{c['harmless']} harmless (unused bytes, same data), "
                 f"{c.get('detected_on_read', 0)} refused when read (rows the resume does not "
                 f"read), {c['silent']} silent, "
                 f"{c['wrote_anyway']} wrote/executed anyway")
    f = result["fuzz"]
    if f is not None:
        lines.append(f"fuzz: {f['examples']} calls: {f['typed_errors']} typed errors, "
                     f"{f['accepted']} accepted, {f['unhandled']} unhandled"
                     + "".join(f"\n  {n} x {k}" for k, n in f["unhandled_kinds"].items()))
    for counter, f in result["findings"].items():
        for cause, n in f["causes"].items():
            lines.append(f"found: {counter} in {n} run(s): {cause}")
    lines.append(f"all zero: {'yes' if result['all_zero'] else 'NO'}; "
                 f"{result['seconds']:.0f} s in all")
    return "\n".join(lines)


def run(smoke: bool = False) -> dict[str, Any]:
    print("\n== crash campaign: SIGKILLed processes on SqliteStore, every policy", flush=True)
    if smoke:
        result = run_campaign(policies=[RecoveryPolicy.MANUAL], points="seed", io=0, timer=0,
                              multi=0, corruption_trials=1, fuzz_examples=20,
                              legacy_control=False)
    else:
        result = run_campaign()
    print(render(result))
    goal = result["kills"] >= (5 if smoke else 200)
    print(f"goal: all zero with >= 200 kills: "
          f"{'met' if result['all_zero'] and goal else 'NOT met'}")
    result["goal_met"] = bool(result["all_zero"] and goal)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--child" in args:
        return child_main(args)
    p = argparse.ArgumentParser(description="SIGKILL crash campaign on SqliteStore")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(args)
    result = run(smoke=a.smoke)
    if a.json:
        print(json.dumps(result, indent=2))
    return 0 if result["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
