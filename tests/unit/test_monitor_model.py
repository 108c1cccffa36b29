"""The typed figures record (weir/monitor/model.py) against the JSON the API promises: the exact keys of a
processor's figures, every key the dashboard reads, and the figures behind alert kinds and series."""

from __future__ import annotations

import json
import re

from weir.monitor import dashboard
from weir.monitor.alerts import VALUE
from weir.monitor.compute import Health
from weir.monitor.config import KINDS, MonitorConfig
from weir.monitor.model import (
    SAMPLED,
    Accounting,
    Distribution,
    Freshness,
    Lag,
    LastBatch,
    OutputFigures,
    ProcessorFigures,
    Rates,
    Retention,
    Run,
    Violation,
)
from weir.monitor.records import RetentionReport
from weir.monitor.series import Histogram
from weir.monitor.state import BrokerSnapshot, Monitor
from weir.monitor.track import BATCH_SERIES, SAMPLED_SERIES

# The keys of /api/processors/<name> (docs/monitor.md), in order; the overview drops the two histograms
# and adds batch_ms_p50 and batch_ms_p95. Renaming one breaks the dashboard, `weir status` and users' scripts.
PROCESSOR_KEYS = [
    "key", "pipeline", "name", "health", "health_reason", "stale", "declared", "inputs", "outputs",
    "side_outputs", "trigger_ms", "checkpoint", "lifecycle", "runner_alive", "note", "restarts", "failures_total",
    "failures_window", "last_error", "failed_at_ms", "client_rebuilds", "first_seen_ms", "last_record_ms",
    "last_advance_ms", "lag",
    "lag_by_partition", "lag_seconds", "lag_growing", "pending_since_ms", "input_rate", "processing_rate",
    "spark_input_rate", "spark_processed_rate", "dlq_rate", "late_rate", "violations_window", "violations_total",
    "unbalanced_batches", "last_violation", "totals", "retention_left_s", "retention_partition", "lost_offsets",
    "retention_reports", "last_batch", "batch_ms", "scheduling_delay_ms", "completeness_ms", "freshness_s",
    "silent_gaps", "silent_offsets", "counted_lost_offsets", "in_flight_offsets", "gaps", "audit_error",
    "release_drift", "versions",
]  # fmt: skip
T0 = 1_800_000_000


def full() -> ProcessorFigures:
    """A record with every part filled in."""
    hist = Histogram()
    hist.observe(250)
    report = RetentionReport(
        kind="retention_risk", pipeline="shop", processor="enrich", at_ms=T0, topic="orders", partition=0,
        reason="lag", time_left_ms=60_000, lag_ms=None, retention_ms=None, lost_offsets=0, message="hm",
    )  # fmt: skip
    return ProcessorFigures(
        key="shop/enrich", pipeline="shop", name="enrich", health=Health.BEHIND, health_reason="lag growing",
        inputs=("orders",), outputs=("enriched",), side_outputs=("orders.dlq",), trigger_ms=1000.0,
        run=Run(state="running", restarts=1, failures_total=2, failures_window=1, last_error="ValueError"),
        first_seen_ms=T0, last_record_ms=T0, last_advance_ms=T0,
        lag=Lag(records=20, by_partition={"orders/0": 20}, seconds=7.0, growing=True, pending_since_ms=T0),
        rates=Rates(input=10.0, processing=8.0, spark_input=9.0, spark_processed=9.5, dlq=0.05, late=0.01),
        accounting=Accounting(1, 3, 1, Violation(7, T0, 10, {"in": 100, "out": 90}), {"in": 100, "out": 90}),
        retention=Retention(left_s=3600.0, partition="orders/0", lost_offsets=0, reports=(report,)),
        last_batch=LastBatch(batch_id=7, at_ms=T0, input_rows=100, batch_ms=250.0),
        batch_ms=Distribution.of(hist), scheduling_delay_ms=Distribution.of(Histogram()),
        freshness=Freshness(seconds=7.0, completeness_ms=T0 - 7000),
    )  # fmt: skip


def test_a_record_gives_exactly_the_json_keys_of_the_api():
    for fig in (full(), ProcessorFigures("shop/x", "shop", "x")):
        body = fig.to_json()
        assert list(body) == PROCESSOR_KEYS
        assert json.loads(json.dumps(body, allow_nan=False)) == body  # plain JSON: no enum, tuple or dataclass
    body = full().to_json()
    assert body["health"] == "behind" and body["lag"] == 20 and body["dlq_rate"] == 0.05
    assert body["last_violation"] == {"batch_id": 7, "at_ms": T0, "unaccounted": 10,
                                      "accounting": {"in": 100, "out": 90}}  # fmt: skip
    assert body["retention_reports"] == [{"topic": "orders", "partition": 0, "reason": "lag",
                                          "time_left_ms": 60_000, "at_ms": T0, "message": "hm"}]  # fmt: skip
    assert set(body["last_batch"]) >= {"batch_id", "at_ms", "input_rows", "batch_ms", "watermark_ms"}
    assert set(body["batch_ms"]) == {"buckets", "count", "sum", "p50", "p95", "max"}
    assert body["batch_ms"]["buckets"][-1] == ["+Inf", 1]
    assert list(OutputFigures("t", "topic").to_json()) == ["name", "kind", "writers", "freshness_s",
                                                           "completeness_ms"]  # fmt: skip


def _read(var: str) -> set[str]:
    """The properties the dashboard's script reads of `var` (e.g. `p.lag` -> "lag")."""
    return set(re.findall(rf"\b{re.escape(var)}\.([a-z_0-9]+)", dashboard.DASHBOARD))


def test_every_key_the_dashboard_reads_is_in_the_api():
    m = Monitor(MonitorConfig(), clock=lambda: T0 / 1000)
    record = {
        "type": "progress", "pipeline": "shop", "processor": "enrich", "at_ms": T0, "batch_id": 3,
        "input_rows": 100, "batch_duration_ms": 250, "sources": [{"end_offset": {"orders": {"0": 100}}}],
        "accounting": {"in": 100, "out": 100, "outputs": {"enriched": 100}},
    }  # fmt: skip
    m.ingest(json.dumps(record).encode())
    m.observe_broker(BrokerSnapshot(T0, {("orders", 0): (0, 120)}, {"orders": 3_600_000}))
    m.refresh()
    ov = json.loads(json.dumps(m.overview(), default=str))
    proc = ov["processors"]["shop/enrich"]
    layout = {"x", "y"}  # `p` is also a point of the graph's layout
    processor_keys = _read("p") - layout
    assert "lag" in processor_keys and "health_reason" in processor_keys  # the pattern finds them
    assert processor_keys <= set(proc), processor_keys - set(proc)
    assert processor_keys <= set(full().to_json()) | {"batch_ms_p50", "batch_ms_p95"}
    assert _read("p.last_batch") <= set(proc["last_batch"])
    assert _read("o") <= set(ov["outputs"]["enriched"])
    assert _read("n") <= {k for node in ov["topology"]["nodes"] for k in node}
    assert _read("ov") <= set(ov) and _read("ov.broker") <= set(ov["broker"])
    charted = set(re.findall(r'\["([a-z_]+)", "[a-z]+", "[^"]*"\]', dashboard.DASHBOARD))
    assert {"lag", "input_rate", "batch_ms", "dlq"} <= charted <= set(m.series()["processors"]["shop/enrich"])


def test_every_alert_kind_and_series_reads_a_figure():
    assert set(VALUE) == {k for k, spec in KINDS.items() if spec[3] != "broker"}
    fig = full()
    assert {k: VALUE[k](fig) for k in ("lag", "freshness", "dlq_rate", "retention_left", "behind", "failures")} == {
        "lag": 20,
        "freshness": 7.0,
        "dlq_rate": 0.05,
        "retention_left": 3600.0,
        "behind": True,
        "failures": 1,
    }
    assert tuple(SAMPLED) == SAMPLED_SERIES and not set(SAMPLED) & set(BATCH_SERIES)
    body = fig.to_json()
    assert {name: value(fig) for name, value in SAMPLED.items()} == {name: body[name] for name in SAMPLED}
