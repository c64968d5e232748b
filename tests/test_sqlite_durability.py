"""SqliteStore's durability steps, observed as they happen, and a creation race.

Under test: :class:`~toolledger._core.sqlite_store.SqliteStore` creating a
store (``_create_atomically``), committing, and checkpointing.  The oracle is
the kernel's view: ``strace`` records the system calls of a child process
running the store (:func:`benchmarks.power_loss.trace`: every write with its
file and offset, every ``fsync``/``fdatasync`` of a file or of the directory,
``link``/``rename``/``unlink``, and the ``ACK`` line the child prints when a
step returned).  The order checked:

- create: the new store file fsynced, then linked into place (``link``, never
  a ``rename`` that would replace a file there), then the directory fsynced,
  three consecutive operations, all before the constructor returns;
- commit: every write of the commit to the ``-wal``, then its fsync, before
  the commit returns; the ``-wal``'s directory entry synced before the first
  commit returns; nothing written to the database file itself;
- checkpoint: the ``-wal`` synced before the first page is copied into the
  database file, the database file synced after the last one and before the
  ``-wal`` is reset.

Each check is shown to fail on a planted bug (a patched copy of the store's
method in the child: :data:`benchmarks.power_loss.VARIANTS`).  And two real
processes create the same store at once, many times: one store, each
process's data in it, the shared session created by exactly one of them, the
other refused with ``SessionExists``; ``os.replace`` for ``os.link`` fails it.
The power-loss crash states of the same traces: ``tests/test_power_loss.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from functools import cache
from pathlib import Path

import pytest

from benchmarks import power_loss as pl
from toolledger import SqliteStore

ROOT = Path(__file__).resolve().parent.parent


def test_strace_is_installed() -> None:
    """The observer itself: missing, every test here fails (never skips)."""
    assert pl.strace_missing() is None, pl.strace_missing()


@cache
def steps(variant: str) -> tuple[pl.Op, ...]:
    """The operations of the ``steps`` workload (create, commits, a checkpoint, close)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "w"
        work.mkdir()
        return tuple(pl.trace("steps", variant, work))


def _ack(ops: tuple[pl.Op, ...], word: str, nth: int = 0) -> int:
    found = [j for j, o in enumerate(ops) if o.kind == "ack" and o.text.split()[0] == word]
    assert len(found) > nth, f"the workload never acknowledged {word!r}"
    return found[nth]


def _last(ops: tuple[pl.Op, ...], start: int, end: int, kinds: tuple[str, ...],
          inode: int) -> int | None:
    hits = [j for j in range(start, end) if ops[j].kind in kinds and ops[j].inode == inode]
    return hits[-1] if hits else None


def creation_problems(ops: tuple[pl.Op, ...]) -> list[str]:
    """What is wrong with the steps that create the store file (before its ACK)."""
    end = _ack(ops, "created")
    out = []
    renamed = [o for o in ops[:end] if o.kind == "rename" and o.new == pl.STORE]
    if renamed:
        out.append(f"the store file was put in place by rename (replacing what is there): "
                   f"{renamed}")
    links = [j for j in range(end) if ops[j].kind == "link" and ops[j].name == pl.STORE]
    if len(links) != 1:
        return [*out, f"the store file was linked into place {len(links)} times, not once"]
    at = links[0]
    inode = ops[at].inode
    wrote = _last(ops, 0, at, pl.DATA, inode)
    if wrote is None or _last(ops, wrote, at, ("fsync",), inode) is None:
        out.append("the new store file is not fsynced after its last write, before the link")
    if ops[at - 1] != pl.Op("fsync", inode):
        out.append(f"the operation right before the link is {ops[at - 1]}, not the store "
                   "file's fsync")
    if not any(ops[j].kind == "dirsync" for j in range(at + 1, end)):
        out.append("the directory is not fsynced after the link, before the store is used")
    elif ops[at + 1].kind != "dirsync":
        out.append(f"the operation right after the link is {ops[at + 1]}, not the "
                   "directory's fsync")
    if _last(ops, at + 1, end, pl.DATA, inode) is not None:
        out.append("the store file was written after it was linked, before it was synced")
    return out


def _inode(ops: tuple[pl.Op, ...], name: str) -> int:
    made = [o.inode for o in ops if (o.kind in ("create", "link") and o.name == name)
            or (o.kind == "rename" and o.new == name)]
    assert made, f"no file {name} in the trace"
    return made[-1]


def commit_problems(ops: tuple[pl.Op, ...]) -> list[str]:
    """What is wrong with the commits: each one's -wal writes synced before it returns."""
    wal, db = _inode(ops, pl.STORE + "-wal"), _inode(ops, pl.STORE)
    commits = [j for j, o in enumerate(ops) if o.kind == "ack" and o.text.startswith("commit")]
    assert len(commits) >= 2
    out = []
    made = next(j for j, o in enumerate(ops) if o.kind == "create" and o.inode == wal)
    if not any(o.kind == "dirsync" for o in ops[made:commits[0]]):
        out.append("the -wal's directory entry is not synced before the first commit returns")
    for n, end in enumerate(commits):
        start = max(j for j in range(end) if ops[j].kind == "ack")  # the step before it
        wrote = _last(ops, start, end, pl.DATA, wal)
        if wrote is None:
            out.append(f"commit {n} wrote nothing to the -wal")
        elif _last(ops, wrote, end, ("fsync",), wal) is None:
            out.append(f"commit {n} returned before its -wal writes were fsynced")
        if _last(ops, start, end, pl.DATA, db) is not None:
            out.append(f"commit {n} wrote to the database file, not only to the -wal")
    return out


def checkpoint_problems(ops: tuple[pl.Op, ...]) -> list[str]:
    """What is wrong with the checkpoint: -wal synced, pages copied, file synced, -wal reset."""
    wal, db = _inode(ops, pl.STORE + "-wal"), _inode(ops, pl.STORE)
    end = _ack(ops, "checkpoint")
    start = max(j for j in range(end) if ops[j].kind == "ack")
    copied = [j for j in range(start, end) if ops[j].kind == "write" and ops[j].inode == db]
    if not copied:
        return ["the checkpoint copied no page into the database file"]
    out = []
    last_wal = _last(ops, 0, copied[0], ("write",), wal)
    if last_wal is None or _last(ops, last_wal, copied[0], ("fsync",), wal) is None:
        out.append("pages were copied into the database file before the -wal was fsynced")
    reset = next((j for j in range(copied[-1], end)
                  if ops[j].kind == "trunc" and ops[j].inode == wal), None)
    if reset is None:
        out.append("the checkpoint did not reset the -wal")
        reset = end
    if _last(ops, copied[-1], reset, ("fsync",), db) is None:
        out.append("the -wal was reset before the database file was fsynced")
    return out


CHECKS = {"create": creation_problems, "commit": commit_problems,
          "checkpoint": checkpoint_problems}


@pytest.mark.parametrize("step", sorted(CHECKS))
def test_the_real_store_makes_every_durability_step_in_order(step: str) -> None:
    assert CHECKS[step](steps("real")) == []


@pytest.mark.parametrize(("variant", "step", "says"), [
    ("no-dir-fsync", "create", "directory is not fsynced after the link"),
    ("replace", "create", "by rename"),
    ("link-before-file-fsync", "create", "right before the link"),
    ("dir-fsync-before-link", "create", "directory is not fsynced after the link"),
    ("synchronous-normal", "commit", "returned before its -wal writes were fsynced"),
    ("synchronous-off", "commit", "returned before its -wal writes were fsynced"),
    ("synchronous-off", "checkpoint", "before the -wal was fsynced"),
])
def test_each_check_fails_on_its_planted_bug(variant: str, step: str, says: str) -> None:
    problems = CHECKS[step](steps(variant))
    assert any(says in p for p in problems), problems
    # a planted bug in the creation breaks no other step's check, and one in the syncs of
    # commits none of the creation's: each check looks at its own step
    others = {"create"} if variant.startswith("synchronous") else {"commit", "checkpoint"}
    for other in others:
        assert CHECKS[other](steps(variant)) == [], (other, CHECKS[other](steps(variant)))


def test_a_variant_whose_code_moved_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(pl.VARIANTS, "stale", [("_create_atomically", [("no such line", "")])])
    with pytest.raises(SystemExit, match=r"is not in SqliteStore\._create_atomically"):
        pl.apply_variant("stale")


# -- the creation race: two processes, one store -----------------------------------------

RACER = r"""
import json, os, sys, time
sys.path.insert(0, {root!r})
from benchmarks import power_loss as pl
pl.apply_variant(sys.argv[1])
from toolledger import SqliteStore
from toolledger._core.stores import SessionExists
path, go, me = sys.argv[2], sys.argv[3], sys.argv[4]
other = "b" if me == "a" else "a"

def wait_for(name, seconds):
    deadline = time.monotonic() + seconds
    while not os.path.exists(name) and time.monotonic() < deadline:
        time.sleep(0.0005)

def scheduled(step):
    # The schedule of the race: both creators reach the step that puts the file in
    # place (both saw no store), then the first to arrive goes on and writes its data,
    # and the second puts its file in place only after that: the loser of a real race.
    def put(src, dst, *args, **kwargs):
        if os.path.basename(os.fsdecode(dst)) == os.path.basename(path):
            open(go + ".at." + me, "w").close()
            wait_for(go + ".at." + other, 30)
            try:
                os.close(os.open(go + ".first", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                wait_for(go + ".done." + other, 30)
        return step(src, dst, *args, **kwargs)
    return put

os.link, os.replace = scheduled(os.link), scheduled(os.replace)
open(go + "." + me, "w").close()          # ready
wait_for(go, 60)                          # the barrier: both start creating at once
store = SqliteStore(path)
store.create_session("own-" + me, marker=1, max_attempts=3)
try:
    store.create_session("shared", marker=2, max_attempts=3)
    got = "created"
except SessionExists as exc:
    got = "exists: " + str(exc)
# the data in the file, as a store's commits are after SQLite's automatic checkpoints (in
# its -wal only, a replaced file with that -wal beside it would hide the loss)
store.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
open(go + ".done." + me, "w").close()
print(json.dumps({{"got": got, "sessions": store.sessions()}}))
store.close()
"""


def race(tmp: Path, variant: str, rounds: int) -> list[str]:
    """``rounds`` creation races of two processes; what went wrong in each."""
    script = tmp / "racer.py"
    script.write_text(RACER.format(root=str(ROOT)))
    problems = []
    for r in range(rounds):
        d = tmp / f"race{r}"
        d.mkdir()
        path, go = d / "store.sqlite3", d / "go"
        procs = [subprocess.Popen([sys.executable, str(script), variant, str(path), str(go),
                                   me], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for me in ("a", "b")]
        deadline = time.monotonic() + 60
        while not all(Path(f"{go}.{me}").exists() for me in ("a", "b")):
            assert time.monotonic() < deadline, "the racers never got ready"
            time.sleep(0.001)
        go.touch()
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=60)
            if p.returncode != 0:
                problems.append(f"round {r}: a creator failed: {err.decode()[-400:]}")
            else:
                outs.append(json.loads(out))
        if len(outs) != 2:
            continue
        got = sorted(o["got"].split(":")[0] for o in outs)
        if got != ["created", "exists"]:
            problems.append(f"round {r}: the shared session was {got}, not created once")
        if any(o["got"].startswith("exists") and "already exists" not in o["got"] for o in outs):
            problems.append(f"round {r}: the loser's error does not say it exists: {outs}")
        with SqliteStore(path) as store:
            if store.sessions() != ["own-a", "own-b", "shared"]:
                problems.append(f"round {r}: the store holds {store.sessions()}")
            store.verify()
        strays = sorted(p.name for p in d.iterdir() if "creating" in p.name)
        if strays:
            problems.append(f"round {r}: temporary files left: {strays}")
        if not all(Path(f"{go}.at.{me}").exists() for me in ("a", "b")):
            problems.append(f"round {r}: the creators did not race (one saw the other's store)")
    return problems


def test_two_processes_creating_one_store_never_overwrite_it(tmp_path: Path) -> None:
    assert race(tmp_path, "real", 8) == []


def test_the_race_catches_a_creation_that_replaces(tmp_path: Path) -> None:
    problems = race(tmp_path, "replace", 2)
    assert any("the shared session was ['created', 'created']" in p for p in problems), problems
    assert any("the store holds" in p for p in problems), problems
