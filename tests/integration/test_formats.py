"""Avro, Protobuf and JSON Schema topics end to end (docs/formats.md, whose example pipeline and schema files this
test runs): records written by confluent-kafka's own Avro serializer read by a processor, written as Protobuf
and read by the next one, written as JSON Schema; every record once, bad ones dead-lettered with their reason;
the lake and `weir sql` over the decoded columns; a schema evolved in the registry read under the newer one;
a schema the registry refuses stopping the start with its answer."""

from __future__ import annotations

import importlib
import json
import sys
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
