"""The shop generator's stream reader, driven by hand as Spark would drive it, without a Spark session:
offsets, pacing by the wall clock, limits, the refusal to change a stream on restart, and the Arrow rows."""

from __future__ import annotations

import time

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import BinaryType, StringType, StructField, StructType, TimestampType

from examples.shop.generator import SCHEMA, GeneratorOptions, ShopStreamReader
from examples.shop.records import Shape, records

# generator.SCHEMA as a struct (parsing its DDL would need a JVM); checked against it below.
STRUCT = StructType(
    [
        StructField("_output", StringType()),
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("timestamp", TimestampType()),
    ]
)


def reader(**options: object) -> ShopStreamReader:
    return ShopStreamReader(GeneratorOptions.parse({k: str(v) for k, v in options.items()}), STRUCT)


def test_the_struct_here_is_the_sources_schema() -> None:
    assert ", ".join(f"{f.name} {f.dataType.simpleString().upper()}" for f in STRUCT) == SCHEMA


def test_options_are_case_insensitive_and_checked() -> None:
    opts = GeneratorOptions.parse({"rate": "0", "total": "10", "eventrate": "5", "MAXRECORDSPERTRIGGER": "3"})
    assert (opts.rate, opts.total, opts.event_rate, opts.max_per_trigger) == (0, 10, 5, 3)
    with pytest.raises(ValueError, match="unknown option"):
        GeneratorOptions.parse({"rows": "5"})
    with pytest.raises(ValueError, match="rate must be positive"):
        GeneratorOptions.parse({"rate": "0"})


def test_the_wall_clock_paces_the_stream_from_its_start() -> None:
    start = int(time.time() * 1000) - 10_000
    r = reader(rate=100, startMs=start, maxRecordsPerTrigger=10_000)
    first = r.initialOffset()
    assert first["records"] == 0 and first["start_ms"] == start and first["event_rate"] == 100
    end = r.latestOffset(first, ReadAllAvailable())
    assert 1_000 <= end["records"] <= 1_100  # 10 s at 100 records/s, plus the time this test takes
    assert r.latestOffset(first, ReadMaxRows(250))["records"] == 250
    capped = reader(rate=100, startMs=start, total=400)
    assert capped.latestOffset(capped.initialOffset(), ReadAllAvailable())["records"] == 400


def test_available_now_stops_at_what_existed_when_it_was_prepared() -> None:
    r = reader(rate=1000, startMs=int(time.time() * 1000) - 2_000)
    r.prepareForTriggerAvailableNow()
    first = r.latestOffset(r.initialOffset(), ReadAllAvailable())["records"]
    time.sleep(0.2)
    assert r.latestOffset(r.initialOffset(), ReadAllAvailable())["records"] == first


def test_a_restart_with_another_seed_is_refused_but_a_new_rate_is_fine() -> None:
    offset = reader(rate=50, seed=3, startMs=1).initialOffset()
    with pytest.raises(ValueError, match="new checkpoint"):
        reader(rate=50, seed=4).latestOffset(offset, ReadAllAvailable())
    # Without eventRate the stream keeps the event rate it started with: only the pacing changes.
    assert reader(rate=500, seed=3).latestOffset(offset, ReadAllAvailable())["event_rate"] == 50


def test_partitions_cover_the_range_and_read_the_records_of_the_shape() -> None:
    r = reader(rate=0, total=250_000, eventRate=200, seed=9, startMs=1_700_000_000_000)
    start = {**r.initialOffset(), "records": 1_234}
    end = {**start, "records": 21_234}
    assert [(p.start, p.end) for p in r.partitions(start, end)] == [(1_234, 21_234)]  # one task: one writer
    many = r.partitions(start, {**start, "records": 250_000})
    assert [(p.start, p.end) for p in many] == [(1_234, 84_156), (84_156, 167_078), (167_078, 250_000)]
    parts = r.partitions(start, end)
    shape = Shape(9, 1_700_000_000_000, 200.0, 1000)
    rows = [row for batch in r.read(parts[0]) for row in batch.to_pylist()]
    expected = records(shape, 1_234, 21_234)
    assert [(x["_output"], x["key"], x["value"]) for x in rows] == [(e.output, e.key, e.value) for e in expected]
    stamps = [int(x["timestamp"].timestamp() * 1000) for x in rows[:5]]
    assert stamps == [e.timestamp_ms for e in expected[:5]]
