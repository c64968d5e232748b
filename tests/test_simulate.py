"""``toolledger simulate``: the command, its report, and real SIGKILLs.

Under test: :mod:`toolledger.kit.simulate`.  The SIGKILL tests run the engine
kit in a child process on a real :class:`~toolledger._core.sqlite_store.SqliteStore`,
the child kills itself with SIGKILL at the crash point (the return code
proves it), and a second process resumes from what survived on disk.  The
oracle is the external system's fsynced log, read back by the parent.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from toolledger._core.protocol import InvalidInput
from toolledger._core.sqlite_store import SqliteStore
from toolledger.cli import main as cli_main
from toolledger.kit.engine import SEED_MATRIX, crash_points
from toolledger.kit.external import CountingExternalSystem, RequestStatus
from toolledger.kit.simulate import (
    EXIT_DUPLICATE,
    SimulationFailed,
    _child_command,
    _child_env,
    _child_failed,
    _exists,
    _store_files,
    main,
    register,
    run_simulation,
)

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
            ("approved", 1), ("dispatch", 1), ("recovery_required", 1)]


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
    from toolledger._core.protocol import RecoveryPolicy
    from toolledger.kit.engine import EngineMode, parse_crash_point

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
                 "after-ExternalApply", "--json"]) == EXIT_DUPLICATE
    report = json.loads(capsys.readouterr().out)
    assert report["engine"] == "legacy" and report["crashed"] is True
    assert report["effects_applied"] == 2 and report["adapter_invocations"] == 2
    assert report["audit"] == [] and report["ledger_record"] is None
    assert report["duplicate"] is True and report["authorized_effects"] == 1


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
        (["--crash-at", "none", "--store", "memory", "--db", "x.db"],
         "implies --store sqlite: drop --store memory or --db"),
        (["--crash-at", "none", "--fresh"], "--fresh goes with --db DB"),
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
    assert "exists and it is not a SQLite database" in capsys.readouterr().err
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


# --------------------------------------------------------------------------
# A duplicate says so (issue 10 item 10)
# --------------------------------------------------------------------------


def test_the_legacy_duplicate_is_marked_loudly_and_exits_3(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli_main(["simulate", "--engine", "legacy", "--policy", "manual",
                     "--crash-at", "after ExternalApply"]) == EXIT_DUPLICATE == 3
    out = capsys.readouterr().out
    lines = out.splitlines()
    verdict = ("DUPLICATE: the effect was applied 2 times for 1 approval "
               "(issue #443: https://github.com/andrewyng/openworker/issues/443)")
    assert lines[2] == verdict  # right under the header, before any detail
    assert "effects applied:      2   <-- DUPLICATE (1 authorized)" in lines
    assert "[ok, but the effect was applied 2 times]" in out  # not a bare [ok]
    assert "[ok]" not in out
    assert "(crash simulated by an exception)" in lines[0] and "(exception)" not in out
    assert lines[-1] == "exit status 3: DUPLICATE (see the top)"


def test_a_safe_run_has_no_duplicate_and_labels_positions(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli_main(["simulate", "--policy", "idempotent",
                     "--crash-at", "after EngineInvokeAdapter"]) == 0
    out = capsys.readouterr().out
    assert "DUPLICATE" not in out
    # the decision with its inputs, compact: (turn, slot) labelled, every input one word
    assert ("  turn 1, slot 0: retry_same_id     from dispatched (attempt 1/3), idempotent, "
            "approved, args match, no result, new call") in out.splitlines()
    assert "(1, 0)" not in out and "digest_matches=" not in out


def test_a_human_retry_is_authorized_not_a_duplicate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--policy", "manual", "--crash-at", "after ExternalApply",
                 "--resolve", "retry"]) == 0
    out = capsys.readouterr().out
    assert ("effects applied:      2   (all 2 authorized: the approval and a human's retry)"
            in out.splitlines())
    assert "DUPLICATE" not in out


def test_help_documents_the_exit_status_and_the_side_files(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli_main(["simulate", "--help"]) == 0
    text = capsys.readouterr().out
    for needle in ("exit status:", "3  DUPLICATE", "DB.conversation/", "DB.external.jsonl",
                   "--fresh", "implies --store sqlite"):
        assert needle in text, needle


# --------------------------------------------------------------------------
# --db: implies SQLite, starts over with --fresh (item 11)
# --------------------------------------------------------------------------

LEDGER_LINE = ["simulate", "--engine", "ledger", "--policy", "manual",
               "--crash-at", "after ExternalApply", "--resolve", "applied"]


def test_db_implies_sqlite_and_fresh_starts_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "run1.sqlite3"
    assert cli_main([*LEDGER_LINE, "--db", str(db), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert (first["store"], first["crash_with"], first["crashed"]) == ("sqlite", "sigkill", True)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["run1.sqlite3", "run1.sqlite3.conversation", "run1.sqlite3.external.jsonl"]
    # again, as printed: refused, naming the files and the way out; nothing changed
    before = snapshot(tmp_path)
    assert cli_main([*LEDGER_LINE, "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "add --fresh" in err
    for name in files:
        assert name in err
    assert snapshot(tmp_path) == before
    # --fresh removes exactly those files and the run starts from nothing
    (tmp_path / "keep.txt").write_text("mine")
    assert cli_main([*LEDGER_LINE, "--db", str(db), "--fresh", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["effects_applied"] == 1 and again["turn_status"] == "done"
    assert [a["kind"] for a in again["audit"]] == [a["kind"] for a in first["audit"]]
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_fresh_also_clears_a_legacy_run(tmp_path: Path) -> None:
    db = tmp_path / "legacy.db"
    assert main(["--engine", "legacy", "--crash-at", "after ExternalApply",
                 "--db", str(db)]) == EXIT_DUPLICATE
    assert not db.exists()  # the legacy engine has no ledger: side files only
    assert main(["--engine", "legacy", "--crash-at", "after ExternalApply",
                 "--db", str(db)]) == 2
    r = run_simulation("legacy", "manual", "after ExternalApply", db=db, fresh=True)
    assert r.store == "sqlite" and r.effects_applied == 2  # counted from a new log


@pytest.mark.parametrize(
    ("plant", "why"),
    [
        ("conversation-stray", "not only checkpoints"),
        ("external-junk", "is not an external system log"),
        ("wal-without-store", "which is not a toolledger store"),
    ],
)
def test_fresh_refuses_files_a_run_did_not_write(
    plant: str, why: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.sqlite3"
    assert main(["--crash-at", "none", "--db", str(db)]) == 0
    capsys.readouterr()
    if plant == "conversation-stray":
        (tmp_path / "s.sqlite3.conversation" / "notes.txt").write_text("mine")
    elif plant == "external-junk":
        (tmp_path / "s.sqlite3.external.jsonl").write_text("my own log\n")
    else:
        db.unlink()
        Path(f"{db}-wal").write_bytes(b"x" * 32)
    before = snapshot(tmp_path)
    assert main(["--crash-at", "none", "--db", str(db), "--fresh"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and why in err and "not even with --fresh" in err
    assert snapshot(tmp_path) == before  # nothing removed, nothing created


# --------------------------------------------------------------------------
# Bad --db paths: one line, exit 2, nothing created (item 7)
# --------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for a directory)."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes())
            for p in sorted(root.rglob("*"))}


def other_sqlite(path: Path) -> Path:
    import sqlite3

    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE notes (text)")
        conn.execute("INSERT INTO notes VALUES ('not a ledger')")
        conn.commit()
    return path


BAD_PATHS: dict[str, tuple[str, str]] = {
    # case: (the --db argument below tmp_path, what the one line must say)
    "missing directory": ("nodir/run.sqlite3", "directory {root}/nodir does not exist: create it"),
    "below a regular file (ENOTDIR)": ("afile/run.sqlite3",
                                       "{root}/afile is a file, not a directory"),
    "a directory": ("adir", "{root}/adir is a directory: give the path of a new store file"),
    "another application's SQLite file": (
        "other.db", "{root}/other.db exists and it is a SQLite database of another application"),
    "a file that is not SQLite": ("notes.txt",
                                  "{root}/notes.txt exists and it is not a SQLite database"),
}


@pytest.mark.parametrize("fresh", [False, True], ids=["plain", "fresh"])
@pytest.mark.parametrize("case", list(BAD_PATHS))
def test_a_bad_db_path_gets_one_line_exit_2_and_nothing_created(
    case: str, fresh: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "afile").write_text("a regular file")
    (tmp_path / "adir").mkdir()
    (tmp_path / "notes.txt").write_text("somebody's notes")
    other_sqlite(tmp_path / "other.db")
    before = snapshot(tmp_path)
    arg, message = BAD_PATHS[case]
    argv = [*LEDGER_LINE, "--db", str(tmp_path / arg), *(["--fresh"] if fresh else [])]
    assert cli_main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err  # one line
    assert "Traceback" not in captured.err
    assert str(tmp_path / arg) in captured.err  # names the path
    assert message.format(root=tmp_path) in captured.err
    assert snapshot(tmp_path) == before  # nothing created, nothing changed


def test_a_directory_even_root_cannot_write_via_the_real_console_script() -> None:
    """``/sys`` refuses new files with EACCES to every user, root included.

    The tests run as root, for whom ``chmod`` is not enforced and
    ``os.access`` says yes: this is the case where only creating the store
    shows the problem, and it used to end in two nested tracebacks, exit 1.
    """
    sysfs = Path("/sys")
    if not sysfs.is_dir():
        pytest.skip("no /sys on this system")  # pragma: no cover - Linux CI has it
    db = sysfs / f"toolledger-test-{os.getpid()}.sqlite3"
    done = subprocess.run(
        [sys.executable, "-m", "toolledger.cli", *LEDGER_LINE, "--db", str(db)],
        env=_child_env(), capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"toolledger simulate: --db {db}: cannot create the store")
    assert "choose a --db path in a directory you can write" in done.stderr
    assert not any(_exists(p) for p in _store_files(db))
    assert not list(sysfs.glob(f".{db.name}*"))


def test_a_read_only_directory_for_a_user_who_is_not_root() -> None:
    """A ``chmod 555`` directory, tried by an unprivileged user (uid 65534).

    As root the test forks and drops to uid 65534 in the child (the
    interpreter is already loaded, so it needs no file root owns); the
    directory lives under a world-readable temp dir.  The parent checks that
    the child saw a refusal in one line and that nothing was created.
    """
    base = Path(tempfile.mkdtemp(prefix="toolledger-ro-"))
    try:
        base.chmod(0o755)
        ro = base / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        db = ro / "run.sqlite3"
        rc, err = run_cli_unprivileged([*LEDGER_LINE, "--db", str(db)])
        assert rc == 2, err
        assert err == (f"toolledger simulate: --db {db}: cannot create files in directory {ro} "
                       "(permission denied): choose a --db path in a directory you can write\n")
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)
        shutil.rmtree(base)


def run_cli_unprivileged(argv: list[str]) -> tuple[int, str]:
    """``toolledger ARGV`` in-process as a user who is not root; (exit status, stderr)."""
    if os.geteuid() != 0:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return cli_main(argv), err.getvalue()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        code = 99
        try:
            os.close(read)
            os.setgid(65534)
            os.setuid(65534)
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code = cli_main(argv)
            os.write(write, err.getvalue().encode())
        except BaseException as exc:  # reported to the parent, then exit
            os.write(write, f"child failed: {exc!r}".encode())
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        text = f.read().decode()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), text


def test_a_childs_store_error_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """A store that fails in a child (here: damaged after creation) gives one line."""
    from toolledger._core.protocol import RecoveryPolicy
    from toolledger.kit.engine import EngineMode

    db = tmp_path / "damaged.sqlite3"
    db.write_bytes(b"SQLite format 3\x00" + b"\x00" * 200)  # a header, no database
    cmd = _child_command("resume", EngineMode.LEDGER, RecoveryPolicy.MANUAL, None, db, None)
    done = subprocess.run(cmd, env=_child_env(), capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 3
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert str(db) in done.stderr
    with pytest.raises(SimulationFailed, match=r"^the resuming child stopped: .*damaged"):
        _child_failed("the resuming child", done)
