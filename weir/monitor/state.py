"""The monitor's state: what it has heard of every processor and topic, and the figures computed from it.

The collectors feed it (`ingest`, `observe_*`); `refresh` recomputes the figures, samples the series and
evaluates the alerts; the views are plain JSON for the HTTP API. Thread-safe (one lock), bounded, on an
injected clock. See docs/monitor.md ("Inside the monitor").
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from threading import RLock
from typing import Any

from weir.monitor import compute, records
from weir.monitor.alerts import AlertEngine, Facts, iso
from weir.monitor.compute import TP, HealthRules
from weir.monitor.config import MonitorConfig
from weir.monitor.figures import Moment, figures
from weir.monitor.freshness import Stage, propagate
from weir.monitor.model import (
    SAMPLED,
    BrokerState,
    Completeness,
    Freshness,
    OutputFigures,
    ProcessorFigures,
    ProgressState,
)
from weir.monitor.records import BadRecord, Record, UnknownKind, time_ms
from weir.monitor.series import Ring, arrivals
from weir.monitor.track import BrokerSnapshot, TopicTrack, Track, finite

__all__ = ["MAX_PROCESSORS", "BrokerSnapshot", "Monitor", "TopicTrack", "Track"]
log = logging.getLogger("weir.monitor")
MAX_PROCESSORS = 1000


class Monitor:
    def __init__(
        self,
        config: MonitorConfig,
        trigger_of: Callable[[str, str], float] | None = None,
        clock: Callable[[], float] = time.time,
        bootstrap: str = "",
        progress_topic: str = "_weir.progress",
        alerts: AlertEngine | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.trigger_of = trigger_of or (lambda pipeline, name: (config.trigger or 1.0) * 1000)
        self.bootstrap = bootstrap
        self.progress_topic = progress_topic
        self.lock = RLock()
        self.start_ms = self.now_ms()
        self.tracks: dict[str, Track] = {}
        self.topics: dict[str, TopicTrack] = {}
        self.timestamps: dict[tuple[TP, int], int | None] = {}
        self.rules = HealthRules(
            config.stall_triggers, config.dead_after * 1000, config.rate_tolerance, config.batch_timeout * 1000
        )
        self.alerts = alerts or AlertEngine(config.rules, config.history)
        self.counts: Counter = Counter()  # records by kind, "bad", "unknown_kind", "duplicate"
        self.bad_reasons: deque[dict] = deque(maxlen=20)
        self.broker = BrokerState()
        self.progress = ProgressState(progress_topic)
        self.outputs: dict[str, OutputFigures] = {}
        self.output_series: dict[str, Ring] = {}  # freshness of each output topic or sink
        self.webhook: Any = None  # the Webhook, for its counters
        self.views: list[dict] = []  # materialized views as their stores describe them (observe_views)

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # -- declared topology ------------------------------------------------------------------------------
    def _track(self, pipeline: str, name: str) -> Track | None:
        key = f"{pipeline}/{name}"
        t = self.tracks.get(key)
        if t is None:
            if len(self.tracks) >= MAX_PROCESSORS:
                return None
            t = self.tracks[key] = Track(key, pipeline, name, self.config.series_points)
        return t

    def declare(
        self, pipeline: str, name: str, inputs: Iterable[str], outputs: Iterable[str],
        trigger_ms: float | None = None, checkpoint: str | None = None,
    ) -> None:  # fmt: skip
        """A processor known from a pipeline spec (it may not have published anything yet)."""
        with self.lock:
            t = self._track(pipeline, name)
            if t is None:
                return
            t.declared = True
            t.inputs |= set(inputs)
            t.outputs |= set(outputs)
            t.trigger_ms = trigger_ms if trigger_ms is not None else t.trigger_ms
            t.checkpoint = checkpoint or t.checkpoint

    # -- progress records ---------------------------------------------------------------------------------
    def ingest(self, value: bytes | str | None, key: bytes | None = None, where: str = "") -> Record | None:
        """Parse and apply one message of the progress topic; a malformed one is counted and skipped, and so is one
        that arrives again (a publisher's next start publishes again what the broker did not acknowledge)."""
        try:
            record = records.parse(value, key)
        except UnknownKind as exc:
            with self.lock:
                self.counts["unknown_kind"] += 1
                if self.counts["unknown_kind"] <= 10:
                    log.info("weir monitor: skipped a record at %s: %s", where or "?", exc)
            return None
        except BadRecord as exc:
            with self.lock:
                self.counts["bad"] += 1
                n = self.counts["bad"]
                self.bad_reasons.append({"at_ms": self.now_ms(), "where": where, "reason": str(exc)})
            if n <= 10 or n % 1000 == 0:
                log.warning("weir monitor: skipped a malformed progress record at %s (%d so far): %s", where, n, exc)
            return None
        with self.lock:
            t = self._track(record.pipeline, record.processor)
            if t is None:
                self.counts["bad"] += 1
                self.bad_reasons.append({"at_ms": self.now_ms(), "where": where,
                                         "reason": f"more than {MAX_PROCESSORS} processors"})  # fmt: skip
                return None
            if not t.first_time(records.identity(value)):
                self.counts["duplicate"] += 1  # published again (weir.runtime.acked): applied once
                return None
            self.counts[record.kind] += 1
            self.progress.last_record_ms = max(self.progress.last_record_ms or 0, record.at_ms)
            t.apply(record, self._trigger(t))
        return record

    def _trigger(self, t: Track) -> float:
        return t.trigger_ms if t.trigger_ms is not None else self.trigger_of(t.pipeline, t.name)

    # -- the broker, runners, checkpoints --------------------------------------------------------------------
    def topics_of_interest(self) -> set[str]:
        """Every topic a known processor reads or writes (sinks aside), and the progress topic."""
        with self.lock:
            names = {self.progress_topic}
            for t in self.tracks.values():
                names |= t.inputs | t.side_outputs | {o for o in t.outputs if ":" not in o}
            return names

    def wanted_timestamps(self, bounds: dict[TP, tuple[int, int]]) -> set[tuple[TP, int]]:
        """(partition, offset) of each processor's oldest unprocessed record whose timestamp is not known."""
        with self.lock:
            wanted = set()
            for t in self.tracks.values():
                committed = t.committed_now()
                lag = compute.lag_records(committed, bounds, t.inputs)
                for tp, off in compute.oldest_unprocessed(committed, bounds, lag).items():
                    if (tp, off) not in self.timestamps:
                        wanted.add((tp, off))
            return wanted

    def observe_broker(self, snap: BrokerSnapshot) -> None:
        with self.lock:
            broker = self.broker
            if broker.reachable is not True:
                broker.since_ms = snap.at_ms
                if broker.reachable is False:
                    log.info("weir monitor: the broker is reachable again")
            broker.reachable, broker.error, broker.last_ok_ms = True, None, snap.at_ms
            by_topic: dict[str, dict[int, tuple[int, int]]] = {}
            for (topic, p), b in snap.bounds.items():
                by_topic.setdefault(topic, {})[p] = b
            for name, parts in by_topic.items():
                tt = self.topics.get(name) or self.topics.setdefault(name, TopicTrack(name, self.config.series_points))
                tt.partitions = parts
                tt.polled_ms = snap.at_ms
                tt.samples.append((snap.at_ms, sum(hi for _, hi in parts.values())))
            for name, ret in snap.retention_ms.items():
                if name in self.topics:
                    self.topics[name].retention_ms = ret
            # Timestamps of offsets still wanted are kept; the others are dropped (bounded cache).
            self.timestamps = {**{k: v for k, v in self.timestamps.items() if k[0] in snap.bounds}, **snap.timestamps}
            if len(self.timestamps) > 50_000:
                self.timestamps = dict(list(self.timestamps.items())[-10_000:])
            for t in self.tracks.values():
                t.observe_poll(snap.at_ms, snap.bounds)

    def observe_broker_down(self, error: str, at_ms: int | None = None) -> None:
        with self.lock:
            at_ms = at_ms if at_ms is not None else self.now_ms()
            if self.broker.reachable is not False:
                log.warning("weir monitor: the broker is unreachable: %s", error)
                self.broker.since_ms = at_ms
            self.broker.reachable, self.broker.error = False, error

    def observe_progress_error(self, error: str | None) -> None:
        with self.lock:
            self.progress.error = error

    def observe_runs(self, runs: list[dict]) -> None:
        """The runners' state files: [{"pipeline", "alive", "stopping", "processors": {name: {state, checkpoint,
        ...}}}]."""
        # A processor can be named in several files (`weir run` of the whole pipeline once, of some of its
        # processors later): a live runner's file speaks for it, else the newest.
        chosen: dict[tuple[str, str], tuple[tuple[bool, int], dict, int | None, bool]] = {}
        for run in runs:
            rank = (bool(run.get("alive")), _updated_ms(run.get("updated")))
            for name, st in run.get("processors", {}).items():
                key = (run["pipeline"], name)
                if key not in chosen or rank >= chosen[key][0]:
                    chosen[key] = (rank, st, _updated_ms(run.get("started")) or None, bool(run.get("stopping")))
        with self.lock:
            for (pipeline, name), ((alive, updated), st, started, stopping) in chosen.items():
                t = self._track(pipeline, name)
                if t is None:
                    continue
                t.checkpoint = t.checkpoint or st.get("checkpoint")
                t.runner_state = st.get("state")
                t.runner_started_ms = started
                stopped = st.get("state") in ("stopped", "finished", "failed")
                # A runner that stops its queries lives on until each has stopped (its file says "stopping"
                # before their states say stopped): not a process that is gone
                t.runner_alive = True if alive else (None if stopped or stopping else False)
                # A dead runner's last word, unless the processor has said something since (a new runner whose
                # file is not written yet already sends progress).
                newer = t.lifecycle_ms is None or updated >= t.lifecycle_ms
                if not alive and stopped and newer and t.lifecycle not in ("stopped", "finished", "failed"):
                    t.lifecycle = st["state"]
                # A new runner that started after the last one stopped, gave up or failed it starts it again: its
                # file speaks before it publishes anything (its Spark session, its tracing), so the old end and
                # the old failure are over.
                later = started is not None and (t.lifecycle_ms is None or started >= t.lifecycle_ms)
                if alive and later and st.get("state") in ("pending", "starting"):
                    if t.lifecycle in ("stopped", "finished", "failed", "restarting"):
                        t.lifecycle, t.lifecycle_ms = "starting", started
                    if t.failed_at_ms is not None and t.failed_at_ms <= started:
                        t.failed_at_ms = None

    def observe_checkpoint(self, key: str, committed: dict[TP, int]) -> None:
        with self.lock:
            if key in self.tracks:
                self.tracks[key].checkpoint_committed = dict(committed)

    def observe_audit(self, key: str, completeness: Completeness) -> None:
        with self.lock:
            if key in self.tracks:
                self.tracks[key].completeness = completeness

    def checkpoints(self) -> dict[str, str]:
        with self.lock:
            return {k: t.checkpoint for k, t in self.tracks.items() if t.checkpoint}

    # -- figures ------------------------------------------------------------------------------------------
    def broker_ok(self, now_ms: int) -> bool:
        last = self.broker.last_ok_ms
        return bool(self.broker.reachable) and last is not None and now_ms - last <= self.config.stale_seconds * 1000

    def _bounds(self) -> dict[TP, tuple[int, int]]:
        return {(name, p): b for name, tt in self.topics.items() for p, b in tt.partitions.items()}

    def refresh(self) -> list[dict]:
        """Recompute every figure, sample the series, evaluate the alerts; returns the alert events."""
        with self.lock:
            now = self.now_ms()
            retention = {name: tt.retention_ms for name, tt in self.topics.items()}
            m = Moment(
                now, self.start_ms, self._bounds(), self.timestamps, retention, self.broker_ok(now),
                self.broker.reachable is False,
            )  # fmt: skip
            stages: dict[str, Stage] = {}
            computed: dict[str, ProcessorFigures] = {}
            for key, t in self.tracks.items():
                computed[key], stages[key] = figures(t, m, self.config, self.rules, self._trigger(t))
            complete = propagate(stages, now)
            proc_fresh, topic_fresh = complete.freshness(now)
            self.outputs = {}
            for key, t in self.tracks.items():
                fresh = Freshness(seconds=proc_fresh.get(key), completeness_ms=complete.processors.get(key))
                f = t.figures = replace(computed[key], freshness=fresh)
                for name, value in SAMPLED.items():
                    t.series[name].add(now, finite(value(f)))
                for out in t.outputs:
                    kind = "sink" if ":" in out else "topic"
                    self.outputs.setdefault(out, OutputFigures(out, kind)).writers.append(key)
            for name, o in self.outputs.items():
                o.freshness_s = topic_fresh.get(name)
                o.completeness_ms = complete.topics.get(name)
                ring = self.output_series.get(name) or self.output_series.setdefault(
                    name, Ring(self.config.series_points)
                )
                ring.add(now, finite(o.freshness_s))
            for gone in set(self.output_series) - set(self.outputs):
                del self.output_series[gone]
            facts = Facts(
                {k: t.figures for k, t in self.tracks.items() if t.figures is not None},
                {n: o.freshness_s for n, o in self.outputs.items()},
                bool(self.broker.reachable) if self.broker.reachable is not None else True,
            )
        return self.alerts.evaluate(now, facts)

    # -- views --------------------------------------------------------------------------------------------
    def _topic_view(self, tt: TopicTrack, now: int) -> dict:
        readers = sorted(k for k, t in self.tracks.items() if tt.name in t.inputs)
        writers = sorted(k for k, t in self.tracks.items() if tt.name in t.outputs | t.side_outputs)
        partitions = {str(p): {"earliest": lo, "latest": hi} for p, (lo, hi) in sorted(tt.partitions.items())}
        stale = tt.polled_ms is None or now - tt.polled_ms > self.config.stale_seconds * 1000
        append_rate = compute.rate(tt.samples, now, self.config.behind_window * 1000)
        return {
            "name": tt.name, "partitions": partitions, "records": sum(hi - lo for lo, hi in tt.partitions.values()),
            "retention_ms": tt.retention_ms, "append_rate": append_rate,
            "polled_ms": tt.polled_ms, "stale": stale, "readers": readers, "writers": writers,
            "freshness_s": self._freshness(tt.name),
        }  # fmt: skip

    def _freshness(self, output: str) -> float | None:
        o = self.outputs.get(output)
        return o.freshness_s if o is not None else None

    def topics_view(self) -> dict:
        with self.lock:
            now = self.now_ms()
            return {name: self._topic_view(tt, now) for name, tt in sorted(self.topics.items())}

    def topology(self) -> dict:
        """Nodes (processors, topics, sinks) and edges, with each node's health for the dashboard's graph."""
        with self.lock:
            nodes: dict[str, dict] = {}
            edges: list[dict] = []
            for key, t in sorted(self.tracks.items()):
                health = _health(t)
                nodes[key] = {"id": key, "kind": "processor", "name": t.name, "pipeline": t.pipeline, "health": health}
                for i in sorted(t.inputs):
                    nodes.setdefault(i, {"id": i, "kind": "topic", "name": i, "writers": []})
                    edges.append({"from": i, "to": key})
                for o in sorted(t.outputs):
                    node = nodes.setdefault(o, {"id": o, "kind": "sink" if ":" in o else "topic", "name": o,
                                                "writers": []})  # fmt: skip
                    node.setdefault("writers", []).append(key)
                    edges.append({"from": key, "to": o})
            order = [compute.DEAD, compute.STALLED, compute.WAITING, compute.BEHIND, compute.UNKNOWN, compute.STARTING,
                     compute.STOPPED, compute.RUNNING, compute.HEALTHY]  # fmt: skip
            for node in nodes.values():
                if node["kind"] == "processor":
                    continue
                writers = [_health(self.tracks[w]) for w in node.pop("writers", [])]
                node["health"] = min(writers, key=order.index) if writers else compute.HEALTHY
                if self.broker.reachable is False:
                    node["health"] = compute.UNKNOWN
                node["freshness_s"] = self._freshness(node["id"])
            return {"nodes": list(nodes.values()), "edges": edges}

    def processor(self, name: str) -> dict | None:
        """Figures of a processor by `pipeline/name`, or by name when only one pipeline has it."""
        with self.lock:
            t = self.tracks.get(name)
            if t is None:
                found = [t for t in self.tracks.values() if t.name == name]
                t = found[0] if len(found) == 1 else None
            if t is None:
                return None
            return {**_json(t), "series": {k: r.since() for k, r in t.series.items()}}

    def series(self, since_ms: int = 0, after: int = 0) -> dict:
        """Points stamped at or after since_ms that arrived after the cursor `after`, and the cursor to ask
        with next time (`arrival`): polling with it yields every point once, whatever its stamp."""
        with self.lock:
            cursor = arrivals()
            return {
                "arrival": cursor,
                "started_ms": self.start_ms,  # a restarted monitor numbers arrivals afresh: clients start over
                "processors": {
                    k: {n: r.since(since_ms, after) for n, r in t.series.items()} for k, t in self.tracks.items()
                },
                "outputs": {n: ring.since(since_ms, after) for n, ring in self.output_series.items()},
            }

    def monitor_view(self) -> dict:
        now = self.now_ms()
        return {
            "now_ms": now, "now": iso(now), "started_ms": self.start_ms, "pid": os.getpid(),
            "interval_s": self.config.interval, "records": dict(self.counts),
            "bad_records": self.counts.get("bad", 0), "bad_reasons": list(self.bad_reasons),
            "webhook": self.webhook.to_json() if self.webhook is not None else None,
        }  # fmt: skip

    def observe_views(self, views: list[dict]) -> None:
        """The views read from their stores (weir.storage.views ViewInfo.to_json, or {"name", "error"})."""
        with self.lock:
            self.views = list(views)

    def views_view(self) -> list[dict]:
        """Every view: its store's freshness (the input time its rows are current as of, the lag now) and the
        propagated freshness of the processor that maintains it (`<pipeline>/view.<name>`)."""
        with self.lock:
            now = self.now_ms()
            out = []
            for v in self.views:
                fresh = dict(v.get("freshness") or {})
                if fresh.get("as_of_ms") is not None:
                    fresh["lag_s"] = max(0.0, (now - fresh["as_of_ms"]) / 1000)
                t = self.tracks.get(f"{v.get('pipeline')}/view.{v.get('name')}")
                f = t.figures if t is not None else None
                out.append({**v, "freshness": fresh, "processor": t.key if t is not None else None,
                            "processor_freshness_s": f.freshness.seconds if f is not None else None,
                            "health": str(_health(t)) if t is not None else None})  # fmt: skip
            return out

    def overview(self) -> dict:
        with self.lock:
            now = self.now_ms()
            health = Counter(str(_health(t)) for t in self.tracks.values())
            processors = {
                k: {n: v for n, v in _json(t).items() if n not in ("batch_ms", "scheduling_delay_ms")}
                | {"batch_ms_p50": t.batch_hist.quantile(0.5), "batch_ms_p95": t.batch_hist.quantile(0.95)}
                for k, t in sorted(self.tracks.items())
            }
            broker = {**self.broker.to_json(), "bootstrap": self.bootstrap, "stale": not self.broker_ok(now)}
            return {
                "monitor": self.monitor_view(),
                "broker": broker,
                "progress": self.progress.to_json(),
                "health": dict(health),
                "processors": processors,
                "outputs": {n: o.to_json() for n, o in sorted(self.outputs.items())},
                "topology": self.topology(),
                "alerts": {"active": self.alerts.firing()},
                "views": self.views_view(),
            }


def _health(t: Track) -> compute.Health:
    return t.figures.health if t.figures is not None else compute.UNKNOWN


def _json(t: Track) -> dict[str, Any]:
    """The processor's figures as JSON; before the first refresh, none."""
    return t.figures.to_json() if t.figures is not None else {}


def _updated_ms(value: Any) -> int:
    """A state file's `updated` time in epoch ms (0 when missing or unreadable: the oldest)."""
    try:
        return time_ms(value, "updated") or 0
    except BadRecord:
        return 0
