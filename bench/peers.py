"""The peer workload, every system in one run: a 10 s tumbling event-time window per user over Kafka.

    .venv/bin/python bench/peers.py [--records 1000000] [--weir-timeout 900] [--weir-unlimited] [--blocks [NAMES]]
                                    [--only raw,loop,spark,weir,bytewax,quix] [--max-per-trigger 100000]
                                    [--weir-env KEY=VALUE ...]

Workload (shared/FACTS.md, "Peers on the same work"): N JSON events of about 140 B, keyed by user (997 users),
on 4 partitions of one embedded Apache Kafka broker that this script starts on a free port and stops at the end,
produced with confluent-kafka before any system runs:

    {"id": 17, "user": "u0042", "amount": 12.25, "ts": <event time ms>, "item": ..., "country": ..., "note": ...}

Event time advances steadily, --event-rate events per event-second (default 10,000, lowered to N/100 for a
small N so that every run spans about 100 event-seconds, i.e. 10 windows), each event up to --jitter-ms (500)
earlier than its place, well under the watermark delay (2 s). Amounts are multiples of 0.25, so every sum is
exact whatever the order of additions. The Kafka timestamp of an event is its event time.

Each system parses the events, keeps a 10 s tumbling window (aligned to the epoch) per user with count and sum
of amount, and writes closed windows to its own output topic:

  raw consume       a confluent-kafka consumer reading every message, no parsing (the baseline)
  hand loop         one Python process: consume, json.loads, a dict of windows, closed windows produced
  spark native      readStream weir-kafka -> withWatermark -> groupBy(window, user).agg -> writeStream weir-kafka,
                    append mode, Trigger.AvailableNow, local[2], --max-per-trigger records per batch
  weir tumbling     bench/peers/weir_pipelines.py:tumbling (weir.blocks.window.tumbling_window) by
                    `weir run --once` with default settings; with --weir-unlimited again with
                    WEIR_MAX_OFFSETS_PER_TRIGGER=0 (no limit)
  bytewax           Bytewax 0.21.1, KafkaSource/KafkaSink, fold_window on TumblingWindower + EventClock:
                    1 worker (`python -m bytewax.run -w1`), and 2 processes (`python -m bytewax.testing -p2`)
  quix              Quix Streams 3.28.1, 1 process: tumbling_window(...).reduce(...).final()

Bytewax and Quix Streams run in throwaway virtual environments made here on first use and reused after,
~/.cache/weir-bench/venvs/<name>-<version> (pinned versions, outside weir's pyproject). A peer that cannot
be installed or fails gets its reason in its row; the run goes on.

Expected output: a window [start, end) is expected closed iff end <= max event time of all events - 2 s
(what a watermark of "max event time seen - delay" closes once it has seen everything). Only output windows
with such an end are compared (a system may flush the rest at the end or not); the check is an exact match of
the multiset {(user, start, count, sum)} against the one computed here from the produced events.

Figures, each system a subprocess (its whole process tree measured):
  steady rows/s     Python peers: input messages / (done - first input message), both stamped by the program;
                    Spark and weir: input rows / triggerExecution time of the batches after the first (of all
                    batches when there is only one), from the query's progress (weir: <WEIR_HOME>/progress)
  whole-run rows/s  N / (done - launch of the subprocess); done is the program's own end of work (weir: its
                    last progress record), so JVM and interpreter shutdown are left out; start-up is in
  peak RSS MB       the largest sum of RSS over the process tree, sampled from /proc every 100 ms; for Spark
                    and weir also printed by kind of process at that peak (the JVM, each Python worker module)
  CPU s             user + system CPU of the tree: the larger of getrusage(RUSAGE_CHILDREN) over the run and
                    the sum of the last /proc/<pid>/stat sample of every process seen in the tree
  output correct    the check above; a timed-out run shows its figures so far

--blocks then runs weir's other blocks on the same input, each by `weir run --once`, against the tumbling
window's steady rate: sliding_window (1 min, slide 10 s), session_window (gap 30 s), a tumbling window of avg and
p95 (a KLL sketch), the tumbling window with 30 s of allowed lateness, a running aggregate per user (count,
sum, avg; one row per user and batch), deduplicate (on id),
join_table (a 100k-key changelog topic), join_streams (each event left-joined with its payment, made 0 to 4 minutes
after it, within 5 minutes: 2N input records, all in state until their interval closes), a @stateful rule (per
user, an amount over twice the average of the last 10); and a stateless processor (filter + map) against the same query
written by hand over weir-kafka (no routing, no accounting). Every block runs per bucket of keys; deduplicate
keeps one key per event, so its state (and each call's cost) grows with N.

The peers' versions of two blocks (issue 29) run after weir's, for each of bytewax and quix that --only names
(both by default), each in its own output topic (peers.<system>.<block>), with the ratio weir's block steady /
the peer's (above 1: weir is faster):

  keyed       Bytewax stateful_map (bench/peers/bytewax_flow.py:keyed; 1 worker, and 2 processes) and Quix
              Streams apply(stateful=True) with State (bench/peers/quix_app.py keyed; 1 process), per user
              the last 10 amounts, the same rule (common.spike), in arrival order
  streamjoin  Bytewax join_window on a SessionWindower (gap 5 min) per id, the pairs outside the interval
              dropped (bytewax_flow.py:streamjoin; 1 worker, 2 processes); Quix Streams join_interval(how="left",
              forward_ms 5 min) after group_by("id") (quix_app.py streamjoin; 1 process). How each differs from
              weir's join: the docstrings of those files, and the row's notes

    .venv/bin/python bench/peers.py --blocks keyed,streamjoin --only weir,bytewax,quix   # weir tumbling, the
                                                            # peers' tumbling rows, weir's blocks, the peers' blocks

(weir's blocks run whenever --blocks is given; weir's tumbling row, their ratios' base, only with weir in --only.)
The payments are produced with the murmur2 partitioner (as a Java client would): Quix Streams joins only
co-partitioned topics, and partitions its re-keyed events with murmur2.

Checked exactly, for weir and the peers alike, against what this script computes from the produced records:
keyed, the multiset {(user, amount, avg10)} (a row twice is one too many), the rule run per user in the order
the system sees the records: arrival order for the peers; for weir, event-time order within each micro-batch
(its batches from the end offsets in its progress records) and batch order across them; streamjoin, one
(id, user, amount, method, paid_ms) per event with its own payment, no event without one (every payment lies
within its event's interval), nothing twice, except that Quix's left join may first write an event without its
payment (it has none yet) and then with it: those rows are counted and shown, not failed. (Quix's join pairs two
records only when the later one in event time is read second: a payment read before its event goes unpaired,
and the row fails; the notes say so.)

This machine's speed varies from day to day and under other load: compare ratios measured in the same run; the
load average is printed at start and end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT / "bench" / "peers"
sys.path.insert(0, str(ROOT))

from weir.checkpoint.offsets import from_json, parsed  # noqa: E402
from weir.kafka import Admin  # noqa: E402
from weir.kafka.broker import embedded_broker, free_port  # noqa: E402

console = Console(width=max(160, shutil.get_terminal_size().columns))
INPUT = "events"
USERS = 997
TABLE_KEYS = 100_000
SIZE_MS = 10_000
DELAY_MS = 2_000
TOPIC_CONFIG = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}
VENVS = Path.home() / ".cache" / "weir-bench" / "venvs"
PEER_PACKAGES = {
    "bytewax": ("bytewax-0.21.1", ["bytewax==0.21.1", "confluent-kafka"]),
    "quix": ("quixstreams-3.28.1", ["quixstreams==3.28.1"]),
}
SYSTEMS = ("raw", "loop", "spark", "weir", "bytewax", "quix")
BLOCKS = ("sliding", "session", "sketched", "lateness", "running", "dedup", "join", "streamjoin", "keyed", "stateless")
PEER_BLOCKS = ("keyed", "streamjoin")  # blocks that Bytewax and Quix Streams run too
PAYMENTS = "peers.payments"
LAST = 10  # the keyed rule: per user, an amount over twice the average of the last LAST
PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")

Window = tuple[str, int, int, float]  # user, start ms, count, sum
Check = Callable[[str], tuple[bool, str]]  # an output topic -> (exact, how it differs)


# ---------------------------------------------------------------- the workload


_PRODUCER = {
    "linger.ms": 20,
    "batch.num.messages": 10_000,
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "acks": 1,
}


def _producer(bootstrap: str) -> Producer:
    return Producer({**_PRODUCER, "bootstrap.servers": bootstrap})


def _send(producer: Producer, topic: str, value: bytes, key: bytes, ts: int, delivered: Callable | None = None) -> None:
    extra = {} if delivered is None else {"on_delivery": delivered}
    while True:
        try:
            producer.produce(topic, value, key, timestamp=ts, **extra)
            return
        except BufferError:
            producer.poll(0.05)


@dataclass
class Produced:
    """The produced records as the checks of keyed and streamjoin need them, by event id."""

    users: list[str] = field(default_factory=list)
    amounts: list[float] = field(default_factory=list)
    times: list[int] = field(default_factory=list)  # event time, ms
    partitions: list[int] = field(default_factory=list)  # of INPUT, from the delivery reports
    offsets: list[int] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)  # each event's payment
    paid: list[int] = field(default_factory=list)

    def add(self, user: str, amount: float, ts: int) -> Callable:
        """One more event; returns its delivery callback (which notes its partition and offset)."""
        self.users.append(user)
        self.amounts.append(amount)
        self.times.append(ts)
        self.partitions.append(-1)
        self.offsets.append(-1)
        return partial(self._delivered, len(self.users) - 1)

    def _delivered(self, i: int, err: KafkaError | None, msg: object) -> None:
        if err is None:
            self.partitions[i], self.offsets[i] = msg.partition(), msg.offset()  # type: ignore[attr-defined]


def produce(
    bootstrap: str, n: int, rate: float, jitter_ms: int, seed: int, log: Produced | None = None
) -> tuple[Counter, int]:
    """N events into INPUT; returns (expected closed windows as a multiset, the closing bound W). `log`, if
    given, gets each event (for `produce_payments` and the blocks' checks)."""
    rng = random.Random(seed)
    names = [f"u{k:04d}" for k in range(USERS)]
    # The stream starts 5 s into a window and ends about now, so the bound max - 2 s falls mid-window.
    span_ms = int(n / rate * 1000)
    t0 = (int(time.time() * 1000) - span_ms) // SIZE_MS * SIZE_MS + 5_000
    producer = _producer(bootstrap)
    windows: dict[tuple[str, int], list] = {}
    max_ts = 0
    note = "x" * 24
    for i in range(n):
        user = names[rng.randrange(USERS)]
        ts = t0 + int(i * 1000 / rate) - rng.randrange(jitter_ms + 1)
        amount = rng.randrange(1, 400) * 0.25
        ev = {
            "id": i, "user": user, "amount": amount, "ts": ts, "item": f"sku-{rng.randrange(100_000):06d}",
            "country": rng.choice(("FR", "DE", "US", "JP", "BR")), "note": note,
        }  # fmt: skip
        max_ts = max(max_ts, ts)
        acc = windows.setdefault((user, ts - ts % SIZE_MS), [0, 0.0])
        acc[0] += 1
        acc[1] += amount
        delivered = None if log is None else log.add(user, amount, ts)
        _send(producer, INPUT, json.dumps(ev).encode(), user.encode(), ts, delivered)
    if producer.flush(120):
        raise RuntimeError("events were not all delivered")
    if log is not None and -1 in log.offsets:
        raise RuntimeError("an event's delivery report is missing")
    bound = max_ts - DELAY_MS
    expected = Counter(
        (u, s, c, round(t, 2)) for (u, s), (c, t) in windows.items() if s + SIZE_MS <= bound
    )  # fmt: skip
    return expected, bound


def produce_payments(bootstrap: str, topic: str, log: Produced, seed: int) -> None:
    """One payment per event, by its id, 0 to 4 minutes after it (event time), in the order events were made:
    the stream-stream join's right side (its interval: 5 minutes). Keyed by the id (its text) and partitioned
    with murmur2, as Quix Streams partitions the events it re-keys by id: its join needs both alike."""
    rng = random.Random(seed + 1)
    producer = Producer({**_PRODUCER, "bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    for i, ts in enumerate(log.times):
        paid = ts + rng.randrange(240_000)
        method = rng.choice(("card", "cash", "wire"))
        log.methods.append(method)
        log.paid.append(paid)
        value = json.dumps({"id": i, "method": method, "paid_ms": paid}).encode()
        _send(producer, topic, value, str(i).encode(), paid)
    if producer.flush(120):
        raise RuntimeError("payments were not all delivered")


def produce_table(bootstrap: str, topic: str) -> None:
    """TABLE_KEYS users (every event's user among them) as a changelog table."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "queue.buffering.max.messages": 500_000})
    for k in range(TABLE_KEYS):
        user = f"u{k:04d}"
        value = json.dumps({"user": user, "segment": f"s{k % 7}", "region": f"r{k % 13}"}).encode()
        while True:
            try:
                producer.produce(topic, value, user.encode())
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)


def consume_all(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """Every (key, value) of `topic` now."""
    bounds = {p: b for p, b in Admin(bootstrap).offsets(topic).items() if b[1] > b[0]}
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"peers-check-{uuid.uuid4().hex[:8]}",
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, lo) for p, (lo, _) in bounds.items()])
    out, remaining = [], {p: hi for p, (_, hi) in bounds.items()}
    try:
        while remaining:
            for m in consumer.consume(num_messages=10_000, timeout=1.0):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(err)
                out.append((m.key(), m.value()))
                if m.offset() + 1 >= remaining.get(m.partition(), 0):
                    remaining.pop(m.partition(), None)
    finally:
        consumer.close()
    return out


def _ms(v: object) -> int:
    """A window bound as epoch ms: a number, or a timestamp as text (weir writes ISO-8601)."""
    if isinstance(v, int | float):
        return int(v)
    text = str(v).replace("Z", "+00:00")
    if " " in text and "T" not in text:
        text = text.replace(" ", "T")
    return round(datetime.fromisoformat(text).timestamp() * 1000)


def check_output(bootstrap: str, topic: str, expected: Counter, bound: int) -> tuple[bool, str]:
    """The output's windows with end <= bound against the expected ones: (exact match, how it differs)."""
    got: Counter = Counter()
    beyond = bad = 0
    for key, value in consume_all(bootstrap, topic):
        try:
            w = json.loads(value)
            user = w.get("user") or (key or b"").decode()
            start = _ms(w.get("start", w.get("window_start")))
            end = _ms(w.get("end", w.get("window_end")))
            count, total = int(w["count"]), round(float(w["sum"]), 2)
        except (TypeError, ValueError, KeyError, json.JSONDecodeError):
            bad += 1
            continue
        if end <= bound:
            got[(user, start, count, total)] += 1
        else:
            beyond += 1
    missing, extra = expected - got, got - expected
    ok = not missing and not extra and not bad
    detail = f"{sum(got.values()):,} of {sum(expected.values()):,} expected windows"
    if missing:
        detail += f", {sum(missing.values()):,} missing (e.g. {next(iter(missing))})"
    if extra:
        detail += f", {sum(extra.values()):,} unexpected (e.g. {next(iter(extra))})"
    if bad:
        detail += f", {bad:,} unreadable"
    if beyond:
        detail += f"; {beyond:,} later windows flushed (not compared)"
    return ok, detail


def _compare(got: Counter, expected: Counter, what: str) -> tuple[bool, str]:
    """A multiset of output rows against the expected one: (exact, "n of m expected <what>, ...")."""
    missing, extra = expected - got, got - expected
    twice = sum(n for row, n in extra.items() if row in expected)  # an expected row more often than expected
    detail = f"{sum(got.values()):,} of {sum(expected.values()):,} expected {what}"
    if missing:
        detail += f", {sum(missing.values()):,} missing (e.g. {next(iter(missing))})"
    if twice:
        detail += f", {twice:,} duplicated"
    if sum(extra.values()) > twice:
        stray = next(row for row in extra if row not in expected)
        detail += f", {sum(extra.values()) - twice:,} unexpected (e.g. {stray})"
    return not missing and not extra, detail


def expected_spikes(log: Produced, order: Callable[[int], tuple] | None = None) -> Counter:
    """The keyed rule's rows {(user, amount, avg10)} when each user's events are seen in `order` (a sort key
    on the event id; None: arrival order, the order they were produced, which a partition keeps)."""
    by_user: dict[str, list[int]] = {}
    for i, user in enumerate(log.users):
        by_user.setdefault(user, []).append(i)
    rows: Counter = Counter()
    for user, ids in by_user.items():
        recent: list[float] = []
        for i in sorted(ids, key=order) if order else ids:
            amount = log.amounts[i]
            if len(recent) == LAST and amount > 2 * sum(recent) / LAST:
                rows[(user, amount, round(sum(recent) / LAST, 6))] += 1
            recent.append(amount)
            if len(recent) > LAST:
                del recent[0]
    return rows


def weir_order(log: Produced, progress: list[dict]) -> tuple[Callable[[int], tuple], int]:
    """weir's @stateful order of the events, from its progress records: by micro-batch (each batch's end offsets
    of INPUT), then event time, then offset; and the number of batches found with end offsets (0: event time)."""
    ends: dict[int, list[int]] = {}  # partition -> its end offset after each batch, in batch order
    batches = 0
    for r in sorted(progress, key=lambda r: r.get("batch_id") or 0):
        for source in r.get("sources") or []:
            positions, _ = from_json(parsed(source.get("end_offset")))
            if INPUT in positions:
                batches += 1
                for part, end in positions[INPUT].items():
                    ends.setdefault(part, []).append(end)

    def key(i: int) -> tuple:
        part, offset = log.partitions[i], log.offsets[i]
        return bisect_right(ends.get(part, []), offset), log.times[i], offset

    return key, batches


def check_spikes(bootstrap: str, topic: str, expected: Counter) -> tuple[bool, str]:
    """The keyed rule's output rows against the expected ones, exactly (a row twice is one too many)."""
    got: Counter = Counter()
    bad = 0
    for _key, value in consume_all(bootstrap, topic):
        try:
            r = json.loads(value)
            got[(r["user"], float(r["amount"]), round(float(r["avg10"]), 6))] += 1
        except (TypeError, ValueError, KeyError, json.JSONDecodeError):
            bad += 1
    ok, detail = _compare(got, expected, "rows")
    return ok and not bad, detail + (f", {bad:,} unreadable" if bad else "")


def check_paid(bootstrap: str, topic: str, log: Produced, quix: bool = False) -> tuple[bool, str]:
    """The left join's output against one row per event with its own payment (every payment lies within its
    event's interval): (id, user, amount, method, paid_ms) each once, no event without its payment. With
    `quix`, an event written without its payment as well as with it (Quix's left join, before the payment
    came) is counted and shown, not failed, and the events it never pairs are explained."""
    pairs: Counter = Counter()
    lonely: Counter = Counter()
    bad = 0
    for _key, value in consume_all(bootstrap, topic):
        try:
            r = json.loads(value)
            row = (int(r["id"]), r["user"], float(r["amount"]))
            if r.get("method") is None:
                lonely[row] += 1
            else:
                pairs[(*row, r["method"], int(r["paid_ms"]))] += 1
        except (TypeError, ValueError, KeyError, json.JSONDecodeError):
            bad += 1
    expected = Counter(zip(range(len(log.users)), log.users, log.amounts, log.methods, log.paid, strict=True))
    ok, detail = _compare(pairs, expected, "pairs")
    paired = {p[:3] for p in pairs}
    before = sum(n for row, n in lonely.items() if row in paired)
    alone = sum(lonely.values()) - before
    if alone:
        detail += f", {alone:,} events without a payment (each has one in its interval)"
        if quix:
            detail += (
                ": Quix's interval join looks for a record's partners only among those it stored before it, so a "
                "payment read before its event is never paired with it"
            )
    if before:
        detail += f", {before:,} events written without their payment before it came, then with it"
    if bad:
        detail += f", {bad:,} unreadable"
    return ok and not alone and not bad and (quix or not before), detail


def create_topic(bootstrap: str, name: str, config: dict[str, str] | None = None) -> None:
    Admin(bootstrap).create_topic(name, 4, {**TOPIC_CONFIG, **(config or {})}, exist_ok=True)


# ---------------------------------------------------------------- measuring a process tree


def _proc_stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, cpu ticks, rss bytes) of a live process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/statm") as f:
            rss = int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return None
    return int(rest[1]), int(rest[11]) + int(rest[12]), rss


def _kind(pid: int) -> str:
    """A process's kind for the RSS breakdown: the JVM, a Python worker by its module, or the program."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode(errors="replace").split("\0")
    except OSError:
        return "gone"
    if args and args[0].endswith("java"):
        return "JVM"
    if "pyspark.daemon" in args:
        return args[-2] if args[-1] == "" else args[-1]  # the worker's module: pyspark.worker, ...
    if "-m" in args:
        return args[args.index("-m") + 1]
    return os.path.basename(args[0]) if args else "?"


class TreeSampler(threading.Thread):
    """Every 100 ms: the RSS sum of `root` and its descendants (peak kept), and each one's CPU ticks."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.peak = 0
        self.parts: Counter = Counter()  # RSS by kind of process at the peak
        self.ticks: dict[int, int] = {}
        self.kinds: dict[int, str] = {}  # each process's kind, noted while it runs (it may be gone at the end)
        self.stopped = threading.Event()

    def sample(self) -> None:
        procs = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                st = _proc_stat(int(name))
                if st is not None:
                    procs[int(name)] = st
        tree, frontier = {self.root}, [self.root]
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in procs.items():
            children.setdefault(ppid, []).append(pid)
        while frontier:
            for child in children.get(frontier.pop(), []):
                if child not in tree:
                    tree.add(child)
                    frontier.append(child)
        rss = 0
        for pid in tree:
            if pid in procs:
                rss += procs[pid][2]
                self.ticks[pid] = max(self.ticks.get(pid, 0), procs[pid][1])
                if self.kinds.get(pid) in (None, "bash", "sh"):  # spark-submit's script execs the JVM
                    self.kinds[pid] = _kind(pid)
        if rss > self.peak:
            self.peak = rss
            self.parts = Counter()
            for pid in tree:
                if pid in procs:
                    self.parts[_kind(pid)] += procs[pid][2]

    def breakdown(self) -> str:
        """Where the peak RSS was, by kind of process: "JVM 1,003 MB, pyspark.worker 4x 980 MB, ..."."""
        return ", ".join(f"{kind} {v / 2**20:,.0f} MB" for kind, v in self.parts.most_common())

    def cpu_by_kind(self) -> str:
        """Where the CPU went, by kind of process: "JVM 31.2 s, pyspark.worker 12.0 s, ..."."""
        by_kind: Counter = Counter()
        for pid, ticks in self.ticks.items():
            by_kind[self.kinds.get(pid, "?")] += ticks / TICK
        return ", ".join(f"{kind} {v:.1f} s" for kind, v in by_kind.most_common() if v >= 0.05)

    def run(self) -> None:
        while not self.stopped.is_set():
            self.sample()
            self.stopped.wait(0.1)

    @property
    def cpu(self) -> float:
        return sum(self.ticks.values()) / TICK


@dataclass
class Launch:
    launch: float  # epoch s
    ended: float
    rc: int | None  # None: timed out
    peak_rss: int
    cpu: float
    log: Path
    memory: str = ""  # the peak RSS by kind of process
    cpu_parts: str = ""  # CPU seconds by kind of process

    @property
    def timed_out(self) -> bool:
        return self.rc is None


def launch(cmd: list[str], env: dict[str, str], log: Path, timeout: float, cwd: Path = ROOT) -> Launch:
    """Run `cmd` to its end (or kill its process group after `timeout` s), measuring its process tree."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log, "wb") as out:
        t0 = time.time()
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        sampler = TreeSampler(proc.pid)
        sampler.start()
        try:
            rc: int | None = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            sampler.sample()
            os.killpg(proc.pid, 15)  # the group this call started, and only it
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
            rc = None
        ended = time.time()
        sampler.stopped.set()
        sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rusage = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    cpu = max(rusage, sampler.cpu)
    return Launch(t0, ended, rc, sampler.peak, cpu, log, sampler.breakdown(), sampler.cpu_by_kind())


def tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip()[:200] for line in text[-lines:])


# ---------------------------------------------------------------- results


@dataclass
class Row:
    system: str
    steady: float | None = None
    whole: float | None = None
    rss_mb: float | None = None
    memory: str = ""  # the peak RSS by kind of process
    cpu: float | None = None
    correct: bool | None = None
    detail: str = ""
    first_batch_s: float | None = None  # weir: launch to its first committed batch
    versus: str = ""  # a peer's version of a weir block: the block (its ratio: weir's steady / this one's)


@dataclass
class Bench:
    args: argparse.Namespace
    bootstrap: str
    scratch: Path
    expected: Counter
    bound: int
    rows: list[Row] = field(default_factory=list)
    block_rows: list[Row] = field(default_factory=list)
    produced: Produced | None = None  # with --blocks keyed or streamjoin
    arrival_spikes: Counter | None = None  # the keyed rule in arrival order (the peers'), made on first use

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("WEIR_", "PEER_", "PYSPARK_"))}
        env.update(
            PEER_BOOTSTRAP=self.bootstrap, PEER_INPUT=INPUT, PEER_RECORDS=str(self.args.records),
            PEER_SIZE_MS=str(SIZE_MS), PEER_DELAY_MS=str(DELAY_MS), PYTHONPATH=str(PEERS), PEER_PAYMENTS=PAYMENTS,
        )  # fmt: skip
        env.update(extra)
        return env

    def add(self, row: Row, blocks: bool = False) -> Row:
        (self.block_rows if blocks else self.rows).append(row)
        figures = (
            f"steady {_rate(row.steady)}, whole {_rate(row.whole)}, RSS {_num(row.rss_mb)} MB, CPU {_num(row.cpu)} s"
        )
        verdict = "" if row.correct is None else " [green]correct[/]" if row.correct else " [red]WRONG[/]"
        console.print(f"  {row.system}: {figures}{verdict} {row.detail}", highlight=False)
        if row.memory:
            console.print(f"    peak RSS by process: {row.memory}", highlight=False)
        return row


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def read_stats(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except OSError:
        return []


def batch_rate(batches: list[tuple[int, float]]) -> float | None:
    """Input rows over triggerExecution seconds of the batches with input after the first (all, if one)."""
    with_input = [(r, s) for r, s in batches if r]
    use = with_input[1:] if len(with_input) > 1 else with_input
    rows, secs = sum(r for r, _ in use), sum(s for _, s in use)
    return rows / secs if secs > 0 else None


def peer_row(
    bench: Bench, system: str, run: Launch, output: str | None, check: Check | None = None, inputs: int | None = None
) -> Row:
    """A Python peer's row from its stats lines (one per process); `check` its output (default: the windows),
    `inputs` the input records it should read (shown when it read another number)."""
    stats = read_stats(bench.scratch / f"{system}.stats")
    row = Row(system, rss_mb=run.peak_rss / 2**20, cpu=run.cpu)
    firsts = [s["first"] for s in stats if s.get("first")]
    if stats and firsts:
        done, rows = max(s["done"] for s in stats), sum(s["rows"] for s in stats)
        row.steady = rows / (done - min(firsts)) if done > min(firsts) else None
        row.whole = rows / (done - run.launch)
    if run.timed_out:
        row.detail = f"timed out after {run.ended - run.launch:.0f} s"
    elif run.rc != 0 or not stats:
        row.detail = f"failed (exit {run.rc}): {tail(run.log)}"
        row.steady = row.whole = None
    read, late = sum(s["rows"] for s in stats), sum(s.get("late", 0) for s in stats)
    if stats and inputs is not None and read != inputs:
        row.detail = (row.detail + f" read {read:,} of {inputs:,} input records;").strip()
    if output is not None and not run.timed_out and run.rc == 0:
        if check is None:
            row.correct, detail = check_output(bench.bootstrap, output, bench.expected, bench.bound)
        else:
            row.correct, detail = check(output)
        row.detail = (row.detail + " " + detail).strip()
    if late:
        row.detail += f"; {late:,} records late (dropped)"
    return row


# ---------------------------------------------------------------- the systems


def run_python_peer(
    bench: Bench, system: str, label: str, cmd: list[str], output: str | None, timeout: float, versus: str = "",
    check: Check | None = None, inputs: int | None = None,
) -> Row:  # fmt: skip
    """A Python peer's run and row; `versus` names the weir block it is a version of (a row of the blocks'
    table then), `check` and `inputs` as in `peer_row`."""
    env = bench.env(PEER_OUTPUT=output or "", PEER_STATS=str(bench.scratch / f"{system}.stats"))
    env["PEER_STATE"] = str(bench.scratch / f"{system}-state")
    if output:
        create_topic(bench.bootstrap, output)
    run = launch(cmd, env, bench.scratch / f"{system}.log", timeout)
    row = peer_row(bench, system, run, output, check, inputs)
    row.system, row.versus = label, versus
    return bench.add(row, blocks=bool(versus))


def run_spark(bench: Bench, name: str, label: str, mode: str, output: str, blocks: bool = False) -> Row:
    create_topic(bench.bootstrap, output)
    stats_file = bench.scratch / f"{name}.stats"
    env = bench.env(
        PEER_OUTPUT=output, PEER_STATS=str(stats_file), PEER_CHECKPOINT=str(bench.scratch / f"{name}-checkpoint"),
        PEER_MAX_PER_TRIGGER=str(bench.args.max_per_trigger),
    )  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join((str(PEERS), str(ROOT)))
    run = launch([sys.executable, str(PEERS / "spark_query.py"), mode], env, bench.scratch / f"{name}.log", 3600)
    stats = read_stats(stats_file)
    row = Row(label, rss_mb=run.peak_rss / 2**20, cpu=run.cpu, memory=run.memory)
    if run.rc != 0 or not stats:
        row.detail = f"failed (exit {run.rc}): {tail(run.log)}"
        return bench.add(row, blocks)
    s = stats[-1]
    row.steady = batch_rate([(r, ms / 1000) for r, ms in s["batches"]])
    row.whole = s["rows"] / (s["done"] - run.launch)
    batches = [b for b in s["batches"] if b[0]]
    row.detail = f"{len(batches)} batches with input, {len(s['batches'])} in all;"
    if s["rows"] != bench.args.records:
        row.detail += f" read {s['rows']:,} of {bench.args.records:,} rows;"
    if mode == "window":
        row.correct, detail = check_output(bench.bootstrap, output, bench.expected, bench.bound)
        row.detail += " " + detail
    return bench.add(row, blocks)


def weir_progress(home: Path, pipeline: str) -> list[dict]:
    path = home / "progress" / f"{pipeline}.jsonl"
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except OSError:
        return []


def run_weir(
    bench: Bench,
    name: str,
    label: str,
    timeout: float,
    blocks: bool = False,
    check: bool = False,
    suffix: str = "",
    **env_extra: str,
) -> Row:
    """`weir run bench/peers/weir_pipelines.py:<name> --once` with a fresh home, checkpoints and lake."""
    home = bench.scratch / f"weir-{label.replace(' ', '-').replace('=', '')}"
    home.mkdir(parents=True, exist_ok=True)
    env = bench.env(
        WEIR_HOME=str(home), WEIR_BOOTSTRAP_SERVERS=bench.bootstrap, WEIR_CHECKPOINT_ROOT=str(home / "checkpoints"),
        WEIR_LAKE=str(home / "lake"), WEIR_SPARK_MASTER="local[2]", WEIR_MAX_RESTARTS="0", PEER_SUFFIX=suffix,
        **dict(e.split("=", 1) for e in bench.args.weir_env),
        **env_extra,
    )  # fmt: skip
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "weir.cli", "run", f"bench/peers/weir_pipelines.py:{name}", "--once"]
    run = launch(cmd, env, home / "run.log", timeout)
    progress = [r for r in weir_progress(home, f"peers_{name}") if r.get("type") == "progress"]
    row = Row(label, rss_mb=run.peak_rss / 2**20, cpu=run.cpu, memory=run.memory)
    by_proc: dict[str, list[tuple[int, float]]] = {}
    for r in progress:
        ms = (r.get("duration_ms") or {}).get("triggerExecution", 0)
        by_proc.setdefault(r["processor"], []).append((r.get("input_rows") or 0, ms / 1000))
    rows_in = sum(r for b in by_proc.values() for r, _ in b)
    if progress:
        row.steady = batch_rate([b for bs in by_proc.values() for b in bs])
        done = max(r["at_ms"] for r in progress) / 1000
        row.whole = rows_in / (done - run.launch) if done > run.launch else None
        row.first_batch_s = min(r["at_ms"] for r in progress) / 1000 - run.launch
    accounting: Counter = Counter()
    if progress:
        for r in progress:
            for k in ("in", "out", "late", "dlq", "duplicate", "emitted", "filtered", "absorbed"):
                accounting[k] += (r.get("accounting") or {}).get(k, 0) or 0
        nonzero = ", ".join(f"{k} {v:,}" for k, v in accounting.items() if v)
        row.detail = f"{len(progress)} batches, {nonzero};"
    if run.timed_out:
        row.detail += f" timed out after {run.ended - run.launch:.0f} s ({rows_in:,} of {bench.args.records:,} rows in)"
    elif run.rc != 0:
        row.detail += f" failed (exit {run.rc}): {tail(run.log)}"
    elif check:
        topic = f"peers.weir.{name}{suffix}"
        row.correct, detail = check_output(bench.bootstrap, topic, bench.expected, bench.bound)
        row.detail += " " + detail
        if accounting["late"]:
            row.detail += f"; {accounting['late']:,} routed late, yet no event is late (its jitter is under the delay)"
    elif blocks and name in PEER_BLOCKS and bench.produced is not None:
        topic = f"peers.weir.{name}{suffix}"
        if name == "keyed":
            order, batches = weir_order(bench.produced, progress)
            expected = expected_spikes(bench.produced, order)
            row.correct, detail = check_spikes(bench.bootstrap, topic, expected)
            if batches:
                detail += f" (the rule in event-time order within each of {batches} batches)"
            else:
                detail += " (no end offsets in the progress records: the rule in event-time order over all)"
        else:
            row.correct, detail = check_paid(bench.bootstrap, topic, bench.produced)
        row.detail += " " + detail
    return bench.add(row, blocks)


def peer_python(name: str) -> tuple[Path | None, str]:
    """The peer's venv python, installing it on first use: (python, "") or (None, why not)."""
    dirname, packages = PEER_PACKAGES[name]
    venv = VENVS / dirname
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    if stamp.exists():
        return python, ""
    console.print(f"  installing {' '.join(packages)} into {venv} ...")
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *packages],
            check=True, capture_output=True, timeout=900,
        )  # fmt: skip
    except subprocess.CalledProcessError as exc:
        lines = (exc.stderr or b"").decode(errors="replace").strip().splitlines()
        return None, f"cannot install {' '.join(packages)}: {lines[-1] if lines else exc}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"cannot install {' '.join(packages)}: {exc}"
    stamp.touch()
    return python, ""


def run_peer_block(bench: Bench, name: str, only: set[str], timeout: float) -> None:
    """Bytewax's and Quix Streams' versions of weir's block `name` (keyed or streamjoin), those `only` names,
    each checked as weir's is, as rows of the blocks' table."""
    log = bench.produced
    assert log is not None
    if name == "keyed":
        if bench.arrival_spikes is None:
            bench.arrival_spikes = expected_spikes(log)
        spikes = bench.arrival_spikes
        check = partial(check_spikes, bench.bootstrap, expected=spikes)
        checks: dict[str, Check] = {"bytewax": check, "quix": check}
        inputs = bench.args.records
    else:
        checks = {
            "bytewax": partial(check_paid, bench.bootstrap, log=log),
            "quix": partial(check_paid, bench.bootstrap, log=log, quix=True),
        }
        inputs = 2 * bench.args.records  # the events and their payments, as weir's input rows
    if "bytewax" in only:
        python, why = peer_python("bytewax")
        for system, how, cmd in (
            ("bytewax1", "1 worker", ["-m", "bytewax.run", f"bytewax_flow:{name}", "-w1"]),
            ("bytewax2", "2 processes", ["-m", "bytewax.testing", f"bytewax_flow:{name}", "-p2", "-w1"]),
        ):
            label = f"bytewax {name}, {how}"
            if python is None:
                bench.add(Row(label, detail=why, versus=name), blocks=True)
                continue
            run_python_peer(
                bench, f"{system}-{name}", label, [str(python), *cmd], f"peers.{system}.{name}", timeout, name,
                checks["bytewax"], inputs,
            )  # fmt: skip
    if "quix" in only:
        python, why = peer_python("quix")
        label = f"quix {name}, 1 process"
        if python is None:
            bench.add(Row(label, detail=why, versus=name), blocks=True)
        else:
            cmd = [str(python), str(PEERS / "quix_app.py"), name]
            out = f"peers.quix.{name}"
            run_python_peer(bench, f"quix-{name}", label, cmd, out, timeout, name, checks["quix"], inputs)


# ---------------------------------------------------------------- report


def table(bench: Bench, load: tuple[tuple[float, ...], tuple[float, ...]]) -> Table:
    n = bench.args.records
    t = Table(title=f"the peer workload: {n:,} events, 10 s tumbling window per user, watermark 2 s")
    for name in ("system", "steady rows/s", "whole-run rows/s", "peak RSS MB", "CPU s", "output correct", "notes"):
        t.add_column(name, justify="left" if name in ("system", "notes") else "right", overflow="fold")
    for r in bench.rows:
        ok = "-" if r.correct is None else "[green]yes[/]" if r.correct else "[red]NO[/]"
        t.add_row(r.system, _rate(r.steady), _rate(r.whole), _num(r.rss_mb), _num(r.cpu), ok, r.detail)
    t.caption = (
        f"load average {' '.join(f'{x:.2f}' for x in load[0])} at start, "
        f"{' '.join(f'{x:.2f}' for x in load[1])} at end; {os.cpu_count()} cores. Expected windows: "
        f"{sum(bench.expected.values()):,} (end <= max event time - 2 s)."
    )
    return t


def ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.2f}x"


def targets(bench: Bench) -> Table:
    by = {r.system: r for r in bench.rows}
    weir = by.get("weir tumbling") or Row("weir tumbling")
    bw2, loop, spark = by.get("bytewax 2 processes"), by.get("hand loop"), by.get("spark native window")
    t = Table(title="targets (issue 11): weir tumbling against the peers of this run")
    for name in ("figure", "value", "goal", "met"):
        t.add_column(name, justify="left" if name == "figure" else "right")

    def add(figure: str, value: float | None, goal: float, text: str, at_most: bool = False, unit: str = "x") -> None:
        met = (
            "-"
            if value is None
            else ("[green]yes[/]" if (value <= goal if at_most else value >= goal) else "[red]no[/]")
        )
        shown = "-" if value is None else f"{value:.2f}{unit}" if unit == "x" else f"{value:,.1f} {unit}"
        t.add_row(figure, shown, text, met)

    def r(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    add("weir steady / Bytewax 2 processes steady", r(weir.steady, bw2 and bw2.steady), 2, ">= 2x")
    add("weir steady / hand loop steady", r(weir.steady, loop and loop.steady), 1, ">= 1x")
    add("weir steady / Spark native window steady", r(weir.steady, spark and spark.steady), 0.9, ">= 0.9x")
    add("weir whole-run / Bytewax 2 processes whole-run", r(weir.whole, bw2 and bw2.whole), 1, ">= 1x")
    add("weir peak RSS", weir.rss_mb and weir.rss_mb / 1024, 1.5, "<= 1.5 GB", at_most=True, unit="GB")
    add("launch to weir's first committed batch", weir.first_batch_s, 15, "<= 15 s", at_most=True, unit="s")
    return t


def blocks_table(bench: Bench) -> Table:
    base = next((r.steady for r in bench.rows if r.system == "weir tumbling"), None)
    by = {r.system: r for r in bench.block_rows}
    t = Table(title="weir's blocks on the same events, `weir run --once` each, and the peers' versions of some")
    figures = ("steady rows/s", "whole-run rows/s", "peak RSS MB", "CPU s", "ratio")
    for name in ("block", *figures, "against", "output correct", "notes"):
        t.add_column(name, justify="left" if name in ("block", "against", "notes") else "right", overflow="fold")
    hand = by.get("hand-written stateless query")
    for r in bench.block_rows:
        if r.versus:  # a peer's version of a weir block: weir's steady over this one's
            weir = by.get(f"weir {r.versus}")
            against, shown = f"weir {r.versus} / this", ratio(weir and weir.steady, r.steady)
        else:
            if r.system.startswith("weir stateless"):
                against, ref = "hand-written stateless query", hand and hand.steady
            elif r.system.startswith("hand-written"):
                against, ref = "", None
            else:
                against, ref = "weir tumbling", base
            shown = ratio(r.steady, ref)
        ok = "-" if r.correct is None else "[green]yes[/]" if r.correct else "[red]NO[/]"
        cells = (_rate(r.steady), _rate(r.whole), _num(r.rss_mb), _num(r.cpu), shown)
        t.add_row(r.system, *cells, against, ok, r.detail)
    t.caption = (
        "ratio: the row's steady rate / the one it is against (weir tumbling, or the hand-written query); "
        "for a peer's version of a block, weir's block / the peer's (above 1: weir faster). A join's input rows: "
        "the events and the payments."
    )
    return t


# ---------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000, help="events to produce (N)")
    parser.add_argument("--event-rate", type=float, default=None, help="events per event-second (10000; N/100 if less)")
    parser.add_argument("--jitter-ms", type=int, default=500, help="an event is up to this much earlier than its place")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-per-trigger", type=int, default=100_000, help="Spark native: records per micro-batch")
    parser.add_argument("--weir-timeout", type=float, default=900.0, help="seconds before a weir run is stopped")
    parser.add_argument("--peer-timeout", type=float, default=900.0, help="seconds before any other peer is stopped")
    parser.add_argument("--weir-unlimited", action="store_true", help="weir again with WEIR_MAX_OFFSETS_PER_TRIGGER=0")
    parser.add_argument(
        "--blocks", nargs="?", const=",".join(BLOCKS), default="", metavar="NAMES",
        help=f"then weir's other blocks and a stateless processor (all, or some of {','.join(BLOCKS)})",
    )  # fmt: skip
    parser.add_argument(
        "--weir-env", action="append", default=[], metavar="KEY=VALUE",
        help="an environment variable for every weir run, e.g. WEIR_SPARK_CONF='{\"spark.eventLog.enabled\":\"true\"}'",
    )  # fmt: skip
    parser.add_argument("--only", default=",".join(SYSTEMS), help=f"comma-separated systems among {','.join(SYSTEMS)}")
    args = parser.parse_args()
    rate = args.event_rate or min(10_000.0, max(args.records / 100, 1.0))
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    chosen = [b.strip() for b in args.blocks.split(",") if b.strip()]
    unknown = sorted(set(chosen) - set(BLOCKS))
    if unknown:
        parser.error(f"--blocks: unknown block(s) {', '.join(unknown)}; choose among {','.join(BLOCKS)}")
    load_start = os.getloadavg()
    console.print(f"[bold]load average[/] {load_start} on {os.cpu_count()} cores")
    scratch = Path(tempfile.mkdtemp(prefix="weir-bench-peers-"))
    # Apache Kafka, as users run it (on Tansu weir would read through weir-kafka: docs/brokers.md)
    broker = embedded_broker(scratch / "broker-home", free_port(), kind="kafka")
    bench = None
    try:
        broker.start()
        bootstrap = broker.bootstrap
        console.print(f"[bold]broker[/] on {bootstrap}, scratch {scratch}")
        create_topic(bootstrap, INPUT)
        t0 = time.perf_counter()
        produced = Produced() if set(PEER_BLOCKS) & set(chosen) else None
        expected, bound = produce(bootstrap, args.records, rate, args.jitter_ms, args.seed, produced)
        console.print(
            f"[bold]produced[/] {args.records:,} events at {rate:,.0f}/event-s in {time.perf_counter() - t0:.1f} s; "
            f"{sum(expected.values()):,} windows expected closed"
        )
        bench = Bench(args, bootstrap, scratch, expected, bound, produced=produced)
        py = sys.executable
        if "raw" in only:
            console.print("[bold]1. raw consume[/]")
            run_python_peer(bench, "raw", "raw consume", [py, str(PEERS / "raw.py")], None, args.peer_timeout)
        if "loop" in only:
            console.print("[bold]2. hand-written loop[/]")
            run_python_peer(bench, "loop", "hand loop", [py, str(PEERS / "loop.py")], "peers.loop", args.peer_timeout)
        if "spark" in only:
            console.print("[bold]3. Spark native window over weir-kafka[/]")
            run_spark(bench, "spark", "spark native window", "window", "peers.spark")
        if "weir" in only:
            console.print("[bold]4. weir tumbling_window[/]")
            run_weir(bench, "tumbling", "weir tumbling", args.weir_timeout, check=True)
            if args.weir_unlimited:
                run_weir(
                    bench, "tumbling", "weir tumbling, max offsets 0", args.weir_timeout, check=True,
                    suffix=".unlimited", WEIR_MAX_OFFSETS_PER_TRIGGER="0",
                )  # fmt: skip
        if "bytewax" in only:
            console.print("[bold]5. Bytewax 0.21.1[/]")
            python, why = peer_python("bytewax")
            for system, label, cmd in (
                ("bytewax1", "bytewax 1 worker", ["-m", "bytewax.run", "bytewax_flow:flow", "-w1"]),
                ("bytewax2", "bytewax 2 processes", ["-m", "bytewax.testing", "bytewax_flow:flow", "-p2", "-w1"]),
            ):
                if python is None:
                    bench.add(Row(label, detail=why))
                    continue
                out = f"peers.{system}"
                run_python_peer(bench, system, label, [str(python), *cmd], out, args.peer_timeout)
        if "quix" in only:
            console.print("[bold]6. Quix Streams 3.28.1[/]")
            python, why = peer_python("quix")
            if python is None:
                bench.add(Row("quix 1 process", detail=why))
            else:
                cmd = [str(python), str(PEERS / "quix_app.py")]
                run_python_peer(bench, "quix", "quix 1 process", cmd, "peers.quix", args.peer_timeout)
        if args.blocks:
            console.print("[bold]7. weir's other blocks[/]")
            create_topic(bootstrap, "peers.users", {"cleanup.policy": "compact"})
            produce_table(bootstrap, "peers.users")
            if produced is not None and "streamjoin" in chosen:
                create_topic(bootstrap, PAYMENTS)
                produce_payments(bootstrap, PAYMENTS, produced, args.seed)
            for name in chosen:
                run_weir(bench, name, f"weir {name}", args.weir_timeout, blocks=True)
                if name in PEER_BLOCKS and {"bytewax", "quix"} & only:
                    console.print(f"[bold]   the peers' {name}[/]")
                    run_peer_block(bench, name, only, args.peer_timeout)
            if "stateless" in chosen:
                run_spark(
                    bench, "hand-stateless", "hand-written stateless query", "stateless", "peers.hand.stateless", True
                )
    finally:
        broker.stop()
        shutil.rmtree(scratch / "broker-home", ignore_errors=True)  # the topics; the logs and stats stay
    load_end = os.getloadavg()
    if bench is None:
        return 1
    console.print(table(bench, (load_start, load_end)))
    console.print(targets(bench))
    if args.blocks:
        console.print(blocks_table(bench))
    console.print(f"[bold]load average[/] {load_end} at end; logs and stats kept in {scratch}")
    wrong = [r.system for r in bench.rows + bench.block_rows if r.correct is False]
    if wrong:
        console.print(f"[red]output differs from the expected: {', '.join(wrong)}[/]")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
