"""Latency of Spark's real-time mode against a micro-batch query over the same Kafka source, in one run.

    .venv/bin/python bench/realtime.py [--rate 5000] [--seconds 60] [--checkpoint-interval "5 seconds"]

One stateless query (upper-case each value), Kafka to Kafka through Spark's own connector, run twice over topics of
their own: with `trigger(realTime=...)` (records stream through long-running tasks; the duration is how often it
checkpoints), and with the default micro-batch trigger as the baseline. A producer sends `--rate` records a second
for `--seconds`, each carrying its send time; a consumer reads the output and takes, per record, the time from its
send to the output record's creation by Spark's producer (its CreateTime) and to its arrival here. Prints p50, p95
and p99 of each, the records in and out (each must come out once), and real-time over micro-batch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer

from weir.kafka import Admin
from weir.kafka.broker import KafkaBroker, free_port


def quantiles(values: list[float]) -> str:
    if not values:
        return "no records"
    q = statistics.quantiles(values, n=100, method="inclusive")
    return f"p50 {q[49]:.0f} ms, p95 {q[94]:.0f} ms, p99 {q[98]:.0f} ms"


def produce(bootstrap: str, topic: str, rate: int, seconds: float) -> int:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "enable.idempotence": True})
    sent, start = 0, time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        while sent < elapsed * rate:
            producer.produce(topic, key=str(sent).encode(), value=json.dumps({"n": sent, "t": time.time()}).encode())
            sent += 1
        producer.poll(0)
        time.sleep(0.001)
    assert producer.flush(60) == 0
    return sent


def collect(bootstrap: str, topic: str, stop: threading.Event, out: list[tuple[int, float, float]]) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}", "auto.offset.reset": "earliest",
                         "fetch.wait.max.ms": 10})  # fmt: skip
    consumer.subscribe([topic])
    try:
        while not stop.is_set():
            for m in consumer.consume(1000, 0.1):
                if m.error() is None:
                    sent = json.loads(m.value().decode().lower())
                    out.append((sent["n"], m.timestamp()[1] / 1000 - sent["t"], time.time() - sent["t"]))
    finally:
        consumer.close()


def run(spark, bootstrap: str, name: str, trigger: dict, args: argparse.Namespace, scratch: Path) -> dict:
    source, sink = f"{name}.in", f"{name}.out"
    for topic in (source, sink):
        Admin(bootstrap).create_topic(topic, 2)
    frame = spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", source)
    upper = frame.option("startingOffsets", "latest").load().selectExpr("key", "upper(cast(value AS STRING)) AS value")
    writer = upper.writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", sink)
    writer = writer.option("checkpointLocation", str(scratch / name)).outputMode("update")
    query = writer.trigger(**trigger).start()
    received: list[tuple[int, float, float]] = []
    stop = threading.Event()
    reader = threading.Thread(target=collect, args=(bootstrap, sink, stop, received), daemon=True)
    reader.start()
    try:
        time.sleep(args.warmup)  # the query's first batch, its tasks started
        sent = produce(bootstrap, source, args.rate, args.seconds)
        deadline = time.monotonic() + 120
        while len(received) < sent and time.monotonic() < deadline and query.exception() is None:
            time.sleep(0.5)
    finally:
        stop.set()
        reader.join(10)
        query.stop()
    numbers = [n for n, _, _ in received]
    return {"sent": sent, "out": len(numbers), "distinct": len(set(numbers)),
            "created": [c * 1000 for _, c, _ in received], "arrived": [a * 1000 for _, _, a in received]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=int, default=5000, help="records a second")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--checkpoint-interval", default="5 seconds", help="real-time mode's trigger duration")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds between a query's start and the records")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="weir-bench-"))
    broker = KafkaBroker(scratch / "broker", free_port())
    broker.start()
    import weir  # Spark only after the broker is up

    spark = weir.spark_session("weir-bench-realtime", master="local[4]", conf={"spark.ui.enabled": "false"})
    try:
        results = {
            "real-time": run(spark, broker.bootstrap, "rt", {"realTime": args.checkpoint_interval}, args, scratch),
            "micro-batch": run(spark, broker.bootstrap, "mb", {"processingTime": "0 seconds"}, args, scratch),
        }
    finally:
        spark.stop()
        broker.stop()
    for name, r in results.items():
        print(f"{name}: {r['sent']:,} sent, {r['out']:,} out ({r['distinct']:,} distinct); send to output record: "
              f"{quantiles(r['created'])}; send to arrival here: {quantiles(r['arrived'])}")  # fmt: skip
    rt, mb = (statistics.quantiles(results[k]["arrived"], n=100)[98] for k in ("real-time", "micro-batch"))
    print(f"p99 real-time over micro-batch: {rt / mb:.2f}; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
