"""Where a connector batch's time goes: Spark's Kafka source alone, then decoding JSON in Python (weir's decoders
through mapInArrow, what a processor does) or in the JVM (Spark's from_json, what a real-time processor does), then
writing through weir-kafka's sink or Spark's Kafka sink, in one run over the same records.

    .venv/bin/python bench/connector_stages.py [--records 400000] [--limit N]

One embedded Apache Kafka broker started here, one topic of 4 partitions of about 140 B JSON orders, one Spark
session (local[2]); each stage is one query with Trigger.AvailableNow from the earliest offset into its own
checkpoint (`--limit`: maxOffsetsPerTrigger, many small batches instead of one). The sink stages keep amount > 10
and write {id, user, amount, ts} to a topic of their own. Prints rows/s per stage and its ratio to Spark's source
alone (raw -> noop), and the median addBatch.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from weir.kafka import Admin
from weir.kafka.broker import embedded_broker, free_port

SCHEMA = "id BIGINT, user STRING, amount DOUBLE, ts BIGINT, note STRING"


def produce(bootstrap: str, topic: str, n: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(n):
        doc = {"id": i, "user": f"u{i % 1000}", "amount": random.random() * 100, "ts": int(time.time() * 1000),
               "note": "x" * 60}  # fmt: skip
        producer.produce(topic, json.dumps(doc).encode(), key=f"u{i % 1000}".encode())
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--limit", type=int, default=None, help="maxOffsetsPerTrigger (default: one batch)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="weir-bench-stages-"))
    broker = embedded_broker(scratch / "home", free_port(), kind="kafka")
    broker.start()
    load = os.getloadavg()[0]
    try:
        bs, topic = broker.bootstrap, f"in-{uuid.uuid4().hex[:6]}"
        Admin(bs).create_topic(topic, partitions=4)
        produce(bs, topic, args.records)
        from pyspark.sql import functions as F

        import weir
        from weir.kafka import connector

        spark = weir.spark_session("weir-bench-stages", master="local[2]",
                                   conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"})  # fmt: skip
        spark.sparkContext.setLogLevel("ERROR")
        base = {"kafka.bootstrap.servers": bs, "subscribe": topic, "startingOffsets": "earliest"}
        if args.limit:
            base["maxOffsetsPerTrigger"] = str(args.limit)
        decoded = {"valueFormat": "json", "valueSchema": SCHEMA}
        stages = {
            "raw": lambda: spark.readStream.format("kafka").options(**base).load(),
            "python json": lambda: connector.read(spark.readStream, {**base, **decoded}, True),
            "jvm json": lambda: connector.read(spark.readStream, {**base, **decoded}, True, in_jvm=True),
        }

        def run(label: str, frame, sink: str) -> tuple[float, float]:
            cp = str(scratch / f"cp-{label.replace(' ', '-')}")
            if sink != "noop":
                out = f"out-{uuid.uuid4().hex[:6]}"
                Admin(bs).create_topic(out, partitions=4)
                value = F.to_json(F.struct("id", "user", "amount", "ts")).cast("binary")
                frame = frame.where(F.col("amount") > 10).select(F.col("user").cast("binary").alias("key"),
                                                                 value.alias("value"))  # fmt: skip
            writer = frame.writeStream.trigger(availableNow=True).option("checkpointLocation", cp).format(sink)
            if sink != "noop":
                writer = writer.option("kafka.bootstrap.servers", bs).option("topic", out)
            began = time.perf_counter()
            query = writer.start()
            query.awaitTermination()
            seconds = time.perf_counter() - began
            progress = [p for p in query.recentProgress if p.numInputRows > 0]
            rows = sum(p.numInputRows for p in progress)
            assert rows == args.records, f"{label}: {rows} rows of {args.records}"
            adds = sorted(p.durationMs.get("addBatch", 0) for p in progress)
            return rows / seconds, adds[len(adds) // 2]

        run("warm-up", stages["raw"](), "noop")
        figures = []
        for sink in ("noop", "weir-kafka", "kafka"):
            for name, frame in stages.items():
                if sink != "noop" and name == "raw":
                    continue
                label = f"{name} -> {sink}"
                figures.append((label, *run(label, frame(), sink)))
        spark.stop()
    finally:
        broker.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    baseline = figures[0][1]
    print(f"{args.records:,} records, {'one batch' if not args.limit else f'{args.limit:,} per batch'}; "
          f"load {load:.1f} before, {os.getloadavg()[0]:.1f} after")  # fmt: skip
    for label, rate, add in figures:
        print(f"  {label:28s} {rate:>10,.0f} rows/s  {rate / baseline:5.2f}x raw -> noop   addBatch median {add} ms")


if __name__ == "__main__":
    main()
