"""Which client errors rebuild a long-lived Kafka client (weir.kafka.heal) and which do not: decided by error
code, never by message text. Then the ingest producer (weir.ingest.producer) on each: rebuilt once, counted, and
its unit's records failed back, for every class that cannot go on; left alone for a transient disconnect. No
broker: a producer connects only to send."""

from __future__ import annotations

import time

import faulty_sink
import pytest
from confluent_kafka import KafkaError, KafkaException

import weir.kafka.sink as ks
from weir import wire
from weir.ingest.producer import Acks, Backpressure, IngestProducer, Out
from weir.kafka import heal
from weir.kafka.log import BrokerUnavailable, pooled
from weir.monitor.config import MonitorConfig
from weir.monitor.metrics import render
from weir.monitor.sources import ProgressReader
from weir.monitor.state import Monitor
from weir.runtime.progress import ProgressPublisher

MUST_REBUILD = {
    "fenced producer": KafkaError(KafkaError.PRODUCER_FENCED),
    "invalid producer epoch": KafkaError(KafkaError.INVALID_PRODUCER_EPOCH),
    "unknown producer id": KafkaError(KafkaError.UNKNOWN_PRODUCER_ID),
    "out-of-order sequence": KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER),
    "invalid producer id mapping": KafkaError(KafkaError.INVALID_PRODUCER_ID_MAPPING),
    "fenced (local)": KafkaError(KafkaError._FENCED),
    "fatal (local)": KafkaError(KafkaError._FATAL),
    "any code, flagged fatal": KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER - 1, "x", fatal=True),
}
TRANSIENT = {
    "connection reset": KafkaError(KafkaError._TRANSPORT, "Disconnected: connection reset by peer"),
    "all brokers down": KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"),
    "message timed out": KafkaError(KafkaError._MSG_TIMED_OUT),
    "request timed out": KafkaError(KafkaError.REQUEST_TIMED_OUT, retriable=True),
    "not leader": KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION, retriable=True),
    "network exception": KafkaError(KafkaError.NETWORK_EXCEPTION, retriable=True),
    "name not resolved": KafkaError(KafkaError._RESOLVE),
    # the fencing text of the log, under a transient code: the text decides nothing
    "fencing words, transient code": KafkaError(
        KafkaError._TRANSPORT, "There is a newer producer with the same transactionalId which fences the current one"
    ),
}


@pytest.mark.parametrize("name", sorted(MUST_REBUILD))
def test_an_error_that_cannot_go_on_rebuilds(name):
    assert heal.cannot_go_on(MUST_REBUILD[name])


@pytest.mark.parametrize("name", sorted(TRANSIENT))
def test_a_transient_error_does_not_rebuild(name):
    assert not heal.cannot_go_on(TRANSIENT[name])
    assert not heal.cannot_go_on(None)


def test_the_backoff_is_bounded_and_starts_again_after_a_healthy_spell():
    now = [100.0]
    b = heal.Backoff(clock=lambda: now[0])
    assert b.wait_s() == 0.0  # the first rebuild: at once
    delays = []
    for _ in range(10):  # failing again at once: 0.5 s, 1 s, 2 s ... never more than the bound
        b.rebuilt()
        delays.append(b.wait_s())
        now[0] += b.wait_s()
    assert delays[:3] == [0.5, 1.0, 2.0] and max(delays) == heal.MAX_DELAY_S
    now[0] += heal.SETTLED_S + heal.MAX_DELAY_S
    b.rebuilt()
    assert b.wait_s() == heal.FIRST_DELAY_S


class Msg:
    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 7


def _deliver(err: KafkaError | None) -> tuple[IngestProducer, Acks, object]:
    """A producer of no broker holding a unit of two records; another record's delivery report is `err`."""
    producer = IngestProducer({"bootstrap.servers": "127.0.0.1:1"}, ack_timeout_s=30.0)
    first = producer.producer
    acks = producer.send([Out("t", b"a", None, [], 0), Out("t", b"b", None, [], 1)])
    other = Acks([Out("t", b"c", None, [], 0)])
    producer._delivered(other, 0, err, Msg())
    assert other.done.is_set() and other.failed
    return producer, acks, first


def _stop(producer: IngestProducer) -> None:
    """Stop without waiting for the poll thread, which may be in a metadata probe of the absent broker (1 s)."""
    producer._closed.set()
    producer.producer.purge()
    producer.producer.flush(0)


def _wait(cond, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("name", sorted(MUST_REBUILD))
def test_the_ingest_producer_is_rebuilt_and_its_unit_answered(name):
    before = heal.rebuilds().get("ingest producer", 0)
    producer, acks, first = _deliver(MUST_REBUILD[name])
    try:
        assert _wait(lambda: producer.counts["rebuilds"] == 1), producer.counts
        assert producer.producer is not first and producer.broken is None
        # the record the old producer still held failed back at once: the unit is answered, not left waiting
        assert acks.done.wait(5) and set(acks.failed) == {0, 1}, acks.failed
        assert producer.in_flight == 0
        assert heal.rebuilds()["ingest producer"] == before + 1
        try:  # refused no more for the rebuild (this broker being absent, for that)
            producer.check(1)
        except Backpressure as exc:
            assert "rebuilt" not in str(exc)
    finally:
        _stop(producer)


@pytest.mark.parametrize("name", sorted(TRANSIENT))
def test_the_ingest_producer_rides_a_transient_error_out(name):
    producer, acks, first = _deliver(TRANSIENT[name])
    try:
        time.sleep(0.3)  # several poll rounds
        assert producer.counts["rebuilds"] == 0 and producer.producer is first and producer.broken is None
        assert not acks.done.is_set() and not acks.failed  # the unit still waits for its acknowledgements
    finally:
        _stop(producer)


def test_records_are_refused_while_the_producer_is_rebuilt():
    producer = IngestProducer({"bootstrap.servers": "127.0.0.1:1"})
    try:
        producer._closed.set()  # no poll thread: the rebuild stays pending
        producer._thread.join(2)
        producer.broken = "PRODUCER_FENCED: fenced"
        with pytest.raises(Backpressure, match="being rebuilt"):
            producer.check(1)
        acks = producer.send([Out("t", b"a", None, [], 0)])  # one that passed `check` just before
        assert acks.done.is_set() and acks.failed[0].startswith("not sent: the producer is being rebuilt")
        assert producer.in_flight == 0
    finally:
        producer.producer.flush(0)


@pytest.mark.parametrize("name", sorted(MUST_REBUILD))
def test_a_pooled_sink_producer_that_cannot_go_on_is_replaced_at_the_next_write(name):
    settings = {"bootstrap.servers": "127.0.0.1:1", "client.id": f"heal-{name}"}
    before = heal.rebuilds().get("sink producer", 0)
    first = ks._pooled(settings)
    first._on_error(MUST_REBUILD[name])  # as librdkafka's error callback, while the producer is idle
    second = ks._pooled(settings)
    assert second is not first and heal.rebuilds()["sink producer"] == before + 1
    ks._discard(second)


@pytest.mark.parametrize("name", sorted(TRANSIENT))
def test_a_pooled_sink_producer_rides_a_transient_error_out(name):
    settings = {"bootstrap.servers": "127.0.0.1:1", "client.id": f"heal-{name}"}
    first = ks._pooled(settings)
    first._on_error(TRANSIENT[name])
    assert ks._pooled(settings) is first and first.broken is None
    ks._discard(first)


@pytest.mark.parametrize(("name", "rebuilt"), [("fenced producer", True), ("connection reset", False)])
def test_the_progress_publisher_rebuilds_only_a_producer_that_cannot_go_on(name, rebuilt, tmp_path):
    err = {**MUST_REBUILD, **TRANSIENT}[name]
    publisher = ProgressPublisher("p", {"bootstrap.servers": "127.0.0.1:1"}, str(tmp_path))
    try:
        first = publisher._producer
        before = heal.rebuilds().get("progress producer", 0)
        publisher._on_error(err)
        publisher.publish("x", wire.State(state="running"))
        record = publisher.publish("x", wire.State(state="running"))
        assert (publisher._producer is not first) == rebuilt
        assert record["client_rebuilds"].get("progress producer", 0) == before + rebuilt  # published with records
    finally:
        publisher.close(0.1)


@pytest.mark.parametrize(("name", "rebuilt"), [("fenced (local)", True), ("fatal (local)", True),
                                               ("all brokers down", False)])  # fmt: skip
def test_the_monitor_rebuilds_only_a_progress_consumer_that_cannot_go_on(name, rebuilt):
    monitor = Monitor(MonitorConfig())
    reader = ProgressReader(monitor, {"bootstrap.servers": "127.0.0.1:1"}, "_weir.progress", positions={0: 41},
                            timeout=0.2)  # fmt: skip
    try:
        first = reader._consumer()
        reader._assigned = {0}
        reader._error({**MUST_REBUILD, **TRANSIENT}[name])
        reader.step(0.05)
        assert (reader.consumer is not first) == rebuilt and reader.rebuilds == int(rebuilt)
        assert reader.positions == {0: 41}  # read positions kept: the new consumer goes on from there
        metrics = render(monitor).decode() if rebuilt else ""
        assert not rebuilt or 'weir_monitor_client_rebuilds_total{client="monitor consumer"}' in metrics
    finally:
        reader.close()


@pytest.mark.parametrize(("name", "counted"), [("fatal (local)", True), ("request timed out", False)])
def test_a_pooled_log_view_that_raised_is_closed_and_a_rebuild_counted_by_code(name, counted):
    client = {"bootstrap.servers": "127.0.0.1:1", "client.id": f"heal-view-{name}"}
    before = heal.rebuilds().get("log view", 0)
    with pytest.raises(KafkaException), pooled(client, 0.1) as view:
        raise KafkaException({**MUST_REBUILD, **TRANSIENT}[name])
    with pooled(client, 0.1) as again:
        assert again is not view  # the view that raised is not reused
    assert heal.rebuilds().get("log view", 0) == before + counted


def test_only_a_record_that_may_have_been_stored_is_read_back_before_it_is_sent_again():
    """A record purged from the queue never left this process; one that timed out or was purged in flight may
    be stored: `doubtful` says which of a unit's failed records a files or PostgreSQL job reads back."""
    codes = {0: KafkaError._PURGE_QUEUE, 1: KafkaError._MSG_TIMED_OUT, 2: KafkaError._PURGE_INFLIGHT,
             3: KafkaError.PRODUCER_FENCED}  # fmt: skip
    acks = Acks([Out("t", b"v", None, [], row) for row in (*codes, 4)])
    for i, code in codes.items():
        acks.delivered(i, KafkaError(code), Msg())
    acks.delivered(4, None, Msg())
    assert acks.done.is_set() and set(acks.failed) == {0, 1, 2, 3} and acks.placed == {4: ("t", 0, 7)}
    assert acks.doubtful == {1, 2, 3}


@pytest.mark.parametrize(("name", "rebuilt"), [("fenced (local)", True), ("fatal (local)", True),
                                               ("all brokers down", False)])  # fmt: skip
def test_a_source_query_rebuilds_only_a_view_that_cannot_go_on(name, rebuilt):
    """KafkaStreamReader's long-lived LogView: an error that cannot go on (raised, or the context of the
    BrokerUnavailable LogView raises) closes it and counts a rebuild; the outage is ridden out with a new view.
    A transient error leaves the view alone."""
    from pyspark.sql.types import StructType

    from weir.kafka.options import parse_source
    from weir.kafka.source import KafkaStreamReader

    opts = parse_source({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}, streaming=True)
    reader = KafkaStreamReader(opts, StructType())
    reader._reached = True  # after a first answer: outages are ridden out
    err = {**MUST_REBUILD, **TRANSIENT}[name]
    before = heal.rebuilds().get("source view", 0)
    views, calls = [], []

    def look():
        views.append(reader.view)
        calls.append(1)
        if len(calls) == 1:
            try:
                raise KafkaException(err)
            except KafkaException:
                raise BrokerUnavailable("cannot read metadata") from None  # as LogView.partitions raises
        return "answer"

    try:
        assert reader._ask(look, "plan a batch") == "answer"
        assert (views[0] is not views[1]) == rebuilt
        assert heal.rebuilds().get("source view", 0) == before + rebuilt
    finally:
        reader.stop()


def test_a_sink_producer_rebuilt_in_a_worker_goes_back_with_the_next_write_once(tmp_path):
    """Sink producers are rebuilt in Spark's Python workers, whose counts never reach the runner by themselves:
    each successful write carries what its worker rebuilt since the last one (a failed write's too), the commit
    sums its tasks' into the report the runner reads, and the runner's publisher adds them to its own."""
    from pyspark.sql.types import StringType, StructField, StructType

    from weir.kafka.options import parse_sink
    from weir.runtime.accounting import Counts

    report = str(tmp_path / "commit.json")
    options = {"kafka.bootstrap.servers": "127.0.0.1:1", "kafka.client.id": "heal-carried", "topic": "t",
               "commitReport": report}  # fmt: skip
    opts = parse_sink(options)
    schema = StructType([StructField("value", StringType())])
    writer = ks.KafkaBatchWriter(opts, schema)
    heal.take_unreported("sink producer")  # what earlier tests rebuilt is no write's here
    ks._pooled(opts.producer_settings())._on_error(KafkaError(KafkaError.PRODUCER_FENCED))  # fenced while idle
    first = writer.write(iter([]))  # rebuilds it, and carries the rebuild
    second = writer.write(iter([]))
    assert (first.rebuilds, second.rebuilds) == (1, 0)
    # A write that fails with a producer that cannot go on: discarded and counted, carried by the next write
    failed = ks._pooled(opts.producer_settings())
    failed.broken = "PRODUCER_FENCED: fenced"
    ks._discard(failed)
    third = writer.write(iter([]))
    assert third.rebuilds == 1
    # The driver's commit sums its tasks' (a failed task's message is None) into the runner's report, read once
    writer.commit([first, None, second, third])
    assert ks.take_report(report) == {"tasks": 3, "records": 0, "rebuilds": 2, "per_topic": {}, "sources": {}}
    assert ks.take_report(report) is None
    # A writer whose producer is fenced before every write (tests/faulty_sink.py, as the runner's tests hand it
    # their workers): each write rebuilds one, and carries it
    fenced = faulty_sink.FaultyBatchWriter(opts, schema, fence=True)
    assert [fenced.write(iter([])).rebuilds for _ in range(2)] == [1, 1]
    # The runner's books: a batch's rebuilds add up over batches and are no records
    batch, totals = Counts(in_=5, out=5, client_rebuilds=2), Counts()
    totals.add(batch)
    totals.add(batch)
    assert totals.client_rebuilds == 4 and batch.balanced and batch.to_json()["client_rebuilds"] == 2


def test_the_publisher_publishes_rebuilds_carried_back_to_it(tmp_path):
    publisher = ProgressPublisher("p", {"bootstrap.servers": "127.0.0.1:1"}, str(tmp_path))
    try:
        own = heal.rebuilds().get("sink producer", 0)
        publisher.carried("sink producer", 0)
        assert publisher.publish("x", wire.State(state="running"))["client_rebuilds"].get("sink producer", 0) == own
        publisher.carried("sink producer", 2)
        publisher.carried("sink producer", 1)
        record = publisher.publish("x", wire.State(state="running"))
        assert record["client_rebuilds"]["sink producer"] == own + 3
        assert heal.merged({"a": 1}, {"a": 2, "b": 1}, {}) == {"a": 3, "b": 1}
    finally:
        publisher.close(0.1)


def test_every_long_lived_client_reconnects_within_a_second_unless_told_otherwise():
    """librdkafka's default reconnect backoff (10 s, jittered to 15 s) kept the HTTP ingest's producer away from
    a broker that was back for 11 s; each client weir keeps takes heal.RECONNECT, and a user's own value wins."""
    from weir.kafka.options import client_settings

    assert heal.reconnecting({"bootstrap.servers": "b:1"})["reconnect.backoff.max.ms"] == "1000"
    assert heal.reconnecting({"reconnect.backoff.max.ms": "5000"})["reconnect.backoff.max.ms"] == "5000"
    assert client_settings({"kafka.bootstrap.servers": "b:1"})["reconnect.backoff.max.ms"] == "1000"
    producer = IngestProducer({"bootstrap.servers": "127.0.0.1:1"})
    try:
        assert producer.settings["reconnect.backoff.max.ms"] == "1000"
    finally:
        producer.close()
