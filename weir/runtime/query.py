"""One processor as one Structured Streaming query: read and decode its inputs, apply it, route, deliver, count.

Stateless processors run in foreachBatch on each micro-batch's decoded rows, isolating records on which the
function raises by bisecting the batch; stateful ones are applied once to the streams; source processors
return a stream of their own. Dead letters and poison records, and the order in which a batch is delivered
and counted: see docs/pipelines.md ("Dead letters, late records, filtered records", "What happens in one batch").

What one foreachBatch batch's steps share (its replay guard, its steps' timings, the frames it cached, its poison
records and replays) is its `Batch`, handed down from where the batch begins; the query's attributes hold its
configuration and what outlives a batch (see ProcessorQuery).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from weir import units
from weir.blocks.common import col
from weir.checkpoint import log as checkpoint_log
from weir.checkpoint.files import Checkpoint
from weir.checkpoint.offsets import Positions
from weir.config import ProcessorSettings, Settings
from weir.formats import ERROR_COLUMN
from weir.kafka import admission, connector, replay
from weir.kafka import sink as kafka_sink
from weir.kafka.headers import PIPELINE_HEADER, PROCESSOR_HEADER, SOURCE_HEADER
from weir.kafka.log import LogView
from weir.kafka.offsets import span_bounds
from weir.kafka.source import KAFKA_COLUMN_NAMES
from weir.lake.archive import ARCHIVE_FORMAT, ArchiveSink
from weir.pipeline.model import DeclarationError, Pipeline, Processor, Table, Topic
from weir.pipeline.routes import ABSORBED, DLQ, EMIT, OUT, REASON, ROUTE
from weir.runtime import completeness, direct, provenance, reading, realtime, rebuild, routing, views
from weir.runtime.accounting import Counts, from_routes
from weir.runtime.batchpath import Routed
from weir.runtime.tally import SourceTally

log = logging.getLogger("weir.pipeline")
SLOW_BATCH_S = 5.0  # a batch slower than this logs the seconds of each of its steps
STATIC_LIMIT = 100_000  # records per input topic per batch with flow = static and no limit set
# A batch with a backlog aims at the trigger interval, but at least this: each batch has a fixed cost of
# planning and commits (about 0.5-1 s), which shorter catch-up batches would spend most of their time on.
MIN_TARGET_MS = 10_000
CATCH_UP_CHECK_S = 10.0  # how often a processor in a lake fallback asks whether it is over
READER_CHOICE_TIMEOUT_S = 10.0  # how long the choice of a reader waits for the broker (then: weir-kafka)
_INTERNAL = (ROUTE, ABSORBED, REASON, ERROR_COLUMN, routing.OUTPUT, provenance.PROVENANCE)


@dataclass
class Ledger:
    """Counts of delivered batches, by (query name, batch id), until the progress listener takes them."""

    _counts: dict[tuple[str, int], Counts] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def put(self, query: str, batch_id: int, counts: Counts) -> None:
        with self._lock:
            self._counts[(query, batch_id)] = counts

    def take(self, query: str, batch_id: int) -> Counts | None:
        with self._lock:
            return self._counts.pop((query, batch_id), None)

    def peek(self, query: str, batch_id: int) -> Counts | None:
        with self._lock:
            return self._counts.get((query, batch_id))

    def forget_from(self, query: str, first: int) -> None:
        """Drop `query`'s counts of batch `first` and later: a stopped run's, of batches it never committed, whose
        progress will never come; the next run runs them again and books them anew. Earlier ones stay: a committed
        batch's progress may still be on its way to the listener."""
        with self._lock:
            for key in [k for k in self._counts if k[0] == query and k[1] >= first]:
                del self._counts[key]


@dataclass(frozen=True)
class Bounds:
    """The input offsets a query replays (a stateful backfill): per topic, where it starts and ends, and below
    what it reads from the lake whatever the broker still holds."""

    start: Positions
    end: Positions
    lake_until: Positions

    def options(self, topic: str, limit: int | None) -> dict[str, str]:
        """The weir-kafka source options of one input topic, `limit` records per batch (None: all at once)."""

        def one(positions: Positions) -> str:
            return json.dumps({topic: {str(p): o for p, o in positions.get(topic, {}).items()}})

        found = {"maxOffsetsPerTrigger": str(limit)} if limit else {}
        # A topic without bounds (a join's table the lake does not archive): from the broker's earliest offset to
        # its end when the replay began (Trigger.AvailableNow)
        for option, positions in (("startingOffsets", self.start), ("endingOffsets", self.end),
                                  ("lakeUntil", self.lake_until)):  # fmt: skip
            if positions.get(topic):
                found[option] = one(positions)
        return found


class StopRequested(RuntimeError):
    """A batch refused because its processor is stopping (see Runner.stop)."""


def query_name(pipeline: Pipeline, proc: Processor) -> str:
    return f"{pipeline.name}.{proc.name}"


class Output:
    """Where a batch's records for topics go: rows of (topic, key, value, headers, timestamp), every one already
    routed, stamped and cleared by the replay guard. `write` runs on the driver, once per write of a batch; the
    rows are written by the executors that hold them. The default writes them to Kafka with the weir-kafka sink,
    whose options (the client's, the replay guard's, the commit report's) the query gives; the testing kit's
    (weir.testing) keeps them in memory instead. A subclass overrides `write`.
    """

    def write(self, records: DataFrame, options: dict[str, str], oldest_first: bool) -> None:
        """Write `records` in one Spark job. `oldest_first`: each task writes its rows oldest first, so that a
        reader cutting through the batch (its own batch limit, or reading while it is written) sees the older
        records and not a scatter whose newest event times would push its watermark past the rest (a stateful
        result comes grouped by key). Raises what the write raised: the batch fails and runs again."""
        if oldest_first:
            records = records.sortWithinPartitions("timestamp")
        records.write.format("weir-kafka").options(**options).mode("append").save()


@dataclass(eq=False)
class Batch:
    """What the steps of one foreachBatch batch share, from its start to its books: created where a batch begins
    (`start`'s `each`, or `run_batch` and `deliver_result` called by a backfill or the testing kit) and handed down
    to every step, which reads it and adds to it. Nothing of a running batch is left in the query's attributes for
    another method to pick up."""

    id: int
    # Whether the batch's writes leave their rows unsorted because they come in their input records' order: a
    # one-pass batch's write (and the rerun or three-job batch it hands over to). See ProcessorQuery._batch.
    in_order: bool = False
    poisoned: int = 0  # records on which the function raised, isolated by bisection (at most max_poison)
    replayed: int = 0  # records the batch's writes found already delivered, and skipped
    routes_own: bool = False  # whether the function's result has its own `_route` column (Routed.routes_own)
    has_sources: bool = False  # whether the result's rows name their input records (Routed.has_sources)
    phases: dict[str, float] = field(default_factory=dict)  # seconds spent in each step (a slow batch logs them)
    cached: list[DataFrame] = field(default_factory=list)  # frames persisted for the batch, released at its end
    # The batch's replay guard (a streaming batch's write), or its marks being taken (see `guard`)
    _guard: replay.Guard | None = field(default=None, init=False, repr=False)
    _marks: Future[replay.Guard] | None = field(default=None, init=False, repr=False)

    @property
    def guard(self) -> replay.Guard | None:
        """The batch's replay guard (a streaming batch's write; docs/delivery.md, "Replays"). Its marks are taken
        while the driver plans the batch (`mark`): the first use waits for them, and every write of the batch uses
        the guard, so nothing of it is written before its marks are noted."""
        if self._marks is not None:
            with self.phase("replay marks"):  # the wait only: the rest overlapped the plan
                self._guard, self._marks = self._marks.result(), None
        return self._guard

    @guard.setter
    def guard(self, guard: replay.Guard | None) -> None:
        self._marks, self._guard = None, guard

    @property
    def guarded(self) -> bool:
        """Whether the batch's writes have a guard, or its marks are being taken (without waiting for them)."""
        return self._marks is not None or self._guard is not None

    def mark(self, begin: Callable[[], replay.Guard], thread: str) -> None:
        """Start taking the batch's marks (`begin`: ProcessorQuery._begin_guard) beside the driver's planning: both
        wait on round trips (the broker's ends, the checkpoint's storage; the JVM's analysis), about 0.1-0.25 s
        each a batch. A daemon thread: one still riding out a broker outage must not hold the process's exit."""
        marks: Future[replay.Guard] = Future()

        def take() -> None:
            try:
                marks.set_result(begin())
            except BaseException as exc:  # the batch raises it where it waits for the marks
                marks.set_exception(exc)

        threading.Thread(target=take, name=thread, daemon=True).start()
        self._marks = marks

    def end_guard(self) -> None:
        """The batch is over. A batch that failed before its first write may still be noting its marks: they
        are waited for (their own bound), so that the next attempt of the batch finds them and replays."""
        pending, self._marks, self._guard = self._marks, None, None
        if pending is not None:
            # Its failure, if any, is not the batch's: the batch failed first, and says why
            with contextlib.suppress(Exception):
                pending.result()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a step of the batch into `phases`."""
        began = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.monotonic() - began

    def cache(self, frame: DataFrame) -> DataFrame:
        """`frame` persisted until the batch's `release`."""
        self.cached.append(frame.persist())
        return frame

    def release(self) -> None:
        while self.cached:
            self.cached.pop().unpersist()


class ProcessorQuery:
    """Builds and starts the streaming query of one processor.

    Everything that differs between a streaming run, a backfill and the testing kit comes in here, never set from
    outside afterwards: `name` (the query's, and its Observations'), `stamp` (headers stamped on every record
    beside `weir.pipeline`: a backfill's id), `bounds` (the offsets a stateful backfill's sources replay),
    `delivered` (topics whose rows this writer delivered before, never written again: a backfill's outputs) and
    `output` (where records for topics go).

    Its attributes are that configuration and what outlives a batch (the reader chosen at a start, the direct
    path's fallbacks, a lake fallback's timer, rows delivered before, memos of a plan's properties, what one batch
    hands to the next). What one batch's steps share is its `Batch`, handed down from where the batch begins; the
    only per-batch attribute is `in_batch`, for the runner's threads.
    """

    def __init__(
        self,
        spark: SparkSession,
        pipeline: Pipeline,
        proc: Processor,
        settings: Settings,
        ledger: Ledger,
        checkpoint: str,
        *,
        available_now: bool = False,
        max_poison: int = 10,
        name: str | None = None,
        stamp: dict[str, str] | None = None,
        bounds: Bounds | None = None,
        delivered: list[str] | None = None,
        output: Output | None = None,
    ) -> None:
        self.spark, self.pipeline, self.proc, self.settings = spark, pipeline, proc, settings
        self.ledger, self.checkpoint = ledger, checkpoint
        self.available_now, self.max_poison = available_now, max_poison
        self.name = name or query_name(pipeline, proc)
        self.output = output or Output()
        self.topics = pipeline.topics
        # Avro, Protobuf and JSON Schema outputs: their schemas registered now, before anything is written
        self.writers = routing.writers(proc, self.topics, settings.registry_conf())
        self._columns: dict[Any, list[Column]] = {}  # see _memo
        self._observable: bool | None = None  # whether a one-pass batch's plan keeps its Observations (_observes)
        self._keeps: bool | None = None  # whether the function's plan keeps its input's order, once known
        self.stopping = threading.Event()
        # The batch whose foreachBatch is running: the one per-batch attribute, because the runner's threads (its
        # heartbeat's phase, its wait for a batch to finish before a stop) ask which batch runs and cannot be handed
        # the running Batch. The batch's own steps read their Batch instead.
        self.in_batch: int | None = None
        self.ran: int | None = None  # the last batch whose foreachBatch completed in this process
        self._override = settings.processors.get(proc.name, ProcessorSettings())
        # A sink that reads raw (the lake's archiver): every record, undecodable ones included, goes to it as read.
        self.archive = proc.sink is not None and proc.sink.reads_raw
        self.view = views.view_of(pipeline, proc)  # a view's processor: the lean path (`_view_batch`)
        # Stamped on every record written to Kafka: the writer's pipeline (weir.processor is in the routed
        # headers), and a backfill's id (weir.backfill).
        self.headers: dict[str, str] = {PIPELINE_HEADER: pipeline.name, **(stamp or {})}
        # What this writer already delivered to its topics (a backfill's: what streaming delivered; a rebuild's:
        # what the processor wrote before its reset), never written again: `read_delivered`'s rows.
        self.delivered: DataFrame | None = None
        self.rebuild: rebuild.Rebuild | None = None  # a reset's rebuild still skipping what was delivered
        self._rebuild_checked = False
        # The last batch that wrote topics without a replay: (batch id, its marks, records written per topic),
        # checked against the next batch's marks (weir.runtime.completeness.check_writes).
        self._wrote: tuple[int, dict, dict[str, int]] | None = None
        # Sink producers rebuilt by the workers of this processor's writes, not yet in a batch's books (a failed
        # write's are booked with the next batch that succeeds).
        self.client_rebuilds = 0
        self.bounds = bounds
        self.direct: direct.Direct | None = None  # the running query's direct path (weir.runtime.direct), if any
        self.fell_back: str | None = None  # why the direct path failed: the processor runs one batch at a time
        self._fallbacks = direct.Fallbacks()  # when a fallback from the direct path returns to it
        self._back_at: int | None = None  # the batch after which a fallback returns to the direct path
        self.reader: reading.Reader | None = None  # this run's Kafka reader, chosen at each start
        self.in_realtime = False  # whether the query being built runs in Spark's real-time mode
        self._tail: DataFrame | None = None  # a real-time processor's rows written past its last commit (cached)
        self._checked_at = 0.0  # when a lake fallback last asked whether it is over (time.monotonic)
        if delivered is not None:  # read by one job at its first use, and kept
            self.delivered = self.read_delivered(delivered).persist()

    @property
    def cp(self) -> Checkpoint:
        """The checkpoint's files (weir.checkpoint); `checkpoint` is its location, as Spark and the sinks take it."""
        return Checkpoint(self.checkpoint)

    # -- inputs -----------------------------------------------------------------------------------------
    def kafka_options(self) -> dict[str, str]:
        """The client options of every weir-kafka source and sink of this processor."""
        return self.settings.kafka_options()

    def source(self, topic: Topic) -> DataFrame:
        """`topic`'s decoded stream, read by this run's reader (weir.runtime.reading), observed per partition."""
        # A new checkpoint starts where the sink says (the archiver: after the lake), else at the earliest offset.
        wanted = self.proc.sink.starting_offsets() if self.proc.sink is not None else None
        starting = {topic.name: wanted[topic.name]} if wanted and wanted.get(topic.name) else None
        options = {
            **self.kafka_options(), "subscribe": topic.name,
            "startingOffsets": json.dumps(starting) if starting else "earliest",
            **topic.reader_options(self.settings.registry_conf()),
        }  # fmt: skip
        if self.bounds is not None:
            # A stateful backfill's replay (weir.backfill.stateful): these offsets, from the lake where it holds
            # them, in batches of a static size, to the end and no further.
            # A join's table comes whole in the first batch: each stream record then meets it as of its time.
            limit = None if isinstance(topic, Table) else (self.static_limit() or STATIC_LIMIT)
            options |= self.bounds.options(topic.name, limit)
        elif self.proc.shadow is not None:
            # A shadow's batches are the live processor's, one for one (docs/releases.md, "Shadow runs"): the
            # same watermarks, so a window or a late record is decided alike by the same code.
            options["followCheckpoint"] = self.proc.shadow.follow
        elif not self.in_realtime:  # a real-time query has no batches to size (weir.runtime.realtime)
            options |= self.admission_options()
        reader = self.reader or self.choose_reader()
        if reader.connector:
            # A real-time processor's records never cross into Python (weir.runtime.realtime): decoded by Spark's
            # JSON parser on every path it runs, so that micro-batches and real time take the same records
            read = connector.read(self.spark.readStream, self._on_connector(options, topic), True,
                                  in_jvm=self.proc.realtime is not None)  # fmt: skip
            return _observe_reads(read, topic)
        if self.settings.lake and not self.archive:
            # Offsets retention deleted are read from the lake if it archived them (docs/retention.md). Always
            # passed: the source consults the lake only then, and the archiver may run in another pipeline.
            # Never for the archiver itself: it would copy the lake into the lake.
            options["lake"] = self.settings.lake
        # The archiver's read tasks write the lake's files themselves, so records never cross into the JVM: its
        # source is weir-kafka's archive form, which hands Spark the files' descriptions (docs/lake.md).
        archive = self.archive and isinstance(self.proc.sink, ArchiveSink)
        stream = self.spark.readStream.format(ARCHIVE_FORMAT if archive else "weir-kafka").options(**options)
        if archive:
            return stream.options(**self.proc.sink.source_options()).load()
        return _observe_reads(stream.load(), topic)

    def choose_reader(self) -> reading.Reader:
        """This run's Kafka reader (weir.runtime.reading), chosen at each start; the checkpoint is handed to it."""
        fixed = reading.fixed_reason(
            setting=self._override.kafka_reader or self.settings.kafka_reader, archive=self.archive,
            bounded=self.bounds is not None, shadow=self.proc.shadow is not None,
            by_partition=self.proc.sink is not None and self.proc.sink.commits_by_partition,
        )  # fmt: skip
        with self._log_view() as view:
            self.reader = reading.choose(fixed, self.cp, self.proc.inputs, view)
        self._checked_at = time.monotonic()
        if not self.reader.connector:
            log.info("weir: processor %s reads through weir-kafka: %s", self.proc.name, self.reader.why)
        return self.reader

    @contextlib.contextmanager
    def _log_view(self) -> Iterator[LogView]:
        view = LogView(self.settings.client_config(), timeout=READER_CHOICE_TIMEOUT_S)
        try:
            yield view
        finally:
            view.close()

    def _on_connector(self, options: dict[str, str], topic: Topic) -> dict[str, str]:
        """weir-kafka's `options` as the connector takes them: flow = auto as the memory cap of a batch (fixed for
        the query's run), never a lake (a lake fallback runs on weir-kafka), and data loss always failing the query
        (the restart then finds it: weir.runtime.reading)."""
        flow = {k: options.pop(k) for k in [k for k in options if k.startswith("flow")]}
        if flow:
            with self._log_view() as view:
                options["maxOffsetsPerTrigger"] = str(reading.batch_limit(int(flow["flowMemoryBytes"]), view,
                                                                          topic.name))  # fmt: skip
        return options | {"failOnDataLoss": "true"}

    def realtime_figure(self) -> float | None:
        """In the progress records: the checkpoint interval (seconds) of a batch that ran in Spark's real-time mode,
        None for a micro-batch (weir.runtime.realtime)."""
        every = self.proc.realtime
        return every.total_seconds() if every is not None and isinstance(self.direct, realtime.RealTime) else None

    def reader_figure(self) -> dict[str, str | None] | None:
        """This run's reader in the progress records: `kind`, and why weir-kafka."""
        return None if self.reader is None else {"kind": self.reader.kind, "why": self.reader.why}

    @property
    def back_to_connector(self) -> bool:
        """Whether the runner should restart this query on the connector: its lake fallback on weir-kafka is over,
        by the checkpoint's committed offsets (checked at most every CATCH_UP_CHECK_S)."""
        if self.reader is None or not self.reader.fallback:
            return False
        if time.monotonic() - self._checked_at < CATCH_UP_CHECK_S:
            return False
        self._checked_at = time.monotonic()
        try:
            with self._log_view() as view:
                return reading.caught_up(self.cp, self.proc.inputs, view)
        except Exception as exc:  # asked again at the next check: the fallback reads on meanwhile
            log.warning("weir: processor %s: whether its lake fallback is over is not known (%s)", self.proc.name,
                        brief(exc))  # fmt: skip
            return False

    def static_limit(self) -> int | None:
        """The static records-per-batch limit when admission is static (0: none), else None (flow = auto). A
        limit set anywhere wins over auto: the processor's override, its declaration, then the settings."""
        given = (self._override.max_offsets_per_trigger, self.proc.max_offsets_per_trigger)
        limit = next((v for v in given if v is not None), self.settings.max_offsets_per_trigger)
        flow = self._override.flow or self.settings.flow
        if limit is None and flow == "static":
            return STATIC_LIMIT
        return limit

    @property
    def trigger(self) -> timedelta:
        """The processor's trigger interval: its override in the settings, its declaration (checked when declared),
        then the settings'."""
        if self._override.trigger is not None:
            return self._override.trigger
        if self.proc.trigger is not None:
            return timedelta(milliseconds=units.duration_ms(self.proc.trigger, f"processor {self.proc.name} trigger",
                                                            bare="s"))  # fmt: skip
        return self.settings.trigger

    @property
    def measurements(self) -> str:
        """The file where each batch's measured duration is written for the sources' admission control."""
        return str(Path(self.settings.home) / "run" / "flow" / f"{self.name}.json")

    def admission_options(self) -> dict[str, str]:
        """The weir-kafka options of this processor's admission: a static limit, or flow=auto (docs/flow.md)."""
        limit = self.static_limit()
        if limit is not None:
            return {"maxOffsetsPerTrigger": str(limit)} if limit else {}
        ms = timedelta(milliseconds=1)
        if self.settings.flow_target is not None:
            target_ms = self.settings.flow_target // ms
        else:
            target_ms = max(self.trigger // ms, MIN_TARGET_MS)
        return {
            "flow": "auto",
            "flowTargetMs": str(target_ms),
            "flowMemoryBytes": str(self._memory_budget()),
            "flowStartRecords": str(self.settings.flow_start_records),
            "flowCores": str(self.spark.sparkContext.defaultParallelism),
            "flowMeasurements": self.measurements,
        }

    def _memory_budget(self) -> int:
        """flow_memory, else a quarter of the heap of the JVMs that run tasks: the driver's in local mode,
        every executor's otherwise."""
        jvm = self.spark.sparkContext._jvm
        to_bytes = jvm.org.apache.spark.network.util.JavaUtils.byteStringAsBytes
        if self.settings.flow_memory is not None:
            return int(to_bytes(self.settings.flow_memory))
        conf = self.spark.sparkContext.getConf()
        if self.spark.sparkContext.master.startswith("local"):
            return int(to_bytes(conf.get("spark.driver.memory", "1g"))) // 4
        executors = int(conf.get("spark.executor.instances", "1"))
        return int(to_bytes(conf.get("spark.executor.memory", "1g"))) * max(executors, 1) // 4

    def inputs(self) -> DataFrame:
        """Every input topic's decoded stream, unioned by column name (fields of other topics are null)."""
        return union([self.source(self.topics[t]) for t in self.proc.inputs])

    def split(self, batch: DataFrame) -> list[DataFrame]:
        """The clean rows of a batch, one DataFrame per input topic with that topic's columns."""
        parts = []
        for t in self.proc.inputs:
            names = [*self._kafka_columns(batch), *self.topics[t].fields()]
            parts.append(batch.where((col("topic") == t) & col(ERROR_COLUMN).isNull()).select(*map(col, names)))
        return parts

    @staticmethod
    def _kafka_columns(df: DataFrame) -> list[str]:
        return [c for c in df.columns if c.lower() in KAFKA_COLUMN_NAMES]

    # -- the result ---------------------------------------------------------------------------------------
    def _applied(self) -> DataFrame | dict[str, DataFrame]:
        """Stateful and source processors: the function over the streams (or its own source). The streams
        carry the undecodable records too: weir's blocks route them to "dlq" themselves, since a second
        branch for them would make Spark read each input twice, and count its rows twice."""
        if self.proc.kind == "source":
            return self.called(self.spark)
        return self.called(*[self.source(self.topics[t]) for t in self.proc.inputs])

    def called(self, *args: DataFrame | SparkSession) -> DataFrame | dict[str, DataFrame]:
        """The processor's function on `args`; Spark's analysis error (a column that does not exist) becomes one
        line naming the processor, the column and its inputs' columns (a DeclarationError)."""
        # PySpark logs an analysis error with its whole plan as JSON before raising it: the error is raised here
        # as one line instead, so its loggers are quiet for this call.
        quiet = [logging.getLogger(n) for n in ("DataFrameQueryContextLogger", "SQLQueryContextLogger")]
        levels = [q.level for q in quiet]
        for q in quiet:
            q.setLevel(logging.CRITICAL)
        try:
            return self.proc.fn(*args)
        except AnalysisException as exc:
            inputs = {t: [c for c in a.columns if c.lower() not in KAFKA_COLUMN_NAMES and c != ERROR_COLUMN]
                      for t, a in zip(self.proc.inputs, args, strict=False) if isinstance(a, DataFrame)}  # fmt: skip
            problem = routing.analysis_problem(
                self.proc, exc.getCondition() or "", exc.getMessageParameters() or {}, str(exc), inputs
            )
            raise DeclarationError(problem) from None
        finally:
            for q, level in zip(quiet, levels, strict=True):
                q.setLevel(level)

    def trace(self) -> DataFrame | dict[str, DataFrame]:
        """The processor's result, checked against the declared outputs before anything starts, so that a
        wrong declaration fails with a clear message."""
        if self.archive:
            return self.inputs()
        if self.proc.stateful or self.proc.kind == "source":
            result = self._applied()
        else:  # called per batch on static rows: trace it on an empty batch of the same shape
            return self.trace_batch(self.inputs().schema)
        routing.check_outputs(self.proc, result, self.topics)
        return result

    def trace_batch(self, schema: StructType) -> DataFrame | dict[str, DataFrame]:
        """A stateless processor's result on an empty batch of `schema` (the inputs' columns), checked
        against the declared outputs: what `run_batch` would do, without data."""
        result = self.called(*self.split(self.spark.createDataFrame([], schema)))
        routing.check_outputs(self.proc, result, self.topics)
        return result

    def streaming_result(self) -> DataFrame:
        result = self._applied()
        return _with_output(result) if isinstance(result, dict) else result

    # -- per batch ----------------------------------------------------------------------------------------
    # Fewer Spark jobs per batch is most of a small batch's cost. A stateless batch of one input topic without
    # a sink runs in one job (read, decode, apply, route, count, write); any other, and one whose single job
    # failed (a poison record), runs in three: the batch is read and counted into a cache, computed and counted
    # by route, then written.
    def _batch(self, batch_id: int) -> Batch:
        """A batch beginning: what its steps will share. Its writes leave their rows unsorted when they come in
        their input records' order; a one-pass batch sets that for its own write (`_one_pass`). A query whose
        one-pass plan was found to drop its Observations runs every later batch the three-job way, with the order
        its function's plan was found to keep then."""
        return Batch(batch_id, in_order=self._observable is False and bool(self._keeps))

    def _stateless_batch(self, batch: DataFrame, current: Batch) -> None:
        tally = self._tally(current)
        counts = (
            self.run_batch(batch, current.id, current=current) if tally is None
            else self._one_pass(batch, current, tally)
        )  # fmt: skip
        self.ledger.put(self.name, current.id, counts)

    def _tally(self, current: Batch) -> SourceTally | None:
        """How the batch's output rows are traced to its input records in one pass, or None when it cannot run
        in one: several inputs (each would scan the batch again), a sink (a second write), no checkpoint (a
        test's batch), a plan that does not say where it starts, or a batch too large for the bitmaps."""
        single = len(self.proc.inputs) == 1 and self.proc.sink is None and self._observable is not False
        if not single or not self.checkpoint or not current.guarded:
            return None
        topic = self.proc.inputs[0]
        return SourceTally.of(topic, checkpoint_log.planned_span(self.cp, current.id, topic))

    def _one_pass(self, batch: DataFrame, current: Batch, tally: SourceTally) -> Counts:
        """A stateless batch in one Spark job. Observations in that job count what the books need: the records
        that did not decode (with their offsets' span per partition), the records handed to the function, the
        rows by route and destination, and the distinct input records behind the output rows (SourceTally).
        Records that did not decode are read again by offsets and dead-lettered in a second job, only when there
        are some. A job that fails (the function raised on a record) runs the batch again the three-job way,
        which isolates the record, over a bounded read of the batch's planned offsets (see _rerun)."""
        current.poisoned, current.replayed = 0, 0
        topic = self.topics[self.proc.inputs[0]]
        tag = f"{self.name}-{current.id}-{uuid.uuid4().hex[:8]}"
        undecoded, handed = Observation(f"weir-undecoded-{tag}"), Observation(f"weir-handed-{tag}")
        with current.phase("plan"):  # the driver's work on the batch's DataFrames: calls into the JVM
            clean = self.split(batch.observe(undecoded, *self._memo("undecoded", lambda: _undecoded(topic))))[0]
            # Counted where the function takes them, apart from Spark's count of the batch: a record weir itself
            # lost or doubled on the way (in `_split`) unbalances the books
            count = self._memo("handed", lambda: [F.count(F.lit(1)).alias("n")])
            result = self.result([clean.observe(handed, *count)])
            frame, current.routes_own, current.has_sources = result.frame, result.routes_own, result.has_sources
            names = tuple(frame.columns)
            enc = self._memo(("encoded", names), lambda: [routing.encoded_column(names, self.proc, self.topics,
                                                                                 self.writers)])  # fmt: skip
            if enc[0] is not None:  # an output in a format of its own: each row encoded once, then routed
                frame = frame.withColumn(routing.ENCODED, enc[0])
                names = tuple(frame.columns)
            routed = frame.select(
                *self._memo(names, lambda: routing.route_columns(names, self.proc, self.topics, self.writers))
            )
            extra = [F.expr(f"count_if(`{ROUTE}` = '{DLQ}')").alias("_refused")]
            if current.has_sources:
                routed = routed.select("*", *tally.columns(routing.SOURCE, f"`{ROUTE}` IN ('{OUT}', '{EMIT}')"))
                extra += tally.metrics()
            if self._observable is None:
                self._observable = _observes(routed, undecoded, handed)
                self._keeps = routing.keeps_order(routed)
            current.in_order = bool(self._keeps)
        if not self._observable:
            # Spark's optimizer dropped the read (a function that ignores its input, or filters with a constant
            # false): the Observations would never complete. The three-job path counts such batches.
            log.info("weir: processor %s: its result does not read its input in every plan, so its batches are "
                     "counted the three-job way", self.proc.name)  # fmt: skip
            return self.run_batch(batch, current.id, current=current)
        try:
            counts, got = self._observed_delivery(routed, current, extra)
        except AnalysisException:
            raise
        except Exception as exc:  # any task failure may be one record's: the rerun decides
            if self.stopping.is_set():
                raise
            return self._rerun(current, tally, exc)
        finally:
            current.in_order = False  # the dead letters' write below, and any other, reads what it writes anew
        counts.handed = int(handed.get["n"])
        # Rows sent to dlq by the function itself, or refused by an output's format: handed, not filtered
        counts.refused = int(got["_refused"]) if current.routes_own or routing.ENCODED in names else 0
        counts.passed, outside = tally.count(got) if current.has_sources else (0, 0)
        if outside:
            log.error("weir: processor %s batch %d: %d output rows name input records outside the batch's offsets %s",
                      self.proc.name, current.id, outside, tally.spans)  # fmt: skip
            counts.violations += 1
        found = undecoded.get
        if int(found["bad"]):
            self._dead_letter(topic, current, counts, int(found["bad"]), {
                p: (int(found[f"lo{p}"]), int(found[f"hi{p}"])) for p in range(topic.partitions)
                if found[f"lo{p}"] is not None})  # fmt: skip
        return counts

    def _memo(self, key: Any, build: Callable[[], list[Column]]) -> list[Column]:
        """Column expressions built once per query and reused by every batch (they are unresolved, so they fit
        any batch of the same columns): building them calls into the JVM dozens of times."""
        if key not in self._columns:
            self._columns[key] = build()
        return self._columns[key]

    def _dead_letter(self, topic: Topic, current: Batch, counts: Counts, bad: int, spans: dict) -> None:
        """The batch's records that did not decode, read again within their offsets' span per partition, written
        to `<topic>.dlq` (a second job, guarded by the batch's marks like the first) and added to `counts`."""
        again = self._reread(topic.name, spans)
        with current.phase("dead letters"):
            letters, _ = self._observed_delivery(routing.dead_letters(again, self.proc), current)
        if letters.dlq != bad:  # read again, they are not what the batch read: retention, or a changed record
            log.error("weir: processor %s batch %d: %d records did not decode, but %d read again by their offsets",
                      self.proc.name, current.id, bad, letters.dlq)  # fmt: skip
            counts.violations += 1
        counts.dlq += letters.dlq
        counts.violations += letters.violations
        for dest, n in letters.outputs.items():
            counts.outputs[dest] = counts.outputs.get(dest, 0) + n
        counts.replayed = current.replayed

    def _rerun(self, current: Batch, tally: SourceTally, exc: Exception) -> Counts:
        """The batch again after its one job failed, the three-job way that isolates a poison record. Its rows
        come from a bounded read of the planned offsets, not from the micro-batch: the failed job's finished
        tasks are already in Spark's counts of the micro-batch (numInputRows, the read observations), which a
        second read would double. So the rerun's own read stands for them (`Counts.read`, `Counts.reads`). The
        failed job may have written part of the batch: the write reads back from the batch's marks, as a
        replay does, and skips what is there."""
        log.warning("weir: processor %s batch %d failed in one pass (%s); running it again, record by record where "
                    "it fails", self.proc.name, current.id, brief(exc))  # fmt: skip
        topic = self.topics[tally.topic]
        reads = Observation(f"weir-reread-{self.name}-{current.id}-{uuid.uuid4().hex[:8]}")
        again = _observe_reads(self._reread(topic.name, {p: (f, e - 1) for p, (f, e) in tally.spans.items() if e > f}),
                               topic, reads)  # fmt: skip
        if current.guard is not None:
            current.guard = replace(current.guard, replay=True)
        counts = self.run_batch(again, current.id, current=current)
        seen = reads.get
        counts.read = sum(int(seen.get(f"c{p}") or 0) for p in range(topic.partitions)) + int(
            seen.get(completeness.OTHER) or 0)  # fmt: skip
        counts.reads = {topic.name: dict(seen)}
        return counts

    def run_batch(
        self, batch: DataFrame, batch_id: int, reread: bool = False, *, current: Batch | None = None
    ) -> Counts:
        """One static batch of a stateless processor, as foreachBatch runs it: dead-letter the undecodable
        records, apply the function to each input topic's clean rows (isolating poison records), route and
        deliver; returns the batch's counts, to be settled with an input count measured apart from weir's
        (Spark's own, or the lake files' for a backfill). `batch` has the columns of the inputs' weir-kafka
        streams; any DataFrame of those columns will do (`weir backfill` hands it rows from the lake). Sinks
        must be open.

        `reread`: the batch is cheap to read again (the lake's Parquet files), so it is not cached. `current`: the
        running batch of `batch_id` that hands over to this path (a streaming batch's), else one begins here."""
        current = current if current is not None else self._batch(batch_id)
        current.poisoned, current.replayed = 0, 0
        if not reread:
            current.cache(batch)
        try:
            inputs = self.split(batch)
            # The records the function is handed, counted in a job without user code: it also fills the cache,
            # so later jobs that fail (a poison record) re-read the cache, not Kafka.
            with current.phase("read and count"):
                handed = union(inputs).count()
            dead = routing.dead_letters(batch, self.proc)
            with current.phase("apply and route"):
                frame, routed, groups = self._attempt(inputs, None, current, dead)
            counts = self._deliver(frame, routed, groups, current)
            counts.handed = handed
            return counts
        finally:
            current.release()

    def _attempt(
        self, inputs: list[DataFrame], ranges: list[tuple] | None, current: Batch, extra: DataFrame | None = None
    ) -> tuple[DataFrame, DataFrame, list | None]:
        """(result, routed result, counts by route) of the function over `inputs` (restricted to offset
        `ranges`, (topic, partition, first, last) each), computed and cached; the records on which it fails
        in a task are isolated by bisection and dead-lettered (docs/pipelines.md, poison records)."""
        sub = inputs if ranges is None else [df.where(_covering(ranges)) for df in inputs]
        result = self.result(sub)
        current.routes_own, current.has_sources = result.routes_own, result.has_sources
        frame = current.cache(result.frame)
        # The function's result is cached; its routed form is not: it is a projection (counted on four
        # columns, written only where a record goes to a topic), and caching it would build every row's key,
        # value and headers, even those of a sink's rows that never go to Kafka.
        routed = routing.route(frame, self.proc, self.topics, self.writers)
        routed = routed if extra is None else routed.unionByName(extra)
        try:
            return frame, routed, routing.route_groups(routed)
        except AnalysisException:
            raise
        except Exception as exc:  # any task failure may be one record's; bisection decides
            frame.unpersist()
            routed.unpersist()
            frame, routed = self._bisect(inputs, ranges if ranges is not None else self._ranges(sub), exc, current)
            routed = routed if extra is None else routed.unionByName(extra)
            return frame, routed, None

    def result(self, inputs: list[DataFrame]) -> Routed:
        """The function's result over `inputs`, one frame with a route per row (out, unless it routes its rows
        itself) and the input record behind each row where it still has one."""
        # Each input record's coordinates ride along hidden, so that its output rows know it whatever the
        # function keeps (weir.runtime.provenance). A driver-side error (bad column, bad code) is no record's fault.
        result = provenance.attach_all(self.proc.fn(*map(provenance.carry, inputs)))
        routing.check_outputs(self.proc, result, self.topics)
        frame = _with_output(result) if isinstance(result, dict) else result
        routes_own = ROUTE in frame.columns  # the function routes rows itself (a view: keyless to dlq)
        frame = frame if routes_own else frame.withColumn(ROUTE, F.lit(OUT))
        return Routed(frame, routes_own, routing.origin(frame) is not None)

    @staticmethod
    def _ranges(inputs: list[DataFrame]) -> list[tuple]:
        """(topic, partition, first offset, last offset) of every input partition: metadata, not data."""
        union = None
        for df in inputs:
            part = df.select(*routing.COORDINATES)
            union = part if union is None else union.unionByName(part)
        rows = union.groupBy("topic", "partition").agg(F.min("offset"), F.max("offset")).collect()
        return sorted(tuple(r) for r in rows)

    def _bisect(
        self, inputs: list[DataFrame], ranges: list[tuple], exc: Exception, current: Batch
    ) -> tuple[DataFrame, DataFrame]:
        # Offsets within a partition are (nearly) dense, so halving offset ranges halves the records
        # without counting them: about 2*log2(batch) small jobs to isolate one failing record.
        if len(ranges) == 1 and ranges[0][2] == ranges[0][3]:
            return self._poison([df.where(_covering(ranges)) for df in inputs], exc, current)
        if len(ranges) > 1:
            halves = [ranges[: len(ranges) // 2], ranges[len(ranges) // 2 :]]
        else:
            t, p, lo, hi = ranges[0]
            halves = [[(t, p, lo, (lo + hi) // 2)], [(t, p, (lo + hi) // 2 + 1, hi)]]
        (f1, r1, _), (f2, r2, _) = (self._attempt(inputs, h, current) for h in halves)
        return f1.unionByName(f2, allowMissingColumns=True), r1.unionByName(r2)

    def _poison(self, inputs: list[DataFrame], exc: Exception, current: Batch) -> DataFrame:
        """The one record on which the function raised, as a dead letter carrying the error."""
        current.poisoned += 1
        if current.poisoned > self.max_poison:
            raise RuntimeError(
                f"processor {self.proc.name}: more than {self.max_poison} records of one batch made it fail; "
                f"that is broken code, not bad data. Last error: {brief(exc)}"
            ) from exc
        row = None
        for df in inputs:
            part = df.select(*routing.COORDINATES, "key", "value", "timestamp")
            row = part if row is None else row.unionByName(part)
        message = f"processor {self.proc.name} raised: {brief(exc)}"
        log.warning("weir: %s; the record goes to the dead-letter topic", message)
        frame = current.cache(row.withColumn(ERROR_COLUMN, F.lit(message)))
        routed = current.cache(routing.dead_letters(frame, self.proc))
        routed.count()
        # A dead letter is no result row for a sink; an empty frame of one column adds no columns to the result.
        return frame.select(F.lit(DLQ).alias(ROUTE)).limit(0), routed

    def _deliver(self, frame: DataFrame, routed: DataFrame, groups: list | None, current: Batch) -> Counts:
        """Write the routed records to their topics and the result to the sink; the batch's counts."""
        groups = groups if groups is not None else routing.route_groups(routed)
        counts = from_routes([(g[ROUTE], g[routing.DEST], g["n"], g["a"]) for g in groups])
        counts.passed = sum(g["sources"] for g in groups if g[ROUTE] in (OUT, EMIT))
        counts.has_sources = current.has_sources
        counts.poison = current.poisoned
        if current.routes_own and any(g[ROUTE] == DLQ for g in groups):
            # Records the function itself sent to dlq were handed to it: not "filtered" as well (Counts.settle).
            # The frame is cached: a count of it reads memory.
            counts.refused += frame.where(col(ROUTE) == DLQ).count()
        if self.writers and any(g[ROUTE] == DLQ for g in groups):
            counts.refused += routing.refused_rows(frame, self.proc, self.topics, self.writers)
        if any(g[routing.DEST] is not None for g in groups):
            skipped = self.write_topics(routed, current)
            counts.replayed = current.replayed
            for dest, n in skipped.items():  # routed there, delivered before: not written by this batch
                counts.outputs[dest] -= n
        if self.proc.sink is not None:
            rows = frame.where(col(ROUTE).isin(OUT, EMIT)).drop(*[c for c in _INTERNAL if c in frame.columns])
            with current.phase(f"sink {self.proc.sink.name}"):
                counts.outputs[self.proc.sink.name] = self.proc.sink.write(rows, current.id).rows
        return counts

    def write_topics(self, routed: DataFrame, current: Batch) -> dict[str, int]:
        """Write the routed rows that have a destination topic to it (one Spark job), guarded by `current`'s replay
        guard; the rows not written again because this writer delivered them before (`delivered`), per destination
        topic. The one place routed records leave for their topics, through `output`."""
        rows = routed.where(col(routing.DEST).isNotNull())
        seen = None
        if not self._rebuild_checked:
            self._start_rebuild()
        if self.delivered is not None:
            rows, seen = self._undelivered(rows)
        report = kafka_sink.report_path()
        try:
            with current.phase("write topics"):
                record = self._memo(("record", tuple(self.headers.items())), lambda: [
                    col(routing.DEST).alias("topic"), col("key"), col("value"),
                    routing.stamped_headers(self.headers).alias("headers"), col("timestamp")])  # fmt: skip
                options = {
                    **self.kafka_options(),
                    **({"replayGuard": current.guard.to_option()} if current.guard else {}),
                    "commitReport": report,
                }
                # Rows that come in their input records' order are oldest first already; sorting them would make
                # each task read all of its records before writing the first (no reading while the writer produces)
                self.output.write(rows.select(*record), options, oldest_first=not current.in_order or seen is not None)
        finally:
            self._take_report(report)
        if current.guard is not None and current.guard.reports is not None:
            current.replayed += replay.skipped(current.guard.reports)
        skipped: dict[str, int] = {}
        if seen is not None:
            skipped = {d: int(n) for d, n in seen.get.items() if d != "_none" and int(n)}
            current.replayed += sum(skipped.values())
            if self.rebuild is not None:
                self._note_rebuild(sum(skipped.values()), current.id)
        return skipped

    def _take_report(self, path: str) -> None:
        """The rebuilt producers a write's commit reported, kept for the batch's books (`client_rebuilds`)."""
        report = kafka_sink.take_report(path)
        if report is None:  # a write that failed before its commit (or a collecting test double) reports nothing
            return
        self.client_rebuilds += int(report.get("rebuilds", 0))

    def _start_rebuild(self) -> None:
        """After `weir run --reset` (weir.runtime.rebuild): note the marks of the topics this processor writes
        (at its first write after the reset only) and read what it delivered below them, to skip it."""
        self._rebuild_checked = True
        if not self.checkpoint or self.delivered is not None:
            return
        found = rebuild.pending(self.cp)
        if found is None:
            return
        if not self.written_topics():
            return
        if found.marks is None:
            topics = self.written_topics()
            wait = self.settings.broker_wait // timedelta(milliseconds=1)
            marks = replay.take_marks(self.settings.client_config(), topics, timeout=min(30.0, wait / 1000))
            found.marks = {t: {str(p): o for p, o in ps.items()} for t, ps in marks.items()}
            rebuild.save(self.cp, found)
        if not found.marks:  # none of its topics existed: nothing was delivered
            rebuild.done(self.cp)
            return
        self.delivered = self.read_delivered(sorted(found.marks), found.marks).persist()
        if found.delivered is None:
            found.delivered = int(self.delivered.agg(F.coalesce(F.sum("n"), F.lit(0))).first()[0])
            rebuild.save(self.cp, found)
        self.rebuild = found
        log.info("weir: %s rebuilds after a reset (since %s): %d rows it delivered before are not written again",
                 self.name, found.since, found.remaining)  # fmt: skip
        self._note_rebuild(0)

    def _note_rebuild(self, skipped: int, batch_id: int | None = None) -> None:
        """Note the skips of batch `batch_id`; once every delivered row was met, the rebuild ends. A rebuild runs
        only in a streaming query's batches (its checkpoint names the reset; a backfill or a test has none)."""
        if batch_id is not None and skipped:
            self.rebuild.skipped[str(batch_id)] = skipped
            rebuild.save(self.cp, self.rebuild)
        if self.rebuild.remaining is not None and self.rebuild.remaining <= 0:
            log.info("weir: %s met every row it delivered before its reset; it writes as usual", self.name)
            rebuild.done(self.cp)
            self.delivered.unpersist()
            self.delivered, self.rebuild = None, None

    def read_since(self, topics: list[str], marks: dict[str, dict[int, int]]) -> DataFrame:
        """What this writer delivered to `topics` from `marks` on, read from Kafka by one job when used: (topic,
        source, key, value) per record, source null for rows without an input record. What a real-time
        processor's next run must not write again (weir.runtime.realtime)."""
        starting = {t: {str(p): o for p, o in ps.items()} for t, ps in marks.items() if ps}
        if not starting:
            return self.spark.createDataFrame([], "topic string, source string, key binary, value binary")
        reader = (
            self.spark.read.format("weir-kafka")
            .options(**self.kafka_options())
            .option("subscribe", ",".join(sorted(starting)))
            .option("startingOffsets", json.dumps(starting))
        )
        return reader.load().where(self._ours()).select(
            "topic", routing.header_value(SOURCE_HEADER).alias("source"), "key", "value")  # fmt: skip

    def _ours(self) -> Column:
        """Whether a record of a topic was written by this processor (a record without `weir.pipeline` was
        written before writers had one)."""
        pipeline = routing.header_value(PIPELINE_HEADER)
        return (routing.header_value(PROCESSOR_HEADER) == F.lit(self.proc.name)) & (
            pipeline.isNull() | (pipeline == F.lit(self.pipeline.name))
        )

    def read_delivered(self, topics: list[str], marks: dict[str, dict[str, int]] | None = None) -> DataFrame:
        """What this writer (its pipeline and processor; a record without `weir.pipeline` was written before
        writers had one) delivered to `topics`, below `marks` if given, read from Kafka by one job when used:
        (topic, source, key, value, n), with key and value null for rows with a source (known by it), and `n`
        the rows of each. What a backfill or a rebuild must not write again (docs/backfill.md,
        docs/pipelines.md "Resets"). The caller caches it."""
        reader = (
            self.spark.read.format("weir-kafka")
            .options(**self.kafka_options())
            .option("subscribe", ",".join(topics))
            .option("startingOffsets", "earliest")
        )
        if marks is not None:
            reader = reader.option("endingOffsets", json.dumps(marks))
        header, ours = routing.header_value, self._ours()
        sourced = col("source").isNotNull()
        known = [F.when(~sourced, col(c)).alias(c) for c in ("key", "value")]  # a row with a source: by it alone
        records = reader.load().where(ours).select("topic", header(SOURCE_HEADER).alias("source"), "key", "value")
        return (
            records.select("topic", "source", *known)
            .groupBy("topic", "source", "key", "value")
            .count()
            .select("topic", "source", "key", "value", col("count").alias("n"))
        )

    def _undelivered(self, rows: DataFrame) -> tuple[DataFrame, Observation]:
        """`rows` without those already delivered (`self.delivered`): a row with a `weir.source` when its
        (destination, source) was; a row without one (a window's result) as often as its (destination, key,
        value) was, a multiset. And an Observation of how many were left out per destination (read once the
        write ran)."""
        d = self.delivered
        by_source = d.where(col("source").isNotNull()).select(
            col("topic").alias("_d_topic"), col("source").alias("_d_source"), F.lit(True).alias("_d_seen")
        )
        by_row = d.where(col("source").isNull()).select(
            col("topic").alias("_r_topic"), col("key").alias("_r_key"), col("value").alias("_r_value"),
            col("n").alias("_r_n"),
        )  # fmt: skip
        marked = rows.withColumn("_d_row_source", routing.header_value(SOURCE_HEADER))
        marked = marked.join(
            by_source, (col(routing.DEST) == col("_d_topic")) & (col("_d_row_source") == col("_d_source")), "left"
        )
        # Rows without a source: the k-th equal row of the batch is skipped while k <= how often it was delivered
        rank = F.row_number().over(
            Window.partitionBy(routing.DEST, "key", "value", col("_d_row_source").isNull()).orderBy("timestamp")
        )
        marked = marked.withColumn("_r_rank", F.when(col("_d_row_source").isNull(), rank)).join(
            by_row,
            col("_d_row_source").isNull() & (col(routing.DEST) == col("_r_topic"))
            & col("key").eqNullSafe(col("_r_key")) & col("value").eqNullSafe(col("_r_value")),
            "left",
        )  # fmt: skip
        skip = col("_d_seen").isNotNull() | (col("_r_n").isNotNull() & (col("_r_rank") <= col("_r_n")))
        dests = self.written_topics()
        observed = Observation(f"weir-{self.name}-delivered-{uuid.uuid4().hex[:8]}")
        marked = marked.withColumn("_d_skip", skip).observe(
            observed, F.lit(0).alias("_none"),
            *[F.count_if(col("_d_skip") & (col(routing.DEST) == d)).alias(d) for d in dests],
        )  # fmt: skip
        helpers = ["_d_row_source", "_d_topic", "_d_source", "_d_seen", "_r_rank", "_r_topic", "_r_key", "_r_value"]
        kept = marked.where(~col("_d_skip")).drop(*helpers, "_r_n", "_d_skip")
        return kept, observed

    def _observed_delivery(
        self, routed: DataFrame, current: Batch, extra: list[Column] | None = None
    ) -> tuple[Counts, dict[str, Any]]:
        """A batch without a sink in one Spark job: the Kafka write counts every route on its way (an
        Observation of all rows, taken before the filter on a destination), so the batch is neither cached nor
        computed twice. A route or destination outside the processor's own shows as a violation. `extra`: more
        aggregates for the same Observation, whose row is returned with the counts."""
        combos = routing.destinations(self.proc)
        metrics = self._memo("delivery", lambda: routing.by_route(combos))
        seen = Observation(f"weir-{self.name}-{current.id}-{uuid.uuid4().hex[:8]}")
        skipped = self.write_topics(routed.observe(seen, *metrics, *(extra or [])), current)
        got = seen.get
        groups = routing.observed_groups(got, combos)
        counts = from_routes(groups)
        counts.has_sources = current.has_sources
        counts.poison = current.poisoned
        counts.replayed = current.replayed
        for dest, n in skipped.items():  # routed there, delivered before: not written by this batch
            counts.outputs[dest] -= n
        return counts, got

    def _archive_batch(self, batch: DataFrame, current: Batch) -> None:
        # No cache and no count: one job reads the batch and writes it. `in` is the records the read tasks
        # consumed (Spark's own input count when the batch holds records), `out` the rows the committed files
        # hold: two independent measurements.
        counts = Counts()
        written = self.proc.sink.write(batch, current.id)
        # A replay the sink skipped wrote nothing this time, but its records are in the lake: delivered.
        counts.out, counts.read = written.delivered, written.read
        counts.outputs[self.proc.sink.name] = counts.out
        self.ledger.put(self.name, current.id, counts)

    def _view_batch(self, batch: DataFrame, current: Batch) -> None:
        """A view's micro-batch in one Spark job: the sink's one task applies the records to keep and counts the
        dead letters and refused records (no count, no route groups, no cache, no replay marks). Only a batch
        with such records (a replay's too: its task still counts them) runs a second job, their write to
        `<topic>.dlq`, guarded against replays by marks taken now (nothing of the batch went to Kafka before)."""
        began = time.monotonic()
        done = self.proc.sink.apply(views.lean(batch, self.pipeline, self.view), current.id)
        counts = Counts(out=done.written.delivered, dlq=done.dead + done.refused, refused=done.refused)
        counts.outputs[self.proc.sink.name] = done.written.rows
        if done.spans:
            current.guard = self._begin_guard(current.id)
            again = self._reread(self.view.source, done.spans)
            self.write_topics(views.dead_letters(again, self.proc, self.pipeline, self.view), current)
            counts.replayed = current.replayed
            dlq = f"{self.view.source}.dlq"
            counts.outputs[dlq] = counts.outputs.get(dlq, 0) + counts.dlq
        log.info("weir: %s batch %d: %d in %.0f ms", self.name, current.id, counts.out + counts.dlq,
                 (time.monotonic() - began) * 1000)  # fmt: skip
        self.ledger.put(self.name, current.id, counts)

    def _reread(self, topic: str, spans: dict[int, tuple[int, int]]) -> DataFrame:
        """The records of `topic` within the (first, last) offsets per partition, read again by a bounded batch
        read, decoded as the stream decodes them. Not from the micro-batch: Spark would count a second read of
        it in `in` (measured: 88 in for 62 records); not from a cache of it either, which costs every batch
        about 0.2 s to build, for the few that have dead letters."""
        decoding = self.topics[topic].reader_options(self.settings.registry_conf())
        if self.proc.realtime is not None and self.reader is not None and self.reader.connector:
            # decoded as the stream decodes them: in the JVM (weir.runtime.realtime)
            return connector.read_spans(self.spark.read, {**self.kafka_options(), **decoding}, topic, spans)
        reader = (
            self.spark.read.format("weir-kafka")
            .options(**self.kafka_options())
            .option("subscribe", topic)
            .options(**span_bounds(topic, spans))
            .options(**decoding)
        )
        if self.settings.lake:  # offsets retention deleted meanwhile are read from the lake, as the stream would
            reader = reader.option("lake", self.settings.lake)
        return reader.load()

    def deliver_result(self, frame: DataFrame, batch_id: int) -> Counts:
        """A stateful result's rows routed and delivered to their topics and the sink, its counts (a stateful
        backfill's batch: `_streaming_batch` without the ledger). The caller caches `frame` when it has a sink."""
        current = self._batch(batch_id)  # this batch's, as `each` of a streaming query begins one
        routed = routing.route(frame, self.proc, self.topics, self.writers)
        counts = self._deliver(frame, routed, routing.route_groups(routed, sources=False), current)
        counts.passed = None  # the blocks' routes are the accounting: nothing to settle
        return counts

    def _streaming_batch(self, batch: DataFrame, current: Batch) -> None:
        frame = batch if ROUTE in batch.columns else batch.withColumn(ROUTE, F.lit(OUT))
        if self.proc.sink is None:
            counts, _ = self._observed_delivery(routing.route(frame, self.proc, self.topics, self.writers), current)
            counts.passed = None  # the blocks' routes are the accounting: nothing to settle
            self.ledger.put(self.name, current.id, counts)
            return
        # With a sink, the batch feeds two writes: cached, so the stateful operator runs once.
        current.cache(batch)
        try:
            # Not cached: a projection of the cached batch (see _attempt). A block's routes are the accounting,
            # so the groups need no count of distinct sources, which costs a shuffle.
            routed = routing.route(frame, self.proc, self.topics, self.writers)
            counts = self._deliver(frame, routed, routing.route_groups(routed, sources=False), current)
            counts.passed = None  # the blocks' routes are the accounting: nothing to settle
            self.ledger.put(self.name, current.id, counts)
        finally:
            current.release()

    def _guarded(self) -> bool:
        """Whether a streaming batch's writes are guarded against replays: it writes topics (not a view's,
        whose dead letters take their marks when they come, see _view_batch)."""
        return not (self.archive or self.view) and bool(self.written_topics())

    def written_topics(self) -> list[str]:
        """Every topic the processor's batches may write (outputs, dead letters, late records), sorted."""
        return sorted({d for _, d in routing.destinations(self.proc) if d is not None})

    def _begin_guard(self, batch_id: int) -> replay.Guard:
        """The replay guard of a streaming batch that writes topics (docs/delivery.md, "Replays")."""
        topics = self.written_topics()
        client = self.settings.client_config()
        wait = self.settings.broker_wait // timedelta(milliseconds=1)
        return replay.begin(self.cp, self.proc.name, batch_id, topics, client, wait / 1000, self.pipeline.name)

    def _unappended(self, current: Batch) -> list[completeness.Gap]:
        """What the batch before wrote and its topics do not hold: its records per topic against how far the
        marks moved up to this batch's (driver; only after a first write that skipped nothing, in this process)."""
        wrote, self._wrote = self._wrote, None
        if wrote is None or wrote[0] != current.id - 1 or current.guard is None or current.guard.replay:
            return []
        return completeness.check_writes(wrote[1], current.guard.marks, wrote[2])

    def _books_writes(self, current: Batch, unappended: list[completeness.Gap]) -> None:
        batch_id = current.id
        counts = self.ledger.peek(self.name, batch_id)
        if counts is None:
            return
        counts.client_rebuilds, self.client_rebuilds = counts.client_rebuilds + self.client_rebuilds, 0
        for gap in unappended:
            log.error("weir: processor %s batch %d: %s", self.proc.name, batch_id - 1, gap.describe())
            counts.gaps.append(gap.to_json() | {"batch": batch_id - 1})
            counts.violations += 1
        if current.guard is not None and not current.guard.replay and not counts.replayed:
            written = {t: counts.outputs.get(t, 0) for t in current.guard.marks}
            self._wrote = (batch_id, current.guard.marks, written)

    # -- start --------------------------------------------------------------------------------------------
    def _start_realtime(self):
        """A real-time processor's start (weir.runtime.realtime): what earlier real-time runs wrote past their last
        commit is skipped on every path; then its real-time query, or None when it runs micro-batches now (one
        batch at a time: the tail's rows are skipped by foreachBatch's write)."""
        if self._tail is not None:  # the last start's: read anew
            self._tail.unpersist()
        found, reach = realtime.settle(self)
        self._tail = found
        self.delivered = None if found is None else found.select(
            "topic", "source", F.lit(None).cast("binary").alias("key"), F.lit(None).cast("binary").alias("value"),
            F.lit(1).alias("n"))  # fmt: skip
        why = realtime.refusal(self)
        if why is not None:
            log.info("weir: processor %s runs micro-batches for now: %s", self.proc.name, why)
            return None
        path = realtime.RealTime(self, found, reach)
        self.in_realtime = True
        try:
            records = path.build()  # RealTimeError: the declaration cannot run in real time, said at once
        finally:
            self.in_realtime = False
        try:
            query = path.start(records)
        except realtime.RealTimeError:
            raise
        except Exception as exc:  # Spark refused the query: micro-batches, saying why
            self.fell_back = brief(exc)
            self._back_at = self._fallbacks.fell(None)
            log.warning("weir: processor %s cannot start in real time (%s); it runs micro-batches",
                        self.proc.name, self.fell_back)  # fmt: skip
            return None
        self.direct = path
        return query

    def failed(self, exc: BaseException) -> None:
        """The query failed (the runner restarts it): a direct query falls back to one batch at a time."""
        if self.direct is not None:
            self.fall_back(brief(exc))

    @property
    def starved(self) -> str | None:
        """Why the running direct query should give way to one batch at a time though it runs (a real-time query
        whose batches read nothing: weir.runtime.realtime); None: it runs on."""
        return self.direct.starved if self.direct is not None else None

    def fall_back(self, why: str) -> None:
        """The direct query gives way to one batch at a time, for `why`; the runner restarts it, and returns it to
        the direct path after a while (direct.Fallbacks)."""
        assert self.direct is not None
        self.fell_back = why
        failed_at = self.direct.fall_back(why)
        self.direct = None
        self._back_at = self._fallbacks.fell(failed_at)

    @property
    def back_to_direct(self) -> bool:
        """Whether the runner should restart this query on the direct path (its fallback has run its course)."""
        return self._back_at is not None and self.ran is not None and self.ran >= self._back_at

    def start(self, on_batch: Callable[[DataFrame, int], None] | None = None):
        if self.checkpoint:
            # A stop between a batch's foreachBatch and its commit left that batch's counts: this run runs it again,
            # and its books (a direct or real-time path's come from its progress) must not meet the stale ones
            done = self.cp.committed_batches()
            self.ledger.forget_from(self.name, done[-1] + 1 if done else 0)
        if self.proc.sink is not None:
            # A stable writer name: replays of a batch id are recognised.
            self.proc.sink.open(self.name, self.checkpoint)
        self.reader = None if self.proc.kind == "source" else self.choose_reader()
        if self.archive:
            stream, handler = self.inputs(), self._archive_batch
        elif self.view is not None:
            stream, handler = self.inputs(), self._view_batch
        else:
            self.direct = None
            if self.back_to_direct:  # the fallback ran its course: the direct path again
                self._fallbacks.resumed = self._back_at
                self.fell_back, self._back_at = None, None
            if self.proc.realtime is not None and on_batch is None and self.checkpoint:
                query = self._start_realtime()
                if query is not None:
                    return query
            elif on_batch is None and direct.refusal(self) is None:
                path = direct.Direct(self)
                try:
                    records = path.build()
                    if records is not None:
                        self.direct = path
                        return path.start(records)
                except Exception as exc:  # the path's own failure: one batch at a time says what is wrong, if anything
                    self.direct = None
                    self.fell_back = brief(exc)
                    log.warning("weir: processor %s cannot start on the direct path (%s); it runs one batch at a "
                                "time", self.proc.name, self.fell_back)  # fmt: skip
            if self.proc.stateful or self.proc.kind == "source":
                stream, handler = self.streaming_result(), self._streaming_batch
            else:
                stream, handler = self.inputs(), self._stateless_batch

        def each(batch: DataFrame, batch_id: int) -> None:
            if self.stopping.is_set():
                # Refuse the batch before writing anything: it stays uncommitted and the next start runs
                # it from its offsets, with nothing written twice.
                raise StopRequested(f"processor {self.proc.name} is stopping; batch {batch_id} runs at the next start")
            current = self._batch(batch_id)  # what the batch's steps share, handed down to each
            self.in_batch = batch_id
            try:
                began = time.monotonic()
                if self._guarded():
                    current.mark(lambda: self._begin_guard(batch_id), f"weir-marks-{self.proc.name}")
                handler(batch, current)
                self._books_writes(current, self._unappended(current))
                took = time.monotonic() - began
                if took > SLOW_BATCH_S:  # where a slow batch's time went (after an outage, on a loaded machine)
                    spent = ", ".join(f"{k} {v:.1f} s" for k, v in current.phases.items())
                    log.info("weir: processor %s batch %d took %.1f s: %s", self.proc.name, batch_id, took, spent)
                # The sources' admission control sizes the next batch from this one's duration (docs/flow.md).
                admission.write_measurement(self.measurements, batch_id, took)
                if on_batch:
                    on_batch(batch, batch_id)
                self.ran = batch_id
            finally:
                self.in_batch = None
                current.end_guard()

        Path(self.measurements).unlink(missing_ok=True)  # a previous run's measurements are not this one's
        writer = stream.writeStream.queryName(self.name).option("checkpointLocation", self.checkpoint)
        writer = writer.foreachBatch(each)
        if self.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            interval = self.trigger
            writer = writer.trigger(processingTime=units.spark_trigger(interval, f"{self.name}: trigger"))
        return writer.start()


def _observe_reads(stream: DataFrame, topic: Topic, observation: Observation | None = None) -> DataFrame:
    """`stream` observed per declared partition (records, first and last offset) in the job that reads it: Spark
    publishes the figures with the batch's progress, where the runner checks them against the batch's planned
    offsets (weir.runtime.completeness). No extra job, no shuffle: a few aggregates on columns already read."""
    part, offset = col("partition"), col("offset")
    metrics = []
    for p in range(topic.partitions):
        mine = part == p
        metrics += [
            F.count_if(mine).alias(f"c{p}"),
            F.min(F.when(mine, offset)).alias(f"lo{p}"),
            F.max(F.when(mine, offset)).alias(f"hi{p}"),
        ]
    metrics.append(F.count_if((part >= topic.partitions) | (part < 0)).alias(completeness.OTHER))
    return stream.observe(observation or completeness.READ_OBSERVATION + topic.name, *metrics)


def _observes(df: DataFrame, *observations: Observation) -> bool:
    """Whether `df`'s optimized plan still computes these Observations: an Observation whose node the optimizer
    removed (below a filter it knows is false) never completes, and reading it would wait for ever."""
    plan = df._jdf.queryExecution().optimizedPlan().toString()
    return all(f"CollectMetrics {o._name}," in plan for o in observations)


def _undecoded(topic: Topic) -> list[Column]:
    """Aggregates of a batch's records that did not decode: how many, and their first and last offset per
    partition (where to read them again)."""
    bad = col(ERROR_COLUMN).isNotNull()
    part, offset = col("partition"), col("offset")
    out = [F.count_if(bad).alias("bad")]
    for p in range(topic.partitions):
        out += [F.min(F.when(bad & (part == p), offset)).alias(f"lo{p}"),
                F.max(F.when(bad & (part == p), offset)).alias(f"hi{p}")]  # fmt: skip
    return out


def union(frames: list[DataFrame]) -> DataFrame:
    """Frames unioned by column name; a column some of them lack is null in their rows."""
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f, allowMissingColumns=True)
    return out


def _with_output(result: dict[str, DataFrame]) -> DataFrame:
    return union([df.withColumn(routing.OUTPUT, F.lit(t)) for t, df in result.items()])


def _covering(ranges: list[tuple]) -> Column:
    """Rows within any of the (topic, partition, first, last) offset ranges."""
    out = None
    for t, p, lo, hi in ranges:
        c = (col("topic") == t) & (col("partition") == p) & col("offset").between(lo, hi)
        out = c if out is None else out | c
    return out


def brief(exc: BaseException | str) -> str:
    """The error itself, out of a Spark error that wraps a Python traceback, a plan and a JVM stack trace."""
    text = str(exc)
    # Python's own names end in Error or Exception; others are known by their module path (weir.kafka.log.X).
    errors = re.findall(
        r"^\s*((?:(?:[A-Za-z_][\w.]*)?(?:Error|Exception)|[a-z_]\w*(?:\.\w+)*\.[A-Z]\w*)\b: .+)$", text, flags=re.M
    )
    python = [e for e in errors if not e.lstrip().startswith(("org.", "java.", "scala.", "py4j."))]
    if python:
        return python[-1].strip()[:500]
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    return first[:500]
