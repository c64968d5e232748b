"""Every CI model of the manifest gives the recorded outcome and state count,
and today's engine fails exactly as the seed report says.

The models run as ``toolledger check`` runs them: the probes of a must-pass
model batched into its run (:mod:`toolledger.check.batch`, the same plan
over the same CI set, so the same generated modules), each other model
alone.  With ``TOOLLEDGER_TLC_CACHE`` (``make`` sets it, and ``make check``
fills the same directory) a run whose every input is byte-for-byte one that
``make check`` already ran is answered from that run's output
(:mod:`toolledger.check.tlccache`) instead of starting TLC again; every row
is still checked against the manifest here.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from checker_support import ROOT
from toolledger.check.batch import Batch, batch_files, plan, split_result
from toolledger.check.manifest import ModelEntry, drift, load_manifest
from toolledger.check.tlc import Outcome, TLCResult, run_tlc
from toolledger.check.tlccache import cache_from_env

MANIFEST = load_manifest(ROOT)
CI_MODELS = [m for m in MANIFEST.ci_models() if not m.conformance]  # those run in test_conformance
CACHE = cache_from_env()


def _batches() -> dict[str, Batch]:
    """Row name -> its batch in ``toolledger check``'s plan of the rows make
    check runs (a batch hosted by a conformance model included: make check
    runs it with a dump when its conformance row is make check's, and a run
    with a dump that passes is cached under the key of the same run without
    one too; a host's own row is the conformance test's).  The rows make
    check leaves to this module (``tier = "test"``) run alone."""
    batches, _ = plan(MANIFEST.check_models())
    return {e.name: b for b in batches for e in b.entries}


BATCH_OF = _batches()
_RESULTS: dict[str, dict[str, TLCResult]] = {}
_LOCK = threading.Lock()


def _run(entry: ModelEntry, tmp: Path) -> TLCResult:
    batch = BATCH_OF.get(entry.name)
    if batch is None:
        return run_tlc(entry.module, entry.cfg_path, search_dirs=MANIFEST.search_dirs,
                       check_deadlock=entry.check_deadlock, workers=entry.workers, cache=CACHE)
    with _LOCK:
        if batch.module not in _RESULTS:  # the batch's first row runs it, the others reuse it
            where = tmp / batch.module
            _, cfg = batch_files(batch, where)
            base = batch.base
            result = run_tlc(batch.module, cfg, search_dirs=[*MANIFEST.search_dirs, where],
                             check_deadlock=base.check_deadlock, workers=base.workers,
                             cache=CACHE)
            _RESULTS[batch.module] = split_result(batch, result)
    return _RESULTS[batch.module][entry.name]


@pytest.mark.parametrize("entry", CI_MODELS, ids=[m.name for m in CI_MODELS])
def test_model_matches_the_manifest(entry: ModelEntry, tmp_path_factory: pytest.TempPathFactory
                                    ) -> None:
    result = _run(entry, tmp_path_factory.getbasetemp())
    assert drift(entry, result) == [], result.output[-2000:]


def test_the_batches_here_are_those_of_make_check() -> None:
    """Every batch used here is one of ``toolledger check``'s, under its generated
    module name (what makes the cache keys of the two equal), and every CI row
    outside them runs alone."""
    batches, alone = plan(MANIFEST.check_models())
    used = {b.module: b for b in BATCH_OF.values()}
    assert used and all(b in batches for b in used.values())
    hosted = {e.name for b in used.values() for e in b.entries}
    left_to_test = {e.name for e in CI_MODELS if e.tier == "test"}
    assert not hosted & left_to_test
    assert {e.name for e in CI_MODELS} - hosted <= {e.name for e in alone} | left_to_test


def test_ci_set_covers_what_the_issue_asks() -> None:
    from toolledger.check.system import ModelConfig
    from toolledger.notebook.support import models_of_spec

    policies: set[str] = set()
    calls = crashes = 0
    # the protocol's own models: not LegacyResume's, ConcurrentResumers' or the
    # Decide tie's (other specs, other constants)
    for m in models_of_spec(MANIFEST):
        # MCTwins holds the broken twins' one-call constants, not a protocol model
        if not m.ci or m.expect != "pass" or m.module == "MCTwins":
            continue
        cfg = ModelConfig.from_mc_module(ROOT / "model" / f"{m.module}.tla")
        policies |= {c.tool.policy.value for c in cfg.calls}
        calls, crashes = max(calls, len(cfg.calls)), max(crashes, cfg.max_crashes)
    assert policies == {"readonly", "manual", "idempotent", "reconcile"}
    assert calls >= 2 and crashes >= 2


def test_legacy_counterexample_is_the_seed_reproduction() -> None:
    """openworker #443: approve, deliver, crash before the result is durable,
    resume with the old approval, deliver again."""
    result = run_tlc(
        "MCLegacyResume",
        ROOT / "model" / "LegacyResume.cfg",
        search_dirs=MANIFEST.search_dirs,
        check_deadlock=False,
    )
    assert result.outcome is Outcome.INVARIANT_VIOLATED
    assert result.violated == "AtMostOnceEffect"
    assert [s.action for s in result.trace] == [
        "Init",
        "ProviderEmitCall",  # 1. the provider emits a call with a fixed id
        "EngineParkApproval",  # 2. the approval is parked and persisted
        "HumanApprove",  # 3. the approval is resolved...
        "EngineInvokeAdapter",  # ...the tool runs
        "ExternalApply",  # ...and returns: deliveries == 1
        "Crash",  # 4. crash before _record_result's result is durable
        "Recover",  # 6./7. durable resume reuses the resolved approval
        "EngineInvokeAdapter",
        "ExternalApply",  # deliveries == 2
    ]
    applied = [s.state["applied"] for s in result.trace]
    assert applied[5] == {"c1": 1} and applied[-1] == {"c1": 2}
    durable = result.trace[6].state["result"]
    assert durable == {"c1": "none"}  # no durable tool result when it crashed


def test_make_check_runs_the_inputs_this_module_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What makes the cache pay: every TLC run of this module is, input for
    input, a run `toolledger check` (make check) does, so its cache key is one
    make check wrote (a run with a dump that passes is kept under the key of
    the run without one too: tlc.run_tlc). TLC is replaced by a recorder of what
    each run reads (no JVM starts); the rows' verdicts are not looked at."""
    import toolledger.cli as cli
    from toolledger.check.tlcoutput import TLCResult as Result

    def inputs(module: str, cfg: Path, search_dirs: list[Path], check_deadlock: bool,
               workers: int) -> tuple[object, ...]:
        tla = sorted((p.name, p.read_bytes()) for d in search_dirs for p in Path(d).glob("*.tla"))
        return (module, cfg.name, cfg.read_bytes(), tuple(tla), check_deadlock, workers)

    def recorder(into: set[tuple[object, ...]], *, dumps_too: bool = False) -> object:
        def fake(module: str, cfg: Path, *, search_dirs: list[Path], check_deadlock: bool,
                 workers: int = 1, dump_dot: Path | None = None, **_: object) -> Result:
            if dump_dot is None or dumps_too:
                into.add(inputs(module, cfg, search_dirs, check_deadlock, workers))
            return Result(outcome=Outcome.PASS, violated=None, distinct_states=0,
                          generated_states=0, depth=0, wall_seconds=0.0, exit_code=0, trace=(),
                          error_text="", output="")
        return fake

    by_check: set[tuple[object, ...]] = set()
    monkeypatch.setattr(cli, "run_tlc", recorder(by_check, dumps_too=True))
    monkeypatch.setattr(cli, "parse_modules", lambda modules, **_: dict.fromkeys(modules, ()))
    monkeypatch.setattr(cli, "_reference_package", lambda root: root / "reference")
    monkeypatch.setattr(cli, "_conformance_row", lambda root, entry, result, *a, **k: (
        cli._not_conformance_row(entry, result, "not run in this test")))
    cli.main(["check", "--root", str(ROOT), "--json"])
    capsys.readouterr()
    here: set[tuple[object, ...]] = set()
    monkeypatch.setitem(globals(), "run_tlc", recorder(here))  # what _run calls
    monkeypatch.setitem(globals(), "_RESULTS", {})
    for entry in CI_MODELS:
        if entry.tier == "check":  # the others are this module's alone
            _run(entry, tmp_path)
    assert len(here) >= len(BATCH_OF) // 2 and by_check
    assert here - by_check == set(), sorted(str(m[0]) for m in here - by_check)
