"""Release drift (issue 30, item 1): each version's books from the progress records, the two-proportion test,
and the `release_drift` alert, fed by hand on a hand-driven clock: a release that dead-letters 3% of its input
where the previous one dead-lettered 0.1% fires within its batches, naming the version, the share, both values
and when it started; the same shift on a few records does not; a release that changes nothing does not."""

from __future__ import annotations

import pytest
from test_monitor_state import Clock, progress

from weir.monitor.config import MonitorConfig
from weir.monitor.drift import Z_CRITICAL, Releases, z_score
from weir.monitor.metrics import render
from weir.monitor.state import Monitor
from weir.units import iso


@pytest.fixture
def clock() -> Clock:
    return Clock()


def batch(rows: int, dlq: int) -> dict:
    return {"in": rows, "out": rows - dlq, "dlq": dlq, "balanced": True, "outputs": {"orders.enriched": rows - dlq}}


def run(m: Monitor, clock: Clock, version: str, batches: int, rows: int, dlq: int, first: int = 1) -> int:
    for i in range(batches):
        clock.t += 10
        m.ingest(progress(clock, batch_id=first + i, end=first + i, rows=rows, accounting=batch(rows, dlq),
                          version=version))  # fmt: skip
    return first + batches


def test_the_two_proportion_test() -> None:
    assert z_score(30, 1000, 1, 1000) == pytest.approx(5.25, abs=0.01)  # 3% against 0.1%: far beyond chance
    assert abs(z_score(60, 2000, 20, 2000)) > Z_CRITICAL  # 3% against 1% on 2,000 records each: not chance
    assert abs(z_score(9, 300, 3, 300)) < Z_CRITICAL  # the same shares on 300 records each: chance
    assert z_score(0, 100, 0, 500) is None and z_score(5, 0, 1, 10) is None  # no variance, no sample: no verdict
    assert z_score(1, 20, 0, 20_000) is None  # 1 record in 20 against none: too few expected for the test


def test_versions_keep_their_own_books_and_a_rollback_runs_again() -> None:
    r = Releases()
    r.add("v1", 1_000, batch(100, 0))
    assert r.drift() is None  # one version: nothing to compare with
    r.add("v2", 2_000, batch(100, 50))
    r.add("v2", 3_000, batch(100, 50))
    r.add(None, 3_500, batch(100, 0))  # a record without a version is booked to none
    assert (r.running, r.versions["v2"].counts["in"], r.versions["v2"].batches) == ("v2", 200, 2)
    drift = r.drift()
    assert (drift.version, drift.previous, drift.share, drift.difference) == ("v2", "v1", "dlq", 0.5)  # the cause
    r.add("v1", 4_000, batch(100, 0))  # rolled back: v1 runs again, compared with v2
    assert (r.running, r.drift().previous, r.versions["v1"].since_ms) == ("v1", "v2", 4_000)


def test_a_release_that_dead_letters_3_percent_fires_naming_version_share_and_start(clock) -> None:
    m = Monitor(MonitorConfig.model_validate({}), clock=clock)  # the default rule: release_drift(*) > 1%
    after = run(m, clock, "src-aaaa", 20, 1000, 1)  # 0.1% dead-lettered, 20,000 records
    m.refresh()
    assert m.alerts.firing() == []
    started = clock.ms(10)
    run(m, clock, "src-bbbb", 3, 1000, 30, first=after)  # the new release: 3%
    m.refresh()
    [alert] = m.alerts.firing()
    assert alert["rule"] == "release drift" and alert["target"] == "shop/enrich"
    assert (f"version src-bbbb (running since {iso(started)}): dlq/in 3.00% against 0.10% for version src-aaaa"
            in alert["message"]), alert["message"]  # fmt: skip
    gauge = 'weir_processor_release_drift{pipeline="shop",processor="enrich"} '
    [line] = [line for line in render(m).decode().splitlines() if line.startswith(gauge)]
    assert float(line.removeprefix(gauge)) == pytest.approx(0.029)
    figures = m.tracks["shop/enrich"].figures.to_json()
    assert figures["release_drift"]["share"] == "dlq" and [v["version"] for v in figures["versions"]] == [
        "src-bbbb", "src-aaaa"]  # fmt: skip


def test_a_small_sample_or_an_unchanged_release_does_not_fire(clock) -> None:
    m = Monitor(MonitorConfig.model_validate({}), clock=clock)
    after = run(m, clock, "v1", 5, 20, 0)
    after = run(m, clock, "v2", 1, 20, 1, first=after)  # 5% of 20 records: 1 record, no evidence
    m.refresh()
    assert m.alerts.firing() == [] and m.tracks["shop/enrich"].figures.drift.difference == 0.0
    run(m, clock, "v3", 20, 1000, 0, first=after)  # v3 against v2, both ~0%: no difference
    m.refresh()
    assert m.alerts.firing() == []


def test_a_release_that_filters_2_percent_more_fires_within_its_first_batches(clock) -> None:
    """The issue's case: a new version drops (filters) 2% of its records. With 1,000 records a batch it fires at
    its second batch (the first has too few expected records to judge), naming the filtered share."""
    m = Monitor(MonitorConfig.model_validate({}), clock=clock)
    for i in range(10):
        clock.t += 10
        m.ingest(progress(clock, batch_id=i, end=i, rows=1000, version="v1",
                          accounting={"in": 1000, "out": 1000, "balanced": True}))  # fmt: skip
    fired_at = None
    for i in range(10, 15):
        clock.t += 10
        m.ingest(progress(clock, batch_id=i, end=i, rows=1000, version="v2",
                          accounting={"in": 1000, "out": 980, "filtered": 20, "balanced": True}))  # fmt: skip
        m.refresh()
        if fired_at is None and m.alerts.firing():
            fired_at = i - 9
    assert fired_at == 2
    [alert] = m.alerts.firing()
    assert "filtered/in 2.00% against 0.00% for version v1" in alert["message"], alert["message"]


def kinds(rows: int, big: float, purchases: float | None = None) -> dict:
    """A batch routed by kind to two outputs (a `big` share to orders.big, the rest to orders.small), or, with
    `purchases`, a stateful funnel's: every record absorbed, purchases emitted to one output, carts to another."""
    if purchases is not None:
        bought, carts = round(rows * purchases), rows // 20
        return {"in": rows, "absorbed": rows, "emitted": bought + carts, "balanced": True,
                "outputs": {"funnel.purchases": bought, "funnel.carts": carts}}  # fmt: skip
    n = round(rows * big)
    return {"in": rows, "out": rows, "balanced": True, "outputs": {"orders.big": n, "orders.small": rows - n}}


def first_firing(m: Monitor, clock: Clock, version: str, batches: int, accounting: dict, first: int) -> int | None:
    """The batch (counted from 1) of `version` at which an alert first fires, or None."""
    for i in range(batches):
        clock.t += 10
        m.ingest(progress(clock, batch_id=first + i, end=first + i, rows=accounting["in"], version=version,
                          accounting=accounting))  # fmt: skip
        m.refresh()
        if m.alerts.firing():
            return i + 1
    return None


def test_a_release_that_sends_2_percent_of_one_kind_to_another_output_fires_on_that_output(clock) -> None:
    """Issue 58 item 2, stateless: out, filtered and dead letters unchanged, but 2% of the big orders (30% of all)
    go to the wrong output: 0.6 points of one output's share, under the old fixed 1-point rule (and invisible in
    the shares it compared). At 10,000 records a batch it fires within 15 batches, naming the output."""
    m = Monitor(MonitorConfig.model_validate({}), clock=clock)
    assert first_firing(m, clock, "v1", 30, kinds(10_000, 0.30), first=0) is None
    fired = first_firing(m, clock, "v2", 20, kinds(10_000, 0.30 * 0.98), first=30)
    assert fired is not None and fired <= 15, fired
    [alert] = m.alerts.firing()
    assert "out:orders.big/in 29.40% against 30.00% for version v1" in alert["message"], alert["message"]


def test_a_stateful_release_that_drops_1_4_percent_of_purchases_fires_on_purchases(clock) -> None:
    """Issue 58 item 2, stateful: the newcomer's funnel v2 dropped 7 of 516 purchases (1.4%). Every record is
    absorbed into state either way; the purchases emitted per record in fall from 10% to 9.86%. At 100,000
    records a batch (a few minutes at 5,000 records/s) it fires within 30 batches, naming the purchases output; on
    the first few batches (too few purchases to tell a 1.4% drop from chance) it does not."""
    m = Monitor(MonitorConfig.model_validate({}), clock=clock)
    assert first_firing(m, clock, "v1", 30, kinds(100_000, 0, purchases=0.10), first=0) is None
    fired = first_firing(m, clock, "v2", 30, kinds(100_000, 0, purchases=0.10 * 0.986), first=30)
    assert fired is not None and 3 < fired <= 30, fired
    [alert] = m.alerts.firing()
    assert "out:funnel.purchases/in 9.86% against 10.00% for version v1" in alert["message"], alert["message"]


def test_an_unchanged_stateful_release_with_many_outputs_does_not_fire(clock) -> None:
    """The same funnel, released unchanged, with the counts' own noise (a purchase share that wanders by a few
    records a batch): no alert, however many outputs are compared (the test holds the comparison as a whole)."""
    import random

    m = Monitor(MonitorConfig.model_validate({}), clock=clock)
    rnd = random.Random(7)
    batch_id = 0
    for version in ("v1", "v2", "v3"):
        for _ in range(30):
            share = 0.10 + rnd.gauss(0, 0.001)
            batch_id += 1
            assert first_firing(m, clock, version, 1, kinds(100_000, 0, purchases=share), first=batch_id) is None
