"""The catalog: which tables exist and their decoded columns, without a broker or a lake."""

from __future__ import annotations

import pyarrow as pa
import pytest

from weir.pipeline import Pipeline
from weir.query.catalog import CatalogError, build, declared_fields, lake_fields


def test_tables_and_their_decoded_columns():
    p = Pipeline("shop")
    p.topic("orders", schema="order_id STRING NOT NULL, amount DOUBLE, tags ARRAY<STRING>", partitions=2)
    lake_schema = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("partition", pa.int32()),
                             ("n", pa.int64()), ("_error", pa.string()), ("date", pa.string())])  # fmt: skip
    tables = build(
        ["orders", "clicks"], ["orders", "orders.dlq", "orders.late", "__consumer_offsets", "raw"], p,
        {"clicks": lake_schema},
    )  # fmt: skip
    assert sorted(tables) == ["clicks", "orders", "orders.dlq", "orders.late", "raw"]
    orders = tables["orders"]
    assert orders.archived and orders.on_broker and orders.declared and orders.required == {"order_id"}
    assert orders.fields.names == ["order_id", "amount", "tags"]
    assert orders.fields.field("tags").type == pa.list_(pa.string())
    names = orders.schema().names
    assert names[:8] == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
    assert names[-3:] == ["_error", "date", "hour"]
    assert tables["orders.late"].fields == orders.fields and not tables["orders.late"].archived
    assert not tables["orders.dlq"].decoded and "_error" not in tables["orders.dlq"].schema().names
    assert tables["clicks"].fields.names == ["n"] and not tables["clicks"].on_broker  # the archiver's columns
    assert not tables["raw"].decoded
    assert lake_fields(pa.schema([("value", pa.binary())])).names == []


def test_a_field_named_like_a_kafka_column_is_refused():
    with pytest.raises(CatalogError, match="offset"):
        declared_fields("offset BIGINT, amount DOUBLE", "orders")
    p = Pipeline("odd")
    p.topic("odd", schema="offset BIGINT")
    p.topic("fine", schema="amount DOUBLE")
    tables = build([], ["odd", "fine"], p)
    assert "collide" in tables["odd"].problem and tables["fine"].problem is None  # only a query naming it fails
