"""bench/latency.py's stateless processor as a weir pipeline, for `weir run bench/latency/weir_latency.py:latency`:
parse, keep amount > 10, write {id, user, amount, ts} to LAT_OUTPUT. LAT_INPUT and LAT_OUTPUT name the topics."""

from __future__ import annotations

import os

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from weir.pipeline import Pipeline

INPUT = os.environ.get("LAT_INPUT", "latency.in")
OUTPUT = os.environ.get("LAT_OUTPUT", "latency.out")
KEEP_ABOVE = 10.0

latency = Pipeline("latency")
_events = latency.topic(
    INPUT, "id BIGINT, user STRING, amount DOUBLE, ts BIGINT, note STRING", key="user", partitions=4
)
_out = latency.topic(OUTPUT, "id BIGINT, user STRING, amount DOUBLE, ts BIGINT", key="user", partitions=4)


@latency.processor(inputs=[_events], outputs=[_out], name="keep")
def keep(events: DataFrame) -> DataFrame:
    return events.where(F.col("amount") > KEEP_ABOVE)
