"""The monitor's config: rule syntax, durations and ratios, clear errors for malformed rules."""

from __future__ import annotations

import pytest

from weir.monitor.config import AlertRule, MonitorConfig, MonitorConfigError, load_config, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [(90, 90.0), ("90s", 90.0), ("2m", 120.0), ("1h", 3600.0), ("500ms", 0.5), ("1 second", 1.0),
     ("5 seconds", 5.0), ("interval 2 minutes", 120.0), ("1.5h", 5400.0), ("1d", 86400.0)],
)  # fmt: skip
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["2 fortnights", "-1", "soon", "", True])
def test_bad_durations(bad):
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(bad)


def test_rule_expressions():
    r = AlertRule.model_validate({"expr": "freshness(orders.enriched) > 2m for 1m"})
    assert (r.kind, r.target, r.threshold, r.for_, r.op) == ("freshness", "orders.enriched", 120.0, 60.0, ">")
    assert r.name == "freshness(orders.enriched) > 2m"
    r = AlertRule.model_validate({"expr": "lag_growing(enrich) for 5m", "name": "enrich lags"})
    assert (r.kind, r.target, r.threshold, r.for_, r.name) == ("lag_growing", "enrich", None, 300.0, "enrich lags")
    r = AlertRule.model_validate({"expr": "dlq_rate(shop/enrich) > 1%"})
    assert r.threshold == pytest.approx(0.01) and r.target == "shop/enrich"
    r = AlertRule.model_validate({"expr": "retention_left(archive.orders) < 1h"})
    assert (r.op, r.threshold) == ("<", 3600.0)
    r = AlertRule.model_validate({"expr": "stalled(*)"})
    assert (r.kind, r.target, r.for_) == ("stalled", "*", 0.0)
    r = AlertRule.model_validate({"expr": "broker_unreachable for 30s"})
    assert r.kind == "broker_unreachable" and r.for_ == 30.0
    r = AlertRule.model_validate({"expr": "violations(*)"})
    assert r.threshold == 0.0  # any violation


def test_rules_as_fields():
    r = AlertRule.model_validate({"name": "slow", "kind": "lag_seconds", "target": "enrich", "threshold": "30s",
                                  "for": "2m"})  # fmt: skip
    assert (r.threshold, r.for_) == (30.0, 120.0)


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"expr": "frshness(x) > 2m"}, "unknown alert kind 'frshness'"),
        ({"expr": "freshness(x) < 2m"}, "freshness compares with >, not <"),
        ({"expr": "freshness(x)"}, "freshness needs a threshold"),
        ({"expr": "stalled(x) > 3"}, "stalled takes no threshold"),
        ({"expr": "freshness(x) > soon"}, "not a duration"),
        ({"expr": "dlq_rate(x) > lots"}, "not a ratio"),
        ({"expr": "what is this"}, "is not a rule such as"),
        ({"expr": "lag(x) > 5", "target": "y"}, "also sets target"),
        ({"kind": "lag", "target": "x", "threshold": 5, "extra": 1}, "Extra inputs are not permitted"),
    ],
)
def test_malformed_rules_are_clear_config_errors(rule, message):
    with pytest.raises(MonitorConfigError, match=message) as info:
        load_config(None, None, alerts=[rule])
    assert "alert rule 1" in str(info.value)


def test_rule_names_must_be_unique():
    with pytest.raises(MonitorConfigError, match="two alert rules are named"):
        load_config(None, None, alerts=[{"expr": "stalled(a)"}, {"expr": "stalled(a)"}])


def test_monitor_table_of_weir_toml(tmp_path, monkeypatch):
    toml = tmp_path / "weir.toml"
    toml.write_text(
        'bootstrap_servers = "127.0.0.1:1"\n'
        '[monitor]\nport = 9000\ninterval = "500ms"\n'
        '[[monitor.alerts]]\nexpr = "freshness(out) > 2m for 1m"\n'
        '[[monitor.alerts]]\nname = "dead"\nkind = "dead"\ntarget = "*"\n'
    )
    monkeypatch.setenv("WEIR_CONFIG", str(toml))
    monkeypatch.delenv("WEIR_MONITOR_TOKEN", raising=False)
    cfg = load_config(None)
    assert cfg.port == 9000 and cfg.interval == 0.5 and [r.name for r in cfg.alerts][1] == "dead"
    assert load_config(None, None, port=9100).port == 9100  # command-line overrides win
    monkeypatch.setenv("WEIR_MONITOR_TOKEN", "s3cret")
    cfg = load_config(None)
    assert cfg.token_value() == "s3cret" and "s3cret" not in repr(cfg)


def test_a_rules_file_and_its_errors(tmp_path):
    f = tmp_path / "rules.toml"
    f.write_text('[[alerts]]\nexpr = "lag(enrich) > 1000 for 10s"\n')
    assert load_config(None, str(f)).alerts[0].threshold == 1000
    f.write_text("[[alerts]\n")
    with pytest.raises(MonitorConfigError, match="not valid TOML"):
        load_config(None, str(f))
    with pytest.raises(MonitorConfigError, match="cannot read"):
        load_config(None, str(tmp_path / "missing.toml"))


def test_defaults_are_safe():
    cfg = MonitorConfig()
    assert cfg.host == "127.0.0.1" and cfg.token_value() is None and cfg.port == 8642
