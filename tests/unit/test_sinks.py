"""Pure helpers of weir.sinks, without Spark: writer names, batch directories, type mapping, DSN redaction."""

from __future__ import annotations

import json

import pytest
from pyspark.sql import types as T

from weir.config import Settings
from weir.lake.archive import ArchiveSink, archiver
from weir.pipeline import Pipeline
from weir.pipeline.graph import text
from weir.pipeline.validate import problems
from weir.runtime.query import Batch, Ledger, ProcessorQuery
from weir.sinks import Delivery, KafkaSink, ParquetSink, PostgresSink, Sink, SinkError, Written, check_writer_name
from weir.sinks.parquet import batch_dir_name, check_atomic_rename, parse_batch_dir
from weir.sinks.postgres import csv_safe, parse_table, pg_columns, pg_type, redact_dsn, scrub

SECRET = "s3cr3t-Pa55"


class Memory(Sink):
    """The least a sink must say: how to write a batch. Everything else is the base class's default."""

    def __init__(self, result: Written | None = None) -> None:
        self.result = result or Written(0)
        self.batches: list[tuple[object, int]] = []

    def write(self, batch, batch_id: int) -> Written:
        self.batches.append((batch, batch_id))
        return self.result


class Chain:
    """Stands for Spark's reader and writer builders: records options, returns itself."""

    def __init__(self) -> None:
        self.opts: dict[str, str] = {}
        self.calls: list[str] = []

    @property
    def readStream(self) -> Chain:
        return self

    @property
    def writeStream(self) -> Chain:
        return self

    def option(self, key: str, value) -> Chain:
        self.opts[key] = value
        return self

    def options(self, **opts) -> Chain:
        self.opts.update(opts)
        return self

    def __getattr__(self, name: str):
        def call(*args, **kwargs) -> Chain:
            self.calls.append(name)
            return self

        return call


@pytest.fixture(autouse=True)
def _no_read_observation(monkeypatch) -> None:
    """The fake session builds no Spark columns: the read observation (a Spark expression) is left out here; its
    own tests run with Spark (tests/integration/test_run.py)."""
    import weir.runtime.query

    monkeypatch.setattr(weir.runtime.query, "_observe_reads", lambda stream, topic: stream)


def query(tmp_path, sink: Sink | None, inputs=("orders",), lake: str | None = None) -> tuple[ProcessorQuery, Chain]:
    p = Pipeline("shop")
    for name in inputs:
        p.topic(name, schema="id BIGINT")
    p.processor(inputs=list(inputs), name="store", sink=sink)(lambda *dfs: dfs[0])
    [proc] = p.processors.values()
    # flow = static: adaptive admission reads Spark's conf (memory, parallelism), which this chain of calls lacks.
    settings = Settings(
        home=str(tmp_path), lake=lake or str(tmp_path / "lake"), checkpoint_root=str(tmp_path / "cp"), flow="static"
    )
    spark = Chain()
    return ProcessorQuery(spark, p, proc, settings, Ledger(), str(tmp_path / "cp" / "q")), spark  # type: ignore[arg-type]


# -- the contract ---------------------------------------------------------------------------------------
def test_each_sink_declares_its_capabilities(tmp_path) -> None:
    plain = [ParquetSink(str(tmp_path / "out")), PostgresSink("host=h", "t"), KafkaSink("out", "h:9092")]
    for sink in plain:
        assert sink.reads_raw is False and sink.starting_offsets() is None
    archive = ArchiveSink(str(tmp_path / "lake"), "orders")
    assert archive.reads_raw is True
    assert archive.starting_offsets() is None  # an empty lake: the broker's earliest offset
    archive.open("archive.orders", str(tmp_path / "cp"))  # the checkpoint comes with open, not by assignment
    assert (archive.writer, archive.checkpoint) == ("archive.orders", str(tmp_path / "cp"))


def test_a_sink_that_only_writes_gets_every_default() -> None:
    sink = Memory()
    assert sink.guarantee is Delivery.AT_LEAST_ONCE  # exactly-once is claimed, never assumed
    assert sink.reads_raw is False
    assert sink.starting_offsets() is None
    assert sink.name == "Memory" and repr(sink) == "Memory('Memory', at-least-once)"
    assert sink.writer is None
    sink.open("shop.store")  # a backfill chunk: no checkpoint
    sink.open("shop.store", "/checkpoints/shop/store")  # the runner: the query's checkpoint too
    assert sink.writer == "shop.store"
    with pytest.raises(SinkError, match="invalid writer name"):
        sink.open("shop/store")
    sink.name = "memory:test"
    assert sink.name == "memory:test"


def test_written_counts_rows_written_and_rows_a_replay_found_delivered() -> None:
    assert Written(5) == Written(5, replayed=0) and Written(5).delivered == 5
    replay = Written(0, replayed=500)  # an exactly-once sink skipped a replayed batch: its rows are there
    assert (replay.rows, replay.replayed, replay.delivered) == (0, 500, 500)
    assert Written(200, replayed=300).delivered == 500  # a replay that completed what a crash left undone
    with pytest.raises(ValueError, match="never negative"):
        Written(-1)
    with pytest.raises(AttributeError):
        replay.rows = 1  # type: ignore[misc]


def test_a_pipeline_accepts_any_sink_subclass_and_refuses_anything_else() -> None:
    p = Pipeline("shop")
    orders = p.topic("orders", schema="id BIGINT")
    p.processor(inputs=[orders], name="good", sink=Memory())(lambda df: df)
    p.processor(inputs=[orders], name="bad", sink=object())(lambda df: df)  # type: ignore[arg-type]
    found = problems(p)
    assert len(found) == 1 and found[0].startswith("processor bad: sink <object object at")
    assert found[0].endswith("is not a weir.sinks.Sink (subclass it and implement write(batch, batch_id))")
    del p.processors["bad"]
    assert "Memory [sink]" in text(p)


def test_the_runtime_drives_a_minimal_sink_through_the_base_class(tmp_path) -> None:
    sink = Memory()
    q, spark = query(tmp_path, sink)
    assert not q.archive  # not a raw reader: dead letters, the user function, a lake fallback
    q.source(q.topics["orders"])
    assert spark.opts["startingOffsets"] == "earliest" and spark.opts["lake"] == str(tmp_path / "lake")
    q.start()
    assert sink.writer == "shop.store"  # opened with the query's name
    assert "foreachBatch" in spark.calls and spark.opts["checkpointLocation"] == q.checkpoint


def test_each_input_starts_at_its_part_of_the_sinks_starting_offsets(tmp_path) -> None:
    class Resuming(Memory):
        def starting_offsets(self):
            return {"orders": {"0": 7, "1": 9}, "elsewhere": {"0": 1}}

    q, spark = query(tmp_path, Resuming(), inputs=("orders", "customers"))
    q.source(q.topics["orders"])
    assert json.loads(spark.opts["startingOffsets"]) == {"orders": {"0": 7, "1": 9}}  # not the other topics
    q.source(q.topics["customers"])
    assert spark.opts["startingOffsets"] == "earliest"  # a topic the sink does not name


def test_a_raw_readers_replayed_batch_counts_as_delivered(tmp_path) -> None:
    class Raw(Memory):
        reads_raw = True

    sink = Raw(Written(0, replayed=60))
    q, spark = query(tmp_path, sink)
    assert q.archive
    q.source(q.topics["orders"])
    assert "lake" not in spark.opts  # an archiver never reads the lake it writes
    q._archive_batch("batch", Batch(3))  # type: ignore[arg-type]
    counts = q.ledger.take(q.name, 3)
    assert sink.batches == [("batch", 3)]
    assert counts.out == 60 and counts.outputs == {"Raw": 60}


def test_the_archiver_takes_its_checkpoint_from_open(tmp_path) -> None:
    proc = archiver(str(tmp_path / "lake"), "orders")
    p = Pipeline("shop")
    p.topic("orders", schema="id BIGINT")
    p.processors[proc.name] = proc
    settings = Settings(
        home=str(tmp_path), lake=str(tmp_path / "lake"), checkpoint_root=str(tmp_path / "cp"), flow="static"
    )
    q = ProcessorQuery(Chain(), p, proc, settings, Ledger(), str(tmp_path / "cp" / "_archive" / "orders"))  # type: ignore[arg-type]
    q.start()
    assert proc.sink.checkpoint == q.checkpoint and proc.sink.writer == "shop.archive.orders"


@pytest.mark.parametrize("name", ["shop.enrich", "a", "Q-1_x.y", "7up", "x" * 128])
def test_valid_writer_names(name: str) -> None:
    assert check_writer_name(name) == name


@pytest.mark.parametrize("name", ["", "a/b", "a=b", "a b", ".hidden", "_x", "-x", "x" * 129, "é", "a'b", None])
def test_invalid_writer_names_are_refused(name) -> None:
    with pytest.raises(SinkError, match="invalid writer name"):
        check_writer_name(name)


def test_exactly_once_sink_refuses_to_write_before_open(tmp_path) -> None:
    with pytest.raises(SinkError, match=r"call open\(query_name\)"):
        ParquetSink(str(tmp_path / "out")).write(None, 0)  # type: ignore[arg-type]


# -- Parquet ------------------------------------------------------------------------------------------
def test_batch_directory_names_round_trip_and_sort_by_batch() -> None:
    assert batch_dir_name("shop.enrich", 7) == "weir_batch=shop.enrich-000000000007"
    assert parse_batch_dir(batch_dir_name("a-b-c", 12)) == ("a-b-c", 12)
    assert parse_batch_dir(batch_dir_name("w", 10**13)) == ("w", 10**13)
    assert parse_batch_dir("date=2024-01-01") is None
    assert parse_batch_dir("weir_batch=w-12") is None  # not 12 digits: not ours
    names = [batch_dir_name("w", i) for i in (10, 9, 100)]
    assert sorted(names) == [batch_dir_name("w", i) for i in (9, 10, 100)]


def test_object_stores_are_refused_because_their_rename_is_a_copy() -> None:
    class S3Like:
        type_name = "s3"

    with pytest.raises(SinkError, match="not atomic"):
        check_atomic_rename(S3Like(), "s3://bucket/out")  # type: ignore[arg-type]


def test_relative_and_url_paths_resolve_to_one_local_directory(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert ParquetSink("out").root == str(tmp_path / "out")
    assert ParquetSink(f"file://{tmp_path}/out/").root == str(tmp_path / "out")
    assert ParquetSink("out").name == "parquet:out"


# -- PostgreSQL types and names -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spark_type", "pg"),
    [
        (T.BooleanType(), "boolean"),
        (T.ByteType(), "smallint"),
        (T.ShortType(), "smallint"),
        (T.IntegerType(), "integer"),
        (T.LongType(), "bigint"),
        (T.FloatType(), "real"),
        (T.DoubleType(), "double precision"),
        (T.DecimalType(12, 3), "numeric(12,3)"),
        (T.StringType(), "text"),
        (T.VarcharType(10), "varchar(10)"),
        (T.BinaryType(), "bytea"),
        (T.DateType(), "date"),
        (T.TimestampType(), "timestamptz"),
        (T.TimestampNTZType(), "timestamp"),
        (T.DayTimeIntervalType(), "interval"),
        (T.ArrayType(T.LongType()), "bigint[]"),
        (T.ArrayType(T.StringType()), "text[]"),
    ],
)
def test_spark_types_map_to_postgres_types(spark_type: T.DataType, pg: str) -> None:
    assert pg_type(spark_type) == pg


@pytest.mark.parametrize(
    "spark_type",
    [
        T.MapType(T.StringType(), T.LongType()),
        T.StructType([T.StructField("a", T.LongType())]),
        T.ArrayType(T.ArrayType(T.LongType())),
        T.ArrayType(T.MapType(T.StringType(), T.StringType())),
        T.NullType(),
        T.YearMonthIntervalType(),
        T.CalendarIntervalType(),
        T.VariantType(),
    ],
)
def test_types_without_a_faithful_postgres_column_are_unsupported(spark_type: T.DataType) -> None:
    assert pg_type(spark_type) is None


def test_unsupported_columns_are_all_named_in_one_error() -> None:
    schema = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("attrs", T.MapType(T.StringType(), T.StringType())),
            T.StructField("pos", T.StructType([T.StructField("x", T.DoubleType())])),
        ]
    )
    with pytest.raises(SinkError, match=r"'attrs' \(map<string,string>\), 'pos' \(struct<x:double>\).*to_json"):
        pg_columns(schema)
    assert pg_columns(T.StructType([T.StructField("id", T.LongType())])) == [("id", "bigint")]


def test_only_types_that_survive_csv_take_the_csv_copy_path() -> None:
    flat = T.StructType([T.StructField("a", T.LongType()), T.StructField("b", T.TimestampType())])
    assert csv_safe(flat)
    assert not csv_safe(flat.add("c", T.BinaryType()))
    assert not csv_safe(flat.add("c", T.ArrayType(T.LongType())))


def test_table_names() -> None:
    assert parse_table("events") == (None, "events")
    assert parse_table("analytics.Events") == ("analytics", "Events")
    for bad in ("", "a.b.c", ".t", "s.", "x" * 64):
        with pytest.raises(SinkError, match="not a table name"):
            parse_table(bad)


# -- credentials --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "dsn",
    [
        f"postgresql://writer:{SECRET}@db.example:5432/shop?sslmode=require",
        f"host=db.example port=5432 dbname=shop user=writer password={SECRET}",
        f"host=db.example port=5432 dbname=shop user=writer password='{SECRET}'",
    ],
)
def test_dsn_redaction_keeps_where_and_drops_the_password(dsn: str) -> None:
    shown = redact_dsn(dsn)
    assert SECRET not in shown
    assert shown == "host=db.example port=5432 dbname=shop user=writer"
    assert SECRET not in scrub(f"failed with {dsn}: password={SECRET}", dsn)


def test_scrub_hides_passwords_it_was_not_told_about() -> None:
    text = "retry postgresql://u:hunter2@h/db and password=hunter2 and PASSWORD = 'hunter 2'"
    assert "hunter" not in scrub(text, "host=h")


def test_a_url_encoded_password_is_hidden_in_both_spellings() -> None:
    dsn = "postgresql://u:p%40ss%20word@h/db"
    assert "p@ss word" not in scrub("auth failed for p@ss word", dsn)
    assert "p%40ss" not in scrub("dsn was p%40ss%20word", dsn)


def test_sink_names_and_reprs_never_carry_the_dsn() -> None:
    sink = PostgresSink(f"host=h user=u password={SECRET}", "public.events", key=["id"])
    assert SECRET not in sink.name and SECRET not in repr(sink)
    assert sink.name == "postgres:public.events"


def test_an_unparseable_dsn_is_refused_without_quoting_it() -> None:
    # libpq's parser would say: missing "=" after "Pa55" in connection info string.
    with pytest.raises(SinkError, match="could not be parsed") as info:
        PostgresSink("host=h password=s3cr3t Pa55", "t")
    assert "Pa55" not in str(info.value) and info.value.__cause__ is None


def test_kafka_sink_options_redact_credentials_and_spell_settings_with_dots() -> None:
    sink = KafkaSink(
        "out", ["b1:9092", "b2:9092"], sasl_password=SECRET, compression_type="lz4", **{"enable.idempotence": True}
    )
    assert sink.options == {
        "kafka.bootstrap.servers": "b1:9092,b2:9092",
        "topic": "out",
        "kafka.sasl.password": "***",
        "kafka.compression.type": "lz4",
        "kafka.enable.idempotence": "true",
    }
    assert SECRET not in repr(sink)


def test_opening_after_a_clean_run_says_nothing_of_leftovers_and_removes_the_empty_staging(tmp_path, caplog):
    sink = ParquetSink(str(tmp_path / "out"))
    staging = tmp_path / "out.staging" / "w"
    staging.mkdir(parents=True)  # what a clean run used to leave behind
    with caplog.at_level("INFO", logger="weir"):
        sink.open("w")
    assert not staging.exists() and "leftover" not in caplog.text
    (staging / "000000000003-abc").mkdir(parents=True)  # a batch a crash interrupted before its publish
    with caplog.at_level("INFO", logger="weir"):
        sink.open("w")
    assert not staging.exists() and "deleting 1 staging leftover(s) of writer w" in caplog.text
