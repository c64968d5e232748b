"""Several manifest rows in ONE TLC run: the probes of a model, with or without its own run.

Most rows of ``toolledger check`` are small: a reachability probe (a
``Witness_*`` invariant that TLC must violate, e.g. "an effect was applied and
a later attempt was sent") is found after a few hundred states, and then most
of its time is the JVM's start and SANY's parse (about 1.5 s per run).
Rows that check the same module with the same constants and the same
specification, and differ only in their ``INVARIANTS``, can share one run:

* a **host**: a row that must pass (all its safety invariants hold), whose
  run explores the whole model anyway;
* **probes**: rows whose cfg checks exactly one invariant, the one they
  expect violated.

The batch runs the host's cfg (or, without a host, the first probe's) with
one more invariant, generated into a module that ``EXTENDS`` the model's:
for each probe it notes, once, the first state that violates the probe's
invariant, printing the probe's name and TLC's count of distinct states at
that moment (``TLCGet("distinct")``), and remembers it in a TLC register
(``TLCSet``).  With a host it never fails (the host's own invariants decide
the outcome); without one it fails once every probe was noted, so the run
stops as soon as the last probe is reached.

Why not TLC's ``-continue``: TLC 2.15 with ``-continue`` prints a full
counterexample for EVERY violating state (26,760 of them, 1.5 GB of output,
for the 11 probes of ReconcileReadonly) and reports only the first violated
invariant of each state, so a probe whose states all violate an earlier
probe too is never reported.

Each probe keeps its meaning and its pinned count: TLC's breadth-first
search with one worker visits states in the same order whatever the
invariants are, so the count printed for a probe is exactly the count at
which a run of the probe alone stops (``tests/test_batch.py`` checks that).
A probe the run never notes is reported as not violated (vacuous): its row
drifts, as it would alone.  A batch row has no counterexample trace
(``toolledger check --trace`` runs every row alone).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .manifest import Manifest, ModelEntry
from .tlc import _CFG_KEYWORDS, _CFG_TOKEN_RE, Outcome, TLCResult, parse_cfg, run_tlc

__all__ = ["Batch", "batch_files", "plan", "run_as_check", "split_result"]

_NOTE = "toolledger-probe"
_NOTE_RE = re.compile(r'<<"' + _NOTE + r'", "([^"]+)", (\d+)>>')
_INVARIANT_KEYWORDS = frozenset({"INVARIANT", "INVARIANTS"})


@dataclass(frozen=True)
class Batch:
    """Rows that one TLC run checks: an optional host and its probes."""

    host: ModelEntry | None
    probes: tuple[ModelEntry, ...]
    module: str  # the generated module's name

    @property
    def entries(self) -> tuple[ModelEntry, ...]:
        return ((self.host,) if self.host else ()) + self.probes

    @property
    def name(self) -> str:
        """The run's name in the output: the host's, or the first probe's."""
        first = self.host or self.probes[0]
        return f"{first.name} + {len(self.entries) - 1} probes in one run"

    @property
    def base(self) -> ModelEntry:
        """The row whose cfg the run uses (the host's, else the first probe's)."""
        return self.host or self.probes[0]


def _sections(text: str) -> list[tuple[str, int, int, tuple[str, ...]]]:
    """The cfg's sections: (keyword, start, end, tokens) in file order, comments dropped."""
    out: list[tuple[str, int, int, list[str]]] = []
    for m in _CFG_TOKEN_RE.finditer(text):
        tok = m.group(0)
        if tok.startswith("\\*") or tok.startswith("(*"):
            continue
        if tok in _CFG_KEYWORDS:
            out.append((tok, m.start(), len(text), []))
            if len(out) > 1:
                kw, start, _, toks = out[-2]
                out[-2] = (kw, start, m.start(), toks)
        elif out:
            out[-1][3].append(tok)
    return [(kw, s, e, tuple(t)) for kw, s, e, t in out]


def _body(path: Path) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """What a cfg says apart from its invariants (the key rows must share)."""
    return tuple(
        (kw, toks) for kw, _, _, toks in _sections(path.read_text(encoding="utf-8"))
        if kw not in _INVARIANT_KEYWORDS
    )


def _is_probe(e: ModelEntry) -> bool:
    info = parse_cfg(e.cfg_path)
    return (e.expected_outcome is Outcome.INVARIANT_VIOLATED
            and info.invariants == (e.expect,) and not info.properties)


def _is_host(e: ModelEntry) -> bool:
    return e.expected_outcome is Outcome.PASS


def plan(entries: Sequence[ModelEntry]) -> tuple[list[Batch], list[ModelEntry]]:
    """Group ``entries`` into batches; returns the batches and the rows run alone.

    A batch is a host with at least one probe, or at least two probes, all of
    one module, one deadlock setting, one TLC worker, and cfgs that are equal
    but for their invariants."""
    groups: dict[tuple[object, ...], list[ModelEntry]] = {}
    alone: list[ModelEntry] = []
    for e in entries:
        if e.workers == 1 and (_is_probe(e) or _is_host(e)):
            key = (e.module, e.check_deadlock, _body(e.cfg_path))
            groups.setdefault(key, []).append(e)
        else:
            alone.append(e)
    batches: list[Batch] = []
    for members in groups.values():
        hosts = [e for e in members if _is_host(e)]
        probes = tuple(e for e in members if not _is_host(e))
        host = hosts[0] if hosts else None
        alone.extend(hosts[1:])
        if probes and (host is not None or len(probes) >= 2):
            module = f"TLBatch{len(batches)}_{members[0].module}"
            batches.append(Batch(host, probes, module))
        else:
            alone.extend(members if host is None else [host, *probes])
    order = {e.name: i for i, e in enumerate(entries)}
    alone.sort(key=lambda e: order[e.name])
    return batches, alone


def _module_text(batch: Batch) -> str:
    names = [p.expect for p in batch.probes]
    n = len(names)
    holds = "\n       [] ".join(f"k = {i} -> {name}" for i, name in enumerate(names, 1))
    listed = ", ".join(f'"{p.name}"' for p in batch.probes)
    stop = (
        "TLBatchInvariant == TLBatchNoted"
        if batch.host is not None
        else f"TLBatchInvariant == TLBatchNoted /\\ ~\\A k \\in 1..{n} : TLBatchSeen(k)"
    )
    return f"""---- MODULE {batch.module} ----
(* Generated by toolledger check (toolledger/check/batch.py) for one run:  *)
(* notes the first state that violates each probe's invariant.            *)
EXTENDS {batch.base.module}, TLC
TLBatchRows == <<{listed}>>
TLBatchHolds(k) == CASE {holds}
TLBatchSeen(k) == TLCGet(k) = TRUE
TLBatchNote(k) ==
    IF ~TLBatchSeen(k) /\\ ~TLBatchHolds(k)
    THEN PrintT(<<"{_NOTE}", TLBatchRows[k], TLCGet("distinct")>>) /\\ TLCSet(k, TRUE)
    ELSE TRUE
TLBatchNoted == \\A k \\in 1..{n} : TLBatchNote(k)
{stop}
ASSUME \\A k \\in 1..{n} : TLCSet(k, FALSE)
====
"""


def _cfg_text(batch: Batch) -> str:
    """The base row's cfg with its invariants, then the batch's invariant."""
    text = batch.base.cfg_path.read_text(encoding="utf-8")
    sections = _sections(text)
    invariants: list[str] = []
    for kw, start, end, toks in reversed(sections):
        if kw in _INVARIANT_KEYWORDS:
            invariants[:0] = list(toks)
            text = text[:start] + text[end:]
    if batch.host is None:
        invariants = []  # a probe's own invariant is in the batch's
    listed = "".join(f"    {name}\n" for name in [*invariants, "TLBatchInvariant"])
    return text.rstrip("\n") + f"\nINVARIANTS\n{listed}"


def batch_files(batch: Batch, directory: Path) -> tuple[Path, Path]:
    """Write the batch's module and cfg into ``directory``; returns (module, cfg)."""
    directory.mkdir(parents=True, exist_ok=True)
    tla = directory / f"{batch.module}.tla"
    cfg = directory / f"{batch.module}.cfg"
    tla.write_text(_module_text(batch), encoding="utf-8")
    cfg.write_text(_cfg_text(batch), encoding="utf-8")
    return tla, cfg


def noted(output: str) -> dict[str, int]:
    """Row name -> distinct states when its probe was first violated, from a run's output."""
    found: dict[str, int] = {}
    for m in _NOTE_RE.finditer(output):
        found.setdefault(m.group(1), int(m.group(2)))
    return found


def split_result(batch: Batch, result: TLCResult) -> dict[str, TLCResult]:
    """One result per row of ``batch`` from the run's ``result``."""
    seen = noted(result.output)
    out: dict[str, TLCResult] = {}
    finished = result.outcome is Outcome.PASS or (
        batch.host is None and result.outcome is Outcome.INVARIANT_VIOLATED
        and result.violated == "TLBatchInvariant"
    )
    for probe in batch.probes:
        if probe.name in seen:
            out[probe.name] = replace(
                result, outcome=Outcome.INVARIANT_VIOLATED, violated=probe.expect,
                distinct_states=seen[probe.name], trace=(), error_text="",
            )
        elif finished:
            # the run explored every state (or stopped for the others): vacuous
            out[probe.name] = replace(result, outcome=Outcome.PASS, violated=None, trace=())
        else:
            out[probe.name] = replace(result, distinct_states=None)
    if batch.host is not None:
        out[batch.host.name] = result
    return out


def run_as_check(manifest: Manifest, name: str, where: Path, *, dump_dot: Path | None = None,
                 cache: Path | None = None) -> TLCResult:
    """Row ``name``'s TLC result from the very run the full ``toolledger check``
    makes of it: inside its batch of :func:`plan` over the manifest's check
    rows (the generated files written under ``where``), else alone.

    The inputs are byte for byte those of ``make check``'s run, so with the
    same ``cache`` (:mod:`toolledger.check.tlccache`) that run's answer, and
    its state-graph dump (``dump_dot``; a batch's graph is its host's: the
    batch only adds an invariant that never fails), are reused instead of
    running TLC again."""
    entry = manifest.get(name)
    batches, _ = plan(manifest.check_models())
    batch = next((b for b in batches if any(e.name == name for e in b.entries)), None)
    if batch is None:
        return run_tlc(entry.module, entry.cfg_path, search_dirs=manifest.search_dirs,
                       check_deadlock=entry.check_deadlock, workers=entry.workers,
                       dump_dot=dump_dot, cache=cache, expected_states=entry.distinct_states)
    _, cfg = batch_files(batch, where / batch.module)
    result = run_tlc(batch.module, cfg, search_dirs=[*manifest.search_dirs, where / batch.module],
                     check_deadlock=batch.base.check_deadlock, workers=batch.base.workers,
                     dump_dot=dump_dot, cache=cache, expected_states=batch.base.distinct_states)
    return split_result(batch, result)[name]
