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


def adoption_blocks() -> list[str]:
    section = README.split("## Adopting toolledger in an engine", 1)[1].split("\n## ", 1)[0]
    return [part.split("```", 1)[0] for part in section.split("```python")[1:]]


def run_block(code: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})
    return out.getvalue()


def test_first_time_users_flow_fits_in_15_lines_and_recovers() -> None:
    code = adoption_blocks()[0]
    lines = [line for line in code.splitlines() if line.strip()]
    assert len(lines) <= 15, f"the README's first adoption block has {len(lines)} lines"
    assert "toolledger.session" not in code and "Event(" not in code  # the API, not the spec
    text = run_block(code)
    assert text.startswith("retry retry_same_id {'role': 'tool', 'tool_call_id': 'call_0', "
                           "'content': 'sent', 'status': 'ok'}"), text
    assert text.rstrip().endswith(" 1"), text  # one email for two requests


def test_adoption_example_runs_and_prints_what_the_readme_says() -> None:
    [kit] = [b for b in adoption_blocks() if "toolledger.engine" in b]
    text = run_block(kit)
    assert "emails sent: 1 requests: 2" in text
    rows = [line for line in text.splitlines() if line.startswith(("dispatch", "retry_same_id"))]
    assert [r.split()[:3] for r in rows] == [
        ["dispatch", "1", "approval"],
        ["retry_same_id", "1", "approval"],
        ["dispatch", "2", "policy"],
    ], text
