"""Stream-table join (weir.blocks.join): as-of enrichment from a changelog kept in RocksDB keyed state, with
every input record of every micro-batch accounted for (out, filtered, absorbed into the table, or dead-lettered)."""

from __future__ import annotations

import json
from collections import Counter

import pandas as pd
import pytest
from _pipe import Rec, produce, source
from pyspark.sql import functions as F
from test_window import check_accounting, run_routed

from weir.blocks.common import bucket, bucket_count
from weir.blocks.join import join_table
from weir.kafka import Admin
from weir.pipeline.routes import ABSORB, DLQ, FILTERED, OUT

pytestmark = pytest.mark.integration

BASE_MS = 1_700_000_000_000
BIG = 2**62 + 1  # not a float64: BIGINT must cross pandas exactly
ORDERS = "order_id STRING, customer_id STRING, amount DOUBLE"
CUSTOMERS = "customer_id STRING, tier STRING, name STRING, since BIGINT, level INT, seen TIMESTAMP, tags ARRAY<STRING>"
SEEN = "2024-01-02T03:04:05.123456Z"

# (customer_id, value or None for a tombstone, timestamp offset in ms), in production order.
CUSTOMER_LOG = [
    ("c1", {"tier": "silver", "name": "Ann"}, 1000),
    ("c2", {"tier": "gold", "name": "Bob"}, 1500),
    ("c1", {"tier": "gold", "name": "Ann B"}, 3000),
    ("c3", {"tier": "bronze", "name": "Cy"}, 2000),  # produced after a later record of another key
    ("c2", None, 4000),
    ("c2", {"tier": "platinum", "name": "Bob"}, 6000),
    ("c5", None, 2500),  # a tombstone for a key that never had a value
]
# (order_id, customer_id, timestamp offset in ms)
ORDER_LOG = [
    ("o1", "c1", 500),  # before c1 exists
    ("o2", "c1", 1000),  # same timestamp as c1's first value: the table applies first
    ("o3", "c1", 2999),
    ("o4", "c1", 3000),
    ("o5", "c2", 3500),
    ("o6", "c2", 4000),  # same timestamp as c2's tombstone
    ("o7", "c2", 5000),
    ("o8", "c2", 7000),
    ("o9", "c4", 8000),  # a key never seen
    ("o10", None, 9000),  # a null key
    ("o11", "c3", 2500),
    ("o12", "c5", 3000),
]


def customer_recs(log) -> list[Rec]:
    return [
        Rec(0, cid.encode(), None if v is None else json.dumps({"customer_id": cid, **v}).encode(), None, BASE_MS + t)
        for cid, v, t in log
    ]


def order_recs(log) -> list[Rec]:
    return [
        Rec(
            i % 2,
            None,
            json.dumps({"order_id": oid, "customer_id": cid, "amount": 10.0 + i}).encode(),
            None,
            BASE_MS + t,
        )
        for i, (oid, cid, t) in enumerate(log)
    ]


def create(bootstrap: str, name: str) -> tuple[str, str]:
    customers, orders = f"{name}-customers", f"{name}-orders"
    Admin(bootstrap).create_topic(customers, partitions=1)
    Admin(bootstrap).create_topic(orders, partitions=2)
    return customers, orders


def inputs(spark, bootstrap: str, customers: str, orders: str, **options):
    """Both topics as the source gives them: undecodable records too (the join dead-letters them)."""
    stream = source(
        spark,
        bootstrap,
        orders,
        stream=True,
        startingOffsets="earliest",
        valueFormat="json",
        valueSchema=ORDERS,
        **options,
    )
    table = source(
        spark,
        bootstrap,
        customers,
        stream=True,
        startingOffsets="earliest",
        valueFormat="json",
        valueSchema=CUSTOMERS,
        **options,
    )
    return stream, table


def reference(how: str) -> set[tuple]:
    """As-of join in pandas: for each order, the latest customer record with timestamp <= the order's;
    a tombstone there means no value."""
    cust = pd.DataFrame(
        [
            (cid, t, off, v is None, (v or {}).get("tier"), (v or {}).get("name"))
            for off, (cid, v, t) in enumerate(CUSTOMER_LOG)
        ],
        columns=["customer_id", "ts", "off", "tomb", "tier", "name"],
    ).sort_values(["ts", "off"])
    orders = pd.DataFrame(
        [(oid, cid, t, 10.0 + i) for i, (oid, cid, t) in enumerate(ORDER_LOG)],
        columns=["order_id", "customer_id", "ts", "amount"],
    )
    keyed = orders[orders.customer_id.notna()].sort_values("ts")
    merged = pd.merge_asof(keyed, cust, on="ts", by="customer_id", direction="backward")
    merged = pd.concat([merged, orders[orders.customer_id.isna()]], ignore_index=True)
    out = set()
    for r in merged.itertuples():
        found = isinstance(r.tier, str) and not r.tomb
        route = "out" if found or how == "left" else "filtered"
        cid = r.customer_id if isinstance(r.customer_id, str) else None
        out.add((r.order_id, cid, r.amount, r.tier if found else None, r.name if found else None, route))
    return out


def per_bucket(spark, stream, counts: dict[str, int]) -> list[int]:
    """The absorbed counts to expect from table records per key: summed over the keys of each bucket."""
    buckets = bucket_count(stream)
    keys = spark.createDataFrame([(k,) for k in counts], "k STRING")
    sums = Counter()
    for r in keys.select("k", bucket(F.col("k"), buckets).alias("b")).collect():
        sums[r.b] += counts[r.k]
    return sorted(sums.values())


def result(rows) -> set[tuple]:
    return {(r.order_id, r.customer_id, r.amount, r.tier, r.name, r._route) for r in rows}


@pytest.mark.parametrize("how", ["inner", "left"])
def test_join_is_as_of_with_updates_and_tombstones(spark, bootstrap, topic_name, tmp_path, how) -> None:
    customers, orders = create(bootstrap, topic_name)
    produce(bootstrap, customers, customer_recs(CUSTOMER_LOG))
    produce(bootstrap, orders, [*order_recs(ORDER_LOG), Rec(1, None, b"not json", None, BASE_MS + 1000)])
    stream, table = inputs(spark, bootstrap, customers, orders)

    joined = join_table(stream, table, "customer_id", how=how)

    stream_fields = [f for f in stream.schema.fields if f.name != "_error"]
    assert joined.columns == [
        *[f.name for f in stream_fields],
        "tier",
        "name",
        "since",
        "level",
        "seen",
        "tags",
        "_route",
        "_absorbed",
        "_error",
    ]
    assert [dict(joined.dtypes)[c] for c in ("since", "_absorbed", "_error")] == ["bigint", "bigint", "string"]
    assert [f.dataType for f in joined.schema.fields[: len(stream_fields)]] == [f.dataType for f in stream_fields]
    routed = run_routed(joined, str(tmp_path / "ckpt"))
    check_accounting(routed)
    everything = routed.rows
    got = [r for r in everything if r._route in (OUT, FILTERED)]
    assert len(got) == len(ORDER_LOG)  # one row per clean order
    assert result(got) == reference(how)
    # One absorbed row per bucket of table keys (all in one micro-batch here) counting its records: the sum of
    # c1 2, c2 3, c3 1, c5 1 over the keys of each bucket (with the tests' 8 buckets, c1 and c3 share one).
    absorbed = [r for r in everything if r._route == ABSORB]
    assert sorted(r._absorbed for r in absorbed) == per_bucket(spark, stream, {"c1": 2, "c2": 3, "c3": 1, "c5": 1})
    assert all(r.customer_id is None and r.order_id is None and r.tier is None for r in absorbed)
    (bad,) = [r for r in everything if r._route == DLQ]  # the order that did not decode
    assert (bad.topic, bytes(bad.value), bad.order_id) == (orders, b"not json", None) and bad._error
    # Stream columns pass through untouched.
    assert {(r.order_id, r.topic, json.loads(r.value)["amount"]) for r in got} == {
        (oid, orders, 10.0 + i) for i, (oid, _, _) in enumerate(ORDER_LOG)
    }


def test_table_state_survives_a_restart(spark, bootstrap, topic_name, tmp_path) -> None:
    customers, orders = create(bootstrap, topic_name)
    produce(
        bootstrap,
        customers,
        customer_recs(
            [
                ("c1", {"tier": "silver", "name": "Ann"}, 1000),
                (
                    "c1",
                    {"tier": "gold", "name": "Ann", "since": BIG, "level": 7, "seen": SEEN, "tags": ["a", "b"]},
                    2000,
                ),
                ("c2", {"tier": "gold", "name": "Bob"}, 1000),
                ("c2", None, 3000),
                ("c3", {"tier": "bronze", "name": "Cy", "since": -BIG, "tags": []}, 1000),
            ]
        ),
    )
    produce(bootstrap, orders, order_recs([("o1", "c1", 5000)]))
    checkpoint = str(tmp_path / "ckpt")

    first = run_routed(join_table(*inputs(spark, bootstrap, customers, orders), "customer_id"), checkpoint)
    check_accounting(first)
    assert {(r.order_id, r.tier, r._route) for r in first.rows if r._route != ABSORB} == {("o1", "gold", "out")}

    # No customer record after this point: the second run can only know them from the checkpointed state.
    later = [("o2", "c1", 6000), ("o3", "c2", 6000), ("o4", "c3", 6000), ("o5", "c9", 6000)]
    produce(bootstrap, orders, order_recs(later))
    second = run_routed(join_table(*inputs(spark, bootstrap, customers, orders), "customer_id"), checkpoint)
    check_accounting(second)
    # Values come back from the state exactly: BIGINT, an INT with and without a value, a timestamp, arrays.
    seen = spark.sql(f"SELECT TIMESTAMP '{SEEN}' AS t").first().t
    got = {
        (r.order_id, r.tier, r.name, r.since, r.level, r.seen, None if r.tags is None else tuple(r.tags), r._route)
        for r in second.rows
    }
    assert got == {
        ("o2", "gold", "Ann", BIG, 7, seen, ("a", "b"), "out"),
        ("o3", None, None, None, None, None, None, "filtered"),  # deleted by the tombstone before the restart
        ("o4", "bronze", "Cy", -BIG, None, None, (), "out"),
        ("o5", None, None, None, None, None, None, "filtered"),
    }
    assert sum(p["numInputRows"] for p in second.progress) == len(later)  # nothing re-read from the table


def test_every_record_is_accounted_in_every_batch(spark, bootstrap, topic_name, tmp_path) -> None:
    customers, orders = create(bootstrap, topic_name)
    keyless = [
        Rec(0, b"c9", json.dumps({"tier": "gold"}).encode(), None, BASE_MS + 100),  # an upsert without its key
        Rec(0, None, None, None, BASE_MS + 200),  # a tombstone without a Kafka key
    ]
    produce(bootstrap, customers, [*customer_recs(CUSTOMER_LOG), *keyless])
    produce(bootstrap, orders, [*order_recs(ORDER_LOG), Rec(1, None, b"not json", None, BASE_MS + 1000)])
    stream, table = inputs(spark, bootstrap, customers, orders, maxOffsetsPerTrigger=3)

    joined = join_table(stream, table, "customer_id", how="left", table_name="customers")

    got = run_routed(joined, str(tmp_path / "ckpt"))
    assert len([p for p in got.progress if p["numInputRows"]]) >= 4  # the limit made several batches
    check_accounting(got)
    rows = got.rows
    assert sorted(r.order_id for r in rows if r._route == OUT) == sorted(oid for oid, _, _ in ORDER_LOG)
    assert sum(r._absorbed for r in rows if r._route == ABSORB) == len(CUSTOMER_LOG)
    # The dead letters carry their own topic's coordinates and raw bytes, for <topic>.dlq.
    dlq = sorted((r for r in rows if r._route == DLQ), key=lambda r: (r.topic, r.offset))
    null_key = "table customers record has a null key customer_id"
    assert [(r.topic, r.partition, r.offset, r.key, r.value) for r in dlq] == [
        (customers, 0, len(CUSTOMER_LOG), b"c9", keyless[0].value),
        (customers, 0, len(CUSTOMER_LOG) + 1, None, None),
        (orders, 1, len(ORDER_LOG) // 2, None, b"not json"),
    ]
    assert dlq[0]._error == null_key
    assert dlq[1]._error == f"{null_key}: a tombstone's key is its Kafka key, null or not a string"
    assert dlq[2]._error  # the decoder's reason
    assert all(r.order_id is None and r.customer_id is None and r.tier is None for r in dlq)


def test_invalid_arguments_raise_value_error(spark, bootstrap, topic_name) -> None:
    stream, table = inputs(spark, bootstrap, f"{topic_name}-customers", f"{topic_name}-orders")
    cases = [
        ({"key": "cust"}, "key column 'cust'"),
        ({"key": "order_id"}, "not a column of the table"),
        ({"how": "right"}, "how must be one of inner, left"),
        ({"table_columns": ["tier", "segment"]}, r"\['segment'\] are not columns of the table"),
        ({"table_columns": ["tier", "timestamp"]}, r"\['timestamp'\] collide"),
        ({"table_columns": []}, "no table column"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            join_table(stream, table, **{"key": "customer_id", **kwargs})
    # The stream's own columns collide by default: both sides have a `name` here.
    with pytest.raises(ValueError, match=r"\['name'\] collide"):
        join_table(stream.withColumnRenamed("amount", "NAME"), table, "customer_id")
    with pytest.raises(ValueError, match=r"the table lacks the Kafka column\(s\) partition"):
        join_table(stream, table.drop("partition"), "customer_id")
    with pytest.raises(ValueError, match=r"\['_absorbed'\] collide with the output columns"):
        join_table(stream.withColumn("_absorbed", stream.amount), table, "customer_id")
    with pytest.raises(ValueError, match="is string in the stream but int in the table"):
        join_table(stream, table.withColumn("customer_id", table.customer_id.cast("int")), "customer_id")
