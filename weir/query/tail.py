"""The live tail: the records a seam plan reads from the broker, into one Arrow table.

One confluent-kafka consumer is assigned every partition's first span and seeks to the next span when one is
done; rows are built by the weir-kafka source's own conversion and decoder (`weir.kafka.read.to_batch`), so a
tail row has the same columns and the same decoded values as a row the archiver wrote. Every wait is bounded by
the query's deadline, and an unreachable broker fails the query naming it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from weir.formats import ERROR_COLUMN
from weir.kafka.log import TP, LogView, client_log, is_outage
from weir.kafka.options import SourceOptions
from weir.kafka.read import CHUNK, gc_paused, to_batch
from weir.query.catalog import TableSpec
from weir.query.seam import Span


class TailTimeout(TimeoutError):
    """Reading the tail took longer than the query may."""


class TailLost(RuntimeError):
    """Offsets the plan read from the broker were deleted while the query ran."""


def watermarks(
    view: LogView, topics: list[str], exact: bool = True, parts: Mapping[str, list[int]] | None = None
) -> dict[str, dict[int, tuple[int, int]]]:
    """Per topic, partition -> (earliest, high-water mark); topics the broker does not know are left out. With
    `exact=False` the latest offsets are ListOffsets' answers, which some brokers give short of the high-water
    mark: `read` then reads the last span up to the high-water mark of its own first fetch. `parts`: the broker's
    partitions, if already known."""
    parts = parts if parts is not None else view.partitions()
    tps: list[TP] = [(t, p) for t in topics for p in parts.get(t, [])]
    out: dict[str, dict[int, tuple[int, int]]] = {}
    for (t, p), b in (view.bounds(tps) if exact else view.listed(tps)).items():
        out.setdefault(t, {})[p] = b
    return out


def with_partitions(batch: pa.RecordBatch | pa.Table) -> pa.Table:
    """`date` and `hour` (UTC, of the record's timestamp) as the lake partitions by; no timestamp: 1970-01-01/00."""
    table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
    # Formatted once per distinct hour, not per row: strftime per row was a fifth of reading a 14k-record tail.
    hours = pc.floor_temporal(table.column("timestamp"), unit="hour")
    distinct = pc.unique(hours)
    at = pc.index_in(hours, value_set=distinct)  # a null timestamp finds the null among `distinct`
    date = pc.take(pc.fill_null(pc.strftime(distinct, format="%Y-%m-%d"), "1970-01-01"), at)
    hour = pc.take(pc.fill_null(pc.strftime(distinct, format="%H"), "00"), at)
    return table.append_column("date", date).append_column("hour", hour)


def read(
    client: dict[str, str],
    spec: TableSpec,
    spans: Mapping[int, list[Span]],
    deadline: float,
    open_from: Mapping[int, tuple[int, int]] | None = None,
) -> pa.Table:
    """Every record of `spans` (partition -> [start, end) spans, in order) of the table's topic, in the table's
    schema; then, for each partition of `open_from` (partition -> (start, the latest offset listed)), every record
    from start up to the high-water mark of the first fetch response that reaches it (taken after the lake's
    snapshot, so the seam stays exact; the listed latest only sizes the reads). Raises
    TailTimeout when the deadline (a `time.monotonic()` instant) passes."""
    schema = spec.schema()
    reader_schema = pa.schema([f for f in schema if f.name not in ("date", "hour")])
    dec = spec.decoder()
    pending: dict[int, list[tuple[int, int | None]]] = {
        p: [sp for sp in spans.get(p, []) if sp[1] > sp[0]] for p in {*spans, *(open_from or {})}
    }
    hints: dict[int, int] = {}
    for p, (start, listed) in (open_from or {}).items():
        pending[p].append((start, None))  # the end: the high-water mark of the partition's first fetch
        hints[p] = max(listed, start)
    pending = {p: ranges for p, ranges in pending.items() if ranges}
    if not pending:
        return schema.empty_table()
    opts = SourceOptions(client=dict(client), topics=(spec.topic,))
    consumer = Consumer({**opts.consumer_settings(), "logger": client_log})
    records: dict[int, list] = {p: [] for p in pending}
    pos: dict[int, int] = {}  # per partition, the offset after the last record received
    pieces: list[pa.Table] = []
    last_error: KafkaError | None = None

    def flush(p: int) -> None:
        if records[p]:
            pieces.append(with_partitions(to_batch(records[p], spec.topic, p, reader_schema, dec)))
            records[p] = []

    def advance(p: int) -> None:
        """The partition's current span is done: on to its next one, or the partition is done."""
        pending[p].pop(0)
        pos.pop(p, None)
        if pending[p]:
            consumer.seek(TopicPartition(spec.topic, p, pending[p][0][0]))
        else:
            del pending[p]
            flush(p)

    # No cyclic collections while messages pile up (they die by reference count; see gc_paused).
    with gc_paused(), contextlib.closing(consumer):
        consumer.assign([TopicPartition(spec.topic, p, ranges[0][0]) for p, ranges in sorted(pending.items())])
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                where = ", ".join(f"partition {p} at {r[0][0]}" for p, r in sorted(pending.items())[:3])
                why = f"; the broker at {opts.servers} last said: {last_error}" if last_error else ""
                raise TailTimeout(f"reading the tail of {spec.topic} passed the deadline ({where}){why}")
            # At most what the spans still hold (plus an end-of-partition event each): consume() returns as soon
            # as it has that many, instead of waiting out its timeout for a full chunk.
            want = sum((r[0][1] or hints[p]) - max(r[0][0], pos.get(p, 0)) + 1 for p, r in pending.items())
            for m in consumer.consume(num_messages=max(1, min(CHUNK, want)), timeout=min(0.2, left)):
                p, err = m.partition(), m.error()
                if p not in pending:
                    continue
                start, end = pending[p][0]
                if end is None and (err is None or err.code() == KafkaError._PARTITION_EOF):
                    # This message came with a fetch response: its high-water mark is the span's end.
                    end = consumer.get_watermark_offsets(TopicPartition(spec.topic, p), cached=True)[1]
                    end = max(end, start, m.offset() + 1 if err is None else m.offset())
                    pending[p][0] = (start, end)
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if m.offset() >= end:  # the span ends in offsets without records (markers, compaction)
                            advance(p)
                        continue
                    if is_outage(err):
                        last_error = err  # librdkafka reconnects; the deadline bounds the wait
                        continue
                    if err.code() == KafkaError._AUTO_OFFSET_RESET:
                        raise TailLost(
                            f"{spec.topic} partition {p}: offsets from {start} were deleted by retention while the "
                            "query read them; run it again (the plan then reports them missing)"
                        )
                    raise KafkaException(err)
                o = m.offset()
                if o < start:
                    continue
                pos[p] = o + 1
                if o < end:
                    records[p].append(m)
                    if len(records[p]) >= CHUNK:
                        flush(p)
                if o + 1 >= end:
                    advance(p)
    for p in list(records):
        flush(p)
    if not pieces:
        return schema.empty_table()
    return pa.concat_tables(pieces).cast(schema)


def undecodable(table: pa.Table) -> int:
    """Rows whose value did not decode (a non-null `_error`)."""
    if ERROR_COLUMN not in table.column_names:
        return 0
    return len(table) - table.column(ERROR_COLUMN).null_count
