"""EventuallyAnswered for two resumers, and why its bound is what it is (TLC).

The ConcurrentLiveness* rows (model/MCConcurrentLiveness.tla) check the
concurrent spec's FairSpec with one takeover of a running session (a steal)
and MaxEpoch 3.  These tests pin what the rows rest on: they check every
safety invariant the concurrent models check; with MaxEpoch 2 the model's
bound, not the protocol, strands the call (the counterexample ends with the
epochs spent and nobody running); without the fairness of Restart a crash
leaves the call unanswered (the assumption is needed); and the liveness
twin's counterexample is the bug it names (a refused stale worker that never
lets the session go).
docs/protocol.md#concurrent-resumers.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from checker_support import ROOT
from toolledger.check.manifest import load_manifest
from toolledger.check.tlc import Outcome, TLCResult, parse_cfg, run_tlc
from toolledger.check.tlccache import cache_from_env

MANIFEST = load_manifest(ROOT)
ROWS = ("ConcurrentLivenessManual", "ConcurrentLivenessIdempotent",
        "ConcurrentLivenessReconcile", "ConcurrentLivenessRefusedReloads")


def test_the_rows_check_every_concurrent_safety_invariant_and_the_property() -> None:
    safety = parse_cfg(MANIFEST.get("ConcurrentManual").cfg_path).invariants
    for name in ROWS:
        info = parse_cfg(MANIFEST.get(name).cfg_path)
        assert info.invariants == safety, name
        assert info.properties == ("EventuallyAnswered",), name
        assert "SPECIFICATION LiveSpec" in MANIFEST.get(name).cfg_path.read_text(), name
    assert MANIFEST.get("ConcurrentLivenessRefusedReloads").expect == "EventuallyAnswered"


def _last_state(result: TLCResult) -> dict[str, object]:
    assert result.trace, result.output[-2000:]
    return dict(result.trace[-1].state)


def test_with_max_epoch_2_the_bound_strands_the_call(tmp_path: Path) -> None:
    cfg = MANIFEST.get("ConcurrentLivenessManual").cfg_path.read_text(encoding="utf-8")
    assert "MaxEpoch <- MCLiveMaxEpoch" in cfg
    (tmp_path / "Epochs2.cfg").write_text(
        cfg.replace("MaxEpoch <- MCLiveMaxEpoch", "MaxEpoch = 2"), encoding="utf-8")
    result = run_tlc("MCConcurrentLiveness", tmp_path / "Epochs2.cfg",
                     search_dirs=MANIFEST.search_dirs, check_deadlock=False,
                     cache=cache_from_env())
    assert (result.outcome, result.violated) == (Outcome.PROPERTY_VIOLATED, "EventuallyAnswered")
    end = _last_state(result)
    # nobody runs, nobody can take the session: the model's bound, not a protocol bug
    assert end["epoch"] == 2 and end["res"] == "none"
    assert isinstance(end["pc"], Mapping) and set(end["pc"].values()) == {"idle"}


def test_the_twins_counterexample_is_a_stale_worker_that_keeps_the_session(
        tmp_path: Path) -> None:
    entry = MANIFEST.get("ConcurrentLivenessRefusedReloads")
    result = run_tlc(entry.module, entry.cfg_path, search_dirs=MANIFEST.search_dirs,
                     check_deadlock=False, cache=cache_from_env(),
                     expected_states=entry.distinct_states)
    assert (result.outcome, result.violated) == (Outcome.PROPERTY_VIOLATED, "EventuallyAnswered")
    end = _last_state(result)
    pc, held = end["pc"], end["held"]
    assert isinstance(pc, Mapping) and isinstance(held, Mapping)
    assert end["res"] == "none"
    stale = [p for p in pc if pc[p] != "idle"]
    # one process still holds the call, under an epoch the lease no longer grants
    assert len(stale) == 1 and held[stale[0]] < end["epoch"], end


def test_without_restart_fairness_a_crash_leaves_the_call_unanswered(tmp_path: Path) -> None:
    """Every conjunct of Fairness but Restart's: nobody comes back after the
    owner's crash, so the property fails: the assumption is needed."""
    (tmp_path / "MCNoRestart.tla").write_text(
        "---- MODULE MCNoRestart ----\nEXTENDS MCConcurrentLiveness\n"
        "NoRestartSpec ==\n"
        "    /\\ Init /\\ [][Next /\\ StealBound]_vars\n"
        "    /\\ \\A p \\in Procs : WF_vars(ProcStep(p))\n"
        "    /\\ \\A q \\in Procs : WF_vars(HumanStep(q))\n"
        "    /\\ WF_vars(ExternalStep)\n====\n", encoding="utf-8")
    cfg = MANIFEST.get("ConcurrentLivenessManual").cfg_path.read_text(encoding="utf-8")
    assert "SPECIFICATION LiveSpec" in cfg
    assert "MaxAttempts <- MCMaxAttempts" in cfg
    # one attempt is enough to show it (and a quarter of the states)
    (tmp_path / "NoRestart.cfg").write_text(
        cfg.replace("SPECIFICATION LiveSpec", "SPECIFICATION NoRestartSpec")
        .replace("MaxAttempts <- MCMaxAttempts", "MaxAttempts = 1"), encoding="utf-8")
    (tmp_path / "WithRestart.cfg").write_text(
        cfg.replace("MaxAttempts <- MCMaxAttempts", "MaxAttempts = 1"), encoding="utf-8")
    dirs = [*MANIFEST.search_dirs, tmp_path]
    control = run_tlc("MCNoRestart", tmp_path / "WithRestart.cfg", search_dirs=dirs,
                      check_deadlock=False)
    assert control.outcome is Outcome.PASS, control.output[-2000:]  # the same bounds, fair Restart
    result = run_tlc("MCNoRestart", tmp_path / "NoRestart.cfg", search_dirs=dirs,
                     check_deadlock=False)
    assert (result.outcome, result.violated) == (Outcome.PROPERTY_VIOLATED, "EventuallyAnswered")
    end = _last_state(result)
    assert end["res"] == "none" and end["crashes"] == 1
    assert isinstance(end["pc"], Mapping) and set(end["pc"].values()) == {"idle"}
