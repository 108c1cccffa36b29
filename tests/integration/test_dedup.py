"""Deduplication (weir.blocks.dedup): replays of a record are "duplicate", first sightings "out", a key comes
back after its horizon, state expires with the watermark (also across a restart), and every micro-batch's input
rows are accounted for."""

from __future__ import annotations

import json

import pytest
from _pipe import Rec, produce, source
from pyspark.sql import functions as F
from test_window import check_accounting, run_routed

from weir.blocks import deduping
from weir.blocks.common import bucket_count
from weir.blocks.dedup import deduplicate
from weir.kafka import Admin
from weir.pipeline.routes import DLQ, DUPLICATE, LATE, OUT

pytestmark = pytest.mark.integration

BASE_MS = 1_700_000_000_000
HORIZON, DELAY = "10 seconds", "2 seconds"
PER_TRIGGER = 4
EVENTS = "id STRING, ts_ms BIGINT, n BIGINT"
BIG = 2**62 + 1

# (id, event time in s or None), four records a micro-batch on one partition, and the route each must take. The
# watermark of a batch is the latest event time of the batches before it minus 2 s (0 before any data).
RUN_1 = [
    # batch 0, watermark 0
    ("a", 0, OUT),
    ("b", 1, OUT),
    ("a", 0, DUPLICATE),  # a replay within the batch: the earlier offset wins
    ("c", 2, OUT),
    # batch 1, watermark 0
    ("b", 1, DUPLICATE),  # a replay from the batch before
    ("d", 20, OUT),
    ("a", 5, DUPLICATE),  # within 10 s of a's last sighting (0 s); a is now last seen at 5 s
    ("e", 3, OUT),
    # batch 2, watermark 18 s: it clears a (5 + 10 <= 18), b, c and e once the batch's rows are processed
    ("a", 0, LATE),  # a replay after the state expired is behind the watermark: never "out" twice
    ("c", 2, LATE),
    ("f", 19, OUT),
    ("d", 20, DUPLICATE),
]
RUN_2 = [
    # batch 3, watermark 18 s (restored from the checkpoint)
    ("a", 25, OUT),  # a's state expired: a comes back
    ("d", 31, OUT),  # d's state lives (20 + 10 > 18) but 31 s is its horizon or more after 20 s
    ("g", None, LATE),  # no event time
    (None, 22, DLQ),  # no key: it cannot be checked
    # batch 4, watermark 29 s: it clears f (19 + 10 <= 29)
    ("bad", None, DLQ),  # not JSON
    ("d", 31, DUPLICATE),
    ("h", 40, OUT),
    ("f", 19, LATE),
    # then a batch without data, watermark 38 s: it clears a (25 + 10 <= 38); d (31 + 10) and h stay
]


def records(log: list[tuple], first_offset: int = 0) -> list[Rec]:
    out = []
    for i, (rid, s, _) in enumerate(log, first_offset):
        value = {"id": rid, "ts_ms": None if s is None else BASE_MS + s * 1000, "n": BIG + i}
        out.append(Rec(0, None, b"not json" if rid == "bad" else json.dumps(value).encode(), None, BASE_MS))
    return out


def stream(spark, bootstrap: str, topic: str):
    return source(
        spark,
        bootstrap,
        topic,
        stream=True,
        startingOffsets="earliest",
        valueFormat="json",
        valueSchema=EVENTS,
        maxOffsetsPerTrigger=PER_TRIGGER,
    ).withColumn("event_time", F.timestamp_millis("ts_ms"))


def test_replays_are_duplicates_and_keys_come_back_after_the_horizon(spark, bootstrap, topic_name, tmp_path) -> None:
    Admin(bootstrap).create_topic(topic_name, partitions=1)
    checkpoint = str(tmp_path / "ckpt")
    produce(bootstrap, topic_name, records(RUN_1))
    events = stream(spark, bootstrap, topic_name)

    unique = deduplicate(events, "id", "event_time", HORIZON, DELAY)

    assert unique.columns == [*[c for c in events.columns if c != "_error"], "_route", "_absorbed", "_error"]
    assert [f.dataType for f in unique.schema.fields[:-3]] == [f.dataType for f in events.schema if f.name != "_error"]
    first = run_routed(unique, checkpoint)
    check_accounting(first)
    assert [p["numInputRows"] for p in first.progress] == [4, 4, 4]

    produce(bootstrap, topic_name, records(RUN_2, len(RUN_1)))
    second = run_routed(
        deduplicate(stream(spark, bootstrap, topic_name), "id", "event_time", HORIZON, DELAY), checkpoint
    )
    check_accounting(second)
    assert [p["numInputRows"] for p in second.progress] == [4, 4, 0]
    assert all(p["stateOperators"][0]["numRowsDroppedByWatermark"] == 0 for p in first.progress + second.progress)

    log = RUN_1 + RUN_2
    rows = sorted(first.rows + second.rows, key=lambda r: r.offset)
    assert [r.offset for r in rows] == list(range(len(log)))  # one row per record
    assert [r._route for r in rows] == [route for _, _, route in log]
    recs = records(log)
    for r, (rid, s, _) in zip(rows, log, strict=True):
        # Every column passes through untouched: the raw record, the event time, BIGINTs beyond float64.
        assert (r.topic, r.partition, bytes(r.value)) == (topic_name, 0, recs[r.offset].value)
        assert r._absorbed is None
        if rid != "bad":
            assert (r.id, r.n) == (rid, BIG + r.offset)
            event_ms = None if r.event_time is None else round(r.event_time.timestamp() * 1000)
            assert event_ms == (None if s is None else BASE_MS + s * 1000)
    assert rows[15]._error == "deduplicate: key id is null"
    assert rows[16]._error and rows[16].id is None

    # The state holds only the keys whose horizon the watermark has not passed: d (last seen 31 s) and h.
    # Per bucket of keys, one value: the keys and their last sightings.
    state = spark.read.format("statestore").option("stateVarName", "bucket").load(checkpoint).collect()
    kept = {k: last for r in state for k, last in deduping.loads(bytes(r.value.keys)).itertuples(index=False)}
    assert kept == {"d": (BASE_MS + 31_000) * 1000, "h": (BASE_MS + 40_000) * 1000}
    assert all(r.value.shape == f"buckets={bucket_count(spark.range(1))}" for r in state)


def test_a_checkpoint_refuses_another_number_of_buckets(spark, bootstrap, topic_name, tmp_path) -> None:
    """The state records its number of buckets: a query hashing keys into another number fails, naming both,
    instead of missing the keys' earlier sightings."""
    Admin(bootstrap).create_topic(topic_name, partitions=1)
    checkpoint = str(tmp_path / "ckpt")
    produce(bootstrap, topic_name, records([("a", 0, OUT)]))
    run_routed(deduplicate(stream(spark, bootstrap, topic_name), "id", "event_time", HORIZON, DELAY), checkpoint)
    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", str(int(partitions) * 4))
    try:
        # Every bucket is read again: "a" lands in some bucket, and the old one's timer is not due yet.
        produce(bootstrap, topic_name, records([(f"k{i}", 1, OUT) for i in range(64)], 1))
        with pytest.raises(Exception, match=r"deduplicate: the checkpoint's state was built as \[buckets=\d+\]"):
            run_routed(
                deduplicate(stream(spark, bootstrap, topic_name), "id", "event_time", HORIZON, DELAY), checkpoint
            )
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", partitions)


def test_invalid_dedup_arguments_raise_value_error(spark, bootstrap, topic_name) -> None:
    events = stream(spark, bootstrap, topic_name)
    cases = [
        ({"key": "uid"}, "deduplicate: key column 'uid'"),
        ({"event_time": "ts_ms"}, "is bigint, not timestamp"),
        ({"horizon": "a while"}, "is not a duration"),
    ]
    for kwargs, message in cases:
        args = {"key": "id", "event_time": "event_time", "horizon": HORIZON, "watermark": DELAY}
        with pytest.raises(ValueError, match=message):
            deduplicate(events, **{**args, **kwargs})
    with pytest.raises(ValueError, match=r"lacks the Kafka column\(s\) offset"):
        deduplicate(events.drop("offset"), "id", "event_time", HORIZON, DELAY)
    with pytest.raises(ValueError, match=r"\['_route'\] collide"):
        deduplicate(events.withColumn("_route", F.lit("x")), "id", "event_time", HORIZON, DELAY)
