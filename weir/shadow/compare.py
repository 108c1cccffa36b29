"""The comparison of a shadow's outputs with the live ones, over the batches both have committed since it began.

A record is matched by its input record (`weir.source`); a record without one (a window's or a session's result)
by its batch and, where its topic's records have `window_start` and `window_end`, by (key, window), else by
its bytes. Each match is `same`, `missing` (the shadow lacks it), `extra` (the live side lacks it) or `changed`;
the counts and a few examples reach the driver, never the records. Beside them, each side's books over the
compared input: records in, out, filtered, dead letters, late.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.functions import col

from weir.config import Settings
from weir.kafka.checkpoint import read_offsets
from weir.kafka.headers import PIPELINE_HEADER, PROCESSOR_HEADER, SOURCE_HEADER, TASK_HEADER
from weir.kafka.offsets import Positions
from weir.pipeline.model import Pipeline
from weir.runtime.routing import header_value
from weir.shadow.record import ShadowRecord

KINDS = ("same", "missing", "extra", "changed")
WINDOW_FIELDS = ("window_start", "window_end")


@dataclass
class ShadowReport:
    """What `weir shadow --report` prints. `compared`: the batches both sides committed since the shadow began
    (first, last; None before the shadow's first batch) and the input offsets they cover per partition."""

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
    books: dict[str, dict[str, int]] = field(default_factory=dict)  # side -> in, out, filtered, dlq, late, emitted
    topics: dict[str, dict[str, int]] = field(default_factory=dict)  # live topic -> kind -> records
    examples: list[dict] = field(default_factory=list)  # topic, kind, record, live, shadow
    notes: list[str] = field(default_factory=list)

    @property
    def differences(self) -> int:
        return sum(n for kinds in self.topics.values() for k, n in kinds.items() if k != "same")

    def to_json(self) -> dict:
        out = asdict(self)
        out["differences"] = self.differences
        out["ranges"] = {t: {str(p): list(r) for p, r in parts.items()} for t, parts in self.ranges.items()}
        return out


def compare(
    spark: SparkSession, settings: Settings, pipeline: Pipeline, rec: ShadowRecord, shadow_checkpoint: str,
    examples: int = 5,
) -> ShadowReport:  # fmt: skip
    """The comparison so far (driver: a few Spark jobs; only counts and `examples` per topic and kind come back)."""
    live = read_offsets(rec.live_checkpoint)
    mine = read_offsets(shadow_checkpoint)
    last = min(live.committed_batch or -1, mine.committed_batch or -1)
    compared = (rec.batch + 1, last) if last > rec.batch else None
    hi = _lower(live.committed, mine.committed, rec.start) if compared else rec.start
    ranges = {t: {p: (s, hi.get(t, {}).get(p, s)) for p, s in parts.items()} for t, parts in rec.start.items()}
    report = ShadowReport(
        rec.pipeline, rec.processor, rec.live_version, rec.candidate_version, rec.code, rec.began, rec.stopped,
        live.committed_batch, mine.committed_batch, compared, ranges,
    )  # fmt: skip
    if mine.committed_batch is not None and (live.committed_batch or -1) > mine.committed_batch:
        report.notes.append(f"the shadow is {live.committed_batch - mine.committed_batch} batch(es) behind")
    if compared is None:
        report.notes.append("no batch compared yet: the shadow has not committed a batch since it began")
        return report
    opts = settings.kafka_options()
    report.records_in = _count_inputs(spark, opts, ranges)
    rows = _rows(spark, opts, settings.registry_conf(), pipeline, rec, ranges, compared).persist()
    try:
        matched = _matched(rows)
        for r in matched.groupBy("o", "kind").count().collect():
            report.topics.setdefault(r["o"], dict.fromkeys(KINDS, 0))[r["kind"]] = int(r["count"])
        rank = F.row_number().over(Window.partitionBy("o", "kind").orderBy("ident"))
        shown = matched.where(col("kind") != "same").withColumn("rank", rank).where(col("rank") <= examples)
        for r in shown.orderBy("o", "kind", "ident").collect():
            report.examples.append(
                {"topic": r["o"], "kind": r["kind"], "record": r["ident"], "live": r["lt"], "shadow": r["st"]}
            )
        report.books = _books(rows, pipeline, rec, report.records_in)
    finally:
        rows.unpersist()
    for t in rec.topics:
        report.topics.setdefault(t, dict.fromkeys(KINDS, 0))
    return report


def _lower(a: Positions, b: Positions, start: Positions) -> Positions:
    """Per partition of `start`, the lower of `a` and `b` (never below the start)."""
    out: Positions = {}
    for t, parts in start.items():
        for p, s in parts.items():
            ends = [x[t][p] for x in (a, b) if p in x.get(t, {})]
            out.setdefault(t, {})[p] = max(s, min(ends)) if len(ends) == 2 else s
    return out


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
    ranges: dict[str, dict[int, tuple[int, int]]], compared: tuple[int, int],
) -> DataFrame:  # fmt: skip
    """Both sides' records of the compared batches: (side, o: the live topic, ident, key, value, src, text)."""
    bounds = [(f"{t}/{p}", s, e) for t, parts in ranges.items() for p, (s, e) in parts.items()]
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
            if all(w in fields for w in WINDOW_FIELDS):
                by_row = F.concat_ws("|", F.hex(col("key")), *[col(w).cast("string") for w in WINDOW_FIELDS])
            else:
                by_row = F.concat_ws("|", F.hex(col("key")), F.sha2(col("value"), 256))
            frames.append(
                df.where(ours).select(
                    F.lit(side).alias("side"), F.lit(live_topic).alias("o"), src.alias("src"), task.alias("task"),
                    by_row.alias("by_row"), col("key"), col("value"), text.alias("text"),
                )
            )  # fmt: skip
    rows = frames[0]
    for f in frames[1:]:
        rows = rows.unionByName(f)
    parts = F.split(col("src"), "/")
    at = F.concat_ws("/", parts[0], parts[1])
    offset = parts[2].cast("long")
    batch = F.split(col("task"), ":")[0].cast("long")
    within = F.when(
        col("src").isNotNull(), (offset >= F.element_at(lo, at)) & (offset < F.element_at(hi, at))
    ).otherwise(col("task").contains(":") & batch.between(compared[0], compared[1]))
    ident = F.coalesce(col("src"), F.concat_ws("|", batch.cast("string"), col("by_row")))
    return rows.where(F.coalesce(within, F.lit(False))).select("side", "o", ident.alias("ident"), "key", "value",
                                                                "src", "text")  # fmt: skip


def _matched(rows: DataFrame) -> DataFrame:
    """One row per (topic, ident): its kind, and each side's first record as text."""
    pair = F.struct("key", "value")
    g = rows.groupBy("o", "ident").agg(
        F.sort_array(F.collect_list(F.when(col("side") == "live", pair))).alias("lv"),
        F.sort_array(F.collect_list(F.when(col("side") == "shadow", pair))).alias("sv"),
        F.first(F.when(col("side") == "live", col("text")), ignorenulls=True).alias("lt"),
        F.first(F.when(col("side") == "shadow", col("text")), ignorenulls=True).alias("st"),
    )
    kind = (
        F.when(F.size("lv") == 0, "extra")
        .when(F.size("sv") == 0, "missing")
        .when(col("lv") != col("sv"), "changed")
        .otherwise("same")
    )
    return g.withColumn("kind", kind)


def _books(rows: DataFrame, pipeline: Pipeline, rec: ShadowRecord, records_in: int) -> dict[str, dict[str, int]]:
    """Each side's books over the compared input, from its records: out (input records with an output), dead
    letters, late, emitted (results without an input record); filtered is what is left of `in`."""
    inputs = [t for t in rec.start]
    dlq, late = [f"{t}.dlq" for t in inputs], [f"{t}.late" for t in inputs]
    outputs = [t for t in rec.topics if t not in dlq and t not in late]
    sourced = col("src").isNotNull()
    agg = rows.groupBy("side").agg(
        F.count_distinct(F.when(col("o").isin(outputs) & sourced, col("src"))).alias("out"),
        F.count(F.when(col("o").isin(outputs) & ~sourced, F.lit(1))).alias("emitted"),
        F.count_distinct(F.when(col("o").isin(dlq), col("src"))).alias("dlq"),
        F.count_distinct(F.when(col("o").isin(late), col("src"))).alias("late"),
    )
    empty = {"in": records_in, "out": 0, "filtered": 0, "dlq": 0, "late": 0, "emitted": 0}
    books = {s: dict(empty) for s in ("live", "shadow")}
    for r in agg.collect():
        books[r["side"]].update({k: int(r[k]) for k in ("out", "emitted", "dlq", "late")})
    for b in books.values():
        # Filtered (or absorbed into state, for a stateful processor): in without out, dead letter or late
        b["filtered"] = max(b["in"] - b["out"] - b["dlq"] - b["late"], 0)
    return books
