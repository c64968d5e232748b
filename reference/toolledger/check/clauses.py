"""Clause-level twins: every clause of every invariant is shown to matter.

A twin (``witnesses`` in ``model/manifest.toml``) shows that an invariant can
fail; it does not show that each of its clauses can.  An invariant written
``A => (B \\/ C /\\ D)`` could lose ``D`` and its twin still fail through
``B``: the weakened invariant proves less and nothing notices.  So each
*clause* of an invariant (a leaf of its ``/\\``, ``\\/`` and ``=>`` structure,
read from the spec text by :func:`clauses`) is paired, in
``model/clauses.toml``, with a ci twin that violates the invariant *only
through that clause*: with the clause replaced by ``TRUE`` (``FALSE`` in an
antecedent, i.e. weakened) the twin's whole state space satisfies the
weakened invariant, so deleting the clause in the spec flips that twin's
row in ``toolledger check`` from "violated" to "pass" (a drift).  An entry
may weaken a clause by a stated replacement instead (``weakened``: e.g.
``<>`` for ``<>[]``, or a case exempted), and a clause no twin isolates
names the reason instead of a twin.

Action guards can be listed too (``operator`` an action, ``kind = "guard"``):
then deleting the guard must make its ``twin`` (any ci row) drift.

Quantifier bounds (``kind = "bound"``, :func:`bounds`): ``\\A x \\in S : P``
is ``\\A x : x \\in S => P``, so narrowing ``S`` weakens the invariant as
deleting a clause does.  Every ``\\A`` the clause reader descends through
has its bound (``clause = "x \\in S"``) listed twice, once per narrowing an
off-by-one of a loop over ``S`` makes (``weakened``): ``"rest"``, every value
but the first (TLC's ``CHOOSE`` of ``S`` in each state), and ``"first"``, the
first value alone.  A twin kills a narrowing as it kills a clause: its
violations all lie in what the narrowing drops, so with it the twin passes.

``tests/test_model_coverage.py`` checks that every clause of the spec has an
entry naming a ci twin of that invariant (no TLC).  :func:`run_kills` (``python
-m toolledger.check.clauses``; ``tests/test_clause_kills.py`` for issue 28's
survivors) proves each entry: per twin ONE TLC run (:func:`kill_files`) notes
every weakened invariant the twin's states violate, and an entry is killed
when its weakened invariant holds there while the full one fails (a
``kill = "drift"`` entry: when the twin's first violation satisfies it).  See
docs/models.md (clause-level twins).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .batch import _INVARIANT_KEYWORDS, _sections
from .manifest import Manifest, ModelEntry, drift, result_label
from .tlc import Outcome, run_tlc

__all__ = [
    "CLAUSES",
    "Clause",
    "ClauseEntry",
    "ClauseError",
    "Kill",
    "bounds",
    "clauses",
    "definition",
    "kill_files",
    "load_clauses",
    "noted",
    "run_kills",
    "weakened_text",
]

CLAUSES = Path("model") / "clauses.toml"
_NOTE = "toolledger-clause"
_NOTE_RE = re.compile(r'<<"' + _NOTE + r'", (\d+)>>')
_FIELDS = {"spec", "operator", "clause", "occurrence", "weakened", "twin", "reason", "kind",
           "kill"}
_KINDS = ("invariant", "property", "guard", "bound")
# A bound's two narrowings (``weakened`` of a ``kind = "bound"`` entry): the
# off-by-ones of a loop over the domain, "rest" (every value but the first:
# the default) and "first" (the first value alone); "first" is TLC's CHOOSE
# of the domain, in each state.
_NARROWINGS = {
    "rest": "(LET TLDomain == ({dom}) IN IF TLDomain = {{}} THEN TLDomain "
            "ELSE TLDomain \\ {{CHOOSE TLValue \\in TLDomain : TRUE}})",
    "first": "(LET TLDomain == ({dom}) IN IF TLDomain = {{}} THEN TLDomain "
             "ELSE {{CHOOSE TLValue \\in TLDomain : TRUE}})",
}
# "pass": with the clause weakened the twin's whole state space satisfies the
# invariant (its row's outcome flips); "drift": the twin's first violation
# (the row's pinned state) satisfies the weakened invariant, so a run of it
# stops later or passes (its row's count or outcome drifts), for a clause no
# twin violates alone in every state.
_KILLS = ("pass", "drift")


class ClauseError(ValueError):
    """model/clauses.toml or a spec definition is invalid; the message says how to fix it."""


@dataclass(frozen=True)
class Clause:
    """One leaf of a definition: its text (whitespace collapsed), span and polarity."""

    text: str
    start: int  # offsets in the definition's body (see :func:`definition`)
    end: int
    positive: bool  # False: in an antecedent (weakening it means FALSE)
    occurrence: int  # 1 for the first leaf with this text, 2 for the next, ...


@dataclass(frozen=True)
class ClauseEntry:
    """One ``[[clause]]`` of model/clauses.toml."""

    spec: str  # the spec module that defines the operator (spec/<spec>.tla)
    operator: str
    clause: str
    occurrence: int = 1
    weakened: str = ""  # "" : TRUE (positive) or FALSE (antecedent)
    twin: str = ""
    reason: str = ""
    kind: str = "invariant"
    kill: str = "pass"

    @property
    def label(self) -> str:
        occ = f" #{self.occurrence}" if self.occurrence > 1 else ""
        how = f" -> {self.weakened}" if self.weakened else ""
        return f"{self.operator}: {self.clause}{occ}{how}"


# --- reading a definition ---------------------------------------------------

def definition(spec: str, name: str) -> tuple[str, str]:
    """(params, body) of ``name``'s definition in ``spec``: ``params`` is
    ``"(e)"`` or ``""``; ``body`` runs from the line after ``==`` (or the
    rest of that line) to the first blank or unindented line, with ``\\*``
    comments blanked out (offsets are kept)."""
    m = re.search(rf"^{re.escape(name)}(\([^)]*\))? ==[ \t]*", spec, re.MULTILINE)
    if m is None:
        raise ClauseError(f"no definition of {name} in the spec: fix the operator name")
    rest = spec[m.end():]
    lines = rest.split("\n")
    body = [lines[0]]
    for ln in lines[1:]:
        if not ln.strip() or not ln[0].isspace():
            break
        body.append(ln)
    text = "\n".join(body)
    text = re.sub(r"\\\*[^\n]*", lambda x: " " * len(x.group(0)), text)
    return m.group(1) or "", text


_TOKEN_RE = re.compile(
    r'"[^"]*"|<<|>>|/\\|\\/|=>|<=>|\\[AE]\b|\b(?:LET|IN|IF|CHOOSE)\b|[()\[\]{}:]')
_OPEN = {"(": ")", "[": "]", "{": "}", "<<": ">>"}
_CLOSE = {")", "]", "}", ">>"}
_BARRIER = {"\\A", "\\E", "IF", "CHOOSE", "LET"}


def _tokens(body: str, s: int, e: int) -> list[tuple[int, str, int]]:
    """(offset, token, depth) of the structural tokens in body[s:e]."""
    out: list[tuple[int, str, int]] = []
    depth = 0
    for m in _TOKEN_RE.finditer(body, s, e):
        tok = m.group(0)
        if tok in _CLOSE:
            depth -= 1
        out.append((m.start(), tok, depth))
        if tok in _OPEN:
            depth += 1
    return out


def _column(body: str, i: int) -> int:
    return i - (body.rfind("\n", 0, i) + 1)


def _first_on_line(body: str, i: int) -> bool:
    return not body[body.rfind("\n", 0, i) + 1:i].strip()


def _trim(body: str, s: int, e: int) -> tuple[int, int]:
    while s < e and body[s].isspace():
        s += 1
    while e > s and body[e - 1].isspace():
        e -= 1
    while body[s:e].startswith("(") and _matching(body, s, e) == e - 1:
        s, e = _trim(body, s + 1, e - 1)
    return s, e


def _matching(body: str, s: int, e: int) -> int:
    for off, tok, depth in _tokens(body, s, e):
        if tok == ")" and depth == 0:
            return off
    return -1


def _leaves(body: str, s: int, e: int, positive: bool, out: list[tuple[int, int, bool]],
            bounds: list[tuple[int, int, int, bool]] | None = None) -> None:
    """Collect the leaves (clauses) of body[s:e] into ``out``; into ``bounds``,
    each ``\\A x \\in S :`` the walk descends through (binder start, domain
    start, domain end, positive)."""
    s, e = _trim(body, s, e)
    toks = _tokens(body, s, e)
    if not toks:
        out.append((s, e, positive))
        return
    off, tok, _ = toks[0]
    if off == s and tok in ("\\A", "\\E"):
        colon = next(o for o, t, d in toks if t == ":" and d == 0)
        if bounds is not None and tok == "\\A" and positive:
            binder = body[s + 2:colon]
            at = binder.find("\\in")
            if at < 0 or binder.count("\\in") > 1:
                raise ClauseError(f"quantifier {_norm(body[s:colon])}: the clause reader "
                                  "reads one bound per quantifier (x \\in S or x, y \\in S): "
                                  "split it into nested quantifiers")
            bounds.append((s + 2, s + 2 + at + 3, colon, positive))
        _leaves(body, colon + 1, e, positive, out, bounds)
        return
    if off == s and tok == "LET":
        level = 0
        for o, t, d in toks:
            if d == 0 and t == "LET":
                level += 1
            elif d == 0 and t == "IN":
                level -= 1
                if level == 0:
                    _leaves(body, o + 2, e, positive, out, bounds)
                    return
    if off == s and tok in ("/\\", "\\/"):
        col = _column(body, s)
        starts = [s, *(o for o, t, d in toks[1:] if t == tok and d == 0
                       and _column(body, o) == col and _first_on_line(body, o))]
        for a, b in zip(starts, [*starts[1:], e], strict=True):
            _leaves(body, a + 2, b, positive, out, bounds)
        return
    implies = -1
    junctions: list[int] = []
    for o, t, d in toks:
        if d != 0:
            continue
        if t in _BARRIER:
            break
        if t == "=>" and implies < 0:
            implies = o
            break
        if t in ("/\\", "\\/"):
            junctions.append(o)
    if implies >= 0:
        _leaves(body, s, implies, not positive, out, bounds)
        _leaves(body, implies + 2, e, positive, out, bounds)
    elif junctions:
        for a, b in zip([s - 2, *junctions], [*junctions, e], strict=True):
            _leaves(body, a + 2, b, positive, out, bounds)
    else:
        out.append((s, e, positive))


def _norm(text: str) -> str:
    return " ".join(text.split())


def clauses(spec: str, name: str) -> list[Clause]:
    """The clauses (leaves) of ``name``'s definition in ``spec``, in text order."""
    _, body = definition(spec, name)
    spans: list[tuple[int, int, bool]] = []
    _leaves(body, 0, len(body), True, spans)
    seen: dict[str, int] = {}
    out: list[Clause] = []
    for s, e, pos in spans:
        text = _norm(body[s:e])
        seen[text] = seen.get(text, 0) + 1
        out.append(Clause(text, s, e, pos, seen[text]))
    return out


def bounds(spec: str, name: str) -> list[Clause]:
    """The bounds of the ``\\A`` quantifiers of ``name``'s definition that the
    clause reader descends through (those at the head of the definition or
    of one of its ``/\\``, ``\\/``, ``=>`` operands, outside an antecedent):
    each as a Clause whose text is the binder (``c \\in Calls``) and whose
    span is its domain (``Calls``), in text order.  ``\\A x \\in S : P`` is
    ``\\A x : x \\in S => P``, so narrowing S weakens the invariant as
    deleting a clause does; see :data:`_NARROWINGS`."""
    _, body = definition(spec, name)
    found: list[tuple[int, int, int, bool]] = []
    _leaves(body, 0, len(body), True, [], found)
    seen: dict[str, int] = {}
    out: list[Clause] = []
    for b, ds, de, pos in found:
        text = _norm(body[b:de])
        seen[text] = seen.get(text, 0) + 1
        ds, de = _trim(body, ds, de)
        out.append(Clause(text, ds, de, pos, seen[text]))
    return out


def weakened_text(spec: str, entry: ClauseEntry) -> tuple[str, str]:
    """(params, body) of ``entry.operator`` with the entry's clause weakened
    (a bound: its domain narrowed)."""
    params, body = definition(spec, entry.operator)
    if entry.kind == "bound":
        how = entry.weakened or "rest"
        if how not in _NARROWINGS:
            raise ClauseError(f"{entry.label}: a bound's weakened is one of "
                              f"{sorted(_NARROWINGS)} (default rest)")
        for c in bounds(spec, entry.operator):
            if c.text == _norm(entry.clause) and c.occurrence == entry.occurrence:
                new = _NARROWINGS[how].format(dom=body[c.start:c.end])
                return params, body[:c.start] + new + body[c.end:]
        raise ClauseError(
            f"{entry.label}: no such bound in spec/{entry.spec}.tla; its bounds are: "
            + "; ".join(c.text for c in bounds(spec, entry.operator)))
    for c in clauses(spec, entry.operator):
        if c.text == _norm(entry.clause) and c.occurrence == entry.occurrence:
            new = entry.weakened or ("TRUE" if c.positive else "FALSE")
            return params, body[:c.start] + f"({new})" + body[c.end:]
    raise ClauseError(
        f"{entry.label}: no such clause in spec/{entry.spec}.tla; its clauses are: "
        + "; ".join(c.text for c in clauses(spec, entry.operator))
    )


# --- model/clauses.toml -----------------------------------------------------

def load_clauses(root: Path) -> tuple[ClauseEntry, ...]:
    """Read model/clauses.toml, checking each entry's keys and its clause against the spec."""
    path = Path(root) / CLAUSES
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ClauseError(
            f"{path} does not exist: create it (see toolledger.check.clauses)") from None
    except tomllib.TOMLDecodeError as e:
        raise ClauseError(f"{path} is not valid TOML: {e}") from None
    problems: list[str] = []
    entries: list[ClauseEntry] = []
    specs: dict[str, str] = {}
    for i, raw in enumerate(data.get("clause", []), 1):
        where = f"{CLAUSES} clause #{i}"
        bad = set(raw) - _FIELDS
        if bad:
            problems.append(f"{where}: unknown keys {sorted(bad)}; allowed: {sorted(_FIELDS)}")
            continue
        try:
            entry = ClauseEntry(**raw)
        except TypeError as e:
            problems.append(f"{where}: {e}")
            continue
        if entry.kind not in _KINDS:
            problems.append(f"{where}: kind {entry.kind!r} is not one of {_KINDS}")
        if entry.kill not in _KILLS or (
                entry.kill == "drift" and entry.kind not in ("invariant", "bound")):
            problems.append(f"{where}: kill {entry.kill!r} must be one of {_KILLS} "
                            "(\"drift\" only for an invariant or a bound)")
        if bool(entry.twin) == bool(entry.reason):
            problems.append(f"{where} ({entry.label}): give exactly one of twin "
                            "(the ci row that kills it) or reason (why none can)")
        if entry.spec not in specs:
            spec_path = Path(root) / "spec" / f"{entry.spec}.tla"
            if not spec_path.is_file():
                problems.append(f"{where}: spec/{entry.spec}.tla does not exist")
                continue
            specs[entry.spec] = spec_path.read_text(encoding="utf-8")
        try:
            weakened_text(specs[entry.spec], entry)
        except ClauseError as e:
            problems.append(f"{where}: {e}")
        entries.append(entry)
    if problems:
        raise ClauseError("\n".join(problems))
    return tuple(entries)


# --- the kill run -----------------------------------------------------------

def kill_files(
    spec: str, module: str, cfg: Path, entries: Sequence[ClauseEntry], full: str,
    directory: Path, name: str,
) -> tuple[Path, Path]:
    """Write a module and cfg that run ``cfg``'s model (module ``module``) and
    note, once each, the first state violating the full invariant ``full``
    (note 0) and each entry's weakened invariant (note k).  The run never
    fails on them: it explores the twin's whole state space.  Properties
    (``kind = "property"``) are checked by TLC itself instead (one entry)."""
    defs: list[str] = []
    for k, entry in enumerate(entries, 1):
        params, body = weakened_text(spec, entry)
        defs.append(f"TLClause{k}{params} ==\n{body}\n")
    n = len(entries)
    holds = "\n       [] ".join(
        [f"k = 0 -> {full}", *(f"k = {k} -> TLClause{k}" for k in range(1, n + 1))])
    text = f"""---- MODULE {name} ----
(* Generated by toolledger.check.clauses: {full}'s clauses weakened, one *)
(* operator each, on one twin.                                             *)
EXTENDS {module}, TLC
{"".join(defs)}
TLClauseHolds(k) == CASE {holds}
TLClauseNote(k) ==
    IF TLCGet(k + 100) # TRUE /\\ ~TLClauseHolds(k)
    THEN PrintT(<<"{_NOTE}", k>>) /\\ TLCSet(k + 100, TRUE)
    ELSE TRUE
TLClauseNoted == \\A k \\in 0..{n} : TLClauseNote(k)
ASSUME \\A k \\in 0..{n} : TLCSet(k + 100, FALSE)
====
"""
    cfg_text = cfg.read_text(encoding="utf-8")
    props = [e for e in entries if e.kind == "property"]
    for kw, start, end, _ in reversed(_sections(cfg_text)):
        if kw in _INVARIANT_KEYWORDS or (props and kw in ("PROPERTY", "PROPERTIES")):
            cfg_text = cfg_text[:start] + cfg_text[end:]
    if props:
        cfg_text = cfg_text.rstrip("\n") + "\nPROPERTIES\n" + "".join(
            f"    TLClause{k}\n" for k, e in enumerate(entries, 1) if e.kind == "property")
    else:
        cfg_text = cfg_text.rstrip("\n") + "\nINVARIANTS\n    TLClauseNoted\n"
    directory.mkdir(parents=True, exist_ok=True)
    tla_path, cfg_path = directory / f"{name}.tla", directory / f"{name}.cfg"
    tla_path.write_text(text, encoding="utf-8")
    cfg_path.write_text(cfg_text, encoding="utf-8")
    return tla_path, cfg_path


def noted(output: str) -> set[int]:
    """The notes (0: the full invariant, k: entry k weakened) a kill run printed."""
    return {int(m.group(1)) for m in _NOTE_RE.finditer(output)}


@dataclass(frozen=True)
class Kill:
    """What one entry's kill run showed: ``killed`` and, if not, why."""

    entry: ClauseEntry
    killed: bool
    detail: str


def _single_files(spec: str, model: ModelEntry, entry: ClauseEntry,
                  directory: Path, name: str) -> tuple[Path, Path]:
    """A guard: the action overridden without it; a drift entry: the weakened
    invariant checked instead of the full one."""
    params, body = weakened_text(spec, entry)
    text = (f"---- MODULE {name} ----\n(* Generated by toolledger.check.clauses: "
            f"{entry.operator} with one clause weakened. *)\nEXTENDS {model.module}\n"
            f"TLGuard{params} ==\n{body}\n====\n")
    cfg_text = model.cfg_path.read_text(encoding="utf-8")
    if entry.kind == "guard":
        cfg_text = cfg_text.rstrip("\n") + f"\nCONSTANTS\n    {entry.operator} <- TLGuard\n"
    else:
        for kw, start, end, _ in reversed(_sections(cfg_text)):
            if kw in _INVARIANT_KEYWORDS:
                cfg_text = cfg_text[:start] + cfg_text[end:]
        cfg_text = cfg_text.rstrip("\n") + "\nINVARIANTS\n    TLGuard\n"
    directory.mkdir(parents=True, exist_ok=True)
    tla_path, cfg_path = directory / f"{name}.tla", directory / f"{name}.cfg"
    tla_path.write_text(text, encoding="utf-8")
    cfg_path.write_text(cfg_text, encoding="utf-8")
    return tla_path, cfg_path


def _valid_when_weakened(spec: str, entry: ClauseEntry) -> bool:
    """Every clause of the entry's operator weakens it to a valid formula: its
    shape is ``\\A ... : A1 /\\ ... /\\ An => C`` (or ``\\A ... : C``), no
    ``\\/``, no ``\\E``, one positive clause; ``C`` as TRUE, or any ``Ai`` as
    FALSE, leaves TRUE.  So every twin of the operator kills it (its row
    shows the twin violates the operator), with no TLC run."""
    if entry.weakened or entry.kind != "invariant" or entry.kill != "pass":
        return False
    _, body = definition(spec, entry.operator)
    toks = [t for _, t, _ in _tokens(body, 0, len(body))]
    positive = [c for c in clauses(spec, entry.operator) if c.positive]
    return ("\\/" not in toks and "\\E" not in toks and toks.count("=>") <= 1
            and len(positive) == 1)


def run_kills(manifest: Manifest, entries: Sequence[ClauseEntry], directory: Path,
              *, timeout: float | None = 300, jobs: int = 1) -> list[Kill]:
    """Run every entry with a twin: one TLC run per (twin, operator, kind) for
    invariants (all of the twin's clauses noted in one run), one per entry for
    properties and guards.  An invariant clause is killed when the twin's
    states violate the full invariant and none violates the weakened one; a
    property clause when the weakened property holds on the twin (which
    violates the full one: its manifest row); a guard when the twin's row
    drifts with the guard deleted.  ``jobs``: how many TLC runs at once."""
    specs: dict[str, str] = {}
    groups: dict[tuple[str, str, str], list[ClauseEntry]] = {}
    for e in entries:
        if e.twin:
            specs.setdefault(e.spec, (manifest.root / "spec" / f"{e.spec}.tla")
                             .read_text(encoding="utf-8"))
            key = (e.twin, e.operator, "invariant" if e.kind == "bound" else e.kind)
            if e.kind in ("invariant", "bound") and e.kill == "pass":
                groups.setdefault(key, []).append(e)
            else:
                groups[(*key[:2], f"{e.kind}{e.kill}{len(groups)}")] = [e]
    out: list[Kill] = []
    for key, group in list(groups.items()):
        if key[2] == "invariant":
            spec = specs[group[0].spec]
            free = [e for e in group if _valid_when_weakened(spec, e)]
            out.extend(Kill(e, True, f"{e.operator} is A => C: weakened, it is TRUE, "
                            f"and {e.twin} violates it (its row)")
                       for e in free)
            groups[key] = [e for e in group if e not in free]
            if not groups[key]:
                del groups[key]
    def kill_group(n: int, twin: str, operator: str, group: list[ClauseEntry]) -> list[Kill]:
        found: list[Kill] = []
        model = manifest.get(twin)
        spec = specs[group[0].spec]
        name = f"TLClauses{n}_{model.module}"
        single = group[0].kind == "guard" or group[0].kill == "drift"
        if single:
            _, cfg = _single_files(spec, model, group[0], directory, name)
        else:
            _, cfg = kill_files(spec, model.module, model.cfg_path, group, operator,
                                directory, name)
        result = run_tlc(name, cfg, search_dirs=[directory, *manifest.search_dirs],
                         check_deadlock=model.check_deadlock, timeout=timeout,
                         expected_states=model.distinct_states)
        if group[0].kind == "guard":
            drifts = drift(model, result)
            found.append(Kill(group[0], bool(drifts), "; ".join(drifts) or
                            f"{twin} does not drift without the guard ({result_label(result)})"))
            return found
        if single:  # a drift entry: the weakened invariant passes or fails later
            moved = result.outcome is Outcome.PASS or (
                result.outcome is Outcome.INVARIANT_VIOLATED
                and result.distinct_states != model.distinct_states)
            found.append(Kill(group[0], moved, f"{twin} with the clause weakened: "
                            f"{result_label(result)}, {result.distinct_states} states "
                            f"(its row: {model.distinct_states})"))
            return found
        if group[0].kind == "property":
            ok = result.outcome is Outcome.PASS
            found.append(Kill(group[0], ok, f"weakened on {twin}: {result_label(result)}"))
            return found
        seen = noted(result.output)
        if result.outcome is not Outcome.PASS or 0 not in seen:
            why = (f"the kill run on {twin} did not explore its states "
                   f"({result_label(result)})" if result.outcome is not Outcome.PASS
                   else f"{twin} never violates {operator}")
            found.extend(Kill(e, False, why) for e in group)
            return found
        for k, e in enumerate(group, 1):
            found.append(Kill(e, k not in seen, f"{twin} also violates {operator} "
                            "with this clause weakened: it does not isolate it"
                            if k in seen else f"killed by {twin}"))
        return found

    # TLC runs are child processes: threads run `jobs` of them at once
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        done = pool.map(lambda item: kill_group(item[0], item[1][0][0], item[1][0][1],
                                                item[1][1]), enumerate(groups.items()))
        for kills in done:  # in the order of the entries, whatever finishes first
            out.extend(kills)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m toolledger.check.clauses [--jobs N] [NAME ...]``: run the kills of
    model/clauses.toml (all, or those of the operators or spec modules named,
    e.g. ``ConcurrentResumers``) and print the clause table; exit 1 if a
    clause is not killed."""
    import sys
    import tempfile

    from .manifest import find_root, load_manifest

    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(main.__doc__)
        return 0
    jobs = min(2, os.cpu_count() or 1)
    if "--jobs" in args:
        i = args.index("--jobs")
        if i + 1 >= len(args) or not args[i + 1].isdigit() or int(args[i + 1]) < 1:
            print("error: --jobs takes a number of TLC runs at once, e.g. --jobs 2",
                  file=sys.stderr)
            return 2
        jobs = int(args[i + 1])
        del args[i:i + 2]
    root = find_root()
    manifest = load_manifest(root)
    clauses = load_clauses(root)
    known = {e.operator for e in clauses} | {e.spec for e in clauses}
    unknown = [a for a in args if a not in known]
    if unknown:
        print(f"error: {', '.join(unknown)}: no operator or spec module of "
              f"model/clauses.toml has that name; known: {', '.join(sorted(known))}",
              file=sys.stderr)
        return 2
    entries = [e for e in clauses
               if e.twin and (not args or e.operator in args or e.spec in args)]
    with tempfile.TemporaryDirectory(prefix="toolledger-clauses-") as tmp:
        kills = run_kills(manifest, entries, Path(tmp), jobs=jobs)
    for k in kills:
        print(f"{'killed' if k.killed else 'ALIVE '}  {k.entry.twin:24} {k.entry.label}"
              + ("" if k.killed else f"\n        {k.detail}"))
    alive = [k for k in kills if not k.killed]
    print(f"{len(kills) - len(alive)} of {len(kills)} clauses killed")
    return 1 if alive else 0


if __name__ == "__main__":
    raise SystemExit(main())
