"""``toolledger verify-store`` is read-only: every file of the store byte-identical after it.

Under test: ``toolledger._core.sqlite_store.verify_file`` and the ``verify-store``
subcommand.  Opening a SQLite store is not read-only: after a killed writer
the ``-wal`` file holds committed transactions, and the first connection
folds them into the database and deletes ``-wal`` and ``-shm``.  Oracles:
the bytes of every file in the store's directory (database, ``-wal``,
``-shm``, and that no file appears or disappears) before and after; the
sessions a restarted engine would see (only in the ``-wal`` here); a control
showing that the former behaviour (open the store and verify it) does
change the files, i.e. that the oracle catches it.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from toolledger._core.sqlite_store import SqliteStore
from toolledger._core.sqlite_verify import verify_file
from toolledger._core.stores import StoreCorrupt, StoreError
from toolledger.cli import main as cli_main

SID = "s1"

KILLED_WRITER = """
import os, signal, sys
from toolledger._core import protocol as p
from toolledger._core.ledger import Ledger
from toolledger._core.sqlite_store import SqliteStore
store = SqliteStore(sys.argv[1])
ledger = Ledger.create(store, "s1")
tool = p.ToolProfile("create_ticket", p.RecoveryPolicy.IDEMPOTENT, False)
ledger.step(p.Event(p.Action.ProviderEmitCall, (0, 0), "call_0", tool,
                    p.args_digest(tool.name, {})), arguments={})
ledger.step(p.Event(p.Action.EnginePersistCall, (0, 0)))
ledger.step(p.Event(p.Action.EnginePersistDispatched, (0, 0)))
os.kill(os.getpid(), signal.SIGKILL)  # no close(), no checkpoint: the WAL holds the commits
"""


def killed_writer(path: Path) -> Path:
    """A store whose writer was SIGKILLed: its session lives only in the -wal file."""
    done = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(path)], capture_output=True, timeout=60
    )
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    for suffix in ("-wal", "-shm"):
        assert Path(f"{path}{suffix}").stat().st_size > 0
    return path


def closed_store(path: Path) -> Path:
    with SqliteStore(path) as store:
        store.create_session(SID, marker=0, max_attempts=3)
    assert [f.name for f in path.parent.iterdir()] == [path.name]  # no -wal, no -shm
    return path


def files(directory: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(directory.iterdir())}


def sessions_in(*copied: Path, tmp: Path) -> list[str]:
    """The sessions a store made of exactly these files shows (opened in a fresh dir)."""
    tmp.mkdir()
    for f in copied:
        shutil.copyfile(f, tmp / f.name)
    with SqliteStore(tmp / copied[0].name) as store:
        return store.sessions()


def test_a_closed_store_is_verified_and_left_byte_identical(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "store").mkdir()
    path = closed_store(tmp_path / "store" / "x.db")
    before = files(path.parent)
    assert cli_main(["verify-store", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ok (1 sessions" in out and "only read" in out and "note:" not in out
    assert files(path.parent) == before


def test_a_store_left_by_a_killed_writer_is_verified_with_its_wal_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "store").mkdir()
    path = killed_writer(tmp_path / "store" / "x.db")
    before = files(path.parent)
    assert set(before) == {"x.db", "x.db-wal", "x.db-shm"}
    # The session is committed in the -wal only: the database file alone lacks it.
    assert sessions_in(path, tmp=tmp_path / "db-only") == []
    assert cli_main(["verify-store", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ok (1 sessions" in out  # the check saw what a restarted engine sees
    assert f"note: x.db-wal ({len(before['x.db-wal'])} bytes) is present" in out
    assert "a backup must copy x.db-wal together with x.db" in out
    assert files(path.parent) == before  # database, -wal and -shm: every byte
    report = verify_file(path)
    assert (report.sessions, dict(report.side_files)) == (1, {"x.db-wal": len(before["x.db-wal"])})
    assert files(path.parent) == before


def test_a_store_an_idle_engine_holds_open_is_verified_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "store").mkdir()
    path = tmp_path / "store" / "x.db"
    with SqliteStore(path) as engine:  # another process would hold it the same way
        engine.create_session(SID, marker=0, max_attempts=3)
        before = files(path.parent)
        assert set(before) == {"x.db", "x.db-wal", "x.db-shm"}
        assert cli_main(["verify-store", str(path)]) == 0
        assert "ok (1 sessions" in capsys.readouterr().out
        assert files(path.parent) == before
        assert engine.sessions() == [SID]  # and the engine goes on with its store


def test_control_opening_the_store_to_verify_it_rewrites_the_files(tmp_path: Path) -> None:
    """The former verify-store (open with SqliteStore, verify, close): caught by the oracle."""
    (tmp_path / "store").mkdir()
    path = killed_writer(tmp_path / "store" / "x.db")
    before = files(path.parent)
    with SqliteStore(path) as store:
        store.verify()
    after = files(path.parent)
    assert after != before
    assert set(after) == {"x.db"} and after["x.db"] != before["x.db"]  # merged, -wal deleted


def test_a_damaged_store_is_reported_by_its_own_path_and_left_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "store").mkdir()
    path = tmp_path / "store" / "x.db"
    with SqliteStore(path) as store:
        store.create_session("session-ABCDEFGH", marker=0, max_attempts=3)
    data = path.read_bytes()
    assert data.count(b"session-ABCDEFGH") >= 1
    path.write_bytes(data.replace(b"session-ABCDEFGH", b"session-ABCDEFGh"))
    before = files(path.parent)
    assert cli_main(["verify-store", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path} is not a usable toolledger store" in err, err
    assert "does not match its checksum" in err
    assert "toolledger-verify-" not in err  # never the private copy's path
    assert files(path.parent) == before


def test_a_store_that_changes_while_copied_is_not_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "store").mkdir()
    path = killed_writer(tmp_path / "store" / "x.db")
    copyfile = shutil.copyfile

    def copy_while_a_writer_checkpoints(src: str, dst: str) -> object:
        done = copyfile(src, dst)
        if str(src) == str(path):  # the database is copied; now a writer changes it
            with open(path, "r+b") as f:
                f.seek(200)
                f.write(b"\x00" * 8)
        return done

    monkeypatch.setattr(shutil, "copyfile", copy_while_a_writer_checkpoints)
    with pytest.raises(StoreError, match=r"changed while it was copied to be checked \(x\.db\)"):
        verify_file(path)
    assert cli_main(["verify-store", str(path)]) == 2
    assert "a process is writing the store. Nothing was checked" in capsys.readouterr().err


def test_a_missing_file_is_not_checked(tmp_path: Path) -> None:
    assert cli_main(["verify-store", str(tmp_path / "missing.db")]) == 2
    with pytest.raises(StoreError, match="is not a file"):
        verify_file(tmp_path / "missing.db")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------
# What docs/operating.md says a backup must copy
# --------------------------------------------------------------------------


def test_a_backup_of_the_file_alone_loses_what_the_wal_holds(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    path = killed_writer(tmp_path / "store" / "x.db")
    wal = Path(f"{path}-wal")
    assert sessions_in(path, tmp=tmp_path / "file-only") == []
    assert sessions_in(path, wal, tmp=tmp_path / "file-and-wal") == [SID]


def test_a_checkpoint_folds_the_wal_into_the_file(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    path = killed_writer(tmp_path / "store" / "x.db")
    SqliteStore(path).close()  # the checkpoint of docs/operating.md: the last close folds the WAL
    assert [f.name for f in path.parent.iterdir()] == ["x.db"]
    assert sessions_in(path, tmp=tmp_path / "file-only") == [SID]


def test_an_online_backup_is_complete(tmp_path: Path) -> None:
    """docs/operating.md's backup while an engine may run: SQLite's backup API, one snapshot."""
    import sqlite3

    (tmp_path / "store").mkdir()
    path = killed_writer(tmp_path / "store" / "x.db")
    backup = tmp_path / "backup.db"
    with SqliteStore(path):  # an engine has the store open meanwhile
        source = sqlite3.connect(path)
        target = sqlite3.connect(backup)
        source.backup(target)
        target.close()
        source.close()
    assert verify_file(backup).sessions == 1
    with pytest.raises(StoreCorrupt):  # and the copy is a store that fails closed like any
        backup.write_bytes(backup.read_bytes()[:1000])
        verify_file(backup)
