"""``toolledger check --quick``: only the rows that exercise what a change touches.

The table of what each model exercises is generated, never hand-written:
``toolledger exercises`` runs every CI model once with TLC's ``-coverage``
and writes ``model/exercises.json`` (and ``docs/exercises.md``, its
readable form): per model, the actions TLC took at least once, the
invariants and properties its ``.cfg`` checks, and every top-level
definition of a ``.tla`` file that TLC evaluated while checking it.

``--quick`` reads ``git diff HEAD`` (the working tree against the last
commit) of ``spec/``, ``model/`` and ``reference/``:

- a changed line of a ``.tla`` file is mapped to the top-level definition
  it lies in (in the old and in the new text); the models that evaluated
  that definition exercise the change;
- a changed ``.cfg`` or ``MC*.tla`` selects the models that use it;
- a changed line of the reference's core (``reference/toolledger/_core``)
  is mapped to the function it lies in, and that function to the spec
  actions whose handler (``@_handles(Action.X)`` in ``protocol.py``) calls
  it, directly or through other functions of the core
  (:func:`reference_actions`); the conformance rows that take those actions
  exercise the change.  A change no handler reaches (a constant, the
  checker's own ``check/`` code) selects conformance rows that together take
  every action the conformance models take;
- a changed invariant or property selects the twins that expect it to be
  violated (a weakened invariant is seen only there: the models that must
  pass still pass) and the cheapest must-pass model that checks it.

Within a budget of estimated CPU seconds (:func:`toolledger.cli.job_cost`),
every touched definition gets its cheapest must-pass model first, then the
others are added, must-pass models first, cheapest first. What is left
out is said, so that the answer is never mistaken for the full check
(docs/maintaining.md).
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "TABLE",
    "Selection",
    "changed_lines",
    "coverage_of",
    "definitions",
    "exercised_definitions",
    "load_table",
    "markdown",
    "python_units",
    "reference_actions",
    "select",
    "touched",
]

TABLE = Path("model") / "exercises.json"
DOC = Path("docs") / "exercises.md"

# A top-level definition starts at column 0: `Name ==`, `Name(a, b) ==`, or
# `Name[x \in S] ==`; `LOCAL`/`RECURSIVE` prefixes are allowed.
_DEF_RE = re.compile(
    r"^(?:LOCAL\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*(?:\([^)]*\)|\[[^\]]*\])?\s*==", re.M)
# TLC's coverage records: `line A, col x to line B, col y of module M: count`
# (and `<Name line ...>: distinct:total` for an action).
# (an action's header may name its body's span: `of module M (497 5 508 24)>`)
_COVER_RE = re.compile(r"line (\d+), col \d+ to line (\d+), col \d+ of module (\w+)"
                       r"(?: \([\d ]+\))?>?: (\d+)(?::(\d+))?")
_ACTION_RE = re.compile(r"^<(\w+) line \d+, col \d+ to line \d+, col \d+ of module \w+"
                        r"(?: \([\d ]+\))?>: (\d+):(\d+)", re.M)
_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", re.M)


def definitions(text: str) -> list[tuple[str, int, int]]:
    """The top-level definitions of a ``.tla`` text: ``(name, first line, last line)``
    (1-based; a definition runs to the line before the next one)."""
    starts = [(m.group(1), text.count("\n", 0, m.start()) + 1) for m in _DEF_RE.finditer(text)]
    last = text.count("\n") + 1
    return [(name, line, (starts[i + 1][1] - 1) if i + 1 < len(starts) else last)
            for i, (name, line) in enumerate(starts)]


def _def_at(defs: Sequence[tuple[str, int, int]], line: int) -> str | None:
    for name, first, last in defs:
        if first <= line <= last:
            return name
    return None


def coverage_of(output: str) -> tuple[set[str], dict[str, set[int]]]:
    """From TLC's ``-coverage`` output: the actions taken at least once, and per
    module the first lines of the expressions evaluated at least once."""
    actions = {m.group(1) for m in _ACTION_RE.finditer(output) if int(m.group(3)) > 0}
    lines: dict[str, set[int]] = {}
    for m in _COVER_RE.finditer(output):
        count = int(m.group(5) if m.group(5) is not None else m.group(4))
        if count > 0:
            lines.setdefault(m.group(3), set()).add(int(m.group(1)))
    return actions, lines


def exercised_definitions(lines: Mapping[str, set[int]],
                          texts: Mapping[str, str]) -> dict[str, list[str]]:
    """Per module (whose text is in ``texts``), the definitions with an evaluated line."""
    out: dict[str, list[str]] = {}
    for module, text in texts.items():
        defs = definitions(text)
        names = {_def_at(defs, ln) for ln in lines.get(module, ())}
        names.discard(None)
        if names:
            out[module] = sorted(n for n in names if n is not None)
    return out


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def load_table(root: Path) -> dict[str, object] | None:
    path = root / TABLE
    if not path.is_file():
        return None
    data: dict[str, object] = json.loads(path.read_text(encoding="utf-8"))
    return data


# ---------------------------------------------------------------------------
# What a change touches


def _git(root: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip() or f"git {' '.join(args)} failed")
    return proc.stdout


def changed_lines(diff: str) -> dict[str, tuple[list[tuple[int, int]], list[tuple[int, int]]]]:
    """Per file of a ``git diff -U0``: the changed line ranges of the old and of
    the new text (a pure insertion or deletion is the line next to it)."""
    out: dict[str, tuple[list[tuple[int, int]], list[tuple[int, int]]]] = {}
    current: str | None = None
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            current = line.split(" b/", 1)[1] if " b/" in line else None
            if current is not None:
                out.setdefault(current, ([], []))
        elif line.startswith("@@") and current is not None:
            m = _HUNK_RE.match(line)
            if m is None:
                continue
            a, alen, b, blen = (int(m.group(1)), int(m.group(2) or 1), int(m.group(3)),
                                int(m.group(4) or 1))
            old, new = out[current]
            old.append((a, a + max(alen, 1) - 1) if alen else (max(a, 1), max(a, 1)))
            new.append((b, b + max(blen, 1) - 1) if blen else (max(b, 1), max(b, 1)))
    return out


@dataclass
class Touched:
    """What a diff touches: definitions per module, model files, the reference."""

    definitions: dict[str, set[str]] = field(default_factory=dict)  # module -> names
    model_files: set[str] = field(default_factory=set)  # model/<file> names
    reference: list[str] = field(default_factory=list)  # changed files under reference/
    # reference path -> the functions its changed lines lie in (None: a line outside any)
    reference_units: dict[str, set[str | None]] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.definitions or self.model_files or self.reference)


def touched(root: Path, diff: str | None = None,
            old_text: Callable[[str], str] | None = None) -> Touched:
    """What ``git diff HEAD`` (or ``diff``) of spec/, model/ and reference/ touches."""
    if diff is None:
        diff = _git(root, "diff", "-U0", "--no-color", "HEAD", "--", "spec", "model",
                    "reference")
        untracked = _git(root, "ls-files", "--others", "--exclude-standard", "--",
                         "spec", "model", "reference").split()
    else:
        untracked = []

    def head_text(path: str) -> str:
        if old_text is not None:
            return old_text(path)
        try:
            return _git(root, "show", f"HEAD:{path}")
        except RuntimeError:
            return ""  # a file new in the working tree

    out = Touched()
    for path, (old, new) in changed_lines(diff).items():
        out.files.append(path)
        p = Path(path)
        if p.parts[0] == "reference":
            if p.suffix == ".py":
                out.reference.append(path)
                units = out.reference_units.setdefault(path, set())
                for text, ranges in ((head_text(path), old), (_read(root / path), new)):
                    spans = [(name, first, last) for name, first, last, _, _ in
                             python_units(text)]
                    for first, last in ranges:
                        for ln in range(first, last + 1):
                            units.add(_def_at(spans, ln))
            continue
        if p.parts[0] == "model" and (p.suffix == ".cfg" or p.name.startswith("MC")):
            out.model_files.add(p.name)
        if p.suffix != ".tla":
            continue
        module = p.stem
        names = out.definitions.setdefault(module, set())
        for text, ranges in ((head_text(path), old), (_read(root / path), new)):
            defs = definitions(text)
            for first, last in ranges:
                for ln in range(first, last + 1):
                    name = _def_at(defs, ln)
                    if name is not None:
                        names.add(name)
        if not names:
            out.definitions.pop(module)
    for path in untracked:
        out.files.append(path)
        p = Path(path)
        if p.parts[0] == "reference" and p.suffix == ".py":
            out.reference.append(path)
            out.reference_units[path] = {None}  # a new file: no handler is known to reach it
        elif p.parts[0] == "model" and (p.suffix == ".cfg" or p.name.startswith("MC")):
            out.model_files.add(p.name)
    return out


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""  # deleted in the working tree


CORE = Path("reference") / "toolledger" / "_core"


def python_units(text: str) -> list[tuple[str, int, int, set[str], str | None]]:
    """The top-level functions and classes of a Python text: ``(name, first line,
    last line, the names it refers to, the spec action it handles)``; the
    action is ``X`` of a ``@_handles(Action.X)`` decorator (protocol.py), the
    first line that of the first decorator.  A text that does not parse has none."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    out: list[tuple[str, int, int, set[str], str | None]] = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        action = None
        for d in node.decorator_list:
            if (isinstance(d, ast.Call) and isinstance(d.func, ast.Name)
                    and d.func.id == "_handles" and d.args
                    and isinstance(d.args[0], ast.Attribute)):
                action = d.args[0].attr
        out.append((node.name, first, node.end_lineno or first, _names(node), action))
    for node in tree.body:  # a module-level constant (a table of stages, say)
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    out.append((t.id, node.lineno, node.end_lineno or node.lineno,
                                _names(node), None))
    return sorted(out, key=lambda u: u[1])


def _names(node: ast.AST) -> set[str]:
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    return names | {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def reference_actions(root: Path, functions: Iterable[str]) -> dict[str, set[str]]:
    """Per changed function (or class) of the core, the spec actions whose
    handler reaches it: the handler is it, or refers to it by name, directly or
    through other functions and classes of ``reference/toolledger/_core``
    (by name, so a name defined twice counts for both: more rows, never fewer).
    A function no handler reaches maps to an empty set."""
    refers: dict[str, set[str]] = {}
    handles: dict[str, set[str]] = {}
    for path in sorted((root / CORE).glob("*.py")):
        for name, _first, _last, names, action in python_units(_read(path)):
            refers.setdefault(name, set()).update(names - {name})
            if action is not None:
                handles.setdefault(name, set()).add(action)
    out: dict[str, set[str]] = {}
    for fn in functions:
        reached: set[str] = set()
        todo, seen = [fn], {fn}
        while todo:  # the units that refer to what is reached, transitively
            cur = todo.pop()
            reached |= handles.get(cur, set())
            for unit, names in refers.items():
                if cur in names and unit not in seen:
                    seen.add(unit)
                    todo.append(unit)
        out[fn] = reached
    return out


# ---------------------------------------------------------------------------
# Which rows to run


@dataclass
class Selection:
    """The rows ``--quick`` runs, and why."""

    models: list[str]
    conformance: list[str]
    reasons: list[str]  # one line each: what was touched and what covers it
    uncovered: list[str]  # touched definitions no model evaluated (in the table)
    left_out: int  # models that exercise the change but did not fit the budget
    cost: float


def select(
    table: Mapping[str, object],
    change: Touched,
    *,
    cost: Callable[[str, bool], float],
    ci: Sequence[str],
    conformance_models: Sequence[str],
    module_of: Mapping[str, str],
    cfg_of: Mapping[str, str],
    budget: float,
    must_pass: Iterable[str] = (),
    expects: Mapping[str, str] | None = None,
    reference_actions: Mapping[str, set[str]] | None = None,
) -> Selection:
    """The models (and conformance rows) that exercise ``change``, within ``budget``.

    ``cost(name, with_conformance)``: estimated CPU seconds of a row; ``ci``:
    the models the full check runs (the only candidates); ``module_of`` /
    ``cfg_of``: each model's MC module and ``.cfg`` file name. ``must_pass``:
    the models expected to pass, tried first: they explore their whole state
    space, so a weakened guard breaks an invariant there and a strengthened
    one changes their state count; a twin or probe stops at its first
    violation and sees less (a dropped fence in ExternalApply passed 19 of
    them unnoticed). ``expects``: each model's ``expect`` (``pass``, or the
    invariant a twin must violate): a touched invariant gets its twins.
    ``reference_actions``: per changed function of the reference's core, the
    spec actions that reach it (:func:`reference_actions`); without it, or
    for a change no action reaches, the conformance rows cover every action."""
    models_data = table.get("models", {})
    assert isinstance(models_data, dict)
    exercised: dict[str, dict[str, set[str]]] = {
        name: {mod: set(names) for mod, names in info.get("definitions", {}).items()}
        for name, info in models_data.items() if name in ci
    }
    actions_of: dict[str, set[str]] = {
        name: set(info.get("actions", ())) for name, info in models_data.items() if name in ci
    }
    chosen: list[str] = []
    chosen_conf: list[str] = []
    spent = 0.0
    reasons: list[str] = []

    def take(name: str, conf: bool = False) -> None:
        nonlocal spent
        if conf:
            if name not in chosen_conf:
                chosen_conf.append(name)
                spent += cost(name, True) - (cost(name, False) if name in chosen else 0.0)
                if name not in chosen:
                    chosen.append(name)
        elif name not in chosen:
            chosen.append(name)
            spent += cost(name, False)

    # 1. model files changed: the models that use them, whatever the budget
    for name in ci:
        if (f"{module_of[name]}.tla" in change.model_files
                or cfg_of[name] in change.model_files):
            take(name)
    if chosen:
        reasons.append(f"model files {', '.join(sorted(change.model_files))}: "
                       f"{', '.join(chosen)}")

    # 2. touched definitions: per definition its cheapest model first
    # An action exercises a model that took it at least once (its guard's first
    # conjunct is evaluated in every state of every model, which says nothing);
    # any other definition, a model that evaluated it.
    all_actions = set().union(*actions_of.values()) if actions_of else set()
    passing = set(must_pass)

    def rank(m: str) -> tuple[bool, float]:
        return m not in passing, cost(m, False)

    def users(module: str, def_name: str) -> list[str]:
        if def_name in all_actions:
            return [m for m in exercised if def_name in actions_of[m]]
        return [m for m in exercised if def_name in exercised[m].get(module, ())]

    wanted: dict[tuple[str, str], list[str]] = {}
    uncovered: list[str] = []
    for module, names in sorted(change.definitions.items()):
        for def_name in sorted(names):
            by = sorted(users(module, def_name), key=rank)
            if by:
                wanted[(module, def_name)] = by
            elif not module.startswith("MC"):
                uncovered.append(f"{module}!{def_name}")
    # an invariant or property: the twins that must violate it (they see a
    # weakening: every must-pass model still passes) and a must-pass model
    # that checks it (it sees a strengthening)
    expect = dict(expects or {})
    checked_by: dict[str, list[str]] = {}
    for name, info in models_data.items():
        if name in exercised:
            for inv in (*info.get("invariants", ()), *info.get("properties", ())):
                checked_by.setdefault(inv, []).append(name)
    twins_first: list[str] = []
    for module, names in sorted(change.definitions.items()):
        for def_name in sorted(names):
            if def_name not in checked_by:
                continue
            twins = sorted((m for m in ci if expect.get(m) == def_name and m in exercised),
                           key=lambda m: cost(m, False))
            checkers = sorted((m for m in checked_by[def_name] if m in passing),
                              key=lambda m: cost(m, False))
            wanted[(module, def_name)] = sorted(
                {*wanted.get((module, def_name), ()), *twins, *checkers}, key=rank)
            for m in [*twins[:1], *checkers[:1]]:
                take(m)
            twins_first += [m for m in twins[1:] if m not in twins_first]
            reasons.append(f"{module}!{def_name}: checked by {len(checkers)} must-pass model"
                           f"{'' if len(checkers) == 1 else 's'}, {len(twins)} twin"
                           f"{'' if len(twins) == 1 else 's'} must violate it")
    for (module, def_name), by in wanted.items():
        if not any(m in chosen for m in by):
            take(by[0])
        if def_name in checked_by:
            continue
        how = "taken" if def_name in all_actions else "evaluated"
        reasons.append(f"{module}!{def_name}: {how} by {len(by)} CI model"
                       f"{'' if len(by) == 1 else 's'} (cheapest {by[0]})")
    # a spec change can break conformance: the cheapest conformance model per definition
    conf_ok = [m for m in conformance_models if m in exercised]
    if wanted:
        for (module, def_name), _by in wanted.items():
            conf_by = sorted((m for m in users(module, def_name) if m in conf_ok),
                             key=lambda m: cost(m, True))
            if (conf_by and not any(m in chosen_conf for m in conf_by)
                    and spent + cost(conf_by[0], True) <= budget):
                take(conf_by[0], conf=True)

    # 3. the reference changed: per action that reaches a changed function, its
    # cheapest conformance row; what no action reaches: rows covering every action
    reached: set[str] = set()
    unreached = bool(change.reference)
    if change.reference and reference_actions is not None:
        units = {u for us in change.reference_units.values() for u in us}
        in_core = all(Path(f).parent == CORE for f in change.reference)
        unreached = not in_core or None in units or any(
            not reference_actions.get(u) for u in units if u is not None)
        reached = {a for u in units if u is not None for a in reference_actions.get(u, ())}
        conf_reached: list[str] = []
        for action in sorted(reached):
            by = sorted((m for m in conf_ok if action in actions_of[m]),
                        key=lambda m: cost(m, True))
            if not by:
                unreached = True  # no conformance row takes it: cover them all
                continue
            if not any(m in chosen_conf for m in by):
                take(by[0], conf=True)
            conf_reached += [m for m in by if m not in conf_reached]
        if reached:
            reasons.append(f"the reference's {', '.join(sorted(u for u in units if u))}: "
                           f"reached from {', '.join(sorted(reached))}; conformance of "
                           f"{', '.join(chosen_conf) or 'no model'}")
        for m in sorted(conf_reached, key=lambda m: cost(m, True)):  # the others, in budget
            if m not in chosen_conf and spent + cost(m, True) <= budget:
                take(m, conf=True)
    # and the cover, always: an action is too coarse a unit (the cheapest row
    # taking Recover may hold no reconcile call: ref-decide-reconcile-retries)
    if unreached or change.reference:
        goal = set().union(*(actions_of[m] for m in conf_ok)) if conf_ok else set()
        have: set[str] = set().union(*(actions_of[m] for m in chosen_conf)) if chosen_conf \
            else set()
        while goal - have:
            best = min((m for m in conf_ok if m not in chosen_conf and actions_of[m] - have),
                       key=lambda m: cost(m, True) / len(actions_of[m] - have), default=None)
            if best is None:
                break
            take(best, conf=True)
            have |= actions_of[best]
        reasons.append(f"the reference ({len(change.reference)} file"
                       f"{'' if len(change.reference) == 1 else 's'}): conformance of "
                       f"{', '.join(chosen_conf) or 'no model'} (every action they take: "
                       f"{len(have)} of {len(goal)})")

    # 4. fill the budget: the other models exercising a touched definition, cheapest first
    rest = [m for m in twins_first if m not in chosen] + sorted(
        {m for by in wanted.values() for m in by if m not in chosen and m not in twins_first},
        key=rank)
    left_out = 0
    for m in rest:
        if spent + cost(m, False) <= budget:
            take(m)
        else:
            left_out += 1
    return Selection(models=chosen, conformance=chosen_conf, reasons=reasons,
                     uncovered=uncovered, left_out=left_out, cost=spent)


# ---------------------------------------------------------------------------
# The generated table, readable


def markdown(table: Mapping[str, object]) -> str:
    """``docs/exercises.md``: which model exercises which action and invariant."""
    models = table.get("models", {})
    assert isinstance(models, dict)
    lines = [
        "# Which model exercises which action and invariant",
        "",
        "Generated by `toolledger exercises` from TLC's `-coverage` output of every CI",
        "model (do not edit by hand; `toolledger check --quick` reads",
        "`model/exercises.json`, see [maintaining.md](maintaining.md)). Actions: those",
        "TLC took at least once; invariants and properties: those the model's `.cfg`",
        "checks.",
        "",
    ]
    actions = sorted(set().union(*(set(i.get("actions", ())) for i in models.values())))
    lines += ["## By action", "", "| action | models that take it |", "|---|---|"]
    for a in actions:
        users = [n for n, i in models.items() if a in i.get("actions", ())]
        lines.append(f"| `{a}` | {len(users)}: {', '.join(users)} |")
    invariants = sorted(set().union(*(set(i.get("invariants", ())) | set(i.get("properties", ()))
                                      for i in models.values())))
    lines += ["", "## By invariant or property", "", "| checked | models |", "|---|---|"]
    for inv in invariants:
        users = [n for n, i in models.items()
                 if inv in i.get("invariants", ()) or inv in i.get("properties", ())]
        lines.append(f"| `{inv}` | {len(users)}: {', '.join(users)} |")
    return "\n".join(lines) + "\n"


def table_json(models: Mapping[str, Mapping[str, object]], digests: Mapping[str, str]) -> str:
    return json.dumps({"generated_by": "toolledger exercises", "files": dict(sorted(
        digests.items())), "models": dict(models)}, indent=1, sort_keys=False) + "\n"


def stale_files(root: Path, table: Mapping[str, object]) -> list[str]:
    """The .tla files whose last commit (HEAD, what ``--quick`` diffs against;
    the working tree outside git) differs from the text the table was computed on."""
    files = table.get("files", {})
    assert isinstance(files, dict)
    out = []
    for rel, digest in files.items():
        proc = subprocess.run(["git", "-C", str(root), "show", f"HEAD:{rel}"],
                              capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
        if proc.returncode == 0:
            got = hashlib.sha256(proc.stdout).hexdigest()[:16]
        else:
            path = root / rel
            got = file_digest(path) if path.is_file() else ""
        if got != digest:
            out.append(rel)
    return sorted(out)


def tla_texts(dirs: Iterable[Path]) -> dict[str, str]:
    return {p.stem: p.read_text(encoding="utf-8") for d in dirs for p in sorted(d.glob("*.tla"))}
