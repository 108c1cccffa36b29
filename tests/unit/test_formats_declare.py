"""Declaring a topic's format (weir.formats.declare, Pipeline.topic(format=)): specs, subjects, schema files found
beside the declaring module, registry-only topics refused until their schema is read, the source's options."""

from __future__ import annotations

import dataclasses
import json

import pytest

import weir
from weir.formats import FormatError, FormatSpec
from weir.kafka.options import OptionError, parse_source
from weir.pipeline import DeclarationError, Pipeline, problems

ORDER = {
    "type": "record", "name": "Order", "namespace": "shop",
    "fields": [{"name": "order_id", "type": "string"}, {"name": "amount", "type": ["null", "double"]}],
}  # fmt: skip


def test_a_spec_travels_as_one_option_and_names_its_subject():
    spec = FormatSpec("avro", schema=json.dumps(ORDER), registry=True)
    assert FormatSpec.from_option(spec.to_option()) == spec
    assert spec.subject_for("orders") == "orders-value"
    assert dataclasses.replace(spec, role="key").subject_for("orders") == "orders-key"
    assert FormatSpec("avro", registry=True, subject="x").subject_for("orders") == "x"
    assert FormatSpec("avro", registry=True, strategy="record", record="shop.Order").subject_for("o") == "shop.Order"
    with pytest.raises(FormatError, match="record name strategy needs the record's full name"):
        FormatSpec("avro", registry=True, strategy="record").subject_for("orders")
    with pytest.raises(FormatError, match="not a format spec"):
        FormatSpec.from_option('{"kind": "avro", "colour": "red"}')


def test_a_format_needs_a_file_or_a_registry_and_a_file_that_exists():
    with pytest.raises(FormatError, match="give the schema file, or registry=True"):
        weir.avro()
    with pytest.raises(FormatError, match=r"avro schema file .*nowhere\.avsc"):
        weir.avro("nowhere.avsc")


def test_a_relative_schema_file_is_found_beside_the_declaring_module(tmp_path, monkeypatch):
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "order.avsc").write_text(json.dumps(ORDER))
    module = tmp_path / "declares.py"
    module.write_text("import weir\nspec = weir.avro('schemas/order.avsc', registry=True)\n")
    monkeypatch.chdir("/")  # not the module's directory
    namespace: dict = {}
    exec(compile(module.read_text(), str(module), "exec"), namespace)
    assert json.loads(namespace["spec"].schema) == ORDER and namespace["spec"].registry


def test_a_registry_only_topic_waits_for_its_schema_and_is_refused_until_then():
    p = Pipeline("p")
    topic = p.topic("events", format=weir.avro(registry=True), key="id")
    assert not topic.resolved and topic.schema == ""  # its key is checked once the columns are known
    assert problems(p) == [
        "topic events: its avro schema is in the schema registry and was not read (a run reads it: "
        "Pipeline.with_schemas)"
    ]
    with pytest.raises(DeclarationError, match=r"pipeline p: topic 'events'.*no registry is set"):
        p.with_schemas({})


def test_a_format_topic_takes_no_ddl_and_json_topics_read_as_before():
    p = Pipeline("p")
    with pytest.raises(DeclarationError, match="takes its columns from its schema; drop schema="):
        p.topic("t", "a STRING", format=FormatSpec("avro", registry=True, schema=json.dumps(ORDER)))
    plain = p.topic("plain", "a STRING")
    assert plain.reader_options({"url": "http://r"}) == {"valueFormat": "json", "valueSchema": "a STRING"}
    assert p.topic("raw").reader_options({}) == {}


def test_the_source_refuses_a_format_without_its_spec_and_a_spec_without_its_format():
    base = {"kafka.bootstrap.servers": "-", "subscribe": "t"}
    with pytest.raises(OptionError, match="valueFormat=avro needs valueFormatSpec"):
        parse_source(base | {"valueFormat": "avro"}, streaming=None)
    spec = FormatSpec("protobuf", schema="syntax = 'proto3';").to_option()
    with pytest.raises(OptionError, match="valueFormatSpec needs valueFormat avro, protobuf or json-schema"):
        parse_source(base | {"valueFormat": "json", "valueSchema": "a INT", "valueFormatSpec": spec}, streaming=None)
    with pytest.raises(OptionError, match="valueFormatSpec is for protobuf values, valueFormat says avro"):
        parse_source(base | {"valueFormat": "avro", "valueFormatSpec": spec}, streaming=None)
    with pytest.raises(OptionError, match="valueFormat must be raw, json, avro, protobuf, json-schema"):
        parse_source(base | {"valueFormat": "xml"}, streaming=None)
