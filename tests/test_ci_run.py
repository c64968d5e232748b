"""`.ci/run` runs both README commands, and fails if either fails.

Under test: the CI entry point, with a fake ``make`` first on PATH that logs
its arguments and fails on request (the real targets take minutes and are
tested on their own). Oracle: the README's Quick start, whose commands are
exactly what a developer runs; CI must run each of them, even after one
failed, and exit non-zero if any failed.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from checker_support import ROOT

CI_RUN = ROOT / ".ci" / "run"


def readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Working on toolledger", 1)[1].split("##", 1)[0]
    return re.findall(r"^make \w+$", quick, re.MULTILINE)


@pytest.mark.parametrize("failing", [None, "check", "test"])
def test_ci_runs_every_readme_command(tmp_path: Path, failing: str | None) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "make.log"
    make = bin_dir / "make"
    make.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "GNU Make (fake)"; exit 0; fi\n'
        f'echo "make $*" >> "{log}"\n'
        f'[ "$1" != "{failing}" ]\n'
    )
    make.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(CI_RUN)], env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    ran = log.read_text().splitlines()
    assert sorted(ran) == sorted(readme_commands()) == ["make check", "make test"]
    if failing is None:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 1
        assert f"CI failed: make {failing}" in done.stderr
