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
import json
import shutil
from pathlib import Path

import pytest

from toolledger import cli
from toolledger.cli import Row, Subcommand, changes, main, render_trace
from toolledger.manifest import Manifest, ModelEntry
from toolledger.tlavalues import FnValue, ModelValue, Value
from toolledger.tlc import TraceStep

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
    rows = {ln.split()[0]: ln.split() for ln in lines[2:] if not ln.startswith("total ")}
    assert set(rows) == {"LedgerPass", "LedgerRetry", "Stuck"}  # CI models only
    assert lines[-1].startswith("total wall time ")
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
    out = capsys.readouterr().out
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
def test_parse_error_is_an_error_row_with_sany_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check(make_root(tmp_path), "--model", "Broken") == 1
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.startswith("Broken "))
    assert row.split()[2] == "parse-error" and row.split()[-1] == "ERROR"
    assert "***Parse Error***" in out


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
