"""Quix Streams 3.28: a 10 s tumbling window per message key (the user) on the message timestamp (the event
time), grace = the watermark delay, count and sum of amount, .final() windows to PEER_OUTPUT. The app stops
itself after PEER_RECORDS input messages. PEER_STATE is its state directory."""

from __future__ import annotations

import os
import uuid

from common import BOOTSTRAP, DELAY_MS, INPUT, OUTPUT, RECORDS, SIZE_MS, Stats
from quixstreams import Application
from quixstreams.models import TopicConfig

STATS = Stats()
TOPIC_CONFIG = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}


def main() -> None:
    app = Application(
        broker_address=BOOTSTRAP,
        consumer_group=f"peers-quix-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        state_dir=os.environ.get("PEER_STATE", "state"),
    )
    config = TopicConfig(num_partitions=4, replication_factor=1, extra_config=TOPIC_CONFIG)
    source = app.topic(INPUT, value_deserializer="json", key_deserializer="string", config=config)
    sink = app.topic(OUTPUT, value_serializer="json", key_serializer="string", config=config)

    def seen(_value: dict) -> None:
        STATS.seen()
        if STATS.rows >= RECORDS:
            app.stop()

    sdf = app.dataframe(source)
    sdf = sdf.update(seen)
    sdf = (
        sdf.tumbling_window(duration_ms=SIZE_MS, grace_ms=DELAY_MS)
        .reduce(lambda acc, ev: [acc[0] + 1, acc[1] + ev["amount"]], lambda ev: [1, ev["amount"]])
        .final(closing_strategy="partition")  # the partition's event time closes windows, as a watermark
    )
    sdf = sdf.apply(
        lambda w, key, _ts, _headers: {
            "user": key, "start": w["start"], "end": w["end"], "count": w["value"][0], "sum": w["value"][1],
        },
        metadata=True,
    )  # fmt: skip
    sdf.to_topic(sink)
    try:
        app.run()
    finally:
        STATS.write()


if __name__ == "__main__":
    main()
