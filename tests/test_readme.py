"""The README's and docs/adopting.md's commands and figures come from the code: check
that they do (docs/models.md's model table too).  tests/test_docs.py runs every other
python block of the README and the docs pages."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

from checker_support import ROOT
from toolledger.check.manifest import load_manifest, markdown_table

README = (ROOT / "README.md").read_text()
ADOPTING = (ROOT / "docs" / "adopting.md").read_text()  # the README links it
MAINTAINERS = "## Working on toolledger"  # the README's section with the two commands


def test_the_maintainers_section_shows_exactly_the_two_commands() -> None:
    quick = README.split(MAINTAINERS, 1)[1].split("##", 1)[0]
    assert re.findall(r"^make \w+$", quick, re.MULTILINE) == ["make check", "make test"]


def test_models_table_is_generated_from_the_manifest() -> None:
    page = (ROOT / "docs" / "models.md").read_text()
    block = page.split("<!-- models:begin -->", 1)[1].split("<!-- models:end -->", 1)[0]
    assert block.strip() == markdown_table(load_manifest(ROOT)), (
        "docs/models.md's model table drifted from model/manifest.toml: "
        "paste the output of `toolledger models` between the markers"
    )


def python_blocks(text: str) -> list[str]:
    return [part.split("```", 1)[0] for part in text.split("```python")[1:]]


def test_the_readme_starts_with_the_adopter_and_stays_short() -> None:
    """What it is, the install line, the 15-line example, the frameworks, then the
    maintainers' and reviewers' ways in, in that order and in at most 300 lines."""
    heads = re.findall(r"^## (.+)$", README, re.MULTILINE)
    assert heads[:5] == ["Install", "Protect a tool call", "Frameworks",
                         MAINTAINERS[3:], "Reviewing: the notebooks"], heads
    assert len(README.splitlines()) <= 300
    first = README.index("```python")
    assert README.index("pip install .") < first < README.index(MAINTAINERS)


def run_block(code: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})
    return out.getvalue()


def test_first_time_users_flow_fits_in_15_lines_and_recovers() -> None:
    code = python_blocks(README)[0]
    lines = [line for line in code.splitlines() if line.strip()]
    assert len(lines) <= 15, f"the README's first adoption block has {len(lines)} lines"
    assert "toolledger._core.session" not in code and "Event(" not in code  # the API, not the spec
    text = run_block(code)
    assert text.startswith("retry retry_same_id {'role': 'tool', 'tool_call_id': 'call_0', "
                           "'content': 'sent', 'status': 'ok'}"), text
    assert text.rstrip().endswith(" 1"), text  # one email for two requests


def test_adoption_example_runs_and_prints_what_the_readme_says() -> None:
    [kit] = [b for b in python_blocks(ADOPTING) if "toolledger.kit.engine" in b]
    text = run_block(kit)
    assert "emails sent: 1 requests: 2" in text
    rows = [line for line in text.splitlines() if line.startswith(("dispatch", "retry_same_id"))]
    assert [r.split()[:3] for r in rows] == [
        ["dispatch", "1", "approval"],
        ["retry_same_id", "1", "approval"],
        ["dispatch", "2", "policy"],
    ], text


def simulate_lines() -> list[tuple[list[str], int]]:
    """docs/adopting.md's ``$ toolledger simulate`` lines: (argv, the exit status its
    comment says)."""
    section = ADOPTING.split("To try any crash point", 1)[1]
    block = section.split("```console", 1)[1].split("```", 1)[0]
    joined = re.sub(r"\\\n\s*", " ", block)  # backslash continuations, as a shell reads them
    lines = []
    for line in joined.splitlines():
        if not line.startswith("$ "):
            continue
        command, _, comment = line[2:].partition("#")
        status = re.search(r"exit status (\d+)", comment)
        lines.append((shlex.split(command), int(status.group(1)) if status else 0))
    return lines


def toolledger_command() -> list[str]:
    """The console script docs/adopting.md's lines call, from this interpreter's environment."""
    script = Path(sys.executable).with_name("toolledger")
    return [str(script)] if script.exists() else [sys.executable, "-m", "toolledger.cli"]


def test_the_readme_lists_the_simulate_lines_this_test_runs() -> None:
    lines = simulate_lines()
    assert [argv[:2] for argv, _ in lines] == [["toolledger", "simulate"]] * 4
    assert [status for _, status in lines] == [0, 3, 0, 0]
    assert any("--db" in argv for argv, _ in lines)  # the SQLite line is among them


def test_the_readme_simulate_lines_work_as_printed_twice_in_a_row(tmp_path: Path) -> None:
    """Each line, run twice in a row in one directory, exits as docs/adopting.md says.

    The SQLite line writes its store and side files into the current
    directory; the second run starts over (``--fresh``) instead of failing on
    them, and leaves exactly the files docs/adopting.md names.
    """
    for argv, status in simulate_lines():
        outputs = []
        for _ in range(2):
            done = subprocess.run([*toolledger_command(), *argv[1:]], cwd=tmp_path,
                                  capture_output=True, text=True, timeout=300, check=False)
            assert done.returncode == status, (argv, done.stderr)
            assert done.stderr == "", (argv, done.stderr)
            outputs.append(done.stdout)
        if status == 3:
            assert "DUPLICATE: the effect was applied 2 times for 1 approval" in outputs[1]
        if "--db" in argv:
            for out in outputs:
                assert "effects applied:      1" in out
                assert "human resolution:     applied" in out
    db = "run1.sqlite3"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        db, f"{db}.conversation", f"{db}.external.jsonl"]
    assert "`DB.conversation/`" in ADOPTING and "`DB.external.jsonl`" in ADOPTING
