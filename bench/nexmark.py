"""Nexmark on weir: the standard streaming benchmark's q0, q1, q2, q5, q7 and q8, each checked exactly, against
Spark's own query and Bytewax on the same events in the same run.

    .venv/bin/python bench/nexmark.py [--events N] [--only q0,q1,q2,q5,q7,q8] [--systems weir,spark,bytewax]
                                      [--rate EVENTS_PER_EVENT_SECOND] [--seed 7] [--timeout 1800] [--profile]

Workload. N Nexmark events (default 500,000) from bench/nexmark/nexmark_gen.py, the Beam / nexmark/nexmark
generator's model written anew: per 50 events 1 person, 3 auctions, 46 bids; dense person and auction ids;
auctions' sellers and bids' bidders among the active persons or the hot one (3 in 4), bids for the hot auction
(1 in 2) or one of the last 100 auctions in flight; prices in cents, round(10^(6u) * 100); an auction expires
after it opened; each event padded by `extra` to the model's average size (person 200 B, auction 500 B, bid
100 B). Event time advances at a fixed --rate events per event-second (Nexmark's 10,000, lowered to N/100 for
a smaller N, so that a run spans at least 100 event-seconds: enough closed windows to check), in order. The
module docstring of nexmark_gen.py has the model rule by rule. The events are produced as JSON with
confluent-kafka to the topics person, auction and bid (4 partitions each, keyed by id, id and auction) of an
embedded Apache Kafka broker this script starts on a free port and stops at the end; each record's Kafka
timestamp is its event time (`dateTime`, epoch ms). All of it is produced before any system runs: each system
drains the same backlog.

Queries (Nexmark's, the nexmark/nexmark project's SQL; watermark: dateTime - 4 s, as its DDL):
  q0  pass-through of the bids: auction, bidder, price, dateTime, extra
  q1  currency conversion: the same with price * 908 DIV 1000 (integer cents: exact in every system, where
      Nexmark's 0.908 * price is a DECIMAL)
  q2  selection: auction, price of the bids with auction % 123 = 0
  q5  hot items: per sliding window of 10 s every 2 s, the auction(s) with the most bids (ties all kept)
  q7  highest bid: per tumbling 10 s window, the bid(s) at the window's highest price. A window is
      [start, start + 10 s): Nexmark's SQL takes dateTime BETWEEN end - 10 s AND end, both ends included
  q8  new users: per tumbling 10 s window, the persons who opened an auction as seller in the window they
      joined: (id, name, window start)

Systems, each a subprocess of its own, its whole process tree measured (bench/peers.py's `launch`):
  weir     bench/nexmark/weir_queries.py:<query> by `weir run ... --once` with default settings (local[2],
           a fresh home, checkpoints and lake): how weir's blocks express each query is in that file's docstring
  spark    bench/nexmark/spark_queries.py <query>: Spark's own Kafka connector -> from_json -> the query ->
           format("kafka"), Trigger.AvailableNow, local[2], spark.sql.shuffle.partitions 2, no maxOffsetsPerTrigger
  bytewax  bench/nexmark/bytewax_queries.py by `python -m bytewax.testing ... -p2 -w1` (2 processes), Bytewax
           0.21.1 in its venv under ~/.cache/weir-bench/venvs (made on first use, as bench/peers.py does): q0, q1,
           q2, q7. q5 and q8 are not written for Bytewax here (its windows are per key; q5's second step needs a
           ranking across keys per window, q8 a join of two windowed streams): those cells read "-"

Checks. Each system writes its output to its own topic (nexmark.<system>.<query>); every record is read back
and compared, as a multiset of rows, with the same query computed by DuckDB over the generated events (held in
memory). Any missing, extra or doubled row fails the check, prints the difference, and the script exits 1.
Windowed queries (q5, q7, q8) compare only the windows the watermark must have closed when the input is
drained, and show how many later windows a system wrote (not compared):
  - one watermark of 4 s over the query's inputs: window end <= max dateTime of its inputs - 4 s (q7, q8; q5
    in Spark, whose chained aggregation evicts both steps on the same watermark);
  - weir's q5 has two steps: the sliding counts close end <= max bid dateTime - 4 s; the second step's
    watermark is the largest window end it read less its delay (10 s), so it closes end <= that - 10 s.
Spark's q7 keeps one bid per window (the max of a struct): a tie at a window's top price, which the price
distribution makes rare, would show as a missing row and fail the check honestly.

Columns:
  query        the query
  events       the input records the query reads (bids; persons and auctions for q8)
  weir rows/s  events / seconds from the launch of `weir run` to its last committed batch (its last progress
               record): start-up, every batch and the drain of the output included, JVM shutdown not
  Spark rows/s events / seconds from launch to awaitTermination's return in Spark's query program
  weir/Spark   the ratio of the two (above 1: weir faster)
  Bytewax rows/s  events / seconds from launch to the last process's end of work (its sink closed)
  checks       per system: ok, or FAIL with the difference (also printed below the table)
The load average is printed before and after: the machine is shared, compare figures of one run only.

A published reference (not measured here): Flink 1.13, nexmark/nexmark's README (8 TaskManagers of 1 slot, 100
million events, 10 M events/s source), reported throughput per core: q0 155.02 K/s, q1 157.94 K/s, q2
175.21 K/s, q5 22.14 K/s, q7 12.33 K/s, q8 146.14 K/s; those count every Nexmark event the source generates.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pandas as pd
from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "bench" / "nexmark"
sys.path[:0] = [str(ROOT), str(HERE), str(ROOT / "bench")]

import jfr_top  # noqa: E402
from nexmark_gen import DEFAULT_RATE, Auction, Bid, Generator, Person  # noqa: E402
from peers import consume_all, launch, peer_python, read_stats, tail  # noqa: E402

from weir.kafka import Admin  # noqa: E402
from weir.kafka.broker import embedded_broker, free_port  # noqa: E402

console = Console(width=max(160, shutil.get_terminal_size().columns))
QUERIES = ("q0", "q1", "q2", "q5", "q7", "q8")
SYSTEMS = ("weir", "spark", "bytewax")
BYTEWAX_QUERIES = ("q0", "q1", "q2", "q7")
INPUTS = {"q0": ("bid",), "q1": ("bid",), "q2": ("bid",), "q5": ("bid",), "q7": ("bid",), "q8": ("person", "auction")}
TOPIC_CONFIG = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}
SIZE_MS, SLIDE_MS, DELAY_MS = 10_000, 2_000, 4_000
HOT_DELAY_MS = 10_000  # weir q5's second step (weir_queries.HOT_DELAY)
WINDOWED = {"q5", "q7", "q8"}

Row = tuple  # one output row, as the check compares it


# ---------------------------------------------------------------- the events


@dataclass
class Events:
    """The generated events by kind, as DuckDB reads them, and their counts by topic."""

    person: pd.DataFrame
    auction: pd.DataFrame
    bid: pd.DataFrame

    def count(self, topics: tuple[str, ...]) -> int:
        return sum(len(getattr(self, t)) for t in topics)

    def max_time(self, topics: tuple[str, ...]) -> int:
        return max(int(getattr(self, t)["dateTime"].max()) for t in topics)


def produce(bootstrap: str, n: int, rate: int, seed: int) -> Events:
    """N events to person, auction, bid (JSON, Kafka timestamp = dateTime); returns them as DataFrames."""
    span_ms = n * 1000 // rate
    base = (int(time.time() * 1000) - span_ms) // SIZE_MS * SIZE_MS  # windows line up with the first event
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000,
                         "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1_048_576,
                         "acks": 1})  # fmt: skip
    rows: dict[str, list[dict]] = {"person": [], "auction": [], "bid": []}
    for event in Generator(seed, base, rate).events(n):
        fields = event.__dict__
        if isinstance(event, Bid):
            topic, key = "bid", event.auction
        elif isinstance(event, Auction):
            topic, key = "auction", event.id
        else:
            assert isinstance(event, Person)
            topic, key = "person", event.id
        rows[topic].append(fields)
        value = json.dumps(fields).encode()
        while True:
            try:
                producer.produce(topic, value, str(key).encode(), timestamp=event.dateTime)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(300):
        raise RuntimeError("events were not all delivered")
    return Events(*(pd.DataFrame(rows[t]) for t in ("person", "auction", "bid")))


# ---------------------------------------------------------------- the expected outputs, by DuckDB

EXPECTED_SQL = {
    "q0": "SELECT auction, bidder, price, dateTime, extra FROM bid",
    "q1": "SELECT auction, bidder, price * 908 // 1000, dateTime, extra FROM bid",
    "q2": "SELECT auction, price FROM bid WHERE auction % 123 = 0",
    # Sliding windows [start, start + 10 s) with start a multiple of 2 s: a bid at t is in the 5 starting at
    # t - t % 2 s - k * 2 s, k = 0..4.
    "q5": f"""
        WITH hop AS (
            SELECT auction, dateTime - dateTime % {SLIDE_MS} - k * {SLIDE_MS} AS starttime
            FROM bid, range(0, {SIZE_MS // SLIDE_MS}) AS r(k)),
        counts AS (SELECT starttime, auction, count(*) AS num FROM hop GROUP BY starttime, auction),
        best AS (SELECT starttime, max(num) AS num FROM counts GROUP BY starttime)
        SELECT c.starttime, c.auction, c.num FROM counts c JOIN best b USING (starttime) WHERE c.num = b.num""",
    "q7": f"""
        WITH b AS (SELECT *, dateTime - dateTime % {SIZE_MS} AS starttime FROM bid),
        top AS (SELECT starttime, max(price) AS price FROM b GROUP BY starttime)
        SELECT b.starttime, b.auction, b.bidder, b.price, b.dateTime, b.extra
        FROM b JOIN top USING (starttime) WHERE b.price = top.price""",
    "q8": f"""
        WITH p AS (SELECT DISTINCT id, name, dateTime - dateTime % {SIZE_MS} AS starttime FROM person),
        a AS (SELECT DISTINCT seller, dateTime - dateTime % {SIZE_MS} AS starttime FROM auction)
        SELECT p.id, p.name, p.starttime FROM p JOIN a ON p.id = a.seller AND p.starttime = a.starttime""",
}
# The fields of each query's output record, in the order of EXPECTED_SQL's columns.
FIELDS = {
    "q0": ("auction", "bidder", "price", "dateTime", "extra"),
    "q1": ("auction", "bidder", "price", "dateTime", "extra"),
    "q2": ("auction", "price"),
    "q5": ("starttime", "auction", "num"),
    "q7": ("starttime", "auction", "bidder", "price", "dateTime", "extra"),
    "q8": ("id", "name", "starttime"),
}


def expected(events: Events, query: str) -> Counter:
    con = duckdb.connect()
    for name in ("person", "auction", "bid"):
        con.register(name, getattr(events, name))
    rows = con.execute(EXPECTED_SQL[query]).fetchall()
    con.close()
    return Counter(tuple(r) for r in rows)


def closing_bound(events: Events, query: str, system: str) -> int | None:
    """The largest window end the watermark must have closed once the system drained its input (None: the
    query has no windows). See the module docstring, "Checks"."""
    if query not in WINDOWED:
        return None
    bound = events.max_time(INPUTS[query]) - DELAY_MS
    if query == "q5" and system == "weir":
        last_end = bound // SLIDE_MS * SLIDE_MS  # the last window the sliding counts close
        bound = last_end - HOT_DELAY_MS
    return bound


# ---------------------------------------------------------------- checks


def check(bootstrap: str, topic: str, query: str, want: Counter, bound: int | None) -> tuple[bool, str]:
    """The topic's records against the expected rows (those of windows ending by `bound`): (exact, detail)."""
    fields = FIELDS[query]
    got: Counter = Counter()
    beyond = bad = 0
    for _key, value in consume_all(bootstrap, topic):
        try:
            r = json.loads(value)
            row = tuple(r[f] for f in fields)
        except (TypeError, KeyError, json.JSONDecodeError):
            bad += 1
            continue
        if bound is not None and r["starttime"] + SIZE_MS > bound:
            beyond += 1
            continue
        got[row] += 1
    if bound is not None:
        want = Counter({row: n for row, n in want.items() if row[fields.index("starttime")] + SIZE_MS <= bound})
    missing, extra = want - got, got - want
    twice = sum(n for row, n in extra.items() if row in want)
    detail = f"{sum(got.values()):,} of {sum(want.values()):,} rows"
    if missing:
        detail += f", {sum(missing.values()):,} missing (e.g. {_short(next(iter(missing)))})"
    if twice:
        detail += f", {twice:,} doubled"
    if sum(extra.values()) > twice:
        stray = next(row for row in extra if row not in want)
        detail += f", {sum(extra.values()) - twice:,} unexpected (e.g. {_short(stray)})"
    if bad:
        detail += f", {bad:,} unreadable"
    if bound is not None:
        windows = len({row[fields.index("starttime")] for row in want})
        detail += f" in {windows} closed windows"
        if beyond:
            detail += f"; {beyond:,} rows of later windows (not compared)"
    return not missing and not extra and not bad, detail


def _short(row: Row) -> str:
    return str(tuple(v[:12] + "..." if isinstance(v, str) and len(v) > 15 else v for v in row))


# ---------------------------------------------------------------- the systems


@dataclass
class Result:
    rate: float | None = None
    ok: bool | None = None
    detail: str = ""
    cpu: float | None = None
    split: tuple[float, float, float] | None = None  # seconds: before the first batch, in batches, between them
    cpu_parts: str = ""  # CPU seconds by kind of process (bench/peers.py's TreeSampler)


def split(launch: float, done: float, first: float | None, batch_ms: list[float]) -> tuple[float, float, float] | None:
    """Where a run's seconds went: from the launch to its first batch's start (the process, Spark's session and
    the query's start), inside batches (Spark's triggerExecution), and the rest until the last batch's end."""
    if first is None or done <= launch:
        return None
    before, inside = first - launch, sum(batch_ms) / 1000
    return before, inside, max(0.0, done - launch - before - inside)


@dataclass
class Bench:
    bootstrap: str
    scratch: Path
    events: Events
    timeout: float
    results: dict[tuple[str, str], Result] = field(default_factory=dict)
    profile: bool = False  # --profile: each system's JVM records a JFR profile, summed up after its run

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("WEIR_", "NX_", "PYSPARK_"))}
        env.update(NX_BOOTSTRAP=self.bootstrap, **extra)
        return env

    def profiled(self, env: dict[str, str], system: str, query: str) -> Path | None:
        """With --profile, `env` made to start the run's JVM with Java Flight Recorder (where its CPU goes)."""
        if not self.profile:
            return None
        recording = self.scratch / f"{system}-{query}.jfr"
        env["JDK_JAVA_OPTIONS"] = f"-XX:StartFlightRecording=filename={recording},settings=profile,dumponexit=true"
        return recording

    def output(self, system: str, query: str) -> str:
        topic = f"nexmark.{system}.{query}"
        Admin(self.bootstrap).create_topic(topic, 4, TOPIC_CONFIG, exist_ok=True)
        return topic

    def finish(self, system: str, query: str, result: Result, topic: str | None, run_ok: bool) -> Result:
        if run_ok and topic is not None:
            want = expected(self.events, query)
            result.ok, detail = check(self.bootstrap, topic, query, want, closing_bound(self.events, query, system))
            result.detail = (result.detail + " " + detail).strip()
        self.results[(query, system)] = result
        verdict = "" if result.ok is None else " [green]exact[/]" if result.ok else " [red]WRONG[/]"
        console.print(f"  {system} {query}: {_rate(result.rate)} rows/s{verdict} {result.detail}", highlight=False)
        return result


def run_weir(bench: Bench, query: str) -> Result:
    home = bench.scratch / f"weir-{query}"
    home.mkdir(parents=True, exist_ok=True)
    env = bench.env(
        WEIR_HOME=str(home), WEIR_BOOTSTRAP_SERVERS=bench.bootstrap, WEIR_CHECKPOINT_ROOT=str(home / "checkpoints"),
        WEIR_LAKE=str(home / "lake"), WEIR_SPARK_MASTER="local[2]", WEIR_MAX_RESTARTS="0",
    )  # fmt: skip
    env["PYTHONPATH"] = str(ROOT)
    topic = bench.output("weir", query)
    cmd = [sys.executable, "-m", "weir.cli", "run", f"bench/nexmark/weir_queries.py:{query}", "--once"]
    recording = bench.profiled(env, "weir", query)
    run = launch(cmd, env, home / "run.log", bench.timeout)
    if recording is not None and recording.exists():
        console.print(jfr_top.summary(recording), highlight=False)
    progress = _progress(home / "progress" / f"nexmark_{query}.jsonl")
    result = Result(cpu=run.cpu, cpu_parts=run.cpu_parts)
    inputs = bench.events.count(INPUTS[query])
    # The query's events are the first processor's input (q5's second step reads the first's windows).
    first = [r for r in progress if r.get("processor") == _first_processor(query)]
    read = sum(r.get("input_rows") or 0 for r in first)
    late = sum((r.get("accounting") or {}).get("late", 0) or 0 for r in progress)
    if progress:
        done = max(r["at_ms"] for r in progress) / 1000
        result.rate = inputs / (done - run.launch) if done > run.launch else None
        ms = [float((r.get("duration_ms") or {}).get("triggerExecution", 0)) for r in progress]
        # a progress record is published as its batch ends: the first began its triggerExecution before
        began = min(r["at_ms"] - (r.get("duration_ms") or {}).get("triggerExecution", 0) for r in progress) / 1000
        result.split = split(run.launch, done, began, ms)
        result.detail = f"{len(progress)} batches;"
    if read != inputs:
        result.detail += f" read {read:,} of {inputs:,};"
    if late:
        result.detail += f" {late:,} routed late;"
    ok = run.rc == 0 and not run.timed_out
    if run.timed_out:
        result.detail += f" timed out after {run.ended - run.launch:.0f} s"
    elif run.rc != 0:
        result.detail += f" failed (exit {run.rc}): {tail(run.log)}"
        result.ok = False
    return bench.finish("weir", query, result, topic, ok)


def _first_processor(query: str) -> str:
    return {"q0": "passthrough", "q1": "euros", "q2": "selection", "q5": "counts", "q7": "highest",
            "q8": "new_users"}[query]  # fmt: skip


def _progress(path: Path) -> list[dict]:
    try:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except OSError:
        return []
    return [r for r in records if r.get("type") == "progress"]


def run_spark(bench: Bench, query: str) -> Result:
    topic = bench.output("spark", query)
    stats = bench.scratch / f"spark-{query}.stats"
    env = bench.env(NX_OUTPUT=topic, NX_STATS=str(stats), NX_CHECKPOINT=str(bench.scratch / f"spark-{query}-ckpt"))
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, str(HERE / "spark_queries.py"), query]
    recording = bench.profiled(env, "spark", query)
    run = launch(cmd, env, bench.scratch / f"spark-{query}.log", bench.timeout)
    if recording is not None and recording.exists():
        console.print(jfr_top.summary(recording), highlight=False)
    lines = read_stats(stats)
    result = Result(cpu=run.cpu, cpu_parts=run.cpu_parts)
    inputs = bench.events.count(INPUTS[query])
    ok = run.rc == 0 and bool(lines)
    if ok:
        s = lines[-1]
        result.rate = inputs / (s["done"] - run.launch)
        result.split = split(run.launch, s["done"], s.get("first"), [ms for _, ms in s["batches"]])
        result.detail = f"{sum(1 for r, _ in s['batches'] if r)} batches with input;"
        if s["rows"] != inputs:
            result.detail += f" read {s['rows']:,} of {inputs:,};"
    else:
        result.ok = False
        result.detail = f"failed (exit {run.rc}): {tail(run.log)}"
    return bench.finish("spark", query, result, topic, ok)


def run_bytewax(bench: Bench, query: str, python: Path | None, why: str) -> Result:
    if query not in BYTEWAX_QUERIES:
        result = Result(detail="not written for Bytewax (see the docstring)")
        bench.results[(query, "bytewax")] = result
        return result
    if python is None:
        return bench.finish("bytewax", query, Result(detail=why), None, False)
    topic = bench.output("bytewax", query)
    stats = bench.scratch / f"bytewax-{query}.stats"
    env = bench.env(NX_OUTPUT=topic, NX_STATS=str(stats), PYTHONPATH=str(HERE))
    cmd = [str(python), "-m", "bytewax.testing", f"bytewax_queries:{query}", "-p2", "-w1"]
    run = launch(cmd, env, bench.scratch / f"bytewax-{query}.log", bench.timeout, cwd=HERE)
    lines = read_stats(stats)
    result = Result(cpu=run.cpu, cpu_parts=run.cpu_parts)
    inputs = bench.events.count(INPUTS[query])
    ok = run.rc == 0 and bool(lines)
    if ok:
        read = sum(s["rows"] for s in lines)
        result.rate = read / (max(s["done"] for s in lines) - run.launch)
        result.detail = f"{len(lines)} processes;"
        late = sum(s.get("late", 0) for s in lines)
        if late:
            result.detail += f" {late:,} bids late by its window clock (dropped);"
        if read != inputs:
            result.detail += f" read {read:,} of {inputs:,};"
    else:
        result.ok = False
        result.detail = f"failed (exit {run.rc}): {tail(run.log)}"
    return bench.finish("bytewax", query, result, topic, ok)


# ---------------------------------------------------------------- report


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _splits(bench: Bench, queries: list[str]) -> str:
    """Where each run's time went (Result.split), a line per query and system that has it."""
    lines = []
    for q in queries:
        for system in ("weir", "spark"):
            r = bench.results.get((q, system))
            if r is not None and r.split is not None:
                before, inside, between = r.split
                lines.append(f"{q} {system}: {before:.1f} s to the first batch, {inside:.1f} s in batches, "
                             f"{between:.1f} s between them; CPU {r.cpu or 0:.1f} s: {r.cpu_parts}")  # fmt: skip
    return "".join(f"{line}\n" for line in lines)


def report(bench: Bench, queries: list[str], systems: list[str], load: tuple[tuple, tuple], n: int) -> Table:
    t = Table(title=f"Nexmark, {n:,} events, local[2], each system draining the same backlog")
    for name in ("query", "events", "weir rows/s", "Spark rows/s", "weir/Spark", "Bytewax rows/s", "checks"):
        t.add_column(name, justify="left" if name in ("query", "checks") else "right", overflow="fold")
    for q in queries:
        r = {s: bench.results.get((q, s)) for s in SYSTEMS}
        weir, spark = r["weir"], r["spark"]
        ratio = f"{weir.rate / spark.rate:.2f}x" if weir and spark and weir.rate and spark.rate else "-"
        checks = []
        for s in systems:
            res = r[s]
            if res is None:
                continue
            verdict = "-" if res.ok is None else "[green]ok[/]" if res.ok else "[red]FAIL[/]"
            checks.append(f"{s} {verdict}")
        t.add_row(q, f"{bench.events.count(INPUTS[q]):,}", _rate(weir and weir.rate), _rate(spark and spark.rate),
                  ratio, _rate(r["bytewax"] and r["bytewax"].rate), ", ".join(checks))  # fmt: skip
    t.caption = _splits(bench, queries) + (
        f"load average {' '.join(f'{x:.2f}' for x in load[0])} before, {' '.join(f'{x:.2f}' for x in load[1])} "
        f"after; {os.cpu_count()} cores. rows/s: the query's input events / seconds from launch to drained output."
    )
    return t


# ---------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=500_000, help="Nexmark events to generate (N)")
    parser.add_argument("--rate", type=int, default=None, help="events per event-second (10,000; N/100 if less)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--only", default=",".join(QUERIES), help=f"queries among {','.join(QUERIES)}")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"systems among {','.join(SYSTEMS)}")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before a system's run is stopped")
    parser.add_argument("--profile", action="store_true", help="record each weir and Spark run's JVM with JFR")
    args = parser.parse_args()
    queries = [q.strip() for q in args.only.split(",") if q.strip()]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if set(queries) - set(QUERIES) or set(systems) - set(SYSTEMS):
        parser.error(f"--only among {','.join(QUERIES)}, --systems among {','.join(SYSTEMS)}")
    rate = args.rate or min(DEFAULT_RATE, max(args.events // 100, 1))
    load_start = os.getloadavg()
    console.print(f"[bold]load average[/] {load_start} on {os.cpu_count()} cores")
    scratch = Path(tempfile.mkdtemp(prefix="weir-bench-nexmark-"))
    broker = embedded_broker(scratch / "broker", free_port(), kind="kafka")
    try:
        broker.start()
        bootstrap = broker.bootstrap
        console.print(f"[bold]broker[/] on {bootstrap}, scratch {scratch}")
        for topic in ("person", "auction", "bid"):
            Admin(bootstrap).create_topic(topic, 4, TOPIC_CONFIG, exist_ok=True)
        t0 = time.perf_counter()
        events = produce(bootstrap, args.events, rate, args.seed)
        console.print(
            f"[bold]produced[/] {args.events:,} events ({len(events.person):,} persons, {len(events.auction):,} "
            f"auctions, {len(events.bid):,} bids) at {rate:,}/event-s in {time.perf_counter() - t0:.1f} s"
        )
        bench = Bench(bootstrap, scratch, events, args.timeout, profile=args.profile)
        bytewax_python, why = (None, "")
        if "bytewax" in systems and set(queries) & set(BYTEWAX_QUERIES):
            bytewax_python, why = peer_python("bytewax")
        runners: dict[str, Callable[[Bench, str], Result]] = {
            "weir": run_weir,
            "spark": run_spark,
            "bytewax": lambda b, q: run_bytewax(b, q, bytewax_python, why),
        }
        for q in queries:
            console.print(f"[bold]{q}[/]")
            for s in systems:
                runners[s](bench, q)
    finally:
        broker.stop()
        shutil.rmtree(scratch / "broker", ignore_errors=True)  # the topics; logs and stats stay
    load_end = os.getloadavg()
    console.print(report(bench, queries, systems, (load_start, load_end), args.events))
    wrong = [(q, s, r.detail) for (q, s), r in bench.results.items() if r.ok is False]
    for q, s, detail in wrong:
        console.print(f"[red]{s} {q} differs from DuckDB's result:[/] {detail}", highlight=False)
    console.print(f"logs and stats kept in {scratch}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
