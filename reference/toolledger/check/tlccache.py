"""A content-addressed cache of TLC runs: the same inputs are model-checked once.

CI runs ``make check`` and then ``make test``, and both check every CI model
with TLC: the same modules, the same ``.cfg``, the same options, the same
jar.  TLC's answer depends on nothing else (``-workers 1``, ``-fp 0``,
``-lncheck final``: see :func:`toolledger.check.tlc.run_tlc`), so the second
run of identical inputs can only repeat the first.  With a cache directory
(``toolledger check --tlc-cache DIR``; in the tests the
``TOOLLEDGER_TLC_CACHE`` variable, set by ``make``), :func:`run_tlc` keeps
TLC's raw output of each finished run under a digest of its inputs and, for
the same digest, parses that output again instead of starting a JVM: the
result is exactly what parsing the original run gave (``cached`` is True).

The digest covers every byte TLC reads: the module name, the ``.cfg`` and
every ``.tla`` copied next to it that the run can read (names and
contents: :func:`read_set`, the modules named, transitively, by the model's
module or its cfg; a word of the code outside comments and strings is taken
for a module name wherever it appears, so the set can be larger than what
SANY loads; and a run whose output shows SANY parsing a module outside the
set is never kept: :func:`covers`), TLC's options
(workers, deadlock check, fingerprint, liveness mode, extra arguments), the
jar's contents and the java binary and version.  JVM flags (``-Xss``, C1/C2)
are not in it: they change how fast TLC runs, not what it finds.  Only
complete verdicts are kept (pass, invariant or property violated,
deadlock); a timeout, an error, a parse error or a cancelled run never is.

A run that dumps its state graph (``-dump dot,actionlabels``: the
conformance rows, the tests and notebooks that read a graph) has the dump in
its key, and is kept only when it passed, i.e. the dump is the whole
reachable graph: the dot file is stored next to the entry
(``<digest>.dot``, its size recorded), and a hit copies it to the path the
caller asked for.  A run that stopped at a violation dumped a prefix of the
graph and is never kept.  Entries are written atomically (the dump first,
then the entry, each a temporary file and a rename), so a crashed run leaves
no half-written entry; an unreadable entry, or one whose dump is missing or
of another size, is a miss.

See docs/models.md ("What `make check` and `make test` share").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

__all__ = ["CACHE_ENV", "Entry", "cache_from_env", "copy_dump", "covers", "key", "load", "read_set",
           "store"]

CACHE_ENV = "TOOLLEDGER_TLC_CACHE"
_VERSION = 3  # 3: module names are read outside comments and strings (2: everywhere)
_WORD = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")
# TLA+ (and cfg) text in pieces: a string, a line comment, a block comment's
# opening or closing, or a run of other text
_PIECE = re.compile(rb'"(?:[^"\\\n]|\\.)*"|\\\*[^\n]*|\(\*|\*\)|[^"\\(*]+|.', re.S)
_PARSED = re.compile(r"^Parsing file (.*)$", re.M)


@dataclass(frozen=True)
class Entry:
    """What a run left in the cache: TLC's output, its exit code, its time."""

    output: str
    exit_code: int
    wall_seconds: float
    command: tuple[str, ...]
    dump: Path | None = None  # the stored state graph (a run with ``-dump``)


def cache_from_env() -> Path | None:
    """The directory named by ``TOOLLEDGER_TLC_CACHE``, or None (no cache)."""
    value = os.environ.get(CACHE_ENV, "").strip()
    return Path(value) if value else None


@lru_cache(maxsize=8)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _digest_of(path: Path) -> str:
    st = path.stat()
    return _file_digest(str(path.resolve()), st.st_size, st.st_mtime_ns)


def code_words(text: bytes) -> set[str]:
    """The words of ``text`` outside its comments (``\\*`` to the end of the
    line, ``(* ... *)``, nested) and strings: where a module name can be."""
    words: set[str] = set()
    depth = 0
    for m in _PIECE.finditer(text):
        piece = m.group()
        if piece == b"(*":
            depth += 1
        elif piece == b"*)" and depth:
            depth -= 1
        elif not depth and not piece.startswith((b'"', b"\\*")):
            words.update(w.decode() for w in _WORD.findall(piece))
    return words


@lru_cache(maxsize=512)
def _module_words(path: str, size: int, mtime_ns: int) -> frozenset[str]:
    return frozenset(code_words(Path(path).read_bytes()))


def read_set(module: str, cfg_text: bytes, files: Mapping[str, Path]) -> list[str]:
    """The names (``X.tla``) of ``files`` a run of ``module`` with this cfg can
    read: ``module``, every module whose name is a word of the code of the
    cfg or of a module already in the set (EXTENDS, INSTANCE, a cfg's
    ``<-[M]``; a name in a comment or a string does not count), transitively."""
    by_stem = {Path(name).stem: name for name in files}
    todo, seen = [module, *code_words(cfg_text)], set()
    while todo:
        stem = todo.pop()
        if stem in seen or stem not in by_stem:
            continue
        seen.add(stem)
        path = files[by_stem[stem]]
        st = path.stat()
        todo += _module_words(str(path.resolve()), st.st_size, st.st_mtime_ns)
    return sorted(by_stem[s] for s in seen)


def covers(module: str, cfg_text: bytes, files: Mapping[str, Path], output: str) -> bool:
    """Every one of ``files`` that TLC's ``output`` shows SANY parsing is in
    the :func:`read_set`: the key covered every input of the run.  (A run
    that read another would be kept under a key blind to it: it is not kept.)"""
    parsed = {Path(f.strip()).name for f in _PARSED.findall(output)}
    return parsed & set(files) <= set(read_set(module, cfg_text, files))


def key(*, module: str, cfg: Path, files: Mapping[str, Path], options: Sequence[str],
        jar: Path, java: str, java_major: int) -> str:
    """The digest of everything a TLC run reads (see the module doc)."""
    h = hashlib.sha256()
    head = {"v": _VERSION, "module": module, "cfg": cfg.name, "options": list(options),
            "jar": _digest_of(jar), "java": str(Path(java).resolve()), "java_major": java_major}
    h.update(json.dumps(head, sort_keys=True).encode())
    cfg_text = cfg.read_bytes()
    h.update(b"\0cfg\0" + cfg_text)
    for name in read_set(module, cfg_text, files):
        h.update(f"\0file\0{name}\0".encode() + hashlib.sha256(files[name].read_bytes()).digest())
    return h.hexdigest()


def _path(directory: Path, digest: str) -> Path:
    return directory / digest[:2] / f"{digest}.json"


def _dump_path(directory: Path, digest: str) -> Path:
    return directory / digest[:2] / f"{digest}.dot"


def load(directory: Path, digest: str) -> Entry | None:
    """The entry for ``digest``, or None (absent, unreadable or of another version)."""
    try:
        data = json.loads(_path(directory, digest).read_text(encoding="utf-8"))
        if data.get("v") != _VERSION or data.get("key") != digest:
            return None
        dump = None
        if data.get("dump_size") is not None:
            dump = _dump_path(directory, digest)
            if dump.stat().st_size != int(data["dump_size"]):
                return None
        return Entry(output=str(data["output"]), exit_code=int(data["exit_code"]),
                     wall_seconds=float(data["wall_seconds"]),
                     command=tuple(str(c) for c in data["command"]), dump=dump)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _atomic(target: Path, write: Callable[[Path], object]) -> None:
    """``write`` a temporary file next to ``target``, then rename it there."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=target.suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def store(directory: Path, digest: str, entry: Entry) -> None:
    """Write the entry (and a copy of ``entry.dump``) atomically; a cache
    that cannot be written is skipped."""
    target = _path(directory, digest)
    data: dict[str, object] = {
        "v": _VERSION, "key": digest, "output": entry.output, "exit_code": entry.exit_code,
        "wall_seconds": entry.wall_seconds, "command": list(entry.command)}
    try:
        if entry.dump is not None:
            source = entry.dump
            _atomic(_dump_path(directory, digest), lambda tmp: shutil.copyfile(source, tmp))
            data["dump_size"] = _dump_path(directory, digest).stat().st_size
        _atomic(target, lambda tmp: tmp.write_text(json.dumps(data), encoding="utf-8"))
    except OSError:
        return


def copy_dump(entry: Entry, to: Path) -> bool:
    """Copy the entry's stored state graph to ``to`` (atomically); False if
    the entry has none or the copy failed (the caller then runs TLC)."""
    if entry.dump is None:
        return False
    source = entry.dump
    try:
        _atomic(to, lambda tmp: shutil.copyfile(source, tmp))
    except OSError:
        return False
    return True
