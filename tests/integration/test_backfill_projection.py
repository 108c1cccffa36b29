"""A backfill into the topics of a processor that keeps only some columns (docs/testing.md's `large_payments`,
given an archived input) is exact: each input record's output once, a rerun writes nothing. Its rows lost the
input's coordinates in the function's `select`; they still know their input record (weir.runtime.provenance),
streaming's and the backfill's alike."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from _pipe import Rec, produce, source
from pyspark.sql import functions as F

from weir.backfill import BACKFILL_HEADER, backfill
from weir.config import load
from weir.kafka import Admin
from weir.pipeline import Pipeline
from weir.runtime.runner import Runner

pytestmark = pytest.mark.integration
T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
N = 240  # two hours, one payment every 30 s


def cents(i: int) -> int:
    return (i * 1373) % 20000


def declare(prefix: str, buggy: bool) -> Pipeline:
    p = Pipeline(f"bfp-{prefix}")
    payments = p.topic(f"{prefix}.payments", "id STRING, user STRING, cents BIGINT", key="id", partitions=2,
                       archived=True)  # fmt: skip
    large = p.topic(f"{prefix}.large", "id STRING, euros DOUBLE", key="id")

    @p.processor(inputs=[payments], outputs=[large])
    def large_payments(df):
        out = df.where("cents >= 10000").select("id", (F.col("cents") / 100).alias("euros"))
        return out.where(~F.col("id").endswith("7")) if buggy else out  # the bug: drops real payments

    return p


def test_a_backfill_of_a_projecting_processor_writes_each_inputs_output_once(bootstrap, spark, tmp_path) -> None:
    prefix = uuid.uuid4().hex[:8]
    s = load(home=str(tmp_path / "home"), bootstrap_servers=bootstrap, checkpoint_root=str(tmp_path / "ck"),
             lake=str(tmp_path / "lake"), restart_backoff=0.2)  # fmt: skip
    topic, out = f"{prefix}.payments", f"{prefix}.large"
    Admin(bootstrap).create_topic(topic, 2)
    recs = []
    for i in range(N):
        value = json.dumps({"id": f"p{i}", "user": f"u{i % 5}", "cents": cents(i)}).encode()
        recs.append(Rec(i % 2, f"p{i}".encode(), value, (), int((T0 + timedelta(seconds=30 * i)).timestamp() * 1000)))
    produce(bootstrap, topic, recs)
    r = Runner(declare(prefix, buggy=True), s, spark=spark, available_now=True).start()
    try:
        assert r.wait(300)
    finally:
        r.stop()
    assert all(st.state == "finished" for st in r.snapshot().values()), r.snapshot()

    def read() -> list:
        return source(spark, bootstrap, out, stream=False, startingOffsets="earliest").collect()

    def hs(row) -> dict[str, str]:
        return {h["key"]: bytes(h["value"]).decode() for h in row["headers"] or []}

    streamed = read()
    # The projection kept neither topic, partition nor offset: the rows still name their input record
    assert all(hs(row)["weir.source"].startswith(f"{topic}/") for row in streamed)
    large = {i for i in range(N) if cents(i) >= 10000}
    lost = large - {int(json.loads(row["value"])["id"][1:]) for row in streamed}
    assert lost == {i for i in large if str(i).endswith("7")} and lost

    report = backfill(declare(prefix, buggy=False), "large_payments", T0, T0 + timedelta(hours=2), settings=s,
                      spark=spark)  # fmt: skip
    assert report.written == {out: len(lost)}
    assert report.counts.replayed == len(large) - len(lost)
    assert report.counts.balanced and report.counts.violations == 0 and report.counts.in_ == N

    everything = read()
    by_source: dict[str, list] = {}
    for row in everything:
        by_source.setdefault(hs(row)["weir.source"], []).append(json.loads(row["value"]))
    correct = {f"{topic}/{i % 2}/{i // 2}": [{"id": f"p{i}", "euros": cents(i) / 100}] for i in large}
    assert by_source == correct  # each input record's output once
    assert {int(bytes(row["key"])[1:]) for row in everything if hs(row).get(BACKFILL_HEADER) == report.id} == lost

    again = backfill(declare(prefix, buggy=False), "large_payments", T0, T0 + timedelta(hours=2), settings=s,
                     spark=spark)  # fmt: skip
    assert again.written == {out: 0} and again.counts.replayed == len(large)
    assert len(read()) == len(everything)
    assert Path(s.lake).exists()
