"""What skipping replays costs a processor's Kafka write (docs/delivery.md, "Replays"), in one run.

    .venv/bin/python bench/replay.py [--records 300000] [--partitions 4]

The weir-kafka sink's task code (its writer's `write`, weir.kafka.sink) writes N records of about 150 B, with the
headers a processor's records carry, to an embedded broker, in-process (no Spark: the figures are the task's own):
  raw            confluent-kafka's Producer with the sink's settings: the baseline
  unguarded      the sink as a plain weir-kafka write (at-least-once)
  first write    the sink with a replay guard, as `weir run` writes a batch the first time
  replay         the same batch written again after it was all delivered: each task reads the batch's records
                 back from the marks and skips every row (the worst case of a replay: nothing left to write)
and the driver's step per batch: noting the marks of 3 topics (begin), median of 20.
Ratios are against raw in the same run; the load is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pyarrow as pa
from confluent_kafka import Producer
from pyspark.sql.types import ArrayType, BinaryType, StringType, StructField, StructType
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from weir.checkpoint.files import Checkpoint  # noqa: E402
from weir.kafka import Admin  # noqa: E402
from weir.kafka.broker import EmbeddedBroker, free_port  # noqa: E402
from weir.kafka.options import parse_sink  # noqa: E402
from weir.kafka.replay import Guard, begin  # noqa: E402
from weir.kafka.sink import KafkaBatchWriter  # noqa: E402

console = Console(width=140)
HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField(
            "headers", ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
        ),
    ]
)


def batches(topic: str, n: int, chunk: int = 20_000) -> list[pa.RecordBatch]:
    out = []
    for lo in range(0, n, chunk):
        ids = range(lo, min(n, lo + chunk))
        keys = [f"user-{i % 5000}".encode() for i in ids]
        pad = "x" * 60
        values = [
            f'{{"id": {i}, "user": "user-{i % 5000}", "amount": {i % 997}.25, "ts_ms": {i}, "pad": "{pad}"}}'.encode()
            for i in ids
        ]
        headers = [
            [{"key": "weir.processor", "value": b"bench"}, {"key": "weir.source", "value": f"in/{i % 4}/{i}".encode()}]
            for i in ids
        ]
        arrays = [pa.array([topic] * len(ids)), pa.array(keys, pa.binary()), pa.array(values, pa.binary())]
        out.append(pa.RecordBatch.from_arrays([*arrays, pa.array(headers, HEADERS)], names=[*SCHEMA.names]))
    return out


def timed(fn) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def raw(bootstrap: str, data: list[pa.RecordBatch]) -> None:
    opts = parse_sink({"kafka.bootstrap.servers": bootstrap})
    p = Producer(opts.producer_settings())
    for b in data:
        topics, keys, values = (b.column(i).to_pylist() for i in range(3))
        hs = [[(h["key"], h["value"]) for h in x] for x in b.column(3).to_pylist()]
        for i in range(b.num_rows):
            while True:
                try:
                    p.produce(topics[i], values[i], keys[i], headers=hs[i])
                    break
                except BufferError:
                    p.poll(0.05)
        p.poll(0)
    assert p.flush(120) == 0


def sink(bootstrap: str, data: list[pa.RecordBatch], guard: Guard | None) -> int:
    options = {"kafka.bootstrap.servers": bootstrap} | ({"replayGuard": guard.to_option()} if guard else {})
    opts = parse_sink(options)
    return KafkaBatchWriter(opts, SCHEMA).write(iter(data)).records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--partitions", type=int, default=4)
    a = parser.parse_args()
    load_before = os.getloadavg()
    scratch = Path(tempfile.mkdtemp(prefix="weir-bench-replay-"))
    broker = EmbeddedBroker(scratch / "broker", free_port())
    broker.start()
    rows = []
    try:
        admin = Admin(broker.bootstrap)
        names = {k: f"replay-{k}-{uuid.uuid4().hex[:6]}" for k in ("raw", "plain", "guarded", "side1", "side2")}
        for t in names.values():
            admin.create_topic(t, a.partitions)
        client = {"bootstrap.servers": broker.bootstrap}
        sink(broker.bootstrap, batches(names["plain"], 20_000), None)  # warm-up: the pooled producer's id
        raw(broker.bootstrap, batches(names["raw"], 20_000))  # and the broker's first appends, for both
        n = a.records
        data = {k: batches(names[k], n) for k in ("raw", "plain", "guarded")}  # built before the clocks run
        rows.append(("raw", timed(lambda: raw(broker.bootstrap, data["raw"]))))
        rows.append(("unguarded", timed(lambda: sink(broker.bootstrap, data["plain"], None))))
        checkpoint = Checkpoint(str(scratch / "ck"))
        topics = [names["guarded"], names["side1"], names["side2"]]
        first = begin(checkpoint, "bench", 1, topics, client, 30)
        rows.append(("first write", timed(lambda: sink(broker.bootstrap, data["guarded"], first))))
        again = begin(checkpoint, "bench", 1, topics, client, 30)
        assert again.replay
        wrote = []
        rows.append(("replay", timed(lambda: wrote.append(sink(broker.bootstrap, data["guarded"], again)))))
        assert wrote == [0], f"the replay wrote {wrote[0]} records of a batch that was all delivered"
        marks = [timed(lambda i=i: begin(checkpoint, "bench", 10 + i, topics, client, 30)) for i in range(20)]
    finally:
        broker.stop()
    load_after = os.getloadavg()
    base = rows[0][1]
    table = Table(
        title=f"A processor's write of {a.records:,} records (~190 B with headers), {a.partitions} partitions"
    )
    for h in ("write", "seconds", "records/s", "vs raw", "µs/record over raw"):
        table.add_column(h, justify="right")
    for label, secs in rows:
        table.add_row(label, f"{secs:.2f}", f"{a.records / secs:,.0f}", f"{base / secs:.2f}",
                      f"{(secs - base) / a.records * 1e6:+.2f}")  # fmt: skip
    console.print(table)
    console.print(f"marks per batch (3 topics x {a.partitions} partitions, driver): median "
                  f"{statistics.median(marks) * 1000:.1f} ms, max {max(marks) * 1000:.1f} ms")  # fmt: skip
    before, after = ("/".join(f"{x:.2f}" for x in load) for load in (load_before, load_after))
    console.print(f"machine: {os.cpu_count()} cores, load average (1/5/15 min) before {before}, after {after}")


if __name__ == "__main__":
    main()
