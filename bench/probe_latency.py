"""How long the driver's view of the log (weir.kafka.log.LogView.bounds: the high-water marks every micro-batch
plans from) takes while a paced producer writes, against a plain consumer's end-to-end latency on the same topic.

    .venv/bin/python bench/probe_latency.py [--rate 5000] [--seconds 60] [--every 0.2]

No Spark: an embedded broker, a producer at --rate events/s into a 4-partition topic, a subscribed consumer
timing each record against its produce time (the floor), and LogView.bounds called every --every s from a
pooled view, as the weir-kafka source calls it when it plans a batch. Prints p50, p99 and max of each, and
how many bounds calls failed (BrokerUnavailable) or took longer than 1 s. Issue 27: weir's live batches stalled
in LogView._probe for 10+ s while the plain consumer kept up.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from weir.kafka import Admin
from weir.kafka.broker import EmbeddedBroker, free_port
from weir.kafka.log import pooled


def quantiles(xs: list[float]) -> str:
    if not xs:
        return "none"
    s = sorted(xs)
    q = statistics.quantiles(s, n=100) if len(s) > 1 else [s[0]] * 99
    return f"n {len(s):,}, p50 {q[49] * 1000:,.0f} ms, p99 {q[98] * 1000:,.0f} ms, max {s[-1] * 1000:,.0f} ms"


def produce(bootstrap: str, topic: str, rate: float, seconds: float, stop: threading.Event) -> int:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    sent, began = 0, time.monotonic()
    while not stop.is_set() and time.monotonic() - began < seconds:
        due = int((time.monotonic() - began) * rate)
        while sent < due:
            p.produce(topic, key=str(sent % 97).encode(), value=repr(time.time()).encode())
            sent += 1
        p.poll(0)
        time.sleep(0.005)
    p.flush(30)
    return sent


def consume(bootstrap: str, topic: str, stop: threading.Event, out: list[float]) -> None:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-bench-{time.time()}",
                  "auto.offset.reset": "earliest", "fetch.wait.max.ms": 50, "enable.auto.commit": False})  # fmt: skip
    # Assigned, not subscribed: a group join takes about half of session.timeout.ms on the embedded broker
    # (shared/FACTS.md), which would delay the first 20 s of records.
    c.assign([TopicPartition(topic, p, 0) for p in range(4)])
    try:
        while not stop.is_set():
            for m in c.consume(1000, 0.2):
                if m.error() is None:
                    out.append(time.time() - float(m.value()))
    finally:
        c.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=5000.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--every", type=float, default=0.2, help="seconds between bounds calls")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="probe-bench-"))
    broker = EmbeddedBroker(scratch / "broker", free_port())
    broker.start()
    try:
        topic = "probe.events"
        Admin(broker.bootstrap).create_topic(topic, 4)
        stop = threading.Event()
        latencies: list[float] = []
        reader = threading.Thread(target=consume, args=(broker.bootstrap, topic, stop, latencies), daemon=True)
        reader.start()
        sent: list[int] = []
        writer = threading.Thread(
            target=lambda: sent.append(produce(broker.bootstrap, topic, args.rate, args.seconds, stop)), daemon=True
        )
        writer.start()
        calls: list[float] = []
        failures: list[str] = []
        tps = [(topic, p) for p in range(4)]
        while writer.is_alive():
            began = time.monotonic()
            try:
                with pooled({"bootstrap.servers": broker.bootstrap}, 30.0) as view:
                    view.bounds(tps)
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {exc}"[:200])
            calls.append(time.monotonic() - began)
            time.sleep(args.every)
        writer.join()
        time.sleep(2)
        stop.set()
        reader.join(10)
        print(f"rate {args.rate:,.0f}/s for {args.seconds:.0f} s: {sent[0] if sent else 0:,} sent")
        print(f"consumer end-to-end latency: {quantiles(latencies)}")
        print(f"LogView.bounds: {quantiles(calls)}; over 1 s: {sum(c > 1 for c in calls)}; failed: {len(failures)}")
        for f in failures[:5]:
            print(f"  {f}")
    finally:
        broker.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
