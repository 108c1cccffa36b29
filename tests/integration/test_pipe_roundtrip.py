"""Round trips through the weir-kafka sink and source: what goes in comes out, byte for byte."""

from __future__ import annotations

import datetime as dt

import pytest
from _pipe import Rec, header_tuples, produce, row_to_rec, sort_key, source, unique
from pyspark.sql import functions as F

from weir.kafka import Admin

pytestmark = pytest.mark.integration

N = 2000
PARTITIONS = 3
BASE_MS = 1_700_000_000_123  # a ms-precision instant; Kafka timestamps are milliseconds
SINK_SCHEMA = (
    "key STRING, value BINARY, partition INT, timestamp TIMESTAMP, headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
)
READ_COLUMNS = ["partition", "key", "value", "headers", "unix_millis(timestamp) AS ts_ms"]


def expected_records() -> list[Rec]:
    """Varied on purpose: null keys, binary (non-UTF-8) values, repeated header keys, null and empty header
    values, no headers."""
    out = []
    for i in range(N):
        key = None if i % 10 == 0 else f"k-{i}".encode()
        value = b"\x00\xff" + f"v-{i}".encode() + bytes([i % 256])
        if i % 7 == 0:
            headers = None  # written as an empty array: Kafka has no headers then, and the source says null
        else:
            headers = (("trace", f"t-{i}".encode()), ("bin", bytes([i % 256, 0, 255])), ("trace", b"again"))
            if i % 5 == 0:
                headers += (("maybe", None if i % 2 else b""),)  # null and empty header values
        out.append(Rec(i % PARTITIONS, key, value, headers, BASE_MS + 37 * i))
    return out


def to_spark_rows(records: list[Rec]) -> list[tuple]:
    return [
        (
            None if r.key is None else r.key.decode(),
            r.value,
            r.partition,
            dt.datetime.fromtimestamp(r.timestamp_ms / 1000, tz=dt.UTC),
            [{"key": k, "value": v} for k, v in (r.headers or ())],
        )
        for r in records
    ]


def read_records(df) -> list[Rec]:
    return sorted((row_to_rec(r) for r in df.selectExpr(*READ_COLUMNS).collect()), key=sort_key)


@pytest.fixture(scope="module")
def written(spark, bootstrap) -> tuple[str, list[Rec]]:
    """A 3-partition topic filled by the weir-kafka batch sink from a DataFrame built in Spark."""
    topic = unique("roundtrip")
    Admin(bootstrap).create_topic(topic, partitions=PARTITIONS)
    records = expected_records()
    df = spark.createDataFrame(to_spark_rows(records), SINK_SCHEMA).repartition(2)
    df.write.mode("append").format("weir-kafka").option("kafka.bootstrap.servers", bootstrap).option(
        "topic", topic
    ).save()
    return topic, sorted(records, key=sort_key)


def test_batch_sink_then_batch_source(spark, bootstrap, written) -> None:
    topic, expected = written
    offsets = Admin(bootstrap).offsets(topic)
    assert {p: hi - lo for p, (lo, hi) in offsets.items()} == {0: 667, 1: 667, 2: 666}

    df = source(spark, bootstrap, topic, stream=False)
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
    got = read_records(df)
    assert len(got) == N
    # Each record in the partition its row asked for, with key, value, headers (order and duplicates
    # kept) and timestamp exactly as written.
    assert got == expected

    meta = df.groupBy("topic", "partition").agg(
        F.min("offset").alias("lo"),
        F.max("offset").alias("hi"),
        F.count("*").alias("n"),
        F.collect_set("timestampType").alias("types"),
    )
    by_partition = {r["partition"]: r for r in meta.collect()}
    assert sorted(by_partition) == [0, 1, 2]
    for p, r in by_partition.items():
        assert r["topic"] == topic
        assert (r["lo"], r["hi"] + 1, r["n"]) == (0, offsets[p][1], offsets[p][1])  # dense offsets 0..n-1
        assert r["types"] == [0]  # CreateTime: the timestamps given by the sink


def test_stream_source_reads_what_the_sink_wrote(spark, bootstrap, written, tmp_path) -> None:
    topic, expected = written
    df = source(spark, bootstrap, topic, stream=True, startingOffsets="earliest")
    name = f"roundtrip_{unique('q').replace('-', '_')}"
    query = (
        df.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), f"query did not finish: {query.lastProgress}"
    finally:
        if query.isActive:
            query.stop()
    assert query.exception() is None
    got = read_records(spark.table(name))
    assert got == expected
    offsets = spark.table(name).select("partition", "offset").distinct().count()
    assert offsets == N


def test_batch_copy_without_coordinates_keeps_everything(spark, bootstrap, written) -> None:
    """Rows without source coordinates (no offset column) are written as they are: no weir.source header."""
    topic, expected = written
    copy = unique("copy")
    Admin(bootstrap).create_topic(copy, partitions=PARTITIONS)
    src = source(spark, bootstrap, topic, stream=False).select("key", "value", "partition", "headers", "timestamp")
    src.write.mode("append").format("weir-kafka").option("kafka.bootstrap.servers", bootstrap).option(
        "topic", copy
    ).save()
    got = read_records(source(spark, bootstrap, copy, stream=False))
    assert got == expected


def test_stream_sink_adds_weir_source_header(spark, bootstrap, written, tmp_path) -> None:
    """readStream -> writeStream.format('weir-kafka') with the source's columns as they come: each record
    lands in the destination topic with its key, value, headers and timestamp, plus a `weir.source`
    header naming the topic/partition/offset it was read from."""
    topic, _ = written
    dest = unique("dest")
    Admin(bootstrap).create_topic(dest, partitions=2)
    src = source(spark, bootstrap, topic, stream=True, startingOffsets="earliest")
    query = (
        src.writeStream.format("weir-kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", dest)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), f"query did not finish: {query.lastProgress}"
    finally:
        if query.isActive:
            query.stop()
    assert query.exception() is None
    assert sum(p["numInputRows"] for p in query.recentProgress) == N

    cols = ["partition", "offset", "key", "value", "headers", "unix_millis(timestamp) AS ts_ms"]
    originals = {
        (r["partition"], r["offset"]): r
        for r in source(spark, bootstrap, topic, stream=False).selectExpr(*cols).collect()
    }
    copies = source(spark, bootstrap, dest, stream=False).selectExpr(*cols).collect()
    assert len(copies) == N

    seen = set()
    for c in copies:
        headers = list(header_tuples(c["headers"]))
        assert headers[-1][0] == "weir.source"
        src_topic, p, o = headers[-1][1].decode().rsplit("/", 2)
        assert src_topic == topic
        coords = (int(p), int(o))
        assert coords not in seen, f"{coords} written twice"
        seen.add(coords)
        orig = originals[coords]
        assert c["key"] == orig["key"]
        assert c["value"] == orig["value"]
        assert c["ts_ms"] == orig["ts_ms"]
        orig_headers = list(header_tuples(orig["headers"]) or ())
        assert headers[:-1] == orig_headers
    assert seen == set(originals)
    # The destination partition is not the source's partition column: the source has 3 partitions, the
    # destination 2, and the records of source partition 2 arrived all the same.
    assert {c["partition"] for c in copies} == {0, 1}
    assert sum(1 for p, _ in seen if p == 2) == 666


def test_producer_records_read_back_exactly(spark, bootstrap, topic_name) -> None:
    """Records from a plain Kafka producer (not the sink) with explicit partitions read back unchanged,
    including a null value (tombstone) and LogAppendTime-free CreateTime timestamps."""
    Admin(bootstrap).create_topic(topic_name, partitions=2)
    records = [
        Rec(i % 2, f"p-{i}".encode(), None if i == 5 else f"payload-{i}".encode(), (("h", bytes([i])),), BASE_MS + i)
        for i in range(40)
    ]
    produce(bootstrap, topic_name, records)
    got = read_records(source(spark, bootstrap, topic_name, stream=False))
    assert got == sorted(records, key=sort_key)


def test_batch_read_of_an_empty_topic_is_empty(spark, bootstrap, topic_name) -> None:
    Admin(bootstrap).create_topic(topic_name, 2)
    df = source(spark, bootstrap, topic_name, stream=False, valueFormat="json", valueSchema="x STRING")
    assert df.count() == 0
