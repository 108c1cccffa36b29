"""Avro, Protobuf and JSON Schema topics end to end (docs/formats.md, whose example pipeline and schema files this
test runs): records written by confluent-kafka's own Avro serializer read by a processor, written as Protobuf
and read by the next one, written as JSON Schema; every record once, bad ones dead-lettered with their reason;
the lake and `weir sql` over the decoded columns; a schema evolved in the registry read under the newer one;
a schema the registry refuses stopping the start with its answer."""

from __future__ import annotations

import importlib
import json
import os
import sys
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from tests._docs import blocks
from weir.pipeline import DeclarationError, Pipeline
from weir.query import run as sql
from weir.testing import assert_rows

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 11, 28, 9, 0, tzinfo=UTC)


@pytest.fixture
def registry(schema_registry, monkeypatch):
    """The test registry's URL in the settings every part of weir reads."""
    monkeypatch.setenv("WEIR_SCHEMA_REGISTRY_URL", schema_registry)
    return SchemaRegistryClient({"url": schema_registry})


@pytest.fixture
def page(tmp_path, monkeypatch):
    """docs/formats.md's files (the pipeline and its schemas) in a directory of their own, the pipeline imported."""
    for block in blocks(REPO / "docs" / "formats.md"):
        if block.file:
            (tmp_path / block.file).write_text(block.body)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("formats_shop", None)
    return importlib.import_module("formats_shop"), tmp_path


def order(i: int, tier: str | None) -> dict:
    return {"order_id": f"o{i}", "amount": float(i * 10), "customer": {"id": f"c{i % 3}", "tier": tier},
            "placed": T0}  # fmt: skip


def avro_values(registry: SchemaRegistryClient, subject: str, schema: str, rows: list[dict]) -> list[bytes]:
    """Values as confluent-kafka's own Avro serializer writes them (registering `schema` under `subject`)."""
    serializer = AvroSerializer(registry, schema, conf={"subject.name.strategy": lambda *_: subject})
    return [serializer(r, SerializationContext("orders", MessageField.VALUE)) for r in rows]


def test_the_pages_pipeline_reads_and_writes_each_format(page, registry, pipeline_test):
    module, where = page
    t = pipeline_test(module.shop)
    schema = (where / "order.avsc").read_text()
    good = [order(i, "gold" if i % 2 else None) for i in range(1, 21)]
    values = avro_values(registry, f"{t.topic('orders')}-value", schema, good)
    bad = [b'{"order_id": "j1"}', b"\x00\x00\x0f\x42\x40garbage"]  # JSON, not Avro; an id the registry lacks
    t.send("orders", values + bad, keys=[r["order_id"] for r in good] + [None, None])
    t.run_once()

    big = [r for r in good if r["amount"] >= 100]
    assert_rows(t.read("orders.big"), [{"order_id": r["order_id"], "amount": r["amount"],
                                        "tier": r["customer"]["tier"]} for r in big])  # fmt: skip
    gold = [r for r in big if r["customer"]["tier"] == "gold"]
    assert_rows(t.read("orders.flagged"), [{"order_id": r["order_id"], "reason": f"gold, {r['amount']}"}
                                           for r in gold])  # fmt: skip
    letters = sorted((d.value, d.error) for d in t.dead_letters("orders"))
    assert [v for v, _ in letters] == sorted(bad)
    assert all(e for _, e in letters), letters  # each with its reason
    books = t.accounting("big_orders")
    assert (books.in_, books.out, books.dlq, books.balanced) == (22, len(big), 2, True)
    # The outputs are framed for the registry: a schema id the registry knows, under the topic's subject.
    (raw, *_) = t.records("orders.big")
    assert raw.value[0] == 0 and registry.get_schema(int.from_bytes(raw.value[1:5], "big")).schema_type == "PROTOBUF"
    assert registry.get_latest_version(f"{t.topic('orders.big')}-value").schema.schema_type == "PROTOBUF"
    key = registry.get_latest_version(f"{t.topic('orders.big')}-key")  # keys too: the OrderKey message, framed
    assert "message OrderKey" in key.schema.schema_str and raw.key[:5] == b"\x00" + key.schema_id.to_bytes(4, "big")

    # The lake (the archiver kept the decoded columns) and the broker's tail (three records not archived yet,
    # decoded by the query) read as one table by weir sql.
    late = [order(i, "silver") for i in range(21, 24)]
    t.send("orders", avro_values(registry, f"{t.topic('orders')}-value", schema, late))
    answer = sql(
        f'SELECT count(*) AS n, count(_error) AS bad, sum(amount) AS total, count(customer.tier) AS tiers '
        f'FROM "{t.topic("orders")}"',
        t.settings, pipeline=t.pipeline,
    )  # fmt: skip
    row = answer.table.to_pylist()[0]
    assert row == {"n": 25, "bad": 2, "total": sum(r["amount"] for r in good + late), "tiers": 13}
    (prov,) = answer.provenance
    assert (prov.lake_rows, prov.tail_rows, prov.undecodable) == (22, 3, 2)


def test_an_evolved_schema_reads_old_and_new_records(registry, pipeline_test, tmp_path):
    subject = f"evolve-{uuid.uuid4().hex[:8]}-value"
    v1 = {"type": "record", "name": "Reading", "fields": [{"name": "id", "type": "string"},
                                                          {"name": "temp", "type": "double"}]}  # fmt: skip
    v2 = {**v1, "fields": [*v1["fields"], {"name": "unit", "type": "string", "default": "C"}]}

    def declared() -> Pipeline:
        import weir

        p = Pipeline("evolve")
        p.topic("readings", format=weir.avro(registry=True, subject=subject))
        return p

    old = avro_values(registry, subject, json.dumps(v1), [{"id": "a", "temp": 20.5}])
    before = pipeline_test(declared(), isolate=False)  # the reader's schema: v1, the latest when it starts
    assert "unit" not in before.pipeline.topics["readings"].schema
    new = avro_values(registry, subject, json.dumps(v2), [{"id": "b", "temp": 70.0, "unit": "F"}])
    t = pipeline_test(declared())
    assert "unit STRING NOT NULL" in t.pipeline.topics[t.topic("readings")].schema
    t.send("readings", old + new)
    assert_rows(t.read("readings"), [{"id": "a", "temp": 20.5, "unit": "C"}, {"id": "b", "temp": 70.0, "unit": "F"}])


def test_a_schema_the_registry_refuses_stops_the_start(registry, pipeline_test, tmp_path):
    import weir

    first = {"type": "record", "name": "Total", "fields": [{"name": "n", "type": "long"}]}
    second = {**first, "fields": [*first["fields"], {"name": "region", "type": "string"}]}  # no default
    (tmp_path / "total.avsc").write_text(json.dumps(second))
    p = Pipeline("refused")
    src = p.topic("numbers", "n BIGINT")
    out = p.topic("totals", format=weir.avro(str(tmp_path / "total.avsc"), registry=True))

    @p.processor(inputs=[src], outputs=[out])
    def totals(df):
        return df.selectExpr("n", "'eu' AS region")

    t = pipeline_test(p, max_restarts=0)
    registry.register_schema(f"{t.topic('totals')}-value", Schema(json.dumps(first), "AVRO"))
    t.send("numbers", [{"n": 1}])
    with pytest.raises(Exception, match=r"409") as failed:
        t.run_once()
    assert f"{t.topic('totals')}-value" in str(failed.value)
    assert t.records("totals") == []


def test_a_registry_only_topic_without_a_registry_is_refused_by_name(monkeypatch):
    import weir

    p = Pipeline("nowhere")
    p.topic("events", format=weir.avro(registry=True))
    with pytest.raises(DeclarationError, match=r"topic 'events'.*no registry is set"):
        p.with_schemas({})


def test_an_output_row_its_format_refuses_is_a_dead_letter_with_the_reason(registry, pipeline_test, tmp_path):
    import weir

    given = {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}, "n": {"type": "integer"}}}
    wanted = {"type": "object", "required": ["id"],
              "properties": {"id": {"type": "string"}, "twice": {"type": "integer", "maximum": 100}}}  # fmt: skip
    (tmp_path / "in.json").write_text(json.dumps(given))
    (tmp_path / "out.json").write_text(json.dumps(wanted))
    p = Pipeline("refusals")
    src = p.topic("in", format=weir.json_schema(str(tmp_path / "in.json"), registry=True), key="id")
    out = p.topic("out", format=weir.json_schema(str(tmp_path / "out.json"), registry=True), key="id")

    @p.processor(inputs=[src], outputs=[out])
    def double(df):
        return df.selectExpr("id", "n * 2 AS twice")

    t = pipeline_test(p)
    t.send("in", [{"id": "a", "n": 1}, {"id": "b", "n": 60}, {"id": "c", "n": 2}])
    t.send("in", [b'{"id": "x"}'])  # plain JSON where the registry's framing is expected
    t.run_once()
    assert_rows(t.read("out"), [{"id": "a", "twice": 2}, {"id": "c", "twice": 4}])
    letters = sorted((d.value, d.error) for d in t.dead_letters("in"))
    assert letters == [
        (b'{"id": "x"}', "the value does not start with the schema registry's magic byte 0 (it starts with 123)"),
        (b'{"id":"b","twice":120}',
         f"topic '{t.topic('out')}': a row does not fit its JSON schema: field 'twice': 120 is greater than the "
         "maximum of 100"),
    ]  # fmt: skip
    books = t.accounting("double")
    assert (books.in_, books.out, books.dlq, books.filtered, books.balanced) == (4, 2, 2, 0, True)


def test_a_view_over_an_avro_topic_keeps_its_decoded_columns(pipeline_test, tmp_path):
    import weir

    fields = [{"name": "category", "type": "string"}, {"name": "revenue", "type": ["null", "double"], "default": None}]
    total = {"type": "record", "name": "Total", "fields": fields}
    (tmp_path / "total.avsc").write_text(json.dumps(total))
    p = Pipeline("avro-view")
    totals = p.topic("totals", format=weir.avro(str(tmp_path / "total.avsc")), key="category")
    p.view("revenue", source=totals, key="category")
    t = pipeline_test(p, processors=["view.revenue"])
    t.send("totals", [{"category": "books", "revenue": 5.0}, {"category": "games", "revenue": None}])
    t.send("totals", [b"\x01not avro"])  # a dead letter, not a row
    t.run_once()
    assert t.view("revenue") == [{"category": "books", "revenue": 5.0}, {"category": "games", "revenue": None}]
    assert [d.value for d in t.dead_letters("totals")] == [b"\x01not avro"]


def test_keys_in_a_format_of_their_own_are_read_written_and_delete_a_views_row(registry, pipeline_test, tmp_path):
    import weir

    key = {"type": "record", "name": "DeviceKey", "namespace": "iot", "fields": [{"name": "device", "type": "string"}]}
    (tmp_path / "key.avsc").write_text(json.dumps(key))
    (tmp_path / "hot.proto").write_text('syntax = "proto3";\npackage iot;\n'
                                        "message Hot { string device = 1; double temp = 2; }\n"
                                        "message HotKey { string device = 1; }\n")  # fmt: skip
    proto = str(tmp_path / "hot.proto")
    p = Pipeline("keyed")
    readings = p.topic("readings", "device STRING NOT NULL, temp DOUBLE", key="device",
                       key_format=weir.avro(str(tmp_path / "key.avsc"), registry=True))  # fmt: skip
    hot = p.topic("hot", format=weir.protobuf(proto, message="iot.Hot", registry=True), key="device",
                  key_format=weir.protobuf(proto, message="iot.HotKey", registry=True))  # fmt: skip
    p.view("hot_now", source=hot, key="device")

    @p.processor(inputs=[readings], outputs=[hot])
    def heat(df):
        return df.where("temp > 30").select("device", "temp")

    t = pipeline_test(p)
    # the input's keys as confluent-kafka's own Avro serializer writes them, under <topic>-key
    subject = f"{t.topic('readings')}-key"
    serializer = AvroSerializer(registry, json.dumps(key), conf={"subject.name.strategy": lambda *_: subject})
    where = SerializationContext(t.topic("readings"), MessageField.KEY)
    keys = [serializer({"device": d}, where) for d in ("d1", "d2", "d3")]
    t.send("readings", [{"device": "d1", "temp": 35.0}, {"device": "d2", "temp": 20.0},
                        {"device": "d3", "temp": 40.0}], keys=keys)  # fmt: skip
    t.send("readings", [{"device": "d4", "temp": 50.0}], keys=[b"device-4"])  # text where Avro is expected
    t.run_once()

    assert_rows(t.read("hot"), [{"device": "d1", "temp": 35.0}, {"device": "d3", "temp": 40.0}])
    key_id = registry.get_latest_version(f"{t.topic('hot')}-key").schema_id
    assert {r.key[:5] for r in t.records("hot")} == {b"\x00" + key_id.to_bytes(4, "big")}  # framed, registered
    [letter] = t.dead_letters("readings")
    assert letter.key == b"device-4"
    assert letter.error == (
        "key: the value does not start with the Confluent wire format's zero byte (it starts with 0x64)"
    )
    books = t.accounting("heat")
    assert (books.in_, books.out, books.dlq, books.filtered, books.balanced) == (4, 2, 1, 1, True)
    assert t.view("hot_now") == [{"device": "d1", "temp": 35.0}, {"device": "d3", "temp": 40.0}]

    t.send("hot", [None], keys=["d1"])  # a tombstone: its key in the topic's key format, its fields from the key
    t.run_once()
    assert t.view("hot_now") == [{"device": "d3", "temp": 40.0}]


def test_http_ingest_writes_avro_values_and_keys_confluents_deserializers_read(registry, bootstrap, tmp_path,
                                                                              topic_name):  # fmt: skip
    from _ingest import http_server, read_topic
    from confluent_kafka.schema_registry.avro import AvroDeserializer

    key = {"type": "record", "name": "DeviceKey", "fields": [{"name": "device", "type": "string"}]}
    value = {"type": "record", "name": "Reading", "fields": [{"name": "device", "type": "string"},
                                                             {"name": "temp", "type": "double"}]}  # fmt: skip
    (tmp_path / "key.avsc").write_text(json.dumps(key))
    (tmp_path / "reading.avsc").write_text(json.dumps(value))
    (tmp_path / "keyed_ingest.py").write_text(
        "import weir\n\np = weir.Pipeline('keyed_ingest')\n"
        f"p.topic({topic_name!r}, format=weir.avro('reading.avsc', registry=True), key='device',\n"
        "        key_format=weir.avro('key.avsc', registry=True))\n"
    )  # fmt: skip
    env = {"WEIR_HOME": str(tmp_path / "home"), "WEIR_BOOTSTRAP_SERVERS": bootstrap,
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}  # fmt: skip
    rows = [{"device": "d1", "temp": 20.5}, {"device": "d2", "temp": 30.0}]
    with http_server(["keyed_ingest:p", "--topic", topic_name], env, tmp_path / "http.log") as (_, url):
        body = b"\n".join(json.dumps(r).encode() for r in rows)
        request = urllib.request.Request(f"{url}/topics/{topic_name}", body, {"Content-Type": "application/x-ndjson"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 201, answer.read()
    read = [(m.key(), m.value()) for m in read_topic(bootstrap, topic_name)]
    values, keys = AvroDeserializer(registry), AvroDeserializer(registry)
    got = [(keys(k, SerializationContext(topic_name, MessageField.KEY)),
            values(v, SerializationContext(topic_name, MessageField.VALUE))) for k, v in read]  # fmt: skip
    assert sorted(got, key=lambda kv: kv[0]["device"]) == [({"device": r["device"]}, r) for r in rows]
    assert registry.get_latest_version(f"{topic_name}-key").schema.schema_str == registry.get_schema(
        int.from_bytes(read[0][0][1:5], "big")).schema_str  # fmt: skip
