"""The plain Structured Streaming query over Spark's own Kafka source and sink: readStream.format("kafka") ->
from_json -> filter amount > 10 -> to_json -> writeStream.format("kafka"), processingTime 0, local[2], no limit per
batch (LAT_HEADERS=1: each record with the headers weir writes, the `plain+headers` system). Runs until SIGTERM.
With LAT_MODE=window: withWatermark(2 s) -> groupBy(window(10 s), user) -> count, sum -> writeStream kafka.

Each batch's progress (input rows, addBatch and triggerExecution ms) is appended to LAT_STATS as a JSON line.
"""

from __future__ import annotations

import json
import os
import signal
import time

from common import BOOTSTRAP, DELAY_MS, INPUT, KEEP_ABOVE, OUTPUT, SIZE_MS, WINDOW
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener

import weir

SCHEMA = "id BIGINT, user STRING, amount DOUBLE, ts BIGINT, note STRING"


class Progress(StreamingQueryListener):
    def __init__(self, path: str) -> None:
        self.path = path

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        p = event.progress
        line = {"at_ms": round(time.time() * 1000), "batch": p.batchId, "input_rows": p.numInputRows,
                "duration_ms": dict(p.durationMs)}  # fmt: skip
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass


def _weir_like() -> list:
    """With LAT_HEADERS=1, the headers weir's direct path writes with each record (its processor,
    the input record behind it, its pipeline), so that a run tells the records' size apart from weir's path."""
    if os.environ.get("LAT_HEADERS") != "1":
        return []
    source = F.concat_ws("/", "topic", F.col("partition").cast("string"), F.col("offset").cast("string"))
    pairs = [("weir.processor", F.lit("keep")), ("weir.source", source), ("weir.pipeline", F.lit("latency"))]
    headers = F.array(*[F.struct(F.lit(k).alias("key"), v.cast("binary").alias("value")) for k, v in pairs])
    return [headers.alias("headers")]


def main() -> None:
    conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}
    conf.update(json.loads(os.environ.get("LAT_SPARK_CONF") or "{}"))
    spark = weir.spark_session("latency-plain", master="local[2]", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    spark.streams.addListener(Progress(os.environ["LAT_STATS"]))
    raw = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", BOOTSTRAP)
        .option("subscribe", INPUT)
        .option("startingOffsets", "earliest")
        .load()
    )
    events = raw.select("*", F.from_json(F.col("value").cast("string"), SCHEMA).alias("v")).select("*", "v.*")
    if WINDOW:  # Spark's own groupBy(window): the floor of --window
        out = (
            events.withColumn("event_time", F.timestamp_millis("ts"))
            .withWatermark("event_time", f"{DELAY_MS // 1000} seconds")
            .groupBy(F.window("event_time", f"{SIZE_MS // 1000} seconds"), F.col("user"))
            .agg(F.count(F.lit(1)).alias("count"), F.sum("amount").alias("sum"))
            .select(
                F.col("user").cast("binary").alias("key"),
                F.to_json(
                    F.struct(
                        "user", F.unix_millis("window.start").alias("start"), F.unix_millis("window.end").alias("end"),
                        "count", "sum",
                    )
                ).alias("value"),
            )
        )  # fmt: skip
    else:
        out = events.where(F.col("amount") > KEEP_ABOVE).select(
            F.col("key"), F.to_json(F.struct("id", "user", "amount", "ts")).alias("value"),
            *_weir_like(),
        )  # fmt: skip
    query = (
        out.writeStream.format("kafka")
        .option("kafka.bootstrap.servers", BOOTSTRAP)
        .option("topic", OUTPUT)
        .option("checkpointLocation", os.environ["LAT_CHECKPOINT"])
        .trigger(processingTime="0 seconds")
        .start()
    )
    signal.signal(signal.SIGTERM, lambda *_: query.stop())
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
