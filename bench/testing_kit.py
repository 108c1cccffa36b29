"""Time from a test's start to its first result with weir's testing kit, one-processor pipeline, cold and warm.

    .venv/bin/python bench/testing_kit.py

Each path runs in a fresh process: its first test is cold (it starts Spark, and for `run_once` the broker),
the next ones are warm. A test here is what a user's test does: make a PipelineTest, put three rows in
(`send` + `run_once`, or `run_batch`), read the output topic and check it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

ROWS = [{"id": "p1", "cents": 25000}, {"id": "p2", "cents": 999}, b"garbage"]


def pipeline():
    from pyspark.sql import functions as F

    from weir.pipeline import Pipeline

    p = Pipeline("payments")
    payments = p.topic("payments", "id STRING NOT NULL, cents BIGINT", key="id", partitions=2)
    large = p.topic("payments.large", "id STRING, euros DOUBLE", key="id")

    @p.processor(inputs=[payments], outputs=[large])
    def large_payments(df):
        return df.where("cents >= 10000").select("id", (F.col("cents") / 100).alias("euros"))

    return p


def one_test(path: str, phases: dict[str, float]) -> float:
    """One test's seconds from its start to its checked result; `phases` gets where they went."""
    from weir.testing import PipelineTest, assert_rows
    from weir.testing.environment import Environment

    began = last = time.monotonic()

    def phase(name: str) -> None:
        nonlocal last
        now = time.monotonic()
        phases[name] = round(now - last, 2)
        last = now

    t = PipelineTest(pipeline())
    env = Environment.current()
    _ = env.spark  # started here when cold: the Spark session, measured apart from the rest
    phase("spark session")
    if path == "run_once":
        _ = env.broker
        phase("broker")
        t.send("payments", ROWS)
        phase("send")
        t.run_once()
        phase("run_once")
    else:
        t.run_batch("large_payments", ROWS)
        phase("run_batch")
    assert_rows(t.read("payments.large"), [{"id": "p1", "euros": 250.0}])
    phase("read")
    return time.monotonic() - began


def child(path: str, tests: int) -> None:
    runs = []
    for _ in range(tests):
        phases: dict[str, float] = {}
        runs.append((one_test(path, phases), phases))
    print(json.dumps(runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=3, help="tests per process: the first is cold")
    parser.add_argument("--child", choices=["run_once", "run_batch"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.tests)
        return
    print(f"{'path':<12} {'cold s':>7} {'warm s (each next test)':>30}")
    for path in ("run_once", "run_batch"):
        command = [sys.executable, __file__, "--child", path, "--tests", str(args.tests)]
        out = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True).stdout
        runs = json.loads(out.strip().splitlines()[-1])
        seconds = [s for s, _ in runs]
        print(f"{path:<12} {seconds[0]:>7.1f} {', '.join(f'{s:.1f}' for s in seconds[1:]):>30}")
        print(f"{'':<12} cold: {runs[0][1]}; warm: {runs[1][1]}")


if __name__ == "__main__":
    main()
