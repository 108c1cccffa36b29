"""The weir-kafka sink's `oldestFirst` option (weir/kafka/sink.py `_oldest_first`): a task's rows, handed in any
order and in several Arrow batches, are written by their timestamp, oldest first, rows of one time in the order they
came; a task without rows writes nothing. The option parses as a flag. No Spark, no broker."""

from __future__ import annotations

from datetime import datetime, timedelta

import pyarrow as pa
import pytest

from weir.kafka import sink
from weir.kafka.options import OptionError, parse_sink

T0 = datetime(2026, 12, 1)


def _batch(rows: list[tuple[int, str]]) -> pa.RecordBatch:
    times = pa.array([T0 + timedelta(seconds=s) for s, _ in rows], pa.timestamp("us"))
    return pa.record_batch({"Timestamp": times, "value": pa.array([v.encode() for _, v in rows], pa.binary())})


def test_a_tasks_rows_come_oldest_first_across_its_batches_and_ties_keep_their_order():
    batches = [_batch([(30, "c"), (10, "a1")]), _batch([]), _batch([(20, "b"), (10, "a2"), (30, "c2")])]
    out = list(sink._oldest_first(iter(batches)))
    values = [v for b in out for v in b.column("value").to_pylist()]
    assert values == [b"a1", b"a2", b"b", b"c", b"c2"]
    assert sum(b.num_rows for b in out) == 5


def test_a_task_without_rows_writes_nothing():
    assert list(sink._oldest_first(iter([]))) == []
    assert list(sink._oldest_first(iter([_batch([])]))) == []


def test_oldest_first_is_a_flag():
    base = {"kafka.bootstrap.servers": "localhost:9092"}
    assert parse_sink(base).oldest_first is False
    assert parse_sink(base | {"oldestFirst": "true"}).oldest_first is True
    with pytest.raises(OptionError, match="oldestfirst must be true or false"):
        parse_sink(base | {"oldestFirst": "yes"})
