"""The live tail: the records a seam plan reads from the broker, into one Arrow table.

Each span is read with the weir-kafka source's own range reader (`weir.kafka.read.read_range`: confluent-kafka
assign and seek, bounded waits, the source's decoder), so a tail row has the same columns and the same decoded
values as a row the archiver wrote. Every wait is bounded by the query's deadline.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from weir.kafka.decode import ERROR_COLUMN, JsonDecoder
from weir.kafka.log import TP, LogView
from weir.kafka.offsets import OffsetRange
from weir.kafka.options import SourceOptions
from weir.kafka.read import read_range
from weir.query.catalog import TableSpec
from weir.query.seam import Span


class TailTimeout(TimeoutError):
    """Reading the tail took longer than the query may."""


def watermarks(client: dict[str, str], topics: list[str], timeout_s: float) -> dict[str, dict[int, tuple[int, int]]]:
    """Per topic, partition -> (earliest, high-water mark); topics the broker does not know are left out."""
    view = LogView(client, timeout=max(1.0, timeout_s))
    try:
        parts = view.partitions()
        tps: list[TP] = [(t, p) for t in topics for p in parts.get(t, [])]
        bounds = view.bounds(tps)
    finally:
        view.close()
    out: dict[str, dict[int, tuple[int, int]]] = {}
    for (t, p), b in bounds.items():
        out.setdefault(t, {})[p] = b
    return out


def decoder(spec: TableSpec) -> JsonDecoder | None:
    return JsonDecoder(spec.fields, set(spec.required)) if spec.decoded else None


def with_partitions(batch: pa.RecordBatch | pa.Table) -> pa.Table:
    """`date` and `hour` (UTC, of the record's timestamp) as the lake partitions by; no timestamp: 1970-01-01/00."""
    table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
    ts = table.column("timestamp")
    date = pc.fill_null(pc.strftime(ts, format="%Y-%m-%d"), "1970-01-01")
    hour = pc.fill_null(pc.strftime(ts, format="%H"), "00")
    return table.append_column("date", date).append_column("hour", hour)


def read(client: dict[str, str], spec: TableSpec, spans: Mapping[int, list[Span]], deadline: float) -> pa.Table:
    """Every record of `spans` (partition -> [start, end) spans) of the table's topic, in the table's schema.
    Raises TailTimeout when the deadline (a `time.monotonic()` instant) passes."""
    schema = spec.schema()
    reader_schema = pa.schema([f for f in schema if f.name not in ("date", "hour")])
    dec = decoder(spec)
    pieces: list[pa.Table] = []
    for partition, ranges in sorted(spans.items()):
        for start, end in ranges:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TailTimeout(f"reading the tail of {spec.topic} (partition {partition}) passed the deadline")
            opts = SourceOptions(
                client=dict(client),
                topics=(spec.topic,),
                poll_timeout_ms=max(1000, int(left * 1000)),
                broker_timeout_s=max(1.0, left),
            )
            for batch in read_range(opts, OffsetRange(spec.topic, partition, start, end), reader_schema, dec):
                pieces.append(with_partitions(batch))
                if time.monotonic() > deadline:
                    raise TailTimeout(f"reading the tail of {spec.topic} (partition {partition}) passed the deadline")
    if not pieces:
        return schema.empty_table()
    return pa.concat_tables(pieces).cast(schema)


def undecodable(table: pa.Table) -> int:
    """Rows whose value did not decode (a non-null `_error`)."""
    if ERROR_COLUMN not in table.column_names:
        return 0
    return len(table) - table.column(ERROR_COLUMN).null_count
