"""Live latency at a steady rate: every system in one run on one embedded broker, each output timed against its
input's produce time.

    .venv/bin/python bench/latency.py [--rate 5000] [--seconds 60] [--idle 20]
                                      [--only loop,plain,plain+headers,weir,weir-rt,bytewax,quix]
                                      [--weir-variant 'LABEL:KEY=VALUE[;KEY=VALUE...]' ...] [--drain 120]
                                      [--window]

The job (issue 27): parse an event's JSON, keep amount > 10 (about 90% of events), write {id, user, amount, ts} to
a topic keyed by user. Each system gets its own 4-partition input and output topic on the same broker, and runs
in turn:

  loop      the hand-written confluent-kafka loop (bench/latency/loop.py)
  plain     the plain Structured Streaming query over Spark's Kafka source and sink, processingTime 0, no limit,
            local[2] (bench/latency/spark_query.py): the floor weir is measured against
  weir      `weir run bench/latency/weir_latency.py:latency` with default settings (local[2])
  weir-rt   `weir run bench/latency/weir_latency.py:latency_realtime` with default settings: the same job declared
            `realtime=True`, so it runs in Spark's real-time mode (checkpoint every 30 s, weir.runtime.realtime),
            read and written through Spark's Kafka source and sink, decoded in the JVM; weir raises local[2] to
            local[6] for its 4 long-running tasks. Not in the default set; its "batches" are real-time batches,
            one per checkpoint interval
  bytewax   Bytewax 0.21.1, 1 worker; quix: Quix Streams 3.28.1, 1 process; each in a throwaway virtual
            environment made as bench/peers.py does (~/.cache/weir-bench/venvs)

--window runs the window case instead (plain and weir only): a 10 s tumbling window per user (count, sum of
amount) over every event, watermark 2 s; `plain` is Spark's own withWatermark -> groupBy(window, user) over
Spark's Kafka source, `weir` is `weir run bench/latency/weir_latency.py:windows` (weir.blocks.window.tumbling_window).
Each closed window is timed from its end to its output record (the 2 s watermark is in both systems' figures);
during the drain a tick event every 0.25 s (user "~tick") moves event time on, so every paced window closes.
The exactly-once check: every window of the paced events out once, with its exact count.

--weir-variant runs `weir run` again with settings changed, e.g. 'trigger 0:WEIR_TRIGGER=0 seconds' (LAT_NO_MONITOR=1:
without `weir monitor` beside it), after each of weir and weir-rt that --only names (weir-rt's labelled "real time,
LABEL"; LAT_REALTIME_S=N declares its processor `realtime=timedelta(seconds=N)`, N >= 5).

Per system, in order:
  1. the latency consumer starts in its own process (bench/latency/consumer.py), then the system is launched;
  2. a quiet start: one probe event a second until the first output arrives (launch to first output);
  3. the paced producer (this process) sends --rate events/s for --seconds, each stamped with its produce time;
  4. drain: until every kept paced event has come out, at most --drain s; then the system and the consumer stop.
Figures over the paced events: p50, p95, p99 and max of output time minus produce time; launch to first output;
the exactly-once check (every kept event once, nothing else); the load average over the system's run; CPU s of
its process tree, and its CPU share over --idle s with no input after the drain (what polling for input costs);
for the Spark systems, the first batches with input (records / addBatch s); for weir, `weir monitor`'s
freshness of the processor, run beside it and sampled twice a second over the paced traffic (median, and its
ratio to p50); per weir-rt run, the records over 100 ms, the slowest seconds of sending (the p99 of the records
sent in each second) and when the real-time batches' progress came, so that a tail at a batch boundary shows.
Ratios are against the plain query: the machine's speed varies from day to day and with other load, so compare
rows of one run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "bench" / "latency"
sys.path.insert(0, str(ROOT))
_spec = importlib.util.spec_from_file_location("bench_peers", ROOT / "bench" / "peers.py")
peers = importlib.util.module_from_spec(_spec)
sys.modules["bench_peers"] = peers
_spec.loader.exec_module(peers)

from weir.kafka.broker import embedded_broker, free_port  # noqa: E402

console = Console(width=max(160, shutil.get_terminal_size().columns))
SYSTEMS = ("loop", "plain", "plain+headers", "weir", "weir-rt", "bytewax", "quix")
KEEP_ABOVE = 10.0
LAUNCH_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0
PLAIN = "plain Structured Streaming"
SIZE_MS = 10_000  # --window's window (bench/latency/common.py)
# per weir system (--window: "window"), its pipeline, its processor (the monitor's freshness) and its progress log
WEIR_JOB = {"weir": ("bench/latency/weir_latency.py:latency", "keep", "latency.jsonl"),
            "weir-rt": ("bench/latency/weir_latency.py:latency_realtime", "keep", "latency_realtime.jsonl"),
            "window": ("bench/latency/weir_latency.py:windows", "window", "latency_windows.jsonl")}  # fmt: skip


@dataclass
class Result:
    label: str
    expected: int = 0
    latencies: list[int] = field(default_factory=list)
    launch_s: float | None = None
    duplicates: int = 0
    unexpected: int = 0
    missing: int = 0
    load: tuple[float, float] = (0.0, 0.0)
    batches: list[tuple[int, float]] = field(default_factory=list)  # (input rows, addBatch s) with input
    cpu: float | None = None  # CPU s of the system's process tree, launch to stop
    idle_cpu: float | None = None  # its CPU share (1.0: one core) while caught up with no input, after the drain
    note: str = ""
    # `weir monitor`'s freshness of the processor (seconds), sampled twice a second over the paced traffic
    freshness: list[float] = field(default_factory=list)
    # weir-rt: (paced id, ms) of each kept event out, when the paced traffic began (epoch s), and when each
    # real-time batch's progress was published (epoch ms): the tail against the batch boundaries
    sent_at: float | None = None
    by_id: list[tuple[int, int]] = field(default_factory=list)
    ends_ms: list[int] = field(default_factory=list)

    def pct(self, q: float) -> int | None:
        if not self.latencies:
            return None
        s = sorted(self.latencies)
        return s[min(len(s) - 1, int(q * len(s)))]

    def freshness_text(self) -> str:
        """The monitor's median freshness over the paced traffic, and its ratio to the measured p50."""
        if not self.freshness or not self.latencies:
            return "-"
        median = sorted(self.freshness)[len(self.freshness) // 2] * 1000
        return f"{median:,.0f} ms ({median / self.pct(0.5):.2f}x p50)"

    @property
    def exactly_once(self) -> bool:
        return bool(self.expected) and not (self.duplicates or self.unexpected or self.missing)


def event(i: int, rng: random.Random) -> dict:
    return {"id": i, "user": f"u{rng.randrange(997):04d}", "amount": round(rng.uniform(0, 100), 2),
            "ts": round(time.time() * 1000), "note": "x" * 60}  # fmt: skip


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def stop_group(proc: subprocess.Popen, timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM to the program (a graceful stop), then SIGKILL to the process group this script started."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the group this script started, and only it
    proc.wait()


class FreshnessSampler(threading.Thread):
    """`weir monitor` beside a weir system, polling the broker every second; while `on` is set, its freshness of
    the processor (`/api/processors/keep`, seconds) is sampled twice a second (issue 27: it should agree with
    the measured p50 within 20%)."""

    def __init__(self, env: dict[str, str], bootstrap: str, log: Path, system: str) -> None:
        super().__init__(daemon=True)
        self.port = free_port()
        self.out = open(log, "wb")  # noqa: SIM115 - closed in stop()
        spec, self.processor, _ = WEIR_JOB[system]
        cmd = [sys.executable, "-m", "weir.cli", "monitor", spec, "--port",
               str(self.port), "--interval", "1", "--bootstrap", bootstrap]  # fmt: skip
        self.proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=self.out, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # fmt: skip
        self.on, self.done = threading.Event(), threading.Event()
        self.samples: list[float] = []

    def run(self) -> None:
        url = f"http://127.0.0.1:{self.port}/api/processors/{self.processor}"
        while not self.done.wait(0.5):
            if not self.on.is_set():
                continue
            with contextlib.suppress(OSError, ValueError):
                with urllib.request.urlopen(url, timeout=2) as resp:
                    fresh = json.loads(resp.read()).get("freshness_s")
                if fresh is not None:
                    self.samples.append(float(fresh))

    def stop(self) -> None:
        self.done.set()
        stop_group(self.proc, 10)
        self.out.close()


def run_system(args: argparse.Namespace, bootstrap: str, scratch: Path, label: str, cmd: list[str],
               env: dict[str, str], progress: Path | None, system: str) -> Result:  # fmt: skip
    """One system through the quiet start, the paced traffic and the drain (the module docstring)."""
    name = "".join(c if c.isalnum() else "-" for c in label)
    topic_in, topic_out = f"latency.in.{name}", f"latency.out.{name}"
    for t in (topic_in, topic_out):
        peers.create_topic(bootstrap, t)
    base = {"LAT_BOOTSTRAP": bootstrap, "LAT_INPUT": topic_in, "LAT_OUTPUT": topic_out,
            "LAT_MODE": "window" if args.window else "stateless"}  # fmt: skip
    status, result_file = scratch / f"{name}.status", scratch / f"{name}.result"
    cenv = {**os.environ, **base, "LAT_STATUS": str(status), "LAT_RESULT": str(result_file), "PYTHONPATH": str(HERE)}
    res = Result(label)
    load0 = os.getloadavg()[0]
    with open(scratch / f"{name}.consumer.log", "wb") as clog, open(scratch / f"{name}.log", "wb") as log:
        consumer = subprocess.Popen([sys.executable, str(HERE / "consumer.py")], env=cenv, stdout=clog,
                                    stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        launched = time.time()
        proc = subprocess.Popen(cmd, env={**env, **base}, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        sampler = peers.TreeSampler(proc.pid)
        sampler.start()
        # A variant with LAT_NO_MONITOR=1 runs without the monitor beside it: its polls load the broker too
        weir_run = progress is not None and not label.startswith(PLAIN) and not env.get("LAT_NO_MONITOR")
        monitor = FreshnessSampler(env, bootstrap, scratch / f"{name}.monitor.log", system) if weir_run else None
        if monitor is not None:
            monitor.start()
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": 1})
        rng = random.Random(7)
        try:
            res.launch_s = _quiet_start(producer, rng, status, proc, topic_in, launched, args.window)
            if res.launch_s is None:
                res.note = (
                    f"no output {LAUNCH_TIMEOUT_S:.0f} s after launch"
                    if proc.poll() is None
                    else (f"exited {proc.returncode} before its first output: {peers.tail(scratch / f'{name}.log', 2)}")
                )
                return res
            console.print(f"  first output {res.launch_s:.1f} s after launch; {args.rate:,.0f} events/s for "
                          f"{args.seconds:.0f} s ...", highlight=False)  # fmt: skip
            if monitor is not None:
                monitor.on.set()
            res.sent_at = time.time()
            kept = _paced(producer, rng, topic_in, args.rate, args.seconds, args.window)
            if monitor is not None:
                monitor.on.clear()
                res.freshness = monitor.samples
            res.expected = len(kept)
            deadline, tick = time.monotonic() + args.drain, 0
            while time.monotonic() < deadline and proc.poll() is None:
                if read_json(status).get("paced", 0) >= len(kept):
                    break
                if args.window:  # event time moves on, so the watermark closes the last paced windows
                    tick += 1
                    ev = event(-1_000_000 - tick, rng) | {"user": "~tick"}
                    producer.produce(topic_in, json.dumps(ev).encode(), ev["user"].encode())
                    producer.poll(0)
                time.sleep(0.25)
            if args.idle and proc.poll() is None:
                time.sleep(2.0)  # the last batch's commit and progress
                sampler.sample()
                before, t0 = sampler.cpu, time.monotonic()
                time.sleep(args.idle)
                sampler.sample()
                res.idle_cpu = (sampler.cpu - before) / (time.monotonic() - t0)
        finally:
            producer.flush(30)
            res.load = (load0, os.getloadavg()[0])
            sampler.sample()
            sampler.stopped.set()
            res.cpu = sampler.cpu
            stop_group(proc)
            stop_group(consumer, 10)
            if monitor is not None:
                monitor.stop()
    got = read_json(result_file)
    if args.window:  # `kept`: each paced window's count
        seen = {k: v for k, v in got.get("latency", {}).items() if not k.startswith("~")}
        counts = got.get("counts", {})
        wrong = sum(1 for k in kept.keys() & seen.keys() if counts.get(k) != kept[k])
    else:
        seen = {int(k): v for k, v in got.get("latency", {}).items() if int(k) >= 0}
        wrong = 0
    res.latencies = [seen[i] for i in kept if i in seen]
    if system == "weir-rt":
        res.by_id = [(i, seen[i]) for i in kept if i in seen]
        res.ends_ms = _ends(progress) if progress is not None else []
    res.missing = len(kept.keys() - seen.keys())
    res.unexpected = len(seen.keys() - kept.keys()) + got.get("unknown", 0) + wrong
    res.duplicates = got.get("duplicates", 0)
    if progress is not None:
        res.batches = _batches(progress)
    return res


def _quiet_start(producer: Producer, rng: random.Random, status: Path, proc: subprocess.Popen, topic: str,
                 launched: float, window: bool) -> float | None:  # fmt: skip
    """One probe event a second (id < 0, always kept; user "~probe" for --window, whose first output is the
    probes' first closed window) until the first output: seconds from launch, or None."""
    probe = 0
    while time.time() - launched < LAUNCH_TIMEOUT_S and proc.poll() is None:
        first = read_json(status).get("first_ms")
        if first:
            return first / 1000 - launched
        probe += 1
        ev = event(-probe, rng) | {"amount": 50.0, **({"user": "~probe"} if window else {})}
        producer.produce(topic, json.dumps(ev).encode(), ev["user"].encode())
        producer.poll(0)
        for _ in range(4):
            time.sleep(0.25)
            if read_json(status).get("first_ms"):
                break
    return None


def _paced(producer: Producer, rng: random.Random, topic: str, rate: float, seconds: float,
           window: bool) -> Counter:  # fmt: skip
    """`rate` events a second for `seconds`, each stamped with its produce time: the ids the job keeps (each
    once), or for --window each window's "user@start" and its count."""
    kept: Counter = Counter()
    total, sent, start = int(rate * seconds), 0, time.monotonic()
    while sent < total:
        due = min(total, int((time.monotonic() - start) * rate) + 1)
        while sent < due:
            ev = event(sent, rng)
            try:
                producer.produce(topic, json.dumps(ev).encode(), ev["user"].encode())
            except BufferError:
                producer.poll(0.01)
                continue
            if window:
                kept[f"{ev['user']}@{ev['ts'] - ev['ts'] % SIZE_MS}"] += 1
            elif ev["amount"] > KEEP_ABOVE:
                kept[sent] = 1
            sent += 1
        producer.poll(0)
        time.sleep(0.002)
    return kept


def _batches(progress: Path) -> list[tuple[int, float]]:
    try:
        lines = [json.loads(x) for x in progress.read_text().splitlines() if x.strip()]
    except OSError:
        return []
    lines = [x for x in lines if x.get("type", "progress") == "progress" and x.get("input_rows")]
    return [(x["input_rows"], (x.get("duration_ms") or {}).get("addBatch", 0) / 1000) for x in lines]


def _ends(progress: Path) -> list[int]:
    """When each batch's progress was published (epoch ms): for a real-time query, about when its batch ended."""
    try:
        lines = [json.loads(x) for x in progress.read_text().splitlines() if x.strip()]
    except OSError:
        return []
    return [int(x["at_ms"]) for x in lines if x.get("type", "progress") == "progress" and x.get("at_ms")]


def boundaries(results: list[Result], rate: float) -> None:
    """Per weir-rt run: the p99 of the records sent in each second of the paced traffic, its slowest seconds, and
    the real-time batches' ends in the same seconds (since the paced traffic began), so that a tail gathered at a
    batch boundary shows."""
    for r in results:
        if not r.by_id or r.sent_at is None:
            continue
        per: dict[int, list[int]] = {}
        for i, ms in r.by_id:
            per.setdefault(int(i / rate), []).append(ms)
        p99 = {s: sorted(v)[min(len(v) - 1, int(0.99 * len(v)))] for s, v in per.items()}
        worst = sorted(p99, key=lambda s: -p99[s])[:8]
        ends = [round(e / 1000 - r.sent_at, 1) for e in r.ends_ms if r.sent_at - 5 <= e / 1000 <= r.sent_at + 200]
        over = sum(1 for _, ms in r.by_id if ms > 100)
        console.print(f"{r.label}: {over:,} of {len(r.by_id):,} records over 100 ms; slowest seconds of sending "
                      f"(s since the paced start: p99 ms): {', '.join(f'{s}: {p99[s]:,}' for s in sorted(worst))}; "
                      f"batches' progress at s {ends}", highlight=False)  # fmt: skip


def event_log(scratch: Path, label: str) -> dict[str, str]:
    where = scratch / "events" / "".join(c if c.isalnum() else "-" for c in label)
    where.mkdir(parents=True, exist_ok=True)
    return {"spark.eventLog.enabled": "true", "spark.eventLog.compress": "false", "spark.eventLog.dir": where.as_uri()}


def jobs_per_batch(scratch: Path, label: str) -> str:
    """From Spark's event log, medians over the streaming batches that ran a job: Spark jobs, the wall time of the
    batch's SQL executions (its plan run: the jobs and the writer's commit), the time its jobs ran, and the
    tasks' executor run, CPU and deserialize times summed (on 2 cores, run time above twice the job time waits)."""
    where = scratch / "events" / "".join(c if c.isalnum() else "-" for c in label)
    per: dict[str, dict[str, float]] = {}
    job_batch: dict[int, tuple[str, float, str | None]] = {}
    stage_batch: dict[int, str] = {}
    executions: dict[str, float] = {}  # execution id -> its start (ms)
    exec_batch: dict[str, str] = {}
    for path in sorted(p for p in where.rglob("*") if p.is_file()):  # Spark 4 writes a directory per application
        for line in path.read_text(errors="replace").splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            kind = ev.get("Event", "")
            if kind == "SparkListenerJobStart":
                props = ev.get("Properties") or {}
                batch = props.get("streaming.sql.batchId")
                if batch is not None:
                    job_batch[ev["Job ID"]] = (batch, ev["Submission Time"], props.get("spark.sql.execution.id"))
                    for stage in ev.get("Stage IDs", []):
                        stage_batch[stage] = batch
                    if props.get("spark.sql.execution.id") is not None:
                        exec_batch[props["spark.sql.execution.id"]] = batch
            elif kind == "SparkListenerJobEnd" and ev.get("Job ID") in job_batch:
                batch, t0, _ = job_batch.pop(ev["Job ID"])
                b = per.setdefault(batch, {})
                b["jobs"] = b.get("jobs", 0) + 1
                b["job s"] = b.get("job s", 0) + (ev["Completion Time"] - t0) / 1000
            elif kind == "SparkListenerTaskEnd" and ev.get("Stage ID") in stage_batch:
                m = ev.get("Task Metrics") or {}
                b = per.setdefault(stage_batch[ev["Stage ID"]], {})
                b["tasks"] = b.get("tasks", 0) + 1
                b["task run s"] = b.get("task run s", 0) + m.get("Executor Run Time", 0) / 1000
                b["task cpu s"] = b.get("task cpu s", 0) + m.get("Executor CPU Time", 0) / 1e9
                b["task deser s"] = b.get("task deser s", 0) + m.get("Executor Deserialize Time", 0) / 1000
            elif kind.endswith("SparkListenerSQLExecutionStart"):
                executions[str(ev.get("executionId"))] = ev.get("time", 0)
            elif kind.endswith("SparkListenerSQLExecutionEnd"):
                key = str(ev.get("executionId"))
                if key in executions and key in exec_batch:
                    b = per.setdefault(exec_batch[key], {})
                    b["execution s"] = b.get("execution s", 0) + (ev.get("time", 0) - executions[key]) / 1000
    ran = [b for b in per.values() if b.get("jobs")]
    if not ran:
        return "no event log"

    def median(key: str) -> float:
        values = sorted(b.get(key, 0) for b in ran)
        return values[len(values) // 2]

    return (f"{median('jobs'):.0f} Spark jobs per batch; medians per batch: execution {median('execution s'):.2f} s, "
            f"jobs {median('job s'):.2f} s, {median('tasks'):.0f} tasks running {median('task run s'):.2f} s "
            f"(CPU {median('task cpu s'):.2f} s, deserialize {median('task deser s'):.2f} s)")  # fmt: skip


def durations(progress: Path | None) -> str:
    """Medians of each step of Spark's progress (durationMs) over the batches that read records."""
    if progress is None:
        return ""
    try:
        lines = [json.loads(x) for x in progress.read_text().splitlines() if x.strip()]
    except OSError:
        return ""
    steps = [
        x.get("duration_ms") or {} for x in lines if x.get("type", "progress") == "progress" and x.get("input_rows")
    ]
    if not steps:
        return ""
    medians = {k: sorted(d.get(k, 0) for d in steps)[len(steps) // 2] for k in {k for d in steps for k in d}}
    return ", ".join(f"{k} {v}" for k, v in sorted(medians.items(), key=lambda kv: -kv[1]))


def weir_env(scratch: Path, label: str, extra: dict[str, str], system: str) -> tuple[dict[str, str], Path]:
    name = "".join(c if c.isalnum() else "-" for c in label)
    home = scratch / f"weir-{name}"
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WEIR_", "LAT_", "PYSPARK_"))}
    env.update(WEIR_HOME=str(home), WEIR_CHECKPOINT_ROOT=str(home / "checkpoints"), WEIR_LAKE=str(home / "lake"),
               WEIR_SPARK_MASTER="local[2]", PYTHONPATH=str(ROOT),
               # A progress topic per system: the monitor beside a later one must not track an earlier one's
               # processor of the same name (the same pipeline file), whose inputs it would find never read
               WEIR_PROGRESS_TOPIC=f"_weir.progress.{name}", **extra)  # fmt: skip
    return env, home / "progress" / WEIR_JOB[system][2]


def table(results: list[Result], args: argparse.Namespace) -> Table:
    job = ("a 10 s tumbling window per user, watermark 2 s, each closed window against its end" if args.window else
           "stateless (keep amount > 10), each output against its input's produce time")  # fmt: skip
    t = Table(title=f"live latency: {args.rate:,.0f} events/s for {args.seconds:.0f} s, 4 partitions, {job}")
    for h in (
        "system",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "max ms",
        "launch to first output",
        "exactly once",
        "p50 / plain",
        "monitor freshness p50",
        "p99 / plain",
        "launch / plain",
        "CPU s",
        "idle CPU",
        "load 1 min",
    ):
        t.add_column(h, justify="left" if h in ("system", "exactly once") else "right", overflow="fold")  # fmt: skip
    plain = next((r for r in results if r.label == PLAIN), None)

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}x" if a is not None and b else "-"

    for r in results:
        once = (
            r.note or "-"
            if not r.expected
            else "yes"
            if r.exactly_once
            else (
                f"NO: {r.missing:,} not out within the drain, {r.duplicates:,} twice, {r.unexpected:,} unexpected "
                "or with a wrong count"
            )
        )
        t.add_row(
            r.label, *(f"{v:,}" if v is not None else "-" for v in (r.pct(0.5), r.pct(0.95), r.pct(0.99), r.pct(1.0))),
            f"{r.launch_s:.1f} s" if r.launch_s is not None else "-", once,
            ratio(r.pct(0.5), plain and plain.pct(0.5)), r.freshness_text(),
            ratio(r.pct(0.99), plain and plain.pct(0.99)),
            ratio(r.launch_s, plain and plain.launch_s), f"{r.cpu:,.1f}" if r.cpu is not None else "-",
            f"{r.idle_cpu:.0%}" if r.idle_cpu is not None else "-", f"{r.load[0]:.1f} -> {r.load[1]:.1f}",
        )  # fmt: skip
    return t


def batches(results: list[Result]) -> None:
    """The Spark systems' first batches with input, from their progress: records / addBatch s."""
    for r in results:
        if r.batches:
            first = ", ".join(f"{n:,}/{s:.1f}" for n, s in r.batches[:10])
            median = sorted(s for _, s in r.batches)[len(r.batches) // 2]
            console.print(f"{r.label}: {len(r.batches)} batches with input, addBatch median {median:.1f} s; first "
                          f"(records/addBatch s): {first}", highlight=False)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=5000.0, help="events per second")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of paced traffic per system")
    parser.add_argument("--drain", type=float, default=120.0, help="seconds to wait for the last outputs")
    parser.add_argument("--event-log", action="store_true",
                        help="Spark's event log for the Spark systems: Spark jobs per batch with input")  # fmt: skip
    parser.add_argument("--idle", type=float, default=20.0, help="then seconds with no input, measuring CPU (0: none)")
    parser.add_argument("--only", default=None, help=f"systems among {','.join(SYSTEMS)}, in order "
                        "(default loop,plain,weir; plain,weir with --window)")  # fmt: skip
    parser.add_argument("--window", action="store_true", help="the tumbling-window case (the module docstring)")
    parser.add_argument("--weir-variant", action="append", default=[], metavar="LABEL:KEY=VALUE[;KEY=VALUE]",
                        help="`weir run` again with these settings")  # fmt: skip
    args = parser.parse_args()
    only = [s.strip() for s in (args.only or ("plain,weir" if args.window else "loop,plain,weir")).split(",")]
    systems = ("plain", "weir") if args.window else SYSTEMS
    unknown = sorted(set(only) - set(systems))
    if unknown:
        parser.error(f"--only: unknown system(s) {', '.join(unknown)}; choose among {','.join(systems)}")
    variants = []
    for v in args.weir_variant:
        label, _, pairs = v.partition(":")
        try:
            variants.append((label, dict(p.split("=", 1) for p in pairs.split(";") if p)))
        except ValueError:
            parser.error(f"--weir-variant {v!r}: expected LABEL:KEY=VALUE[;KEY=VALUE...]")
    console.print(f"load average {os.getloadavg()} on {os.cpu_count()} cores")
    scratch = Path(tempfile.mkdtemp(prefix="weir-bench-latency-"))
    broker = embedded_broker(scratch / "broker-home", free_port(), kind="kafka")  # what users run (not Tansu)
    results: list[Result] = []
    py = sys.executable
    base = {k: v for k, v in os.environ.items() if not k.startswith(("WEIR_", "LAT_", "PYSPARK_"))}
    try:
        broker.start()
        bs = broker.bootstrap
        console.print(f"broker on {bs}, scratch {scratch}")
        runs: list[tuple[str, list[str], dict[str, str], Path | None, str]] = []
        for system in only:
            if system == "loop":
                runs.append(("hand loop", [py, str(HERE / "loop.py")], {**base, "PYTHONPATH": str(HERE)}, None, system))
            elif system in ("plain", "plain+headers"):
                # plain+headers: the plain query writing weir's headers and timestamp with each record
                label = PLAIN if system == "plain" else f"{PLAIN}, weir's headers"
                name = system.replace("+", "-")
                stats = scratch / f"{name}.progress"
                env = {**base, "PYTHONPATH": os.pathsep.join((str(HERE), str(ROOT))), "LAT_STATS": str(stats),
                       "LAT_CHECKPOINT": str(scratch / f"{name}-checkpoint"),
                       "LAT_HEADERS": "1" if system == "plain+headers" else "0",
                       "LAT_SPARK_CONF": json.dumps(event_log(scratch, label) if args.event_log else {})}  # fmt: skip
                runs.append((label, [py, str(HERE / "spark_query.py")], env, stats, system))
            elif system in ("weir", "weir-rt"):
                job = "window" if args.window else system
                rt = system == "weir-rt"
                for label, extra in [("weir run, defaults", {}), *variants]:
                    label = f"real time, {label}" if rt else label
                    if args.event_log:
                        extra = {"WEIR_SPARK_CONF": json.dumps(event_log(scratch, label)), **extra}
                    env, progress = weir_env(scratch, label, {"WEIR_BOOTSTRAP_SERVERS": bs, **extra}, job)
                    cmd = [py, "-m", "weir.cli", "run", WEIR_JOB[job][0]]
                    runs.append((label, cmd, env, progress, job))
            else:
                python, why = peers.peer_python(system)
                label = {"bytewax": "Bytewax 0.21.1, 1 worker", "quix": "Quix Streams 3.28.1"}[system]
                if python is None:
                    results.append(Result(label, note=why))
                    continue
                program = {"bytewax": ["-m", "bytewax.run", "bytewax_flow:flow", "-w1"],
                           "quix": [str(HERE / "quix_app.py")]}[system]  # fmt: skip
                runs.append((label, [str(python), *program], {**base, "PYTHONPATH": str(HERE)}, None, system))
        where = {label: progress for label, _, _, progress, _ in runs}
        for label, cmd, env, progress, system in runs:
            console.print(f"[bold]{label}[/]", highlight=False)
            r = run_system(args, bs, scratch, label, cmd, env, progress, system)
            console.print(f"  p50 {r.pct(0.5)} ms, p99 {r.pct(0.99)} ms, exactly once: {r.exactly_once}; {r.note}",
                          highlight=False)  # fmt: skip
            results.append(r)
    finally:
        broker.stop()
        shutil.rmtree(scratch / "broker-home", ignore_errors=True)
    console.print(table(results, args))
    batches(results)
    boundaries(results, args.rate)
    if args.event_log:
        for r in results:
            if r.batches:
                console.print(f"{r.label}: {jobs_per_batch(scratch, r.label)}", highlight=False)
                console.print(f"  progress medians (ms): {durations(where.get(r.label))}", highlight=False)
    console.print(f"load average {os.getloadavg()} at end; logs kept in {scratch}")
    return 0 if all(r.exactly_once for r in results if r.expected) else 1


if __name__ == "__main__":
    sys.exit(main())
