"""The retention fallback: offsets the broker no longer has are read from the lake, each record once, in
offset order, exactly as the broker would have returned it; the reads are counted in `@lakeFallback` (the
offset, hence the checkpoint and every progress event) and in the pipeline's progress record. A range the
lake lacks fails loudly, naming it and what the lake holds, or with failOnDataLoss=false is skipped and
counted in `@dataLoss`.

The broker deletes the records itself: Apache Kafka's DeleteRecords moves a partition's log start as retention
does (test_kafka_retention.py has retention.ms do it); nothing but the broker tells the source where its log begins.
"""

from __future__ import annotations

import json
import shutil
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from _pipe import Rec, delete_records, end_offsets, produce, run_available_now, source, wait_for
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from weir.checkpoint.offsets import OffsetRange
from weir.config import load
from weir.kafka import Admin
from weir.kafka.fallback import LakeIndex
from weir.lake.archive import archiver_name
from weir.pipeline import Pipeline
from weir.runtime import query as query_module
from weir.runtime.progress import lake_fallback
from weir.runtime.runner import Runner
from weir.storage.lake import Lake

pytestmark = pytest.mark.integration
SCHEMA = "id BIGINT NOT NULL, amount DOUBLE"
T0 = int(datetime(2025, 3, 1, 23, 30, tzinfo=UTC).timestamp() * 1000)  # records span midnight: two dates
ARCHIVED = 40  # records per partition archived before the rest is produced
TOTAL = 60  # records per partition in the end


def record(i: int) -> Rec:
    """Record i: partition i % 2; some values malformed, one a tombstone, one without headers."""
    value = b"{broken" if i % 25 == 7 else None if i == 12 else json.dumps({"id": i, "amount": i / 4}).encode()
    headers = None if i == 3 else (("h", str(i).encode()), ("n", None))
    return Rec(i % 2, str(i).encode(), value, headers, T0 + i * 60_000)


def pipeline(topic: str, out: str | None = None) -> Pipeline:
    p = Pipeline(f"fb-{topic.split('.')[0]}")
    events = p.topic(topic, schema=SCHEMA, key="id", partitions=2, archived=True)
    if out:
        doubled = p.topic(out, schema="id BIGINT, amount DOUBLE", key="id", partitions=1)

        @p.processor(inputs=[events], outputs=[doubled])
        def double(e):
            return e.where(F.col("id").isNotNull()).select("id", (F.col("amount") * 2).alias("amount"))

    return p


def settings(tmp_path: Path, bootstrap: str, **extra):
    return load(
        home=str(tmp_path / "home"), bootstrap_servers=bootstrap, checkpoint_root=str(tmp_path / "checkpoints"),
        lake=str(tmp_path / "lake"), restart_backoff=0.2, max_offsets_per_trigger=25, **extra,
    )  # fmt: skip


def run(p: Pipeline, s, spark, processors: list[str]) -> Runner:
    r = Runner(p, s, spark=spark, available_now=True, processors=processors).start()
    assert r.wait(300)
    r.stop()
    return r


@pytest.fixture
def archived(spark, bootstrap, tmp_path_factory):
    """A 2-partition topic of TOTAL records per partition whose first ARCHIVED per partition are in the lake. One
    per test: each deletes records of its own from the broker, which no test can undo."""
    tmp_path = tmp_path_factory.mktemp("archived")
    topic = f"{uuid.uuid4().hex[:8]}.events"
    Admin(bootstrap).create_topic(topic, 2)
    produce(bootstrap, topic, (record(i) for i in range(2 * ARCHIVED)))
    s = settings(tmp_path, bootstrap)
    run(pipeline(topic), s, spark, [archiver_name(topic)])
    cover = {p: [(r.start, r.end) for r in rs] for p, rs in Lake(s.lake).coverage(topic).items()}
    assert cover == {0: [(0, ARCHIVED)], 1: [(0, ARCHIVED)]}
    produce(bootstrap, topic, (record(i) for i in range(2 * ARCHIVED, 2 * TOTAL)))
    return topic, s


def options(s, **extra) -> dict:
    return {"valueFormat": "json", "valueSchema": SCHEMA, "lake": s.lake, **extra}


def as_tuples(rows) -> list[tuple]:
    """Everything a row carries, comparable: coordinates, bytes, time, headers, decoded fields, error."""
    out = []
    for r in rows:
        headers = None if r["headers"] is None else [(h["key"], h["value"]) for h in r["headers"]]
        out.append((
            r["partition"], r["offset"], r["key"], r["value"], r["timestamp"], r["timestampType"], headers,
            r["id"], r["amount"], r["_error"],
        ))  # fmt: skip
    return out


def broker_truth(spark, bootstrap: str, topic: str) -> list[tuple]:
    """The topic as the broker returns it, in (partition, offset) order."""
    df = source(spark, bootstrap, topic, stream=False, valueFormat="json", valueSchema=SCHEMA)
    return sorted(as_tuples(df.collect()))


def in_order_per_partition(rows: list[tuple]) -> bool:
    last: dict[int, int] = {}
    for r in rows:
        if r[1] <= last.get(r[0], -1):
            return False
        last[r[0]] = r[1]
    return True


def test_stream_reads_retention_deleted_offsets_from_the_lake(spark, bootstrap, archived, tmp_path):
    topic, s = archived
    truth = broker_truth(spark, bootstrap, topic)
    assert len(truth) == 2 * TOTAL
    start = json.dumps({topic: {"0": 0, "1": 0}})  # a checkpoint-like position below the earliest offset
    delete_records(bootstrap, {topic: {0: 30, 1: ARCHIVED}})
    stream = source(spark, bootstrap, topic, stream=True, startingOffsets=start, maxOffsetsPerTrigger=25, **options(s))
    got = run_available_now(stream, str(tmp_path / "ckpt"))
    rows = as_tuples(got.rows)
    assert in_order_per_partition(rows)  # each batch, and batch after batch
    assert sorted(rows) == truth  # every record once, identical to the broker's, decoded the same
    ends = end_offsets(got.progress)
    last = ends[-1]
    assert last[topic] == {"0": TOTAL, "1": TOTAL}
    assert "@dataLoss" not in last
    fb = last["@lakeFallback"]
    assert fb["offsets"] == 30 + ARCHIVED
    assert fb["events"] >= 2  # 70 lake offsets at 25 records a batch: the fallback spans batches
    assert fb["ranges"] == len(fb["last"]) >= fb["events"]
    pieces = sorted((r["partition"], r["start"], r["end"]) for r in fb["last"])
    assert _merged(pieces) == [(0, 0, 30), (1, 0, ARCHIVED)]
    summary = lake_fallback([{"startOffset": json.dumps(ends[0]), "endOffset": json.dumps(last)}])
    assert summary["offsets"] == 30 + ARCHIVED


def _merged(pieces: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    for p, a, b in pieces:
        if out and out[-1][0] == p and out[-1][2] == a:
            out[-1] = (p, out[-1][1], b)
        else:
            out.append((p, a, b))
    return out


def log_uncommitted_batch(checkpoint: Path, topic: str, end: dict[str, int]) -> None:
    """A planned, uncommitted batch appended to the offset log: what a crash mid-batch leaves (as in
    test_pipe_dataloss). Spark replays it as logged, without asking the source for offsets again."""
    offsets = checkpoint / "offsets"
    last = max(int(f.name) for f in offsets.iterdir() if f.name.isdigit())
    lines = (offsets / str(last)).read_text().splitlines()
    before = json.loads(lines[-1])
    assert before.keys() == {topic, "@start"}  # version, metadata, then our one source
    # The plan starts where the committed batch ended, as the source logs it.
    planned = {topic: end, "@start": {topic: {p: before[topic][p] for p in end}}}
    (offsets / str(last + 1)).write_text("\n".join([*lines[:-1], json.dumps(planned)]))


def test_replayed_batch_reads_from_the_lake_and_counts_it_in_the_next_offset(spark, bootstrap, tmp_path):
    """Planned before retention passed it, replayed after a crash: the logged offset counts no lake read, so
    the reads are counted in the next offset; the records are read once."""
    topic = f"{uuid.uuid4().hex[:8]}.events"
    Admin(bootstrap).create_topic(topic, 2)
    s = settings(tmp_path, bootstrap)
    checkpoint = tmp_path / "ckpt"
    opts = {"valueFormat": "json", "valueSchema": SCHEMA}
    produce(bootstrap, topic, (record(i) for i in range(40)))  # 20 per partition
    first = run_available_now(
        source(spark, bootstrap, topic, stream=True, startingOffsets="earliest", **opts), str(checkpoint)
    )
    assert len(first.rows) == 40
    produce(bootstrap, topic, (record(i) for i in range(40, 80)))
    run(pipeline(topic), s, spark, [archiver_name(topic)])  # the lake: [0, 40) of each partition
    produce(bootstrap, topic, (record(i) for i in range(80, 2 * TOTAL)))
    log_uncommitted_batch(checkpoint, topic, {"0": TOTAL, "1": TOTAL})  # planned [20, 60), then a crash

    truth = [r for r in broker_truth(spark, bootstrap, topic) if r[1] >= 20]
    delete_records(bootstrap, {topic: {0: 35, 1: ARCHIVED}})
    stream = source(spark, bootstrap, topic, stream=True, startingOffsets="earliest", **options(s))
    got = run_available_now(stream, str(checkpoint))
    rows = as_tuples(got.rows)
    assert in_order_per_partition(rows)
    assert sorted(rows) == truth
    last = end_offsets(got.progress)[-1]
    assert last[topic] == {"0": TOTAL, "1": TOTAL}
    assert last["@lakeFallback"]["offsets"] == 15 + 20
    assert last["@lakeFallback"]["events"] == 1


def test_partial_lake_coverage_fails_loudly_or_skips_and_counts(spark, bootstrap, archived, tmp_path):
    topic, s = archived
    truth = broker_truth(spark, bootstrap, topic)
    start = json.dumps({topic: {"0": 0, "1": 0}})
    delete_records(bootstrap, {topic: {0: ARCHIVED + 10}})  # 10 offsets past what the lake holds of partition 0

    strict = source(spark, bootstrap, topic, stream=True, startingOffsets=start, **options(s))
    with pytest.raises(StreamingQueryException) as info:
        run_available_now(strict, str(tmp_path / "strict"))
    message = str(info.value).split("=== Streaming Query ===")[0]
    assert topic in message and "partition 0" in message
    assert f"offsets [0, {ARCHIVED + 10}) are gone" in message
    assert f"does not hold [{ARCHIVED}, {ARCHIVED + 10})" in message
    assert f"covers {topic} partition 0 offsets [0, {ARCHIVED})" in message

    lenient = source(spark, bootstrap, topic, stream=True, startingOffsets=start, failOnDataLoss="false", **options(s))
    got = run_available_now(lenient, str(tmp_path / "lenient"))
    rows = as_tuples(got.rows)
    assert in_order_per_partition(rows)
    assert sorted(rows) == [r for r in truth if not (r[0] == 0 and ARCHIVED <= r[1] < ARCHIVED + 10)]
    last = end_offsets(got.progress)[-1]
    assert last["@dataLoss"] == {"skippedOffsets": 10, "events": 1}
    assert last["@lakeFallback"]["offsets"] == ARCHIVED


def test_without_archive_the_gap_is_data_loss_as_before(spark, bootstrap, tmp_path):
    topic = f"{uuid.uuid4().hex[:8]}.raw"
    Admin(bootstrap).create_topic(topic, 1)
    produce(bootstrap, topic, (Rec(0, None, f"v{i}".encode()) for i in range(50)))
    lake = str(tmp_path / "empty-lake")
    delete_records(bootstrap, {topic: {0: 20}})
    opts = {"lake": lake}
    start = json.dumps({topic: {"0": 5}})

    strict = source(spark, bootstrap, topic, stream=True, startingOffsets=start, **opts)
    with pytest.raises(StreamingQueryException) as info:
        run_available_now(strict, str(tmp_path / "strict"))
    message = str(info.value).split("=== Streaming Query ===")[0]
    assert f"data loss on {topic} partition 0: offsets [5, 20) are gone" in message
    assert f"holds nothing of {topic} partition 0" in message

    lenient = source(spark, bootstrap, topic, stream=True, startingOffsets=start, failOnDataLoss="false", **opts)
    got = run_available_now(lenient, str(tmp_path / "lenient"))
    assert sorted(r["offset"] for r in got.rows) == list(range(20, 50))
    last = end_offsets(got.progress)[-1]
    assert last == {topic: {"0": 50}, "@dataLoss": {"skippedOffsets": 15, "events": 1}}


def test_batch_read_below_the_earliest_offset(spark, bootstrap, archived):
    topic, s = archived
    truth = broker_truth(spark, bootstrap, topic)
    start = json.dumps({topic: {"0": 10, "1": 0}})
    delete_records(bootstrap, {topic: {0: 30, 1: 35}})
    df = source(spark, bootstrap, topic, stream=False, startingOffsets=start, **options(s))
    rows = as_tuples(df.collect())
    assert in_order_per_partition(rows)
    assert sorted(rows) == [r for r in truth if r[0] == 1 or r[1] >= 10]
    plan = planned(spark, bootstrap, topic, startingOffsets=start, **options(s))
    assert plan == [("lake", 0, 10, 30), ("lake", 1, 0, 35), ("kafka", 0, 30, TOTAL), ("kafka", 1, 35, TOTAL)]


def planned(spark, bootstrap: str, topic: str, **opts) -> list[tuple]:
    """The batch reader's plan, (where, partition, start, end) per task: proof of where rows come from."""
    from pyspark.sql.types import _parse_datatype_string

    from weir.kafka.source import KafkaDataSource

    source_ = KafkaDataSource({"kafka.bootstrap.servers": bootstrap, "subscribe": topic, **opts})
    schema = _parse_datatype_string(source_.schema())
    out = []
    for part in source_.reader(schema).partitions():
        r = part.range
        out.append(("kafka" if type(part).__name__ == "KafkaPartition" else "lake", r.partition, r.start, r.end))
    return out


def test_a_lake_missing_a_file_is_an_error_not_a_gap_and_a_stray_copy_is_ignored(spark, bootstrap, archived, tmp_path):
    topic, shared = archived
    s = shared.model_copy(update={"lake": str(tmp_path / "lake")})  # a copy of the module's lake to damage
    shutil.copytree(shared.lake, s.lake)
    start = json.dumps({topic: {"0": 0, "1": 0}})
    delete_records(bootstrap, {topic: {0: 30}})
    opts = options(s, startingOffsets=start)
    files = sorted(Path(s.lake, topic).rglob("*.parquet"))
    victim = next(f for f in files if f.stat().st_size and _holds(f, 0, 30))
    copy = victim.with_name("part-copy.parquet")
    copy.write_bytes(victim.read_bytes())  # a file no commit names: Delta readers never see it
    rows = source(spark, bootstrap, topic, stream=False, **opts).where("partition = 0 and offset < 30").collect()
    assert sorted(r["offset"] for r in rows) == list(range(30))
    copy.unlink()
    victim.unlink()
    with pytest.raises(Exception, match=r"a data file of table version \d+ is missing"):
        source(spark, bootstrap, topic, stream=False, **opts).collect()


def _holds(path: Path, partition: int, below: int) -> bool:
    import pyarrow.parquet as pq

    t = pq.read_table(path, columns=["partition", "offset"])
    return any(p == partition and o < below for p, o in zip(*t.to_pydict().values(), strict=True))


def test_pipeline_processor_reads_from_the_lake_and_publishes_it(spark, bootstrap, tmp_path, monkeypatch):
    prefix = uuid.uuid4().hex[:8]
    topic, out = f"{prefix}.events", f"{prefix}.doubled"
    p = pipeline(topic, out)
    s = settings(tmp_path, bootstrap)
    Admin(bootstrap).create_topic(topic, 2)
    produce(bootstrap, topic, (record(i) for i in range(40)))  # 20 per partition
    run(p, s, spark, ["double", archiver_name(topic)])  # the processor's checkpoint and the lake: at 20
    produce(bootstrap, topic, (record(i) for i in range(40, 80)))
    run(p, s, spark, [archiver_name(topic)])  # the lake: at 40; the processor still at 20
    produce(bootstrap, topic, (record(i) for i in range(80, 120)))

    # The broker deletes offsets below 35 and 40: [20, 35) and [20, 40) come from the lake.
    delete_records(bootstrap, {topic: {0: 35, 1: 40}})
    r = run(p, s, spark, ["double"])
    assert r.snapshot()["double"].state == "finished"

    got = source(spark, bootstrap, out, stream=False, valueFormat="json", valueSchema="id BIGINT, amount DOUBLE")
    ids = sorted(row["id"] for row in got.collect())
    valid = [i for i in range(120) if i % 25 != 7 and i != 12]
    assert ids == valid  # every valid input exactly once: 0..39 from the first run, the rest now

    lines = (Path(s.home) / "progress" / f"{p.name}.jsonl").read_text().splitlines()
    progress = [x for x in map(json.loads, lines) if x["type"] == "progress" and x["processor"] == "double"]
    fallbacks = [x["lake_fallback"] for x in progress if x["lake_fallback"]]
    assert fallbacks, "no progress record shows the lake fallback"
    assert fallbacks[-1]["offsets"] == 15 + 20
    assert sum(f["batch_offsets"] for f in fallbacks) == 15 + 20
    assert all(x["accounting"]["balanced"] and not x["accounting"]["violations"] for x in progress)
    # The first run read through Spark's connector; the fallback through weir-kafka, saying why (the run may return
    # to the connector for its last records, once a catch-up check finds it past the fallback: a loaded run did)
    fell = [x["reader"] for x in progress if x["lake_fallback"]]
    assert progress[0]["reader"]["kind"] == "connector" and all(r["kind"] == "weir-kafka" for r in fell)
    assert "lake fallback" in fell[-1]["why"] and f"{topic}/0 [20, 35)" in fell[-1]["why"]

    # Past the fallback, the same checkpoint goes on through the connector (kafka/handover.py): each record once
    produce(bootstrap, topic, (record(i) for i in range(120, 160)))
    run(p, s, spark, ["double"])
    got = source(spark, bootstrap, out, stream=False, valueFormat="json", valueSchema="id BIGINT, amount DOUBLE")
    assert sorted(row["id"] for row in got.collect()) == [i for i in range(160) if i % 25 != 7 and i != 12]
    lines = (Path(s.home) / "progress" / f"{p.name}.jsonl").read_text().splitlines()
    last = [x for x in map(json.loads, lines) if x["type"] == "progress" and x["processor"] == "double"][-1]
    assert last["reader"]["kind"] == "connector" and not last["accounting"]["violations"]


def test_a_running_processor_returns_to_the_connector_once_past_its_lake_fallback(
    spark, bootstrap, tmp_path, monkeypatch
):
    monkeypatch.setattr(query_module, "CATCH_UP_CHECK_S", 0.5)
    prefix = uuid.uuid4().hex[:8]
    topic, out = f"{prefix}.events", f"{prefix}.doubled"
    p, s = pipeline(topic, out), settings(tmp_path, bootstrap)
    Admin(bootstrap).create_topic(topic, 2)
    produce(bootstrap, topic, (record(i) for i in range(40)))
    run(p, s, spark, ["double", archiver_name(topic)])  # the processor and the lake at 20 per partition
    produce(bootstrap, topic, (record(i) for i in range(40, 80)))
    run(p, s, spark, [archiver_name(topic)])  # the lake at 40; the processor still at 20
    delete_records(bootstrap, {topic: {0: 30, 1: 30}})

    def progress() -> list[dict]:
        lines = (Path(s.home) / "progress" / f"{p.name}.jsonl").read_text().splitlines()
        return [x for x in map(json.loads, lines) if x["type"] == "progress" and x["processor"] == "double"]

    valid = lambda n: [i for i in range(n) if i % 25 != 7 and i != 12]  # noqa: E731
    runner = Runner(p, s, spark=spark, processors=["double"]).start()  # a live run: no end of input
    try:
        kinds = lambda: [x["reader"]["kind"] for x in progress()]  # noqa: E731
        wait_for(lambda: "weir-kafka" in kinds() and runner._builders["double"].reader.connector, 240,
                 "batches on weir-kafka (the fallback), then a start on the connector", about=kinds)  # fmt: skip
        produce(bootstrap, topic, (record(i) for i in range(80, 120)))
        read = lambda: source(spark, bootstrap, out, stream=False, valueFormat="json",  # noqa: E731
                              valueSchema="id BIGINT, amount DOUBLE").collect()  # fmt: skip
        wait_for(lambda: len(read()) >= len(valid(120)), 180, "every valid input in the output")
    finally:
        runner.stop()
    assert sorted(r["id"] for r in read()) == valid(120)  # each once, across both readers and their handovers
    records = progress()
    assert all(x["accounting"]["balanced"] and not x["accounting"]["violations"] for x in records)
    assert records[-1]["reader"]["kind"] == "connector"
    # The return is between batches, not a failure: the only failures are the direct path's on undecodable records
    lines = (Path(s.home) / "progress" / f"{p.name}.jsonl").read_text().splitlines()
    failures = [x["error"] for x in map(json.loads, lines) if x["type"] == "failure"]
    assert all("does not decode" in e for e in failures), failures


def test_lake_index_split_and_describe(tmp_path):
    """The driver's planning, without Spark: what the lake covers of a range, and how it is described."""
    index = LakeIndex.__new__(LakeIndex)
    index.lake, index.topic, index.batches = Lake(str(tmp_path)), "t", []
    from weir.storage.lake import Range

    index.coverage = {0: [Range(0, 10, 20, 10), Range(0, 30, 40, 10)]}
    got = index.split(OffsetRange("t", 0, 5, 35))
    assert [(r.start, r.end, c) for r, c in got] == [(5, 10, False), (10, 20, True), (20, 30, False), (30, 35, True)]
    assert [(r.start, r.end, c) for r, c in index.split(OffsetRange("t", 1, 0, 5))] == [(0, 5, False)]
    assert "offsets [10, 20), [30, 40)" in index.describe(0)
    assert "holds nothing of t partition 1" in index.describe(1)


def test_retention_guard_publishes_an_archiver_lagging_its_topic_retention(spark, bootstrap, tmp_path):
    prefix = uuid.uuid4().hex[:8]
    topic = f"{prefix}.events"
    p = Pipeline(f"guard-{prefix}")
    p.topic(topic, schema=SCHEMA, key="id", partitions=2, retention="1m", archived=True)
    archive = archiver_name(topic)
    # One small batch, then the archiver waits an hour: records stay unarchived, two hours old.
    s = settings(
        tmp_path, bootstrap, retention_guard_interval=0.5,
        processors={archive: {"trigger": "1 hour", "max_offsets_per_trigger": 4}},
    )  # fmt: skip
    Admin(bootstrap).create_topic(topic, 2, {"retention.ms": "60000"})
    old = int(datetime.now(UTC).timestamp() * 1000) - 2 * 3_600_000
    produce(bootstrap, topic, (Rec(i % 2, None, b"{}", None, old + i) for i in range(20)))
    log = Path(s.home) / "progress" / f"{p.name}.jsonl"

    def risks() -> list[dict]:
        lines = log.read_text().splitlines() if log.exists() else []
        return [x for x in map(json.loads, lines) if x["type"] == "retention_risk"]

    r = Runner(p, s, spark=spark, processors=[archive]).start()
    try:
        wait_for(lambda: {x["partition"] for x in risks()} == {0, 1}, 120, "retention_risk records")
    finally:
        r.stop()
    risk = risks()[-1]
    assert (risk["pipeline"], risk["processor"], risk["topic"], risk["reason"]) == (p.name, archive, topic, "lag")
    assert risk["retention_ms"] == 60_000 and risk["lag_ms"] > 2 * 3_600_000 - 60_000
    assert risk["time_left_ms"] == risk["retention_ms"] - risk["lag_ms"] < 0
    assert risk["latest_offset"] == 10 and risk["next_offset"] < 10


def test_fallback_counts_round_trip_in_the_offset_and_sum_in_the_progress_record():
    """Pure: @lakeFallback next to @dataLoss, never taken for a topic; the progress record's summary."""
    from weir.checkpoint.offsets import DataLoss, LakeFallback, fallback_from_json, from_json, to_json

    fb = LakeFallback().add([OffsetRange("t", 0, 5, 20), OffsetRange("t", 1, 0, 0)])
    fb = fb.add([OffsetRange("t", 1, 3, 9)])
    assert (fb.offsets, fb.ranges, fb.events) == (21, 2, 2)
    offset = to_json({"t": {0: 20, 1: 9}}, DataLoss(4, 1), fb)
    assert list(offset) == ["t", "@dataLoss", "@lakeFallback"]
    assert from_json(offset) == ({"t": {0: 20, 1: 9}}, DataLoss(4, 1))
    assert fallback_from_json(json.loads(json.dumps(offset))) == fb
    assert "@lakeFallback" not in to_json({"t": {0: 1}}, None, LakeFallback().add([]))
    many = LakeFallback()
    for i in range(15):
        many = many.add([OffsetRange("t", 0, i, i + 1)])
    assert len(many.last) == 10 and many.last[-1].start == 14 and many.ranges == 15

    before = to_json({"t": {0: 5}}, None, LakeFallback().add([OffsetRange("t", 0, 0, 5)]))
    summary = lake_fallback([
        {"startOffset": json.dumps(before), "endOffset": json.dumps(offset)},
        {"startOffset": None, "endOffset": {"other": {"0": 3}}},
    ])  # fmt: skip
    assert (summary["offsets"], summary["batch_offsets"], summary["events"]) == (21, 16, 2)
    assert lake_fallback([{"startOffset": None, "endOffset": json.dumps({"t": {"0": 1}})}]) is None
