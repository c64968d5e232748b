"""Where the bytes (and the CPU) of a protected call go, on a SqliteStore.

The workload is ``bench_peers``'s: turns of 5 sequential protected calls of an
idempotent tool with a trivial effect, each turn a new session, run as an
engine does with ``Session.open(..., lazy_create=True)`` and
``Session.execute_message``: n + 1 commits for n calls in all (the session's
creation, the assistant message's record and the first call's dispatched
share the first).

Three views of the same calls:

- **WAL frames**: the store's ``-wal`` file is parsed after the measured turns
  (automatic checkpoints held off for that window only, so every frame is
  still there): each frame is one page of ``page_size`` bytes plus a 24-byte
  header, and names its page number; ``dbstat`` (SQLite's page map) says
  which table or index owns that page.  So: frames (pages written) per
  commit and per call, split by table/index, and the bytes of those frames.
  A checkpoint later writes each distinct page of the window once more into
  the database file (``checkpoint`` column: distinct pages x page size).
  The *floor* counts, per commit, one page for each table or index it
  touched: the WAL bytes this table layout costs even if no B-tree ever split
  (no shorter row or smaller value can go below it, only fewer B-trees
  touched per commit or fewer commits).
- **The kernel's count**: ``/proc/self/io`` ``write_bytes`` (bytes this
  process caused to be sent to storage, counted per 4 KiB page-cache page
  dirtied: a 4,120-byte WAL frame straddles two of them) and ``wchar`` (bytes
  passed to ``write``), over a second window of turns with the store's own
  settings (checkpoints included).
- **Row payload**: the bytes of every column of the rows the measured calls
  wrote (``length(CAST(col AS BLOB))``), per table, so the checksums, the
  audit JSON and the ids can be compared with the pages they land in.

With ``--profile`` it also runs the turns under ``cProfile`` (on a store
whose syncs are switched off for that run only: the profile is of CPU time,
and a sync is a wait) and prints the functions with the most own time and
the most cumulative time, and the CPU time per call (``getrusage``), for two
paths: the engine's (``execute_message``, as above; ``profile``) and the plain
per-call path of the README (``Session.open``, ``record``, then
``execute(key, fn)`` per call; ``profile_plain``).

``python benchmarks/bench_bytes.py [--smoke] [--json] [--profile]``
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import sqlite3
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import Result, heading, scratch_dir, table

CALLS_PER_TURN = 5
WAL_HEADER, FRAME_HEADER = 32, 24


def make_turn(store: Any) -> Any:
    """bench_peers' toolledger-batched turn, on a given store."""
    from toolledger import Session, Tool

    tools = {"send": Tool("idempotent", requires_approval=False)}
    applied: set[str] = set()

    def body(a: Any) -> str:
        applied.add(a.idempotency_key)
        return "sent"

    def turn(n: int) -> None:
        s = Session.open(store, f"turn-{n}", tools, lazy_create=True)
        s.execute_message(1, [{"id": f"c{i}", "name": "send", "arguments": {"i": i}}
                              for i in range(CALLS_PER_TURN)], body)

    return turn


def make_plain_turn(store: Any) -> Any:
    """bench_peers' plain ``toolledger`` turn (the README's path): ``Session.open``, then
    ``record`` the message, then one ``execute(key, fn)`` per call."""
    from toolledger import Session, Tool

    tools = {"send": Tool("idempotent", requires_approval=False)}

    def body(a: Any) -> str:
        return "sent"

    def turn(n: int) -> None:
        s = Session.open(store, f"plain-{n}", tools)
        for st in s.record(1, [{"id": f"c{i}", "name": "send", "arguments": {"i": i}}
                               for i in range(CALLS_PER_TURN)]):
            s.execute(st.call.key, body)

    return turn


PATHS = {"message": make_turn, "plain": make_plain_turn}
"""The turns ``--profile`` measures: ``execute_message`` (the engine's path, the ``profile``
key) and the plain per-call path (``profile_plain``)."""


def parse_wal(data: bytes) -> tuple[int, list[tuple[int, bool]]]:
    """(page size, [(page number, is a commit frame)]) of the valid frames of a WAL."""
    if len(data) < WAL_HEADER:
        return 0, []
    page_size = int.from_bytes(data[8:12], "big")
    salts = data[16:24]
    frames = []
    at = WAL_HEADER
    while at + FRAME_HEADER + page_size <= len(data):
        head = data[at:at + FRAME_HEADER]
        if head[8:16] != salts:
            break  # a frame of an earlier WAL generation: not part of this log
        frames.append((int.from_bytes(head[0:4], "big"), head[4:8] != b"\0\0\0\0"))
        at += FRAME_HEADER + page_size
    return page_size, frames


def _io() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/io").read_text().splitlines():
        k, _, v = line.partition(":")
        out[k.strip()] = int(v)
    return out


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _payload(path: Path, sessions: list[str]) -> dict[str, dict[str, float]]:
    """Bytes per column of the rows these sessions own, per table."""
    from toolledger._core.sqlite_schema import _COLUMNS

    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        marks = ", ".join("?" * len(sessions))
        out: dict[str, dict[str, float]] = {}
        for t, cols in _COLUMNS.items():
            if t == "meta":
                continue
            sums = conn.execute(
                "SELECT count(*), " + ", ".join(
                    f"coalesce(sum(length(CAST({c} AS BLOB))), 0)" for c in cols)
                + f" FROM {t} WHERE session_id IN ({marks})", sessions).fetchone()
            out[t] = {"rows": sums[0], **dict(zip(cols, sums[1:], strict=True))}
        return out
    finally:
        conn.close()


def measure(directory: Path, warm: int, turns: int) -> Result:
    from toolledger import SqliteStore

    path = directory / "bytes.sqlite3"
    store = SqliteStore(path)
    turn = make_turn(store)
    n = 0
    for _ in range(warm):
        turn(n)
        n += 1
    calls = turns * CALLS_PER_TURN

    # Window 1: the WAL, frame by frame (checkpoints held off, measurement only).
    conn = store.connection
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    commits0 = store.commits
    first = n
    for _ in range(turns):
        turn(n)
        n += 1
    commits = store.commits - commits0
    wal = Path(f"{path}-wal").read_bytes()
    page_size, frames = parse_wal(wal)
    owner = dict(sqlite3.connect(f"file:{path}?mode=ro", uri=True).execute(
        "SELECT pageno, name FROM dbstat").fetchall())
    by_table = Counter(owner.get(p, "(free/other)") for p, _ in frames)
    # The floor of this table layout: one page per table or index a commit touches
    # (no B-tree split, no header page); what fewer rows or smaller values cannot cut.
    touched, floor_frames = set(), 0
    for p, is_commit in frames:
        touched.add(owner.get(p, "(free/other)"))
        if is_commit:
            floor_frames += len(touched - {"sqlite_schema"})
            touched = set()
    distinct = {p for p, _ in frames}
    wal_commits = sum(1 for _, c in frames if c)
    conn.execute("PRAGMA wal_autocheckpoint = 1000")  # SQLite's default, as the store runs
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    payload = _payload(path, [f"turn-{i}" for i in range(first, n)])

    # Window 2: what the kernel counts, with the store's own settings.
    io0, cpu0 = _io(), _cpu()
    for _ in range(turns):
        turn(n)
        n += 1
    io1, cpu1 = _io(), _cpu()
    store.close()

    frame_bytes = page_size + FRAME_HEADER
    rows_per_call = {t: v["rows"] / calls for t, v in payload.items()}
    payload_per_call = {t: sum(x for k, x in v.items() if k != "rows") / calls
                        for t, v in payload.items()}
    return {
        "page_size": page_size,
        "calls": calls,
        "commits_per_call": commits / calls,
        "wal_commit_frames_per_call": wal_commits / calls,
        "wal_frames_per_commit": len(frames) / max(commits, 1),
        "wal_frames_per_call": len(frames) / calls,
        "wal_bytes_per_call": len(frames) * frame_bytes / calls,
        "wal_frames_per_call_by_object": {k: v / calls for k, v in by_table.most_common()},
        "checkpoint_bytes_per_call": len(distinct) * page_size / calls,
        "floor_frames_per_call": floor_frames / calls,
        "floor_wal_bytes_per_call": floor_frames * frame_bytes / calls,
        "write_bytes_per_call": (io1["write_bytes"] - io0["write_bytes"]) / calls,
        "wchar_per_call": (io1["wchar"] - io0["wchar"]) / calls,
        "cpu_ms_per_call": (cpu1 - cpu0) * 1000 / calls,
        "rows_per_call": rows_per_call,
        "payload_bytes_per_call": payload_per_call,
        "payload_bytes_per_column": {
            t: {k: x / max(v["rows"], 1) for k, x in v.items() if k != "rows"}
            for t, v in payload.items()},
    }


def profile(directory: Path, warm: int, turns: int, top: int = 20,
            path: str = "message") -> Result:
    """cProfile of ``turns`` turns of ``path`` (``PATHS``): the functions with the most own
    time, and the CPU per call without the profiler."""
    from toolledger import SqliteStore

    store = SqliteStore(directory / f"profile-{path}.sqlite3")
    # Measurement only: the profile is of CPU, and an fsync is a wait, not CPU.
    store.connection.execute("PRAGMA synchronous = OFF")
    turn = PATHS[path](store)
    for n in range(warm):
        turn(n)
    cpu0 = _cpu()
    for n in range(warm, warm + turns):  # without the profiler: the CPU a call costs
        turn(n)
    cpu = (_cpu() - cpu0) * 1000 / (turns * CALLS_PER_TURN)
    prof = cProfile.Profile()
    prof.enable()
    for n in range(warm + turns, warm + 2 * turns):
        turn(n)
    prof.disable()
    store.close()
    stats = pstats.Stats(prof)
    calls = turns * CALLS_PER_TURN
    rows = []
    entries: Any = stats.stats  # type: ignore[attr-defined]
    for (file, line, fn), (_cc, nc, tt, ct, _callers) in entries.items():
        rows.append({"function": f"{Path(file).name}:{line}({fn})", "calls_per_call": nc / calls,
                     "own_us_per_call": tt * 1e6 / calls, "cum_us_per_call": ct * 1e6 / calls})
    total: float = stats.total_tt  # type: ignore[attr-defined]
    own = sorted(rows, key=lambda r: -r["own_us_per_call"])[:top]
    ours = [r for r in rows if not r["function"].startswith(("~", "<"))]
    cum = sorted(ours, key=lambda r: -r["cum_us_per_call"])[:top]
    return {"path": path, "cpu_ms_per_call_nosync": cpu,
            "total_us_per_call": total * 1e6 / calls, "top": own, "top_cumulative": cum}


def run(smoke: bool = False, with_profile: bool = False) -> Result:
    warm, turns = (2, 4) if smoke else (20, 100)
    with scratch_dir("bytes") as d:
        m = measure(d, warm, turns)
        profiles = ([profile(d, warm, turns, path=path) for path in PATHS]
                    if with_profile or smoke else [])
    heading(f"Bytes per protected call, 5-call turns (execute_message), page size "
            f"{m['page_size']}")
    print(table(("what", "per call"), [
        ("commits", f"{m['commits_per_call']:.2f}"),
        ("WAL frames (pages written)", f"{m['wal_frames_per_call']:.2f}"
         f" ({m['wal_frames_per_commit']:.2f} per commit)"),
        ("WAL bytes (frames x (page + 24))", f"{m['wal_bytes_per_call'] / 1024:.1f} KB"),
        ("floor: one page per table/index a commit touches",
         f"{m['floor_frames_per_call']:.2f} frames, {m['floor_wal_bytes_per_call'] / 1024:.1f} KB"),
        ("checkpoint (distinct pages of the window)",
         f"{m['checkpoint_bytes_per_call'] / 1024:.1f} KB"),
        ("kernel: write_bytes", f"{m['write_bytes_per_call'] / 1024:.1f} KB"),
        ("kernel: wchar", f"{m['wchar_per_call'] / 1024:.1f} KB"),
    ], right=(1,)))
    print(table(("table / index", "WAL frames per call"),
                [(k, f"{v:.2f}") for k, v in m["wal_frames_per_call_by_object"].items()],
                right=(1,)))
    print(table(("table", "rows per call", "payload bytes per call", "largest columns (bytes/row)"),
                [(t, f"{m['rows_per_call'][t]:.2f}", f"{m['payload_bytes_per_call'][t]:.0f}",
                  ", ".join(f"{c} {b:.0f}" for c, b in sorted(
                      m["payload_bytes_per_column"][t].items(), key=lambda x: -x[1])[:4]))
                 for t in m["rows_per_call"]], right=(1, 2)))
    out: Result = {"measured": m}
    for p in profiles:
        heading(f"CPU, {p['path']} path: {p['cpu_ms_per_call_nosync']:.3f} ms per call (syncs "
                f"off, getrusage); cProfile: {p['total_us_per_call']:.0f} us per call under "
                "the profiler")
        print(table(("function", "calls/call", "own us/call", "cum us/call"),
                    [(r["function"], f"{r['calls_per_call']:.1f}", f"{r['own_us_per_call']:.1f}",
                      f"{r['cum_us_per_call']:.1f}") for r in p["top"]], right=(1, 2, 3)))
        print(table(("function (by cumulative time)", "calls/call", "own us/call", "cum us/call"),
                    [(r["function"], f"{r['calls_per_call']:.1f}", f"{r['own_us_per_call']:.1f}",
                      f"{r['cum_us_per_call']:.1f}") for r in p["top_cumulative"]],
                    right=(1, 2, 3)))
        out["profile" if p["path"] == "message" else f"profile_{p['path']}"] = p
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--profile", action="store_true", help="also run the turns under cProfile")
    a = ap.parse_args(argv)
    result = run(smoke=a.smoke, with_profile=a.profile)
    if a.json:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
