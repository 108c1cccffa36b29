"""The vectorized join core (weir.blocks.joining) without Spark: the same answers as a per-record loop in event
order on random batches, the edge cases of docs/blocks.md, and values kept exactly through the state value."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from weir.blocks import joining as j
from weir.blocks.joining import STREAM, TABLE

COLUMNS = ["n", "s", "x", "t", "o"]  # Int32, text, double, timestamp, any object (a struct here)
BIG = 2**31 - 1


def batch(records: list[tuple]) -> dict:
    """join's arguments from (key, ts, side, offset, tombstone, values or None) records."""
    values = [v or (None,) * len(COLUMNS) for *_, v in records]
    frame = pd.DataFrame(values, columns=COLUMNS, dtype=object)
    frame["n"] = pd.array(frame["n"], dtype="Int32")
    frame["x"] = frame["x"].astype("float64")
    frame["t"] = pd.to_datetime(frame["t"])
    return {
        "keys": np.array([r[0] for r in records], dtype=object),
        "ts": np.array([r[1] for r in records], dtype=np.int64),
        "side": np.array([r[2] for r in records], dtype=np.int8),
        "offset": np.array([r[3] for r in records], dtype=np.int64),
        "tombstone": np.array([r[4] for r in records], dtype=bool),
        "values": frame,
    }


def reference(table: dict, records: list[tuple]) -> tuple[list, dict]:
    """A per-record loop in event order: (per stream record in input order, the row it sees or None; the table)."""
    table = dict(table)
    seen = {}
    for i in sorted(range(len(records)), key=lambda i: (records[i][1], records[i][2], records[i][3])):
        key, _, side, _, tomb, values = records[i]
        if side == TABLE:
            if tomb:
                table.pop(key, None)
            else:
                table[key] = tuple(values)
        else:
            seen[i] = table.get(key) if key is not None else None
    return [seen[i] for i in sorted(seen)], table


def plain(v: object) -> object:
    """A value as comparable Python: None for every kind of null."""
    return None if v is None or v is pd.NaT or v is pd.NA or (isinstance(v, float) and np.isnan(v)) else v


def rows(frame: pd.DataFrame) -> list[tuple]:
    return [tuple(plain(v) for v in r) for r in frame[COLUMNS].astype(object).itertuples(index=False, name=None)]


def as_dict(table: pd.DataFrame) -> dict:
    return dict(zip(table["key"], rows(table), strict=True))


def random_records(rng: random.Random, offsets: dict[int, int], n: int) -> list[tuple]:
    out = []
    for _ in range(n):
        side = rng.choice((TABLE, STREAM))
        key = rng.choice(["a", "b", "c", "d", "e", 7, None if side == STREAM else "f"])
        offsets[side] += 1
        tomb = side == TABLE and rng.random() < 0.25
        values = None
        if side == TABLE and not tomb:
            values = (
                rng.choice([None, rng.randint(-BIG, BIG)]),
                rng.choice([None, "", f"v{rng.randint(0, 9)}"]),
                rng.choice([None, rng.random()]),
                rng.choice([None, pd.Timestamp(1_700_000_000_000_000_000 + rng.randint(0, 10**9))]),
                rng.choice([None, {"id": rng.randint(0, 3), "tags": ["x"]}]),
            )
        out.append((key, rng.randint(0, 6), side, offsets[side], tomb, values))
    rng.shuffle(out)  # Spark hands a bucket's rows over in no particular order
    return out


@pytest.mark.parametrize("seed", range(20))
def test_random_batches_match_a_per_record_loop(seed: int) -> None:
    rng = random.Random(seed)
    offsets = {TABLE: 0, STREAM: 0}
    table, expected = j.empty(COLUMNS), {}
    for _ in range(4):  # a few micro-batches, the table through its state value in between
        records = random_records(rng, offsets, rng.randint(0, 40))
        joined = j.join(table, **batch(records))
        want_seen, expected = reference(expected, records)
        assert rows(joined.seen) == [w or (None,) * len(COLUMNS) for w in want_seen]
        assert joined.found.tolist() == [w is not None for w in want_seen]
        assert joined.applied == sum(r[2] == TABLE for r in records)
        assert as_dict(joined.table) == expected
        table = j.loads(j.dumps(joined.table))
        assert as_dict(table) == expected


def test_tombstone_then_upsert_in_one_batch_and_the_reverse() -> None:
    stored = j.join(j.empty(COLUMNS), **batch([("k", 0, TABLE, 0, False, (1, "old", None, None, None))])).table
    joined = j.join(
        stored,
        **batch(
            [
                ("k", 5, STREAM, 0, False, None),  # after the upsert: listed first, sorted into place
                ("k", 3, TABLE, 2, False, (2, "new", None, None, None)),
                ("k", 2, TABLE, 1, True, None),
                ("k", 2, STREAM, 1, False, None),  # same time as the tombstone: sees it applied
                ("k", 1, STREAM, 2, False, None),  # before the tombstone: the stored row
                ("m", 1, TABLE, 3, False, (3, "m", None, None, None)),
                ("m", 2, TABLE, 4, True, None),
            ]
        ),
    )
    assert [r[:2] for r in rows(joined.seen)] == [(2, "new"), (None, None), (1, "old")]
    assert joined.found.tolist() == [True, False, True]
    assert as_dict(joined.table) == {"k": (2, "new", None, None, None)}  # m upserted, then deleted
    assert joined.applied == 4


def test_the_table_applies_first_at_the_same_timestamp_whatever_the_offsets() -> None:
    joined = j.join(
        j.empty(COLUMNS),
        **batch([("k", 7, STREAM, 1, False, None), ("k", 7, TABLE, 900, False, (1, "v", None, None, None))]),
    )
    assert rows(joined.seen)[0][:2] == (1, "v")


def test_a_row_of_nulls_is_a_row_and_a_key_with_only_stream_records_keeps_its_row() -> None:
    stored = j.join(
        j.empty(COLUMNS),
        **batch([("k", 0, TABLE, 0, False, (None,) * 5), ("q", 0, TABLE, 1, False, (5, "q", 0.5, None, None))]),
    )
    joined = j.join(stored.table, **batch([("k", 1, STREAM, 0, False, None), ("q", 1, STREAM, 1, False, None)]))
    assert joined.found.tolist() == [True, True]  # a table row whose values are all null still matches
    assert rows(joined.seen) == [(None,) * 5, (5, "q", 0.5, None, None)]
    assert joined.applied == 0
    assert as_dict(joined.table) == as_dict(stored.table)


def test_null_keys_and_an_empty_table() -> None:
    joined = j.join(j.empty(COLUMNS), **batch([(None, 0, STREAM, 0, False, None), ("k", 0, STREAM, 1, False, None)]))
    assert joined.found.tolist() == [False, False] and joined.table.empty and joined.applied == 0
    nothing = j.join(j.empty(COLUMNS), **batch([]))
    assert nothing.seen.empty and nothing.table.empty
    assert j.loads(j.dumps(j.empty(COLUMNS))).empty
    with pytest.raises(ValueError, match="table record without a key"):
        j.join(j.empty(COLUMNS), **batch([(None, 0, TABLE, 0, False, (1, "v", None, None, None))]))


def test_values_stay_exact_through_the_join_and_the_state_value() -> None:
    """Integers with nulls stay nullable integers (never float64), times keep their nanoseconds, any other
    value (a struct's dict, an array's ndarray, bytes) comes back as it went in."""
    cols = ["i", "b", "f", "t", "arr", "raw", "big"]
    values = pd.DataFrame(
        {
            "i": pd.array([BIG, None, -BIG], dtype="Int32"),
            "b": np.array([True, False, True]),
            "f": np.array([0.1, np.nan, -2.5]),
            "t": pd.to_datetime([1_700_000_000_123_456_789, None, 0]),
            "arr": pd.Series([np.array([1, 2], dtype=np.int32), np.array([3, 4], dtype=np.int32), None], dtype=object),
            "raw": pd.Series([b"\x00\xff", None, b""], dtype=object),
            "big": pd.Series([str(2**63 - 1), None, "-1"], dtype=object),  # BIGINT travels as text
        }
    )
    keys = np.array([10, 11, 12], dtype=object)
    joined = j.join(
        j.empty(cols),
        keys=keys,
        ts=np.zeros(3, dtype=np.int64),
        side=np.full(3, TABLE, dtype=np.int8),
        offset=np.arange(3, dtype=np.int64),
        tombstone=np.zeros(3, dtype=bool),
        values=values,
    )
    table = j.loads(j.dumps(joined.table))
    assert str(table["i"].dtype) == "Int32" and str(table["t"].dtype) == "datetime64[ns]"
    assert table["b"].dtype == bool and table["f"].dtype == np.float64
    back = table.set_index("key").loc[[10, 11, 12]].reset_index(drop=True)
    for c in ("i", "b", "f", "t", "raw", "big"):
        assert back[c].equals(values[c]), c
    assert [None if a is None else a.tolist() for a in back["arr"]] == [[1, 2], [3, 4], None]
    assert back["arr"][0].dtype == np.int32
    # Stream records read them back the same, nulls where a key has no row.
    seen = j.join(
        table,
        keys=np.array([12, 99, 10], dtype=object),
        ts=np.ones(3, dtype=np.int64),
        side=np.full(3, STREAM, dtype=np.int8),
        offset=np.arange(3, dtype=np.int64),
        tombstone=np.zeros(3, dtype=bool),
        values=values.iloc[:0],
    ).seen
    assert seen["i"].tolist()[0] == -BIG and seen["i"].isna().tolist() == [False, True, False]
    assert str(seen["i"].dtype) == "Int32"
    assert seen["t"].tolist() == [pd.Timestamp(0), pd.NaT, pd.Timestamp(1_700_000_000_123_456_789)]
    assert seen["b"].tolist() == [True, None, True] and seen["big"].tolist() == ["-1", None, str(2**63 - 1)]
