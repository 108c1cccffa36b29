"""A read through Spark's own Kafka connector (weir.kafka.connector) has the rows and columns a weir-kafka read of
the same topic has: Spark's Kafka columns, then the decoded value fields and `_error`, decoded by weir's decoders
in the read's tasks (a bad record keeps its reason, a tombstone decodes to nulls without one); batch and stream
alike. On Apache Kafka, with the connector's jars from the cache (weir jars fetch)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from _pipe import Rec, produce, run_available_now, source, unique

from weir.formats import FormatSpec, value_format
from weir.kafka import Admin, connector
from weir.kafka.options import OptionError

pytestmark = pytest.mark.integration
ORDER = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "long"}, {"name": "sku", "type": "string"}],
}


def records() -> list[Rec]:
    good = [Rec(i % 2, f"k{i}".encode(), json.dumps({"id": i, "sku": f"s{i}"}).encode(), (("h", b"v"),))
            for i in range(40)]  # fmt: skip
    return [*good, Rec(0, b"bad", b"{not json"), Rec(1, b"gone", None), Rec(1, b"missing", b'{"sku": "x"}')]


def rows(df) -> list[dict]:
    return sorted((r.asDict(recursive=True) for r in df.collect()), key=lambda r: (r["partition"], r["offset"]))


def both(spark, bootstrap: str, topic: str, stream: bool, tmp_path, **options: str) -> tuple[list, list]:
    options = {"startingOffsets": "earliest", **options}
    ours = source(spark, bootstrap, topic, stream=stream, **options)
    reader = spark.readStream if stream else spark.read
    theirs = connector.read(reader, {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, **options}, stream)
    assert theirs.schema == ours.schema
    if not stream:
        return rows(ours), rows(theirs)
    got = [run_available_now(df, str(tmp_path / name)).rows for name, df in (("ours", ours), ("theirs", theirs))]
    order = lambda rs: sorted((r.asDict(recursive=True) for r in rs), key=lambda r: (r["partition"], r["offset"]))  # noqa: E731
    return order(got[0]), order(got[1])


@pytest.mark.parametrize("stream", [False, True], ids=["batch", "stream"])
def test_json_through_the_connector_reads_as_weir_kafka_does(spark, kafka, tmp_path, stream):
    topic = unique("conn")
    Admin(kafka.bootstrap).create_topic(topic, 2)
    produce(kafka.bootstrap, topic, records())
    ours, theirs = both(spark, kafka.bootstrap, topic, stream, tmp_path, valueFormat="json",
                        valueSchema="id BIGINT NOT NULL, sku STRING")  # fmt: skip
    assert len(theirs) == 43 and theirs == ours
    errors = {r["key"]: r["_error"] for r in theirs if r["_error"] is not None}
    assert set(errors) == {b"bad", b"missing"} and "id" in errors[b"missing"]
    gone = next(r for r in theirs if r["key"] == b"gone")
    assert gone["value"] is None and gone["id"] is None and gone["_error"] is None
    assert next(r for r in theirs if r["key"] == b"k3")["headers"] == [{"key": "h", "value": b"v"}]


def test_avro_through_the_connector_reads_as_weir_kafka_does(spark, kafka, tmp_path):
    topic = unique("conn-avro")
    Admin(kafka.bootstrap).create_topic(topic, 1)
    spec = FormatSpec("avro", json.dumps(ORDER), registry=False)
    fmt = value_format(spec, topic, {})
    values = fmt.encoder(None).encode(pa.array([{"id": i, "sku": f"s{i}"} for i in range(20)],
                                               pa.struct([("id", pa.int64()), ("sku", pa.string())])))  # fmt: skip
    produce(kafka.bootstrap, topic, [*(Rec(0, b"k", v) for v in values.to_pylist()), Rec(0, b"k", b"\x01")])
    ours, theirs = both(spark, kafka.bootstrap, topic, False, tmp_path, valueFormat="avro",
                        valueFormatSpec=spec.to_option())  # fmt: skip
    assert theirs == ours and [r["id"] for r in theirs[:20]] == list(range(20))
    assert theirs[20]["_error"] is not None


def test_what_the_connector_cannot_do_is_refused_naming_it(spark, kafka):
    options = {"kafka.bootstrap.servers": kafka.bootstrap, "subscribe": "t", "lake": "/tmp/lake"}
    with pytest.raises(OptionError, match="needs weir-kafka's own reader: the lake fallback"):
        connector.read(spark.readStream, options, True)


def test_json_decoded_in_the_jvm_keeps_weirs_rules_around_sparks_parser(spark, kafka):
    """A real-time processor's decoding (connector.decoded_in_jvm, docs/realtime.md): weir-kafka's columns, weir's
    rules for tombstones, non-objects and NOT NULL fields, Spark's parser for what fits the schema."""
    topic = unique("jvm")
    Admin(kafka.bootstrap).create_topic(topic, 1)
    values = {
        b"good": b'{"id": 1, "sku": "a", "extra": [1, 2]}', b"gone": None, b"empty": b"  ", b"array": b"[1, 2]",
        b"text": b"not json", b"cut": b'{"id": 2, "sku"', b"wrong": b'{"id": "two", "sku": "b"}',
        b"missing": b'{"sku": "c"}', b"number": b'{"id": 3, "sku": 7}',
    }  # fmt: skip
    produce(kafka.bootstrap, topic, [Rec(0, k, v) for k, v in values.items()])
    options = {"kafka.bootstrap.servers": kafka.bootstrap, "subscribe": topic, "startingOffsets": "earliest",
               "valueFormat": "json", "valueSchema": "id BIGINT NOT NULL, sku STRING"}  # fmt: skip
    jvm = connector.read(spark.read, options, False, in_jvm=True)
    assert jvm.schema == connector.read(spark.read, options, False).schema
    got = {r["key"]: (r["id"], r["sku"], r["_error"]) for r in jvm.collect()}
    assert got == {
        b"good": (1, "a", None),
        b"gone": (None, None, None),  # a tombstone: a delete, not a bad record
        b"empty": (None, None, "the value is empty"),
        b"array": (None, None, "the value is not a JSON object"),
        b"text": (None, None, "the value is not a JSON object"),
        b"cut": (None, None, "the value does not fit valueSchema (Spark's JSON parser)"),
        b"wrong": (None, None, "the value does not fit valueSchema (Spark's JSON parser)"),
        b"missing": (None, None, "required field 'id' is missing or null"),
        b"number": (3, "7", None),  # Spark's parser takes a number for a STRING field as its text
    }
    avro = {**options, "valueFormat": "avro", "valueFormatSpec": FormatSpec("avro", json.dumps(ORDER)).to_option()}
    del avro["valueSchema"]
    with pytest.raises(OptionError, match="avro values are decoded by weir's own decoders"):
        connector.read(spark.read, avro, False, in_jvm=True)
