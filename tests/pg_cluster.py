"""A throwaway PostgreSQL cluster for the tests and benchmarks: no mock database.

:class:`PgCluster` runs ``initdb`` into its own temporary directory, starts
the server on 127.0.0.1 only, on a free port, with its unix socket inside
that directory and ``fsync`` on (the stores' durability is what is tested),
creates a database, and on :meth:`PgCluster.stop` shuts the server down
(fast) and removes the directory, whatever happened in between.

PostgreSQL refuses to run as root, and CI runs as root: then the server runs
as the unprivileged ``postgres`` system user if it exists (the Debian package
creates it), else as ``nobody``, and the directory is handed to that user.
Run by anyone else, the server runs as the current user.

The server binaries are looked up in ``$PG_BINDIR``, then the Debian layout
``/usr/lib/postgresql/<version>/bin`` (newest first), then ``PATH``.  When
there are none, :func:`find_bindir` raises :class:`NoPostgres` naming what to
install: the tests that need a server then FAIL (they never skip: a missing
server must not pass as a green run).  ``.ci/run`` installs the Debian
``postgresql`` package when it is missing.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["NoPostgres", "PgCluster", "find_bindir"]

_TOOLS = ("initdb", "pg_ctl", "postgres")
INSTALL_HINT = (
    "install the PostgreSQL server binaries: `apt-get install postgresql` on Debian/Ubuntu "
    "(.ci/run does this), `brew install postgresql` on macOS, or point PG_BINDIR at the "
    "directory holding initdb, pg_ctl and postgres"
)


class NoPostgres(RuntimeError):
    """No PostgreSQL server binaries on this machine."""


def _has_tools(directory: Path) -> bool:
    return all(os.access(directory / tool, os.X_OK) for tool in _TOOLS)


def find_bindir(debian: Path = Path("/usr/lib/postgresql")) -> Path:
    """The directory holding initdb, pg_ctl and postgres; :class:`NoPostgres` if none."""
    candidates: list[Path] = []
    if os.environ.get("PG_BINDIR"):
        candidates.append(Path(os.environ["PG_BINDIR"]))
    if debian.is_dir():
        versions = [d for d in debian.iterdir() if d.name.isdigit()]
        candidates += [d / "bin" for d in sorted(versions, key=lambda d: -int(d.name))]
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for directory in candidates:
        if _has_tools(directory):
            return directory
    raise NoPostgres(
        "the PostgreSQL store tests need a real PostgreSQL server and found none "
        f"(looked in {', '.join(map(str, candidates)) or 'PG_BINDIR, /usr/lib/postgresql, PATH'}): "
        + INSTALL_HINT
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _server_user() -> pwd.struct_passwd | None:
    """The unprivileged user to run the server as (``None``: the current user)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise NoPostgres("running as root, and neither a 'postgres' nor a 'nobody' user exists")


class PgCluster:
    """One throwaway cluster; ``with PgCluster() as pg: pg.conninfo``."""

    def __init__(self, dbname: str = "toolledger_test") -> None:
        self.bindir = find_bindir()
        self.dbname = dbname
        self.user = "toolledger"
        self.port = 0
        self._owner = _server_user()
        self._dir = Path(tempfile.mkdtemp(prefix="toolledger-pg-"))
        self.data = self._dir / "data"
        self.sockets = self._dir / "sock"
        self.log = self._dir / "server.log"
        self._started = False
        self._options = ""

    @property
    def conninfo(self) -> str:
        """A libpq connection string for the test database (TCP on loopback)."""
        return f"host=127.0.0.1 port={self.port} user={self.user} dbname={self.dbname}"

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        kwargs: dict[str, Any] = {}
        if self._owner is not None:
            kwargs = {"user": self._owner.pw_uid, "group": self._owner.pw_gid,
                      "extra_groups": []}  # fmt: skip
        done = subprocess.run(
            args, capture_output=True, text=True, timeout=timeout, cwd=self._dir,
            stdin=subprocess.DEVNULL, check=False, **kwargs,
        )  # fmt: skip
        if done.returncode != 0:
            log = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise RuntimeError(
                f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}\n"
                f"server log tail:\n{log}"
            )
        return done

    def start(self) -> PgCluster:
        """initdb, start on a free loopback port, create the database."""
        try:
            self.sockets.mkdir()
            if self._owner is not None:
                for path in (self._dir, self.sockets):
                    os.chown(path, self._owner.pw_uid, self._owner.pw_gid)
            # trust on loopback only: a private, throwaway cluster nobody else can reach
            self._run(
                str(self.bindir / "initdb"), "-D", str(self.data), "-U", self.user,
                "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-instructions",
            )  # fmt: skip
            for attempt in range(5):
                self.port = _free_port()
                options = (
                    f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                    f"-c unix_socket_directories={self.sockets} -c fsync=on "
                    "-c synchronous_commit=on -c full_page_writes=on -c max_connections=60 "
                    "-c shared_buffers=16MB"
                )
                self._options = options
                try:
                    self._run(
                        str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                        "-o", options, "-w", "-t", "60", "start",
                    )  # fmt: skip
                    break
                except RuntimeError:
                    if attempt == 4:  # the port was taken meanwhile: try another one
                        raise
            self._started = True
            self._run(
                str(self.bindir / "psql") if (self.bindir / "psql").exists() else "psql",
                "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, "-d", "postgres",
                "-v", "ON_ERROR_STOP=1", "-c", f"CREATE DATABASE {self.dbname}",
            )  # fmt: skip
        except BaseException:
            self.stop()
            raise
        return self

    def restart(self, mode: str = "fast") -> None:
        """Restart the server (``mode``: fast, or immediate: a crash stop, WAL replay)."""
        # -l again: without it the new postmaster would hold our output pipes open
        self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
            "-o", self._options, "-m", mode, "-w", "-t", "60", "restart",
        )  # fmt: skip

    def postmaster_pid(self) -> int:
        """The process id of the running server (its ``postmaster.pid``)."""
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def running(self) -> bool:
        """Whether the server is up (``pg_ctl status``)."""
        try:  # as the server's user: pg_ctl refuses to run as root
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "status")
        except RuntimeError:
            return False
        return True

    def start_again(self, attempts: int = 60) -> None:
        """Start the server again, same port and options, after a stop or a kill -9.

        After a kill -9 of the postmaster its orphaned backends may hold the
        shared memory for a moment, and the new postmaster refuses to start:
        retried every half second (``attempts`` times) until they are gone.
        """
        for attempt in range(attempts):
            try:
                self._run(
                    str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                    "-o", self._options, "-w", "-t", "60", "start",
                )  # fmt: skip
                return
            except RuntimeError:
                if attempt == attempts - 1:
                    raise
                time.sleep(0.5)

    def stop(self) -> None:
        """Fast shutdown and removal of the directory; idempotent, never raises."""
        if self._started:
            self._started = False
            with contextlib.suppress(Exception):
                self._run(
                    str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w",
                    "-t", "30", "stop",
                )  # fmt: skip
            pid_file = self.data / "postmaster.pid"
            with contextlib.suppress(Exception):
                if pid_file.exists():  # it did not stop: do not leave it running
                    os.kill(int(pid_file.read_text().split()[0]), 9)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> PgCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":  # a manual check: start, print, stop
    with PgCluster() as pg:
        print(pg.conninfo)
        time.sleep(0.1)
