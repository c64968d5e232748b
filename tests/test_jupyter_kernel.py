"""The TLA+ notebook kernel can't hide a failed check.

Under test: ``toolledger.notebook.kernel`` driven by real Jupyter machinery and
the real TLC 2.15 jar. The oracle is nbmake itself (the tool that runs our
notebooks in ``make test``): a notebook whose model check passes must pass, and
one whose invariant is violated or whose module doesn't parse must FAIL. With
the stock tlaplus-jupyter kernel the violated one passes, which is why this
kernel exists. A second test runs every kind of failing cell through nbclient
and checks that each ends as a Jupyter error with a name that says what failed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat import NotebookNode
from nbformat.v4 import new_code_cell, new_notebook

from toolledger.notebook.kernel import (
    DISPLAY_NAME,
    KERNEL_NAME,
    install_kernelspec,
)

COUNTER = r"""---- MODULE Counter ----
EXTENDS Naturals
VARIABLE x
Init == x = 0
Increment == x < 3 /\ x' = x + 1
Next == Increment
BelowFour == x < 4
BelowTwo == x < 2
====
"""


def tlc_cell(invariant: str, options: str = "-deadlock") -> str:
    return f"%tlc:Counter {options}\nINIT Init\nNEXT Next\nINVARIANT {invariant}\n"


def write_notebook(path: Path, cells: list[str]) -> Path:
    notebook = new_notebook(
        cells=[new_code_cell(source) for source in cells],
        metadata={
            "kernelspec": {"name": KERNEL_NAME, "display_name": DISPLAY_NAME, "language": "tla"}
        },
    )
    nbformat.write(notebook, path)
    return path


def test_installed_kernel_spec_runs_this_module_with_this_python(tmp_path: Path) -> None:
    destination = Path(install_kernelspec(str(tmp_path)))

    assert destination == tmp_path / "share" / "jupyter" / "kernels" / KERNEL_NAME
    spec = json.loads((destination / "kernel.json").read_text())
    assert spec["argv"] == [
        sys.executable,
        "-m",
        "toolledger.notebook.kernel",
        "-f",
        "{connection_file}",
    ]
    assert (spec["display_name"], spec["language"]) == (DISPLAY_NAME, "tla")


@pytest.fixture
def jupyter_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Jupyter data directory holding only our kernel spec, installed fresh."""
    prefix = tmp_path / "prefix"
    install_kernelspec(str(prefix))
    data = prefix / "share" / "jupyter"
    monkeypatch.setenv("JUPYTER_PATH", str(data))
    return data


@pytest.mark.slow
def test_nbmake_fails_notebooks_whose_check_failed(tmp_path: Path, jupyter_path: Path) -> None:
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    passing = write_notebook(
        notebooks / "passing.ipynb",
        [COUNTER, tlc_cell("BelowFour"), r"{x * 2 : x \in 1..3}"],
    )
    write_notebook(notebooks / "violated.ipynb", [COUNTER, tlc_cell("BelowTwo")])
    write_notebook(
        notebooks / "unparsable.ipynb",
        ["---- MODULE Broken ----\nVARIABLE x\nInit == x = = 1\n====\n"],
    )
    report = tmp_path / "report.xml"

    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",  # named: make test runs with PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
            "nbmake",
            "--nbmake",
            "--overwrite",
            f"--junitxml={report}",
            f"--rootdir={notebooks}",
            str(notebooks),
        ],
        cwd=notebooks,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    outcomes = {
        case.attrib["name"]: "failed" if case.find("failure") is not None else "passed"
        for case in ElementTree.parse(report).getroot().iter("testcase")
    }
    assert outcomes == {
        "passing.ipynb": "passed",
        "violated.ipynb": "failed",
        "unparsable.ipynb": "failed",
    }, completed.stdout + completed.stderr
    assert "TLCInvariantViolation: Invariant BelowTwo is violated." in completed.stdout
    assert "TLAParseError" in completed.stdout
    # --overwrite wrote the outputs back: the expression cell printed its value.
    expression_cell = nbformat.read(passing, as_version=4).cells[2]
    assert [output.get("text") for output in expression_cell.outputs] == ["{2, 4, 6}"]


FAILING_CELLS = {
    "parse": ("---- MODULE P ----\nVARIABLE x\nInit == x = = 1\n====\n", "TLAParseError"),
    # SANY exits 0 here; only its output says "*** Errors: 1".
    "semantic": ("---- MODULE S ----\nVARIABLE x\nInit == x = Foo\n====\n", "TLASemanticError"),
    # pcal.trans translates this happily; only parsing the translation catches it.
    "pluscal": (
        "---- MODULE Q ----\nEXTENDS Naturals\n(* --algorithm Q\nvariables x = 0;\n"
        "begin\n  A: x := x + ;\nend algorithm; *)\n====\n",
        "TLAParseError",
    ),
    "invariant": (tlc_cell("BelowTwo"), "TLCInvariantViolation"),
    # TLC exits 0 after reporting violations with -continue.
    "continue": (tlc_cell("BelowTwo", "-deadlock -continue"), "TLCInvariantViolation"),
    "deadlock": (tlc_cell("BelowFour", options=""), "TLCDeadlock"),
    "undefined invariant": (tlc_cell("Nonexistent"), "TLCConfigError"),
    "unknown module": ("%tlc:Nonexistent\nINIT Init\nNEXT Next\n", "TLAPlusKernelError"),
    "expression": ('1 + "a"', "TLCError"),
}


@pytest.mark.slow
def test_every_kind_of_failure_is_a_jupyter_error(tmp_path: Path, jupyter_path: Path) -> None:
    sources = [COUNTER, tlc_cell("BelowFour"), *(source for source, _ in FAILING_CELLS.values())]
    notebook: NotebookNode = nbformat.read(
        write_notebook(tmp_path / "failures.ipynb", sources), as_version=4
    )

    NotebookClient(notebook, timeout=60, allow_errors=True, shutdown_kernel="immediate").execute(
        cwd=str(tmp_path)
    )

    def errors(cell: NotebookNode) -> list[str]:
        return [output.ename for output in cell.outputs if output.output_type == "error"]

    assert errors(notebook.cells[0]) == []
    assert errors(notebook.cells[1]) == []
    names = {
        kind: errors(cell) for kind, cell in zip(FAILING_CELLS, notebook.cells[2:], strict=True)
    }
    assert names == {kind: [ename] for kind, (_, ename) in FAILING_CELLS.items()}
