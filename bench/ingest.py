"""HTTP ingest (`weir ingest http`) against a raw confluent-kafka producer, in one run.

    .venv/bin/python bench/ingest.py [--seconds 8] [--batch 100] [--clients 1,8,64]

An embedded broker and one `weir ingest http` process are started here. For each client count, that many
clients (one asyncio process, keep-alive connections, a hand-rolled HTTP/1.1 writer so the client costs
little of the 2 cores) POST NDJSON batches of `--batch` records of about 110 bytes for `--seconds`; each
request is answered 201 only after the broker acknowledged all its records. The baseline is the same
contract without HTTP: one confluent-kafka producer (idempotent, acks=all) in this process keeping that many
batches in flight, a batch done when its last record is acknowledged.

Printed: records/s and p50/p99 latency per request (per batch for the baseline), HTTP over raw, CPU time per
record (the server process's; the baseline process's, librdkafka's threads included): a figure the machine's
other load moves far less than wall time), the machine's load average before and after, and whether the
goals hold: HTTP at least 50% of raw with batches of 100, p99 under 50 ms at 8 clients.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from weir.kafka.broker import EmbeddedBroker, free_port

console = Console(width=140)
SCHEMA = "order_id STRING NOT NULL, customer_id STRING NOT NULL, amount DOUBLE, ts_ms BIGINT"
TOPIC = "bench_orders"


def record(n: int, i: int) -> dict:
    return {"order_id": f"o{n}-{i}", "customer_id": f"c{i % 997}", "amount": i * 0.5, "ts_ms": 1_795_000_000_000 + i}


def body(batch: int, n: int) -> bytes:
    return b"\n".join(json.dumps(record(n, i)).encode() for i in range(batch))


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def client(host: str, port: int, payloads: list[bytes], until: float, lat: list[float], bad: list[int]) -> int:
    reader, writer = await asyncio.open_connection(host, port)
    sent, i = 0, 0
    try:
        while time.perf_counter() < until:
            payload = payloads[i % len(payloads)]
            i += 1
            head = (f"POST /topics/{TOPIC} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/x-ndjson\r\n"
                    f"Content-Length: {len(payload)}\r\n\r\n").encode()  # fmt: skip
            t0 = time.perf_counter()
            writer.write(head + payload)
            status_line = await reader.readline()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            lat.append(time.perf_counter() - t0)
            status = int(status_line.split()[1])
            if status == 201:
                sent += 1
            else:
                bad.append(status)
    finally:
        writer.close()
    return sent


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used: a figure the machine's other load moves far less."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def http_point(host: str, port: int, clients: int, batch: int, seconds: float, server: int) -> dict:
    payloads = [body(batch, n) for n in range(64)]
    lat: list[float] = []
    bad: list[int] = []

    async def run() -> int:
        until = time.perf_counter() + seconds
        counts = await asyncio.gather(*(client(host, port, payloads, until, lat, bad) for _ in range(clients)))
        return sum(counts)

    started, cpu = time.perf_counter(), cpu_s(server)
    ok = asyncio.run(run())
    elapsed = time.perf_counter() - started
    cpu_us = (cpu_s(server) - cpu) / max(ok * batch, 1) * 1e6
    return {"rps": ok * batch / elapsed, "p50": pct(lat, 0.5) * 1000, "p99": pct(lat, 0.99) * 1000,
            "requests": ok, "refused": len(bad), "cpu_us": cpu_us}  # fmt: skip


def raw_point(bootstrap: str, clients: int, batch: int, seconds: float) -> dict:
    """`clients` batches in flight on one idempotent producer; a batch is done at its last acknowledgement."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 2})
    records = [body(batch, n).split(b"\n") for n in range(64)]
    lat: list[float] = []
    state = {"flight": 0, "batches": 0}

    def one(n: int) -> None:
        left = [batch]
        t0 = time.perf_counter()

        def acked(err, msg) -> None:
            left[0] -= 1
            if left[0] == 0:
                lat.append(time.perf_counter() - t0)
                state["flight"] -= 1
                state["batches"] += err is None

        for value in records[n % 64]:
            producer.produce(TOPIC, value, value[13:25], on_delivery=acked)
        state["flight"] += 1

    until = time.perf_counter() + seconds
    started, n, cpu = time.perf_counter(), 0, time.process_time()
    while time.perf_counter() < until:
        while state["flight"] < clients:
            one(n)
            n += 1
        producer.poll(0.001)
    producer.flush(30)
    elapsed = time.perf_counter() - started
    cpu_us = (time.process_time() - cpu) / max(state["batches"] * batch, 1) * 1e6
    return {"rps": state["batches"] * batch / elapsed, "p50": pct(lat, 0.5) * 1000, "p99": pct(lat, 0.99) * 1000,
            "requests": state["batches"], "refused": 0, "cpu_us": cpu_us}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--clients", default="1,8,64")
    a = parser.parse_args()
    counts = [int(c) for c in a.clients.split(",")]
    load_before = os.getloadavg()
    home = Path(tempfile.mkdtemp(prefix="weir-bench-ingest-"))
    broker = EmbeddedBroker(home, free_port())
    broker.start()
    env = {**os.environ, "WEIR_HOME": str(home), "WEIR_BOOTSTRAP_SERVERS": broker.bootstrap}
    log = open(home / "ingest.log", "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [sys.executable, "-m", "weir.cli", "ingest", "http", "--topic", TOPIC, "--schema", SCHEMA, "--key",
         "order_id", "--partitions", "4", "--port", "0"], stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (m := re.search(r"listening on http://([\d.]+):(\d+)", (home / "ingest.log").read_text())):
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit(f"the ingest server did not start:\n{(home / 'ingest.log').read_text()[-2000:]}")
            time.sleep(0.1)
        host, port = m.group(1), int(m.group(2))
        http_point(host, port, 8, a.batch, 2.0, server.pid)  # warm-up: connections, the producer's id, the decoder
        raw_point(broker.bootstrap, 8, a.batch, 1.0)
        rows = []
        for c in counts:
            raw = raw_point(broker.bootstrap, c, a.batch, a.seconds)
            http = http_point(host, port, c, a.batch, a.seconds, server.pid)
            rows.append((c, raw, http))
            console.print(f"{c} clients: raw {raw['rps']:,.0f} rec/s, http {http['rps']:,.0f} rec/s", style="dim")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        log.close()
        broker.stop()
    load_after = os.getloadavg()
    table = Table(title=f"HTTP ingest vs raw producer: batches of {a.batch} records, {a.seconds:g}s per point")
    for h in ("clients", "raw rec/s", "raw p50 ms", "raw p99 ms", "http rec/s", "http p50 ms", "http p99 ms",
              "http/raw", "raw CPU µs/rec", "server CPU µs/rec", "refused"):  # fmt: skip
        table.add_column(h, justify="right")
    for c, raw, http in rows:
        table.add_row(str(c), f"{raw['rps']:,.0f}", f"{raw['p50']:.1f}", f"{raw['p99']:.1f}", f"{http['rps']:,.0f}",
                      f"{http['p50']:.1f}", f"{http['p99']:.1f}", f"{http['rps'] / raw['rps']:.2f}",
                      f"{raw['cpu_us']:.1f}", f"{http['cpu_us']:.1f}", str(http["refused"]))  # fmt: skip
    console.print(table)
    before, after = ("/".join(f"{x:.2f}" for x in load) for load in (load_before, load_after))
    console.print(f"machine: {os.cpu_count()} cores, load average (1/5/15 min) before {before}, after {after}")
    by = {c: (raw, http) for c, raw, http in rows}
    if 8 in by:
        raw8, http8 = by[8]
        ratio = http8["rps"] / raw8["rps"]
        console.print(f"goal 1, HTTP >= 50% of raw at 8 clients: {ratio:.0%} {'met' if ratio >= 0.5 else 'NOT met'}")
        console.print(f"goal 2, p99 < 50 ms at 8 clients: {http8['p99']:.1f} ms "
                      f"{'met' if http8['p99'] < 50 else 'NOT met'}")  # fmt: skip
    best = max(by[c][1]["rps"] / by[c][0]["rps"] for c in by)
    console.print(f"best HTTP/raw over the client counts: {best:.0%}; median p99: "
                  f"{statistics.median(by[c][1]['p99'] for c in by):.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
