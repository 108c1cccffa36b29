"""What the monitor keeps of each processor (`Track`) and topic (`TopicTrack`), and how a progress record or
a poll of the broker changes it. Plain data, no lock: the `Monitor` (weir/monitor/state.py) holds its lock
around every call. Bounded: series are rings, samples and windows deques with a maximum length.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from weir.monitor import compute
from weir.monitor.compute import TP
from weir.monitor.drift import Releases
from weir.monitor.model import SAMPLED, Completeness, ProcessorFigures, Violation
from weir.monitor.records import Failure, Heartbeat, Idle, Progress, Record, RetentionReport, StateChange
from weir.monitor.series import Histogram, Ring

BATCH_SERIES = ("input_rows", "spark_input_rate", "spark_processed_rate", "batch_ms", "scheduling_delay_ms", "dlq",
                "late")  # fmt: skip
SAMPLED_SERIES = tuple(SAMPLED)  # sampled from the figures at each refresh
# Records of a processor whose identity the monitor remembers, to apply a record that arrives again once: a
# publisher's next start publishes again what the broker did not acknowledge (weir.runtime.acked), seconds of
# records, at once.
REMEMBERED = 2_000


def finite(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def side_topic(topic: str, inputs: Iterable[str]) -> bool:
    """A processor's dead-letter or late topic (`<input>.dlq`, `<input>.late`): a side output, not data."""
    base, _, suffix = topic.rpartition(".")
    return suffix in ("dlq", "late") and base in set(inputs)


@dataclass(frozen=True)
class BrokerSnapshot:
    """One poll of the broker."""

    at_ms: int
    bounds: dict[TP, tuple[int, int]]  # (earliest, latest) of the partitions of the topics of interest
    retention_ms: dict[str, int | None]  # per topic; None: unlimited or not known
    timestamps: dict[tuple[TP, int], int | None] = field(default_factory=dict)  # record timestamp at an offset


@dataclass
class TopicTrack:
    name: str
    points: int
    partitions: dict[int, tuple[int, int]] = field(default_factory=dict)
    retention_ms: int | None = None
    polled_ms: int | None = None
    samples: deque = field(default_factory=lambda: deque(maxlen=2_000))  # (t, sum of latest offsets)


@dataclass
class Track:
    """Everything the monitor keeps about one processor."""

    key: str
    pipeline: str
    name: str
    points: int
    declared: bool = False
    trigger_ms: float | None = None  # from the pipeline spec; else the settings' (see Monitor.trigger_of)
    checkpoint: str | None = None
    inputs: set[str] = field(default_factory=set)
    outputs: set[str] = field(default_factory=set)
    side_outputs: set[str] = field(default_factory=set)
    first_seen_ms: int | None = None
    last_record_ms: int | None = None
    last_progress: Progress | None = None
    last_advance_ms: int | None = None
    caught_up_ms: int | None = None
    committed: dict[TP, int] = field(default_factory=dict)
    moved_ms: dict[TP, int] = field(default_factory=dict)  # when each input partition's offset last advanced
    checkpoint_committed: dict[TP, int] = field(default_factory=dict)
    completeness: Completeness = field(default_factory=Completeness)  # the audit of its checkpoint
    lifecycle: str | None = None
    lifecycle_ms: int | None = None
    note: str | None = None
    failed_at_ms: int | None = None
    last_error: str | None = None
    failures_in_row: int = 0  # as the last failure record said
    restarts: int = 0
    client_rebuilds: dict[str, int] = field(default_factory=dict)  # its process's, as its last record said
    failures_total: int = 0
    failures: deque = field(default_factory=lambda: deque(maxlen=10_000))  # at_ms
    batches: deque = field(default_factory=lambda: deque(maxlen=20_000))  # (at_ms, in, dlq, late, violations)
    totals: Counter = field(default_factory=Counter)
    unbalanced_batches: int = 0
    last_violation: Violation | None = None
    runner_alive: bool | None = None
    runner_state: str | None = None
    runner_started_ms: int | None = None  # when its runner started, from its state file
    # Its runner's last heartbeat while it is the processor's last word (a batch, an idle record, a failure or a
    # state change after it says more), and since when a "starting" state has not been followed by a batch.
    heartbeat: Heartbeat | None = None
    starting_since_ms: int | None = None
    reports: dict[TP, RetentionReport] = field(default_factory=dict)
    offsets: deque = field(default_factory=lambda: deque(maxlen=2_000))  # (t, latest sum, committed sum)
    lag_samples: deque = field(default_factory=lambda: deque(maxlen=2_000))  # (t, lag)
    pending_since_ms: int | None = None
    stamps: dict[TP, tuple[int, int]] = field(default_factory=dict)  # last known (offset, timestamp) of oldest
    series: dict[str, Ring] = field(default_factory=dict)
    # (duration ms, first batch of its run) of the last batches that read records: their pace, for stalls
    paces: deque = field(default_factory=lambda: deque(maxlen=20))
    paced_run: str | None = None
    batch_hist: Histogram = field(default_factory=Histogram)
    delay_hist: Histogram = field(default_factory=Histogram)
    figures: ProcessorFigures | None = None  # of the last refresh (weir/monitor/figures.py)
    releases: Releases = field(default_factory=Releases)  # each version's books (weir/monitor/drift.py)
    seen: deque = field(default_factory=lambda: deque(maxlen=REMEMBERED))  # identities of its last records
    seen_set: set = field(default_factory=set)

    def __post_init__(self) -> None:
        self.series = {name: Ring(self.points) for name in (*BATCH_SERIES, *SAMPLED_SERIES)}

    def committed_now(self) -> dict[TP, int]:
        """Committed offsets: the last batch's end offsets, or the checkpoint's where it is ahead."""
        out = dict(self.committed)
        for tp, off in self.checkpoint_committed.items():
            out[tp] = max(off, out.get(tp, off))
        return out

    # -- progress records ---------------------------------------------------------------------------------
    def first_time(self, identity: bytes) -> bool:
        """Whether a record of this identity is new among its last REMEMBERED (remembered from now on)."""
        if identity in self.seen_set:
            return False
        if len(self.seen) == self.seen.maxlen:
            self.seen_set.discard(self.seen[0])
        self.seen.append(identity)
        self.seen_set.add(identity)
        return True

    def apply(self, record: Record, trigger_ms: float) -> None:
        """A record of this processor; `trigger_ms` its trigger (for the scheduling delay of a batch)."""
        self.first_seen_ms = self.first_seen_ms or record.at_ms
        # A record older than what was heard last (one a publisher's next start published again) says nothing of now
        latest = record.at_ms >= (self.last_record_ms or 0)
        self.last_record_ms = max(self.last_record_ms or 0, record.at_ms)
        self.client_rebuilds = dict(record.client_rebuilds)
        self._phase(record, latest)
        if isinstance(record, Progress):
            self._progress(record, trigger_ms)
        elif isinstance(record, Failure):
            self.failures.append(record.at_ms)
            self.failures_total += 1
            self.failed_at_ms = record.at_ms
            self.last_error = record.error
            self.failures_in_row = record.failures_in_row
            self.restarts = record.restarts
            self.lifecycle = "failed" if record.next_restart_s is None else "restarting"
            self.lifecycle_ms = record.at_ms
        elif isinstance(record, StateChange):
            if record.state in ("code_changed", "state_evolved"):
                self.note = record.note
            else:
                self.lifecycle, self.lifecycle_ms = record.state, record.at_ms
                if record.state == "running":
                    self.failed_at_ms = None  # restarted
        elif isinstance(record, RetentionReport):
            self.reports[(record.topic, record.partition)] = record

    def _phase(self, record: Record, latest: bool) -> None:
        """What the processor does now, as its records say: a heartbeat names its phase until another record says
        more; a "starting" state holds until a batch, an idle record, a failure or an end."""
        if isinstance(record, Heartbeat):
            if latest:
                self.heartbeat = record
            return
        if isinstance(record, RetentionReport) or not latest:
            return
        if isinstance(record, StateChange) and record.state in ("code_changed", "state_evolved"):
            return
        self.heartbeat = None
        if isinstance(record, StateChange) and record.state == "starting":
            self.starting_since_ms = record.at_ms
        elif isinstance(record, Progress | Idle | Failure) or (
            isinstance(record, StateChange) and record.state != "running"
        ):
            self.starting_since_ms = None

    def phase(self) -> tuple[str | None, int | None, int | None]:
        """(phase, since ms, batch in progress) of the processor now (weir.wire.PHASES), None when nothing says:
        its live runner's state file when it names it pending or starting (a runner publishes nothing before its
        Spark session and its tracing are done), else its last heartbeat, else a start not followed by a batch."""
        hb = self.heartbeat
        if self.runner_alive and self.runner_state in ("pending", "starting"):
            since = self.runner_started_ms
            if hb is not None and hb.phase == self.runner_state:
                since = hb.since_ms
            elif self.runner_state == "starting" and self.starting_since_ms is not None:
                since = self.starting_since_ms
            return self.runner_state, since, None
        if hb is not None:
            return hb.phase, hb.since_ms, hb.batch_id
        if self.starting_since_ms is not None:
            return "starting", self.starting_since_ms, None
        return None, None, None

    def _progress(self, r: Progress, trigger_ms: float) -> None:
        prev = self.last_progress
        self.inputs |= {tp[0] for tp in (*r.end_offsets, *r.latest_offsets)}
        for dest in r.outputs:
            (self.side_outputs if side_topic(dest, self.inputs) else self.outputs).add(dest)
        moved = prev is None or r.end_offsets != prev.end_offsets
        for tp, off in r.end_offsets.items():
            if prev is None or prev.end_offsets.get(tp) != off or tp not in self.moved_ms:
                self.moved_ms[tp] = r.at_ms
        if r.input_rows > 0 or moved:
            self.last_advance_ms = r.at_ms
        if r.end_offsets:
            self.committed = dict(r.end_offsets)
        if r.latest_offsets and all(r.end_offsets.get(tp, -1) >= off for tp, off in r.latest_offsets.items()):
            self.caught_up_ms = max(self.caught_up_ms or 0, r.at_ms)
        self.failed_at_ms = None
        if self.lifecycle != "running":
            self.lifecycle, self.lifecycle_ms = "running", r.at_ms
        self.restarts = r.restarts
        self.last_progress = r
        a = r.accounting
        # The runner counts an unbalanced batch as a violation; a record that only says balanced=false counts too.
        violations = a.get("violations", 0) or (0 if r.balanced else 1)
        self.batches.append((r.at_ms, a.get("in", 0), a.get("dlq", 0), a.get("late", 0), violations))
        for k, v in a.items():
            self.totals[k] += v
        self.releases.add(r.version, r.at_ms, a, r.outputs)
        if violations or not r.balanced:
            self.unbalanced_batches += 1
            self.last_violation = Violation(r.batch_id, r.at_ms, r.unaccounted, dict(a))
        if r.input_rows <= 0:
            return  # an idle trigger: no batch to time
        s = self.series
        s["input_rows"].add(r.at_ms, r.input_rows)
        s["spark_input_rate"].add(r.at_ms, finite(r.input_rate))
        s["spark_processed_rate"].add(r.at_ms, finite(r.processed_rate))
        s["dlq"].add(r.at_ms, a.get("dlq", 0))
        s["late"].add(r.at_ms, a.get("late", 0))
        if r.batch_ms is not None:
            s["batch_ms"].add(r.at_ms, r.batch_ms)
            self.batch_hist.observe(r.batch_ms)
            self.paces.append((r.batch_ms, r.run_id != self.paced_run))
            self.paced_run = r.run_id
        if prev is not None and prev.run_id == r.run_id and r.batch_id == prev.batch_id + 1:
            delay = compute.scheduling_delay_ms(prev.batch_at_ms, r.batch_at_ms, trigger_ms)
            if delay is not None:
                s["scheduling_delay_ms"].add(r.at_ms, delay)
                self.delay_hist.observe(delay)

    def pace_ms(self) -> float | None:
        """The longest of the last batches, a run's first batch (Python workers and state starting, the
        backlog of its downtime) aside once a later one is known: how long a batch may take, for stalls."""
        steady = [ms for ms, first in self.paces if not first]
        recent = steady or [ms for ms, _ in self.paces]
        return max(recent) if recent else None

    # -- polls of the broker --------------------------------------------------------------------------------
    def observe_poll(self, at_ms: int, bounds: dict[TP, tuple[int, int]]) -> None:
        """Its offsets at a poll: samples for the rates and the lag's trend, and since when input is pending."""
        committed = self.committed_now()
        lag = compute.lag_records(committed, bounds, self.inputs)
        if not lag:
            return
        total = sum(lag.values())
        latest = sum(bounds[tp][1] for tp in lag)
        self.offsets.append((at_ms, latest, sum(committed.get(tp, bounds[tp][0]) for tp in lag)))
        self.lag_samples.append((at_ms, total))
        if total > 0:
            self.pending_since_ms = self.pending_since_ms or at_ms
        else:
            self.pending_since_ms = None
            self.caught_up_ms = max(self.caught_up_ms or 0, at_ms)
