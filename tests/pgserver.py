"""A private PostgreSQL for a test run (and the demo): a server from the installed Debian binaries, in a temp dir, on
a free loopback port, with `wal_level` as asked; removed when it stops. Never a machine service: the machine kind
CI runs on starts none, and a test that found no server must fail, not skip.

    with PrivatePostgres("logical") as pg:
        dsn = pg.create_database("orders")     # a database of the caller's own on that server

`make test` installs the binaries (Debian's `postgresql`); tests/conftest.py starts one server per test run in
pytest's controller and hands its DSN to every worker through WEIR_TEST_POSTGRES_DSN (`run_dsn()`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType

import psycopg

ENV_DSN = "WEIR_TEST_POSTGRES_DSN"
ENV_ERROR = "WEIR_TEST_POSTGRES_ERROR"
START_TIMEOUT = 60.0
INSTALL_HINT = "install Debian's postgresql package (make test does: apt-get install postgresql)"


class PostgresUnavailable(RuntimeError):
    """The private server could not be had: the reason names what was missing or what failed."""


def binaries() -> Path:
    """The newest installed server's bin directory (/usr/lib/postgresql/<major>/bin)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise PostgresUnavailable(f"no PostgreSQL server binaries under /usr/lib/postgresql/*/bin; {INSTALL_HINT}")
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivatePostgres:
    """One server process; `dsn` names its `postgres` database as the superuser `postgres` (trust on loopback)."""

    def __init__(self, wal_level: str = "logical") -> None:
        self.wal_level = wal_level
        self.root: Path | None = None
        self.port = 0
        self._server: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def start(self) -> str:
        bin_dir = binaries()
        as_root = os.geteuid() == 0
        # As root, under /tmp whatever TMPDIR says: the postgres user must reach the directory, and a TMPDIR inside a
        # root-only one (pytest's tmp_path, which the demo's test hands the demo) would refuse it
        self.root = root = Path(tempfile.mkdtemp(prefix="weir-pg-", dir="/tmp" if as_root else None))
        as_user: list[str] = []
        if as_root:  # initdb and postgres refuse to run as root: run them as the postgres user
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable(f"running as root with no 'postgres' user to run a server as; "
                                          f"{INSTALL_HINT}") from None  # fmt: skip
            os.chown(root, user.pw_uid, user.pw_gid)
            as_user = ["runuser", "-u", "postgres", "--"]
        data, self.port = root / "data", _free_port()
        init = subprocess.run([*as_user, str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
                               "--no-sync"], capture_output=True, text=True, timeout=START_TIMEOUT)  # fmt: skip
        if init.returncode != 0:
            raise PostgresUnavailable(f"initdb failed: {init.stderr.strip()[-400:]}")
        settings = {"listen_addresses": "127.0.0.1", "wal_level": self.wal_level, "max_replication_slots": "32",
                    "max_wal_senders": "16", "max_connections": "400", "fsync": "off",
                    "synchronous_commit": "off", "full_page_writes": "off"}  # fmt: skip
        argv = [*as_user, str(bin_dir / "postgres"), "-D", str(data), "-p", str(self.port), "-k", str(root)]
        for name, value in settings.items():
            argv += ["-c", f"{name}={value}"]
        with open(root / "log", "wb") as log:
            self._server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                psycopg.connect(self.dsn, connect_timeout=2).close()
                return self.dsn
            except psycopg.OperationalError:
                if self._server.poll() is not None or time.monotonic() > deadline:
                    log_text = (root / "log").read_text(errors="replace")[-400:]
                    self.stop()
                    raise PostgresUnavailable(f"the private PostgreSQL did not answer within {START_TIMEOUT:.0f} s "
                                              f"on port {self.port}: {log_text}") from None  # fmt: skip
                time.sleep(0.2)

    def create_database(self, prefix: str = "t") -> str:
        """A new database on this server; its DSN."""
        return new_database(self.dsn, prefix)

    def stop(self) -> None:
        if self._server is not None and self.root is not None:
            pid_file = self.root / "data" / "postmaster.pid"
            pid = int(pid_file.read_text().split()[0]) if pid_file.exists() else self._server.pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)  # fast shutdown of the postmaster itself (runuser may sit between)
            try:
                self._server.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self._server.wait(10)
        self._server = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def __enter__(self) -> PrivatePostgres:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def run_dsn() -> str:
    """The DSN of the test run's server (its `postgres` database), or PostgresUnavailable naming why there is none."""
    dsn = os.environ.get(ENV_DSN)
    if dsn:
        return dsn
    why = os.environ.get(ENV_ERROR) or "tests/conftest.py started none (WEIR_TEST_POSTGRES_DSN is not set)"
    raise PostgresUnavailable(f"no PostgreSQL for this test run: {why}")


def new_database(server_dsn: str, prefix: str = "t") -> str:
    """A new database on the server `server_dsn` names (its `postgres` database); the new database's DSN."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return server_dsn.replace("dbname=postgres", f"dbname={name}")


def run_database(prefix: str = "t") -> str:
    """A new database on the test run's server, so that tests on two workers never share a table; its DSN."""
    return new_database(run_dsn(), prefix)
