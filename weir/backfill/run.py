"""`backfill`: a stateless processor's own function over a time range of its inputs' archive in the lake.

    report = backfill("shop.py", "total", "2026-11-20T14:00", "2026-11-20T17:00")
    report = backfill(pipeline, "total", start, end, into="parquet:/data/totals", dry_run=True)

Checks the processor, the range and the lake, plans one chunk per UTC hour, and hands each chunk to
`ProcessorQuery.run_batch`, the code a streaming micro-batch runs. The contract (what runs, identities and
dedup, reruns, boundaries, refusals): docs/backfill.md.
"""

from __future__ import annotations

import functools
import json
import logging
import operator
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pyspark.sql import Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from weir.backfill import stateful
from weir.backfill.plan import (
    BackfillError,
    Chunk,
    backfill_id,
    check_range,
    chunks,
    epoch_micros,
    hour_index,
    hour_start,
    iso,
    parse_time,
    writer_name,
)
from weir.backfill.scan import TopicScan, chunk_rows, scan_offsets, scan_topic, span
from weir.backfill.target import Target, resolve
from weir.checkpoint.audit import Backfilled, audit, spans_text
from weir.checkpoint.files import processor_checkpoint
from weir.config import Settings, load
from weir.kafka.admin import Admin
from weir.kafka.headers import BACKFILL_HEADER
from weir.kafka.options import parse_source
from weir.kafka.source import KAFKA_COLUMNS, value_ddl
from weir.pipeline import validate
from weir.pipeline.load import load as load_pipeline
from weir.pipeline.model import Pipeline, Processor, Table
from weir.runtime import versions
from weir.runtime.accounting import Counts
from weir.runtime.progress import now_iso
from weir.runtime.query import Ledger, ProcessorQuery, union
from weir.runtime.runner import SIDE_TOPIC_CONFIG
from weir.sinks.delta_read import DeltaDataSource
from weir.spark import register_source, spark_session
from weir.storage.lake import Lake

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from weir.sinks.base import Sink

log = logging.getLogger("weir.backfill")


@dataclass
class ChunkPlan:
    chunk: Chunk
    files: int
    rows: int  # in the hour's files: exact for a whole hour, an upper bound for a partial one

    def to_json(self) -> dict[str, Any]:
        c = self.chunk
        return {"batch_id": c.batch_id, "from": iso(c.start), "to": iso(c.end), "files": self.files, "rows": self.rows}


@dataclass
class BackfillReport:
    """The plan, and after a run what happened: every input row is in exactly one of out, filtered,
    dead-lettered (the books balance when `unaccounted` is 0)."""

    id: str
    pipeline: str
    processor: str
    start: datetime
    end: datetime
    target: str
    dry_run: bool
    plan: list[ChunkPlan] = field(default_factory=list)
    topics: dict[str, TopicScan] = field(default_factory=dict)
    read: dict[str, dict[int, int]] = field(default_factory=dict)  # input topic -> Kafka partition -> rows
    written: dict[str, int] = field(default_factory=dict)  # destination topic or sink -> rows this run wrote
    dead_lettered: dict[str, int] = field(default_factory=dict)  # <input>.dlq -> records
    counts: Counts = field(default_factory=Counts)
    chunks_run: int = 0
    chunks_empty: int = 0  # chunks without files or without a row in the exact range: no batch ran
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    version: str | None = None  # `--version`: the code version whose input offsets are replayed
    ranges: dict[str, dict[int, list[tuple[int, int]]]] = field(default_factory=dict)  # its [start, end) offsets
    stateful: bool = False  # a replay of the processor's streaming query (weir.backfill.stateful), not chunks

    @property
    def files(self) -> int:
        return sum(c.files for c in self.plan)

    @property
    def file_rows(self) -> int:
        return sum(c.rows for c in self.plan)

    @property
    def exact(self) -> bool:
        """Whether `file_rows` is exactly the rows in the range (no partial boundary hour with files)."""
        return all(c.chunk.whole_hour or c.files == 0 for c in self.plan)

    @property
    def rows_read(self) -> int:
        return sum(n for parts in self.read.values() for n in parts.values())

    @property
    def filtered(self) -> int:
        return self.counts.filtered

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pipeline": self.pipeline,
            "processor": self.processor,
            "from": iso(self.start),
            "to": iso(self.end),
            "target": self.target,
            "dry_run": self.dry_run,
            "chunks": [c.to_json() for c in self.plan],
            "files": self.files,
            "file_rows": self.file_rows,
            "file_rows_exact": self.exact,
            "lake": {t: {"files": len(s.files), "rows": s.rows, "holds": span(s)} for t, s in self.topics.items()},
            "read": {t: {str(p): n for p, n in sorted(ps.items())} for t, ps in self.read.items()},
            "written": self.written,
            "dead_lettered": self.dead_lettered,
            "accounting": self.counts.to_json(),
            "chunks_run": self.chunks_run,
            "chunks_empty": self.chunks_empty,
            "seconds": round(self.seconds, 3),
            "notes": self.notes,
            "version": self.version,
            "ranges": {
                t: {str(p): [list(r) for r in rs] for p, rs in sorted(ps.items())} for t, ps in self.ranges.items()
            },
        }


def find_processor(pipeline: Pipeline, name: str) -> Processor:
    """The processor to backfill, or a BackfillError saying why it cannot be."""
    proc = pipeline.processors.get(name)
    if proc is None:
        known = ", ".join(sorted(pipeline.processors)) or "none"
        raise BackfillError(f"pipeline {pipeline.name} has no processor {name!r} (its processors: {known})")
    if proc.kind == "source":
        raise BackfillError(
            f"processor {name} is a source processor: it has no input topics whose archive could be replayed"
        )
    return proc


def _pipeline(spec: Pipeline | str) -> Pipeline:

    if isinstance(spec, Pipeline):
        return validate(spec)

    return validate(load_pipeline(spec))


@dataclass
class Planned:
    """What `plan` decided: the report so far (a dry run's whole answer) and what `execute` needs."""

    report: BackfillReport
    target: Target
    pipeline: Pipeline
    settings: Settings


def plan(
    pipeline: Pipeline | str,
    processor: str,
    start: str | datetime | date | None = None,
    end: str | datetime | date | None = None,
    into: str | Sink | None = None,
    settings: Settings | None = None,
    now: datetime | None = None,
    version: str | None = None,
) -> Planned:
    """Everything a backfill decides before Spark runs: the checks (each bad input a BackfillError), the
    target, the lake's files in the range's hours (from the inputs' Delta logs), the chunks. With `version`
    instead of a time range: the input offsets that code version processed (its checkpoint's records, `weir
    audit`), in the lake's files that may hold them, a chunk per hour of files."""

    began = time.monotonic()
    settings = settings or load()
    p = _pipeline(pipeline)
    proc = find_processor(p, processor)
    target = resolve(into, p, proc, lambda: _kafka_topics(settings))
    lake = Lake(settings.lake)
    if version is None:
        if start is None or end is None:
            raise BackfillError("give the range to backfill: --from and --to (record time), or --version")
        t1, t2 = parse_time(start, "--from"), parse_time(end, "--to")
        check_range(t1, t2, now)
        scans = {t: scan_topic(lake, t, t1, t2) for t in proc.inputs}
        planned_chunks, ranges, scope = chunks(t1, t2), {}, ""
    else:
        if start is not None or end is not None:
            raise BackfillError("--version replays the offsets a version processed: give it without --from and --to")
        ranges = version_ranges(settings, proc, version)
        scans = {t: scan_offsets(lake, t, ranges.get(t, {})) for t in proc.inputs}
        found = sorted({f.hour for s in scans.values() for f in s.files})
        planned_chunks = [Chunk(h, hour_start(h), hour_start(h + 1)) for h in found]
        if not planned_chunks and proc.stateful:
            # None of its offsets archived yet (the archiver behind): the replay reads them from the broker, its
            # warm-up from the lake's newest hour
            newest = max((s.last_hour for s in scans.values() if s.last_hour is not None), default=None)
            h = newest if newest is not None else hour_index(now or datetime.now(UTC))
            planned_chunks = [Chunk(h, hour_start(h), hour_start(h + 1))]
        if not planned_chunks:
            raise BackfillError(f"the lake {lake.url} holds no file with the offsets version {version} of "
                                f"{proc.name} processed ({ranges_text(ranges)})")  # fmt: skip
        t1, t2 = planned_chunks[0].start, planned_chunks[-1].end
        scope = f"version {version} {ranges_text(ranges)}"
    recorded = _recorded_blocks(settings, proc) if proc.stateful else None
    if proc.stateful:  # one replay of the range widened by the blocks' horizon (weir.backfill.stateful)
        h = stateful.horizon(recorded or [])
        own = into is None  # its own topics or sink
        stateful.refuse(h, pipeline if isinstance(pipeline, str) else "<pipeline>", proc.name, version, own)
        scans = stateful_scans(lake, p, proc, t1, t2, h)
        lo, hi = stateful.replay_span(t1, t2, h)
        if h.from_start:  # from where its state began: the lake's oldest hour at most
            first = min((s.first_hour for s in scans.values() if s.first_hour is not None), default=None)
            lo = min(lo, hour_start(first)) if first is not None else lo
        planned_chunks = [Chunk(hour_index(lo), lo, hi)]
    report = BackfillReport(
        backfill_id(p.name, proc.name, proc.version, t1, t2, target.description, scope),
        p.name, proc.name, t1, t2, target.description, dry_run=True, topics=scans, version=version, ranges=ranges,
    )  # fmt: skip
    report.stateful = proc.stateful
    if proc.stateful and not recorded:
        report.notes.append(
            f"processor {proc.name} never ran here (its checkpoint records no blocks): the plan reads the range "
            f"only; the run widens it by the horizon its code's blocks give"
        )
    elif proc.stateful:
        report.notes.extend(h.notes)
    if proc.stateful:  # one replay over every file of its hours
        files = sum(len(s.files) for s in scans.values())
        report.plan = [ChunkPlan(planned_chunks[0], files, sum(s.rows for s in scans.values()))]
    else:
        report.plan = [ChunkPlan(c, *chunk_rows(list(scans.values()), c)) for c in planned_chunks]
    if report.files == 0 and not (proc.stateful and version is not None):  # a version's replay has the broker
        unarchived = [t for t in proc.inputs if not p.topics[t].archived]
        hint = f" ({', '.join(unarchived)} not declared archived=True)" if unarchived else ""
        holds = "; ".join(f"{t}: {span(s)}" for t, s in scans.items()) + hint
        raise BackfillError(
            f"the lake {lake.url} has no data of {', '.join(proc.inputs)} in [{iso(t1)}, {iso(t2)}); it holds {holds}"
        )
    for t, s in scans.items() if version is None else ():  # a version's offsets are known: the notes say what lacks
        if s.last_hour is not None and report.plan[-1].chunk.hour >= s.last_hour:
            report.notes.append(
                f"the range reaches the newest hour of {t} in the lake ({span(s)}): records the archiver has not "
                f"written yet are not backfilled, and a rerun with the same id skips what this run delivers"
            )
    report.seconds = time.monotonic() - began
    return Planned(report, target, p, settings)


def _recorded_blocks(settings: Settings, proc: Processor) -> list[dict[str, str]]:
    """The blocks' settings the processor's last start recorded (its checkpoint's version record): a plan's
    horizon, before Spark traces the code (the run uses the traced ones)."""
    stored = versions.read(processor_checkpoint(settings.checkpoint_root, proc.checkpoint))
    return stored.blocks if stored is not None else []


def stateful_scans(lake: Lake, p: Pipeline, proc: Processor, t1: datetime, t2: datetime, h: stateful.Horizon) -> dict:
    """The lake files a stateful replay reads: each input's hours of the range widened by the horizon; a join's
    table (a Table input) whole, and every input whole for keyed state replayed from where it began."""
    lo, hi = stateful.replay_span(t1, t2, h)
    whole = (datetime(1970, 1, 1, tzinfo=UTC), hi + timedelta(days=1))
    everything = h.from_start  # keyed state: replayed from where it began
    return {
        t: scan_topic(lake, t, *(whole if everything or isinstance(p.topics[t], Table) else (lo, hi)))
        for t in proc.inputs
    }


def version_ranges(settings: Settings, proc: Processor, version: str) -> dict[str, dict[int, list[tuple[int, int]]]]:
    """The input offsets `version` of the processor processed, per topic and partition, from its checkpoint and the
    history beside it (weir.checkpoint.audit); a BackfillError naming the versions there are when it ran none."""
    checkpoint = processor_checkpoint(settings.checkpoint_root, proc.checkpoint)
    found = audit(proc.name, checkpoint).versions()
    if version not in found:
        known = "; ".join(f"{v}: {spans_text(spans)}" for v, spans in sorted(found.items())) or "none"
        raise BackfillError(f"processor {proc.name} ran no batch of version {version!r} that its checkpoint "
                            f"{checkpoint.url} records (versions: {known}); `weir audit` lists them")  # fmt: skip
    return _by_topic(found[version])


def _by_topic(spans: dict[tuple[str, int], list[tuple[int, int]]]) -> dict[str, dict[int, list[tuple[int, int]]]]:
    out: dict[str, dict[int, list[tuple[int, int]]]] = {}
    for (topic, partition), ranges in sorted(spans.items()):
        out.setdefault(topic, {})[partition] = list(ranges)
    return out


def ranges_text(ranges: dict[str, dict[int, list[tuple[int, int]]]]) -> str:
    """A report's ranges as `weir audit` prints them (weir.checkpoint.audit.spans_text)."""
    return spans_text({(t, p): rs for t, ps in ranges.items() for p, rs in ps.items()})


def execute(
    planned: Planned,
    spark: SparkSession | None = None,
    on_chunk: Callable[[ChunkPlan, Counts | None], None] | None = None,
) -> BackfillReport:
    """Run a plan, chunk after chunk (oldest first); `on_chunk(chunk, counts)` after each (counts None for a
    chunk without rows in the range). An error stops the backfill at that chunk: the chunks before it are
    delivered, and a rerun repeats them (exactly-once sinks skip them)."""

    began = time.monotonic()
    report, target, settings = planned.report, planned.target, planned.settings
    report.dry_run = False
    _ensure_topics(settings, planned.pipeline, target)
    if spark is None:
        spark = spark_session(f"weir-backfill-{planned.pipeline.name}", settings=settings)
    if target.proc.stateful:
        _replay(spark, planned, on_chunk)
        report.seconds += time.monotonic() - began
        return report
    run = _Run(spark, Lake(settings.lake), planned.pipeline, target, report, settings)
    try:
        for chunk in report.plan:
            counts = run.chunk(chunk)
            if on_chunk is not None:
                on_chunk(chunk, counts)
    finally:
        run.query.delivered.unpersist()
    dlqs = {f"{t}.dlq" for t in target.proc.inputs}
    for dest, n in report.counts.outputs.items():
        (report.dead_lettered if dest in dlqs else report.written)[dest] = n
    if report.ranges:
        wanted = sum(e - s for ps in report.ranges.values() for rs in ps.values() for s, e in rs)
        if report.rows_read < wanted:  # compaction and transaction markers leave offsets without records, too
            report.notes.append(f"{report.rows_read} records read of the {wanted} offsets version {report.version} "
                                "processed: the archiver may not have written the newest yet, or offsets hold no "
                                "record (compaction, transaction markers)")  # fmt: skip
    elif report.rows_read == 0:
        report.notes.append("no record of the inputs has a timestamp in the range (the hours' files hold others)")
    if report.counts.violations or not report.counts.balanced:
        report.notes.append(f"the books do not balance: {report.counts.to_json()}")
    report.seconds += time.monotonic() - began
    return report


def _replay(spark: SparkSession, planned: Planned, on_chunk: Callable[[ChunkPlan, Counts | None], None] | None) -> None:
    """A stateful processor's backfill: one bounded replay of its streaming query (weir.backfill.stateful)."""
    report, target, settings = planned.report, planned.target, planned.settings
    lake = Lake(settings.lake)
    files = LakeFiles(spark, lake, {t: input_schema(planned.pipeline, t) for t in target.proc.inputs}, report)
    checkpoint = processor_checkpoint(settings.checkpoint_root, target.proc.checkpoint)
    began = now_iso()

    def rescan(h: stateful.Horizon) -> None:
        t1, t2 = report.start, report.end
        report.topics = stateful_scans(lake, planned.pipeline, target.proc, t1, t2, h)

    run = stateful.StatefulRun(spark, planned.pipeline, target, report, settings, files, checkpoint)
    counts = run.run(rescan)
    report.counts.add(counts)
    report.chunks_run = 1
    dlqs = {f"{t}.dlq" for t in target.proc.inputs}
    for dest, n in counts.outputs.items():
        (report.dead_lettered if dest in dlqs else report.written)[dest] = n
    spans = {(t, p): rs for t, ps in report.ranges.items() for p, rs in ps.items()}
    record = checkpoint.backfill_record(report.id, int(time.time() * 1000))
    checkpoint.write_backfill(record, Backfilled(report.id, began, spans).to_json() | {"target": report.target})
    if on_chunk is not None:
        on_chunk(report.plan[0], counts)


def backfill(
    pipeline: Pipeline | str,
    processor: str,
    start: str | datetime | date | None = None,
    end: str | datetime | date | None = None,
    into: str | Sink | None = None,
    settings: Settings | None = None,
    spark: SparkSession | None = None,
    dry_run: bool = False,
    *,
    on_chunk: Callable[[ChunkPlan, Counts | None], None] | None = None,
    now: datetime | None = None,
    version: str | None = None,
) -> BackfillReport:
    """Run `processor`'s function over its inputs' lake records with timestamps in [start, end) (or, with
    `version` and no times, over the input offsets that code version processed) and deliver the result to its
    outputs (or `into`): `plan`, then (unless `dry_run`) `execute`. `pipeline` is a Pipeline or a spec
    (`file.py[:name]`, `module[:name]`); times are ISO 8601 strings, dates or datetimes (UTC unless they carry
    an offset). Raises BackfillError for bad input."""
    planned = plan(pipeline, processor, start, end, into, settings, now, version)
    return planned.report if dry_run else execute(planned, spark, on_chunk)


# -- execution ------------------------------------------------------------------------------------------------
def _kafka_topics(settings: Settings) -> dict[str, int]:

    return Admin(settings.bootstrap_servers, settings.kafka).topics()


def _ensure_topics(settings: Settings, p: Pipeline, target: Target) -> None:
    """Create missing output topics and the inputs' `.dlq` topics, as the runner does before streaming."""

    admin = Admin(settings.bootstrap_servers, settings.kafka)
    existing = set(admin.topics())
    wanted = {t: (target.topics[t].partitions, target.topics[t].kafka_config()) for t in target.output_topics}
    for name in target.proc.inputs:
        wanted.setdefault(f"{name}.dlq", (p.topics[name].partitions, SIDE_TOPIC_CONFIG))
    for name, (partitions, config) in wanted.items():
        if name not in existing:
            admin.create_topic(name, partitions, config, settings.replication_factor, exist_ok=True)


def input_schema(p: Pipeline, topic: str):
    """The columns the weir-kafka source gives the topic's stream (and the archiver gave its lake files)."""

    options = {"subscribe": topic, "kafka.bootstrap.servers": "-"}  # parsed for the schema only: no client
    options |= p.topics[topic].reader_options({})  # the columns depend on the schema, not on the registry
    return T._parse_datatype_string(KAFKA_COLUMNS + value_ddl(parse_source(options, streaming=None)))


@dataclass
class LakeFiles:
    """Reads a plan's lake files of one input topic, with its stream's columns: Spark's Parquet reader on a local
    lake, weir's `weir-delta` source (pyarrow in the tasks) on object storage Spark has no filesystem for. Both
    the chunked replay and a stateful backfill's read the lake through it."""

    spark: SparkSession
    lake: Lake
    schemas: dict[str, Any]
    report: BackfillReport  # its scans: the table version each topic's plan listed (its files stay)

    def __call__(self, topic: str, files: list) -> DataFrame:
        schema = self.schemas[topic]
        if "://" not in self.lake.url or self.lake.url.startswith("file:"):
            return self.spark.read.schema(schema).parquet(*[self.lake.spark_url(f.path) for f in files])
        top = self.lake.topic_dir(topic) + "/"
        rel = json.dumps([f.path.removeprefix(top) for f in files])
        register_source(self.spark, DeltaDataSource)
        version = str(self.report.topics[topic].version)
        reader = self.spark.read.format("weir-delta").schema(schema).option("path", self.lake.topic_url(topic))
        return reader.option("version", version).option("files", rel).load()


class _Run:
    """One backfill's execution: the processor's stateless batch path over the lake, chunk after chunk."""

    def __init__(
        self, spark: SparkSession, lake: Any, p: Pipeline, target: Target, report: BackfillReport, settings: Settings
    ) -> None:

        self.spark, self.lake, self.target, self.report = spark, lake, target, report
        self.ranges: dict[tuple[str, int], list[tuple[int, int]]] = {}  # input offsets read, for `weir audit`
        self.began = now_iso()
        self.checkpoint = processor_checkpoint(settings.checkpoint_root, target.proc.checkpoint)
        self.record = self.checkpoint.backfill_record(report.id, int(time.time() * 1000))
        self.schemas = {t: input_schema(p, t) for t in target.proc.inputs}
        self._files = LakeFiles(spark, lake, self.schemas, report)
        effective = replace(p, topics=target.topics, processors={**p.processors, target.proc.name: target.proc})
        # What the processor already delivered to the topics this backfill writes (streaming's output, an earlier
        # run's): written again, it would reach every downstream consumer twice (docs/backfill.md, "Identities").
        written = [*target.output_topics, *(f"{t}.dlq" for t in target.proc.inputs)]
        self.query = ProcessorQuery(
            spark, effective, target.proc, settings, Ledger(), checkpoint="",
            name=f"backfill.{p.name}.{target.proc.name}", stamp={BACKFILL_HEADER: report.id}, delivered=written,
        )  # fmt: skip
        # The function traced on an empty batch first: a result that does not fit the target fails here,
        # with the runner's message, before any chunk is written.
        self.query.trace_batch(union([spark.createDataFrame([], s) for s in self.schemas.values()]).schema)

    def read(self, chunk: Chunk) -> DataFrame | None:
        """The chunk's rows of every input topic with timestamps in [chunk.start, chunk.end), as one batch
        with the columns of the inputs' streams; None when its hour has no files."""

        lo, hi = epoch_micros(chunk.start), epoch_micros(chunk.end)
        frames = []
        for topic, scan in self.report.topics.items():
            files = scan.in_hour(chunk.hour)
            if files:
                df = self._files(topic, files)
                if self.report.version is not None:  # the version's offsets, whatever their time
                    frames.append(df.where(stateful.within(self.report.ranges.get(topic, {}))))
                    continue
                micros = F.unix_micros(F.col("timestamp"))
                frames.append(df.where((micros >= F.lit(lo)) & (micros < F.lit(hi))))
        return union(frames) if frames else None

    def chunk(self, planned: ChunkPlan) -> Counts | None:
        """Run one chunk as one batch; its settled counts, or None when it held no row of the range."""

        chunk, report = planned.chunk, self.report
        batch = self.read(chunk) if planned.files else None
        if batch is None:
            report.chunks_empty += 1
            return None
        # Rows per Kafka partition: a small job over two columns of the files. It is also the batch's input
        # count, measured apart from the records run_batch hands the function (two independent counts).
        aggregates = (F.count("*").alias("n"), F.min("offset").alias("lo"), F.max("offset").alias("hi"))
        by_partition = batch.groupBy("topic", "partition").agg(*aggregates).collect()
        if not by_partition:
            report.chunks_empty += 1
            return None
        for row in by_partition:
            parts = report.read.setdefault(row["topic"], {})
            parts[row["partition"]] = parts.get(row["partition"], 0) + row["n"]
        self.note_ranges(batch, by_partition)
        if self.target.sink is not None:
            self.target.sink.open(writer_name(report.id, chunk))
        listed = sum(r["n"] for r in by_partition)
        counts = self.query.run_batch(batch, chunk.batch_id, reread=True)
        counts.settle(listed)
        if not counts.balanced:
            counts.violations += 1
            log.error("weir backfill %s: chunk %s does not balance: %s", report.id, chunk, counts.to_json())
        report.counts.add(counts)
        report.chunks_run += 1
        self.keep_ranges()
        return counts

    def note_ranges(self, batch: DataFrame, by_partition: list) -> None:
        """The chunk's input offset ranges per partition, for `weir audit`: one range where the offsets are
        contiguous (the count says so), else its runs of consecutive offsets (a small job over two columns)."""
        broken = [(r["topic"], r["partition"]) for r in by_partition if r["hi"] - r["lo"] + 1 != r["n"]]
        found = [
            (r["topic"], r["partition"], r["lo"], r["hi"])
            for r in by_partition
            if (r["topic"], r["partition"]) not in broken
        ]
        if broken:
            which = [(F.col("topic") == t) & (F.col("partition") == p) for t, p in broken]
            runs = batch.where(functools.reduce(operator.or_, which))
            rank = F.dense_rank().over(Window.partitionBy("topic", "partition").orderBy("offset"))
            runs = runs.select("topic", "partition", "offset", (F.col("offset") - rank).alias("run"))
            runs = runs.groupBy("topic", "partition", "run").agg(
                F.min("offset").alias("lo"), F.max("offset").alias("hi")
            )
            found += [(r["topic"], r["partition"], r["lo"], r["hi"]) for r in runs.collect()]
        for topic, partition, lo, hi in found:
            self.ranges.setdefault((topic, partition), []).append((lo, hi + 1))

    def keep_ranges(self) -> None:
        """Write the ranges read so far into the processor's checkpoint history (rewritten after each chunk, so a
        backfill that stops half-way says how far it went)."""
        record = Backfilled(self.report.id, self.began, dict(self.ranges))
        self.checkpoint.write_backfill(self.record, record.to_json() | {"target": self.report.target})
