"""Rate limits and parallelism of the weir-kafka source: maxOffsetsPerTrigger, maxBytesPerTrigger,
minPartitions, and adaptive admission (flow=auto)."""

from __future__ import annotations

import pytest
from _pipe import Collected, Rec, end_offsets, produce, run_available_now, run_to_end, source

from weir.kafka import Admin
from weir.kafka.admission import ADMISSION_KEY, EXPANSION, GROWING, MEMORY_CAP, WARMING_UP, write_measurement

pytestmark = pytest.mark.integration

VALUE_BYTES = 100
KEY_BYTES = 8


def fill(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    """Records of one fixed size (key 8 bytes + value 100 bytes) so byte limits are predictable."""
    Admin(bootstrap).create_topic(topic, partitions=partitions)
    produce(
        bootstrap,
        topic,
        (
            Rec(p, f"{p:02d}-{i:05d}".encode(), f"{p}:{i}:".encode().ljust(VALUE_BYTES, b"x"))
            for p in range(partitions)
            for i in range(per_partition)
        ),
    )
    assert Admin(bootstrap).offsets(topic) == {p: (0, per_partition) for p in range(partitions)}


def coordinates(rows) -> list[tuple[int, int]]:
    return sorted((r["partition"], r["offset"]) for r in rows)


def test_max_offsets_per_trigger_sizes_available_now_batches(spark, bootstrap, topic_name, tmp_path) -> None:
    fill(bootstrap, topic_name, partitions=2, per_partition=500)
    df = source(spark, bootstrap, topic_name, stream=True, startingOffsets="earliest", maxOffsetsPerTrigger=300)
    got = run_available_now(df.select("partition", "offset"), str(tmp_path / "ckpt"))

    sizes = [p["numInputRows"] for p in got.progress]
    # Spark runs no trailing empty batch here; were it to, it would show as a 0 at the end.
    assert sizes == [300, 300, 300, 100]
    assert [len(b) for b in got.batches] == sizes
    # The limit is shared by backlog: both partitions advance 150 per batch, then the last 50 each.
    ends = [{p: o for p, o in e[topic_name].items()} for e in end_offsets(got.progress)]
    assert ends == [
        {"0": 150, "1": 150},
        {"0": 300, "1": 300},
        {"0": 450, "1": 450},
        {"0": 500, "1": 500},
    ]
    assert coordinates(got.rows) == [(p, o) for p in range(2) for o in range(500)]


def test_max_bytes_per_trigger_bounds_batches(spark, bootstrap, topic_name, tmp_path) -> None:
    total = 2 * 300
    fill(bootstrap, topic_name, partitions=2, per_partition=300)
    record_bytes = KEY_BYTES + VALUE_BYTES
    limit = 160 * record_bytes  # about 160 records per batch
    df = source(spark, bootstrap, topic_name, stream=True, startingOffsets="earliest", maxBytesPerTrigger=limit)
    got = run_available_now(df.select("partition", "offset", "key", "value"), str(tmp_path / "ckpt"))

    sizes = [p["numInputRows"] for p in got.progress]
    assert sum(sizes) == total
    assert len([s for s in sizes if s]) > 1, sizes
    bound = limit / record_bytes * 1.5
    assert all(s <= bound for s in sizes), (sizes, bound)
    for batch in got.batches:
        assert sum(len(r["key"]) + len(r["value"]) for r in batch) <= limit * 1.5
    assert coordinates(got.rows) == [(p, o) for p in range(2) for o in range(300)]


def test_min_partitions_batch(spark, bootstrap, topic_name) -> None:
    fill(bootstrap, topic_name, partitions=1, per_partition=400)
    plain = source(spark, bootstrap, topic_name, stream=False)
    split = source(spark, bootstrap, topic_name, stream=False, minPartitions=4)
    assert plain.rdd.getNumPartitions() == 1
    assert split.rdd.getNumPartitions() >= 4

    def contents(df) -> list[tuple]:
        return sorted((r["partition"], r["offset"], bytes(r["key"]), bytes(r["value"])) for r in df.collect())

    expected = contents(plain)
    assert len(expected) == 400
    assert [o for _, o, _, _ in expected] == list(range(400))
    assert contents(split) == expected
    # Each task really read a slice: offsets are spread over the tasks, none read twice.
    per_task = split.rdd.mapPartitions(lambda rows: [sorted(r["offset"] for r in rows)]).collect()
    assert sum(1 for offs in per_task if offs) >= 4
    assert sorted(o for offs in per_task for o in offs) == list(range(400))


def test_min_partitions_stream(spark, bootstrap, topic_name, tmp_path) -> None:
    fill(bootstrap, topic_name, partitions=1, per_partition=400)
    df = source(spark, bootstrap, topic_name, stream=True, startingOffsets="earliest", minPartitions=4)
    got = run_available_now(df.select("partition", "offset", "value"), str(tmp_path / "ckpt"))
    assert [len(b) for b in got.batches] == [400]
    assert got.num_partitions[0] >= 4, got.num_partitions
    assert coordinates(got.rows) == [(0, o) for o in range(400)]
    assert {bytes(r["value"])[:6] for r in got.rows if r["offset"] == 123} == {b"0:123:"}


def run_measured(df, checkpoint: str, measurements, seconds: float) -> Collected:
    """Like run_available_now, but each batch reports `seconds` as its measured duration, as the runner does."""
    out = Collected()

    def each(batch_df, batch_id: int) -> None:
        out.num_partitions.append(batch_df.rdd.getNumPartitions())
        out.batches.append(batch_df.select("partition", "offset").collect())
        write_measurement(measurements, batch_id, seconds)

    out.progress = run_to_end(df, checkpoint, each)
    return out


def test_flow_auto_warms_up_grows_and_reads_a_backlog_with_every_core(spark, bootstrap, topic_name, tmp_path) -> None:
    fill(bootstrap, topic_name, partitions=1, per_partition=3000)
    measurements = tmp_path / "flow.json"
    df = source(
        spark, bootstrap, topic_name, stream=True, startingOffsets="earliest", flow="auto", flowStartRecords=100,
        flowTargetMs=10_000, flowCores=3, flowMeasurements=measurements,
    )  # fmt: skip
    got = run_measured(df, str(tmp_path / "ckpt"), measurements, seconds=1.0)  # every batch: 10x under target

    assert [p["numInputRows"] for p in got.progress] == [100, 400, 1600, 900]
    decisions = [e[ADMISSION_KEY] for e in end_offsets(got.progress)]
    assert [(d["limit"], d["reason"], d["waiting"]) for d in decisions] == [
        (100, WARMING_UP, 3000),
        (400, WARMING_UP, 2900),
        (1600, WARMING_UP, 2500),
        (16000, GROWING, 900),  # 10x the headroom; the batch takes the 900 left
    ]
    assert [d.get("measuredMs") for d in decisions] == [None, 1000, 1000, 1000]
    # One Kafka partition, read by a task per core while records were left waiting; by one when caught up.
    assert got.num_partitions == [3, 3, 3, 1]
    assert coordinates(got.rows) == [(0, o) for o in range(3000)]


def test_flow_auto_never_admits_more_than_the_memory_budget(spark, bootstrap, topic_name, tmp_path) -> None:
    fill(bootstrap, topic_name, partitions=2, per_partition=500)
    record = KEY_BYTES + VALUE_BYTES
    measurements = tmp_path / "flow.json"
    df = source(
        spark, bootstrap, topic_name, stream=True, startingOffsets="earliest", flow="auto", flowStartRecords=5000,
        flowMemoryBytes=record * EXPANSION * 250, flowMeasurements=measurements,
    )  # fmt: skip
    got = run_measured(df, str(tmp_path / "ckpt"), measurements, seconds=0.01)

    assert [p["numInputRows"] for p in got.progress] == [250, 250, 250, 250]
    assert {e[ADMISSION_KEY]["reason"] for e in end_offsets(got.progress)} == {MEMORY_CAP}
    assert coordinates(got.rows) == [(p, o) for p in range(2) for o in range(500)]
