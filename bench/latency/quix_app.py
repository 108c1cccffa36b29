"""Quix Streams 3.28 for bench/latency.py: parse, keep amount > 10, write {id, user, amount, ts}. Until SIGTERM."""

from __future__ import annotations

import uuid

from common import BOOTSTRAP, FETCH_WAIT_MS, INPUT, KEEP_ABOVE, OUTPUT
from quixstreams import Application
from quixstreams.models import TopicConfig

TOPIC_CONFIG = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}


def main() -> None:
    app = Application(
        broker_address=BOOTSTRAP,
        consumer_group=f"latency-quix-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        consumer_extra_config={"fetch.wait.max.ms": FETCH_WAIT_MS},
        producer_extra_config={"linger.ms": 5},
    )
    config = TopicConfig(num_partitions=4, replication_factor=1, extra_config=TOPIC_CONFIG)
    source = app.topic(INPUT, value_deserializer="json", key_deserializer="string", config=config)
    sink = app.topic(OUTPUT, value_serializer="json", key_serializer="string", config=config)
    sdf = app.dataframe(source)
    sdf = sdf[sdf["amount"] > KEEP_ABOVE]
    sdf = sdf[["id", "user", "amount", "ts"]]
    sdf.to_topic(sink)
    app.run()


if __name__ == "__main__":
    main()
