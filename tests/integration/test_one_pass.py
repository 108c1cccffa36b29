"""A stateless batch of one input topic without a sink runs in one Spark job (weir/runtime/query.py, _one_pass),
and its books stay exact: a fan-out (`emitted`), a filter, rows the function dead-letters itself (`refused`),
records that do not decode (read again by offsets and dead-lettered in a second job), and more offsets of one
partition in a batch than one bitmap of the distinct count holds (weir/runtime/tally.py, 32,768)."""

from __future__ import annotations

import json
import uuid
from collections import Counter

import pytest
from _pipe import Rec, produce
from pyspark.sql import functions as F
from test_run import progress_records, read_topic, settings

from weir.kafka import Admin
from weir.pipeline import Pipeline
from weir.runtime.runner import Runner
from weir.runtime.tally import BITS

pytestmark = pytest.mark.integration

N = BITS + 7_000  # records of partition 0: its first batch takes two bitmaps


def fan_out_pipeline(prefix: str) -> Pipeline:
    p = Pipeline(f"onepass-{prefix}")
    src = p.topic(f"{prefix}.in", schema="n BIGINT NOT NULL", partitions=2)
    out = p.topic(f"{prefix}.out", schema="n BIGINT, copy INT")

    @p.processor(inputs=[src], outputs=[out])
    def spread(df):
        # n % 5 == 0: filtered; n % 5 == 1: two copies; n % 5 == 2: dead-lettered by the function itself
        kept = df.where(F.col("n") % 5 != 0)
        copies = F.when(F.col("n") % 5 == 1, F.array(F.lit(0), F.lit(1))).otherwise(F.array(F.lit(0)))
        rows = kept.withColumn("copy", F.explode(copies))
        return rows.withColumn("_route", F.when(F.col("n") % 5 == 2, F.lit("dlq")).otherwise(F.lit("out")))

    return p


def test_a_stateless_batch_runs_in_one_job_and_its_books_are_exact(spark, bootstrap, tmp_path):
    prefix = uuid.uuid4().hex[:8]
    p = fan_out_pipeline(prefix)
    Admin(bootstrap).create_topic(f"{prefix}.in", 2)
    records = [Rec(0, None, json.dumps({"n": n}).encode()) for n in range(N)]
    records += [Rec(1, None, json.dumps({"n": n}).encode()) for n in range(N, N + 500)]
    records += [Rec(1, b"bad", b"not json"), Rec(0, b"bad", b"{}")]  # no JSON; no n (NOT NULL)
    produce(bootstrap, f"{prefix}.in", records)
    # The foreachBatch path, whose one job this tests (direct is the default)
    s = settings(tmp_path, bootstrap, flow="static", max_offsets_per_trigger=100_000, direct=False)

    runner = Runner(p, s, spark=spark, available_now=True).start()
    assert runner.wait(300)
    runner.stop()

    ns = range(N + 500)
    out = Counter(json.loads(r["value"])["n"] for r in read_topic(spark, bootstrap, f"{prefix}.out"))
    assert out == Counter({n: 2 if n % 5 == 1 else 1 for n in ns if n % 5 in (1, 3, 4)})
    dlq = read_topic(spark, bootstrap, f"{prefix}.in.dlq")
    assert sorted(json.loads(r["value"])["n"] for r in dlq if r["key"] is None) == [n for n in ns if n % 5 == 2]
    assert sorted(bytes(r["value"]) for r in dlq if r["key"] is not None) == [b"not json", b"{}"]

    progress = progress_records(s, p.name)
    assert all(r["accounting"]["balanced"] and not r["accounting"]["violations"] for r in progress), progress
    total = Counter()
    for r in progress:
        total.update({k: r["accounting"][k] for k in ("in", "out", "emitted", "filtered", "dlq", "refused")})
    assert total == {
        "in": N + 502,
        "out": sum(1 for n in ns if n % 5 in (1, 3, 4)),  # input records with an output row
        "emitted": sum(1 for n in ns if n % 5 == 1),  # their second copies
        "filtered": sum(1 for n in ns if n % 5 == 0),
        "dlq": sum(1 for n in ns if n % 5 == 2) + 2,
        "refused": sum(1 for n in ns if n % 5 == 2),
    }
    # One Spark job per batch, and one more for the batch whose undecodable records were dead-lettered
    runs = {r["run_id"] for r in progress}
    jobs = sum(len(spark.sparkContext.statusTracker().getJobIdsForGroup(run)) for run in runs)
    assert len(progress) == 1 and jobs == 2, (len(progress), jobs)


def test_a_function_whose_plan_drops_its_input_is_counted_the_three_job_way(spark, bootstrap, tmp_path):
    """Spark's optimizer removes a read below a filter it knows is false, and the Observations on it with the
    read: they would never complete, and the batch would wait on them for ever. Such a processor's batches take
    the three-job path, and their books still balance."""
    prefix = uuid.uuid4().hex[:8]
    p = Pipeline(f"onepass-none-{prefix}")
    src = p.topic(f"{prefix}.in", schema="n BIGINT", partitions=2)
    out = p.topic(f"{prefix}.out", schema="n BIGINT")

    @p.processor(inputs=[src], outputs=[out])
    def nothing(df):
        return df.where(F.lit(False))

    Admin(bootstrap).create_topic(f"{prefix}.in", 2)
    produce(bootstrap, f"{prefix}.in", [Rec(n % 2, None, json.dumps({"n": n}).encode()) for n in range(10)])
    s = settings(tmp_path, bootstrap, direct=False)  # the foreachBatch path (direct is the default)
    runner = Runner(p, s, spark=spark, available_now=True).start()
    assert runner.wait(120), "the batch waited on Observations the optimizer had removed"
    runner.stop()
    progress = progress_records(s, p.name)
    assert all(r["accounting"]["balanced"] and not r["accounting"]["violations"] for r in progress), progress
    assert sum(r["accounting"]["in"] for r in progress) == sum(r["accounting"]["filtered"] for r in progress) == 10


def test_a_plan_of_row_by_row_operators_keeps_its_input_order_and_anything_else_does_not(spark):
    # A stateless result in its input records' order is written unsorted (docs/pipelines.md, "Outputs"); one whose
    # plan may reorder rows is sorted by timestamp before its write
    from weir.runtime.routing import keeps_order as _keeps_order

    df = spark.range(10).select(F.col("id").alias("n"), F.col("id").cast("timestamp").alias("timestamp"))
    table = spark.range(5).select(F.col("id").alias("n"), F.lit("x").alias("tag"))
    assert _keeps_order(df.where(F.col("n") > 2).withColumn("m", F.explode(F.array(F.col("n"), F.lit(0)))))
    assert _keeps_order(df.unionByName(df))
    for reordered in (
        df.join(table, "n"),
        df.groupBy("n").count(),
        df.orderBy(F.col("n").desc()),
        df.repartition(3),
        df.dropDuplicates(["n"]),
        df.limit(3),
    ):
        assert not _keeps_order(reordered), reordered._jdf.queryExecution().optimizedPlan().toString()
