"""The retention guard's computation: an archiver's lag in time against its topic's retention."""

from __future__ import annotations

from weir.checkpoint.files import Checkpoint
from weir.lake.guard import PartitionState, RetentionGuard, assess, retention_ms

HOUR = 3_600_000
NOW = 1_000 * HOUR


def state(next_offset: int | None, earliest: int = 0, latest: int = 100, oldest_ms: int | None = NOW - HOUR):
    return PartitionState("t", 0, next_offset, earliest, latest, oldest_ms)


def test_caught_up_is_no_risk_whatever_the_retention():
    assert assess(state(100, oldest_ms=None), 1, NOW, 0.5) is None


def test_lag_below_the_threshold_is_no_risk():
    assert assess(state(40), 3 * HOUR, NOW, 0.5) is None  # 1 h of 3 h: a third


def test_lag_beyond_the_threshold_is_a_risk_with_the_time_left():
    risk = assess(state(40), int(1.5 * HOUR), NOW, 0.5)
    assert risk is not None and risk.reason == "lag"
    assert (risk.lag_ms, risk.retention_ms, risk.time_left_ms) == (HOUR, int(1.5 * HOUR), HOUR // 2)
    assert (risk.next_offset, risk.earliest_offset, risk.latest_offset, risk.lost_offsets) == (40, 0, 100, 0)
    assert "lags 3600000 ms" in risk.message() and "50%" in risk.message()


def test_lag_past_the_retention_has_negative_time_left():
    risk = assess(state(40, oldest_ms=NOW - 2 * HOUR), HOUR, NOW, 0.5)
    assert risk is not None and risk.time_left_ms == -HOUR


def test_broker_past_the_archiver_is_lost_records():
    risk = assess(state(40, earliest=55), 7 * 24 * HOUR, NOW, 0.5)
    assert risk is not None and risk.reason == "lost"
    assert (risk.lost_offsets, risk.time_left_ms, risk.next_offset, risk.earliest_offset) == (15, 0, 40, 55)
    assert "[40, 55)" in risk.message()


def test_lost_records_are_reported_even_without_retention_or_backlog():
    risk = assess(state(40, earliest=100, latest=100, oldest_ms=None), None, NOW, 0.5)
    assert risk is not None and risk.reason == "lost" and risk.lag_ms == 0


def test_unlimited_retention_is_no_lag_risk():
    assert assess(state(0, oldest_ms=0), None, NOW, 0.5) is None


def test_a_new_archiver_starts_at_the_earliest_offset():
    risk = assess(state(None, earliest=20), HOUR, NOW, 0.5)
    assert risk is not None and risk.reason == "lag" and risk.next_offset == 20 and risk.lost_offsets == 0


def test_future_timestamps_are_no_lag():
    assert assess(state(0, oldest_ms=NOW + HOUR), HOUR, NOW, 0.01) is None


def test_unknown_timestamp_is_no_lag_risk():
    assert assess(state(0, oldest_ms=None), HOUR, NOW, 0.01) is None


def test_retention_ms_from_topic_config():
    assert retention_ms({"retention.ms": "604800000"}) == 604_800_000
    assert retention_ms({"retention.ms": "-1"}) is None
    assert retention_ms({}) is None
    assert retention_ms({"retention.ms": "soon"}) is None


class _Admin:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.calls = 0

    def config(self, name: str) -> dict[str, str]:
        self.calls += 1
        if self.fail:
            raise RuntimeError("broker down")
        return {"retention.ms": str(HOUR)}

    def topics(self) -> dict[str, int]:
        return {"t": 1}

    def end_offsets(self, tps):
        return {("t", 0): (0, 10)}


def test_tick_checks_once_per_interval_and_never_raises(monkeypatch, tmp_path):
    from weir.lake import guard
    from weir.storage.lake import Lake

    monkeypatch.setattr(guard, "timestamps_at", lambda client, wanted: {tp: 0 for tp in wanted})
    published = []
    archivers = [
        guard.Archiver("archive.t", "t", Checkpoint(str(tmp_path / "no-checkpoint")), Lake(str(tmp_path / "lake")))
    ]

    def publish(processor, body):
        published.append((body.KIND, processor, body.fields()))

    g = RetentionGuard(archivers, _Admin(), {}, publish, interval=3600, threshold=0.5)
    risks = g.tick()
    assert [(r.topic, r.partition, r.reason) for r in risks] == [("t", 0, "lag")]
    assert g.tick() == []  # within the interval: no second check
    [(kind, processor, fields)] = published
    assert (kind, processor, fields["topic"], fields["partition"], fields["retention_ms"]) == (
        "retention_risk", "archive.t", "t", 0, HOUR,
    )  # fmt: skip
    assert fields["lag_ms"] > fields["retention_ms"] and fields["time_left_ms"] < 0

    broken = RetentionGuard(archivers, _Admin(fail=True), {}, publish, interval=1, threshold=0.5)
    assert broken.tick() == []  # logged, not raised: the supervisor goes on
    off = RetentionGuard(archivers, _Admin(), {}, publish, interval=0, threshold=0.5)
    assert off.tick() == [] and len(published) == 1
