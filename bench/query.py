"""`weir sql` against a raw consumer: one hour's revenue by category out of a 24 h topic, lake plus tail.

    .venv/bin/python bench/query.py [--records 2000000] [--partitions 4] [--tail-minutes 10]

Against one embedded broker started here and stopped at the end:
  1. produce N JSON orders whose Kafka timestamps (create time) spread evenly over 24 hours (UTC), all but the
     last --tail-minutes; the archiver (Spark local[2], AvailableNow) copies them into the lake's Delta table;
     then produce the last --tail-minutes, which stay in the broker only (the live tail);
  2. baseline: one confluent-kafka consumer scans the whole topic and aggregates the hour in Python (json.loads
     only of the hour's records: the timestamp is read first);
  3. `weir.query.run` (DuckDB, the default engine) answers
     `SELECT category, count(*), sum(amount) FROM orders WHERE timestamp in the hour GROUP BY 1`
     for a middle hour (all in the lake) and for the last hour (lake plus tail); three runs each, the median.
The answers must equal the baseline's. The ratio is the point (goal: weir sql at least 20x faster).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from rich.console import Console
from rich.table import Table

from weir.config import load
from weir.kafka import Admin
from weir.kafka.broker import EmbeddedBroker, free_port
from weir.pipeline import Pipeline
from weir.query import run

console = Console(width=max(120, shutil.get_terminal_size().columns))
SCHEMA = "order_id BIGINT, user STRING, category STRING, amount DOUBLE"
CATEGORIES = ("books", "electronics", "garden", "groceries", "toys", "travel")
DAY0 = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=24)  # the last day
DAY_MS = 86_400_000
TARGET = 20.0
QUERY = (
    "SELECT category, count(*) AS orders, sum(amount) AS revenue FROM orders "
    "WHERE timestamp >= TIMESTAMPTZ '{start}' AND timestamp < TIMESTAMPTZ '{end}' GROUP BY category ORDER BY category"
)


def produce(bootstrap: str, lo: int, hi: int, n: int, partitions: int) -> float:
    rnd = random.Random(lo)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000, "acks": 1,
         "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1_048_576}
    )  # fmt: skip
    t0 = time.perf_counter()
    for i in range(lo, hi):
        value = json.dumps(
            {"order_id": i, "user": f"u{rnd.randrange(100_000):06d}", "category": CATEGORIES[i % 6],
             "amount": round(rnd.random() * 500, 2)}
        ).encode()  # fmt: skip
        ts = int(DAY0.timestamp() * 1000) + i * DAY_MS // n
        while True:
            try:
                producer.produce("orders", value, str(i).encode(), partition=i % partitions, timestamp=ts)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(300):
        raise RuntimeError("records were not delivered")
    return time.perf_counter() - t0


def raw_scan(bootstrap: str, start: datetime, end: datetime) -> tuple[dict[str, tuple[int, float]], int, float]:
    """The baseline: every record of the topic through one consumer, the hour's orders aggregated in Python."""
    bounds = Admin(bootstrap).offsets("orders")
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
        "enable.partition.eof": True, "fetch.queue.backoff.ms": 10, "fetch.wait.max.ms": 50,
    })  # fmt: skip
    lo_ms, hi_ms = int(start.timestamp() * 1000), int(end.timestamp() * 1000)
    agg: dict[str, list[float]] = {}
    t0 = time.perf_counter()
    consumer.assign([TopicPartition("orders", p, lo) for p, (lo, _) in bounds.items()])
    remaining = {p: hi for p, (lo, hi) in bounds.items() if hi > lo}
    rows = 0
    try:
        while remaining:
            for m in consumer.consume(num_messages=10_000, timeout=1.0):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(err)
                rows += 1
                if lo_ms <= m.timestamp()[1] < hi_ms:
                    v = json.loads(m.value())
                    a = agg.setdefault(v["category"], [0, 0.0])
                    a[0] += 1
                    a[1] += v["amount"]
                if m.partition() in remaining and m.offset() + 1 >= remaining[m.partition()]:
                    del remaining[m.partition()]
    finally:
        consumer.close()
    return {k: (int(c), s) for k, (c, s) in sorted(agg.items())}, rows, time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2_000_000, help="records over 24 hours")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--tail-minutes", type=int, default=10, help="the last minutes, left in the broker only")
    parser.add_argument("--runs", type=int, default=3, help="weir sql runs per query (the median counts)")
    args = parser.parse_args()
    n, parts = args.records, args.partitions
    cut = n - n * args.tail_minutes * 60_000 // DAY_MS  # first record of the tail
    scratch = Path(tempfile.mkdtemp(prefix="weir-query-bench-"))
    broker = EmbeddedBroker(scratch / "broker", free_port())
    rows_out: list[tuple[str, str, float, str]] = []
    checks: list[tuple[str, bool]] = []
    ratios: list[float] = []
    try:
        broker.start()
        Admin(broker.bootstrap).create_topic("orders", parts)
        console.print(f"producing {cut:,} records of 24 h into {parts} partitions, then archiving them ...")
        produced_s = produce(broker.bootstrap, 0, cut, n, parts)
        settings = load(
            home=str(scratch / "home"), bootstrap_servers=broker.bootstrap, lake=str(scratch / "lake"),
            checkpoint_root=str(scratch / "checkpoints"), spark_master="local[2]", max_offsets_per_trigger=500_000,
        )  # fmt: skip
        shop = Pipeline("querybench")
        shop.topic("orders", SCHEMA, key="order_id", partitions=parts, archived=True)

        import weir
        from weir.runtime.runner import Runner

        spark = weir.spark_session("weir-query-bench", settings=settings, conf={"spark.ui.enabled": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        t0 = time.perf_counter()
        runner = Runner(shop, settings, spark=spark, available_now=True).start()
        runner.wait()
        runner.stop()
        archived = runner.snapshot()["archive.orders"].totals.out
        archive_s = time.perf_counter() - t0
        spark.stop()
        console.print(f"producing the last {args.tail_minutes} minutes ({n - cut:,} records) into the broker only ...")
        produced_s += produce(broker.bootstrap, cut, n, n, parts)
        rows_out.append(("produce (confluent-kafka)", f"{n:,}", produced_s, ""))
        rows_out.append(("archive into the lake (Spark, AvailableNow)", f"{archived:,}", archive_s, "setup"))
        checks.append((f"the lake holds {archived:,} records, the tail {n - cut:,}", archived == cut))

        for label, hour in (("a middle hour (lake only)", 12), ("the last hour (lake + tail)", 23)):
            start = DAY0 + timedelta(hours=hour)
            end = start + timedelta(hours=1)
            expected, scanned, raw_s = raw_scan(broker.bootstrap, start, end)
            q = QUERY.format(start=start.isoformat(), end=end.isoformat())
            times, answer = [], None
            for _ in range(args.runs):
                t0 = time.perf_counter()
                answer = run(q, settings, pipeline=shop, timeout_s=300)
                times.append(time.perf_counter() - t0)
            got = {r["category"]: (r["orders"], r["revenue"]) for r in answer.table.to_pylist()}
            same = got.keys() == expected.keys() and all(
                got[k][0] == expected[k][0] and abs(got[k][1] - expected[k][1]) < 1e-6 * max(1.0, expected[k][1])
                for k in expected
            )
            checks.append((f"{label}: weir sql's answer equals the raw consumer's", same))
            median = statistics.median(times)
            ratios.append(raw_s / median)
            rows_out.append((f"{label}: raw consumer scans the topic", f"{scanned:,}", raw_s, "baseline"))
            rows_out.append((
                f"{label}: weir sql (DuckDB)", f"{sum(c for c, _ in got.values()):,}", median,
                f"{raw_s / median:.1f}x faster; runs {', '.join(f'{t:.2f}' for t in times)} s; "
                + answer.provenance[0].line(),
            ))  # fmt: skip
    finally:
        broker.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    table = Table("stage", "records", "seconds", "note", title=f"bench/query.py, {n:,} records over 24 h")
    for stage, records, seconds, note in rows_out:
        table.add_row(stage, records, f"{seconds:.2f}", note)
    console.print(table)
    low = min(ratios) if ratios else 0.0
    verdict = "meets" if low >= TARGET else "misses"
    console.print(f"weir sql vs a raw consumer scan: at least {low:.1f}x faster ({verdict} the {TARGET:.0f}x goal)")
    loadavg = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    console.print(f"load average (1, 5, 15 min): {loadavg} on {os.cpu_count()} cores")
    for what, ok in checks:
        console.print(f"  [{'green' if ok else 'red'}]{'ok' if ok else 'FAILED'}[/] {what}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
