"""The latency consumer, in its own process: reads LAT_OUTPUT from its start and times each output record against
its input's produce time (`ts`, epoch ms). Every 0.25 s it rewrites LAT_STATUS ({"records", "distinct", "first_ms",
"paced"}: records read, distinct ids, when the first output came, distinct paced ids, i.e. id >= 0); on SIGTERM it
writes LAT_RESULT ({"latency": {id: ms}, "duplicates", "unknown"}) and exits.

With LAT_MODE=window an output is a closed window: its id is "user@start", its latency the time from the
window's end, and LAT_RESULT also holds each window's count ("counts"); "paced" counts the windows of the
measured users (not "~...")."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid

from common import BOOTSTRAP, FETCH_WAIT_MS, OUTPUT, WINDOW, window_of
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition


def _write(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def main() -> None:
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    consumer = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": f"latency-consumer-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": FETCH_WAIT_MS,
            "fetch.min.bytes": 1,
        }
    )
    partitions = sorted(consumer.list_topics(OUTPUT, timeout=30).topics[OUTPUT].partitions)
    consumer.assign([TopicPartition(OUTPUT, p, OFFSET_BEGINNING) for p in partitions])
    latency: dict[int | str, int] = {}
    counts: dict[str, int] = {}
    records = duplicates = unknown = paced = 0
    first_ms = None
    next_status = 0.0
    try:
        while not stop:
            for m in consumer.consume(num_messages=10_000, timeout=0.05):
                now = time.time() * 1000
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(err)
                records += 1
                try:
                    if WINDOW:
                        user, start, ts, count = window_of(m.value())
                        key = f"{user}@{start}"
                    else:
                        out = json.loads(m.value())
                        key, ts = int(out["id"]), int(out["ts"])
                except (TypeError, ValueError, KeyError):
                    unknown += 1
                    continue
                if first_ms is None:
                    first_ms = now
                if key in latency:
                    duplicates += 1
                    continue
                latency[key] = round(now - ts)
                if WINDOW:
                    counts[key] = count
                    paced += not key.startswith("~")
                else:
                    paced += key >= 0
            if time.monotonic() >= next_status:
                status = {"records": records, "distinct": len(latency), "first_ms": first_ms, "paced": paced}
                _write(os.environ["LAT_STATUS"], status)
                next_status = time.monotonic() + 0.25
    finally:
        consumer.close()
        result = {"latency": latency, "duplicates": duplicates, "unknown": unknown, "first_ms": first_ms,
                  "counts": counts}  # fmt: skip
        _write(os.environ["LAT_RESULT"], result)


if __name__ == "__main__":
    main()
