"""Data loss under a checkpoint: a deleted and recreated topic, and offsets the broker removed (Apache Kafka's
DeleteRecords, which moves the log start as retention does). Fail loudly by default; skip and count with
failOnDataLoss=false.

Topics are deleted only here, and only while no query runs: a client that outlives the deletion of a topic
it used can crash inside librdkafka on the embedded broker. The test process's own clients (producer,
admin) are closed or dropped before each deletion.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from _pipe import Rec, delete_records, end_offsets, produce, run_available_now, source, wait_for
from pyspark.errors import StreamingQueryException

from weir.kafka import Admin, TopicError

pytestmark = pytest.mark.integration

OLD = {0: 60, 1: 40}  # records per partition before the topic is deleted
NEW = {0: 6, 1: 4}  # and after it is recreated


def fill(bootstrap: str, topic: str, counts: dict[int, int], tag: str, first: int = 0) -> None:
    produce(
        bootstrap,
        topic,
        (Rec(p, None, f"{tag}:{p}:{i}".encode()) for p, n in counts.items() for i in range(first, first + n)),
    )


def recreate(bootstrap: str, topic: str, partitions: int) -> None:
    Admin(bootstrap).delete_topic(topic)
    wait_for(lambda: topic not in Admin(bootstrap).topics(), 30, f"deletion of {topic}")

    def created() -> bool:
        try:
            Admin(bootstrap).create_topic(topic, partitions=partitions)
            return True
        except TopicError as exc:  # the broker may still be finishing the deletion
            if "already exists" in str(exc):
                return False
            raise

    wait_for(created, 30, f"re-creation of {topic}", interval=0.5)
    assert Admin(bootstrap).offsets(topic) == {p: (0, 0) for p in range(partitions)}


def values(rows) -> list[str]:
    return sorted(bytes(r["value"]).decode() for r in rows)


def recreated_topic_under_checkpoint(spark, bootstrap: str, topic: str, checkpoint: str) -> None:
    """A checkpoint at offsets {0: 60, 1: 40}; then the topic is deleted and recreated with fewer records."""
    Admin(bootstrap).create_topic(topic, partitions=2)
    fill(bootstrap, topic, OLD, "old")
    first = run_available_now(source(spark, bootstrap, topic, stream=True, startingOffsets="earliest"), checkpoint)
    assert values(first.rows) == sorted(f"old:{p}:{i}" for p, n in OLD.items() for i in range(n))
    assert end_offsets(first.progress)[-1] == {topic: {"0": 60, "1": 40}}
    recreate(bootstrap, topic, partitions=2)
    fill(bootstrap, topic, NEW, "new")
    assert Admin(bootstrap).offsets(topic) == {0: (0, 6), 1: (0, 4)}


def test_recreated_topic_fails_the_query(spark, bootstrap, topic_name, tmp_path) -> None:
    checkpoint = str(tmp_path / "ckpt")
    recreated_topic_under_checkpoint(spark, bootstrap, topic_name, checkpoint)

    stream = source(spark, bootstrap, topic_name, stream=True, startingOffsets="earliest")
    with pytest.raises(StreamingQueryException) as info:
        run_available_now(stream, checkpoint)
    message = str(info.value)
    assert topic_name in message
    assert "data loss" in message
    # Partition 0 is checked first: the checkpoint wants offset 60, the new log ends at 6.
    assert "partition 0" in message
    assert "[6, 60)" in message
    assert "failOnDataLoss=false" in message

    # Nothing was committed by the failed run: the checkpoint still points into the old log.
    with pytest.raises(StreamingQueryException, match=r"\[6, 60\)"):
        run_available_now(stream, checkpoint)


def test_recreated_topic_skipped_with_fail_on_data_loss_false(spark, bootstrap, topic_name, tmp_path) -> None:
    checkpoint = str(tmp_path / "ckpt")
    recreated_topic_under_checkpoint(spark, bootstrap, topic_name, checkpoint)

    stream = source(spark, bootstrap, topic_name, stream=True, startingOffsets="earliest", failOnDataLoss="false")
    got = run_available_now(stream, checkpoint)
    # The records of the new topic, from its first offset, each once; nothing of the old log.
    assert values(got.rows) == sorted(f"new:{p}:{i}" for p, n in NEW.items() for i in range(n))
    ends = end_offsets(got.progress)
    assert ends, "no progress event"
    last = ends[-1]
    assert {k: v for k, v in last.items() if k != "@dataLoss"} == {topic_name: {"0": 6, "1": 4}}
    assert "@dataLoss" in last, last
    assert last["@dataLoss"]["events"] >= 1


def retention_scenario(spark, bootstrap: str, topic: str, checkpoint: str) -> dict[str, str]:
    """A checkpoint at offset 20 of 100, and the broker's log start moved to 50 (no options for the source:
    the broker itself says where its log begins)."""
    Admin(bootstrap).create_topic(topic, partitions=1)
    fill(bootstrap, topic, {0: 20}, "r")
    first = run_available_now(source(spark, bootstrap, topic, stream=True, startingOffsets="earliest"), checkpoint)
    assert len(first.rows) == 20
    assert end_offsets(first.progress)[-1] == {topic: {"0": 20}}
    fill(bootstrap, topic, {0: 80}, "r", first=20)
    delete_records(bootstrap, {topic: {0: 50}})
    return {}


def test_retention_past_checkpoint_fails_the_query(spark, bootstrap, topic_name, tmp_path) -> None:
    checkpoint = str(tmp_path / "ckpt")
    hook = retention_scenario(spark, bootstrap, topic_name, checkpoint)
    stream = source(spark, bootstrap, topic_name, stream=True, startingOffsets="earliest", **hook)
    with pytest.raises(StreamingQueryException) as info:
        run_available_now(stream, checkpoint)
    message = str(info.value)
    assert topic_name in message
    assert "partition 0" in message
    assert "[20, 50)" in message
    assert "earliest available offset is 50" in message


def test_retention_past_checkpoint_skipped_and_counted(spark, bootstrap, topic_name, tmp_path) -> None:
    checkpoint = str(tmp_path / "ckpt")
    hook = retention_scenario(spark, bootstrap, topic_name, checkpoint)
    stream = source(
        spark, bootstrap, topic_name, stream=True, startingOffsets="earliest", failOnDataLoss="false", **hook
    )
    got = run_available_now(stream, checkpoint)
    assert sorted(r["offset"] for r in got.rows) == list(range(50, 100))
    assert values(got.rows) == sorted(f"r:0:{i}" for i in range(50, 100))
    last = end_offsets(got.progress)[-1]
    assert last[topic_name] == {"0": 100}
    assert last["@dataLoss"] == {"skippedOffsets": 30, "events": 1}

    # The count lives in the checkpoint: a later run keeps it, and adds nothing without new loss.
    fill(bootstrap, topic_name, {0: 10}, "r", first=100)
    later = run_available_now(stream, checkpoint)
    assert sorted(r["offset"] for r in later.rows) == list(range(100, 110))
    assert end_offsets(later.progress)[-1] == {topic_name: {"0": 110}, "@dataLoss": {"skippedOffsets": 30, "events": 1}}


def test_deleted_records_in_batch_reads(spark, bootstrap, topic_name) -> None:
    """The same deletion in spark.read: earliest starts at 50, an explicit start below it is data loss."""
    Admin(bootstrap).create_topic(topic_name, partitions=1)
    fill(bootstrap, topic_name, {0: 100}, "b")
    delete_records(bootstrap, {topic_name: {0: 50}})
    hook: dict[str, str] = {}

    earliest = source(spark, bootstrap, topic_name, stream=False, **hook).select("offset").collect()
    assert sorted(r["offset"] for r in earliest) == list(range(50, 100))

    start_20 = json.dumps({topic_name: {"0": 20}})
    with pytest.raises(Exception, match=r"\[20, 50\)") as info:
        source(spark, bootstrap, topic_name, stream=False, startingOffsets=start_20, **hook).collect()
    assert topic_name in str(info.value)

    lenient = source(
        spark, bootstrap, topic_name, stream=False, startingOffsets=start_20, failOnDataLoss="false", **hook
    )
    assert sorted(r["offset"] for r in lenient.select("offset").collect()) == list(range(50, 100))


def log_uncommitted_batch(checkpoint: Path, topic: str, end: dict[str, int]) -> None:
    """Append a planned, uncommitted batch to a checkpoint's offset log, as a driver crash right after Spark
    logged a batch's end offsets (before the batch's commit) leaves it; the restart test's SIGKILL lands
    there too. On restart Spark replays that batch as logged, without asking the source for offsets again
    (latestOffset is not called), so the source's data-loss checks must also run when it plans the replay."""
    offsets = checkpoint / "offsets"
    last = max(int(f.name) for f in offsets.iterdir() if f.name.isdigit())
    assert sorted(int(f.name) for f in (checkpoint / "commits").iterdir() if f.name.isdigit())[-1] == last
    lines = (offsets / str(last)).read_text().splitlines()
    before = json.loads(lines[-1])
    assert before.keys() == {topic, "@start"}  # version, metadata, then our one source
    # The plan starts where the committed batch ended, as the source logs it.
    planned = {topic: end, "@start": {topic: {p: before[topic][p] for p in end}}}
    (offsets / str(last + 1)).write_text("\n".join([*lines[:-1], json.dumps(planned)]))


def test_replayed_batch_after_retention_fails_then_skips(spark, bootstrap, topic_name, tmp_path) -> None:
    checkpoint = tmp_path / "ckpt"
    hook = retention_scenario(spark, bootstrap, topic_name, str(checkpoint))
    log_uncommitted_batch(checkpoint, topic_name, {"0": 100})  # planned [20, 100), then a crash

    stream = source(spark, bootstrap, topic_name, stream=True, startingOffsets="earliest", **hook)
    with pytest.raises(StreamingQueryException) as info:
        run_available_now(stream, str(checkpoint))
    message = str(info.value)
    assert topic_name in message
    assert "partition 0" in message
    assert "[20, 50)" in message

    lenient = source(
        spark, bootstrap, topic_name, stream=True, startingOffsets="earliest", failOnDataLoss="false", **hook
    )
    got = run_available_now(lenient, str(checkpoint))
    assert sorted(r["offset"] for r in got.rows) == list(range(50, 100))
    assert end_offsets(got.progress)[-1][topic_name] == {"0": 100}


# A batch logged as [60, 100) before the topic was deleted and recreated (now 6 records) is replayed after
# a crash: with failOnDataLoss=true it is a data-loss error at once (not a read that waits pollTimeoutMs);
# with false the replay reads nothing and the next batch reads the new log exactly once.
def test_replayed_batch_after_topic_recreated(spark, bootstrap, topic_name, tmp_path) -> None:
    checkpoint = tmp_path / "ckpt"
    Admin(bootstrap).create_topic(topic_name, partitions=1)
    fill(bootstrap, topic_name, {0: 60}, "old")
    first = run_available_now(
        source(spark, bootstrap, topic_name, stream=True, startingOffsets="earliest"), str(checkpoint)
    )
    assert len(first.rows) == 60
    log_uncommitted_batch(checkpoint, topic_name, {"0": 100})  # planned [60, 100) of the old log
    recreate(bootstrap, topic_name, partitions=1)
    fill(bootstrap, topic_name, {0: 6}, "new")
    poll = 10_000  # a task idle this long on a local broker is the bug, not a slow machine
    problems = []  # both settings are checked, so one run shows every way this goes wrong

    strict = source(spark, bootstrap, topic_name, stream=True, startingOffsets="earliest", pollTimeoutMs=poll)
    started = time.monotonic()
    with pytest.raises(StreamingQueryException) as info:
        run_available_now(strict, str(checkpoint))
    message = str(info.value).split("=== Streaming Query ===")[0]
    if "data loss" not in message or topic_name not in message or "partition 0" not in message:
        problems.append(f"failOnDataLoss=true: not a data-loss error naming the partition: {message[-400:]}")
    if time.monotonic() - started >= poll / 1000:
        problems.append(f"failOnDataLoss=true: failed only after waiting pollTimeoutMs={poll}")

    lenient = source(
        spark, bootstrap, topic_name, stream=True, startingOffsets="earliest", failOnDataLoss="false",
        pollTimeoutMs=poll,
    )  # fmt: skip
    try:
        got = run_available_now(lenient, str(checkpoint))
    except StreamingQueryException as exc:
        problems.append(f"failOnDataLoss=false: the query failed: {str(exc).split('=== Streaming Query')[0][-400:]}")
    else:
        if values(got.rows) != sorted(f"new:0:{i}" for i in range(6)):  # the new log, each record once
            problems.append(f"failOnDataLoss=false: read {values(got.rows)}")
    assert not problems, "\n".join(problems)
