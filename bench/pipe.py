"""Throughput of the weir-kafka source and sink against a raw confluent-kafka baseline, in one run.

    .venv/bin/python bench/pipe.py [--records 1000000] [--partitions 4]

Stages, all against one embedded broker started here and stopped at the end:
  1. produce N JSON records of about 150 bytes with confluent-kafka (the input of every later stage);
  2. raw baseline: one confluent-kafka consumer reads the whole topic, touching each value, no parsing;
  3. weir source -> noop sink (availableNow), a cold run then a warm run of the same query;
  4. weir source with valueFormat=json -> Parquet file sink, several micro-batches, with a correctness check;
  5. weir sink: a batch read of the topic written back to a second topic, checked by its offsets.

Every ratio is against the raw baseline of the same run, so a busy machine moves both sides of it.
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
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from rich.console import Console
from rich.table import Table

from weir.pipe import Admin
from weir.pipe.broker import EmbeddedBroker, free_port

# Wide enough for the table even when piped to a file (rich falls back to 80 columns there).
console = Console(width=max(150, shutil.get_terminal_size().columns))

# The decoded fields of every record; stage 4 asks the source for exactly these.
VALUE_SCHEMA = "user STRING, event_time TIMESTAMP, amount DOUBLE, category STRING, note STRING"
CATEGORIES = ("books", "electronics", "garden", "groceries", "toys", "travel")
RECORD_BYTES = 150
NOOP_TARGET = 1.2  # warm weir->noop rows/s over the raw single-consumer baseline
PARQUET_TARGET = 110_000  # steady rows/s of the JSON -> Parquet query


@dataclass
class Result:
    stage: str
    rows: int
    seconds: float
    note: str = ""
    target: str = ""
    ok: bool | None = None  # None: no target for this figure

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("nan")


@dataclass
class Run:
    results: list[Result] = field(default_factory=list)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    baseline: float = 0.0

    def add(self, result: Result) -> Result:
        self.results.append(result)
        console.print(f"  {result.stage}: {result.rows:,} rows in {result.seconds:.2f}s = {result.rate:,.0f} rows/s")
        return result

    def check(self, what: str, ok: bool, detail: str) -> None:
        self.checks.append((what, ok, detail))
        console.print(f"  check {what}: {'[green]OK[/]' if ok else '[red]FAILED[/]'} ({detail})")


def make_values(n: int) -> tuple[list[bytes], list[bytes]]:
    """Keys and JSON values of about RECORD_BYTES each, built before the clock starts: the produce rate
    should measure the client and the broker, not json.dumps."""
    rng = random.Random(42)  # the same data every run, so runs compare
    start = datetime(2024, 5, 1, tzinfo=UTC)
    keys, values = [], []
    for i in range(n):
        user = f"u{rng.randrange(100_000)}"
        doc = {
            "user": user,
            "event_time": (start + timedelta(milliseconds=i * 37)).isoformat(timespec="microseconds"),
            "amount": round(rng.uniform(1, 500), 2),
            "category": CATEGORIES[i % len(CATEGORIES)],
            "note": "",
        }
        raw = json.dumps(doc, separators=(",", ":"))
        doc["note"] = "x" * max(0, RECORD_BYTES - len(raw))
        keys.append(user.encode())
        values.append(json.dumps(doc, separators=(",", ":")).encode())
    return keys, values


def produce(bootstrap: str, topic: str, partitions: int, keys: list[bytes], values: list[bytes]) -> Result:
    # Throughput settings: big batches and a short linger fill each request; uncompressed because on
    # loopback the CPU spent compressing costs more than the bytes saved (and readers then decompress).
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "acks": 1,
            "enable.idempotence": False,
            "compression.type": "none",
        }
    )
    t0 = time.perf_counter()
    for i, (k, v) in enumerate(zip(keys, values, strict=True)):
        # Explicit round-robin: every partition gets the same share, so Spark tasks are balanced.
        while True:
            try:
                producer.produce(topic, v, k, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    left = producer.flush(120)
    seconds = time.perf_counter() - t0
    if left:
        raise RuntimeError(f"{left} records were not delivered")
    size = sum(map(len, values)) / len(values)
    return Result("produce (confluent-kafka)", len(values), seconds, f"{size:.0f} B values, {partitions} partitions")


def end_offsets(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    return Admin(bootstrap).offsets(topic)


def raw_consume(bootstrap: str, topic: str, bounds: dict[int, tuple[int, int]]) -> Result:
    """The floor any Python reader pays: librdkafka fetching plus one Python Message object per record."""
    # The same client settings the weir source uses (weir/pipe/options.py), so the ratio isolates weir.
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            "fetch.wait.max.ms": 50,
        }
    )
    t0 = time.perf_counter()
    consumer.assign([TopicPartition(topic, p, lo) for p, (lo, _) in bounds.items()])
    remaining = {p: hi for p, (lo, hi) in bounds.items() if hi > lo}
    rows = nbytes = 0
    try:
        while remaining:
            for m in consumer.consume(num_messages=10_000, timeout=1.0):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(err)
                nbytes += len(m.value())  # touch the value, as any real consumer would
                rows += 1
                p = m.partition()
                if p in remaining and m.offset() + 1 >= remaining[p]:
                    del remaining[p]
    finally:
        consumer.close()
    seconds = time.perf_counter() - t0
    return Result("raw consume (1 process)", rows, seconds, f"{nbytes / 1e6:.0f} MB of values touched")


def stream_source(spark, bootstrap: str, topic: str, **options: str):
    reader = (
        spark.readStream.format("weir-kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def run_query(writer) -> tuple[float, list]:
    """Start a query, wait for availableNow to drain, and return (wall seconds, progress list)."""
    t0 = time.perf_counter()
    query = writer.start()
    query.awaitTermination()
    seconds = time.perf_counter() - t0
    if query.exception() is not None:
        raise RuntimeError(f"query failed: {query.exception()}")
    # Empty triggers (no rows) have no triggerExecution worth counting; keep only batches that read.
    progress = [p for p in query.recentProgress if p.numInputRows > 0]
    return seconds, progress


def rows_and_ms(progress: list) -> tuple[int, int]:
    return sum(p.numInputRows for p in progress), sum(p.durationMs.get("triggerExecution", 0) for p in progress)


def noop(run: Run, spark, bootstrap: str, topic: str, n: int, scratch: Path) -> None:
    def once(label: str) -> tuple[float, list]:
        # A fresh checkpoint each time: the warm run re-reads everything from earliest.
        writer = (
            stream_source(spark, bootstrap, topic)
            .writeStream.format("noop")
            .trigger(availableNow=True)
            .option("checkpointLocation", str(scratch / f"noop-{label}"))
        )
        return run_query(writer)

    # Cold pays JVM JIT, Python worker start and module imports; warm is the steady cost of the source.
    cold_s, cold_p = once("cold")
    run.add(Result("weir -> noop, cold (wall)", rows_and_ms(cold_p)[0], cold_s, "first query of the session"))
    warm_s, warm_p = once("warm")
    rows, ms = rows_and_ms(warm_p)
    run.check("noop warm row count", rows == n, f"{rows:,} of {n:,}")
    ok = rows / warm_s >= NOOP_TARGET * run.baseline
    run.add(Result("weir -> noop, warm (wall)", rows, warm_s, "query start to end", f">= {NOOP_TARGET}x raw", ok))
    run.add(
        Result(
            "weir -> noop, warm (triggerExecution)",
            rows,
            ms / 1000,
            f"{len(warm_p)} batch(es), recentProgress",
            f">= {NOOP_TARGET}x raw",
            rows / (ms / 1000) >= NOOP_TARGET * run.baseline,
        )
    )


def parquet(run: Run, spark, bootstrap: str, topic: str, n: int, scratch: Path) -> None:
    path = scratch / "parquet"
    df = stream_source(
        spark, bootstrap, topic, valueFormat="json", valueSchema=VALUE_SCHEMA, maxOffsetsPerTrigger="200000"
    )
    writer = (
        df.writeStream.format("parquet")
        .option("path", str(path))
        .option("checkpointLocation", str(scratch / "parquet-ck"))
        .trigger(availableNow=True)
    )
    wall_s, progress = run_query(writer)
    # The first batch carries the query's one-off costs (file sink metadata log, first Python worker
    # use with decoding); later batches are the rate a long-running query sustains.
    steady_rows, steady_ms = rows_and_ms(progress[1:])
    all_rows, _ = rows_and_ms(progress)
    if steady_ms:
        ok = steady_rows / (steady_ms / 1000) >= PARQUET_TARGET
        note = f"batches 2..{len(progress)} of {len(progress)}"
        run.add(Result("weir json -> parquet, steady", steady_rows, steady_ms / 1000, note, f">= {PARQUET_TARGET:,}", ok))
    run.add(Result("weir json -> parquet, whole run", all_rows, wall_s, "all rows / wall incl. query start"))

    written = spark.read.parquet(str(path))
    count = written.count()
    errors = written.where("_error IS NOT NULL").count()
    # A decode that silently produced nulls would pass the _error check; every field is set in the input.
    nulls = written.where(" OR ".join(f"{c} IS NULL" for c in ("user", "event_time", "amount", "category"))).count()
    run.check("parquet row count", count == n, f"{count:,} rows written of {n:,}")
    run.check("parquet _error null", errors == 0, f"{errors:,} rows with _error")
    run.check("parquet decoded fields set", nulls == 0, f"{nulls:,} rows with a null field")


def sink(run: Run, spark, bootstrap: str, topic: str, partitions: int, n: int) -> None:
    other = f"{topic}-copy"
    Admin(bootstrap).create_topic(other, partitions=partitions)
    t0 = time.perf_counter()
    (
        spark.read.format("weir-kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .load()
        .select("key", "value")
        .write.mode("append")
        .format("weir-kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", other)
        .save()
    )
    seconds = time.perf_counter() - t0
    written = sum(hi - lo for lo, hi in Admin(bootstrap).offsets(other).values())
    run.add(Result("weir batch read -> weir sink", n, seconds, "wall, read included; idempotent, lz4, acks=all"))
    run.check("sink record count", written == n, f"{written:,} records in {other} of {n:,}")


def table(run: Run, args: argparse.Namespace, load: tuple[float, float]) -> Table:
    t = Table(title=f"weir pipe bench: {args.records:,} records, {args.partitions} partitions, local[2]")
    for name, justify in (("stage", "left"), ("rows", "right"), ("seconds", "right"), ("rows/s", "right")):
        t.add_column(name, justify=justify)
    t.add_column("x raw", justify="right")
    t.add_column("target")
    t.add_column("notes")
    for r in run.results:
        verdict = "" if r.ok is None else (" [green]met[/]" if r.ok else " [red]missed[/]")
        ratio = f"{r.rate / run.baseline:.2f}" if run.baseline else "-"
        t.add_row(r.stage, f"{r.rows:,}", f"{r.seconds:.2f}", f"{r.rate:,.0f}", ratio, r.target + verdict, r.note)
    t.caption = f"load average 1 min: {load[0]:.2f} before, {load[1]:.2f} after (2 cores; >2 means contention)"
    return t


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    run = Run()
    scratch = Path(tempfile.mkdtemp(prefix="weir-bench-"))
    broker = EmbeddedBroker(scratch / "home", free_port())
    spark = None
    try:
        console.print(f"[bold]broker[/] on {broker.bootstrap}, scratch {scratch}")
        broker.start()
        bootstrap = broker.bootstrap
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        Admin(bootstrap).create_topic(topic, partitions=args.partitions)

        console.print("[bold]1. produce[/]")
        keys, values = make_values(args.records)
        run.add(produce(bootstrap, topic, args.partitions, keys, values))
        del keys, values
        bounds = end_offsets(bootstrap, topic)
        total = sum(hi - lo for lo, hi in bounds.values())
        run.check("topic record count", total == args.records, f"{total:,} records in {topic}")

        console.print("[bold]2. raw consume baseline[/]")
        baseline = run.add(raw_consume(bootstrap, topic, bounds))
        run.baseline = baseline.rate
        run.check("raw consume row count", baseline.rows == args.records, f"{baseline.rows:,}")

        console.print("[bold]spark session[/]")
        import weir  # Spark only now: stages 1-2 need no JVM and should not compete with one

        spark = weir.spark_session(
            "weir-bench",
            master="local[2]",
            conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
        )
        spark.sparkContext.setLogLevel("ERROR")

        console.print("[bold]3. weir source -> noop[/]")
        noop(run, spark, bootstrap, topic, args.records, scratch)
        console.print("[bold]4. weir source (json) -> parquet[/]")
        parquet(run, spark, bootstrap, topic, args.records, scratch)
        console.print("[bold]5. weir sink[/]")
        sink(run, spark, bootstrap, topic, args.partitions, args.records)
    finally:
        if spark is not None:
            spark.stop()
        broker.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    console.print(table(run, args, (load_before, os.getloadavg()[0])))
    failed = [what for what, ok, _ in run.checks if not ok]
    if failed:
        console.print(f"[red]correctness checks failed: {', '.join(failed)}[/]")
        return 1
    console.print(f"[green]all {len(run.checks)} correctness checks passed[/]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
