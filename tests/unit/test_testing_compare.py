"""assert_rows (weir.testing.compare): rows compared as multisets, and a diff a reader can act on."""

from __future__ import annotations

import pytest

from weir.testing.compare import assert_rows, diff


def test_order_is_ignored_and_only_the_expected_columns_are_compared():
    found = [{"id": "b", "n": 2, "extra": 1}, {"id": "a", "n": 1, "extra": 2}]
    assert_rows(found, [{"id": "a", "n": 1}, {"id": "b", "n": 2}])
    assert diff(found, [{"id": "a", "n": 1}, {"id": "b", "n": 2}], columns=["id", "n", "extra"]) is not None


def test_duplicates_count():
    with pytest.raises(AssertionError, match="1 expected, 2 found; 0 missing, 1 unexpected"):
        assert_rows([{"id": "a"}, {"id": "a"}], [{"id": "a"}])


def test_a_wrong_row_is_paired_with_its_expected_one_and_the_differing_field_named():
    message = diff(
        [{"id": "a", "n": 1}, {"id": "b", "n": 5}, {"id": "z", "n": 0}],
        [{"id": "a", "n": 1}, {"id": "b", "n": 2}, {"id": "c", "n": 3}],
        key=["id"],
    )
    assert message.splitlines() == [
        "rows differ (order ignored; compared on id, n): 3 expected, 3 found; 2 missing, 2 unexpected",
        "differing (expected -> found):",
        "  n: 2 -> 5   (where id='b')",
        "missing (expected, not found):",
        "  {id: 'c', n: 3}",
        "unexpected (found, not expected):",
        "  {id: 'z', n: 0}",
    ]


def test_without_a_key_the_closest_row_is_the_one_with_most_equal_fields():
    message = diff(
        [{"a": 1, "b": 2, "c": 9}, {"a": 7, "b": 7, "c": 7}], [{"a": 1, "b": 2, "c": 3}, {"a": 7, "b": 7, "c": 8}]
    )
    assert "  c: 3 -> 9   (where a=1, b=2)" in message and "  c: 8 -> 7   (where a=7, b=7)" in message


def test_nested_values_and_empty_sides():
    assert_rows([{"tags": ["x", "y"], "m": {"k": 1}}], [{"m": {"k": 1}, "tags": ["x", "y"]}])
    assert_rows([], [])
    with pytest.raises(AssertionError, match=r"unexpected \(found, not expected\):\n  \{id: 'a'\}"):
        assert_rows([{"id": "a"}], [])
