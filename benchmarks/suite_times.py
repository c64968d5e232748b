"""A pytest plugin that records each test's wall and CPU time, for bench_suite.

``pytest -p benchmarks.suite_times --suite-times=PATH ...`` writes one JSON
line per test item to PATH: its node id, the wall seconds of its setup, call
and teardown phases, and the CPU seconds (user + sys) of this process and of
the children it waited for (TLC's JVMs, PostgreSQL's tools, crash-campaign
children) over those phases; also what the test is made of, for the kinds
of ``bench_suite.py``: its fixtures, whether it is a Hypothesis test, and the
programs it started (``subprocess.Popen``'s first argument, base name only).
CPU time barely depends on how loaded the machine is, wall time does: the
table of ``benchmarks/bench_suite.py`` shows both.  Session-scoped fixtures
are charged to the first test that uses them, as in pytest's own
``--durations``.  Under pytest-xdist each worker writes its own file,
``PATH.<worker id>`` (``PATH.gw0``, ...), and the controller writes none;
:func:`recorded_files` lists what one run wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Generator
from pathlib import Path
from typing import IO, Any

import pytest

_KEY = pytest.StashKey[IO[str]]()
_LAUNCHED: list[str] = []  # programs started by the running test
_POPEN_INIT = subprocess.Popen.__init__


def _recording_init(self: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> None:
    first = args if isinstance(args, (str, bytes, os.PathLike)) else (list(args) or [""])[0]
    _LAUNCHED.append(os.path.basename(os.fsdecode(first)).split(" ")[0])
    _POPEN_INIT(self, args, *rest, **kw)


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--suite-times", metavar="PATH", default=None,
                     help="write each test's wall and CPU seconds to PATH (JSON lines)")


def recorded_files(path: Path) -> list[Path]:
    """The files one run with ``--suite-times=path`` wrote: ``path`` itself in a
    run without xdist, ``path.gw0``, ``path.gw1``, ... with it."""
    workers = sorted(path.parent.glob(path.name + ".gw*"))
    return workers or ([path] if path.exists() else [])


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--suite-times")
    if not path:
        return
    worker = getattr(config, "workerinput", None)  # set by xdist in its workers
    if worker is not None:
        path = f"{path}.{worker['workerid']}"
    elif getattr(config.option, "numprocesses", None):
        return  # the xdist controller runs no test: its workers record
    config.stash[_KEY] = open(path, "w", encoding="utf-8")  # noqa: SIM115 closed at unconfigure
    subprocess.Popen.__init__ = _recording_init  # type: ignore[method-assign]


def pytest_unconfigure(config: pytest.Config) -> None:
    out = config.stash.get(_KEY, None)
    if out is not None:
        out.close()
        subprocess.Popen.__init__ = _POPEN_INIT  # type: ignore[method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item,
                            nextitem: pytest.Item | None) -> Generator[None, Any, None]:
    out = item.config.stash.get(_KEY, None)
    _LAUNCHED.clear()
    wall0, cpu0 = time.perf_counter(), _cpu()
    yield
    if out is None:
        return
    record = {
        "nodeid": item.nodeid,
        "wall": round(time.perf_counter() - wall0, 4),
        "cpu": round(_cpu() - cpu0, 4),
        "outcome": getattr(item, "_suite_outcome", "passed"),
        "fixtures": sorted(getattr(item, "fixturenames", ())),
        "hypothesis": bool(getattr(getattr(item, "obj", None), "is_hypothesis_test", False)),
        "launched": sorted(set(_LAUNCHED)),
    }
    out.write(json.dumps(record) + "\n")
    out.flush()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        item._suite_outcome = "failed"  # type: ignore[attr-defined]
    elif report.skipped and getattr(item, "_suite_outcome", "passed") == "passed":
        item._suite_outcome = "skipped"  # type: ignore[attr-defined]
