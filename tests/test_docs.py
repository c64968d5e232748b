"""The README and the docs pages it links: every python block runs, every link lands,
every error they name can be imported from ``toolledger``.

- Every ```python block of README.md and docs/*.md is run here (in a temporary
  directory), unless it needs a framework or pytest around it: those few are
  listed in :data:`RUN_ELSEWHERE` with the test module that runs them, and
  that module must read the page.  A new block that nobody runs fails.
- Every relative Markdown link resolves to a file of the repository, and an
  ``#anchor`` to a heading of that file (GitHub's heading slugs).
- Every error a page names (a CamelCase word ending like an exception, or the
  name of any exception class of ``toolledger._core``) is a builtin or in
  ``toolledger.__all__``: an adopter can ``from toolledger import`` it.

Each scanner is run on a planted broken page first, to show it catches one.
"""

from __future__ import annotations

import builtins
import inspect
import pkgutil
import re
from importlib import import_module
from pathlib import Path

import pytest

import toolledger
import toolledger._core
from checker_support import ROOT

PAGES = sorted([ROOT / "README.md", ROOT / "benchmarks" / "README.md",
                *(ROOT / "docs").glob("*.md")])

# (page, index of its python block) -> the test module that runs that block, and why
# it is not run here.
RUN_ELSEWHERE = {
    ("docs/connectors.md", 0): ("tests/test_extra_pytest.py", "a pytest plugin: run by pytester"),
    ("docs/frameworks.md", 0): ("tests/test_extra_pydantic_ai.py", "needs an agent model"),
    ("docs/frameworks.md", 1): ("tests/test_extra_langgraph.py", "needs a graph builder"),
    ("docs/frameworks.md", 2): ("tests/test_extra_mcp.py", "needs an MCP server"),
}


def rel(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def python_blocks(text: str) -> list[str]:
    """The ```python blocks of a Markdown text, dedented (a block may sit in a list)."""
    out = []
    for m in re.finditer(r"^( *)```python\n(.*?)^\1```", text, re.MULTILINE | re.DOTALL):
        indent = len(m.group(1))
        out.append("\n".join(line[indent:] for line in m.group(2).splitlines()) + "\n")
    return out


BLOCKS = [(rel(p), i, code) for p in PAGES for i, code in enumerate(python_blocks(p.read_text()))]


def test_the_pages_have_the_blocks_this_module_knows() -> None:
    found = {(page, i) for page, i, _ in BLOCKS}
    assert set(RUN_ELSEWHERE) <= found, set(RUN_ELSEWHERE) - found
    assert ("README.md", 0) in found
    assert sum(page == "docs/adopting.md" for page, _, _ in BLOCKS) >= 3
    for (page, _), (module, _) in RUN_ELSEWHERE.items():
        assert page in (ROOT / module).read_text(), f"{module} does not read {page}"


@pytest.mark.parametrize(("page", "index", "code"),
                         [b for b in BLOCKS if b[:2] not in RUN_ELSEWHERE],
                         ids=[f"{p}[{i}]" for p, i, _ in BLOCKS if (p, i) not in RUN_ELSEWHERE])
def test_every_python_block_runs(page: str, index: int, code: str, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a block may write files (a ledger, a database)
    exec(compile(code, f"{page} python block {index}", "exec"), {"__name__": "doc_example"})


def test_a_list_item_block_is_found_dedented() -> None:
    page = "1. item\n\n   ```python\n   x = 1\n   assert x == 1\n   ```\n"
    assert python_blocks(page) == ["x = 1\nassert x == 1\n"]


# ---------------------------------------------------------------------------- links


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def prose(text: str) -> str:
    """``text`` without its fenced blocks and inline code spans (code, not links)."""
    text = re.sub(r"^( *)```.*?^\1```", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "", text)


def broken_links(page: Path, text: str) -> list[str]:
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(text)):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto: ...
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or ROOT not in dest.parents:
            bad.append(f"{rel(page)}: {target} (no such file in the repository)")
            continue
        if anchor and dest.suffix == ".md":
            heads = re.findall(r"^#+ (.+)$", dest.read_text(), re.MULTILINE)
            if anchor not in {slug(h) for h in heads}:
                bad.append(f"{rel(page)}: {target} (no such heading in {rel(dest)})")
    return bad


def test_the_link_checker_catches_a_planted_bad_link() -> None:
    page = ROOT / "docs" / "planted.md"
    text = ("[ok](adopting.md#errors) [no page](nowhere.md) `registry[name](**args)` "
            "[no heading](adopting.md#no-such-heading) [web](https://example.org/x)")
    assert broken_links(page, text) == [
        "docs/planted.md: nowhere.md (no such file in the repository)",
        "docs/planted.md: adopting.md#no-such-heading (no such heading in docs/adopting.md)",
    ]
    assert slug("What recover() and status() return") == "what-recover-and-status-return"


def test_every_link_of_the_readme_and_the_docs_lands() -> None:
    bad = [b for p in PAGES for b in broken_links(p, p.read_text())]
    assert bad == []


def test_the_readme_links_every_docs_page() -> None:
    readme = (ROOT / "README.md").read_text()
    missing = [p.name for p in (ROOT / "docs").glob("*.md") if f"](docs/{p.name})" not in readme]
    assert missing == []


# ---------------------------------------------------------------------------- errors

ERROR_WORD = re.compile(
    r"\b([A-Z][a-z]+(?:[A-Z][a-z]*)*(?:Error|Exists|Corrupt|Unavailable|Schema|Lost|Busy"
    r"|Interrupted|Interrupt|Input|Stale|Invalid))\b"
)


def core_exceptions() -> set[str]:
    """The names of every exception class defined in ``toolledger._core``."""
    names = set()
    for info in pkgutil.iter_modules(toolledger._core.__path__, "toolledger._core."):
        module = import_module(info.name)
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException)
                    and obj.__module__ == module.__name__ and not name.startswith("_")):
                names.add(name)
    return names


def unimportable_errors(text: str, exported: set[str]) -> list[str]:
    """Error names in ``text`` an adopter cannot import from toolledger (nor builtins)."""
    words = set(re.findall(r"\b[A-Z]\w+\b", text))
    named = set(ERROR_WORD.findall(text)) | (words & core_exceptions())
    return sorted(n for n in named if not hasattr(builtins, n) and n not in exported)


def test_the_error_scanner_catches_a_planted_name() -> None:
    exported = set(toolledger.__all__)
    text = "raises `FrobnicateError`, or `StaleState`, or a `KeyboardInterrupt`"
    assert unimportable_errors(text, exported) == ["FrobnicateError"]
    assert unimportable_errors(text, exported - {"StaleState"}) == ["FrobnicateError",
                                                                    "StaleState"]
    assert {"StaleState", "StoreCorrupt", "StoreUnavailable", "UnsupportedSchema",
            "SessionExists", "LeaseLost"} <= core_exceptions()


def test_every_error_the_docs_name_is_importable_from_toolledger() -> None:
    exported = set(toolledger.__all__)
    bad = {rel(p): found for p in PAGES
           if (found := unimportable_errors(p.read_text(), exported))}
    assert bad == {}, "export these from toolledger (reference/toolledger/__init__.py)"
    for name in exported & core_exceptions():
        assert issubclass(getattr(toolledger, name), BaseException), name
