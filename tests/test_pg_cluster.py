"""The throwaway PostgreSQL cluster the store tests run against (tests/pg_cluster.py).

Oracles: the server's own settings (``SHOW``), the owner of its processes'
data directory, and the file system after ``stop``.
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from pg_cluster import NoPostgres, PgCluster, find_bindir


def test_the_cluster_is_private_durable_and_unprivileged(pg_cluster: PgCluster) -> None:
    with psycopg.connect(pg_cluster.conninfo) as conn:
        settings = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
            for name in ("fsync", "synchronous_commit", "listen_addresses", "data_directory")
        }
    assert settings["fsync"] == "on" and settings["synchronous_commit"] == "on"
    assert settings["listen_addresses"] == "127.0.0.1"
    assert Path(settings["data_directory"]) == pg_cluster.data
    if os.geteuid() == 0:  # the server refuses root; it runs as an unprivileged user
        assert pg_cluster.data.stat().st_uid != 0


def test_stop_removes_everything_and_is_idempotent() -> None:
    cluster = PgCluster().start()
    top = cluster.data.parent
    assert (cluster.data / "postmaster.pid").exists()
    cluster.stop()
    assert not top.exists()
    cluster.stop()


def test_no_server_binaries_is_a_clear_failure_not_a_skip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("PG_BINDIR", raising=False)
    with pytest.raises(NoPostgres, match=r"apt-get install postgresql"):
        find_bindir(tmp_path / "no-such-dir")


def test_ci_installs_the_server_when_initdb_is_missing() -> None:
    text = (Path(__file__).parents[1] / ".ci" / "run").read_text()
    assert "/usr/lib/postgresql/*/bin/initdb" in text and "missing+=(postgresql)" in text
