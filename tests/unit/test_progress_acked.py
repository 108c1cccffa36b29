"""The monitor's totals survive a SIGKILL (issue 58 item 7): what a progress publisher wrote to its JSONL log but the
broker never acknowledged is published again by the next publisher of the log, at its start, each line as it was
written; and the monitor applies a record that arrives twice once. No broker: the publisher's producer is a fake
that acknowledges only when told (tests/integration/test_progress_replay.py runs it against the broker)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from weir import wire
from weir.monitor.config import MonitorConfig
from weir.monitor.metrics import MonitorCollector
from weir.monitor.state import Monitor
from weir.monitor.track import REMEMBERED
from weir.runtime import acked
from weir.runtime.progress import ProgressPublisher


class Broker:
    """What the fake producers of a test produced: `topic`, what reached the topic, in order; `waiting`, what waits
    for the broker's acknowledgement, which comes only when the test says."""

    def __init__(self) -> None:
        self.topic: list[tuple[bytes, bytes]] = []
        self.waiting: list[tuple[bytes, bytes, object, FakeProducer]] = []

    def producer(self, settings: dict) -> FakeProducer:
        return FakeProducer(self)

    def values(self) -> list[bytes]:
        return [w[0] for w in self.waiting]

    def ack(self, *which: int, err: KafkaError | None = None) -> None:
        """Acknowledge the waiting messages at `which` (all when none): they reach the topic, unless `err` says
        their delivery failed."""
        chosen = [self.waiting[i] for i in which] if which else list(self.waiting)
        for item in chosen:
            self.waiting.remove(item)
        for value, key, callback, _ in chosen:
            if err is None:
                self.topic.append((value, key))
            callback(err, None)

    def lose_ack(self, i: int) -> None:
        """The message at `i` reaches the topic, but its acknowledgement is lost (the publisher is killed first)."""
        value, key, _, _ = self.waiting.pop(i)
        self.topic.append((value, key))


class FakeProducer:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery=None) -> None:
        self.broker.waiting.append((value, key, on_delivery, self))

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        return sum(w[3] is self for w in self.broker.waiting)

    def purge(self) -> None:
        pass


def publisher(tmp_path: Path, broker: Broker, name: str = "shop") -> ProgressPublisher:
    return ProgressPublisher("shop", {"bootstrap.servers": "127.0.0.1:1"}, str(tmp_path), log_name=name,
                             producer=broker.producer)  # fmt: skip


def kill(p: ProgressPublisher, broker: Broker) -> None:
    """What a SIGKILL leaves: the log and the mark as they are on disk, the slot's locks released (the kernel closes
    its fds), and what its producer held gone; nothing flushed, no last mark written."""
    for fd in [p._slot._fd, p._fd, *(fd for _, fd in p._slot._adopted)]:
        if fd is not None:
            os.close(fd)
    p._slot._fd = p._fd = None
    p._slot.slot = None
    broker.waiting = [w for w in broker.waiting if w[3] is not p._producer]


def batch(n: int, records: int = 32) -> wire.Progress:
    return wire.Progress(batch_id=n, run_id="run-1", input_rows=records, sources=[],
                         accounting=wire.Accounting(in_=records, out=records))  # fmt: skip


def on_disk(tmp_path: Path, name: str = "shop", slot: int = 0) -> acked.Mark | None:
    return acked.read_mark(acked.mark_path(tmp_path / f"{name}.jsonl", slot))


def test_the_mark_advances_to_the_lowest_line_not_acknowledged_whatever_order_the_acknowledgements_come_in(tmp_path):
    broker = Broker()
    p = publisher(tmp_path, broker)
    for n in range(4):
        p.publish("enrich", batch(n))
    lines = (tmp_path / "shop.jsonl").read_bytes().splitlines(keepends=True)
    starts = [sum(len(x) for x in lines[:i]) for i in range(5)]  # each line's offset, and the end
    assert p._slot.mark().acked_to == starts[0]
    broker.ack(3)  # the fourth first, then the second: partitions deliver in their own order
    broker.ack(1)
    assert p._slot.mark().acked_to == starts[0]
    broker.ack(0)  # the first: the second is acknowledged already, the third is not
    assert p._slot.mark().acked_to == starts[2]
    broker.ack()
    assert p._slot.mark().acked_to == starts[4]
    p._slot.save(force=True)
    mark = on_disk(tmp_path)
    assert mark is not None and mark.acked_to == starts[4] and mark.keys == {"shop/enrich"} and not mark.failed
    p.close(0)
    assert on_disk(tmp_path) is None  # every record acknowledged: no mark, and a next start publishes nothing


def test_the_mark_is_written_by_rename_at_most_every_second_and_at_once_for_a_new_processor(tmp_path):
    slot = acked.Slot(tmp_path / "x.jsonl", "t", 0, None)
    (tmp_path / "x.jsonl").write_bytes(b"")
    slot.names("p/a")
    slot.wrote(0, 10)
    slot.save(now=100.0)
    assert on_disk(tmp_path, "x").acked_to == 0
    slot.delivered(0, True)
    slot.save(now=100.5)  # within the second: not yet
    assert on_disk(tmp_path, "x").acked_to == 0
    slot.save(now=101.0)
    assert on_disk(tmp_path, "x").acked_to == 10
    assert not list(tmp_path.glob("*.tmp"))
    assert acked.low_water([30, 10, 20], 40) == 10 and acked.low_water([], 40) == 40


def test_a_killed_publishers_records_past_its_mark_are_published_again_at_the_next_start_once_each(tmp_path):
    broker = Broker()
    first = publisher(tmp_path, broker)
    for n in range(5):
        first.publish("enrich", batch(n))
    broker.ack(0, 1, 2)
    first._slot.save(force=True)
    broker.lose_ack(1)  # the fifth reached the topic, but the kill came before its acknowledgement
    kill(first, broker)  # the fourth never left the process
    written = (tmp_path / "shop.jsonl").read_bytes().splitlines()
    assert [v for v, _ in broker.topic] == [written[0], written[1], written[2], written[4]]

    second = publisher(tmp_path, broker)
    assert second.replayed == 2
    assert broker.values() == [written[3], written[4]]  # as written, envelope and all
    assert {w[1] for w in broker.waiting} == {b"shop/enrich"}
    second.publish("enrich", batch(5))  # after what it publishes again
    broker.ack()
    assert (tmp_path / "shop.jsonl").read_bytes().splitlines()[:5] == written  # the log keeps each record once
    # The monitor fed the topic: every batch once, the one that arrived twice counted apart
    monitor = Monitor(MonitorConfig())
    for value, key in broker.topic:
        monitor.ingest(value, key)
    totals = monitor.tracks["shop/enrich"].totals
    assert totals["in"] == 6 * 32 and monitor.counts["progress"] == 6 and monitor.counts["duplicate"] == 1
    second.close(0)
    assert on_disk(tmp_path) is None
    third = publisher(tmp_path, broker)
    assert third.replayed == 0 and not broker.waiting  # nothing left to publish again
    third.close(0)


def test_a_record_whose_delivery_failed_is_published_again_at_the_next_start(tmp_path):
    broker = Broker()
    first = publisher(tmp_path, broker)
    for n in range(3):
        first.publish("enrich", batch(n))
    broker.ack(1, err=KafkaError(KafkaError._MSG_TIMED_OUT))  # the broker was down for the second
    broker.ack()
    assert first.undelivered == 1 and first._slot.mark().acked_to == first._slot.end  # past it: it is named
    first.close(0)
    assert on_disk(tmp_path).failed
    second = publisher(tmp_path, broker)
    assert second.replayed == 1
    assert broker.values() == [(tmp_path / "shop.jsonl").read_bytes().splitlines()[1]]
    broker.ack()
    second.close(0)
    assert on_disk(tmp_path) is None


def test_a_partial_last_line_is_skipped_counted_and_ended(tmp_path, caplog):
    broker = Broker()
    first = publisher(tmp_path, broker)
    first.publish("enrich", batch(0))
    first.publish("enrich", batch(1))
    kill(first, broker)
    log = tmp_path / "shop.jsonl"
    whole = log.read_bytes().splitlines()
    with log.open("ab") as f:
        f.write(b'{"type":"progress","pipeline":"shop","processor":"enrich","at":"2026')  # killed mid-write
    second = publisher(tmp_path, broker)
    assert second.replayed == 2 and second.partial == len(
        b'{"type":"progress","pipeline":"shop","processor":"enrich","at":"2026'
    )
    assert "partial last line" in caplog.text
    second.publish("enrich", batch(2))
    lines = log.read_bytes().splitlines()
    assert lines[:2] == whole and lines[2].endswith(b'"at":"2026')  # the partial line, ended: a line of its own
    assert json.loads(lines[3])["batch_id"] == 2
    broker.ack()
    second.close(0)


def test_a_rotated_or_truncated_log_or_an_unreadable_mark_publishes_nothing_again_and_starts_over(tmp_path, caplog):
    broker = Broker()
    log = tmp_path / "shop.jsonl"
    first = publisher(tmp_path, broker)
    first.publish("enrich", batch(0))
    first._slot.save(force=True)
    kill(first, broker)
    log.write_bytes(b"")  # truncated below the mark
    mark = on_disk(tmp_path)
    acked.write_mark(acked.mark_path(log, 0), acked.Mark(10_000, mark.keys, mark.topic, mark.device, mark.inode))
    second = publisher(tmp_path, broker)
    assert second.replayed == 0 and "truncated" in caplog.text
    kill(second, broker)
    os.replace(log, tmp_path / "shop.jsonl.1")  # rotated: the mark names the old file
    log.write_bytes(b"")
    acked.write_mark(acked.mark_path(log, 0), acked.Mark(0, mark.keys, mark.topic, mark.device, mark.inode))
    third = publisher(tmp_path, broker)
    assert third.replayed == 0 and "rotated" in caplog.text
    kill(third, broker)
    acked.mark_path(log, 0).write_text("{not json")
    fourth = publisher(tmp_path, broker)
    assert fourth.replayed == 0 and "cannot be read" in caplog.text
    fourth.publish("enrich", batch(1))
    broker.ack()
    fourth.close(0)
    assert on_disk(tmp_path) is None


def test_publishers_sharing_a_log_each_keep_a_mark_of_their_own_lines(tmp_path):
    """`weir run --processors a` and `--processors b` of one pipeline (and `weir ingest` jobs of it) append to one
    log: each publisher takes a slot of its own, and a kill of one publishes again its lines only, never those of a
    live one, nor those of one that the broker acknowledged."""
    broker = Broker()
    a, b = publisher(tmp_path, broker), publisher(tmp_path, broker)
    assert (a._slot.slot, b._slot.slot) == (0, 1)
    for n in range(3):
        a.publish("a", batch(n))
        b.publish("b", batch(n))
    broker.ack(1, 3, 5)  # b's
    kill(a, broker)  # a's three were never acknowledged
    for n in range(3, 6):
        b.publish("b", batch(n))
    broker.ack()  # b's three
    assert not broker.waiting
    c = publisher(tmp_path, broker)  # `--processors a` again, beside the live b
    assert c._slot.slot == 0 and c.replayed == 3
    assert {w[1] for w in broker.waiting} == {b"shop/a"}
    assert on_disk(tmp_path, slot=1).keys == {"shop/b"}  # b's mark is b's: left alone
    broker.ack()
    c.close(0)
    b.close(0)
    assert not list(tmp_path.glob("shop.jsonl.acked")) and not list(tmp_path.glob("shop.jsonl.acked.[0-9]"))


def test_a_mark_left_by_a_publisher_gone_is_taken_over_by_the_next_one_whatever_its_slot(tmp_path):
    broker = Broker()
    a, b = publisher(tmp_path, broker), publisher(tmp_path, broker)
    a.publish("a", batch(0))
    b.publish("b", batch(0))
    kill(b, broker)  # slot 1's mark stays behind
    c = publisher(tmp_path, broker)  # takes slot 1 back
    assert c._slot.slot == 1 and c.replayed == 1 and broker.waiting[-1][1] == b"shop/b"
    a.close(0)
    d = publisher(tmp_path, broker)
    assert d._slot.slot == 0 and d.replayed == 1  # a's, never acknowledged either: left in its mark at close
    broker.ack()
    c.close(0)
    d.close(0)


def test_the_monitor_applies_a_record_that_arrives_twice_once():
    monitor = Monitor(MonitorConfig())
    record = json.dumps({
        "type": "progress", "pipeline": "shop", "processor": "enrich", "at_ms": 1_800_000_000_000, "batch_id": 7,
        "run_id": "r", "input_rows": 160, "sources": [], "accounting": {"in": 160, "out": 160},
    }).encode()  # fmt: skip
    assert monitor.ingest(record) is not None
    assert monitor.ingest(record) is None  # published again after a kill: counted apart, not applied
    t = monitor.tracks["shop/enrich"]
    assert t.totals["in"] == 160 and len(t.batches) == 1
    assert monitor.counts["progress"] == 1 and monitor.counts["duplicate"] == 1
    assert monitor.monitor_view()["records"]["duplicate"] == 1
    metric = next(m for m in MonitorCollector(monitor).collect() if m.name == "weir_monitor_records")
    assert {s.labels["type"]: s.value for s in metric.samples if s.name.endswith("_total")}["duplicate"] == 1
    # Two records that differ in a byte are two, even in one millisecond (two state changes)
    for state in ("starting", "running"):
        monitor.ingest(json.dumps({"type": "state", "pipeline": "shop", "processor": "enrich", "state": state,
                                   "at_ms": 1_800_000_000_001}))  # fmt: skip
    assert monitor.counts["state"] == 2 and t.lifecycle == "running"


def test_the_monitor_remembers_a_bounded_number_of_records_per_processor():
    monitor = Monitor(MonitorConfig())

    def record(n: int, processor: str = "enrich") -> str:
        return json.dumps({"type": "idle", "pipeline": "shop", "processor": processor, "at_ms": 1_000 + n})

    for n in range(REMEMBERED + 1):
        monitor.ingest(record(n))
    monitor.ingest(record(0, "other"))
    t = monitor.tracks["shop/enrich"]
    assert len(t.seen) == len(t.seen_set) == REMEMBERED
    monitor.ingest(record(REMEMBERED))  # still remembered
    monitor.ingest(record(0))  # forgotten: the oldest went
    assert monitor.counts["duplicate"] == 1 and monitor.counts["idle"] == REMEMBERED + 3


@pytest.mark.parametrize("junk", [b"not json\n", b'{"pipeline":"shop","processor":"enrich"\n'])
def test_a_line_past_a_mark_that_is_no_record_is_skipped_and_counted(tmp_path, junk):
    broker = Broker()
    first = publisher(tmp_path, broker)
    first.publish("enrich", batch(0))
    kill(first, broker)
    with (tmp_path / "shop.jsonl").open("ab") as f:
        f.write(junk)
    replay = acked.to_replay(tmp_path / "shop.jsonl", [on_disk(tmp_path)])
    assert len(replay.lines) == 1 and replay.unreadable == (b"processor" in junk) and not replay.partial
