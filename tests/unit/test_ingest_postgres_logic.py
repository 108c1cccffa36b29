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


def test_a_poll_by_updated_at_keeps_the_rows_sent_at_its_cursor_tick():
    from weir.ingest.polling import PollJob
    from weir.ingest.postgres import Change

    job = PollJob("", "t", "", None, None, {}, ("id",), poll_by="at", kind="updated")
    rows = [Change(job._row({"id": i, "at": t}), "INSERT", {"id": i, "at": t}) for i, t in
            ((1, "10:00"), (2, "10:01"), (3, "10:01"))]  # fmt: skip
    after = job._after({"cursor": None, "boundary": []}, rows)
    assert after == {"cursor": "10:01", "boundary": sorted({rows[1].row, rows[2].row})}
    more = [Change(job._row({"id": 4, "at": "10:01"}), "INSERT", {"id": 4, "at": "10:01"})]  # the same tick
    assert set(job._after(after, more)["boundary"]) == {rows[1].row, rows[2].row, more[0].row}
    assert job._after(after, []) == after  # nothing new: the cursor stays
    # One state of a row is one record: the same key at another time is another row id.
    assert job._row({"id": 1, "at": "10:00"}) != job._row({"id": 1, "at": "10:02"})
    key = PollJob("", "t", "", None, None, {}, ("id",), poll_by="id", kind="key")
    assert key._after({"cursor": 3, "boundary": []}, [Change(key._row({"id": 9}), "INSERT", {"id": 9})]) == {
        "cursor": 9, "boundary": []}  # fmt: skip
