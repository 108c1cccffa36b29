"""Quix Streams 3.28, 1 process, one of three apps by its argument (default window), out to PEER_OUTPUT:

  window      a 10 s tumbling window per message key (the user) on the message timestamp (the event time),
              grace = the watermark delay, count and sum of amount, .final() windows
  keyed       apply(stateful=True) per user keeping the last 10 amounts in State: common.spike's rows (weir's
              `keyed` block)
  streamjoin  events re-keyed by id (group_by, a repartition topic) join_interval(how="left") payments
              (PEER_PAYMENTS, keyed by id) on the message timestamps (event time, paid_ms), backward_ms =
              BEFORE_MS, forward_ms = AFTER_MS, grace_ms = AFTER_MS (weir's `streamjoin` block)

The app stops itself after its input: PEER_RECORDS messages (window, keyed), or PEER_RECORDS events and as many
payments through the join (streamjoin). PEER_STATE is its state directory.

Quix's left interval join, against weir's join_streams: it writes a left record at once, with null payment
columns, when no payment of it is stored yet, and then again with each payment that comes within its interval:
an event read before its payment is written twice (weir writes it once, with its payment, or alone when its
interval closes without one). A record looks for its partners only among the records stored before it (a left
one among the right ones in [ts - backward_ms, ts], a right one among the left ones in [ts - forward_ms, ts]):
a payment read before its event is never paired with it, and the event is written alone (weir pairs them
whichever comes first). It has no watermark: no record is late; a key's records older than grace_ms before its
newest are expired. Both sides must be partitioned alike: Quix produces with murmur2, as the bench produces the
payments.
"""

from __future__ import annotations

import os
import sys
import uuid
from typing import Any

from common import (
    AFTER_MS,
    BEFORE_MS,
    BOOTSTRAP,
    DELAY_MS,
    INPUT,
    LAST,
    OUTPUT,
    PAYMENTS,
    RECORDS,
    SIZE_MS,
    Stats,
    spike,
)
from quixstreams import Application
from quixstreams.dataframe import StreamingDataFrame
from quixstreams.models import TopicConfig
from quixstreams.state import State

STATS = Stats()
TOPIC_CONFIG = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}


def window(sdf: StreamingDataFrame) -> StreamingDataFrame:
    sdf = (
        sdf.tumbling_window(duration_ms=SIZE_MS, grace_ms=DELAY_MS)
        .reduce(lambda acc, ev: [acc[0] + 1, acc[1] + ev["amount"]], lambda ev: [1, ev["amount"]])
        .final(closing_strategy="partition")  # the partition's event time closes windows, as a watermark
    )
    return sdf.apply(
        lambda w, key, _ts, _headers: {
            "user": key, "start": w["start"], "end": w["end"], "count": w["value"][0], "sum": w["value"][1],
        },
        metadata=True,
    )  # fmt: skip


def last10(ev: dict, state: State) -> list[dict]:
    """The keyed rule on the user's last amounts in State: [its row] when it fires, else []."""
    recent = state.get("recent", [])
    row = spike(recent, ev["amount"])
    recent.append(ev["amount"])
    state.set("recent", recent[-LAST:])
    return [] if row is None else [{"user": ev["user"], **row}]


def keyed(sdf: StreamingDataFrame) -> StreamingDataFrame:
    return sdf.apply(last10, stateful=True, expand=True)


def merged(ev: dict, pay: dict | None) -> dict[str, Any]:
    """join_interval's on_merge: weir's output columns (a new dict: Quix forbids changing its inputs)."""
    pay = pay or {}
    return {"id": ev["id"], "user": ev["user"], "amount": ev["amount"], "method": pay.get("method"),
            "paid_ms": pay.get("paid_ms")}  # fmt: skip


def streamjoin(app: Application, sdf: StreamingDataFrame, config: TopicConfig) -> StreamingDataFrame:
    payments = app.dataframe(
        app.topic(PAYMENTS, value_deserializer="json", key_deserializer="json", config=config)
    ).update(source_seen)
    joined = 0

    def at_join(_value: dict) -> None:
        nonlocal joined
        joined += 1
        if joined >= 2 * RECORDS:
            app.stop()

    events = sdf.group_by("id").update(at_join)
    return events.join_interval(
        payments.update(at_join), how="left", on_merge=merged, grace_ms=AFTER_MS, backward_ms=BEFORE_MS,
        forward_ms=AFTER_MS,
    )  # fmt: skip


def source_seen(_value: dict) -> None:
    STATS.seen()


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "window"
    app = Application(
        broker_address=BOOTSTRAP,
        consumer_group=f"peers-quix-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        state_dir=os.environ.get("PEER_STATE", "state"),
    )
    config = TopicConfig(num_partitions=4, replication_factor=1, extra_config=TOPIC_CONFIG)
    source = app.topic(INPUT, value_deserializer="json", key_deserializer="string", config=config)
    key = "json" if mode == "streamjoin" else "string"  # the output's key: the id, else the user
    sink = app.topic(OUTPUT, value_serializer="json", key_serializer=key, config=config)

    def seen(_value: dict) -> None:
        STATS.seen()
        if STATS.rows >= RECORDS:
            app.stop()

    if mode == "streamjoin":
        sdf = streamjoin(app, app.dataframe(source).update(source_seen), config)
    elif mode in ("window", "keyed"):
        sdf = (window if mode == "window" else keyed)(app.dataframe(source).update(seen))
    else:
        raise SystemExit(f"quix_app.py: unknown mode {mode!r}: window, keyed or streamjoin")
    sdf.to_topic(sink)
    try:
        app.run()
    finally:
        STATS.write()


if __name__ == "__main__":
    main()
