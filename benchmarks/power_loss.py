"""The power-loss harness: every file state a power cut may leave, opened by the store.

What it does
------------
A SIGKILL (the crash campaign, :mod:`benchmarks.crash_campaign`) loses no
write the kernel accepted; a power cut loses every write that no fsync
covered, and may tear a write.  This harness, after ALICE (Pillai et al.,
OSDI 2014) and CrashMonkey (Mohan et al., OSDI 2018), records the system
calls a workload of :class:`~toolledger._core.sqlite_store.SqliteStore`
makes, under ``strace`` (``-y -xx``: every write with its file, offset and
bytes; every ``fsync``/``fdatasync``, ``link``, ``rename``, ``unlink``,
``ftruncate``, and the ``ACK`` lines the workload writes to its stdout each
time a step returned), then builds the crash states and opens each one.

The file-system model (ALICE's, for a journaling file system in its
default mode): a write or truncation of a file is durable once an fsync of
that file follows it; a directory entry (a create, ``link``, ``rename``,
``unlink``) once an fsync of the directory follows it.  At a crash point
(just before each sync, just after each ``ACK``, and at the end) the pending
operations are in issue order, and a crash state keeps:

- ``prefix``: the first c pending operations, for every c (any unsynced
  suffix lost, directory entries included: "the entry of an unsynced create
  missing" is the cut just before it);
- ``torn``: the first c, then only part of the next write, at 512-byte
  sector boundaries (its first half of sectors, or all but its first sector);
- ``no-dir``: every pending write, and none of the pending directory
  entries.

The ``-shm`` file is left out (SQLite rebuilds it from the ``-wal``).  Each
state is written to a fresh directory and judged:

- ``no_store``: the store file is absent and its creation was never
  acknowledged (correct);
- ``recovered``: the store opens, passes ``verify()``, and its logical
  state (every session's state and audit rows) is the one of the last
  acknowledged step or of the step in flight; every effect the workload's
  tool applied has its ``dispatched`` durable; and a resume (``Session.open``,
  ``recover()``, running what it says to run) applies no effect twice;
- ``failed_closed``: the store refuses the file with ``StoreCorrupt`` or
  ``UnsupportedSchema`` (not silent; a power cut should never cause it on a
  correct store, so the figures count it apart);
- incorrect: ``lost`` (an acknowledged step is gone, e.g. the store file or
  a commit), ``wrong`` (a state the workload never committed), ``unbacked``
  (an applied effect without its durable ``dispatched``), ``duplicate`` (the
  resume applied an effect again), ``error`` (any other exception).

Planted bugs (:data:`VARIANTS`, patched copies of the store's methods made
in the workload process) show the harness is not blind: the directory
fsync after the link removed, ``os.replace`` for ``os.link`` (a second
creator, as the loser of a creation race runs, replaces a store that has
data), the file fsync moved after the link, the directory fsync moved
before it, and ``synchronous=NORMAL``.  ``tests/test_sqlite_durability.py``
uses the same trace for the order of the durability steps.

``python benchmarks/power_loss.py [--smoke] [--variant NAME]``; ``make
bench`` runs it through ``benchmarks/run_all.py`` (states explored, each
outcome counted, for the real store and each planted bug).  Needs
``strace`` (Debian package ``strace``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "reference"))

from toolledger import Attempt, Next, Session, SqliteStore, Tool
from toolledger._core import sqlite_store as _sqlite_store
from toolledger._core.stores import StoreCorrupt, UnsupportedSchema

STORE = "store.sqlite3"
SID = "power"
SECTOR = 512
TRACED = ("openat,open,creat,write,pwrite64,writev,pwritev,pwritev2,ftruncate,fsync,"
          "fdatasync,link,linkat,rename,renameat,renameat2,unlink,unlinkat,close")
INCORRECT = ("lost", "wrong", "unbacked", "duplicate", "error")

# -- planted bugs: patched copies of the store's methods ------------------------------

_LINK = "                os.link(tmp, self.path)\n"
_DIR_FSYNC = "                os.fsync(dfd)\n"
_FILE_FSYNC = "                os.fsync(fd)\n"

VARIANTS: dict[str, list[tuple[str, list[tuple[str, str]]]]] = {
    "real": [],
    # the directory fsync after the link removed: the new entry may vanish on power loss
    "no-dir-fsync": [("_create_atomically", [(_DIR_FSYNC, "                pass\n")])],
    # creation replaces what is there: a racing creator overwrites a store with data
    "replace": [("_create_atomically", [(_LINK, _LINK.replace("os.link", "os.replace"))])],
    # the temporary file fsynced only after it is linked into place
    "link-before-file-fsync": [("_create_atomically", [
        (_FILE_FSYNC, "                pass\n"),
        (_LINK, _LINK + "                _late = os.open(tmp, os.O_RDONLY)\n"
                        "                os.fsync(_late)\n                os.close(_late)\n"),
    ])],
    # the directory fsynced before the link instead of after it
    "dir-fsync-before-link": [("_create_atomically", [
        (_DIR_FSYNC, "                pass\n"),
        (_LINK, "                _d = os.open(self.path.parent, os.O_RDONLY)\n"
                "                os.fsync(_d)\n                os.close(_d)\n" + _LINK),
    ])],
    # a commit returns before the WAL is synced
    "synchronous-normal": [("_configure", [
        ('"PRAGMA synchronous = FULL"', '"PRAGMA synchronous = NORMAL"'),
        ('fetchone()[0] != 2', 'fetchone()[0] != 1'),
    ])],
    # no sync at all: neither a commit nor a checkpoint waits for the disk
    "synchronous-off": [("_configure", [
        ('"PRAGMA synchronous = FULL"', '"PRAGMA synchronous = OFF"'),
        ('fetchone()[0] != 2', 'fetchone()[0] != 0'),
    ])],
}
"""Each planted bug: the methods of ``SqliteStore`` it patches, as (old, new) text edits."""


MUST_FIND = ("no-dir-fsync", "replace", "dir-fsync-before-link", "synchronous-normal",
             "synchronous-off")
"""The planted bugs that lose data on a power cut: the harness must report each."""

BENIGN = {"link-before-file-fsync": "SQLite's own checkpoint of the new file (the creation's "
          "wal_checkpoint(TRUNCATE)) fsynced it before the link already: the store's fsync "
          "is a second one, so moving it loses nothing (the order check of "
          "tests/test_sqlite_durability.py still refuses it)"}
"""Planted bugs the harness must NOT report, and why: a check that cried wolf would."""


def apply_variant(name: str) -> None:
    """Patch ``SqliteStore`` in this process with the planted bug ``name``.

    Every edit must match its method's source exactly once: a store whose
    code moved makes the variant fail loudly instead of testing nothing."""
    if name not in VARIANTS:
        raise SystemExit(f"unknown variant {name!r}; use one of {', '.join(VARIANTS)}")
    for method, edits in VARIANTS[name]:
        src = inspect.getsource(getattr(SqliteStore, method))
        for old, new in edits:
            if src.count(old) != 1:
                raise SystemExit(f"variant {name}: {old!r} is not in SqliteStore.{method}")
            src = src.replace(old, new)
        space: dict[str, Any] = dict(vars(_sqlite_store))
        # the method's source at its indentation in the class, compiled in a class
        exec(compile("class _Patched:\n" + src, f"<variant {name}>", "exec"), space)
        setattr(SqliteStore, method, space["_Patched"].__dict__[method])


# -- the workload (a child process, under strace) --------------------------------------


def mark(*words: object) -> None:
    """One ``ACK`` line on stdout: the step before it returned (seen in the trace)."""
    os.write(1, ("ACK " + " ".join(str(w) for w in words) + "\n").encode())


def digest(store: SqliteStore) -> str:
    """The logical state of the store: every session's state and audit rows."""
    text = repr(_canonical([(sid, store.load(sid), store.audit(sid))
                            for sid in store.sessions()]))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _canonical(value: Any) -> Any:
    """``value`` with sets and dicts sorted: a repr that is the same in every process
    (a frozenset's order follows the string hash, which each process seeds anew)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__,
                tuple((f.name, _canonical(getattr(value, f.name)))
                      for f in dataclasses.fields(value)))
    if isinstance(value, (set, frozenset)):
        return ("set", sorted(repr(_canonical(v)) for v in value))
    if isinstance(value, dict):
        return ("dict", sorted((repr(_canonical(k)), _canonical(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_canonical(v) for v in value)
    return value


def tools() -> dict[str, Tool | str]:
    # manual: a resume never re-sends a call whose outcome is unknown, so ANY second
    # request for an execution id is a duplicate effect
    return {"send": Tool("manual", requires_approval=False)}


def calls(seq: int, n: int) -> list[dict[str, Any]]:
    return [{"id": f"c{seq}-{i}", "name": "send", "arguments": {"seq": seq, "i": i}}
            for i in range(n)]


def _counting(store: SqliteStore) -> None:
    """ACK every counted commit, with the logical state it made durable."""
    original = store.commit

    def commit(*args: Any, **kwargs: Any) -> None:
        before = store.commits
        original(*args, **kwargs)
        if store.commits > before:
            mark("commit", digest(store))

    store.commit = commit  # type: ignore[method-assign]


def _body(a: Attempt) -> str:
    mark("effect", a.call.key)  # the external system applied it (it is another machine)
    return f"sent {a.call.arguments['seq']}.{a.call.arguments['i']}"


def workload(name: str, directory: Path) -> None:
    """The steps a crash may interrupt; every step that returned is ACKed."""
    path = directory / STORE
    store = SqliteStore(path)
    mark("created", digest(store))
    _counting(store)
    s = Session.open(store, SID, tools(), lazy_create=True)
    s.execute_message(1, calls(1, 2), _body)
    if name == "steps":  # a create, commits, a checkpoint (tests/test_sqlite_durability.py)
        store.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        mark("checkpoint")
        s.execute_message(2, calls(2, 1), _body)
    elif name == "session":  # the power-loss workload
        s.execute_message(2, calls(2, 3), _body, together=True)
        store.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        mark("checkpoint")
        s.execute_message(3, calls(3, 1), _body)
    elif name == "second-creator":
        # the steps the loser of a creation race runs: it saw no file, then the winner
        # created the store (and committed); the loser's creation must not replace it.
        # The winner's commits are in the file, not only its -wal (a checkpoint): a
        # replaced file with the old -wal beside it would hide the loss.
        store.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        mark("checkpoint")
        loser = object.__new__(SqliteStore)
        loser.path = path
        loser._create_atomically()
        mark("second-creator")
        s.execute_message(2, calls(2, 1), _body)
    else:
        raise SystemExit(f"unknown workload {name!r}")
    store.close()
    mark("closed")


# -- tracing and parsing ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Op:
    """One operation on the store's directory, in issue order.

    ``kind``: create, write, trunc, fsync (of a file), dirsync, link, unlink,
    rename, ack.  ``inode`` is the model's file identity (several names may
    name one file: the link)."""

    kind: str
    inode: int = -1
    name: str = ""
    new: str = ""
    offset: int = 0
    data: bytes = b""
    text: str = ""

    def __repr__(self) -> str:
        bits = [self.kind, self.name or f"#{self.inode}"]
        if self.kind == "write":
            bits.append(f"{len(self.data)}B@{self.offset}")
        if self.new or self.text:
            bits.append(self.new or self.text)
        return " ".join(bits)


def strace_missing() -> str | None:
    if shutil.which("strace") is None:
        return ("strace is not installed: `apt-get install strace` (Debian); .ci/run "
                "installs it")
    return None


def trace(workload_name: str, variant: str, directory: Path) -> list[Op]:
    """Run the workload under strace in ``directory`` and return its operations."""
    problem = strace_missing()
    if problem:
        raise RuntimeError(problem)
    log = directory.parent / f"{directory.name}.strace"
    cmd = ["strace", "-o", str(log), "-y", "-qq", "-xx", "-s", "1000000", "-e",
           f"trace={TRACED}", sys.executable, str(Path(__file__).resolve()), "--child",
           workload_name, "--variant", variant, str(directory)]
    done = subprocess.run(cmd, cwd=directory, capture_output=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the traced workload failed ({done.returncode}): "
                           f"{done.stderr.decode(errors='replace')[-2000:]}")
    return parse(log.read_text(), directory)


_LINE = re.compile(r"^(\w+)\((.*)\) = (-?\d+)(?:<(.*)>)?(?: .*)?$")
_STRING = re.compile(r'^"((?:\\x[0-9a-f]{2})*)"(\.\.\.)?$')
_FD = re.compile(r"^(-?\d+)(?:<.*>)?$")


def _bytes(arg: str) -> bytes:
    m = _STRING.match(arg)
    if m is None:
        raise ValueError(f"not a -xx string: {arg[:80]!r}")
    if m.group(2):
        raise ValueError("strace truncated a string: raise -s")
    return bytes.fromhex(m.group(1).replace("\\x", ""))


def parse(text: str, directory: Path) -> list[Op]:
    """The operations on files of ``directory`` (and its fsyncs), from ``strace -y -xx``."""
    root = str(directory.resolve())
    ops: list[Op] = []
    names: dict[str, int] = {}  # name -> inode, as the workload sees them
    fds: dict[int, int | str] = {}  # fd -> inode, or "dir"
    inodes = iter(range(1, 1 << 30))

    def local(path: str) -> str | None:
        path = os.path.join(root, path) if not path.startswith("/") else path
        head, name = os.path.split(os.path.normpath(path))
        if head != root or name.endswith("-shm"):
            return None
        return name

    def fd_of(arg: str) -> int | str | None:
        m = _FD.match(arg)
        if m is None:
            return None
        return fds.get(int(m.group(1)))

    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None or int(m.group(3)) < 0:
            continue
        call, args, ret = m.group(1), m.group(2).split(", "), int(m.group(3))
        if call in ("openat", "open", "creat"):
            path = _bytes(args[1] if call == "openat" else args[0]).decode()
            flags = args[2] if call == "openat" else (args[1] if call == "open" else "O_CREAT")
            if os.path.normpath(os.path.join(root, path)) == root:
                fds[ret] = "dir"
                continue
            name = local(path)
            if name is None:
                fds.pop(ret, None)
                continue
            if name not in names:
                names[name] = next(inodes)
                ops.append(Op("create", names[name], name))
            elif "O_TRUNC" in flags:
                ops.append(Op("trunc", names[name], name, offset=0))
            fds[ret] = names[name]
        elif call == "close":
            m2 = _FD.match(args[0])
            if m2 is not None:
                fds.pop(int(m2.group(1)), None)
        elif call == "write" and args[0].startswith("1<"):
            for ack in _bytes(args[1]).decode().splitlines():
                if ack.startswith("ACK "):
                    ops.append(Op("ack", text=ack[4:]))
        elif call in ("pwrite64", "write", "ftruncate", "fsync", "fdatasync"):
            target = fd_of(args[0])
            if target is None:
                continue
            if target == "dir":
                if call in ("fsync", "fdatasync"):
                    ops.append(Op("dirsync"))
                continue
            assert isinstance(target, int)
            if call == "pwrite64":
                ops.append(Op("write", target, offset=int(args[3]), data=_bytes(args[1])))
            elif call == "write":
                raise ValueError(f"a write() without an offset to a store file: {line[:120]}")
            elif call == "ftruncate":
                ops.append(Op("trunc", target, offset=int(args[1])))
            else:
                ops.append(Op("fsync", target))
        elif call in ("link", "linkat", "rename", "renameat", "renameat2"):
            strings = [a for a in args if a.startswith('"')]
            old, new = (_bytes(s).decode() for s in strings[:2])
            o, n = local(old), local(new)
            if o is None or n is None:
                continue
            if call.startswith("link"):
                names[n] = names[o]
                ops.append(Op("link", names[o], n))
            else:
                names[n] = names.pop(o)
                ops.append(Op("rename", names[n], o, new=n))
        elif call in ("unlink", "unlinkat"):
            strings = [a for a in args if a.startswith('"')]
            n2 = local(_bytes(strings[0]).decode())
            if n2 is not None and n2 in names:
                ops.append(Op("unlink", names.pop(n2), n2))
    return ops


# -- crash states ----------------------------------------------------------------------

DATA = ("write", "trunc")
ENTRIES = ("create", "link", "unlink", "rename")


def pending(ops: Sequence[Op], point: int) -> list[int]:
    """Indexes of the operations before ``point`` that no later sync (before it) covers."""
    out = []
    synced_dir = False
    synced: set[int] = set()
    for j in range(point - 1, -1, -1):
        op = ops[j]
        if op.kind == "dirsync":
            synced_dir = True
        elif op.kind == "fsync":
            synced.add(op.inode)
        elif ((op.kind in DATA and op.inode not in synced)
              or (op.kind in ENTRIES and not synced_dir)):
            out.append(j)
    return out[::-1]


def materialise(ops: Sequence[Op], gone: set[int],
                torn: Mapping[int, Op] | None = None) -> dict[str, bytes]:
    """The files left when the operations ``gone`` are lost and those in ``torn`` are
    replaced by their torn part."""
    names: dict[str, int] = {}
    files: dict[int, bytearray] = {}
    for j, original in enumerate(ops):
        if j in gone:
            continue
        op = torn.get(j, original) if torn else original
        if op.kind == "create":
            names[op.name] = op.inode
            files.setdefault(op.inode, bytearray())
        elif op.kind == "link":
            names[op.name] = op.inode
        elif op.kind == "unlink":
            if names.get(op.name) == op.inode:
                del names[op.name]
        elif op.kind == "rename":
            if names.get(op.name) == op.inode:
                names[op.new] = names.pop(op.name)
        elif op.kind == "write":
            buf = files.setdefault(op.inode, bytearray())
            if len(buf) < op.offset:
                buf.extend(bytes(op.offset - len(buf)))
            buf[op.offset:op.offset + len(op.data)] = op.data
        elif op.kind == "trunc":
            buf = files.setdefault(op.inode, bytearray())
            del buf[op.offset:]
            if len(buf) < op.offset:
                buf.extend(bytes(op.offset - len(buf)))
    return {n: bytes(files.get(i, b"")) for n, i in names.items()}


@dataclass(frozen=True, slots=True)
class CrashState:
    point: int  # operations issued before the power cut
    how: str  # prefix / torn / no-dir / none
    files: dict[str, bytes] = field(hash=False, compare=False)


def crash_points(ops: Sequence[Op]) -> list[int]:
    out = {len(ops)}
    for j, op in enumerate(ops):
        if op.kind in ("fsync", "dirsync"):
            out.add(j)
        if op.kind == "ack":
            out.add(j + 1)
    return sorted(out)


def crash_states(ops: Sequence[Op]) -> Iterator[CrashState]:
    """Every crash state of the model (see the module doc), deduplicated per point."""
    for point in crash_points(ops):
        lost = pending(ops, point)
        seen: set[bytes] = set()

        def emit(how: str, gone: set[int], torn: Mapping[int, Op] | None = None,
                 point: int = point, seen: set[bytes] = seen) -> Iterator[CrashState]:
            files = materialise(ops[:point], gone, torn)
            key = hashlib.sha256(repr(sorted(files.items())).encode()).digest()
            if key not in seen:
                seen.add(key)
                yield CrashState(point, how, files)

        for c in range(len(lost) + 1):
            gone = set(lost[c:])
            yield from emit("prefix" if gone else "none", gone)
            w = ops[lost[c]] if c < len(lost) else None
            if w is not None and w.kind == "write" and len(w.data) > SECTOR:
                half = max(1, len(w.data) // SECTOR // 2) * SECTOR
                for part in (Op("write", w.inode, offset=w.offset, data=w.data[:half]),
                             Op("write", w.inode, offset=w.offset + SECTOR,
                                data=w.data[SECTOR:])):
                    yield from emit("torn", gone - {lost[c]}, {lost[c]: part})
        entries = {j for j in lost if ops[j].kind in ENTRIES}
        if entries:
            yield from emit("no-dir", entries)


# -- judging one state -----------------------------------------------------------------


@dataclass
class History:
    """What the workload acknowledged, in order: the logical state after each step."""

    states: list[str]  # digests: after the creation, then after each commit
    ack_at: list[int]  # index into ops of each state's ACK
    effects: list[tuple[int, str]]  # (index into ops, execution id) of each applied effect
    created_at: int


def history(ops: Sequence[Op]) -> History:
    states, at, effects, created = [], [], [], -1
    for j, op in enumerate(ops):
        if op.kind != "ack":
            continue
        word, *rest = op.text.split()
        if word in ("created", "commit"):
            states.append(rest[0])
            at.append(j)
            created = j if word == "created" else created
        elif word == "effect":
            effects.append((j, rest[0]))
    if created < 0:
        raise ValueError("the workload never acknowledged the store's creation")
    return History(states, at, effects, created)


def judge(state: CrashState, hist: History, scratch: Path) -> tuple[str, str]:
    """The outcome of opening ``state`` with the store, and a line saying why."""
    d = Path(tempfile.mkdtemp(dir=scratch))
    try:
        for name, data in state.files.items():
            (d / name).write_bytes(data)
        acked = [k for k, j in enumerate(hist.ack_at) if j < state.point]
        if not (d / STORE).exists():
            if acked:
                return "lost", "the store file is gone after its creation was acknowledged"
            return "no_store", ""
        allowed = hist.states[acked[-1]:acked[-1] + 2] if acked else hist.states[:1]
        try:
            with SqliteStore(d / STORE) as store:
                found = digest(store)
                store.verify()
                if found not in allowed:
                    if found in hist.states[:acked[-1] if acked else 0]:
                        return "lost", f"state {hist.states.index(found)} after step {acked[-1]}"
                    return "wrong", f"state {found} was never committed"
                applied = [e for j, e in hist.effects if j < state.point]
                dispatched = {r.execution_id for sid in store.sessions()
                              for r in store.audit(sid) if r.kind == "dispatch"}
                unbacked = [e for e in applied if e not in dispatched]
                if unbacked:
                    return "unbacked", f"effects with no durable dispatched: {unbacked}"
                again = resume(store, applied)
                if again:
                    return "duplicate", f"the resume applied again: {again}"
        except (StoreCorrupt, UnsupportedSchema) as exc:
            return "failed_closed", str(exc)[:200]
        except Exception as exc:
            return "error", f"{type(exc).__name__}: {exc}"[:300]
        return "recovered", ""
    finally:
        shutil.rmtree(d, ignore_errors=True)


def resume(store: SqliteStore, applied: Sequence[str]) -> list[str]:
    """Resume the session as a restarted engine does; the effects it applies again."""
    if SID not in store.sessions():
        return []
    s = Session.open(store, SID, tools())
    again: list[str] = []

    def body(a: Attempt) -> str:
        if a.call.key in applied:
            again.append(a.call.key)
        return "sent again"

    for status in s.recover():
        if status.next in (Next.EXECUTE, Next.RETRY):
            s.execute(status.key, body)
    return again


# -- the campaign ----------------------------------------------------------------------


def explore(workload_name: str, variant: str, *, limit: int | None = None,
            base: Path | None = None) -> dict[str, Any]:
    """Trace one workload under one variant and judge its crash states (``limit``: at most
    that many, spread evenly over the points)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        work = Path(tmp) / "w"
        work.mkdir()
        ops = trace(workload_name, variant, work)
    hist = history(ops)
    states = list(crash_states(ops))
    if limit is not None and len(states) > limit:
        step = len(states) / limit
        states = [states[int(k * step)] for k in range(limit)] + [states[-1]]
    scratch = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    outcomes: Counter[str] = Counter()
    hows: Counter[str] = Counter()
    examples: dict[str, str] = {}
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        for st in states:
            outcome, why = judge(st, hist, Path(tmp))
            outcomes[outcome] += 1
            hows[st.how] += 1
            if outcome in INCORRECT and outcome not in examples:
                examples[outcome] = f"point {st.point}/{len(ops)} ({st.how}): {why}"
    incorrect = sum(outcomes[k] for k in INCORRECT)
    return {"workload": workload_name, "variant": variant, "operations": len(ops),
            "syncs": sum(1 for o in ops if o.kind in ("fsync", "dirsync")),
            "crash_points": len(crash_points(ops)), "states": len(states),
            "kinds": dict(hows), "outcomes": dict(outcomes), "incorrect": incorrect,
            "examples": examples, "seconds": round(time.perf_counter() - t0, 2)}


WORKLOADS = ("session", "second-creator")


def run(smoke: bool = False, variants: Sequence[str] | None = None) -> dict[str, Any]:
    print("\n== power-loss harness: crash states of SqliteStore's writes and syncs", flush=True)
    limit = 60 if smoke else None  # smoke: the real store only, 60 states per workload
    variants = ["real"] if smoke and variants is None else variants
    rows = []
    for variant in variants or list(VARIANTS):
        for w in WORKLOADS:
            row = explore(w, variant, limit=limit)
            rows.append(row)
            print(f"{variant:24} {w:15} {row['operations']:4} ops {row['states']:5} states "
                  f"{row['incorrect']:4} incorrect  {row['outcomes']}", flush=True)
    real = [r for r in rows if r["variant"] == "real"]
    planted = sorted({r["variant"] for r in rows} - {"real"})
    found = {v: sum(r["incorrect"] for r in rows if r["variant"] == v) > 0 for v in planted}
    wrong = [v for v in planted if found[v] != (v not in BENIGN)]
    result = {
        "rows": rows,
        "states_explored": sum(r["states"] for r in rows),
        "real_incorrect": sum(r["incorrect"] for r in real),
        "real_failed_closed": sum(r["outcomes"].get("failed_closed", 0) for r in real),
        "planted_found": found,
        "benign": {v: why for v, why in BENIGN.items() if v in found},
        # every planted bug reported but the benign ones, zero incorrect on the real store
        "goal_met": bool(real) and all(r["incorrect"] == 0 for r in real) and not wrong
        and (variants is not None or set(MUST_FIND) <= set(found)),
    }
    print(f"states explored {result['states_explored']}; real store: "
          f"{result['real_incorrect']} incorrect recoveries; planted bugs found: "
          f"{sum(found.values())}/{len(found)} ({len(set(found) & set(BENIGN))} benign by "
          "design)", flush=True)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--variant", action="append", choices=list(VARIANTS))
    p.add_argument("--smoke", action="store_true")
    p.add_argument("directory", nargs="?", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        apply_variant((a.variant or ["real"])[0])
        workload(a.child, a.directory)
        return 0
    result = run(smoke=a.smoke, variants=a.variant)
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))
    return 0 if result["goal_met"] else 1


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
