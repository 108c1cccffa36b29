"""LogView.bounds returns only what its own call observed: impossible listings and probes answered without a fetch
are asked again, and refused loudly when they stay impossible. On a broker that follows the protocol the listing is
the answer and nothing is fetched; on one that lists short (Tansu: weir.kafka.quirks) a Fetch probe corrects it. A
fake cluster stands in for the broker (the anomalies are ones no broker produces on demand)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from weir.kafka import log as kafka_log
from weir.kafka.log import BrokerUnavailable, LogView
from weir.kafka.quirks import PROTOCOL, TANSU, quirks_of

TP0 = ("t", 0)


class FakeMessage:
    def __init__(self, tp, offset, code=None) -> None:
        self.tp, self.off, self.code = tp, offset, code

    def error(self):
        return None if self.code is None else KafkaError(self.code)

    def topic(self):
        return self.tp[0]

    def partition(self):
        return self.tp[1]

    def offset(self):
        return self.off

    def key(self):
        return b"k"

    def value(self):
        return b"v"


class FakeConsumer:
    """Answers a probe per the script: ("record", mark) fetches and sets the cached mark; ("reset",) does not fetch,
    and leaves whatever mark an earlier use of this (pooled) consumer cached."""

    def __init__(self, script: list, cached: int, low: int = 0) -> None:
        self.script, self.cached, self.low, self.assigned = script, cached, low, []
        self.fetches = 0

    def assign(self, tps):
        self.assigned = [(tp.topic, tp.partition, tp.offset) for tp in tps]

    def consume(self, num_messages, timeout):
        self.fetches += 1
        t, p, o = self.assigned[0]
        step = self.script.pop(0)
        if step[0] == "reset":
            return [FakeMessage((t, p), o, KafkaError._AUTO_OFFSET_RESET)]
        if step[0] == "eof":
            self.cached = step[1]
            return [FakeMessage((t, p), step[1], KafkaError._PARTITION_EOF)]
        self.cached = step[1]
        return [FakeMessage((t, p), o)]

    def get_watermark_offsets(self, tp, cached):
        return (self.low, self.cached)

    def unassign(self):
        self.assigned = []

    def close(self):
        pass


def view(listings: list[tuple[int, int]], probes: list, cached: int = 999, low: int = 0, quirks=TANSU) -> LogView:
    v = LogView({"bootstrap.servers": "127.0.0.1:1"}, quirks=quirks)
    answers = list(listings)
    state: dict = {"calls": 0}

    def listing(tps, spec):  # each observation lists the earliest, then the latest offsets
        state["calls"] += 1
        if state["calls"] % 2:
            state["now"] = answers.pop(0)
            return {TP0: state["now"][0]}
        return {TP0: state["now"][1]}

    v._list = listing  # type: ignore[method-assign]
    v.consumer = FakeConsumer(probes, cached, low)  # type: ignore[assignment]
    return v


def test_a_listed_latest_below_the_earliest_is_asked_again():
    v = view([(5, -1), (5, 40)], [("record", 42)], low=5)
    assert v.bounds([TP0]) == {TP0: (5, 42)}


def test_a_listed_latest_of_minus_one_twice_is_a_loud_error_naming_the_broker():
    v = view([(5, -1), (5, -1)], [])
    with pytest.raises(BrokerUnavailable, match=r"127\.0\.0\.1:1.*t partition 0.*latest -1"):
        v.bounds([TP0])


def test_a_probe_answered_by_an_offset_reset_is_not_read_from_a_stale_cached_mark():
    # The pooled consumer cached 999 from an earlier use; the probe got no fetch: the mark must come from a new one.
    v = view([(0, 40), (0, 50)], [("reset",), ("record", 51)], cached=999)
    assert v.bounds([TP0]) == {TP0: (0, 51)}


def test_a_lower_mark_than_seen_before_is_probed_again_and_then_accepted():
    v = view([(0, 40), (0, 30), (0, 30)], [("record", 40), ("record", 30), ("record", 30)])
    assert v.bounds([TP0]) == {TP0: (0, 40)}
    assert v.bounds([TP0]) == {TP0: (0, 30)}  # confirmed by the fresh probe: a truncated or recreated log
    assert not v.consumer.script  # both probes ran


def test_a_listed_latest_beyond_the_fetched_high_water_mark_is_not_planned():
    # The probe at listed - 1 = 40 is answered by the end of the partition at 40: the log ends there, and a read
    # planned to 41 would wait for an offset that never comes.
    v = view([(0, 41)], [("eof", 40)])
    assert v.bounds([TP0]) == {TP0: (0, 40)}


def test_a_listing_whose_earliest_is_above_its_latest_is_settled_by_a_fetch_at_the_higher(caplog):
    # Seen from the embedded broker in a loaded CI run, every batch: earliest 31, latest 1, for a partition of 31
    # records. A fetch at 31 answers the end of the partition with the log start and the mark: no second listing.
    v = view([(31, 1)], [("eof", 31)])
    assert v.bounds([TP0]) == {TP0: (0, 31)}
    assert v.consumer.script == []
    assert "listed earliest 31 above latest 1" in caplog.text
    caplog.clear()
    v._list, v.consumer.script = view([(31, 1)], [])._list, [("eof", 33)]
    assert v.bounds([TP0]) == {TP0: (0, 33)}
    assert "listed earliest" not in caplog.text  # once per partition and view: the broker does it every time


def test_a_contradictory_listing_whose_fetch_is_out_of_range_stays_a_loud_error():
    v = view([(31, 1), (31, 1)], [("reset",), ("reset",)])
    with pytest.raises(BrokerUnavailable, match=r"listed earliest 31 and latest 1 twice|earliest 31 and latest 1"):
        v.bounds([TP0])


def test_a_listed_earliest_above_the_fetched_log_start_is_not_planned():
    # Seen from the embedded broker in a loaded run: earliest 5 listed for a log that starts at 0 (latest listed
    # right); a read planned from 5 skipped offsets 0-4 without a word. The probe's Fetch response carries the log
    # start, by the protocol.
    v = view([(5, 15)], [("record", 15)], low=0)
    assert v.bounds([TP0]) == {TP0: (0, 15)}
    # A log start the fetch does not know (librdkafka's -1001) leaves the listed one.
    assert view([(5, 15)], [("record", 15)], low=-1001).bounds([TP0]) == {TP0: (5, 15)}


def test_a_partition_listed_empty_is_probed_at_its_end_and_its_fetched_bounds_win():
    v = view([(5, 5)], [("record", 15)], low=0)  # the fetch at 5 found records: the listing was wrong on both ends
    assert v.bounds([TP0]) == {TP0: (0, 15)}
    assert v.consumer.assigned == [] and not v.consumer.script
    empty = view([(0, 0)], [("eof", 0)], low=0)
    assert empty.bounds([TP0]) == {TP0: (0, 0)}


def test_the_broker_is_known_by_its_cluster_id():
    assert quirks_of("tansu_cluster") is TANSU and not TANSU.lists_exact_offsets
    assert quirks_of("zhj5D7i1QVeolgz1LoKbTg") is PROTOCOL and PROTOCOL.lists_exact_offsets
    assert quirks_of(None) is PROTOCOL


def test_on_a_protocol_broker_the_listing_is_the_answer_and_nothing_is_fetched():
    v = view([(3, 40)], [], quirks=PROTOCOL)
    assert v.bounds([TP0]) == {TP0: (3, 40)}
    assert v.consumer.fetches == 0


def test_on_a_protocol_broker_an_impossible_listing_is_asked_again_then_refused():
    assert view([(5, -1), (5, 40)], [], quirks=PROTOCOL).bounds([TP0]) == {TP0: (5, 40)}
    with pytest.raises(BrokerUnavailable, match=r"t partition 0.*latest 1"):
        view([(31, 1), (31, 1)], [], quirks=PROTOCOL).bounds([TP0])


def test_on_a_protocol_broker_a_lower_mark_is_asked_again_and_a_confirmed_one_accepted(caplog):
    v = view([(0, 40), (0, 30), (0, 30)], [], quirks=PROTOCOL)
    assert v.bounds([TP0]) == {TP0: (0, 40)}
    assert v.bounds([TP0]) == {TP0: (0, 30)}
    assert "lower high-water mark 30 after 40, confirmed" in caplog.text
    v2 = view([(0, 40), (0, 30), (0, 41)], [], quirks=PROTOCOL)  # a new leader's mark trailing for a moment
    v2.bounds([TP0])
    assert v2.bounds([TP0]) == {TP0: (0, 41)}


def test_record_sizes_are_sampled_from_the_last_records_at_most_once_a_minute(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(kafka_log.time, "monotonic", lambda: now[0])
    v = view([(0, 40), (0, 40)], [("record", 40), ("record", 40)], quirks=PROTOCOL)
    v._sampled_at = now[0] - kafka_log.SAMPLE_EVERY_S
    assert v.average_record_bytes() == 1024  # nothing bounded yet: no partition to sample
    v.bounds([TP0])
    assert v.average_record_bytes() == 2  # key b"k" + value b"v", fetched at offset 39
    assert v.consumer.fetches == 1
    now[0] += kafka_log.SAMPLE_EVERY_S / 2
    v.average_record_bytes()
    assert v.consumer.fetches == 1  # within the minute: no fetch
    now[0] += kafka_log.SAMPLE_EVERY_S
    v.average_record_bytes()
    assert v.consumer.fetches == 2


def test_a_record_size_sample_the_broker_does_not_answer_keeps_the_last_estimate(monkeypatch, caplog):
    v = view([(0, 40)], [("record", 40)], quirks=PROTOCOL)
    v.bounds([TP0])
    assert v.average_record_bytes() == 2

    def unreachable(probe):
        raise BrokerUnavailable("cannot fetch from Kafka at 127.0.0.1:1 within 30s")

    v._probe = unreachable  # type: ignore[method-assign]
    v._sampled_at -= kafka_log.SAMPLE_EVERY_S
    assert v.average_record_bytes() == 2
    assert "record sizes not sampled, the last estimate kept" in caplog.text
