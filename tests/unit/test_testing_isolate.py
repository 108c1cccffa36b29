"""A test's copy of a pipeline (weir.testing.isolate) and its records in (weir.testing.records), without Spark."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from weir.pipeline import Pipeline
from weir.testing.isolate import isolated
from weir.testing.records import encode, timestamps_for


def declared() -> Pipeline:
    p = Pipeline("shop")
    orders = p.topic("orders", "id STRING NOT NULL, amount DOUBLE", key="id", partitions=3, archived=True)
    p.topic("small", "id STRING")
    p.topic("big", "id STRING")

    @p.processor(inputs=[orders], outputs=["small", "big"])
    def split(df):
        return {"small": "the small ones", "big": "the big ones"}

    return p


def test_every_topic_is_renamed_and_the_processors_follow():
    p = declared()
    copy = isolated(p, "t1")
    assert sorted(copy.topics) == ["t1.big", "t1.orders", "t1.small"]
    orders = copy.topics["t1.orders"]
    assert (orders.key, orders.partitions, orders.archived) == ("id", 3, True)
    split = copy.processors["split"]
    assert (split.inputs, split.outputs) == (("t1.orders",), ("t1.small", "t1.big"))
    assert split.version == p.processors["split"].version and split.checkpoint == "shop/split"
    # A dict result names its outputs as declared; the copy's function names them as the test's topics.
    assert split.fn(None) == {"t1.small": "the small ones", "t1.big": "the big ones"}
    assert sorted(p.topics) == ["big", "orders", "small"]  # the declared pipeline is left as it was
    assert isolated(p, "") is p


def test_rows_become_the_records_a_producer_would_write():
    topic = declared().topics["orders"]
    key, value = encode(topic, {"id": 7, "amount": 2.5, "at": datetime(2026, 1, 1, tzinfo=UTC)})
    assert key == b"7" and json.loads(value) == {"id": 7, "amount": 2.5, "at": "2026-01-01T00:00:00Z"}
    assert encode(topic, b"not json") == (None, b"not json") and encode(topic, None) == (None, None)
    with pytest.raises(TypeError, match="a row is a dict of fields, bytes or a string"):
        encode(topic, 42)


def test_record_times_come_from_the_clock_one_instant_or_one_per_row():
    clock = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
    ms = 1_767_261_600_000
    assert timestamps_for(2, None, clock) == [ms, ms]
    assert timestamps_for(2, "2026-01-01T10:00:01Z", clock) == [ms + 1000] * 2
    assert timestamps_for(2, [ms, datetime(2026, 1, 1, 10, 0, 2)], clock) == [ms, ms + 2000]
    with pytest.raises(ValueError, match="3 timestamps for 2 rows"):
        timestamps_for(2, [ms, ms, ms], clock)


def test_every_declaration_that_names_a_topic_is_renamed_and_the_copy_validates():
    from weir.pipeline import validate
    from weir.sinks import KafkaSink, ParquetSink

    p = Pipeline("iot")
    readings = p.topic("readings", "device STRING NOT NULL, celsius DOUBLE", key="device", archived=True)
    devices = p.table("devices", "device STRING NOT NULL, room STRING", key="device")
    hot = p.topic("hot", "device STRING, celsius DOUBLE", key="device")
    p.http_source(readings, "devices", port=8660)
    p.view("latest", source=readings, key="device")

    @p.processor(inputs=[readings], sink=KafkaSink("hot", "127.0.0.1:9092"))
    def forward(df):
        return df

    @p.processor(inputs=[hot], sink=ParquetSink("/tmp/hot"))
    def keep(df):
        return df

    copy = validate(isolated(p, "t1"))  # the declared pipeline's HTTP source named 'readings': refused before
    assert [s.topics for s in copy.http_sources] == [("t1.readings", "t1.devices")]
    assert copy.http_sources[0].port == 8660 and copy.views["latest"].source == "t1.readings"
    assert type(copy.topics["t1.devices"]).__name__ == "Table" and copy.topics["t1.readings"].archived
    sink = copy.processors["forward"].sink
    assert (sink.topic, sink.options["topic"], sink.name) == ("t1.hot", "t1.hot", "kafka:t1.hot")
    assert p.processors["forward"].sink.topic == "hot" and p.http_sources[0].topics == ("readings", "devices")
    assert copy.processors["keep"].sink is p.processors["keep"].sink  # names no topic: the same sink
    assert devices.name == "devices" and hot.name == "hot"
