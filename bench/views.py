"""Materialized views: lookups over HTTP and freshness under load, in one run.

    .venv/bin/python bench/views.py [--rps 500] [--seconds 60] [--rows 10000] [--events 10000]
                                    [--fresh-seconds 60] [--skip-freshness]

1. Lookups: a view of `--rows` rows in the embedded SQLite store (written through ViewSink's own executor
   code, no Spark), served by a `weir serve` process (uvicorn) on loopback. A paced client (asyncio, the
   stdlib, 16 keep-alive connections) sends GET /views/<name>/<key> for random keys at `--rps` for `--seconds`;
   the latency of each request runs from its scheduled send time (a late send counts against the server, no
   coordinated omission). Goal: p99 under 10 ms at 500 requests/s.
2. Freshness: `weir run` of a pipeline holding one view, fed by a producer at `--events` records/s on 2
   partitions (keys over 1,000 categories). Every 100th record's (partition, offset, record time) is kept;
   the view's stored offsets are polled every 20 ms; a record is visible at the first poll whose offset for its
   partition is past it. Record-time-to-visible = that poll's time minus the record's time, measured after
   the view's first batch and a 10 s warm-up. Goal: p99 under 2 s at 10k records/s.

The machine's load is printed: this machine's speed varies from day to day, and other jobs share it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pyarrow as pa
from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from weir.kafka import Admin  # noqa: E402
from weir.kafka.broker import EmbeddedBroker, free_port  # noqa: E402
from weir.sinks.view import ViewSpec, _sqlite_prepare, _sqlite_task  # noqa: E402
from weir.storage.views import SqliteViews, sqlite_path  # noqa: E402

console = Console(width=140)
VIEW = "bench_view"


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


# -- 1. lookups -------------------------------------------------------------------------------------------------
def build_view(home: Path, rows: int) -> None:
    """A view of `rows` rows, written by ViewSink's executor code in batches of 5,000."""
    path = sqlite_path(str(home / "views"), "bench", VIEW)
    columns = (("category", "string"), ("revenue", "double"), ("orders", "bigint"))
    spec = ViewSpec(VIEW, "bench", "bench.totals", ("category",), columns, sqlite=str(path), writer="bench.view")
    _sqlite_prepare(spec)
    now = int(time.time() * 1000)
    for b, start in enumerate(range(0, rows, 5000)):
        n = min(5000, rows - start)
        batch = pa.RecordBatch.from_pydict({
            "category": [f"c{i:06d}" for i in range(start, start + n)], "revenue": [i * 1.5 for i in range(n)],
            "orders": list(range(n)), "_weir_delete": [False] * n, "_weir_ts_ms": [now] * n,
            "partition": [0] * n, "offset": list(range(start, start + n)),
        })  # fmt: skip
        list(_sqlite_task(ViewSpec(**{**spec.__dict__, "batch_id": b}), iter([batch])))


async def _request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str) -> int:
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    await reader.readexactly(length)
    return status


async def paced(port: int, rps: int, seconds: float, keys: int, conns: int = 16) -> tuple[list[float], dict]:
    """Latencies (ms, from each request's scheduled time) and answers by status."""
    pool: asyncio.Queue = asyncio.Queue()
    for _ in range(conns):
        pool.put_nowait(await asyncio.open_connection("127.0.0.1", port))
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    rng = random.Random(7)
    begin = time.perf_counter() + 0.2
    total = int(rps * seconds)

    async def one(at: float) -> None:
        conn = await pool.get()
        try:
            status = await _request(*conn, f"/views/{VIEW}/c{rng.randrange(keys):06d}")
            statuses[status] = statuses.get(status, 0) + 1
            latencies.append((time.perf_counter() - at) * 1000)
        finally:
            pool.put_nowait(conn)

    tasks = []
    for i in range(total):
        at = begin + i / rps
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(at)))
    await asyncio.gather(*tasks)
    while not pool.empty():
        _, w = pool.get_nowait()
        w.close()
    return latencies, statuses


def lookups(args: argparse.Namespace, scratch: Path) -> dict:
    home = scratch / "lookups"
    build_view(home, args.rows)
    port = free_port()
    env = {**os.environ, "WEIR_HOME": str(home)}
    server = subprocess.Popen([sys.executable, "-m", "weir.cli", "serve", "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                asyncio.run(paced(port, 50, 0.2, args.rows, conns=1))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("weir serve did not listen within 30 s") from None
                time.sleep(0.2)
        asyncio.run(paced(port, args.rps, 3, args.rows))  # warm-up, not counted
        began = time.perf_counter()
        lat, statuses = asyncio.run(paced(port, args.rps, args.seconds, args.rows))
        took = time.perf_counter() - began
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    return {"requests": len(lat), "achieved_rps": len(lat) / took, "p50": pct(lat, 0.5), "p99": pct(lat, 0.99),
            "max": max(lat), "statuses": statuses}  # fmt: skip


# -- 2. freshness ------------------------------------------------------------------------------------------------
PIPELINE = """
from weir.pipeline import Pipeline

p = Pipeline("bench")
totals = p.topic("bench.totals", schema="category STRING, revenue DOUBLE, n BIGINT", key="category", partitions=2)
p.view("{view}", source=totals, key="category", trigger="200 milliseconds")
"""


def freshness(args: argparse.Namespace, scratch: Path) -> dict:
    root = scratch / "freshness"
    root.mkdir()
    broker = EmbeddedBroker(root / "broker", free_port())
    broker.start()
    proc = None
    try:
        Admin(broker.bootstrap).create_topic("bench.totals", 2)
        spec = root / "pipeline.py"
        spec.write_text(textwrap.dedent(PIPELINE.format(view=VIEW)))
        env = {
            **os.environ, "WEIR_HOME": str(root / "home"), "WEIR_BOOTSTRAP_SERVERS": broker.bootstrap,
            "WEIR_CHECKPOINT_ROOT": str(root / "checkpoints"), "WEIR_SPARK_MASTER": "local[2]",
            "WEIR_SPARK_CONF": json.dumps({"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"}),
            "SPARK_LOCAL_IP": "127.0.0.1",
        }  # fmt: skip
        with open(root / "run.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "weir.cli", "run", str(spec)], env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        reader = SqliteViews({VIEW: sqlite_path(str(root / "home" / "views"), "bench", VIEW)}, timeout_s=2)
        sampled: list[tuple[int, int, int]] = []  # (partition, offset, record ms)
        stop = threading.Event()
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "acks": 1})

        def delivered(err, msg) -> None:
            if err is None and msg.offset() % 100 == 0:
                sampled.append((msg.partition(), msg.offset(), msg.timestamp()[1]))

        def produce() -> None:
            i, began = 0, time.perf_counter()
            while not stop.is_set():
                due = began + i / args.events
                if due > time.perf_counter():
                    time.sleep(max(0.0, min(due - time.perf_counter(), 0.01)))
                    continue
                cat = f"c{i % 1000:04d}"
                value = json.dumps({"category": cat, "revenue": i * 0.5, "n": i}).encode()
                while True:
                    try:
                        producer.produce("bench.totals", value, cat.encode(), partition=i % 2, callback=delivered)
                        break
                    except BufferError:
                        producer.poll(0.01)
                producer.poll(0)
                i += 1
            producer.flush(30)

        polls: list[tuple[float, dict[str, int]]] = []
        # Warm-up: a small first batch, so that the query's first-batch cost (JVM workers, 10-50 s on a busy
        # machine) is not measured as a backlog; the paced feed starts once the view applied it.
        for i in range(2000):
            producer.produce("bench.totals", json.dumps({"category": f"w{i}", "revenue": 0.0, "n": i}).encode(),
                             f"w{i}".encode(), partition=i % 2)  # fmt: skip
        producer.flush(30)
        deadline = time.time() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"weir run exited with {proc.returncode}: see {root / 'run.log'}")
            try:
                if reader.info(VIEW, count=False).freshness.batch_id is not None:
                    break
            except Exception:  # the store is created at the query's start
                pass
            if time.time() > deadline:
                raise RuntimeError("the view applied no batch within 300 s (warm-up)")
            time.sleep(0.1)
        feeder = threading.Thread(target=produce, daemon=True)
        feeder.start()
        began = time.time()
        first_applied = None
        deadline = began + 300
        while True:
            now = time.time()
            if proc.poll() is not None:
                raise RuntimeError(f"weir run exited with {proc.returncode}: see {root / 'run.log'}")
            try:
                info = reader.info(VIEW, count=False)
                if info.freshness.batch_id is not None:
                    polls.append((now, dict(info.freshness.offsets), info.freshness.as_of_ms))
                    first_applied = first_applied or now
            except Exception:  # the store is created at the query's start
                pass
            if first_applied is None and now > deadline:
                raise RuntimeError("the view applied no batch within 300 s")
            if first_applied is not None and now > first_applied + 10 + args.fresh_seconds:
                break
            time.sleep(0.02)
        stop.set()
        feeder.join(60)
        measured_from = (first_applied + 10) * 1000
        lat = []
        pending = sorted((ms, p, o) for p, o, ms in sampled if ms >= measured_from)
        for ms, p, o in pending:
            seen = next((t for t, offs, _ in polls if offs.get(str(p), 0) > o and t * 1000 >= ms), None)
            if seen is not None:
                lat.append(seen * 1000 - ms)
        unseen = len(pending) - len(lat)
        # What a reader sees: the view's lag (now - the newest record time applied) at each poll of the window.
        polled = [t * 1000 - a for t, _, a in polls if a is not None and t * 1000 >= measured_from]
        console.print(f"polls {len(polls)}, last offsets {polls[-1][1] if polls else None}, sampled {len(sampled)}")
        rate = len(sampled) * 100 / max(time.time() - began, 1)
        return {"records_sampled": len(pending), "unseen": unseen, "p50": pct(lat, 0.5), "p99": pct(lat, 0.99),
                "max": max(lat) if lat else float("nan"), "produced_rps": rate, "lag_p50": pct(polled, 0.5),
                "lag_p99": pct(polled, 0.99), "lag_max": max(polled) if polled else float("nan")}  # fmt: skip
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        broker.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rps", type=int, default=500)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--fresh-seconds", type=float, default=60)
    ap.add_argument("--skip-freshness", action="store_true")
    ap.add_argument("--skip-lookups", action="store_true")
    args = ap.parse_args()
    load_start = os.getloadavg()
    console.print(f"load average {load_start} on {os.cpu_count()} cores")
    scratch = Path(tempfile.mkdtemp(prefix="weir-bench-views-"))
    look = None if args.skip_lookups else lookups(args, scratch)
    console.print(f"lookups: {look}")
    fresh = None if args.skip_freshness else freshness(args, scratch)
    if fresh:
        console.print(f"freshness: {fresh}")
    t = Table(title="materialized views (bench/views.py)")
    for h in ("measure", "rate", "p50", "p99", "max", "goal", "met"):
        t.add_column(h, justify="left" if h in ("measure", "goal") else "right")
    if look:
        t.add_row(f"lookup GET /views/<name>/<key> ({args.rows:,} rows, SQLite)", f"{look['achieved_rps']:.0f} req/s",
                  f"{look['p50']:.2f} ms", f"{look['p99']:.2f} ms", f"{look['max']:.1f} ms", "p99 < 10 ms",
                  "yes" if look["p99"] < 10 else "no")  # fmt: skip
    if fresh:
        t.add_row("record time to visible in the view", f"{fresh['produced_rps']:,.0f} rec/s",
                  f"{fresh['p50'] / 1000:.2f} s", f"{fresh['p99'] / 1000:.2f} s", f"{fresh['max'] / 1000:.2f} s",
                  "p99 < 2 s", "yes" if fresh["p99"] < 2000 else "no")  # fmt: skip
        t.add_row("the view's lag as readers see it (now - as_of)", "", f"{fresh['lag_p50'] / 1000:.2f} s",
                  f"{fresh['lag_p99'] / 1000:.2f} s", f"{fresh['lag_max'] / 1000:.2f} s", "", "")  # fmt: skip
    console.print(t)
    statuses = look and look["statuses"]
    samples, unseen = (fresh["records_sampled"], fresh["unseen"]) if fresh else (None, None)
    console.print(f"answers by status: {statuses}; freshness samples {samples}, never seen {unseen}")
    console.print(f"load average {load_start} at start, {os.getloadavg()} at end, {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
