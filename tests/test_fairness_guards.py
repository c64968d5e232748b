"""The Liveness models state their fairness as guards, and the guards are checked.

``FairSpecByGuards`` writes each ``WF_vars(A)`` of ``FairSpec`` as
``[]<>~G \\/ []<><<A>>_vars`` with ``G`` a plain state predicate (the action's
guard), because TLC evaluates an ``ENABLED`` on every transition and that was
two thirds of the Liveness model's time.  The two are the same formula only
where ``G = ENABLED <<A>>_vars``; ``FairnessGuardsExact`` says so and
``Liveness.cfg`` checks it in every reachable state.  These tests show that
check bites: a guard that forgets a case, or claims one too many, is a
violation, and the Liveness rows keep checking it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from checker_support import ROOT
from toolledger.check.manifest import load_manifest
from toolledger.check.tlc import Outcome, parse_cfg, run_tlc

MANIFEST = load_manifest(ROOT)

# Each broken guard differs from the spec's in one case (written out in
# full: a substituted operator cannot call the one it replaces).
BROKEN_GUARDS = {
    # forgets that a reconciling call can always be given up (EngineReconcileUnknown)
    "EngineEnabled": """
    \\/ msg[c] = "volatile"
    \\/ stage[c] \\in {"dispatched", "waiting", "got_ok", "got_fail", "recorded", "resume"}
    \\/ /\\ stage[c] = "live"
       /\\ \\/ NeedsApproval[c] /\\ approval[ExecId(c)] \\in {"none", "rejected"}
          \\/ /\\ ApprovalOK(c)
             /\\ \\/ Policy[c] = "readonly"
                \\/ msg[c] = "durable" /\\ Rec(c).attempt < MaxAttempts
    \\/ /\\ stage[c] = "retry" /\\ Policy[c] # "readonly" /\\ msg[c] = "durable"
       /\\ Rec(c).attempt < MaxAttempts""",
    # claims a human can act on every durable call
    "HumanEnabled": 'msg[c] = "durable"',
    # forgets that the provider waits for earlier turns
    "EmitEnabled": 'ArgChoices[c] # {} /\\ msg[c] = "absent" /\\ ~IsLegacy(c)',
}


def _specification(cfg: Path) -> str:
    found = re.findall(r"^SPECIFICATION\s+(\w+)", cfg.read_text(encoding="utf-8"), re.M)
    assert len(found) == 1, cfg
    return str(found[0])


def _broken_model(tmp_path: Path, guard: str) -> tuple[str, Path]:
    """MCLiveness with one guard replaced, checking only FairnessGuardsExact."""
    module = f"MCLivenessBroken{guard}"
    (tmp_path / f"{module}.tla").write_text(
        f"---- MODULE {module} ----\nEXTENDS MCLiveness\n"
        f"Broken{guard}(c) == {BROKEN_GUARDS[guard]}\n====\n", encoding="utf-8")
    cfg_text = (ROOT / "model" / "Liveness.cfg").read_text(encoding="utf-8")
    constants, _ = cfg_text.split("SPECIFICATION", 1)
    cfg = tmp_path / f"{module}.cfg"
    cfg.write_text(
        constants.rstrip() + f"\n    {guard} <- Broken{guard}\n"
        "SPECIFICATION Spec\nINVARIANTS\n    FairnessGuardsExact\n", encoding="utf-8")
    return module, cfg


@pytest.mark.parametrize("guard", sorted(BROKEN_GUARDS))
def test_a_wrong_guard_violates_fairness_guards_exact(tmp_path: Path, guard: str) -> None:
    module, cfg = _broken_model(tmp_path, guard)
    result = run_tlc(module, cfg, search_dirs=[*MANIFEST.search_dirs, tmp_path],
                     check_deadlock=False)
    assert result.outcome is Outcome.INVARIANT_VIOLATED, result.output[-2000:]
    assert result.violated == "FairnessGuardsExact"


def test_the_liveness_rows_use_the_guards_and_liveness_checks_them() -> None:
    live, twin = MANIFEST.get("Liveness").cfg_path, MANIFEST.get("LivenessNoHumanFairness").cfg_path
    assert _specification(live) == "FairSpecByGuards"
    assert "FairnessGuardsExact" in parse_cfg(live).invariants
    assert _specification(twin) == "EngineFairSpecByGuards"
    # the twin explores the same states as Liveness, which checks the guards there
    assert MANIFEST.get("LivenessNoHumanFairness").module == MANIFEST.get("Liveness").module


def test_the_guarded_fairness_is_the_wf_fairness_written_out() -> None:
    """Every WF conjunct of Fairness has its guarded twin, and the guard
    it uses is the one FairnessGuardsExact compares with that action."""
    spec = (ROOT / "spec" / "DurableToolExecution.tla").read_text(encoding="utf-8")
    for guard, action in (("EmitEnabled", "EmitStep"), ("EngineEnabled", "EngineStep"),
                          ("HumanEnabled", "HumanStep")):
        assert f"[]<>~{guard}(c) \\/ []<><<{action}(c)>>_vars" in spec
        assert f"{guard}(c) = ENABLED <<{action}(c)>>_vars" in spec
    for action in ("EngineStep", "HumanStep"):
        assert f"WF_vars({action}(c))" in spec
