"""Every duration option of the command line reads the one grammar of weir.units, a bare number in seconds as in
the settings, into a timedelta where it comes in (weir/cli/durations.py); a bad value is a usage error naming the
option and the value. Parsed without running the commands: click's make_context converts the options only."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from weir import units
from weir.cli import app, durations

ROOT = typer.main.get_command(app)

# (command path, its required arguments, the option): every duration option of `weir`
OPTIONS = [
    (("run",), ["p.py"], "--duration"),
    (("archive",), ["t"], "--duration"),
    (("shadow",), ["p.py", "proc"], "--duration"),
    (("monitor",), [], "--interval"),
    (("serve",), [], "--timeout"),
    (("sql",), ["SELECT 1"], "--timeout"),
    (("topics", "create"), ["t"], "--retention"),
    (("lake", "vacuum"), ["t"], "--retention"),
    (("ingest", "http"), [], "--ack-timeout"),
    (("ingest", "http"), [], "--idempotency-horizon"),
    (("ingest", "files"), ["/in", "-t", "t", "-f", "json"], "--settle"),
    (("ingest", "files"), ["/in", "-t", "t", "-f", "json"], "--interval"),
    (("ingest", "files"), ["/in", "-t", "t", "-f", "json"], "--max-wait"),
    (("ingest", "files"), ["/in", "-t", "t", "-f", "json"], "--ack-timeout"),
    (("ingest", "postgres"), ["--dsn", "d", "--table", "x", "-t", "t"], "--interval"),
    (("ingest", "postgres"), ["--dsn", "d", "--table", "x", "-t", "t"], "--poll-margin"),
    (("ingest", "postgres"), ["--dsn", "d", "--table", "x", "-t", "t"], "--max-wait"),
    (("ingest", "postgres"), ["--dsn", "d", "--table", "x", "-t", "t"], "--ack-timeout"),
]


def command(path: tuple[str, ...]) -> Any:
    found: Any = ROOT
    for name in path:
        found = found.commands[name]
    return found


def parsed(path: tuple[str, ...], args: list[str], option: str, value: str) -> Any:
    cmd = command(path)
    (param,) = [p for p in cmd.params if option in p.opts]
    return cmd.make_context(" ".join(path), [*args, option, value]).params[param.name]


def duration_options(cmd: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = [(path, p) for p in cmd.params if p.metavar == "DURATION"]
    for name, sub in getattr(cmd, "commands", {}).items():
        found += duration_options(sub, (*path, name))
    return found


def test_the_list_here_is_every_duration_option_of_the_command_line():
    assert sorted((path, p.opts[0]) for path, p in duration_options(ROOT)) == sorted((p, o) for p, _, o in OPTIONS)


@pytest.mark.parametrize(("path", "args", "option"), OPTIONS, ids=lambda x: " ".join(x) if isinstance(x, tuple) else x)
def test_each_duration_option_reads_the_one_grammar_a_bare_number_in_seconds(path, args, option):
    assert parsed(path, args, option, "90") == timedelta(seconds=90)
    assert parsed(path, args, option, "90s") == timedelta(seconds=90)
    assert parsed(path, args, option, "2m") == timedelta(minutes=2)
    assert parsed(path, args, option, "1h 30m") == timedelta(minutes=90)
    assert parsed(path, args, option, "0.5") == timedelta(milliseconds=500)
    result = CliRunner().invoke(app, [*path, *args, option, "often"], terminal_width=300)
    assert result.exit_code == 2, result.output
    said = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())
    assert f"Invalid value for '{option}': 'often' is not a duration such as" in said
    assert "a bare number is seconds" in said


@pytest.mark.parametrize(("path", "args", "option"), [o for o in OPTIONS if o[2] in ("--timeout", "--ack-timeout")])
def test_a_timeout_of_zero_is_refused(path, args, option):
    result = CliRunner().invoke(app, [*path, *args, option, "0"], terminal_width=300)
    assert result.exit_code == 2 and "must be positive" in result.output


def test_each_default_shown_in_the_help_is_the_default_taken():
    for path, param in duration_options(ROOT):
        if param.default is None:
            assert param.show_default is False, (path, param.opts)
        else:
            assert isinstance(param.default, timedelta) and isinstance(param.show_default, str), (path, param.opts)
            shown = units.duration_ms(param.show_default, "shown", bare="s")
            assert timedelta(milliseconds=shown) == param.default, (path, param.opts)


def test_a_topics_retention_takes_the_grammar_and_minus_one_for_forever(monkeypatch):
    made: list[dict[str, str]] = []

    class Admin:
        def create_topic(self, name: str, partitions: int, configs: dict[str, str], **kw: Any) -> None:
            made.append(configs)

    monkeypatch.setattr("weir.cli.topics.admin", lambda bootstrap: Admin())
    for value, ms in (("3d", "259200000"), ("-1", "-1"), ("36h", "129600000"), ("90", "90000")):
        result = CliRunner().invoke(app, ["topics", "create", "t", "--retention", value])
        assert result.exit_code == 0, result.output
        assert made.pop()["retention.ms"] == ms
    result = CliRunner().invoke(app, ["topics", "create", "t"])
    assert result.exit_code == 0 and "retention.ms" not in made.pop()  # the broker's default
    result = CliRunner().invoke(app, ["topics", "create", "t", "--retention-ms", "3600000"], terminal_width=300)
    assert result.exit_code == 2 and "No such option: --retention-ms" in result.output  # gone, loudly
    assert durations.ms(durations.FOREVER) == -1


def test_forever_is_for_a_retention_only():
    result = CliRunner().invoke(app, ["sql", "SELECT 1", "--timeout", "-1"], terminal_width=300)
    assert result.exit_code == 2 and "Invalid value for '--timeout'" in result.output


def test_a_lake_vacuum_retention_is_a_duration(monkeypatch):
    import weir.lake.compact as c
    from weir.cli import lake

    taken: list[timedelta] = []

    class Inspect:
        def check_known_topic(self, lk: Any, topic: str) -> None:
            pass

    monkeypatch.setattr(lake, "_lake", lambda root: None)
    monkeypatch.setattr(lake, "_inspect", lambda: Inspect())
    monkeypatch.setattr(c, "vacuum", lambda lk, topic, retention, dry_run: taken.append(retention) or [])
    result = CliRunner().invoke(app, ["lake", "vacuum", "events", "--retention", "1d", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert taken == [timedelta(days=1)] and "older than 1 day" in result.output
    assert CliRunner().invoke(app, ["lake", "vacuum", "events"]).exit_code == 0
    assert taken[-1] == timedelta(days=7)
