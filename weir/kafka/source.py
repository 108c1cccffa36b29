"""`weir-kafka`: Kafka as a Spark data source (stream and batch) and sink, through the Python Data Source API.

The columns follow Spark's own Kafka source, so code written for `format("kafka")` reads the same:
key, value, topic, partition, offset, timestamp, timestampType, headers; with `valueFormat=json`, the
decoded value fields follow, then `_error`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

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

from weir.checkpoint import offsets as form
from weir.checkpoint.files import Checkpoint
from weir.checkpoint.follow import Follower
from weir.checkpoint.offsets import DataLoss, LakeFallback, OffsetRange, Positions
from weir.formats import ERROR_COLUMN, KeyedDecoder, key_fields, value_format
from weir.formats.base import Decoder
from weir.formats.ddl import parse_fields
from weir.formats.jsondecode import JsonDecoder
from weir.kafka import heal
from weir.kafka import offsets as off
from weir.kafka.admission import ADMISSION_KEY, Controller, Decision, memory_cap, read_measurement
from weir.kafka.fallback import LakeIndex, LakePartition, read_lake
from weir.kafka.log import TP, BrokerUnavailable, LogView
from weir.kafka.options import OptionError, SourceOptions, parse_sink, parse_source
from weir.kafka.outage import ride_out
from weir.kafka.read import DataLossError, read_range
from weir.kafka.sink import KafkaBatchWriter, KafkaStreamWriter

log = logging.getLogger("weir.kafka")
T = TypeVar("T")

KAFKA_COLUMNS = (
    "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, "
    "timestampType INT, headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
)
KAFKA_COLUMN_NAMES = ("key", "value", "topic", "partition", "offset", "timestamp", "timestamptype", "headers")


def value_ddl(opts: SourceOptions) -> str:
    """DDL of the decoded value columns (all nullable: an error row has none) plus `_error`."""
    if opts.value_format == "raw":
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


def decoder(opts: SourceOptions, schema: StructType) -> Decoder | None:
    """The decoder of the value columns of `schema` (the source's columns), None for raw values: weir's JSON
    decoder, or the values' format's (weir.formats); with keyFormat, beside the keys' decoder. Made where
    the source is made: on the driver, pickled to the read tasks."""
    values = _value_decoder(opts, schema)
    if values is None or opts.key_spec is None:
        return values
    topic = opts.topics[0] if len(opts.topics) == 1 else (opts.pattern or "")
    names = [opts.value_prefix + f.name for f in parse_fields(opts.value_schema or "")]
    fields = [name for name, _ in key_fields(opts.key_spec, topic)]
    missing = [f for f in fields if opts.value_prefix + f not in names]
    if missing:
        raise OptionError(
            f"keyFormatSpec: the key's fields {missing} are not fields of the values ({', '.join(names)})"
        )
    places = [(names.index(opts.value_prefix + f), i) for i, f in enumerate(fields)]
    return KeyedDecoder(values, value_format(opts.key_spec, topic, opts.registry).decoder(), places)


def _value_decoder(opts: SourceOptions, schema: StructType) -> Decoder | None:
    if opts.value_format == "raw":
        return None
    if opts.value_spec is not None:
        topic = opts.topics[0] if len(opts.topics) == 1 else (opts.pattern or "")
        return value_format(opts.value_spec, topic, opts.registry).decoder()
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
    """Earliest and latest per partition. The earliest is raised to lakeUntil (offsets below it are read from the
    lake, as offsets below a log start are)."""
    bounds = view.bounds(tps)
    for (t, p), (lo, hi) in bounds.items():
        floor = opts.lake_until.get(t, {}).get(p, lo)
        if floor > lo:
            # Identical to a real log-start advance for everything downstream of this function.
            bounds[(t, p)] = (min(floor, hi), hi)
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


def _lake_gap_message(
    t: str, p: int, start: int, lo: int, gaps: list[OffsetRange], index: LakeIndex, until: int | None = None
) -> str:
    missing = ", ".join(f"[{g.start}, {g.end})" for g in gaps[:5]) + (" ..." if len(gaps) > 5 else "")
    why = (
        f"are below lakeUntil {until}, to be read from the lake"
        if until is not None
        else f"are gone from the broker (the earliest available offset is {lo}; retention or deletion removed them)"
    )
    return (
        f"weir-kafka: data loss on {t} partition {p}: offsets [{start}, {lo}) {why}, and the lake does not hold "
        f"{missing} of them: {index.describe(p)}"
    )


class _RangeReading:
    """What stream and batch readers share: the options, the Arrow schema, reading one planned range, and
    the lake fallback's planning (docs/retention.md)."""

    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self.decoder = decoder(opts, schema)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, LakePartition):
            return read_lake(partition, self.arrow_schema, self.decoder)
        if not isinstance(partition, KafkaPartition):
            # Spark plans one default InputPartition when partitions() has none: nothing to read (an empty
            # topic, or a range with no records).
            return iter(())
        return read_range(self.opts, partition.range, self.arrow_schema, self.decoder)

    def _until(self, t: str, p: int, lo: int) -> int | None:
        """lakeUntil of a partition whose earliest `lo` (as _bounds gives it) it set, else None (retention did)."""
        until = self.opts.lake_until.get(t, {}).get(p)
        return until if until is not None and lo <= until else None

    def _lake_read(self, r: OffsetRange, lo: int) -> None:
        """Say that `r`, below the earliest `lo`, is read from the lake: a warning when retention deleted it, a note
        when lakeUntil asked for it."""
        until = self._until(r.topic, r.partition, lo)
        if until is not None:
            log.info("weir-kafka: %s partition %d: offsets [%d, %d) are below lakeUntil %d; reading them from the "
                     "lake %s", r.topic, r.partition, r.start, r.end, until, self.opts.lake)  # fmt: skip
            return
        log.warning(
            "weir-kafka: %s partition %d: offsets [%d, %d) are gone from the broker (earliest %d); "
            "reading them from the lake %s", r.topic, r.partition, r.start, r.end, lo, self.opts.lake,
        )  # fmt: skip

    def _lake_split(
        self, indexes: dict[str, LakeIndex], t: str, p: int, start: int, lo: int, end: int | None = None
    ) -> list[tuple[OffsetRange, bool]]:
        """Offsets [start, min(end, lo)) below the broker's earliest `lo`, cut into pieces the lake covers
        (True) and not (False). Raises DataLossError, with failOnDataLoss, when the lake lacks any of
        [start, lo): a query must not start a fallback it cannot finish."""
        if t not in indexes:
            indexes[t] = LakeIndex(self.opts.lake, t)
        index = indexes[t]
        pieces = index.split(OffsetRange(t, p, start, lo))
        gaps = [r for r, covered in pieces if not covered]
        if gaps and self.opts.fail_on_data_loss:
            raise DataLossError(
                _lake_gap_message(t, p, start, lo, gaps, index, self._until(t, p, lo))
                + ". Set failOnDataLoss=false to read what the lake holds and skip the rest."
            )
        stop = lo if end is None else min(end, lo)
        out = []
        for r, covered in pieces:
            if r.start < stop:
                out.append((OffsetRange(t, p, r.start, min(r.end, stop)), covered))
        return out

    def _lake_partitions(
        self, indexes: dict[str, LakeIndex], t: str, p: int, start: int, lo: int, end: int
    ) -> tuple[list[LakePartition], int]:
        """The tasks reading [start, min(end, lo)) from the lake, and the offsets skipped because the lake
        lacks them (only with failOnDataLoss=false)."""
        out, skipped = [], 0
        for r, covered in self._lake_split(indexes, t, p, start, lo, end):
            if covered:
                out.append(indexes[t].plan(r))
            else:
                skipped += r.size
                where = "below lakeUntil and not" if self._until(t, p, lo) is not None else "neither on the broker nor"
                log.warning(
                    "weir-kafka: data loss on %s partition %d: offsets [%d, %d) are %s in the lake %s; skipped "
                    "(failOnDataLoss=false)", t, p, r.start, r.end, where, self.opts.lake,
                )  # fmt: skip
        return out, skipped


class KafkaStreamReader(_RangeReading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver side of a streaming read. One instance lives for the whole query, so it keeps a metadata
    client and the last seen offsets between triggers."""

    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        super().__init__(opts, schema)
        self._view: LogView | None = None
        self._bounds: dict[TP, tuple[int, int]] = {}
        self._target: dict[TP, int] | None = None
        self._lake: dict[str, LakeIndex] = {}  # per trigger: latestOffset and partitions plan with one view
        # Lake reads and skips of a replayed batch beyond what its logged offset counted: added to the next one.
        self._uncounted = LakeFallback()
        self._uncounted_loss = DataLoss()
        self._replay_counted: str | None = None  # the end offset of the batch last counted so (planned once or more)
        # flow=auto: the admission controller, the last batch planned (end, records, whether it left records
        # waiting, the input's latest offsets summed, when) until it is measured, the last measurement used, and
        # whether the planned batch left records waiting (a backlog).
        self._admission = Controller(opts.flow) if opts.flow is not None else None
        self._planned: tuple[Positions, int, bool, int, float] | None = None
        self._measurement_seq: int | None = None
        self._catching_up = False
        self._reached = False  # whether this query's source has had an answer from the broker yet
        self._initial: dict | None = None  # this query's initial offset, resolved once
        self._follower: Follower | None = None  # followCheckpoint: built at the first batch
        self._follow_warned = False  # one warning when this query's batches stop being the followed ones

    @property
    def view(self) -> LogView:
        if self._view is None:
            self._view = LogView(self.opts.client, timeout=self.opts.request_timeout_s)
        return self._view

    def _discover(self, *, must_exist: bool = False) -> dict[TP, tuple[int, int]]:
        def look() -> dict[TP, tuple[int, int]]:
            return _bounds(self.opts, self.view, _subscribed(self.opts, self.view, must_exist=must_exist))

        self._bounds = self._ask(look, f"plan a batch of {self._what}")
        return self._bounds

    def _ask(self, look: Callable[[], T], what: str) -> T:
        """`look()` at the broker. The first contact fails at once: a wrong address or a broker down at the
        query's start is no outage to wait out, and a start should say so now rather than after
        broker_unavailable_timeout. After it, an outage is waited out here, in the planning of a batch: the
        query stays up."""

        def healed(bound: float) -> T:  # a view that cannot go on (weir.kafka.heal) is closed; the next is new
            try:
                self.view.timeout = bound  # short while the broker is away: its return is noticed within seconds
                return look()
            except Exception as exc:
                err = heal.raised_cannot_go_on(exc)
                if err is None or self._view is None:
                    raise
                self._view.close()
                self._view = None
                heal.counted("source view")
                raise BrokerUnavailable(f"the source's metadata client cannot go on ({err.name()}): rebuilt") from exc

        if self._reached:
            found = ride_out(healed, what, self.opts.servers, self.opts.broker_timeout_s)
        else:  # one request never outlasts the broker-unavailable limit
            found = healed(self.opts.request_timeout_s)
        self._reached = True
        return found

    @property
    def _what(self) -> str:
        return ", ".join(self.opts.topics) if self.opts.topics else f"topics matching {self.opts.pattern}"

    def initialOffset(self) -> dict:
        """Where a new query starts, resolved once per query: Spark asks again when batch 0 runs, and a second
        answer (`latest` after new records, `earliest` after retention) is not the start batch 0 was planned on.
        The plan's own start (`@start` of the batch's end offset) is what `partitions` reads from, so a restart
        that replays batch 0 reads the logged range, whatever this answers then."""
        if self._initial is None:
            bounds = self._discover(must_exist=bool(self.opts.topics))
            if isinstance(self.opts.ending, dict):
                _resolve(self.opts.ending, bounds, "endingOffsets")  # refuses partitions that do not exist
            self._initial = form.to_json(_resolve(self.opts.starting, bounds, "startingOffsets"))
        return dict(self._initial)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self._admission is not None or self.opts.follow is not None:
            return ReadAllAvailable()  # the controller, or the followed plans, end each batch (latestOffset)
        if self.opts.max_offsets is not None:
            return ReadMaxRows(self.opts.max_offsets)
        if self.opts.max_bytes is not None:
            return ReadMaxBytes(self.opts.max_bytes)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        # Exact high-water marks, each observed by this call (LogView.bounds refuses what it did not observe): a
        # target below the true end would end the run "finished" with records unread. endingOffsets lowers it:
        # the run ends there (a broker short of the end: at what it has now, as without endingOffsets).
        self._target = {tp: min(hi, self._ending(*tp, hi)) for tp, (_, hi) in self._discover().items()}

    def _ending(self, t: str, p: int, hi: int) -> int:
        """endingOffsets of a partition (a stream stops advancing there), else `hi`."""
        return self.opts.ending.get(t, {}).get(p, hi) if isinstance(self.opts.ending, dict) else hi

    def _effective_start(self, start: Positions, loss: DataLoss) -> tuple[Positions, DataLoss]:
        """Where this batch really starts per partition, after data-loss checks; new partitions start at
        their earliest offset (as Spark's Kafka source does). With the lake option, a start below the
        broker's earliest stays where it is (the lake supplies what the broker lost), past any leading
        piece the lake lacks (skipped and counted now, with failOnDataLoss=false)."""
        eff: Positions = {}
        for t, parts in start.items():
            for p, s in parts.items():
                lo, hi = self._bounds.get((t, p), (None, None))
                if lo is not None and lo <= s <= hi:
                    eff.setdefault(t, {})[p] = s
                    continue
                if self.opts.lake and lo is not None and s < lo:
                    at = s
                    for r, covered in self._lake_split(self._lake, t, p, s, lo):
                        if covered:
                            break
                        message = _lake_gap_message(t, p, s, lo, [r], self._lake[t], self._until(t, p, lo))
                        log.warning("%s; skipping (failOnDataLoss=false)", message)
                        loss = loss.add(r.size)
                        at = r.end
                    eff.setdefault(t, {})[p] = at
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

    def _lake_planned(
        self, eff: Positions, end: Positions, loss: DataLoss, fallback: LakeFallback
    ) -> tuple[DataLoss, LakeFallback]:
        """Count what this batch reads from the lake, and the pieces the lake lacks (skipped, with
        failOnDataLoss=false), for every partition starting below the broker's earliest offset."""
        ranges = []
        for (t, p), (lo, _) in sorted(self._bounds.items()):
            s, e = eff.get(t, {}).get(p, lo), end.get(t, {}).get(p, lo)
            if not self.opts.lake or s >= lo or e <= s:
                continue
            for r, covered in self._lake_split(self._lake, t, p, s, lo, e):
                if covered:
                    ranges.append(r)
                    self._lake_read(r, lo)
                else:
                    message = _lake_gap_message(t, p, s, lo, [r], self._lake[t], self._until(t, p, lo))
                    log.warning("%s; skipping (failOnDataLoss=false)", message)
                    loss = loss.add(r.size)
        return loss, fallback.add(ranges)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        positions, loss = form.from_json(start)
        fallback = form.fallback_from_json(start)
        self._discover()
        self._lake = {}  # the lake's manifests are read again each trigger that needs them
        eff, loss = self._effective_start(positions, loss)
        latest: Positions = {}
        for (t, p), (_, hi) in self._bounds.items():
            if self._target is not None:
                target = self._target.get((t, p), eff[t][p])
                if hi < target and eff[t][p] < target:
                    # The run would end short of the marks it took at its start: loudly, never "finished".
                    raise DataLossError(
                        f"weir-kafka: {t} partition {p}: the run must read to offset {target} (its high-water "
                        f"mark when the run began), but the broker's latest offset is now {hi}; the partition "
                        f"was truncated or recreated"
                    )
                # AvailableNow: nothing past the target, and no partition born after it.
                hi = min(hi, target)
            # endingOffsets: never beyond it (after the target's check: the broker's latest, not the cap, is checked)
            hi = min(hi, self._ending(t, p, hi))
            latest.setdefault(t, {})[p] = max(hi, eff[t][p])
        end = latest
        decision = None
        if self.opts.follow is not None:
            followed = self._followed(positions, eff, latest)
            if followed is None:
                # The followed query planned nothing further: no batch (counts wait for the next one).
                self._catching_up = False
                return start
            end = followed
        elif self._admission is not None:
            waiting = _records(eff, latest)
            decision = self._admit(positions, _total(latest), waiting)
            end = off.cap(eff, latest, decision.limit)
        elif not isinstance(limit, ReadAllAvailable):
            max_rows = self._max_rows(limit)
            if max_rows is not None:
                end = off.cap(eff, latest, max_rows)
        loss, fallback = self._lake_planned(eff, end, loss, fallback)
        fallback, self._uncounted = fallback.plus(self._uncounted), LakeFallback()
        if self._uncounted_loss.events:
            loss = DataLoss(loss.skipped_offsets + self._uncounted_loss.skipped_offsets, loss.events + 1)
            self._uncounted_loss = DataLoss()
        if end == positions and loss == form.from_json(start)[1] and fallback == form.fallback_from_json(start):
            # No batch: the offset must equal the start's exactly, or Spark would run an empty batch for it.
            self._catching_up = False
            return start
        # The plan carries its start (every partition it covers, new ones too): `partitions` reads from it.
        planned = {t: {p: eff[t][p] for p in parts} for t, parts in end.items()}
        out = form.to_json(end, loss, fallback, start=planned)
        if decision is not None:
            admitted = _records(eff, end)
            self._catching_up = waiting > admitted
            if admitted > 0:
                self._planned = (end, admitted, self._catching_up, _total(latest), time.monotonic())
                out[ADMISSION_KEY] = decision.to_json(self._admission.opts.target_s) | {"waiting": waiting}
        return out

    def _followed(self, start: Positions, eff: Positions, latest: Positions) -> Positions | None:
        """followCheckpoint: the end of the followed query's next logged batch after `start` (Spark's, before any
        adjustment), within what the broker has and never below where this batch starts (`eff`); partitions the
        plan does not name stay at `eff`. None when the followed query has not planned further."""
        if self._follower is None:
            self._follower = Follower(Checkpoint(self.opts.follow), self.opts.topics)
        planned = self._follower.next_end(start)
        if not self._follow_warned and not self._follower.aligned(start):
            self._follow_warned = True
            log.warning(
                "weir-kafka: this query's start %s is no batch boundary of the followed checkpoint %s (it fell behind "
                "the followed log, which Spark purges, or started elsewhere): its batches are not the followed ones "
                "until they meet again", start, self.opts.follow,
            )  # fmt: skip
        if planned is None:
            return None
        return {
            t: {p: max(eff[t][p], min(planned.get(t, {}).get(p, eff[t][p]), hi)) for p, hi in parts.items()}
            for t, parts in latest.items()
        }

    def _admit(self, start: Positions, latest: int, backlog: int) -> Decision:
        """The controller's decision for the batch after the one that ended at `start`, measured by the
        runner's file when it has a newer measurement, else by the time since that batch was planned (which
        includes any wait for the trigger: an over-estimate when the batch finished early). `latest`: the input's
        latest offsets summed now, so that what arrived while that batch ran is known; `backlog`: the records
        waiting from `start`."""
        rows = seconds = waiting = arrived = None
        if self._planned is not None and self._planned[0] == start:
            _, rows, waiting, latest_then, planned_at = self._planned
            arrived = max(latest - latest_then, 0)
            seconds = time.monotonic() - planned_at
            got = read_measurement(self._admission.opts.measurements) if self._admission.opts.measurements else None
            if got is not None and got[0] != self._measurement_seq:
                self._measurement_seq, seconds = got
        self._planned = None
        cap = memory_cap(self._admission.opts, self.view.average_record_bytes())
        return self._admission.decide(rows, seconds, cap, waiting, arrived, backlog)

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
        return form.to_json(latest)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        until, _ = form.from_json(end)
        begin = self._planned_start(start, end)
        wanted = [(t, p) for t, parts in until.items() for p in parts]
        if any(tp not in self._bounds for tp in wanted):
            # A restart replaying a logged batch: nothing discovered yet in this process.
            found = self._ask(lambda: _bounds(self.opts, self.view, wanted), f"replay a batch of {self._what}")
            self._bounds.update(found)
            self._lake = {}
        ranges = []
        lake: list[LakePartition] = []
        skipped = 0
        for t, parts in until.items():
            for p, e in parts.items():
                s = begin.get(t, {}).get(p)
                lo, hi = self._bounds.get((t, p), (0, 0))
                if self.opts.lake and s is not None and s < lo and s <= e:
                    # Below the broker's earliest: the lake's part first; the broker's part, if any, follows.
                    parts_, lost = self._lake_partitions(self._lake, t, p, s, lo, e)
                    lake.extend(parts_)
                    skipped += lost
                    if e <= lo:
                        continue
                    s = lo
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
                    # Only a batch logged before plans carried their start: a new partition, or a loss counted in
                    # @dataLoss when the batch was planned.
                    s = lo
                ranges.append(OffsetRange(t, p, s, e))
        self._count_replayed(start, end, lake, skipped)
        tasks = self.opts.min_partitions
        if self._catching_up and self.opts.flow is not None and self.opts.flow.cores:
            tasks = max(tasks or 0, self.opts.flow.cores)  # a backlog: a read task for every core
        return [*lake, *(KafkaPartition(r) for r in off.split(ranges, tasks))]

    def _planned_start(self, start: dict, end: dict) -> Positions:
        """Where the batch ending at `end` reads from: the start logged in its plan (`@start`). Checked against the
        end of the batch before (`start`, as Spark hands it), partition by partition: a difference must be a skip
        the plan counted in `@dataLoss`, or batch 0's start asked again (Spark's second `initialOffset`, which
        this source answers from the plan). Anything else is refused: offsets no batch reads, or read twice."""
        previous, loss_before = form.from_json(start)
        planned = form.starts_from_json(end)
        if planned is None:
            return previous  # an offset logged before plans carried their start
        _, loss_after = form.from_json(end)
        counted = loss_after.skipped_offsets - loss_before.skipped_offsets
        initial = self._initial is not None and form.from_json(self._initial)[0] == previous
        for t, parts in planned.items():
            for p, s in parts.items():
                was = previous.get(t, {}).get(p)
                if was is None or was == s or initial:
                    continue
                if s > was and loss_after.events > loss_before.events and counted >= s - was:
                    continue  # skipped and counted when planned (failOnDataLoss=false)
                if s < was and loss_after.events > loss_before.events:
                    continue  # the log was recreated below the old end: counted when planned
                gap = f"offsets [{was}, {s}) would never be read" if s > was else f"offsets [{s}, {was}) read twice"
                raise DataLossError(
                    f"weir-kafka: the plan of this batch starts {t} partition {p} at offset {s}, but the batch "
                    f"before ended at {was}: {gap}. The checkpoint's offset log is inconsistent; see `weir audit`."
                )
        if initial and planned != {t: {p: previous.get(t, {}).get(p) for p in ps} for t, ps in planned.items()}:
            log.info("weir-kafka: batch 0 reads from its planned start %s (Spark asked for the initial offset "
                     "again and got %s)", planned, previous)  # fmt: skip
        return planned

    def _count_replayed(self, start: dict, end: dict, lake: list[LakePartition], skipped: int) -> None:
        """A batch planned before retention passed it and replayed after (a restart after a crash mid-batch)
        reads more from the lake, or skips more, than its logged offset counts: the difference goes into the
        next offset."""
        logged, before = form.fallback_from_json(end), form.fallback_from_json(start)
        extra = sum(p.end - p.start for p in lake) - (logged.offsets - before.offsets)
        extra_loss = skipped - (form.from_json(end)[1].skipped_offsets - form.from_json(start)[1].skipped_offsets)
        key = json.dumps(end, sort_keys=True)
        if (extra <= 0 and extra_loss <= 0) or key == self._replay_counted:
            return
        self._replay_counted = key  # Spark may plan one batch more than once (each action on it)
        if extra_loss > 0:
            log.warning(
                "weir-kafka: this batch skips %d offsets more than it counted when it was planned; they are counted "
                "in the next batch's @dataLoss", extra_loss,
            )  # fmt: skip
            self._uncounted_loss = self._uncounted_loss.add(extra_loss)
        if extra <= 0:
            return
        log.warning(
            "weir-kafka: this batch reads %d more offsets from the lake than it counted when it was planned (the "
            "broker deleted them since); they are counted in the next batch's @lakeFallback", extra,
        )  # fmt: skip
        counted_ranges = logged.ranges - before.ranges
        self._uncounted = self._uncounted.plus(
            LakeFallback(
                extra, max(len(lake) - counted_ranges, 0), 0 if logged.events > before.events else 1,
                tuple(p.range for p in lake),
            )
        )  # fmt: skip

    def commit(self, end: dict) -> None:
        """Nothing to do: offsets live in Spark's checkpoint, never in a consumer group."""

    def stop(self) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None


def _total(positions: Positions) -> int:
    return sum(o for parts in positions.values() for o in parts.values())


def _records(start: Positions, end: Positions) -> int:
    return sum(max(e - start.get(t, {}).get(p, e), 0) for t, parts in end.items() for p, e in parts.items())


class KafkaBatchReader(_RangeReading, DataSourceReader):
    """A bounded read of [startingOffsets, endingOffsets) for `spark.read`."""

    def partitions(self) -> list[InputPartition]:
        view = LogView(self.opts.client, timeout=self.opts.request_timeout_s)
        try:
            bounds = _bounds(self.opts, view, _subscribed(self.opts, view, must_exist=bool(self.opts.topics)))
        finally:
            view.close()
        begin = _resolve(self.opts.starting, bounds, "startingOffsets")
        until = _resolve(self.opts.ending, bounds, "endingOffsets")
        ranges = []
        lake: list[InputPartition] = []
        indexes: dict[str, LakeIndex] = {}  # local: this reader is pickled to the tasks after planning
        for (t, p), (lo, hi) in sorted(bounds.items()):
            s, e = begin[t][p], until[t][p]
            if self.opts.lake and s < lo and s < e:
                parts, _ = self._lake_partitions(indexes, t, p, s, lo, e)
                for part in parts:
                    self._lake_read(part.range, lo)
                lake.extend(parts)
                if e <= lo:
                    continue
                s = lo
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
        return lake + [KafkaPartition(r) for r in off.split(ranges, self.opts.min_partitions)]


class KafkaDataSource(DataSource):
    """`format("weir-kafka")`: see docs/connector.md's options table."""

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
        return KafkaBatchWriter(parse_sink(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool):
        return KafkaStreamWriter(parse_sink(self.options), schema)
