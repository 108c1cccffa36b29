"""Throughput of the weir-kafka source and sink against a raw confluent-kafka baseline, in one run.

    .venv/bin/python bench/pipe.py [--records 1000000] [--partitions 4] [-o KEY=VALUE] [-c KEY=VALUE]

Stages, all against one embedded broker (--broker: kafka, the default, or tansu) started here and stopped at the end:
  1. produce N JSON records of about 150 bytes with confluent-kafka (the input of every later stage);
  2. raw baseline: one confluent-kafka consumer reads the whole topic, touching each value, no parsing;
     once with librdkafka's defaults (the baseline), once with weir's own consumer settings;
  3. weir source -> noop sink (availableNow), a cold run then a warm run of the same query; then Spark's own
     Kafka source (format "kafka", the connector of weir/jvm/connector) -> noop, warm, the engine's baseline;
  4. weir source with valueFormat=json -> Parquet file sink, several micro-batches, with a correctness check;
  5. weir sink: a batch read of the topic written back to a second topic, checked by its offsets.

After the table, each warm noop run's wall seconds are split by Spark's own figures (`split`): start() to the
batch, the query's steps (latestOffset, planning, offset log, addBatch, commit), and its tasks' span, run time and
CPU, read from Spark's status store (the data behind its UI, without a UI).

Every ratio is against a raw baseline of the same run, so a busy machine moves both sides of it. Wall time
on a shared 2-core machine is noisy; the CPU columns (from /proc, per process group) are much less so and
say where the time went: the Spark JVM, its Python workers (where the weir source and sink run), the broker,
and this process.
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

from weir.kafka import Admin
from weir.kafka.broker import KINDS, embedded_broker, free_port
from weir.kafka.options import parse_source

# Wide enough for the table even when piped to a file (rich falls back to 80 columns there).
console = Console(width=max(200, shutil.get_terminal_size().columns))

# The decoded fields of every record; stage 4 asks the source for exactly these.
VALUE_SCHEMA = "user STRING, event_time TIMESTAMP, amount DOUBLE, category STRING, note STRING"
CATEGORIES = ("books", "electronics", "garden", "groceries", "toys", "travel")
RECORD_BYTES = 150
NOOP_TARGET = 1.2  # warm weir->noop rows/s over the raw single-consumer baseline
PARQUET_TARGET = 110_000  # steady rows/s of the JSON -> Parquet query
PARQUET_BATCH = 200_000  # maxOffsetsPerTrigger: several batches, so a steady rate exists beside the first
# The raw baselines: librdkafka's defaults (what FACTS and the issue call the raw single-process consume),
# and weir's own consumer settings (so that ratio isolates what the Spark path costs on top of the client).
# librdkafka idles fetch.queue.backoff.ms (default 1000) once a partition's local queue is full; weir sets
# it to 10 ms, which is most of the gap between the two.
DEFAULT_CONSUMER = {"enable.auto.commit": False, "enable.partition.eof": True}


def weir_consumer(bootstrap: str) -> dict:
    opts = parse_source({"kafka.bootstrap.servers": bootstrap, "subscribe": "x"}, streaming=False)
    return {k: v for k, v in opts.consumer_settings().items() if k not in ("bootstrap.servers", "group.id")}


CPU_GROUPS = ("jvm", "py", "broker", "bench")  # Spark JVM, its Python workers, the broker, this process
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_cpu(pid: int, children: bool) -> float:
    """CPU seconds of one process from /proc: its threads, plus its reaped children when asked."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0.0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime: exited Python workers land here
    return ticks / TICK


def _descendants(root: int) -> set[int]:
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                continue
    found, frontier = set(), {root}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found


@dataclass
class CpuMeter:
    """CPU seconds per process group. Linux only; elsewhere every figure reads 0 and the column says so."""

    broker_pid: int | None = None
    jvm_pid: int | None = None

    @property
    def available(self) -> bool:
        return Path("/proc/self/stat").exists()

    def snapshot(self) -> dict[str, float]:
        if not self.available:
            return {}
        snap = {"bench": sum(os.times()[:2])}  # this process, librdkafka threads included
        if self.broker_pid:
            snap["broker"] = _proc_cpu(self.broker_pid, children=True)
        if self.jvm_pid:
            snap["jvm"] = _proc_cpu(self.jvm_pid, children=False)
            # Python daemons and workers that Spark forks: where the weir source and sink code runs.
            snap["py"] = sum(_proc_cpu(p, children=True) for p in _descendants(self.jvm_pid))
        return snap

    @staticmethod
    def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {k: after[k] - before.get(k, 0.0) for k in after}


@dataclass
class Result:
    stage: str
    rows: int
    seconds: float
    note: str = ""
    target: str = ""
    ok: bool | None = None  # None: no target for this figure
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("nan")

    def cpu_per_row(self) -> dict[str, float]:
        """CPU µs per row by process group, and their total."""
        if not self.cpu or not self.rows:
            return {}
        per_row = {k: v / self.rows * 1e6 for k, v in self.cpu.items()}
        return {**per_row, "total": sum(per_row.values())}

    def cpu_text(self) -> str:
        per_row = self.cpu_per_row()
        parts = [f"{k} {per_row[k]:.1f}" for k in CPU_GROUPS if k in per_row]
        return f"{per_row['total']:.1f} = " + " + ".join(parts) if per_row else "-"


@dataclass
class Run:
    meter: CpuMeter
    results: list[Result] = field(default_factory=list)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    baseline: float = 0.0
    tuned_baseline: float = 0.0
    source_options: dict[str, str] = field(default_factory=dict)  # --source-option, on every weir read
    last_split: tuple[float, float, set[int]] = (0.0, 0.0, set())  # run_query's, for split()
    splits: list[tuple[str, str]] = field(default_factory=list)  # (stage, where its wall seconds went)

    def add(self, result: Result) -> Result:
        self.results.append(result)
        console.print(
            f"  {result.stage}: {result.rows:,} rows in {result.seconds:.2f}s = {result.rate:,.0f} rows/s"
            f"  (CPU µs/row {result.cpu_text()})"
        )
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
        doc["note"] = "x" * max(0, RECORD_BYTES - len(json.dumps(doc, separators=(",", ":"))))
        keys.append(user.encode())
        values.append(json.dumps(doc, separators=(",", ":")).encode())
    return keys, values


def produce(run: Run, bootstrap: str, topic: str, partitions: int, keys: list, values: list) -> None:
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
    before = run.meter.snapshot()
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
    note = f"{size:.0f} B values, acks=1, uncompressed"
    cpu = run.meter.delta(before, run.meter.snapshot())
    run.add(Result("1. produce (confluent-kafka)", len(values), seconds, note, cpu=cpu))


def raw_consume(run: Run, label: str, bootstrap: str, topic: str, bounds: dict, settings: dict) -> Result:
    """The floor any Python reader pays: librdkafka fetching plus one Python Message object per record."""
    group = f"bench-{uuid.uuid4().hex[:8]}"  # never joined: assign() reads without a group
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, **settings})
    before = run.meter.snapshot()
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
    cpu = run.meter.delta(before, run.meter.snapshot())
    return run.add(Result(label, rows, seconds, f"{nbytes / 1e6:.0f} MB of values touched", cpu=cpu))


def weir_reader(run: Run, reader, bootstrap: str, topic: str, **options: str):
    """`reader` (spark.read or spark.readStream) set up for the topic, with --source-option applied."""
    reader = reader.format("weir-kafka")
    settings = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, **options, **run.source_options}
    for k, v in settings.items():
        reader = reader.option(k, v)
    return reader.load()


def _stages(spark) -> list:
    """Spark's own record of every stage so far (AppStatusStore, the data behind its UI, read without a UI)."""
    gateway = spark.sparkContext._gateway
    stages = spark.sparkContext._jsc.sc().statusStore()
    found = stages.stageList(None, False, False, gateway.new_array(gateway.jvm.double, 0), None)
    return [found.apply(i) for i in range(found.size())]


def _ms(option) -> float:
    """A java.util.Date inside a Scala Option, as epoch milliseconds (nan when unset)."""
    return float(option.get().getTime()) if option.isDefined() else float("nan")


def split(spark, since: float, ended: float, stages_before: set[int], progress: list) -> str:
    """Where a run's wall seconds went, from Spark's own figures: the query's durations and its tasks' times.

    `since` and `ended` are epoch seconds around start() .. awaitTermination(); `stages_before` the stage ids
    that existed before it, so only this run's stages count.
    """
    first = datetime.fromisoformat(progress[0].timestamp.replace("Z", "+00:00")).timestamp()
    d: dict[str, int] = {}
    for p in progress:
        for k, v in p.durationMs.items():
            d[k] = d.get(k, 0) + v
    last = datetime.fromisoformat(progress[-1].timestamp.replace("Z", "+00:00")).timestamp()
    after = ended - last - progress[-1].durationMs.get("triggerExecution", 0) / 1000
    mine = [s for s in _stages(spark) if s.stageId() not in stages_before]
    tasks = sum(s.numTasks() for s in mine)
    run_ms = sum(s.executorRunTime() for s in mine)
    cpu_ms = sum(s.executorCpuTime() for s in mine) / 1e6
    launched = min(_ms(s.firstTaskLaunchedTime()) for s in mine) / 1000
    done = max(_ms(s.completionTime()) for s in mine) / 1000
    wait = sum(_ms(s.firstTaskLaunchedTime()) - _ms(s.submissionTime()) for s in mine)
    rows = sum(p.numInputRows for p in progress)
    parts = ", ".join(f"{k} {d.get(k, 0)}" for k in ("latestOffset", "queryPlanning", "walCommit", "addBatch"))
    return (
        f"{ended - since:.2f} s wall: {first - since:.2f} s from start() to the first batch; "
        f"{len(progress)} batch(es) ({parts}, commitOffsets {d.get('commitOffsets', 0)} ms); "
        f"{after:.2f} s after the last. Inside: {len(mine)} stage(s), {tasks} tasks, {wait:.0f} ms from submission "
        f"to first task, tasks' span {done - launched:.2f} s, task run time {run_ms / 1000:.2f} s "
        f"(CPU {cpu_ms / 1000:.2f} s): {rows / (run_ms / 1000):,.0f} rows per task-second"
    )


def run_query(run: Run, spark, writer) -> tuple[float, list, dict[str, float]]:
    """Start a query, wait for availableNow to drain; (wall seconds, progress list, CPU seconds).

    Keeps what `split` needs in run.last_split: the epoch seconds around it and the stages before it.
    """
    before = run.meter.snapshot()
    stages_before = {s.stageId() for s in _stages(spark)}
    since = time.time()
    t0 = time.perf_counter()
    query = writer.start()
    query.awaitTermination()
    seconds = time.perf_counter() - t0
    run.last_split = (since, time.time(), stages_before)
    cpu = run.meter.delta(before, run.meter.snapshot())
    if query.exception() is not None:
        raise RuntimeError(f"query failed: {query.exception()}")
    # Empty triggers (no rows) have no triggerExecution worth counting; keep only batches that read.
    progress = [p for p in query.recentProgress if p.numInputRows > 0]
    return seconds, progress, cpu


def rows_and_ms(progress: list) -> tuple[int, int]:
    ms = sum(p.durationMs.get("triggerExecution", 0) for p in progress)
    return sum(p.numInputRows for p in progress), ms


def noop(run: Run, spark, bootstrap: str, topic: str, n: int, scratch: Path) -> None:
    def once(label: str) -> tuple[float, list, dict[str, float]]:
        # A fresh checkpoint each time: the warm run re-reads everything from earliest.
        writer = (
            weir_reader(run, spark.readStream, bootstrap, topic, startingOffsets="earliest")
            .writeStream.format("noop")
            .trigger(availableNow=True)
            .option("checkpointLocation", str(scratch / f"noop-{label}"))
        )
        return run_query(run, spark, writer)

    # Cold pays JVM JIT, Python worker start and module imports; warm is the steady cost of the source.
    cold_s, cold_p, cold_cpu = once("cold")
    cold_rows = rows_and_ms(cold_p)[0]
    run.add(Result("3. source -> noop, cold", cold_rows, cold_s, "first query of the session", cpu=cold_cpu))
    warm_s, warm_p, warm_cpu = once("warm")
    rows, ms = rows_and_ms(warm_p)
    run.check("noop warm row count", rows == n, f"{rows:,} of {n:,}")
    target = f">= {NOOP_TARGET}x raw"
    ok = rows / warm_s >= NOOP_TARGET * run.baseline
    run.add(Result("3. source -> noop, warm (wall)", rows, warm_s, "start to end", target, ok, warm_cpu))
    ok = rows / (ms / 1000) >= NOOP_TARGET * run.baseline
    note = f"{len(warm_p)} batch(es): rows / triggerExecution"
    run.add(Result("3. source -> noop, warm (trigger)", rows, ms / 1000, note, target, ok))
    run.splits.append(("3. weir-kafka -> noop, warm", split(spark, *run.last_split, warm_p)))

    # The engine's own source over the same records, as warm as the row above (its cold run first)
    def spark_once(label: str) -> tuple[float, list, dict[str, float]]:
        reader = spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
        reader = reader.option("subscribe", topic).option("startingOffsets", "earliest")
        writer = reader.load().writeStream.format("noop").trigger(availableNow=True)
        return run_query(run, spark, writer.option("checkpointLocation", str(scratch / f"noop-spark-{label}")))

    spark_once("cold")
    warm_s, warm_p, warm_cpu = spark_once("warm")
    rows, ms = rows_and_ms(warm_p)
    run.check("spark kafka noop row count", rows == n, f"{rows:,} of {n:,}")
    run.add(Result("3s. Spark's kafka source -> noop, warm", rows, warm_s, "start to end", cpu=warm_cpu))
    run.splits.append(("3s. Spark's kafka source -> noop, warm", split(spark, *run.last_split, warm_p)))


def parquet(run: Run, spark, bootstrap: str, topic: str, n: int, scratch: Path) -> None:
    path = scratch / "parquet"
    decode = {"valueFormat": "json", "valueSchema": VALUE_SCHEMA}
    batches = {"startingOffsets": "earliest", "maxOffsetsPerTrigger": str(PARQUET_BATCH)}
    df = weir_reader(run, spark.readStream, bootstrap, topic, **decode, **batches)
    # The whole frame as loaded (Kafka columns, decoded fields, _error): what writeStream of the source does.
    writer = (
        df.writeStream.format("parquet")
        .option("path", str(path))
        .option("checkpointLocation", str(scratch / "parquet-ck"))
        .trigger(availableNow=True)
    )
    wall_s, progress, cpu = run_query(run, spark, writer)
    # The first batch carries one-off costs (the JVM's first Parquet writes are JIT-bound: 3-7 s against
    # ~1.7 s for each later 200k batch, measured); later batches are what a long-running query sustains.
    steady_rows, steady_ms = rows_and_ms(progress[1:])
    all_rows, _ = rows_and_ms(progress)
    if steady_ms:
        ok = steady_rows / (steady_ms / 1000) >= PARQUET_TARGET
        note = f"batches 2..{len(progress)} of {len(progress)}: rows / trigger ms"
        target = f">= {PARQUET_TARGET:,}"
        run.add(Result("4. json -> parquet, steady", steady_rows, steady_ms / 1000, note, target, ok))
    first_ms = progress[0].durationMs.get("triggerExecution", 0) if progress else 0
    later_ms = steady_ms / max(1, len(progress) - 1)
    note = f"wall incl. start; batch 1 {first_ms / 1000:.1f}s, others {later_ms / 1000:.1f}s each"
    run.add(Result("4. json -> parquet, whole run", all_rows, wall_s, note, cpu=cpu))

    written = spark.read.parquet(str(path))
    count = written.count()
    errors = written.where("_error IS NOT NULL").count()
    # A decode that silently produced nulls would pass the _error check; every field is set in the input.
    any_null = " OR ".join(f"{c} IS NULL" for c in ("user", "event_time", "amount", "category"))
    nulls = written.where(any_null).count()
    run.check("parquet row count", count == n, f"{count:,} rows written of {n:,}")
    run.check("parquet _error null", errors == 0, f"{errors:,} rows with _error")
    run.check("parquet decoded fields set", nulls == 0, f"{nulls:,} rows with a null field")


def sink(run: Run, spark, bootstrap: str, topic: str, partitions: int, n: int) -> None:
    other = f"{topic}-copy"
    Admin(bootstrap).create_topic(other, partitions=partitions)
    before = run.meter.snapshot()
    t0 = time.perf_counter()
    (
        weir_reader(run, spark.read, bootstrap, topic)
        .select("key", "value")
        .write.mode("append")
        .format("weir-kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", other)
        .save()
    )
    seconds = time.perf_counter() - t0
    cpu = run.meter.delta(before, run.meter.snapshot())
    written = sum(hi - lo for lo, hi in Admin(bootstrap).offsets(other).values())
    note = "wall incl. read; idempotent, lz4, acks=all"
    run.add(Result("5. batch read -> weir sink", n, seconds, note, cpu=cpu))
    run.check("sink record count", written == n, f"{written:,} records in {other} of {n:,}")


def table(run: Run, args: argparse.Namespace, load: tuple[float, float]) -> Table:
    t = Table(title=f"weir pipe bench: {args.records:,} records, {args.partitions} partitions, local[2]")
    figures = ("rows", "seconds", "rows/s", "x raw", "x tuned raw", "CPU µs/row", *CPU_GROUPS)
    for name in ("stage", *figures, "target", "notes"):
        t.add_column(name, justify="right" if name in figures else "left", overflow="fold")
    for r in run.results:
        verdict = "" if r.ok is None else (" [green]met[/]" if r.ok else " [red]missed[/]")
        raw = f"{r.rate / run.baseline:.2f}" if run.baseline else "-"
        tuned = f"{r.rate / run.tuned_baseline:.2f}" if run.tuned_baseline else "-"
        per_row = r.cpu_per_row()
        cpu = [f"{per_row[k]:.1f}" if k in per_row else "-" for k in ("total", *CPU_GROUPS)]
        rate = (f"{r.rows:,}", f"{r.seconds:.2f}", f"{r.rate:,.0f}", raw, tuned)
        t.add_row(r.stage, *rate, *cpu, r.target + verdict, r.note)
    t.caption = (
        "x raw: over raw consume with librdkafka's defaults; x tuned raw: over raw consume with weir's own "
        "consumer settings (fetch.queue.backoff.ms=10 among them).\n"
        "CPU µs/row = jvm (Spark JVM) + py (its Python workers: the weir source and sink) + broker + bench "
        "(this process).\n"
        f"Load average (1 min) {load[0]:.2f} before, {load[1]:.2f} after, on {os.cpu_count()} cores: "
        "above the core count, other work shared the machine and wall figures are noisy."
    )
    return t


def pairs(items: list[str]) -> dict[str, str]:
    bad = [i for i in items if "=" not in i]
    if bad:
        raise SystemExit(f"expected KEY=VALUE, got {', '.join(bad)}")
    return dict(i.split("=", 1) for i in items)


def main() -> int:
    raw_help = argparse.RawDescriptionHelpFormatter  # keep the docstring's layout in --help
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw_help)
    parser.add_argument("--records", type=int, default=1_000_000, help="records to produce and read")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the topic")
    # For trying a setting without editing weir, e.g. -o kafka.fetch.queue.backoff.ms=10
    more = {"action": "append", "default": [], "metavar": "KEY=VALUE"}
    parser.add_argument("-o", "--source-option", **more, help="extra option on every weir-kafka read")
    parser.add_argument("-c", "--conf", **more, help="extra Spark conf for the session")
    parser.add_argument("--broker", choices=KINDS, default="kafka", help="the embedded broker's kind")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    scratch = Path(tempfile.mkdtemp(prefix="weir-bench-"))
    broker = embedded_broker(scratch / "home", free_port(), kind=args.broker)
    run = Run(CpuMeter(), source_options=pairs(args.source_option))
    spark = None
    try:
        console.print(f"[bold]broker[/] on {broker.bootstrap}, scratch {scratch}")
        run.meter.broker_pid = broker.start().pid
        bootstrap = broker.bootstrap
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        Admin(bootstrap).create_topic(topic, partitions=args.partitions)

        console.print("[bold]1. produce[/]")
        keys, values = make_values(args.records)
        produce(run, bootstrap, topic, args.partitions, keys, values)
        del keys, values
        bounds = Admin(bootstrap).offsets(topic)
        total = sum(hi - lo for lo, hi in bounds.values())
        run.check("topic record count", total == args.records, f"{total:,} records in {topic}")

        console.print("[bold]2. raw consume baselines[/]")
        label = "2. raw consume, librdkafka defaults (baseline)"
        baseline = raw_consume(run, label, bootstrap, topic, bounds, DEFAULT_CONSUMER)
        run.baseline = baseline.rate
        run.check("raw consume row count", baseline.rows == args.records, f"{baseline.rows:,}")
        label = "2. raw consume, weir's consumer settings"
        run.tuned_baseline = raw_consume(run, label, bootstrap, topic, bounds, weir_consumer(bootstrap)).rate

        console.print("[bold]spark session[/]")
        import weir  # Spark only now: stages 1-2 need no JVM and should not compete with one

        spark = weir.spark_session(
            "weir-bench",
            master="local[2]",
            conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2", **pairs(args.conf)},
        )
        spark.sparkContext.setLogLevel("ERROR")
        run.meter.jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())

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
    for stage, where in run.splits:
        console.print(f"[bold]{stage}[/]: {where}")
    failed = [what for what, ok, _ in run.checks if not ok]
    if failed:
        console.print(f"[red]correctness checks failed: {', '.join(failed)}[/]")
        return 1
    console.print(f"[green]all {len(run.checks)} correctness checks passed[/]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
