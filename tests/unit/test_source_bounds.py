"""The stream source's bounds for a stateful backfill: lakeUntil raises a partition's earliest offset (what is below
it is read from the lake, as offsets retention deleted are), and endingOffsets stops a stream's partitions at given
offsets. No Spark, no broker, no lake: the broker's bounds and the lake's coverage are stubbed."""

from __future__ import annotations

import logging

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import StructType

from weir.checkpoint import offsets as off
from weir.checkpoint.offsets import OffsetRange
from weir.kafka import source
from weir.kafka.fallback import LakeIndex, LakePartition
from weir.kafka.options import OptionError, parse_source
from weir.kafka.read import DataLossError
from weir.kafka.source import KafkaPartition, KafkaStreamReader, _bounds

BASE = {"kafka.bootstrap.servers": "h:9092", "subscribe": "orders"}
TWO = {("orders", 0): (0, 100), ("orders", 1): (0, 100)}


class View:
    """A broker's answer to `bounds`: fixed (earliest, latest) per partition."""

    def __init__(self, bounds: dict) -> None:
        self.fixed = bounds

    def bounds(self, tps: list) -> dict:
        return {tp: self.fixed[tp] for tp in tps}


class Index:
    """A lake holding `HOLDS[partition]`, [start, end) ranges, of every topic (LakeIndex's split on them)."""

    HOLDS: dict[int, list[OffsetRange]] = {}  # noqa: RUF012 - set by each test through `lake_holds`

    def __init__(self, lake: str, topic: str) -> None:
        self.topic = topic
        self.coverage = self.HOLDS

    split = LakeIndex.split

    def describe(self, partition: int) -> str:
        return f"the test lake covers {[(r.start, r.end) for r in self.coverage.get(partition, [])]}"

    def plan(self, r: OffsetRange) -> LakePartition:
        return LakePartition("file:///lake", r.topic, r.partition, r.start, r.end, 0, ())


@pytest.fixture
def lake_holds(monkeypatch):
    def holds(**ranges: tuple[int, int]) -> None:
        # p0=(0, 60): partition 0's offsets [0, 60)
        Index.HOLDS = {int(p[1:]): [OffsetRange("orders", int(p[1:]), a, b)] for p, (a, b) in ranges.items()}

    monkeypatch.setattr(source, "LakeIndex", Index)
    return holds


def reader(options: dict, bounds: dict) -> KafkaStreamReader:
    """A stream reader whose broker look-ups answer `bounds`, {(topic, partition): (earliest, latest)}, through
    _bounds (so lakeUntil applies), as weir/kafka/source.py's _discover does."""
    r = KafkaStreamReader(parse_source({**BASE, **options}, streaming=True), StructType())
    answer(r, bounds)
    return r


def answer(r: KafkaStreamReader, bounds: dict) -> None:
    """From now on, the broker's bounds are `bounds`."""

    def discover(*, must_exist: bool = False) -> dict:
        r._bounds = _bounds(r.opts, View(bounds), sorted(bounds))
        return r._bounds

    r._discover = discover


def ends(offset: dict) -> dict:
    return off.from_json(offset)[0]


def orders(p0: int, p1: int) -> dict:
    return off.to_json({"orders": {0: p0, 1: p1}})


# -- _bounds ----------------------------------------------------------------------------------------------------------


def test_lake_until_raises_the_earliest_offset_within_the_latest(tmp_path):
    opts = parse_source(
        {**BASE, "lake": str(tmp_path), "startingOffsets": '{"orders": {"0": 0, "1": 0, "2": 0, "3": 0}}',
         "lakeUntil": '{"orders": {"0": 60, "1": 5, "2": 500}}'},
        streaming=True,
    )  # fmt: skip
    view = View({("orders", 0): (10, 100), ("orders", 1): (20, 100), ("orders", 2): (0, 100), ("orders", 3): (7, 9)})
    assert _bounds(opts, view, sorted(view.fixed)) == {
        ("orders", 0): (60, 100),  # the broker holds [10, 100): below 60 from the lake all the same
        ("orders", 1): (20, 100),  # retention already passed lakeUntil
        ("orders", 2): (100, 100),  # beyond the latest: everything there is, from the lake
        ("orders", 3): (7, 9),  # not named
    }


def test_lake_until_raises_the_earliest_offset(tmp_path):
    opts = parse_source(
        {**BASE, "lake": str(tmp_path), "startingOffsets": '{"orders": {"0": 0, "1": 0}}',
         "lakeUntil": '{"orders": {"0": 60, "1": 30}}'},
        streaming=True,
    )  # fmt: skip
    assert opts.lake_until == {"orders": {0: 60, 1: 30}}
    assert _bounds(opts, View(TWO), sorted(TWO)) == {("orders", 0): (60, 100), ("orders", 1): (30, 100)}


# -- lakeUntil in a stream ------------------------------------------------------------------------------------------


def test_a_stream_reads_below_lake_until_from_the_lake_and_the_rest_from_the_broker(tmp_path, lake_holds, caplog):
    lake_holds(p0=(0, 80))
    r = reader({"lake": str(tmp_path), "lakeUntil": '{"orders": {"0": 60}}'}, TWO)
    with caplog.at_level(logging.INFO, logger="weir.kafka"):
        end = r.latestOffset(orders(10, 0), ReadAllAvailable())
    assert ends(end) == {"orders": {0: 100, 1: 100}}
    fallback = off.fallback_from_json(end)
    assert (fallback.offsets, fallback.events) == (50, 1) and off.from_json(end)[1].events == 0
    parts = r.partitions(orders(10, 0), end)
    lake = [(p.partition, p.start, p.end) for p in parts if isinstance(p, LakePartition)]
    broker = sorted((p.range.partition, p.range.start, p.range.end) for p in parts if isinstance(p, KafkaPartition))
    assert lake == [(0, 10, 60)] and broker == [(0, 60, 100), (1, 0, 100)]
    said = [rec for rec in caplog.records if "lakeUntil 60" in rec.getMessage()]
    assert said and all(rec.levelno == logging.INFO for rec in said)  # planned, not a loss: no warning
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING]


def test_a_stream_already_past_lake_until_reads_the_broker(tmp_path, lake_holds):
    lake_holds()
    r = reader({"lake": str(tmp_path), "lakeUntil": '{"orders": {"0": 60}}'}, TWO)
    end = r.latestOffset(orders(70, 0), ReadAllAvailable())
    assert ends(end) == {"orders": {0: 100, 1: 100}} and off.fallback_from_json(end).offsets == 0


def test_below_lake_until_what_the_lake_lacks_is_lost_as_with_retention(tmp_path, lake_holds, caplog):
    lake_holds(p0=(30, 60))  # the lake lacks [10, 30)
    options = {"lake": str(tmp_path), "lakeUntil": '{"orders": {"0": 60}}'}
    with pytest.raises(DataLossError, match=r"offsets \[10, 60\) are below lakeUntil 60.*\[10, 30\)"):
        reader(options, TWO).latestOffset(orders(10, 0), ReadAllAvailable())
    r = reader({**options, "failOnDataLoss": "false"}, TWO)
    with caplog.at_level(logging.WARNING, logger="weir.kafka"):
        end = r.latestOffset(orders(10, 0), ReadAllAvailable())
    loss = off.from_json(end)[1]
    assert (loss.skipped_offsets, loss.events) == (20, 1)  # skipped and counted
    assert off.starts_from_json(end) == {"orders": {0: 30, 1: 0}}
    assert off.fallback_from_json(end).offsets == 30  # [30, 60) from the lake
    assert [rec for rec in caplog.records if "below lakeUntil 60" in rec.getMessage()]


def test_lake_until_with_an_end_below_it_reads_the_lake_only(tmp_path, lake_holds):
    lake_holds(p0=(0, 60))
    r = reader({"lake": str(tmp_path), "lakeUntil": '{"orders": {"0": 60}}', "endingOffsets": '{"orders": {"0": 40}}'},
               TWO)  # fmt: skip
    end = r.latestOffset(orders(10, 0), ReadAllAvailable())
    assert ends(end) == {"orders": {0: 40, 1: 100}}
    parts = r.partitions(orders(10, 0), end)
    assert [(p.partition, p.start, p.end) for p in parts if isinstance(p, LakePartition)] == [(0, 10, 40)]
    assert [p.range.partition for p in parts if isinstance(p, KafkaPartition)] == [1]


# -- endingOffsets in a stream ------------------------------------------------------------------------------------


def test_a_stream_stops_at_its_ending_offsets():
    r = reader({"endingOffsets": '{"orders": {"0": 50}}'}, TWO)
    first = r.latestOffset(orders(0, 0), ReadAllAvailable())
    assert ends(first) == {"orders": {0: 50, 1: 100}}  # partition 1 is not named: unaffected
    assert r.latestOffset(first, ReadAllAvailable()) == first  # nothing more: no batch
    r2 = reader({"endingOffsets": '{"orders": {"0": 50}}'}, {("orders", 0): (0, 300), ("orders", 1): (0, 120)})
    assert ends(r2.latestOffset(first, ReadAllAvailable())) == {"orders": {0: 50, 1: 120}}


def test_a_stream_approaches_its_end_with_a_limit_and_a_broker_behind_it():
    r = reader({"endingOffsets": '{"orders": {"0": 50, "1": 500}}', "maxOffsetsPerTrigger": "60"}, TWO)
    batch = r.latestOffset(orders(0, 0), ReadMaxRows(60))
    assert sum(ends(batch)["orders"].values()) == 60 and ends(batch)["orders"][0] <= 50
    while (after := r.latestOffset(batch, ReadMaxRows(60))) != batch:
        batch = after
    assert ends(batch) == {"orders": {0: 50, 1: 100}}  # partition 1: the broker's latest, short of 500


def test_a_start_beyond_the_end_stays_where_it_is():
    r = reader({"endingOffsets": '{"orders": {"0": 50}}'}, TWO)
    assert ends(r.latestOffset(orders(70, 0), ReadAllAvailable())) == {"orders": {0: 70, 1: 100}}


def test_available_now_ends_at_the_ending_offsets_without_a_loss():
    r = reader({"endingOffsets": '{"orders": {"0": 50, "1": 500}}'}, TWO)
    r.prepareForTriggerAvailableNow()
    assert r._target == {("orders", 0): 50, ("orders", 1): 100}  # a broker short of the end: what it has now
    first = r.latestOffset(orders(0, 0), ReadAllAvailable())
    assert ends(first) == {"orders": {0: 50, 1: 100}}
    # The broker goes on beyond both: neither the cap nor the target is a loss
    answer(r, {("orders", 0): (0, 900), ("orders", 1): (0, 900)})
    assert r.latestOffset(first, ReadAllAvailable()) == first


def test_available_now_still_fails_when_the_broker_falls_below_its_target():
    r = reader({"endingOffsets": '{"orders": {"0": 50}}'}, TWO)
    r.prepareForTriggerAvailableNow()
    answer(r, {("orders", 0): (0, 30), ("orders", 1): (0, 100)})
    with pytest.raises(DataLossError, match=r"orders partition 0: the run must read to offset 50"):
        r.latestOffset(orders(10, 0), ReadAllAvailable())


def test_ending_offsets_naming_a_partition_that_does_not_exist_are_refused_at_the_start():
    r = reader({"endingOffsets": '{"orders": {"0": 50, "7": 10}}'}, TWO)
    with pytest.raises(OptionError, match=r"endingOffsets names partitions that do not exist: orders/7"):
        r.initialOffset()
    assert reader({"endingOffsets": '{"orders": {"0": 50}}'}, TWO).initialOffset() == orders(100, 100)
