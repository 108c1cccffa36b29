"""bench/latency.py's stateless processor as a weir pipeline, for `weir run bench/latency/weir_latency.py:latency`:
parse, keep amount > 10, write {id, user, amount, ts} to LAT_OUTPUT. LAT_INPUT and LAT_OUTPUT name the topics.
`latency_realtime` is the same job declared `realtime=True` (Spark's real-time mode, weir.runtime.realtime), for the
`weir-rt` system; LAT_REALTIME_S, when set, declares `realtime=timedelta(seconds=LAT_REALTIME_S)` instead (a bench
variant: how the checkpoint interval moves the tail). `windows` is --window's job: a 10 s tumbling window per user
(count, sum of amount), watermark 2 s."""

from __future__ import annotations

import os
from datetime import timedelta

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from weir.blocks.window import tumbling_window
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


latency_realtime = Pipeline("latency_realtime")
_rt_events = latency_realtime.topic(
    INPUT, "id BIGINT, user STRING, amount DOUBLE, ts BIGINT, note STRING", key="user", partitions=4
)
_rt_out = latency_realtime.topic(OUTPUT, "id BIGINT, user STRING, amount DOUBLE, ts BIGINT", key="user", partitions=4)
_every = os.environ.get("LAT_REALTIME_S")


@latency_realtime.processor(inputs=[_rt_events], outputs=[_rt_out], name="keep",
                            realtime=timedelta(seconds=float(_every)) if _every else True)  # fmt: skip
def keep_realtime(events: DataFrame) -> DataFrame:
    return events.where(F.col("amount") > KEEP_ABOVE)


windows = Pipeline("latency_windows")
_w_events = windows.topic(
    INPUT, "id BIGINT, user STRING NOT NULL, amount DOUBLE, ts BIGINT, note STRING", key="user", partitions=4
)
_w_out = windows.topic(
    OUTPUT, "user STRING, window_start TIMESTAMP, window_end TIMESTAMP, count BIGINT, sum DOUBLE", key="user",
    partitions=4,
)  # fmt: skip


@windows.processor(inputs=[_w_events], outputs=[_w_out], stateful=True, name="window")
def window(events: DataFrame) -> DataFrame:
    timed = events.withColumn("event_time", F.timestamp_millis("ts"))
    return tumbling_window(timed, "user", "event_time", "10 seconds", "2 seconds",
                           {"count": ("count", "*"), "sum": ("sum", "amount")})  # fmt: skip
