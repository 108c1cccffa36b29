"""The lake against the broker: archive a day of events, then reprocess one hour from each, in one run.

    .venv/bin/python bench/lake.py [--records 5000000] [--partitions 4] [--hour 12] [--s3]
                                     [--max-per-trigger 500000|auto]

Stages, against one embedded broker started here and stopped at the end, Spark local[2]:
  1. produce N JSON records of about 150 bytes whose timestamps spread evenly over 24 hours (UTC);
  2. raw baseline: one confluent-kafka consumer reads the whole topic (weir's consumer settings);
  3. archive: the topic's archiver (`archived=True`, AvailableNow) copies it into the lake's Delta table; 3b is
     its steady state: the batches after the first (the whole run also holds the query's start and the first
     batch's warm-up), from the runner's progress records;
  4. backfill one hour from the lake through a processor into Parquet (`weir backfill --into parquet:`);
  5. replay the same hour from the broker by offsets (the offsets of the hour's first and last records)
     through the same processor path (ProcessorQuery.run_batch) into Parquet, as one would without a lake;
     4 and 5 run twice, alternating, and the second run of each is the figure (the first is in the note);
  6./7. reading alone: the hour's sum of one decoded column from the lake's Parquet, then from the broker;
  8. lake-visible latency: a second topic produced at --rate events/s (timestamps = produce time) while its
     archiver runs with a 1 s trigger; each record's latency is when a poll of the table (every 50 ms) first
     sees it minus its timestamp: p50 and p99.

With --s3 the lake is on a local S3 server (moto_server from the venv, started here). Spark cannot open s3://
here (hadoop-aws is a Maven jar), so stages 4 and 6 read the lake through weir's `weir-delta` source (pyarrow
in Spark's tasks); 6b also reads the hour through delta-rs alone.

Both reprocessing runs apply the same function and write through the same ParquetSink; the outputs must
hold the same records. The ratio of 5 to 4 is the point: the lake has the decoded columns in Parquet and
prunes to one hour's files, while the broker must ship and decode every record of the hour.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
from confluent_kafka import Producer
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from rich.console import Console
from rich.table import Table

from weir.config import load
from weir.kafka import Admin
from weir.kafka.broker import EmbeddedBroker, free_port
from weir.pipeline import Pipeline
from weir.sinks import ParquetSink
from weir.sinks.delta_read import DeltaDataSource
from weir.storage import delta

console = Console(width=max(160, shutil.get_terminal_size().columns))
SCHEMA = "user STRING, amount DOUBLE, category STRING, note STRING, n BIGINT"
CATEGORIES = ("books", "electronics", "garden", "groceries", "toys", "travel")
DAY0 = datetime(2026, 11, 20, tzinfo=UTC)
DAY_MS = 86_400_000
TARGET = 10.0  # the lake backfill against the broker replay


@dataclass
class Result:
    stage: str
    rows: int
    seconds: float
    note: str = ""

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


def summarise(df: DataFrame) -> DataFrame:
    """The processor of this bench: a projection, a derived column and a filter, as a real fix would be."""
    return df.where(F.col("amount") >= 0).select(
        "topic", "partition", "offset", "user", "category", (F.col("amount") * 100).cast("long").alias("cents")
    )


def pipeline(topic: str, partitions: int) -> Pipeline:
    p = Pipeline("lakebench")
    events = p.topic(topic, SCHEMA, key="user", partitions=partitions, archived=True)
    p.processor(inputs=[events], sink=ParquetSink("/unused"), name="summarise")(summarise)
    return p


def produce(bootstrap: str, topic: str, n: int, partitions: int) -> float:
    rnd = random.Random(7)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000, "acks": 1,
         "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1_048_576}
    )  # fmt: skip
    t0 = time.perf_counter()
    for i in range(n):
        user = f"u{rnd.randrange(100_000):06d}"
        value = json.dumps(
            {"user": user, "amount": round(rnd.random() * 500, 2), "category": CATEGORIES[i % 6],
             "note": "x" * 48, "n": i}
        ).encode()  # fmt: skip
        ts = int(DAY0.timestamp() * 1000) + i * DAY_MS // n
        while True:
            try:
                producer.produce(topic, value, user.encode(), partition=i % partitions, timestamp=ts)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(300):
        raise RuntimeError("records were not delivered")
    return time.perf_counter() - t0


def hour_offsets(n: int, partitions: int, hour: int) -> dict[int, tuple[int, int]]:
    """Per partition, the offsets [start, end) of the records whose timestamps fall in `hour`: record i went to
    partition i % partitions at offset i // partitions with timestamp i * DAY_MS // n."""
    lo = -(-hour * 3_600_000 * n // DAY_MS)  # first i with i * DAY_MS // n >= hour start
    hi = -(-(hour + 1) * 3_600_000 * n // DAY_MS)
    while lo > 0 and (lo - 1) * DAY_MS // n >= hour * 3_600_000:
        lo -= 1
    while lo * DAY_MS // n < hour * 3_600_000:
        lo += 1
    while hi * DAY_MS // n < (hour + 1) * 3_600_000 and hi < n:
        hi += 1
    return {p: (-(-(lo - p) // partitions), -(-(hi - p) // partitions)) for p in range(partitions)}


def raw_consume(bootstrap: str, topic: str) -> tuple[int, float]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/pipeline.py, run as a script or not
    from pipeline import raw_consume as consume_all
    from pipeline import weir_consumer

    return consume_all(bootstrap, [topic], weir_consumer(bootstrap))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=5_000_000, help="records over 24 hours")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--hour", type=int, default=12, help="the hour (0-23) to reprocess")
    parser.add_argument(
        "--max-per-trigger",
        type=lambda v: None if v == "auto" else int(v),
        default=500_000,
        help="archiver records per micro-batch; `auto`: weir's default flow control (batches sized from the last "
        "ones' durations, within a memory budget: docs/flow.md)",
    )
    parser.add_argument("--s3", action="store_true", help="the lake on a local S3 server (moto_server)")
    parser.add_argument("--rate", type=int, default=10_000, help="events/s of the latency stage")
    parser.add_argument("--latency-seconds", type=int, default=30, help="how long the latency stage produces")
    args = parser.parse_args()
    n, parts = args.records, args.partitions
    scratch = Path(tempfile.mkdtemp(prefix="weir-lake-bench-"))
    broker = EmbeddedBroker(scratch / "broker", free_port())
    results: list[Result] = []
    checks: list[tuple[str, bool]] = []
    s3 = start_s3(scratch) if args.s3 else None
    lake_root = "s3://bench/lake" if s3 else str(scratch / "lake")
    latency: tuple[float, float, int, int] | None = None
    try:
        broker.start()
        topic = "events"
        Admin(broker.bootstrap).create_topic(topic, parts)
        console.print(f"producing {n:,} records over 24 h into {parts} partitions ...")
        results.append(Result("1. produce (confluent-kafka)", n, produce(broker.bootstrap, topic, n, parts)))
        rows, seconds = raw_consume(broker.bootstrap, topic)
        results.append(Result("2. raw consume, whole topic (baseline)", rows, seconds))

        import weir
        from weir.backfill import backfill
        from weir.runtime.runner import Runner

        settings = load(
            home=str(scratch / "home"), bootstrap_servers=broker.bootstrap, lake=lake_root,
            checkpoint_root=str(scratch / "checkpoints"), spark_master="local[2]",
            max_offsets_per_trigger=args.max_per_trigger,
        )  # fmt: skip
        spark = weir.spark_session("weir-lake-bench", settings=settings, conf={"spark.ui.enabled": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        p = pipeline(topic, parts)
        console.print("archiving ...")
        t0 = time.perf_counter()
        runner = Runner(p, settings, spark=spark, available_now=True, processors=[f"archive.{topic}"]).start()
        runner.wait()
        runner.stop()
        archived = runner.snapshot()[f"archive.{topic}"].totals.out
        results.append(Result("3. archive into the lake (AvailableNow)", archived, time.perf_counter() - t0))
        steady = steady_state(scratch / "home" / "progress" / f"{p.name}.jsonl", f"archive.{topic}")
        if steady is not None:
            results.append(Result("3b. archive, steady state (the batches after the first)", *steady))
        table = delta.open_table(f"{lake_root}/{topic}")
        lake_rows = table.to_pyarrow_dataset().count_rows() if table is not None else 0
        checks.append((f"the lake holds every record once ({lake_rows:,})", lake_rows == n == archived))

        start = DAY0 + timedelta(hours=args.hour)
        end = start + timedelta(hours=1)
        expected = sum(e - s for s, e in hour_offsets(n, parts, args.hour).values())
        if s3:  # the hour through delta-rs alone too (no Spark): what a pandas or DuckDB user pays
            t0 = time.perf_counter()
            hour = table.to_pyarrow_table(
                columns=["amount"], filters=[("date", "=", f"{start:%Y-%m-%d}"), ("hour", "=", f"{start:%H}")]
            )
            seconds = time.perf_counter() - t0
            results.append(Result("6b. read the hour's amounts through delta-rs (no Spark)", hour.num_rows, seconds))
            checks.append((f"the hour holds its {expected:,} records", hour.num_rows == expected))
        offsets = hour_offsets(n, parts, args.hour)
        from dataclasses import replace

        from weir.runtime.query import Ledger, ProcessorQuery

        def from_lake(run: int) -> tuple[float, Any]:
            t0 = time.perf_counter()
            report = backfill(p, "summarise", start, end, into=f"parquet:{scratch / f'from-lake-{run}'}",
                              settings=settings, spark=spark)  # fmt: skip
            return time.perf_counter() - t0, report

        def hour_from_broker() -> DataFrame:
            return (
                spark.read.format("weir-kafka").option("kafka.bootstrap.servers", broker.bootstrap)
                .option("subscribe", topic).option("valueFormat", "json").option("valueSchema", SCHEMA)
                .option("startingOffsets", json.dumps({topic: {str(p): s for p, (s, _) in offsets.items()}}))
                .option("endingOffsets", json.dumps({topic: {str(p): e for p, (_, e) in offsets.items()}}))
                .load()
            )  # fmt: skip

        def from_broker(run: int) -> tuple[float, int]:
            t0 = time.perf_counter()
            df = hour_from_broker()
            # The same processor path a backfill chunk runs (ProcessorQuery.run_batch: dead letters, the
            # function, routing, accounting, the sink), on the broker's records instead of the lake's.
            sink = ParquetSink(str(scratch / f"from-broker-{run}"))
            proc = replace(p.processors["summarise"], sink=sink)
            query = ProcessorQuery(spark, replace(p, processors={"summarise": proc}), proc, settings, Ledger(), "")
            sink.open("replay")
            written = query.run_batch(df, 0).outputs.get(sink.name, 0)
            return time.perf_counter() - t0, written

        # Each twice, alternating, and the second runs count: the first of either pays for code paths the
        # session has not run yet (its first Parquet scan, its first shuffle of this shape), whichever goes first.
        console.print(f"reprocessing {start:%Y-%m-%d %H:00}-{end:%H:00} from the lake and from the broker, twice ...")
        (lake_cold, _), (broker_cold, _) = from_lake(0), from_broker(0)
        (lake_s, report), (broker_s, replayed) = from_lake(1), from_broker(1)
        results.append(
            Result("4. backfill 1 hour from the lake", report.rows_read, lake_s, f"first run {lake_cold:.2f}s")
        )
        results.append(
            Result("5. replay 1 hour from the broker by offsets", expected, broker_s, f"first run {broker_cold:.2f}s")
        )

        def coords(path: str) -> set[tuple[int, int]]:
            t = ds.dataset(path, format="parquet", partitioning="hive").to_table(columns=["partition", "offset"])
            return set(zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(), strict=True))

        lake_rows, broker_rows = coords(str(scratch / "from-lake-1")), coords(str(scratch / "from-broker-1"))
        checks.append((f"both read the hour's {expected:,} records", report.rows_read == expected))
        checks.append((f"both wrote the same {len(lake_rows):,} rows", lake_rows == broker_rows and replayed > 0))
        ratio = broker_s / lake_s if lake_s else 0.0

        # Reading alone: the hour's revenue (one decoded column) from each store, with nothing else around it.
        def revenue(df: DataFrame) -> tuple[float, float]:
            t0 = time.perf_counter()
            total = df.agg(F.sum("amount")).first()[0]
            return total, time.perf_counter() - t0

        hour_files = table.file_uris(
            file_pruning_predicate=[("date", "=", f"{start:%Y-%m-%d}"), ("hour", "=", f"{start:%H}")]
        )
        if s3:  # Spark has no S3 filesystem here: weir's weir-delta source reads the hour's files
            spark.dataSource.register(DeltaDataSource)
            rel = json.dumps([u.removeprefix(f"{lake_root}/{topic}/") for u in hour_files])
            hour_df = (
                spark.read.format("weir-delta").option("path", f"{lake_root}/{topic}")
                .option("files", rel).load().select("amount")
            )  # fmt: skip
        else:
            hour_df = spark.read.parquet(*[f"file://{f}" for f in hour_files])
        lake_total, lake_read_s = revenue(hour_df)
        broker_total, broker_read_s = revenue(hour_from_broker())
        results.append(Result("6. read the hour's amounts from the lake (Parquet)", expected, lake_read_s))
        results.append(Result("7. read the hour's amounts from the broker (fetch + JSON)", expected, broker_read_s))
        checks.append(
            ("both sums of the hour's amounts agree", abs(lake_total - broker_total) < 1e-6 * abs(lake_total))
        )
        read_ratio = broker_read_s / lake_read_s if lake_read_s else 0.0
        latency = lake_latency(broker.bootstrap, settings, spark, parts, args.rate, args.latency_seconds)
    finally:
        broker.stop()
        if s3 is not None:
            s3.terminate()
            s3.wait(10)
        shutil.rmtree(scratch, ignore_errors=True)

    where = "S3 (moto_server)" if s3 else "local disk"
    table = Table("stage", "records", "seconds", "records/s", "note", title=f"bench/lake.py, {n:,} records, {where}")
    for r in results:
        table.add_row(r.stage, f"{r.rows:,}", f"{r.seconds:.2f}", f"{r.rate:,.0f}", r.note)
    console.print(table)
    base = next(r.rate for r in results if "baseline" in r.stage)
    archive = next(r for r in results if r.stage.startswith("3."))
    console.print(f"archive rate: {archive.rate:,.0f} records/s = {archive.rate / base:.2f}x the raw consume")
    for r in results:
        if r.stage.startswith("3b."):
            console.print(f"archive steady state: {r.rate:,.0f} records/s = {r.rate / base:.2f}x the raw consume")
    verdict = "meets" if ratio >= TARGET else "misses"
    console.print(
        f"lake backfill vs broker replay of the same hour: {ratio:.1f}x faster ({verdict} the {TARGET:.0f}x target)"
    )
    console.print(f"reading the hour alone (one column): the lake {read_ratio:.1f}x faster than the broker")
    if latency is not None:
        p50, p99, seen, sent = latency
        console.print(
            f"lake-visible latency at {args.rate:,} events/s, 1 s trigger: p50 {p50:.2f} s, p99 {p99:.2f} s "
            f"({seen:,} records; goal p50 < 1.5 s, p99 < 3 s)"
        )
        checks.append((f"the latency stage saw {seen:,} of the {sent:,} records it produced", seen == sent))
    for what, ok in checks:
        console.print(f"  [{'green' if ok else 'red'}]{'ok' if ok else 'FAILED'}[/] {what}")
    return 0 if all(ok for _, ok in checks) else 1


def steady_state(progress: Path, processor: str) -> tuple[int, float] | None:
    """Records and seconds of a query's batches after its first, from the runner's progress records: the whole
    run also holds the query's start and the first batch's warm-up (Python workers, imports, connections)."""
    if not progress.exists():
        return None
    rows, ms = 0, 0
    for line in progress.open():
        x = json.loads(line)
        if x.get("type") == "progress" and x.get("processor") == processor and x.get("batch_id", 0) > 0:
            rows += x["accounting"]["in"]
            ms += (x.get("duration_ms") or {}).get("triggerExecution", 0)
    return (rows, ms / 1000) if rows and ms else None


def start_s3(scratch: Path) -> subprocess.Popen:
    """moto_server from the venv on a free port, the AWS settings pointing at it, and a bucket `bench`."""
    port = free_port()
    os.environ.update({
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
    })  # fmt: skip
    exe = Path(sys.executable).with_name("moto_server")
    log = (scratch / "moto.log").open("wb")
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/bench", method="PUT")
            urllib.request.urlopen(req, timeout=2).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("moto_server did not start") from None
            time.sleep(0.2)


def lake_latency(bootstrap: str, settings: Any, spark: Any, partitions: int, rate: int, seconds: int):
    """Produce `rate` records/s for `seconds` into a new archived topic (timestamp = produce time) while its
    archiver runs with a 1 s trigger; each record's latency is when the table first shows it minus its
    timestamp. Returns (p50, p99, records seen)."""
    from weir.runtime.runner import Runner

    topic = "live"
    Admin(bootstrap).create_topic(topic, partitions)
    p = Pipeline("lakelatency")
    p.topic(topic, SCHEMA, key="user", partitions=partitions, archived=True)
    live = settings.model_copy(update={"trigger": "1 second", "max_offsets_per_trigger": None})
    runner = Runner(p, live, spark=spark).start()
    url = f"{settings.lake}/{topic}"
    latencies: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from weir.storage import paths

        filesystem, root = paths.resolve(url)
        seen: set[str] = set()
        while not stop.is_set():
            table = delta.open_table(url)
            if table is not None:
                now = time.time()
                new = [x for x in pa.table(table.get_add_actions()).column("path").to_pylist() if x not in seen]
                for rel in new:  # the files of the commits since the last poll: their records became visible now
                    ts = pq.read_table(f"{root}/{rel}", filesystem=filesystem, columns=["timestamp"])
                    latencies.extend(now - t.timestamp() for t in ts.column("timestamp").to_pylist())
                seen.update(new)
            time.sleep(0.05)

    console.print(f"lake-visible latency: producing {rate:,} events/s for {seconds} s with the archiver running ...")
    poller = threading.Thread(target=poll, daemon=True)
    time.sleep(15)  # the archiver's query starts and runs its first (empty) batches: warm-up is not latency
    poller.start()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": 1})
    sent, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        due = int((time.monotonic() - t0) * rate)
        while sent < due:
            value = json.dumps({"user": f"u{sent % 1000}", "amount": 1.0, "category": "books", "note": "", "n": sent})
            producer.produce(topic, value.encode(), partition=sent % partitions, timestamp=int(time.time() * 1000))
            sent += 1
        producer.poll(0)
        time.sleep(0.005)
    producer.flush(60)
    deadline = time.monotonic() + 30
    while len(latencies) < sent and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    poller.join(10)
    runner.stop()
    if not latencies:
        return None
    q = statistics.quantiles(latencies, n=100)
    return q[49], q[98], len(latencies), sent


if __name__ == "__main__":
    raise SystemExit(main())
