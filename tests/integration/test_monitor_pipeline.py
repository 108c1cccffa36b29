"""The monitor watching a real pipeline on the embedded broker: the monitor's threads and its HTTP server in
this process; processors b and c in runners in this process, on the shared Spark session; processor a in
`weir run` processes of its own (the pipeline's spec file, written to tmp), so that it can be held back,
killed with SIGKILL and restarted as in a deployment. The runners and the monitor share one home, as on one
host: the monitor reads the runners' state files (`<home>/run/*.json`) and their checkpoints.

One topology for the module, src -> a -> t1 -> b -> t2 -> c -> t3: stateless pass-throughs, so every record
keeps its timestamp, the event time that freshness follows. src has a one-hour retention and its records
are produced with chosen timestamps (`Env.produced`, by offset), so lag, retention left and freshness are
computed by hand, against the monitor's own evaluation times (each series point is [t, value] of one
evaluation). The tests run in order on the same topics and checkpoints, each from where the one before left
them (CI time: Spark streaming starts, and JVM starts for a's processes, are the cost): a's held-back process
starts in the first test and runs through the second; the third stops it and runs a on its own trigger.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import pytest
from _pipe import Rec, produce, wait_for
from _serving import serving
from confluent_kafka import Producer

from weir.checkpoint.files import processor_checkpoint
from weir.checkpoint.log import CheckpointError, read_offsets
from weir.config import Settings, load
from weir.monitor.config import MonitorConfig
from weir.monitor.server import create_app
from weir.monitor.service import MonitorService, declare_pipeline
from weir.pipeline import Pipeline
from weir.pipeline.load import load as load_pipeline
from weir.runtime.runner import Runner
from weir.testing.environment import TEST_SPARK_CONF

pytestmark = pytest.mark.integration
RETENTION_MS = 3_600_000
INTERVAL = 0.5  # seconds between the monitor's broker polls (and reads of the runners' files); it evaluates
# every min(1 s, interval)
HELD = {"trigger": "1 hour", "max_offsets_per_trigger": 10}  # one batch of 10 records at start, then none

# The pipeline's spec file (`TAG = "..."` is written above it): what `weir run` loads, and this process too.
SPEC = """
from weir.pipeline import Pipeline

p = Pipeline(f"mon-{TAG}")
src = p.topic(f"{TAG}.src", schema="n BIGINT", retention="1h")
t1, t2, t3 = (p.topic(f"{TAG}.t{i}", schema="n BIGINT") for i in (1, 2, 3))


@p.processor(inputs=[src], outputs=[t1])
def a(df):
    return df


@p.processor(inputs=[t1], outputs=[t2])
def b(df):
    return df


@p.processor(inputs=[t2], outputs=[t3])
def c(df):
    return df
"""
# The settings a `weir run` process gets through its environment (WEIR_<NAME>; maps as JSON).
PROCESS_SETTINGS = {
    "home", "bootstrap_servers", "checkpoint_root", "lake", "progress_topic", "trigger", "processors",
    "max_restarts", "restart_backoff", "spark_master", "spark_conf",
}  # fmt: skip


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class WeirRun:
    """A `weir run` process: a session (process group) of its own with the runner, its JVM and Spark's
    Python workers; its output in a log file."""

    popen: subprocess.Popen
    log: Path

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def wait_for(self, predicate, timeout: float, what: str, about=None):
        """`wait_for`, failing at once with the process's output if it exits meanwhile; on a timeout, with its
        output and what `about()` says (the monitor's view, for one)."""

        def check():
            if self.popen.poll() is not None:
                raise AssertionError(f"weir run exited ({self.popen.returncode}) waiting for {what}:\n{self.tail()}")
            return predicate()

        def state() -> str:
            return f"{about() if about else ''}\nweir run's output:\n{self.tail()}"

        return wait_for(check, timeout, what, about=state)

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, as Ctrl-C or a service manager: the runner stops its queries and writes its state file."""
        self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"weir run did not stop within {timeout}s of SIGTERM:\n{self.tail()}") from None

    def kill(self) -> None:
        """SIGKILL to its whole process group, then the runner's process reaped at once (to `kill(pid, 0)`, which
        the monitor asks, a zombie is alive). Only while it is not reaped yet: its pid is still this one's."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(30)


@dataclass
class Env:
    tag: str
    pipeline: Pipeline
    bootstrap: str
    root: str
    spec: str
    service: MonitorService | None = None
    url: str = ""
    produced: list[int] = field(default_factory=list)  # timestamp (ms) of each record of src, by offset
    runs: list[WeirRun] = field(default_factory=list)  # every `weir run` started, killed at the end
    held: WeirRun | None = None  # a, held back, from the first test to the third

    def topic(self, name: str) -> str:
        return f"{self.tag}.{name}"

    def key(self, processor: str) -> str:
        return f"{self.pipeline.name}/{processor}"

    def settings(self, **processors: dict) -> Settings:
        """The runners' settings, with per-processor overrides (trigger, max_offsets_per_trigger); the
        monitor is told the pipeline as run with them, as `weir monitor spec.py` would be. Runners of some
        processors each write a state file of their own, `<home>/run/<pipeline>.<digest>.json`."""
        s = load(
            home=f"{self.root}/home", bootstrap_servers=self.bootstrap, checkpoint_root=f"{self.root}/checkpoints",
            lake=f"{self.root}/lake", progress_topic=f"{self.tag}.progress", trigger="1 second",
            # A failed query restarts, as in a deployment: at a load of 10, Spark's 10 s (fixed) wait for a Python
            # worker to connect back ran out once, and with max_restarts=0 that gave b up for good.
            processors=processors, max_restarts=3, restart_backoff=0.2, spark_master="local[2]",
            spark_conf={**TEST_SPARK_CONF, "spark.local.dir": f"{self.root}/spark-local"},  # a killed JVM's files
        )  # fmt: skip
        if self.service is not None:
            declare_pipeline(self.service.monitor, self.pipeline, s)
        return s

    def weir_run(self, **processors: dict) -> WeirRun:
        """`weir run <spec> --processor a` in a process of its own, with `settings(**processors)`."""
        s = self.settings(**processors)
        values = s.model_dump(include=PROCESS_SETTINGS, exclude_none=True)
        env = {**os.environ, **{f"WEIR_{k.upper()}": v if isinstance(v, str) else json.dumps(v) for k, v in
                                values.items()}}  # fmt: skip
        log = Path(self.root) / f"weir-run-{len(self.runs)}.log"
        with log.open("ab") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "weir.cli", "run", self.spec, "--processor", "a"], env=env,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.runs.append(run := WeirRun(popen, log))
        return run

    def committed(self, processor: str) -> dict[str, int]:
        """Next offset per input partition as the processor's checkpoint commits it ("topic/partition")."""
        cp = processor_checkpoint(f"{self.root}/checkpoints", self.pipeline.processors[processor].checkpoint)
        try:
            committed = read_offsets(cp).committed
        except CheckpointError:  # no batch planned yet
            return {}
        return {f"{t}/{p}": off for t, parts in committed.items() for p, off in parts.items()}

    def records(self, kind: str, processor: str, since_ms: int) -> list[dict]:
        """The processor's records of a kind since then, from the runners' progress log (complete lines:
        runners in two processes append to it)."""
        path = Path(self.root) / "home" / "progress" / f"{self.pipeline.name}.jsonl"
        text = path.read_text() if path.exists() else ""
        records = map(json.loads, text[: text.rfind("\n") + 1].splitlines())
        return [r for r in records if r["type"] == kind and r["processor"] == processor and r["at_ms"] >= since_ms]

    def timeline(self, *processors: str) -> dict[str, list]:
        """What each processor did last, for a wait's failure to explain itself (a batch that never came, or
        came slowly: at a load of 16, b's first batch spent 101 s in addBatch for 10 records): its last records
        of any kind, oldest first, each (seconds ago, kind, batch, input rows, Spark's durationMs)."""
        now = now_ms()
        return {
            p: [(round((now - r["at_ms"]) / 1000, 1), r["type"], r.get("batch_id"), r.get("input_rows"),
                 r.get("duration_ms") or r.get("error", "")) for r in self.records_of(p)[-6:]]
            for p in processors
        }  # fmt: skip

    def records_of(self, processor: str) -> list[dict]:
        every = [r for kind in ("progress", "idle", "failure") for r in self.records(kind, processor, 0)]
        return sorted(every, key=lambda r: r["at_ms"])

    def batches(self, processor: str, since_ms: int) -> list[dict]:
        """The processor's batches that read records since then."""
        return [r for r in self.records("progress", processor, since_ms) if r["input_rows"] > 0]

    def produce(self, stamps: list[int]) -> None:
        first = len(self.produced)
        produce(self.bootstrap, self.topic("src"), [
            Rec(0, None, json.dumps({"n": first + i}).encode(), timestamp_ms=ts) for i, ts in enumerate(stamps)
        ])  # fmt: skip
        self.produced += stamps

    def get(self, path: str, raw: bool = False):
        with urllib.request.urlopen(self.url + path, timeout=5) as r:
            body = r.read()
        return body.decode() if raw else json.loads(body)

    def proc(self, name: str) -> dict:
        return self.get(f"/api/processors/{self.key(name)}")

    def active(self, rule: str) -> dict | None:
        """The firing alert of a rule (one target each here), as /api/alerts lists it."""
        return next((e for e in self.get("/api/alerts")["active"] if e["rule"] == rule), None)

    def history(self, rule: str, status: str, after_ms: int = 0) -> list[dict]:
        return [e for e in self.get("/api/alerts")["history"] if e["rule"] == rule and e["status"] == status
                and e["at_ms"] >= after_ms]  # fmt: skip


@pytest.fixture(scope="module")
def env(bootstrap, tmp_path_factory):
    tag = f"m{uuid.uuid4().hex[:8]}"
    root = tmp_path_factory.mktemp("monitor-pipeline")
    spec = root / "mon_pipeline.py"
    spec.write_text(f"TAG = {tag!r}\n" + SPEC)
    e = Env(tag, load_pipeline(str(spec)), bootstrap, str(root), str(spec))
    settings = e.settings()
    Runner(e.pipeline, settings).create_topics()
    # The runners' home: the monitor reads their state files (a runner whose process is gone is dead at
    # once) and their checkpoints (a batch committed whose progress record a kill lost still counts).
    config = MonitorConfig.model_validate({
        "interval": INTERVAL, "behind_window": "10m", "read_checkpoints": True,
        "alerts": [{"expr": "dead(a)"}, {"expr": "unhealthy(a)"}, {"expr": "lag(a) > 20"},
                   {"expr": "retention_left(a) < 40m"}],
    })  # fmt: skip
    e.service = MonitorService(settings, config, pipelines=[e.pipeline]).start()
    try:
        with serving(create_app(e.service.monitor)) as url:
            e.url = url
            yield e
    finally:
        for run in e.runs:
            run.kill()
        e.service.stop()


def last(f: dict, series: str) -> tuple[int, float | None]:
    """The newest [t, value] of a processor's sampled series: one evaluation, at t."""
    t, v = f["series"][series][-1]
    return t, v


def test_lag_and_retention_of_a_held_back_processor(env):
    """a runs in a `weir run` of its own with a one-hour trigger and at most 10 records per batch: it reads
    src 0..9 at start and then waits, with the rest of src pending (it keeps running, held, through the next
    test). Lag = records produced - committed offset (from its checkpoint); lag seconds = age of the record
    at the committed offset; retention left = retention.ms - that age."""
    base = now_ms() - 30 * 60_000  # half an hour ago: half the retention left
    env.produce([base + i * 1000 for i in range(25)])
    env.held = a = env.weir_run(a=HELD)
    a.wait_for(lambda: env.committed("a"), 180, "a's first batch")
    committed = env.committed("a")
    assert committed == {env.topic("src") + "/0": 10}

    def figures(pending: int):
        f = env.proc("a")
        t, lag_s = last(f, "lag_seconds")
        return f if f["lag"] == pending and lag_s == pytest.approx((t - env.produced[10]) / 1000) else None

    f = a.wait_for(lambda: figures(25 - 10), 30, "a's figures with 15 records pending")
    t, lag_s = last(f, "lag_seconds")
    assert f["lag_by_partition"] == {env.topic("src") + "/0": 15}
    assert f["health"] == "healthy"  # a one-hour trigger: waiting is what it is told to do
    assert f["runner_alive"] is True  # its state file names its process, which is running
    t2, left = last(f, "retention_left_s")
    assert t2 == t and left == pytest.approx((RETENTION_MS - (t - env.produced[10])) / 1000)
    topics = env.get("/api/topics")
    assert topics[env.topic("src")]["retention_ms"] == RETENTION_MS
    assert topics[env.topic("src")]["records"] == 25
    # 15 pending: the rule does not hold (it did while all 25 were, before a's batch, if polled then).
    wait_for(lambda: env.active("lag(a) > 20") is None, 10, "the lag alert to be quiet")

    # More records, newer: the lag grows by as many; the oldest pending record is the same, older now.
    env.produce([base + 60_000 + i * 1000 for i in range(10)])
    f = a.wait_for(lambda: figures(35 - 10), 30, "a's figures with 25 records pending")
    t_later, lag_later = last(f, "lag_seconds")
    _, left_later = last(f, "retention_left_s")
    assert t_later > t
    assert lag_later - lag_s == pytest.approx((t_later - t) / 1000)
    assert left - left_later == pytest.approx((t_later - t) / 1000)
    fired = wait_for(lambda: env.active("lag(a) > 20"), 10, "the lag alert")
    assert fired["value"] == 25 and fired["target"] == env.key("a")
    risk = env.active("retention_left(a) < 40m")
    assert risk is not None and risk["target"] == env.key("a") and risk["value"] < 40 * 60
    assert env.committed("a") == committed  # held: no second batch


def test_freshness_propagates_through_three_stages(spark, env):
    """a stays held (its process still runs, src 10.. pending, from the test above); b and c run and process
    all a wrote. Each output is then complete up to the timestamp of a's oldest pending record, down to t3:
    C(t1) = C(a) = ts(src@10), since a has that record pending; C(t2) = C(b) = C(t1), b having processed all
    of t1; C(t3) = C(c) = C(t2). Freshness = now - C, for every output and processor, though b and c lag by
    nothing."""
    assert len(env.produced) == 35 and env.committed("a"), "runs after test_lag_and_retention_of_a_held_back_processor"
    assert env.held is not None and env.held.popen.poll() is None, "a's held process runs on"
    r = Runner(env.pipeline, env.settings(a=HELD), spark=spark, processors=["b", "c"]).start()
    try:
        wait_for(lambda: env.committed("c").get(env.topic("t2") + "/0") == 10, 120, "c to process b's 10 records",
                 about=lambda: env.timeline("b", "c"))  # fmt: skip
        assert env.committed("b") == {env.topic("t1") + "/0": 10}
        complete = env.produced[10]

        def fresh():
            procs = {n: env.proc(n) for n in "abc"}
            if procs["b"]["lag"] != 0 or procs["c"]["lag"] != 0:
                return None
            # Lag and freshness come from the broker and the checkpoints; health from the records, which the
            # monitor reads on its own thread: c is "starting" until its batch's record is read (seen loaded)
            if procs["b"]["last_batch"] is None or procs["c"]["last_batch"] is None:
                return None
            outputs = env.get(f"/api/series?since={now_ms() - 3000}")["outputs"]
            points = [last(f, "freshness_s") for f in procs.values()] + [outputs[env.topic(t)][-1] for t in
                                                                          ("t1", "t2", "t3")]  # fmt: skip
            return points if all(v == pytest.approx((t - complete) / 1000) for t, v in points) else None

        points = wait_for(fresh, 30, "freshness of a's oldest pending record on every output")
        assert all(29 * 60 < v < 40 * 60 for _, v in points)  # about half an hour, as produced
        b, c = env.proc("b"), env.proc("c")
        assert (b["lag_seconds"], c["lag_seconds"], b["health"], c["health"]) == (0, 0, "healthy", "healthy")
        overview = env.get("/api/overview")
        assert overview["outputs"][env.topic("t3")]["writers"] == [env.key("c")]
        edges = {(e["from"], e["to"]) for e in env.get("/api/topology")["edges"]}
        chain = [env.topic("src"), env.key("a"), env.topic("t1"), env.key("b"), env.topic("t2"), env.key("c"),
                 env.topic("t3")]  # fmt: skip
        assert set(pairwise(chain)) <= edges
        assert env.committed("a") == {env.topic("src") + "/0": 10}
        # With nothing more to read, b's query is idle: Spark says so every 10 s (not by a progress event), and
        # the runner records it, so that the monitor hears an idle processor as alive (seen "dead" at load 11).
        idle_from = now_ms()
        wait_for(lambda: env.records("idle", "b", idle_from), 60, "an idle record of b")
        assert env.proc("b")["health"] == "healthy"
    finally:
        r.stop()


class Trickle:
    """One record into src every `every` seconds, stamped with the time it is produced, each acknowledged
    before the next (so `env.produced` stays in offset order): input that keeps arriving."""

    def __init__(self, env: Env, every: float = 0.25) -> None:
        self.env, self.every = env, every
        self.stop_event = threading.Event()
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, name="trickle", daemon=True)

    def __enter__(self) -> Trickle:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join(15)

    def _run(self) -> None:
        producer = Producer({"bootstrap.servers": self.env.bootstrap, "linger.ms": 0})
        try:
            while not self.stop_event.wait(self.every):
                ts = now_ms()
                n = len(self.env.produced)
                producer.produce(self.env.topic("src"), json.dumps({"n": n}).encode(), partition=0, timestamp=ts)
                if producer.flush(10):
                    self.errors.append(f"record {n} not acknowledged")
                    return
                self.env.produced.append(ts)
        finally:
            producer.close()


def test_a_killed_processor_is_alerted_while_the_monitor_serves_and_resolves_on_restart(spark, env, record_property):
    """a, in a `weir run` of its own on its one-second trigger, is killed (SIGKILL to its process group) while
    src keeps receiving records: the monitor, reading the runner's state file, reports it dead ("its
    runner's process is gone"), and `dead(a)` and `unhealthy(a)` fire within two of its trigger intervals of
    the kill, while the HTTP API keeps answering. Its outputs' freshness stops at its oldest pending record,
    three stages down. A new `weir run` on its checkpoint resolves both alerts, and once everything is
    processed, every lag is 0 and every output fresh."""
    assert env.committed("b"), "runs after test_freshness_propagates_through_three_stages"
    assert env.held is not None and env.held.stop() == 0, env.held and env.held.tail()  # as Ctrl-C would
    src = env.topic("src") + "/0"
    began_ms = now_ms()
    bc = None
    try:
        with Trickle(env) as trickle:
            a = env.weir_run()  # every processor on its one-second trigger
            bc = Runner(env.pipeline, env.settings(), spark=spark, processors=["b", "c"]).start()
            # a catches up on src (the 35 records above, then the trickle): its lag alert resolves.
            a.wait_for(lambda: env.history("lag(a) > 20", "resolved", began_ms), 180, "a to catch up")
            a.wait_for(lambda: len(env.batches("a", began_ms)) >= 3, 60, "a's third batch")
            # On a loaded machine a's batches may run over its one-second trigger for a while: it is then
            # rightly "behind", and healthy again once they fit (seen failing at 10 s under a load of 8).
            a.wait_for(lambda: env.proc("a")["health"] == "healthy" and env.active("unhealthy(a)") is None, 60,
                       "a healthy", lambda: (env.proc("a")["health_reason"], env.active("unhealthy(a)")))  # fmt: skip
            assert env.proc("a")["runner_alive"] is True and env.active("dead(a)") is None

            kill_ms = now_ms()
            a.kill()  # mid-stream: no failure, no state change, its state file left saying it runs
            reaped_ms = now_ms()
            slowest = 0.0
            while (fired := env.active("dead(a)")) is None:
                assert now_ms() - kill_ms < 30_000, "dead(a) did not fire"
                began = time.monotonic()
                health = env.get("/api/overview")["processors"][env.key("a")]["health"]
                assert health in ("healthy", "stalled", "dead")  # dead a moment before its alert is evaluated
                slowest = max(slowest, time.monotonic() - began)
                time.sleep(0.05)
            f = env.proc("a")
            assert (f["health"], f["health_reason"], f["runner_alive"]) == ("dead", "its runner's process is gone",
                                                                             False)  # fmt: skip
            # The bound: the monitor reads the runners' state files after each broker poll (every INTERVAL) and
            # evaluates every INTERVAL, so it fires about a poll and two intervals (~1 s) after the kill: within
            # two of a's trigger intervals, what the issue asks. (Without the state file, a's silence would be
            # death only after dead_after, 60 s; the stall, 2 x max(trigger, its slowest recent batch) after its
            # last batch.) `unhealthy(a)` fires at the same evaluation.
            assert f["trigger_ms"] == 1000
            dead_lag = f["lag"]
            assert kill_ms <= fired["at_ms"] <= kill_ms + 2 * f["trigger_ms"]
            unhealthy = env.active("unhealthy(a)")
            assert unhealthy is not None and unhealthy["at_ms"] == fired["at_ms"]

            # While a is dead: the API answers at once, /metrics says it too, the lag grows.
            for path in ("/api/overview", "/api/topology", f"/api/processors/{env.key('a')}", "/metrics"):
                began = time.monotonic()
                env.get(path, raw=True)
                slowest = max(slowest, time.monotonic() - began)
            assert slowest < 2  # each answer at once, as all along
            metrics = env.get("/metrics", raw=True)
            assert f'weir_alert_firing{{rule="dead(a)",target="{env.key("a")}"}} 1.0' in metrics
            assert f'weir_processor_health{{pipeline="{env.pipeline.name}",processor="a",state="dead"}} 1.0' in (
                metrics
            )
            nodes = {n["id"]: n for n in env.get("/api/topology")["nodes"]}
            assert nodes[env.key("a")]["health"] == nodes[env.topic("t1")]["health"] == "dead"
            # b and c finish what a wrote; every output is then complete up to a's oldest pending record (the
            # one at its checkpoint's committed offset: a batch the kill interrupted was not committed).
            k = env.committed("a")[src]

            def held():
                procs = {n: env.proc(n) for n in "abc"}
                if procs["b"]["lag"] != 0 or procs["c"]["lag"] != 0:
                    return None
                outputs = env.get(f"/api/series?since={now_ms() - 3000}")["outputs"]
                points = [outputs[env.topic(t)][-1] for t in ("t1", "t2", "t3")]
                return points if all(v == pytest.approx((t - env.produced[k]) / 1000) for t, v in points) else None

            # 60 s was too short once under a load of 14 (the monitor, b and c share this process's GIL)
            wait_for(held, 180, "b and c to process what a wrote",
                     about=lambda: ({n: env.proc(n)["lag"] for n in "bc"}, env.produced[k], env.get(
                         f"/api/series?since={now_ms() - 3000}")["outputs"], env.timeline("b", "c")))  # fmt: skip
            f = env.proc("a")
            assert f["lag"] > dead_lag and f["lag_by_partition"] == {src: f["lag"]} and f["health"] == "dead"
            assert env.committed("a")[src] == k

            restart_ms = now_ms()
            a = env.weir_run()
            # dead(a) resolves once the new runner's state file names its live process; then its batches come
            # again. Until its first one it is starting (its Spark session, its tracing, its query's start, issue
            # 58), then running while that first batch (a cold one) takes over a heartbeat: never dead nor
            # stalled, though its input has been pending since the kill.
            back = a.wait_for(lambda: env.history("dead(a)", "resolved", restart_ms), 180, "dead(a) to resolve")
            starting: list[tuple[str, str]] = []  # a's health and reason from then to its first batch

            def first_batch():
                f = env.proc("a")
                starting.append((f["health"], f["health_reason"]))
                return env.batches("a", restart_ms)

            a.wait_for(first_batch, 180, "a's first batch after the restart", lambda: env.proc("a"))
            assert back[0]["fired_at_ms"] == fired["at_ms"] and env.active("dead(a)") is None
            # Each look but the last was before its first batch (its health is read before its batches are).
            healths = [h for h, _ in starting[:-1]]
            assert healths and healths[0] == "starting" and set(healths) <= {"starting", "running"}, starting
            assert env.proc("a")["runner_alive"] is True
        assert not trickle.errors

        # The trickle stopped: once all is processed, every lag is 0 and every output complete up to now.
        def caught_up():
            procs = {n: env.proc(n) for n in "abc"}
            return procs if all(p["lag"] == 0 and p["freshness_s"] == 0 for p in procs.values()) else None

        procs = a.wait_for(caught_up, 180, "everything processed", lambda: {
            n: {k: v for k, v in env.proc(n).items() if k in ("health", "health_reason", "lag", "freshness_s")}
            for n in "abc"} | {"timeline": env.timeline("a", "b", "c")})  # fmt: skip
        assert env.committed("a") == {src: len(env.produced)}

        # unhealthy(a) resolves once a is healthy: while the trickle runs on a quiet machine, else once it has
        # caught up (under a load of 15 its batches took twice its trigger: rightly "behind" while input came).
        # The alert that fired at the kill is resolved after the restart, not before (no flap while a was dead).
        # It may fire again later, rightly: a's first batches after a restart are cold ones (new Python workers,
        # new Kafka clients) and can run over its trigger while the trickle still comes, so a is "behind" for a
        # moment (seen once on a quiet machine, 5.5 s after the kill). History lists the newest first.
        def first_resolution():
            ends = [e for e in env.history("unhealthy(a)", "resolved") if e["fired_at_ms"] == unhealthy["at_ms"]]
            return ends or None

        well = a.wait_for(first_resolution, 30, "a healthy again",
                          lambda: (env.proc("a"), env.get("/api/alerts")["history"]))  # fmt: skip
        assert len(well) == 1 and well[0]["at_ms"] >= restart_ms, env.get("/api/alerts")["history"]
        wait_for(lambda: env.active("unhealthy(a)") is None, 30, "unhealthy(a) to resolve once a caught up",
                 about=lambda: (env.proc("a"), env.get("/api/alerts")["history"]))  # fmt: skip
        restart_to_resolve = ((back[0]["at_ms"] - restart_ms) / 1000, (well[0]["at_ms"] - restart_ms) / 1000)
        assert (procs["a"]["lag_seconds"], procs["a"]["retention_left_s"], procs["a"]["health"]) == (0, None, "healthy")
        assert [n for n, o in env.get("/api/overview")["outputs"].items() if o["freshness_s"] != 0] == []
        # Nothing is pending: no record is at risk of retention any more.
        wait_for(lambda: env.active("retention_left(a) < 40m") is None, 5, "the retention alert to resolve")
    finally:
        if bc is not None:
            bc.stop()
        for run in env.runs:
            run.kill()
    timings = {"kill_to_alert_s": (fired["at_ms"] - kill_ms) / 1000,
               "reaped_to_alert_s": (fired["at_ms"] - reaped_ms) / 1000,
               "restart_to_dead_resolved_s": restart_to_resolve[0], "restart_to_healthy_s": restart_to_resolve[1],
               "slowest_api_s": round(slowest, 3)}  # fmt: skip
    for k, v in timings.items():
        record_property(k, v)
    print(timings)
