"""Every CI model of the manifest gives the recorded outcome and state count,
and today's engine fails exactly as the seed report says."""

from __future__ import annotations

import pytest

from checker_support import ROOT
from toolledger.check.manifest import ModelEntry, drift, load_manifest
from toolledger.check.tlc import Outcome, TLCResult, run_tlc

MANIFEST = load_manifest(ROOT)
CI_MODELS = [m for m in MANIFEST.ci_models() if not m.conformance]  # those run in test_conformance


def _run(entry: ModelEntry) -> TLCResult:
    return run_tlc(
        entry.module,
        entry.cfg_path,
        search_dirs=MANIFEST.search_dirs,
        check_deadlock=entry.check_deadlock,
        workers=entry.workers,
    )


@pytest.mark.parametrize("entry", CI_MODELS, ids=[m.name for m in CI_MODELS])
def test_model_matches_the_manifest(entry: ModelEntry) -> None:
    result = _run(entry)
    assert drift(entry, result) == [], result.output[-2000:]


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
