"""Nexmark's q0, q1, q2, q5, q7 and q8 as weir pipelines, one per query, for
`weir run bench/nexmark/weir_queries.py:<query> --once` (bench/nexmark.py runs them).

Inputs are the topics person, auction and bid (bench/nexmark/nexmark_gen.py's events as JSON, `dateTime` in
epoch ms); each query writes to nexmark.weir.<query>. Event time is `dateTime`, with Nexmark's watermark of
4 s (the nexmark/nexmark DDL: `WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND`).

    q0  pass-through: every bid's auction, bidder, price, dateTime, extra             (stateless)
    q1  currency conversion: the same with price * 908 DIV 1000, integer cents        (stateless)
    q2  selection: auction, price of the bids whose auction % 123 = 0                 (stateless)
    q5  hot items: per sliding window of 10 s every 2 s, the auction(s) with the most bids
          counts   sliding_window per auction, count(*)           -> nexmark.weir.q5.counts
          hottest  @stateful per window: the counts' maximum and the auctions that reach it, emitted when the
                   window's end passes (a watermark of HOT_DELAY over the windows' ends) -> nexmark.weir.q5
    q7  highest bid: per tumbling 10 s window, the bid(s) whose price is the window's maximum (@stateful per
        window: the best price so far and its bids, emitted when the watermark passes the window's end)
    q8  new users: persons and the auctions they opened as seller in the same tumbling 10 s window; one row
        (id, name, starttime) per person and window (@stateful per person and window over persons and auctions
        together, a row once both are seen; a timer at the window's end clears the key)

Why @stateful for q5's second step, q7 and q8: each asks a question of a whole window across keys (the
maximum over all auctions or bids of a window) or of two streams at once, and weir's window blocks aggregate
per key into a fixed set of aggregates; a stateful result must carry `_route` (a plain groupBy().agg() is
refused), so weir's own keyed-state block is the way to express them. Windows start at multiples of their
slide since the epoch, as Spark's and Flink's.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from weir.blocks.keyed import ListOf, Value, stateful
from weir.blocks.window import sliding_window
from weir.pipeline import Pipeline

PERSON = ("id BIGINT, name STRING, emailAddress STRING, creditCard STRING, city STRING, state STRING, "
          "dateTime BIGINT, extra STRING")  # fmt: skip
AUCTION = ("id BIGINT, itemName STRING, description STRING, initialBid BIGINT, reserve BIGINT, dateTime BIGINT, "
           "expires BIGINT, seller BIGINT, category BIGINT, extra STRING")  # fmt: skip
BID = "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, dateTime BIGINT, extra STRING"
PASSED = "auction BIGINT, bidder BIGINT, price BIGINT, dateTime BIGINT, extra STRING"
WATERMARK = "4 seconds"
SIZE_MS, SLIDE_MS = 10_000, 2_000  # q5's sliding windows; q7's and q8's tumbling windows are SIZE_MS too
# q5's second step reads the first step's windows; its watermark runs over their ends. The first step writes the
# windows one micro-batch closes together, and their ends span what that batch's watermark moved: the delay
# must cover it, or windows of a batch split across the second step's batches would come late.
HOT_DELAY = "10 seconds"
KAFKA = ["key", "value", "topic", "partition", "offset", "_error"]
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _pipeline(query: str, schema: str, key: str) -> tuple[Pipeline, object, object, object, object]:
    p = Pipeline(f"nexmark_{query}")
    person = p.topic("person", PERSON, key="id", partitions=4, retention=-1)
    auction = p.topic("auction", AUCTION, key="id", partitions=4, retention=-1)
    bid = p.topic("bid", BID, key="auction", partitions=4, retention=-1)
    out = p.topic(f"nexmark.weir.{query}", schema, key=key, partitions=4, retention=-1)
    return p, person, auction, bid, out


def _timed(stream: DataFrame) -> DataFrame:
    return stream.withColumn("event_time", F.timestamp_millis("dateTime"))


def _kafka(stream: DataFrame) -> list[str]:
    return [c for c in KAFKA if c in stream.columns]


def _ms(at: datetime) -> int:
    return (at - EPOCH) // timedelta(milliseconds=1)


# ---------------------------------------------------------------- q0, q1, q2: stateless

q0, _person, _auction, _bid, _out = _pipeline("q0", PASSED, "auction")


@q0.processor(inputs=[_bid], outputs=[_out], name="passthrough")
def passthrough(bids: DataFrame) -> DataFrame:
    return bids.select("auction", "bidder", "price", "dateTime", "extra")


q1, _person, _auction, _bid, _out = _pipeline("q1", PASSED, "auction")


@q1.processor(inputs=[_bid], outputs=[_out], name="euros")
def euros(bids: DataFrame) -> DataFrame:
    # Cents times 0.908, rounded down, in integers: the same in DuckDB, Spark and Python, whatever the order.
    return bids.select("auction", "bidder", F.expr("price * 908 div 1000").alias("price"), "dateTime", "extra")


q2, _person, _auction, _bid, _out = _pipeline("q2", "auction BIGINT, price BIGINT", "auction")


@q2.processor(inputs=[_bid], outputs=[_out], name="selection")
def selection(bids: DataFrame) -> DataFrame:
    return bids.where(F.col("auction") % 123 == 0).select("auction", "price")


# ---------------------------------------------------------------- q5: hot items

q5, _person, _auction, _bid, _out = _pipeline("q5", "starttime BIGINT, auction BIGINT, num BIGINT", "starttime")
_counts = q5.topic("nexmark.weir.q5.counts", "auction BIGINT, window_start TIMESTAMP, window_end TIMESTAMP, num BIGINT",
                   key="auction", partitions=4, retention=-1)  # fmt: skip


@q5.processor(inputs=[_bid], outputs=[_counts], stateful=True, name="counts")
def counts(bids: DataFrame) -> DataFrame:
    timed = _timed(bids.select("auction", "dateTime", *_kafka(bids)))
    windows = sliding_window(timed, "auction", "event_time", "10 seconds", "2 seconds", WATERMARK,
                             {"num": ("count", "*")})  # fmt: skip
    # Each window's record stamped with its end, so that each task writes them in window order (the runner
    # writes a task's records oldest first) and the next step's watermark advances with them.
    return windows.withColumn("timestamp", F.col("window_end"))


@stateful(key="starttime", event_time="window_end", watermark=HOT_DELAY, output="auction BIGINT, num BIGINT",
          state={"best": Value("bigint"), "auctions": ListOf("bigint")})  # fmt: skip
def hottest(starttime: int, records: list[dict], state, timers):
    """Per window: the largest count and the auctions that have it; the window's rows when its end passes."""
    best = state.best.value
    tied = state.auctions.items()
    for r in records:
        if best is None or r["num"] > best:
            best, tied = r["num"], [r["auction"]]
        elif r["num"] == best:
            tied.append(r["auction"])
    state.best.set(best)
    state.auctions.set(tied)
    if not timers.pending():
        timers.set(records[0]["window_end"])
    return ()


@hottest.on_timer
def hottest_closed(starttime: int, at: datetime, state, timers):
    for auction in state.auctions.items():
        yield {"auction": auction, "num": state.best.value}
    state.clear()


@q5.processor(inputs=[_counts], outputs=[_out], stateful=True, name="hottest")
def hottest_proc(windows: DataFrame) -> DataFrame:
    keyed = windows.select(F.unix_millis("window_start").alias("starttime"), "window_end", "auction", "num",
                           *_kafka(windows))  # fmt: skip
    return hottest(keyed)


# ---------------------------------------------------------------- q7: highest bid

q7, _person, _auction, _bid, _out = _pipeline("q7", f"starttime BIGINT, {PASSED}", "starttime")


@stateful(key="starttime", event_time="event_time", watermark=WATERMARK, output=PASSED,
          state={"best": Value("bigint"), "bids": ListOf("json")})  # fmt: skip
def highest(starttime: int, records: list[dict], state, timers):
    """Per tumbling window: the best price so far and its bids; them all when the window's end passes."""
    best = state.best.value
    bids = state.bids.items()
    for r in records:
        price = r["price"]
        if best is None or price >= best:
            bid = [r["auction"], r["bidder"], price, r["dateTime"], r["extra"]]
            if best is None or price > best:
                best, bids = price, [bid]
            else:
                bids.append(bid)
    state.best.set(best)
    state.bids.set(bids)
    if not timers.pending():
        timers.set(EPOCH + timedelta(milliseconds=starttime + SIZE_MS))
    return ()


@highest.on_timer
def highest_closed(starttime: int, at: datetime, state, timers):
    for auction, bidder, price, at_ms, extra in state.bids.items():
        yield {"auction": auction, "bidder": bidder, "price": price, "dateTime": at_ms, "extra": extra}
    state.clear()


@q7.processor(inputs=[_bid], outputs=[_out], stateful=True, name="highest")
def highest_proc(bids: DataFrame) -> DataFrame:
    start = F.col("dateTime") - F.col("dateTime") % SIZE_MS
    keyed = _timed(bids.select(start.alias("starttime"), "auction", "bidder", "price", "dateTime", "extra",
                               *_kafka(bids)))  # fmt: skip
    return highest(keyed)


# ---------------------------------------------------------------- q8: new users

q8, _person, _auction, _bid, _out = _pipeline("q8", "id BIGINT, name STRING, starttime BIGINT", "id")


@stateful(key="member", event_time="event_time", watermark=WATERMARK, output="id BIGINT, name STRING, starttime BIGINT",
          state={"name": Value("string"), "person": Value("boolean"), "sold": Value("boolean"),
                 "done": Value("boolean")})  # fmt: skip
def new_users(member: str, records: list[dict], state, timers):
    """Per (person id, window): once the person's own event and an auction they sell are both seen, one row."""
    for r in records:
        if r["kind"] == "person":
            state.person.set(True)
            state.name.set(r["name"])
        else:
            state.sold.set(True)
    if state.person.value and state.sold.value and not state.done.value:
        state.done.set(True)
        person_id, start = (int(x) for x in member.split("@"))
        yield {"id": person_id, "name": state.name.value, "starttime": start}
    if not timers.pending():  # the key is done with once its window closed: no on-time record can reach it
        start = int(member.split("@")[1])
        timers.set(EPOCH + timedelta(milliseconds=start + SIZE_MS))


@new_users.on_timer
def new_users_closed(member: str, at: datetime, state, timers):
    state.clear()
    return ()


@q8.processor(inputs=[_person, _auction], outputs=[_out], stateful=True, name="new_users")
def new_users_proc(persons: DataFrame, auctions: DataFrame) -> DataFrame:
    def side(stream: DataFrame, who: str, kind: str, name: F.Column) -> DataFrame:
        start = F.col("dateTime") - F.col("dateTime") % SIZE_MS
        member = F.concat_ws("@", F.col(who).cast("string"), start.cast("string"))
        return _timed(stream.select(member.alias("member"), F.lit(kind).alias("kind"), name.alias("name"),
                                    "dateTime", *_kafka(stream)))  # fmt: skip

    people = side(persons, "id", "person", F.col("name"))
    sellers = side(auctions, "seller", "auction", F.lit(None).cast("string"))
    return new_users(people.unionByName(sellers))
