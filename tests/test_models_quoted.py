"""What the docs and the models' comments say about models agrees with the manifest.

model/manifest.toml is the truth for every model's name and distinct-state
count (`toolledger check` pins them).  Prose drifts: a model renamed in the
manifest but not in docs/protocol.md, a count quoted in a model's comment
that the late-answer rule made stale.  This test reads:

- every backticked name in docs/protocol.md and docs/models.md: a name that
  is a model's cfg, or is defined nowhere in the spec, the models or the
  Python (so can only be a model's), must be a manifest model;
- the tables of docs/protocol.md with a "model" and a "states" column: the
  models of a row and its counts (``a / b / c``), in order;
- every "N states" (or "Nk states") in a comment of model/*.cfg and
  model/MC*.tla: a count of a manifest model of that cfg or module.  A count
  of a variant the manifest has no row for is listed in NOT_IN_MANIFEST,
  with what it is.
No TLC.
"""

from __future__ import annotations

import io
import re
import tokenize
from functools import cache
from pathlib import Path

from checker_support import ROOT
from toolledger.check.manifest import Manifest, load_manifest

MANIFEST = load_manifest(ROOT)
DOCS = ("docs/protocol.md", "docs/models.md")
# backticked capitalised words of the docs that are not models: notation,
# SQL, an environment variable, another library's name
NOTATION = {"L1", "L2", "Li", "Ln", "WF", "L", "COMMIT", "PYTHONPATH", "RemoveMessage",
            # real APIs' names in docs/protocol.md's table of key answers
            "ClientToken", "IdempotentParameterMismatch",
            "TOOLLEDGER_TLC_CACHE"}  # an environment variable (docs/models.md)
# (file, quoted count) -> what it counts: variants with no manifest row
NOT_IN_MANIFEST = {
    ("MCSameTurn.tla", "130k"): "SameTurn with one crash: a variant outside CI",
}
_COUNT_RE = re.compile(r"(\d[\d,]*)(k?) (?:distinct )?states")
_NAME_RE = re.compile(r"`([A-Z][A-Za-z0-9_]*)`")


@cache
def _defined_names() -> frozenset[str]:
    """Names the spec, the models and the Python define or use in code
    (comments and strings left out: they may name models)."""
    names: set[str] = set()
    for path in [*ROOT.glob("spec/*.tla"), *ROOT.glob("model/*.tla")]:
        text = re.sub(r"\(\*.*?\*\)", " ", path.read_text(encoding="utf-8"), flags=re.S)
        text = re.sub(r'\\\*[^\n]*|"[^"\n]*"', " ", text)
        names |= set(re.findall(r"[A-Za-z_]\w*", text))
    for path in ROOT.glob("reference/**/*.py"):
        src = path.read_text(encoding="utf-8")
        names |= {t.string for t in tokenize.generate_tokens(io.StringIO(src).readline)
                  if t.type == tokenize.NAME}
    return frozenset(names)


def unnamed_models(text: str, manifest: Manifest, defined: frozenset[str]) -> list[str]:
    """Backticked names of ``text`` that can only be models and are not in the manifest."""
    models = set(manifest.names())
    cfgs = {p.stem for p in (manifest.root / "model").glob("*.cfg")}
    return sorted({
        n for n in _NAME_RE.findall(text)
        if n not in models and n not in NOTATION and (n in cfgs or n not in defined)
    })


def table_drift(text: str, manifest: Manifest) -> list[str]:
    """Rows of ``text``'s tables with a model and a states column whose counts
    are not the manifest's."""
    counts = {m.name: m.distinct_states for m in manifest.models}
    problems: list[str] = []
    header: list[str] | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = [c.lower() for c in cells]
            continue
        if "model" not in header or "states" not in header or set(line) <= set("|-: "):
            continue
        names = [n for n in _NAME_RE.findall(cells[header.index("model")]) if n in counts]
        quoted = [int(x.replace(",", "")) for x in
                  re.findall(r"\d[\d,]*", cells[header.index("states")])]
        expected = [counts[n] for n in names]
        if names and quoted != expected:
            problems.append(f"{', '.join(names)}: the table says {quoted}, "
                            f"the manifest {expected}")
    return problems


def _comments(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    return "\n".join([*re.findall(r"\(\*.*?\*\)", text, flags=re.S),
                      *re.findall(r"\\\*[^\n]*", text)])


def comment_drift(path: Path, manifest: Manifest) -> list[str]:
    """Counts quoted in ``path``'s comments that no manifest row of it has."""
    rows = [m for m in manifest.models
            if (path.suffix == ".cfg" and m.cfg == path.name)
            or (path.suffix == ".tla" and m.module == path.stem)]
    have = [m.distinct_states for m in rows]
    problems: list[str] = []
    for number, k in _COUNT_RE.findall(" ".join(_comments(path).split())):
        n = int(number.replace(",", ""))
        ok = any(abs(c - n * 1000) < 1000 for c in have) if k else n in have
        if not ok and (path.name, f"{number}{k}") not in NOT_IN_MANIFEST:
            problems.append(f"model/{path.name} quotes {number}{k} states; its manifest "
                            f"rows {[m.name for m in rows]} have {have}: quote the "
                            "manifest's count (or list a variant in NOT_IN_MANIFEST)")
    return problems


def model_files() -> list[Path]:
    return sorted([*ROOT.glob("model/*.cfg"), *ROOT.glob("model/MC*.tla")])


def test_the_docs_name_only_manifest_models() -> None:
    defined = _defined_names()
    for doc in DOCS:
        text = (ROOT / doc).read_text(encoding="utf-8")
        assert unnamed_models(text, MANIFEST, defined) == [], doc


def test_the_docs_tables_quote_the_manifests_counts() -> None:
    text = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
    assert "| model | answer | states |" in text  # the table this reads is there
    assert table_drift(text, MANIFEST) == []


def test_the_models_comments_quote_the_manifests_counts() -> None:
    problems = [p for path in model_files() for p in comment_drift(path, MANIFEST)]
    assert problems == []
    quoted = [path.name for path in model_files() if _COUNT_RE.search(_comments(path))]
    assert "MCLegacyUpgradeDeep.tla" in quoted  # the check reads what it should


def test_every_exemption_is_still_quoted() -> None:
    for name, count in NOT_IN_MANIFEST:
        assert count in " ".join(_comments(ROOT / "model" / name).split()), (name, count)


def test_a_wrong_count_or_name_is_caught(tmp_path: Path) -> None:
    """The checks bite: a stale count in a comment, a table or a renamed model."""
    deep = MANIFEST.get("LegacyUpgradeDeep").distinct_states
    src = (ROOT / "model" / "MCLegacyUpgradeDeep.tla").read_text(encoding="utf-8")
    quoted = f"{deep:,}"
    assert quoted in src
    bad = tmp_path / "MCLegacyUpgradeDeep.tla"
    bad.write_text(src.replace(quoted, f"{deep + 1:,}"), encoding="utf-8")
    assert comment_drift(bad, MANIFEST) != []
    assert comment_drift(ROOT / "model" / "MCLegacyUpgradeDeep.tla", MANIFEST) == []
    twin = MANIFEST.get("StaleWorkerCommits").distinct_states
    table = ("| model | answer | states |\n|---|---|---|\n"
             f"| `StaleWorkerCommits` | fails | {twin + 1} |\n")
    assert table_drift(table, MANIFEST) != []
    assert table_drift(table.replace(str(twin + 1), str(twin)), MANIFEST) == []
    defined = _defined_names()
    assert unnamed_models("twin `StaleWorkerCommitz` breaks it", MANIFEST, defined) == [
        "StaleWorkerCommitz"]
    assert unnamed_models("twin `StaleWorkerCommits` breaks it", MANIFEST, defined) == []
