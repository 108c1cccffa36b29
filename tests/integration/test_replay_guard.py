"""A processor's rewritten batch adds nothing to its topics (weir.kafka.replay): a first write cut short, then
the batch's replay, leave each row in the topic once; what the replay skipped is reported; rows another
processor wrote, or another pipeline's processor of the same name, are not taken for delivered ones, nor a
row's copy in another topic, nor a window's row of the batch before; the next batch starts fresh."""

from __future__ import annotations

import json
import uuid
from collections import Counter

import pytest
from _pipe import consume_all
from pyspark.sql import functions as F

from weir.checkpoint.files import Checkpoint
from weir.kafka import Admin
from weir.kafka.replay import Guard, begin, skipped

pytestmark = pytest.mark.integration
SCHEMA = "id BIGINT, topic STRING, key BINARY, value BINARY, headers ARRAY<STRUCT<key: STRING, value: BINARY>>"


def rows(topic: str, processor: str, n: int, sourced: int, first: int = 0, pipeline: str | None = None) -> list[tuple]:
    """`sourced` rows from input records (weir.source), the rest without one, as a window's results."""
    out = []
    for i in range(first, first + n):
        hs = [("weir.processor", processor.encode())]
        if pipeline is not None:
            hs.append(("weir.pipeline", pipeline.encode()))
        if i < first + sourced:
            hs.append(("weir.source", f"in/{i % 2}/{i}".encode()))
        out.append((i, topic, str(i % 7).encode(), f'{{"n": {i % 50}}}'.encode(), hs))
    return out


def write(df, bootstrap: str, guard: Guard | None) -> None:
    w = df.drop("id").write.format("weir-kafka").option("kafka.bootstrap.servers", bootstrap).mode("append")
    (w.option("replayGuard", guard.to_option()) if guard else w).save()


def test_a_replay_writes_only_what_the_cut_first_attempt_did_not_deliver(spark, bootstrap, tmp_path) -> None:
    topic = f"guard-{uuid.uuid4().hex[:8]}"
    Admin(bootstrap).create_topic(topic, 2)
    checkpoint = Checkpoint(str(tmp_path / "ck"))
    client = {"bootstrap.servers": bootstrap}
    batch = spark.createDataFrame(rows(topic, "p", 400, sourced=300), SCHEMA).repartition(3, "id")
    batch.cache().count()  # the same rows in the same tasks for both attempts, as a replayed batch has

    write(spark.createDataFrame(rows(topic, "p", 40, sourced=40, first=1000), SCHEMA), bootstrap, None)  # batch 6
    first = begin(checkpoint, "p", 7, [topic], client, 30)
    assert not first.replay and sum(first.marks[topic].values()) == 40
    write(batch.where(F.col("id") % 3 != 0), bootstrap, first)  # the first attempt, cut short
    # Another processor writes rows equal to some of the missing ones: they are not this batch's
    write(spark.createDataFrame(rows(topic, "q", 30, sourced=30), SCHEMA), bootstrap, None)

    again = begin(checkpoint, "p", 7, [topic], client, 30)
    assert again.replay and again.marks == first.marks
    write(batch, bootstrap, again)
    delivered_first = batch.where(F.col("id") % 3 != 0).count()
    assert skipped(again.reports) == delivered_first

    got = Counter()
    for m in consume_all(bootstrap, topic):
        hs = dict(m.headers())
        if hs["weir.processor"] == b"p":
            got[(hs.get("weir.source"), m.key(), m.value())] += 1
    batch_rows = rows(topic, "p", 400, sourced=300)
    # Rows without a source carry their task; one row each, whichever task it was
    assert sum(got.values()) == 40 + 400
    assert all(n == 1 for (src, _, _), n in got.items() if src is not None)
    assert sum(n for (src, _, _), n in got.items() if src is None) == 100
    assert {s for (s, _, _) in got if s} == {f"in/{i % 2}/{i}".encode() for i in range(1000, 1040)} | {
        f"in/{r[0] % 2}/{r[0]}".encode() for r in batch_rows if r[0] < 300
    }

    after = begin(checkpoint, "p", 8, [topic], client, 30)
    assert not after.replay and sum(after.marks[topic].values()) == 40 + 400 + 30
    assert not (tmp_path / "ck" / "weir" / "marks" / "7.json").exists()


def by_topic(bootstrap: str, *topics: str) -> Counter:
    got = Counter()
    for t in topics:
        for m in consume_all(bootstrap, t):
            hs = dict(m.headers())
            got[(t, hs.get("weir.source"), m.key(), m.value())] += 1
    return got


def test_a_rows_copy_in_another_topic_is_not_taken_for_a_delivered_one(spark, bootstrap, tmp_path) -> None:
    # One input record's row goes to two topics; the first attempt delivered the copy to `b` only. Known without
    # its topic, the replay would skip the copy to `a` (lost) and write `b`'s again (twice).
    a, b = f"guard-a-{uuid.uuid4().hex[:8]}", f"guard-b-{uuid.uuid4().hex[:8]}"
    for t in (a, b):
        Admin(bootstrap).create_topic(t, 1)
    checkpoint, client = Checkpoint(str(tmp_path / "ck")), {"bootstrap.servers": bootstrap}
    hs = [("weir.processor", b"p"), ("weir.source", b"in/0/7")]
    batch = spark.createDataFrame([(0, a, b"k", b"v", hs), (1, b, b"k", b"v", hs)], SCHEMA).coalesce(1)
    first = begin(checkpoint, "p", 3, [a, b], client, 30)
    write(batch.where(F.col("topic") == b), bootstrap, first)  # the first attempt, cut after b's copy
    again = begin(checkpoint, "p", 3, [a, b], client, 30)
    write(batch, bootstrap, again)  # a's copy first: it must not use up b's delivered one
    assert skipped(again.reports) == 1
    assert by_topic(bootstrap, a, b) == Counter({(a, b"in/0/7", b"k", b"v"): 1, (b, b"in/0/7", b"k", b"v"): 1})


def test_a_windows_row_equal_to_one_of_the_batch_before_is_written(spark, bootstrap, tmp_path) -> None:
    # Rows without an input record (a window's results) are known by batch and task: with a mark below the
    # true end, batch 7's read-back sees batch 6's equal rows of the same task, which are not batch 7's.
    topic = f"guard-{uuid.uuid4().hex[:8]}"
    Admin(bootstrap).create_topic(topic, 1)
    checkpoint, client = Checkpoint(str(tmp_path / "ck")), {"bootstrap.servers": bootstrap}
    windows = spark.createDataFrame(rows(topic, "p", 20, sourced=0), SCHEMA).coalesce(1)
    write(windows, bootstrap, begin(checkpoint, "p", 6, [topic], client, 30))
    begin(checkpoint, "p", 7, [topic], client, 30)
    marks = tmp_path / "ck" / "weir" / "marks" / "7.json"
    doctored = json.loads(marks.read_text())
    doctored["marks"] = {topic: {"0": 0}}  # below the true end (20): batch 6's records are past it
    marks.write_text(json.dumps(doctored))
    again = begin(checkpoint, "p", 7, [topic], client, 30)
    assert again.replay
    write(windows, bootstrap, again)  # nothing of batch 7 was delivered: all 20 are written
    assert skipped(again.reports) == 0
    assert sum(by_topic(bootstrap, topic).values()) == 40


def test_another_pipelines_processor_of_the_same_name_is_another_writer(spark, bootstrap, tmp_path) -> None:
    topic = f"guard-{uuid.uuid4().hex[:8]}"
    Admin(bootstrap).create_topic(topic, 1)
    checkpoint, client = Checkpoint(str(tmp_path / "ck")), {"bootstrap.servers": bootstrap}
    mine = spark.createDataFrame(rows(topic, "p", 30, sourced=20, pipeline="shop"), SCHEMA).coalesce(1)
    first = begin(checkpoint, "p", 2, [topic], client, 30, pipeline="shop")
    write(mine.where(F.col("id") < 10), bootstrap, first)  # cut after 10 rows
    # Pipeline iot's processor p writes rows equal to all of shop's meanwhile: they are not shop's
    write(spark.createDataFrame(rows(topic, "p", 30, sourced=20, pipeline="iot"), SCHEMA), bootstrap, None)
    again = begin(checkpoint, "p", 2, [topic], client, 30, pipeline="shop")
    write(mine, bootstrap, again)
    assert skipped(again.reports) == 10
    shop = Counter()
    for m in consume_all(bootstrap, topic):
        hs = dict(m.headers())
        if hs["weir.pipeline"] == b"shop":
            shop[(hs.get("weir.source"), m.key(), m.value())] += 1
    assert sum(shop.values()) == 30 and all(n == 1 for (src, _, _), n in shop.items() if src is not None)
