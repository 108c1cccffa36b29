"""Bad input to the weir-kafka source and sink: undecodable values become error rows (never dropped), and
mistakes in options, addresses and columns fail fast with a message that says what is wrong."""

from __future__ import annotations

import time

import pytest
from _pipe import Rec, produce, run_available_now, source, unique
from pyspark.errors import StreamingQueryException

from weir.kafka import Admin
from weir.kafka.broker import free_port

pytestmark = pytest.mark.integration

SCHEMA = "id BIGINT NOT NULL, name STRING, score DOUBLE"

GOOD = {
    b"good-1": (b'{"id": 1, "name": "ann", "score": 1.5}', (1, "ann", 1.5)),
    b"good-2": (b'{"name": "bob", "id": 2, "extra": [1, 2]}', (2, "bob", None)),  # unknown fields ignored
    b"good-3": (b'{\n  "id": 3,\n  "name": "pretty"\n}', (3, "pretty", None)),  # newlines inside a value
    b"good-4": ('{"id": 4, "name": "zoë ✓"}'.encode(), (4, "zoë ✓", None)),
}
BAD = {
    b"malformed": b'{"id": 10, "name": ',
    b"not-utf8": b'{"id": 11, "name": "\xff\xfe"}',
    b"missing-required": b'{"name": "no id", "score": 2.0}',
    b"null-required": b'{"id": null, "name": "null id"}',
    b"empty": b"",
    b"wrong-type": b'{"id": "twelve", "name": "x"}',
    b"wrong-type-float": b'{"id": 13.5, "name": "x"}',
    b"not-an-object": b"[1, 2, 3]",
    b"two-documents": b'{"id": 14}{"id": 15}',
}
# A tombstone is a delete, not a bad record: null fields and no error, even though `id` is NOT NULL.
TOMBSTONE = b"tombstone"


@pytest.fixture(scope="module")
def bad_topic(bootstrap) -> str:
    """One partition; good and bad records interleaved so decoding has to split batches."""
    topic = unique("bad")
    Admin(bootstrap).create_topic(topic, partitions=1)
    goods, bads = list(GOOD.items()), list(BAD.items())
    records = []
    for i in range(max(len(goods), len(bads))):
        if i < len(goods):
            records.append(Rec(0, goods[i][0], goods[i][1][0]))
        if i < len(bads):
            records.append(Rec(0, bads[i][0], bads[i][1]))
    records.append(Rec(0, TOMBSTONE, None))
    produce(bootstrap, topic, records)
    assert Admin(bootstrap).offsets(topic) == {0: (0, len(GOOD) + len(BAD) + 1)}
    return topic


def check_decoded(rows) -> None:
    by_key = {bytes(r["key"]): r for r in rows}
    assert len(rows) == len(GOOD) + len(BAD) + 1  # nothing dropped
    assert set(by_key) == set(GOOD) | set(BAD) | {TOMBSTONE}
    tomb = by_key[TOMBSTONE]
    assert (tomb["value"], tomb["_error"], tomb["id"], tomb["name"]) == (None, None, None, None)
    for key, (value, fields) in GOOD.items():
        r = by_key[key]
        assert r["_error"] is None, (key, r["_error"])
        assert (r["id"], r["name"], r["score"]) == fields
        assert bytes(r["value"]) == value
    for key, value in BAD.items():
        r = by_key[key]
        assert r["_error"], f"{key!r} decoded without error: {r}"
        assert (r["id"], r["name"], r["score"]) == (None, None, None), key
        # The raw bytes stay, so a dead-letter topic can keep them as they arrived.
        assert (None if r["value"] is None else bytes(r["value"])) == value, key
    assert "UTF-8" in by_key[b"not-utf8"]["_error"]
    assert "empty" in by_key[b"empty"]["_error"]
    assert "id" in by_key[b"missing-required"]["_error"]
    assert "id" in by_key[b"null-required"]["_error"]


def test_json_errors_become_rows_in_batch_reads(spark, bootstrap, bad_topic) -> None:
    df = source(spark, bootstrap, bad_topic, stream=False, valueFormat="json", valueSchema=SCHEMA)
    assert df.columns[-4:] == ["id", "name", "score", "_error"]
    check_decoded(df.collect())


def test_json_errors_become_rows_in_streams(spark, bootstrap, bad_topic, tmp_path) -> None:
    df = source(
        spark, bootstrap, bad_topic, stream=True, startingOffsets="earliest", valueFormat="json", valueSchema=SCHEMA
    )
    got = run_available_now(df, str(tmp_path / "ckpt"))
    check_decoded(got.rows)


def test_unknown_option_lists_valid_options(spark, bootstrap, bad_topic) -> None:
    # Names are case-insensitive: the right name in any case is accepted...
    ok = source(spark, bootstrap, bad_topic, stream=False, STARTINGOFFSETS="earliest", MinPartitions="2")
    assert ok.count() == len(GOOD) + len(BAD) + 1  # the tombstone too
    # ...while a misspelt one is an error that lists the valid ones, not a silently ignored setting.
    for stream in (False, True):
        with pytest.raises(Exception) as info:
            df = source(spark, bootstrap, bad_topic, stream=stream, maxOffsetPerTrigger="10")
            df.collect() if not stream else df.writeStream.format("noop").start().stop()
        message = str(info.value).lower()
        assert "unknown" in message
        assert "maxoffsetpertrigger" in message  # the misspelt name
        assert "maxoffsetspertrigger" in message  # among the valid ones
        assert "startingoffsets" in message

    sink = spark.createDataFrame([("v",)], "value STRING")
    with pytest.raises(Exception) as info:
        sink.write.mode("append").format("weir-kafka").option("kafka.bootstrap.servers", bootstrap).option(
            "topic", bad_topic
        ).option("topics", "oops").save()
    message = str(info.value).lower()
    assert "unknown" in message and "topics" in message
    assert "checkpointlocation" in message


def test_unreachable_broker_fails_fast_naming_it(spark, tmp_path) -> None:
    """Nothing listens on the port: batch and stream reads fail with the address in the message, in bounded
    time: the broker-unavailable limit (5 s here; without it, one request's 30 s). The stream runs concurrently with
    the batch read to keep the test short."""
    address = f"127.0.0.1:{free_port()}"
    limit = {"kafka.bootstrap.servers": address, "subscribe": "nowhere", "brokerUnavailableTimeoutMs": "5000"}
    started = time.monotonic()
    stream = (
        spark.readStream.format("weir-kafka")
        .options(**limit)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .start()
    )
    try:
        with pytest.raises(Exception) as batch_info:
            spark.read.format("weir-kafka").options(**limit).load().collect()
        batch_elapsed = time.monotonic() - started
        with pytest.raises(StreamingQueryException) as stream_info:
            stream.awaitTermination(max(1.0, 60 - batch_elapsed))
            pytest.fail("the stream was still running after 60 s")
        stream_elapsed = time.monotonic() - started
    finally:
        if stream.isActive:
            stream.stop()
    # the limit and a query's start: a read that ignored it would wait a request's 30 s
    assert batch_elapsed < 25, batch_elapsed
    assert stream_elapsed < 25, stream_elapsed
    for message in (str(batch_info.value), str(stream_info.value)):
        assert address in message
        assert "cannot" in message.lower()


def test_sink_rejects_unexpected_column(spark, bootstrap, topic_name) -> None:
    Admin(bootstrap).create_topic(topic_name, partitions=1)
    df = spark.createDataFrame([("k", "v", 7)], "key STRING, value STRING, amount INT")
    with pytest.raises(Exception) as info:
        df.write.mode("append").format("weir-kafka").option("kafka.bootstrap.servers", bootstrap).option(
            "topic", topic_name
        ).save()
    message = str(info.value)
    assert "unexpected column" in message
    assert "amount" in message
    assert "to_json" in message  # says how to fix it
    assert Admin(bootstrap).offsets(topic_name) == {0: (0, 0)}  # nothing was written

    no_value = spark.createDataFrame([("k",)], "key STRING")
    with pytest.raises(Exception, match="needs a 'value' column"):
        no_value.write.mode("append").format("weir-kafka").option("kafka.bootstrap.servers", bootstrap).option(
            "topic", topic_name
        ).save()
    assert Admin(bootstrap).offsets(topic_name) == {0: (0, 0)}


# A value that is a bare JSON literal (`null`, not a tombstone) is an error row. pyarrow 26 crashes on a
# block that starts with `null`, so this guards the decoder's pre-check, alone and first in a block.
def test_json_null_literal_is_an_error_row(spark, bootstrap, topic_name) -> None:
    Admin(bootstrap).create_topic(topic_name, partitions=1)
    produce(
        bootstrap,
        topic_name,
        [Rec(0, b"null-first", b"null"), Rec(0, b"good", b'{"id": 1}'), Rec(0, b"null-spaced", b" null ")],
    )
    rows = source(spark, bootstrap, topic_name, stream=False, valueFormat="json", valueSchema=SCHEMA).collect()
    by_key = {bytes(r["key"]): r for r in rows}
    assert len(rows) == 3
    assert (by_key[b"good"]["id"], by_key[b"good"]["_error"]) == (1, None)
    for key, value in ((b"null-first", b"null"), (b"null-spaced", b" null ")):
        assert by_key[key]["_error"], key  # `id` is NOT NULL, and a JSON null has no fields
        assert bytes(by_key[key]["value"]) == value
        assert by_key[key]["id"] is None
