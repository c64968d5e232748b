"""The manifest loader accepts valid manifests and explains every invalid one.

Under test: ``toolledger.check.manifest``. Each invalid manifest below breaks one
rule; the error must name the model and say what to change. Valid entries
must resolve to the outcome the cfg implies (an expected name is an
INVARIANT or a PROPERTY of the cfg). ``drift`` must flag a wrong outcome, a
wrong violated name and a wrong state count.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from toolledger.check.manifest import (
    MANIFEST,
    ManifestError,
    drift,
    find_root,
    load_manifest,
    result_label,
)
from toolledger.check.tlc import Outcome, TLCResult

FIXTURES = Path(__file__).parent / "fixtures" / "tla"

GOOD = """
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
ci = false
expect = "AtMostOneAttempt"
distinct_states = 36
question = "can a call be dispatched twice?"
conformance = true
workers = 2

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
ci = true
expect = "Settle"
distinct_states = 3
question = "does x settle at 2?"
"""


def make_root(tmp_path: Path, manifest: str) -> Path:
    """A project root: spec/ with the fixture modules, model/ with their cfgs and the manifest."""
    (tmp_path / "spec").mkdir(parents=True)
    (tmp_path / "model").mkdir()
    for f in FIXTURES.glob("*.tla"):
        shutil.copyfile(f, tmp_path / "spec" / f.name)
    for f in FIXTURES.glob("*.cfg"):
        shutil.copyfile(f, tmp_path / "model" / f.name)
    (tmp_path / MANIFEST).write_text(manifest)
    return tmp_path


def errors_of(tmp_path: Path, manifest: str) -> str:
    root = make_root(tmp_path, manifest)
    with pytest.raises(ManifestError) as err:
        load_manifest(root)
    return str(err.value)


def test_valid_manifest_loads_with_defaults_and_resolved_outcomes(tmp_path: Path) -> None:
    m = load_manifest(make_root(tmp_path, GOOD))
    assert m.names() == ["LedgerPass", "LedgerRetry", "Stuck", "Settle"]
    assert [e.name for e in m.ci_models()] == ["LedgerPass", "Stuck", "Settle"]
    by = {e.name: e for e in m.models}
    assert by["LedgerPass"].expected_outcome is Outcome.PASS
    assert by["LedgerRetry"].expected_outcome is Outcome.INVARIANT_VIOLATED
    assert by["Stuck"].expected_outcome is Outcome.DEADLOCK
    assert by["Settle"].expected_outcome is Outcome.PROPERTY_VIOLATED
    assert by["LedgerRetry"].expected_violation == "AtMostOneAttempt"
    assert by["LedgerPass"].expected_violation is None
    assert (by["LedgerPass"].conformance, by["LedgerPass"].workers) == (False, 1)
    assert (by["LedgerRetry"].conformance, by["LedgerRetry"].workers) == (True, 2)
    assert by["Stuck"].cfg_path == tmp_path / "model" / "Stuck.cfg"
    assert m.search_dirs == [tmp_path / "spec", tmp_path / "model"]
    assert m.get("Stuck") is by["Stuck"]
    with pytest.raises(KeyError, match="no model named 'Nope'; the models are: LedgerPass, "):
        m.get("Nope")


def test_find_root_walks_up(tmp_path: Path) -> None:
    root = make_root(tmp_path, GOOD)
    deep = root / "a" / "b"
    deep.mkdir(parents=True)
    assert find_root(deep) == root.resolve()
    with pytest.raises(ManifestError, match=r"no model/manifest\.toml in .* or any parent"):
        find_root(Path("/"))


def test_project_manifest_is_valid() -> None:
    root = find_root(Path(__file__).parent)
    m = load_manifest(root)
    assert m.ci_models()


def test_unknown_key_is_named_with_a_suggestion(tmp_path: Path) -> None:
    text = GOOD.replace("distinct_states = 3\n", "distinct_state = 3\n", 1)
    msg = errors_of(tmp_path, text)
    assert "model 'Stuck': unknown key 'distinct_state' (did you mean 'distinct_states'?)" in msg
    assert "model 'Stuck': missing 'distinct_states': add distinct_states = <an integer>" in msg


def test_missing_fields(tmp_path: Path) -> None:
    text = GOOD.replace('question = "does the counter get stuck?"\n', "")
    text = text.replace('name = "Stuck"\n', "")
    msg = errors_of(tmp_path, text)
    assert "[[model]] #3: missing 'name': add name = <a string>" in msg
    assert "[[model]] #3: missing 'question'" in msg
    assert "2 problem(s)" in msg


def test_wrong_types(tmp_path: Path) -> None:
    text = GOOD.replace("distinct_states = 108", "distinct_states = true")
    text = text.replace("ci = false", 'ci = "no"')
    text = text.replace("workers = 2", "workers = 0")
    msg = errors_of(tmp_path, text)
    assert "model 'LedgerPass': distinct_states = True must be an integer" in msg
    assert "model 'LedgerRetry': ci = 'no' must be true or false" in msg
    text = GOOD.replace("workers = 2", "workers = 0")
    msg = errors_of(tmp_path / "2", text)
    assert "model 'LedgerRetry': workers = 0 must be >= 1" in msg


def test_duplicate_names(tmp_path: Path) -> None:
    msg = errors_of(tmp_path, GOOD.replace('name = "Settle"', 'name = "Stuck"'))
    assert "model 'Stuck': the name is also used by [[model]] #3: names must be unique" in msg


def test_missing_cfg_and_module(tmp_path: Path) -> None:
    text = GOOD.replace('cfg = "Stuck.cfg"', 'cfg = "Stuk.cfg"')
    text = text.replace('module = "Live"', 'module = "Lively"')
    msg = errors_of(tmp_path, text)
    assert "model 'Stuck': cfg file model/Stuk.cfg does not exist" in msg
    assert "model 'Settle': module Lively not found: no Lively.tla in spec/ or model/" in msg
    msg = errors_of(tmp_path / "2", GOOD.replace('cfg = "Stuck.cfg"', 'cfg = "../Stuck.cfg"'))
    assert "must be a file name in model/ ending in .cfg" in msg
    msg = errors_of(tmp_path / "3", GOOD.replace('module = "Stuck"', 'module = "Stuck.tla"'))
    assert "model 'Stuck': module = 'Stuck.tla' must be a module name, without .tla" in msg


def test_expect_must_be_checked_by_the_cfg(tmp_path: Path) -> None:
    msg = errors_of(
        tmp_path, GOOD.replace('expect = "AtMostOneAttempt"', 'expect = "AtMostOnceAttempt"')
    )
    assert "model 'LedgerRetry': expect = 'AtMostOnceAttempt' is not" in msg
    assert "(did you mean 'AtMostOneAttempt'?)" in msg
    assert "the cfg checks: TypeOK, AtMostOneAttempt" in msg


def test_deadlock_expectation_needs_deadlock_checking(tmp_path: Path) -> None:
    text = GOOD.replace(
        'cfg = "Stuck.cfg"\ncheck_deadlock = true', 'cfg = "Stuck.cfg"\ncheck_deadlock = false'
    )
    msg = errors_of(tmp_path, text)
    assert "model 'Stuck': expect = \"deadlock\" needs check_deadlock = true" in msg


def test_bad_toml_and_structure(tmp_path: Path) -> None:
    assert "is not valid TOML" in errors_of(tmp_path / "a", "[[model]\nname = 1")
    assert "no [[model]] tables" in errors_of(tmp_path / "b", "")
    assert "unknown top-level key(s) models" in errors_of(tmp_path / "c", "models = 1\n" + GOOD)
    assert "must be an array of tables" in errors_of(tmp_path / "d", "model = 3\n")
    with pytest.raises(ManifestError, match="does not exist"):
        load_manifest(tmp_path / "nowhere")


def test_all_problems_reported_at_once(tmp_path: Path) -> None:
    text = GOOD.replace("ci = true", "ci = 1").replace('expect = "pass"', 'expect = "nope"')
    msg = errors_of(tmp_path, text)
    assert "model 'LedgerPass': ci = 1 must be true or false" in msg
    assert "model 'Stuck': ci = 1" in msg and "model 'Settle': ci = 1" in msg
    assert "4 problem(s)" not in msg and "3 problem(s)" in msg


def _result(outcome: Outcome, violated: str | None, distinct: int | None) -> TLCResult:
    return TLCResult(
        outcome=outcome,
        violated=violated,
        distinct_states=distinct,
        generated_states=None,
        depth=None,
        wall_seconds=0.0,
        exit_code=0,
        trace=(),
        error_text="",
        output="",
    )


def test_drift(tmp_path: Path) -> None:
    m = load_manifest(make_root(tmp_path, GOOD))
    retry, ok = m.get("LedgerRetry"), m.get("LedgerPass")
    assert drift(retry, _result(Outcome.INVARIANT_VIOLATED, "AtMostOneAttempt", 36)) == []
    assert drift(retry, _result(Outcome.INVARIANT_VIOLATED, "TypeOK", 36)) == [
        "expected AtMostOneAttempt, got TypeOK"
    ]
    assert drift(retry, _result(Outcome.INVARIANT_VIOLATED, "AtMostOneAttempt", 37)) == [
        "expected 36 distinct states, got 37"
    ]
    assert drift(ok, _result(Outcome.PASS, None, 108)) == []
    assert drift(ok, _result(Outcome.PARSE_ERROR, None, None)) == [
        "expected pass, got parse-error",
        "expected 108 distinct states, got None",
    ]
    unnamed = drift(m.get("Settle"), _result(Outcome.PROPERTY_VIOLATED, None, 3))
    assert unnamed and "does not name" in unnamed[0]
    assert result_label(_result(Outcome.DEADLOCK, None, 3)) == "deadlock"
    assert result_label(_result(Outcome.TIMEOUT, None, 3)) == "timeout"


def test_twin_and_probe_fields_are_validated(tmp_path: Path) -> None:
    retry = 'expect = "AtMostOneAttempt"\n'
    ok = load_manifest(make_root(tmp_path / "ok", GOOD.replace(
        retry, retry + 'witnesses = ["AtMostOneAttempt"]\n')))
    assert ok.get("LedgerRetry").witnesses == ("AtMostOneAttempt",)
    assert ok.get("LedgerPass").witnesses == () and ok.get("LedgerPass").antecedent_of == ()
    msg = errors_of(tmp_path / "a", GOOD.replace(retry, retry + 'witnesses = ["TypeOK"]\n'))
    assert "model 'LedgerRetry': a twin must be expected to violate one of its witnesses" in msg
    msg = errors_of(tmp_path / "b", GOOD.replace(retry, retry + 'witnesses = ["Nope"]\n'))
    assert "witnesses names 'Nope', which is not a safety INVARIANT of model/LedgerRetry.cfg" in msg
    msg = errors_of(tmp_path / "c", GOOD.replace(retry, retry + "witnesses = []\n"))
    assert "witnesses must be a non-empty list of invariant names" in msg
    msg = errors_of(tmp_path / "d", GOOD.replace(
        retry, retry + 'antecedent_of = ["AtMostOneAttempt"]\n'))
    assert "model 'LedgerRetry': a probe's cfg checks exactly one Witness_* invariant" in msg
    msg = errors_of(tmp_path / "e", GOOD.replace(
        retry, retry + 'antecedent_of = ["X"]\nwitnesses = ["AtMostOneAttempt"]\n'))
    assert "a twin (witnesses) or a probe (antecedent_of), not both" in msg


def test_a_probe_must_run_on_a_must_pass_models_constants(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    shutil.copytree(root / "spec", tmp_path / "spec")
    shutil.copytree(root / "model", tmp_path / "model")
    assert load_manifest(tmp_path).get("Witness_LegacyInvoked").antecedent_of
    cfg = tmp_path / "model" / "Witness_LegacyInvoked.cfg"
    cfg.write_text(cfg.read_text().replace("MaxCrashes <- MCMaxCrashes", "MaxCrashes = 0"))
    with pytest.raises(ManifestError, match=r"model 'Witness_LegacyInvoked': a probe must run "
                       r"on a ci must-pass model: no ci model with expect = \"pass\" runs "
                       r"module MCLegacyUpgrade with the constants of "
                       r"model/Witness_LegacyInvoked\.cfg"):
        load_manifest(tmp_path)
