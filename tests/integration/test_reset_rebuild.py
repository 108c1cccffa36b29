"""`weir run --reset`: a stateless and a stateful processor rebuilt from the earliest offsets over the same input
leave every output topic and a downstream sink as a single run did (weir.runtime.rebuild): what their topics
hold is not written again, counted as replayed; with `--republish`, everything is."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import pyarrow.parquet as pq
import pytest
from _pipe import Rec, consume_all, produce
from pyspark.sql import functions as F

from weir.blocks import tumbling_window
from weir.config import load
from weir.kafka import Admin
from weir.pipeline import Pipeline
from weir.runtime import rebuild
from weir.runtime.runner import Runner
from weir.sinks import ParquetSink

pytestmark = pytest.mark.integration
T0 = datetime(2026, 11, 22, 8, 0, tzinfo=UTC)
N = 200


def declare(prefix: str, store: str) -> Pipeline:
    p = Pipeline(f"rs-{prefix}")
    events = p.topic(f"{prefix}.events", "id BIGINT, user STRING, cents BIGINT", key="id", partitions=2)
    enriched = p.topic(f"{prefix}.enriched", "id BIGINT, user STRING, euros DOUBLE", key="id", partitions=2)
    per_user = p.topic(f"{prefix}.per_user", "user STRING, window_start TIMESTAMP, window_end TIMESTAMP, n BIGINT")

    @p.processor(inputs=[events], outputs=[enriched])
    def enrich(df):
        return df.where("cents % 7 != 0").select("id", "user", (F.col("cents") / 100).alias("euros"), "timestamp")

    @p.processor(inputs=[enriched], outputs=[per_user], stateful=True)
    def counts(df):
        return tumbling_window(df, key="user", event_time="timestamp", size="1 minute", watermark="10 seconds",
                               aggregates={"n": ("count", "*")})  # fmt: skip

    @p.processor(inputs=[enriched], sink=ParquetSink(store))
    def keep(df):
        return df.select("id", "euros")

    return p


def run_once(p: Pipeline, s, spark) -> Runner:
    r = Runner(p, s, spark=spark, available_now=True).start()
    try:
        assert r.wait(300)
    finally:
        r.stop()
    assert all(st.state == "finished" for st in r.snapshot().values()), r.snapshot()
    return r


def held(bootstrap: str, topic: str) -> Counter:
    return Counter((m.key(), m.value()) for m in consume_all(bootstrap, topic))


def test_a_reset_rebuilds_without_publishing_again_and_republish_publishes(bootstrap, spark, tmp_path) -> None:
    prefix = uuid.uuid4().hex[:8]
    s = load(home=str(tmp_path / "home"), bootstrap_servers=bootstrap, checkpoint_root=str(tmp_path / "ck"),
             restart_backoff=0.2)  # fmt: skip
    store = str(tmp_path / "store")
    p = declare(prefix, store)
    Admin(bootstrap).create_topic(f"{prefix}.events", 2)
    recs = []
    for i in range(N):
        value = json.dumps({"id": i, "user": f"u{i % 3}", "cents": i * 13}).encode()
        recs.append(Rec(i % 2, str(i).encode(), value, (), int((T0 + timedelta(seconds=3 * i)).timestamp() * 1000)))
    produce(bootstrap, f"{prefix}.events", recs)
    first = run_once(p, s, spark)
    outputs = [f"{prefix}.enriched", f"{prefix}.per_user", f"{prefix}.events.dlq"]
    single = {t: held(bootstrap, t) for t in outputs}
    assert sum(single[f"{prefix}.enriched"].values()) == sum(i * 13 % 7 != 0 for i in range(N))
    assert sum(single[f"{prefix}.per_user"].values()) >= 3  # closed windows, one record each
    kept = sorted(pq.read_table(store).to_pandas()["id"])

    for name in ("enrich", "counts"):
        assert rebuild.reset(first.checkpoint(p.processors[name]))
    again = run_once(p, s, spark)
    assert {t: held(bootstrap, t) for t in outputs} == single  # as a single run left them
    assert sorted(pq.read_table(store).to_pandas()["id"]) == kept  # downstream saw nothing twice
    totals = again.snapshot()
    assert totals["enrich"].totals.replayed == sum(single[f"{prefix}.enriched"].values())
    assert totals["counts"].totals.replayed == sum(single[f"{prefix}.per_user"].values())
    for name in ("enrich", "counts"):  # every earlier row met: the rebuild is over
        assert rebuild.pending(first.checkpoint(p.processors[name])) is None

    assert rebuild.reset(first.checkpoint(p.processors["enrich"]), republish=True)
    run_once(p, s, spark)
    doubled = held(bootstrap, f"{prefix}.enriched")
    assert doubled == Counter({k: 2 * n for k, n in single[f"{prefix}.enriched"].items()})
