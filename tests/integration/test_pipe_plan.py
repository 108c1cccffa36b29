"""A batch reads exactly the range it was planned on: the weir-kafka stream reader driven in the order Spark's
MicroBatchExecution calls it (initialOffset, latestOffset, the offset log, then initialOffset again when batch 0
runs, partitions, read), against the real broker, without a Spark session.

Each case failed before plans carried their start (`@start`): batch 0 read 0 of the records it planned when they
arrived between Spark's two initialOffset calls, a log start that moved between them skipped its range silently,
and a restart replaying batch 0 after new records failed for good with a wrong diagnosis.
"""

from __future__ import annotations

import json

import pytest
from _pipe import Rec, delete_records, produce, unique

from weir.checkpoint.offsets import from_json, starts_from_json
from weir.kafka import Admin
from weir.kafka.read import DataLossError
from weir.kafka.source import KafkaDataSource, KafkaStreamReader
from weir.kafka.tolake import KAFKA_STRUCT

pytestmark = pytest.mark.integration

SCHEMA = KAFKA_STRUCT  # the raw columns, as Spark hands them to the source


def reader(bootstrap: str, topic: str, **options: str) -> KafkaStreamReader:
    opts = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, **options}
    return KafkaDataSource({k.lower(): v for k, v in opts.items()}).streamReader(SCHEMA)


def fill(bootstrap: str, topic: str, n: int, tag: str) -> None:
    produce(bootstrap, topic, (Rec(i % 2, None, f"{tag}:{i}".encode()) for i in range(n)))


def plan_batch_0(r: KafkaStreamReader) -> tuple[dict, dict]:
    """What Spark does to plan batch 0: its start, then its end (which goes into the offset log), as JSON text."""
    start = r.initialOffset()
    end = r.latestOffset(start, r.getDefaultReadLimit())
    return json.loads(json.dumps(start)), json.loads(json.dumps(end))


def run_batch(r: KafkaStreamReader, start: dict, end: dict) -> list[str]:
    """What Spark does to run a planned batch: the values its read tasks produce."""
    out = []
    for part in r.partitions(start, end):
        for batch in r.read(part):
            out += [bytes(v).decode() for v in batch.column("value").to_pylist()]
    return sorted(out)


@pytest.fixture
def topic(bootstrap: str) -> str:
    name = unique("plan")
    Admin(bootstrap).create_topic(name, partitions=2)
    return name


def test_batch_0_reads_what_it_planned_when_records_arrive_between_sparks_initial_offset_calls(bootstrap, topic):
    fill(bootstrap, topic, 10, "old")
    r = reader(bootstrap, topic, startingOffsets="latest")
    start = r.initialOffset()
    fill(bootstrap, topic, 50, "new")  # between the plan's initialOffset and latestOffset: batch 0's records
    end = r.latestOffset(start, r.getDefaultReadLimit())
    assert sum(from_json(end)[0][topic].values()) == 60
    assert starts_from_json(end) == {topic: {0: 5, 1: 5}}  # the plan says where it starts
    fill(bootstrap, topic, 7, "later")
    # runBatch asks again: the answer must not move batch 0's start past its records
    rows = run_batch(r, r.initialOffset(), end)
    assert rows == sorted(f"new:{i}" for i in range(50))
    r.stop()


def test_a_restart_replaying_batch_0_reads_the_logged_range(bootstrap, topic):
    fill(bootstrap, topic, 10, "old")
    first = reader(bootstrap, topic, startingOffsets="latest")
    start = first.initialOffset()
    fill(bootstrap, topic, 50, "new")
    end = json.loads(json.dumps(first.latestOffset(start, first.getDefaultReadLimit())))
    first.stop()  # the process dies with batch 0 planned and logged, not committed
    fill(bootstrap, topic, 30, "after")
    again = reader(bootstrap, topic, startingOffsets="latest")
    # Before: "the next offset to read, 45, is beyond the latest offset 30 ... deleted and recreated", for good.
    assert run_batch(again, again.initialOffset(), end) == sorted(f"new:{i}" for i in range(50))
    again.stop()


def test_a_log_start_moving_between_the_calls_fails_loudly_not_silently(bootstrap, topic):
    fill(bootstrap, topic, 40, "r")
    r = reader(bootstrap, topic, startingOffsets="earliest")
    _, end = plan_batch_0(r)
    assert starts_from_json(end) == {topic: {0: 0, 1: 0}}
    r.stop()
    # The broker deleted offsets [0, 8) of partition 0 before batch 0 ran (a restart replays it).
    delete_records(bootstrap, {topic: {0: 8}})
    moved = reader(bootstrap, topic, startingOffsets="earliest")
    with pytest.raises(DataLossError, match=r"offsets \[0, 8\) are gone"):
        moved.partitions(moved.initialOffset(), end)
    moved.stop()


def test_a_plan_that_does_not_start_where_the_batch_before_ended_is_refused(bootstrap, topic):
    fill(bootstrap, topic, 20, "r")
    r = reader(bootstrap, topic, startingOffsets="earliest")
    start, end = plan_batch_0(r)
    assert len(run_batch(r, start, end)) == 20
    fill(bootstrap, topic, 6, "s")
    nxt = json.loads(json.dumps(r.latestOffset(end, r.getDefaultReadLimit())))
    assert len(run_batch(r, end, nxt)) == 6
    doctored = json.loads(json.dumps(nxt))
    doctored["@start"][topic]["1"] += 2  # a plan that would skip two offsets of partition 1
    with pytest.raises(DataLossError, match=rf"{topic} partition 1 at offset 12, but the batch before ended at 10"):
        r.partitions(end, doctored)
    r.stop()


def test_no_new_records_plans_no_batch(bootstrap, topic):
    fill(bootstrap, topic, 4, "r")
    r = reader(bootstrap, topic, startingOffsets="earliest")
    _, end = plan_batch_0(r)
    # Spark runs a batch whenever the end differs from the start: with nothing new it must be the start itself.
    assert r.latestOffset(end, r.getDefaultReadLimit()) == end
    r.stop()
