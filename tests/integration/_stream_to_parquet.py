"""A streaming job for the restart test: a Kafka topic -> Parquet (Spark's file sink) with a checkpoint.

    python _stream_to_parquet.py --bootstrap H:P --topic T --checkpoint DIR --output DIR \
        --max-offsets 1000 --until-rows 20000 [--timeout 180]

Reads the topic from the earliest offset, at most --max-offsets records per micro-batch, on a
processing-time trigger, so a backlog takes many batches. Runs until it is killed, or until the committed
end offsets of the source add up to --until-rows (offsets start at 0, so that is the number of records
read, counted across restarts from the same checkpoint), then stops cleanly and exits 0. Exits 3 on
--timeout, 2 when the query fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import weir
from weir.testing.environment import TEST_SPARK_CONF


def rows_read(progress: dict | None, topic: str) -> int:
    if not progress or not progress.get("sources"):
        return 0
    end = progress["sources"][0]["endOffset"]
    end = json.loads(end) if isinstance(end, str) else end
    return sum(int(o) for o in (end or {}).get(topic, {}).values())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--max-offsets", type=int, default=1000)
    ap.add_argument("--until-rows", type=int, required=True)
    ap.add_argument("--trigger", default="100 milliseconds")
    ap.add_argument("--timeout", type=float, default=180.0)
    args = ap.parse_args()

    spark = weir.spark_session(
        "weir-restart-test",
        master="local[2]",
        conf=TEST_SPARK_CONF,
    )
    spark.sparkContext.setLogLevel("ERROR")
    df = (
        spark.readStream.format("weir-kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args.max_offsets))
        .load()
        .select("topic", "partition", "offset", "key", "value")
    )
    query = (
        df.writeStream.format("parquet")
        .option("path", args.output)
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime=args.trigger)
        .start()
    )
    print(f"started query {query.id} run {query.runId}", flush=True)
    deadline = time.monotonic() + args.timeout
    code = 3
    try:
        while time.monotonic() < deadline:
            if not query.isActive:
                print(f"query failed: {query.exception()}", file=sys.stderr, flush=True)
                code = 2
                break
            done = rows_read(query.lastProgress, args.topic)
            if done >= args.until_rows:
                print(f"read {done} rows", flush=True)
                code = 0
                break
            time.sleep(0.2)
        else:
            print(f"timed out after {args.timeout}s: {query.lastProgress}", file=sys.stderr, flush=True)
    finally:
        if query.isActive:
            query.stop()
        spark.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
