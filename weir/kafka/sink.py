"""The weir-kafka sink: rows to Kafka records, written from Spark's executors.

At-least-once: an idempotent producer, and a task succeeds only once the broker acknowledged every record.
Rows from a weir-kafka source carry their coordinates into the `weir.source` header, by which consumers
drop replays. Columns and options: docs/connector.md; the commit order and failure cases: docs/delivery.md.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from confluent_kafka import KafkaException, Producer
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from weir.kafka import heal
from weir.kafka.headers import SOURCE_HEADER
from weir.kafka.log import client_log
from weir.kafka.options import OptionError, SinkOptions
from weir.kafka.replay import Guard, Rewrite, StreamGuard, delivered

log = logging.getLogger("weir.kafka")
ALLOWED = {"key", "value", "topic", "partition", "offset", "timestamp", "timestamptype", "headers"}
# The flush waits for acknowledgements a little longer than librdkafka retries a record (message.timeout.ms,
# the broker-unavailable timeout): a record is then either delivered or reported failed, never left unknown.
FLUSH_MARGIN_S = 30


class DeliveryError(RuntimeError):
    """The broker did not acknowledge records; the task fails so that Spark retries it."""


@dataclass
class SinkCommit(WriterCommitMessage):
    records: int = 0
    per_topic: dict[str, int] = field(default_factory=dict)
    # This worker's sink producers rebuilt since its last successful write (weir.kafka.heal): carried back to
    # the driver, where no other path leads from a Python worker to the runner's progress records.
    rebuilds: int = 0
    # `sourceTally`: the input records behind the task's rows of those topics, "topic/partition" -> offsets
    sources: dict[str, set[int]] = field(default_factory=dict)


def report_path() -> str:
    """A new file for one write's commit report (`commitReport`): local to the driver, where Spark runs the
    commit, as the runner is."""
    return os.path.join(tempfile.gettempdir(), "weir-commits", f"{os.getpid()}-{uuid.uuid4().hex}.json")


def write_report(path: str, messages: list[SinkCommit | None]) -> dict:
    """What the tasks of a write reported, summed (a failed task's message is None), to `path` (driver): records
    (per topic too), rebuilt producers, and the distinct input records behind the `sourceTally` rows as offset
    runs, "topic/partition" -> [[first, last], ...]. Only a successful task attempt's message reaches a
    commit, so a retried task is counted once."""
    done = [m for m in messages if m is not None]
    per_topic: dict[str, int] = {}
    sources: dict[str, set[int]] = {}
    for m in done:
        for t, n in m.per_topic.items():
            per_topic[t] = per_topic.get(t, 0) + n
        for tp, offsets in getattr(m, "sources", {}).items():
            sources.setdefault(tp, set()).update(offsets)
    report = {"tasks": len(done), "records": sum(m.records for m in done), "rebuilds": sum(m.rebuilds for m in done),
              "per_topic": per_topic, "sources": {tp: runs(offsets) for tp, offsets in sources.items()}}  # fmt: skip
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f)
    os.replace(tmp, path)
    return report


def runs(offsets: set[int]) -> list[list[int]]:
    """Distinct offsets as [first, last] runs, ascending: a filter's gaps make a run break, not a row each."""
    out: list[list[int]] = []
    for o in sorted(offsets):
        if out and o == out[-1][1] + 1:
            out[-1][1] = o
        else:
            out.append([o, o])
    return out


def take_report(path: str) -> dict | None:
    """The commit report at `path`, removed (None: no commit wrote one)."""
    try:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
    except FileNotFoundError:
        return None
    os.unlink(path)
    return report


@dataclass(frozen=True)
class Layout:
    """How input columns map to Kafka records; checked once on the driver, used on executors."""

    topic: str | None
    has_key: bool
    has_topic_column: bool
    has_partition: bool
    has_headers: bool
    has_timestamp: bool
    has_coordinates: bool


def layout(opts: SinkOptions, schema: StructType) -> Layout:
    names = {f.name.lower(): f for f in schema.fields}
    unknown = sorted(set(names) - ALLOWED)
    if unknown:
        raise OptionError(
            f"weir-kafka sink: unexpected column(s) {', '.join(unknown)}. It writes key, value, topic, partition, "
            f"headers and timestamp; serialize other fields into value, e.g. to_json(struct(...)) AS value"
        )
    if "value" not in names:
        raise OptionError("weir-kafka sink: the input needs a 'value' column (string or binary)")
    for col in ("key", "value"):
        if col in names and not isinstance(names[col].dataType, StringType | BinaryType):
            raise OptionError(
                f"weir-kafka sink: column {col!r} must be string or binary, not {names[col].dataType.simpleString()}"
            )
    coordinates = {"topic", "partition", "offset"} <= set(names)
    if "offset" in names and not coordinates:
        raise OptionError("weir-kafka sink: an 'offset' column needs 'topic' and 'partition' too (source coordinates)")
    if coordinates and not opts.topic:
        raise OptionError(
            "weir-kafka sink: the input carries source coordinates (topic, partition, offset); "
            "set the destination with .option('topic', ...)"
        )
    if not opts.topic and "topic" not in names:
        raise OptionError("weir-kafka sink: set .option('topic', ...) or provide a 'topic' column")
    return Layout(
        topic=opts.topic,
        has_key="key" in names,
        has_topic_column="topic" in names and not coordinates,
        has_partition="partition" in names and not coordinates,
        has_headers="headers" in names,
        has_timestamp="timestamp" in names,
        has_coordinates=coordinates,
    )


def _columns(batch: pa.RecordBatch) -> dict[str, pa.Array]:
    """The batch's columns by lower-cased name (Spark matches sink columns case-insensitively)."""
    return {name.lower(): batch.column(i) for i, name in enumerate(batch.schema.names)}


class _Pooled:
    """A producer kept by a Python worker across tasks and micro-batches, with the failures of the write using
    it. A new idempotent producer cannot deliver before it has a producer id, which librdkafka asks for on a
    500 ms timer once a connection is up: a producer per task cost every micro-batch 0.5-1 s of waiting."""

    def __init__(self, settings: dict) -> None:
        self.failures: list[str] = []
        self.broken: str | None = None  # why it cannot go on (weir.kafka.heal): never used for another write
        self.lock = threading.Lock()  # one write at a time: the failures belong to it
        self.idle_since = time.monotonic()
        self.producer = Producer(
            {**settings, "on_delivery": self._on_delivery, "error_cb": self._on_error, "logger": client_log}
        )

    def _on_delivery(self, err, msg) -> None:  # called only for failures (delivery.report.only.error)
        if err is not None:
            self.failures.append(f"{msg.topic()}[{msg.partition()}]: {err.str()}")
            if heal.cannot_go_on(err):
                self.broken = f"{err.name()}: {err.str()}"

    def _on_error(self, err) -> None:
        if heal.cannot_go_on(err):
            self.broken = f"{err.name()}: {err.str()}"


_POOL: dict[tuple, _Pooled] = {}
_POOL_LOCK = threading.Lock()
# A producer unused this long is closed (at the worker's next write): librdkafka reconnects to a broker that is
# gone many times a second, into whatever listens on its address next; a new one costs a batch 0.5-1 s.
IDLE_CLOSE_S = 300.0


def _pooled(settings: dict) -> _Pooled:
    key = tuple(sorted((k, repr(v)) for k, v in settings.items()))
    now = time.monotonic()
    with _POOL_LOCK:
        for other, p in list(_POOL.items()):
            if other != key and now - p.idle_since > IDLE_CLOSE_S and p.lock.acquire(blocking=False):
                del _POOL[other]
                p.producer.close()  # flushed: its last write waited for every acknowledgement
                p.lock.release()
        kept = _POOL.get(key)
        if kept is not None and kept.broken is not None and kept.lock.acquire(blocking=False):
            # Fenced or fatal while idle (error_cb): the next write gets a new producer (a new producer id).
            del _POOL[key]
            _rebuilt(kept)
            kept.producer.purge()
            kept.producer.flush(0)
            kept.lock.release()
        if key not in _POOL:
            _POOL[key] = _Pooled(settings)
        return _POOL[key]


def _rebuilt(pooled: _Pooled) -> None:
    """Count and log a producer dropped because it cannot go on (the next write of its settings makes a new one)."""
    total = heal.counted("sink producer")
    log.warning("weir-kafka sink: a producer that cannot go on is rebuilt (%d in this worker): %s", total,
                pooled.broken)  # fmt: skip


def _discard(pooled: _Pooled) -> None:
    """Drop a producer after a failed write: what it still holds (queued records, a fatal idempotence error)
    must not reach the next write."""
    with _POOL_LOCK:
        for key, p in list(_POOL.items()):
            if p is pooled:
                del _POOL[key]
    if pooled.broken is not None:
        _rebuilt(pooled)
    # Not delivered later behind Spark's retry of the task: what is queued or in flight is dropped (the retry
    # writes it again; what was acknowledged stays, at-least-once, as docs/delivery.md says).
    pooled.producer.purge()
    pooled.producer.flush(0)


def _oldest_first(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The task's rows by their timestamp, oldest first (stable: rows of one time keep their order). A reader that
    cuts through the write (its own batch limit, or reading while it is written) then sees the older records
    first, not a scatter whose newest event times would push its watermark past the rest."""
    held = [b for b in batches if b.num_rows]
    if not held:
        return iter(())
    table = pa.Table.from_batches(held)
    name = next(n for n in table.schema.names if n.lower() == "timestamp")
    return iter(table.sort_by([(name, "ascending")]).to_batches())


def _rewrite(opts: SinkOptions) -> Rewrite | None:
    """A processor's guarded write (the runner's `replayGuard` option): a task of a replayed batch, or a retried
    task, reads back what the processor already delivered past the batch's marks, to skip it."""
    if opts.replay_guard is None and opts.stream_guard is None:
        return None
    ctx = TaskContext.get()
    task, attempt = (ctx.partitionId(), ctx.attemptNumber()) if ctx is not None else (0, 0)
    if opts.stream_guard is not None:  # one writer for every batch: the batch's guard comes from the checkpoint
        batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
        if batch is None:
            raise DeliveryError("weir-kafka sink: option streamGuard is for streaming writes (no batch id here)")
        guard = StreamGuard.from_option(opts.stream_guard).for_batch(int(batch), attempt)
    else:
        guard = Guard.from_option(opts.replay_guard)
    again = guard.replay or attempt > 0
    seen = delivered(opts.client, guard, opts.broker_timeout_s) if again else None
    if again:
        log.warning(
            "weir-kafka sink: %s writes a batch again (task %d, attempt %d): %d of its records are already in the "
            "topics, and this task's among them are skipped",
            guard.processor, task, attempt, sum(seen.values()),
        )  # fmt: skip
    return Rewrite(guard, task, seen)


def _produce(
    producer: Producer,
    failures: list[str],
    lay: Layout,
    batches: Iterator[pa.RecordBatch],
    flush_s: float,
    rewrite: Rewrite | None = None,
    tally: frozenset[str] = frozenset(),
) -> SinkCommit:
    commit = SinkCommit()
    sources = commit.sources
    try:
        for batch in batches:
            n = batch.num_rows
            cols = _columns(batch)
            values = cols["value"].to_pylist()
            keys = cols["key"].to_pylist() if lay.has_key else [None] * n
            topics = cols["topic"].to_pylist() if lay.has_topic_column else None
            parts = cols["partition"].to_pylist() if lay.has_partition else None
            millis = _millis(cols["timestamp"]) if lay.has_timestamp else None
            headers = _headers(cols, lay)
            if rewrite is not None or tally:
                headers = headers if headers is not None else [None] * n
            for i in range(n):
                topic = lay.topic or topics[i]
                if topic is None:
                    raise DeliveryError("weir-kafka sink: a row has a null topic and no topic option is set")
                if topic in tally:  # before a replay's skip: a row delivered before still has its input record
                    _tally(sources, headers[i])
                kwargs = {}
                if parts is not None and parts[i] is not None:
                    kwargs["partition"] = parts[i]
                if millis is not None and millis[i] is not None:
                    kwargs["timestamp"] = millis[i]
                if rewrite is not None:
                    hs = rewrite.admit(topic, headers[i], keys[i], values[i])
                    if hs is None:
                        continue  # delivered by an earlier attempt of this batch
                    kwargs["headers"] = hs
                elif headers is not None and headers[i]:
                    kwargs["headers"] = headers[i]
                while True:
                    try:
                        producer.produce(topic, values[i], keys[i], **kwargs)
                        break
                    except BufferError:
                        producer.poll(0.05)  # local queue full: let deliveries drain
                commit.per_topic[topic] = commit.per_topic.get(topic, 0) + 1
                if failures:
                    break
            producer.poll(0)
            if failures:
                break
        remaining = producer.flush(flush_s)
    except KafkaException as exc:
        raise DeliveryError(f"weir-kafka sink: produce failed: {exc}") from exc
    if failures:
        raise DeliveryError(
            f"weir-kafka sink: {len(failures)} record(s) were not delivered, e.g. {failures[0]}; the task fails "
            f"and Spark retries it"
        )
    if remaining:
        raise DeliveryError(f"weir-kafka sink: {remaining} record(s) unacknowledged after {flush_s:.0f}s")
    commit.records = sum(commit.per_topic.values())
    return commit


def _tally(sources: dict[str, set[int]], headers: list | None) -> None:
    """The row's input record (its weir.source, "topic/partition/offset") added to `sources`."""
    for k, v in headers or ():
        if k == SOURCE_HEADER and v:
            tp, _, offset = v.decode().rpartition("/")
            sources.setdefault(tp, set()).add(int(offset))
            return


def _millis(stamps: pa.Array) -> list:
    if pa.types.is_timestamp(stamps.type):
        stamps = stamps.cast(pa.timestamp("ms", tz=stamps.type.tz), safe=False).cast(pa.int64())
    return stamps.to_pylist()


def header_pairs(headers: pa.Array) -> list[list[tuple[str, bytes | None]] | None]:
    """Each row's headers as (key, value) pairs, None for a row without any. Read from the list's flat children:
    `to_pylist` builds a dict per header, which cost 6.5 us of a row of three headers (measured), half of what
    the writer spends on a row."""
    if len(headers) == 0:
        return []
    offsets = headers.offsets.to_pylist()  # of the sliced array: not rebased, so the first is where it starts
    base = offsets[0]
    keys, values = headers.flatten().flatten()  # the rows' headers, then their key and value children
    pairs = list(zip(keys.to_pylist(), values.to_pylist(), strict=True))
    nulls = headers.is_null().to_pylist() if headers.null_count else None
    out: list[list[tuple[str, bytes | None]] | None] = []
    for i in range(len(headers)):
        row = pairs[offsets[i] - base : offsets[i + 1] - base]
        out.append(None if not row or (nulls is not None and nulls[i]) else row)
    return out


def _headers(cols: dict[str, pa.Array], lay: Layout) -> list | None:
    given = header_pairs(cols["headers"]) if lay.has_headers else None
    if not lay.has_coordinates:
        return given
    coords = zip(cols["topic"].to_pylist(), cols["partition"].to_pylist(), cols["offset"].to_pylist(), strict=True)
    out = []
    for i, (t, p, o) in enumerate(coords):
        hs = [h for h in given[i] if h[0] != SOURCE_HEADER] if given and given[i] else []
        hs.append((SOURCE_HEADER, f"{t}/{p}/{o}".encode()))
        out.append(hs)
    return out


class _Writing:
    """What batch and stream writers share: the layout checked on the driver, the write on executors. A task's
    write takes its worker's pooled producer (`pooled`) and produces its rows with it (`produce`)."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        self.opts = opts
        self.layout = layout(opts, schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        """Produce the batches' rows and wait for every acknowledgement (DeliveryError otherwise): runs in a task,
        on an executor's Python worker, with that worker's pooled producer."""
        opts = self.opts
        rewrite = _rewrite(opts)
        batches = _oldest_first(iterator) if opts.oldest_first and self.layout.has_timestamp else iterator
        pooled = self.pooled()
        with pooled.lock:
            pooled.failures = []
            try:
                commit = self.produce(pooled.producer, pooled.failures, batches, rewrite)
            except BaseException:
                _discard(pooled)
                raise
            finally:
                pooled.idle_since = time.monotonic()
        if rewrite is not None:
            rewrite.report()
        # Rebuilds of this worker's producers, by this write or an earlier one that failed, go back with this one.
        commit.rebuilds = heal.take_unreported("sink producer")
        return commit

    def pooled(self) -> _Pooled:
        """The worker's producer for this write's settings: the one its last write with them used, or a new one in
        place of one that cannot go on (weir.kafka.heal)."""
        return _pooled(self.opts.producer_settings())

    def produce(
        self, producer: Producer, failures: list[str], batches: Iterator[pa.RecordBatch], rewrite: Rewrite | None
    ) -> SinkCommit:
        """The rows of `batches` produced with `producer` and acknowledged, counted per topic; DeliveryError when
        one was not (`failures`: the producer's failed deliveries, as its delivery callback reports them)."""
        flush_s = self.opts.broker_timeout_s + FLUSH_MARGIN_S
        return _produce(producer, failures, self.layout, batches, flush_s, rewrite, self.opts.source_tally)

    def reported(self, messages: list[SinkCommit | None]) -> dict:
        """The tasks' reports summed; written to `commitReport` when the runner asked (it runs in a Python
        worker of the driver, not in the runner's process). An aborted write's successful tasks report too:
        the producers they rebuilt were rebuilt all the same."""
        if self.opts.commit_report:
            report = write_report(self.opts.commit_report, messages)
        else:
            done = [m for m in messages if m is not None]
            report = {"records": sum(m.records for m in done), "rebuilds": sum(m.rebuilds for m in done)}
        if report["rebuilds"]:
            log.warning("weir-kafka sink: %d producer(s) rebuilt by this write's workers", report["rebuilds"])
        return report


class KafkaBatchWriter(_Writing, DataSourceArrowWriter):
    def commit(self, messages: list[SinkCommit | None]) -> None:
        log.info("weir-kafka sink: wrote %d records", self.reported(messages)["records"])

    def abort(self, messages: list[SinkCommit | None]) -> None:
        self.reported(messages)
        log.warning("weir-kafka sink: write aborted; delivered records stay (at-least-once)")


class KafkaStreamWriter(_Writing, DataSourceStreamArrowWriter):
    def commit(self, messages: list[SinkCommit | None], batchId: int) -> None:
        if self.opts.commit_reports:  # the runner's books of the batch (weir.runtime.direct)
            write_report(os.path.join(self.opts.commit_reports, f"{batchId}.json"), messages)
        log.info("weir-kafka sink: batch %d wrote %d records", batchId, self.reported(messages)["records"])

    def abort(self, messages: list[SinkCommit | None], batchId: int) -> None:
        # Records that tasks delivered before the failure stay in Kafka: at-least-once, by design.
        self.reported(messages)
        log.warning("weir-kafka sink: batch %d aborted; delivered records stay and will be written again", batchId)
