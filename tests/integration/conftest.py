"""Fixtures of the integration tests that need more than the session's broker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pgserver import PostgresUnavailable, PrivatePostgres, run_database


@pytest.fixture
def logical_pg() -> str:
    """The DSN of a new database of this test's own on the run's PostgreSQL (wal_level=logical, tests/pgserver.py);
    the test fails, naming why, when the run has none."""
    try:
        return run_database("logical")
    except PostgresUnavailable as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def replica_pg() -> Iterator[str]:
    """The DSN of a private PostgreSQL with wal_level=replica: a server without logical decoding, for the tests of
    what weir does without it; started by the first test that asks, stopped at the end of the worker's run."""
    try:
        with PrivatePostgres("replica") as server:
            yield server.dsn
    except PostgresUnavailable as exc:
        pytest.fail(str(exc))
