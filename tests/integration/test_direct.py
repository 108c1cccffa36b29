"""The direct path (weir/runtime/direct.py): a stateless processor of one input topic as one streaming query with
one streaming writer. Its books come from Spark's progress and the writer's commit and stay exact (a fan-out, a
filter, rows the function dead-letters itself); a record that does not decode fails the batch, and the processor
runs one batch at a time from it on, dead-lettering it, with nothing written twice."""

from __future__ import annotations

import json
import uuid
from collections import Counter

import faulty_sink
import pytest
from _pipe import Rec, produce
from test_one_pass import fan_out_pipeline
from test_run import progress_records, read_topic, settings

from weir.kafka import Admin
from weir.runtime.runner import Runner

pytestmark = pytest.mark.integration

N = 3_000


def _run(spark, bootstrap, tmp_path, records, prefix, limit=1_000):
    p = fan_out_pipeline(prefix)
    Admin(bootstrap).create_topic(f"{prefix}.in", 2)
    produce(bootstrap, f"{prefix}.in", records)
    s = settings(tmp_path, bootstrap, flow="static", max_offsets_per_trigger=limit, direct=True)
    runner = Runner(p, s, spark=spark, available_now=True).start()
    assert runner.wait(180)
    runner.stop()
    return p, s, runner


def _totals(progress):
    total = Counter()
    for r in progress:
        total.update({k: r["accounting"][k] for k in ("in", "out", "emitted", "filtered", "dlq", "refused")})
    return total


def test_a_direct_query_writes_every_output_once_and_its_books_balance(spark, bootstrap, tmp_path):
    prefix = uuid.uuid4().hex[:8]
    records = [Rec(n % 2, None, json.dumps({"n": n}).encode()) for n in range(N)]
    p, s, runner = _run(spark, bootstrap, tmp_path, records, prefix)
    assert runner.snapshot()["spread"].restarts == 0
    assert runner._builders["spread"].fell_back is None

    ns = range(N)
    out = Counter(json.loads(r["value"])["n"] for r in read_topic(spark, bootstrap, f"{prefix}.out"))
    assert out == Counter({n: 2 if n % 5 == 1 else 1 for n in ns if n % 5 in (1, 3, 4)})
    dlq = read_topic(spark, bootstrap, f"{prefix}.in.dlq")
    assert sorted(json.loads(r["value"])["n"] for r in dlq) == [n for n in ns if n % 5 == 2]

    progress = progress_records(s, p.name)
    assert len(progress) > 1  # several batches, each with its own books
    assert {r["reader"]["kind"] for r in progress} == {"connector"}  # Spark's Kafka connector reads its input
    assert all(r["accounting"]["balanced"] and not r["accounting"]["violations"] for r in progress), progress
    assert _totals(progress) == {
        "in": N,
        "out": sum(1 for n in ns if n % 5 in (1, 3, 4)),
        "emitted": sum(1 for n in ns if n % 5 == 1),
        "filtered": sum(1 for n in ns if n % 5 == 0),
        "dlq": sum(1 for n in ns if n % 5 == 2),
        "refused": sum(1 for n in ns if n % 5 == 2),
    }


def test_an_undecodable_record_sends_the_processor_one_batch_at_a_time_then_back_with_nothing_written_twice(
    spark, bootstrap, tmp_path, caplog
):
    prefix = uuid.uuid4().hex[:8]
    records = [Rec(n % 2, None, json.dumps({"n": n}).encode()) for n in range(N)]
    records.insert(400, Rec(0, b"bad", b"not json"))  # in a later batch of partition 0, after direct ones
    with caplog.at_level("INFO", logger="weir"):
        p, s, runner = _run(spark, bootstrap, tmp_path, records, prefix, limit=100)
    said = caplog.text
    assert "failed on the direct path" in said and "does not decode" in said, said[-3000:]
    assert "returns to the direct path" in said  # after BACK_AFTER batches one at a time
    builder = runner._builders["spread"]
    assert builder.fell_back is None and builder.direct is not None

    ns = range(N)
    out = Counter(json.loads(r["value"])["n"] for r in read_topic(spark, bootstrap, f"{prefix}.out"))
    assert out == Counter({n: 2 if n % 5 == 1 else 1 for n in ns if n % 5 in (1, 3, 4)})
    dlq = read_topic(spark, bootstrap, f"{prefix}.in.dlq")
    assert sorted(json.loads(r["value"])["n"] for r in dlq if r["key"] is None) == [n for n in ns if n % 5 == 2]
    assert [bytes(r["value"]) for r in dlq if r["key"] is not None] == [b"not json"]

    progress = progress_records(s, p.name)
    assert all(r["accounting"]["balanced"] and not r["accounting"]["violations"] for r in progress), progress
    total = _totals(progress)
    assert total["in"] == N + 1 and total["dlq"] == sum(1 for n in ns if n % 5 == 2) + 1, total


def test_records_acknowledged_but_not_in_the_topic_are_a_published_gap_on_the_direct_path(spark, bootstrap, tmp_path):
    """A weir-kafka sink that counts a topic's records as written and never produces them (tests/faulty_sink.py):
    the marks taken after each batch have not moved by what the batches wrote since the query's start."""
    prefix = uuid.uuid4().hex[:8]
    records = [Rec(n % 2, None, json.dumps({"n": n}).encode()) for n in range(20)]
    with faulty_sink.replacing(spark, drop=[f"{prefix}.out"]):
        p, s, runner = _run(spark, bootstrap, tmp_path, records, prefix)
    assert runner._builders["spread"].fell_back is None
    gaps = [g for r in progress_records(s, p.name) for g in r["accounting"]["gaps"]]
    kept = sum(2 if n % 5 == 1 else 1 for n in range(20) if n % 5 in (1, 3, 4))
    assert [(g["kind"], g["topic"], g["records"]) for g in gaps] == [("unappended", f"{prefix}.out", kept)], gaps
    assert runner.snapshot()["spread"].totals.violations == 1


def test_a_direct_path_that_cannot_start_leaves_the_processor_one_batch_at_a_time(
    spark, bootstrap, tmp_path, monkeypatch, caplog
):
    from weir.runtime import direct

    def refuse(self, records):
        raise RuntimeError("no streaming writer here")

    monkeypatch.setattr(direct.Direct, "start", refuse)
    prefix = uuid.uuid4().hex[:8]
    records = [Rec(n % 2, None, json.dumps({"n": n}).encode()) for n in range(200)]
    with caplog.at_level("WARNING", logger="weir"):
        p, s, runner = _run(spark, bootstrap, tmp_path, records, prefix)
    assert "cannot start on the direct path (no streaming writer here)" in caplog.text, caplog.text[-2000:]
    builder = runner._builders["spread"]
    assert builder.direct is None and runner.snapshot()["spread"].restarts == 0
    out = Counter(json.loads(r["value"])["n"] for r in read_topic(spark, bootstrap, f"{prefix}.out"))
    assert out == Counter({n: 2 if n % 5 == 1 else 1 for n in range(200) if n % 5 in (1, 3, 4)})
    assert all(r["accounting"]["balanced"] for r in progress_records(s, p.name))
