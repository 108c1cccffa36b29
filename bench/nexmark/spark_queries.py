"""Nexmark's queries as plain PySpark Structured Streaming, for bench/nexmark.py: Spark's own Kafka connector
(`spark.readStream.format("kafka")`, its jars in weir's session) -> from_json -> the query -> `format("kafka")`,
Trigger.AvailableNow, local[2], spark.sql.shuffle.partitions 2, no maxOffsetsPerTrigger (Spark's default).

    python bench/nexmark/spark_queries.py <q0|q1|q2|q5|q7|q8>

    q0  bids -> auction, bidder, price, dateTime, extra
    q1  the same with price * 908 DIV 1000
    q2  auction, price where auction % 123 = 0
    q5  groupBy(window(10 s, 2 s), auction).count(), then groupBy(window(window_time(window), 2 s)) (Spark's
        chained time windows: one group per sliding window) with max(num) and the (num, auction) list; the
        auctions whose count is the maximum
    q7  groupBy(window(10 s)).agg(max(struct(price, auction, bidder, dateTime, extra))): the bid with the highest
        price per window. One bid per window: ties at the maximum are not kept (see bench/nexmark.py)
    q8  persons and auctions (seller as id) in one stream, groupBy(window(10 s), id) with max(name), whether a
        person event and an auction came; the ids with both: (id, name, starttime)

Event time: timestamp_millis(dateTime), watermark 4 s (Nexmark's). Aggregations write in append mode.
NX_BOOTSTRAP, NX_OUTPUT (topic), NX_CHECKPOINT, NX_STATS (a JSON line: rows, done, batches) configure it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

import weir

BOOTSTRAP = os.environ.get("NX_BOOTSTRAP", "127.0.0.1:9092")
PERSON = ("id BIGINT, name STRING, emailAddress STRING, creditCard STRING, city STRING, state STRING, "
          "dateTime BIGINT, extra STRING")  # fmt: skip
AUCTION = ("id BIGINT, itemName STRING, description STRING, initialBid BIGINT, reserve BIGINT, dateTime BIGINT, "
           "expires BIGINT, seller BIGINT, category BIGINT, extra STRING")  # fmt: skip
BID = "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, dateTime BIGINT, extra STRING"
SCHEMAS = {"person": PERSON, "auction": AUCTION, "bid": BID}
WATERMARK = "4 seconds"
PASSED = ("auction", "bidder", "price", "dateTime", "extra")


def read(spark: SparkSession, topic: str) -> DataFrame:
    raw = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", BOOTSTRAP)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    parsed = raw.select(F.from_json(F.col("value").cast("string"), SCHEMAS[topic]).alias("e")).select("e.*")
    return parsed.withColumn("event_time", F.timestamp_millis("dateTime"))


def record(key: Column, *fields: Column | str) -> list[Column]:
    """The (key, value) columns the Kafka sink takes: the key as text, the fields as a JSON object."""
    return [key.cast("string").alias("key"), F.to_json(F.struct(*fields)).alias("value")]


def query(spark: SparkSession, name: str) -> DataFrame:
    if name in ("q0", "q1", "q2"):
        bids = read(spark, "bid")
        if name == "q0":
            return bids.select(*record(F.col("auction"), *PASSED))
        if name == "q1":
            euros = F.expr("price * 908 div 1000").alias("price")
            return bids.select(*record(F.col("auction"), "auction", "bidder", euros, "dateTime", "extra"))
        return bids.where(F.col("auction") % 123 == 0).select(*record(F.col("auction"), "auction", "price"))
    if name == "q5":
        counts = (
            read(spark, "bid")
            .withWatermark("event_time", WATERMARK)
            .groupBy(F.window("event_time", "10 seconds", "2 seconds"), F.col("auction"))
            .agg(F.count(F.lit(1)).alias("num"))
        )
        # window_time(window) is the window's end less 1 µs: the 2 s window holding it is one per sliding window.
        per_window = counts.groupBy(F.window(F.window_time("window"), "2 seconds").alias("w")).agg(
            F.max("num").alias("best"), F.collect_list(F.struct("num", "auction")).alias("all")
        )
        top = per_window.select(
            (F.unix_millis(F.col("w.end")) - 10_000).alias("starttime"),
            F.explode(F.filter("all", lambda x: x["num"] == F.col("best"))).alias("t"),
        )
        return top.select(*record(F.col("starttime"), "starttime", F.col("t.auction").alias("auction"),
                                  F.col("t.num").alias("num")))  # fmt: skip
    if name == "q7":
        top = (
            read(spark, "bid")
            .withWatermark("event_time", WATERMARK)
            .groupBy(F.window("event_time", "10 seconds"))
            .agg(F.max(F.struct("price", "auction", "bidder", "dateTime", "extra")).alias("top"))
        )
        start = F.unix_millis(F.col("window.start")).alias("starttime")
        return top.select(*record(start, start, *(F.col(f"top.{f}").alias(f) for f in PASSED)))
    if name == "q8":
        persons = read(spark, "person").select(
            "id", "name", "event_time", F.lit(1).alias("person"), F.lit(0).alias("sold")
        )
        sellers = read(spark, "auction").select(
            F.col("seller").alias("id"), F.lit(None).cast("string").alias("name"), "event_time",
            F.lit(0).alias("person"), F.lit(1).alias("sold"),
        )  # fmt: skip
        both = (
            persons.unionByName(sellers)
            .withWatermark("event_time", WATERMARK)
            .groupBy(F.window("event_time", "10 seconds"), F.col("id"))
            .agg(F.max("name").alias("name"), F.max("person").alias("person"), F.max("sold").alias("sold"))
            .where((F.col("person") == 1) & (F.col("sold") == 1))
        )
        start = F.unix_millis(F.col("window.start")).alias("starttime")
        return both.select(*record(F.col("id"), "id", "name", start))
    raise SystemExit(f"unknown query {name}")


def main(name: str) -> None:
    conf = {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.streaming.numRecentProgressUpdates": "100000",
    }
    spark = weir.spark_session(f"nexmark-spark-{name}", master="local[2]", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    stream = (
        query(spark, name)
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", BOOTSTRAP)
        .option("topic", os.environ["NX_OUTPUT"])
        .option("checkpointLocation", os.environ["NX_CHECKPOINT"])
        .outputMode("append")
        .trigger(availableNow=True)
        .start()
    )
    stream.awaitTermination()
    done = time.time()
    progress = stream.recentProgress
    batches = [[int(p.numInputRows), int(p.durationMs.get("triggerExecution", 0))] for p in progress]
    # when the first batch began (its progress's timestamp is its trigger's start): the split of bench/nexmark.py
    first = datetime.fromisoformat(progress[0].timestamp.replace("Z", "+00:00")).timestamp() if progress else None
    with open(os.environ["NX_STATS"], "a") as f:
        f.write(json.dumps({"rows": sum(r for r, _ in batches), "done": done, "batches": batches, "first": first}))
        f.write("\n")
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
