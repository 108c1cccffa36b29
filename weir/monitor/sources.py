"""Where the monitor's figures come from: the progress topic, polls of the broker, the runners' state files
and (optionally) checkpoints. Each collector feeds a `Monitor` and never raises out of its loop: a broker
that is down is reported as unreachable, a bad file is skipped with a warning.

The progress consumer is assigned (`assign()`) to every partition of the progress topic at positions the
monitor keeps itself (weir/monitor/store.py), with no consumer group: joining a group takes seconds on the
embedded broker and would commit positions the monitor does not need the broker to hold.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from weir.kafka import heal
from weir.kafka.log import BrokerUnavailable, LogView, admin_client, client_log
from weir.monitor.compute import TP
from weir.monitor.model import Completeness
from weir.monitor.state import BrokerSnapshot, Monitor
from weir.process import process_alive
from weir.storage.views import ViewError, reader_for

log = logging.getLogger("weir.monitor")
_DOWN = (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE, KafkaError._TIMED_OUT)


def start_offset(earliest: int, latest: int, remembered: int | None, replay: int, catch_up_max: int) -> int:
    """Where to start reading a partition of the progress topic: from the remembered position, so records
    published while the monitor was down are not missed, but at least `replay` records back to rebuild the
    recent history, and never more than `catch_up_max` back (older records are skipped, and logged)."""
    start = latest - replay if remembered is None else min(remembered, latest - replay)
    return min(max(start, earliest, latest - catch_up_max), latest)


class ProgressReader:
    """Reads the progress topic into the monitor; `positions` (partition -> next offset) is what it has read."""

    def __init__(
        self, monitor: Monitor, client: dict[str, str], topic: str, positions: dict[int, int] | None = None,
        replay: int = 2000, catch_up_max: int = 100_000, timeout: float = 5.0,
    ) -> None:  # fmt: skip
        self.monitor = monitor
        self.client = client
        self.topic = topic
        self.positions: dict[int, int] = dict(positions or {})
        self.replay = replay
        self.catch_up_max = catch_up_max
        self.timeout = timeout
        self.skipped = 0  # records not read because more than catch_up_max were published meanwhile
        self.consumer: Consumer | None = None
        self.rebuilds = 0  # consumers closed and made anew because they could not go on (weir.kafka.heal)
        self._broken: str | None = None
        self._backoff = heal.Backoff()
        self._assigned: set[int] = set()
        self._next_check = 0.0
        self._lock = threading.Lock()
        # Called after each read that fed the monitor records: a batch's commit moved the oldest unprocessed
        # record, whose timestamp (freshness) only a broker poll fetches (MonitorService wakes its poller).
        self.on_records: Callable[[], None] | None = None

    def _error(self, err: KafkaError) -> None:
        if heal.cannot_go_on(err):
            self._broken = f"{err.name()}: {err.str()}"
        if err.code() in _DOWN:
            self.monitor.observe_progress_error(f"cannot read {self.topic}: {err.str()}")

    def _consumer(self) -> Consumer:
        if self.consumer is None:
            self.consumer = Consumer({
                **heal.reconnecting(self.client), "group.id": f"weir-monitor-{uuid.uuid4().hex[:12]}",
                "enable.auto.commit": False, "auto.offset.reset": "earliest", "enable.partition.eof": False,
                "logger": client_log, "error_cb": self._error, "fetch.wait.max.ms": 100,
            })  # fmt: skip
        return self.consumer

    def assign(self) -> bool:
        """Assign the partitions not assigned yet; False while the topic does not exist or cannot be seen."""
        consumer = self._consumer()
        try:
            # All-topic metadata: a request naming the topic could make some brokers create it.
            meta = consumer.list_topics(timeout=self.timeout)
        except KafkaException as exc:
            self.monitor.observe_progress_error(f"cannot read metadata for {self.topic}: {exc}")
            return False
        topic = meta.topics.get(self.topic)
        if topic is None or topic.error is not None:
            self.monitor.observe_progress_error(f"the progress topic {self.topic} does not exist (yet)")
            return bool(self._assigned)
        new = []
        for p in sorted(set(topic.partitions) - self._assigned):
            try:
                lo, hi = consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=self.timeout)
            except KafkaException as exc:
                self.monitor.observe_progress_error(f"cannot list offsets of {self.topic}/{p}: {exc}")
                return bool(self._assigned)
            remembered = self.positions.get(p)
            start = start_offset(lo, hi, remembered, self.replay, self.catch_up_max)
            if remembered is not None and start > remembered:
                self.skipped += start - remembered
                log.warning(
                    "weir monitor: %s/%d: %d records were published since the monitor last read it, more than "
                    "catch_up_max=%d; the oldest %d are skipped", self.topic, p, hi - remembered, self.catch_up_max,
                    start - remembered,
                )  # fmt: skip
            new.append(TopicPartition(self.topic, p, start))
        if new:
            consumer.incremental_assign(new)
            self._assigned |= {tp.partition for tp in new}
        self.monitor.observe_progress_error(None)
        return True

    def step(self, timeout: float = 0.5) -> int:
        """Read what is there (up to `timeout`), feed the monitor; the number of messages read."""
        with self._lock:
            if self._broken is not None and self._backoff.wait_s() == 0.0:
                self._rebuild()
            if time.monotonic() >= self._next_check:
                self._next_check = time.monotonic() + (30.0 if self._assigned else 2.0)
                if not self.assign():
                    time.sleep(min(timeout, 0.5))
                    return 0
            if not self._assigned:
                time.sleep(min(timeout, 0.5))
                return 0
            n = 0
            for msg in self._consumer().consume(num_messages=500, timeout=timeout):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                        self.monitor.observe_progress_error(f"the progress topic {self.topic} is gone")
                    elif err.code() not in (KafkaError._PARTITION_EOF,):
                        self._error(err)
                    continue
                where = f"{msg.topic()}/{msg.partition()}@{msg.offset()}"
                self.monitor.ingest(msg.value(), msg.key(), where)
                self.positions[msg.partition()] = msg.offset() + 1
                n += 1
            if n:
                self.monitor.observe_progress_error(None)
                if self.on_records is not None:
                    self.on_records()
            return n

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.step(0.5)
            except Exception as exc:  # the loop must outlive anything one message or the client does
                log.warning("weir monitor: reading %s: %s", self.topic, exc)
                self.monitor.observe_progress_error(f"reading {self.topic}: {exc}")
                stop.wait(1.0)

    def _rebuild(self) -> None:
        """Close a consumer that cannot go on; the next step makes a new one, assigned from `positions` (what
        was read stays read, nothing is skipped)."""
        why, self._broken = self._broken, None
        if self.consumer is not None:
            self.consumer.close()
        self.consumer = None
        self._assigned.clear()
        self._next_check = 0.0
        self._backoff.rebuilt()
        self.rebuilds += 1
        total = heal.counted("monitor consumer")
        log.warning("weir monitor: the consumer of %s is rebuilt (%d so far) after: %s", self.topic, total, why)

    def close(self) -> None:
        with self._lock:
            if self.consumer is not None:
                self.consumer.close()
                self.consumer = None
                self._assigned.clear()


def fetch_timestamps(consumer: Consumer, wanted: set[tuple[TP, int]], timeout: float) -> dict:
    """{((topic, partition), offset): timestamp ms of the record at (or first after) that offset, or None when
    there is none (any more)}. One fetch per partition and round; a partition wanted at several offsets
    (several processors read it) takes several rounds."""
    out: dict[tuple[TP, int], int | None] = {}
    rounds: dict[TP, list[int]] = {}
    for tp, off in sorted(wanted):
        rounds.setdefault(tp, []).append(off)
    deadline = time.monotonic() + timeout
    while rounds and time.monotonic() < deadline:
        batch = {tp: offs.pop(0) for tp, offs in rounds.items()}
        rounds = {tp: offs for tp, offs in rounds.items() if offs}
        consumer.assign([TopicPartition(t, p, o) for (t, p), o in batch.items()])
        try:
            pending = set(batch)
            while pending and time.monotonic() < deadline:
                for msg in consumer.consume(num_messages=len(pending) * 5, timeout=0.2):
                    tp = (msg.topic(), msg.partition())
                    if tp not in pending:
                        continue
                    err = msg.error()
                    if err is None:
                        _, ts = msg.timestamp()
                        out[(tp, batch[tp])] = ts if ts is not None and ts >= 0 else None
                        pending.discard(tp)
                    elif err.code() in (KafkaError._PARTITION_EOF, KafkaError._AUTO_OFFSET_RESET):
                        out[(tp, batch[tp])] = None
                        pending.discard(tp)
        finally:
            consumer.unassign()
    return out


def retention_of(admin, topics: list[str], timeout: float) -> dict[str, int | None]:
    """retention.ms of each topic (None: unlimited); topics that cannot be described are left out."""
    if not topics:
        return {}
    resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics]
    out: dict[str, int | None] = {}
    for res, future in admin.describe_configs(resources, request_timeout=timeout).items():
        try:
            entry = future.result().get("retention.ms")
        except KafkaException:
            continue
        try:
            value = int(entry.value) if entry is not None and entry.value is not None else -1
        except ValueError:
            value = -1
        out[res.name] = value if value >= 0 else None
    return out


class BrokerPoller:
    """One poll: partitions and (earliest, latest) offsets of the topics of interest, their retention.ms
    (every `retention_every` seconds), and the timestamps of the processors' oldest unprocessed records.
    The consumer is short-lived, one per poll: a consumer that outlives a topic deletion has crashed inside
    librdkafka on the embedded broker (see weir/kafka/admin.py). The admin client lives as long as the poller
    (made anew after a failed poll): made and dropped at up to MAX_POLLS_S a second, one crashed the process
    inside list_offsets on a loaded machine, twice."""

    def __init__(self, monitor: Monitor, client: dict[str, str], timeout: float = 5.0, retention_every: float = 60):
        self.monitor = monitor
        self.client = client
        self.timeout = timeout
        self.retention_every = retention_every
        self._retention: dict[str, int | None] = {}
        self._retention_at: dict[str, float] = {}
        self._admin: AdminClient | None = None

    def poll_once(self) -> bool:
        at_ms = self.monitor.now_ms()
        try:
            if self._admin is None:
                self._admin = admin_client(self.client)
            view = LogView(self.client, timeout=self.timeout, admin=self._admin)
            try:
                parts = view.partitions()
                names = sorted(self.monitor.topics_of_interest() & parts.keys())
                bounds = view.bounds([(n, p) for n in names for p in parts[n]])
                due = [n for n in names if time.monotonic() - self._retention_at.get(n, -1e9) > self.retention_every]
                for name, ret in retention_of(view.admin, due, self.timeout).items():
                    self._retention[name] = ret
                    self._retention_at[name] = time.monotonic()
                stamps = fetch_timestamps(view.consumer, self.monitor.wanted_timestamps(bounds), self.timeout)
            finally:
                view.close()
        except (BrokerUnavailable, KafkaException, RuntimeError) as exc:
            self._admin = None  # it may hold a failed connection: the next poll starts clean
            self.monitor.observe_broker_down(str(exc), at_ms)
            return False
        retention = {n: self._retention.get(n) for n in names}
        self.monitor.observe_broker(BrokerSnapshot(at_ms, bounds, retention, stamps))
        return True


def read_runs(home: str) -> list[dict]:
    """The runners' state files `<home>/run/*.json` (weir/runtime/runner.py), each with whether its process
    is alive; unreadable files are skipped (a runner rewrites its file by rename, so a torn one is rare)."""
    out = []
    run_dir = Path(home) / "run"
    for f in sorted(run_dir.glob("*.json")) if run_dir.is_dir() else []:
        try:
            body = json.loads(f.read_text())
            pid = int(body["pid"])
            live = process_alive(pid)
            out.append({
                "pipeline": str(body["pipeline"]), "alive": live and not body.get("stopping"),
                "stopping": live and bool(body.get("stopping")),  # its process lives and stops its queries
                "updated": body.get("updated"), "started": body.get("started"),
                "processors": dict(body.get("processors") or {}),
            })  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.debug("weir monitor: skipped run file %s: %s", f, exc)
    return out


def read_checkpoint(checkpoint: str) -> dict[TP, int] | None:
    """Committed next offsets of a query from its checkpoint."""
    # Imported when first asked: it loads pyarrow (tens of MB), which a monitor watching no checkpoint never
    # needs (docs/monitor.md, its memory).
    from weir.checkpoint.files import Checkpoint
    from weir.checkpoint.log import CheckpointError, read_offsets

    try:
        committed = read_offsets(Checkpoint(checkpoint)).committed
    except (CheckpointError, OSError, ValueError):
        return None
    return {(t, p): off for t, parts in committed.items() for p, off in parts.items()}


def read_audit(name: str, checkpoint: str, cache: dict) -> Completeness:
    """`weir audit`'s figures of one processor's checkpoint; `cache` (the caller's, per processor) keeps the
    offset files read, for the run that wrote them (a reset starts a new run, whose batch 0 is another file)."""
    from weir.checkpoint.audit import SILENT, audit
    from weir.checkpoint.files import Checkpoint

    cp = Checkpoint(checkpoint)
    try:
        run = cp.run_id()
    except (OSError, ValueError, KeyError):
        run = None
    if cache.get("run") != run:
        cache.clear()
        cache["run"], cache["batches"] = run, {}
    try:
        a = audit(name, cp, cache["batches"] if run else None)
    except (OSError, ValueError) as exc:
        return Completeness(error=str(exc))
    gaps = tuple(f"{p.topic}/{p.partition} {s.start}-{s.end - 1}" for p, s in a.holes(SILENT)[:5])
    return Completeness(a.silent_gaps, a.offsets(SILENT), a.offsets("loss"), a.offsets("in flight"), gaps)


def read_views(settings: Any, timeout_s: float = 2.0) -> list[dict]:
    """Every materialized view in the settings' stores, read-only (the embedded SQLite files under views_dir,
    and views_dsn's meta table): name, key, rows, freshness; an unreadable view is listed with its error."""
    out: list[dict] = []
    try:
        reader = reader_for(settings.views_path(), settings.views_dsn, None, timeout_s)
        names = reader.names()
    except ViewError as exc:
        return [{"name": "*", "error": str(exc)}]
    for name in names:
        try:
            out.append(reader.info(name).to_json())
        except ViewError as exc:  # one unreadable view does not hide the others
            out.append({"name": name, "error": str(exc)})
    return out
