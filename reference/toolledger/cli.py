"""The ``toolledger`` command line.

``toolledger check`` runs every ``ci = true`` model of ``model/manifest.toml``
with TLC and fails on any drift from the manifest (a different outcome, a
different violated invariant or property, a different number of distinct
states). Exit status: 0 everything matches, 1 drift (or TLC failed), 2 the
check could not run as asked (usage error, invalid manifest, no java or jar).

Adding a subcommand: write ``_configure_NAME(parser)`` and ``cmd_NAME(args) ->
int`` and append a :class:`Subcommand` to :data:`SUBCOMMANDS`. Adding rows to
``check``'s table (e.g. a conformance check per model): append a function to
:data:`CHECK_ROW_PROVIDERS`; it gets the manifest, the selected models and the
parsed arguments and returns :class:`Row` values.

:func:`render_trace` turns a counterexample into a readable step table
(step, action, only what changed); notebooks can use it directly.

This module must never change the manifest, the specs or the models, and
never hide a failure: anything that is not an exact match exits non-zero.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

from .manifest import Manifest, ManifestError, ModelEntry, drift, find_root, load_manifest
from .manifest import result_label as _result_label
from .tlavalues import FnValue, Value, pretty, serialize
from .tlc import Outcome, TLCResult, ToolchainError, TraceStep, run_tlc

__all__ = [
    "CHECK_ROW_PROVIDERS",
    "SUBCOMMANDS",
    "Row",
    "Subcommand",
    "UsageError",
    "changes",
    "main",
    "render_trace",
    "resolve_root",
]


class UsageError(Exception):
    """The command cannot run as asked; exit status 2 with this message."""


@dataclass(frozen=True)
class Subcommand:
    """One ``toolledger NAME`` subcommand."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


@dataclass
class Row:
    """One line of ``toolledger check``'s table (and one object of its ``--json``)."""

    model: str
    expected: str
    got: str
    distinct_states: int | None
    expected_distinct_states: int | None
    wall_seconds: float
    status: str  # "ok", "DRIFT" or "ERROR"
    check: str = "tlc"
    reasons: list[str] = field(default_factory=list)
    error: str = ""
    trace: list[dict[str, object]] | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


RowProvider = Callable[[Manifest, list[ModelEntry], argparse.Namespace], Iterable[Row]]
CHECK_ROW_PROVIDERS: list[RowProvider] = []


# ----------------------------------------------------------------------------
# Counterexamples.


def _accessor(key: Value, record: bool) -> str:
    return f".{key}" if record else f"[{serialize(key)}]"


def _appended(a: Value, b: Value) -> tuple[Value, ...] | None:
    """The elements appended to sequence ``a`` to make ``b``, if that is what happened."""
    if isinstance(a, tuple) and isinstance(b, tuple) and 0 < len(a) < len(b) and b[: len(a)] == a:
        return b[len(a) :]
    return None


Change = tuple[str, str, Value]  # (path, "=" or "\\o", value)


def changes(old: dict[str, Value] | None, new: dict[str, Value]) -> list[Change]:
    """What changed from ``old`` to ``new``, as ``(path, op, value)`` triples.

    Functions and records with an unchanged domain are compared entry by
    entry, so a change shows as ``("ledger[c1].attempts", "=", 2)``; a
    sequence that grew at the end shows as ``("log", "\\o", <the new tail>)``;
    anything else is ``(var, "=", new value)``. With ``old=None`` every
    variable is listed.
    """
    out: list[Change] = []

    def diff(path: str, a: Value, b: Value) -> None:
        if a == b:
            return
        if isinstance(a, FnValue) and isinstance(b, FnValue) and a.keys() == b.keys():
            record = b.is_record()
            for k in b:
                diff(path + _accessor(k, record), a[k], b[k])
            return
        tail = _appended(a, b)
        if tail is not None:
            out.append((path, "\\o", tail))
            return
        out.append((path, "=", b))

    for var, value in new.items():
        if old is None or var not in old:
            out.append((var, "=", value))
        else:
            diff(var, old[var], value)
    return out


def _wrap(change: Change, width: int) -> list[str]:
    path, op, value = change
    head = f"{path} {op} "
    body = pretty(value, width=max(20, width - len(head)))
    lines = body.split("\n")
    return [head + lines[0]] + [" " * len(head) + ln for ln in lines[1:]]


def render_trace(trace: Sequence[TraceStep], *, width: int = 100) -> str:
    """A counterexample as a step table: step number, action, and only what changed.

    The first step lists every variable. A ``Stuttering`` step says that
    nothing changes any more; a lasso step names the state it returns to.
    """
    if not trace:
        return "(no counterexample)"
    num_w = max(len(str(s.index)) for s in trace)
    act_w = max(6, *(len(s.action) for s in trace))
    text_w = max(30, width - num_w - act_w - 4)
    out = [
        f"{'#':>{num_w}}  {'action':<{act_w}}  changes",
        f"{'-' * num_w}  {'-' * act_w}  {'-' * 7}",
    ]
    prev: dict[str, Value] | None = None
    for step in trace:
        if step.is_stuttering:
            lines = ["(stutters: nothing changes from here on)"]
        else:
            lines = []
            for change in changes(prev, step.state):
                lines += _wrap(change, text_w)
            if step.loop_to is not None:
                lines.append(f"(back to state {step.loop_to}: the behaviour loops from here)")
            if not lines:
                lines = ["(no variable changes)"]
        lead = f"{step.index:>{num_w}}  {step.action:<{act_w}}  "
        out.append(lead + lines[0])
        out += [" " * len(lead) + ln for ln in lines[1:]]
        prev = step.state
    return "\n".join(out)


def _trace_json(trace: Sequence[TraceStep]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    prev: dict[str, Value] | None = None
    for step in trace:
        rows.append(
            {
                "index": step.index,
                "action": step.action,
                "loop_to": step.loop_to,
                "changes": {p: f"{op} {serialize(v)}" for p, op, v in changes(prev, step.state)},
            }
        )
        prev = step.state
    return rows


# ----------------------------------------------------------------------------
# Shared helpers for subcommands.


def add_root_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--root",
        type=Path,
        help="project root (the directory holding model/manifest.toml); "
        "default: the nearest one above the current directory, else this package's checkout",
    )


def resolve_root(args: argparse.Namespace) -> Path:
    """The project root: ``--root``, else up from cwd, else up from this package."""
    root: Path | None = getattr(args, "root", None)
    if root is not None:
        if not (root / "model" / "manifest.toml").is_file():
            raise UsageError(f"--root {root}: no model/manifest.toml there")
        return root
    try:
        return find_root(Path.cwd())
    except ManifestError:
        pass
    try:
        return find_root(Path(__file__).resolve().parent)
    except ManifestError:
        raise UsageError(
            "no model/manifest.toml above the current directory or this package: "
            "run inside the toolledger checkout or pass --root"
        ) from None


class _ProgressLine:
    """One live status line on stderr (rewritten in place on a terminal)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.lock = threading.Lock()
        self.text = ""
        self.started = time.monotonic()
        self.stop = threading.Event()
        self.ticker: threading.Thread | None = None

    def begin(self, text: str) -> None:
        self.started = time.monotonic()
        self.update(text)
        if self.tty:
            self.stop.clear()
            self.ticker = threading.Thread(target=self._tick, daemon=True)
            self.ticker.start()

    def _tick(self) -> None:
        while not self.stop.wait(1.0):
            self.update(self.text)

    def update(self, text: str) -> None:
        with self.lock:
            self.text = text
            line = f"{text} ({time.monotonic() - self.started:.0f} s)"
            if self.tty:
                self.stream.write("\r\033[K" + line)
            else:
                self.stream.write(line + "\n")
            self.stream.flush()

    def end(self, text: str) -> None:
        self.stop.set()
        if self.ticker is not None:
            self.ticker.join()
            self.ticker = None
        with self.lock:
            self.stream.write(("\r\033[K" if self.tty else "") + text + "\n")
            self.stream.flush()


# ----------------------------------------------------------------------------
# toolledger check


def _configure_check(p: argparse.ArgumentParser) -> None:
    add_root_argument(p)
    p.add_argument("--model", metavar="NAME", help="run only this model (CI or not)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    p.add_argument(
        "--trace",
        action="store_true",
        help="show the counterexample of each violating model as a step table "
        "(only the variables that change)",
    )
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="kill TLC after this long")
    p.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        metavar="N",
        help="TLC runs side by side (default: 2, or 1 on a single core)",
    )
    p.add_argument(
        "--no-conformance",
        action="store_true",
        help="skip the exhaustive conformance check of the reference (TLC rows only)",
    )


def _conformance_row(root: Path, entry: ModelEntry, tlc: TLCResult, dot: Path) -> Row:
    """Check the reference against the state graph TLC dumped for ``entry``."""
    # imported here: the conformance checker pulls in the whole reference
    from . import conformance
    from .stategraph import load_dot
    from .system import ModelConfig

    def row(got: str, status: str, reasons: list[str], seconds: float = 0.0,
            states: int | None = None) -> Row:
        return Row(
            model=entry.name, expected="conforms", got=got, distinct_states=states,
            expected_distinct_states=entry.distinct_states, wall_seconds=round(seconds, 2),
            status=status, check="conformance", reasons=reasons,
        )

    if not dot.exists():
        return row("no state graph", "ERROR", [f"TLC wrote no state graph ({tlc.outcome.name})"])
    started = time.monotonic()
    graph = load_dot(dot)
    cfg = ModelConfig.from_mc_module(conformance._module_path(root, entry.module))
    report = conformance.check_graph(cfg, graph, model=entry.name,
                                     workers=min(2, os.cpu_count() or 1))
    seconds = time.monotonic() - started
    ratio = seconds / tlc.wall_seconds if tlc.wall_seconds else 0.0
    got = (f"{report.mismatch_count} mismatches, {report.edges:,} edges, "
           f"{ratio:.1f}x TLC time")
    reasons = [conformance.render_mismatch(report, m) for m in report.mismatches]
    if report.mismatch_count > len(reasons):
        reasons.append(f"... and {report.mismatch_count - len(reasons)} more mismatches")
    return row(got, "ok" if report.ok else "DRIFT", reasons, seconds, report.states)


def _row_for(entry: ModelEntry, result: TLCResult, with_trace: bool) -> Row:
    reasons = drift(entry, result)
    if result.outcome in (Outcome.PARSE_ERROR, Outcome.ERROR, Outcome.TIMEOUT):
        status = "ERROR"
    else:
        status = "DRIFT" if reasons else "ok"
    return Row(
        model=entry.name,
        expected=entry.expect,
        got=_result_label(result),
        distinct_states=result.distinct_states,
        expected_distinct_states=entry.distinct_states,
        wall_seconds=round(result.wall_seconds, 2),
        status=status,
        reasons=reasons,
        error=result.error_text,
        trace=_trace_json(result.trace) if with_trace and result.trace else None,
    )


def _fmt_count(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _table(rows: Sequence[Row]) -> str:
    head = ("model", "expected", "got", "distinct states (got / expected)", "wall s", "status")
    body = [
        (
            r.model if r.check == "tlc" else f"{r.model} [{r.check}]",
            r.expected,
            r.got,
            f"{_fmt_count(r.distinct_states)} / {_fmt_count(r.expected_distinct_states)}",
            f"{r.wall_seconds:.1f}",
            r.status,
        )
        for r in rows
    ]
    widths = [max(len(x[i]) for x in (head, *body)) for i in range(len(head))]
    right = {3, 4}

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(head), line(["-" * w for w in widths]), *(line(b) for b in body)])


def cmd_check(args: argparse.Namespace) -> int:
    root = resolve_root(args)
    manifest = load_manifest(root)
    if args.model is not None:
        try:
            models = [manifest.get(args.model)]
        except KeyError:
            raise UsageError(
                f"no model named {args.model!r}; valid names: {', '.join(manifest.names())}"
            ) from None
    else:
        models = manifest.ci_models()
        if not models:
            raise UsageError(f"{manifest.path} has no model with ci = true: nothing to check")

    jobs = max(1, args.jobs)
    progress = _ProgressLine(sys.stderr)
    rows_by_name: dict[str, Row] = {}
    results: dict[str, TLCResult] = {}
    dumps = tempfile.TemporaryDirectory(prefix="toolledger-check-")
    conform = [e for e in models if e.conformance and not args.no_conformance]
    dot_of = {e.name: Path(dumps.name) / f"{e.name}.dot" for e in conform}
    started = time.monotonic()

    def run_one(entry: ModelEntry) -> TLCResult:
        return run_tlc(
            entry.module,
            entry.cfg_path,
            search_dirs=manifest.search_dirs,
            check_deadlock=entry.check_deadlock,
            workers=entry.workers,
            dump_dot=dot_of.get(entry.name),
            timeout=args.timeout,
        )

    # TLC runs one worker per model (identical counterexamples run to run);
    # several models run side by side instead, one per core.
    progress.begin(f"running {len(models)} models with TLC, {jobs} at a time")
    with dumps, concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run_one, e): e for e in models}
        for n, fut in enumerate(concurrent.futures.as_completed(futures), 1):
            entry = futures[fut]
            result = fut.result()
            results[entry.name] = result
            row = _row_for(entry, result, args.trace)
            rows_by_name[entry.name] = row
            progress.end(
                f"[{n}/{len(models)}] {entry.name}: {row.got}, "
                f"{_fmt_count(result.distinct_states)} distinct states, "
                f"{result.wall_seconds:.1f} s: {row.status}"
            )
            if n < len(models):
                progress.begin(f"{len(models) - n} models still running")
        rows: list[Row] = [rows_by_name[e.name] for e in models]
        for entry in conform:
            progress.begin(f"{entry.name}: conformance of the reference with every state and edge")
            rows.append(_conformance_row(manifest.root, entry, results[entry.name],
                                         dot_of[entry.name]))
            progress.end(f"{entry.name}: conformance {rows[-1].got}: {rows[-1].status}")
    total = time.monotonic() - started
    for provider in CHECK_ROW_PROVIDERS:
        rows.extend(provider(manifest, models, args))

    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
    else:
        print(_table(rows))
        print(f"total wall time {total:.1f} s ({jobs} TLC runs at a time)")
        for r in rows:
            for reason in r.reasons:
                print(f"{r.model}: {reason}")
            if r.error and r.status == "ERROR":
                print(f"\n{r.model}: TLC said:\n{r.error}\n")
        if args.trace:
            for name, result in results.items():
                if result.trace:
                    print(f"\n== {name}: {_result_label(result)} ({len(result.trace)} steps)")
                    print(render_trace(result.trace))
    return 0 if all(r.ok for r in rows) else 1


def _configure_simulate(p: argparse.ArgumentParser) -> None:
    from . import simulate

    simulate.configure(p)


def _cmd_simulate(args: argparse.Namespace) -> int:
    from . import simulate

    return simulate.cmd_simulate(args)


def _configure_models(p: argparse.ArgumentParser) -> None:
    add_root_argument(p)


def _cmd_models(args: argparse.Namespace) -> int:
    from .manifest import markdown_table

    print(markdown_table(load_manifest(resolve_root(args))))
    return 0


def _configure_verify_store(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "path",
        help="the SqliteStore file to check; none of its files (database, -wal, -shm) is "
        "written: a private copy of the file and its -wal is checked",
    )
    p.epilog = (
        "exit status: 0 the store passed; 1 it is damaged or not a toolledger store; "
        "2 it was not checked (no such file, it changed while being copied, no space for "
        "the copy)"
    )


def _cmd_verify_store(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .sqlite_store import verify_file
    from .stores import StoreCorrupt, StoreError, UnsupportedSchema

    path = Path(args.path)
    if not path.is_file():
        print(f"toolledger verify-store: {path} is not a file: give the path of a store",
              file=sys.stderr)
        return 2
    try:
        report = verify_file(path)
    except (StoreCorrupt, UnsupportedSchema) as e:
        print(f"toolledger verify-store: {e}", file=sys.stderr)
        return 1
    except StoreError as e:
        print(f"toolledger verify-store: {e}", file=sys.stderr)
        return 2
    print(f"{path}: ok ({report.sessions} sessions; every page, row checksum and record "
          "checked, on a private copy: the store's files were only read)")
    for name, size in report.side_files:
        if size:
            print(f"note: {name} ({size} bytes) is present: the last process that wrote the "
                  "store did not close it (killed?) or still has it open. The check included "
                  f"the transactions committed in it; a backup must copy {name} together "
                  f"with {path.name} (see the README's backups paragraph).")
    return 0


SUBCOMMANDS: list[Subcommand] = [
    Subcommand(
        "check",
        "run the CI models of model/manifest.toml with TLC; fail on any drift",
        _configure_check,
        cmd_check,
    ),
    Subcommand(
        "models",
        "print the manifest's models as the README's markdown table",
        _configure_models,
        _cmd_models,
    ),
    Subcommand(
        "simulate",
        "run one approved side-effecting call through the engine kit, crash, resume, report",
        _configure_simulate,
        _cmd_simulate,
    ),
    Subcommand(
        "verify-store",
        "check a whole SqliteStore file (SQLite pages, every row's checksum, every "
        "session) without writing any of its files",
        _configure_verify_store,
        _cmd_verify_store,
    ),
]


# ----------------------------------------------------------------------------
# Entry point.


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toolledger",
        description="Crash-safe tool calls: model checking and conformance tooling.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for cmd in SUBCOMMANDS:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.configure(p)
        p.set_defaults(_run=cmd.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``toolledger`` with ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) and argparse usage errors (2)
        return e.code if isinstance(e.code, int) else 2
    run: Callable[[argparse.Namespace], int] | None = getattr(args, "_run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return run(args)
    except (UsageError, ManifestError, ToolchainError) as e:
        print(f"toolledger {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
