"""``toolledger simulate``: the command, its report, and real SIGKILLs.

Under test: :mod:`toolledger.simulate`.  The SIGKILL tests run the engine
kit in a child process on a real :class:`~toolledger.sqlite_store.SqliteStore`,
the child kills itself with SIGKILL at the crash point (the return code
proves it), and a second process resumes from what survived on disk.  The
oracle is the external system's fsynced log, read back by the parent.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
from pathlib import Path

import pytest

from toolledger.adapters import CountingExternalSystem, RequestStatus
from toolledger.engine import SEED_MATRIX, crash_points
from toolledger.protocol import InvalidInput
from toolledger.simulate import (
    _child_command,
    _child_env,
    main,
    register,
    run_simulation,
)
from toolledger.sqlite_store import SqliteStore

# --------------------------------------------------------------------------
# Real process, real kill
# --------------------------------------------------------------------------


def test_sigkill_after_external_success_ledger_manual_halts_on_the_real_store(
    tmp_path: Path,
) -> None:
    db = tmp_path / "ledger.sqlite3"
    r = run_simulation("ledger", "manual", "after ExternalApply", "sqlite", db)
    assert (r.crash_with, r.crashed) == ("sigkill", True)
    assert r.effects_applied == 1 and r.adapter_invocations == 1
    assert r.turn_status == "recovery_required" and r.final_tool_result is None
    assert r.decision_names == ["recovery_required"]
    assert r.ledger_record == {"status": "recovery_required", "attempt": 1,
                               "authorization": "approval", "result": None}
    # what survived, read back independently of the children
    assert CountingExternalSystem(Path(f"{db}.external.jsonl")).effects() == 1
    with SqliteStore(db) as store:
        assert [(a.kind, a.attempt) for a in store.audit("sim-session")] == [
            ("dispatch", 1), ("recovery_required", 1)]


def test_sigkill_while_the_call_is_out_ledger_idempotent_retries_same_id(tmp_path: Path) -> None:
    r = run_simulation("ledger", "idempotent", SEED_MATRIX["after_dispatched_call_out"].ledger,
                       "sqlite", tmp_path / "l.sqlite3")
    assert r.crashed and r.turn_status == "done"
    assert (r.effects_applied, r.adapter_invocations) == (1, 2)
    assert r.decision_names == ["retry_same_id"]
    [late] = r.late_deliveries
    assert (late["attempt"], late["status"]) == (1, RequestStatus.DEDUPLICATED.value)
    keys = {q["idempotency_key"] for q in r.external_requests}
    assert len(keys) == 1 and keys == {q["execution_id"] for q in r.external_requests}


def test_sigkill_legacy_engine_sends_twice(tmp_path: Path) -> None:
    r = run_simulation("legacy", "manual", "after ExternalApply", "sqlite", tmp_path / "x.db")
    assert r.crashed and r.crash_with == "sigkill"
    assert r.effects_applied == 2 and r.turn_status == "done"


def test_the_child_really_dies_by_sigkill(tmp_path: Path) -> None:
    from toolledger.engine import EngineMode, parse_crash_point
    from toolledger.protocol import RecoveryPolicy

    db = tmp_path / "k.sqlite3"
    point = parse_crash_point("ledger", "after EnginePersistDispatched")
    cmd = _child_command("run", EngineMode.LEDGER, RecoveryPolicy.MANUAL, point, db, None)
    done = subprocess.run(cmd, env=_child_env(), capture_output=True, timeout=60, check=False)
    assert done.returncode == -signal.SIGKILL
    with SqliteStore(db) as store:  # dispatched(1) is durable, nothing was sent
        [rec] = store.load("sim-session").ledger.values()
        assert (rec.status.value, rec.attempt) == ("dispatched", 1)
    assert CountingExternalSystem(Path(f"{db}.external.jsonl")).invocations() == 0


def test_no_crash_in_a_child_exits_cleanly(tmp_path: Path) -> None:
    r = run_simulation("ledger", "readonly", "after EnginePersistDispatched", "sqlite",
                       tmp_path / "r.db")
    assert not r.crashed and not r.crash_point_on_path
    assert r.effects_applied == 1 and r.turn_status == "done"


# --------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------


def test_cli_table_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--engine", "ledger", "--policy", "reconcile",
                 "--crash-at", "after EngineInvokeAdapter"]) == 0
    out = capsys.readouterr().out
    assert "effects applied:      1" in out
    assert "adapter invocations:  2" in out
    assert "request 1 attempt 1 -> dropped_fenced" in out
    assert "reconcile_not_applied" in out


def test_cli_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--engine", "legacy", "--policy", "manual", "--crash-at",
                 "after-ExternalApply", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["engine"] == "legacy" and report["crashed"] is True
    assert report["effects_applied"] == 2 and report["adapter_invocations"] == 2
    assert report["audit"] == [] and report["ledger_record"] is None


def test_cli_resolve_applied(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--crash-at", "after ExternalApply", "--resolve", "applied", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["policy"] == "manual" and report["resolution"] == "applied"
    assert report["turn_status"] == "done" and report["final_tool_status"] == "human"
    assert report["effects_applied"] == 1
    assert "human_applied" in [a["kind"] for a in report["audit"]]


def test_cli_lists_crash_points(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list-crash-points"]) == 0
    out = capsys.readouterr().out
    for mode in ("legacy", "ledger"):
        for p in crash_points(mode):
            assert p.name in out
    assert "seed row: after_succeeded_before_tool_message" in out
    assert main(["--list-crash-points", "--engine", "legacy"]) == 0
    out = capsys.readouterr().out
    assert "ledger engine" not in out and "after EngineCheckpoint" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--crash-at", "after lunch"], "valid points: before ProviderEmitCall"),
        (["--engine", "legacy", "--crash-at", "after EnginePersistDispatched"],
         "for the legacy engine; valid points"),
        ([], "--crash-at POINT is required"),
        (["--crash-at", "none", "--db", "x.db"], "--db only goes with --store sqlite"),
        (["--policy", "sometimes", "--crash-at", "none"], "invalid choice: 'sometimes'"),
        (["--engine", "future", "--crash-at", "none"], "invalid choice: 'future'"),
        (["--crash-at", "none", "--crash-with", "sigkill"], "use store='sqlite'"),
    ],
)
def test_cli_bad_input_exits_2_listing_valid_values(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_existing_db_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "taken.sqlite3"
    db.write_bytes(b"somebody's data")
    assert main(["--crash-at", "none", "--store", "sqlite", "--db", str(db)]) == 2
    assert "already exist" in capsys.readouterr().err
    assert db.read_bytes() == b"somebody's data"


def test_run_simulation_rejects_bad_values() -> None:
    with pytest.raises(InvalidInput, match="valid policies: readonly, manual"):
        run_simulation("ledger", "sometimes", "none")
    with pytest.raises(InvalidInput, match="valid engines: legacy, ledger"):
        run_simulation("future", "manual", "none")
    with pytest.raises(InvalidInput, match="valid stores: memory, sqlite"):
        run_simulation("ledger", "manual", "none", "postgres")  # type: ignore[arg-type]


def test_register_adds_the_subcommand() -> None:
    parser = argparse.ArgumentParser(prog="toolledger")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["simulate", "--crash-at", "after HumanApprove", "--json"])
    assert args.command == "simulate" and args.crash_at == "after HumanApprove"
    assert args._run.__name__ == "cmd_simulate"


def test_no_crash_baseline() -> None:
    for mode in ("legacy", "ledger"):
        r = run_simulation(mode, "manual", None)
        assert not r.crashed and r.effects_applied == 1 and r.turn_status == "done"
