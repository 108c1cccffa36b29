"""The pure parts of `weir ingest postgres`: test_decoding lines and Kafka keys."""

from __future__ import annotations

from weir.ingest.postgres import kafka_key, parse_change


def test_a_change_of_the_primary_key_gives_the_old_key_and_the_new_row():
    line = ("table public.lines: UPDATE: old-key: order_id[integer]:7 line[integer]:1 new-tuple: "
            "order_id[integer]:7 line[integer]:2 sku[text]:'a ''b''' qty[integer]:3")  # fmt: skip
    table, op, values, old = parse_change(line)
    assert (table, op) == ("public.lines", "UPDATE")
    assert values == {"order_id": 7, "line": 2, "sku": "a 'b'", "qty": 3}
    assert old == {"order_id": 7, "line": 1}
    plain = parse_change(
        "table public.lines: UPDATE: order_id[integer]:7 line[integer]:2 sku[text]:null qty[integer]:4"
    )
    assert plain[3] is None and plain[2]["sku"] is None
    assert parse_change("BEGIN") is None


def test_kafka_keys_of_one_column_and_of_several():
    assert kafka_key({"customer_id": "c1", "name": "x"}, ("customer_id",)) == b"c1"
    assert kafka_key({"id": 5}, ("id",)) == b"5"
    assert kafka_key({"order_id": 7, "line": 2, "qty": 1}, ("order_id", "line")) == b'{"order_id":7,"line":2}'
    assert kafka_key({"order_id": 7, "line": None}, ("order_id", "line")) is None
