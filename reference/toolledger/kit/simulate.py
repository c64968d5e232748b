"""``toolledger simulate``: one approved side-effecting call, one crash, one resume, measured.

What it is for
--------------
:func:`run_simulation` runs issue #443's scenario through the engine kit
(:mod:`toolledger.kit.engine`): a scripted provider asks for ``send_email``, a
scripted human approves, the call executes against a
:class:`~toolledger.kit.external.CountingExternalSystem`, and the engine dies at
a crash point.  A new engine then resumes from durable storage only, and
the network finally delivers any request that was still in flight (the
late original, the case fencing and deduplication exist for).  The
:class:`SimulationReport` says what really happened: effects applied at the
external system, adapter invocations, the conversation's final tool result,
the ledger record, every recovery decision and the audit rows.

With ``store="sqlite"`` the run happens in a child process (``python -m
toolledger.kit.simulate --child ...``) that really SIGKILLs itself at the crash
point; a second child resumes from the SQLite file, the conversation files
and the external system's fsynced JSON-lines log.  ``crash_with="exception"``
keeps everything in this process (the same storage, a raised
:class:`~toolledger.kit.engine.SimulatedCrash`): fast, for the test matrix.

Wiring into the ``toolledger`` CLI: ``cli.SUBCOMMANDS.append(Subcommand(
"simulate", simulate.HELP, simulate.configure, simulate.cmd_simulate))``, or
:func:`register` on an ``argparse`` subparsers object.  ``python -m
toolledger.kit.simulate ...`` runs the same command stand-alone.

Files of a SQLite run: the store ``DB`` (with SQLite's ``DB-wal`` and
``DB-shm`` while it is open), the conversation checkpoints in the directory
``DB.conversation/`` and the external system's log ``DB.external.jsonl``.
``--db`` implies ``--store sqlite``.  A run never touches files that already
exist: it refuses, naming them; ``--fresh`` first removes exactly these
files, and only after checking that each is what a simulate run writes (a
toolledger store, a conversation directory holding only checkpoints, an
external log of JSON events).  Every bad ``--db`` path (a missing directory,
a directory the process cannot write, a directory given as the file, a path
below a regular file, an existing file of any kind) is refused before
anything is created: one line naming the path and what to do, exit status 2.

Exit status of the command (:data:`EXIT_DUPLICATE`): 0 when every effect
was applied at most once per authorization (the approval, plus a retry a
human chose); 3 when the run shows a duplicate effect, issue #443's bug (the
legacy engine's demo exits 3, and so would a ledger run if the protocol ever
failed); 2 for bad input; 1 when the simulation itself could not run.

What it must never do: overwrite or delete a file it did not write, or
report a number it did not measure: effects and invocations are counted by
the external system, results read back from durable storage.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from .._core.ledger import RESOLUTIONS
from .._core.protocol import InvalidInput, RecoveryPolicy
from .._core.stores import MemoryStore, Store, StoreError
from .._core.tools import ToolRegistry
from .engine import (
    SEED_MATRIX,
    ConversationStore,
    CrashInjector,
    CrashPoint,
    DecisionTaken,
    EngineMode,
    FileConversationStore,
    MemoryConversationStore,
    ScriptedHuman,
    ScriptedProvider,
    SimulatedCrash,
    TurnEngine,
    TurnResult,
    TurnStatus,
    crash_points,
    parse_crash_point,
    tool_call,
)
from .external import CountingAdapter, CountingExternalSystem

__all__ = [
    "EXIT_DUPLICATE",
    "HELP",
    "SimulationFailed",
    "SimulationReport",
    "cmd_simulate",
    "configure",
    "main",
    "register",
    "run_simulation",
]

HELP: Final = (
    "crash one approved side-effecting call at a crash point, resume, report what happened"
)
SESSION_ID: Final = "sim-session"
TOOL: Final = "send_email"
ARGUMENTS: Final[dict[str, Any]] = {
    "to": "ada@example.com",
    "subject": "Q3 report",
    "body": "Numbers attached.",
}
USER_TEXT: Final = "Email Ada the Q3 report."
HUMAN_RESULT: Final = "a human checked the outbox: the email was sent"
StoreKind = Literal["memory", "sqlite"]
CrashWith = Literal["exception", "sigkill"]
ISSUE: Final = "https://github.com/andrewyng/openworker/issues/443"
EXIT_DUPLICATE: Final = 3
"""Exit status of a run whose external system applied an effect more often than authorized."""
_CHILD_STORE_ERROR: Final = 3  # a child's StoreError: one line on stderr, no traceback
EPILOG: Final = f"""\
files of a SQLite run (--db DB; --db implies --store sqlite):
  DB                  the ledger (SqliteStore; ledger engine only), with DB-wal and
                      DB-shm beside it while it is open
  DB.conversation/    the conversation checkpoints (JSON files)
  DB.external.jsonl   the external system's log: every request and effect
  simulate never writes over existing files; --fresh removes exactly these files
  first, after checking each is one a simulate run wrote.

exit status:
  0  every effect was applied at most once per authorization (the approval,
     plus a retry a human chose with --resolve retry)
  {EXIT_DUPLICATE}  DUPLICATE: the run applied an effect more often than authorized,
     the bug of issue #443 ({ISSUE});
     the legacy engine's demo exits {EXIT_DUPLICATE} on purpose
  2  bad input (an unknown value, a bad --db path): one line says what to do
  1  the simulation itself could not run (e.g. the store failed mid-run)
"""


@dataclass
class SimulationReport:
    """What one simulation measured (``to_dict()`` is the ``--json`` output)."""

    engine: str
    policy: str
    crash_at: str | None
    store: str
    crash_with: str
    crash_point_on_path: bool
    crashed: bool
    turn_status: str
    effects_applied: int
    adapter_invocations: int
    final_tool_result: str | None
    final_tool_status: str | None
    recovery_required: list[dict[str, Any]] = field(default_factory=list)
    ledger_record: dict[str, Any] | None = None
    decisions: list[dict[str, Any]] = field(default_factory=list)
    audit: list[dict[str, Any]] = field(default_factory=list)
    external_requests: list[dict[str, Any]] = field(default_factory=list)
    late_deliveries: list[dict[str, Any]] = field(default_factory=list)
    resolution: str | None = None
    engine_log: list[str] = field(default_factory=list)

    @property
    def decision_names(self) -> list[str]:
        """The recovery decisions in the order they were taken."""
        return [str(d["decision"]) for d in self.decisions]

    @property
    def authorized_effects(self) -> int:
        """How many effects were authorized: the one approval plus each human retry.

        A human who answers ``recovery_required`` with "retry" authorizes one
        more attempt (audited as ``human_retry``); ``AtMostOnceEffect`` allows
        exactly these.
        """
        return 1 + sum(1 for a in self.audit if a.get("kind") == "human_retry")

    @property
    def duplicate(self) -> bool:
        """The effect was applied more often than authorized (issue #443's bug)."""
        return self.effects_applied > self.authorized_effects

    def duplicate_line(self) -> str:
        """The loud one-line verdict of a duplicate run ("" when there is none)."""
        if not self.duplicate:
            return ""
        times = "approval" if self.authorized_effects == 1 else "authorizations"
        return (
            f"DUPLICATE: the effect was applied {self.effects_applied} times for "
            f"{self.authorized_effects} {times} (issue #443: {ISSUE})"
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["authorized_effects"] = self.authorized_effects
        out["duplicate"] = self.duplicate
        return out

    def render(self) -> str:
        """The report as a human-readable table."""
        how = (
            "crash simulated by an exception" if self.crash_with == "exception"
            else "crash by a real SIGKILL of a child process"
        )
        head = (
            f"engine={self.engine} policy={self.policy} crash-at={self.crash_at!r} "
            f"store={self.store} ({how})"
        )
        crashed = "yes" if self.crashed else (
            "no (the point is not on this policy's path)" if not self.crash_point_on_path
            else "no"
        )
        verdict = self.duplicate_line()
        status = str(self.final_tool_status)
        if verdict and self.final_tool_status == "ok":
            # the conversation says "ok" once; the outside world saw it twice
            status += f", but the effect was applied {self.effects_applied} times"
        result = (
            f"{self.final_tool_result} [{status}]"
            if self.final_tool_result is not None
            else "(none)"
        )
        effects = str(self.effects_applied)
        if verdict:
            effects += f"   <-- DUPLICATE ({self.authorized_effects} authorized)"
        elif self.effects_applied > 1:
            effects += (f"   (all {self.authorized_effects} authorized: the approval "
                        "and a human's retry)")
        rec = self.ledger_record
        rec_text = (
            "(none: " + ("legacy engine)" if self.engine == "legacy" else "readonly bypasses it)")
            if rec is None
            else " ".join(f"{k}={v}" for k, v in rec.items())
        )
        lines = [
            head,
            "-" * len(head),
            *([verdict, ""] if verdict else []),
            f"crashed:              {crashed}",
            f"turn status:          {self.turn_status}",
            f"effects applied:      {effects}",
            f"adapter invocations:  {self.adapter_invocations}",
            f"final tool result:    {result}",
            f"ledger record:        {rec_text}",
        ]
        if self.resolution:
            lines.append(f"human resolution:     {self.resolution}")
        for item in self.recovery_required:
            lines.append(
                f"recovery required:    {item['tool']} at {_where(item['position'])}, "
                f"attempt {item['attempt']}"
            )
        lines.append("recovery decisions:" + ("   (none)" if not self.decisions else ""))
        for d in self.decisions:
            lines.append(
                f"  {_where(d['position'])}: {d['decision']:<17} from {_inputs(d['inputs'])}"
            )
        lines.append("late deliveries:" + ("      (none)" if not self.late_deliveries else ""))
        for r in self.late_deliveries:
            lines.append(f"  request {r['number']} attempt {r['attempt']} -> {r['status']}")
        lines.append("audit rows:" + ("           (none)" if not self.audit else ""))
        if self.audit:
            cols = ("kind", "attempt", "authorization", "recovery_decision", "note")
            rows = [tuple("-" if a[c] is None else str(a[c]) for c in cols) for a in self.audit]
            widths = [max(len(x[i]) for x in (cols, *rows)) for i in range(len(cols))]
            for cells in (cols, *rows):
                lines.append(
                    "  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))
                )
        if verdict:
            lines += ["", f"exit status {EXIT_DUPLICATE}: DUPLICATE (see the top)"]
        return "\n".join(line.rstrip() for line in lines)


def _where(position: Sequence[int]) -> str:
    """A call's position, labelled: the assistant message's turn, the index in it."""
    turn, slot = position
    return f"turn {turn}, slot {slot}"


def _inputs(inputs: dict[str, Any]) -> str:
    """The recovery decision's inputs in one short phrase (``--json`` has them raw)."""
    status = str(inputs.get("status"))
    record = "no record" if status == "none" else (
        f"{status} (attempt {inputs.get('attempt')}/{inputs.get('max_attempts')})"
    )
    approval = str(inputs.get("approval"))
    if not inputs.get("requires_approval"):
        approval = "no approval needed"
    elif approval != "approved":
        approval = f"approval {approval}"
    parts = [
        record,
        str(inputs.get("policy")),
        approval,
        "args match" if inputs.get("digest_matches") else "ARGS DIFFER",
        "result in the conversation" if inputs.get("has_result") else "no result",
        "legacy call" if inputs.get("legacy") else "new call",
    ]
    return ", ".join(parts)


# --------------------------------------------------------------------------
# The scenario
# --------------------------------------------------------------------------


def _policy(policy: RecoveryPolicy | str) -> RecoveryPolicy:
    try:
        return RecoveryPolicy(str(policy))
    except ValueError:
        valid = ", ".join(p.value for p in RecoveryPolicy)
        raise InvalidInput(f"unknown policy {policy!r}; valid policies: {valid}") from None


def _engine_mode(mode: EngineMode | str) -> EngineMode:
    try:
        return EngineMode(str(mode))
    except ValueError:
        valid = ", ".join(m.value for m in EngineMode)
        raise InvalidInput(f"unknown engine {mode!r}; valid engines: {valid}") from None


def _point(mode: EngineMode, crash_at: str | CrashPoint | None) -> CrashPoint | None:
    if crash_at is None or (isinstance(crash_at, str) and crash_at.strip().casefold() == "none"):
        return None
    return parse_crash_point(mode, crash_at)


@dataclass
class _World:
    """Everything that survives a crash: storage and the external system."""

    store: Store | None
    conversations: ConversationStore
    system: CountingExternalSystem


def _paths(db: Path) -> tuple[Path, Path]:
    return Path(f"{db}.conversation"), Path(f"{db}.external.jsonl")


def _open_world(mode: EngineMode, store: StoreKind, db: Path | None) -> _World:
    if store == "memory":
        return _World(
            MemoryStore() if mode is EngineMode.LEDGER else None,
            MemoryConversationStore(),
            CountingExternalSystem(),
        )
    assert db is not None
    from .._core.sqlite_store import SqliteStore

    conv_dir, external = _paths(db)
    return _World(
        SqliteStore(db) if mode is EngineMode.LEDGER else None,
        FileConversationStore(conv_dir),
        CountingExternalSystem(external),
    )


def _engine(
    mode: EngineMode, policy: RecoveryPolicy, world: _World, crash: CrashInjector
) -> TurnEngine:
    registry = ToolRegistry()
    registry.register(
        TOOL,
        CountingAdapter(world.system, TOOL, on_request_sent=crash.request_sent),
        policy=policy,
        requires_approval=True,
    )
    return TurnEngine(
        session_id=SESSION_ID,
        mode=mode,
        registry=registry,
        provider=ScriptedProvider([[tool_call("call_0", TOOL, ARGUMENTS)], "The email is sent."]),
        human=ScriptedHuman(default="approve"),
        conversations=world.conversations,
        store=world.store,
        crash=crash,
    )


def _resume_and_measure(
    mode: EngineMode,
    policy: RecoveryPolicy,
    world: _World,
    resolve: str | None,
    earlier: Sequence[DecisionTaken] = (),
    result: TurnResult | None = None,
) -> dict[str, Any]:
    """Resume (if the run did not finish), deliver late requests, maybe resolve, measure."""
    engine = _engine(mode, policy, world, CrashInjector(None))
    if result is None:
        result = engine.resume()
    late = world.system.deliver_in_flight()
    resolution = None
    if resolve is not None and result.status is TurnStatus.RECOVERY_REQUIRED:
        text = HUMAN_RESULT if resolve == "applied" else None
        result = engine.resolve_recovery(result.halted[0], resolve, result_text=text)
        resolution = resolve
    return _measure(engine, world, result, [*earlier, *engine.decisions], late, resolution)


def _measure(
    engine: TurnEngine,
    world: _World,
    result: TurnResult,
    decisions: Sequence[DecisionTaken],
    late: Sequence[Any],
    resolution: str | None,
) -> dict[str, Any]:
    tool_messages = [m for m in engine.messages if m.get("role") == "tool"]
    final = tool_messages[-1] if tool_messages else None
    out: dict[str, Any] = {
        "turn_status": result.status.value,
        "effects_applied": world.system.effects(),
        "adapter_invocations": world.system.invocations(),
        "final_tool_result": None if final is None else final.get("content"),
        "final_tool_status": None if final is None else final.get("status"),
        "external_requests": [
            {"number": r.number, "execution_id": r.execution_id, "attempt": r.attempt,
             "idempotency_key": r.idempotency_key, "status": r.status.value}
            for r in world.system.requests
        ],
        "late_deliveries": [
            {"number": r.number, "attempt": r.attempt, "status": r.status.value} for r in late
        ],
        "resolution": resolution,
        "engine_log": list(engine.log),
        "decisions": [
            {"position": list(d.position), "execution_id": d.execution_id,
             "decision": d.decision.value, "inputs": dict(d.inputs)}
            for d in decisions
        ],
        "recovery_required": [],
        "ledger_record": None,
        "audit": [],
    }
    if engine.mode is EngineMode.LEDGER:
        state = engine.ledger.state
        out["recovery_required"] = [
            {"position": list(i.position), "tool": i.tool, "execution_id": i.execution_id,
             "attempt": i.attempt}
            for i in engine.recovery_required()
        ]
        calls = list(state.calls)
        if calls and calls[-1].execution_id in state.ledger:
            rec = state.record(calls[-1].execution_id)
            out["ledger_record"] = {
                "status": rec.status.value,
                "attempt": rec.attempt,
                "authorization": rec.authorization.value,
                "result": None if rec.result is None else rec.result.kind.value,
            }
        out["audit"] = [
            {"position": list(a.position), "tool_call_id": a.tool_call_id,
             "execution_id": a.execution_id, "kind": a.kind, "attempt": a.attempt,
             "authorization": a.authorization.value, "recovery_decision": a.recovery_decision,
             "inputs": a.inputs, "note": a.note}
            for a in engine.ledger.audit()
        ]
    return out


def run_simulation(
    engine_mode: EngineMode | str,
    policy: RecoveryPolicy | str,
    crash_at: str | CrashPoint | None,
    store: StoreKind | None = None,
    db: str | os.PathLike[str] | None = None,
    *,
    crash_with: CrashWith | None = None,
    resolve: str | None = None,
    fresh: bool = False,
) -> SimulationReport:
    """Run the scenario, crash at ``crash_at`` (``None``/``"none"``: no crash), resume, measure.

    ``store`` defaults to ``"sqlite"`` when ``db`` is given, else ``"memory"``.
    ``store="sqlite"`` writes ``db`` (default: a new temp dir), and next to it
    ``DB.conversation/`` and ``DB.external.jsonl``; none of them may exist
    unless ``fresh``, which first removes exactly these files of an earlier
    run (and refuses anything a run did not write).  By default it crashes a
    child process with SIGKILL (``crash_with="sigkill"``);
    ``crash_with="exception"`` runs in this process.  ``resolve`` (``"applied"``,
    ``"retry"``, ``"abandon"``) answers a call left in ``recovery_required``.
    Raises ``InvalidInput`` for a bad engine, policy, crash point, option or
    ``db`` path (having created nothing), ``SimulationFailed`` if a child's
    store fails mid-run.
    """
    mode = _engine_mode(engine_mode)
    pol = _policy(policy)
    point = _point(mode, crash_at)
    if store is None:
        store = "sqlite" if db is not None else "memory"
    if store not in ("memory", "sqlite"):
        raise InvalidInput(f"unknown store {store!r}; valid stores: memory, sqlite")
    how: CrashWith = crash_with or ("sigkill" if store == "sqlite" else "exception")
    if how not in ("exception", "sigkill"):
        raise InvalidInput(f"crash_with must be 'exception' or 'sigkill', not {how!r}")
    if store == "memory" and how == "sigkill":
        raise InvalidInput(
            "a memory store dies with the process: use store='sqlite' (--store sqlite) "
            "for a SIGKILL run"
        )
    if resolve is not None and resolve not in RESOLUTIONS:
        raise InvalidInput(f"unknown resolution {resolve!r}; valid: {', '.join(RESOLUTIONS)}")
    if store == "memory" and db is not None:
        raise InvalidInput("a db path goes with store='sqlite' (--db implies --store sqlite)")
    db_path = _fresh_db(db, fresh) if store == "sqlite" else None
    on_path = point is None or point.reached_by(pol)
    base: dict[str, Any] = {
        "engine": mode.value,
        "policy": pol.value,
        "crash_at": None if point is None else point.name,
        "store": store,
        "crash_with": how,
        "crash_point_on_path": on_path,
    }
    world: _World
    if db_path is not None:
        # create the files here, so that a path nobody may write is refused in
        # one line with nothing left behind, before any child runs
        world = _create_world(mode, db_path)
        if how == "sigkill":
            if world.store is not None:
                world.store.close()
            crashed, measured = _run_in_children(mode, pol, point, db_path, resolve)
            return SimulationReport(**base, crashed=crashed, **measured)
    else:
        world = _open_world(mode, store, db_path)
    crash = CrashInjector(point, how="raise")
    first = _engine(mode, pol, world, crash)
    result: TurnResult | None
    try:
        result = first.run(USER_TEXT)
    except SimulatedCrash:
        result = None
        if world.store is not None and store == "sqlite":
            world.store.close()  # the process died: reopen everything from disk
            world = _open_world(mode, store, db_path)
        elif store == "sqlite":
            world = _open_world(mode, store, db_path)
    measured = _resume_and_measure(mode, pol, world, resolve, first.decisions, result)
    if world.store is not None:
        world.store.close()
    return SimulationReport(**base, crashed=crash.fired, **measured)


class SimulationFailed(RuntimeError):
    """The simulation could not run (e.g. its store failed in a child); one line says why."""


def _store_files(db: Path) -> tuple[Path, ...]:
    """Every file a SQLite run writes at ``db``: the store, SQLite's, the side files."""
    conv, external = _paths(db)
    return (db, Path(f"{db}-wal"), Path(f"{db}-shm"), conv, external)


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


# what FileConversationStore writes for SESSION_ID, and its temporaries
_CHECKPOINT = re.compile(
    re.escape(SESSION_ID) + r"\.(messages|inbox)\.json([A-Za-z0-9_]*\.tmp)?"
)
# the events CountingExternalSystem logs (external.CountingExternalSystem._replay)
_EXTERNAL_OPS: Final = frozenset({"receive", "apply", "dedup", "reject", "drop", "fence"})


def _not_ours(path: Path, db: Path) -> str | None:
    """Why ``path`` (one of :func:`_store_files`) is not a file a simulate run wrote."""
    try:
        return _why_not_ours(path, db)
    except OSError as exc:  # unreadable: not ours to judge, so not ours to delete
        return f"it cannot be read ({exc.strerror or exc})"


def _why_not_ours(path: Path, db: Path) -> str | None:
    from .._core.sqlite_store import APPLICATION_ID

    conv, external = _paths(db)
    if path.is_symlink():
        return "it is a symbolic link"
    if path == conv:
        if not path.is_dir():
            return "it is not a directory"
        strays = [x.name for x in path.iterdir()
                  if not (x.is_file() and not x.is_symlink() and _CHECKPOINT.fullmatch(x.name))]
        return f"it holds {', '.join(sorted(strays)[:3])}, not only checkpoints" if strays else None
    if not path.is_file():
        return "it is not a regular file"
    if path == db:
        with path.open("rb") as f:
            header = f.read(100)
        if not header.startswith(b"SQLite format 3\x00"):
            return "it is not a SQLite database"
        if len(header) < 72 or int.from_bytes(header[68:72], "big") != APPLICATION_ID:
            return "it is a SQLite database of another application, not a toolledger store"
        return None
    if path == external:
        try:
            lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
            for line in lines:
                if not line.endswith("\n"):
                    break  # a torn last line, as CountingExternalSystem ignores it
                event = json.loads(line)
                if not isinstance(event, dict) or event.get("op") not in _EXTERNAL_OPS:
                    return "it is not an external system log (a line is not one of its events)"
        except (UnicodeDecodeError, json.JSONDecodeError):
            return "it is not an external system log (not JSON lines)"
        return None
    # DB-wal / DB-shm: SQLite's, removable only together with their store
    if not _exists(db) or _not_ours(db, db) is not None:
        return f"it belongs to {db}, which is not a toolledger store"
    return None


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        for x in path.iterdir():
            x.unlink()
        path.rmdir()
    else:
        path.unlink()


def _fresh_db(db: str | os.PathLike[str] | None, fresh: bool = False) -> Path:
    """Check a ``--db`` path before anything is created; with ``fresh``, clear a past run.

    Raises ``InvalidInput`` with one line naming the path and what to do.
    Root passes every permission check, so a directory it cannot write (e.g.
    ``/sys``) is caught only when the store is created: see :func:`_create_world`.
    """
    if db is None:
        return Path(tempfile.mkdtemp(prefix="toolledger-simulate-")) / "ledger.sqlite3"
    text = os.fspath(db)
    if not text:
        raise InvalidInput("--db needs a file path, e.g. --db run.sqlite3")
    path = Path(text)
    if path.is_dir():
        raise InvalidInput(
            f"--db {path} is a directory: give the path of a new store file in it, "
            f"e.g. --db {path / 'run.sqlite3'}"
        )
    parent = path.parent
    if not parent.is_dir():
        blocker = next((a for a in (parent, *parent.parents) if _exists(a) and not a.is_dir()),
                       None)
        if blocker is not None:
            raise InvalidInput(
                f"--db {path}: {blocker} is a file, not a directory: "
                "choose a --db path in an existing directory"
            )
        raise InvalidInput(
            f"--db {path}: directory {parent} does not exist: create it "
            f"(mkdir -p {parent}) or choose another --db path"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InvalidInput(
            f"--db {path}: cannot create files in directory {parent} (permission denied): "
            "choose a --db path in a directory you can write"
        )
    taken = [p for p in _store_files(path) if _exists(p)]
    if not taken:
        return path
    names = ", ".join(map(str, taken))
    foreign = [(p, why) for p in taken if (why := _not_ours(p, path)) is not None]
    if foreign:
        p, why = foreign[0]
        raise InvalidInput(
            f"--db {path}: {p} exists and {why}; simulate never writes over or deletes it "
            "(not even with --fresh): choose another --db path"
        )
    if not fresh:
        raise InvalidInput(
            f"--db {path}: a previous run's files exist ({names}); simulate writes a new "
            "store: add --fresh to remove exactly these files first, or choose another --db path"
        )
    for p in taken:
        _remove(p)
    return path


def _create_world(mode: EngineMode, db: Path) -> _World:
    """Create the run's files at ``db`` (checked by :func:`_fresh_db`); refuse in one line.

    This is where an unwritable directory shows when permission checks do not
    (root on a directory no one may create files in, like ``/sys``, or a
    read-only file system): whatever was created before the failure is removed,
    so a refused path leaves nothing behind.
    """
    try:
        return _open_world(mode, "sqlite", db)
    except (StoreError, OSError) as exc:
        for p in _store_files(db):
            if _exists(p) and _not_ours(p, db) is None:
                _remove(p)
        reason = " ".join(str(exc).split())
        raise InvalidInput(
            f"--db {db}: {reason}: choose a --db path in a directory you can write"
        ) from None


# --------------------------------------------------------------------------
# The SIGKILL path: two child processes
# --------------------------------------------------------------------------


def _child_command(
    phase: str, mode: EngineMode, policy: RecoveryPolicy, point: CrashPoint | None,
    db: Path, resolve: str | None,
) -> list[str]:
    cmd = [sys.executable, "-m", "toolledger.kit.simulate", "--child", phase,
           "--engine", mode.value,
           "--policy", policy.value, "--db", str(db),
           "--crash-at", "none" if point is None else point.name]
    if resolve is not None:
        cmd += ["--resolve", resolve]
    return cmd


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    # reference/, the directory holding toolledger/ (this module is toolledger/kit/)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_root, env.get("PYTHONPATH", "")) if p
    )
    return env


def _run_in_children(
    mode: EngineMode, policy: RecoveryPolicy, point: CrashPoint | None, db: Path,
    resolve: str | None,
) -> tuple[bool, dict[str, Any]]:
    run = subprocess.run(
        _child_command("run", mode, policy, point, db, None),
        env=_child_env(), capture_output=True, text=True, timeout=120, check=False,
    )
    killed = run.returncode == -signal.SIGKILL
    if run.returncode not in (0, -signal.SIGKILL):
        _child_failed("the simulation child", run)
    resumed = subprocess.run(
        _child_command("resume", mode, policy, None, db, resolve),
        env=_child_env(), capture_output=True, text=True, timeout=120, check=False,
    )
    if resumed.returncode != 0:
        _child_failed("the resuming child", resumed)
    measured: dict[str, Any] = json.loads(resumed.stdout)
    return killed, measured


def _child_failed(who: str, done: subprocess.CompletedProcess[str]) -> None:
    if done.returncode == _CHILD_STORE_ERROR:
        # the child's StoreError, already one line that says what to do
        raise SimulationFailed(f"{who} stopped: {done.stderr.strip()}")
    # anything else is a bug in the kit: keep the child's whole traceback
    raise RuntimeError(f"{who} exited with {done.returncode}:\n{done.stderr.strip()}")


def _child(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m toolledger.kit.simulate --child")
    p.add_argument("--child", choices=("run", "resume"), required=True)
    p.add_argument("--engine", required=True)
    p.add_argument("--policy", required=True)
    p.add_argument("--crash-at", required=True)
    p.add_argument("--db", type=Path, required=True)
    p.add_argument("--resolve")
    a = p.parse_args(argv)
    mode, pol = _engine_mode(a.engine), _policy(a.policy)
    try:
        world = _open_world(mode, "sqlite", a.db)
        if a.child == "run":
            crash = CrashInjector(_point(mode, a.crash_at), how="sigkill")
            _engine(mode, pol, world, crash).run(USER_TEXT)  # SIGKILLs itself at the point
            return 0
        measured = _resume_and_measure(mode, pol, world, a.resolve)
    except StoreError as exc:
        print(" ".join(str(exc).split()), file=sys.stderr)
        return _CHILD_STORE_ERROR
    print(json.dumps(measured))
    return 0


# --------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------


def configure(p: argparse.ArgumentParser) -> None:
    """Add ``toolledger simulate``'s options to ``p``."""
    p.add_argument("--engine", choices=[m.value for m in EngineMode],
                   help="legacy: today's engine (issue #443); ledger: this protocol "
                        "(default: ledger; --list-crash-points without it lists both)")
    p.add_argument("--policy", choices=[x.value for x in RecoveryPolicy], default="manual",
                   help="the tool's declared recovery policy (default: manual)")
    p.add_argument("--crash-at", metavar="POINT",
                   help="where the process dies, e.g. 'after ExternalApply' "
                        "(see --list-crash-points; 'none' for no crash)")
    p.add_argument("--list-crash-points", action="store_true",
                   help="list the crash points of --engine (or of both) and exit")
    p.add_argument("--store", choices=["memory", "sqlite"],
                   help="memory: in-process; sqlite: SqliteStore in a child process that is "
                        "SIGKILLed at POINT and resumed by a new process "
                        "(default: sqlite with --db, else memory)")
    p.add_argument("--db", metavar="DB",
                   help="the new SQLite store file (implies --store sqlite; its side files "
                        "DB.conversation/ and DB.external.jsonl go next to it; "
                        "default with --store sqlite: a new temp dir)")
    p.add_argument("--fresh", action="store_true",
                   help="with --db: first remove exactly the files of an earlier run at DB "
                        "(refused for any file a simulate run did not write)")
    p.add_argument("--crash-with", choices=["exception", "sigkill"],
                   help="how the process dies (default: exception for memory, sigkill for sqlite)")
    p.add_argument("--resolve", choices=list(RESOLUTIONS),
                   help="a human answers a call left in recovery_required")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.epilog = EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter


def _list_points(engine: str | None) -> str:
    modes = [EngineMode(engine)] if engine else list(EngineMode)
    lines = []
    for m in modes:
        lines.append(f"{m.value} engine:")
        for p in crash_points(m):
            seed = [r.name for r in SEED_MATRIX.values() if r.point(m) == p]
            alias = f" (= {', '.join(p.aliases)})" if p.aliases else ""
            paths = "" if m is EngineMode.LEGACY else f" [{', '.join(sorted(p.paths))}]"
            tag = f"  seed row: {', '.join(seed)}" if seed else ""
            lines.append(f"  {p.name}{alias}{paths}{tag}")
            lines.append(f"      durable: {p.durable}")
    return "\n".join(lines)


def cmd_simulate(args: argparse.Namespace) -> int:
    """Run ``toolledger simulate``; the exit status is the one :data:`EPILOG` documents.

    0: no duplicate; :data:`EXIT_DUPLICATE`: the run applied an effect more
    often than authorized; 2: bad input (one line, valid values listed);
    1: the simulation could not run.
    """
    if args.list_crash_points:
        print(_list_points(args.engine))
        return 0
    engine = args.engine or EngineMode.LEDGER.value
    if args.crash_at is None:
        print("toolledger simulate: --crash-at POINT is required (or --list-crash-points); "
              f"valid points for the {engine} engine: "
              + ", ".join(p.name for p in crash_points(engine)), file=sys.stderr)
        return 2
    if args.db is not None and args.store == "memory":
        print("toolledger simulate: --db names a SQLite store and implies --store sqlite: "
              "drop --store memory or --db", file=sys.stderr)
        return 2
    if args.fresh and args.db is None:
        print("toolledger simulate: --fresh goes with --db DB (it removes the files of an "
              "earlier run at DB)", file=sys.stderr)
        return 2
    try:
        report = run_simulation(
            engine, args.policy, args.crash_at, args.store, args.db,
            crash_with=args.crash_with, resolve=args.resolve, fresh=args.fresh,
        )
    except InvalidInput as exc:
        print(f"toolledger simulate: {exc}", file=sys.stderr)
        return 2
    except SimulationFailed as exc:
        print(f"toolledger simulate: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.render())
    return EXIT_DUPLICATE if report.duplicate else 0


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``simulate`` to an ``argparse`` subparsers object (``set_defaults(_run=...)``)."""
    p: argparse.ArgumentParser = subparsers.add_parser("simulate", help=HELP, description=HELP)
    configure(p)
    p.set_defaults(_run=cmd_simulate)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m toolledger.kit.simulate``: the command stand-alone (and the child processes)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if "--child" in args_list:
        return _child(args_list)
    parser = argparse.ArgumentParser(prog="toolledger simulate", description=HELP)
    configure(parser)
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    return cmd_simulate(args)


if __name__ == "__main__":
    sys.exit(main())
