"""A test run's last line (tests/run_summary.py): passes counted at their call, skips and failures where
they happened (a skip mark skips at setup, and a skip there must show: issue 55 counts skips in the last line), and
the brokers the run used."""

from __future__ import annotations

from types import SimpleNamespace

from run_summary import closing_line


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
