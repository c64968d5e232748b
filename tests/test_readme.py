"""The README's commands and figures come from the code: check that they do."""

from __future__ import annotations

import contextlib
import io
import re

from checker_support import ROOT
from toolledger.manifest import load_manifest, markdown_table

README = (ROOT / "README.md").read_text()


def test_quick_start_shows_exactly_the_two_commands() -> None:
    quick = README.split("## Quick start", 1)[1].split("##", 1)[0]
    assert re.findall(r"^make \w+$", quick, re.MULTILINE) == ["make check", "make test"]


def test_models_table_is_generated_from_the_manifest() -> None:
    block = README.split("<!-- models:begin -->", 1)[1].split("<!-- models:end -->", 1)[0]
    assert block.strip() == markdown_table(load_manifest(ROOT)), (
        "README's model table drifted from model/manifest.toml: "
        "paste the output of `toolledger models` between the markers"
    )


def test_adoption_example_runs_and_prints_what_the_readme_says() -> None:
    section = README.split("## Adopting toolledger in an engine", 1)[1]
    code = section.split("```python", 1)[1].split("```", 1)[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})
    text = out.getvalue()
    assert "emails sent: 1 requests: 2" in text
    rows = [line for line in text.splitlines() if line.startswith(("dispatch", "retry_same_id"))]
    assert [r.split()[:3] for r in rows] == [
        ["dispatch", "1", "approval"],
        ["retry_same_id", "1", "approval"],
        ["dispatch", "2", "policy"],
    ], text
