"""Throughput of the shop pipeline (examples/shop) against a raw confluent-kafka baseline, in one run.

    .venv/bin/python bench/pipeline.py [--records 1000000] [--event-rate 10000] [--max-per-trigger 100000]

Stages, all against one embedded broker started here and stopped at the end, Spark local[2]:
  1. produce the shop generator's first N records (orders, customers, page views; 1% malformed, 2% of the
     events late) straight into their topics with confluent-kafka, so the generator's cost stays out;
  2. raw baseline: one confluent-kafka consumer reads orders + customers (what the pipeline reads), touching
     each value, no parsing; once with librdkafka's defaults (the baseline), once with weir's consumer settings;
  3. end to end: the pipeline's processors enrich -> revenue, spend -> alert with available_now, each in
     turn as the runner orders them; rows/s = records of orders + customers over the whole wall time;
  4. the window alone: revenue over orders.enriched (written by stage 3), against a raw consume of that topic;
  5. the join alone: enrich over orders + customers again, with a fresh checkpoint.

"wall" rates run from starting the runner to its end, first-batch warm-up included; "steady" rates are a
processor's input rows over the triggerExecution time of its batches after the first (from its progress
records). Every ratio is against a raw baseline of the same run, so a busy machine moves both sides.
Correctness checks compare the runner's accounting with what the generator made.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # examples.shop, when run as `python bench/pipeline.py`
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)

from examples.shop.pipeline import build  # noqa: E402
from examples.shop.records import CUSTOMERS, ORDERS, Shape, records  # noqa: E402
from weir.config import Settings  # noqa: E402
from weir.kafka import Admin  # noqa: E402
from weir.kafka.broker import EmbeddedBroker, free_port  # noqa: E402
from weir.kafka.options import parse_source  # noqa: E402

console = Console(width=max(160, shutil.get_terminal_size().columns))
DEFAULT_CONSUMER = {"enable.auto.commit": False, "enable.partition.eof": True}
PIPELINE = ["enrich", "revenue", "spend", "alert"]
LATE_NOTE = (
    "each enrich batch writes its orders grouped by customer, so within it event time is shuffled over the "
    "batch's whole span; a window batch that ends inside it sees some of its newest orders, moves the "
    "watermark to that batch's end, and its next batch finds the rest late. Spans under the 30 s delay "
    "avoid it: fewer records per trigger (--max-per-trigger) or a faster event clock (--event-rate)"
)


def weir_consumer(bootstrap: str) -> dict:
    """weir's own source settings (fetch.queue.backoff.ms=10 among them), minus what assign() does not use."""
    opts = parse_source({"kafka.bootstrap.servers": bootstrap, "subscribe": "x"}, streaming=False)
    return {k: v for k, v in opts.consumer_settings().items() if k not in ("bootstrap.servers", "group.id")}


@dataclass
class Result:
    stage: str
    rows: int
    seconds: float
    baseline: str = ""  # which baseline the ratio is against
    note: str = ""

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("nan")


@dataclass
class Bench:
    results: list[Result] = field(default_factory=list)
    baselines: dict[str, float] = field(default_factory=dict)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)

    def add(self, result: Result) -> Result:
        self.results.append(result)
        console.print(f"  {result.stage}: {result.rows:,} rows in {result.seconds:.2f}s = {result.rate:,.0f} rows/s")
        return result

    def check(self, what: str, ok: bool, detail: str) -> None:
        self.checks.append((what, ok, detail))
        console.print(f"  check {what}: {'[green]OK[/]' if ok else '[red]FAILED[/]'} ({detail})")


def produce(bench: Bench, bootstrap: str, shape: Shape, n: int) -> Counter:
    """The generator's records 0..n-1 into their topics; returns counts by (topic, malformed/late/ok)."""
    console.print(f"  generating {n:,} records ...")
    recs = records(shape, 0, n)
    kinds = Counter((r.output, "malformed" if r.malformed else "late" if r.late else "ok") for r in recs)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "acks": 1,
            "compression.type": "none",
        }
    )
    t0 = time.perf_counter()
    for r in recs:
        while True:
            try:
                producer.produce(r.output, r.value, r.key, timestamp=r.timestamp_ms)
                break
            except BufferError:
                producer.poll(0.05)
    left = producer.flush(120)
    if left:
        raise RuntimeError(f"{left} records were not delivered")
    bench.add(Result("1. produce (confluent-kafka)", n, time.perf_counter() - t0, note="the shop's three topics"))
    return kinds


def raw_consume(bootstrap: str, topics: list[str], settings: dict) -> tuple[int, float]:
    """Every record of `topics` through one consumer: (records, seconds). The floor any Python reader pays."""
    admin = Admin(bootstrap)
    bounds = {(t, p): b for t in topics for p, b in admin.offsets(t).items()}
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}", **settings})
    t0 = time.perf_counter()
    consumer.assign([TopicPartition(t, p, lo) for (t, p), (lo, _) in bounds.items()])
    remaining = {tp: hi for tp, (lo, hi) in bounds.items() if hi > lo}
    rows = 0
    try:
        while remaining:
            for m in consumer.consume(num_messages=10_000, timeout=1.0):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(err)
                len(m.value() or b"")  # touch the value, as any real consumer would
                rows += 1
                tp = (m.topic(), m.partition())
                if tp in remaining and m.offset() + 1 >= remaining[tp]:
                    del remaining[tp]
    finally:
        consumer.close()
    return rows, time.perf_counter() - t0


def baseline(bench: Bench, bootstrap: str, topics: list[str], tuned: bool = False) -> None:
    label = "weir's consumer settings" if tuned else "librdkafka defaults"
    settings = weir_consumer(bootstrap) if tuned else DEFAULT_CONSUMER
    rows, seconds = raw_consume(bootstrap, topics, settings)
    base = "raw " + "+".join(topics)  # the tuned consume is shown against the plain one, never against itself
    r = bench.add(Result(f"2. raw consume {' + '.join(topics)}, {label}", rows, seconds, base))
    if not tuned:
        bench.baselines[base] = r.rate


@dataclass
class Stage:
    seconds: float
    totals: dict  # processor -> Counts
    steady: dict[str, tuple[int, float]]  # processor -> (rows, seconds) of its batches after the first


def run_stage(spark, pipeline, bootstrap: str, home: Path, processors: list[str], max_per_trigger: int) -> Stage:
    """One available_now run of `processors` with fresh checkpoints under `home`."""
    from weir.runtime.runner import Runner

    settings = Settings(
        home=str(home), bootstrap_servers=bootstrap, checkpoint_root=str(home / "checkpoints"),
        spark_master="local[2]", max_offsets_per_trigger=max_per_trigger, max_restarts=0,
    )  # fmt: skip
    runner = Runner(pipeline, settings, spark=spark, available_now=True, processors=processors)
    t0 = time.perf_counter()
    runner.start()
    try:
        runner.wait()
    finally:
        runner.stop()
    seconds = time.perf_counter() - t0
    snapshot = runner.snapshot()
    failed = {n: st.last_error for n, st in snapshot.items() if st.state != "finished"}
    if failed:
        raise RuntimeError(f"processors did not finish: {failed}")
    batches: dict[str, list[tuple[int, int]]] = {}
    for line in (home / "progress" / f"{pipeline.name}.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("type") == "progress" and rec.get("input_rows"):
            ms = (rec.get("duration_ms") or {}).get("triggerExecution", 0)
            batches.setdefault(rec["processor"], []).append((rec["input_rows"], ms))
    steady = {p: (sum(r for r, _ in b[1:]), sum(ms for _, ms in b[1:]) / 1000) for p, b in batches.items()}
    return Stage(seconds, {n: st.totals for n, st in snapshot.items()}, steady)


def add_steady(bench: Bench, label: str, stage: Stage, proc: str, base: str) -> None:
    rows, seconds = stage.steady.get(proc, (0, 0.0))
    if rows:
        bench.add(Result(label, rows, seconds, base, "rows / triggerExecution, batches after the first"))


def check_accounting(bench: Bench, stage: Stage, kinds: Counter) -> None:
    """The runner's books against what the generator made; every processor balanced."""
    for name, t in stage.totals.items():
        bench.check(f"{name} balances", t.balanced and not t.violations, f"in {t.in_:,}, accounted {t.accounted:,}")
    orders = {k: n for (o, k), n in kinds.items() if o == ORDERS}
    customers = {k: n for (o, k), n in kinds.items() if o == CUSTOMERS}
    e = stage.totals.get("enrich")
    if e is not None:
        good_orders = orders.get("ok", 0) + orders.get("late", 0)
        bad = orders.get("malformed", 0) + customers.get("malformed", 0)
        bench.check("enrich in", e.in_ == sum(orders.values()) + sum(customers.values()), f"{e.in_:,}")
        bench.check("enrich out = well-formed orders", e.out == good_orders, f"{e.out:,} of {good_orders:,}")
        bench.check("enrich dlq = malformed orders + customers", e.dlq == bad, f"{e.dlq:,} of {bad:,}")
        bench.check("enrich absorbed = customer changes", e.absorbed == customers.get("ok", 0), f"{e.absorbed:,}")
    for name in ("revenue", "spend"):
        w = stage.totals.get(name)
        if w is not None and e is not None:
            ok = w.in_ == e.out and w.late + w.absorbed == w.in_
            bench.check(f"{name} reads every enriched order", ok, f"in {w.in_:,}, windows {w.emitted:,}")
            # Only the generator's late orders should be late (fewer: those in a first batch are on time).
            # More means event-time disorder in orders.enriched beyond the 30 s watermark delay.
            generated = orders.get("late", 0)
            detail = f"late {w.late:,}, generated late {generated:,}"
            if w.late > 1.1 * generated:
                detail += f" ({LATE_NOTE})"
            bench.check(f"{name}: late orders are the generated late ones", w.late <= 1.1 * generated, detail)


def table(bench: Bench, args: argparse.Namespace, load: tuple[float, float]) -> Table:
    t = Table(title=f"weir shop pipeline bench: {args.records:,} generated records, local[2]")
    for name in ("stage", "rows", "seconds", "rows/s", "x baseline", "baseline", "notes"):
        t.add_column(name, justify="right" if name in ("rows", "seconds", "rows/s", "x baseline") else "left")
    for r in bench.results:
        base = bench.baselines.get(r.baseline)
        ratio = f"{r.rate / base:.3f}" if base else "-"
        t.add_row(r.stage, f"{r.rows:,}", f"{r.seconds:.2f}", f"{r.rate:,.0f}", ratio, r.baseline, r.note)
    t.caption = (
        "x baseline: over a raw confluent-kafka consume (librdkafka defaults) of the same topics in this run.\n"
        f"Load average (1 min) {load[0]:.2f} before, {load[1]:.2f} after, on {os.cpu_count()} cores."
    )
    return t


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000, help="generated records to produce")
    parser.add_argument("--seed", type=int, default=7, help="seed of the generator")
    parser.add_argument("--event-rate", type=float, default=10_000.0, help="records per second of event time")
    parser.add_argument("--customers", type=int, default=1000, help="customers in the table")
    parser.add_argument("--max-per-trigger", type=int, default=100_000, help="records per input per micro-batch")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    scratch = Path(tempfile.mkdtemp(prefix="weir-bench-shop-"))
    broker = EmbeddedBroker(scratch / "broker-home", free_port())
    bench = Bench()
    spark = None
    try:
        console.print(f"[bold]broker[/] on {broker.bootstrap}, scratch {scratch}")
        broker.start()
        bootstrap = broker.bootstrap
        shape = {"seed": args.seed, "event_rate": args.event_rate, "customers": args.customers}
        pipeline = build(rate=0, total=args.records, archive=False, **shape)  # the archive has its own bench
        from weir.runtime.runner import Runner

        Runner(pipeline, Settings(home=str(scratch), bootstrap_servers=bootstrap)).create_topics()
        start_ms = int(time.time() * 1000 - args.records / args.event_rate * 1000)  # the stream ends about now
        console.print("[bold]1. produce[/]")
        kinds = produce(bench, bootstrap, Shape(args.seed, start_ms, args.event_rate, args.customers), args.records)

        console.print("[bold]2. raw consume baselines[/]")
        baseline(bench, bootstrap, [ORDERS, CUSTOMERS])
        baseline(bench, bootstrap, [ORDERS, CUSTOMERS], tuned=True)

        console.print("[bold]spark session[/]")
        import weir

        conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}
        spark = weir.spark_session("weir-bench-shop", master="local[2]", conf=conf)
        spark.sparkContext.setLogLevel("ERROR")
        base = "raw orders+customers"

        console.print("[bold]3. end to end[/]")
        e2e = run_stage(spark, pipeline, bootstrap, scratch / "e2e", PIPELINE, args.max_per_trigger)
        rows = e2e.totals["enrich"].in_
        bench.add(Result("3. end to end, wall", rows, e2e.seconds, base, "orders + customers through all 4"))
        for proc in PIPELINE:
            # A window reads orders.enriched: its baseline is a raw consume of that topic (taken in stage 4).
            proc_base = "raw orders.enriched" if proc in ("revenue", "spend") else base
            add_steady(bench, f"3. end to end: {proc}, steady", e2e, proc, proc_base)
        check_accounting(bench, e2e, kinds)

        console.print("[bold]4. window alone (revenue)[/]")
        baseline(bench, bootstrap, ["orders.enriched"])
        window = run_stage(spark, pipeline, bootstrap, scratch / "window", ["revenue"], args.max_per_trigger)
        rows = window.totals["revenue"].in_
        bench.add(Result("4. window alone, wall", rows, window.seconds, "raw orders.enriched", "revenue"))
        add_steady(bench, "4. window alone, steady", window, "revenue", "raw orders.enriched")

        console.print("[bold]5. join alone (enrich)[/]")
        join = run_stage(spark, pipeline, bootstrap, scratch / "join", ["enrich"], args.max_per_trigger)
        bench.add(Result("5. join alone, wall", join.totals["enrich"].in_, join.seconds, base, "enrich"))
        add_steady(bench, "5. join alone, steady", join, "enrich", base)
        check_accounting(bench, join, kinds)
    finally:
        if spark is not None:
            spark.stop()
        broker.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    console.print(table(bench, args, (load_before, os.getloadavg()[0])))
    failed = [what for what, ok, _ in bench.checks if not ok]
    if failed:
        console.print(f"[red]correctness checks failed: {', '.join(failed)}[/]")
        return 1
    console.print(f"[green]all {len(bench.checks)} correctness checks passed[/]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
