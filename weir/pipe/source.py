"""`weir-kafka`: Kafka as a Spark data source (stream and batch) and sink, through the Python Data Source API.

The columns follow Spark's own Kafka source, so code written for `format("kafka")` reads the same:
key, value, topic, partition, offset, timestamp, timestampType, headers; with `valueFormat=json`, the
decoded value fields follow, then `_error`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from weir.pipe import offsets as off
from weir.pipe.decode import ERROR_COLUMN, JsonDecoder, parse_fields
from weir.pipe.log import TP, LogView
from weir.pipe.offsets import DataLoss, OffsetRange, Positions
from weir.pipe.options import OptionError, SourceOptions, parse_sink, parse_source
from weir.pipe.read import DataLossError, read_range

log = logging.getLogger("weir.kafka")

KAFKA_COLUMNS = (
    "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, "
    "timestampType INT, headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
)
KAFKA_COLUMN_NAMES = ("key", "value", "topic", "partition", "offset", "timestamp", "timestamptype", "headers")


def value_ddl(opts: SourceOptions) -> str:
    """DDL of the decoded value columns (all nullable: an error row has none) plus `_error`."""
    if opts.value_format != "json":
        return ""
    cols = []
    for f in parse_fields(opts.value_schema or ""):
        name = opts.value_prefix + f.name
        if name.lower() in KAFKA_COLUMN_NAMES or name.lower() == ERROR_COLUMN:
            raise OptionError(
                f"valueSchema field {f.name!r} collides with the Kafka column {name!r}; "
                f"set valueFieldPrefix (e.g. 'v_') to rename the decoded columns"
            )
        cols.append(f"`{name.replace('`', '``')}` {f.type_ddl}")
    return ", " + ", ".join([*cols, f"{ERROR_COLUMN} STRING"])


def _decoder(opts: SourceOptions, schema: StructType) -> JsonDecoder | None:
    if opts.value_format != "json":
        return None
    arrow = to_arrow_schema(schema, timezone="UTC")
    names = arrow.names[len(KAFKA_COLUMN_NAMES) : -1]
    fields = pa.schema([arrow.field(n) for n in names])
    required = {opts.value_prefix + f.name for f in parse_fields(opts.value_schema or "") if f.required}
    return JsonDecoder(fields, required)


@dataclass(frozen=True)
class KafkaPartition(InputPartition):
    """One Spark task's work: an offset range of one topic-partition."""

    range: OffsetRange


def _subscribed(opts: SourceOptions, view: LogView, *, must_exist: bool) -> list[TP]:
    parts = view.partitions()
    missing = [t for t in opts.topics if t not in parts]
    if missing and must_exist:
        raise OptionError(f"weir-kafka: topic(s) {', '.join(missing)} do not exist; create them first")
    if missing:
        log.warning("weir-kafka: subscribed topic(s) %s do not exist (yet)", ", ".join(missing))
    return [(t, p) for t, ps in parts.items() if opts.matches(t) for p in ps]


def _bounds(opts: SourceOptions, view: LogView, tps: list[TP]) -> dict[TP, tuple[int, int]]:
    """Earliest and latest per partition, with the test hook that hides offsets below a given one."""
    bounds = view.bounds(tps)
    for (t, p), (lo, hi) in bounds.items():
        hidden = opts.simulated_log_start.get(t, {}).get(p)
        if hidden is not None and hidden > lo:
            # Identical to a real log-start advance for everything downstream of this function.
            bounds[(t, p)] = (min(hidden, hi), hi)
    return bounds


def _resolve(spec: off.OffsetSpec, bounds: dict[TP, tuple[int, int]], name: str) -> Positions:
    out: Positions = {}
    for (t, p), (lo, hi) in bounds.items():
        if spec == "earliest":
            o = lo
        elif spec == "latest":
            o = hi
        else:
            o = spec.get(t, {}).get(p, -2)
            o = lo if o == -2 else hi if o == -1 else o
        out.setdefault(t, {})[p] = o
    if isinstance(spec, dict):
        unknown = [f"{t}/{p}" for t, parts in spec.items() for p in parts if (t, p) not in bounds]
        if unknown:
            raise OptionError(f"option {name} names partitions that do not exist: {', '.join(unknown)}")
    return out


def _loss_message(t: str, p: int, start: int, lo: int, hi: int | None) -> str:
    if hi is None:
        return (
            f"weir-kafka: data loss on {t} partition {p}: the partition no longer exists; "
            f"records from offset {start} on cannot be read"
        )
    if start < lo:
        return (
            f"weir-kafka: data loss on {t} partition {p}: offsets [{start}, {lo}) are gone "
            f"(the earliest available offset is {lo}; retention or deletion removed them)"
        )
    return (
        f"weir-kafka: data loss on {t} partition {p}: the next offset to read, {start}, is beyond the "
        f"latest offset {hi}; the topic was probably deleted and recreated, so offsets [{hi}, {start}) of the "
        f"old log and whatever followed them are lost"
    )


class _RangeReading:
    """What stream and batch readers share: the options, the Arrow schema, and reading one planned range."""

    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self.decoder = _decoder(opts, schema)

    def read(self, partition: KafkaPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, KafkaPartition):
            # Spark plans one default InputPartition when partitions() has none: nothing to read (an empty
            # topic, or a range with no records).
            return iter(())
        return read_range(self.opts, partition.range, self.arrow_schema, self.decoder)


class KafkaStreamReader(_RangeReading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver side of a streaming read. One instance lives for the whole query, so it keeps a metadata
    client and the last seen offsets between triggers."""

    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        super().__init__(opts, schema)
        self._view: LogView | None = None
        self._bounds: dict[TP, tuple[int, int]] = {}
        self._target: dict[TP, int] | None = None

    @property
    def view(self) -> LogView:
        if self._view is None:
            self._view = LogView(self.opts.client)
        return self._view

    def _discover(self, *, must_exist: bool = False) -> dict[TP, tuple[int, int]]:
        self._bounds = _bounds(self.opts, self.view, _subscribed(self.opts, self.view, must_exist=must_exist))
        return self._bounds

    def initialOffset(self) -> dict:
        bounds = self._discover(must_exist=bool(self.opts.topics))
        return off.to_json(_resolve(self.opts.starting, bounds, "startingOffsets"))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets is not None:
            return ReadMaxRows(self.opts.max_offsets)
        if self.opts.max_bytes is not None:
            return ReadMaxBytes(self.opts.max_bytes)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {tp: hi for tp, (_, hi) in self._discover().items()}

    def _effective_start(self, start: Positions, loss: DataLoss) -> tuple[Positions, DataLoss]:
        """Where this batch really starts per partition, after data-loss checks; new partitions start at
        their earliest offset (as Spark's Kafka source does)."""
        eff: Positions = {}
        for t, parts in start.items():
            for p, s in parts.items():
                lo, hi = self._bounds.get((t, p), (None, None))
                if lo is not None and lo <= s <= hi:
                    eff.setdefault(t, {})[p] = s
                    continue
                message = _loss_message(t, p, s, lo or 0, hi)
                if self.opts.fail_on_data_loss:
                    raise DataLossError(message + ". Set failOnDataLoss=false to skip and count instead.")
                log.warning("%s; skipping (failOnDataLoss=false)", message)
                loss = loss.add(lo - s if lo is not None and s < lo else 0)
                if lo is not None:
                    eff.setdefault(t, {})[p] = lo
        for (t, p), (lo, _) in self._bounds.items():
            eff.setdefault(t, {}).setdefault(p, lo)
        return eff, loss

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        positions, loss = off.from_json(start)
        self._discover()
        eff, loss = self._effective_start(positions, loss)
        latest: Positions = {}
        for (t, p), (_, hi) in self._bounds.items():
            if self._target is not None:
                # AvailableNow: nothing past the target, and no partition born after it.
                hi = min(hi, self._target.get((t, p), eff[t][p]))
            latest.setdefault(t, {})[p] = max(hi, eff[t][p])
        end = latest
        if not isinstance(limit, ReadAllAvailable):
            max_rows = self._max_rows(limit)
            if max_rows is not None:
                end = off.cap(eff, latest, max_rows)
        return off.to_json(end, loss)

    def _max_rows(self, limit: ReadLimit) -> int | None:
        rows = [limit.max_rows] if isinstance(limit, ReadMaxRows) else []
        if self.opts.max_offsets is not None:
            rows.append(self.opts.max_offsets)
        max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else self.opts.max_bytes
        if max_bytes is not None:
            # Bytes are estimated from the sizes of records sampled while finding the high-water marks.
            rows.append(max(1, max_bytes // self.view.average_record_bytes()))
        return min(rows) if rows else None

    def reportLatestOffset(self) -> dict | None:
        if not self._bounds:
            return None
        latest: Positions = {}
        for (t, p), (_, hi) in self._bounds.items():
            latest.setdefault(t, {})[p] = hi
        return off.to_json(latest)

    def partitions(self, start: dict, end: dict) -> list[KafkaPartition]:
        begin, _ = off.from_json(start)
        until, _ = off.from_json(end)
        wanted = [(t, p) for t, parts in until.items() for p in parts]
        if any(tp not in self._bounds for tp in wanted):
            # A restart replaying a logged batch: nothing discovered yet in this process.
            self._bounds.update(_bounds(self.opts, self.view, wanted))
        ranges = []
        for t, parts in until.items():
            for p, e in parts.items():
                s = begin.get(t, {}).get(p)
                lo, hi = self._bounds.get((t, p), (0, 0))
                if s is not None and (s < lo or s > e or s > hi) and self.opts.fail_on_data_loss:
                    # latestOffset raised for this before logging the batch; here it is a logged batch
                    # replayed after a restart, and the offsets went missing in between.
                    raise DataLossError(_loss_message(t, p, s, lo, hi) + ". Set failOnDataLoss=false to skip.")
                if e > hi:
                    # Only a replay can end beyond the log (the topic was recreated since it was planned);
                    # reading on would wait for offsets that will never come.
                    if self.opts.fail_on_data_loss:
                        raise DataLossError(_loss_message(t, p, e, lo, hi) + ". Set failOnDataLoss=false to skip.")
                    # Read nothing here: the batch's logged end stays beyond the log, so the next batch
                    # sees the recreated log, counts it in @dataLoss and reads it from its start, once.
                    log.warning("%s; skipping (failOnDataLoss=false)", _loss_message(t, p, e, lo, hi))
                    continue
                if s is None or s > e or s < lo:
                    s = lo  # new partition, or a loss counted in @dataLoss when the batch was planned
                ranges.append(OffsetRange(t, p, s, e))
        return [KafkaPartition(r) for r in off.split(ranges, self.opts.min_partitions)]

    def commit(self, end: dict) -> None:
        """Nothing to do: offsets live in Spark's checkpoint, never in a consumer group."""

    def stop(self) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None


class KafkaBatchReader(_RangeReading, DataSourceReader):
    """A bounded read of [startingOffsets, endingOffsets) for `spark.read`."""

    def partitions(self) -> list[KafkaPartition]:
        view = LogView(self.opts.client)
        try:
            bounds = _bounds(self.opts, view, _subscribed(self.opts, view, must_exist=bool(self.opts.topics)))
        finally:
            view.close()
        begin = _resolve(self.opts.starting, bounds, "startingOffsets")
        until = _resolve(self.opts.ending, bounds, "endingOffsets")
        ranges = []
        for (t, p), (lo, hi) in sorted(bounds.items()):
            s, e = begin[t][p], until[t][p]
            if s < lo or e > hi:
                message = (
                    _loss_message(t, p, s, lo, hi)
                    if s < lo
                    else (f"weir-kafka: endingOffsets {e} for {t} partition {p} is beyond the latest offset {hi}")
                )
                if self.opts.fail_on_data_loss:
                    raise DataLossError(message + ". Set failOnDataLoss=false to read what is left.")
                log.warning("%s; reading what is available (failOnDataLoss=false)", message)
                s, e = max(s, lo), min(e, hi)
            ranges.append(OffsetRange(t, p, s, e))
        return [KafkaPartition(r) for r in off.split(ranges, self.opts.min_partitions)]


class KafkaDataSource(DataSource):
    """`format("weir-kafka")`: see the README's options table."""

    @classmethod
    def name(cls) -> str:
        return "weir-kafka"

    def schema(self) -> str:
        return KAFKA_COLUMNS + value_ddl(parse_source(self.options, streaming=None))

    def reader(self, schema: StructType) -> KafkaBatchReader:
        return KafkaBatchReader(parse_source(self.options, streaming=False), schema)

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        return KafkaStreamReader(parse_source(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool):
        from weir.pipe.sink import KafkaBatchWriter

        return KafkaBatchWriter(parse_sink(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool):
        from weir.pipe.sink import KafkaStreamWriter

        return KafkaStreamWriter(parse_sink(self.options), schema)
