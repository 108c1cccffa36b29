"""The same pipeline on a `spark://` master: a standalone Spark master and one worker started from the venv's
pyspark, and `weir run --once` with WEIR_SPARK_MASTER pointing at it. The executors are the worker's, so
the join's state, the Kafka reads and writes and the Parquet sink all run outside the driver's JVM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pyarrow.dataset as ds
import pyspark
import pytest
from _pipe import Rec, produce, wait_for

from weir.kafka import Admin
from weir.kafka.broker import free_port
from weir.testing.environment import TEST_SPARK_CONF

pytestmark = pytest.mark.integration

PIPELINE = """
from pyspark.sql import functions as F
from weir.pipeline import Pipeline
from weir.blocks.join import join_table
from weir.sinks import ParquetSink

p = Pipeline("standalone")
orders = p.topic("{prefix}.orders", schema="id BIGINT NOT NULL, cid STRING, amount DOUBLE", key="id", partitions=2)
customers = p.table("{prefix}.customers", schema="cid STRING, segment STRING", key="cid")
enriched = p.topic("{prefix}.enriched", schema="id BIGINT, cid STRING, amount DOUBLE, segment STRING", key="id")

@p.processor(inputs=[orders, customers], outputs=[enriched], stateful=True)
def enrich(o, c):
    return join_table(o, c, key="cid", how="left")

@p.processor(inputs=[enriched], sink=ParquetSink("{lake}"))
def archive(df):
    return df.where(F.col("amount") > 1).select("id", "segment", "topic", "partition", "offset")
"""


@pytest.fixture
def standalone(tmp_path: Path):
    """A Spark standalone master and one worker with 2 cores, on loopback; stopped after the test."""
    spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
    port, ui = free_port(), free_port()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    log = open(tmp_path / "cluster.log", "ab")  # noqa: SIM115 - closed after the processes
    master = subprocess.Popen(
        [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
         "--webui-port", str(ui)], env=env, stdout=log, stderr=log,
    )  # fmt: skip
    url = f"spark://127.0.0.1:{port}"
    worker = subprocess.Popen(
        [spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "2",
         "--memory", "2g", "--webui-port", str(free_port()), "--work-dir", str(tmp_path / "work")],
        env=env, stdout=log, stderr=log,
    )  # fmt: skip
    try:
        wait_for(lambda: b"Successfully registered with master" in (tmp_path / "cluster.log").read_bytes(), 90,
                 "the worker to register")  # fmt: skip
        yield url
    finally:
        for proc in (worker, master):
            proc.terminate()
            proc.wait(30)
        log.close()


def test_a_pipeline_runs_on_a_spark_standalone_master(bootstrap, tmp_path, standalone):
    prefix = uuid.uuid4().hex[:8]
    lake = tmp_path / "lake"
    spec = tmp_path / "standalone_pipeline.py"
    spec.write_text(textwrap.dedent(PIPELINE.format(prefix=prefix, lake=lake)))
    admin = Admin(bootstrap)
    admin.create_topic(f"{prefix}.orders", 2)
    admin.create_topic(f"{prefix}.customers", 1)
    segments = {f"c{i}": ("gold" if i % 2 else "silver") for i in range(5)}
    table = [Rec(0, c.encode(), json.dumps({"cid": c, "segment": s}).encode()) for c, s in segments.items()]
    produce(bootstrap, f"{prefix}.customers", table)
    n = 600
    orders = [Rec(i % 2, str(i).encode(), json.dumps({"id": i, "cid": f"c{i % 7}", "amount": i % 5}).encode())
              for i in range(n)]  # fmt: skip
    produce(bootstrap, f"{prefix}.orders", [*orders, Rec(0, b"bad", b"garbage")])
    env = {
        **os.environ,
        "WEIR_HOME": str(tmp_path / "home"),
        "WEIR_BOOTSTRAP_SERVERS": bootstrap,
        "WEIR_CHECKPOINT_ROOT": str(tmp_path / "checkpoints"),
        "WEIR_SPARK_MASTER": standalone,
        "WEIR_SPARK_CONF": json.dumps({**TEST_SPARK_CONF, "spark.cores.max": "2"}),
    }
    done = subprocess.run(
        [sys.executable, "-m", "weir.cli", "run", str(spec), "--once"], env=env, capture_output=True, timeout=600
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    cluster = (tmp_path / "cluster.log").read_text(errors="replace")
    assert "Registered app weir-standalone" in cluster and "Launching executor" in cluster

    archived = ds.dataset(str(lake), format="parquet", partitioning="hive").to_table()
    ids = archived.column("id").to_pylist()
    expected = [i for i in range(n) if i % 5 > 1]
    assert sorted(ids) == expected
    got = dict(zip(ids, archived.column("segment").to_pylist(), strict=True))
    assert all(got[i] == segments.get(f"c{i % 7}") for i in expected)
    progress = [json.loads(x) for x in (tmp_path / "home" / "progress" / "standalone.jsonl").read_text().splitlines()]
    batches = [x for x in progress if x["type"] == "progress"]
    assert all(x["accounting"]["balanced"] for x in batches)
    kinds = ("in", "out", "dlq", "absorbed")
    enrich = {k: sum(x["accounting"][k] for x in batches if x["processor"] == "enrich") for k in kinds}
    assert enrich == {"in": n + 1 + len(segments), "out": n, "dlq": 1, "absorbed": len(segments)}
