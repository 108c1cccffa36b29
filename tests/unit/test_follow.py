"""The source option followCheckpoint (weir/checkpoint/follow.py): a shadow query's batches end where the followed
query's logged batches ended, one by one. Hand-made checkpoint directories as Spark writes them, no Spark, no
broker (the stream reader's broker look-ups are stubbed)."""

from __future__ import annotations

import json
import logging

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.sql.types import StructType

from weir.checkpoint import offsets as off
from weir.checkpoint.files import Checkpoint
from weir.checkpoint.follow import Follower
from weir.kafka.options import OptionError, parse_source
from weir.kafka.source import KafkaStreamReader

META = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}})
BASE = {"kafka.bootstrap.servers": "h:9092", "subscribe": "orders"}


def batch(cp, n: int, *lines: tuple[dict, dict], committed: bool = True) -> None:
    """Batch `n`: one source line per (end, start) pair, {topic: {partition: offset}} each, as Spark logs it."""
    (cp / "offsets").mkdir(parents=True, exist_ok=True)
    (cp / "commits").mkdir(exist_ok=True)
    text = "".join(json.dumps(off.to_json(end, start=start)) + "\n" for end, start in lines)
    (cp / "offsets" / str(n)).write_text(f"v1\n{META}\n{text}")
    if committed:
        (cp / "commits" / str(n)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def orders(p0: int, p1: int) -> dict:
    return {"orders": {0: p0, 1: p1}}


@pytest.fixture
def three(tmp_path):
    """Batches 0-2 of a one-topic query: orders from (0, 0) to (10, 12), (15, 12), (20, 30); batch 2 in flight."""
    cp = tmp_path / "live"
    ends = [orders(0, 0), orders(10, 12), orders(15, 12), orders(20, 30)]
    for n in range(3):
        batch(cp, n, (ends[n + 1], ends[n]), committed=n < 2)
    return str(cp), ends


def test_each_batch_end_gives_the_next_batch_end(three):
    cp, ends = three
    f = Follower(Checkpoint(str(cp)), ("orders",))
    assert f.next_end(ends[0]) == ends[1]  # from where batch 0 began
    assert f.next_end(ends[1]) == ends[2]  # only partition 0 advanced: still beyond
    assert f.next_end(ends[2]) == ends[3]  # a planned batch not yet committed counts too
    assert f.next_end(ends[3]) is None  # the followed query has planned nothing further
    assert all(f.aligned(e) for e in ends)


def test_no_log_yet_plans_nothing(tmp_path):
    assert Follower(Checkpoint(str(tmp_path / "missing")), ["orders"]).next_end(orders(0, 0)) is None
    (tmp_path / "empty" / "offsets").mkdir(parents=True)
    f = Follower(Checkpoint(str(tmp_path / "empty")), ["orders"])
    assert f.next_end(orders(0, 0)) is None and not f.aligned(orders(0, 0))


def test_new_batches_are_seen_as_the_followed_query_plans_them(three, tmp_path):
    cp, ends = three
    f = Follower(Checkpoint(str(cp)), ("orders",))
    assert f.next_end(ends[3]) is None
    batch(tmp_path / "live", 3, (orders(25, 31), ends[3]), committed=False)
    assert f.next_end(ends[3]) == orders(25, 31)


def test_a_start_between_two_logged_ends_is_not_aligned(three):
    cp, ends = three
    f = Follower(Checkpoint(str(cp)), ("orders",))
    between = orders(12, 12)  # past batch 1's end, short of batch 2's
    assert not f.aligned(between)
    assert f.next_end(between) == ends[2]  # the next batch reaching past it: a batch of another size
    assert not f.aligned(orders(1, 1))


def test_a_start_behind_a_purged_log_is_not_aligned(three, tmp_path):
    cp, ends = three
    (tmp_path / "live" / "offsets" / "0").unlink()  # Spark purged batch 0
    f = Follower(Checkpoint(str(cp)), ("orders",))
    assert f.aligned(ends[1])  # where the first batch still logged began
    assert not f.aligned(ends[0])
    assert f.next_end(ends[0]) == ends[2]  # batch 1's end is the first one logged past it


def test_two_topics_in_separate_source_lines(tmp_path):
    cp = tmp_path / "live"
    a0, b0 = {"a": {0: 0}}, {"b": {0: 0}}
    a1, b2 = {"a": {0: 5}}, {"b": {0: 7}}
    batch(cp, 0, (a0, a0), (b0, b0))  # a batch without records on either topic (a watermark batch)
    batch(cp, 1, (a1, a0), (b0, b0))  # only a advanced
    batch(cp, 2, (a1, a1), (b2, b0))  # only b advanced
    follow_a, follow_b = Follower(Checkpoint(str(cp)), ["a"]), Follower(Checkpoint(str(cp)), ["b"])
    assert follow_a.next_end(a0) == a1 and follow_a.next_end(a1) is None
    assert follow_b.next_end(b0) == b2 and follow_b.next_end(b2) is None
    both = Follower(Checkpoint(str(cp)), ("a", "b"))
    assert both.next_end({**a0, **b0}) == {**a1, **b0}
    assert both.next_end({**a1, **b0}) == {**a1, **b2}
    assert both.aligned({**a1, **b0}) and not both.aligned({**a1, **b2, "a": {0: 6}})
    # Lines of topics the follower does not read are ignored
    assert Follower(Checkpoint(str(cp)), ["c"]).next_end({}) is None


def test_a_partition_new_to_the_start_is_beyond_it(tmp_path):
    cp = tmp_path / "live"
    batch(cp, 0, (orders(10, 12), orders(0, 0)))
    batch(cp, 1, ({"orders": {0: 10, 1: 12, 2: 4}}, {"orders": {0: 10, 1: 12, 2: 0}}))  # partition 2 was added
    f = Follower(Checkpoint(str(cp)), ["orders"])
    assert f.next_end(orders(10, 12)) == {"orders": {0: 10, 1: 12, 2: 4}}
    assert f.next_end({"orders": {0: 10}}) == orders(10, 12)  # batch 0 already reads partition 1 past it
    assert f.next_end({"orders": {0: 11, 1: 0}}) is None  # no logged batch reaches partition 0's offset 11


def test_follow_checkpoint_option():
    opts = parse_source({**BASE, "followCheckpoint": " s3://b/live/checkpoint "}, streaming=True)
    assert opts.follow == "s3://b/live/checkpoint"
    assert parse_source(BASE, streaming=True).follow is None
    assert parse_source({**BASE, "followCheckpoint": "/c", "flow": "static"}, streaming=True).follow == "/c"
    with pytest.raises(OptionError, match=r"followCheckpoint.*flow=auto"):
        parse_source({**BASE, "followCheckpoint": "/c", "flow": "auto"}, streaming=True)
    with pytest.raises(OptionError, match=r"followCheckpoint.*maxOffsetsPerTrigger"):
        parse_source({**BASE, "followCheckpoint": "/c", "maxOffsetsPerTrigger": "10"}, streaming=True)
    with pytest.raises(OptionError, match=r"followCheckpoint.*maxBytesPerTrigger"):
        parse_source({**BASE, "followCheckpoint": "/c", "maxBytesPerTrigger": "10"}, streaming=True)
    with pytest.raises(OptionError, match=r"followCheckpoint.*empty"):
        parse_source({**BASE, "followCheckpoint": "  "}, streaming=True)
    with pytest.raises(OptionError, match="subscribePattern"):
        parse_source({"kafka.bootstrap.servers": "h", "subscribePattern": "o.*", "followCheckpoint": "/c"},
                     streaming=True)  # fmt: skip


def reader(options: dict, bounds: dict) -> KafkaStreamReader:
    """A stream reader whose broker look-ups answer `bounds`, {(topic, partition): (earliest, latest)}."""
    r = KafkaStreamReader(parse_source(options, streaming=True), StructType())

    def discover(*, must_exist: bool = False) -> dict:
        r._bounds = dict(bounds)
        return r._bounds

    r._discover = discover
    return r


def test_latest_offset_ends_each_batch_where_the_followed_one_ended(three, caplog):
    cp, ends = three
    r = reader({**BASE, "followCheckpoint": cp}, {("orders", 0): (0, 100), ("orders", 1): (0, 100)})
    assert isinstance(r.getDefaultReadLimit(), ReadAllAvailable)
    with caplog.at_level(logging.WARNING, logger="weir.kafka"):
        first = r.latestOffset(off.to_json(ends[0]), ReadAllAvailable())
        assert off.from_json(first)[0] == ends[1] and off.starts_from_json(first) == ends[0]
        second = r.latestOffset(first, ReadAllAvailable())
        assert off.from_json(second)[0] == ends[2]
        third = r.latestOffset(second, ReadAllAvailable())
        assert off.from_json(third)[0] == ends[3]
        assert r.latestOffset(third, ReadAllAvailable()) == third  # nothing planned further: no batch
    assert not [rec for rec in caplog.records if "followed" in rec.getMessage()]


def test_latest_offset_stays_within_the_broker_and_warns_once_when_not_aligned(three, caplog):
    cp, ends = three
    # The broker has less of partition 1 than the followed plan read, and a partition 2 the plan does not name
    bounds = {("orders", 0): (0, 100), ("orders", 1): (0, 20), ("orders", 2): (3, 9)}
    r = reader({**BASE, "followCheckpoint": cp}, bounds)
    with caplog.at_level(logging.WARNING, logger="weir.kafka"):
        got = r.latestOffset(off.to_json(orders(12, 12)), ReadAllAvailable())  # between batches 1 and 2
        assert off.from_json(got)[0] == {"orders": {0: 15, 1: 12, 2: 3}}  # batch 2's end; p2 stays at its start
        got = r.latestOffset(off.to_json(ends[2]), ReadAllAvailable())
        assert off.from_json(got)[0] == {"orders": {0: 20, 1: 20, 2: 3}}  # capped at the broker's latest
        r.latestOffset(off.to_json(orders(16, 12)), ReadAllAvailable())
    warned = [rec for rec in caplog.records if "no batch boundary of the followed checkpoint" in rec.getMessage()]
    assert len(warned) == 1 and cp in warned[0].getMessage()
