"""A processor's rewritten batch adds nothing to its topics (weir.kafka.replay): a first write cut short, then
the batch's replay, leave each row in the topic once; what the replay skipped is reported; rows another
processor wrote are not taken for delivered ones; the next batch starts fresh."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from _pipe import consume_all
from pyspark.sql import functions as F

from weir.kafka import Admin
from weir.kafka.replay import Guard, begin, skipped

pytestmark = pytest.mark.integration
SCHEMA = "id BIGINT, topic STRING, key BINARY, value BINARY, headers ARRAY<STRUCT<key: STRING, value: BINARY>>"


def rows(topic: str, processor: str, n: int, sourced: int, first: int = 0) -> list[tuple]:
    """`sourced` rows from input records (weir.source), the rest without one, as a window's results."""
    out = []
    for i in range(first, first + n):
        hs = [("weir.processor", processor.encode())]
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
    checkpoint = str(tmp_path / "ck")
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
