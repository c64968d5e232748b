"""The ``toolledger`` command line.

``toolledger check`` runs every ``ci = true`` model of ``model/manifest.toml``
with TLC and fails on any drift from the manifest (a different outcome, a
different violated invariant or property, a different number of distinct
states). Before any model runs, SANY parses every model's module once: a
spec that does not parse is reported once (``file:line:col: message``) and
the models it breaks are ``NOT CHECKED`` rows, never drift. The conformance
rows check the reference under the checked root's ``reference/`` (in a child
process; see :func:`_reference_package`), and the output names it.

Exit status: 0 everything matches; 1 drift, a TLC failure or a model not
checked because the spec does not parse (the repository under check is
broken); 2 the check could not run as asked (usage error, invalid manifest,
no java or jar, a root whose reference cannot be checked); 130 after a
Ctrl-C (143 after a SIGTERM): the first one stops everything, prints the
rows finished so far and an ``interrupted`` line.

Adding a subcommand: write ``_configure_NAME(parser)`` and ``cmd_NAME(args) ->
int`` and append a :class:`Subcommand` to :data:`SUBCOMMANDS`. Adding rows to
``check``'s table (e.g. a conformance check per model): append a function to
:data:`CHECK_ROW_PROVIDERS`; it gets the manifest, the selected models and the
parsed arguments and returns :class:`Row` values.

:func:`render_trace` (from :mod:`toolledger.check.counterexample`) turns a
counterexample into a readable step table (step, action, only what changed);
notebooks can use it directly.

This module must never change the manifest, the specs or the models, and
never hide a failure: anything that is not an exact match exits non-zero.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO, TypeVar

from .check.batch import Batch, batch_files, plan, split_result
from .check.counterexample import changes, render_trace, trace_json
from .check.manifest import Manifest, ManifestError, ModelEntry, drift, find_root, load_manifest
from .check.manifest import result_label as _result_label
from .check.tlc import (
    Cancellation,
    Cancelled,
    Outcome,
    Progress,
    SpecError,
    TLCResult,
    ToolchainError,
    parse_cfg,
    parse_modules,
    run_tlc,
)
from .opscmd import (
    cmd_halted,
    cmd_resolve,
    cmd_status,
    configure_halted,
    configure_resolve,
    configure_status,
)
from .storecmd import cmd_verify_store, configure_verify_store

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
    status: str  # "ok", "DRIFT", "ERROR" or "NOT CHECKED" (its module does not parse)
    check: str = "tlc"
    reasons: list[str] = field(default_factory=list)
    error: str = ""
    trace: list[dict[str, object]] | None = None
    reference: str = ""  # conformance rows: the reference package that was checked
    # rows checked by one shared TLC run (a host and its probes, see
    # toolledger.check.batch) name that run; their wall time is the run's
    tlc_run: str | None = None
    # conformance rows: CPU seconds of the check (its process and workers)
    cpu_seconds: float | None = None
    # TLC rows answered from --tlc-cache (a run of the same inputs; its wall time)
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok"


RowProvider = Callable[[Manifest, list[ModelEntry], argparse.Namespace], Iterable[Row]]
CHECK_ROW_PROVIDERS: list[RowProvider] = []


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
    """Progress on stderr: permanent notes, and on a terminal one live status
    line below them, redrawn every second from ``status()`` (a function, so
    the elapsed times it shows are current, not frozen at the last event)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.lock = threading.Lock()
        self.status: Callable[[], str] | None = None
        self.stop = threading.Event()
        self.ticker: threading.Thread | None = None

    def note(self, text: str) -> None:
        """A line that stays (on a terminal: above the live status line)."""
        with self.lock:
            if self.tty:
                self.stream.write("\r\033[K" + text + "\n")
                if self.status is not None:
                    self.stream.write(self.status())
            else:
                self.stream.write(text + "\n")
            self.stream.flush()

    def live(self, status: Callable[[], str] | None) -> None:
        """Show ``status()`` as the live line (terminal only); None clears it."""
        with self.lock:
            self.status = status
        if not self.tty:
            return
        self._draw()
        if status is not None and self.ticker is None:
            self.stop.clear()
            self.ticker = threading.Thread(target=self._tick, daemon=True)
            self.ticker.start()

    def _tick(self) -> None:
        while not self.stop.wait(1.0):
            self._draw()

    def _draw(self) -> None:
        with self.lock:
            self.stream.write("\r\033[K" + (self.status() if self.status is not None else ""))
            self.stream.flush()

    def close(self) -> None:
        self.stop.set()
        if self.ticker is not None:
            self.ticker.join()
            self.ticker = None
        self.live(None)


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s < 600 else f"{s / 60:.0f} min"


def _since(text: str, t0: float) -> Callable[[], str]:
    """A live status: ``text (N s)``, N counting from ``t0``."""
    return lambda: f"{text} ({_seconds(time.monotonic() - t0)})"


# ----------------------------------------------------------------------------
# toolledger check


def _positive(kind: type[int] | type[float], what: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number: give {what}") from None
        if not value > 0 or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{text} is not positive: give {what}")
        return value

    return parse


def _configure_check(p: argparse.ArgumentParser) -> None:
    add_root_argument(p)
    p.add_argument("--model", metavar="NAME", action="append",
                   help="run only this model (CI or not); repeat it to run several")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    p.add_argument(
        "--trace",
        action="store_true",
        help="show the counterexample of each violating model as a step table "
        "(only the variables that change)",
    )
    p.add_argument(
        "--timeout",
        type=_positive(float, "a number of seconds > 0"),
        metavar="SECONDS",
        help="kill TLC after this long (per model)",
    )
    p.add_argument(
        "--jobs",
        type=_positive(int, "a whole number of TLC runs >= 1"),
        default=min(2, os.cpu_count() or 1),
        metavar="N",
        help="TLC runs side by side (default: 2, or 1 on a single core)",
    )
    p.add_argument(
        "--no-conformance",
        action="store_true",
        help="skip the exhaustive conformance check of the reference (TLC rows only)",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help='also the rows the manifest leaves to make test: TLC rows (tier = "test") '
        'and conformance rows (conformance_tier = "test")',
    )
    p.add_argument(
        "--tlc-cache",
        type=Path,
        metavar="DIR",
        default=None,
        help="keep finished TLC runs in DIR, keyed by a digest of every input, and answer a "
        "run of the same inputs from there (make check and make test share one)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="only the models and conformance rows that exercise what `git diff HEAD` "
        "changes in spec/, model/ and reference/ (model/exercises.json), in ~20 s",
    )


# The reference a conformance check checks is the one under the root's
# reference/ directory: the check runs in a child process whose import path
# starts there. Without that, a second checkout run with the venv of another
# checkout (an editable install) would check the other checkout's Python
# against this checkout's spec and report "conforms" for code nobody looked at.


def _reference_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    rest = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(root / "reference") + (os.pathsep + rest if rest else "")
    return env


def _reference_package(root: Path) -> Path:
    """The root's reference package, once a child process proved it imports that one.

    Raises :class:`UsageError` (nothing was run) if the root has no
    reference, or if Python would import ``toolledger`` from elsewhere."""
    expected = (root / "reference" / "toolledger").resolve()
    if not (expected / "__init__.py").is_file():
        raise UsageError(
            f"{expected} does not exist: a conformance check checks the reference of the "
            "checkout whose spec it checks; run it in a complete checkout, or pass "
            "--no-conformance to run TLC only"
        )
    probe = "import pathlib, toolledger; print(pathlib.Path(toolledger.__file__).resolve().parent)"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", probe], env=_reference_env(root), cwd=root / "reference",
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UsageError(f"cannot run {sys.executable} to import the reference: {e}") from None
    found = proc.stdout.strip()
    if proc.returncode != 0 or Path(found) != expected:
        why = proc.stderr.strip().splitlines()[-1:] if proc.returncode else [f"it imported {found}"]
        raise UsageError(
            f"refusing to check: with {root / 'reference'} first on PYTHONPATH, {sys.executable} "
            f"does not import the reference {expected} ({'; '.join(why)}); "
            "run the check with that checkout's own virtualenv"
        )
    return expected


def _git_state(root: Path) -> str:
    """``git <commit>`` of ``root`` (and whether spec/, model/ or reference/ differ from it)."""
    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=30, stdin=subprocess.DEVNULL)

    try:
        top = git("rev-parse", "--show-toplevel", "HEAD")
        lines = top.stdout.split()
        if top.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != root.resolve():
            return "not a git checkout"
        dirty = git("status", "--porcelain", "--", "spec", "model", "reference").stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "git not available"
    return f"git {lines[1][:12]}" + (", with uncommitted changes" if dirty else "")


def _conformance_row(
    root: Path, entry: ModelEntry, tlc: TLCResult, dot: Path, package: Path, cancel: Cancellation,
    workers: int = 2,
) -> Row:
    """Check the root's reference against the state graph TLC dumped for ``entry``
    (in a child process: see :func:`_reference_package`)."""
    def row(got: str, status: str, reasons: list[str], seconds: float = 0.0,
            states: int | None = None, error: str = "", cpu: float | None = None) -> Row:
        return Row(
            model=entry.name, expected="conforms", got=got, distinct_states=states,
            expected_distinct_states=entry.distinct_states, wall_seconds=round(seconds, 2),
            status=status, check="conformance", reasons=reasons, error=error,
            reference=str(package), cpu_seconds=cpu,
        )

    if not dot.exists():
        return row("no state graph", "ERROR", [f"TLC wrote no state graph ({tlc.outcome.name})"])
    cancel.check()
    started = time.monotonic()
    cmd = [sys.executable, "-m", "toolledger.check.conformance", "--root", str(root),
           "--module", entry.module, "--dot", str(dot),
           "--workers", str(max(1, min(workers, os.cpu_count() or 1)))]
    proc = subprocess.Popen(
        cmd, env=_reference_env(root), cwd=root / "reference", stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its worker processes die with it (see Cancellation)
    )
    killed = False
    try:
        if not cancel.register(proc):
            proc.wait()
            raise Cancelled("cancelled as it started")
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        killed = cancel.unregister(proc)
    if killed:
        raise Cancelled(f"conformance of {entry.name} was stopped")
    seconds = time.monotonic() - started
    try:
        report = json.loads(out)
    except ValueError:
        tail = "\n".join(err.strip().splitlines()[-15:])
        return row("not checked", "ERROR", [f"the conformance check of {package} failed "
                                            f"(exit code {proc.returncode})"], seconds, error=tail)
    if Path(report["package"]) != package:  # the probe said otherwise: refuse the result
        return row("not checked", "ERROR", [f"the check imported {report['package']}, "
                                            f"not {package}"], seconds)
    ratio = seconds / tlc.wall_seconds if tlc.wall_seconds else 0.0
    count = int(report["mismatch_count"])
    got = f"{count:,} mismatches, {report['edges']:,} edges, {ratio:.1f}x TLC time"
    # one reason per (direction, action), the spec-allows-reference-refuses
    # ones first, each with its first mismatch as a step table
    groups = report.get("groups", [])
    reasons = [str(g["text"]) for g in groups]
    if len(groups) > 1:
        reasons.insert(0, f"{count:,} mismatches in {len(groups)} groups: "
                       + "; ".join(str(g["title"]) for g in groups))
    ok = count == 0 and int(report["states"]) > 0
    cpu = report.get("cpu_seconds")
    return row(got, "ok" if ok else "DRIFT", reasons, seconds, int(report["states"]),
               cpu=round(float(cpu), 2) if cpu is not None else None)


def _incomplete_graph(entry: ModelEntry, tlc: TLCResult) -> str | None:
    """Why TLC's state graph of ``entry`` is not the whole state space, or None.

    Only a run that passed explored every state: one that stopped at a
    violation, a deadlock, an error or a time-out dumped a prefix of the
    graph, whose unexplored frontier states have no successors. Comparing the
    reference with it would report steps the reference rightly allows as
    drift (and hide the real difference)."""
    if tlc.outcome is Outcome.PASS:
        return None
    of = (f"{_fmt_count(tlc.distinct_states)} of the model's "
          f"{_fmt_count(entry.distinct_states)} states")
    if tlc.outcome in (Outcome.INVARIANT_VIOLATED, Outcome.PROPERTY_VIOLATED):
        what = f"the first violation ({_result_label(tlc)})"
        return f"TLC stopped at {what} after {of}"
    if tlc.outcome is Outcome.DEADLOCK:
        return f"TLC stopped at the first deadlock after {of}"
    return f"TLC did not finish ({_result_label(tlc)}) after {of}"


def _not_conformance_row(entry: ModelEntry, tlc: TLCResult, why: str) -> Row:
    return Row(
        model=entry.name, expected="conforms", got="not checked", distinct_states=None,
        expected_distinct_states=entry.distinct_states, wall_seconds=0.0, status=NOT_CHECKED,
        check="conformance",
        reasons=[f"conformance not checked: {why}; it is computed on a complete state graph "
                 "only (fix the TLC row first)"],
    )


def _violated(result: TLCResult) -> str | None:
    """What a counterexample violates, for the last line of its step table."""
    if result.outcome is Outcome.INVARIANT_VIOLATED:
        return f"invariant {result.violated or '(unnamed)'} (in the last state)"
    if result.outcome is Outcome.PROPERTY_VIOLATED:
        return f"temporal property {result.violated or '(unnamed)'} (by this behaviour)"
    if result.outcome is Outcome.DEADLOCK:
        return "deadlock (no step is enabled in the last state)"
    return None


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
        trace=trace_json(result.trace) if with_trace and result.trace else None,
        cached=result.cached,
    )


def _not_checked_row(entry: ModelEntry, check: str, errors: Sequence[SpecError],
                     root: Path) -> Row:
    return Row(
        model=entry.name,
        expected=entry.expect if check == "tlc" else "conforms",
        got="not checked",
        distinct_states=None,
        expected_distinct_states=entry.distinct_states,
        wall_seconds=0.0,
        status=NOT_CHECKED,
        check=check,
        error="\n".join(e.render(root) for e in errors),
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
            f"{r.wall_seconds:.1f}" + (" cached" if r.cached else ""),
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


# How often the main thread wakes from a wait: Python runs signal handlers in
# the main thread only, when it executes; a signal that the kernel delivered
# to a worker thread (blocked in a read from TLC's pipe) does not interrupt the
# main thread's wait, so a Ctrl-C was handled only when the main thread next
# woke, once up to a whole TLC run later.
_WAKE_SECONDS = 0.2


_T = TypeVar("_T")


def _in_a_thread(work: Callable[[], _T]) -> _T:
    """``work()`` in a helper thread while the main thread wakes every
    :data:`_WAKE_SECONDS` (so that a Ctrl-C is handled at once)."""
    out: list[_T] = []
    err: list[BaseException] = []

    def run() -> None:
        try:
            out.append(work())
        except BaseException as e:  # re-raised in the caller's thread
            err.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    while t.is_alive():
        t.join(_WAKE_SECONDS)
    if err:
        raise err[0]
    return out[0]


class _Interrupt:
    """SIGINT (Ctrl-C) or SIGTERM during ``toolledger check``: the first one
    cancels everything (no new process starts, running JVMs and conformance
    processes are killed); later ones are ignored. The handler raises
    nothing: an exception thrown at an arbitrary point of the main thread
    (e.g. inside ``Popen`` after the fork, before the child is registered)
    would leak that child. Every wait of the main thread is on a process the
    :class:`Cancellation` kills, so the run ends promptly with
    :class:`Cancelled`, and the rows finished so far are reported."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, cancel: Cancellation) -> None:
        self.cancel = cancel
        self.signum: int | None = None
        self.previous: dict[int, object] = {}

    def __enter__(self) -> _Interrupt:
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self.previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is not None:
            return
        self.signum = signum
        self.cancel.cancel()

    @property
    def name(self) -> str:
        return "Ctrl-C" if self.signum in (None, signal.SIGINT) else signal.Signals(
            self.signum).name

    @property
    def exit_status(self) -> int:
        """128 + the signal number, what shells report (130 for a Ctrl-C)."""
        return 128 + (self.signum if self.signum is not None else signal.SIGINT)

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]


def cmd_check(args: argparse.Namespace) -> int:
    # absolute: child processes run in <root>/reference and get paths under root
    root = resolve_root(args).resolve()
    manifest = load_manifest(root)
    if args.model:
        unknown = [n for n in args.model if n not in manifest.names()]
        if unknown:
            raise UsageError(
                f"no model named {', '.join(map(repr, unknown))}; "
                f"valid names: {', '.join(manifest.names())}"
            )
        models = [manifest.get(n) for n in dict.fromkeys(args.model)]  # once each, in order
    else:
        models = manifest.ci_models() if args.all else manifest.check_models()
        if not models:
            raise UsageError(f"{manifest.path} has no model with ci = true: nothing to check")
    if args.all and args.no_conformance:
        raise UsageError("--all and --no-conformance contradict each other: give one of them")
    # a model named with --model gets its conformance row whatever its tier
    conform = [e for e in models if e.conformance and not args.no_conformance
               and (args.all or bool(args.model) or e.conformance_tier == "check")]
    quick_line = ""
    if args.quick:
        if args.model or args.all:
            raise UsageError("--quick picks the models itself: give it without --model/--all")
        picked = _quick_selection(root, manifest, args)
        if picked is None:
            return 0
        models, conform, quick_line = picked
        args.tlc_cache = _cache_or_default(root, getattr(args, "tlc_cache", None))

    cancel = Cancellation()
    with _Interrupt(cancel) as interrupt, tempfile.TemporaryDirectory(
        prefix="toolledger-check-"
    ) as dumps:
        run = _CheckRun(manifest, models, conform, None, Path(dumps), args, cancel)
        try:
            run.run()
        except Cancelled:
            if interrupt.signum is None:
                raise  # a Cancelled nobody asked for is a bug: show it
        except KeyboardInterrupt:  # only without our handler (not in the main thread)
            interrupt.signum = signal.SIGINT
        finally:
            run.stop()
        status = run.report(interrupted=interrupt if interrupt.signum is not None else None)
        if run.stopped_at is not None:
            quick_line += (f"; stopped at the first failing row, {run.stopped_at}: the rows "
                           "after it were not run")
        if quick_line:
            print(quick_line, file=sys.stderr if args.json else sys.stdout)
        return status


# The budget of `check --quick` in estimated CPU seconds (job_cost): 2 cores
# for 20 s, less SANY's parse and the estimates' error on a busy machine.
QUICK_BUDGET = 30.0
# `check --quick` without --tlc-cache reads and fills the cache `make check` fills
# (Makefile's TLC_CACHE): after a change of the reference alone, the spec's
# state graphs (and every TLC verdict) are answered from there.
QUICK_CACHE = Path("build") / "tlc-cache"


def _cache_or_default(root: Path, given: Path | None) -> Path | None:
    """``given``, else the cache ``make check`` leaves under ``root`` if it exists."""
    if given is not None:
        return given
    default = root / QUICK_CACHE
    return default if default.is_dir() else None


def _quick_selection(root: Path, manifest: Manifest, args: argparse.Namespace
                     ) -> tuple[list[ModelEntry], list[ModelEntry], str] | None:
    """The rows of ``check --quick`` (see :mod:`toolledger.check.quick`), or None
    when nothing changed (said on stdout)."""
    from .check import quick

    table = quick.load_table(root)
    if table is None:
        raise UsageError(f"{root / quick.TABLE} does not exist: run `toolledger exercises` "
                         "once to generate it (or run the full `toolledger check`)")
    try:
        change = quick.touched(root)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        raise UsageError(f"--quick needs git to see what changed ({e}); run the full "
                         "`toolledger check` instead") from None
    if change.empty:
        print("quick: nothing changed in spec/, model/ or reference/ against HEAD "
              "(git diff HEAD): nothing to check; `toolledger check` runs everything")
        return None
    ci = manifest.ci_models()
    by_name = {e.name: e for e in ci}

    def cost(name: str, conf: bool) -> float:
        e = by_name[name]
        return job_cost("tlc", e.distinct_states, temporal=bool(parse_cfg(e.cfg_path).properties),
                        dump=conf, then_conformance=conf)

    sel = quick.select(
        table, change, cost=cost, ci=[e.name for e in ci],
        conformance_models=[] if args.no_conformance else [e.name for e in ci if e.conformance],
        module_of={e.name: e.module for e in ci}, cfg_of={e.name: e.cfg for e in ci},
        budget=QUICK_BUDGET, must_pass=[e.name for e in ci if e.expect == "pass"],
        expects={e.name: e.expect for e in ci},
        reference_actions=quick.reference_actions(root, {
            u for units in change.reference_units.values() for u in units if u is not None}),
    )
    out = sys.stderr
    print(f"quick: {', '.join(change.files)} changed against HEAD", file=out)
    for line in sel.reasons:
        print(f"quick: {line}", file=out)
    stale = quick.stale_files(root, table)
    notes = []
    if sel.uncovered:
        notes.append(f"no model evaluated {', '.join(sel.uncovered)} when {quick.TABLE} was "
                     "generated (new, or unused?)")
    if stale:
        notes.append(f"{quick.TABLE} was generated on other versions of {', '.join(stale)}: "
                     "`toolledger exercises` refreshes it")
    if not sel.models:
        notes.append("no model exercises the change")
    models = [by_name[n] for n in sel.models]
    conform = [by_name[n] for n in sel.conformance]
    if not models:  # nothing known exercises it: the cheapest must-pass models, in budget
        spent = 0.0
        for cheap in sorted((m for m in ci if m.expect == "pass"),
                            key=lambda m: cost(m.name, False)):
            if spent + cost(cheap.name, False) > QUICK_BUDGET:
                break
            models.append(cheap)
            spent += cost(cheap.name, False)
        notes.append(f"so the {len(models)} cheapest must-pass models run instead")
    line = (f"quick: {len(models)} of {len(ci)} CI models and {len(conform)} conformance "
            f"row{'' if len(conform) == 1 else 's'} (~{sel.cost:.0f} CPU s estimated)"
            + (f"; {sel.left_out} more models exercise the change but did not fit"
               if sel.left_out else "")
            + "".join(f"; {n}" for n in notes)
            + "; the full answer is `toolledger check`")
    return models, conform, line


def _configure_exercises(p: argparse.ArgumentParser) -> None:
    add_root_argument(p)
    p.add_argument("--jobs", type=_positive(int, "a whole number of TLC runs >= 1"),
                   default=min(2, os.cpu_count() or 1), metavar="N",
                   help="TLC runs side by side (default: 2)")
    p.add_argument("--tlc-cache", type=Path, metavar="DIR", default=None,
                   help=f"read and keep the -coverage runs in DIR (default: {QUICK_CACHE} "
                   "under the root if it exists, as make check leaves it): a model whose "
                   "inputs are unchanged is answered from there, without a JVM")
    p.add_argument("--no-tlc-cache", action="store_true",
                   help="run every model with TLC, reading and keeping nothing")


def _exercise(got: tuple[ModelEntry, TLCResult], n: int, total: int, texts: dict[str, str],
              done: dict[str, dict[str, object]]) -> None:
    from .check import quick

    e, result = got
    actions, lines = quick.coverage_of(result.output)
    cfg = parse_cfg(e.cfg_path)
    done[e.name] = {
        "outcome": _result_label(result),
        "distinct_states": result.distinct_states,
        "actions": sorted(actions),
        "invariants": list(cfg.invariants),
        "properties": list(cfg.properties),
        "definitions": quick.exercised_definitions(lines, texts),
    }
    print(f"[{n}/{total}] {e.name}: {len(actions)} actions, {_result_label(result)}"
          + (" (cached)" if result.cached else ""), file=sys.stderr)


def _cmd_exercises(args: argparse.Namespace) -> int:
    """Run every CI model once with TLC's -coverage; write model/exercises.json and
    docs/exercises.md (what ``check --quick`` selects by)."""
    from .check import quick

    root = resolve_root(args).resolve()
    manifest = load_manifest(root)
    ci = manifest.ci_models()
    texts = quick.tla_texts(manifest.search_dirs)
    cancel = Cancellation()
    done: dict[str, dict[str, object]] = {}
    cached: list[str] = []
    # A coverage run is keyed like any other (tlccache: -coverage is one of its
    # options), so re-running this after adding a twin runs only the models
    # whose read set changed.
    cache = None if args.no_tlc_cache else _cache_or_default(root, args.tlc_cache)
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)

    def one(e: ModelEntry) -> tuple[ModelEntry, TLCResult]:
        return e, run_tlc(e.module, e.cfg_path, search_dirs=manifest.search_dirs,
                          check_deadlock=e.check_deadlock, workers=e.workers,
                          extra_args=("-coverage", "1"), cancel=cancel,
                          expected_states=e.distinct_states, cache=cache)

    with _Interrupt(cancel) as interrupt, concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(one, e) for e in sorted(ci, key=lambda e: -e.distinct_states)}
        try:
            n = 0
            while futures:
                finished, futures = concurrent.futures.wait(
                    futures, timeout=_WAKE_SECONDS, return_when=concurrent.futures.FIRST_COMPLETED)
                for fut in finished:
                    n += 1
                    got = fut.result()
                    if got[1].cached:
                        cached.append(got[0].name)
                    _exercise(got, n, len(ci), texts, done)
        except Cancelled:
            pass
        if interrupt.signum is not None:
            cancel.cancel()
            print(f"interrupted ({interrupt.name}): nothing was written", file=sys.stderr)
            return interrupt.exit_status
    models = {e.name: done[e.name] for e in ci}  # the manifest's order
    digests = {str(p.relative_to(root)): quick.file_digest(p)
               for d in manifest.search_dirs for p in sorted(d.glob("*.tla"))}
    table = json.loads(quick.table_json(models, digests))
    (root / quick.TABLE).write_text(quick.table_json(models, digests), encoding="utf-8")
    (root / quick.DOC).parent.mkdir(parents=True, exist_ok=True)
    (root / quick.DOC).write_text(quick.markdown(table), encoding="utf-8")
    print(f"wrote {quick.TABLE} and {quick.DOC} ({len(models)} models, {len(cached)} of them "
          f"answered from {cache})" if cache is not None else
          f"wrote {quick.TABLE} and {quick.DOC} ({len(models)} models)")
    return 0


NOT_CHECKED = "NOT CHECKED"

# Rough costs of ``toolledger check``'s jobs in CPU seconds, measured on
# the CI models (benchmarks/bench_check.py): a JVM start and SANY ~1.5 s;
# TLC's search ~7,000 distinct states/s (5,000 to 17,000 by model); a
# temporal property ~3x that (the behaviour graph is built as it goes);
# dumping the state graph for conformance ~3,000 states/s on top (TLC
# pretty-prints every state and fingerprints both ends of every edge:
# ReconcileReadonly 4.9 s without, 14.6 s with); the conformance check
# ~2,500 states/s.
_JVM_START_SECONDS = 1.5
_TLC_STATES_PER_SECOND = 7_000
_TEMPORAL_FACTOR = 3.0
_DUMP_STATES_PER_SECOND = 3_000
_CONFORMANCE_STATES_PER_SECOND = 2_500


def job_cost(kind: str, states: int, *, temporal: bool = False, dump: bool = False,
             then_conformance: bool = False) -> float:
    """The estimated seconds of a job and of the work that must wait for it.

    A TLC run that dumps the state graph for a conformance check counts that
    check too (it can only start afterwards): the longest chain starts first,
    so that neither it nor a big run is left alone at the end with a core idle.
    """
    if kind == "conformance":
        return states / _CONFORMANCE_STATES_PER_SECOND
    search = states / _TLC_STATES_PER_SECOND * (_TEMPORAL_FACTOR if temporal else 1.0)
    cost = _JVM_START_SECONDS + search
    if dump:
        cost += states / _DUMP_STATES_PER_SECOND
    if then_conformance:
        cost += job_cost("conformance", states)
    return cost


_Future = concurrent.futures.Future[list[tuple[ModelEntry, TLCResult]] | Row]


@dataclass(frozen=True, eq=False)
class _Job:
    """One unit of ``toolledger check``'s work: a TLC run (of one row, or of a
    batch of rows) or the conformance check of one model."""

    kind: str  # "tlc" or "conformance"
    entries: tuple[ModelEntry, ...]
    batch: Batch | None = None
    temporal: bool = False  # its cfg checks temporal PROPERTIES
    dumps: bool = False  # it dumps the state graph for a conformance check

    @property
    def name(self) -> str:
        if self.batch is not None:
            return self.batch.name
        return self.entries[0].name + (" [conformance]" if self.kind == "conformance" else "")

    def priority(self) -> tuple[int, float]:
        """The order jobs start in (the highest first): the rows most likely to
        fail a change first. A conformance check whose graph is dumped (it is
        what finds a bug in the reference) before any TLC run, then the TLC runs
        that dump a graph for one, smallest first (a small model's conformance
        row answers in seconds instead of after every big run), then the other
        TLC runs longest first (so that no big run is left alone at the end)."""
        if self.kind == "conformance":
            return 2, -self.cost()
        if self.dumps:
            return 1, -self.cost()
        return 0, self.cost()

    def quick_priority(self) -> tuple[int, float]:
        """``check --quick``'s order: it stops at the first failing row, so the
        cheapest answer first (a conformance check, then the TLC runs that dump
        a graph for one, then the others), smallest first."""
        return (2 if self.kind == "conformance" else 1 if self.dumps else 0), -self.cost()

    def cost(self) -> float:
        """A rough estimate of the seconds of the job and of the conformance
        check waiting for it (:func:`job_cost`), to start the longest first."""
        states = max(e.distinct_states for e in self.entries)
        if self.batch is not None and self.batch.host is not None:
            states = self.batch.host.distinct_states
        return job_cost(self.kind, states, temporal=self.temporal, dump=self.dumps,
                        then_conformance=self.dumps)


class _CheckRun:
    """One ``toolledger check``: parse, run TLC, check conformance, report."""

    def __init__(self, manifest: Manifest, models: list[ModelEntry], conform: list[ModelEntry],
                 package: Path | None, dumps: Path, args: argparse.Namespace,
                 cancel: Cancellation) -> None:
        self.manifest, self.models, self.conform = manifest, models, conform
        self.package, self.args, self.cancel = package, args, cancel
        self.root = manifest.root
        self.dumps = dumps
        self.dot_of = {e.name: dumps / f"{e.name}.dot" for e in conform}
        self.ready: list[_Job] = []  # jobs that can start now
        self.jobs: int = args.jobs
        self.progress = _ProgressLine(sys.stderr)
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.running: dict[str, float] = {}  # model -> when its TLC run started
        # model -> TLC's last report: (distinct states, seconds into the run);
        # TLC reports once a minute, so the count says when it was counted
        self.states: dict[str, tuple[int, float]] = {}
        self.started_runs = 0
        self.parsed = False  # SANY's parse of every module is done
        self.finished = 0
        self.to_run: list[ModelEntry] = []
        self.unparsed: dict[str, tuple[SpecError, ...]] = {}
        self.results: dict[str, TLCResult] = {}
        self.tlc_rows: dict[str, Row] = {}
        self.conformance_rows: dict[str, Row] = {}
        self.pool: concurrent.futures.ThreadPoolExecutor | None = None
        # --quick: stop at the first failing row (the answer a maintainer waits for)
        self.fail_fast = bool(getattr(args, "quick", False))
        self.order: Callable[[_Job], tuple[int, float]] = (
            _Job.quick_priority if self.fail_fast else _Job.priority)
        self.stopped_at: str | None = None  # the failing row --quick stopped at

    # -- running

    def run(self) -> None:
        if self.conform:  # refuses (exit 2) before anything runs if it cannot be checked
            self.package = _reference_package(self.root)
            self.cancel.check()  # a Ctrl-C during the probe (it is not a registered child)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.jobs)
        # SANY's parse of every module (one JVM, one core) takes a few
        # seconds; the longest TLC run starts beside it rather than after it.
        # Its result counts only if its module parses (a module that does not
        # parse makes TLC stop at once, and its rows are NOT CHECKED anyway).
        self.to_run = list(self.models)
        head = max(self._plan(), key=self.order if self.fail_fast else _Job.cost,
                   default=None)
        first = None if head is None else self.pool.submit(self._run_job, head)
        self._parse()
        self._run_all(None if head is None or first is None else (head, first))

    def _parse(self) -> None:
        """SANY once over every model's module, before any model runs: a spec
        that does not parse is reported once, here, and its models are not
        checked (rather than failing one by one as parse errors or drift)."""
        modules = list(dict.fromkeys(e.module for e in self.models))
        self.progress.live(lambda: f"parsing {_plural(len(modules), 'module')} with SANY "
                                   f"({_seconds(time.monotonic() - self.started)})")
        errors = _in_a_thread(lambda: parse_modules(
            modules, search_dirs=self.manifest.search_dirs, cancel=self.cancel))
        self.progress.live(None)
        self.unparsed = {m: errs for m, errs in errors.items() if errs}
        shown: set[str] = set()
        for errs in self.unparsed.values():
            for e in errs:
                text = e.render(self.root)
                if text not in shown:
                    shown.add(text)
                    self.progress.note(text)
        if self.unparsed:
            names = [e.name for e in self.models if e.module in self.unparsed]
            self.progress.note(
                f"the spec does not parse: {_plural(len(names), 'model')} will not be checked "
                f"({', '.join(names)})"
            )
        self.to_run = [e for e in self.models if e.module not in self.unparsed]
        self.parsed = True

    def _status(self) -> str:
        now = time.monotonic()
        with self.lock:
            running = sorted(self.running.items(), key=lambda kv: kv[1])
            parts = [
                f"{name} {_seconds(now - t0)}"
                + (f" ({_plural(self.states[name][0], 'state')} at "
                   f"{_seconds(self.states[name][1])})" if name in self.states else "")
                for name, t0 in running
            ]
            waiting = len(self.to_run) - self.started_runs
        text = f"{_seconds(now - self.started)}: " + (
            f"running {', '.join(parts)}" if parts else "starting TLC" if waiting else "finishing")
        if waiting > 0:
            text += f"; {waiting} waiting"
        return text + f"; {self.finished}/{len(self.to_run)} done"

    # -- scheduling: TLC runs and conformance checks share the `--jobs` slots

    def _plan(self) -> list[_Job]:
        """The TLC runs: rows that can share one run are batched
        (:mod:`toolledger.check.batch`), unless ``--trace`` asks for every
        row's own counterexample."""
        batches: list[Batch]
        if self.args.trace:
            batches, alone = [], list(self.to_run)
        else:
            batches, alone = plan(self.to_run)
        conform = {e.name for e in self.conform}

        def job(entries: tuple[ModelEntry, ...], batch: Batch | None) -> _Job:
            host = entries[0] if batch is None else batch.host
            base = entries[0] if batch is None else batch.base
            return _Job("tlc", entries, batch,
                        temporal=bool(parse_cfg(base.cfg_path).properties),
                        dumps=host is not None and host.name in conform)

        return [*(job(b.entries, b) for b in batches), *(job((e,), None) for e in alone)]

    def _run_job(self, job: _Job) -> list[tuple[ModelEntry, TLCResult]] | Row:
        self.cancel.check()  # a queued job never starts after Ctrl-C
        with self.lock:
            self.running[job.name] = time.monotonic()
            if job.kind == "tlc":
                self.started_runs += len(job.entries)
            count = len(self.running)
            waiting = len(self.to_run) - self.started_runs
            # the last job alone on the machine may use every slot
            workers = self.jobs if count == 1 and not self.ready else 1
        if not self.progress.tty and self.parsed:  # the head job is noted after the parse
            self.progress.note(f"started {job.name} ({count} running, {waiting} waiting)")
        try:
            if job.kind == "conformance":
                [entry] = job.entries
                assert self.package is not None
                return _conformance_row(self.root, entry, self.results[entry.name],
                                        self.dot_of[entry.name], self.package, self.cancel,
                                        workers=workers)
            return self._run_tlc_job(job)
        finally:
            with self.lock:
                self.running.pop(job.name, None)
                self.states.pop(job.name, None)

    def _run_tlc_job(self, job: _Job) -> list[tuple[ModelEntry, TLCResult]]:
        def seen(p: Progress) -> None:
            with self.lock:
                self.states[job.name] = (p.distinct, p.elapsed)

        if job.batch is None:
            [entry] = job.entries
            module, cfg, dirs = entry.module, entry.cfg_path, self.manifest.search_dirs
        else:
            entry = job.batch.base
            where = self.dumps / "batches" / job.batch.module
            _, cfg = batch_files(job.batch, where)
            module, dirs = job.batch.module, [*self.manifest.search_dirs, where]
        host = job.batch.host if job.batch is not None else entry
        result = run_tlc(
            module,
            cfg,
            search_dirs=dirs,
            check_deadlock=entry.check_deadlock,
            workers=entry.workers,
            dump_dot=self.dot_of.get(host.name) if host is not None else None,
            timeout=self.args.timeout,
            on_progress=seen,
            cancel=self.cancel,
            expected_states=entry.distinct_states,
            cache=getattr(self.args, "tlc_cache", None),
        )
        if job.batch is None:
            return [(entry, result)]
        split = split_result(job.batch, result)
        return [(e, split[e.name]) for e in job.entries]

    def _finish_tlc(self, job: _Job, results: list[tuple[ModelEntry, TLCResult]]) -> None:
        todo = len(self.to_run)
        for entry, result in results:
            with self.lock:
                self.finished += 1
                n = self.finished
            self.results[entry.name] = result
            row = _row_for(entry, result, self.args.trace)
            if job.batch is not None:
                row.tlc_run = job.name
            self.tlc_rows[entry.name] = row
            self.progress.note(
                f"[{n}/{todo}] {entry.name}: {row.got}, "
                f"{_fmt_count(result.distinct_states)} distinct states, "
                f"{result.wall_seconds:.1f} s"
                + (" (cached: a run of the same inputs)" if result.cached else "")
                + (f" (in the run of {job.name})" if job.batch is not None else "")
                + f": {row.status}"
                + ("" if self.progress.tty or n == todo else f"  ({self._status()})")
            )
            if entry in self.conform:
                why = _incomplete_graph(entry, result)
                if why is None:
                    self.ready.append(_Job("conformance", (entry,)))
                else:
                    self.conformance_rows[entry.name] = _not_conformance_row(entry, result, why)

    def _run_all(self, head: tuple[_Job, _Future] | None = None) -> None:
        """TLC runs and conformance checks, ``--jobs`` at a time.

        The ready jobs start in :meth:`_Job.priority` order: conformance
        checks (ready as soon as their TLC run has dumped its state graph),
        then the TLC runs that dump a graph, smallest first, then the others
        longest first (so that the big models do not run last, alone).
        ``head``: the job started beside the parse, the longest (see
        :meth:`run`), and its future."""
        pending: dict[_Future, _Job] = {}
        if head is not None:
            job, fut = head
            if all(e.module not in self.unparsed for e in job.entries):
                pending[fut] = job
                if not self.progress.tty:
                    self.progress.note(f"started {job.name} (beside the parse)")
            else:  # its module does not parse: TLC stopped at once; wait, then drop it
                concurrent.futures.wait([fut])
                with self.lock:
                    self.started_runs -= len(job.entries)
        if not self.to_run:
            return
        self.ready = [j for j in self._plan()
                      if not any(j.name == p.name for p in pending.values())]
        runs = len(self.ready) + len(pending)
        self.progress.note(f"running {_plural(len(self.to_run), 'model')} with TLC"
                           + (f" in {runs} runs" if runs != len(self.to_run) else "")
                           + f", {min(self.jobs, runs)} at a time")
        self.progress.live(self._status)
        assert self.pool is not None
        while self.ready or pending:
            while self.ready and len(pending) < self.jobs:
                job = max(self.ready, key=self.order)
                self.ready.remove(job)
                pending[self.pool.submit(self._run_job, job)] = job
            done, _ = concurrent.futures.wait(
                pending, timeout=_WAKE_SECONDS, return_when=concurrent.futures.FIRST_COMPLETED)
            for fut in done:
                job = pending.pop(fut)
                out = fut.result()
                if isinstance(out, Row):
                    self.conformance_rows[job.entries[0].name] = out
                    self.progress.note(f"{job.name}: conformance {out.got}: {out.status} "
                                       f"({out.wall_seconds:.1f} s)")
                else:
                    self._finish_tlc(job, out)
            if self.fail_fast and self.stopped_at is None:
                failed = [r for r in (*self.tlc_rows.values(), *self.conformance_rows.values())
                          if not r.ok]
                if failed:
                    first = failed[0]
                    self.stopped_at = first.model + (
                        "" if first.check == "tlc" else f" [{first.check}]")
                    left = len(self.ready) + len(pending) + len(self.to_run) - self.started_runs
                    self.progress.note(f"quick: {self.stopped_at} failed: stopping "
                                       f"({left} jobs not run)")
                    self.ready = []
                    break
        self.progress.live(None)

    def stop(self) -> None:
        """Kill what still runs (after Ctrl-C or an error) and wait until every
        runner has removed its temporary directory."""
        done = len(self.tlc_rows) == len(self.to_run) and len(self.conformance_rows) == len(
            [e for e in self.conform if e.name in self.results]
        ) and not self.ready
        if not done:
            self.cancel.cancel()
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        self.progress.close()

    # -- reporting

    def report(self, *, interrupted: _Interrupt | None = None) -> int:
        rows: list[Row] = []
        for e in self.models:
            if e.name in self.tlc_rows:
                rows.append(self.tlc_rows[e.name])
            elif e.module in self.unparsed:
                rows.append(_not_checked_row(e, "tlc", self.unparsed[e.module], self.root))
        for e in self.conform:
            if e.name in self.conformance_rows:
                rows.append(self.conformance_rows[e.name])
            elif e.module in self.unparsed:
                rows.append(_not_checked_row(e, "conformance", self.unparsed[e.module],
                                             self.root))
        if not interrupted:
            for provider in CHECK_ROW_PROVIDERS:
                rows.extend(provider(self.manifest, self.models, self.args))
        total = time.monotonic() - self.started
        if interrupted is not None and not rows:  # nothing finished: one line, no empty table
            print(self._interrupted_line(total, interrupted.name),
                  file=sys.stderr if self.args.json else sys.stdout)
            return interrupted.exit_status
        checked = self._checked_line()
        if self.args.json:
            print(json.dumps([asdict(r) for r in rows], indent=2))
            print(checked, file=sys.stderr)
        else:
            if rows:
                print(_table(rows))
            print(checked)
            side_by_side = min(self.jobs, max(1, len(self.to_run)))
            print(f"total wall time {total:.1f} s ({_plural(side_by_side, 'TLC run')} at a time)")
            for r in rows:
                if r.status == NOT_CHECKED and not r.reasons:
                    continue  # its parse errors were printed once, before any model ran
                name = r.model if r.check == "tlc" else f"{r.model} [{r.check}]"
                for reason in r.reasons:
                    print(f"{name}: {reason}")
                if r.error and r.status == "ERROR":
                    print(f"\n{r.model}: {'TLC' if r.check == 'tlc' else r.check} said:\n"
                          f"{r.error}\n")
            if self.unparsed:
                names = sorted({r.model for r in rows if r.status == NOT_CHECKED and not r.reasons})
                print(f"not checked: {', '.join(names)}: the spec does not parse "
                      "(SANY's errors are printed above, before any model ran)")
            if self.args.trace:
                for name, result in self.results.items():
                    if result.trace:
                        print(f"\n== {name}: {_result_label(result)} ({len(result.trace)} steps)")
                        print(render_trace(result.trace, violated=_violated(result)))
        if interrupted is not None:
            print(self._interrupted_line(total, interrupted.name),
                  file=sys.stderr if self.args.json else sys.stdout)
            return interrupted.exit_status
        return 0 if all(r.ok for r in rows) else 1

    def _checked_line(self) -> str:
        where = f"{self.root} ({_git_state(self.root)})"
        if self.package is not None:
            line = f"checked: spec/ and model/ of {where}, and the reference {self.package}"
            running = Path(__file__).resolve().parent
            if running != self.package:
                line += f" (this toolledger command itself runs from {running})"
            return line + self._left_to_test()
        why = "--no-conformance" if self.args.no_conformance else "no conformance model selected"
        return (f"checked: spec/ and model/ of {where}; the reference was not checked ({why})"
                + ("" if self.args.no_conformance else self._left_to_test()))

    def _left_to_test(self) -> str:
        line = ""
        if not any(getattr(self.args, a, None) for a in ("model", "all", "quick")):
            rows = [e.name for e in self.manifest.ci_models() if e.tier != "check"]
            if rows:
                line += (f"; the TLC rows of {', '.join(rows)} are left to make test "
                         '(tier = "test"; toolledger check --all runs them)')
        left = [e.name for e in self.models if e.conformance and e not in self.conform]
        if left and not self.args.no_conformance:
            line += (f"; the conformance of {', '.join(left)} is left to make test "
                     '(conformance_tier = "test"; toolledger check --all runs it)')
        return line

    def _interrupted_line(self, total: float, signal_name: str) -> str:
        if not self.parsed:
            return (f"interrupted ({signal_name}) after {total:.1f} s, before SANY's parse of "
                    "the spec was done: nothing was checked; nothing is left running")
        runnable = [e for e in self.models if e.module not in self.unparsed]
        stopped = [e.name for e in runnable if e.name not in self.tlc_rows]
        conf = [e.name for e in self.conform
                if e.name in self.tlc_rows and e.name not in self.conformance_rows]
        parts = [f"interrupted ({signal_name}) after {total:.1f} s: "
                 f"{len(self.tlc_rows)} of {_plural(len(runnable), 'model')} finished"]
        if stopped:
            parts.append(f"not finished: {', '.join(stopped)}")
        if conf:
            parts.append(f"conformance not checked: {', '.join(conf)}")
        return "; ".join(parts) + "; nothing is left running"


def _configure_simulate(p: argparse.ArgumentParser) -> None:
    from .kit import simulate

    simulate.configure(p)


def _cmd_simulate(args: argparse.Namespace) -> int:
    from .kit import simulate

    return simulate.cmd_simulate(args)


def _configure_deep(p: argparse.ArgumentParser) -> None:
    from .check import deep

    add_root_argument(p)
    deep.configure(p)


def _cmd_deep(args: argparse.Namespace) -> int:
    from .check import deep

    try:
        return deep.cmd_deep(args, resolve_root(args))
    except ValueError as e:
        raise UsageError(str(e)) from e


def _configure_models(p: argparse.ArgumentParser) -> None:
    add_root_argument(p)
    p.add_argument("--proves", action="store_true",
                   help="print what each model proves and under which assumptions "
                   "(docs/models.md's list) instead of the table")


def _cmd_models(args: argparse.Namespace) -> int:
    from .check.manifest import markdown_table, proves_markdown

    manifest = load_manifest(resolve_root(args))
    print(proves_markdown(manifest) if args.proves else markdown_table(manifest))
    return 0


SUBCOMMANDS: list[Subcommand] = [
    Subcommand(
        "check",
        "run the CI models of model/manifest.toml with TLC; fail on any drift",
        _configure_check,
        cmd_check,
    ),
    Subcommand(
        "exercises",
        "run every CI model with TLC's -coverage; write which model exercises which action "
        "and definition (model/exercises.json, docs/exercises.md) for check --quick",
        _configure_exercises,
        _cmd_exercises,
    ),
    Subcommand(
        "models",
        "print the manifest's models as docs/models.md's markdown table",
        _configure_models,
        _cmd_models,
    ),
    Subcommand(
        "deep",
        "sample the deep model (3 calls, 3 crashes, 3 attempts, expiring keys) with TLC's "
        "random simulation; exit 1 if a behaviour breaks an invariant",
        _configure_deep,
        _cmd_deep,
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
        configure_verify_store,
        cmd_verify_store,
    ),
    Subcommand(
        "halted",
        "list what waits for a human in a store (halted calls, pending approvals); "
        "exit 3 if anything does",
        configure_halted,
        cmd_halted,
    ),
    Subcommand(
        "status",
        "where every session of a store (or every call of one session) stands; writes nothing",
        configure_status,
        cmd_status,
    ),
    Subcommand(
        "resolve",
        "a human's answer to a halted call: applied, retry or abandon, --by NAME",
        configure_resolve,
        cmd_resolve,
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
    except KeyboardInterrupt:  # before a command installed its own handler (see _Interrupt)
        print(f"toolledger {args.command}: interrupted (Ctrl-C) before it started; "
              "nothing was checked", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
