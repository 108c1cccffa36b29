"""The monitor's state fed by hand: progress records and broker polls on a hand-driven clock, health
transitions, malformed records, runners' state files, retention reports, and what survives a restart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from weir.monitor.config import MonitorConfig
from weir.monitor.sources import read_runs, start_offset
from weir.monitor.state import BrokerSnapshot, Monitor
from weir.monitor.store import StateFile

T0 = 1_800_000_000.0  # seconds


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t

    def ms(self, plus: float = 0.0) -> int:
        return int((self.t + plus) * 1000)


def progress(clock: Clock, processor="enrich", batch_id=1, end=100, latest=None, rows=100, **kw) -> bytes:
    record = {
        "type": "progress", "pipeline": "shop", "processor": processor, "at_ms": clock.ms(), "batch_id": batch_id,
        "run_id": "r1", "batch_at": None, "input_rows": rows, "batch_duration_ms": 300,
        "sources": [{"end_offset": {"orders": {"0": end}}, "latest_offset": {"orders": {"0": latest or end}}}],
        "accounting": {"in": rows, "out": rows, "balanced": True, "outputs": {"orders.enriched": rows}},
        "restarts": 0,
    }  # fmt: skip
    record.update(kw)
    return json.dumps(record).encode()


def snapshot(clock: Clock, latest: int, stamps: dict | None = None) -> BrokerSnapshot:
    return BrokerSnapshot(clock.ms(), {("orders", 0): (0, latest), ("orders.enriched", 0): (0, 10)},
                          {"orders": 86_400_000}, stamps or {})  # fmt: skip


@pytest.fixture
def clock() -> Clock:
    return Clock()


def monitor(clock: Clock, **cfg) -> Monitor:
    config = MonitorConfig.model_validate({"alerts": [{"expr": "stalled(*)"}, {"expr": "dead(*)"}], **cfg})
    return Monitor(config, clock=clock)


def health(m: Monitor, key: str = "shop/enrich") -> str:
    m.refresh()
    return m.tracks[key].figures.health


def test_topology_comes_from_progress_records(clock):
    m = monitor(clock)
    m.ingest(progress(clock, accounting={"in": 10, "out": 9, "dlq": 1, "outputs": {"orders.enriched": 9,
                                                                                   "orders.dlq": 1}}))  # fmt: skip
    m.refresh()
    t = m.tracks["shop/enrich"]
    assert t.inputs == {"orders"} and t.outputs == {"orders.enriched"} and t.side_outputs == {"orders.dlq"}
    topo = m.topology()
    assert {(e["from"], e["to"]) for e in topo["edges"]} == {
        ("orders", "shop/enrich"),
        ("shop/enrich", "orders.enriched"),
    }
    assert m.topics_of_interest() == {"_weir.progress", "orders", "orders.enriched", "orders.dlq"}


def test_stalled_within_two_triggers_of_pending_input_then_healthy_again(clock):
    m = monitor(clock)
    m.declare("shop", "enrich", ["orders"], ["orders.enriched"], trigger_ms=1000)
    m.ingest(progress(clock, end=100))
    m.observe_broker(snapshot(clock, 100))
    assert health(m) == "healthy"
    clock.t += 1.0
    m.observe_broker(snapshot(clock, 150))  # 50 new records seen
    clock.t += 1.5
    assert health(m) == "healthy"  # 1.5 s: within 2 triggers
    clock.t += 1.0
    events = m.refresh()
    f = m.tracks["shop/enrich"].figures
    assert f.health == "stalled" and f.lag.records == 50
    assert [(e["rule"], e["status"]) for e in events] == [("stalled(*)", "firing")]
    m.ingest(progress(clock, batch_id=2, end=150))  # it catches up
    m.observe_broker(snapshot(clock, 150))
    events = m.refresh()
    assert m.tracks["shop/enrich"].figures.health == "healthy"
    assert [(e["rule"], e["status"]) for e in events] == [("stalled(*)", "resolved")]


def test_failure_makes_it_dead_until_it_runs_again(clock):
    m = monitor(clock)
    m.ingest(progress(clock))
    failure = {"type": "failure", "pipeline": "shop", "processor": "enrich", "at_ms": clock.ms(),
               "error": "ValueError: bad", "restarts": 0, "failures_in_row": 1, "next_restart_in_s": 1.0}  # fmt: skip
    m.ingest(json.dumps(failure).encode())
    assert health(m) == "dead"
    assert "ValueError: bad" in m.tracks["shop/enrich"].figures.health_reason
    running = {"type": "state", "pipeline": "shop", "processor": "enrich", "at_ms": clock.ms(), "state": "running"}
    m.ingest(json.dumps(running).encode())
    assert health(m) == "healthy"
    m.ingest(json.dumps({**failure, "next_restart_in_s": None}).encode())  # given up
    assert health(m) == "dead" and m.tracks["shop/enrich"].lifecycle == "failed"
    assert m.tracks["shop/enrich"].figures.run.failures_total == 2


def test_silence_makes_it_dead_unless_the_broker_is_unreachable(clock):
    m = monitor(clock, dead_after="30s")
    m.ingest(progress(clock))
    m.observe_broker(snapshot(clock, 100))
    clock.t += 20
    m.observe_broker(snapshot(clock, 100))
    assert health(m) == "healthy"
    clock.t += 15
    m.observe_broker(snapshot(clock, 100))
    assert health(m) == "dead"
    m.observe_broker_down("cannot read metadata")
    clock.t += 30  # broker figures now stale: silence is not judged
    assert health(m) == "healthy"
    overview = m.overview()
    assert overview["broker"]["reachable"] is False and overview["broker"]["stale"] is True
    assert overview["processors"]["shop/enrich"]["stale"] is True
    assert overview["topology"]["nodes"][1]["health"] == "unknown"  # a topic while the broker is down


def test_an_idle_processor_says_so_and_stays_healthy_past_dead_after(clock):
    """Spark 3.5+ reports an idle query by an idle event every 10 s, not a progress event: the runner's `idle`
    records are its sign of life (a processor with no input overnight is not dead)."""
    m = monitor(clock, dead_after="30s")
    m.ingest(progress(clock))
    for _ in range(6):  # a minute with no input, an idle record every 10 s
        clock.t += 10
        m.observe_broker(snapshot(clock, 100))
        idle = {"type": "idle", "pipeline": "shop", "processor": "enrich", "at_ms": clock.ms(), "query_id": "q"}
        m.ingest(json.dumps(idle).encode())
    assert health(m) == "healthy" and m.counts["unknown_kind"] == 0
    clock.t += 31  # and silence after them is death again
    m.observe_broker(snapshot(clock, 100))
    assert health(m) == "dead"


def test_a_declared_processor_that_never_reports_turns_dead(clock):
    m = monitor(clock, dead_after="60s")
    m.declare("shop", "ghost", ["orders"], ["x"], trigger_ms=1000)
    m.observe_broker(snapshot(clock, 0))
    assert health(m, "shop/ghost") == "unknown"
    clock.t += 61
    m.observe_broker(snapshot(clock, 0))  # silence is judged only while the broker is heard
    assert health(m, "shop/ghost") == "dead"


def test_behind_when_the_lag_troughs_rise(clock):
    m = monitor(clock, behind_window="60s")
    m.declare("shop", "enrich", ["orders"], [], trigger_ms=1000)
    end = 0
    for i in range(31):
        latest = 1000 + i * 100  # 100 records every 2 s arrive...
        end += 60  # ...and it commits 60
        m.ingest(progress(clock, batch_id=i + 1, end=end, latest=latest))
        m.observe_broker(snapshot(clock, latest))
        clock.t += 2
    assert health(m) == "behind"
    f = m.tracks["shop/enrich"].figures
    assert f.lag.growing and f.rates.input == pytest.approx(50.0) and f.rates.processing == pytest.approx(30.0)


def test_lag_seconds_freshness_and_retention_from_the_oldest_unprocessed_record(clock):
    m = monitor(clock)
    m.ingest(progress(clock, end=100))
    bounds = {("orders", 0): (0, 150)}
    assert m.wanted_timestamps(bounds) == {(("orders", 0), 100)}
    m.observe_broker(snapshot(clock, 150, {(("orders", 0), 100): clock.ms(-45)}))
    assert m.wanted_timestamps(bounds) == set()  # known now: not fetched again
    m.refresh()
    f = m.tracks["shop/enrich"].figures
    assert f.lag.seconds == 45 and f.freshness.seconds == 45
    assert f.retention.left_s == 86_400 - 45 and f.retention.partition == "orders/0"
    assert m.outputs["orders.enriched"].freshness_s == 45
    # It processed 20 more: until the next poll fetches the timestamp at 120, the one at 100 stands in.
    clock.t += 1
    m.ingest(progress(clock, batch_id=2, end=120))
    m.refresh()
    assert m.wanted_timestamps(bounds) == {(("orders", 0), 120)}
    assert m.tracks["shop/enrich"].figures.lag.seconds == 46


def test_retention_risk_records_are_surfaced(clock):
    m = monitor(clock)
    risk = {"type": "retention_risk", "pipeline": "shop", "processor": "archive.orders", "at_ms": clock.ms(),
            "topic": "orders", "partition": 0, "reason": "lag", "lag_ms": 151_200_000,
            "retention_ms": 259_200_000, "time_left_ms": 108_000_000, "message": "behind"}  # fmt: skip
    m.ingest(json.dumps(risk).encode())
    clock.t += 100
    m.refresh()
    f = m.tracks["shop/archive.orders"].figures
    assert f.retention.left_s == 108_000 - 100 and f.retention.reports[0].reason == "lag"
    clock.t += 700  # older than retention_report_ttl: no longer counted
    m.refresh()
    assert m.tracks["shop/archive.orders"].figures.retention.left_s is None


def test_batches_feed_series_histograms_rates_and_violations(clock):
    m = monitor(clock, series_points=10)
    for i in range(30):
        batch_at = f"2027-01-15T08:00:{i * 2:02d}.000Z"
        acc = {"in": 100, "out": 90, "dlq": 6, "late": 2, "filtered": 2, "outputs": {}}
        if i == 7:
            acc = {**acc, "out": 80, "balanced": False, "unaccounted": 10, "violations": 1}
        m.ingest(progress(clock, batch_id=i, end=100 * (i + 1), batch_at=batch_at, accounting=acc))
        clock.t += 2
    m.refresh()
    t = m.tracks["shop/enrich"]
    f = t.figures
    assert len(t.series["batch_ms"].points) == 10  # bounded
    assert f.rates.dlq == pytest.approx(0.06) and f.rates.late == pytest.approx(0.02)
    a = f.accounting
    assert a.violations_total == 1 and a.violations_window == 1 and a.last_violation.batch_id == 7
    assert f.batch_ms.count == 30 and f.batch_ms.p50 == 300
    # batches 2 s apart with a 1 s trigger: each started 1 s later than scheduled
    assert f.scheduling_delay_ms.count == 29 and f.scheduling_delay_ms.max == 1000


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "not an object"),
        (None, "empty message"),
        (b'{"type": "progress"}', "missing field 'processor'"),
        (b'{"type": "state", "processor": "p", "at_ms": 1}', "missing field 'pipeline'"),
        (b'{"type": "progress", "pipeline": "s", "processor": "p", "at_ms": "soon"}', "'at_ms' is str, not int"),
        (b'{"type": "progress", "pipeline": "s", "processor": "p", "at_ms": 1, "batch_id": 1, "input_rows": "x",'
         b' "sources": [], "accounting": {"in": 1}}', "'input_rows' is str"),
        (b'{"type": "progress", "pipeline": "s", "processor": "p", "at_ms": 1, "batch_id": 1, "input_rows": 1,'
         b' "sources": [{"end_offset": {"t": {"0": "x"}}}], "accounting": {"in": 1}}', "end_offset['t'][0] is str"),
        (b'{"type": "progress", "pipeline": "s", "processor": "p", "at_ms": 1, "batch_id": 1, "input_rows": NaN,'
         b' "sources": [], "accounting": {"in": 1}}', "missing field 'input_rows'"),
        (b'{"type": "progress", "pipeline": "s", "processor": "p", "at_ms": 1, "batch_id": true, "input_rows": 1,'
         b' "sources": [], "accounting": {"in": 1}}', "'batch_id' is a boolean"),
        (b'{"type": "state", "pipeline": "s", "processor": "p", "at": "yesterday", "state": "x"}', "not an ISO time"),
        (b'{"type": "progress", "pipeline": "s", "processor": "p", "at_ms": 1, "batch_id": 1, "input_rows": 1,'
         b' "sources": [{"end_offset": {"t": {"0": 1}, "u": 7}}], "accounting": {"in": 1}}',
         "end_offset['u'] is int, not partition offsets"),
        (b'{"type": "state", "pipeline": "s", "processor": "p", "at_ms": 1, "state": "running",'
         b' "client_rebuilds": {"sink producer": "2"}}', "client_rebuilds['sink producer'] is str, not int"),
    ],
)  # fmt: skip
def test_malformed_records_are_counted_and_skipped(clock, caplog, value, reason):
    m = monitor(clock)
    with caplog.at_level("WARNING", logger="weir.monitor"):
        assert m.ingest(value, where="_weir.progress/0@7") is None
    assert m.counts["bad"] == 1 and reason in m.bad_reasons[-1]["reason"]
    assert any("_weir.progress/0@7" in r.getMessage() and reason in r.getMessage() for r in caplog.records)
    assert m.ingest(progress(clock)) is not None  # and the next good record is read as usual
    m.refresh()
    assert m.overview()["monitor"]["bad_records"] == 1


def test_a_source_that_is_not_kafka_has_no_positions_but_its_batches_count(clock):
    """The shop demo's generator reports {"records": 120}: its own offset, not Kafka partitions."""
    m = monitor(clock)
    rec = m.ingest(
        b'{"type": "progress", "pipeline": "shop", "processor": "generate", "at_ms": 1, "batch_id": 3,'
        b' "input_rows": 120, "sources": [{"end_offset": {"records": 120}, "latest_offset": "{\\"records\\": 240}"}],'
        b' "accounting": {"in": 120, "out": 120}}'
    )  # fmt: skip
    assert rec is not None and rec.end_offsets == {} and rec.latest_offsets == {} and rec.batch_id == 3
    assert m.counts["bad"] == 0


def test_unknown_kinds_are_counted_apart(clock):
    m = monitor(clock)
    m.ingest(b'{"type": "hologram", "pipeline": "s", "processor": "p", "at_ms": 1}')
    assert m.counts["unknown_kind"] == 1 and m.counts["bad"] == 0


def test_pipeline_from_the_key_and_time_from_at(clock):
    m = monitor(clock)
    rec = m.ingest(b'{"type": "state", "processor": "p", "at": "2027-01-15T08:00:00.000Z", "state": "running"}',
                   key=b"shop/p")  # fmt: skip
    assert rec.key == "shop/p" and rec.at_ms == 1_800_000_000_000


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_runner_state_files(clock, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    body = {"pipeline": "shop", "pid": _dead_pid(), "updated": "x", "stopping": False,
            "processors": {"enrich": {"state": "running", "checkpoint": "/cp/shop/enrich"},
                           "done": {"state": "stopped", "checkpoint": "/cp/shop/done"}}}  # fmt: skip
    (run / "shop.json").write_text(json.dumps(body))
    (run / "torn.json").write_text("{")
    runs = read_runs(str(tmp_path))
    assert [r["pipeline"] for r in runs] == ["shop"] and runs[0]["alive"] is False
    m = monitor(clock)
    m.ingest(progress(clock))
    m.observe_runs(runs)
    assert health(m) == "dead" and "runner's process is gone" in m.tracks["shop/enrich"].figures.health_reason
    assert health(m, "shop/done") == "stopped"
    assert m.checkpoints()["shop/enrich"] == "/cp/shop/enrich"
    (run / "shop.json").write_text(json.dumps({**body, "pid": os.getpid()}))
    m.observe_runs(read_runs(str(tmp_path)))
    assert health(m) == "healthy"


def test_a_runner_stopping_its_queries_is_not_a_process_gone(clock, tmp_path):
    """The demo's loaded run: a runner that stops writes its file with "stopping" while its queries still say
    running; its process lives. Not dead ("its runner's process is gone" fired for all 12 processors); dead once
    the process is gone with a query not stopped."""
    run = tmp_path / "run"
    run.mkdir()
    body = {"pipeline": "shop", "pid": os.getpid(), "updated": "x", "stopping": True,
            "processors": {"enrich": {"state": "running", "checkpoint": "/cp/shop/enrich"}}}  # fmt: skip
    (run / "shop.json").write_text(json.dumps(body))
    m = monitor(clock)
    m.ingest(progress(clock))
    m.observe_runs(read_runs(str(tmp_path)))
    assert health(m) == "healthy", m.tracks["shop/enrich"].figures.health_reason
    (run / "shop.json").write_text(json.dumps({**body, "pid": _dead_pid()}))
    m.observe_runs(read_runs(str(tmp_path)))
    assert health(m) == "dead" and "runner's process is gone" in m.tracks["shop/enrich"].figures.health_reason


def test_declared_pipelines_and_unknown_rule_targets(clock):
    from weir.config import Settings
    from weir.monitor.service import declare_pipeline, unknown_targets
    from weir.pipeline import Pipeline

    p = Pipeline("shop")
    orders = p.topic("orders", schema="id STRING")
    enriched = p.topic("orders.enriched", schema="id STRING")

    @p.processor(inputs=[orders], outputs=[enriched], trigger="5 seconds")
    def enrich(df):
        return df

    settings = Settings(checkpoint_root="/cp", trigger="2 seconds")
    config = MonitorConfig.model_validate({"alerts": [{"expr": "stalled(enrich)"}, {"expr": "stalled(nope)"},
                                                      {"expr": "freshness(orders.enriched) > 1m"}]})  # fmt: skip
    m = Monitor(config, clock=clock)
    declare_pipeline(m, p, settings)
    t = m.tracks["shop/enrich"]
    assert (t.inputs, t.outputs, t.trigger_ms, t.checkpoint) == (
        {"orders"},
        {"orders.enriched"},
        5000,
        "/cp/shop/enrich",
    )
    warnings = unknown_targets(m, config)
    assert len(warnings) == 1 and "'nope'" in warnings[0]


def test_state_file_round_trip_and_a_corrupt_one(tmp_path):
    store = StateFile(str(tmp_path), "127.0.0.1:9092", "_weir.progress")
    store.save({0: 42, 1: 7}, {"active": [], "history": [{"rule": "x"}]})
    again = StateFile(str(tmp_path), "127.0.0.1:9092", "_weir.progress")
    assert again.positions() == {0: 42, 1: 7} and again.alerts()["history"] == [{"rule": "x"}]
    assert StateFile(str(tmp_path), "other:9092", "_weir.progress").positions() == {}  # another cluster
    Path(store.path).write_text("{torn")
    fresh = StateFile(str(tmp_path), "127.0.0.1:9092", "_weir.progress")
    assert fresh.positions() == {} and (tmp_path / "monitor" / "state.json.bad").is_file()


def test_start_offsets_of_the_progress_topic():
    # first start: the last `replay` records, for history
    assert start_offset(0, 10_000, None, replay=2000, catch_up_max=100_000) == 8000
    # restart: from where it stopped when that is further back than the replay...
    assert start_offset(0, 10_000, 5000, replay=2000, catch_up_max=100_000) == 5000
    # ...never beyond catch_up_max back, nor before the earliest offset
    assert start_offset(0, 500_000, 5000, replay=2000, catch_up_max=100_000) == 400_000
    assert start_offset(9000, 10_000, 5000, replay=2000, catch_up_max=100_000) == 9000
    assert start_offset(0, 100, None, replay=2000, catch_up_max=100_000) == 0


@pytest.mark.parametrize(
    "stale",
    [("shop.ff000000.json", "running", False), ("shop.json", "stopped", True)],
    ids=["a killed runner's file", "a stopped runner's file"],
)
def test_a_live_runners_file_speaks_for_its_processors_over_a_stale_one(clock, tmp_path, stale):
    """enrich ran under one runner, which is gone; now a live runner of some processors (-P) has it."""
    name, state, stopping = stale
    run = tmp_path / "run"
    run.mkdir()

    def state_file(file: str, pid: int, state: str, updated: str, stopping: bool = False) -> None:
        body = {"pipeline": "shop", "pid": pid, "updated": updated, "stopping": stopping,
                "processors": {"enrich": {"state": state, "checkpoint": "/cp/shop/enrich"}}}  # fmt: skip
        (run / file).write_text(json.dumps(body))

    state_file(name, _dead_pid(), state, "2026-01-01T00:00:00.000Z", stopping)
    state_file("shop.00000000.json", os.getpid(), "running", "2026-01-01T00:05:00.000Z")
    m = monitor(clock)
    m.ingest(progress(clock))
    for _ in range(3):  # every poll alike: no flicker between the two files
        m.observe_runs(read_runs(str(tmp_path)))
        assert health(m) == "healthy" and m.tracks["shop/enrich"].runner_alive is True


def test_a_partition_left_behind_while_the_others_advance_is_stuck_not_idle(clock):
    """Quix Streams #1124: a consumer silently stopped fetching one partition while its lag grew. Here partition
    1 of orders never moves while partition 0's batches go on: stalled, naming the partition (issue 12)."""
    m = monitor(clock)
    m.declare("shop", "enrich", ["orders"], ["orders.enriched"], trigger_ms=1000)

    def batch(i: int, p0: int) -> bytes:
        ends = {"orders": {"0": p0, "1": 50}}
        return progress(clock, batch_id=i, rows=10, sources=[{"end_offset": ends, "latest_offset": ends}])

    def broker(p0: int) -> BrokerSnapshot:
        return BrokerSnapshot(clock.ms(), {("orders", 0): (0, p0), ("orders", 1): (0, 400)}, {}, {})

    for i in range(1, 6):
        m.ingest(batch(i, 100 * i))
        m.observe_broker(broker(100 * i))
        clock.t += 1.0
        if i == 2:
            assert health(m) == "healthy"  # frozen for 2 s only: within the stall limit (2 triggers)
    f = (m.refresh(), m.tracks["shop/enrich"].figures)[1]
    assert f.health == "stalled"
    assert f.health_reason.startswith("partition orders/1 at offset 50, 350 pending, frozen for")
    # An idle partition (nothing pending on it) is never stuck, however long it stays put.
    m.observe_broker(BrokerSnapshot(clock.ms(), {("orders", 0): (0, 500), ("orders", 1): (0, 50)}, {}, {}))
    assert health(m) == "healthy"


def test_the_monitor_shows_the_audits_silent_gaps_and_alerts_on_them(clock, tmp_path):
    from weir.config import Settings
    from weir.monitor.metrics import render
    from weir.monitor.service import MonitorService
    from weir.pipeline import Pipeline

    p = Pipeline("shop")
    orders = p.topic("orders", schema="id STRING")

    @p.processor(inputs=[orders], outputs=[])
    def enrich(df):
        return df

    settings = Settings(home=str(tmp_path / "home"), checkpoint_root=str(tmp_path / "cp"),
                        bootstrap_servers="127.0.0.1:1")  # fmt: skip
    config = MonitorConfig.model_validate({"read_checkpoints": True, "alerts": [{"expr": "gaps(*)"}]})
    service = MonitorService(settings, config, [p], clock=clock)
    service.poller.poll_once = lambda: None  # no broker here: the checkpoints are what is read
    cp = tmp_path / "cp" / "shop" / "enrich"
    (cp / "offsets").mkdir(parents=True)
    (cp / "commits").mkdir()
    (cp / "metadata").write_text('{"id":"5f1e0000-0000-0000-0000-000000000000"}')
    for batch, start, end in ((0, 0, 10), (1, 14, 20)):  # batch 1 skips 10-13, counted nowhere
        line = {"orders": {"0": end}, "@start": {"orders": {"0": start}}}
        (cp / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{json.dumps(line)}\n')
        (cp / "commits" / str(batch)).write_text("v1\n{}\n")
    try:
        service.poll()
        m = service.monitor
        m.refresh()
        f = m.tracks["shop/enrich"].figures
        assert (f.completeness.silent_gaps, f.completeness.silent_offsets) == (1, 4)
        assert f.to_json()["gaps"] == ["orders/0 10-13"]
        assert [a["kind"] for a in m.alerts.firing()] == ["gaps"]
        assert 'weir_processor_silent_gaps{pipeline="shop",processor="enrich"} 1.0' in render(m).decode()
        line = {"orders": {"0": 20}, "@start": {"orders": {"0": 10}}}  # the same log without the skip
        (cp / "offsets" / "1").write_text(f'v1\n{{"batchWatermarkMs":0}}\n{json.dumps(line)}\n')
        service._audits.clear()  # the cache trusts Spark never to rewrite a batch: this test does
        service.poll()
        m.refresh()
        assert m.tracks["shop/enrich"].figures.completeness.silent_gaps == 0 and not m.alerts.firing()
    finally:
        service.reader.close()


def dead_and_unbalanced(m: Monitor, clock: Clock) -> list[str]:
    """Two processors report a batch (enrich's violates its accounting), then nothing for 90 s: both die."""
    m.ingest(progress(clock))
    m.ingest(progress(clock, processor="total", accounting={"in": 100, "out": 90, "balanced": False,
                                                            "violations": 1}))  # fmt: skip
    m.observe_broker(snapshot(clock, 100))
    m.refresh()
    clock.t += 90
    m.observe_broker(snapshot(clock, 100))
    m.refresh()
    return sorted(f"{a['rule']} {a['target']}" for a in m.alerts.firing())


def test_default_rules_fire_with_no_configuration(clock):
    """Every processor dead, one with an accounting violation: with no rule configured the monitor said
    "no alert firing" (issue 28, item 12)."""
    m = Monitor(MonitorConfig.model_validate({}), clock=clock)
    assert {r.name for r in m.alerts.rules} == {"dead", "stalled", "waiting", "violations", "retention at risk",
                                                "gaps", "release drift"}  # fmt: skip
    assert dead_and_unbalanced(m, clock) == ["dead shop/enrich", "dead shop/total", "violations shop/total"]


def test_a_users_config_changes_or_turns_default_rules_off(clock, tmp_path):
    from weir.monitor.config import load_config

    toml = tmp_path / "monitor.toml"
    toml.write_text(
        '[[alerts]]\nname = "dead"\nenabled = false\n\n'  # off
        '[[alerts]]\nname = "violations"\nexpr = "violations(*) > 5"\n'  # changed: more than 5
    )
    config = load_config(path=str(toml))
    assert "dead" not in {r.name for r in config.rules}
    again = MonitorConfig.model_validate(config.model_dump(by_alias=True, exclude={"alerts": {"__all__": {"expr"}}}))
    assert [r.name for r in again.rules] == [r.name for r in config.rules]
    assert next(r for r in config.alerts if r.name == "violations").threshold == 5
    assert dead_and_unbalanced(Monitor(config, clock=clock), clock) == []
    quiet = MonitorConfig.model_validate({"default_alerts": False})
    assert quiet.rules == [] and MonitorConfig.model_validate(quiet.model_dump()).alerts == []
    with pytest.raises(ValueError, match="no default rule has that name"):
        MonitorConfig.model_validate({"alerts": [{"name": "deed", "enabled": False}]})


def _record(clock: Clock, kind: str, processor: str = "enrich", **fields) -> bytes:
    record = {"type": kind, "pipeline": "shop", "processor": processor, "at_ms": clock.ms(), **fields}
    return json.dumps(record).encode()


def test_a_live_runner_starting_its_processors_is_heard_as_starting_not_dead(clock, tmp_path):
    """Issue 58: `weir status` showed all 8 processors dead while their runner started them, and 18 `dead` alerts
    fired. The monitor has run for 10 minutes; the runner's state file names its live process."""
    m = monitor(clock)
    clock.t += 600
    run = tmp_path / "run"
    run.mkdir()
    started = clock.ms()
    body = {"pipeline": "shop", "pid": os.getpid(), "updated": "x", "started": _iso(started), "stopping": False,
            "processors": {n: {"state": "pending", "checkpoint": f"/cp/{n}"} for n in ("enrich", "late")}}  # fmt: skip
    (run / "shop.json").write_text(json.dumps(body))
    m.observe_runs(read_runs(str(tmp_path)))
    m.observe_broker(snapshot(clock, 100))
    clock.t += 45  # its Spark session and its tracing: nothing published yet
    m.observe_broker(snapshot(clock, 100))
    assert health(m) == health(m, "shop/late") == "starting"
    assert "has not launched it for 45s" in m.tracks["shop/enrich"].figures.health_reason
    # Its queries start one at a time: a "starting" state, then heartbeats every 10 s until a first batch.
    body["processors"] = {n: {"state": "starting", "checkpoint": f"/cp/{n}"} for n in ("enrich", "late")}
    (run / "shop.json").write_text(json.dumps(body))
    m.observe_runs(read_runs(str(tmp_path)))
    for n in ("enrich", "late"):
        m.ingest(_record(clock, "state", n, state="starting"))
    launched = clock.ms()
    for _ in range(12):  # two minutes
        clock.t += 10
        m.observe_broker(snapshot(clock, 100))
        for n in ("enrich", "late"):
            m.ingest(_record(clock, "heartbeat", n, phase="starting", since_ms=launched))
        m.refresh()
        assert [t.figures.health for t in m.tracks.values()] == ["starting", "starting"]
    assert not m.alerts.firing() and m.counts["heartbeat"] == 24 and m.counts["unknown_kind"] == 0
    assert m.overview()["health"] == {"starting": 2}
    # enrich's query started ("running") and runs its first batch: still starting until that batch reports.
    body["processors"]["enrich"]["state"] = "running"
    (run / "shop.json").write_text(json.dumps(body))
    m.observe_runs(read_runs(str(tmp_path)))
    m.ingest(_record(clock, "state", state="running"))
    assert health(m) == "starting"
    m.ingest(progress(clock, end=100))
    assert health(m) == "healthy" and health(m, "shop/late") == "starting"


def test_a_long_batch_is_running_then_stalled_past_batch_timeout_and_a_killed_runner_is_dead_at_once(clock, tmp_path):
    """The 89 s Delta batch of issue 58, after 1 s batches, with input pending: running, not dead; past
    batch_timeout it is flagged; its runner SIGKILLed, dead at the next look at its state file."""
    m = monitor(clock)  # batch_timeout: 10 minutes
    m.declare("shop", "enrich", ["orders"], ["orders.enriched"], trigger_ms=1000)
    run = tmp_path / "run"
    run.mkdir()
    body = {"pipeline": "shop", "pid": os.getpid(), "updated": "x", "stopping": False,
            "processors": {"enrich": {"state": "running", "checkpoint": "/cp/enrich"}}}  # fmt: skip
    (run / "shop.json").write_text(json.dumps(body))
    m.observe_runs(read_runs(str(tmp_path)))
    for i in range(5):
        clock.t += 1
        m.ingest(progress(clock, batch_id=i, end=100 * (i + 1), batch_duration_ms=900))
    m.observe_broker(snapshot(clock, 500))
    assert health(m) == "healthy"
    clock.t += 1
    m.observe_broker(snapshot(clock, 5000))  # input pending, and batch 5 runs on
    began = clock.ms()
    seen = []
    for _ in range(9):
        clock.t += 10
        m.ingest(_record(clock, "heartbeat", phase="batch", batch_id=5, since_ms=began))
        m.observe_broker(snapshot(clock, 5000))
        seen.append(health(m))
    assert seen == ["running"] * 9
    assert m.tracks["shop/enrich"].figures.health_reason.startswith("batch 5 in progress for 90s")
    assert not m.alerts.firing()
    for _ in range(51):  # on past batch_timeout
        clock.t += 10
        m.ingest(_record(clock, "heartbeat", phase="batch", batch_id=5, since_ms=began))
        m.observe_broker(snapshot(clock, 5000))
        seen.append(health(m))
    assert seen == ["running"] * 60  # up to 600 s
    clock.t += 10
    m.ingest(_record(clock, "heartbeat", phase="batch", batch_id=5, since_ms=began))
    assert health(m) == "stalled"
    assert m.tracks["shop/enrich"].figures.health_reason == "batch 5 in progress for 610s, past batch_timeout (600s)"
    # The batch reports: what the heartbeat said is over.
    m.ingest(progress(clock, batch_id=5, end=5000, batch_duration_ms=120_000))
    m.observe_broker(snapshot(clock, 5000))
    assert health(m) == "healthy"
    # Batch 6 runs when its runner is SIGKILLed: its last heartbeat says a batch runs, its process is gone.
    clock.t += 10
    m.ingest(_record(clock, "heartbeat", phase="batch", batch_id=6, since_ms=clock.ms(-9)))
    assert health(m) == "running"
    clock.t += 1
    (run / "shop.json").write_text(json.dumps({**body, "pid": _dead_pid()}))
    m.observe_runs(read_runs(str(tmp_path)))
    assert health(m) == "dead" and m.tracks["shop/enrich"].figures.health_reason == "its runner's process is gone"


def test_heartbeats_that_stop_with_no_state_file_to_read_are_dead_after_dead_after(clock):
    """A monitor on another host than the runner reads no state file: a runner's heartbeats stopping is its death,
    dead_after after the last one."""
    m = monitor(clock, dead_after="30s")
    m.ingest(progress(clock))
    for _ in range(6):
        clock.t += 10
        m.ingest(_record(clock, "heartbeat", phase="batch", batch_id=2, since_ms=clock.ms(-60)))
        m.observe_broker(snapshot(clock, 100))
        assert health(m) == "running"
    clock.t += 31
    m.observe_broker(snapshot(clock, 100))
    assert health(m) == "dead" and m.tracks["shop/enrich"].figures.health_reason == "no progress record for 31s"


def _iso(ms: int) -> str:
    from weir.units import iso

    return iso(ms)


def test_a_new_runner_starting_a_processor_the_last_one_gave_up_or_stopped_is_starting(clock, tmp_path):
    """The last runner gave enrich up (failed) and stopped another processor, late; a new runner starts: its state
    file names them pending with its live process before it publishes anything. Starting, not dead nor stopped."""
    m = monitor(clock)
    m.ingest(progress(clock))
    gave_up = {"error": "ValueError: bad", "restarts": 3, "failures_in_row": 4, "next_restart_in_s": None}
    m.ingest(_record(clock, "failure", **gave_up))
    m.ingest(_record(clock, "state", "late", state="stopped"))
    assert health(m) == "dead" and health(m, "shop/late") == "stopped"
    clock.t += 30
    run = tmp_path / "run"
    run.mkdir()
    body = {"pipeline": "shop", "pid": os.getpid(), "updated": "x", "started": _iso(clock.ms()), "stopping": False,
            "processors": {n: {"state": "pending", "checkpoint": f"/cp/{n}"} for n in ("enrich", "late")}}  # fmt: skip
    (run / "shop.json").write_text(json.dumps(body))
    clock.t += 5
    m.observe_runs(read_runs(str(tmp_path)))
    assert health(m) == health(m, "shop/late") == "starting"
    # A file older than the failure says nothing of it (another runner's, started before the failure).
    m.ingest(_record(clock, "failure", **gave_up))
    m.observe_runs(read_runs(str(tmp_path)))
    assert health(m) == "dead"
