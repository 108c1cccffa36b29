"""The hand-written confluent-kafka loop: consume, parse, keep amount > 10, produce. Runs until SIGTERM."""

from __future__ import annotations

import json
import signal
import uuid

from common import BOOTSTRAP, FETCH_WAIT_MS, INPUT, OUTPUT, kept
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition


def main() -> None:
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    consumer = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": f"latency-loop-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": FETCH_WAIT_MS,
        }
    )
    partitions = sorted(consumer.list_topics(INPUT, timeout=30).topics[INPUT].partitions)
    consumer.assign([TopicPartition(INPUT, p, OFFSET_BEGINNING) for p in partitions])
    producer = Producer({"bootstrap.servers": BOOTSTRAP, "linger.ms": 5})
    try:
        while not stop:
            for m in consumer.consume(num_messages=10_000, timeout=0.1):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(err)
                value = kept(json.loads(m.value()))
                if value is not None:
                    producer.produce(OUTPUT, value, m.key())
            producer.poll(0)
        producer.flush(30)
    finally:
        consumer.close()


if __name__ == "__main__":
    main()
