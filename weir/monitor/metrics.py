"""`/metrics`: the monitor's figures in Prometheus' text format, built at each scrape from the last refresh
by a custom collector (no gauges to keep in step with the state). Names are listed in docs/monitor.md."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from weir.kafka import heal
from weir.monitor.compute import HEALTH_STATES
from weir.monitor.model import ProcessorFigures
from weir.monitor.series import Histogram
from weir.monitor.state import Monitor

ACCOUNTING = ("in", "out", "filtered", "dlq", "late", "duplicate", "absorbed", "emitted")
# weir_processor_<name>: (name, the figure, help)
GAUGES: tuple[tuple[str, Callable[[ProcessorFigures], object], str], ...] = (
    ("lag_records", lambda f: f.lag.records, "Records not yet processed (latest - committed offsets of its inputs)."),
    ("lag_seconds", lambda f: f.lag.seconds, "Age of the oldest unprocessed input record."),
    ("input_rate", lambda f: f.rates.input, "Records per second appended to its inputs (broker offsets)."),
    ("processing_rate", lambda f: f.rates.processing, "Records per second it committed (its offsets)."),
    ("freshness_seconds", lambda f: f.freshness.seconds, "How far behind real time its output is complete."),
    ("dlq_ratio", lambda f: f.rates.dlq, "Dead-lettered / input records over the rate window."),
    ("late_ratio", lambda f: f.rates.late, "Late / input records over the rate window."),
    ("retention_left_seconds", lambda f: f.retention.left_s, "Time before retention may delete an unprocessed "
     "record."),
    ("restarts", lambda f: f.run.restarts, "Restarts of its query, as its runner counts them."),
    ("silent_gaps", lambda f: f.completeness.silent_gaps, "Silent gaps in its input offsets (weir audit; read "
     "from checkpoints)."),
    ("counted_lost_offsets", lambda f: f.completeness.lost_offsets if f.completeness.silent_gaps is not None
     else None, "Input offsets skipped and counted in @dataLoss (weir audit)."),
    ("release_drift", lambda f: None if f.drift is None else f.drift.difference, "How far the running version's "
     "out, filtered, dlq or late share differs from the previous version's, beyond chance (0: it does not)."),
)  # fmt: skip


def _num(v: object) -> float | None:
    if isinstance(v, bool):
        return float(v)
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def _histogram(name: str, doc: str, labels: list[str], per: dict[tuple, Histogram]) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=labels)
    for values, h in per.items():
        buckets = [("+Inf" if math.isinf(b) else repr(b / 1000), n) for b, n in h.cumulative()]
        fam.add_metric(list(values), buckets, h.sum / 1000)
    return fam


class MonitorCollector:
    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        m = self.monitor
        with m.lock:
            yield GaugeMetricFamily("weir_monitor_up", "1 while the monitor serves.", value=1)
            broker = GaugeMetricFamily("weir_monitor_broker_up", "1 when the last broker poll succeeded.")
            broker.add_metric([], 1.0 if m.broker.reachable else 0.0)
            yield broker
            recs = CounterMetricFamily("weir_monitor_records", "Progress records read, by type.", labels=["type"])
            for kind in ("progress", "failure", "state", "retention_risk", "unknown_kind", "duplicate"):
                recs.add_metric([kind], m.counts.get(kind, 0))
            yield recs
            yield CounterMetricFamily(
                "weir_monitor_bad_records", "Malformed progress records skipped.", value=m.counts.get("bad", 0)
            )
            rebuilds = CounterMetricFamily(
                "weir_monitor_client_rebuilds",
                "Kafka clients of the monitor rebuilt because they could not go on.",
                labels=["client"],
            )
            for kind, n in sorted(heal.rebuilds().items()):
                rebuilds.add_metric([kind], n)
            yield rebuilds
            hook = m.webhook
            yield CounterMetricFamily("weir_monitor_webhook_posts", "Alerts posted.", value=hook.sent if hook else 0)
            yield CounterMetricFamily(
                "weir_monitor_webhook_failures", "Alert posts that failed.", value=hook.failures if hook else 0
            )
            labels = ["pipeline", "processor"]
            health = GaugeMetricFamily("weir_processor_health", "1 for the processor's health state.",
                                       labels=[*labels, "state"])  # fmt: skip
            gauges = {n: GaugeMetricFamily(f"weir_processor_{n}", doc, labels=labels) for n, _, doc in GAUGES}
            last = GaugeMetricFamily("weir_processor_last_record_timestamp_seconds", "When it last published.",
                                     labels=labels)  # fmt: skip
            totals = CounterMetricFamily("weir_processor_records", "Records by accounting destination, seen "
                                         "since the monitor started.", labels=[*labels, "kind"])  # fmt: skip
            violations = CounterMetricFamily("weir_processor_violations", "Accounting violations.", labels=labels)
            expired = CounterMetricFamily(
                "weir_processor_state_keys_expired",
                "Keys whose state a time to live cleared (@stateful), since the monitor started.",
                labels=labels,
            )
            failures = CounterMetricFamily("weir_processor_failures", "Failure records.", labels=labels)
            rebuilt = CounterMetricFamily("weir_processor_client_rebuilds", "Kafka clients of its process rebuilt "
                                          "because they could not go on (its Spark workers' sink producers "
                                          "included).", labels=[*labels, "client"])  # fmt: skip
            batch: dict[tuple, Histogram] = {}
            delay: dict[tuple, Histogram] = {}
            for t in m.tracks.values():
                f, lv = t.figures, [t.pipeline, t.name]
                for state in HEALTH_STATES:
                    health.add_metric([*lv, state], 1.0 if f is not None and f.health == state else 0.0)
                for n, value, _ in GAUGES:
                    if f is not None and (v := _num(value(f))) is not None:
                        gauges[n].add_metric(lv, v)
                if t.last_record_ms is not None:
                    last.add_metric(lv, t.last_record_ms / 1000)
                for kind in ACCOUNTING:
                    totals.add_metric([*lv, kind], t.totals.get(kind, 0))
                violations.add_metric(lv, t.totals.get("violations", 0))
                expired.add_metric(lv, t.totals.get("expired", 0))
                failures.add_metric(lv, t.failures_total)
                for kind, n in sorted(t.client_rebuilds.items()):
                    rebuilt.add_metric([*lv, kind], n)
                batch[tuple(lv)], delay[tuple(lv)] = t.batch_hist, t.delay_hist
            yield health
            yield from gauges.values()
            yield from (last, totals, violations, expired, failures, rebuilt)
            yield _histogram("weir_processor_batch_duration_seconds", "Micro-batch durations.", labels, batch)
            yield _histogram("weir_processor_scheduling_delay_seconds", "How late batches started.", labels, delay)
            fresh = GaugeMetricFamily("weir_output_freshness_seconds", "How far behind real time an output "
                                      "topic or sink is complete.", labels=["output"])  # fmt: skip
            for name, o in m.outputs.items():
                if (v := _num(o.freshness_s)) is not None:
                    fresh.add_metric([name], v)
            yield fresh
            lo = GaugeMetricFamily("weir_topic_earliest_offset", "Earliest offset.", labels=["topic", "partition"])
            hi = GaugeMetricFamily("weir_topic_latest_offset", "Latest offset.", labels=["topic", "partition"])
            ret = GaugeMetricFamily("weir_topic_retention_seconds", "retention.ms / 1000.", labels=["topic"])
            for name, tt in m.topics.items():
                for p, (e, latest) in tt.partitions.items():
                    lo.add_metric([name, str(p)], e)
                    hi.add_metric([name, str(p)], latest)
                if tt.retention_ms is not None:
                    ret.add_metric([name], tt.retention_ms / 1000)
            yield from (lo, hi, ret)
            firing = GaugeMetricFamily("weir_alert_firing", "1 per firing alert.", labels=["rule", "target"])
            for event in m.alerts.firing():
                firing.add_metric([event["rule"], event["target"]], 1.0)
            yield firing


def render(monitor: Monitor) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MonitorCollector(monitor))
    return generate_latest(registry)
