"""The demo's release story (docs/releases.md): the next version of `enrich` has a bug that drops about 2% of
orders. Run as a shadow beside the live `enrich`, it shows the orders it would drop before it goes live;
released anyway, the monitor fires `release_drift` within its first batches; rolled back, `weir backfill
--version` writes exactly the orders it dropped into `orders.enriched`, each once.

`enrich` below is the candidate: the file `weir shadow shop enrich --code examples/shop/release.py` names.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from examples.shop.pipeline import enriched
from weir.pipeline.routes import FILTERED, OUT, ROUTE

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from weir.config import Settings
    from weir.pipeline import Pipeline
    from weir.runtime.runner import Runner
    from weir.shadow.start import Shadowing

# How long the demo waits for the candidate's first batch (a loaded machine's start of 11 queries and a backlog:
# 3 minutes seen at two busy loops), then for the monitor's release_drift alert, which needs that batch's books
FIRST_BATCH_WAIT_S = 300.0
DRIFT_WAIT_S = 180.0


def enrich(orders: DataFrame, customers: DataFrame) -> DataFrame:
    """The live `enrich`, plus a rule meant for test orders that also catches one real order in 50."""
    result = enriched(orders, customers)
    test_order = (F.col(ROUTE) == OUT) & (F.abs(F.hash("order_id")) % 50 == 0)
    return result.withColumn(ROUTE, F.when(test_order, F.lit(FILTERED)).otherwise(F.col(ROUTE)))


CODE = __file__


def begin_shadow(spark: SparkSession, pipeline: Pipeline, settings: Settings) -> tuple[Shadowing, Runner] | None:
    """The candidate run as a shadow of the live `enrich`, on the live batches from now on (from its first, when
    it has committed none yet); None before the live query started."""
    from weir.shadow.start import begin, plan

    sh = plan(pipeline, "enrich", CODE, settings)
    if not sh.live_checkpoint.has_run():
        return None  # the live query has not started yet
    runner = sh.runner(spark=spark)
    runner.lock()
    try:
        begin(sh)
        runner.start()
    except BaseException:
        runner.stop()
        raise
    return sh, runner


def shadow_lines(spark: SparkSession, pipeline: Pipeline, settings: Settings, sh: Shadowing) -> list[str]:
    """What the shadow found, in a few lines: its books beside the live ones, and the records it would drop."""
    from weir.shadow import record
    from weir.shadow.compare import compare

    rec = record.read(sh.checkpoint)
    if rec is None:
        return ["the shadow did not begin"]
    report = compare(spark, settings, pipeline, rec, sh.checkpoint, examples=2)
    if report.compared is None:
        return ["the shadow compared no batch yet (the live enrich ran none since it began)"]
    live, shadow = report.books["live"], report.books["shadow"]
    share = lambda b: b["filtered"] / b["in"] if b["in"] else 0.0  # noqa: E731
    kinds = report.topics.get("orders.enriched", {})
    lines = [
        f"weir shadow: candidate {report.candidate_version} beside live {report.live_version}, batches "
        f"{report.compared[0]}-{report.compared[1]}, {report.records_in} orders: filtered {share(live):.2%} live, "
        f"{share(shadow):.2%} candidate; orders.enriched: {kinds.get('same', 0)} same, {kinds.get('missing', 0)} "
        f"missing, {kinds.get('extra', 0)} extra, {kinds.get('changed', 0)} changed",
    ]
    lines += [f"  {e['kind']}: {e['record']} {e['live']}" for e in report.examples[:2]]
    return lines


def drift_alert(settings: Settings, runner: Runner, timeout: float = DRIFT_WAIT_S) -> str | None:
    """The monitor's release_drift alert once it fires (its message), or None: after `timeout` seconds from the
    candidate's first committed batch of enrich (the books drift is judged by), or when no batch came within
    FIRST_BATCH_WAIT_S."""
    from weir.monitor.client import ask

    deadline = time.monotonic() + FIRST_BATCH_WAIT_S
    while runner.snapshot()["enrich"].batches == 0:
        if time.monotonic() >= deadline:
            return None
        time.sleep(1.0)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = ask(settings, path="/api/alerts").body or {}
        for event in [*body.get("active", []), *body.get("history", [])]:
            if event.get("rule") == "release drift" and event.get("status") == "firing":
                return str(event.get("message"))
        time.sleep(1.0)
    return None


def repair(spark: SparkSession, pipeline: Pipeline, settings: Settings, version: str) -> Any:
    """`weir backfill shop enrich --version <version>` with the live code: the dropped orders, from the lake."""
    from weir.backfill import backfill

    return backfill(pipeline, "enrich", settings=settings, spark=spark, version=version)


def exactly_once(spark: SparkSession, settings: Settings, pipeline: Pipeline) -> tuple[int, int, int]:
    """(orders the live enrich's checkpoint committed, how many of them have no record in orders.enriched or
    orders.dlq from enrich, how many have more than one): after the repair, 0 and 0. Spark jobs; three numbers
    reach the driver."""
    import json

    from weir.checkpoint.files import processor_checkpoint
    from weir.checkpoint.log import read_offsets
    from weir.kafka.headers import PROCESSOR_HEADER, SOURCE_HEADER
    from weir.runtime.routing import header_value

    cp = processor_checkpoint(settings.checkpoint_root, pipeline.processors["enrich"].checkpoint)
    ends = read_offsets(cp).committed.get("orders", {})
    opts = settings.kafka_options()
    orders = (
        spark.read.format("weir-kafka").options(**opts).option("subscribe", "orders")
        .option("startingOffsets", "earliest")
        .option("endingOffsets", json.dumps({"orders": {str(p): e for p, e in ends.items()}}))
        .load().select(F.concat_ws("/", "topic", "partition", "offset").alias("src"))
    )  # fmt: skip

    written = (
        spark.read.format("weir-kafka").options(**opts).option("subscribe", "orders.enriched,orders.dlq")
        .option("startingOffsets", "earliest").load()
        .where(header_value(PROCESSOR_HEADER) == "enrich").select(header_value(SOURCE_HEADER).alias("src"))
    )  # fmt: skip
    per = written.groupBy("src").count()
    processed = orders.count()
    missing = orders.join(per, "src", "left_anti").count()
    twice = per.join(orders, "src").where(F.col("count") > 1).count()
    return processed, missing, twice
