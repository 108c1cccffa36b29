"""The shop demo (`make demo`): the whole shop pipeline on the embedded broker, with every record accounted for.

    python -m examples.shop.demo --duration 60 [--rate 1000] [--speedup 10] [--seed 7]

It starts the embedded broker, `weir monitor` (a separate process: its dashboard URL is printed before the
live table), and Spark, runs every processor of the shop pipeline as its own query, and
shows a live table of each processor's state, rates and accounting (in = out + filtered + dlq + late +
absorbed, per batch; a batch that does not balance is a violation). It stops after --duration seconds or
on Ctrl-C, then prints the accounting summary and how many records each topic holds, one `weir sql` query
(revenue by category over the orders topic: its lake plus its live tail), and stops the monitor.
A monitor that fails to start is a yellow warning with the end of its log; the demo goes on without it.

Event time runs --speedup times faster than the wall clock, so that the 1-minute and 5-minute windows
close while you watch; the first batches take 10-30 s (JVM and Python workers warming up). The summary
compares the late orders with those the generator made late on purpose: on 2 cores a batch can span more
event time than the windows' 30 s delay, and then on-time orders are routed late too (never dropped).

Each run uses a fresh directory for checkpoints, the progress log and Spark's log: the embedded broker
keeps its topics in memory, so a checkpoint from an earlier run would point at offsets that no longer
exist. With WEIR_HOME set, that directory is created inside it and kept.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from confluent_kafka import Consumer, TopicPartition
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from examples.shop.customers_pg import TABLE, CustomerTable, logical_dsn
from examples.shop.orders_http import OrderClient, stats
from examples.shop.pipeline import SPEND_LATENESS, build
from examples.shop.records import ORDERS, Shape, records
from weir import units
from weir.config import Settings
from weir.formats import value_format
from weir.formats.ddl import parse_fields
from weir.ingest.postgres import where
from weir.kafka import Admin, embedded_broker
from weir.kafka.broker import free_port
from weir.pipeline import Pipeline, Topic
from weir.process import die_with_parent
from weir.runtime.accounting import Counts

if TYPE_CHECKING:
    from weir.runtime.runner import ProcessorStatus, Runner

# Piped to a file, rich would assume 80 columns and squeeze the table; a terminal keeps its own width.
console = Console(width=None if sys.stdout.isatty() else 130)
FIGURES = ("in_", "out", "filtered", "dlq", "late", "absorbed", "emitted", "replayed")
HEADERS = ("in", "out", "filtered", "dlq", "late", "absorbed", "emitted", "replayed")
FIRST_OUTPUT_S = 180.0  # how long a story waits, after the run, for the first output it shows
# The duration counts from when every query runs: on 2 loaded cores launching the 12 takes minutes (measured: 2.5),
# and a clock started before would end the demo before the last ones (the real-time big_order) ran at all.
LAUNCH_WAIT_S = 300.0


def _n(v: float) -> str:
    return f"{v:,.0f}"


def launched(snapshot: dict) -> bool:
    """Whether every query of the run has started (running, or done with its inputs)."""
    return all(st.state in ("running", "finished") for st in snapshot.values())


def live_table(snapshot: dict, elapsed: float, duration: float, live: bool = True,
               realtime: frozenset[str] = frozenset(), launching: bool = False) -> Table:  # fmt: skip
    """One row per processor, then the totals. The counts cover finished batches only (a real-time processor's,
    named in `realtime`, at its checkpoints: "real time" in the admission column). While `launching`, `elapsed` is
    the launch's: the duration counts once every query runs."""
    hint = " (Ctrl-C stops)" if live else ""
    clock = f"launching the queries, {elapsed:.0f}s" if launching else f"{elapsed:.0f}s of {duration:.0f}s"
    table = Table(title=f"weir shop demo: {clock}{hint}")
    for h in ("processor", "state", "in/s", "admission", *HEADERS, "violations", "restarts"):
        table.add_column(h, justify="left" if h in ("processor", "state", "admission") else "right")
    total = Counts()
    rate = 0.0
    for name, st in snapshot.items():
        t = st.totals
        total.add(t)
        rate += st.input_rate
        state = st.state if st.state in ("running", "finished") else f"[yellow]{st.state}[/]"
        violations = f"[red]{t.violations}[/]" if t.violations else "0"
        table.add_row(
            name, state, _n(st.input_rate), _mode(st) if name in realtime else _admission(st.admission),
            *[_n(getattr(t, f)) for f in FIGURES],
            violations, str(st.restarts),
        )  # fmt: skip
    table.add_section()
    violations = f"[red]{total.violations}[/]" if total.violations else "0"
    table.add_row("total", "", _n(rate), "", *[_n(getattr(total, f)) for f in FIGURES], violations, "")
    errors = [f"{n}: {st.last_error}" for n, st in snapshot.items() if st.last_error and st.state != "running"]
    if errors:
        table.caption = "last errors:\n" + "\n".join(errors)
    return table


VIEW = "revenue_by_category"


def serve_argv(port: int) -> list[str]:
    """`weir serve` of every view in the demo's home (no pipeline to import: no PySpark in that process)."""
    return [sys.executable, "-m", "weir.cli", "serve", "--port", str(port)]


@contextlib.contextmanager
def live_display(console: Console) -> Iterator[Live]:
    """rich's Live display, whose last render ends its line also off a terminal (a log file, a pipe): Live ends
    it on a terminal only, and the next line was glued to it ("...nothing applied yet)orders over HTTP")."""
    with Live(console=console, refresh_per_second=1) as live:
        yield live
    if not console.is_terminal:
        console.line()


def view_line(base: str | None) -> str:
    """One lookup of the view over HTTP, as the live summary shows it: a page of rows, the view's freshness and
    the request's latency."""
    if base is None:
        return "weir serve did not start: no view lookups"
    began = time.monotonic()
    try:
        with urllib.request.urlopen(f"{base}/views/{VIEW}?limit=6", timeout=2) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        if exc.code in (404, 503):  # the view's query has not written its first batch yet
            return f"view {VIEW} over HTTP: waiting for its first batch (GET {base}/views/{VIEW}: {exc.code})"
        return f"GET {base}/views/{VIEW}: {exc.code} {json.loads(exc.read()).get('error', '')[:100]}"
    except (OSError, ValueError) as exc:
        return f"GET {base}/views/{VIEW}: {exc}"
    ms = (time.monotonic() - began) * 1000
    fresh = body.get("freshness") or {}
    rows = ", ".join(_minute(r) for r in body.get("rows", [])) or "no closed window yet"
    lag = f"{fresh['lag_s']:.1f}s behind" if fresh.get("lag_s") is not None else "nothing applied yet"
    return f"view {VIEW} over HTTP ({ms:.1f} ms): {rows}; current as of {fresh.get('as_of') or '-'} ({lag})"


def _minute(row: dict) -> str:
    """A category's latest closed minute: revenue, and the average, 95th percentile and distinct buyers of its orders
    (the window's sketches: docs/blocks.md, "Aggregates")."""

    def amount(v: float | None) -> str:
        return "-" if v is None else f"{v:,.0f}"

    more = f"avg {amount(row.get('avg_order'))}, p95 {amount(row.get('p95_order'))}, {row.get('buyers') or 0} buyers"
    return f"{row['category']} {amount(row.get('revenue'))} ({more})"


def _mode(st: ProcessorStatus) -> str:
    """A real-time processor's mode now: "real time", or micro-batches while it stays away after a starved batch or
    a failure (docs/realtime.md)."""
    return "real time" if st.realtime is not False else "micro-batches for now"


def realtime_line(name: str, st: ProcessorStatus) -> str:
    """How a real-time processor's batches ran: how many in real time, and each time it left real time, why."""
    line = f"{name}: {st.realtime_batches:,} of its {st.batches:,} batches in real time"
    if st.realtime_left:
        line += f"; it left real time for micro-batches {st.realtime_left} time(s), the last: {st.realtime_left_why}"
    return line


def _admission(a: dict | None) -> str:
    """flow = auto (docs/flow.md): the last batch's limit and why, e.g. "40,000 warming up"."""
    return "-" if not a else f"{_n(a.get('limit') or 0)} {a.get('reason', '')}"


def balance_table(snapshot: dict) -> Table:
    """Per processor: in = out + filtered + dlq + late + duplicate + absorbed, over every finished batch."""
    table = Table(title="accounting: in = out + filtered + dlq + late + duplicate + absorbed")
    for h in ("processor", "in", "accounted", "unaccounted", "emitted", "violations", "balanced"):
        table.add_column(h, justify="left" if h == "processor" else "right")
    for name, st in snapshot.items():
        t = st.totals
        ok = "[green]yes[/]" if t.balanced and not t.violations else "[red]NO[/]"
        table.add_row(name, _n(t.in_), _n(t.accounted), _n(t.unaccounted), _n(t.emitted), str(t.violations), ok)
    return table


def topic_table(admin: Admin, topics: list[str]) -> Table:
    """Records each topic holds (the .dlq and .late topics exist for inputs only)."""
    table = Table(title="topics")
    table.add_column("topic")
    table.add_column("records", justify="right")
    existing = admin.topics()
    for topic in topics:
        if topic in existing:
            table.add_row(topic, _n(sum(hi - lo for lo, hi in admin.offsets(topic).values())))
    return table


def lateness(snapshot: dict, seed: int, generated: int | None = None) -> str:
    """How many orders each window found late, against how many the generator made late on purpose."""
    if generated is None:  # records of the stream: all from the generator's query, unless orders came over HTTP
        generated = snapshot["generate"].totals.out
    made = sum(1 for r in records(Shape(seed=seed), 0, generated) if r.output == ORDERS and r.late)
    late = {n: snapshot[n].totals.late for n in ("revenue", "spend")}
    text = f"late orders: revenue {late['revenue']:,}, spend {late['spend']:,}; generated late on purpose: {made:,}"
    if max(late.values()) > 1.1 * made:
        text += (
            "\n  more than generated: each enrich batch writes its orders grouped by customer, so a window batch"
            "\n  that reads part of it sees its newest event times, and the watermark passes the rest. That"
            "\n  happens when a batch spans more event time than the 30 s delay (slow batches, --speedup)."
        )
    return text


def updates(bootstrap: str, topic: Topic, registry_conf: dict[str, str]) -> str:
    """How many spend windows late orders updated within the allowed lateness (records of revision 2 and up)."""
    found = decoded(tail(bootstrap, topic.name, n=1_000_000), topic, registry_conf)
    again = [d for d in found if (d.get("revision") or 1) > 1]
    return (f"{topic.name}: {len(found):,} window records, {len(again):,} of them updates for late orders within "
            f"{SPEND_LATENESS} of allowed lateness (revision 2 and up, the same key and window)")  # fmt: skip


def upserted(path: str) -> str:
    """What spend_lake's Delta table holds, read back by DuckDB: one row per customer and window, updated in place."""
    import duckdb

    from weir.storage import delta

    table = delta.open_table(path)
    if table is None:
        return f"spend_lake: no window in {path} yet"
    con = duckdb.connect()
    con.register("spend", table.to_pyarrow_dataset())
    [(rows, keys, updated)] = con.sql(
        "select count(*), count(distinct (customer_id, window_start)), count(*) filter (where revision > 1) from spend"
    ).fetchall()
    return (f"spend_lake: Delta table {path} (version {table.version()}), read back by DuckDB: {rows:,} rows for "
            f"{keys:,} windows, {updated:,} of them updated in place to a later revision")  # fmt: skip


def start_postgres() -> tuple[contextlib.AbstractContextManager | None, str]:
    """The demo's own PostgreSQL (wal_level=logical), started from Debian's binaries in a temp dir on a free port, as
    the tests start theirs (tests/pgserver.py): the customers table and the schema registry's state live in it.
    (None, why) when it cannot start: customers then come from the generator, and alerts are JSON."""
    try:
        from tests.pgserver import PrivatePostgres

        server = PrivatePostgres("logical")
        server.start()
    except Exception as exc:
        return None, f"no PostgreSQL for the demo ({' '.join(str(exc).split())[:200]})"
    return server, f"PostgreSQL (wal_level=logical) for the demo at {where(server.dsn)}"


def start_registry(dsn: str | None) -> tuple[contextlib.AbstractContextManager | None, str]:
    """The schema registry the Avro alerts are registered in: weir's test double of the Confluent registry REST
    API (tests/registry_server.py, state in the demo's PostgreSQL at `dsn`; weir ships no registry). (None, why)
    when it cannot start: alerts are JSON then."""
    if dsn is None:
        return None, "alerts are JSON: no schema registry (it keeps its state in PostgreSQL, and there is none)"
    try:
        from tests.registry_server import RegistryServer

        server = RegistryServer(dsn)
        server.__enter__()
    except Exception as exc:
        return None, f"alerts are JSON: no schema registry ({' '.join(str(exc).split())[:200]})"
    return server, f"alerts are Avro in the Confluent wire format, registered in the schema registry at {server.url}"


def registered(settings: Settings, topic: str) -> str:
    """Where a topic's schema is in the registry: its subject, version and id (what a consumer's deserializer
    finds by the id each record carries)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    client = SchemaRegistryClient(settings.registry_conf())
    latest, key = client.get_latest_version(f"{topic}-value"), client.get_latest_version(f"{topic}-key")
    return (f"{topic}: Avro schema id {latest.schema_id}, version {latest.version} of subject {latest.subject} in "
            f"the schema registry (weir registered it before the first write); keys: Avro schema id {key.schema_id} "
            f"of subject {key.subject}")  # fmt: skip


def decoded(values: list[bytes], topic: Topic, registry_conf: dict[str, str]) -> list[dict]:
    """Values as the topic's format reads them (JSON, or Avro, Protobuf, JSON Schema through the registry)."""
    if topic.format.kind == "json":
        return [json.loads(v) for v in values]
    columns, _ = value_format(topic.format, topic.name, registry_conf).decoder().decode(values)
    names = [f.name for f in parse_fields(topic.schema)]
    return [dict(zip(names, row, strict=True)) for row in zip(*(c.to_pylist() for c in columns), strict=True)]


def tail(bootstrap: str, topic: str, n: int = 5) -> list[bytes]:
    """The last values of a topic (up to n per partition, newest last by timestamp)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "shop-demo", "enable.auto.commit": False})
    try:
        bounds = Admin(bootstrap).offsets(topic)
        consumer.assign([TopicPartition(topic, p, max(lo, hi - n)) for p, (lo, hi) in bounds.items()])
        wanted = sum(min(n, hi - lo) for lo, hi in bounds.values())
        got = []
        deadline = time.monotonic() + 10
        while len(got) < wanted and time.monotonic() < deadline:
            got += [m for m in consumer.consume(wanted - len(got), timeout=1.0) if m.error() is None]
    finally:
        consumer.close()
    got.sort(key=lambda m: m.timestamp()[1])
    return [m.value() for m in got[-n:]]


@contextlib.contextmanager
def jvm_output_to(path: Path) -> Iterator[None]:
    """Processes started inside (the Spark JVM, and through it the Python workers) write their stdout and
    stderr to `path`: the workers print a banner per stateful query and Spark logs task aborts on stop, which
    would tear through the live table. This process gets its own terminal back on exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def lake_summary(root: str, topic: str) -> str:
    """What the archiver put in the lake, read back: the topic's Delta table through DuckDB (rows, each record
    once, the hours), and the offsets its commits cover per Kafka partition."""
    import duckdb

    from weir.storage.lake import Lake

    lake = Lake(root)
    table = lake.table(topic)
    coverage = lake.coverage(topic, table) if table is not None else {}
    if table is None or not coverage:
        return f"lake: nothing archived of {topic} yet ({root})"
    con = duckdb.connect()
    con.register("archived", table.to_pyarrow_dataset())
    [(rows, distinct, hours)] = con.sql(
        'select count(*), count(distinct ("partition", "offset")), count(distinct (date, hour)) from archived'
    ).fetchall()
    parts = ", ".join(
        f"p{p}: {sum(r.rows for r in rs)} rows, offsets {rs[0].start}-{rs[-1].end}" for p, rs in coverage.items()
    )
    return (
        f"lake {root}/{topic} (Delta, version {table.version()}), read back by DuckDB: {rows} rows "
        f"({distinct} distinct records) in {hours} hour partition(s); {parts}; "
        f"`weir lake stats {topic} --lake {root}` shows more"
    )


def audit_summary(runner: Runner) -> str:
    """`weir audit` of the run, from its checkpoints (docs/delivery.md, "Audit"): every input offset each processor
    processed, how often, and every hole (a silent gap, a counted loss, a batch in flight)."""
    from weir.checkpoint.audit import IN_FLIGHT, audit

    audits = [audit(name, runner.checkpoint(proc)) for name, proc in runner.pipeline.processors.items()]
    processed = sum(s.size for a in audits for p in a.partitions for s in p.segments if not s.kind)
    twice = sum(p.more_than_once for a in audits for p in a.partitions)
    silent = sum(a.silent_gaps for a in audits)
    flight = sum(a.offsets(IN_FLIGHT) for a in audits)
    return (
        f"weir audit: {len(audits)} processors, {processed:,} input offsets processed, {twice} more than once, "
        f"{silent} silent gap(s), {flight} in flight (`WEIR_HOME={runner.settings.home} weir audit shop` per partition)"
    )


def state_summary(settings: Settings, processor: str = "watch", limit: int = 3) -> str:
    """`weir state` of a `@stateful` processor while the pipeline runs, as a user runs it (a process of its own):
    the running pipeline answers from its Spark session (docs/blocks.md, "Inspecting it"), its time said."""
    argv = ["weir", "state", MONITOR_SPEC, processor, "--limit", str(limit)]
    began = time.monotonic()
    try:
        shown = subprocess.run([sys.executable, "-m", "weir.cli", *argv[1:]], capture_output=True, text=True,
                               env=monitor_env(settings, os.environ), cwd=REPO, timeout=180, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"{' '.join(argv)}: no answer within 180 s"
    took = time.monotonic() - began
    if shown.returncode != 0:
        return f"{' '.join(argv)} failed after {took:.1f} s: {(shown.stderr or shown.stdout).strip()[-500:]}"
    by = "a Spark session of its own" if "no live runner" in shown.stderr else "the running pipeline"
    return f"{' '.join(argv)} (answered in {took:.1f} s by {by}):\n{shown.stdout.rstrip()}"


def groups_summary(bootstrap: str, runner: Runner) -> str:
    """Each processor's consumer group (docs/delivery.md, "Consumer group offsets") read as lag tools read it, by
    OffsetFetch: the log end minus the committed offset, over its input partitions."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    settings, pipeline = runner.settings, runner.pipeline
    if not settings.group_offsets:
        return "consumer group offsets: off (group_offsets = false)"
    client = AdminClient({"bootstrap.servers": bootstrap})  # kept: a client collected early never answers
    wanted = {
        settings.offsets_group(pipeline.name, name): [(t, p) for t in proc.inputs if t in pipeline.topics
                                                      for p in range(pipeline.topics[t].partitions)]
        for name, proc in pipeline.processors.items()
    }  # fmt: skip
    ends = Admin(bootstrap).end_offsets([tp for tps in wanted.values() for tp in tps])
    lags = []
    for group, tps in wanted.items():
        if not tps:
            continue
        asked = [ConsumerGroupTopicPartitions(group, [TopicPartition(t, p) for t, p in tps])]
        committed = client.list_consumer_group_offsets(asked)[group].result(timeout=30).topic_partitions
        lag = sum(ends[(tp.topic, tp.partition)][1] - max(tp.offset, 0) for tp in committed)
        lags.append(f"{group} {lag:,}")
    return "lag of each processor's consumer group, as kafka-consumer-groups reads it: " + ", ".join(lags)


def sql_summary(settings: Settings, pipeline: Pipeline, topic: str = "orders") -> tuple[str, Table, str]:
    """`weir sql` over the orders topic: revenue by category from the lake plus the live tail (each record once);
    the query, its answer as a table, and where the rows came from."""
    from weir.query import QueryError, run

    query = (
        f'SELECT category, count(*) AS orders, round(sum(amount), 2) AS revenue FROM "{topic}" '
        "WHERE _error IS NULL GROUP BY category ORDER BY revenue DESC"
    )
    try:
        answer = run(query, settings, pipeline=pipeline, timeout_s=60)
    except QueryError as exc:
        return query, Table("error"), f"weir sql failed: {exc}"
    shown = Table(*answer.table.column_names, title="weir sql: revenue by category (lake + live tail)")
    for row in answer.table.to_pylist():
        shown.add_row(*(f"{v:,}" if isinstance(v, int | float) else str(v) for v in row.values()))
    return query, shown, answer.summary()


REPO = Path(__file__).resolve().parents[2]
MONITOR_SPEC = "examples.shop.pipeline:shop"  # the same processors and topics as build(), whatever its rates


def monitor_argv(spec: str = MONITOR_SPEC, interval: float = 1.0) -> list[str]:
    """`weir monitor` on a free port, with the shop pipeline's topology declared up front."""
    return [sys.executable, "-m", "weir.cli", "monitor", spec, "--port", "0", "--interval", f"{interval:g}"]


def monitor_env(settings: Settings, base: Mapping[str, str]) -> dict[str, str]:
    """The environment of the monitor's process: the demo's home (the monitor's address and state files, the
    runner's state file), broker, progress topic, checkpoints and trigger, over `base`."""
    env = {
        **base, "WEIR_HOME": settings.home, "WEIR_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "WEIR_PROGRESS_TOPIC": settings.progress_topic, "WEIR_CHECKPOINT_ROOT": settings.checkpoint_root,
        "WEIR_LAKE": settings.lake, "WEIR_TRIGGER": units.duration_text(settings.trigger),
    }  # fmt: skip
    if settings.kafka:
        env["WEIR_KAFKA"] = json.dumps(settings.kafka)
    return env


def monitor_address(home: str | Path, pid: int) -> dict | None:
    """The address file `weir monitor` writes once it listens, if the process `pid` wrote it."""
    try:
        body = json.loads((Path(home) / "monitor" / "address.json").read_text())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) and body.get("pid") == pid and body.get("url") else None


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:]) or "(empty log)"


class MonitorProcess:
    """`weir monitor` beside the demo, as its own process: the monitor is independent of what it watches."""

    def __init__(self, settings: Settings, run_dir: Path, argv: list[str] | None = None) -> None:
        self.home = settings.home
        self.log = Path(run_dir) / "monitor.log"
        self.address: dict | None = None
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                argv or monitor_argv(), env=monitor_env(settings, os.environ), cwd=REPO, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
            )  # fmt: skip

    def wait(self, timeout: float = 60.0) -> str | None:
        """The dashboard's URL once the monitor listens; None when it exited or did not listen in `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.address = monitor_address(self.home, self.proc.pid)
            if self.address is not None:
                return str(self.address["url"])
            if self.proc.poll() is not None:
                return None
            time.sleep(0.2)
        return None

    def problem(self) -> str:
        code = self.proc.poll()
        why = f"exited with code {code}" if code is not None else "did not listen in time; stopped"
        return f"weir monitor {why}; the end of {self.log}:\n{log_tail(self.log)}"

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then a kill if it has not ended within `timeout` seconds."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_monitor(settings: Settings, run_dir: Path, argv: list[str] | None = None) -> MonitorProcess | None:
    try:
        return MonitorProcess(settings, run_dir, argv)
    except OSError as exc:
        console.print(f"[yellow]warning: cannot start weir monitor ({escape(str(exc))}); going on without it[/yellow]")
        return None


def show_monitor(monitor: MonitorProcess, timeout: float = 60.0) -> bool:
    """Wait for the monitor and print its dashboard's URL; a yellow warning with its log's tail when it failed."""
    url = monitor.wait(timeout)
    if url is None:
        console.print(f"[yellow]warning: {escape(monitor.problem())}[/yellow]")
        console.print("[yellow]going on without the monitor[/yellow]")
        monitor.stop()
        return False
    token = " (token required: add ?token=<WEIR_MONITOR_TOKEN>)" if monitor.address.get("token_required") else ""
    console.print()
    console.print(f"[bold green]weir monitor dashboard: {escape(url)}/[/bold green]{token}", soft_wrap=True)
    console.print(
        f"  JSON {escape(url)}/api/overview, Prometheus {escape(url)}/metrics; `WEIR_HOME={monitor.home} weir status` "
        f"asks it too; its log: {monitor.log}", soft_wrap=True, highlight=False,
    )  # fmt: skip
    console.print()
    return True


def start_orders(settings: Settings, run_dir: Path, shape: Shape, rate: float) -> tuple[tuple, OrderClient]:
    """`weir ingest http` for the orders topic (its own process, on a free port), and the client that POSTs the
    generator's orders to it."""
    log = run_dir / "ingest-http.log"
    argv = [sys.executable, "-m", "weir.cli", "ingest", "http", MONITOR_SPEC, "--topic", "orders", "--port", "0"]
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=monitor_env(settings, os.environ),
                                cwd=REPO, preexec_fn=die_with_parent)  # fmt: skip
    deadline = time.monotonic() + 60
    while not (found := re.search(r"listening on (http://\S+)", log.read_text(errors="replace"))):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"weir ingest http did not start; see {log}:\n{log_tail(log)}")
        time.sleep(0.1)
    url = found.group(1)
    console.print(f"orders arrive over HTTP: POST {url}/topics/orders (weir ingest http, log {log})")
    return (proc, url), OrderClient(url, shape, rate)


def start_customers(
    settings: Settings, run_dir: Path, dsn: str, shape: Shape
) -> tuple[CustomerTable, subprocess.Popen]:
    """The customers table in PostgreSQL, and `weir ingest postgres` streaming it into the customers topic."""
    table = CustomerTable(dsn, shape)
    log = run_dir / "ingest-postgres.log"
    slot = "weir_shop_" + "".join(ch if ch.isalnum() else "_" for ch in run_dir.name[-8:])  # one per run
    argv = [sys.executable, "-m", "weir.cli", "ingest", "postgres", "--pipeline", MONITOR_SPEC, "--dsn", dsn,
            "--table", TABLE, "--topic", "customers", "--slot", slot]  # fmt: skip
    with open(log, "ab") as out:
        job = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=monitor_env(settings, os.environ),
                               cwd=REPO, preexec_fn=die_with_parent)  # fmt: skip
    console.print(f"customers come from PostgreSQL: table {TABLE}, streamed by weir ingest postgres (log {log})")
    return table, job


def feed_outside(client: OrderClient, table: CustomerTable | None, rate: float, stop: threading.Event) -> None:
    """The stream's records that come from outside, at its pace: customers into the table, orders over HTTP."""
    started = time.monotonic()
    while not stop.is_set():
        due = int((time.monotonic() - started) * rate)
        if table is not None:
            table.apply(due)
        client.send(due)
        stop.wait(0.2)


def shadow_begun(spark, pipeline: Pipeline, settings: Settings) -> tuple | None:
    """The release candidate's shadow beside the live enrich (examples/shop/release.py), once enrich committed a
    batch to begin after; None until then."""
    from examples.shop import release

    found = release.begin_shadow(spark, pipeline, settings)
    if found is None:
        return None
    console.print(f"weir shadow: the release candidate of enrich ({release.CODE}) runs beside the live one, on its "
                  "batches, into orders.enriched.shadow")  # fmt: skip
    return found


def release_story(spark, pipeline: Pipeline, settings: Settings, shadow: tuple | None, build_args: dict,
                  stop: threading.Event) -> None:  # fmt: skip
    """The candidate compared by its shadow, released, caught by the monitor's release_drift, rolled back and
    repaired by `weir backfill --version` (docs/releases.md)."""
    from examples.shop import release
    from weir.runtime.runner import Runner

    console.rule("a release of enrich: compared, released, caught, repaired")
    if shadow is not None:
        for line in release.shadow_lines(spark, pipeline, settings, shadow[0]):
            console.print(line, highlight=False, soft_wrap=True, markup=False)
    candidate = build(**build_args, enrich_code=release.enrich)
    version = candidate.processors["enrich"].version
    console.print(f"releasing enrich {version} anyway: the monitor compares its books with the previous version's ...")
    runner = Runner(candidate, settings, spark=spark).start()
    try:
        alert = release.drift_alert(settings, runner)
    finally:
        logging.getLogger("py4j").setLevel(logging.CRITICAL)
        runner.stop()
    dropped = runner.snapshot()["enrich"].totals.filtered  # its committed batches' (the live enrich filters none)
    if alert is None:
        console.print(
            f"[yellow]no release_drift alert within {release.DRIFT_WAIT_S:.0f} s of the candidate's first "
            f"batch (or no batch within {release.FIRST_BATCH_WAIT_S:.0f} s)[/yellow]"
        )
    else:
        console.print(f"weir monitor: release_drift firing: {alert}", highlight=False, soft_wrap=True, markup=False)
    if stop.is_set():
        return
    console.print(f"rolled back; weir backfill shop enrich --version {version} (its offsets, from the lake) ...")
    report = release.repair(spark, pipeline, settings, version)
    read = sum(n for parts in report.read.values() for n in parts.values())
    written = report.written.get("orders.enriched", 0)
    console.print(
        f"backfill {report.id}: replayed {read} records around version {version}'s offsets "
        f"({sum(e - s for ps in report.ranges.get('orders', {}).values() for s, e in ps)} orders); version {version} "
        f"dropped {dropped} orders (its batches the runner counted), the backfill wrote {written} into orders.enriched",
        highlight=False, soft_wrap=True, markup=False,
    )  # fmt: skip
    processed, missing, twice = release.exactly_once(spark, settings, pipeline)
    console.print(f"orders.enriched and orders.dlq: of the {processed} orders enrich committed, {missing} missing, "
                  f"{twice} more than once", highlight=False, soft_wrap=True, markup=False)  # fmt: skip


def _run_dir() -> Path:
    parent = os.environ.get("WEIR_HOME")
    if parent:
        Path(parent).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="shop-demo-", dir=parent or None))


def main(
    duration: int = typer.Option(60, help="Seconds to run; Ctrl-C stops earlier."),
    rate: float = typer.Option(1000, help="Records generated per second (orders, customer changes, page views)."),
    speedup: float = typer.Option(10, help="Event time runs this many times faster than the wall clock."),
    seed: int = typer.Option(7, help="Seed of the generator."),
    threshold: float | None = typer.Option(None, help="Spend per customer per 5 minutes that raises an alert."),
    http: bool = typer.Option(True, help="Orders over HTTP (weir ingest http) instead of from the generator's query."),
    release: bool = typer.Option(
        True, help="Then the release story: a candidate enrich shadowed, released, caught, repaired (docs/releases.md)."
    ),
) -> None:
    import weir  # after the CLI parsed: --help should not wait for pyspark

    run_dir = _run_dir()
    broker = embedded_broker(run_dir, free_port())
    stop = threading.Event()

    def on_signal(*_: object) -> None:
        if stop.is_set():  # a second Ctrl-C: the user means it
            raise KeyboardInterrupt
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    runner = None
    shadow = None
    spark = None
    monitor = None
    ingest = None
    customers_job = None
    server = None
    registry = None
    postgres = None
    orders_stop = threading.Event()
    try:
        console.print(f"starting the embedded broker on {broker.bootstrap} (run directory {run_dir}) ...")
        broker.start(tied=True)  # a demo killed takes its broker with it
        postgres, why_postgres = start_postgres()
        console.print(why_postgres)
        registry, why_registry = start_registry(postgres.dsn if postgres is not None else None)
        console.print(why_registry)
        settings = Settings(
            home=str(run_dir), bootstrap_servers=broker.bootstrap, checkpoint_root=str(run_dir / "checkpoints"),
            lake=str(run_dir / "lake"), spark_master="local[2]", trigger="2 seconds",
            schema_registry_url=registry.url if registry is not None else None,
        )  # fmt: skip
        # spend_lake's Delta table; the monitor's and weir serve's copies of the pipeline (examples.shop.pipeline:shop)
        # read it from the environment they inherit, so they list the same processors.
        spend_table = str(run_dir / "tables" / "spend_by_customer_5m")
        os.environ["SHOP_SPEND_TABLE"] = spend_table
        console.print("starting weir monitor (a separate process) ...")
        monitor = start_monitor(settings, run_dir)  # it comes up while Spark starts
        from weir.runtime.runner import Runner, realtime_master

        dsn, why = logical_dsn(postgres.dsn if postgres is not None else None) if http else (None, "")
        if why:
            console.print(why)
        outside = ("orders", "customers") if dsn else ("orders",) if http else ()
        build_args = {"rate": rate, "seed": seed, "threshold": threshold, "event_rate": rate / speedup,
                      "from_outside": outside, "avro_alerts": registry is not None,
                      "spend_table": spend_table}  # fmt: skip
        pipeline = build(**build_args)
        console.print("starting Spark (about 10 s) ...")
        conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}
        # big_order runs in real time: a long-running task per partition of its input, beside the 2 cores' work
        master = realtime_master("local[2]", list(pipeline.processors.values()), pipeline)
        with jvm_output_to(run_dir / "spark.log"):
            spark = weir.spark_session("weir-shop-demo", master=master, conf=conf, settings=settings)
        spark.sparkContext.setLogLevel("ERROR")
        # After Spark: PySpark's own SIGINT handler cancels every job and raises KeyboardInterrupt wherever the
        # main thread is, in the middle of a py4j call; an orderly stop of the runner is what Ctrl-C should do.
        signal.signal(signal.SIGINT, on_signal)
        runner = Runner(pipeline, settings, spark=spark)
        if http:
            shape = Shape(seed, int(time.time() * 1000), rate / speedup)
            ingest, client = start_orders(settings, run_dir, shape, rate)
            table, customers_job = start_customers(settings, run_dir, dsn, shape) if dsn else (None, None)
            feed = threading.Thread(target=feed_outside, args=(client, table, rate, orders_stop), daemon=True)
            feed.start()
        if monitor is not None and not show_monitor(monitor):
            monitor = None
        port = free_port()
        with open(run_dir / "serve.log", "wb") as out:
            server = subprocess.Popen(serve_argv(port), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=monitor_env(settings, os.environ), cwd=REPO,
                                      preexec_fn=die_with_parent)  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        console.print(f"weir serve: {base}/views (log {run_dir / 'serve.log'})")
        queries = len(pipeline.processors) + len(pipeline.views) + sum(t.archived for t in pipeline.topics.values())
        console.print(f"starting the shop pipeline: {queries} queries (one archives orders, one keeps a view, one "
                      "upserts spend windows into a Delta table); the first batches take a while ...")  # fmt: skip
        runner.start()
        fast = frozenset(p.name for p in pipeline.processors.values() if p.realtime is not None)
        launching = time.monotonic()
        started: float | None = None  # when every query runs, or LAUNCH_WAIT_S passed: the duration counts from it

        def shown_live() -> Table:
            since = time.monotonic() - (started or launching)
            return live_table(runner.snapshot(), since, duration, realtime=fast, launching=started is None)

        with live_display(console) as live:
            while not stop.is_set() and (started is None or time.monotonic() - started < duration):
                if started is None and (launched(runner.snapshot()) or time.monotonic() - launching > LAUNCH_WAIT_S):
                    started = time.monotonic()
                    if not launched(runner.snapshot()):
                        console.print(f"not every query runs after {LAUNCH_WAIT_S:.0f} s: the demo goes on without")
                if release and shadow is None:
                    shadow = shadow_begun(spark, pipeline, settings)  # once the live enrich query started
                line = view_line(base if server.poll() is None else None)
                live.update(Group(shown_live(), line))
                stop.wait(1.0)
            # Stories that need a first output the run may not have given on 2 loaded cores, each waited for at
            # most FIRST_OUTPUT_S (said, and said again when it did not come): the release story compares a new
            # version's books with the live enrich's (one batch of them); the real-time story shows big_order's alerts.
            waits = [(f"the real-time {name}'s first records out", lambda s, n=name: s[n].totals.out > 0)
                     for name in sorted(fast)]  # fmt: skip
            waits.insert(0, ("watch's first batch (weir state shows its keyed state)",
                             lambda s: s["watch"].batches > 0))  # fmt: skip
            if release:
                waits.insert(0, ("the live enrich's first batch (the release story compares with its books)",
                                 lambda s: s["enrich"].batches > 0))  # fmt: skip
            for what, came in waits:
                if stop.is_set() or came(runner.snapshot()):
                    continue
                console.print(f"waiting for {what}, at most {FIRST_OUTPUT_S:.0f} s")
                deadline = time.monotonic() + FIRST_OUTPUT_S
                while not stop.is_set() and time.monotonic() < deadline and not came(runner.snapshot()):
                    live.update(Group(shown_live(), line))
                    stop.wait(1.0)
                if not came(runner.snapshot()):
                    console.print(f"[yellow]no {what} within {FIRST_OUTPUT_S:.0f} s: the demo goes on without[/yellow]")
        elapsed = time.monotonic() - (started or launching)
        if not stop.is_set():  # asked while it runs: the runner answers from its own session
            console.print(state_summary(settings), highlight=False, markup=False)
        if not release:
            orders_stop.set()
        if ingest is not None:
            console.print(f"orders over HTTP: {client.counts}; the server's books: {stats(ingest[1])['books']}")
        console.print("stopping the queries, up to a minute (an interrupted batch is replayed by the next start) ...")
        logging.getLogger("py4j").setLevel(logging.CRITICAL)  # an interrupted foreachBatch call logs its stack
        if shadow is not None:
            shadow[1].stop()
        runner.stop()
        # The finally below stops a runner only while it runs; the summaries below read the stopped one's books
        stopped, runner = runner, None
        snapshot = stopped.snapshot()
        console.print(live_table(snapshot, elapsed, duration, live=False, realtime=fast))
        for name in sorted(fast):
            console.print(realtime_line(name, snapshot[name]), highlight=False, markup=False)
        topics = sorted({*pipeline.topics, *(f"{t}.{side}" for t in pipeline.topics for side in ("dlq", "late"))})
        console.print(balance_table(snapshot))
        console.print(topic_table(Admin(broker.bootstrap), topics))
        shown = ("revenue.by_category_1m", "customers.lifetime", "customers.signals", "orders.attributed", "alerts",
                 "alerts.big_orders")  # fmt: skip
        for topic in shown:
            console.print(f"latest records of {topic}:")
            for doc in decoded(tail(broker.bootstrap, topic), pipeline.topics[topic], settings.registry_conf()):
                console.print(f"  {doc}")
        if registry is not None:
            console.print(registered(settings, "alerts"), highlight=False)
        console.print(lateness(snapshot, seed, client.next_record if ingest is not None else None))
        console.print(updates(broker.bootstrap, pipeline.topics["spend.by_customer_5m"], settings.registry_conf()))
        console.print(upserted(spend_table), highlight=False)
        console.print(lake_summary(settings.lake, "orders"))
        console.print(audit_summary(stopped), highlight=False)
        console.print(groups_summary(broker.bootstrap, stopped), highlight=False)
        console.print(view_line(base if server.poll() is None else None))
        query, answer, provenance = sql_summary(settings, pipeline)
        console.print(f'weir sql "{query}"')
        console.print(answer)
        console.print(provenance, highlight=False)
        console.print(f"progress records: {run_dir / 'progress' / 'shop.jsonl'}; Spark's log: {run_dir / 'spark.log'}")
        if release and not stop.is_set():
            release_story(spark, pipeline, settings, shadow, build_args, stop)
    except KeyboardInterrupt:
        console.print("interrupted; stopping ...")
    finally:
        if shadow is not None:
            shadow[1].stop()
        if runner is not None:
            runner.stop()
        if spark is not None:
            spark.stop()
        if monitor is not None:
            console.print("stopping weir monitor ...")
            monitor.stop()
        orders_stop.set()
        for proc in (ingest[0] if ingest else None, customers_job, server):
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
        broker.stop()
        if registry is not None:
            registry.__exit__(None, None, None)
        if postgres is not None:
            postgres.stop()


if __name__ == "__main__":
    typer.run(main)
