"""Baseline: one confluent-kafka consumer reads every message of PEER_INPUT, touching each value, no parsing."""

from __future__ import annotations

from common import RECORDS, Stats, assigned_consumer
from confluent_kafka import KafkaError, KafkaException


def main() -> None:
    stats = Stats()
    consumer, _ = assigned_consumer("raw")
    try:
        while stats.rows < RECORDS:
            for m in consumer.consume(num_messages=10_000, timeout=1.0):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(err)
                len(m.value() or b"")
                stats.seen()
    finally:
        stats.write()
        consumer.close()


if __name__ == "__main__":
    main()
