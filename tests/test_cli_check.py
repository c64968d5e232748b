"""`toolledger check` passes only on an exact match with the manifest.

Under test: ``toolledger.cli`` end to end, on a temporary project root whose
manifest points at the fixture specs under ``tests/fixtures/tla/`` and whose
models TLC 2.15 really runs. Oracles: the known outcomes and state counts of
those fixtures; a manifest that disagrees with them in any way (state count,
outcome) must exit 1, and a request that cannot be served must exit 2 and
say why. ``render_trace`` is checked on hand-made traces.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from toolledger import cli
from toolledger.check.counterexample import trace_json
from toolledger.check.manifest import Manifest, ModelEntry, load_manifest
from toolledger.check.mapping import NO_INPUTS
from toolledger.check.tlavalues import FnValue, ModelValue, Value
from toolledger.check.tlc import Cancellation, TraceStep
from toolledger.cli import Row, Subcommand, changes, main, render_trace

FIXTURES = Path(__file__).parent / "fixtures" / "tla"

MANIFEST = """
[[model]]
name = "LedgerPass"
module = "Ledger"
cfg = "LedgerPass.cfg"
check_deadlock = true
ci = true
expect = "pass"
distinct_states = 108
question = "two calls, one attempt: do the invariants hold?"

[[model]]
name = "LedgerRetry"
module = "Ledger"
cfg = "LedgerRetry.cfg"
check_deadlock = true
ci = true
expect = "AtMostOneAttempt"
distinct_states = 36
question = "can a call be dispatched twice?"

[[model]]
name = "Stuck"
module = "Stuck"
cfg = "Stuck.cfg"
check_deadlock = true
ci = true
expect = "deadlock"
distinct_states = 3
question = "does the counter get stuck?"

[[model]]
name = "Settle"
module = "Live"
cfg = "LiveLasso.cfg"
check_deadlock = false
ci = false
expect = "Settle"
distinct_states = 3
question = "does x settle at 2?"

[[model]]
name = "Broken"
module = "Broken"
cfg = "Broken.cfg"
check_deadlock = false
ci = false
expect = "pass"
distinct_states = 1
question = "does a spec with a syntax error fail loudly?"
"""


def make_root(tmp_path: Path, manifest: str = MANIFEST) -> Path:
    (tmp_path / "spec").mkdir(parents=True)
    (tmp_path / "model").mkdir()
    for f in FIXTURES.glob("*.tla"):
        shutil.copyfile(f, tmp_path / "spec" / f.name)
    for f in FIXTURES.glob("*.cfg"):
        shutil.copyfile(f, tmp_path / "model" / f.name)
    (tmp_path / "model" / "manifest.toml").write_text(manifest)
    return tmp_path


def check(root: Path, *args: str) -> int:
    return main(["check", "--root", str(root), *args])


# ---------------------------------------------------------------------------
# Real runs.


@pytest.mark.slow
def test_table_of_all_ci_models(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert check(make_root(tmp_path)) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["model", "expected", "got"]
    assert "status" in lines[0]
    rows = {
        ln.split()[0]: ln.split() for ln in lines[2:] if not ln.startswith(("total ", "checked: "))
    }
    assert set(rows) == {"LedgerPass", "LedgerRetry", "Stuck"}  # CI models only
    assert lines[-1].startswith("total wall time ")
    # what was checked: this root, and no Python (no conformance model here)
    assert lines[-2] == (
        f"checked: spec/ and model/ of {tmp_path} (not a git checkout); "
        "the reference was not checked (no conformance model selected)"
    )
    assert rows["LedgerPass"][:3] == ["LedgerPass", "pass", "pass"]
    assert rows["LedgerRetry"][1:3] == ["AtMostOneAttempt", "AtMostOneAttempt"]
    assert rows["Stuck"][1:3] == ["deadlock", "deadlock"]
    assert "108 / 108" in " ".join(rows["LedgerPass"])
    assert all(r[-1] == "ok" for r in rows.values())
    # progress on stderr while TLC runs (two models at a time): each model's
    # outcome and distinct states as it finishes
    assert "running 3 models with TLC, 2 at a time" in err
    assert "LedgerPass: pass, 108 distinct states" in err
    assert "Stuck: deadlock, 3 distinct states" in err
    assert "[3/3] " in err
    assert "1 models" not in err and "(0 s)" not in err


@pytest.mark.slow
def test_json_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert check(make_root(tmp_path), "--json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["model"] for r in rows] == ["LedgerPass", "LedgerRetry", "Stuck"]
    retry = rows[1]
    assert retry["expected"] == retry["got"] == "AtMostOneAttempt"
    assert retry["distinct_states"] == retry["expected_distinct_states"] == 36
    assert retry["status"] == "ok" and retry["reasons"] == [] and retry["trace"] is None
    assert isinstance(retry["wall_seconds"], float)


@pytest.mark.slow
def test_drifted_state_count_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = make_root(tmp_path, MANIFEST.replace("distinct_states = 108", "distinct_states = 107"))
    assert check(root, "--model", "LedgerPass") == 1
    out, err = capsys.readouterr()
    assert "running 1 model with TLC, 1 at a time" in err  # not "1 models ... 2 at a time"
    assert "DRIFT" in out
    assert "LedgerPass: expected 107 distinct states, got 108" in out


@pytest.mark.slow
def test_drifted_outcome_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = MANIFEST.replace(
        'expect = "pass"\ndistinct_states = 108', 'expect = "TypeOK"\ndistinct_states = 108'
    )
    assert check(make_root(tmp_path, text), "--model", "LedgerPass", "--json") == 1
    (row,) = json.loads(capsys.readouterr().out)
    assert row["status"] == "DRIFT"
    assert row["reasons"] == ["expected TypeOK, got pass"]


@pytest.mark.slow
def test_trace_shows_only_what_changed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert check(make_root(tmp_path), "--model", "LedgerRetry", "--trace") == 0
    out = capsys.readouterr().out
    trace = out[out.index("== LedgerRetry: AtMostOneAttempt (5 steps)") :].splitlines()[1:]
    assert trace[0].split() == ["#", "action", "changes"]
    steps = [ln for ln in trace[2:] if ln[:2].strip().isdigit()]
    assert [s.split()[1] for s in steps] == ["Init", "Dispatch", "Crash", "Recover", "Dispatch"]
    body = "\n".join(trace)
    assert "ledger[c1].attempts = 2" in body  # a nested change, not the whole ledger
    assert 'log \\o <<<<"dispatch", c1>>>>' in body  # an append
    recover = next(s for s in steps if s.split()[1] == "Recover")
    assert recover.split()[2:] == ["up", "=", "TRUE"]  # the only variable Recover changes


@pytest.mark.slow
def test_model_option_runs_a_non_ci_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check(make_root(tmp_path), "--model", "Settle", "--trace", "--json") == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["model"], row["got"], row["status"]) == ("Settle", "Settle", "ok")
    assert [s["action"] for s in row["trace"]] == ["Init", "Up", "Up", "Up"]
    assert row["trace"][-1]["loop_to"] == 1
    assert row["trace"][1]["changes"] == {"x": "= 1"}


@pytest.mark.slow
def test_repeated_model_option_runs_every_named_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--model A --model B` runs A and B (argparse's default would keep only
    B), each once, in the order given, CI or not; the other models do not run."""
    root = make_root(tmp_path)
    assert check(root, "--model", "Settle", "--model", "LedgerRetry", "--model", "Settle",
                 "--json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["model"], r["got"], r["status"]) for r in rows] == [
        ("Settle", "Settle", "ok"), ("LedgerRetry", "AtMostOneAttempt", "ok")]


def test_repeated_model_option_names_every_unknown_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check(make_root(tmp_path), "--model", "Stuck", "--model", "Nope", "--model",
                 "Nah") == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "no model named 'Nope', 'Nah'; valid names: LedgerPass," in err


@pytest.mark.slow
def test_parse_error_is_reported_once_and_its_model_not_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check(make_root(tmp_path), "--model", "Broken") == 1
    out, err = capsys.readouterr()
    row = next(ln for ln in out.splitlines() if ln.startswith("Broken "))
    assert row.split()[2:4] == ["not", "checked"] and row.endswith("NOT CHECKED")
    # SANY's message, once, as file:line:col, before anything ran
    assert err.splitlines()[0] == (
        'spec/Broken.tla:4:9: Was expecting "Expression or Instance"; '
        'Encountered "Beginning of definition" at line 4, column 9 and token "=="'
    )
    assert (out + err).count("Was expecting") == 1
    # no TLC run is reported (the longest one starts beside the parse; a run
    # of a module that does not parse is dropped)
    assert "running" not in err and "started" not in err
    assert "not checked: Broken: the spec does not parse" in out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("typo", "message"),
    [
        # a parse error: SANY exits 255
        ("Recover == == /\\ ~up", 'Was expecting "Expression or Instance"'),
        # a semantic error: SANY exits 0 and only prints "*** Errors: 1"
        ("Recover == /\\ ~up /\\ Bogus", "Unknown operator: `Bogus'."),
    ],
)
def test_a_typo_in_a_shared_module_is_one_error_and_no_drift(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], typo: str, message: str
) -> None:
    root = make_root(tmp_path)
    ledger = root / "spec" / "Ledger.tla"
    text = ledger.read_text()
    assert "Recover == /\\ ~up" in text
    broken_line = next(
        i for i, ln in enumerate(text.splitlines(), 1) if ln.startswith("Recover ==")
    )
    ledger.write_text(text.replace("Recover == /\\ ~up", typo, 1))
    assert check(root, "--json") == 1
    out, err = capsys.readouterr()
    rows = {r["model"]: r for r in json.loads(out)}
    # both models of the broken module are not checked (not DRIFT, not ERROR) ...
    assert {n: r["status"] for n, r in rows.items()} == {
        "LedgerPass": "NOT CHECKED", "LedgerRetry": "NOT CHECKED", "Stuck": "ok"}
    assert rows["LedgerPass"]["distinct_states"] is None
    # ... and the error is printed once, as file:line:col: SANY's message
    errors = [ln for ln in err.splitlines() if ln.startswith("spec/Ledger.tla:")]
    assert len(errors) == 1, err
    assert errors[0].startswith(f"spec/Ledger.tla:{broken_line}:")
    assert message in errors[0]
    assert err.index(errors[0]) < err.index("running 1 model with TLC")  # before any model


# ---------------------------------------------------------------------------
# Usage errors (no TLC run).


def test_unknown_model_lists_the_valid_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check(make_root(tmp_path), "--model", "Nope") == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert (
        "no model named 'Nope'; valid names: LedgerPass, LedgerRetry, Stuck, Settle, Broken" in err
    )


def test_invalid_manifest_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = make_root(tmp_path, MANIFEST.replace('cfg = "Stuck.cfg"', 'cfg = "Stuk.cfg"'))
    assert check(root) == 2
    assert "model 'Stuck': cfg file model/Stuk.cfg does not exist" in capsys.readouterr().err


def test_root_without_manifest_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert check(tmp_path) == 2
    assert "no model/manifest.toml there" in capsys.readouterr().err


def test_no_ci_models_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert check(make_root(tmp_path, MANIFEST.replace("ci = true", "ci = false"))) == 2
    assert "no model with ci = true" in capsys.readouterr().err


def test_bad_arguments_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["check", "--bogus"]) == 2
    assert main(["nonsense"]) == 2
    assert main(["--help"]) == 0
    assert "check" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--timeout", "-5"], "argument --timeout: -5 is not positive: give a number of seconds"),
        (["--timeout", "0"], "argument --timeout: 0 is not positive"),
        (["--timeout", "nan"], "argument --timeout: nan is not positive"),
        (["--timeout", "soon"], "argument --timeout: 'soon' is not a number"),
        (["--jobs", "0"], "argument --jobs: 0 is not positive: give a whole number of TLC runs"),
        (["--jobs", "1.5"], "argument --jobs: '1.5' is not a number"),
    ],
)
def test_timeout_and_jobs_must_be_positive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert check(make_root(tmp_path), *args) == 2
    out, err = capsys.readouterr()
    assert out == "" and message in err and "usage: toolledger check" in err


def test_live_status_shows_the_time_each_model_has_run(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    manifest = load_manifest(root)
    args = cli.build_parser().parse_args(["check", "--root", str(root)])
    run = cli._CheckRun(manifest, manifest.ci_models(), [], None, tmp_path, args,
                        Cancellation())
    run.to_run = manifest.ci_models()
    now = time.monotonic()
    run.started = now - 75
    run.running = {"LedgerRetry": now - 12, "LedgerPass": now - 61}
    run.started_runs, run.finished = 3, 1
    run.states = {"LedgerPass": (1_234_567, 60.2), "LedgerRetry": (1, 0.9)}
    assert run._status() == (
        "75 s: running LedgerPass 61 s (1,234,567 states at 60 s), "
        "LedgerRetry 12 s (1 state at 1 s); 1/3 done"
    )
    run.started_runs = 2
    assert run._status().endswith("; 1 waiting; 1/3 done")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_live_line_on_a_terminal_is_redrawn_every_second() -> None:
    term = _Terminal()
    line = cli._ProgressLine(term)
    t0 = time.monotonic()
    line.live(lambda: f"running TwoCalls {time.monotonic() - t0:.0f} s")
    time.sleep(2.3)
    line.note("[1/1] TwoCalls: pass")
    line.close()
    drawn = [d for d in term.getvalue().split("\r\033[K") if d]
    seconds = [int(d.split()[2]) for d in drawn if d.startswith("running")]
    # redrawn as time passes (not frozen at "0 s"), in order
    assert seconds[0] == 0 and len(set(seconds)) >= 2 and seconds == sorted(seconds), drawn
    # a note stays, and the live line comes back below it
    assert any(d.startswith("[1/1] TwoCalls: pass\nrunning TwoCalls") for d in drawn), drawn
    assert term.getvalue().endswith("\r\033[K")  # the live line is cleared at the end


def test_root_defaults_to_the_project_of_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_root(tmp_path / "proj")
    (root / "spec" / "deeper").mkdir()
    monkeypatch.chdir(root / "spec" / "deeper")
    assert cli.resolve_root(argparse.Namespace(root=None)) == root.resolve()


# ---------------------------------------------------------------------------
# Extension points used by later subcommands and check rows.


def test_subcommands_and_row_providers_can_be_added(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def configure(p: argparse.ArgumentParser) -> None:
        p.add_argument("--n", type=int, default=7)

    monkeypatch.setattr(
        cli, "SUBCOMMANDS", [*cli.SUBCOMMANDS, Subcommand("echo", "test", configure, lambda a: a.n)]
    )
    assert main(["echo", "--n", "5"]) == 5

    def provider(m: Manifest, models: list[ModelEntry], args: argparse.Namespace) -> list[Row]:
        return [
            Row(models[0].name, "conforms", "diverges", None, None, 0.0, "DRIFT", "conformance")
        ]

    monkeypatch.setattr(cli, "CHECK_ROW_PROVIDERS", [provider])
    root = make_root(tmp_path, MANIFEST.replace("ci = true", "ci = false"))
    assert check(root, "--model", "Stuck") == 1  # Stuck itself is ok; the extra row is not
    out = capsys.readouterr().out
    assert "Stuck [conformance]" in out and "diverges" in out


# ---------------------------------------------------------------------------
# render_trace and changes on hand-made traces.


def test_changes_descends_into_functions_and_records() -> None:
    c1, c2 = ModelValue("c1"), ModelValue("c2")
    old: dict[str, Value] = {
        "st": FnValue({c1: FnValue({"a": 1, "b": 2}), c2: FnValue({"a": 1, "b": 2})}),
        "log": (1,),
        "s": frozenset({1}),
        "f": FnValue({"k": 1}),
    }
    new: dict[str, Value] = {
        "st": FnValue({c1: FnValue({"a": 1, "b": 3}), c2: FnValue({"a": 1, "b": 2})}),
        "log": (1, 2, 3),
        "s": frozenset({1, 2}),
        "f": FnValue({"k": 1, "j": 2}),  # domain changed: whole value
    }
    assert changes(old, new) == [
        ("st[c1].b", "=", 3),
        ("log", "\\o", (2, 3)),
        ("s", "=", frozenset({1, 2})),
        ("f", "=", FnValue({"k": 1, "j": 2})),
    ]
    assert changes(old, old) == []
    assert [p for p, _, _ in changes(None, old)] == ["st", "log", "s", "f"]


def test_render_trace_stuttering_lasso_and_long_values() -> None:
    s1: dict[str, Value] = {"x": 0, "big": tuple(range(40))}
    s2: dict[str, Value] = {"x": 1, "big": tuple(range(40))}
    text = render_trace(
        [
            TraceStep(1, "Init", s1),
            TraceStep(2, "Up", s2),
            TraceStep(3, "Up", s1, loop_to=1),
        ],
        width=60,
    )
    lines = text.splitlines()
    assert lines[0].split() == ["#", "action", "changes"]
    assert lines[2].split()[:4] == ["1", "Init", "x", "="]
    assert all(len(ln) <= 60 for ln in lines)  # the 40-element tuple was wrapped
    assert "big = << 0," in text
    assert any(ln.split()[:4] == ["2", "Up", "x", "="] for ln in lines)
    assert "(back to state 1: the behaviour loops from here)" in text
    stutter = render_trace([TraceStep(1, "Init", s1), TraceStep(2, "Stuttering", s1)])
    assert stutter.splitlines()[-1].split()[:2] == ["2", "Stuttering"]
    assert "nothing changes from here on" in stutter
    assert render_trace([]) == "(no counterexample)"


def test_render_trace_skips_placeholders_shows_set_growth_and_names_the_violation() -> None:
    """An audit row without decision inputs (the spec's NoInputs) prints as
    <<kind, n>>; a row with inputs keeps them; a set that grows prints only
    its new elements, one that shrinks only the removed ones; the table ends
    with what was violated. The JSON form (--trace --json) says the same."""
    e = (1, 0, "call_0")
    inputs = FnValue({**NO_INPUTS, "policy": "reconcile", "attempt": 1, "status": "dispatched",
                      "approval": "approved"})

    def state(rows: frozenset[Value], approved: frozenset[Value]) -> dict[str, Value]:
        return {"audit": FnValue({e: rows}), "humanApproved": approved}

    dispatch = ("dispatch", 1, NO_INPUTS)
    reconcile = ("reconcile", 1, inputs)
    trace = [
        TraceStep(1, "Init", state(frozenset(), frozenset())),
        TraceStep(2, "EnginePersistDispatched", state(frozenset({dispatch}), frozenset({"c1"}))),
        TraceStep(3, "Recover", state(frozenset({dispatch, reconcile}), frozenset({"c1", "c2"}))),
        TraceStep(4, "Forget", state(frozenset({dispatch, reconcile}), frozenset({"c2"}))),
    ]
    text = render_trace(trace, violated="invariant AtMostOnceEffect (in the last state)")
    assert '"none"' not in text  # NoInputs' fields are all placeholders
    assert 'audit[<<1, 0, "call_0">>] = {<<"dispatch", 1>>}' in text  # from {}: the whole set
    step3 = text[text.index("3  Recover"):text.index("4  Forget")]
    assert 'audit[<<1, 0, "call_0">>] \\cup { << "reconcile",' in step3  # only the new row
    assert '"dispatch"' not in step3 and 'policy |-> "reconcile"' in step3  # its inputs kept
    assert 'humanApproved \\cup {"c2"}' in step3
    assert 'humanApproved \\ {"c1"}' in text
    assert text.splitlines()[-1] == "violated: invariant AtMostOnceEffect (in the last state)"
    rows = trace_json(trace)
    assert rows[1]["changes"] == {'audit[<<1, 0, "call_0">>]': '= {<<"dispatch", 1>>}',
                                  "humanApproved": '= {"c1"}'}
    assert rows[2]["changes"]["humanApproved"] == '\\cup {"c2"}'  # type: ignore[index]
    # changes() itself (the notebooks' figures use it) still gives whole values by default
    assert changes(trace[1].state, trace[2].state)[1] == (
        "humanApproved", "=", frozenset({"c1", "c2"}))


# ---------------------------------------------------------------------------
# Against a copy of this repository: which code does `toolledger check` check?

REPO = Path(__file__).resolve().parents[1]
TOOLLEDGER = Path(sys.executable).parent / "toolledger"  # this checkout's (editable) install


def copy_repo(dst: Path) -> Path:
    """A second checkout: spec/, model/ and reference/ of this one (no git, no venv)."""
    for d in ("spec", "model", "reference"):
        skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
        shutil.copytree(REPO / d, dst / d, ignore=skip)
    return dst


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TOOLLEDGER), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)


# the smallest CI model with conformance of a reconcile call (see the tests below)
MODEL = "ReconcileReadonlyOneCrash"


def test_the_command_under_test_is_this_checkouts_install() -> None:
    import toolledger

    assert TOOLLEDGER.is_file()
    assert Path(toolledger.__file__).resolve().parent == REPO / "reference" / "toolledger"


@pytest.mark.slow
def test_a_second_checkout_checks_its_own_reference(tmp_path: Path) -> None:
    """This checkout's `toolledger` (an editable install of *this* reference)
    run in a copy whose recovery rule is broken must check the copy's code."""
    other = copy_repo(tmp_path / "other")
    recovery = other / "reference" / "toolledger" / "_core" / "recovery.py"
    text = recovery.read_text()
    rule = (
        "        elif i.policy is RecoveryPolicy.RECONCILE:\n"
        "            d = Decision.RECONCILE\n"
    )
    assert text.count(rule) == 1
    # broken: a reconcile call found dispatched halts for a human instead of reconciling
    recovery.write_text(text.replace(rule, rule.replace("Decision.RECONCILE",
                                                        "Decision.RECOVERY_REQUIRED")))
    # --root relative to the current directory: the checker runs elsewhere.
    # The one-crash model has the same reconcile and readonly calls as
    # ReconcileReadonly (whose conformance test_conformance checks) at 11,494
    # states instead of 39,281: a crash after the dispatch reaches the rule.
    done = run_cli("check", "--root", "other", "--model", MODEL, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    rows = {ln.split("  ")[0].strip(): ln for ln in done.stdout.splitlines()}
    conformance = rows[f"{MODEL} [conformance]"]
    assert conformance.endswith("DRIFT") and " 0 mismatches" not in conformance
    assert "conforms ok" not in done.stdout
    assert rows[MODEL].endswith("ok")  # the spec copy itself is fine
    # it says which code it checked, and that the command runs from elsewhere
    checked = next(ln for ln in done.stdout.splitlines() if ln.startswith("checked: "))
    assert f"the reference {other / 'reference' / 'toolledger'}" in checked
    assert f"this toolledger command itself runs from {REPO / 'reference' / 'toolledger'}" in (
        checked)
    assert "(not a git checkout)" in checked


def test_a_checkout_without_its_reference_is_refused(tmp_path: Path) -> None:
    other = copy_repo(tmp_path / "other")
    shutil.rmtree(other / "reference")
    done = run_cli("check", "--model", "ReconcileReadonly", cwd=other)
    assert done.returncode == 2
    assert done.stdout == ""
    assert f"{other / 'reference' / 'toolledger'} does not exist" in done.stderr
    assert "--no-conformance" in done.stderr
    assert "running" not in done.stderr  # refused before any model ran


def test_a_reference_shadowed_by_another_package_is_refused(tmp_path: Path) -> None:
    """If Python would import toolledger from anywhere but the root's reference/
    even with it first on PYTHONPATH (here: a sitecustomize that imports
    another package as toolledger, as an import hook of a .pth file could,
    only in processes started in the root's reference/ as the check's child
    processes are), check refuses and names both paths."""
    other = copy_repo(tmp_path / "other")
    shadow, site = tmp_path / "shadow", tmp_path / "site"
    (shadow / "toolledger").mkdir(parents=True)
    (shadow / "toolledger" / "__init__.py").write_text("")
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, sys\n"
        f"if os.getcwd() == {str(other / 'reference')!r}:\n"
        f"    sys.path.insert(0, {str(shadow)!r})\n"
        "    import toolledger\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = run_cli("check", "--model", "ReconcileReadonly", cwd=other, env=env)
    assert done.returncode == 2, done.stderr
    assert "refusing to check" in done.stderr
    assert str(shadow / "toolledger") in done.stderr
    assert str(other / "reference" / "toolledger") in done.stderr


def test_a_spec_typo_leaves_tlc_and_conformance_rows_not_checked(tmp_path: Path) -> None:
    other = copy_repo(tmp_path / "other")
    spec = other / "spec" / "DurableToolExecution.tla"
    text = spec.read_text()
    assert text.count("\nCrash ==\n") == 1
    line = text[: text.index("\nCrash ==\n")].count("\n") + 2
    spec.write_text(text.replace("\nCrash ==\n", "\nCrash == ==\n"))
    done = run_cli("check", "--model", "ReconcileReadonly", "--json", cwd=other)
    assert done.returncode == 1
    rows = json.loads(done.stdout)
    assert [(r["model"], r["check"], r["status"]) for r in rows] == [
        ("ReconcileReadonly", "tlc", "NOT CHECKED"),
        ("ReconcileReadonly", "conformance", "NOT CHECKED"),
    ]
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("spec/")]
    assert errors == [
        f'spec/DurableToolExecution.tla:{line}:10: Was expecting "Expression or Instance"; '
        f'Encountered "==" at line {line}, column 10 and token "=="'
    ]
    assert "DRIFT" not in done.stdout + done.stderr


# ---------------------------------------------------------------------------
# Honest conformance rows: the issue-24 scenario, a guard dropped from the spec.

GUARD = '    /\\ stage[c] = "reconciling" /\\ applied[e] = 0\n'


@pytest.mark.slow
def test_a_failed_run_leaves_conformance_not_checked_and_the_real_drift_is_shown(
    tmp_path: Path,
) -> None:
    """Drop `/\\ applied[e] = 0` from EngineReconcileNotApplied in a copy of
    the spec. ReconcileReadonlyOneCrash violates AtMostOnceEffect: TLC stops
    early, so its conformance row is NOT CHECKED with the reason (comparing the
    reference with that partial graph reported 591 false mismatches). The same
    model checking TypeOK only (a cfg and manifest row added to the copy) runs
    to the end, and its conformance row reports the real drift: the spec now
    allows EngineReconcileNotApplied where the reference refuses it, grouped,
    counted, and shown first as a step table."""
    other = copy_repo(tmp_path / "other")
    tla = other / "spec" / "DurableToolExecution.tla"
    text = tla.read_text()
    assert text.count(GUARD) == 1, "the guard this test drops is not in the spec any more"
    tla.write_text(text.replace(GUARD, '    /\\ stage[c] = "reconciling"\n'))
    cfg = (other / "model" / "ReconcileReadonlyOneCrash.cfg").read_text()
    (other / "model" / "TypeOKOnly.cfg").write_text(
        cfg.split("INVARIANTS")[0] + "INVARIANT TypeOK\n")
    manifest = other / "model" / "manifest.toml"
    [block] = [b for b in manifest.read_text().split("[[model]]")
               if 'name = "ReconcileReadonlyOneCrash"' in b]
    manifest.write_text(manifest.read_text() + "\n[[model]]" + block.replace(
        'name = "ReconcileReadonlyOneCrash"', 'name = "TypeOKOnly"').replace(
        'cfg = "ReconcileReadonlyOneCrash.cfg"', 'cfg = "TypeOKOnly.cfg"'))
    done = run_cli("check", "--model", "ReconcileReadonlyOneCrash", "--model", "TypeOKOnly",
                   cwd=other)
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    rows = {ln.split("  ")[0]: ln.split() for ln in out.splitlines()[2:6]}
    assert rows["ReconcileReadonlyOneCrash"][2] == "AtMostOnceEffect"
    assert rows["ReconcileReadonlyOneCrash [conformance]"][-2:] == ["NOT", "CHECKED"]
    assert ("ReconcileReadonlyOneCrash [conformance]: conformance not checked: TLC stopped at "
            "the first violation (AtMostOnceEffect) after ") in out
    whole = load_manifest(other).get("ReconcileReadonlyOneCrash").distinct_states
    assert f"of the model's {whole:,} states" in out
    assert "reference allows" not in out  # no false mismatch from the partial graph
    assert rows["TypeOKOnly"][2] == "pass"
    assert rows["TypeOKOnly [conformance]"][-1] == "DRIFT"
    [first] = [ln for ln in out.splitlines() if ln.startswith("TypeOKOnly [conformance]: ")]
    assert first.split(": ", 1)[1].split(";")[0].endswith(
        "mismatches on EngineReconcileNotApplied: the spec allows, the reference refuses")
    after = out[out.index(first):]
    assert " EngineReconcileNotApplied (!)  " in after  # the step table ends with that step
    assert "the spec takes step (!); the reference has no such step" in after


# ---------------------------------------------------------------------------
# One Ctrl-C stops everything.

# LedgerPass takes about a second, each Big about a minute.
SLOW_MANIFEST = "[[model]]" + MANIFEST.split("[[model]]")[1] + "".join(
    f"""
[[model]]
name = "Big{i}"
module = "Ledger"
cfg = "LedgerBig.cfg"
check_deadlock = false
ci = true
expect = "pass"
distinct_states = 1
question = "about a minute of TLC: only here to be interrupted"
"""
    for i in (1, 2, 3)
)


def processes_under(marker: Path, program: bytes = b"java") -> list[int]:
    """Pids of live ``program`` processes whose command line names ``marker``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        zombie = stat.rpartition(")")[2].split()[0] == "Z"  # exited, not yet reaped
        name = argv[0].rpartition(b"/")[2]
        if program in name and not zombie and str(marker).encode() in b" ".join(argv):
            pids.append(int(entry.name))
    return pids


_TGKILL = {"x86_64": 234, "aarch64": 131}  # the tgkill syscall's number


def send_to_a_worker_thread(pid: int, signum: int) -> None:
    """Send ``signum`` to a thread of ``pid`` other than its main thread (tgkill).

    The kernel delivers a process-directed signal to any thread; one that
    lands on a worker (blocked reading TLC's pipe) does not wake the main
    thread, which alone runs Python's handlers. This makes that case certain."""
    import ctypes

    number = _TGKILL.get(os.uname().machine)
    assert number is not None, f"no tgkill number for {os.uname().machine}: add it"
    tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)
    assert tids, "the check has no worker thread"
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(number, pid, tids[0], signum) == 0, ctypes.get_errno()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "signum", "status", "name"),
    [
        ("process", signal.SIGINT, 130, "Ctrl-C"),
        ("process group", signal.SIGINT, 130, "Ctrl-C"),
        ("worker thread", signal.SIGINT, 130, "Ctrl-C"),
        ("process", signal.SIGTERM, 143, "SIGTERM"),
    ],
)
def test_one_sigint_stops_the_check(
    tmp_path: Path, target: str, signum: int, status: int, name: str
) -> None:
    """A real SIGINT to a real `toolledger check` with two JVMs running and
    one model queued: exit 130 with the rows finished so far and an
    "interrupted" line; the queued model never starts; no java process and
    no temporary directory is left. "process group" is what a Ctrl-C in a
    terminal does: the signal also reaches everything in the foreground group.
    A SIGTERM (a cancelled CI job) is handled the same way (exit 143)."""
    root = make_root(tmp_path / "proj", SLOW_MANIFEST)
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    proc = subprocess.Popen(
        [str(TOOLLEDGER), "check", "--root", str(root), "--jobs", "2", "--no-conformance"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env=env, start_new_session=True,
    )
    err_lines: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: err_lines.extend(proc.stderr or ()), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        # LedgerPass finished, Big1 and Big2 run (two JVMs), Big3 waits
        while not (any(ln.startswith("[1/4] LedgerPass") for ln in err_lines)
                   and any(ln.startswith("started Big2") for ln in err_lines)
                   and len(processes_under(temp)) == 2):
            assert proc.poll() is None, "".join(err_lines)
            assert time.monotonic() < deadline, "".join(err_lines)
            time.sleep(0.05)
        if target == "process":
            proc.send_signal(signum)
        elif target == "worker thread":
            send_to_a_worker_thread(proc.pid, signum)
        else:
            os.killpg(proc.pid, signum)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    err = "".join(err_lines)
    assert proc.returncode == status, out + err
    assert "Traceback" not in out + err
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines()[2:] if ln.startswith("LedgerPass")}
    assert rows["LedgerPass"][-1] == "ok"  # the finished row is reported
    assert not any(ln.startswith("Big") for ln in out.splitlines()), out + err
    interrupted = [ln for ln in out.splitlines() if ln.startswith(f"interrupted ({name}) after")]
    assert len(interrupted) == 1, out
    assert "1 of 4 models finished" in interrupted[0]
    assert "not finished: Big1, Big2, Big3" in interrupted[0]
    assert "started Big3" not in err  # no new model after the SIGINT
    assert processes_under(temp) == []
    assert list(temp.iterdir()) == []  # every toolledger-* directory was removed


@pytest.mark.slow
@pytest.mark.parametrize("target", ["process", "process group", "worker thread"])
def test_sigint_during_the_parse_exits_130_with_one_line(tmp_path: Path, target: str) -> None:
    """A Ctrl-C while SANY parses (the first seconds of every check): exit 130
    and one "interrupted" line, no traceback, no JVM or temporary directory
    left. SANY's JVM is frozen (SIGSTOP) once it exists, so the signal lands
    during the parse however fast the machine is; the cancel kills it anyway."""
    root = make_root(tmp_path / "proj")
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = subprocess.Popen(
        [str(TOOLLEDGER), "check", "--root", str(root), "--no-conformance"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env={**os.environ, "TMPDIR": str(temp)}, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (sany := [p for p in processes_under(temp)
                            if b"tla2sany.SANY" in Path(f"/proc/{p}/cmdline").read_bytes()]):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(sany[0], signal.SIGSTOP)
        if target == "process":
            proc.send_signal(signal.SIGINT)
        elif target == "worker thread":
            send_to_a_worker_thread(proc.pid, signal.SIGINT)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out + err
    assert "Traceback" not in out + err
    [line] = out.splitlines()
    assert line.startswith("interrupted (Ctrl-C) after ")
    assert "before SANY's parse of the spec was done: nothing was checked" in line
    left = processes_under(temp)
    assert left == [], [Path(f"/proc/{p}/cmdline").read_bytes() for p in left]
    assert list(temp.iterdir()) == []


@pytest.mark.slow
def test_sigint_during_conformance_kills_the_checker_and_its_workers(tmp_path: Path) -> None:
    other = copy_repo(tmp_path / "other")
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = subprocess.Popen(
        [str(TOOLLEDGER), "check", "--model", MODEL], cwd=other,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env={**os.environ, "TMPDIR": str(temp)},
    )
    err_lines: list[str] = []
    reader = threading.Thread(target=lambda: err_lines.extend(proc.stderr or ()), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 180
        # the conformance process and its 2 workers (fork) hold the dump's path
        while len(processes_under(temp, b"python")) < 2:
            assert proc.poll() is None, "".join(err_lines)
            assert time.monotonic() < deadline, "".join(err_lines)
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    err = "".join(err_lines)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in out + err
    assert next(ln for ln in out.splitlines() if ln.startswith(f"{MODEL} ")).endswith("ok")
    assert f"{MODEL} [conformance]" not in out
    line = next(ln for ln in out.splitlines() if ln.startswith("interrupted (Ctrl-C)"))
    assert "1 of 1 model finished" in line and f"conformance not checked: {MODEL}" in line
    assert processes_under(temp, b"python") == [] and processes_under(temp) == []
    assert list(temp.iterdir()) == []


def test_checked_line_names_the_commit_and_uncommitted_changes(tmp_path: Path) -> None:
    root = make_root(tmp_path / "proj")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], env=env, check=True,
                              capture_output=True, text=True).stdout.strip()

    assert cli._git_state(root) == "not a git checkout"
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "models")
    head = git("rev-parse", "HEAD")
    assert cli._git_state(root) == f"git {head[:12]}"
    (root / "spec" / "Stuck.tla").write_text("changed")
    assert cli._git_state(root) == f"git {head[:12]}, with uncommitted changes"
    # a directory inside some other checkout is not that checkout
    assert cli._git_state(root / "spec") == "not a git checkout"


def test_a_conformance_row_left_to_make_test_runs_with_all(tmp_path: Path) -> None:
    """conformance_tier = "test": `toolledger check` runs the model with TLC
    and says its conformance row is left to make test; --all runs the row;
    --model NAME runs it too (asked for by name)."""
    other = copy_repo(tmp_path / "other")
    entry = next(t for t in (REPO / "model" / "manifest.toml").read_text().split("[[model]]")
                 if 'name = "Renumbered"' in t)
    assert "conformance = true" in entry
    (other / "model" / "manifest.toml").write_text(
        "[[model]]" + entry.replace("conformance = true",
                                    'conformance = true\nconformance_tier = "test"'))
    plain = run_cli("check", "--json", cwd=other)
    assert plain.returncode == 0, plain.stderr
    assert [(r["model"], r["check"]) for r in json.loads(plain.stdout)] == [
        ("Renumbered", "tlc")]
    assert "the conformance of Renumbered is left to make test" in plain.stderr
    for args in (["--all"], ["--model", "Renumbered"]):
        done = run_cli("check", "--json", *args, cwd=other)
        assert done.returncode == 0, done.stderr
        rows = json.loads(done.stdout)
        assert [(r["model"], r["check"], r["status"]) for r in rows] == [
            ("Renumbered", "tlc", "ok"), ("Renumbered", "conformance", "ok")]
        assert "left to make test" not in done.stderr
    both = run_cli("check", "--all", "--no-conformance", cwd=other)
    assert both.returncode == 2
    assert "--all and --no-conformance contradict each other" in both.stderr + both.stdout


def test_a_tlc_row_left_to_make_test_runs_with_all(tmp_path: Path) -> None:
    """tier = "test": `toolledger check` does not run the model and says so on
    its last line; --all and --model NAME run it."""
    other = copy_repo(tmp_path / "other")
    entries = [t for t in (REPO / "model" / "manifest.toml").read_text().split("[[model]]")
               if 'name = "SuccessOnlyRecord"' in t or 'name = "AuditOnlyHalts"' in t]
    assert len(entries) == 2 and all("ci = true" in t for t in entries)
    left = entries[0].replace("ci = true", 'ci = true\ntier = "test"', 1)
    (other / "model" / "manifest.toml").write_text("[[model]]" + left + "[[model]]" + entries[1])
    name = next(n for n in ("SuccessOnlyRecord", "AuditOnlyHalts") if f'"{n}"' in left)
    kept = "AuditOnlyHalts" if name == "SuccessOnlyRecord" else "SuccessOnlyRecord"
    plain = run_cli("check", "--json", cwd=other)
    assert plain.returncode == 0, plain.stderr
    assert [r["model"] for r in json.loads(plain.stdout)] == [kept]
    assert f"the TLC rows of {name} are left to make test" in plain.stderr
    for args in (["--all"], ["--model", name]):
        done = run_cli("check", "--json", *args, cwd=other)
        assert done.returncode == 0, done.stderr
        assert name in [r["model"] for r in json.loads(done.stdout)]
        assert "left to make test" not in done.stderr


@pytest.mark.parametrize(("model", "line", "says"), [
    ("Renumbered", 'ci = true\ntier = "nightly"',
     "tier = 'nightly' must be one of 'check', 'test'"),
    ("SuccessOnlyRecord", 'ci = false\ntier = "test"', "tier needs ci = true"),
    ("Renumbered", 'ci = true\ntier = "test"',
     'tier = "test" with a conformance row make check runs'),
])
def test_tier_is_validated(tmp_path: Path, model: str, line: str, says: str) -> None:
    other = copy_repo(tmp_path / "other")
    manifest = other / "model" / "manifest.toml"
    text = manifest.read_text()
    entry = next(t for t in text.split("[[model]]") if f'name = "{model}"' in t)
    assert entry.count("ci = true\n") == 1
    manifest.write_text(text.replace(entry, entry.replace("ci = true", line, 1), 1))
    done = run_cli("check", "--model", model, cwd=other)
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stdout + done.stderr


def test_conformance_tier_is_validated(tmp_path: Path) -> None:
    other = copy_repo(tmp_path / "other")
    manifest = other / "model" / "manifest.toml"
    text = manifest.read_text()
    manifest.write_text(text.replace('distinct_states = 1544\nconformance = true',
                                     'distinct_states = 1544\nconformance = true\n'
                                     'conformance_tier = "nightly"', 1))
    done = run_cli("check", "--model", "Renumbered", cwd=other)
    assert done.returncode == 2
    assert "conformance_tier = 'nightly' must be one of 'check', 'test'" in (
        done.stdout + done.stderr)


def test_tlc_runs_c1_only_except_for_big_runs() -> None:
    """C1 only (short runs: C2's compilations cost more than they save),
    except where TLC checks temporal PROPERTIES on a big graph or any
    check on a very big one; a run of unknown size is taken as small."""
    from toolledger.check.tlc import (
        C1_ONLY,
        C2_MIN_STATES,
        C2_MIN_STATES_DUMP,
        C2_MIN_STATES_SAFETY,
        jit_args,
    )

    states = {m.name: m.distinct_states for m in load_manifest(REPO).models}
    assert C1_ONLY == ("-XX:TieredStopAtLevel=1",)
    for name in ("ReconcileReadonly", "DeepReconcile"):  # safety, below the bound
        assert states[name] < C2_MIN_STATES_SAFETY
        assert jit_args(REPO / "model" / f"{name}.cfg", states[name]) == C1_ONLY
    for name in ("TwoCalls", "SameTurnCrashRetry"):
        assert states[name] >= C2_MIN_STATES_SAFETY
        assert jit_args(REPO / "model" / f"{name}.cfg", states[name]) == ()
    for name in ("Liveness", "LivenessNoHumanFairness"):
        assert C2_MIN_STATES <= states[name] < C2_MIN_STATES_SAFETY
        assert jit_args(REPO / "model" / f"{name}.cfg", states[name]) == ()
    for name in ("LivenessReconcile", "LivenessKeyExpiry"):  # temporal, but small
        assert states[name] < C2_MIN_STATES
        assert jit_args(REPO / "model" / f"{name}.cfg", states[name]) == C1_ONLY
    assert jit_args(REPO / "model" / "Liveness.cfg", None) == C1_ONLY
    # a run with a state-graph dump: C2 from C2_MIN_STATES_DUMP states
    for name in ("ReconcileReadonly", "LegacyUpgrade"):
        assert C2_MIN_STATES_DUMP <= states[name] < C2_MIN_STATES_SAFETY
        assert jit_args(REPO / "model" / f"{name}.cfg", states[name]) == C1_ONLY
        assert jit_args(REPO / "model" / f"{name}.cfg", states[name], dump=True) == ()
    for name in ("SameTurnOneCrash", "ReconcileReadonlyOneCrash"):
        assert states[name] < C2_MIN_STATES_DUMP
        assert jit_args(REPO / "model" / f"{name}.cfg", states[name], dump=True) == C1_ONLY


def test_run_tlc_chooses_the_jit_from_the_expected_states(tmp_path: Path) -> None:
    """run_tlc without ``jvm_args`` starts java with :func:`jit_args`' flags
    for ``expected_states``; explicit ``jvm_args`` are used as they are."""
    from toolledger.check.tlc import C1_ONLY, run_tlc

    entry = load_manifest(REPO).get("LivenessReconcile")
    dirs = [REPO / "spec", REPO / "model"]
    small = run_tlc(entry.module, entry.cfg_path, search_dirs=dirs,
                    check_deadlock=entry.check_deadlock, expected_states=entry.distinct_states)
    big = run_tlc(entry.module, entry.cfg_path, search_dirs=dirs,
                  check_deadlock=entry.check_deadlock, expected_states=10**6)
    chosen = run_tlc(entry.module, entry.cfg_path, search_dirs=dirs,
                     check_deadlock=entry.check_deadlock, expected_states=10**6,
                     jvm_args=C1_ONLY)
    assert C1_ONLY[0] in small.command and C1_ONLY[0] not in big.command
    assert C1_ONLY[0] in chosen.command
    assert small.distinct_states == big.distinct_states == entry.distinct_states


@pytest.mark.slow
def test_exercises_answers_unchanged_models_from_the_tlc_cache(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`toolledger exercises` keeps its -coverage runs in the TLC cache: a second
    run writes the same table without a JVM, and a changed module re-runs only
    the models that read it (a twin added beside the others costs one run)."""
    root = make_root(tmp_path / "p")
    cache = tmp_path / "cache"
    args = ["exercises", "--root", str(root), "--tlc-cache", str(cache), "--jobs", "1"]
    assert main(args) == 0
    first = (root / "model" / "exercises.json").read_text()
    assert "0 of them answered" in capsys.readouterr().out
    assert main(args) == 0
    out = capsys.readouterr()
    assert "3 models, 3 of them answered" in out.out and out.err.count("(cached)") == 3
    assert (root / "model" / "exercises.json").read_text() == first
    stuck = root / "spec" / "Stuck.tla"
    stuck.write_text(stuck.read_text() + "\n\\* a comment: the module's bytes changed\n")
    assert main(args) == 0
    out = capsys.readouterr()
    assert "3 models, 2 of them answered" in out.out
    assert [line for line in out.err.splitlines() if "(cached)" not in line] == [
        line for line in out.err.splitlines() if line.split(": ")[0].endswith("Stuck")]
    assert main([*args[:-2], "--no-tlc-cache", "--jobs", "1"]) == 0
    assert "answered" not in capsys.readouterr().out
