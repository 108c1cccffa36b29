"""The monitor's HTTP API through Starlette's TestClient (and once through a real uvicorn for
fetch_status): JSON views, tokens, /metrics parsed by prometheus_client, the dashboard's hooks, the CLI."""

from __future__ import annotations

import json

import pytest
import typer
from _serving import serving
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient
from typer.testing import CliRunner

from weir.cli.monitor import monitor_command
from weir.monitor.client import fetch_status
from weir.monitor.config import MonitorConfig
from weir.monitor.server import check_exposure, create_app
from weir.monitor.state import BrokerSnapshot, Monitor
from weir.monitor.store import clear_address, write_address
from weir.net import is_loopback

T0 = 1_800_000_000.0


def fed_monitor() -> Monitor:
    now = [T0]
    config = MonitorConfig.model_validate({"alerts": [{"expr": "dlq_rate(*) > 1%"}, {"expr": "stalled(nope)"}]})
    m = Monitor(config, clock=lambda: now[0], bootstrap="127.0.0.1:1")
    for i, (proc, inp, out) in enumerate([("enrich", "orders", "enriched"), ("total", "enriched", "totals")]):
        record = {
            "type": "progress", "pipeline": "shop", "processor": proc, "at_ms": int(T0 * 1000), "batch_id": 3,
            "input_rows": 100, "batch_duration_ms": 250, "input_rows_per_second": float("inf") if i else 10.0,
            "sources": [{"end_offset": {inp: {"0": 100}}, "latest_offset": {inp: {"0": 100}}}],
            "accounting": {"in": 100, "out": 95, "dlq": 5, "outputs": {out: 95, f"{inp}.dlq": 5}},
            "client_rebuilds": {} if i else {"sink producer": 2},  # enrich's Spark workers rebuilt two producers
        }  # fmt: skip
        m.ingest(json.dumps(record).encode())
    m.ingest(b"garbage")
    m.observe_broker(BrokerSnapshot(int(T0 * 1000), {("orders", 0): (0, 120), ("enriched", 0): (0, 100)},
                                    {"orders": 3_600_000}, {(("orders", 0), 100): int(T0 * 1000) - 7000}))  # fmt: skip
    m.refresh()
    return m


@pytest.fixture
def monitor() -> Monitor:
    return fed_monitor()


def test_api_views(monitor):
    c = TestClient(create_app(monitor))
    ov = c.get("/api/overview").json()
    assert set(ov["processors"]) == {"shop/enrich", "shop/total"}
    enrich = ov["processors"]["shop/enrich"]
    assert enrich["lag"] == 20 and enrich["lag_seconds"] == 7 and enrich["freshness_s"] == 7
    assert ov["outputs"]["totals"]["freshness_s"] == 7  # through two stages
    assert ov["broker"]["reachable"] is True and ov["monitor"]["bad_records"] == 1
    assert {n["id"] for n in ov["topology"]["nodes"]} >= {"shop/enrich", "orders", "enriched", "totals"}
    assert c.get("/api/processors/enrich").json()["key"] == "shop/enrich"  # by name when unique
    one = c.get("/api/processors/shop/total").json()
    assert one["spark_input_rate"] is None  # an infinite rate in a record comes out as null, valid JSON
    assert "batch_ms" in one["series"] and one["batch_ms"]["count"] == 1
    missing = c.get("/api/processors/nope")
    assert missing.status_code == 404 and "known: shop/enrich, shop/total" in missing.json()["message"]
    topics = c.get("/api/topics").json()
    assert topics["orders"]["partitions"]["0"] == {"earliest": 0, "latest": 120}
    assert topics["orders"]["readers"] == ["shop/enrich"] and topics["orders"]["retention_ms"] == 3_600_000
    alerts = c.get("/api/alerts").json()
    assert {a["target"] for a in alerts["active"]} == {"shop/enrich", "shop/total"}
    assert {r["name"]: r["status"] for r in alerts["rules"]}["stalled(nope)"] == "unknown_target"
    series = c.get("/api/series", params={"since": int(T0 * 1000)}).json()
    assert series["processors"]["shop/enrich"]["lag"] == [[int(T0 * 1000), 20]]
    assert c.get("/api/series", params={"since": int(T0 * 1000) + 1}).json()["processors"]["shop/enrich"]["lag"] == []
    assert series["outputs"]["totals"] == [[int(T0 * 1000), 7]]
    assert c.get("/api/series", params={"since": "yesterday"}).status_code == 400
    assert c.get("/api/series", params={"after": "x"}).status_code == 400
    # The cursor: nothing new after this answer's arrival; then a batch stamped *before* the points already
    # fetched arrives, and the next poll with the cursor brings it, once.
    cursor = series["arrival"]
    assert series["started_ms"] == monitor.start_ms
    assert c.get("/api/series", params={"after": cursor}).json()["processors"]["shop/enrich"]["batch_ms"] == []
    late = {
        "type": "progress", "pipeline": "shop", "processor": "enrich", "at_ms": int(T0 * 1000) - 5000,
        "batch_id": 4, "input_rows": 5, "batch_duration_ms": 999, "sources": [], "accounting": {"in": 5, "out": 5},
    }  # fmt: skip
    assert monitor.ingest(json.dumps(late).encode()) is not None
    after = c.get("/api/series", params={"after": cursor}).json()
    assert after["processors"]["shop/enrich"]["batch_ms"] == [[int(T0 * 1000) - 5000, 999]]
    assert (
        c.get("/api/series", params={"after": after["arrival"]}).json()["processors"]["shop/enrich"]["batch_ms"] == []
    )
    assert c.get("/api/topology").json()["edges"]


def test_metrics_parse_as_prometheus_text(monitor):
    text = TestClient(create_app(monitor)).get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("weir_monitor_bad_records_total", ())] == 1
    assert samples[("weir_processor_lag_records", (("pipeline", "shop"), ("processor", "enrich")))] == 20
    assert (
        samples[("weir_processor_health", (("pipeline", "shop"), ("processor", "enrich"), ("state", "healthy")))] == 1
    )
    assert samples[("weir_output_freshness_seconds", (("output", "totals"),))] == 7
    assert (
        samples[("weir_processor_records_total", (("kind", "dlq"), ("pipeline", "shop"), ("processor", "enrich")))] == 5
    )
    assert families["weir_processor_batch_duration_seconds"].type == "histogram"
    assert samples[("weir_processor_batch_duration_seconds_bucket",
                    (("le", "0.25"), ("pipeline", "shop"), ("processor", "enrich")))] == 1  # fmt: skip
    assert samples[("weir_alert_firing", (("rule", "dlq_rate(*) > 1%"), ("target", "shop/enrich")))] == 1
    assert samples[("weir_topic_latest_offset", (("partition", "0"), ("topic", "orders")))] == 120
    rebuilt = (("client", "sink producer"), ("pipeline", "shop"), ("processor", "enrich"))
    assert samples[("weir_processor_client_rebuilds_total", rebuilt)] == 2
    assert not [k for k in samples if k[0] == "weir_processor_client_rebuilds_total" and ("processor", "total") in k[1]]


def test_dashboard_is_self_contained_with_stable_hooks(monitor):
    page = TestClient(create_app(monitor)).get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    html = page.text
    for hook in ('id="topology"', 'id="chart-rates"', 'id="chart-lag"', 'id="chart-freshness"', 'id="chart-batch"',
                 'id="chart-dlq"', 'id="alerts-active"', 'id="alerts-history"', 'id="processors"', '"data-name"',
                 "setInterval(refresh, 2000)", "polyline"):  # fmt: skip
        assert hook in html, hook
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")  # nothing fetched from elsewhere
    assert "<script src" not in html and "innerHTML" not in html  # names from records only ever set as text


def test_token_required_when_configured(monitor):
    c = TestClient(create_app(monitor, token="s3cret"))
    for path in ("/", "/api/overview", "/metrics", "/api/processors/enrich"):
        r = c.get(path)
        assert r.status_code == 401, path
        assert r.json() == {"error": "unauthorized", "message": "a token is required: send 'Authorization: "
                            "Bearer <token>' or ?token=<token>"}  # fmt: skip
    wrong = c.get("/api/overview", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["message"].startswith("wrong token")
    assert c.get("/api/overview", params={"token": "nope"}).status_code == 401
    assert c.get("/api/overview", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert c.get("/metrics", params={"token": "s3cret"}).status_code == 200
    assert c.get("/healthz").json() == {"ok": True}  # liveness needs no token


def test_exposure_rules():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0")
    check_exposure("127.0.0.1", None)
    check_exposure("0.0.0.0", "tok")
    with pytest.raises(ValueError, match=r"refusing to serve the monitor on 0\.0\.0\.0 without a token"):
        check_exposure("0.0.0.0", None)


def test_fetch_status_from_a_running_monitor(monitor, tmp_path, monkeypatch):
    class S:
        home = str(tmp_path)

    monkeypatch.delenv("WEIR_MONITOR_TOKEN", raising=False)
    monkeypatch.setenv("WEIR_CONFIG", str(tmp_path / "absent.toml"))
    assert fetch_status(S()) is None  # no monitor
    with serving(create_app(monitor, token="s3cr3t-tok")) as url:
        write_address(str(tmp_path), url, "127.0.0.1", int(url.rsplit(":", 1)[1]), True)
        address = json.loads((tmp_path / "monitor" / "address.json").read_text())
        assert "s3cr3t" not in json.dumps(address)  # the token is never written down
        assert fetch_status(S()) is None  # a token is needed and none is configured
        monkeypatch.setenv("WEIR_MONITOR_TOKEN", "s3cr3t-tok")
        status = fetch_status(S())
        assert status is not None and set(status["processors"]) == {"shop/enrich", "shop/total"}
    assert fetch_status(S(), timeout=1) is None  # stopped: no answer
    clear_address(str(tmp_path))
    assert not (tmp_path / "monitor" / "address.json").exists()


def cli() -> typer.Typer:
    app = typer.Typer()
    app.command("monitor")(monitor_command)

    @app.command("other")
    def other() -> None:  # a second command, so typer keeps `monitor` as a subcommand
        pass

    return app


def test_cli_refuses_a_public_address_without_a_token(tmp_path, monkeypatch):
    monkeypatch.setenv("WEIR_HOME", str(tmp_path))
    monkeypatch.delenv("WEIR_MONITOR_TOKEN", raising=False)
    result = CliRunner().invoke(cli(), ["monitor", "--host", "0.0.0.0", "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2 and "without a token" in result.output


def test_cli_malformed_rule_is_a_clear_error_at_start(tmp_path, monkeypatch):
    rules = tmp_path / "rules.toml"
    rules.write_text('[[alerts]]\nexpr = "freshness(x) < 2m"\n')
    monkeypatch.setenv("WEIR_HOME", str(tmp_path))
    result = CliRunner().invoke(cli(), ["monitor", "--config", str(rules), "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2
    assert "alert rule 1" in result.output and "freshness compares with >, not <" in result.output


def test_cli_help():
    result = CliRunner().invoke(cli(), ["monitor", "--help"])
    assert result.exit_code == 0 and "--token" in result.output and "--interval" in result.output
