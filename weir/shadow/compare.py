"""The comparison of a shadow's outputs with the live ones, over what both sides have settled (weir.shadow.settled).

Batch numbers are not compared: the sides cut their batches differently, and a result made from state is not
tied to the batch that read its input. A record with an input record (`weir.source`) in the compared input
offsets is matched by it; a window's or a session's result (its topic has `window_start` and `window_end`) by
(key, window); any other result from state by its bytes (key and value), as one of a multiset: as many `same`
as both sides hold, the rest `missing` (the shadow lacks it) or `extra` (the live side lacks it). Each input
record's or window's match is `same`, `changed`, `missing` or `extra`. Records past what both settled are
`pending`, never missing. The counts and a few examples reach the driver, never the records. Beside them, each
side's books over the compared input (weir.shadow.books): in, out, filtered, duplicate, absorbed, dead letters,
late, emitted.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.functions import col

from weir.checkpoint.files import Checkpoint
from weir.config import Settings
from weir.kafka.headers import PIPELINE_HEADER, PROCESSOR_HEADER, SOURCE_HEADER, TASK_HEADER
from weir.pipeline.model import Pipeline
from weir.runtime.routing import header_value
from weir.shadow import books, settled
from weir.shadow.record import ShadowRecord
from weir.shadow.start import SUFFIX

KINDS = ("same", "missing", "extra", "changed", "pending")
DIFFERENT = ("missing", "extra", "changed")
WINDOW_FIELDS = ("window_start", "window_end")


@dataclass
class ShadowReport:
    """What `weir shadow --report` prints. `compared`: the sides' batches since the shadow began up to the last
    one whose results are settled (first, last of either side; None before both committed a batch since it
    began); `ranges`: the compared input offsets per partition; `settled`: per side, its batches whose results are
    compared; `watermark`: the lower of both sides' watermarks (results of later batches are pending; None
    without an event-time watermark)."""

    pipeline: str
    processor: str
    live_version: str | None
    candidate_version: str
    code: str
    began: str
    stopped: str | None
    live_batch: int | None
    shadow_batch: int | None
    compared: tuple[int, int] | None
    ranges: dict[str, dict[int, tuple[int, int]]]
    records_in: int = 0
    watermark: str | None = None
    settled: dict[str, tuple[int, int]] = field(default_factory=dict)
    books: dict[str, dict[str, int]] = field(default_factory=dict)  # side -> in, out, filtered, ..., emitted
    topics: dict[str, dict[str, int]] = field(default_factory=dict)  # live topic -> kind -> records
    examples: list[dict] = field(default_factory=list)  # topic, kind, record, live, shadow
    notes: list[str] = field(default_factory=list)

    @property
    def differences(self) -> int:
        return sum(n for kinds in self.topics.values() for k, n in kinds.items() if k in DIFFERENT)

    def to_json(self) -> dict:
        out = asdict(self)
        out["differences"] = self.differences
        out["ranges"] = {t: {str(p): list(r) for p, r in parts.items()} for t, parts in self.ranges.items()}
        return out


def compare(
    spark: SparkSession, settings: Settings, pipeline: Pipeline, rec: ShadowRecord, shadow_checkpoint: Checkpoint,
    examples: int = 5,
) -> ShadowReport:  # fmt: skip
    """The comparison so far (driver: a few Spark jobs; only counts and `examples` per topic and kind come back)."""
    sides = {"live": settled.side(Checkpoint(rec.live_checkpoint), rec), "shadow": settled.side(shadow_checkpoint, rec)}
    live, mine = sides["live"], sides["shadow"]
    over = settled.settle(rec, sides)
    ranges = over.ranges if over else {t: {p: (s, s) for p, s in parts.items()} for t, parts in rec.start.items()}
    report = ShadowReport(
        rec.pipeline, rec.processor, rec.live_version, rec.candidate_version, rec.code, rec.began, rec.stopped,
        live.committed, mine.committed, (over.first, max(over.until.values())) if over else None, ranges,
    )  # fmt: skip
    behind = sum(
        max(e - mine.end.get(t, {}).get(p, rec.start[t].get(p, e)), 0)
        for t, parts in live.end.items() for p, e in parts.items()
    )  # fmt: skip
    if mine.committed is not None and behind:
        report.notes.append(f"the shadow is {behind} input offset(s) behind the live processor")
    if over is None:
        report.notes.append("no batch compared yet: the shadow has not committed a batch since it began")
        return report
    report.watermark = _instant(over.watermark_ms) if over.watermark_ms else None  # None: no event time
    report.settled = {s: (over.first, n) for s, n in over.until.items()}
    opts = settings.kafka_options()
    report.records_in = _count_inputs(spark, opts, ranges)
    rows = _rows(spark, opts, settings.registry_conf(), pipeline, rec, over).persist()
    try:
        placed = {r["place"]: int(r["count"]) for r in rows.groupBy("place").count().collect()}
        if placed.get("unplaced"):
            report.notes.append(
                f"{placed['unplaced']} record(s) carry neither an input record (weir.source) in the compared "
                f"offsets or after them nor a batch (weir.task): not compared"
            )
        pending = rows.where(col("place") == "pending").groupBy("o").count().collect()
        for r in pending:
            report.topics.setdefault(r["o"], dict.fromkeys(KINDS, 0))["pending"] = int(r["count"])
        matched = _matched(rows.where(col("place") == "settled"))
        for r in matched.groupBy("o", "kind").agg(F.sum("n").alias("n")).collect():
            report.topics.setdefault(r["o"], dict.fromkeys(KINDS, 0))[r["kind"]] = int(r["n"])
        rank = F.row_number().over(Window.partitionBy("o", "kind").orderBy("ident"))
        shown = matched.where(col("kind") != "same").withColumn("rank", rank).where(col("rank") <= examples)
        for r in shown.orderBy("o", "kind", "ident").collect():
            report.examples.append(
                {"topic": r["o"], "kind": r["kind"], "record": r["ident"], "live": r["lt"], "shadow": r["st"]}
            )
        report.books = _books(spark, settings, rows.where(col("place") == "settled"), rec, over, report)
    finally:
        rows.unpersist()
    for t in rec.topics:
        report.topics.setdefault(t, dict.fromkeys(KINDS, 0))
    return report


def _instant(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


def _count_inputs(spark: SparkSession, opts: dict[str, str], ranges: dict[str, dict[int, tuple[int, int]]]) -> int:
    """The input records in the compared offsets (a job; offsets alone would count transaction markers)."""
    total = 0
    for t, parts in ranges.items():
        if all(e <= s for s, e in parts.values()):
            continue
        starting = {t: {str(p): s for p, (s, _) in parts.items()}}
        ending = {t: {str(p): e for p, (_, e) in parts.items()}}
        df = (
            spark.read.format("weir-kafka").options(**opts).option("subscribe", t)
            .option("startingOffsets", json.dumps(starting)).option("endingOffsets", json.dumps(ending))
            .load()
        )  # fmt: skip
        total += df.count()
    return total


def _rows(
    spark: SparkSession, opts: dict[str, str], registry: dict[str, str], pipeline: Pipeline, rec: ShadowRecord,
    over: settled.Settled,
) -> DataFrame:  # fmt: skip
    """Both sides' records since the shadow began: (side, o: the live topic, ident, bag, key, value, src, text,
    place). `place`: "settled" (compared), "pending" (past what both sides settled) or "unplaced"; `bag`: whether
    the record is matched by its bytes, as one of a multiset, rather than by its input record or window."""
    bounds = [(f"{t}/{p}", s, e) for t, parts in over.ranges.items() for p, (s, e) in parts.items()]
    lo = F.create_map(*[x for b, s, _ in bounds for x in (F.lit(b), F.lit(s))])
    hi = F.create_map(*[x for b, _, e in bounds for x in (F.lit(b), F.lit(e))])
    frames = []
    for live_topic, shadow_topic in sorted(rec.topics.items()):
        declared = pipeline.topics.get(live_topic)
        for side, topic, writer, start in (
            ("live", live_topic, rec.processor, rec.live_from), ("shadow", shadow_topic, rec.shadow, rec.shadow_from)
        ):  # fmt: skip
            reader = spark.read.format("weir-kafka").options(**opts).option("subscribe", topic)
            if start.get(topic):
                from_here = {topic: {str(p): o for p, o in start[topic].items()}}
                reader = reader.option("startingOffsets", json.dumps(from_here))
            if declared is not None:
                reader = reader.options(**declared.reader_options(registry))
            df = reader.load()
            ours = (header_value(PROCESSOR_HEADER) == F.lit(writer)) & (
                header_value(PIPELINE_HEADER).isNull() | (header_value(PIPELINE_HEADER) == F.lit(rec.pipeline))
            )
            src, task = header_value(SOURCE_HEADER), header_value(TASK_HEADER)
            fields = declared.fields() if declared is not None else []
            text = F.to_json(F.struct(*[col(f) for f in fields])) if fields else col("value").cast("string")
            windowed = all(w in fields for w in WINDOW_FIELDS)
            if windowed:
                by_row = F.concat_ws("|", F.hex(col("key")), *[col(w).cast("string") for w in WINDOW_FIELDS])
            else:
                by_row = F.concat_ws("|", F.hex(col("key")), F.sha2(col("value"), 256))
            batch = F.when(task.contains(":"), F.split(task, ":")[0].cast("long"))
            results = F.when(batch.between(over.first, over.until[side]), F.lit("settled")).when(
                batch > over.until[side], F.lit("pending")
            )
            frames.append(
                df.where(ours).select(
                    F.lit(side).alias("side"), F.lit(live_topic).alias("o"), src.alias("src"), results.alias("results"),
                    by_row.alias("by_row"), F.lit(not windowed).alias("bag"), col("key"), col("value"),
                    text.alias("text"),
                )
            )  # fmt: skip
    rows = frames[0]
    for f in frames[1:]:
        rows = rows.unionByName(f)
    parts = F.split(col("src"), "/")
    at = F.concat_ws("/", parts[0], parts[1])
    offset = parts[2].cast("long")
    by_input = F.when((offset >= F.element_at(lo, at)) & (offset < F.element_at(hi, at)), F.lit("settled")).when(
        offset >= F.element_at(hi, at), F.lit("pending")
    )
    place = F.coalesce(F.when(col("src").isNotNull(), by_input).otherwise(col("results")), F.lit("unplaced"))
    ident = F.coalesce(col("src"), col("by_row"))
    bag = col("src").isNull() & col("bag")
    return rows.select("side", "o", ident.alias("ident"), bag.alias("bag"), "key", "value", "src", "text",
                       place.alias("place"))  # fmt: skip


def _matched(rows: DataFrame) -> DataFrame:
    """Per (topic, ident), each kind with its records `n` and each side's first record as text. A record with
    an input record or a window counts once, as `same`, `changed`, `missing` or `extra`; records matched by their
    bytes (results from state) are compared as multisets: as many `same` as both sides hold, the rest of
    either side `missing` or `extra`."""
    pair = F.struct("key", "value")
    g = rows.groupBy("o", "ident", "bag").agg(
        F.sort_array(F.collect_list(F.when(col("side") == "live", pair))).alias("lv"),
        F.sort_array(F.collect_list(F.when(col("side") == "shadow", pair))).alias("sv"),
        F.first(F.when(col("side") == "live", col("text")), ignorenulls=True).alias("lt"),
        F.first(F.when(col("side") == "shadow", col("text")), ignorenulls=True).alias("st"),
    )
    one = (
        F.when(F.size("lv") == 0, "extra")
        .when(F.size("sv") == 0, "missing")
        .when(col("lv") != col("sv"), "changed")
        .otherwise("same")
    )
    both = F.least(F.size("lv"), F.size("sv"))
    kinds = F.when(
        col("bag"),
        F.array(
            F.struct(F.lit("same").alias("kind"), both.alias("n")),
            F.struct(F.lit("missing").alias("kind"), (F.size("lv") - both).alias("n")),
            F.struct(F.lit("extra").alias("kind"), (F.size("sv") - both).alias("n")),
        ),
    ).otherwise(F.array(F.struct(one.alias("kind"), F.lit(1).alias("n"))))
    out = g.select("o", "ident", "lt", "st", F.explode(kinds).alias("k")).where(col("k.n") > 0)
    return out.select(
        "o", "ident", col("k.kind").alias("kind"), col("k.n").alias("n"),
        F.when(col("k.kind") != "extra", col("lt")).alias("lt"),
        F.when(col("k.kind") != "missing", col("st")).alias("st"),
    )  # fmt: skip


def _books(
    spark: SparkSession, settings: Settings, rows: DataFrame, rec: ShadowRecord, over: settled.Settled,
    report: ShadowReport,
) -> dict[str, dict[str, int]]:  # fmt: skip
    """Each side's books over the compared input (weir.shadow.books)."""
    inputs = list(rec.start)
    dlq, late = [f"{t}.dlq" for t in inputs], [f"{t}.late" for t in inputs]
    outputs = [t for t in rec.topics if t not in dlq and t not in late]
    wrote = books.written(rows, outputs, dlq, late)
    opts = settings.kafka_options()
    out = {}
    for side, topic, processor in (
        ("live", settings.progress_topic, rec.processor), ("shadow", settings.progress_topic + SUFFIX, rec.shadow)
    ):  # fmt: skip
        last, exact = over.books_until[side]
        runner = books.runner_books(
            spark, opts, settings.bootstrap_servers, settings.kafka, topic, rec.pipeline, processor,
            (over.first, last), rec.began,
        )  # fmt: skip
        out[side] = books.balance(
            side, report.records_in, wrote[side], runner, last - over.first + 1, exact, report.notes
        )
    return out
