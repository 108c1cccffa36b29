"""`@stateful` (weir.blocks.keyed; docs/blocks.md, "Keyed state of one's own") through Spark, across a restart of the
query on its checkpoint: a rule over each device's last 3 amounts against plain Python, records behind the
watermark routed late, a record the function raises for dead-lettered with its reason, an event-time timer set
before the restart that fires after it (a device gone silent), and every batch's books balanced."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from _pipe import Rec, produce, source
from pyspark.sql import functions as F
from test_window import BASE_MS, check_accounting, run_routed

from weir.blocks import ListOf, Value, stateful
from weir.kafka import Admin
from weir.pipeline.routes import DLQ, EMIT, LATE

pytestmark = pytest.mark.integration

SCHEMA = "device STRING, amount DOUBLE, ts_ms BIGINT"
LATE_AT = {16, 40}  # an hour behind: always behind the watermark once the first batch ran
SILENT_AFTER_S = 5


def events(n: int) -> list[dict]:
    """d1 reports until record 23 (its timer falls after the first run's watermark), d2 throughout, "bad" has no
    amount (the rule raises); one second apart."""
    out = []
    for i in range(n):
        device = "bad" if i % 11 == 3 else ("d1" if i <= 24 and i % 2 else "d2")
        amount = None if device == "bad" else float([1, 2, 1, 9, 1, 30, 2, 2][i % 8])
        ts = BASE_MS + i * 1000 - (3_600_000 if i in LATE_AT else 0)
        out.append({"device": device, "amount": amount, "ts_ms": ts})
    return out


def reference(evts: list[dict]) -> list[tuple[str, float]]:
    """The spikes plain Python finds: an amount over 3x the largest of its device's last 3 on-time amounts."""
    last: dict[str, list[float]] = {}
    out = []
    for i, e in enumerate(evts):
        if i in LATE_AT or e["amount"] is None:
            continue
        seen = last.setdefault(e["device"], [])
        if len(seen) == 3 and e["amount"] > 3 * max(seen):
            out.append((e["device"], e["amount"]))
        seen.append(e["amount"])
        del seen[:-3]
    return out


def _watch():
    """The rule, defined in a function so that cloudpickle ships it by value to Spark's Python workers."""

    @stateful(
        key="device", event_time="event_time", watermark="2s", output="rule STRING, amount DOUBLE, at TIMESTAMP",
        state={"last": ListOf("double", keep=3), "seen": Value("bigint")},
    )  # fmt: skip
    def watch(device, records, state, timers):
        for r in records:
            if r["amount"] is None:
                raise ValueError(f"no amount at offset {r['offset']}")
            if len(state.last) == 3 and r["amount"] > 3 * max(state.last):
                yield {"rule": "spike", "amount": r["amount"], "at": r["event_time"]}
            state.last.append(r["amount"])
            state.seen.value = (state.seen.value or 0) + 1
        timers.clear()  # silent: no record for SILENT_AFTER_S of event time after the latest
        timers.set(records[-1]["event_time"] + timedelta(seconds=SILENT_AFTER_S))

    @watch.on_timer
    def silent(device, at, state, timers):
        yield {"rule": f"silent after {state.seen.value} records", "at": at}

    return watch


def test_a_stateful_rule_and_its_timers_across_a_restart(spark, bootstrap, topic_name, tmp_path) -> None:
    Admin(bootstrap).create_topic(topic_name, partitions=1)
    evts = events(60)
    watch = _watch()
    checkpoint, progress, rows = str(tmp_path / "ckpt"), [], []
    for part in (range(30), range(30, 60)):  # d1's timer is set in the first run and fires in the second
        produce(bootstrap, topic_name, [Rec(0, evts[i]["device"].encode(), json.dumps(evts[i]).encode()) for i in part])
        stream = source(spark, bootstrap, topic_name, stream=True, startingOffsets="earliest", valueFormat="json",
                        valueSchema=SCHEMA, maxOffsetsPerTrigger=7)  # fmt: skip
        out = watch(stream.withColumn("event_time", F.timestamp_millis("ts_ms")))
        assert dict(out.dtypes) | {} == {
            "device": "string", "rule": "string", "amount": "double", "at": "timestamp", "topic": "string",
            "partition": "int", "offset": "bigint", "key": "binary", "value": "binary", "_route": "string",
            "_absorbed": "bigint", "_error": "string",
        }  # fmt: skip
        got = run_routed(out, checkpoint)
        check_accounting(got)
        progress += got.progress
        rows += [r for _, rs in sorted(got.batches.items()) for r in rs]
        if part.start == 0:
            assert not [r for r in rows if r._route == EMIT and r.rule.startswith("silent")]

    assert sorted(r.offset for r in rows if r._route == LATE) == sorted(LATE_AT)
    bad = [i for i, e in enumerate(evts) if e["device"] == "bad"]
    dead = {r.offset: r._error for r in rows if r._route == DLQ}
    assert sorted(dead) == bad
    assert all(v.startswith("watch for key 'bad' raised ValueError: no amount at offset ") for v in dead.values())
    spikes = [(r.device, r.amount) for r in rows if r._route == EMIT and r.rule == "spike"]
    assert spikes == reference(evts) and len(spikes) >= 3
    gone = [r for r in rows if r._route == EMIT and r.rule.startswith("silent")]
    d1_last = max(e["ts_ms"] for i, e in enumerate(evts) if e["device"] == "d1" and i not in LATE_AT)
    d1_records = sum(e["device"] == "d1" and i not in LATE_AT for i, e in enumerate(evts))
    expected_at = datetime.fromtimestamp(d1_last / 1000 + SILENT_AFTER_S, UTC).replace(tzinfo=None)
    assert [(r.device, r.rule, r.at) for r in gone] == [("d1", f"silent after {d1_records} records", expected_at)]
