"""The direct path: a processor without a sink as one streaming query with one streaming writer.

A foreachBatch batch builds and analyzes its DataFrames and makes a writer anew each time, about half a second of
every batch on 2 cores (docs/performance.md). Here the function, its routes and its counts are planned once,
as a plain Structured Streaming query is, and the weir-kafka streaming writer writes every batch. The books come
from three sides that do not share a count: Spark's numInputRows and read Observation; named Observations of the
records handed to the function and of the rows by route; and the writer's commit, which says what its tasks
wrote per topic and which input records are behind the output rows (only a successful task attempt's message is
committed, so a retried task counts once). Replay marks are noted beside the query, never in a batch's path
(weir.kafka.replay, "a processor's streaming write"). A record that does not decode, or on which the function
raises, fails its batch: the processor then runs one batch at a time (foreachBatch), which dead-letters it,
from that batch on. A stateful processor's rows are its blocks' routes (no input record behind a window's row):
those are its books, against what the writer wrote. The commit order and failure cases: docs/delivery.md, "The
direct path".
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.functions import col

from weir import units
from weir.formats import ERROR_COLUMN
from weir.kafka import replay
from weir.kafka import sink as kafka_sink
from weir.pipeline.routes import DLQ, EMIT, OUT, ROUTE
from weir.runtime import completeness, rebuild, routing
from weir.runtime.accounting import Counts, from_routes

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

    from weir.runtime.batchpath import PathQuery

log = logging.getLogger("weir")
UNDECODABLE = "weir: a record that does not decode"
HANDED, ROUTES = "weir.handed:", "weir.routes:"
BACK_AFTER = 10  # batches one at a time after a fallback, before the direct path again (see Fallbacks)
MARKS_EVERY_S = 5.0  # how often marks are noted anew: a replay reads back from them, at most this much more


@dataclass
class Fallbacks:
    """When a processor that fell back from the direct path returns to it: after the batch it failed on and
    BACK_AFTER more one at a time. Each fallback in a row doubles the stay, so that a stream of bad records settles
    on foreachBatch; a fallback after the direct path ran, clean, at least as many batches as the last stay begins
    a new row, so that a trickle of them keeps most batches direct."""

    row: int = 0  # fallbacks in a row
    stay: int = 0  # the last fallback's batches one at a time
    resumed: int | None = None  # the batch from which the direct path ran again, after the last fallback

    def fell(self, failed_at: int | None) -> int | None:
        """A fallback on batch `failed_at` (None: before any batch was planned); the batch after which the
        processor returns to the direct path (None: the next start)."""
        if self.resumed is not None and failed_at is not None and failed_at - self.resumed >= self.stay:
            self.row = 0
        self.row += 1
        self.stay, self.resumed = BACK_AFTER * 2 ** (self.row - 1), None
        return None if failed_at is None else failed_at + self.stay


def refusal(q: PathQuery) -> str | None:
    """Why `q` cannot run the direct path (None: it can)."""
    proc = q.proc
    reasons = [
        (not q.settings.direct, "direct is off"),
        (proc.kind == "source", "a source of its own"),
        (not proc.stateful and len(proc.inputs) != 1, "a stateless processor of more than one input"),
        (proc.sink is not None, "a sink"),
        (not q.checkpoint, "no checkpoint"),
        (proc.shadow is not None, "a shadow run"),
        (q.bounds is not None or q.archive or q.view is not None, "a replay, an archiver or a view"),
        # A rebuild's skips of what was delivered before the reset happen in foreachBatch's write (see
        # PathQuery._start_rebuild), which notes it at its first write: the marker is read here
        (q.delivered is not None or (q.checkpoint and rebuild.pending(q.cp)), "a rebuild after a reset"),
        (q.fell_back is not None, f"it fell back: {q.fell_back}"),
    ]
    return next((why for bad, why in reasons if bad), None)


class Direct:
    """One processor's direct query: built and started by `start`, its batches' books by `counts`."""

    def __init__(self, q: PathQuery) -> None:
        self.q = q
        self.cp = q.cp
        self.reports = str(Path(q.settings.home) / "run" / "commits" / q.name)
        self.replay: int | None = None  # the batch planned and not committed at the start: written again
        self._routes_own = False
        self.has_sources = False  # whether each routed row names its input record (a stateless build's result)
        self._encoded = False
        self._stateful_rows = q.proc.stateful  # no input record behind a row: the routes are the books
        self._combos = routing.destinations(q.proc)
        self._origin: replay.Marks = {}  # the marks taken at the start
        self._written: dict[str, int] = {}  # records the batches since the start wrote, per topic
        self._short: dict[str, int] = {}  # per topic: records the checks found unappended so far
        self._checked_at = 0.0
        # Why the path should give way to micro-batches now, though it did not fail (a real-time path whose
        # batches read nothing: weir.runtime.realtime); the runner restarts the processor on them. None: it runs on.
        self.starved: str | None = None

    # -- the query ----------------------------------------------------------------------------------------
    def build(self) -> DataFrame | None:
        """The routed records of the stream, or None when the function's result cannot be counted this way
        (it keeps no input record, or reorders rows)."""
        if self.q.proc.stateful:
            return self._stateful()
        q = self.q
        topic = q.topics[q.proc.inputs[0]]
        stream = q.source(topic)
        why = F.concat(F.lit(f"{UNDECODABLE} ({topic.name} partition "), col("partition").cast("string"),
                       F.lit(" offset "), col("offset").cast("string"), F.lit("): "), col(ERROR_COLUMN))  # fmt: skip
        # A record that does not decode fails the task: the batch runs again one batch at a time, dead-lettered.
        checked = stream.where(F.when(col(ERROR_COLUMN).isNull(), F.lit(True)).otherwise(F.raise_error(why)))
        clean = q.split(checked)[0].observe(f"{HANDED}{q.name}", F.count(F.lit(1)).alias("n"))
        result = q.result([clean])
        self.has_sources, self._routes_own, frame = result.has_sources, result.routes_own, result.frame
        if not result.has_sources:
            return None
        names = tuple(frame.columns)
        enc = routing.encoded_column(names, q.proc, q.topics, q.writers)
        if enc is not None:
            frame = frame.withColumn(routing.ENCODED, enc)
            names = tuple(frame.columns)
            self._encoded = True
        if not self._routes_own and not self._encoded and len(q.proc.outputs) == 1 and routing.OUTPUT not in names:
            # Every row goes out to the one output: its records directly, and a count of them is the routes' count
            records = frame.select(*routing.out_records(names, q.proc, q.topics, q.headers))
            if not routing.keeps_order(records, analyzed=True):
                return None
            self._combos = [(OUT, q.proc.outputs[0])]
            rows = F.count(F.lit(1))
            zero = [F.lit(0).alias(n) for n in ("absorbed", "expired", "_refused")]
            return records.observe(f"{ROUTES}{q.name}", rows.alias("rows"), rows.alias("n0"), *zero)
        routed = frame.select(*routing.route_columns(names, q.proc, q.topics, q.writers))
        refused = F.expr(f"count_if(`{ROUTE}` = '{DLQ}')").alias("_refused")
        routed = routed.observe(f"{ROUTES}{q.name}", *routing.by_route(self._combos), refused)
        if not routing.keeps_order(routed, analyzed=True):
            return None
        return self._to_write(routed)

    def _stateful(self) -> DataFrame:
        """A stateful result's routed records: the function applied once to the streams, as foreachBatch's path
        does (weir's blocks route the records that do not decode, and late ones, themselves). The routes are the
        books: an Observation counts them, as one foreachBatch batch does, and the writer's commit what went out."""
        q = self.q
        frame = q.streaming_result()
        if ROUTE not in frame.columns:
            frame = frame.withColumn(ROUTE, F.lit(OUT))
        routed = routing.route(frame, q.proc, q.topics, q.writers)
        routed = routed.observe(f"{ROUTES}{q.name}", *routing.by_route(self._combos))
        return self._to_write(routed)

    def _to_write(self, routed: DataFrame) -> DataFrame:
        """The routed rows that have a destination topic, as the writer's records."""
        return routed.where(col(routing.DEST).isNotNull()).select(
            col(routing.DEST).alias("topic"), col("key"), col("value"),
            routing.stamped_headers(self.q.headers).alias("headers"), col("timestamp"),
        )  # fmt: skip

    def start(self, records: DataFrame) -> StreamingQuery:
        q = self.q
        planned, committed = self._logged()
        self.replay = _uncommitted(planned, committed)
        # Nothing runs yet: these marks lie below everything the query will write. They serve a replay that has no
        # marks of its own (its attempt wrote nothing: a streaming attempt always has marks at or below it), and
        # every later batch; they are where the check of what the query's writes appended starts.
        self._origin = self._take()
        if self.replay is None or replay.newest_marks(q.cp, self.replay) is None:
            first = self.replay if self.replay is not None else (planned + 1 if planned is not None else 0)
            replay.note_marks(q.cp, q.proc.name, first, self._origin, q.pipeline.name, committed)
        if self.replay is not None:  # what tasks of an earlier attempt skipped is not this attempt's
            replay.forget_reports(self.cp.mark_reports(self.replay))
        # An earlier process's reports are no batch's of this one (a replay's commit writes its own)
        shutil.rmtree(self.reports, ignore_errors=True)
        Path(self.reports).mkdir(parents=True, exist_ok=True)
        passing = sorted({d for r, d in self._combos if r in (OUT, EMIT) and d is not None})
        guard = replay.StreamGuard(q.proc.name, q.checkpoint, q.pipeline.name, self.replay)
        writer = (
            records.writeStream.format("weir-kafka")
            .queryName(q.name)
            .option("checkpointLocation", q.checkpoint)
            .options(**q.kafka_options())
            .option("streamGuard", guard.to_option())
            .option("commitReports", self.reports)
            .option("sourceTally", "" if self._stateful_rows else ",".join(passing))
            # A stateful result comes grouped by key: each task writes oldest first (a streaming query cannot sort)
            .option("oldestFirst", str(self._stateful_rows).lower())
        )
        if q.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=units.spark_trigger(q.trigger, f"{q.name}: trigger"))
        # Spark finds a Python data source to write by the thread's active session: this thread (the runner's
        # supervisor) has none of its own, and the default session need not be the one weir-kafka is registered in
        q.spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(q.spark._jsparkSession)
        query = writer.start()
        log.info("weir: processor %s runs as one streaming query (direct)%s", q.proc.name,
                 f"; batch {self.replay} is written again" if self.replay is not None else "")  # fmt: skip
        return query

    def fall_back(self, why: str) -> int | None:
        """The query failed: the processor runs one batch at a time from the batch that failed on. That batch's
        marks become its own (replay.adopt), so its foreachBatch attempt reads back what this one delivered."""
        planned, committed = self._logged()
        if _uncommitted(planned, committed) is not None:
            replay.adopt(self.q.cp, self.q.proc.name, planned, self.q.pipeline.name)
        log.warning("weir: processor %s failed on the direct path (%s); it runs one batch at a time from batch %s "
                    "on", self.q.proc.name, why, planned)  # fmt: skip
        return planned

    def running(self) -> int | None:
        """The batch running now: the offset log's last when the commit log does not hold it yet (None when every
        planned batch has committed, or before the first)."""
        return _uncommitted(*self._logged())

    def committed(self, batch: int) -> bool:
        """Whether Spark's commit log holds `batch` (and so every batch before it)."""
        done = self._logged()[1]
        return done is not None and done >= batch

    # -- marks ----------------------------------------------------------------------------------------------
    def _logged(self) -> tuple[int | None, int | None]:
        """The last batch in the offset log and the last committed one."""
        planned, committed = self.cp.planned_batches(), self.cp.committed_batches()
        return (max(planned) if planned else None), (max(committed) if committed else None)

    def _take(self) -> replay.Marks:
        q = self.q
        return replay.take_marks(q.settings.client_config(), q.written_topics(), timeout=30.0)

    def _after(self, batch: int, written_now: dict[str, int], counts: Counts) -> None:
        """After batch `batch` committed (its progress): every record of it and of the batches before was
        acknowledged, so the topics' marks now must have moved, since the query's start, by at least what its
        batches wrote (other writers only add): less is a published gap, in this batch's books. The same marks
        are noted for replays when no later batch was planned meanwhile (the offset log's last batch read before
        and after them), so that a replay reads back little. At most every MARKS_EVERY_S in a live stream; every
        batch of a run that ends (available_now). A failure to take them is logged: the next batch tries again."""
        q = self.q
        for t, n in written_now.items():  # batches come in order: the sum is of this batch and those before
            self._written[t] = self._written.get(t, 0) + n
        if not q.available_now and time.monotonic() - self._checked_at < MARKS_EVERY_S:
            return
        self._checked_at = time.monotonic()
        try:
            before, committed = self._logged()
            marks = self._take()
            after, _ = self._logged()
        except Exception as exc:
            log.warning("weir: processor %s: marks not taken after batch %d (%s); older ones serve", q.proc.name,
                        batch, exc)  # fmt: skip
            return
        if before == after:
            replay.note_marks(q.cp, q.proc.name, (after or 0) + 1, marks, q.pipeline.name, committed)
        for gap in completeness.check_writes(self._origin, marks, self._written):
            short = gap.records - self._short.get(gap.topic, 0)  # the part not published by an earlier check
            if short > 0:
                self._short[gap.topic] = gap.records
                gap = replace(gap, records=short)
                log.error("weir: processor %s batch %d: %s", q.proc.name, batch, gap.describe())
                counts.gaps.append(gap.to_json() | {"batch": batch})
                counts.violations += 1

    # -- the books --------------------------------------------------------------------------------------
    def counts(self, figures: dict, progress: Any) -> Counts:
        """Batch `figures["batch_id"]`'s books from its progress and its writer's commit report."""
        batch = figures["batch_id"]
        observed = {n: row.asDict() for n, row in (getattr(progress, "observedMetrics", None) or {}).items()}
        got = observed.get(f"{ROUTES}{self.q.name}")
        handed = observed.get(f"{HANDED}{self.q.name}")  # a stateful query's books have none
        report = kafka_sink.take_report(os.path.join(self.reports, f"{batch}.json"))
        counts = Counts()
        if got is None or (handed is None and not self._stateful_rows):
            # A batch whose plan dropped the Observations, or an empty one Spark ran without its job
            rows = int(figures.get("input_rows") or 0)
            if rows or (report or {}).get("records"):
                log.error("weir: processor %s batch %s: its counts were not observed", self.q.proc.name, batch)
                counts.violations += 1
            counts.passed, counts.has_sources = (None if self._stateful_rows else 0), True
            return counts
        counts = from_routes(routing.observed_groups(got, self._combos))
        counts.has_sources = True
        counts.handed = 0 if handed is None else int(handed["n"])
        counts.refused = int(got["_refused"]) if self._routes_own or self._encoded else 0
        # Rows the batch's tasks found delivered before, and did not write again: every task of a replayed batch,
        # and a retried task of any batch, reports what it skipped (read once: the batch has committed)
        skips = self.cp.mark_reports(batch)
        counts.replayed = replay.skipped(skips)
        replay.forget_reports(skips)
        if report is None:
            log.error("weir: processor %s batch %s: its writer's commit report is missing", self.q.proc.name, batch)
            counts.violations += 1
            counts.passed = 0
            return counts
        counts.client_rebuilds = int(report.get("rebuilds", 0))
        # Two counts of one thing: the rows routed (an Observation) and the records the tasks wrote, plus those a
        # replay found delivered before
        written = {d: int(n) for d, n in report.get("per_topic", {}).items()}
        routed = {d: n for d, n in counts.outputs.items() if n}
        if sum(written.values()) + counts.replayed != sum(routed.values()) or (
            not counts.replayed and written != routed
        ):
            log.error("weir: processor %s batch %s: rows routed %s, records written %s (%d found delivered before)",
                      self.q.proc.name, batch, routed, written, counts.replayed)  # fmt: skip
            counts.violations += 1
        if self._stateful_rows:  # the blocks' routes are the accounting: nothing to settle (as foreachBatch's)
            counts.passed, outside = None, 0
        else:
            counts.passed, outside = _tally(report.get("sources", {}), completeness.planned_spans(figures["sources"]))
        if outside:
            log.error("weir: processor %s batch %s: %d output rows name input records outside the batch's offsets",
                      self.q.proc.name, batch, outside)  # fmt: skip
            counts.violations += 1
        self._after(batch, written, counts)
        return counts


def _uncommitted(planned: int | None, committed: int | None) -> int | None:
    """The offset log's last batch when the commit log does not hold it yet, else None."""
    return planned if planned is not None and (committed is None or planned > committed) else None


def _tally(sources: dict[str, list[list[int]]], spans: dict[str, dict[int, tuple[int | None, int]]]) -> tuple[int, int]:
    """(input records inside the batch's planned spans, those outside) of the report's offset runs."""
    inside = outside = 0
    for tp, found in sources.items():
        topic, _, part = tp.rpartition("/")
        first, end = spans.get(topic, {}).get(int(part), (None, None))
        for lo, hi in found:
            n = hi - lo + 1
            if first is None or end is None:
                outside += n
                continue
            within = max(0, min(hi + 1, end) - max(lo, first))
            inside += within
            outside += n - within
    return inside, outside
