"""A streaming query into ParquetSink, SIGKILLed mid-run and restarted from its checkpoint:
DuckDB and pandas, listing `*.parquet` directly, see every row exactly once and no partial file.

Run as a script, this file is the streaming job itself:

    python test_sinks_parquet_kill.py --output DIR --checkpoint DIR --rows-per-batch N [--until-batch B]
        [--pause-after-write S]

It reads Spark's `rate-micro-batch` source (batch i holds exactly the values [i*N, (i+1)*N), so a
replayed batch has the same rows), writes each micro-batch with `ParquetSink.write` inside
`foreachBatch`, then spends S seconds as a runner's bookkeeping would before Spark logs the batch's
commit. It stops cleanly once batch B is committed, or runs until it is killed.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROWS_PER_BATCH = 20_000
PAUSE_AFTER_WRITE_S = 0.3
WRITER = "kill.test"


# -- the job ------------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--output", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--rows-per-batch", type=int, required=True)
    ap.add_argument("--until-batch", type=int, default=10**9)
    ap.add_argument("--pause-after-write", type=float, default=0.0)
    ap.add_argument("--timeout", type=float, default=240.0)
    args = ap.parse_args()

    import weir
    from weir.sinks import ParquetSink
    from weir.testing.environment import TEST_SPARK_CONF

    spark = weir.spark_session("weir-sink-kill-test", master="local[2]", conf=TEST_SPARK_CONF)
    spark.sparkContext.setLogLevel("ERROR")
    sink = ParquetSink(args.output, partition_by=["bucket"])
    sink.open(WRITER)

    def each(batch, batch_id: int) -> None:
        written = sink.write(batch, batch_id)
        print(f"batch {batch_id} wrote {written.rows}, replayed {written.replayed}", flush=True)
        time.sleep(args.pause_after_write)

    rows = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", args.rows_per_batch)
        .option("numPartitions", 2)
        .load()
        .selectExpr("value AS id", "timestamp", "value % 4 AS bucket", "repeat('x', 50) AS padding")
    )
    query = (
        rows.writeStream.foreachBatch(each)
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    deadline = time.monotonic() + args.timeout
    try:
        while time.monotonic() < deadline:
            if not query.isActive:
                print(f"query failed: {query.exception()}", file=sys.stderr, flush=True)
                return 2
            progress = query.lastProgress
            if progress and progress["batchId"] >= args.until_batch:
                print(f"done at batch {progress['batchId']}", flush=True)
                return 0
            time.sleep(0.1)
        print("timed out", file=sys.stderr, flush=True)
        return 3
    finally:
        if query.isActive:
            query.stop()
        spark.stop()


# -- the test -----------------------------------------------------------------------------------------
def start(tmp: Path, run: int, until_batch: int | None = None) -> subprocess.Popen:
    args = [
        sys.executable, __file__,
        "--output", str(tmp / "out"),
        "--checkpoint", str(tmp / "ckpt"),
        "--rows-per-batch", str(ROWS_PER_BATCH),
        "--pause-after-write", str(PAUSE_AFTER_WRITE_S),
    ]  # fmt: skip
    if until_batch is not None:
        args += ["--until-batch", str(until_batch)]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    # A session of its own: SIGKILL to the group takes the JVM and Python workers down with the driver,
    # as a crashed machine would.
    with open(tmp / f"run{run}.log", "wb") as log:
        return subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def published(out: Path) -> int:
    return len(list(out.glob("weir_batch=*"))) if out.exists() else 0


def logs(tmp: Path) -> str:
    return "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}" for f in sorted(tmp.glob("run*.log")))


def wait_for_published(proc: subprocess.Popen, out: Path, at_least: int, tmp: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while published(out) < at_least:
        assert proc.poll() is None, f"the job exited with {proc.returncode}\n{logs(tmp)}"
        assert time.monotonic() < deadline, f"fewer than {at_least} batches published in {timeout}s\n{logs(tmp)}"
        time.sleep(0.05)


def test_sigkill_and_restart_publish_every_row_exactly_once(tmp_path) -> None:
    import duckdb
    import pandas as pd
    import pyarrow.parquet as pq

    from weir.sinks import ParquetSink

    out, staging = tmp_path / "out", tmp_path / "out.staging" / WRITER
    rng = random.Random(7)
    interrupted_staging = 0
    # A kill as soon as a batch is published: inside the pause, before Spark logged that batch's commit. (The
    # schedule also takes "random": a kill during Spark's write, between staging and publish, or after.)
    schedule = ["right after a publish"]  # the narrowest window; a random kill is test_run_kill's
    for run, when in enumerate(schedule, start=1):
        proc = start(tmp_path, run)
        try:
            wait_for_published(proc, out, published(out) + 2, tmp_path)
            if when == "random":
                time.sleep(rng.uniform(0.0, 0.8))
            else:
                wait_for_published(proc, out, published(out) + 1, tmp_path)
        finally:
            kill_group(proc)
        interrupted_staging += len(list(staging.iterdir())) if staging.exists() else 0

    last = published(out)
    final = start(tmp_path, len(schedule) + 1, until_batch=last + 3)
    try:
        assert final.wait(timeout=240) == 0, logs(tmp_path)
    finally:
        kill_group(final)

    batches = published(out)
    expected = batches * ROWS_PER_BATCH
    query = f"SELECT count(*), count(DISTINCT id), min(id), max(id) FROM read_parquet('{out}/**/*.parquet')"
    assert duckdb.sql(query).fetchall() == [(expected, expected, 0, expected - 1)], logs(tmp_path)
    files = glob.glob(f"{out}/**/*.parquet", recursive=True)
    ids = pd.concat([pd.read_parquet(f, columns=["id"]) for f in files])["id"]
    assert len(ids) == expected and ids.is_unique
    every_file = [Path(r) / f for r, _, names in os.walk(out) for f in names]
    assert len(every_file) == len(files), "only .parquet files are published"
    assert all(pq.read_metadata(f).num_rows > 0 for f in files), "no empty or truncated Parquet file"
    # query.stop() interrupts the batch after the last one it waited for, as a kill would: its staging copy
    # is never published, and the next open() deletes it.
    leftovers = [int(p.name.split("-")[0]) for p in staging.iterdir()] if staging.exists() else []
    assert all(b >= batches for b in leftovers), leftovers
    ParquetSink(str(out)).open(WRITER)
    assert not staging.exists()
    replays = sum(len(re.findall(r" replayed [1-9]", f.read_text(errors="replace"))) for f in tmp_path.glob("run*.log"))
    assert replays >= 1, f"the batch published before the second kill was not replayed\n{logs(tmp_path)}"
    print(f"{batches} batches, {expected} rows; {interrupted_staging} staging dirs left by kills; {replays} replays")


if __name__ == "__main__":
    sys.exit(main())
