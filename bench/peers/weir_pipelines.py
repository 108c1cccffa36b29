"""The peer workload as weir pipelines, one per block, for `weir run bench/peers/weir_pipelines.py:<name> --once`.

    tumbling   10 s tumbling window per user (count, sum of amount), watermark 2 s   -> peers.weir.tumbling
    sliding    1 min windows every 10 s, same aggregates                            -> peers.weir.sliding
    session    sessions with a 30 s gap, same aggregates                            -> peers.weir.session
    sketched   10 s tumbling window per user: avg and p95 of amount (a KLL sketch)   -> peers.weir.sketched
    lateness   the tumbling window with 30 s of allowed lateness                     -> peers.weir.lateness
    running    running aggregate per user (count, sum, avg of amount), no window    -> peers.weir.running
    dedup      deduplicate on id (horizon 1 min)                                    -> peers.weir.dedup
    join       events left-joined with the 100k-key changelog table peers.users   -> peers.weir.join
    streamjoin events left-joined with their payment (peers.payments) within 5 min -> peers.weir.streamjoin
    keyed      @stateful per user: an amount over twice the average of the last 10  -> peers.weir.keyed
    stateless  filter amount > 50, map (doubled amount)                             -> peers.weir.stateless

PEER_INPUT names the input topic (default events); its records are bench/peers.py's events. PEER_SUFFIX, if set,
ends every output topic's name (a second run of a pipeline with its own output).
"""

from __future__ import annotations

import os

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from weir.blocks.dedup import deduplicate
from weir.blocks.join import join_table
from weir.blocks.keyed import ListOf, stateful
from weir.blocks.running import running_aggregate
from weir.blocks.sessions import session_window
from weir.blocks.streamjoin import join_streams
from weir.blocks.window import sliding_window, tumbling_window
from weir.formats import ERROR_COLUMN
from weir.pipeline import Pipeline

INPUT = os.environ.get("PEER_INPUT", "events")
SUFFIX = os.environ.get("PEER_SUFFIX", "")
EVENTS = "id BIGINT, user STRING NOT NULL, amount DOUBLE, ts BIGINT, item STRING, country STRING, note STRING"
USERS = "user STRING NOT NULL, segment STRING, region STRING"
WINDOWS = "user STRING, window_start TIMESTAMP, window_end TIMESTAMP, count BIGINT, sum DOUBLE"
REVISED = WINDOWS + ", revision BIGINT"
SKETCHED = "user STRING, window_start TIMESTAMP, window_end TIMESTAMP, avg DOUBLE, p95 DOUBLE"
RUNNING = "user STRING, revision BIGINT, count BIGINT, sum DOUBLE, avg DOUBLE"
STATELESS = "id BIGINT, user STRING, amount DOUBLE, ts BIGINT, doubled DOUBLE"
JOINED = EVENTS + ", segment STRING, region STRING"
PAYMENTS = "id BIGINT, method STRING, paid_ms BIGINT"
PAID = "id BIGINT, user STRING, amount DOUBLE, method STRING, paid_ms BIGINT"
SPIKES = "user STRING, amount DOUBLE, avg10 DOUBLE"
WATERMARK = "2 seconds"
AGGREGATES = {"count": ("count", "*"), "sum": ("sum", "amount")}
EVENTS_FIELDS = ["id", "user", "amount", "ts", "item", "country", "note"]
KAFKA = ["key", "value", "topic", "partition", "offset", "timestamp"]


def _timed(events: DataFrame) -> DataFrame:
    return events.withColumn("event_time", F.timestamp_millis("ts"))


def _pipeline(name: str) -> tuple[Pipeline, object, object]:
    p = Pipeline(f"peers_{name}")
    events = p.topic(INPUT, EVENTS, key="user", partitions=4, retention=-1)
    schema = {"dedup": EVENTS, "join": JOINED, "stateless": STATELESS, "sketched": SKETCHED, "running": RUNNING,
              "streamjoin": PAID, "keyed": SPIKES, "lateness": REVISED}  # fmt: skip
    schema = schema.get(name, WINDOWS)
    out = p.topic(f"peers.weir.{name}{SUFFIX}", schema, key="user", partitions=4, retention=-1)
    return p, events, out


tumbling, _events, _out = _pipeline("tumbling")


@tumbling.processor(inputs=[_events], outputs=[_out], stateful=True, name="window")
def tumbling_proc(events: DataFrame) -> DataFrame:
    return tumbling_window(_timed(events), "user", "event_time", "10 seconds", WATERMARK, AGGREGATES)


sliding, _events, _out = _pipeline("sliding")


@sliding.processor(inputs=[_events], outputs=[_out], stateful=True, name="window")
def sliding_proc(events: DataFrame) -> DataFrame:
    return sliding_window(_timed(events), "user", "event_time", "1 minute", "10 seconds", WATERMARK, AGGREGATES)


session, _events, _out = _pipeline("session")


@session.processor(inputs=[_events], outputs=[_out], stateful=True, name="window")
def session_proc(events: DataFrame) -> DataFrame:
    return session_window(_timed(events), "user", "event_time", "30 seconds", WATERMARK, AGGREGATES)


sketched, _events, _out = _pipeline("sketched")


@sketched.processor(inputs=[_events], outputs=[_out], stateful=True, name="window")
def sketched_proc(events: DataFrame) -> DataFrame:
    aggregates = {"avg": ("avg", "amount"), "p95": ("percentile", "amount", 0.95)}
    return tumbling_window(_timed(events), "user", "event_time", "10 seconds", WATERMARK, aggregates)


lateness, _events, _out = _pipeline("lateness")


@lateness.processor(inputs=[_events], outputs=[_out], stateful=True, name="window")
def lateness_proc(events: DataFrame) -> DataFrame:
    return tumbling_window(
        _timed(events), "user", "event_time", "10 seconds", WATERMARK, AGGREGATES, allowed_lateness="30 seconds"
    )


running, _events, _out = _pipeline("running")


@running.processor(inputs=[_events], outputs=[_out], stateful=True, name="running")
def running_proc(events: DataFrame) -> DataFrame:
    return running_aggregate(events, "user", {**AGGREGATES, "avg": ("avg", "amount")})


dedup, _events, _out = _pipeline("dedup")


@dedup.processor(inputs=[_events], outputs=[_out], stateful=True, name="dedup")
def dedup_proc(events: DataFrame) -> DataFrame:
    return deduplicate(_timed(events), "id", "event_time", "1 minute", WATERMARK).drop("event_time")


join, _events, _out = _pipeline("join")
_users = join.table("peers.users", USERS, key="user", partitions=4)


@join.processor(inputs=[_events, _users], outputs=[_out], stateful=True, name="join")
def join_proc(events: DataFrame, users: DataFrame) -> DataFrame:
    keep = [c for c in (*EVENTS_FIELDS, *KAFKA, ERROR_COLUMN) if c in events.columns]
    return join_table(
        events.select(*keep), users, key="user", how="left", table_columns=["segment", "region"], table_name="users",
    )  # fmt: skip


streamjoin, _events, _out = _pipeline("streamjoin")
_payments = streamjoin.topic("peers.payments", PAYMENTS, key="id", partitions=4, retention=-1)


@streamjoin.processor(inputs=[_events, _payments], outputs=[_out], stateful=True, name="join")
def streamjoin_proc(events: DataFrame, payments: DataFrame) -> DataFrame:
    keep = [c for c in (*EVENTS_FIELDS, *KAFKA, ERROR_COLUMN) if c in events.columns]
    return join_streams(
        _timed(events.select(*keep)), payments.withColumn("paid_at", F.timestamp_millis("paid_ms")), key="id",
        event_time=("event_time", "paid_at"), watermark=WATERMARK, after="5 minutes", how="left",
        right_columns=["method", "paid_ms"],
    )  # fmt: skip


@stateful(key="user", event_time="event_time", watermark=WATERMARK, output="amount DOUBLE, avg10 DOUBLE",
          state={"recent": ListOf("double", keep=10)})  # fmt: skip
def last10(user: str, records: list[dict], state, timers):
    """An amount over twice the average of the user's last 10 (a fraud rule over the last 10 payments)."""
    for r in records:
        recent = state.recent.items()
        if len(recent) == 10 and r["amount"] > 2 * sum(recent) / 10:
            yield {"amount": r["amount"], "avg10": sum(recent) / 10}
        state.recent.append(r["amount"])


keyed, _events, _out = _pipeline("keyed")


@keyed.processor(inputs=[_events], outputs=[_out], stateful=True, name="rule")
def stateful_proc(events: DataFrame) -> DataFrame:
    return last10(_timed(events))


stateless, _events, _out = _pipeline("stateless")


@stateless.processor(inputs=[_events], outputs=[_out], name="filter_map")
def stateless_proc(events: DataFrame) -> DataFrame:
    return events.where(F.col("amount") > 50).withColumn("doubled", F.col("amount") * 2)
