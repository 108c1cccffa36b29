"""KafkaSink (at-least-once) as the sink of a pipeline run by `weir run`, SIGKILLed twice mid-run and
restarted: the output topic holds every input record at least once, and exactly once after dropping the
copies that carry a `weir.source` (topic/partition/offset of the input record) seen before.

The sink in the pipeline is KafkaSink with a pause after its write, which stands for the runner's work
between a batch's write and Spark's commit of it (as test_sinks_parquet_kill's job pauses): the first kill
lands there, after the whole batch is in the topic and before its commit, so the restart replays it and
the topic surely holds duplicates to check. The second kill lands as soon as the next batch's first records
appear: mid-write, or in its pause.
"""

from __future__ import annotations

import json
import textwrap
import time
import uuid
from collections import defaultdict

import pytest
from _pipe import Rec, consume_all, finish_once, kill_tree, produce, start_weir, wait_running, weir_env

from weir.kafka import Admin
from weir.kafka.log import LogView

pytestmark = pytest.mark.integration
N = 3000
BATCH = 100  # max offsets per trigger in the killed runs: about 30 batches in all
PAUSE_S = 3.0

PIPELINE = """
import os
import time

from pyspark.sql import functions as F
from weir.pipeline import Pipeline
from weir.sinks import KafkaSink


class PausingKafkaSink(KafkaSink):
    def write(self, batch, batch_id):
        written = super().write(batch, batch_id)
        time.sleep(float(os.environ.get("KILLTEST_PAUSE_S", "0")))  # written, not yet committed by Spark
        return written


p = Pipeline("{name}")
events = p.topic("{prefix}.events", schema="id BIGINT NOT NULL, amount DOUBLE", key="id", partitions=2)

@p.processor(inputs=[events], sink=PausingKafkaSink("{prefix}.out", "{bootstrap}", linger_ms=5))
def forward(df):
    # Source coordinates kept: the sink stamps them on every record as its weir.source header.
    return df.select("key", F.to_json(F.struct("id", "amount")).alias("value"), "topic", "partition", "offset")
"""


def test_kafka_sink_in_a_killed_pipeline_is_at_least_once_and_exact_by_weir_source(bootstrap, tmp_path) -> None:
    prefix = uuid.uuid4().hex[:8]
    events, out = f"{prefix}.events", f"{prefix}.out"
    spec = tmp_path / "kafka_pipeline.py"
    spec.write_text(textwrap.dedent(PIPELINE.format(name=f"kafkakill-{prefix}", prefix=prefix, bootstrap=bootstrap)))
    admin = Admin(bootstrap)
    admin.create_topic(events, 2)
    admin.create_topic(out, 2)
    # Record i at partition i % 2, offset i // 2: the weir.source each id must carry.
    produce(
        bootstrap, events,
        (Rec(i % 2, str(i).encode(), json.dumps({"id": i, "amount": i / 4}).encode()) for i in range(N)),
    )  # fmt: skip
    env = weir_env(tmp_path, bootstrap)
    killed = {"KILLTEST_PAUSE_S": str(PAUSE_S), "WEIR_MAX_OFFSETS_PER_TRIGGER": str(BATCH)}
    probe = LogView({"bootstrap.servers": bootstrap})  # true high-water marks (see weir.kafka.log)

    def in_topic() -> int:
        return sum(hi for _, hi in probe.bounds([(out, 0), (out, 1)]).values())

    proc = None
    try:
        # Kill 1: a batch entirely in the topic (no record for a while), in the pause before its commit.
        proc = start_weir(spec, env, tmp_path / "run1.log", **killed)
        wait_running(proc, in_topic, 240, "records in the output topic", tmp_path)
        seen, since = in_topic(), time.monotonic()
        deadline = since + 60
        while time.monotonic() - since < 0.5:  # a kill within PAUSE_S of the write: before Spark's commit
            assert time.monotonic() < deadline, "records kept arriving for 60 s: no pause after a write"
            now = in_topic()
            if now != seen:
                seen, since = now, time.monotonic()
            time.sleep(0.02)
        kill_tree(proc)
        first_kill = in_topic()
        assert 0 < first_kill < N, f"the first kill was not mid-run: {first_kill} of {N} records"

        # Kill 2: the restart replays the killed batch (as many records again), then writes the next one:
        # killed at its first records, mid-write or in its pause.
        proc = start_weir(spec, env, tmp_path / "run2.log", **killed)
        wait_running(proc, lambda: in_topic() > first_kill + BATCH, 240, "a batch after the replay", tmp_path)
        kill_tree(proc)
        second_kill = in_topic()
        assert first_kill + BATCH < second_kill < N + first_kill, f"second kill at {second_kill} records"

        # The final run replays the second killed batch, then reads the rest in one batch, and stops.
        finish_once(spec, env, tmp_path)
    finally:
        probe.close()
        if proc is not None and proc.poll() is None:
            kill_tree(proc)

    records = consume_all(bootstrap, out)
    by_source: dict[str, list[int]] = defaultdict(list)  # weir.source -> the ids of its copies, in topic order
    sources_of: dict[int, set[str]] = defaultdict(set)  # id -> the weir.source of each of its copies
    for m in records:
        origins = [v.decode() for k, v in m.headers() or [] if k == "weir.source"]
        assert len(origins) == 1, f"record {m.partition()}/{m.offset()} has weir.source headers {origins}"
        record = json.loads(m.value())
        assert m.key() == str(record["id"]).encode() and record["amount"] == record["id"] / 4
        by_source[origins[0]].append(record["id"])
        sources_of[record["id"]].add(origins[0])

    # At least once: every input record is there.
    assert set(sources_of) == set(range(N)), f"missing ids: {sorted(set(range(N)) - set(sources_of))[:20]}"
    # Exactly once by weir.source: one source per input record, each the input record's own coordinates, and
    # every copy of a source is the same record. A copy stamped with other coordinates (a replay that
    # changed what a row carries) would make two sources for one id, or one source with two ids.
    assert len(by_source) == N, f"{len(by_source)} distinct weir.source values for {N} input records"
    assert all(len(set(ids)) == 1 for ids in by_source.values()), "a weir.source on two different records"
    assert all(srcs == {f"{events}/{i % 2}/{i // 2}"} for i, srcs in sources_of.items()), "a wrong weir.source"
    # Duplicates are the replays, which the first kill guarantees: it came after a complete write and before
    # the batch's commit, so the restart wrote that batch again (with no duplicate the dedup checks above
    # would prove nothing).
    duplicates = len(records) - N
    assert duplicates >= 1, f"no record was written twice, though the first kill interrupted batch at {first_kill}"
    print(f"kills at {first_kill} and {second_kill} records; {len(records)} in the topic, {duplicates} duplicates")
