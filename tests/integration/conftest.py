"""Fixtures of the integration tests that need more than the session's broker."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from weir.kafka.broker import free_port


def _binaries() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    return Path(found[-1]).parent if found else None


@pytest.fixture(scope="session")
def logical_pg() -> Iterator[str]:
    """The DSN of a private PostgreSQL with wal_level=logical, on a free port, removed afterwards: started from
    the installed binaries (the machine's server runs wal_level=replica and is left alone), as the postgres
    user when the tests run as root; skipped with the reason when it cannot start."""
    with _private_pg("logical") as dsn:
        yield dsn


@pytest.fixture(scope="session")
def replica_pg() -> Iterator[str]:
    """As `logical_pg`, with wal_level=replica: a server without logical decoding, whatever the machine's runs."""
    with _private_pg("replica") as dsn:
        yield dsn


@contextlib.contextmanager
def _private_pg(wal_level: str) -> Iterator[str]:
    bin_dir = _binaries()
    if bin_dir is None:
        pytest.skip(f"no PostgreSQL server binaries under /usr/lib/postgresql/*/bin to start one with "
                    f"wal_level={wal_level}")  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="weir-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root: run them as the postgres user
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run a private PostgreSQL as")
        os.chown(root, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", free_port()
    init = subprocess.run([*as_user, str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
                           "--no-sync"], capture_output=True, text=True)  # fmt: skip
    if init.returncode != 0:
        pytest.skip(f"initdb failed, no private PostgreSQL: {init.stderr.strip()[-300:]}")
    log = open(root / "log", "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [*as_user, str(bin_dir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(root), "-c",
         "listen_addresses=127.0.0.1", "-c", f"wal_level={wal_level}", "-c", "max_replication_slots=4", "-c",
         "fsync=off"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
    deadline = time.monotonic() + 30
    while True:
        try:
            psycopg.connect(dsn, connect_timeout=2).close()
            break
        except psycopg.OperationalError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.skip(f"the private PostgreSQL did not start: {(root / 'log').read_text()[-300:]}")
            time.sleep(0.2)
    try:
        yield dsn
    finally:
        pid = int((data / "postmaster.pid").read_text().split()[0]) if (data / "postmaster.pid").exists() else None
        with contextlib.suppress(ProcessLookupError, TypeError):
            os.kill(pid, signal.SIGINT)  # fast shutdown of the postmaster itself (runuser may sit between)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(pid, signal.SIGKILL)
            server.wait(10)
        log.close()
        shutil.rmtree(root, ignore_errors=True)
