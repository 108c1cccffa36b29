"""A stateful processor's backfill (windows, sessions, dedup, a join): its state rebuilt from the lake, and only
the range's outputs delivered.

The processor's own streaming query runs again, from a checkpoint of its own, over a bounded replay of its
inputs (Trigger.AvailableNow): from early enough before the range that its state is whole when the range
begins (its blocks' horizon: a window's size, a session's gap, a dedup horizon, each plus the watermark; a
join's table from its beginning), to late enough after it that the range's windows close. Offsets the lake
holds are read from the lake, whatever the broker still has. A result belongs to the range when it is a window
or session that overlaps it (by event time), or a row of an input record in it (late, dead letter, joined,
first of its key). Into the processor's own topics only what they lack is written: a window by (key, window),
a row of an input record by that record.

Keyed state of one's own (`@stateful`) may depend on every record of its key, so no horizon bounds it: a version's
repair replays from where the processor's state began (the first offset it processed, per partition), warming the
state up to the version's first offsets without delivering, then delivers what the version's offsets make and the
topics lack (a row without an input record by its key and value). docs/backfill.md, "Stateful processors".
"""

from __future__ import annotations

import functools
import json
import logging
import operator
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pyspark.sql import Window
from pyspark.sql import functions as F

from weir.backfill.plan import BackfillError, epoch_micros
from weir.blocks.common import settings_noted
from weir.blocks.window import interval_ms
from weir.checkpoint.audit import audit
from weir.checkpoint.files import Checkpoint, processor_checkpoint
from weir.checkpoint.offsets import Positions
from weir.kafka.headers import BACKFILL_HEADER, PROCESSOR_HEADER
from weir.kafka.replay import take_marks
from weir.pipeline.model import Table
from weir.pipeline.routes import ABSORBED, EMIT, ROUTE
from weir.runtime.accounting import Counts, from_routes
from weir.runtime.query import Bounds, Ledger, ProcessorQuery
from weir.runtime.routing import header_value
from weir.storage import paths

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from weir.backfill.target import Target
    from weir.config import Settings
    from weir.pipeline.model import Pipeline

log = logging.getLogger("weir.backfill")
WINDOW = ("window_start", "window_end")
STALLED_S = 600.0  # a replay whose query makes no batch for this long is stopped, loudly
NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"


@dataclass(frozen=True)
class Horizon:
    """How far around the range a stateful processor's replay reads (record time), from its blocks' settings."""

    before_ms: int  # before the range: state whole at its start
    after_ms: int  # after it: the range's windows closed by the watermark
    keys: tuple[str, ...]  # the blocks' key columns: a window's identity with its bounds
    notes: tuple[str, ...] = ()
    # Keyed state no bounded replay rebuilds (`@stateful`): the replay reads from where the state began, and only
    # a version's offsets can be repaired (a time range's edges cut keys' histories); the blocks' names
    from_start: tuple[str, ...] = ()
    changelog: tuple[str, ...] = ()  # running aggregates: a replay's rows differ from streaming's by batch cuts


def horizon(blocks: list[dict[str, str]]) -> Horizon:
    """The horizon of a processor whose blocks noted these settings (weir.blocks.common.settle)."""
    before = after = 0
    keys, notes, from_start, changelog = [], [], [], []
    for b in blocks:
        kind = b.get("block", "")
        wm = interval_ms(b["watermark"], kind) if b.get("watermark") else 0
        if kind in ("tumbling_window", "sliding_window"):
            size = interval_ms(b["size"], kind)
            # allowed lateness: the range's windows still take records (updates) that long after they close
            lateness = interval_ms(b["allowed_lateness"], kind) if b.get("allowed_lateness") else 0
            before, after = max(before, size + wm), max(after, size + wm + lateness)
        elif kind == "session_window":
            gap = interval_ms(b["gap"], kind)
            before, after = max(before, gap + wm), max(after, gap + wm)
            notes.append(
                f"sessions are rebuilt from {gap + wm} ms before the range: a session whose records began earlier "
                f"than that, with no gap since, starts later in the backfill than it did when streamed"
            )
        elif kind == "join_streams":
            # A left record of the range pairs with right records from `before` before it to `after` after it,
            # and a left join's unmatched record closes once the watermark passes its time + `after`.
            span_before, span_after = interval_ms(b["before"], kind), interval_ms(b["after"], kind)
            before, after = max(before, span_before + wm), max(after, span_after + wm)
        elif kind == "deduplicate":
            before, after = max(before, interval_ms(b["horizon"], kind) + wm), max(after, wm)
        elif kind == "running_aggregate":
            # Its rows are totals over every record of their key since the state began: rebuilt from where it
            # began. Each row is the key's total at the end of a micro-batch, and a replay cuts other batches
            # than streaming did: its rows differ from those delivered, so they go to another target only.
            from_start.append(f"a running aggregate (key {b.get('key')!r})")
            changelog.append(f"the running aggregate (key {b.get('key')!r})")
        elif kind == "stateful":
            # The function's state may hold anything from any record of its key: it is rebuilt from where it began
            from_start.append(f"@stateful {b.get('name')!r} (key {b.get('key')!r})")
            notes.append(
                f"the keyed state of @stateful {b.get('name')!r} is rebuilt from the first offset the processor "
                "processed: the replay reads its inputs from there, and delivers only what the version's offsets make"
            )
        if b.get("key"):
            keys.append(b["key"])
    return Horizon(before, after, tuple(dict.fromkeys(keys)), tuple(notes), tuple(from_start), tuple(changelog))


def refuse(h: Horizon, pipeline: str, processor: str, version: str | None, own_topics: bool) -> None:
    """Keyed state that began before a backfill's offsets: a BackfillError naming the command that repairs, for a
    time range (its edges cut keys' histories: only a version's offsets are repaired) and for a running aggregate
    into its own topics (the replay's totals are of other batches than those delivered)."""
    if not h.from_start:
        return
    held = ", ".join(h.from_start)
    into = " --into <topic, parquet:path or postgres:table>" if h.changelog else ""
    if version is None:
        raise BackfillError(
            f"processor {processor} holds the keyed state of {held}, which may depend on every record of its key "
            f"since the state began: a time range cannot be backfilled. Repair the offsets a bad release processed "
            f"with `weir backfill {pipeline} {processor} --version <V>{into}` (its state rebuilt from the processor's "
            f"first offset; `weir audit {pipeline}` lists each version's offsets)"
            + (
                ""
                if h.changelog
                else f", or rebuild everything with `weir run {pipeline} --reset {processor}`; "
                "both write only what its topics lack"
            )
            + " (docs/releases.md)"
        )
    if h.changelog and own_topics:
        raise BackfillError(
            f"processor {processor} holds {', '.join(h.changelog)}: each of its rows is a key's total at the end of "
            f"a micro-batch, and a replay cuts other micro-batches than streaming did, so its rows would reach the "
            f"processor's own topics beside those delivered. Write version {version}'s corrected rows elsewhere: "
            f"`weir backfill {pipeline} {processor} --version {version}{into}` (docs/releases.md)"
        )


def replay_span(t1: datetime, t2: datetime, h: Horizon) -> tuple[datetime, datetime]:
    """The record times a replay reads: the range widened by the horizon."""
    return t1 - timedelta(milliseconds=h.before_ms), t2 + timedelta(milliseconds=h.after_ms)


@dataclass
class Replay:
    """The offsets a stateful backfill replays, found in the lake: where each input starts and ends, below what
    it reads from the lake, the range's own offsets (its input records), and the records per partition."""

    bounds: Bounds
    ranges: dict[str, dict[int, list[tuple[int, int]]]]
    read: dict[str, dict[int, int]]
    event_range: tuple[int, int] | None = None  # --version: its records' first and last record time, micros
    warm: Positions | None = None  # keyed state from its start: the replay delivers nothing below these


class StatefulRun:
    """One stateful backfill's execution: the processor's streaming query over a bounded replay. `report` is the
    backfill's BackfillReport (weir.backfill.run, which imports this module)."""

    def __init__(
        self, spark: SparkSession, p: Pipeline, target: Target, report: Any, settings: Settings,
        files: Any, live: Checkpoint,
    ) -> None:  # fmt: skip
        self.spark, self.p, self.target, self.report, self.settings = spark, p, target, report, settings
        self.files = files  # (topic, [LakeFile]) -> DataFrame of the stream's columns (_Run._files)
        # The replay's own checkpoint, in the history of the processor's (`live`): a new one per run
        self.replay = live.backfill_replay(report.id)
        self.checkpoint = self.replay.url

    def run(self, rescan: Any) -> Counts:
        """Trace the processor (its blocks' settings give the horizon), find the replay's offsets in the lake
        (`rescan(horizon)` lists the files of the replay's hours into the report), replay, deliver the range's
        rows; the replay's books (every record it read, by route) with the delivered rows per destination."""
        proc = self.target.proc
        effective = replace(self.p, topics=self.target.topics, processors={**self.p.processors, proc.name: proc})
        name = f"backfill.{self.p.name}.{proc.name}"
        traced = ProcessorQuery(
            self.spark, effective, proc, self.settings, Ledger(), checkpoint=self.checkpoint, name=name
        )
        with settings_noted() as blocks:
            names = traced.trace()
        names = names.columns if not isinstance(names, dict) else next(iter(names.values())).columns
        h = horizon(list(blocks))
        self.report.notes.extend(n for n in h.notes if n not in self.report.notes)
        rescan(h)
        replay = self.offsets(h)
        written = [*self.target.output_topics, *(f"{t}.dlq" for t in proc.inputs), *(f"{t}.late" for t in proc.inputs)]
        # The replay's query: its sources bounded by the offsets the trace's horizon gave
        query = ProcessorQuery(
            self.spark, effective, proc, self.settings, Ledger(), checkpoint=self.checkpoint, name=name,
            stamp={BACKFILL_HEADER: self.report.id}, bounds=replay.bounds, delivered=written,
        )  # fmt: skip
        windows = self.delivered_windows(h, names)
        belongs = self.belongs(replay, names)
        total = Counts()
        ran: list[int] = []  # the batches delivered
        if self.target.sink is not None:
            self.target.sink.open(f"{self.report.id}-replay")

        warming = [replay.warm is not None]  # keyed state from its start: below the version, nothing delivered

        def each(batch: DataFrame, batch_id: int) -> None:
            # Cached: the stateful operator runs once per batch, for its books and for the range's delivery
            batch = batch.persist()
            try:
                books = self.books(batch)
                if warming[0]:
                    total.add(books)
                    ran.append(batch_id)
                    return
                frame = batch.where(belongs)
                if windows is not None:
                    frame = self.without_delivered(frame, windows, h)
                delivered = query.deliver_result(frame, batch_id)
            finally:
                batch.unpersist()
            # The books are the whole batch's (every record the replay read has its one route); what reached the
            # target is the range's
            books.outputs, books.replayed = delivered.outputs, delivered.replayed
            total.add(books)
            ran.append(batch_id)

        def replay_to(q: ProcessorQuery, trailing: bool = True) -> dict[int, int]:
            stream = q.streaming_result()
            writer = (
                stream.writeStream.queryName(q.name).option("checkpointLocation", paths.spark_url(self.checkpoint))
                .foreachBatch(each).trigger(availableNow=True)
            )  # fmt: skip
            # Without `trailing`, no batch without data after the last: a timer the watermark passes there fires in
            # the next run's first batch instead, as it fired in the version's first batch when streamed. A query
            # takes the session's settings when it starts.
            before = self.spark.conf.get(NO_DATA_BATCHES, "true")
            self.spark.conf.set(NO_DATA_BATCHES, str(trailing).lower())
            try:
                running = writer.start()
            finally:
                self.spark.conf.set(NO_DATA_BATCHES, before)
            return self._wait(running)

        try:
            inputs: dict[int, int] = {}
            if replay.warm is not None:
                # Two runs of one query (one checkpoint, so one state): up to the version's first offsets, then on
                # to its last; the batches of the second begin where the version began
                b = replay.bounds
                if any(replay.warm[t][p] > s for t, ps in b.start.items() if t in replay.warm for p, s in ps.items()):
                    warm = {t: replay.warm.get(t, b.end[t]) for t in b.end}
                    until = {t: {p: min(u, warm[t][p]) for p, u in ps.items()} for t, ps in b.lake_until.items()}
                    # its own query, bounded below the version (a query's bounds are given, never set after);
                    # it delivers nothing, so it reads nothing of what was delivered
                    warming_query = ProcessorQuery(
                        self.spark, effective, proc, self.settings, Ledger(), checkpoint=self.checkpoint, name=name,
                        stamp={BACKFILL_HEADER: self.report.id}, bounds=Bounds(b.start, warm, until),
                    )  # fmt: skip
                    inputs |= replay_to(warming_query, trailing=False)
                warming[0] = False
            inputs |= replay_to(query)
        finally:
            query.delivered.unpersist()
            if windows is not None:
                windows.unpersist()
            self._drop_checkpoint()
        self.report.read = replay.read
        self.report.ranges = self.report.ranges or replay.ranges
        total.in_ = sum(inputs.values())  # Spark's own count of the records the replay read
        unseen = sorted(set(ran) - set(inputs))
        if unseen:  # more batches than Spark keeps progress of between two looks: no count of their input
            self.report.notes.append(f"the replay's batches {unseen} left no progress: its books are incomplete")
        elif not total.balanced:
            total.violations += 1
            log.error("weir backfill %s: the replay does not balance: %s", self.report.id, total.to_json())
        return total

    @staticmethod
    def books(batch: DataFrame) -> Counts:
        """A replayed batch's routes counted (one small job over the cached batch): its records absorbed, late,
        dead-lettered, duplicates, first of their key, and the results emitted."""
        absorbed = F.col(ABSORBED).cast("long") if ABSORBED in batch.columns else F.lit(0).cast("long")
        rows = batch.groupBy(ROUTE).agg(F.count("*").alias("n"), F.coalesce(F.sum(absorbed), F.lit(0)).alias("a"))
        return from_routes([(r[ROUTE], None, r["n"], r["a"]) for r in rows.collect()])

    # -- the replay's offsets -----------------------------------------------------------------------------
    def offsets(self, h: Horizon) -> Replay:
        """Per partition of each input: where the replay starts (the first record at or after the replay's start
        time, from the lake; a version's first offset if earlier), where it ends (past the last record before
        the replay's end time and past the first at or after it; the broker's end where the lake's newest record
        is older than that, or where the lake lacks the partition; a version's last offset if later), and below
        what it reads from the lake (its newest offset + 1). A join's table is replayed from the lake's first
        offset (or the broker's earliest). Small jobs over three columns of the replay hours' files."""
        report = self.report
        inputs = [t for t in self.target.proc.inputs if not isinstance(self.p.topics.get(t), Table)]
        tables = [t for t in self.target.proc.inputs if t not in inputs]
        broker = take_marks(self.settings.client_config(), list(self.target.proc.inputs), timeout=self._wait_s)
        lake = {t: self._lake_last(t) for t in self.target.proc.inputs}
        event_range = None
        if report.version is not None:
            event_range = self._version_times(lake)
            t1 = datetime.fromtimestamp(event_range[0] / 1e6, tz=UTC)
            t2 = datetime.fromtimestamp((event_range[1] + 1) / 1e6, tz=UTC)
        else:
            t1, t2 = report.start, report.end
        if h.from_start:
            own = self.target.proc is self.p.processors.get(self.target.proc.name)  # no --into: its own target
            refuse(h, self.p.name, self.target.proc.name, report.version, own)
            if event_range is None:
                raise AssertionError("refuse() refuses a time range of keyed state")
            return self._from_start(inputs, tables, broker, lake, event_range)
        lo, hi = replay_span(t1, t2, h)
        start: Positions = {}
        end: Positions = {}
        lake_until: Positions = {}
        ranges: dict[str, dict[int, list[tuple[int, int]]]] = {}
        for topic in inputs:
            found = self._lake_span(topic, lo, hi, t1, t2)
            for p, top in broker.get(topic, {}).items():
                s, e, r = found.get(p, (None, None, None))
                newest = lake.get(topic, {}).get(p)
                # The broker holds what the lake does not yet: read on to its end, unless a version's own offsets
                # are all that is needed (no window to close after them)
                lacking = newest is None or newest[1] < epoch_micros(hi)
                if lacking and not (report.version is not None and h.after_ms == 0):
                    e = top if s is not None or report.version is not None else None
                wanted = report.ranges.get(topic, {}).get(p) if report.version is not None else None
                if wanted:
                    s = min(s, wanted[0][0]) if s is not None else wanted[0][0]
                    e = max(e or 0, wanted[-1][1])
                if s is None or e is None or e <= s:
                    continue
                start.setdefault(topic, {})[p], end.setdefault(topic, {})[p] = s, e
                if newest is not None:
                    lake_until.setdefault(topic, {})[p] = min(newest[0] + 1, e)
                if r is not None:
                    ranges.setdefault(topic, {})[p] = r
        _whole(tables, broker, lake, start, end, lake_until)
        if not start:
            raise BackfillError(f"neither the lake nor the broker holds a record of {', '.join(inputs)} to replay")
        if report.version is not None:
            ranges = report.ranges  # the version's own offsets, exactly
        replayed = {t: {p: end[t][p] - s for p, s in parts.items()} for t, parts in start.items()}
        return Replay(Bounds(start, end, lake_until), ranges, replayed, event_range)

    _wait_s = 30.0  # for the broker's ends

    def _from_start(
        self, inputs: list[str], tables: list[str], broker: Positions, lake: dict, event_range: tuple[int, int]
    ) -> Replay:
        """A version's replay for keyed state that may depend on every record of its key: per partition, from the
        first offset the processor processed (where its state began, over every run: `weir audit`), warming up
        to the version's first offset and delivering to its last. A partition the version read nothing of is
        cut, both times, at its first record at or after the version's first record time (from the lake)."""
        report, proc = self.report, self.target.proc
        began = state_began(self.settings, proc.name, proc.checkpoint)
        start: Positions = {}
        end: Positions = {}
        warm: Positions = {}
        lake_until: Positions = {}
        for topic in inputs:
            spans = report.ranges.get(topic, {})
            cut: dict[int, int] | None = None
            for p, top in broker.get(topic, {}).items():
                s = began.get((topic, p))
                newest = lake.get(topic, {}).get(p)
                if s is None:  # never read by the processor: nothing of it is in its state
                    continue
                if spans.get(p):
                    w, e = spans[p][0][0], spans[p][-1][1]
                else:
                    cut = self._cuts(topic, event_range[0]) if cut is None else cut
                    w = e = cut.get(p, newest[0] + 1 if newest is not None else s)
                    if p not in cut:
                        report.notes.append(f"{topic} partition {p}: version {report.version} read none of it and "
                                            f"the lake holds no record of it from that version's time on: its replay "
                                            f"ends at offset {w}")  # fmt: skip
                w, e = max(w, s), min(max(e, s), top)
                start.setdefault(topic, {})[p], warm.setdefault(topic, {})[p] = s, min(w, e)
                end.setdefault(topic, {})[p] = e
                if newest is not None:
                    lake_until.setdefault(topic, {})[p] = min(newest[0] + 1, e)
        _whole(tables, broker, lake, start, end, lake_until)
        if not start:
            raise BackfillError(f"processor {proc.name} processed no offset of {', '.join(inputs)} its checkpoint "
                                "records: no state to rebuild")  # fmt: skip
        replayed = {t: {p: end[t][p] - s for p, s in parts.items()} for t, parts in start.items()}
        return Replay(Bounds(start, end, lake_until), report.ranges, replayed, event_range, warm)

    def _cuts(self, topic: str, micros: int) -> dict[int, int]:
        """Per partition of the lake's files of `topic`: its first offset whose record time is at or after
        `micros`."""
        scan = self.report.topics.get(topic)
        if scan is None or not scan.files:
            return {}
        ts = F.unix_micros(F.col("timestamp"))
        rows = (
            self.files(topic, scan.files).groupBy("partition")
            .agg(F.min(F.when(ts >= F.lit(micros), F.col("offset"))).alias("o")).collect()
        )  # fmt: skip
        return {int(r["partition"]): int(r["o"]) for r in rows if r["o"] is not None}

    def _lake_last(self, topic: str) -> dict[int, tuple[int, int, int]]:
        """Per partition of the replay hours' lake files of `topic`: (its newest offset, its newest record time
        in micros, its first offset)."""
        scan = self.report.topics.get(topic)
        if scan is None or not scan.files:
            return {}
        rows = (
            self.files(topic, scan.files).groupBy("partition")
            .agg(F.max("offset").alias("o"), F.max(F.unix_micros("timestamp")).alias("t"), F.min("offset").alias("f"))
            .collect()
        )  # fmt: skip
        return {int(r["partition"]): (int(r["o"]), int(r["t"]), int(r["f"])) for r in rows if r["o"] is not None}

    def _lake_span(
        self, topic: str, lo: datetime, hi: datetime, t1: datetime, t2: datetime
    ) -> dict[int, tuple[int | None, int | None, list[tuple[int, int]] | None]]:
        """Per partition, from the lake: the first offset at or after `lo`; the end past the last record before
        `hi` and past the first at or after it; and the offset runs of the range [t1, t2)'s records."""
        scan = self.report.topics.get(topic)
        if scan is None or not scan.files:
            return {}
        us = lambda t: F.lit(epoch_micros(t))  # noqa: E731
        ts = F.unix_micros(F.col("timestamp"))
        inside = (ts >= us(t1)) & (ts < us(t2))
        rows = (
            self.files(topic, scan.files).groupBy("partition")
            .agg(
                F.min(F.when(ts >= us(lo), F.col("offset"))).alias("start"),
                F.max(F.when(ts < us(hi), F.col("offset"))).alias("last"),
                F.min(F.when(ts >= us(hi), F.col("offset"))).alias("past"),
                F.min(F.when(inside, F.col("offset"))).alias("rlo"),
                F.max(F.when(inside, F.col("offset"))).alias("rhi"),
                F.count_if(inside).alias("n"),
            )
            .collect()
        )  # fmt: skip
        out = {}
        broken = {}  # partitions whose range records are not all the records between its first and last
        for r in rows:
            span = None if r["rlo"] is None else [(int(r["rlo"]), int(r["rhi"]) + 1)]
            if span is not None and span[0][1] - span[0][0] != r["n"]:
                broken[int(r["partition"])] = span
            first = None if r["start"] is None else int(r["start"])
            # One record at or past `hi` too: the watermark passes `hi` less its delay only on a record that late,
            # and a left join's record of the range's last instants closes only then (lts + after < watermark)
            ends = [int(x) + 1 for x in (r["last"], r["past"]) if x is not None]
            out[int(r["partition"])] = (first, max(ends) if ends else None, span)
        if broken:
            for p, runs in self._runs(topic, broken, inside).items():
                out[p] = (*out[p][:2], runs)
        return out

    def _runs(self, topic: str, spans: dict[int, list[tuple[int, int]]], inside: Column) -> dict:
        """The runs of consecutive records (by offset) of the range in these spans, per partition: a partition
        out of order by record time holds records outside the range between those of it, which are not the
        range's (a small job over the spans' records)."""
        scan = self.report.topics[topic]
        by_offset = Window.partitionBy("partition").orderBy("offset")
        by_side = Window.partitionBy("partition", "_in").orderBy("offset")
        rows = (
            self.files(topic, scan.files).where(within(spans)).select("partition", "offset", inside.alias("_in"))
            # gaps and islands: within a run of the range's records both row numbers grow together
            .select("partition", "offset", "_in", (F.row_number().over(by_offset) - F.row_number().over(by_side))
                    .alias("_run"))
            .where("_in").groupBy("partition", "_run").agg(F.min("offset").alias("lo"), F.max("offset").alias("hi"))
            .collect()
        )  # fmt: skip
        runs: dict[int, list[tuple[int, int]]] = {}
        for r in rows:
            runs.setdefault(int(r["partition"]), []).append((int(r["lo"]), int(r["hi"]) + 1))
        return {p: sorted(rs) for p, rs in runs.items()}

    def _version_times(self, lake: dict[str, dict[int, tuple[int, int, int]]]) -> tuple[int, int]:
        """The first and last record time (micros) of the records in the version's offsets: from the lake's
        files, and from the broker for offsets above the lake's newest."""
        found = []
        for topic, spans in self.report.ranges.items():
            scan = self.report.topics.get(topic)
            if scan is not None and scan.files:
                found.append(self.files(topic, scan.files).where(within(spans)))
            newest = lake.get(topic, {})
            above = {p: (max(rs[0][0], newest[p][0] + 1) if p in newest else rs[0][0], rs[-1][1])
                     for p, rs in spans.items()}  # fmt: skip
            above = {p: (s, e) for p, (s, e) in above.items() if e > s}
            if above:
                reader = (
                    self.spark.read.format("weir-kafka").options(**self.settings.kafka_options())
                    .option("subscribe", topic)
                    .option("startingOffsets", json.dumps({topic: {str(p): s for p, (s, _) in above.items()}}))
                    .option("endingOffsets", json.dumps({topic: {str(p): e for p, (_, e) in above.items()}}))
                )  # fmt: skip
                found.append(reader.load().where(within({p: [r] for p, r in above.items()})))
        micros = F.unix_micros("timestamp")
        times = [
            r for f in found for r in f.agg(F.min(micros).alias("a"), F.max(micros).alias("b")).collect()
            if r["a"] is not None
        ]  # fmt: skip
        if not times:
            raise BackfillError(f"neither the lake nor the broker holds the offsets version {self.report.version} "
                                "processed")  # fmt: skip
        return min(r["a"] for r in times), max(r["b"] for r in times)

    # -- what belongs to the range --------------------------------------------------------------------------
    def belongs(self, replay: Replay, names: list[str]) -> Column:
        """Rows of the range: a window or session overlapping it by event time; a row of an input record in it
        (by offset; a stream-stream join's pair by its left record); nothing else (absorbed and filtered rows are
        counted by the blocks, not delivered)."""
        report = self.report
        if replay.event_range is not None:
            t1, t2 = replay.event_range[0], replay.event_range[1] + 1
        else:
            t1, t2 = epoch_micros(report.start), epoch_micros(report.end)
        # A result of no input record (a window); a stream-stream join's pairs carry their left record
        emitted = (F.col(ROUTE) == EMIT) & F.col("offset").isNull() if "offset" in names else F.col(ROUTE) == EMIT
        if all(w in names for w in WINDOW):
            overlap = (F.unix_micros(F.col("window_end")) > F.lit(t1)) & (
                F.unix_micros(F.col("window_start")) < F.lit(t2)
            )
            windows = emitted & overlap
        else:
            windows = emitted
        # By offset: the version's exactly, a time range's as the offset runs of its records per partition
        # (results carry their input record's coordinates, not its time; `_lake_span`)
        by_record = F.lit(False)
        for topic, spans in replay.ranges.items():
            by_record = by_record | ((F.col("topic") == topic) & within(spans))
        sourced = F.col("offset").isNotNull() & F.col(ROUTE).isin("out", "late", "dlq", EMIT) & by_record
        return F.coalesce(windows | sourced, F.lit(False))

    # -- what the target holds already ----------------------------------------------------------------------
    def delivered_windows(self, h: Horizon, names: list[str]) -> DataFrame | None:
        """(key, window_start, window_end) of the windows the target's topic holds from this processor (any
        run of it, backfills included), when its records are windows with one key column; None otherwise."""
        if len(self.target.output_topics) != 1 or len(h.keys) != 1:
            return None
        topic = self.target.topics[self.target.output_topics[0]]
        fields = topic.fields()
        key = h.keys[0]
        if not all(c in fields and c in names for c in (*WINDOW, key)):
            return None
        reader = (
            self.spark.read.format("weir-kafka").options(**self.settings.kafka_options())
            .option("subscribe", topic.name).option("startingOffsets", "earliest")
            .options(**topic.reader_options(self.settings.registry_conf()))
        )  # fmt: skip
        mine = header_value(PROCESSOR_HEADER) == F.lit(self.target.proc.name)
        return (
            reader.load().where(mine)
            .select(F.col(key).cast("string").alias("_w_key"), *[F.col(w).alias(f"_w_{w}") for w in WINDOW])
            .distinct().persist()
        )  # fmt: skip

    def without_delivered(self, frame: DataFrame, windows: DataFrame, h: Horizon) -> DataFrame:
        """`frame` without the windows the target holds already (by key and window): a window streaming
        delivered stays as delivered, even if this run computes it otherwise (docs/backfill.md)."""
        key = h.keys[0]
        match = (
            (F.col(key).cast("string") == F.col("_w_key"))
            & (F.col("window_start") == F.col("_w_window_start"))
            & (F.col("window_end") == F.col("_w_window_end"))
        )
        emitted = frame.where(F.col(ROUTE) == EMIT).join(windows, match, "left_anti")
        return emitted.unionByName(frame.where(F.col(ROUTE) != EMIT))

    # -- running ----------------------------------------------------------------------------------------------
    def _wait(self, running: Any) -> dict[int, int]:
        """Until the replay's query ends; a query without a new batch for STALLED_S is stopped and named. The
        records each batch read (numInputRows), from the progress Spark keeps of its recent batches."""
        seen, since = None, time.monotonic()
        inputs: dict[int, int] = {}

        def note() -> None:
            for p in running.recentProgress:
                inputs[int(p["batchId"])] = int(p["numInputRows"])

        while not running.awaitTermination(5):
            note()
            progress = running.lastProgress
            batch = progress["batchId"] if progress else None
            if batch != seen:
                seen, since = batch, time.monotonic()
            elif time.monotonic() - since > STALLED_S:
                running.stop()
                raise BackfillError(
                    f"backfill {self.report.id}: its replay made no batch for {STALLED_S:.0f} s (last batch {seen}); "
                    f"stopped"
                )
        if running.exception() is not None:
            raise running.exception()
        note()
        return inputs

    def _drop_checkpoint(self) -> None:
        """The replay's checkpoint is of no use after it: a rerun replays from the lake again."""
        self.replay.discard()


def _whole(
    tables: list[str], broker: Positions, lake: dict, start: Positions, end: Positions, until: Positions
) -> None:
    """A join's tables in a replay: the whole changelog, from the lake's first offset where it has one."""
    for topic in tables:
        for p, top in broker.get(topic, {}).items():
            first = lake.get(topic, {}).get(p)
            if first is not None:
                start.setdefault(topic, {})[p] = first[2]
                until.setdefault(topic, {})[p] = first[0] + 1
                end.setdefault(topic, {})[p] = top


def state_began(settings: Settings, processor: str, checkpoint: str) -> dict[tuple[str, int], int]:
    """Per input partition, the first offset the processor processed over every run its checkpoint and history
    record (resets included): where its state began."""
    found = audit(processor, processor_checkpoint(settings.checkpoint_root, checkpoint))
    began: dict[tuple[str, int], int] = {}
    for epoch in found.epochs:
        for tp, ranges in epoch.processed.items():
            if ranges:
                began[tp] = min(began.get(tp, ranges[0][0]), *(s for s, _ in ranges))
    return began


def within(ranges: dict[int, list[tuple[int, int]]]) -> Column:
    """Rows whose (partition, offset) lies in `ranges`."""
    found = F.lit(False)
    for partition, spans in ranges.items():
        offset = F.col("offset")
        inside = functools.reduce(operator.or_, [(offset >= s) & (offset < e) for s, e in spans], F.lit(False))
        found = found | ((F.col("partition") == partition) & inside)
    return found
