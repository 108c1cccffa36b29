"""What one batch write through the weir-kafka Python data source costs on the driver, against Spark's `noop` sink.

    .venv/bin/python bench/write_cost.py [--rows 1,10000] [--writes 6]

A processor's stateless batch ends in `DataFrame.write.format("weir-kafka").save()` (weir.runtime.query,
write_topics): each such write creates the data source and its writer in Python workers on the driver, and
commits in another. The plain Structured Streaming query's writer is made once per query. This times N writes of
the same rows (topic, key, value) to a 4-partition topic of an embedded broker, and the same writes to `noop`,
in one Spark session (local[2]); the first write of each is Spark's and Python's warm-up and is left out of the
median. Issue 27: the fixed cost per batch that keeps weir's live latency above the plain query's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pyspark.sql import functions as F
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from weir.config import load
from weir.kafka import Admin
from weir.kafka.broker import EmbeddedBroker, free_port
from weir.spark import spark_session


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,10000", help="rows per write, comma-separated")
    parser.add_argument("--writes", type=int, default=6, help="writes per size and sink (the first is warm-up)")
    args = parser.parse_args()
    console = Console()
    scratch = Path(tempfile.mkdtemp(prefix="weir-bench-write-cost-"))
    broker = EmbeddedBroker(scratch / "broker-home", free_port())
    broker.start()
    try:
        settings = load(home=str(scratch / "home"), bootstrap_servers=broker.bootstrap)
        spark = spark_session("bench-write-cost", settings=settings, master="local[2]",
                              conf={"spark.ui.enabled": "false"})  # fmt: skip
        Admin(broker.bootstrap).create_topic("out", 4, exist_ok=True)
        table = Table(title=f"one batch write, median of {args.writes - 1} (load {os.getloadavg()[0]:.1f})")
        for column in ("rows", "noop s", "weir-kafka s", "weir-kafka - noop s", "weir-kafka / noop"):
            table.add_column(column, justify="right")
        for n in (int(x) for x in args.rows.split(",")):
            text = F.col("id").cast("string").cast("binary")
            rows = spark.range(n).select(F.lit("out").alias("topic"), text.alias("key"), text.alias("value"))
            took = {}
            for sink in ("noop", "weir-kafka"):
                times = []
                for _ in range(args.writes):
                    began = time.monotonic()
                    write = rows.write.format(sink).mode("append")
                    if sink == "weir-kafka":
                        write = write.option("kafka.bootstrap.servers", broker.bootstrap)
                    write.save()
                    times.append(time.monotonic() - began)
                took[sink] = statistics.median(times[1:])
            extra = took["weir-kafka"] - took["noop"]
            ratio = took["weir-kafka"] / took["noop"]
            table.add_row(f"{n:,}", f"{took['noop']:.3f}", f"{took['weir-kafka']:.3f}", f"{extra:.3f}", f"{ratio:.2f}x")
        console.print(table)
        console.print(f"load average {os.getloadavg()} on {os.cpu_count()} cores")
        spark.stop()
    finally:
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
