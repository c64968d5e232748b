"""The repository is self-contained: everything a reader is pointed to is in it.

Scans every tracked file (``git ls-files``; notebook outputs included, they
are part of the tracked ``.ipynb``) for

- a path into the repository that does not exist in it: ``docs/...``,
  ``spec/...``, ``model/...``, ``notebooks/...``, ``benchmarks/...``,
  ``tests/...``, ``reference/...``, and any ``NAME.md``;
- an anchor ``docs/protocol.md#anchor`` that is not a heading of that file;
- an absolute path of some machine (under the work, home, root or temp
  directories) or a reference to a sibling ``shared`` folder outside the
  repository.

What does not count as a reference (each rule has a reason, and the
planted-reference test shows the scanner still catches the real thing):
a glob or template (``model/MC*.tla``, ``spec/{name}.tla``), a path that
``.gitignore`` covers (output the code writes, e.g. ``states/``), the
``.gitignore`` file's own patterns (``/tmp/`` there means the repository's
``tmp``), and the string literals of test modules other than docstrings:
they are test data fed to the code under test (a recorded TLC output line, a
deliberately misspelt cfg name, a leaky notebook output), not something a
reader is pointed to. Comments and docstrings of tests are scanned like
everything else.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache

from checker_support import ROOT

TOP_DIRS = ("docs", "spec", "model", "notebooks", "benchmarks", "tests", "reference")

# Built from parts so that this file does not contain what it looks for.
_MACHINE_DIRS = ("work", "home", "root", "tmp", "Users", "mnt", "private/var")
ABSOLUTE = re.compile(
    r"(?<![\w.~-])/(?:" + "|".join(re.escape(d) for d in _MACHINE_DIRS) + r")/[^\s\"'`)<>\\]*"
)
OUTSIDE = re.compile(re.escape("..") + "/" + "shared")
REPO_PATH = re.compile(
    r"(?<![\w./~-])((?:" + "|".join(TOP_DIRS) + r")/[\w./-]*[\w/])"
)
MD_NAME = re.compile(r"(?<![\w./-])([\w-]+(?:\.[\w-]+)*\.md)\b(?![\w/])")
ANCHOR = re.compile(r"docs/protocol\.md#([\w-]+)")
PATTERN_CHARS = "*{<[$%\\"  # a glob, a template or a regex follows: not a concrete path
SELF = "tests/test_repository_self_contained.py"  # its strings are the scanner's test data

# f-strings are one STRING token before Python 3.12, FSTRING_* tokens since.
_STRING_TOKENS = frozenset(
    t for t in (tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", None)) if t is not None
)


def without_test_data(source: str) -> str:
    """``source`` (a test module) with every string literal but docstrings blanked.

    Blanked characters become spaces, so line numbers and columns still match.
    """
    tree = ast.parse(source)
    docstrings: set[tuple[int, int]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                docstrings.add((first.lineno, first.col_offset))
    lines = [list(line) for line in source.splitlines(keepends=True)]
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _STRING_TOKENS or token.start in docstrings:
            continue
        (row, col), (end_row, end_col) = token.start, token.end
        for r in range(row, end_row + 1):
            line = lines[r - 1]
            stop = end_col if r == end_row else len(line)
            for c in range(col if r == row else 0, stop):
                if line[c] != "\n":
                    line[c] = " "
    return "".join("".join(line) for line in lines)


@dataclass(frozen=True)
class Finding:
    """One bad reference: where, what, and why it is bad."""

    path: str
    line: int
    text: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text!r} ({self.why})"


@cache
def tracked() -> tuple[str, ...]:
    """The files of the repository, as a fresh clone has them."""
    done = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                          check=True)
    return tuple(sorted(p for p in done.stdout.decode().split("\0") if p))


@cache
def existing() -> frozenset[str]:
    """Tracked files and every directory that holds one."""
    names: set[str] = set()
    for f in tracked():
        names.add(f)
        parts = f.split("/")
        names.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return frozenset(names)


def ignored(paths: Iterable[str]) -> frozenset[str]:
    """Which of ``paths`` ``.gitignore`` covers (output the code writes, not sources)."""
    todo = sorted(set(paths))
    if not todo:
        return frozenset()
    done = subprocess.run(["git", "check-ignore", "--no-index", "--stdin", "-z"], cwd=ROOT,
                          input="\0".join(todo).encode(), capture_output=True, check=False)
    return frozenset(p for p in done.stdout.decode().split("\0") if p)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    return {github_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+)$", markdown, re.M)}


def scan(name: str, text: str, files: frozenset[str], md_anchors: set[str]) -> Iterator[Finding]:
    """Every bad reference in ``text`` (the contents of tracked file ``name``)."""
    for number, line in enumerate(text.splitlines(), 1):
        if name != ".gitignore":  # its patterns are relative to the repository
            for m in ABSOLUTE.finditer(line):
                yield Finding(name, number, m.group(0), "an absolute path of some machine")
        for m in OUTSIDE.finditer(line):
            yield Finding(name, number, m.group(0), "a folder outside the repository")
        for m in REPO_PATH.finditer(line):
            after = line[m.end():m.end() + 1]
            if after and after in PATTERN_CHARS:
                continue
            path = m.group(1).rstrip("./")
            if path not in files:
                yield Finding(name, number, path, "no such file in the repository")
        for m in MD_NAME.finditer(line):
            md = m.group(1)
            if not any(f == md or f.endswith("/" + md) for f in files):
                yield Finding(name, number, md, "no such file in the repository")
        for m in ANCHOR.finditer(line):
            if m.group(1) not in md_anchors:
                yield Finding(name, number, m.group(0), "no such heading in docs/protocol.md")


def findings(names: Iterable[str]) -> list[Finding]:
    files = existing()
    protocol = ROOT / "docs" / "protocol.md"
    md_anchors = anchors(protocol.read_text(encoding="utf-8")) if protocol.exists() else set()
    found: list[Finding] = []
    for name in names:
        if name == SELF:
            continue  # the planted-reference tests below run the scanner on its strings
        try:
            text = (ROOT / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue  # binary files point nowhere; a deleted file is git's business
        if name.startswith("tests/") and name.endswith(".py"):
            text = without_test_data(text)
        found.extend(scan(name, text, files, md_anchors))
    # a missing path that .gitignore covers is output the code writes, not a source
    skip = ignored(f.text for f in found if f.why == "no such file in the repository")
    return [f for f in found if f.text not in skip]


def report(found: list[Finding]) -> str:
    return "\n".join(map(str, found))


NOTEBOOKS = tuple(f for f in tracked() if f.endswith(".ipynb"))
OTHERS = tuple(f for f in tracked() if not f.endswith(".ipynb"))


def test_tracked_files_point_only_inside_the_repository() -> None:
    found = findings(OTHERS)
    assert not found, "references to nothing in the repository:\n" + report(found)


def test_notebooks_point_only_inside_the_repository() -> None:
    found = findings(NOTEBOOKS)
    assert not found, "references to nothing in the repository:\n" + report(found)


def test_the_protocol_document_exists_and_is_linked_from_the_readme() -> None:
    assert "docs/protocol.md" in tracked()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "](docs/protocol.md)" in readme


def test_string_literals_of_tests_are_test_data_but_their_comments_and_docstrings_count() -> None:
    files = existing()
    md_anchors = anchors((ROOT / "docs" / "protocol.md").read_text(encoding="utf-8"))
    missing = "docs/" + "design.md"
    module = "\n".join([
        f'"""Module docstring: see {missing}."""',
        "def test_x() -> None:",
        f'    """Test docstring: see {missing}."""',
        f'    data = "{missing}"  # comment: see {missing}',
        f'    assert f"{{data}} {missing}" != """{missing}',
        f'{missing}"""',
        "",
    ])
    blanked = without_test_data(module)
    assert blanked.count("\n") == module.count("\n")
    got = [(f.line, f.text) for f in scan("tests/t.py", blanked, files, md_anchors)]
    assert got == [(1, missing), (3, missing), (4, missing)], got


def test_the_scanner_catches_planted_bad_references() -> None:
    files = existing()
    md_anchors = anchors((ROOT / "docs" / "protocol.md").read_text(encoding="utf-8"))
    machine = "/" + "home/ada/toolledger/spec/DurableToolExecution.tla"
    planted = "\n".join([
        "The recovery table is in PROTOCOL" + ".md section 3.",           # 1 a missing .md
        "See docs/" + "design.md and model/" + "Nope.cfg.",                 # 2 two missing paths
        f"Open {machine} in an editor.",                                    # 3 a machine path
        "Background: .." + "/shared/" + "design/notes.txt",                 # 4 outside the repo
        "Invariants: docs/protocol.md#" + "no-such-section",                # 5 a dead anchor
        "Output of `notebooks/" + "01_the_bug.ipynb`, outputs: /" + "tmp/tmpab12/x.tla",  # 6
    ])
    got = [(f.line, f.text, f.why) for f in scan("planted.md", planted, files, md_anchors)]
    assert got == [
        (1, "PROTOCOL.md", "no such file in the repository"),
        (2, "docs/design.md", "no such file in the repository"),
        (2, "model/Nope.cfg", "no such file in the repository"),
        (3, machine, "an absolute path of some machine"),
        (4, "../shared", "a folder outside the repository"),
        (5, "docs/protocol.md#no-such-section", "no such heading in docs/protocol.md"),
        (6, "/" + "tmp/tmpab12/x.tla", "an absolute path of some machine"),
    ], got


def test_the_scanner_passes_what_is_not_a_reference() -> None:
    files = existing()
    md_anchors = anchors((ROOT / "docs" / "protocol.md").read_text(encoding="utf-8"))
    fine = "\n".join([
        "Models are model/MC*.tla and spec/{name}.tla; see README.md and docs/protocol.md.",
        "Invariants: docs/protocol.md#invariants, recovery: docs/protocol.md#recovery.",
        "Issue: https://github.com/andrewyng/openworker/issues/443",
        "The suite lives in tests/ and the package in reference/toolledger/.",
        "Relative: ./tmp/x and a/" + "work/b are not machine paths.",
    ])
    assert list(scan("fine.md", fine, files, md_anchors)) == []
