"""Reading one offset range of one partition into Arrow record batches; runs inside Spark tasks."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import repeat
from operator import is_not, methodcaller

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from weir.checkpoint.offsets import OffsetRange
from weir.formats.base import Decoder
from weir.formats.keys import decode_records
from weir.kafka.log import BrokerUnavailable, client_log, is_outage
from weir.kafka.options import SourceOptions

log = logging.getLogger("weir.kafka")
CHUNK = 20_000  # records per Arrow batch: large enough to amortise per-batch costs, small in memory


class DataLossError(RuntimeError):
    """Offsets the query still needed are gone from the broker (retention, or a recreated topic)."""


def _headers(headers: list, target: pa.DataType) -> pa.Array:
    if headers.count(None) == len(headers):
        return pa.nulls(len(headers), target)
    offsets, keys, values, missing = [0], [], [], []
    for h in headers:
        if h is not None:
            keys.extend(k for k, _ in h)
            values.extend(v for _, v in h)
        offsets.append(len(keys))
        missing.append(h is None)
    fields = list(target.value_type)
    items = pa.StructArray.from_arrays([pa.array(keys, pa.string()), pa.array(values, pa.binary())], fields=fields)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), items, type=target, mask=pa.array(missing))


_VALUE, _TIMESTAMP, _KEY = methodcaller("value"), methodcaller("timestamp"), methodcaller("key")
_OFFSET, _HEADERS, _ERROR = methodcaller("offset"), methodcaller("headers"), methodcaller("error")


def to_batch(records: list, topic: str, partition: int, schema: pa.Schema, decoder: Decoder | None) -> pa.RecordBatch:
    """Arrow batch in the source's column order from confluent-kafka messages of one partition."""
    n = len(records)
    # map() over method callers: no bound method per record (per-record Python was a third of a read task). Not
    # Message.value itself: the testing kit hands in its own message objects, which that descriptor refuses.
    values = list(map(_VALUE, records))
    ts_types, ts_ms = zip(*map(_TIMESTAMP, records), strict=True)
    ts_type = pa.array(ts_types, pa.int32())
    # librdkafka: 0 none, 1 create time, 2 log-append time; Spark's columns: -1, 0, 1.
    no_ts = pc.equal(ts_type, 0)
    micros = pc.multiply(pa.array(ts_ms, pa.int64()), 1000)
    keys = list(map(_KEY, records))
    arrays = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array(list(map(_OFFSET, records)), pa.int64()),
        pc.if_else(no_ts, pa.scalar(None, pa.int64()), micros).cast(schema.field("timestamp").type),
        pc.subtract(ts_type, pa.scalar(1, pa.int32())),
        _headers(list(map(_HEADERS, records)), schema.field("headers").type),
    ]
    if decoder is not None:
        columns, errors = decode_records(decoder, values, lambda: keys)
        arrays.extend(columns)
        arrays.append(errors)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def read_range(
    opts: SourceOptions, r: OffsetRange, schema: pa.Schema, decoder: Decoder | None
) -> Iterator[pa.RecordBatch]:
    """Every record of [r.start, r.end) of one partition, in offset order, as Arrow batches.

    Gaps inside the range (compaction, transaction markers) are normal. Offsets that retention deleted
    between planning and reading are data loss: an error, or with failOnDataLoss=false a logged skip; with
    the `lake` option always an error, so that the batch's replay reads them from the lake.
    """
    if r.size == 0:
        return
    # A consumer per task, not one cached per worker: a cached client outlives topic deletions, and
    # librdkafka 2.16 crashed (metadata cache, strcmp) on the embedded broker's answer after one.
    consumer = Consumer({**opts.consumer_settings(), "logger": client_log})
    consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
    try:
        pos = r.start
        idle_since = time.monotonic()
        unreachable_since: float | None = None  # the broker has been out of reach since (librdkafka reconnects)
        last_outage: KafkaError | None = None
        while pos < r.end:
            with gc_paused():
                batch, pos, received, outage = _chunk(opts, consumer, r, pos, schema, decoder)
            now = time.monotonic()
            if received:
                idle_since, unreachable_since, last_outage = now, None, None
            elif outage is not None or (
                unreachable_since is None
                and (now - idle_since) * 1000 > opts.poll_timeout_ms
                and not _answers(consumer)
            ):
                # librdkafka reports an outage once and then reconnects quietly: it lasts until records come.
                unreachable_since, last_outage = unreachable_since or now, outage or last_outage
            if unreachable_since is not None:
                if now - unreachable_since > opts.broker_timeout_s:
                    raise BrokerUnavailable(
                        f"weir-kafka: gave up reading {r.topic}/{r.partition} at offset {pos}: Kafka at "
                        f"{opts.servers} was unreachable for {now - unreachable_since:.0f} s "
                        f"(brokerUnavailableTimeoutMs={opts.broker_timeout_s * 1000:.0f}); last error: {last_outage}"
                    )
                idle_since = now  # waiting for the broker, not for records: pollTimeoutMs does not run
                continue
            if not received and (now - idle_since) * 1000 > opts.poll_timeout_ms:
                raise TimeoutError(
                    f"weir-kafka: no record of {r.topic}/{r.partition} at offset {pos} arrived within "
                    f"pollTimeoutMs={opts.poll_timeout_ms}, though the broker advertised offsets up to {r.end}"
                )
            if batch is not None:
                yield batch
    finally:
        consumer.close()


def _answers(consumer: Consumer) -> bool:
    """Whether the broker answers a metadata request now (a reader idle for long asks before failing)."""
    try:
        consumer.list_topics(timeout=5)
        return True
    except KafkaException:
        return False


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a chunk is built. 20k messages and their timestamp tuples set
    off full collections (about 60 ms each) that free nothing: everything dies by reference count when
    the chunk is done. Measured: over half of the reader's CPU per record went to them."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _chunk(
    opts: SourceOptions, consumer: Consumer, r: OffsetRange, pos: int, schema: pa.Schema, decoder: Decoder | None
) -> tuple[pa.RecordBatch | None, int, bool, KafkaError | None]:
    """One consume call: (the batch or None, the next position, whether anything arrived, the error that says
    the broker is out of reach, if one came)."""
    msgs = consumer.consume(num_messages=min(CHUNK, r.end - pos), timeout=1.0)
    if not msgs:
        return None, pos, False, None
    records = msgs
    # Identity with None, in C: `list.count(None)` compares by ==, and confluent-kafka's KafkaError compared with
    # None sets a TypeError behind a result (a SystemError): every error message (a gap's end of partition under
    # read_committed or compaction) failed the read.
    if any(map(is_not, map(_ERROR, msgs), repeat(None))):
        records = []
        for m in msgs:
            err = m.error()
            if err is None:
                records.append(m)
            elif err.code() == KafkaError._PARTITION_EOF:
                if m.offset() >= r.end:  # the range ends in a gap (compaction, transaction markers)
                    pos = r.end
            elif err.code() == KafkaError._AUTO_OFFSET_RESET:
                pos = _skip_lost(opts, consumer, r, pos)
            elif is_outage(err):
                if not records:
                    return None, pos, False, err
            else:
                raise KafkaException(err)
    if records and records[-1].offset() >= r.end:
        records = [m for m in records if m.offset() < r.end]
    if not records:
        return None, pos, True, None
    pos = max(pos, records[-1].offset() + 1)
    return to_batch(records, r.topic, r.partition, schema, decoder), pos, True, None


def _skip_lost(opts: SourceOptions, consumer: Consumer, r: OffsetRange, pos: int) -> int:
    low, _ = consumer.get_watermark_offsets(TopicPartition(r.topic, r.partition), timeout=10)
    message = (
        f"weir-kafka: data loss on {r.topic} partition {r.partition}: offsets [{pos}, {min(low, r.end)}) "
        f"were deleted (log start is now {low}) between planning and reading"
    )
    if opts.lake:
        # Not skipped even with failOnDataLoss=false: the batch's plan is fixed, but its replay after a restart
        # plans the offsets the broker lost from the lake, and counts them (a task cannot count).
        raise DataLossError(message + f"; restart the query: its replay reads them from the lake {opts.lake}")
    if opts.fail_on_data_loss:
        raise DataLossError(message + "; set failOnDataLoss=false to skip them")
    log.warning("%s; skipped because failOnDataLoss=false", message)
    if low >= r.end:
        return r.end
    consumer.assign([TopicPartition(r.topic, r.partition, low)])
    return low
