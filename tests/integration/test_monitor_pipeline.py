"""The monitor watching a real pipeline: the runners in this process on the shared Spark session, the monitor's
threads and its HTTP server too, all on the embedded broker.

One topology for the module, src -> a -> t1 -> b -> t2 -> c -> t3: stateless pass-throughs, so every record
keeps its timestamp, the event time that freshness follows. src has a one-hour retention and its records
are produced with chosen timestamps (`Env.produced`, by offset), so lag, retention left and freshness are
computed by hand, against the monitor's own evaluation times (each series point is [t, value] of one
evaluation). The tests run in order on the same topics and checkpoints, each from where the one before left
them (CI time: Spark streaming starts are the cost); each starts and stops its own runners.
"""

from __future__ import annotations

import json
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

from weir.config import load
from weir.monitor.config import MonitorConfig
from weir.monitor.server import create_app
from weir.monitor.service import MonitorService, declare_pipeline
from weir.pipe.checkpoint import CheckpointError, read_offsets
from weir.pipeline import Pipeline
from weir.pipeline.run import Runner

pytestmark = pytest.mark.integration
RETENTION_MS = 3_600_000
INTERVAL = 0.5  # seconds between the monitor's broker polls; it evaluates every min(1 s, interval)
HELD = {"trigger": "1 hour", "max_offsets_per_trigger": 10}  # one batch of 10 records at start, then none


def build(tag: str) -> Pipeline:
    p = Pipeline(f"mon-{tag}")
    src = p.topic(f"{tag}.src", schema="n BIGINT", retention="1h")
    t1, t2, t3 = (p.topic(f"{tag}.t{i}", schema="n BIGINT") for i in (1, 2, 3))

    @p.processor(inputs=[src], outputs=[t1])
    def a(df):
        return df

    @p.processor(inputs=[t1], outputs=[t2])
    def b(df):
        return df

    @p.processor(inputs=[t2], outputs=[t3])
    def c(df):
        return df

    return p


@dataclass
class Env:
    tag: str
    pipeline: Pipeline
    bootstrap: str
    root: str
    service: MonitorService | None = None
    url: str = ""
    produced: list[int] = field(default_factory=list)  # timestamp (ms) of each record of src, by offset

    def topic(self, name: str) -> str:
        return f"{self.tag}.{name}"

    def key(self, processor: str) -> str:
        return f"{self.pipeline.name}/{processor}"

    def settings(self, home: str = "home", **processors: dict):
        """The runners' settings, with per-processor overrides (trigger, max_offsets_per_trigger); the
        monitor is told the pipeline as run with them, as `weir monitor spec.py` would be. Two runners of
        the pipeline at once need homes of their own (each writes <home>/run/<pipeline>.json)."""
        s = load(
            home=f"{self.root}/{home}", bootstrap_servers=self.bootstrap, checkpoint_root=f"{self.root}/checkpoints",
            lake=f"{self.root}/lake", progress_topic=f"{self.tag}.progress", trigger="1 second",
            processors=processors, max_restarts=0, restart_backoff=0.2,
        )  # fmt: skip
        if self.service is not None:
            declare_pipeline(self.service.monitor, self.pipeline, s)
        return s

    def committed(self, processor: str) -> dict[str, int]:
        """Next offset per input partition as the processor's checkpoint commits it ("topic/partition")."""
        cp = f"{self.root}/checkpoints/{self.pipeline.processors[processor].checkpoint}"
        try:
            committed = read_offsets(cp).committed
        except CheckpointError:  # no batch planned yet
            return {}
        return {f"{t}/{p}": off for t, parts in committed.items() for p, off in parts.items()}

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
    e = Env(tag, build(tag), bootstrap, str(tmp_path_factory.mktemp("monitor-pipeline")))
    Runner(e.pipeline, e.settings()).create_topics()
    # A home of its own: the monitor cannot see the runners' state files (as from another host), so a
    # killed runner is noticed by its silence alone.
    settings = load(home=f"{e.root}/monitor", bootstrap_servers=bootstrap, progress_topic=f"{tag}.progress")
    config = MonitorConfig.model_validate({
        "interval": INTERVAL, "behind_window": "10m",
        "alerts": [{"expr": "stalled(a)"}, {"expr": "lag(a) > 20"}, {"expr": "retention_left(a) < 40m"}],
    })  # fmt: skip
    e.service = MonitorService(settings, config, pipelines=[e.pipeline]).start()
    try:
        with serving(create_app(e.service.monitor)) as url:
            e.url = url
            yield e
    finally:
        e.service.stop()


def last(f: dict, series: str) -> tuple[int, float | None]:
    """The newest [t, value] of a processor's sampled series: one evaluation, at t."""
    t, v = f["series"][series][-1]
    return t, v


def test_lag_and_retention_of_a_held_back_processor(spark, env):
    """a runs with a one-hour trigger and at most 10 records per batch: it reads src 0..9 at start and then
    waits, with the rest of src pending. Lag = records produced - committed offset (from its checkpoint);
    lag seconds = age of the record at the committed offset; retention left = retention.ms - that age."""
    base = int(time.time() * 1000) - 30 * 60_000  # half an hour ago: half the retention left
    env.produce([base + i * 1000 for i in range(25)])
    r = Runner(env.pipeline, env.settings(a=HELD), spark=spark, processors=["a"]).start()
    try:
        wait_for(lambda: r.snapshot()["a"].batches >= 1, 120, "a's first batch")
        committed = env.committed("a")
        assert committed == {env.topic("src") + "/0": 10}

        def figures(pending: int):
            f = env.proc("a")
            t, lag_s = last(f, "lag_seconds")
            return f if f["lag"] == pending and lag_s == pytest.approx((t - env.produced[10]) / 1000) else None

        f = wait_for(lambda: figures(25 - 10), 30, "a's figures with 15 records pending")
        t, lag_s = last(f, "lag_seconds")
        assert f["lag_by_partition"] == {env.topic("src") + "/0": 15}
        assert f["health"] == "healthy"  # a one-hour trigger: waiting is what it is told to do
        t2, left = last(f, "retention_left_s")
        assert t2 == t and left == pytest.approx((RETENTION_MS - (t - env.produced[10])) / 1000)
        topics = env.get("/api/topics")
        assert topics[env.topic("src")]["retention_ms"] == RETENTION_MS
        assert topics[env.topic("src")]["records"] == 25
        # 15 pending: the rule does not hold (it did while all 25 were, before a's batch, if polled then).
        wait_for(lambda: env.active("lag(a) > 20") is None, 10, "the lag alert to be quiet")

        # More records, newer: the lag grows by as many; the oldest pending record is the same, older now.
        env.produce([base + 60_000 + i * 1000 for i in range(10)])
        f = wait_for(lambda: figures(35 - 10), 30, "a's figures with 25 records pending")
        t_later, lag_later = last(f, "lag_seconds")
        _, left_later = last(f, "retention_left_s")
        assert t_later > t
        assert lag_later - lag_s == pytest.approx((t_later - t) / 1000)
        assert left - left_later == pytest.approx((t_later - t) / 1000)
        fired = wait_for(lambda: env.active("lag(a) > 20"), 10, "the lag alert")
        assert fired["value"] == 25 and fired["target"] == env.key("a")
        risk = env.active("retention_left(a) < 40m")
        assert risk is not None and risk["target"] == env.key("a") and risk["value"] < 40 * 60
    finally:
        r.stop()


def test_freshness_propagates_through_three_stages(spark, env):
    """a stays held (src 10.. pending, from the test above); b and c run and process all a wrote. Each output
    is then complete up to the timestamp of a's oldest pending record, down to t3: C(t1) = C(a) = ts(src@10),
    since a has that record pending; C(t2) = C(b) = C(t1), b having processed all of t1; C(t3) = C(c) = C(t2).
    Freshness = now - C, for every output and processor, though b and c lag by nothing."""
    assert len(env.produced) == 35 and env.committed("a"), "runs after test_lag_and_retention_of_a_held_back_processor"
    r = Runner(env.pipeline, env.settings(a=HELD), spark=spark, processors=["b", "c"]).start()
    try:
        wait_for(lambda: env.committed("c").get(env.topic("t2") + "/0") == 10, 120, "c to process b's 10 records")
        assert env.committed("b") == {env.topic("t1") + "/0": 10}
        complete = env.produced[10]

        def fresh():
            procs = {n: env.proc(n) for n in "abc"}
            if procs["b"]["lag"] != 0 or procs["c"]["lag"] != 0:
                return None
            outputs = env.get(f"/api/series?since={int(time.time() * 1000) - 3000}")["outputs"]
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
                ts = int(time.time() * 1000)
                n = len(self.env.produced)
                producer.produce(self.env.topic("src"), json.dumps({"n": n}).encode(), partition=0, timestamp=ts)
                if producer.flush(10):
                    self.errors.append(f"record {n} not acknowledged")
                    return
                self.env.produced.append(ts)
        finally:
            producer.close()


def crash(spark, runner: Runner) -> None:
    """What SIGKILL does to `weir run`, in this process: its queries end mid-stream and it says nothing more,
    no failure, no state change. (A batch that ended before the kill still reports, as it would have.)"""
    runner._stop.set()
    runner._supervisor.join(10)  # nothing supervises the queries any more, nothing reports their end
    for name, q in list(runner._queries.items()):
        q.stop()
        done = (q.lastProgress or {}).get("batchId", -1)
        wait_for(lambda n=name, d=done: (runner.status[n].last_batch_id or -1) >= d, 10, "the last batch's record")
    runner._queries.clear()
    spark.streams.removeListener(runner._listener)
    publisher, runner.publisher = runner.publisher, None
    publisher.close()


def stall_limit_ms(env: Env, trigger_ms: float) -> float:
    """stall_triggers (2) x max(trigger, longest of a's last 20 batches that read records, its run's first
    batch aside once a later one is known), from the runner's own progress log."""
    log = Path(env.root) / "home" / "progress" / f"{env.pipeline.name}.jsonl"
    batches = [r for r in map(json.loads, log.read_text().splitlines())
               if r["type"] == "progress" and r["processor"] == "a" and r["input_rows"] > 0]  # fmt: skip
    paces = [(r["batch_duration_ms"], i == 0 or r["run_id"] != batches[i - 1]["run_id"]) for i, r in
             enumerate(batches)][-20:]  # fmt: skip
    steady = [ms for ms, first in paces if not first] or [ms for ms, _ in paces]
    return 2 * max(trigger_ms, *steady)


def test_a_killed_processor_is_alerted_while_the_monitor_serves_and_resolves_on_restart(spark, env, record_property):
    """a, in a runner of its own (its own process, as it were), is killed while src keeps receiving records:
    it turns stalled and `stalled(a)` fires within two of its trigger intervals (each as long as its slowest
    recent batch, when that is longer) of its last batch, while the HTTP API keeps answering. Its outputs'
    freshness stops at its oldest pending record, three stages down. A new runner on its checkpoint
    resolves the alert, and once everything is processed, every output is fresh."""
    assert env.committed("b"), "runs after test_freshness_propagates_through_three_stages"
    s = env.settings()  # every processor on its one-second trigger
    src = env.topic("src") + "/0"
    began_ms = int(time.time() * 1000)
    bc = Runner(env.pipeline, env.settings("home-bc"), spark=spark, processors=["b", "c"]).start()
    runners = [bc]
    try:
        with Trickle(env) as trickle:
            a = Runner(env.pipeline, s, spark=spark, processors=["a"]).start()
            runners.append(a)
            # a catches up on src (the 35 records above, then the trickle): its lag alert resolves.
            wait_for(lambda: env.history("lag(a) > 20", "resolved", began_ms), 120, "a to catch up")
            wait_for(lambda: a.snapshot()["a"].batches >= 3, 60, "a's third batch")
            wait_for(lambda: env.proc("a")["health"] == "healthy" and env.active("stalled(a)") is None, 10,
                     "a healthy")  # fmt: skip

            kill_ms = int(time.time() * 1000)
            crash(spark, a)  # a batch in flight in Python may still end: the kill is over when crash returns
            dead_ms = int(time.time() * 1000)
            runners.remove(a)
            slowest = 0.0
            while (fired := env.active("stalled(a)")) is None:
                assert time.time() * 1000 - kill_ms < 120_000, "stalled(a) did not fire"
                began = time.monotonic()
                assert env.get("/api/overview")["processors"][env.key("a")]["health"] in ("healthy", "stalled")
                slowest = max(slowest, time.monotonic() - began)
                time.sleep(0.1)
            f = env.proc("a")
            assert f["health"] == "stalled" and "records pending and no batch for" in f["health_reason"]
            # The stall is counted from a's last batch (or from when input was next seen pending, if later).
            since = max(f["pending_since_ms"], f["last_advance_ms"])
            limit = stall_limit_ms(env, f["trigger_ms"])
            assert f["trigger_ms"] == 1000
            assert limit < fired["at_ms"] - since <= limit + 1000 * (INTERVAL + 2)  # + a poll, an evaluation
            assert since - dead_ms <= 1000 * (trickle.every + INTERVAL + 2)  # input was pending all along
            kill_to_alert = ((fired["at_ms"] - kill_ms) / 1000, (fired["at_ms"] - dead_ms) / 1000)

            # While a is dead: the API answers at once, /metrics says it too, the lag grows.
            for path in ("/api/overview", "/api/topology", f"/api/processors/{env.key('a')}", "/metrics"):
                began = time.monotonic()
                env.get(path, raw=True)
                slowest = max(slowest, time.monotonic() - began)
            assert slowest < 2  # each answer at once, as all along
            metrics = env.get("/metrics", raw=True)
            assert f'weir_alert_firing{{rule="stalled(a)",target="{env.key("a")}"}} 1.0' in metrics
            assert f'weir_processor_health{{pipeline="{env.pipeline.name}",processor="a",state="stalled"}} 1.0' in (
                metrics
            )
            nodes = {n["id"]: n for n in env.get("/api/topology")["nodes"]}
            assert nodes[env.key("a")]["health"] == nodes[env.topic("t1")]["health"] == "stalled"
            # b and c finish what a wrote; every output is then complete up to a's oldest pending record.
            k = env.committed("a")[src]

            def held():
                procs = {n: env.proc(n) for n in "abc"}
                if procs["b"]["lag"] != 0 or procs["c"]["lag"] != 0:
                    return None
                outputs = env.get(f"/api/series?since={int(time.time() * 1000) - 3000}")["outputs"]
                points = [outputs[env.topic(t)][-1] for t in ("t1", "t2", "t3")]
                return points if all(v == pytest.approx((t - env.produced[k]) / 1000) for t, v in points) else None

            wait_for(held, 60, "b and c to process what a wrote")
            f = env.proc("a")
            assert f["lag"] > 0 and f["lag_by_partition"] == {src: f["lag"]} and f["health"] == "stalled"

            restart_ms = int(time.time() * 1000)
            a = Runner(env.pipeline, s, spark=spark, processors=["a"]).start()
            runners.append(a)
            resolved = wait_for(lambda: env.history("stalled(a)", "resolved", restart_ms), 120, "the alert to resolve")
            assert env.active("stalled(a)") is None and resolved[0]["fired_at_ms"] == fired["at_ms"]
            restart_to_resolve = (resolved[0]["at_ms"] - restart_ms) / 1000
        assert not trickle.errors

        # The trickle stopped: once all is processed, every output is complete up to now.
        def caught_up():
            procs = {n: env.proc(n) for n in "abc"}
            return procs if all(p["lag"] == 0 and p["freshness_s"] == 0 for p in procs.values()) else None

        procs = wait_for(caught_up, 120, "everything processed")
        assert env.committed("a") == {src: len(env.produced)}
        assert (procs["a"]["lag_seconds"], procs["a"]["retention_left_s"], procs["a"]["health"]) == (0, None, "healthy")
        assert [n for n, o in env.get("/api/overview")["outputs"].items() if o["freshness_s"] != 0] == []
        # Nothing is pending: no record is at risk of retention any more.
        wait_for(lambda: env.active("retention_left(a) < 40m") is None, 5, "the retention alert to resolve")
    finally:
        for r in runners:
            r.stop()
    timings = {"kill_to_alert_s": kill_to_alert[0], "dead_to_alert_s": kill_to_alert[1],
               "last_batch_to_alert_s": (fired["at_ms"] - since) / 1000, "stall_limit_s": limit / 1000,
               "restart_to_resolve_s": restart_to_resolve, "slowest_api_s": round(slowest, 3)}  # fmt: skip
    for k, v in timings.items():
        record_property(k, v)
    print(timings)
