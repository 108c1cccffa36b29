"""Each side's books over the input a shadow comparison covers, in the runner's terms (docs/pipelines.md,
"Accounting"): in = out + filtered + dlq + late + duplicate + absorbed, and emitted beside them.

`out`, `dlq`, `late` and `emitted` are counted from the records each side wrote (an input record with an output,
a dead letter, a late record; results without an input record). What is left of `in` reached no topic: the
runner's books say what it was, filtered by a function, a duplicate, or absorbed into state (a `@stateful`
rule's, a window's records). Those three come from each side's progress records (one per batch, in its
progress topic) over its batches within the compared input. When those batches do not end exactly where the
compared input does (a side whose batches were cut otherwise), or a batch's record is not in the topic, the
records they do not explain are counted where the runner's books put most of theirs, and a note says so.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.functions import col

from weir.kafka import Admin
from weir.units import parse_instant

LEFT = ("filtered", "duplicate", "absorbed")  # what reaches no topic, as the runner counts it
ORDER = ("in", "out", "filtered", "duplicate", "absorbed", "dlq", "late", "emitted")


def written(rows: DataFrame, outputs: list[str], dlq: list[str], late: list[str]) -> dict[str, dict[str, int]]:
    """Per side, from its settled records: out, emitted, dlq and late."""
    sourced = col("src").isNotNull()
    agg = rows.groupBy("side").agg(
        F.count_distinct(F.when(col("o").isin(outputs) & sourced, col("src"))).alias("out"),
        F.count(F.when(col("o").isin(outputs) & ~sourced, F.lit(1))).alias("emitted"),
        F.count_distinct(F.when(col("o").isin(dlq), col("src"))).alias("dlq"),
        F.count_distinct(F.when(col("o").isin(late), col("src"))).alias("late"),
    )
    got = {s: dict.fromkeys(("out", "emitted", "dlq", "late"), 0) for s in ("live", "shadow")}
    for r in agg.collect():
        got[r["side"]].update({k: int(r[k]) for k in ("out", "emitted", "dlq", "late")})
    return got


def runner_books(
    spark: SparkSession, opts: dict[str, str], bootstrap: str, kafka: dict, topic: str, pipeline: str,
    processor: str, batches: tuple[int, int], since: str,
) -> dict[int, dict[str, int]]:  # fmt: skip
    """The runner's accounting of `processor`'s batches in `batches` (first, last) published since `since`, by
    batch (the latest record of a batch published twice); {} when the progress topic does not exist."""
    first, last = batches
    if last < first or topic not in Admin(bootstrap, kafka).topics():
        return {}
    since_ms = int(parse_instant(since).timestamp() * 1000)
    v = col("value").cast("string")

    def field(path: str):
        return F.get_json_object(v, path)

    df = spark.read.format("weir-kafka").options(**opts).option("subscribe", topic).load()
    batch = field("$.batch_id").cast("long")
    picked = df.where(
        (col("key").cast("string") == F.lit(f"{pipeline}/{processor}")) & (field("$.type") == F.lit("progress"))
        & batch.between(first, last) & (field("$.at_ms").cast("long") >= F.lit(since_ms))
    ).select(
        batch.alias("batch"), field("$.at_ms").cast("long").alias("at_ms"),
        *[F.coalesce(field(f"$.accounting.{k}").cast("long"), F.lit(0)).alias(k) for k in ("in", *LEFT)],
    )  # fmt: skip
    out: dict[int, tuple[int, dict[str, int]]] = {}
    for r in picked.collect():
        if r["batch"] not in out or r["at_ms"] >= out[r["batch"]][0]:
            out[r["batch"]] = (r["at_ms"], {k: int(r[k]) for k in ("in", *LEFT)})
    return {b: acc for b, (_, acc) in out.items()}


def balance(side: str, records_in: int, wrote: dict[str, int], runner: dict[int, dict[str, int]], expected: int,
            exact: bool, notes: list[str]) -> dict[str, int]:  # fmt: skip
    """A side's books: `wrote` (from its records) and the runner's split of the rest over `expected` batches;
    what the runner's books do not explain is counted where they put most, with a note."""
    books = {"in": records_in, **wrote, **dict.fromkeys(LEFT, 0)}
    for acc in runner.values():
        for k in LEFT:
            books[k] += acc[k]
    rest = records_in - wrote["out"] - wrote["dlq"] - wrote["late"]
    unexplained = rest - sum(books[k] for k in LEFT)
    if unexplained:
        most = max(LEFT, key=lambda k: (books[k], k == "filtered"))
        books[most] += unexplained
        why = []
        if not exact:
            why.append("its batches do not end where the compared input does")
        if len(runner) < expected:
            why.append(f"{expected - len(runner)} of its {expected} batches' progress records were not found")
        notes.append(
            f"{side}: {unexplained} record(s) of the compared input reached no topic beyond what its runner's books "
            f"say ({'; '.join(why) or 'its books do not balance with the records written'}): counted as {most}"
        )
    return {k: books[k] for k in ORDER}
