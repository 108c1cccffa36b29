"""Kill test of the archive: SIGKILL `weir archive` mid-run, then let it finish. While it runs and after,
DuckDB and pandas reading `<lake>/<topic>/**/*.parquet` never see a duplicate or a partial file, and at the end
every record of the topic is there exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import duckdb
import pandas as pd
import pytest
from _pipe import Rec, produce, wait_for

from weir.kafka import Admin

pytestmark = pytest.mark.integration
N = 2000
T0_MS = 1_795_300_000_000


def committed(lake: Path, topic: str) -> int:
    return len(list((lake / "_weir" / "manifests" / topic).glob("*-*[0-9].json")))


def read_duckdb(lake: Path, topic: str) -> tuple[int, int]:
    files = list((lake / topic).rglob("*.parquet"))
    if not files:
        return 0, 0
    glob = f"{lake}/{topic}/**/*.parquet"
    q = f'select count(*), count(distinct ("partition", "offset")) from read_parquet(\'{glob}\')'
    return tuple(duckdb.sql(q).fetchall()[0])


def test_sigkill_mid_archive_leaves_no_duplicates_or_partial_files_for_duckdb_and_pandas(bootstrap, tmp_path):
    topic = f"kill-{uuid.uuid4().hex[:8]}"
    lake = tmp_path / "lake"
    Admin(bootstrap).create_topic(topic, 3)
    records = [
        Rec(i % 3, str(i).encode(), json.dumps({"id": i}).encode(), None, T0_MS + i * 45_000) for i in range(N)
    ]  # 25 hours of records: many hour directories per batch
    produce(bootstrap, topic, records)
    env = {
        **os.environ,
        "WEIR_HOME": str(tmp_path / "home"),
        "WEIR_BOOTSTRAP_SERVERS": bootstrap,
        "WEIR_CHECKPOINT_ROOT": str(tmp_path / "checkpoints"),
        "WEIR_LAKE": str(lake),
        "WEIR_SPARK_MASTER": "local[2]",
        "WEIR_SPARK_CONF": json.dumps({"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"}),
        "WEIR_MAX_OFFSETS_PER_TRIGGER": "300",
        "WEIR_TRIGGER": "100 milliseconds",
        "WEIR_RESTART_BACKOFF": "0.5",  # a failed start on a loaded machine is retried soon, not after a minute
        "WEIR_RESTART_BACKOFF_MAX": "5",
    }
    log = tmp_path / "archive.log"

    def start(*extra: str) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "weir.cli", "archive", topic, "--schema", "id BIGINT", *extra]
        return subprocess.Popen(cmd, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)

    # A reader polls the lake the whole time: every read sees each record at most once.
    reads: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            try:
                reads.append(read_duckdb(lake, topic))
            except Exception as exc:  # a read must never fail on a partial file
                errors.append(exc)
            time.sleep(0.05)

    polling = threading.Thread(target=reader, daemon=True)
    polling.start()
    try:
        proc = start()
        wait_for(lambda: committed(lake, topic) >= 1, 240, "an archived batch before the kill")
        time.sleep(0.3)  # into the next batch: its write or publish is cut off (every step: the crash test)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        proc = start("--once")  # the restart completes what the kills left and archives the rest
        code = proc.wait(300)
    finally:
        done.set()
        polling.join(10)
    assert code == 0, log.read_text()[-4000:]
    assert not errors, errors[:3]
    assert reads and all(n == distinct for n, distinct in reads), [r for r in reads if r[0] != r[1]][:5]

    assert read_duckdb(lake, topic) == (N, N)
    df = pd.read_parquet(lake / topic)  # pandas, hive partitions
    assert len(df) == N and not df.duplicated(["partition", "offset"]).any()
    assert sorted(df["id"]) == list(range(N))
    files = [f for f in (lake / topic).rglob("*") if f.is_file()]
    assert files and all(f.suffix == ".parquet" and f.stat().st_size > 0 for f in files)
    assert not list((lake / "_weir" / "manifests").rglob("*.pending.json"))
