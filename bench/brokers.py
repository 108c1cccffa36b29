"""The two embedded brokers side by side, in one run: Apache Kafka (KRaft, from the jars of `weir jars fetch`)
against Tansu, on the same machine, the same client and the same records: how long each takes to answer after its
start, how fast it takes and serves records, and the memory it holds. The figures `broker_kind`'s default rests on
(docs/brokers.md).

    .venv/bin/python bench/brokers.py [--records 1000000] [--partitions 4]

Each broker in turn: start it (time until it answers metadata), produce the records with an idempotent producer
(every acknowledgement awaited), consume them all from the start with one consumer, and read its RSS; then stop it.
Prints each figure, and Kafka's over Tansu's.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from weir.kafka import Admin
from weir.kafka.broker import KafkaBroker, TansuBroker, free_port


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(broker, records: int, partitions: int) -> dict[str, float]:
    began = time.monotonic()
    status = broker.start()
    started = time.monotonic() - began
    bootstrap, topic = broker.bootstrap, "bench.brokers"
    Admin(bootstrap).create_topic(topic, partitions)
    value = b'{"user":"u0000042","amount":12.5,"item":"sku-00017","ts":"2026-12-06T01:02:03.456Z","pad":"' + b"x" * 60
    value += b'"}'
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                         "batch.size": 1_000_000, "compression.type": "none"})  # fmt: skip
    began = time.monotonic()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=value, key=str(i % 1000).encode(), partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(300)
    produced = records / (time.monotonic() - began)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
                         "fetch.wait.max.ms": 50, "auto.offset.reset": "earliest"})  # fmt: skip
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    began, seen = time.monotonic(), 0
    while seen < records and time.monotonic() - began < 600:
        seen += sum(1 for m in consumer.consume(10_000, timeout=1.0) if m.error() is None)
    consumed = seen / (time.monotonic() - began)
    consumer.close()
    memory = rss_mb(status.pid)
    broker.stop()
    return {"start s": started, "produce rec/s": produced, "consume rec/s": consumed, "RSS MB": memory,
            "records seen": seen}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="weir-bench-brokers-") as scratch:
        figures = {}
        for name, broker in (
            ("kafka", KafkaBroker(scratch, free_port())),
            ("tansu", TansuBroker(scratch, free_port())),
        ):
            figures[name] = measure(broker, args.records, args.partitions)
            print(name, {k: round(v, 2) for k, v in figures[name].items()}, flush=True)
    for k in figures["kafka"]:
        if k != "records seen":
            print(f"{k}: kafka {figures['kafka'][k]:,.1f}, tansu {figures['tansu'][k]:,.1f}, "
                  f"kafka/tansu {figures['kafka'][k] / figures['tansu'][k]:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
