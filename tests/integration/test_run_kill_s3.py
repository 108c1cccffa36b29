"""Checkpoints on object storage: `weir run` with `checkpoint_root` on the tests' S3 server (moto_server, a real
process), as a cluster without HDFS runs: Spark writes its offset and commit logs through Hadoop's S3A filesystem
(the jars of weir's `spark` set, fetched by `weir jars fetch`) and weir reads and writes its own files there through
pyarrow. SIGKILLed mid-run and restarted, the output holds every input once."""

from __future__ import annotations

import json
import uuid

import pytest
from _pipe import Rec, consume_all, finish_once, kill_tree, logs_of, produce, start_weir, wait_running, weir_env
from pyarrow import fs as pafs

from weir.kafka import Admin
from weir.storage.paths import resolve

pytestmark = pytest.mark.integration
N = 2000

PIPELINE = """
from pyspark.sql import functions as F
from weir.pipeline import Pipeline

p = Pipeline("s3kill")
events = p.topic("{prefix}.events", schema="id BIGINT NOT NULL, amount DOUBLE", key="id", partitions=2)
scaled = p.topic("{prefix}.scaled", schema="id BIGINT, cents BIGINT", key="id", partitions=2)

@p.processor(inputs=[events], outputs=[scaled])
def scale(df):
    return df.select("id", (F.col("amount") * 100).cast("long").alias("cents"))
"""


def committed_batches(checkpoints: str) -> int:
    """Batches Spark committed, from the commit log on S3."""
    filesystem, path = resolve(f"{checkpoints}/s3kill/scale/commits")
    try:
        infos = filesystem.get_file_info(pafs.FileSelector(path))
    except FileNotFoundError:
        return 0
    return sum(1 for i in infos if i.base_name.isdigit())


def test_sigkill_with_checkpoints_on_s3_loses_and_doubles_nothing(bootstrap, s3, tmp_path):
    prefix = uuid.uuid4().hex[:8]
    checkpoints = f"{s3}/{prefix}/checkpoints"
    spec = tmp_path / "s3kill_pipeline.py"
    spec.write_text(PIPELINE.format(prefix=prefix))
    Admin(bootstrap).create_topic(f"{prefix}.events", 2)
    records = [Rec(i % 2, str(i).encode(), json.dumps({"id": i, "amount": i / 4}).encode()) for i in range(N)]
    produce(bootstrap, f"{prefix}.events", records)
    env = weir_env(tmp_path, bootstrap, WEIR_CHECKPOINT_ROOT=checkpoints, WEIR_MAX_OFFSETS_PER_TRIGGER="200")
    run = start_weir(spec, env, tmp_path / "run.log")
    try:
        wait_running(run, lambda: committed_batches(checkpoints) >= 2, 300, "two batches committed on S3", tmp_path)
    finally:
        kill_tree(run)
    finish_once(spec, env, tmp_path)

    assert committed_batches(checkpoints) >= 3, logs_of(tmp_path)
    out = consume_all(bootstrap, f"{prefix}.scaled")
    ids = sorted(json.loads(r.value())["id"] for r in out)
    assert ids == list(range(N)), f"{len(ids)} records for {N} inputs\n{logs_of(tmp_path)}"
    assert not [p for p in tmp_path.rglob("offsets") if "scale" in str(p)], "a checkpoint went to local disk, not S3"
