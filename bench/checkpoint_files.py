"""What Spark's checkpoint files cost a micro-batch on the local filesystem, in one run: the same queries with the
checkpoint file manager weir sets for local checkpoints (Hadoop's FileSystem API, weir.spark.checkpoint_confs)
against Spark's default (its FileContext API), in one session, each query on a checkpoint of its own.

    .venv/bin/python bench/checkpoint_files.py [--batches 30] [--rounds 2]

Two queries each way, on Spark's rate source into the noop sink: a stateless one, and a count by key (RocksDB
state). Prints, per query and way, the mean milliseconds of a batch's offset log write (walCommit), commit log
write (commitOffsets) and whole batch (triggerExecution) over the batches after the first five, and the ratio of
the whole batch's time, default to weir's.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from pyspark.sql import DataFrame, SparkSession

from weir.spark import CHECKPOINT_MANAGER_CONF, FILESYSTEM_CHECKPOINTS, spark_session
from weir.testing.environment import TEST_SPARK_CONF

DEFAULT = "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"
WAYS = (("FileContext (Spark's default)", DEFAULT), ("FileSystem (weir's)", FILESYSTEM_CHECKPOINTS))
PARTS = ("walCommit", "commitOffsets", "triggerExecution")
WARM = 5  # batches left out of the means: the query's first plans and classes


def batches(spark: SparkSession, stateful: bool, checkpoint: str, count: int) -> dict[str, float]:
    """Mean ms of each of PARTS over `count` batches (after WARM) of one query on `checkpoint`."""
    df: DataFrame = spark.readStream.format("rate").option("rowsPerSecond", 50).load()
    mode = "append"
    if stateful:
        df, mode = df.groupBy((df.value % 10).alias("k")).count(), "update"
    query = (df.writeStream.format("noop").outputMode(mode).option("checkpointLocation", checkpoint)
             .trigger(processingTime="100 milliseconds").start())  # fmt: skip
    deadline = time.monotonic() + 60 + count * 5
    seen: dict[int, dict] = {}
    try:
        while len(seen) < count + WARM:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(seen)} of {count + WARM} batches within the bound")
            time.sleep(0.2)
            seen |= {p["batchId"]: p["durationMs"] for p in query.recentProgress}
    finally:
        query.stop()
    kept = [seen[b] for b in sorted(seen)[WARM : WARM + count]]
    return {part: sum(d.get(part, 0) for d in kept) / len(kept) for part in PARTS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    spark = spark_session("bench-checkpoint-files", master="local[2]", conf=TEST_SPARK_CONF)
    spark.sparkContext.setLogLevel("ERROR")
    root = tempfile.mkdtemp(prefix="weir-bench-")
    print(f"load before: {os.getloadavg()[0]:.1f}")
    results: dict[tuple[str, bool], list[dict[str, float]]] = {}
    try:
        for r in range(args.rounds):
            for way, manager in WAYS:
                spark.conf.set(CHECKPOINT_MANAGER_CONF, manager)  # read when a query starts (its Hadoop configuration)
                for stateful in (False, True):
                    checkpoint = f"file://{root}/{r}-{stateful}-{manager.rsplit('.', 1)[-1]}"
                    results.setdefault((way, stateful), []).append(batches(spark, stateful, checkpoint, args.batches))
    finally:
        spark.stop()
    print(f"load after: {os.getloadavg()[0]:.1f}")
    means = {k: {p: sum(r[p] for r in rs) / len(rs) for p in PARTS} for k, rs in results.items()}
    for (way, stateful), m in means.items():
        parts = ", ".join(f"{p} {m[p]:.0f}" for p in PARTS)
        print(f"{'stateful ' if stateful else 'stateless'} {way:30} ms per batch: {parts}")
    for stateful in (False, True):
        old, new = (means[(way, stateful)]["triggerExecution"] for way, _ in WAYS)
        print(f"{'stateful ' if stateful else 'stateless'} batch: FileContext / FileSystem = {old / new:.2f}x")


if __name__ == "__main__":
    main()
