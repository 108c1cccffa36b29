"""The replay guard's pure parts: a row's identity (destination topic, origin, key, value), which rows a rewrite
skips, whose records count as delivered, the guard as an option (and a guard written before these)."""

from __future__ import annotations

from collections import Counter

from weir.kafka.replay import Guard, Rewrite, identity, origin_of


def test_identity_tells_apart_what_concatenation_would_not() -> None:
    assert identity("o", b"t/0/1", b"ab", b"c") != identity("o", b"t/0/1", b"a", b"bc")
    assert identity("o", None, b"k", b"v") != identity("o", b"", b"k", b"v")
    assert identity("o", b"t/0/1", b"k", b"v") == identity("o", b"t/0/1", b"k", b"v")
    assert identity("ot", b"/0/1", b"k", b"v") != identity("o", b"t/0/1", b"k", b"v")


def test_a_rows_copy_in_another_topic_is_not_taken_for_its_own() -> None:
    # Delivered to `b` only (the write to `a` was cut): the replay writes `a`'s copy and skips `b`'s
    seen = Counter({identity("b", b"in/0/7", b"k", b"v"): 1})
    r = Rewrite(Guard("p", replay=True, batch=7), task=0, seen=seen)
    src = [("weir.source", b"in/0/7")]
    assert r.admit("a", src, b"k", b"v") == src
    assert r.admit("b", src, b"k", b"v") is None
    assert r.skipped == 1


def test_origin_is_the_input_record_else_the_task() -> None:
    assert origin_of([("weir.processor", b"p"), ("weir.source", b"t/1/7")]) == b"t/1/7"
    assert origin_of([("weir.task", b"7:3"), ("weir.source", b"t/1/7")]) == b"t/1/7"
    assert origin_of([("weir.task", b"7:3")]) == b"7:3"
    assert origin_of(None) is None


def test_a_first_write_stamps_batch_and_task_on_rows_without_a_source_and_skips_nothing() -> None:
    r = Rewrite(Guard("p", batch=7), task=4, seen=None)
    assert r.admit("o", [("weir.source", b"t/0/1")], b"k", b"v") == [("weir.source", b"t/0/1")]
    assert r.admit("o", None, b"k", b"v") == [("weir.task", b"7:4")]
    assert r.skipped == 0


def test_a_rewrite_skips_each_delivered_row_as_often_as_it_was_delivered() -> None:
    a, b = identity("o", b"t/0/1", b"k", b"v"), identity("o", b"7:4", b"k", b"w")
    r = Rewrite(Guard("p", replay=True, batch=7), task=4, seen=Counter({a: 1, b: 2}))
    src = [("weir.source", b"t/0/1")]
    assert r.admit("o", src, b"k", b"v") is None
    assert r.admit("o", src, b"k", b"v") == src  # a second copy in this attempt was not delivered before
    assert r.admit("o", None, b"k", b"w") is None and r.admit("o", None, "k", "w") is None  # str and bytes alike
    assert r.admit("o", None, b"k", b"w") == [("weir.task", b"7:4")]
    assert r.admit("o", src, b"k", b"other") == src
    assert r.skipped == 3


def test_the_same_row_of_another_task_is_not_taken_for_a_delivered_one() -> None:
    seen = Counter({identity("o", b"7:4", b"k", b"w"): 1})
    r = Rewrite(Guard("p", replay=True, batch=7), task=5, seen=seen)
    assert r.admit("o", None, b"k", b"w") == [("weir.task", b"7:5")]


def test_the_same_row_of_the_batch_before_is_not_taken_for_this_batchs() -> None:
    # Task 4 of batch 6 wrote this window result; a mark below the true end lets batch 7's read-back see it
    seen = Counter({identity("o", b"6:4", b"k", b"w"): 1})
    r = Rewrite(Guard("p", replay=True, batch=7), task=4, seen=seen)
    assert r.admit("o", None, b"k", b"w") == [("weir.task", b"7:4")]
    assert r.skipped == 0


def test_a_writer_is_its_pipeline_and_processor_and_never_a_backfill() -> None:
    g = Guard("enrich", pipeline="shop", batch=3)
    assert g.wrote([("weir.processor", b"enrich"), ("weir.pipeline", b"shop")])
    assert not g.wrote([("weir.processor", b"enrich"), ("weir.pipeline", b"iot")])
    assert not g.wrote([("weir.processor", b"enrich")])  # a record of before the change is no record of batch 3
    assert not g.wrote([("weir.processor", b"clean"), ("weir.pipeline", b"shop")])
    assert not g.wrote([("weir.processor", b"enrich"), ("weir.pipeline", b"shop"), ("weir.backfill", b"bf-1")])


def test_a_guard_written_before_pipelines_and_batches_replays_as_its_first_attempt_wrote() -> None:
    old = '{"processor": "enrich", "marks": {"o": {"0": 5}}, "replay": false, "reports": null}'
    g = Guard.from_option(old)
    assert (g.pipeline, g.batch, g.marks) == (None, None, {"o": {0: 5}})
    assert g.wrote([("weir.processor", b"enrich")])  # its first attempt stamped no pipeline
    assert Rewrite(g, task=4, seen=None).admit("o", None, b"k", b"v") == [("weir.task", b"4")]


def test_the_guard_travels_as_one_option() -> None:
    g = Guard("enrich", {"orders": {0: 5, 3: 9}}, replay=True, reports="s3://b/ck/weir/marks/7.tasks",
              pipeline="shop", batch=7)  # fmt: skip
    assert Guard.from_option(g.to_option()) == g
