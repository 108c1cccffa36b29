"""The shop pipeline end to end with available_now: every generated record is in exactly one place.

The generator makes a fixed stream (seed, start and event rate fixed); the runner takes it through every
processor in several micro-batches. Then each processor's inputs are traced, by the `weir.source` header
that every output, dead letter and late record carries, to exactly one destination: an output topic, a
`.dlq` topic, a `.late` topic, or a count (filtered, absorbed into state). Nothing is twice, nothing
missing, and the runner's books agree with the topics.
"""

from __future__ import annotations

import collections
import json
import math

import pytest

from examples.shop.demo import lake_summary
from examples.shop.pipeline import build
from examples.shop.records import CUSTOMERS, ORDERS, PAGE_VIEWS, Shape, records
from weir.storage import delta
from weir.storage.lake import Lake
from weir.testing import PipelineTest, Record, assert_rows

pytestmark = pytest.mark.integration

TOTAL = 3000
# 1500 s of event time: 25 one-minute and 5 five-minute windows, most of them closed by the end.
SHAPE = Shape(seed=5, start_ms=1_767_225_617_000, event_rate=2.0, customers=100)
THRESHOLD = 1000.0  # the busiest customers' 5-minute spend tops it, most customers' does not


def coordinates(topic: str, rows: list[Record]) -> list[str]:
    return [f"{topic}/{r.partition}/{r.offset}" for r in rows]


def sources(rows: list[Record], processor: str | None = None) -> list[str]:
    """The input records that rows stand for (their weir.source headers), optionally of one processor."""
    return [r.source for r in rows if processor in (None, r.processor)]


def test_every_generated_record_is_in_exactly_one_place(pipeline_test, tmp_path) -> None:
    spend_table = str(tmp_path / "spend")
    pipeline = build(
        rate=0, total=TOTAL, seed=SHAPE.seed, threshold=THRESHOLD, event_rate=SHAPE.event_rate,
        customers=SHAPE.customers, start_ms=SHAPE.start_ms, spend_table=spend_table,
    )  # fmt: skip
    # A restart is allowed (on a loaded machine a Python worker may miss Spark's fixed 10 s to connect back);
    # the books must balance all the same, which run_once checks batch by batch.
    t: PipelineTest = pipeline_test(pipeline, max_offsets_per_trigger=700, max_restarts=3, restart_backoff=0.5)
    totals = t.run_once(900)
    assert t.status["enrich"].batches > 1  # the books balanced batch by batch, not only once
    names = [*pipeline.topics, *(f"{n}.{side}" for n in pipeline.topics for side in ("dlq", "late"))]
    topic = {n: t.records(n) for n in names}  # .dlq and .late exist for input topics only: the rest are empty
    here = t.topic  # the test's Kafka name of a topic, which weir.source headers carry

    # generate: the three topics hold exactly the generator's records, each once.
    made = records(SHAPE, 0, TOTAL)
    expected = collections.Counter((r.output, r.key, r.value) for r in made)
    found = collections.Counter((n, r.key, r.value) for n in (ORDERS, CUSTOMERS, PAGE_VIEWS) for r in topic[n])
    assert found == expected
    assert totals["generate"].out == TOTAL

    # The orders archiver: the lake holds every order (malformed ones too), each once, as the broker has it; the
    # demo's summary reads the Delta table back.
    lake_root = str(t.root / "lake")
    table = Lake(lake_root).table(here(ORDERS))
    lake = table.to_pyarrow_table(columns=["partition", "offset", "value"]).to_pylist()
    n = len(topic[ORDERS])
    assert f"read back by DuckDB: {n} rows ({n} distinct records)" in lake_summary(lake_root, here(ORDERS))
    assert sorted((r["partition"], r["offset"], r["value"]) for r in lake) == sorted(
        (r.partition, r.offset, r.value) for r in topic[ORDERS]
    )
    assert totals[f"archive.{ORDERS}"].out == len(topic[ORDERS])

    # enrich: each order is enriched or dead-lettered, exactly once; each customer record dead-lettered or
    # absorbed into the table.
    malformed = {
        o: sorted(r.value for r in made if r.output == o and r.malformed) for o in (ORDERS, CUSTOMERS, PAGE_VIEWS)
    }
    assert sorted(r.value for r in topic["orders.dlq"] if r.processor == "enrich") == malformed[ORDERS]
    assert sorted(r.value for r in topic["customers.dlq"]) == malformed[CUSTOMERS]
    orders_out = sources(topic["orders.enriched"]) + sources(topic["orders.dlq"], "enrich")
    assert sorted(orders_out) == sorted(coordinates(here(ORDERS), topic[ORDERS]))
    customers_dlq = sources(topic["customers.dlq"])
    assert len(set(customers_dlq)) == len(customers_dlq)
    assert set(customers_dlq) <= set(coordinates(here(CUSTOMERS), topic[CUSTOMERS]))
    e = totals["enrich"]
    assert e.in_ == len(topic[ORDERS]) + len(topic[CUSTOMERS])
    assert (e.out, e.dlq) == (len(topic["orders.enriched"]), len(malformed[ORDERS]) + len(malformed[CUSTOMERS]))
    assert e.absorbed == len(topic[CUSTOMERS]) - len(malformed[CUSTOMERS])
    joined = [json.loads(r.value) for r in topic["orders.enriched"]]
    # The table was there for most orders (to_json leaves null fields out).
    assert sum(1 for j in joined if j.get("name") is not None) > 0.9 * len(joined)

    # revenue and spend: each enriched order is late (once, in orders.enriched.late) or in a window.
    enriched = coordinates(here("orders.enriched"), topic["orders.enriched"])
    for name in ("revenue", "spend"):
        late = sources(topic["orders.enriched.late"], name)
        assert len(late) == len(set(late)) and set(late) <= set(enriched), name
        w = totals[name]
        assert (w.in_, w.late, w.absorbed + w.late) == (len(enriched), len(late), len(enriched)), name
        assert w.late > 0 and w.emitted > 0, name
    # spend's allowed lateness: a window is written at its close (revision 1), then once per batch that brought it
    # late orders within the lateness (2, 3, ...), each revision once
    revisions = collections.defaultdict(list)
    for r in topic["spend.by_customer_5m"]:
        revisions[(r.fields["customer_id"], r.fields["window_start"])].append(r.fields["revision"])
    assert all(sorted(v) == list(range(1, len(v) + 1)) for v in revisions.values()), revisions
    # spend_lake: its Delta table holds each window once, as its last revision has it (the sink upserts by key).
    last = {}
    for r in topic["spend.by_customer_5m"]:
        k = (r.fields["customer_id"], r.fields["window_start"])
        if r.fields["revision"] >= last.get(k, {"revision": 0})["revision"]:
            last[k] = r.fields
    kept = delta.open_table(spend_table).to_pyarrow_table().to_pylist()
    assert len(kept) == len({(w["customer_id"], w["window_start"]) for w in kept}) == len(last)
    shape = ("customer_id", "revision", "orders", "spend")
    assert sorted(tuple(w[c] for c in shape) for w in kept) == sorted(tuple(w[c] for c in shape) for w in last.values())
    assert (totals["spend_lake"].in_, totals["spend_lake"].out) == (len(topic["spend.by_customer_5m"]),) * 2
    windows = [r.fields for r in topic["revenue.by_category_1m"]]
    assert len(windows) == totals["revenue"].emitted
    assert sum(w["orders"] for w in windows) <= totals["revenue"].absorbed  # open windows are not flushed

    # lifetime: a running aggregate per customer. Its revisions of a customer are 1, 2, ... each written once, and
    # the latest counts each of the customer's enriched orders exactly once (a replayed batch adds nothing).
    per: dict[str, list[dict]] = collections.defaultdict(list)
    for r in topic["customers.lifetime"]:
        per[r.fields["customer_id"]].append(r.fields)
    ordered = collections.Counter(j["customer_id"] for j in joined)
    spent = collections.Counter()
    for j in joined:
        spent[j["customer_id"]] += j.get("amount") or 0.0
    assert set(per) == set(ordered)
    for customer, rows in per.items():
        assert sorted(f["revision"] for f in rows) == list(range(1, len(rows) + 1)), customer
        latest = max(rows, key=lambda f: f["revision"])
        assert latest["orders"] == ordered[customer], customer
        assert math.isclose(latest["spend"] or 0.0, spent[customer], rel_tol=1e-9), customer
    life = totals["lifetime"]
    assert (life.in_, life.absorbed, life.emitted) == (len(enriched), len(enriched), len(topic["customers.lifetime"]))

    # watch (@stateful): every enriched order late or absorbed; each spike is an order of its customer over twice
    # the average of the 5 before it, and each customer's quiet timer fired at most once per gap (the order count
    # it names grows)
    w = totals["watch"]
    late = sources(topic["orders.enriched.late"], "watch")
    assert (w.in_, w.late + w.absorbed, w.emitted) == (len(enriched), len(enriched), len(topic["customers.signals"]))
    signals = [r.fields for r in topic["customers.signals"]]
    placed = {(j["customer_id"], j["amount"], j["ts_ms"]) for j in joined}
    spikes = [f for f in signals if f["rule"].startswith("spike")]
    assert spikes and all((f["customer_id"], f["amount"], round(f["at"].timestamp() * 1000)) in placed for f in spikes)
    quiet = [f for f in signals if f["rule"].startswith("quiet")]
    assert quiet and len(late) == len(set(late)) == w.late
    for customer in {f["customer_id"] for f in quiet}:
        counts = [int(f["rule"].rsplit(" after ", 1)[1].split()[0]) for f in quiet if f["customer_id"] == customer]
        assert counts == sorted(set(counts)), (customer, counts)

    # attribute (a stream-stream join): every order and page view late (once, with its reason), dead-lettered or
    # absorbed; its pairs are exactly the plain-Python join of the on-time ones, each once, each naming its order;
    # an on-time order without a view comes out at most once, with null view columns.
    a = totals["attribute"]
    assert a.in_ == len(topic[ORDERS]) + len(topic[PAGE_VIEWS]) == a.late + a.dlq + a.absorbed
    late = {*sources(topic["orders.late"], "attribute"), *sources(topic["page_views.late"], "attribute")}
    dlq = {*sources(topic["orders.dlq"], "attribute"), *sources(topic["page_views.dlq"], "attribute")}
    assert len(late) == a.late > 0 and len(dlq) == a.dlq == len(malformed[ORDERS]) + len(malformed[PAGE_VIEWS])
    for name in ("orders.late", "page_views.late"):
        assert all(r.headers.get("weir.late", "").startswith("event time ") for r in topic[name]), name
    on_time = {
        name: {c: json.loads(r.value) for c, r in zip(coordinates(here(name), topic[name]), topic[name], strict=True)
               if c not in late and c not in dlq}
        for name in (ORDERS, PAGE_VIEWS)
    }  # fmt: skip
    want = collections.Counter(
        (o["order_id"], v["view_id"]) for o in on_time[ORDERS].values() for v in on_time[PAGE_VIEWS].values()
        if o["customer_id"] == v["customer_id"] and o["ts_ms"] - 10_000 <= v["ts_ms"] <= o["ts_ms"]
    )  # fmt: skip
    rows = topic["orders.attributed"]
    assert len(rows) == a.emitted
    got = collections.Counter((r.fields["order_id"], r.fields["view_id"]) for r in rows if r.fields["view_id"])
    assert got == want and max(got.values()) == 1
    lonely = [r.fields["order_id"] for r in rows if r.fields["view_id"] is None]
    matched = {o for o, _ in want}
    assert lonely and len(lonely) == len(set(lonely)) and not set(lonely) & matched
    for r in rows:
        assert on_time[ORDERS][r.source]["order_id"] == r.fields["order_id"]

    # alert: exactly the 5-minute windows over the threshold, each naming its window record.
    spend = topic["spend.by_customer_5m"]
    over = sorted(c for c, r in zip(coordinates(here("spend.by_customer_5m"), spend), spend, strict=True)
                  if r.fields["spend"] > THRESHOLD)  # fmt: skip
    assert 0 < len(over) < len(spend)
    assert sorted(sources(topic["alerts"])) == over
    a = totals["alert"]
    assert (a.in_, a.out, a.filtered) == (len(spend), len(over), len(spend) - len(over))
    assert all(r.fields["threshold"] == THRESHOLD for r in topic["alerts"])


def test_alerts_are_the_windows_over_the_threshold(pipeline_test) -> None:
    """The alert processor alone, on hand-made windows, by the kit's fast path (no broker)."""
    t: PipelineTest = pipeline_test(build(threshold=100.0))
    start, end = "2026-01-01T10:00:00Z", "2026-01-01T10:05:00Z"

    def window(customer: str, spend: float) -> dict:
        return {"customer_id": customer, "window_start": start, "window_end": end, "orders": 2, "spend": spend}

    counts = t.run_batch("alert", [window("c1", 150.0), window("c2", 99.0), window("c3", 100.5), b"{broken"])
    assert_rows(t.read("alerts"), [
        {"customer_id": "c1", "spend": 150.0, "threshold": 100.0},
        {"customer_id": "c3", "spend": 100.5, "threshold": 100.0},
    ])  # fmt: skip
    assert {r.fields["window_end"].isoformat() for r in t.records("alerts")} == {"2026-01-01T10:05:00+00:00"}
    assert [r.value for r in t.dead_letters("spend.by_customer_5m")] == [b"{broken"]
    assert (counts.in_, counts.out, counts.filtered, counts.dlq, counts.balanced) == (4, 2, 1, 1, True)
