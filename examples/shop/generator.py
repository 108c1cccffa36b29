"""`format("shop-generator")`: the shop's synthetic records as a Spark streaming source (Python Data Source API).

    spark.dataSource.register(ShopSource)
    events = spark.readStream.format("shop-generator").option("rate", 2000).option("seed", 7).load()

Columns: `_output` STRING (orders, customers or page_views: the topic of the row), `key` and `value`
BINARY (the raw JSON bytes, so malformed records reach their topic as they are, and a null value is a
tombstone of the customers table), `timestamp` TIMESTAMP (the record's Kafka timestamp).

Offsets are record counts. The offset also carries what the records depend on besides their number
(records.Shape: seed, event-time start and rate, customer count), so a batch replayed after a restart
regenerates byte-identical records, and a restart with a different seed or shape is refused instead of
silently mixing two streams. The wall-clock `rate` only paces the stream and may change between runs.

Options (names are case-insensitive, as Spark lower-cases them):

| option | default | meaning |
|---|---|---|
| `rate` | 1000 | records per wall-clock second since the stream's start; 0: all at once (needs `total`) |
| `total` | none | stop after this many records |
| `seed` | 7 | the random seed |
| `eventRate` | `rate` | records per second of event time (see records.py); required when `rate` is 0 |
| `customers` | 1000 | customers in the table |
| `maxRecordsPerTrigger` | 100000 | records per micro-batch at most: a restart after a pause plans no huge batch |
| `startMs` | now | the stream's start (epoch ms) on its first run, for reproducible tests |
| `skip` | none | outputs whose records are not emitted (comma-separated): another producer sends them |
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from examples.shop.records import Shape, record

SCHEMA = "_output STRING, key BINARY, value BINARY, timestamp TIMESTAMP"
# Records per Spark task. One task per batch at the default batch size on purpose: tasks of one batch write
# to the same Kafka partitions at once, interleaving early and late records, and a downstream window would
# see that disorder as lateness. Generating 100k records takes about a second.
TASK_RECORDS = 100_000
ARROW_ROWS = 10_000  # rows per Arrow batch handed to Spark


@dataclass(frozen=True)
class GeneratorOptions:
    """The reader's options, parsed and checked once on the driver (see the module docstring)."""

    rate: float = 1000.0
    total: int | None = None
    seed: int = 7
    event_rate: float | None = None
    customers: int = 1000
    max_per_trigger: int = 100_000
    start_ms: int | None = None
    skip: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, options: dict[str, str]) -> GeneratorOptions:
        o = {k.lower(): v for k, v in options.items()}
        known = {"rate", "total", "seed", "eventrate", "customers", "maxrecordspertrigger", "startms", "skip", "path"}
        unknown = sorted(set(o) - known)
        if unknown:
            known_text = ", ".join(sorted(known))
            raise ValueError(f"shop-generator: unknown option(s) {', '.join(unknown)}; known: {known_text}")

        def num(name: str, kind: type, default):
            return default if o.get(name) in (None, "") else kind(o[name])

        opts = cls(
            rate=num("rate", float, 1000.0),
            total=num("total", int, None),
            seed=num("seed", int, 7),
            event_rate=num("eventrate", float, None),
            customers=num("customers", int, 1000),
            max_per_trigger=num("maxrecordspertrigger", int, 100_000),
            start_ms=num("startms", int, None),
            skip=frozenset(o.strip() for o in o.get("skip", "").split(",") if o.strip()),
        )
        if opts.rate < 0 or (opts.rate == 0 and (opts.total is None or not opts.event_rate)):
            raise ValueError("shop-generator: rate must be positive, or 0 (all at once) with total and eventRate")
        if opts.customers < 1 or opts.max_per_trigger < 1 or (opts.event_rate is not None and opts.event_rate <= 0):
            raise ValueError("shop-generator: customers, maxRecordsPerTrigger and eventRate must be positive")
        return opts

    def shape(self, start_ms: int) -> Shape:
        return Shape(self.seed, start_ms, self.event_rate or self.rate, self.customers)


def _offset(shape: Shape, records: int) -> dict:
    return {"records": records, **asdict(shape)}


def _shape(offset: dict) -> Shape:
    return Shape(int(offset["seed"]), int(offset["start_ms"]), float(offset["event_rate"]), int(offset["customers"]))


@dataclass(frozen=True)
class Range(InputPartition):
    """One Spark task: records [start, end) of the stream with this shape."""

    shape: Shape
    start: int
    end: int


class ShopStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver side: offsets are {"records": n, **Shape}; tasks compute their records from (shape, i)."""

    def __init__(self, opts: GeneratorOptions, schema: StructType) -> None:
        self.opts = opts
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self._now_cap_ms: int | None = None  # AvailableNow: the wall time whose records are the target

    def initialOffset(self) -> dict:
        start = self.opts.start_ms if self.opts.start_ms is not None else int(time.time() * 1000)
        return _offset(self.opts.shape(start), 0)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.opts.max_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        self._now_cap_ms = int(time.time() * 1000)

    def _check(self, shape: Shape) -> None:
        # A restart must generate the same stream: refuse options that would change its records.
        wanted = self.opts.shape(shape.start_ms)
        if self.opts.event_rate is None:
            wanted = Shape(wanted.seed, wanted.start_ms, shape.event_rate, wanted.customers)
        if wanted != shape:
            raise ValueError(
                f"shop-generator: this checkpoint's stream was started with {shape}, the options now ask for "
                f"{wanted}; use a new checkpoint to generate a different stream"
            )

    def _due(self, shape: Shape) -> int:
        """How many records exist by now: the wall-clock rate since the stream's start, up to `total`."""
        total = self.opts.total if self.opts.total is not None else math.inf
        if self.opts.rate == 0:
            return int(total)
        now = self._now_cap_ms if self._now_cap_ms is not None else int(time.time() * 1000)
        return int(min(total, max(0, now - shape.start_ms) * self.opts.rate / 1000))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        shape = _shape(start)
        self._check(shape)
        begin = int(start["records"])
        end = self._due(shape)
        if isinstance(limit, ReadMaxRows):
            end = min(end, begin + limit.max_rows)
        elif not isinstance(limit, ReadAllAvailable):
            end = min(end, begin + self.opts.max_per_trigger)
        return _offset(shape, max(begin, end))

    def partitions(self, start: dict, end: dict) -> list[Range]:
        shape, a, b = _shape(end), int(start["records"]), int(end["records"])
        tasks = max(1, math.ceil((b - a) / TASK_RECORDS))
        step = math.ceil((b - a) / tasks) if b > a else 1
        return [Range(shape, s, min(b, s + step)) for s in range(a, b, step)]

    def read(self, partition: Range) -> Iterator[pa.RecordBatch]:
        for lo in range(partition.start, partition.end, ARROW_ROWS):
            rs = [record(partition.shape, i) for i in range(lo, min(partition.end, lo + ARROW_ROWS))]
            if self.opts.skip:  # records another producer sends (the demo's orders, over HTTP)
                rs = [r for r in rs if r.output not in self.opts.skip]
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array([r.output for r in rs], pa.string()),
                    pa.array([r.key for r in rs], pa.binary()),
                    pa.array([r.value for r in rs], pa.binary()),
                    pa.array([r.timestamp_ms * 1000 for r in rs], pa.int64()).cast(self.arrow_schema.field(3).type),
                ],
                schema=self.arrow_schema,
            )

    def commit(self, end: dict) -> None:
        """Nothing to release: records are computed, not fetched."""


class ShopSource(DataSource):
    """Register with `spark.dataSource.register(ShopSource)`; see the module docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return "shop-generator"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> ShopStreamReader:
        return ShopStreamReader(GeneratorOptions.parse(dict(self.options)), schema)
