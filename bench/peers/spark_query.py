"""Hand-written PySpark queries over weir-kafka, for bench/peers.py, Trigger.AvailableNow, local[2]:

    window:    readStream weir-kafka (valueFormat=json) -> withWatermark -> groupBy(window(ts, 10 s), user)
               .agg(count, sum) in append mode -> to_json -> writeStream weir-kafka
    stateless: readStream weir-kafka -> filter amount > 50 -> select -> to_json -> writeStream weir-kafka

PEER_* variables as in common.py, plus PEER_CHECKPOINT and PEER_MAX_PER_TRIGGER (0: no limit). The stats line
carries "batches": [[input rows, triggerExecution ms], ...] from the query's progress, and "first_batch": the
epoch s at which the first batch with input started.
"""

from __future__ import annotations

import os
import sys
from datetime import datetime

from common import BOOTSTRAP, DELAY_MS, INPUT, OUTPUT, SIZE_MS, Stats
from pyspark.sql import functions as F

import weir

SCHEMA = "id BIGINT, user STRING, amount DOUBLE, ts BIGINT, item STRING, country STRING, note STRING"


def main(mode: str) -> None:
    stats = Stats()
    conf = {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.streaming.numRecentProgressUpdates": "100000",
    }
    spark = weir.spark_session(f"peers-{mode}", master="local[2]", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    reader = (
        spark.readStream.format("weir-kafka")
        .option("kafka.bootstrap.servers", BOOTSTRAP)
        .option("subscribe", INPUT)
        .option("startingOffsets", "earliest")
        .option("valueFormat", "json")
        .option("valueSchema", SCHEMA)
    )
    per_trigger = int(os.environ.get("PEER_MAX_PER_TRIGGER", "0"))
    if per_trigger > 0:
        reader = reader.option("maxOffsetsPerTrigger", str(per_trigger))
    events = reader.load()
    if mode == "window":
        out = (
            events.withColumn("event_time", F.timestamp_millis("ts"))
            .withWatermark("event_time", f"{DELAY_MS / 1000} seconds")
            .groupBy(F.window("event_time", f"{SIZE_MS // 1000} seconds"), F.col("user"))
            .agg(F.count(F.lit(1)).alias("count"), F.sum("amount").alias("sum"))
            .select(
                F.col("user").cast("binary").alias("key"),
                F.to_json(
                    F.struct(
                        "user",
                        F.unix_millis(F.col("window.start")).alias("start"),
                        F.unix_millis(F.col("window.end")).alias("end"),
                        "count",
                        "sum",
                    )
                ).alias("value"),
            )
        )
    else:
        out = events.where(F.col("amount") > 50).select(
            F.col("user").cast("binary").alias("key"),
            F.to_json(F.struct("id", "user", "amount", "ts", (F.col("amount") * 2).alias("doubled"))).alias("value"),
        )
    query = (
        out.writeStream.format("weir-kafka")
        .option("kafka.bootstrap.servers", BOOTSTRAP)
        .option("topic", OUTPUT)
        .option("checkpointLocation", os.environ["PEER_CHECKPOINT"])
        .outputMode("append")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    batches, first = [], None
    for p in query.recentProgress:
        rows = int(p.numInputRows)
        batches.append([rows, int(p.durationMs.get("triggerExecution", 0))])
        if rows and first is None:
            first = datetime.fromisoformat(p.timestamp.replace("Z", "+00:00")).timestamp()
        stats.rows += rows
    stats.first = first
    stats.write(batches=batches, first_batch=first)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "window")
