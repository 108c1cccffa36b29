"""`make demo` as a new user runs it, shortened: the shop pipeline on embedded defaults ends with its summaries
(the books, weir audit, the consumer groups' lag, the view, `weir sql`) and exit 0. It ended in a traceback for
two sessions (its audit summary was handed the runner after it was dropped), unseen because nothing ran it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from weir.testing.environment import TEST_SPARK_CONF

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DEMO_LIMIT_S = 1800.0  # above the sum of the demo's own bounded waits (examples/shop/demo.py, release.py)


def test_the_demo_runs_to_its_summaries_and_exits_0(tmp_path):
    # The tests' JVM options (C1 only, the serial collector: weir.testing.environment): the same demo for about 40%
    # less JIT and GC CPU, which the other test worker's Spark session needs on two cores.
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TMPDIR": str(tmp_path),
        "WEIR_SPARK_CONF": json.dumps(TEST_SPARK_CONF),
    }
    env.pop("WEIR_HOME", None)
    # The demo's own waits are bounded (its launch 300 s, the run, each story's first output 180 s, the release
    # story's alert 180 s): on 2 cores beside two busy loops and the other worker's kill tests its whole run took
    # more than 900 s once, and the test killed it mid-story. Its own session, so that a kill takes every process
    # it started (broker, monitor, servers) with it.
    demo = subprocess.Popen(
        [sys.executable, "-m", "examples.shop.demo", "--duration", "30"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        said, _ = demo.communicate(timeout=DEMO_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(demo.pid, signal.SIGKILL)
        said, _ = demo.communicate(timeout=60)
        pytest.fail(f"the demo did not end within {DEMO_LIMIT_S:.0f} s; it said:\n{said[-4000:]}")
    assert demo.returncode == 0, said[-4000:]
    assert "Traceback" not in said, said[-4000:]
    audit = next((line for line in said.splitlines() if line.startswith("weir audit: 12 processors")), None)
    assert audit is not None and "0 more than once, 0 silent gap(s)" in audit, said[-4000:]
    assert "lag of each processor's consumer group, as kafka-consumer-groups reads it: weir.shop.enrich" in said
    assert "latest records of customers.signals:" in said, said[-4000:]  # @stateful: a rule and a timer
    # `weir state` while the pipeline runs: answered by the runner's session, not a Spark start of its own
    state = r"weir state examples.shop.pipeline:shop watch --limit 3 \(answered in [\d.]+ s by the running pipeline"
    assert re.search(state, said), said[-4000:]
    assert "latest records of orders.attributed:" in said, said[-4000:]  # a stream-stream join
    # big_order runs in Spark's real-time mode (docs/realtime.md): the live table says so, its alerts are out
    # (or, when its real-time batches starved on a loaded machine, micro-batches for now: said with why)
    assert re.search(r"│ big_or\S* +│[^\n]*│ (real|micro)", said), said[-4000:]  # names, modes wrap in narrow columns
    assert re.search(r"big_order: [1-9][\d,]* of its [\d,]+ batches in real time", said), said[-4000:]
    assert re.search(r"latest records of alerts.big_orders:\n  \{'order_id'", said), said[-4000:]
    assert re.search(r"spend.by_customer_5m: [\d,]+ window records, [\d,]+ of them updates for late orders", said)
    # spend_lake upserts: as many rows as windows, each once, however many revisions the topic holds (in 30 s few or
    # no 5-minute windows close; test_shop checks the table's rows against the topic's last revisions).
    upsert = re.search(r"by DuckDB: ([\d,]+) rows for ([\d,]+) windows, [\d,]+ of them updated in place", said)
    nothing = "spend_lake: no window in " in said  # a loaded machine: no spend_lake batch committed in 30 s
    assert (upsert and upsert.group(1) == upsert.group(2)) or (nothing and not upsert), said[-4000:]
    assert 'weir sql "SELECT category' in said and "weir sql failed" not in said, said[-4000:]
    # Alerts are Avro through the registry (docs/formats.md), and their latest records decode from it.
    assert "alerts are Avro in the Confluent wire format, registered in the schema registry at" in said, said[-4000:]
    assert re.search(r"alerts: Avro schema id \d+, version 1 of subject alerts-value in the schema registry", said)
    assert re.search(r"keys: Avro schema id \d+ of subject alerts-key", said)
    # The release story (docs/releases.md): a candidate shadowed, released, caught by the monitor, and every order
    # it dropped written back by `weir backfill --version`, each once
    assert "weir shadow: the release candidate of enrich" in said, said[-4000:]
    # in 30 s the live enrich may commit its first batch only as the run ends: the shadow then compared none
    assert re.search(r"weir shadow: candidate src-\w+ beside live src-\w+, batches|the shadow compared no batch", said)
    assert "weir monitor: release_drift firing: " in said, said[-4000:]
    repaired = re.search(
        r"dropped (\d+) orders \(its batches the runner counted\), the backfill wrote (\d+) into", said
    )
    assert repaired and int(repaired.group(2)) > 0, said[-4000:]
    once = re.search(r"of the (\d+) orders enrich committed, (\d+) missing, (\d+) more than once", said)
    assert once and int(once.group(1)) > 0 and once.group(2) == once.group(3) == "0", said[-4000:]
