"""What a Kafka cluster holds: topics, partitions, and each partition's earliest and latest offsets.

Bounds come from ListOffsets, as the Kafka protocol says: the log start and the high-water mark (the last stable
offset to a `read_committed` reader), one round trip per trigger. A broker known to answer otherwise (the
embedded Tansu: weir.kafka.quirks) is asked with a Fetch instead, whose response carries both by the protocol.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Iterator

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ClusterMetadata

from weir.config import redact, redact_text
from weir.kafka import heal
from weir.kafka.quirks import Quirks, quirks_of

TP = tuple[str, int]
EARLIEST, LATEST = -2, -1  # ListOffsets' timestamps for a partition's log start and end, by the protocol


class ClientLog(logging.LoggerAdapter):
    """librdkafka's log lines into Python logging, each distinct line at most once a minute: an unreachable
    broker otherwise prints a line per reconnect attempt, burying the error that explains it."""

    def __init__(self, name: str = "weir.kafka.client", every: float = 60.0) -> None:
        super().__init__(logging.getLogger(name), {})
        self.every = every
        self._last: dict[str, float] = {}

    def log(self, level: int, msg: object, *args: object, **kwargs: object) -> None:
        text = str(msg) % args if args else str(msg)
        now = time.monotonic()
        if now - self._last.get(text, -self.every) >= self.every:
            if len(self._last) > 1000:
                self._last.clear()
            self._last[text] = now
            self.logger.log(level, text)


client_log = ClientLog()


class BrokerUnavailable(RuntimeError):
    """Kafka could not be reached or did not answer in time."""


_OUTAGE_CODES = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT, KafkaError._RESOLVE}


def is_outage(err: KafkaError) -> bool:
    """Whether a client error means Kafka is (for now) out of reach, rather than a bad request or bad data."""
    return err.code() in _OUTAGE_CODES or bool(err.retriable())


# Partition errors that say its leader moves or is being elected: asked again, within the caller's timeout
_LEADER_MOVING = {
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.REPLICA_NOT_AVAILABLE,
}  # fmt: skip
LEADER_WAIT_S = 0.25  # between two asks: librdkafka refreshes the partition's leader meanwhile
# One metadata or offsets request of a view, at most (a read's, never past its limit: SourceOptions.request_timeout_s)
REQUEST_TIMEOUT_S = 30.0


def _leader_moving(err: KafkaError) -> bool:
    return err.code() in _LEADER_MOVING


def servers_of(client: dict) -> str:
    """The bootstrap servers of client settings, as errors and state records name them (credentials redacted)."""
    return str(redact(client).get("bootstrap.servers"))


def _unreachable(client: dict, what: str, exc: BaseException | None, timeout: float) -> BrokerUnavailable:
    servers = servers_of(client)
    reason = f": {redact_text(str(exc))}" if exc else ""
    return BrokerUnavailable(f"cannot {what} from Kafka at {servers} within {timeout:.0f}s{reason}")


def admin_client(client: dict) -> AdminClient:
    """An admin client of `client`'s settings (the consumer-only ones left out), logging through Python."""
    consumer_only = ("enable.", "auto.", "isolation.", "fetch.", "group.", "queued.", "max.partition.")
    admin_keys = {k: v for k, v in client.items() if not k.startswith(consumer_only)}
    # librdkafka's own log lines go to Python logging, not straight to stderr.
    return AdminClient({**heal.reconnecting(admin_keys), "logger": client_log})


class LogView:
    """A driver-side view of the cluster: one admin client and one probe consumer, reused across triggers."""

    def __init__(
        self,
        client: dict,
        timeout: float = REQUEST_TIMEOUT_S,
        admin: AdminClient | None = None,
        quirks: Quirks | None = None,
    ) -> None:
        """`client`: bootstrap servers and pass-through settings (security, isolation.level, ...); `admin`: an
        admin client of the same settings that outlives this view (its owner closes it), else one of its own;
        `quirks`: the broker's, when known (else asked of its metadata at the first use)."""
        self.timeout = timeout
        self._quirks = quirks
        self.leader_retries = 0  # partitions asked again for their offsets while their leader moved (_list)
        # The probe needs end-of-partition events and must never join a group or jump on a bad offset.
        self.settings = {
            "group.id": f"weir-probe-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            "fetch.wait.max.ms": 10,
            # The same default as the read tasks (SourceOptions), so both see the same end of the log.
            "isolation.level": "read_uncommitted",
            **client,
        }
        self.admin = admin if admin is not None else admin_client(client)
        # A read_committed reader's log ends at the last stable offset (the first offset of the oldest open
        # transaction), which ListOffsets answers at that isolation level; a Fetch response's high-water mark lies
        # beyond it while a transaction is open, and records up to it would never come.
        self.committed = str(self.settings["isolation.level"]).lower() == "read_committed"
        self.consumer = Consumer({**heal.reconnecting(self.settings), "logger": client_log})
        self._record_bytes: float | None = None
        self._sampled_at = -SAMPLE_EVERY_S  # when record sizes were last sampled (time.monotonic)
        self._nonempty: dict[TP, int] = {}  # the last bounds' partitions with records: where sizes are sampled
        self._seen_high: dict[TP, int] = {}  # the highest mark each partition showed this view
        self._contradicted: set[TP] = set()  # partitions whose listing contradicted itself (warned once)

    @property
    def quirks(self) -> Quirks:
        """The broker's departures from the Kafka protocol, from the cluster id of its metadata (once per view)."""
        if self._quirks is None:
            self._quirks = quirks_of(self._metadata().cluster_id)
        return self._quirks

    def average_record_bytes(self) -> int:
        """Key+value bytes per record, averaged over the last records of partitions `bounds` found holding some,
        sampled at most every SAMPLE_EVERY_S by a fetch of one record each (1 KiB until a sample)."""
        if time.monotonic() - self._sampled_at >= SAMPLE_EVERY_S and self._nonempty:
            self._sampled_at = time.monotonic()
            try:
                self._probe(dict(sorted(self._nonempty.items())[:SAMPLED_PARTITIONS]))
            except (BrokerUnavailable, KafkaException) as exc:  # an estimate: the last one serves until the next
                client_log.logger.warning("weir-kafka: record sizes not sampled, the last estimate kept: %s", exc)
        return max(1, round(self._record_bytes or 1024))

    def _sample(self, size: int) -> None:
        self._record_bytes = size if self._record_bytes is None else 0.8 * self._record_bytes + 0.2 * size

    def close(self) -> None:
        self.consumer.close()

    def partitions(self) -> dict[str, list[int]]:
        """Partitions of every topic. All-topic metadata on purpose: a request naming one topic makes
        brokers with auto.create.topics.enable create it."""
        meta = self._metadata()
        out: dict[str, list[int]] = {}
        for name, t in meta.topics.items():
            if t.error is not None:
                raise BrokerUnavailable(f"metadata for topic {name!r} failed: {t.error.str()}")
            if not name.startswith("__"):
                out[name] = sorted(t.partitions)
        return out

    def _metadata(self) -> ClusterMetadata:
        try:
            meta = self.consumer.list_topics(timeout=self.timeout)
        except KafkaException as exc:
            raise _unreachable(self.settings, "read metadata", exc, self.timeout) from None
        if self._quirks is None:
            self._quirks = quirks_of(meta.cluster_id)
        return meta

    def bounds(self, tps: Iterable[TP]) -> dict[TP, tuple[int, int]]:
        """(earliest, latest) offset of each topic-partition; latest is the high-water mark, as observed by this
        call. An answer that cannot be true (a latest below the earliest or below 0, a probe the broker answered
        with an offset reset instead of records, a mark below one seen before) is asked again with a fresh probe;
        one still impossible raises BrokerUnavailable naming the broker and the partition. A mark below an earlier
        one that the fresh probe confirms is returned (the partition was truncated or recreated: the caller's
        data-loss checks name it)."""
        tps = sorted(set(tps))
        if not tps:
            return {}
        found, doubts = self._observe(tps)
        if doubts:
            again, still = self._observe(sorted(doubts))
            for tp, why in still.items():
                if not why.startswith("lower"):
                    raise BrokerUnavailable(
                        f"the broker at {servers_of(self.settings)} gave impossible offsets for {tp[0]} partition "
                        f"{tp[1]} twice: {doubts[tp]}; then {why}"
                    )
                client_log.logger.warning("weir-kafka: %s partition %d: %s, confirmed by a fresh probe", *tp, why)
            found.update(again)
        for tp, (lo, hi) in found.items():
            self._seen_high[tp] = hi
            if hi > lo:
                self._nonempty[tp] = hi - 1
            else:
                self._nonempty.pop(tp, None)
        return found

    def _observe(self, tps: list[TP]) -> tuple[dict[TP, tuple[int, int]], dict[TP, str]]:
        """One listing (and on a broker that lists short, one probe): the bounds that make sense, and why the
        others do not."""
        low = self._list(tps, EARLIEST)
        listed = self._list(tps, LATEST)
        doubts: dict[TP, str] = {}
        for tp in tps:
            if low[tp] < 0 or listed[tp] < low[tp]:
                doubts[tp] = f"listed earliest {low[tp]} and latest {listed[tp]}"
        sane = {tp: (low[tp], listed[tp]) for tp in tps if tp not in doubts}
        if self.quirks.lists_exact_offsets:
            return sane, self._lowered(sane, doubts)
        return self._fetched(sane, doubts, low, listed)

    def _lowered(self, found: dict[TP, tuple[int, int]], doubts: dict[TP, str]) -> dict[TP, str]:
        """`doubts` with the partitions whose mark fell below one this view saw (asked again by `bounds`: a new
        leader's mark may trail the old one's for a moment; a confirmed fall is a truncated or recreated log)."""
        for tp, (_, hi) in found.items():
            seen = self._seen_high.get(tp)
            if seen is not None and hi < seen:
                doubts[tp] = f"lower high-water mark {hi} after {seen}"
        return doubts

    def _fetched(
        self, sane: dict[TP, tuple[int, int]], doubts: dict[TP, str], low: dict[TP, int], listed: dict[TP, int]
    ) -> tuple[dict[TP, tuple[int, int]], dict[TP, str]]:
        """Bounds from a Fetch response, for a broker whose ListOffsets answers are not the log's bounds
        (weir.kafka.quirks): the listing only says where to probe."""
        found = self._fetched_bounds({tp: max(low[tp], listed[tp]) for tp in doubts if listed[tp] >= 0 <= low[tp]})
        for tp, (lo, hi) in found.items():
            del doubts[tp]
            if tp not in self._contradicted:  # once per partition and view: the broker does it every time
                self._contradicted.add(tp)
                client_log.logger.warning(
                    "weir-kafka: %s partition %d: the broker listed earliest %d above latest %d; a fetch's log start "
                    "and high-water mark are used instead: %d and %d", *tp, low[tp], listed[tp], lo, hi,
                )  # fmt: skip
        marks, unfetched = self._fetched_marks(sane)
        for tp in unfetched:
            doubts[tp] = f"the probe at offset {_probe_at(*sane[tp])} was answered with an offset reset"
        for tp, (lo, hi) in sane.items():
            if tp in doubts:
                continue
            # The Fetch response's log start and high-water mark are the log's bounds, by the protocol: a listed
            # latest above the mark (a broker's ListOffsets beyond what a fetch returns) would plan reads of offsets
            # that never come, and a listed earliest above the log start (the embedded broker answered 5 for a log
            # starting at 0, loaded) would skip records without a word.
            start, mark = marks.get(tp, (lo, hi))
            if self.committed:
                mark = min(mark, hi)  # the last stable offset, never above the high-water mark
            found[tp] = (start if 0 <= start <= mark else lo, mark)
        return found, self._lowered(found, doubts)

    def listed(self, tps: Iterable[TP]) -> dict[TP, tuple[int, int]]:
        """(earliest, latest) as ListOffsets answers, without the fetch that corrects latest: for a reader that
        fetches the partition anyway and takes the high-water mark from its own first fetch response."""
        tps = sorted(set(tps))
        if not tps:
            return {}
        low = self._list(tps, EARLIEST)
        listed = self._list(tps, LATEST)
        return {tp: (low[tp], listed[tp]) for tp in tps}

    def _list(self, tps: list[TP], at: int) -> dict[TP, int]:
        """ListOffsets at `at`, EARLIEST or LATEST (the protocol's special timestamps), for every partition.

        Through the probe consumer's offsets_for_times (one request per partition leader, the consumer's own
        isolation level), not the admin client's list_offsets: that call segfaulted inside confluent-kafka five
        times on a loaded machine (a C binding of its result; the older consumer call never did here)."""
        deadline = time.monotonic() + self.timeout
        out: dict[TP, int] = {}
        while True:
            left = max(0.1, deadline - time.monotonic())
            try:
                found = self.consumer.offsets_for_times([TopicPartition(t, p, at) for t, p in tps], timeout=left)
            except KafkaException as exc:
                # librdkafka may fail the whole call with a partition's error ("Failed to get offsets: Broker: Not
                # leader for partition", a topic a moment old on a broker just started): each partition failed with it
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                if err is None:
                    raise _unreachable(self.settings, "list offsets", exc, self.timeout) from None
                failed = {tp: err for tp in tps}
            else:
                out |= {(tp.topic, tp.partition): tp.offset for tp in found if tp.error is None}
                failed = {(tp.topic, tp.partition): tp.error for tp in found if tp.error is not None}
            if not failed:
                return out
            # A partition whose leader moves or is being elected (a topic just created, a broker restarting) is
            # asked again, by the protocol, once the client has refreshed its metadata: until the view's timeout
            (topic, partition), error = next(iter(failed.items()))
            if time.monotonic() >= deadline or not all(_leader_moving(e) for e in failed.values()):
                raise _unreachable(self.settings, "list offsets", KafkaException(error), self.timeout)
            self.leader_retries += len(failed)
            said = f"{topic}/{partition}: {error.str()}"
            client_log.log(logging.INFO, f"weir: list offsets asked again of {len(failed)} partition(s): {said}")
            tps = list(failed)
            time.sleep(LEADER_WAIT_S)

    def _fetched_bounds(self, at: dict[TP, int]) -> dict[TP, tuple[int, int]]:
        """(log start, high-water mark) of each partition from a fetch at offset `at` (the Fetch response carries
        both, by the protocol), for the partitions whose fetch answered and whose log start is known and not above
        the mark. For a listing that contradicts itself: one broker's ListOffsets answered earliest 31 and latest
        1 for a partition of 31 records, batch after batch (shared/FACTS.md); a fetch at offset 31 answered the
        end of the partition, with log start 0 and mark 31."""
        if not at:
            return {}
        marks, _ = self._probe(at)
        return {tp: (lo, hi) for tp, (lo, hi) in marks.items() if 0 <= lo <= hi and hi >= at[tp]}

    def _fetched_marks(self, listed: dict[TP, tuple[int, int]]) -> tuple[dict[TP, tuple[int, int]], set[TP]]:
        """(log start, high-water mark) of every partition, from a fetch made by this call (one record just below the
        listed latest, or the listed latest of a partition listed empty: the end answers with both), and the
        partitions whose fetch the broker answered with an offset reset instead (retention passed the probe offset
        meanwhile): their marks were not observed, and cached ones may be another call's."""
        return self._probe({tp: _probe_at(lo, hi) for tp, (lo, hi) in listed.items()})

    def _probe(self, probe: dict[TP, int]) -> tuple[dict[TP, tuple[int, int]], set[TP]]:
        """Fetch each partition at its offset in `probe` (a record, or the end of the partition when the offset is
        its high-water mark): the cached (log start, high-water mark) of each that answered, and those the broker
        answered with an offset reset."""
        if not probe:
            return {}, set()
        self.consumer.assign([TopicPartition(t, p, o) for (t, p), o in probe.items()])
        pending = set(probe)
        reset: set[TP] = set()
        deadline = time.monotonic() + self.timeout
        try:
            while pending:
                if time.monotonic() > deadline:
                    raise _unreachable(self.settings, f"fetch {sorted(pending)[:3]}", None, self.timeout)
                # At most one message per pending partition: consume returns as soon as it has them, not at its
                # timeout (a probe waited the whole 0.2 s every trigger before).
                for msg in self.consumer.consume(num_messages=len(pending), timeout=0.2):
                    err, tp = msg.error(), (msg.topic(), msg.partition())
                    if err is not None and err.code() not in (KafkaError._PARTITION_EOF,):
                        if err.code() == KafkaError._AUTO_OFFSET_RESET:
                            reset.add(tp)
                            pending.discard(tp)
                            continue
                        if is_outage(err):
                            raise _unreachable(self.settings, "fetch the high-water marks", KafkaException(err), 0)
                        raise KafkaException(err)
                    if err is None:
                        self._sample(len(msg.key() or b"") + len(msg.value() or b""))
                    pending.discard(tp)
            # Fresh for the partitions that answered: librdkafka updates a partition's mark from each fetch
            # response before it hands over that response's records or end-of-partition event.
            marks = {tp: self.consumer.get_watermark_offsets(TopicPartition(*tp), cached=True) for tp in probe}
            return {tp: m for tp, m in marks.items() if tp not in reset}, reset
        finally:
            self.consumer.unassign()


# Record sizes (for admission's memory cap) are sampled this often, from this many partitions' last records.
SAMPLE_EVERY_S = 60.0
SAMPLED_PARTITIONS = 8


def _probe_at(lo: int, hi: int) -> int:
    """Where a probe fetches a partition listed (lo, hi): its last record, or its end when it was listed empty."""
    return hi - 1 if hi - 1 >= lo and hi > 0 else hi


_idle: dict[str, list[tuple[LogView, float]]] = {}
_idle_lock = threading.Lock()
# An idle view is closed after this long: a librdkafka client outlives its broker otherwise, and one whose
# broker is gone reconnects to the dead address many times a second, into whatever listens there next.
IDLE_CLOSE_S = 60.0


@contextlib.contextmanager
def pooled(client: dict, timeout: float) -> Iterator[LogView]:
    """A LogView of `client` for one use (driver), taken from this process's idle ones or new, put back after a
    use that raised nothing (one that raised is closed: its clients may hold a failed connection, or an error
    that they cannot go on from, counted as a rebuild: weir.kafka.heal). Why: a processor notes where each batch
    begins writing, and a new admin client and consumer per batch means two librdkafka handles (threads,
    sockets) made and destroyed every trigger. Concurrent users (queries of one runner) each get a view of their
    own; views idle for IDLE_CLOSE_S are closed at the next use of the pool."""
    key = json.dumps(client, sort_keys=True, default=str)
    now = time.monotonic()
    with _idle_lock:
        stale = [v for views in _idle.values() for v, since in views if now - since > IDLE_CLOSE_S]
        for k in list(_idle):
            _idle[k] = [(v, since) for v, since in _idle[k] if now - since <= IDLE_CLOSE_S]
        views = _idle.get(key)
        view = views.pop()[0] if views else None
    for old in stale:
        old.close()
    if view is None:
        view = LogView(client, timeout=timeout)
    view.timeout = timeout
    try:
        yield view
    except BaseException as exc:
        view.close()
        if heal.raised_cannot_go_on(exc) is not None:  # any failure closes it; these are counted
            heal.counted("log view")
        raise
    with _idle_lock:
        _idle.setdefault(key, []).append((view, time.monotonic()))
