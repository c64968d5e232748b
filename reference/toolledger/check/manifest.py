"""The model manifest: every TLC model of the project, its question and its expected answer.

``model/manifest.toml`` holds one ``[[model]]`` table per model::

    [[model]]
    name = "TwoCalls"                 # unique; what `toolledger check --model` takes
    module = "MCTwoCalls"             # the .tla module TLC runs (in model/ or spec/)
    cfg = "TwoCalls.cfg"              # in model/
    check_deadlock = false            # false: TLC runs with -deadlock (check off)
    ci = true                         # run by `toolledger check`
    expect = "pass"                   # or "deadlock", or the invariant/property to violate
    distinct_states = 105955          # expected; any drift is a failure
    question = "one line: what this model asks"
    conformance = false               # optional (default false)
    conformance_tier = "check"        # optional, with conformance = true: "check"
                                      # (`make check` runs the conformance row) or
                                      # "test" (`make test` runs it; `toolledger
                                      # check --all` runs every row)
    tier = "check"                    # optional, ci models: "check" (`make check`
                                      # runs the TLC row) or "test" (an exhaustive
                                      # row `make test` runs: tests/test_models.py;
                                      # `toolledger check --all` runs every row)
    workers = 1                       # optional (default 1)
    witnesses = ["AtMostOnceEffect"]  # optional: a broken twin; the invariants
                                      # it shows can fail (expect is one of them)
    antecedent_of = ["LegacyConservative"]  # optional: a reachability probe;
                                      # expect is the Witness_* invariant (the
                                      # negated antecedent) TLC must violate on
                                      # a must-pass model's module
    assumptions = "one engine process per session; 2 crashes, ..."
                                      # what the result rests on: the modelled
                                      # environment and the bounds (required
                                      # for ci models by the tests; docs/models.md's
                                      # "what each model proves" list shows it)

A twin (``witnesses``) proves an invariant can fail: weakening it fails
``make check``.  A probe (``antecedent_of``) proves the situation an
invariant is about is reached: its cfg checks only the ``Witness_*``
invariant, and its module is one a ``ci`` must-pass model runs, so a refactor
that makes the situation unreachable fails ``make check``.

:func:`load_manifest` validates all of it against the files on disk (the
module and cfg exist, ``expect`` names an INVARIANT or PROPERTY of the cfg,
``"deadlock"`` only with ``check_deadlock = true``) and reports every problem
at once, each naming the model and what to change. :func:`drift` compares a
:class:`~toolledger.check.tlc.TLCResult` with an entry.

This module only reads: it must never run TLC and never write the manifest.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .tlc import Outcome, TLCResult, parse_cfg

__all__ = [
    "MANIFEST",
    "Manifest",
    "ManifestError",
    "ModelEntry",
    "drift",
    "find_root",
    "load_manifest",
    "proves_markdown",
    "result_label",
]

MANIFEST = Path("model") / "manifest.toml"
SEARCH_DIRS = ("spec", "model")

# key -> (type, required). Add a key here to allow it in the manifest.
_FIELDS: dict[str, tuple[type, bool]] = {
    "name": (str, True),
    "module": (str, True),
    "cfg": (str, True),
    "check_deadlock": (bool, True),
    "ci": (bool, True),
    "expect": (str, True),
    "distinct_states": (int, True),
    "question": (str, True),
    "conformance": (bool, False),
    "conformance_tier": (str, False),
    "tier": (str, False),
    "workers": (int, False),
    "witnesses": (list, False),
    "antecedent_of": (list, False),
    "assumptions": (str, False),
}
WITNESS_PREFIX = "Witness_"
# "check": `make check` (toolledger check) runs the conformance row; "test":
# `make test` does (toolledger check --all runs every row)
CONFORMANCE_TIERS = ("check", "test")
# the same for a model's TLC row (`tier`): every CI run checks both tiers
TIERS = CONFORMANCE_TIERS
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+\Z")
_MODULE_RE = re.compile(r"[A-Za-z0-9_]+\Z")


class ManifestError(ValueError):
    """The manifest is missing or invalid; the message lists every problem and its fix."""


@dataclass(frozen=True)
class ModelEntry:
    """One ``[[model]]`` of the manifest, validated, with resolved paths."""

    name: str
    module: str
    cfg: str
    check_deadlock: bool
    ci: bool
    expect: str
    distinct_states: int
    question: str
    conformance: bool
    workers: int
    cfg_path: Path
    expected_outcome: Outcome
    witnesses: tuple[str, ...] = ()
    antecedent_of: tuple[str, ...] = ()
    assumptions: str = ""
    # who runs the conformance row: "check" (`make check`) or "test" (`make test`)
    conformance_tier: str = "check"
    # who runs the TLC row: "check" (`make check`) or "test" (`make test`)
    tier: str = "check"

    @property
    def expected_violation(self) -> str | None:
        """The invariant/property that must be violated, if any."""
        if self.expected_outcome in (Outcome.INVARIANT_VIOLATED, Outcome.PROPERTY_VIOLATED):
            return self.expect
        return None


@dataclass(frozen=True)
class Manifest:
    """All models of a project, in manifest order."""

    root: Path
    models: tuple[ModelEntry, ...]

    @property
    def path(self) -> Path:
        return self.root / MANIFEST

    @property
    def search_dirs(self) -> list[Path]:
        """The directories whose ``.tla`` files TLC needs: ``spec/`` and ``model/``."""
        return [self.root / d for d in SEARCH_DIRS if (self.root / d).is_dir()]

    def names(self) -> list[str]:
        return [m.name for m in self.models]

    def ci_models(self) -> list[ModelEntry]:
        return [m for m in self.models if m.ci]

    def check_models(self) -> list[ModelEntry]:
        """The CI rows `make check` runs (``tier = "check"``); the others are
        `make test`'s (tests/test_models.py) and ``toolledger check --all``'s."""
        return [m for m in self.models if m.ci and m.tier == "check"]

    def get(self, name: str) -> ModelEntry:
        """The model called ``name``; ``KeyError`` listing the valid names otherwise."""
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(f"no model named {name!r}; the models are: {', '.join(self.names())}")


def find_root(start: Path | None = None) -> Path:
    """The nearest directory at or above ``start`` (default: cwd) with ``model/manifest.toml``."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / MANIFEST).is_file():
            return d
    raise ManifestError(
        f"no {MANIFEST} in {here} or any parent directory: run from inside the "
        "project, or pass --root"
    )


def _suggest(key: str, valid: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(valid), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _type_name(t: type) -> str:
    return {str: "a string", bool: "true or false", int: "an integer",
            list: "a list of invariant names"}[t]


def load_manifest(root: Path) -> Manifest:
    """Read and validate ``root/model/manifest.toml``.

    Raises :class:`ManifestError` listing every problem found, not just the first.
    """
    root = Path(root)
    path = root / MANIFEST
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(
            f"{path} does not exist: create it (see toolledger.check.manifest)"
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise ManifestError(f"{path} is not valid TOML: {e}") from None

    problems: list[str] = []
    extra = sorted(set(data) - {"model"})
    if extra:
        problems.append(
            f"unknown top-level key(s) {', '.join(extra)}: only [[model]] tables are allowed"
        )
    tables = data.get("model", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ManifestError(f"{path}: 'model' must be an array of tables, written [[model]]")
    if not tables:
        problems.append("no [[model]] tables: add at least one model")

    models: list[ModelEntry] = []
    seen: dict[str, int] = {}
    for number, table in enumerate(tables, 1):
        name = table.get("name")
        where = f"model {name!r}" if isinstance(name, str) and name else f"[[model]] #{number}"
        entry = _validate(root, table, where, problems)
        if entry is None:
            continue
        if entry.name in seen:
            problems.append(
                f"{where}: the name is also used by [[model]] #{seen[entry.name]}: "
                "names must be unique, rename one"
            )
            continue
        seen[entry.name] = number
        models.append(entry)

    _check_probes(models, problems)
    if problems:
        raise ManifestError(
            f"{path} has {len(problems)} problem(s):\n  - " + "\n  - ".join(problems)
        )
    return Manifest(root=root, models=tuple(models))


def _constants(cfg_path: Path) -> str:
    """The CONSTANTS part of a cfg (everything before SPECIFICATION/INIT), comments dropped."""
    lines = [ln.split("\\*", 1)[0].rstrip() for ln in cfg_path.read_text().splitlines()]
    text = "\n".join(ln for ln in lines if ln.strip())
    return re.split(r"^(?:SPECIFICATION|INIT)\b", text, maxsplit=1, flags=re.MULTILINE)[0]


def _check_probes(models: list[ModelEntry], problems: list[str]) -> None:
    """A probe runs on the module and the constants of a ci must-pass model."""
    passing = [m for m in models if m.ci and m.expect == "pass"]
    for m in models:
        if not m.antecedent_of:
            continue
        same = [p for p in passing if p.module == m.module
                and _constants(p.cfg_path) == _constants(m.cfg_path)]
        if not same:
            problems.append(
                f"model {m.name!r}: a probe must run on a ci must-pass model: no ci model "
                f"with expect = \"pass\" runs module {m.module} with the constants of "
                f"model/{m.cfg}"
            )


def _validate(
    root: Path, table: dict[str, Any], where: str, problems: list[str]
) -> ModelEntry | None:
    before = len(problems)
    for key in table:
        if key not in _FIELDS:
            problems.append(
                f"{where}: unknown key {key!r}{_suggest(key, _FIELDS)}; "
                f"the keys are: {', '.join(_FIELDS)}"
            )
    for key, (typ, required) in _FIELDS.items():
        if key not in table:
            if required:
                problems.append(f"{where}: missing {key!r}: add {key} = <{_type_name(typ)}>")
            continue
        value = table[key]
        if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
            problems.append(f"{where}: {key} = {value!r} must be {_type_name(typ)}")
    if len(problems) > before:
        return None

    name: str = table["name"]
    module: str = table["module"]
    cfg: str = table["cfg"]
    expect: str = table["expect"]
    check_deadlock: bool = table["check_deadlock"]
    distinct: int = table["distinct_states"]
    workers: int = table.get("workers", 1)

    if not _NAME_RE.match(name):
        problems.append(f"{where}: name must be letters, digits, '_', '.' or '-' (no spaces)")
    if not table["question"].strip():
        problems.append(f"{where}: question is empty: say in one line what this model asks")
    if distinct < 1:
        problems.append(f"{where}: distinct_states = {distinct} must be >= 1")
    if workers < 1:
        problems.append(f"{where}: workers = {workers} must be >= 1")

    if not _MODULE_RE.match(module) or module.endswith(".tla"):
        problems.append(f"{where}: module = {module!r} must be a module name, without .tla")
    else:
        found = [d for d in SEARCH_DIRS if (root / d / f"{module}.tla").is_file()]
        if not found:
            problems.append(
                f"{where}: module {module} not found: no {module}.tla in "
                f"{' or '.join(d + '/' for d in SEARCH_DIRS)}"
            )
        elif len(found) > 1:
            problems.append(f"{where}: {module}.tla is in both spec/ and model/: keep one")

    cfg_path = root / "model" / cfg
    outcome: Outcome | None = None
    if not cfg.endswith(".cfg") or "/" in cfg or "\\" in cfg:
        problems.append(f"{where}: cfg = {cfg!r} must be a file name in model/ ending in .cfg")
    elif not cfg_path.is_file():
        problems.append(f"{where}: cfg file model/{cfg} does not exist: create it or fix the name")
    else:
        info = parse_cfg(cfg_path)
        if expect == "pass":
            outcome = Outcome.PASS
        elif expect == "deadlock":
            outcome = Outcome.DEADLOCK
            if not check_deadlock:
                problems.append(
                    f'{where}: expect = "deadlock" needs check_deadlock = true '
                    "(with false TLC never reports a deadlock)"
                )
        elif expect in info.invariants:
            outcome = Outcome.INVARIANT_VIOLATED
        elif expect in info.properties:
            outcome = Outcome.PROPERTY_VIOLATED
        else:
            names = [*info.invariants, *info.properties]
            problems.append(
                f'{where}: expect = {expect!r} is not "pass", "deadlock", or an INVARIANT or '
                f"PROPERTY of model/{cfg}{_suggest(expect, names)}; "
                f"the cfg checks: {', '.join(names) or 'nothing'}"
            )
    witnesses = table.get("witnesses", [])
    antecedents = table.get("antecedent_of", [])
    for key, names in (("witnesses", witnesses), ("antecedent_of", antecedents)):
        if key in table and (not names or not all(isinstance(n, str) and n for n in names)):
            problems.append(f"{where}: {key} must be a non-empty list of invariant names")
    if witnesses and antecedents:
        problems.append(f"{where}: a model is a twin (witnesses) or a probe (antecedent_of), "
                        "not both: split it in two")
    if outcome is not None and witnesses:
        info = parse_cfg(cfg_path)
        for n in witnesses:
            if n not in info.invariants or n.startswith(WITNESS_PREFIX):
                problems.append(f"{where}: witnesses names {n!r}, which is not a safety "
                                f"INVARIANT of model/{cfg}: list only invariants the cfg checks")
        if expect not in witnesses:
            problems.append(f"{where}: a twin must be expected to violate one of its witnesses "
                            f"{witnesses}, not {expect!r}")
    if outcome is not None and antecedents:
        info = parse_cfg(cfg_path)
        if not expect.startswith(WITNESS_PREFIX) or list(info.invariants) != [expect]:
            problems.append(f"{where}: a probe's cfg checks exactly one {WITNESS_PREFIX}* "
                            f"invariant and expects it violated; model/{cfg} checks "
                            f"{', '.join(info.invariants) or 'nothing'}, expect = {expect!r}")
        bad = [n for n in antecedents if n.startswith(WITNESS_PREFIX)]
        if bad:
            problems.append(f"{where}: antecedent_of lists safety invariants, not {bad}")
    tier = table.get("conformance_tier", "check")
    if tier not in CONFORMANCE_TIERS:
        problems.append(f"{where}: conformance_tier = {tier!r} must be one of "
                        f"{', '.join(repr(t) for t in CONFORMANCE_TIERS)}")
    elif "conformance_tier" in table and not table.get("conformance", False):
        problems.append(f"{where}: conformance_tier needs conformance = true: "
                        "remove it or check the model's conformance")
    row_tier = table.get("tier", "check")
    if row_tier not in TIERS:
        problems.append(f"{where}: tier = {row_tier!r} must be one of "
                        f"{', '.join(repr(t) for t in TIERS)}")
    elif row_tier != "check" and not table.get("ci", False):
        problems.append(f"{where}: tier needs ci = true (only CI rows are run by a tier): "
                        "remove it or set ci = true")
    elif row_tier == "test" and tier == "check" and table.get("conformance", False):
        problems.append(f"{where}: tier = \"test\" with a conformance row make check runs: "
                        "the row's graph comes from its TLC run; set conformance_tier = \"test\"")
    if len(problems) > before or outcome is None:
        return None
    return ModelEntry(
        name=name,
        module=module,
        cfg=cfg,
        check_deadlock=check_deadlock,
        ci=table["ci"],
        expect=expect,
        distinct_states=distinct,
        question=table["question"],
        conformance=table.get("conformance", False),
        workers=workers,
        cfg_path=cfg_path,
        expected_outcome=outcome,
        witnesses=tuple(witnesses),
        antecedent_of=tuple(antecedents),
        assumptions=table.get("assumptions", "").strip(),
        conformance_tier=tier,
        tier=row_tier,
    )


# ----------------------------------------------------------------------------
# Comparing a run with its entry.


def result_label(result: TLCResult) -> str:
    """What TLC found, in the same vocabulary as ``expect``."""
    o = result.outcome
    if o is Outcome.PASS:
        return "pass"
    if o is Outcome.DEADLOCK:
        return "deadlock"
    if o in (Outcome.INVARIANT_VIOLATED, Outcome.PROPERTY_VIOLATED):
        kind = "invariant" if o is Outcome.INVARIANT_VIOLATED else "property"
        return result.violated or f"<unnamed {kind}>"
    return str(o.value).replace("_", "-")


def drift(entry: ModelEntry, result: TLCResult) -> list[str]:
    """Why ``result`` does not match ``entry`` (empty if it matches)."""
    reasons: list[str] = []
    got = result_label(result)
    if result.outcome is Outcome.PROPERTY_VIOLATED and result.violated is None:
        reasons.append(
            f"expected {entry.expect}, got a temporal violation TLC 2.15 does not name: "
            f"list only {entry.expect} under PROPERTY in model/{entry.cfg}"
        )
    elif result.outcome is not entry.expected_outcome or (
        entry.expected_violation is not None and result.violated != entry.expect
    ):
        reasons.append(f"expected {entry.expect}, got {got}")
    if result.distinct_states != entry.distinct_states:
        reasons.append(
            f"expected {entry.distinct_states} distinct states, got {result.distinct_states}"
        )
    return reasons


def markdown_table(manifest: Manifest) -> str:
    """docs/models.md's table of models, generated from the manifest (so it can't drift)."""
    lines = [
        "| model | question | expected | distinct states | in CI | conformance |",
        "| --- | --- | --- | ---: | :---: | :---: |",
    ]
    for m in manifest.models:
        expect = "pass" if m.expect == "pass" else f"violates `{m.expect}`"
        conform = "" if not m.conformance else (
            "yes" if m.conformance_tier == "check" else "in `make test`")
        lines.append(
            f"| `{m.name}` | {m.question} | {expect} | {m.distinct_states:,} | "
            f"{_in_ci(m)} | {conform} |"
        )
    return "\n".join(lines)


def _in_ci(m: ModelEntry) -> str:
    if not m.ci:
        return "no"
    return "yes" if m.tier == "check" else "in `make test`"


def _names(names: Iterable[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def proves_markdown(manifest: Manifest) -> str:
    """docs/models.md's list of what each model proves and under which assumptions,
    generated from the manifest (its ``expect``, ``witnesses``,
    ``antecedent_of``, the cfg's invariants and properties, ``assumptions``)."""
    lines = []
    for m in manifest.models:
        info = parse_cfg(m.cfg_path)
        states = f"{m.distinct_states:,} states"
        if m.expected_outcome is Outcome.PASS:
            checked = [n for n in info.invariants if n != "TypeOK"]
            what = "holds" if len(checked) + len(info.properties) == 1 else "hold"
            proves = (f"{_names([*checked, *info.properties])} {what} in every reachable "
                      f"state and behaviour ({states})")
        elif m.antecedent_of:
            proves = (f"the situation {_names(m.antecedent_of)} "
                      f"{'is' if len(m.antecedent_of) == 1 else 'are'} about is reached: "
                      f"`{m.expect}` is violated after {states}")
        elif m.witnesses:
            proves = (f"{_names(m.witnesses)} can fail: a spec with this one mistake "
                      f"violates `{m.expect}` ({states})")
        elif m.expect.startswith(WITNESS_PREFIX):
            proves = (f"the state `{m.expect}` negates is reached: it is violated "
                      f"after {states}")
        else:
            proves = f"`{m.expect}` fails for this design or environment ({states})"
        where = "" if m.ci else " (not in CI)"
        q = m.question.strip()
        q = q if q.endswith(("?", ".", "!")) else q + "."
        lines.append(f"- **`{m.name}`**{where}: {q} Proves: {proves}. "
                     f"Assumes: {m.assumptions or 'not stated'}.")
    return "\n".join(lines)
