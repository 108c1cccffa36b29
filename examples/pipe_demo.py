"""The pipe demo (`make demo`): JSON events through weir-kafka, with every record accounted for.

It starts the embedded broker, produces events at a steady rate (about 1% malformed on purpose), and runs
two Structured Streaming queries over the same topic: decoded events go to `events.clean` (each record
carrying its source coordinates in the `weir.source` header), records that fail to decode go to
`events.dlq` with the reason. A live table shows rates and the balance: in = clean + dead-lettered.
The shop pipeline of the pipelines issue replaces this demo as it lands.
"""

from __future__ import annotations

import json
import random
import signal
import tempfile
import threading
import time
from datetime import UTC, datetime

import typer
from confluent_kafka import Producer
from rich.console import Console
from rich.live import Live
from rich.table import Table

import weir
from weir.kafka import Admin, embedded_broker
from weir.kafka.broker import free_port

SCHEMA = "user STRING NOT NULL, amount DOUBLE NOT NULL, category STRING, event_time TIMESTAMP NOT NULL"
console = Console()


def produce(bootstrap: str, rate: int, stop: threading.Event, seed: int, sent: list[int]) -> None:
    """Events at `rate` per second until stopped; about 1% are malformed so the DLQ path is visible."""
    rng = random.Random(seed)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    while not stop.is_set():
        tick = time.monotonic()
        for _ in range(max(1, rate // 10)):
            user = f"u{rng.randrange(1000)}"
            if rng.random() < 0.01:
                value = rng.choice([b'{"user": "broken"', b"\xff\xfe", b'{"user": "x", "amount": "lots"}'])
            else:
                event = {
                    "user": user,
                    "amount": round(rng.uniform(1, 200), 2),
                    "category": rng.choice(["books", "games", "garden", "tools"]),
                    "event_time": datetime.now(UTC).isoformat(),
                }
                value = json.dumps(event).encode()
            producer.produce("events", value, user.encode())
            sent[0] += 1
        producer.poll(0)
        time.sleep(max(0.0, 0.1 - (time.monotonic() - tick)))
    producer.flush(30)


def summary(queries: dict, admin: Admin, sent: int, elapsed: float) -> Table:
    counts = {t: sum(hi - lo for lo, hi in admin.offsets(t).values()) for t in ("events", "events.clean", "events.dlq")}
    table = Table(title=f"weir pipe demo: {elapsed:.0f}s")
    for col in ("query", "batch", "input rows/s", "processed rows/s", "rows in last batch"):
        table.add_column(col, justify="right" if col != "query" else "left")
    for name, q in queries.items():
        p = q.lastProgress or {}
        table.add_row(
            name,
            str(p.get("batchId", "-")),
            f"{p.get('inputRowsPerSecond', 0):,.0f}",
            f"{p.get('processedRowsPerSecond', 0):,.0f}",
            str(p.get("numInputRows", "-")),
        )
    table.add_section()
    table.add_row("produced", "", "", "", f"{sent:,}")
    for topic, n in counts.items():
        table.add_row(f"topic {topic}", "", "", "", f"{n:,}")
    handled = counts["events.clean"] + counts["events.dlq"]
    table.add_row("in flight (events - clean - dlq)", "", "", "", f"{counts['events'] - handled:,}")
    return table


def main(
    duration: int = typer.Option(60, help="Seconds to run; Ctrl-C stops earlier."),
    rate: int = typer.Option(2000, help="Events produced per second."),
    seed: int = typer.Option(7, help="Random seed of the generator."),
) -> None:
    home = tempfile.mkdtemp(prefix="weir-demo-")
    broker = embedded_broker(home, free_port())
    console.print(f"starting the embedded broker on {broker.bootstrap} ...")
    broker.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        admin = Admin(broker.bootstrap)
        admin.create_topic("events", partitions=4)
        admin.create_topic("events.clean", partitions=4)
        admin.create_topic("events.dlq", partitions=1)
        sent = [0]
        producer = threading.Thread(target=produce, args=(broker.bootstrap, rate, stop, seed, sent), daemon=True)
        producer.start()
        console.print("starting Spark (about 10 s) ...")
        spark = weir.spark_session("weir-pipe-demo", master="local[2]", conf={"spark.ui.enabled": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        events = (
            spark.readStream.format("weir-kafka")
            .option("kafka.bootstrap.servers", broker.bootstrap)
            .option("subscribe", "events")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", 50_000)
            .option("valueFormat", "json")
            .option("valueSchema", SCHEMA)
            .load()
        )
        clean = events.where("_error IS NULL").selectExpr(
            "key", "to_json(struct(user, amount, category, event_time)) AS value", "topic", "partition", "offset"
        )
        dlq = events.where("_error IS NOT NULL").selectExpr(
            "key",
            "value",
            "topic",
            "partition",
            "offset",
            "array(named_struct('key', 'weir.error', 'value', encode(_error, 'UTF-8'))) AS headers",
        )
        queries = {}
        for name, df, target in (("clean", clean, "events.clean"), ("dead letters", dlq, "events.dlq")):
            queries[name] = (
                df.writeStream.format("weir-kafka")
                .option("kafka.bootstrap.servers", broker.bootstrap)
                .option("topic", target)
                .option("checkpointLocation", f"{home}/checkpoints/{target}")
                .trigger(processingTime="2 seconds")
                .queryName(name)
                .start()
            )
        started = time.monotonic()
        with Live(console=console, refresh_per_second=1) as live:
            while not stop.is_set() and time.monotonic() - started < duration:
                live.update(summary(queries, admin, sent[0], time.monotonic() - started))
                if any(q.exception() for q in queries.values()):
                    break
                stop.wait(1.0)
        stop.set()
        producer.join(timeout=30)
        console.print("producer stopped; draining what is left so the books balance ...")
        for name, q in queries.items():
            if q.exception() is None:
                q.processAllAvailable()  # finish in-flight batches instead of aborting them mid-write
            else:
                console.print(f"[red]query {name} failed:[/red] {q.exception()}")
            q.stop()
        console.print(summary(queries, admin, sent[0], time.monotonic() - started))
        spark.stop()
    except KeyboardInterrupt:
        stop.set()
        console.print("stopping ...")
    finally:
        broker.stop()


if __name__ == "__main__":
    typer.run(main)
