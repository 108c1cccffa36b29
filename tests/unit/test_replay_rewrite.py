"""The replay guard's pure parts: a row's identity, which rows a rewrite skips, the guard as an option."""

from __future__ import annotations

from collections import Counter

from weir.kafka.replay import Guard, Rewrite, identity, origin_of


def test_identity_tells_apart_what_concatenation_would_not() -> None:
    assert identity(b"t/0/1", b"ab", b"c") != identity(b"t/0/1", b"a", b"bc")
    assert identity(None, b"k", b"v") != identity(b"", b"k", b"v")
    assert identity(b"t/0/1", b"k", b"v") == identity(b"t/0/1", b"k", b"v")


def test_origin_is_the_input_record_else_the_task() -> None:
    assert origin_of([("weir.processor", b"p"), ("weir.source", b"t/1/7")]) == b"t/1/7"
    assert origin_of([("weir.task", b"3"), ("weir.source", b"t/1/7")]) == b"t/1/7"
    assert origin_of([("weir.task", b"3")]) == b"3"
    assert origin_of(None) is None


def test_a_first_write_stamps_the_task_on_rows_without_a_source_and_skips_nothing() -> None:
    r = Rewrite(Guard("p"), task=4, seen=None)
    assert r.admit([("weir.source", b"t/0/1")], b"k", b"v") == [("weir.source", b"t/0/1")]
    assert r.admit(None, b"k", b"v") == [("weir.task", b"4")]
    assert r.skipped == 0


def test_a_rewrite_skips_each_delivered_row_as_often_as_it_was_delivered() -> None:
    a, b = identity(b"t/0/1", b"k", b"v"), identity(b"4", b"k", b"w")
    r = Rewrite(Guard("p", replay=True), task=4, seen=Counter({a: 1, b: 2}))
    src = [("weir.source", b"t/0/1")]
    assert r.admit(src, b"k", b"v") is None
    assert r.admit(src, b"k", b"v") == src  # a second copy in this attempt was not delivered before
    assert r.admit(None, b"k", b"w") is None and r.admit(None, "k", "w") is None  # str and bytes alike
    assert r.admit(None, b"k", b"w") == [("weir.task", b"4")]
    assert r.admit(src, b"k", b"other") == src
    assert r.skipped == 3


def test_the_same_row_of_another_task_is_not_taken_for_a_delivered_one() -> None:
    seen = Counter({identity(b"4", b"k", b"w"): 1})
    assert Rewrite(Guard("p", replay=True), task=5, seen=seen).admit(None, b"k", b"w") == [("weir.task", b"5")]


def test_the_guard_travels_as_one_option() -> None:
    g = Guard("shop.enrich", {"orders": {0: 5, 3: 9}}, replay=True, reports="s3://b/ck/weir/marks/7.tasks")
    assert Guard.from_option(g.to_option()) == g
