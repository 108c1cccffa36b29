"""A test run's last line (tests/conftest.py closing_line): passes counted at their call, skips and failures where
they happened (a skip mark skips at setup, and a skip there must show: issue 55 counts skips in the last line), and
the brokers the run used."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

# By its path: the name `conftest` is tests/integration's too, whichever pytest imported first
_spec = importlib.util.spec_from_file_location("weir_tests_conftest", Path(__file__).parents[1] / "conftest.py")
assert _spec is not None and _spec.loader is not None
_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_conftest)
closing_line = _conftest.closing_line


def test_the_last_line_counts_setup_skips_and_names_the_brokers():
    stats = {
        "passed": [SimpleNamespace(when="call")] * 3,
        "": [SimpleNamespace(when="setup"), SimpleNamespace(when="teardown")],
        "skipped": [SimpleNamespace(when="setup"), SimpleNamespace(when="call")],
        "failed": [SimpleNamespace(when="call")],
        "error": [SimpleNamespace(when="setup")],
    }
    line = closing_line(stats)
    assert line.startswith("weir: 3 passed, 1 failed, 1 error, 2 skipped; brokers: ")
    assert "Tansu (test_outage's durable restart" in line and "PostgreSQL" in line
