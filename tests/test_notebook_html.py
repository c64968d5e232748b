"""``make notebooks-html``: a reviewer's rendering hides the code and publishes no machine path.

Under test: ``toolledger.notebook.html`` (what the Makefile target runs) on a real
committed notebook, its two checks on renderings that must fail them, and the
Makefile target itself (``make -n``).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from toolledger.notebook.html import (
    RenderError,
    absolute_paths,
    has_input_cells,
    main,
    render,
    write_html,
)

ROOT = Path(__file__).resolve().parent.parent
# The smallest notebook: rendering it takes about two seconds.
NOTEBOOK = ROOT / "notebooks" / "06_the_five_questions.ipynb"

pytestmark = pytest.mark.slow


def code_sources(path: Path) -> list[str]:
    cells = json.loads(path.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code" and c["source"]]


def test_a_committed_notebook_renders_without_inputs_and_without_machine_paths(
    tmp_path: Path,
) -> None:
    assert main(["--out", str(tmp_path / "html"), str(NOTEBOOK)]) == 0
    page = (tmp_path / "html" / f"{NOTEBOOK.stem}.html").read_text()
    assert not has_input_cells(page)
    assert absolute_paths(page) == []
    # The story is there: the notebook's title and its outputs.
    assert "The five questions" in page or "five questions" in page.lower()
    assert "jp-OutputArea-output" in page
    # No code line long enough to be unambiguous appears in the page.
    lines = [ln.strip() for src in code_sources(NOTEBOOK) for ln in src.splitlines()]
    distinctive = [ln for ln in lines if len(ln) > 40 and "<" not in ln and "&" not in ln]
    assert distinctive
    assert not [ln for ln in distinctive if ln in page]


def test_the_input_check_sees_inputs_when_they_are_rendered() -> None:
    # The same notebook with its code shown: the check that guards the target must fire.
    assert has_input_cells(render(NOTEBOOK, no_input=False))


def test_a_notebook_whose_output_names_a_temp_dir_is_refused(tmp_path: Path) -> None:
    nb = json.loads(NOTEBOOK.read_text())
    nb["cells"].append({
        "cell_type": "code", "execution_count": 1, "id": "leak", "metadata": {},
        "source": ["print(1)"],
        "outputs": [{"output_type": "stream", "name": "stdout",
                     "text": ["Parsing file /tmp/tmpx3rbfx3g/RecoveryTable.tla\n"]}],
    })
    leaky = tmp_path / "leaky.ipynb"
    leaky.write_text(json.dumps(nb))
    out = tmp_path / "html"
    with pytest.raises(RenderError, match=r"/tmp/tmpx3rbfx3g/RecoveryTable\.tla"):
        write_html([NOTEBOOK, leaky], out)
    assert not out.exists()  # checked all before writing any
    assert main(["--out", str(out), str(leaky)]) == 1


@pytest.mark.parametrize(("text", "found"), [
    ("Parsing file /tmp/x/A.tla", ["/tmp/x/A.tla"]),
    # built from parts, so that this file names no folder outside the repository
    ("see /" + "work/notes/PROTOCOL.md.", ["/" + "work/notes/PROTOCOL.md."]),
    ("file:///home/u/x.png", ["file:///home/u/x.png"]),
    ("https://example.org/tmp/x and spec/a/tmp/b and ../docs/protocol.md", []),
])
def test_absolute_paths(text: str, found: list[str]) -> None:
    assert absolute_paths(text) == found


def test_a_missing_notebook_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--out", str(tmp_path), str(tmp_path / "nope.ipynb")]) == 2
    assert "nope.ipynb" in capsys.readouterr().err


def test_make_notebooks_html_runs_the_renderer_on_every_notebook() -> None:
    dry = subprocess.run(["make", "-n", "notebooks-html", "SETUP="], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    (line,) = [ln for ln in dry.splitlines() if "toolledger.notebook.html" in ln]
    assert "--out build/notebooks-html" in line
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert f"notebooks/{nb.name}" in line
    ignored = subprocess.run(["git", "check-ignore", "-q", "build/notebooks-html/x.html"],
                             cwd=ROOT, check=False)
    assert ignored.returncode == 0, "build/notebooks-html/ must be git-ignored"


# ----------------------------------------------------------------------------
# Every committed notebook, as a reviewer reads it (no rendering needed).

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def html_outputs(path: Path) -> list[str]:
    cells = json.loads(path.read_text())["cells"]
    return ["".join(out["data"]["text/html"]) for c in cells for out in c.get("outputs", [])
            if "text/html" in out.get("data", {})]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebook_tables_are_left_aligned_and_images_have_alt_text(path: Path) -> None:
    cells = json.loads(path.read_text())["cells"]
    raw_images = [i for i, c in enumerate(cells) for out in c.get("outputs", [])
                  if "image/png" in out.get("data", {})]
    assert not raw_images, f"cells {raw_images} show a PNG without alt text: use show_figure"
    for page in html_outputs(path):
        for size in re.findall(r"<table\b[^>]*font-size:(\d+)px", page):
            assert int(size) >= 14, f"a table in {size} px type: smaller than the text around it"
        for tag in re.findall(r"<t[dh]\b[^>]*>", page):
            assert "text-align:left" in tag, tag  # Jupyter's CSS right-aligns the rest
        for img in re.findall(r"<img\b[^>]*>", page):
            alt = re.search(r'alt="([^"]*)"', img)
            assert alt and len(alt.group(1)) > 20, img[:80]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebooks_name_no_machine_path_and_no_missing_protocol_file(path: Path) -> None:
    text = path.read_text()
    assert absolute_paths(text) == []
    assert "PROTOCOL.md" not in text and "../shared" not in text
