"""The shop pipeline: synthetic orders, a customers table and page views, enriched, windowed and alerted on.

    generate ──► orders, customers (table), page_views
    enrich(orders, customers) ──► orders.enriched          stream-table join, stateful
    attribute(orders, page_views) ──► orders.attributed    stream-stream join: the pages the customer viewed
                                                           in the 10 s before an order (event time), stateful
    revenue(orders.enriched) ──► revenue.by_category_1m    1-minute tumbling windows per category, stateful
    spend(orders.enriched) ──► spend.by_customer_5m        5-minute tumbling windows per customer, stateful;
                                                           a late order within 2 minutes of a window's end
                                                           updates it (allowed lateness: its next revision)
    lifetime(orders.enriched) ──► customers.lifetime       every customer's totals so far, a running aggregate
    watch(orders.enriched) ──► customers.signals           a rule of one's own with keyed state and a timer
                                                           (@stateful, in event-time order across batches): an
                                                           order over twice the customer's recent average, a
                                                           customer gone quiet
    alert(spend.by_customer_5m) ──► alerts                 stateless: windows whose spend tops the threshold
    spend_lake(spend.by_customer_5m) ──► a Delta table     a sink that upserts each window by (customer_id,
                                                           window_start): one row per window, its last revision
    view revenue_by_category (revenue.by_category_1m)      the latest closed minute per category, by key:
                                                           served by `weir serve` (docs/views.md)

Event time is `ts_ms`, epoch milliseconds as BIGINT: exact in JSON, and a wrong type is easy to spot; the
windows turn it into a TIMESTAMP. Both windows wait 30 seconds of event time for stragglers; the generator
makes about 2% of orders minutes late, which the windows route to `orders.enriched.late`.

`shop` below is built from SHOP_RATE (records/s, default 1000), SHOP_SEED (default 7), SHOP_TOTAL (default
unbounded) and SHOP_SPEND_TABLE (spend_lake's table; no spend_lake without it); `build()` makes other variants (the
demo, the tests, the bench).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import weir
from examples.shop.generator import ShopSource
from examples.shop.records import Shape, default_threshold
from weir.blocks.join import join_table
from weir.blocks.keyed import ListOf, Value, stateful
from weir.blocks.running import running_aggregate
from weir.blocks.streamjoin import join_streams
from weir.blocks.window import tumbling_window
from weir.formats import ERROR_COLUMN
from weir.formats.ddl import parse_fields
from weir.pipeline import Pipeline
from weir.sinks import DeltaSink

ORDERS = "order_id STRING NOT NULL, customer_id STRING NOT NULL, category STRING, amount DOUBLE, ts_ms BIGINT"
CUSTOMERS = "customer_id STRING NOT NULL, name STRING, segment STRING, country STRING"
PAGE_VIEWS = "view_id STRING NOT NULL, customer_id STRING NOT NULL, url STRING, ts_ms BIGINT"
CUSTOMER_FIELDS = ["name", "segment", "country"]
ENRICHED = ORDERS + ", " + ", ".join(f"{c} STRING" for c in CUSTOMER_FIELDS)
WINDOW = "window_start TIMESTAMP, window_end TIMESTAMP, orders BIGINT"
REVENUE = f"category STRING, {WINDOW}, revenue DOUBLE, avg_order DOUBLE, p95_order DOUBLE, buyers BIGINT"
SPEND = f"customer_id STRING NOT NULL, {WINDOW}, spend DOUBLE, revision BIGINT"
SPEND_LATENESS = "2 minutes"  # of event time after a spend window's end: a late order still updates it
LIFETIME = (
    "customer_id STRING NOT NULL, revision BIGINT, orders BIGINT, spend DOUBLE, avg_order DOUBLE, last_category STRING"
)
ATTRIBUTED = (
    "order_id STRING NOT NULL, customer_id STRING NOT NULL, amount DOUBLE, view_id STRING, url STRING, viewed_ms BIGINT"
)
VIEWED_BEFORE = "10 seconds"  # of event time before an order: the page views it is attributed to
SIGNALS = "customer_id STRING NOT NULL, rule STRING, amount DOUBLE, at TIMESTAMP"
QUIET_AFTER = timedelta(minutes=2)  # of event time without an order: the customer has gone quiet
ALERTS = "customer_id STRING NOT NULL, window_start TIMESTAMP, window_end TIMESTAMP, spend DOUBLE, threshold DOUBLE"
BIG_ORDERS = "order_id STRING NOT NULL, customer_id STRING NOT NULL, name STRING, segment STRING, amount DOUBLE"
BIG_ORDER = 190.0  # an order amount at or above which a big spender's order is alerted at once (about 2.6%)
WATERMARK = "30 seconds"
KAFKA_KEEP = ("key", "value", "topic", "partition", "offset", "timestamp")


def generated(spark: SparkSession, options: dict[str, str]) -> DataFrame:
    """The generator's stream (see generator.py for the options)."""
    spark.dataSource.register(ShopSource)
    reader = spark.readStream.format("shop-generator")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _fields(df: DataFrame, schema: str) -> DataFrame:
    """The topic's fields and the Kafka columns that routing and the join use. Headers and timestampType are
    left behind: every column crosses into the join's Python state code, and those cost without use."""
    names = [f.name for f in parse_fields(schema)]
    keep = [c for c in (*names, *KAFKA_KEEP, ERROR_COLUMN) if c in df.columns]
    return df.select(*keep)


def enriched(orders: DataFrame, customers: DataFrame) -> DataFrame:
    """Each order with its customer's name, segment and country as of the order (null when unknown)."""
    return join_table(
        _fields(orders, ORDERS), _fields(customers, CUSTOMERS), key="customer_id", how="left",
        table_columns=CUSTOMER_FIELDS, table_name="customers",
    )  # fmt: skip


def attributed(orders: DataFrame, views: DataFrame) -> DataFrame:
    """Each order with every page its customer viewed in the VIEWED_BEFORE (event time) before it, one row per view;
    an order without one once, with null view columns, when no view can come any more (docs/blocks.md,
    "Stream-stream join"). Records behind the watermark go to orders.late and page_views.late with the reason."""
    o = _fields(orders, ORDERS).withColumn("ordered", F.timestamp_millis("ts_ms"))
    v = _fields(views, PAGE_VIEWS).withColumnRenamed("ts_ms", "viewed_ms")
    return join_streams(
        o, v.withColumn("viewed_at", F.timestamp_millis("viewed_ms")), key="customer_id",
        event_time=("ordered", "viewed_at"), watermark=WATERMARK, before=VIEWED_BEFORE, how="left",
        right_columns=["view_id", "url", "viewed_ms"],
    )  # fmt: skip


def _windows(
    orders: DataFrame, key: str, size: str, total: str, allowed_lateness: str | None = None, **more: tuple
) -> DataFrame:
    """Count and amount sum (and `more` aggregates) per `key` and tumbling window; the output keeps the routing
    columns."""
    with_time = orders.withColumn("event_time", F.timestamp_millis("ts_ms"))
    aggregates = {"orders": ("count", "*"), total: ("sum", "amount"), **more}
    return tumbling_window(
        with_time, key=key, event_time="event_time", size=size, watermark=WATERMARK, aggregates=aggregates,
        allowed_lateness=allowed_lateness,
    )  # fmt: skip


def revenue_by_category(orders: DataFrame) -> DataFrame:
    """Per category and minute: orders, revenue, the average order, the 95th percentile of an order's amount (a
    KLL sketch) and the distinct buyers (a HyperLogLog sketch): docs/blocks.md, "Aggregates"."""
    return _windows(
        orders, "category", "1 minute", "revenue", avg_order=("avg", "amount"),
        p95_order=("percentile", "amount", 0.95), buyers=("approx_count_distinct", "customer_id"),
    )  # fmt: skip


def spend_by_customer(orders: DataFrame) -> DataFrame:
    return _windows(orders, "customer_id", "5 minutes", "spend", allowed_lateness=SPEND_LATENESS)


def lifetime_totals(orders: DataFrame) -> DataFrame:
    """Every customer's orders, spend, average order and latest category so far, updated by each micro-batch that
    brings their orders, with its revision (docs/blocks.md, "Running aggregate")."""
    with_time = orders.withColumn("event_time", F.timestamp_millis("ts_ms"))
    aggregates = {
        "orders": ("count", "*"), "spend": ("sum", "amount"), "avg_order": ("avg", "amount"),
        "last_category": ("last", "category"),
    }  # fmt: skip
    return running_aggregate(with_time, "customer_id", aggregates, event_time="event_time")


@stateful(
    key="customer_id", event_time="event_time", watermark=WATERMARK, ttl=timedelta(hours=1), order="event_time",
    output="rule STRING, amount DOUBLE, at TIMESTAMP",
    state={"recent": ListOf("double", keep=5), "orders": Value("bigint")},
)  # fmt: skip
def signals(customer_id: str, records: list[dict], state, timers):
    """Per customer, in event-time order across micro-batches (`order="event_time"`: a customer's orders are held
    until the watermark passes them, so "the last 5" are the 5 placed before, whatever batch brought them): an
    order over twice the average of their last 5 is a spike; a customer with no order for QUIET_AFTER of event
    time after their latest has gone quiet (a timer, moved by each order). State: the last 5 amounts and the order
    count, cleared an hour after the last order."""
    for r in records:
        amount = r["amount"]
        if amount is None:
            continue
        recent = state.recent.items()
        if len(recent) == 5 and amount > 2 * sum(recent) / 5:
            yield {"rule": "spike: over twice the average of the last 5", "amount": amount, "at": r["event_time"]}
        state.recent.append(amount)
        state.orders.value = (state.orders.value or 0) + 1
    timers.clear()
    timers.set(records[-1]["event_time"] + QUIET_AFTER)


@signals.on_timer
def quiet(customer_id: str, at, state, timers):
    yield {"rule": f"quiet: no order for {QUIET_AFTER} after {state.orders.value or 0} orders", "at": at}


def customer_signals(orders: DataFrame) -> DataFrame:
    """The signals of every customer's orders (`signals`), their event time from `ts_ms`."""
    return signals(orders.withColumn("event_time", F.timestamp_millis("ts_ms")))


def over_threshold(spend: DataFrame, threshold: float) -> DataFrame:
    """Windows whose spend tops the threshold. The input's Kafka columns stay, so each alert names its
    source record; the rest of the batch is counted as filtered."""
    return spend.where(F.col("spend") > threshold).withColumn("threshold", F.lit(float(threshold)))


def big_orders(orders: DataFrame) -> DataFrame:
    """Enriched orders of BIG_ORDER or more, with who placed them: a projection and a filter, which Spark's
    real-time mode streams through in milliseconds (docs/realtime.md)."""
    return orders.where(F.col("amount") >= BIG_ORDER).select("order_id", "customer_id", "name", "segment", "amount")


def build(
    rate: float = 1000.0,
    seed: int = 7,
    total: int | None = None,
    threshold: float | None = None,
    *,
    event_rate: float | None = None,
    customers: int = 1000,
    max_records_per_trigger: int | None = None,
    start_ms: int | None = None,
    archive: bool = True,
    from_outside: tuple[str, ...] = (),
    avro_alerts: bool = False,
    enrich_code: Callable[[DataFrame, DataFrame], DataFrame] | None = None,
    spend_table: str | None = None,
) -> Pipeline:
    """The shop pipeline with a generator of `rate` records/s (0: as fast as possible, with `total` and
    `event_rate`), `seed`, an optional `total`, and the spend alert's `threshold` (default: 5x the average
    customer's spend per 5-minute window, from the event rate). `start_ms` fixes the stream's start (its
    event-time origin) for tests; by default it is the wall clock when the stream first runs. The
    generator leaves the outputs named in `from_outside` to other producers: orders over HTTP through `weir
    ingest http` (examples/shop/orders_http.py), customers from PostgreSQL through `weir ingest postgres`
    (examples/shop/customers_pg.py). With `avro_alerts`, alerts are Avro records in the Confluent wire format
    (alerts.avsc, keys alert_key.avsc, registered in the settings' schema registry; docs/formats.md), as other
    teams consume them. `enrich_code` replaces `enrich`'s function: another release of it (examples/shop/release.py).
    With `spend_table` (a path or URL), the `spend_lake` sink keeps the spend windows in that Delta table, one row
    per customer and window: a late order's update replaces the window's row (an upsert by key)."""
    if rate == 0 and event_rate is None:
        event_rate = 1000.0  # no wall clock to follow: one event-time second per thousand records
    shape = Shape(seed, 0, event_rate or rate, customers)
    limit = threshold if threshold is not None else default_threshold(shape)
    options = {"rate": str(rate), "seed": str(seed), "customers": str(customers)}
    per_trigger = max_records_per_trigger
    extra = {"total": total, "eventRate": event_rate, "maxRecordsPerTrigger": per_trigger, "startMs": start_ms}
    for name, value in extra.items():
        if value is not None:
            options[name] = str(value)

    shop = Pipeline("shop")
    # Orders are archived to the lake: a backfill can replay any hour of them through fixed code.
    orders = shop.topic("orders", ORDERS, key="order_id", partitions=4, archived=archive)
    customer_table = shop.table("customers", CUSTOMERS, key="customer_id", partitions=2)
    page_views = shop.topic("page_views", PAGE_VIEWS, key="customer_id", partitions=4)
    enriched_orders = shop.topic("orders.enriched", ENRICHED, key="order_id", partitions=4)
    attributed_orders = shop.topic("orders.attributed", ATTRIBUTED, key="order_id", partitions=2)
    revenue_1m = shop.topic("revenue.by_category_1m", REVENUE, key="category", partitions=2)
    spend_5m = shop.topic("spend.by_customer_5m", SPEND, key="customer_id", partitions=2)
    lifetime_totals_topic = shop.topic("customers.lifetime", LIFETIME, key="customer_id", partitions=2)
    signals_topic = shop.topic("customers.signals", SIGNALS, key="customer_id", partitions=2)
    big_orders_topic = shop.topic("alerts.big_orders", BIG_ORDERS, key="customer_id", partitions=1)
    if avro_alerts:
        avro = weir.avro(Path(__file__).with_name("alerts.avsc"), registry=True)
        avro_key = weir.avro(Path(__file__).with_name("alert_key.avsc"), registry=True)  # keys as Avro records too
        alerts = shop.topic("alerts", key="customer_id", partitions=1, format=avro, key_format=avro_key)
    else:
        alerts = shop.topic("alerts", ALERTS, key="customer_id", partitions=1)

    generated_outputs = [t for t in (orders, customer_table, page_views) if t.name not in from_outside]
    if from_outside:
        options["skip"] = ",".join(from_outside)

    if "orders" in from_outside:
        shop.http_source(orders)  # served by `weir ingest http`, its own process (the demo starts it)

    @shop.processor(outputs=generated_outputs)
    def generate(spark: SparkSession) -> DataFrame:
        return generated(spark, options)

    if enrich_code is not None:
        shop.processor(inputs=[orders, customer_table], outputs=[enriched_orders], stateful=True, name="enrich")(
            enrich_code
        )
    else:

        @shop.processor(inputs=[orders, customer_table], outputs=[enriched_orders], stateful=True)
        def enrich(orders: DataFrame, customers: DataFrame) -> DataFrame:
            return enriched(orders, customers)

    @shop.processor(inputs=[orders, page_views], outputs=[attributed_orders], stateful=True)
    def attribute(orders: DataFrame, views: DataFrame) -> DataFrame:
        return attributed(orders, views)

    @shop.processor(inputs=[enriched_orders], outputs=[revenue_1m], stateful=True)
    def revenue(orders: DataFrame) -> DataFrame:
        return revenue_by_category(orders)

    @shop.processor(inputs=[enriched_orders], outputs=[spend_5m], stateful=True)
    def spend(orders: DataFrame) -> DataFrame:
        return spend_by_customer(orders)

    @shop.processor(inputs=[enriched_orders], outputs=[lifetime_totals_topic], stateful=True)
    def lifetime(orders: DataFrame) -> DataFrame:
        return lifetime_totals(orders)

    @shop.processor(inputs=[enriched_orders], outputs=[signals_topic], stateful=True)
    def watch(orders: DataFrame) -> DataFrame:
        return customer_signals(orders)

    @shop.processor(inputs=[spend_5m], outputs=[alerts])
    def alert(spend: DataFrame) -> DataFrame:
        return over_threshold(spend, limit)

    # Big spenders' orders, alerted as they are enriched: Spark's real-time mode, checkpointing (and publishing its
    # books) every 10 s, so that a short demo shows several
    @shop.processor(inputs=[enriched_orders], outputs=[big_orders_topic], realtime=timedelta(seconds=10))
    def big_order(orders: DataFrame) -> DataFrame:
        return big_orders(orders)

    if spend_table is not None:

        @shop.processor(inputs=[spend_5m], sink=DeltaSink(spend_table, key=["customer_id", "window_start"]))
        def spend_lake(spend: DataFrame) -> DataFrame:
            return spend.select("customer_id", "window_start", "window_end", "orders", "spend", "revision")

    # Each closed window upserts its category's row: the view holds the latest closed minute per category, in
    # the embedded SQLite store unless views_dsn names a database.
    shop.view("revenue_by_category", source=revenue_1m, key="category")
    return shop


def _env_number(name: str, kind: type, default):
    text = os.environ.get(name, "").strip()
    return kind(text) if text else default


shop = build(
    rate=_env_number("SHOP_RATE", float, 1000.0),
    seed=_env_number("SHOP_SEED", int, 7),
    total=_env_number("SHOP_TOTAL", int, None),
    spend_table=os.environ.get("SHOP_SPEND_TABLE") or None,
)
