"""A hand-written single-process window: consume, json.loads, a dict of open windows per start, closed windows
produced to PEER_OUTPUT as soon as the watermark passes them. The watermark is the smallest, over the input's
partitions, of the largest event time read from each, minus the delay: one consumer does not interleave its
partitions in event time, so a watermark from the largest event time read anywhere would make most of the
other partitions late."""

from __future__ import annotations

import json

from common import BOOTSTRAP, DELAY_MS, OUTPUT, RECORDS, SIZE_MS, Stats, assigned_consumer, window_json
from confluent_kafka import KafkaError, KafkaException, Producer

NEVER = -(2**62)


def main() -> None:
    stats = Stats()
    consumer, partitions = assigned_consumer("loop")
    producer = Producer({"bootstrap.servers": BOOTSTRAP, "linger.ms": 20})
    windows: dict[int, dict[str, list]] = {}  # start -> user -> [count, sum]
    part_max = dict.fromkeys(partitions, NEVER)
    watermark = NEVER
    loads = json.loads
    try:
        while stats.rows < RECORDS:
            for m in consumer.consume(num_messages=10_000, timeout=1.0):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(err)
                stats.seen()
                ev = loads(m.value())
                ts = ev["ts"]
                start = ts - ts % SIZE_MS
                if start + SIZE_MS <= watermark:
                    continue  # late: its window is closed already
                by_user = windows.get(start)
                if by_user is None:
                    by_user = windows[start] = {}
                acc = by_user.get(ev["user"])
                if acc is None:
                    by_user[ev["user"]] = [1, ev["amount"]]
                else:
                    acc[0] += 1
                    acc[1] += ev["amount"]
                p = m.partition()
                if ts > part_max[p]:
                    part_max[p] = ts
            if stats.rows >= RECORDS:  # everything read: each partition is at its end
                part_max = dict.fromkeys(part_max, max(part_max.values()))
            watermark = max(watermark, min(part_max.values()) - DELAY_MS)
            for start in [s for s in windows if s + SIZE_MS <= watermark]:
                for user, (count, total) in windows.pop(start).items():
                    while True:
                        try:
                            producer.produce(OUTPUT, window_json(user, start, count, total), user.encode())
                            break
                        except BufferError:
                            producer.poll(0.05)
            producer.poll(0)
        producer.flush(60)
    finally:
        stats.write()
        consumer.close()


if __name__ == "__main__":
    main()
