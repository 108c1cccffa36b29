"""Real-time processors: a stateless processor as one query in Spark's real-time mode (docs/realtime.md).

Records stream through long-running tasks, one per input partition, from Spark's Kafka source to Spark's Kafka
sink, decoded and encoded in the JVM (weir.kafka.connector.decoded_in_jvm), in milliseconds rather than
micro-batches. The query is the direct path's (weir.runtime.direct): the function, its routes and its counts are
planned once; what differs is the writer, the trigger, and how a run that ends mid-batch is settled.

The tail. Spark logs a real-time batch's offsets and its commit only when the batch ends, after its records were
written, and its Kafka sink knows nothing of what it wrote before: a run that ends mid-batch (a crash, a SIGKILL,
a failure, a stop) leaves records written past the last commit, which the next run reads again. weir notes, in
`<checkpoint>/weir/realtime.json`, marks of the written topics below every write no commit covers yet (the
tail's marks). Every start of the processor, on any path, first reads what it delivered past those marks, and
skips rows found there, by (destination, input record): a real-time run by a broadcast anti-join in its plan, a
micro-batch run by its write (ProcessorQuery.delivered). The marks move on only once the commits have passed
every input record found in the tail. Marks taken when batch j's progress arrives lie below every write of
batch j + 2 when batch j + 1 had not committed yet; they become the tail's marks after batch j + 1 commits.

A record that does not decode fails the query (a real-time query has no second branch to dead-letter it): the
processor runs micro-batches for a while (the direct path's fallback), which dead-letter it, then real time
again. What holds and what does not: docs/realtime.md.

A starved batch. Spark ends a real-time batch a checkpoint interval after the driver plans it, wherever its tasks
are then: on a loaded driver, or with task slots taken, they may begin after that end and read nothing, batch after
batch, while the input's backlog grows (seen: 12 s from plan to tasks on 2 cores at load 12, with 10 s batches).
Such a batch, with records waiting past its start when it was planned or when it ended (records that arrive in a
steady stream may all come after its plan), has lost a whole checkpoint interval (5 minutes by default), and
its successors likely will: the processor leaves real time for micro-batches, which read by offsets and so move on
at any load (the runner restarts it, as after a failure, and publishes why in its state record); it returns to real
time as after any fallback, each fallback in a row staying twice as long (direct.Fallbacks).

No task is retried. A task Spark retried inside a real-time batch would read its partition again from the batch's
start and write again what the failed attempt wrote (the tail is settled when the query starts, not in its tasks):
`weir run` gives a session that runs real-time processors one attempt per task (`task_attempts`), so that a failed
task fails the query, and the next start settles the tail.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.functions import col

from weir.checkpoint.files import Checkpoint
from weir.checkpoint.log import read_offsets
from weir.checkpoint.offsets import parsed
from weir.kafka import connector, replay
from weir.kafka.headers import SOURCE_HEADER
from weir.runtime import completeness, routing
from weir.runtime.accounting import Counts, from_routes
from weir.runtime.direct import HANDED, ROUTES, Direct

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

    from weir.runtime.batchpath import PathQuery

log = logging.getLogger("weir")

Ends = dict[str, dict[str, int]]  # offsets by topic, then by partition as Spark's offsets JSON names it
SKIPPED = "weir.skipped:"  # the Observation of rows found in the tail, per destination


class RealTimeError(RuntimeError):
    """A processor declared real-time that cannot run as one: the reason names what to change."""


def task_attempts(master: str, max_failures: str | None) -> int:
    """How many attempts Spark gives a task under `master` with `spark.task.maxFailures` set to `max_failures`
    (None: unset): a local master's own count (`local[N, F]`, else 1: its conf does not apply), else the conf's
    (Spark's default 4)."""
    found = re.fullmatch(r"local(?:\[\s*[^,\]]+\s*(?:,\s*(\d+)\s*)?\])?", master.strip())
    if found is not None:
        return int(found.group(1) or 1)
    return int(max_failures) if max_failures else 4


def refusal(q: PathQuery) -> str | None:
    """Why `q`, declared real-time, runs micro-batches now (None: it runs in real time)."""
    reasons = [
        (q.proc.realtime is None, "not declared real-time"),
        (q.available_now, "a run to the end of its input (--once)"),
        (q.reader is not None and not q.reader.connector, f"it reads through weir-kafka: {q.reader and q.reader.why}"),
        (q.bounds is not None or q.proc.shadow is not None, "a replay or a shadow"),
        (q.fell_back is not None, f"it fell back: {q.fell_back}"),
    ]
    return next((why for bad, why in reasons if bad), None)


# -- the tail ----------------------------------------------------------------------------------------------
def tail_marks(cp: Checkpoint) -> replay.Marks | None:
    """The tail's marks (None: no real-time run left writes that no commit covers)."""
    found = cp.read_realtime_tail()
    if found is None:
        return None
    raw = found["marks"]
    return {t: {int(p): int(o) for p, o in ps.items()} for t, ps in raw.items()}


def note_tail(cp: Checkpoint, marks: replay.Marks) -> None:
    cp.write_realtime_tail({"marks": {t: {str(p): o for p, o in ps.items()} for t, ps in marks.items()}})


def _position() -> tuple[Column, Column]:
    """(partition, offset) of the input record a row's `source` (`weir.source`: topic/partition/offset) names."""
    parts = F.split(col("source"), "/")
    return F.element_at(parts, -2).cast("int"), F.element_at(parts, -1).cast("long")


def reach(delivered: DataFrame) -> dict[int, int]:
    """Per input partition, the offset after the newest input record behind a row of `delivered` (rows of one
    input topic; one small aggregate: a row per partition)."""
    partition, offset = _position()
    rows = delivered.groupBy(partition.alias("p")).agg(F.max(offset).alias("o")).collect()
    return {int(r["p"]): int(r["o"]) + 1 for r in rows}


def settle(q: PathQuery) -> tuple[DataFrame | None, dict[int, int]]:
    """At a start of real-time processor `q` (any path): what earlier runs delivered past the tail's marks, of
    input records the commits have not passed ((topic, source) rows, cached; None: nothing), and its reach per
    input partition. With nothing to skip, the tail's marks move up to now: nothing of this run is written yet."""
    topics, topic = q.written_topics(), q.proc.inputs[0]
    marks = tail_marks(q.cp)
    done = q.cp.committed_batches()
    committed = read_offsets(q.cp).committed.get(topic, {}) if done else {}
    if marks:
        rows = q.read_since(sorted(marks), marks)
        partition, offset = _position()
        # A partition no commit covers (none yet, or one added since) may be read again from its start
        pending = ~partition.isin(list(committed)) if committed else F.lit(True)
        for p, o in committed.items():
            pending = pending | ((partition == p) & (offset >= o))
        rows = rows.where(col("source").startswith(topic + "/") & pending).select("topic", "source").distinct()
        rows = rows.persist()
        found = rows.count()
        if found:
            log.info("weir: processor %s: %d rows an earlier real-time run wrote past its last commit are not "
                     "written again", q.proc.name, found)  # fmt: skip
            return rows, reach(rows)
        rows.unpersist()
    note_tail(q.cp, replay.take_marks(q.settings.client_config(), topics, timeout=30.0))
    return None, {}


def backlog(sources: list[dict], ends: Ends | None = None) -> int:
    """Records a batch's input held past its start: its sources' `ends` (their latest offsets when Spark planned it,
    by default) less their start offsets (progress figures; a partition without both counts nothing). A partition
    one offset past its start counts nothing either: that offset may be a transaction's commit marker, which no
    reader gets, and an idle real-time batch that read nothing of it is not starved."""
    waiting = 0
    for s in sources:
        start = parsed(s.get("start_offset"))
        latest = parsed(s.get("latest_offset")) if ends is None else ends
        for t, parts in latest.items():
            first = start.get(t)
            if not isinstance(parts, dict) or not isinstance(first, dict):
                continue
            for p, end in parts.items():
                begin = first.get(str(p))
                if isinstance(begin, int) and isinstance(end, int) and end > begin + 1:
                    waiting += end - begin
    return waiting


def starved(processor: str, figures: dict, ends_now: Callable[[], Ends] | None = None) -> str | None:
    """Why `processor` should leave real time after the real-time batch of progress `figures`: it read nothing
    although records waited past its start, when Spark planned it or, by `ends_now` (its inputs' ends read from the
    broker as its progress arrives, just after it ended), when it ended (module doc). None: it runs on."""
    if int(figures.get("input_rows") or 0):
        return None
    sources = figures.get("sources") or []
    waiting, when = backlog(sources), "at its plan"
    if not waiting and ends_now is not None:
        waiting, when = backlog(sources, ends_now()), "by its end"
    if not waiting:
        return None
    batch, took = figures["batch_id"], (figures.get("duration_ms") or {}).get("addBatch")
    log.warning("weir: processor %s real-time batch %d read nothing of %d records waiting past its start, counted "
                "%s (its tasks' stage took %s)", processor, batch, waiting, when,
                "an unknown time" if took is None else f"{took / 1000:.1f} s")  # fmt: skip
    return (
        f"real-time batch {batch} read nothing of a backlog ({waiting:,} records {when}): Spark ends a "
        "real-time batch a checkpoint interval after it plans it, and its tasks began too late (a loaded driver, or "
        "task slots taken)"
    )


class RealTime(Direct):
    """One real-time processor's query: built by `build`, started by `start`, its batches' books by `counts`."""

    def __init__(self, q: PathQuery, delivered: DataFrame | None, reach: dict[int, int]) -> None:
        super().__init__(q)
        self.delivered, self.reach = delivered, reach
        self._dests = sorted({d for r, d in self._combos if d is not None})
        self._taken: tuple[int, replay.Marks] | None = None  # marks taken at a progress: (valid from batch, marks)

    def build(self) -> DataFrame:
        q = self.q
        records = super().build()
        if records is None or not self.has_sources:
            raise RealTimeError(
                f"processor {q.proc.name}: its result keeps no input record behind each row, or reorders rows: a "
                "real-time query could not tell what it wrote before; keep the function a projection or filter"
            )
        self._dests = sorted({d for r, d in self._combos if d is not None})
        if self.delivered is None:
            return records
        seen = self.delivered.select(col("topic").alias("_t_topic"), col("source").alias("_t_source"),
                                     F.lit(True).alias("_t_seen"))  # fmt: skip
        source = routing.header_value(SOURCE_HEADER)
        marked = records.join(F.broadcast(seen), (col("topic") == col("_t_topic")) & (source == col("_t_source")),
                              "left")  # fmt: skip
        skipped = [F.count_if(col("_t_seen").isNotNull() & (col("topic") == d)).alias(d) for d in self._dests]
        marked = marked.observe(f"{SKIPPED}{q.name}", F.lit(0).alias("_none"), *skipped)
        return marked.where(col("_t_seen").isNull()).drop("_t_topic", "_t_source", "_t_seen")

    def start(self, records: DataFrame) -> StreamingQuery:
        q = self.q
        topic = q.topics[q.proc.inputs[0]]
        # one long-running task per input partition for as long as it runs (runner.realtime_master counts them too)
        needed, slots = topic.partitions, q.spark.sparkContext.defaultParallelism
        if slots <= needed:
            raise RealTimeError(
                f"processor {q.proc.name} runs in real time: one long-running task for each of {topic.name}'s "
                f"{needed} partitions, and a slot for the rest; Spark has {slots} task slots (spark_master "
                f"{q.settings.spark_master}): give it more (local[{needed + 2}], or more executor cores)"
            )
        conf = q.spark.sparkContext.getConf()
        attempts = task_attempts(conf.get("spark.master", ""), conf.get("spark.task.maxFailures", None))
        if attempts > 1:
            raise RealTimeError(
                f"processor {q.proc.name} runs in real time, and Spark gives each task {attempts} attempts "
                f"(spark_master {q.settings.spark_master}, spark.task.maxFailures): a retried task would write again "
                "what its first attempt wrote; run it under `weir run` without spark.task.maxFailures in spark_conf "
                "(weir makes it 1: a failed task fails the query, whose next start settles the tail)"
            )
        _, committed = self._logged()
        first = (committed + 1) if committed is not None else 0
        self._origin = self._take()
        if replay.newest_marks(q.cp, first) is None:  # a micro-batch fallback's replay reads back from them
            replay.note_marks(q.cp, q.proc.name, first, self._origin, q.pipeline.name, committed)
        client = {f"kafka.{k}": v for k, v in connector.java_client(q.settings.client_config()).items()}
        every = q.proc.realtime
        assert every is not None
        writer = (
            records.writeStream.format("kafka")
            .queryName(q.name)
            .option("checkpointLocation", q.checkpoint)
            .options(**client)
            # Spark's producer waits 5 ms to fill a batch by default (Kafka 4's linger.ms): not here
            .option("kafka.linger.ms", "0")
            .outputMode("update")
            .trigger(realTime=f"{int(every.total_seconds() * 1000)} milliseconds")
        )
        query = writer.start()
        log.info("weir: processor %s runs in real time (checkpoint every %s)%s", q.proc.name, every,
                 "; rows an earlier run wrote are skipped" if self.delivered is not None else "")  # fmt: skip
        return query

    def fall_back(self, why: str) -> int | None:
        """The query failed: the processor runs micro-batches from the first batch no commit covers; the tail
        keeps what this run wrote from being written again."""
        _, committed = self._logged()
        log.warning("weir: processor %s leaves real time (%s); it runs micro-batches for a while",
                    self.q.proc.name, why)  # fmt: skip
        return (committed + 1) if committed is not None else 0

    def running(self) -> int | None:
        """No batch waits for its commit to end: a real-time batch's writes past a commit are the tail's."""
        return None

    def _input_ends(self) -> Ends:
        """The input's high-water marks now, by partition (driver; a failed look counts as nothing waiting)."""
        q = self.q
        topic = q.topics[q.proc.inputs[0]].name
        try:
            marks = replay.take_marks(q.settings.client_config(), [topic], timeout=10.0)
        except Exception as exc:
            log.warning("weir: processor %s: its input's ends not read (%s)", q.proc.name, exc)
            return {}
        return {t: {str(p): end for p, end in parts.items()} for t, parts in marks.items()}

    # -- the books --------------------------------------------------------------------------------------
    def counts(self, figures: dict, progress: Any) -> Counts:
        """Batch `figures["batch_id"]`'s books: the rows routed and the records the input handed the function
        (Observations) against what Spark's Kafka sink wrote (its numOutputRows) and the rows found in the tail."""
        batch = figures["batch_id"]
        if (why := starved(self.q.proc.name, figures, self._input_ends)) is not None:
            self.starved = why
        observed = {n: row.asDict() for n, row in (getattr(progress, "observedMetrics", None) or {}).items()}
        got, handed = observed.get(f"{ROUTES}{self.q.name}"), observed.get(f"{HANDED}{self.q.name}")
        skipped = {d: int(n) for d, n in observed.get(f"{SKIPPED}{self.q.name}", {}).items() if d != "_none"}
        counts = Counts()
        if got is None or handed is None:
            if int(figures.get("input_rows") or 0):
                log.error("weir: processor %s batch %s: its counts were not observed", self.q.proc.name, batch)
                counts.violations += 1
            counts.passed, counts.has_sources = 0, False
            return counts
        counts = from_routes(routing.observed_groups(got, self._combos))
        # Each output row stands for one input record: a fan-out counts as out (Counts.settle)
        counts.has_sources, counts.passed = False, 0
        counts.handed = int(handed["n"])
        counts.refused = int(got.get("_refused", 0)) if self._routes_own else 0
        counts.replayed = sum(skipped.values())
        sink = getattr(progress, "sink", None)
        written = int(getattr(sink, "numOutputRows", -1)) if sink is not None else -1
        routed = {d: n for d, n in counts.outputs.items() if n}
        if written != sum(routed.values()) - counts.replayed:
            log.error("weir: processor %s batch %s: rows routed %s, records written %d (%d found in the tail)",
                      self.q.proc.name, batch, routed, written, counts.replayed)  # fmt: skip
            counts.violations += 1
        for d, n in skipped.items():
            counts.outputs[d] = counts.outputs.get(d, 0) - n
        self._after(batch, {d: n for d, n in counts.outputs.items() if n}, counts, figures)
        return counts

    def _after(self, batch: int, written_now: dict[str, int], counts: Counts, figures: dict | None = None) -> None:
        """After batch `batch` committed: the completeness check of the direct path, and the tail's marks moved
        up (module docstring) once the commits passed every input record found in the tail."""
        q = self.q
        for t, n in written_now.items():
            self._written[t] = self._written.get(t, 0) + n
        if self.reach and figures is not None:
            ends = completeness.planned_spans(figures["sources"]).get(q.proc.inputs[0], {})
            if all(p in ends and ends[p][1] >= o for p, o in self.reach.items()):
                self.reach = {}
        if self._taken is not None and self._taken[0] <= batch + 1 and not self.reach:
            note_tail(q.cp, self._taken[1])
            self._taken = None
        try:
            marks = self._take()
            _, committed = self._logged()
        except Exception as exc:
            log.warning("weir: processor %s: marks not taken after batch %d (%s)", q.proc.name, batch, exc)
            return
        if committed is not None and committed <= batch and self._taken is None:
            self._taken = (batch + 2, marks)
        for gap in completeness.check_writes(self._origin, marks, self._written):
            short = gap.records - self._short.get(gap.topic, 0)
            if short > 0:
                self._short[gap.topic] = gap.records
                log.error("weir: processor %s batch %d: %s", q.proc.name, batch, gap.describe())
                counts.gaps.append(gap.to_json() | {"batch": batch})
                counts.violations += 1
