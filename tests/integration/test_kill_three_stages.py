"""Kill test of a three-stage pipeline: stateless, then a tumbling window, then PostgresSink (append mode, so
that a doubled row would show), SIGKILLed at random moments several times and restarted. The final table equals
the windows computed from the input, exactly: a replayed stage writes its topic only what its first attempt did
not deliver (docs/delivery.md, "Replays"), the window's state comes back from its checkpoint, and the sink is
exactly-once by batch. The seed is printed: a failure can be run again as it happened."""

from __future__ import annotations

import json
import os
import random
import textwrap
import time
import uuid
from collections import defaultdict

import psycopg
import pytest
from _pipe import Rec, consume_all, finish_once, kill_tree, postgres_dsn, produce, start_weir, wait_for, weir_env
from confluent_kafka import Consumer, TopicPartition

from weir.kafka import Admin

pytestmark = pytest.mark.integration
N, KEYS = 1500, 5
BASE_MS, STEP_MS, SIZE_MS = 1_700_000_000_000, 200, 10_000  # 300 s of event time: 30 windows per key
KILLS = 3

PIPELINE = """
from pyspark.sql import functions as F
from weir.blocks.window import tumbling_window
from weir.pipeline import Pipeline
from weir.sinks import PostgresSink

p = Pipeline("{name}")
events = p.topic("{prefix}.events", schema="id BIGINT NOT NULL, k STRING, amount DOUBLE, ts_ms BIGINT", key="id",
                 partitions=2)
clean = p.topic("{prefix}.clean", schema="id BIGINT, k STRING, cents BIGINT, ts_ms BIGINT", key="k", partitions=2)
totals = p.topic("{prefix}.totals", schema="k STRING, window_start TIMESTAMP, window_end TIMESTAMP, orders BIGINT, "
                 "cents BIGINT", key="k", partitions=2)

@p.processor(inputs=[events], outputs=[clean])
def cleanse(df):
    return df.withColumn("cents", (F.col("amount") * 100).cast("long"))

@p.processor(inputs=[clean], outputs=[totals], stateful=True)
def total(df):
    timed = df.withColumn("event_time", F.timestamp_millis("ts_ms"))
    return tumbling_window(timed, key="k", event_time="event_time", size="10 seconds", watermark="30 seconds",
                           aggregates={{"orders": ("count", "*"), "cents": ("sum", "cents")}})

@p.processor(inputs=[totals], sink=PostgresSink("{dsn}", "{table}"))
def store(df):
    return df.select("k", "window_start", "orders", "cents")
"""


def expected() -> dict[tuple[str, int], tuple[int, int]]:
    """(key, window start ms) -> (orders, cents) of every window the flush record closes."""
    out: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    for i in range(N):
        ts = BASE_MS + i * STEP_MS
        w = out[(f"k{i % KEYS}", ts - ts % SIZE_MS)]
        w[0] += 1
        w[1] += int(i / 8 * 100)
    return {k: tuple(v) for k, v in out.items()}


def records(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def test_a_three_stage_pipeline_killed_at_random_ends_exactly_as_a_clean_run(bootstrap, tmp_path) -> None:
    seed = int(os.environ.get("WEIR_KILL_SEED", random.randrange(1 << 30)))
    print(f"kill seed {seed} (WEIR_KILL_SEED={seed} repeats this run's kill moments)")
    rnd = random.Random(seed)
    dsn = postgres_dsn()
    prefix = uuid.uuid4().hex[:8]
    name, table = f"kill3-{prefix}", f"kill3_{prefix}"
    spec = tmp_path / "kill3_pipeline.py"
    spec.write_text(textwrap.dedent(PIPELINE.format(name=name, prefix=prefix, dsn=dsn, table=table)))
    Admin(bootstrap).create_topic(f"{prefix}.events", 2)

    def event(i: int, ts: int, k: str) -> Rec:
        return Rec(i % 2, str(i).encode(), json.dumps({"id": i, "k": k, "amount": i / 8, "ts_ms": ts}).encode())

    produce(bootstrap, f"{prefix}.events", (event(i, BASE_MS + i * STEP_MS, f"k{i % KEYS}") for i in range(N)))
    # An hour later on both partitions: the watermark passes every window of the data above
    produce(bootstrap, f"{prefix}.events", (event(N + p, BASE_MS + 3_600_000, "flush") for p in range(2)))
    env = weir_env(tmp_path, bootstrap)
    db = psycopg.connect(dsn, autocommit=True)

    def stored() -> int:
        if db.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0] is None:
            return 0
        return db.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]

    def progressed() -> int:
        done = records(tmp_path / "home" / "progress" / f"{name}.jsonl")
        return sum(r["type"] == "progress" and r["input_rows"] > 0 for r in done)

    ends = Consumer({"bootstrap.servers": bootstrap, "group.id": f"kill3-{prefix}"})

    def written(topic: str) -> int:
        return sum(ends.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1] for p in (0, 1))

    for kill in range(KILLS):
        # Small batches, so that the kills land mid-run, after some batches of any stage: at a random moment, or
        # (kills 2 and 3) the moment a stage's topic grows, between its write and its commit when lucky
        proc = start_weir(spec, env, tmp_path / f"run-{kill}.log", WEIR_MAX_OFFSETS_PER_TRIGGER="150")
        try:
            want = progressed() + rnd.randint(2, 6)
            wait_for(lambda w=want: progressed() >= w, 300, f"{want} batches before kill {kill + 1}")
            if kill == 0:
                time.sleep(rnd.uniform(0.0, 2.0))
            else:
                topic = f"{prefix}.clean" if kill == 1 else f"{prefix}.totals"
                before = written(topic)
                wait_for(lambda t=topic, b=before: written(t) != b, 120, f"a write to {topic}", interval=0.005)
        finally:
            kill_tree(proc)  # also when a wait fails: a run left behind would load every test after it
        print(f"kill {kill + 1}: {stored()} windows stored, {progressed()} batches with input so far")
    ends.close()
    finish_once(spec, env, tmp_path)
    replays = [
        r for r in records(tmp_path / "home" / "progress" / f"{name}.jsonl") if r.get("accounting", {}).get("replayed")
    ]
    print("replayed batches:", [(r["processor"], r["batch_id"], r["accounting"]["replayed"]) for r in replays])

    late = consume_all(bootstrap, f"{prefix}.clean.late")
    assert late == [], f"{len(late)} late records: the test's data must be on time for its expectation"
    got = db.execute(f'SELECT k, window_start, orders, cents FROM "{table}"').fetchall()
    rows = {(k, int(ws.timestamp() * 1000)): (o, c) for k, ws, o, c in got}
    assert len(rows) == len(got), "a window is stored twice"
    assert rows == expected()
    clean = consume_all(bootstrap, f"{prefix}.clean")
    assert len(clean) == N + 2, "the stateless stage's topic holds a record twice"
