"""A real-time processor's declaration (weir.pipeline.model, validate) and the local master its run gets
(weir.runtime.runner.realtime_master): pure logic, no Spark."""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pytest

import weir
from weir.pipeline import Pipeline
from weir.pipeline.model import REALTIME_CHECKPOINT_EVERY, DeclarationError
from weir.pipeline.validate import problems
from weir.runtime.realtime import backlog, starved, task_attempts
from weir.runtime.runner import realtime_confs, realtime_master


def _pipeline(**declared) -> Pipeline:
    p = Pipeline("rt")
    p.topic("orders", "id BIGINT, amount DOUBLE", key="id", partitions=3)
    p.topic("more", "id BIGINT, amount DOUBLE", key="id", partitions=1)
    p.topic("big", "id BIGINT, amount DOUBLE", key="id", partitions=2)

    @p.processor(inputs=declared.pop("inputs", ["orders"]), outputs=["big"], **declared)
    def alerts(df):
        return df

    return p


def test_realtime_true_checkpoints_every_default_interval_and_a_timedelta_sets_it():
    assert _pipeline(realtime=True).processors["alerts"].realtime == REALTIME_CHECKPOINT_EVERY
    assert _pipeline(realtime=timedelta(seconds=7)).processors["alerts"].realtime == timedelta(seconds=7)
    assert _pipeline().processors["alerts"].realtime is None


@pytest.mark.parametrize("given", [timedelta(seconds=2), "5 seconds", 5])
def test_realtime_below_sparks_minimum_or_not_a_duration_is_refused_naming_the_processor(given):
    with pytest.raises(DeclarationError, match=r"processor alerts: realtime is True or a timedelta of at least 5 s"):
        _pipeline(realtime=given)


def test_a_realtime_processor_that_real_time_mode_cannot_run_is_refused_with_each_reason():
    found = problems(_pipeline(realtime=True, stateful=True, inputs=["orders", "more"], trigger="1 second"))
    text = "\n".join(found)
    assert "processor alerts: real-time: Spark 4.2's real-time mode runs stateless queries only" in text
    assert "it reads one input topic, not 2" in text
    assert "a trigger or a limit per batch means micro-batches" in text
    assert not problems(_pipeline(realtime=True))


def test_a_realtime_processor_over_avro_values_is_refused():
    p = Pipeline("rt")
    p.topic("orders", format=weir.avro(registry=True), key="id")
    p.topic("big", "id BIGINT", key="id")

    @p.processor(inputs=["orders"], outputs=["big"], realtime=True)
    def alerts(df):
        return df

    assert any("topic orders is avro: real-time records are decoded and encoded in the JVM" in f for f in problems(p))


def test_a_local_master_gets_a_thread_per_partition_a_realtime_processor_holds():
    p = _pipeline(realtime=True)
    selected = list(p.processors.values())
    assert realtime_master("local[2]", selected, p) == "local[5]"
    assert realtime_master("local[*]", selected, p) == f"local[{(os.cpu_count() or 2) + 3}]"
    assert realtime_master("local[2, 3]", selected, p) == "local[5]"  # local-with-retries: one attempt per task
    assert realtime_master("spark://host:7077", selected, p) == "spark://host:7077"
    plain = _pipeline()
    assert realtime_master("local[2]", list(plain.processors.values()), plain) == "local[2]"
    assert realtime_master("local[2,3]", list(plain.processors.values()), plain) == "local[2,3]"


def test_a_realtime_session_gives_each_task_one_attempt():
    """A retried real-time task writes again what its first attempt wrote: weir's session gives one attempt, and a
    session that gives more is named (the query refuses to start)."""
    selected = list(_pipeline(realtime=True).processors.values())
    plain = list(_pipeline().processors.values())
    assert realtime_confs("spark://host:7077", selected, {}) == {"spark.task.maxFailures": "1"}
    assert realtime_confs("spark://host:7077", selected, {"spark.task.maxFailures": "4"}) == {}  # refused at start
    assert realtime_confs("spark://host:7077", plain, {}) == {}
    assert realtime_confs("local[5]", selected, {}) == {}
    assert [task_attempts(m, None) for m in ("local", "local[5]", "local[*]", "local[2, 3]", "local[2,1]")] == [
        1, 1, 1, 3, 1]  # fmt: skip
    assert task_attempts("local[2]", "4") == 1  # a local master's own count: its conf does not apply
    assert task_attempts("spark://host:7077", None) == 4  # Spark's default
    assert task_attempts("spark://host:7077", "1") == 1
    assert task_attempts("local-cluster[2,1,1024]", "2") == 2


def _figures(batch: int, read: int, start: dict, latest: dict) -> dict:
    """A real-time batch's progress figures as weir.runtime.progress gives them (offsets as Spark's JSON text)."""
    return {"batch_id": batch, "input_rows": read, "duration_ms": {"addBatch": 13285},
            "sources": [{"start_offset": json.dumps({"orders": start}), "latest_offset": json.dumps({"orders": latest}),
                         "end_offset": json.dumps({"orders": start})}]}  # fmt: skip


def test_the_backlog_is_what_waited_past_each_partitions_start_when_the_batch_was_planned():
    figures = _figures(0, 0, {"0": 0, "1": 1379, "2": 5, "4": 8}, {"0": 7239, "1": 1379, "2": 4, "3": 10, "4": 9})
    # partition 2's end below its start, 3 without a start, 4 one offset past it (a commit marker?): nothing
    assert backlog(figures["sources"]) == 7239
    assert backlog([{"start_offset": None, "latest_offset": None}]) == 0


def test_a_real_time_batch_that_read_nothing_of_a_backlog_sends_it_to_micro_batches():
    waiting = {"0": 7239, "1": 7230}
    assert starved("big_order", _figures(1, 1023, {"0": 0, "1": 0}, waiting)) is None  # it read
    assert starved("big_order", _figures(2, 0, {"0": 364, "1": 166}, {"0": 364, "1": 166})) is None  # none waited
    why = starved("big_order", _figures(3, 0, {"0": 364, "1": 166}, waiting))
    assert why is not None and "batch 3 read nothing of a backlog (13,939 records at its plan)" in why


def test_a_real_time_batch_planned_before_a_steady_stream_is_judged_by_the_ends_when_it_ended():
    """Records sent in a steady stream may all arrive after a batch's plan: one that read nothing of them while they
    arrived is starved too, by its input's ends read as its progress arrives (partitions as the broker numbers them)."""
    idle = _figures(4, 0, {"0": 364, "1": 166}, {"0": 364, "1": 166})
    looked = []

    def ends(found: dict) -> object:
        return lambda: looked.append(found) or found

    assert starved("big_order", idle, ends({"orders": {"0": 364, "1": 167}})) is None  # a commit marker at most
    why = starved("big_order", idle, ends({"orders": {"0": 1364, "1": 166}}))
    assert why is not None and why.startswith("real-time batch 4 read nothing of a backlog (1,000 records by its end)")
    read = _figures(5, 10, {"0": 364, "1": 166}, {"0": 364, "1": 166})
    assert starved("big_order", read, ends({"orders": {"0": 9999}})) is None and len(looked) == 2  # it read: no look
    planned = _figures(6, 0, {"0": 364, "1": 166}, {"0": 400, "1": 166})
    assert "(36 records at its plan)" in starved("big_order", planned, ends({"orders": {}}))
    assert len(looked) == 2  # the plan's backlog was enough: no look at the broker
