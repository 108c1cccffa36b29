"""Durations in the settings (weir.config.Duration): typed once, where they come in. Pure: no Spark, no broker."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from weir.config import Settings

DURATIONS = ("trigger", "flow_target", "broker_unavailable_timeout", "restart_backoff", "restart_backoff_max",
             "stop_timeout", "lock_lease", "retention_guard_interval")  # fmt: skip


@pytest.mark.parametrize("name", DURATIONS)
def test_every_duration_setting_reads_the_one_grammar_into_a_timedelta(name):
    for given, expected in (("90s", 90), ("1h30m", 5400), ("interval 5 seconds", 5), (2.5, 2.5), ("500 ms", 0.5)):
        assert getattr(Settings(**{name: given}), name) == timedelta(seconds=expected)


@pytest.mark.parametrize("name", DURATIONS)
def test_a_bad_duration_fails_at_load_naming_the_setting(name):
    with pytest.raises(ValidationError, match=f"{name}: 'soon' is not a duration"):
        Settings(**{name: "soon"})


def test_a_processors_trigger_is_a_duration_too_and_bad_ones_fail_at_load():
    s = Settings(processors={"enrich": {"trigger": "30 seconds"}})
    assert s.processors["enrich"].trigger == timedelta(seconds=30)
    with pytest.raises(ValidationError, match="trigger: 'now' is not a duration"):
        Settings(processors={"enrich": {"trigger": "now"}})


def test_a_lease_and_a_flow_target_must_be_positive():
    for name in ("lock_lease", "flow_target"):
        with pytest.raises(ValidationError, match=f"{name}: the duration must be positive"):
            Settings(**{name: "0s"})


def test_weir_config_writes_each_duration_back_as_text_that_reads_in_as_itself(monkeypatch):
    s = Settings(trigger="1500ms", broker_unavailable_timeout="1h", restart_backoff=0.25)
    dumped = s.model_dump()
    assert (dumped["trigger"], dumped["broker_unavailable_timeout"]) == ("1500 milliseconds", "1 hour")
    assert dumped["stop_timeout"] == "30 seconds" and dumped["restart_backoff"] == "250 milliseconds"
    again = Settings(**{n: dumped[n] for n in DURATIONS if dumped[n] is not None})
    assert all(getattr(again, n) == getattr(s, n) for n in DURATIONS)
    monkeypatch.setenv("WEIR_STOP_TIMEOUT", "2m")
    assert Settings().stop_timeout == timedelta(minutes=2)
