"""Kill test of the archive, on a local disk and on S3: SIGKILL `weir archive` as it commits a batch (right after
it logs "committing", so the kill lands before, inside or just after the Delta commit), then let it finish.
While it runs and after, DuckDB reading the table never sees a record twice, and at the end DuckDB and pandas
see every record of the topic exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import duckdb
import pytest
from _pipe import Rec, produce, wait_for

from weir.kafka import Admin
from weir.storage.lake import Lake
from weir.testing.environment import TEST_SPARK_CONF

pytestmark = pytest.mark.integration
N = 2000
T0_MS = 1_795_300_000_000


def read_duckdb(lake: str, topic: str) -> tuple[int, int]:
    dt = Lake(lake).table(topic)
    if dt is None:
        return 0, 0
    con = duckdb.connect()
    con.register("archived", dt.to_pyarrow_dataset())
    return tuple(con.sql('select count(*), count(distinct ("partition", "offset")) from archived').fetchall()[0])


def test_sigkill_mid_commit_leaves_every_record_once_for_duckdb_and_pandas(bootstrap, tmp_path, table_root):
    topic = f"kill-{uuid.uuid4().hex[:8]}"
    lake = f"{table_root}/lake"
    Admin(bootstrap).create_topic(topic, 3)
    records = [
        Rec(i % 3, str(i).encode(), json.dumps({"id": i}).encode(), None, T0_MS + i * 45_000) for i in range(N)
    ]  # 25 hours of records: many hour partitions per batch
    produce(bootstrap, topic, records)
    env = {
        **os.environ,
        "WEIR_HOME": str(tmp_path / "home"),
        "WEIR_BOOTSTRAP_SERVERS": bootstrap,
        "WEIR_CHECKPOINT_ROOT": str(tmp_path / "checkpoints"),
        "WEIR_LAKE": lake,
        "WEIR_SPARK_MASTER": "local[2]",
        "WEIR_SPARK_CONF": json.dumps(TEST_SPARK_CONF),
        "WEIR_MAX_OFFSETS_PER_TRIGGER": "600",  # 4 batches: the kill lands in the second one's commit
        "WEIR_TRIGGER": "100 milliseconds",
        "WEIR_RESTART_BACKOFF": "0.5",  # a failed start on a loaded machine is retried soon, not after a minute
        "WEIR_RESTART_BACKOFF_MAX": "5",
    }
    log = tmp_path / "archive.log"

    def start(*extra: str) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "weir.cli", "archive", topic, "--schema", "id BIGINT", *extra]
        return subprocess.Popen(cmd, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)

    def commits() -> int:
        return log.read_text(errors="replace").count(": committing batch") if log.exists() else 0

    # A reader polls the table the whole time: every read sees each record at most once.
    reads: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            try:
                reads.append(read_duckdb(lake, topic))
            except Exception as exc:  # a read must never fail on a partial commit
                errors.append(exc)
            time.sleep(0.25)  # a Delta log read per poll: faster would starve the archiver it watches

    polling = threading.Thread(target=reader, daemon=True)
    polling.start()
    try:
        proc = start()
        wait_for(lambda: commits() >= 2, 240, "a second batch's commit", interval=0.005)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        killed_at = read_duckdb(lake, topic)
        proc = start("--once")  # the restart replays the batch (a no-op if its commit landed) and archives the rest
        code = proc.wait(300)
    finally:
        done.set()
        polling.join(10)
    assert code == 0, log.read_text()[-4000:]
    assert not errors, errors[:3]
    assert reads and all(n == distinct for n, distinct in reads), [r for r in reads if r[0] != r[1]][:5]
    assert 0 < killed_at[0] < N

    assert read_duckdb(lake, topic) == (N, N)
    df = Lake(lake).table(topic).to_pandas()  # pandas
    assert len(df) == N and not df.duplicated(["partition", "offset"]).any()
    assert sorted(df["id"]) == list(range(N))
    assert Lake(lake).gaps(topic) == [] and sum(r.rows for rs in Lake(lake).coverage(topic).values() for r in rs) == N
