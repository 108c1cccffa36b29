"""What the per-batch completeness checks cost (docs/delivery.md, "Completeness by offsets"), in one run.

    .venv/bin/python bench/completeness.py [--records 200000] [--partitions 4] [--per-batch 20000] [--rounds 2]

One stateless processor (parse, keep amount > 10, write a topic) reads N JSON records of about 150 B in batches of
`--per-batch` records, with available_now, in one Spark session (local[2]) against an embedded broker, alternately:
  observed     as `weir run` runs it: the read observation on its input (count, first and last offset per
               partition) checked against each batch's plan, and the writes checked against the marks
  baseline     the same processor with the observation taken out (weir.runtime.query._observe_reads replaced by
               the identity), so only the check's cost differs
Each mode runs `--rounds` times, alternating, each on a fresh checkpoint and output topic. Per batch after the
first (which pays the warm-up), the median triggerExecution ms; the ratio is observed over baseline, in the same
run. The load is printed. Every run must read each record once and report no gap.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from weir.config import Settings  # noqa: E402
from weir.kafka import Admin  # noqa: E402
from weir.kafka.broker import EmbeddedBroker, free_port  # noqa: E402
from weir.pipeline import Pipeline  # noqa: E402

console = Console(width=140)


def produce(bootstrap: str, topic: str, n: int, partitions: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    for i in range(n):
        value = json.dumps({"id": f"e{i:09d}", "user": f"u{i % 5000}", "amount": i % 40, "note": "x" * 60})
        while True:
            try:
                producer.produce(topic, value.encode(), f"u{i % 5000}".encode(), partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120):
        raise RuntimeError("records unacknowledged after 120 s")


def pipeline(source: str, partitions: int, tag: str) -> Pipeline:
    p = Pipeline(f"bench-complete-{tag}")
    events = p.topic(source, schema="id STRING, user STRING, amount INT, note STRING", key="user",
                     partitions=partitions)  # fmt: skip
    big = p.topic(f"{source}.big.{tag}", schema="id STRING, user STRING, amount INT", key="user",
                  partitions=partitions)  # fmt: skip

    @p.processor(inputs=[events], outputs=[big])
    def keep(e):
        return e.where("amount > 10").select("id", "user", "amount")

    return p


def run(spark, bootstrap: str, source: str, args: argparse.Namespace, home: Path, observed: bool) -> dict:
    import weir.runtime.query as query
    from weir.runtime.runner import Runner

    tag = uuid.uuid4().hex[:6]
    p = pipeline(source, args.partitions, tag)
    settings = Settings(
        home=str(home / tag), bootstrap_servers=bootstrap, checkpoint_root=str(home / tag / "checkpoints"),
        max_offsets_per_trigger=args.per_batch, max_restarts=0,
    )  # fmt: skip
    original = query._observe_reads
    if not observed:
        query._observe_reads = lambda stream, topic: stream
    try:
        runner = Runner(p, settings, spark=spark, available_now=True)
        runner.create_topics()
        runner.start()
        try:
            runner.wait()
        finally:
            runner.stop()
    finally:
        query._observe_reads = original
    records = [json.loads(x) for x in (home / tag / "progress" / f"{p.name}.jsonl").read_text().splitlines()]
    batches = [r for r in records if r.get("type") == "progress" and r.get("input_rows")]
    totals = runner.snapshot()["keep"].totals
    gaps = [g for r in batches for g in r["accounting"]["gaps"]]
    ms = [(r.get("duration_ms") or {}).get("triggerExecution", 0) for r in batches[1:]]
    return {"in": totals.in_, "violations": totals.violations, "gaps": gaps, "ms": ms, "batches": len(batches)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--per-batch", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    scratch = Path(tempfile.mkdtemp(prefix="weir-bench-complete-"))
    broker = EmbeddedBroker(scratch / "broker-home", free_port())
    spark = None
    results: dict[str, list[dict]] = {"observed": [], "baseline": []}
    try:
        broker.start()
        source = f"events-{uuid.uuid4().hex[:6]}"
        Admin(broker.bootstrap).create_topic(source, args.partitions)
        console.print(f"produce {args.records:,} records into {args.partitions} partitions")
        produce(broker.bootstrap, source, args.records, args.partitions)
        import weir

        spark = weir.spark_session("weir-bench-complete", master="local[2]", conf={"spark.ui.enabled": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        for i in range(args.rounds):
            for mode in ("observed", "baseline") if i % 2 == 0 else ("baseline", "observed"):
                began = time.monotonic()
                got = run(spark, broker.bootstrap, source, args, scratch, observed=mode == "observed")
                console.print(f"round {i + 1} {mode}: {got['batches']} batches, {time.monotonic() - began:.1f} s")
                results[mode].append(got)
    finally:
        if spark is not None:
            spark.stop()
        broker.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    load_after = os.getloadavg()[0]
    ok = all(r["in"] == args.records and not r["gaps"] and not r["violations"] for rs in results.values() for r in rs)
    med = {m: statistics.median([x for r in rs for x in r["ms"]]) for m, rs in results.items()}
    table = Table(title=f"completeness checks: {args.records:,} records, batches of {args.per_batch:,}")
    for c in ("mode", "runs", "median ms per batch (after the first)", "ratio to baseline"):
        table.add_column(c, justify="right" if c != "mode" else "left")
    for m in ("baseline", "observed"):
        table.add_row(m, str(len(results[m])), f"{med[m]:.0f}", f"{med[m] / med['baseline']:.3f}")
    console.print(table)
    console.print(f"every record read once, no gap, no violation: {ok}")
    console.print(f"load average (1 min): {load_before:.1f} before, {load_after:.1f} after; {os.cpu_count()} cores")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
