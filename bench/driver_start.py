"""A local driver's start with weir's class-data archive (weir.classdata) against the same start without it, in
one run: each round starts a process of its own that builds a Spark session as weir makes it (local[2]) and runs a
first small query (an aggregate and a round trip through a Python worker in Arrow), timed from the process's start
to the query's end. Rounds alternate, so that a busy machine moves both sides.

    .venv/bin/python bench/driver_start.py [--rounds 5]

The baseline is the JVM as it starts without weir's archive: `-Xshare:auto` among the driver's options (a user's
own sharing option, which weir leaves alone), so the JDK's own archive of its classes still maps. The archive is
`weir jars fetch`'s (make venv builds it); the bench fails, naming the command, when there is none.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

START = """
import sys, time
from pyspark.sql import functions as F
from weir.spark import spark_session
extra = sys.argv[1]
spark = spark_session("driver-start", "local[2]", {"spark.driver.extraJavaOptions": extra} if extra else None)
frame = spark.range(20_000).withColumn("k", F.col("id") % 7)
frame.groupBy("k").count().collect()
frame.mapInArrow(lambda batches: batches, frame.schema).count()
print("ready", flush=True)
spark.stop()
"""


def one(extra: str, home: Path) -> float:
    began = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", START, extra], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env={**os.environ, "WEIR_HOME": str(home)}, cwd=ROOT)  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == "ready":
            took = time.monotonic() - began
            proc.wait(120)
            return took
    raise SystemExit(f"the driver's start failed (exit {proc.wait(120)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from weir import classdata
    from weir.spark import local_driver

    spark_home, confs = local_driver()
    path = classdata.archive(spark_home or "", confs.get("spark.driver.extraClassPath", ""))
    if not path.is_file():
        raise SystemExit(f"no class-data archive at {path}: build it with `weir jars fetch`")
    home = Path("/tmp/weir-bench-driver-start")
    times: dict[str, list[float]] = {"with": [], "without": []}
    for r in range(args.rounds):
        for kind, extra in (("with", ""), ("without", "-Xshare:auto")):
            times[kind].append(one(extra, home))
            print(f"round {r + 1} {kind:7s} {times[kind][-1]:5.1f} s (load {os.getloadavg()[0]:.1f})", flush=True)
    w, wo = statistics.median(times["with"]), statistics.median(times["without"])
    print(f"median start to a first query: with the archive {w:.1f} s, without {wo:.1f} s: {wo / w:.2f}x faster "
          f"({path.stat().st_size >> 20} MB archive)")  # fmt: skip


if __name__ == "__main__":
    main()
