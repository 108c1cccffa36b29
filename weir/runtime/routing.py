"""From a processor's result to Kafka records: which topic each row goes to, with what key, value and headers.

A routed DataFrame has the columns `_route`, `_dest` (destination topic, null for rows only counted),
`_absorbed`, `key` and `value` (BINARY), `headers` and `timestamp`, ready for the weir-kafka sink with a
per-row topic. "out"/"emit" rows go to the output topics, "late"/"dlq" rows to `<input>.late`/`<input>.dlq`
with their raw bytes and headers; "filtered", "duplicate" and "absorbed" are only counted. The rules:
docs/pipelines.md ("Outputs", "Dead letters, late records, filtered records").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.functions import arrow_udf

from weir.blocks.common import col
from weir.formats import ERROR_COLUMN, RecordWriter, record_writer
from weir.formats.ddl import parse_fields
from weir.kafka.headers import ERROR_HEADER, LATE_HEADER, PROCESSOR_HEADER, SOURCE_HEADER
from weir.pipeline.model import DeclarationError, Processor, Topic
from weir.pipeline.routes import ABSORB, ABSORBED, DLQ, DUPLICATE, EMIT, EXPIRED, FILTERED, LATE, OUT, REASON, ROUTE
from weir.runtime.provenance import PROVENANCE

DEST = "_dest"
SOURCE = "_src"  # (topic, partition, offset) of the input record behind an output row, when the row has it
SOURCE_TYPE = "struct<topic:string,partition:int,offset:bigint>"
OUTPUT = "_output"
COORDINATES = ("topic", "partition", "offset")


def declared_type(topic: Topic) -> T.StructType:
    """The topic's schema as a Spark struct (NOT NULL markers dropped: they are checked when decoding)."""
    return T.StructType(
        [T.StructField(f.name, T._parse_datatype_string(f.type_ddl)) for f in parse_fields(topic.schema)]
    )


def _compatible(given: T.DataType, declared: T.DataType) -> bool:
    if given == declared or isinstance(given, T.NullType):
        return True
    integral = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
    if isinstance(declared, T.LongType | T.IntegerType | T.ShortType):
        return isinstance(given, integral) and _width(given) <= _width(declared)
    if isinstance(declared, T.DoubleType):
        return isinstance(given, (*integral, T.FloatType, T.DecimalType))
    if isinstance(declared, T.TimestampType):
        return isinstance(given, T.TimestampNTZType)
    return False


def _width(t: T.DataType) -> int:
    return {T.ByteType: 1, T.ShortType: 2, T.IntegerType: 4, T.LongType: 8}[type(t)]


def output_problems(proc: Processor, result: DataFrame, topic: Topic) -> list[str]:
    """Why `result` cannot be written to `topic`, per field; empty when it can."""
    have = {f.name: f.dataType for f in result.schema.fields}
    declared = declared_type(topic)
    missing = [f.name for f in declared.fields if f.name not in have]
    if missing and "value" in have and isinstance(have["value"], T.BinaryType | T.StringType):
        return []  # raw bytes passed through as they are
    found = []
    if missing:
        found.append(
            f"processor {proc.name}: output {topic.name} lacks field(s) {', '.join(missing)} of the topic's schema "
            f"({topic.schema}); the result has {', '.join(have) or 'no columns'}"
        )
    for f in declared.fields:
        if f.name in have and not _compatible(have[f.name], f.dataType):
            found.append(
                f"processor {proc.name}: output {topic.name}: field {f.name} is {have[f.name].simpleString()}, "
                f"the topic declares {f.dataType.simpleString()}"
            )
    return found


def analysis_problem(proc: Processor, condition: str, params: dict[str, str], message: str,
                     inputs: dict[str, list[str]]) -> str:  # fmt: skip
    """One line for Spark's refusal of a processor's function (a typo in a column name: `F.col("tmep")`),
    naming the processor, the column and the columns its inputs have, instead of Spark's page of plan."""
    have = "; ".join(f"input {t} has {', '.join(c)} and the Kafka columns" for t, c in inputs.items())
    have = have or "it has no input topic"
    if condition.startswith("UNRESOLVED_COLUMN") or condition.startswith("UNRESOLVED_FIELD"):
        name = params.get("objectName") or params.get("fieldName") or "?"
        return f"processor {proc.name}: its function names column {name.strip('`')}, which does not exist ({have})"
    first = message.strip().split("\n", 1)[0]
    return f"processor {proc.name}: Spark refused its function: {first} ({have})"


def _header(name: str, value: Column) -> Column:
    return F.struct(F.lit(name).alias("key"), value.cast("binary").alias("value"))


def header_value(name: str) -> Column:
    """A Kafka row's first header called `name`, as a string (null: the record has none): how readers of weir's
    topics tell who wrote a record (`weir.processor`, `weir.pipeline`) and from which input (`weir.source`)."""
    found = F.filter(col("headers"), lambda h: h["key"] == name)
    return F.try_element_at(found, F.lit(1))["value"].cast("string")


def origin(df: DataFrame | Sequence[str]) -> Column | None:
    """(topic, partition, offset) of the input record behind each row of `df` (or of a frame with these
    columns): its coordinates, else the provenance a stateless function's result carried
    (weir.runtime.provenance); None when the rows have neither."""
    names = df.columns if isinstance(df, DataFrame) else df
    if all(c in names for c in COORDINATES):
        return F.struct(*map(col, COORDINATES)).cast(SOURCE_TYPE)
    if PROVENANCE in names:
        return col(PROVENANCE).cast(SOURCE_TYPE)
    return None


def _headers(names: Sequence[str], proc: Processor, refused: Column | None = None) -> Column:
    """weir.source (when the row has an input record), weir.processor, weir.error for dead letters (`refused`:
    why the output's format refused the row) and weir.late for late rows whose block gave a `_reason`."""
    hs = [_header(PROCESSOR_HEADER, F.lit(proc.name))]
    src = origin(names)
    if src is not None:
        parts = (src["topic"], src["partition"].cast("string"), src["offset"].cast("string"))
        hs.append(F.when(src["offset"].isNotNull(), _header(SOURCE_HEADER, F.concat_ws("/", *parts))))
    if ERROR_COLUMN in names:
        hs.append(F.when(col(ERROR_COLUMN).isNotNull(), _header(ERROR_HEADER, col(ERROR_COLUMN))))
    if REASON in names:
        hs.append(F.when((col(ROUTE) == LATE) & col(REASON).isNotNull(), _header(LATE_HEADER, col(REASON))))
    if refused is not None:
        hs.append(F.when(refused.isNotNull(), _header(ERROR_HEADER, refused)))
    return F.filter(F.array(*hs), lambda h: h.isNotNull())


def stamped(routed: DataFrame, headers: dict[str, str]) -> DataFrame:
    """A routed DataFrame with `headers` (name -> value) appended to every record's headers."""
    return routed if not headers else routed.withColumn("headers", stamped_headers(headers))


def stamped_headers(headers: dict[str, str]) -> Column:
    """A routed row's headers with `headers` (name -> value) appended."""
    if not headers:
        return col("headers")
    return F.concat(col("headers"), F.array(*[_header(k, F.lit(v)) for k, v in headers.items()]))


def writers(proc: Processor, topics: dict[str, Topic], registry_conf: dict[str, str]) -> dict[str, RecordWriter]:
    """The record writers of the processor's output topics whose values or keys have a format of their own
    (Avro, Protobuf, JSON Schema), made on the driver once per start: each registers its schemas with the
    registry first (or finds them there), so a schema the registry refuses stops the start with the registry's
    answer (docs/formats.md)."""
    return {
        name: record_writer(topics[name].format, topics[name].key_format, name, registry_conf)
        for name in proc.outputs
        if name in topics and (topics[name].format.kind != "json" or topics[name].key_format is not None)
    }


# struct<value binary, key binary, error string>: a row's value and key in its output topic's formats
ENCODED = "_encoded"
_ENCODED_TYPE = "struct<value:binary,key:binary,error:string>"


def _encoder_udf(encoder: RecordWriter) -> Callable[[Column], Column]:
    """`encoder` in the write's tasks, row by row refusals included: a row a format refuses gets its error,
    not a failed task (RecordWriter.encode_each)."""

    @arrow_udf(_ENCODED_TYPE)
    def encode(rows: pa.Array) -> pa.Array:
        return pa.StructArray.from_arrays(list(encoder.encode_each(rows)), names=["value", "key", "error"])

    return encode


def encoded_column(names: tuple[str, ...], proc: Processor, topics: dict[str, Topic],
                   encoders: dict[str, RecordWriter] | None) -> Column | None:  # fmt: skip
    """`ENCODED` for a result with these columns: an output row's value in its topic's format (Avro, Protobuf,
    JSON Schema), computed once, before routing reads it twice (the route, the value); None when no output
    topic of the processor has such a format."""
    outputs = [topics[t] for t in proc.outputs if t in topics and t in (encoders or {})]
    if not outputs:
        return None
    route_col = col(ROUTE) if ROUTE in names else F.lit(OUT)
    chosen = (lambda t: col(OUTPUT) == t.name) if OUTPUT in names else (lambda t: F.lit(True))
    parts = []
    for t in outputs:
        fields = declared_type(t).fields
        if any(f.name not in names for f in fields):
            continue  # the result carries its own key and value columns
        row = F.struct(*[col(f.name).cast(f.dataType).alias(f.name) for f in fields])
        wanted = route_col.isin(OUT, EMIT) & chosen(t)
        parts.append(F.when(wanted, _encoder_udf(encoders[t.name])(F.when(wanted, row))))
    return F.coalesce(*parts) if parts else None


def with_encoded(df: DataFrame, proc: Processor, topics: dict[str, Topic],
                 encoders: dict[str, RecordWriter] | None) -> DataFrame:  # fmt: skip
    """`df` with `ENCODED` when its processor writes a topic in a format of its own (see encoded_column)."""
    column = encoded_column(tuple(df.columns), proc, topics, encoders)
    return df if column is None else df.withColumn(ENCODED, column)


def refused_rows(frame: DataFrame, proc: Processor, topics: dict[str, Topic], encoders: dict[str, RecordWriter]) -> int:
    """The rows of a result (cached) whose output's format refuses them: dead letters, not filtered records."""
    column = encoded_column(tuple(frame.columns), proc, topics, encoders)
    return 0 if column is None else frame.where(column["error"].isNotNull()).count()


def _record(names: Sequence[str], topic: Topic, encoded: bool = False) -> tuple[Column, Column]:
    """(key, value) of an output record for `topic` from a result row (of a frame with these columns)."""
    declared = declared_type(topic)
    if any(f.name not in names for f in declared.fields):
        key = col("key").cast("binary") if "key" in names else F.lit(None).cast("binary")
        return key, (col("value") if "value" in names else F.lit(None)).cast("binary")
    if (topic.format.kind != "json" or topic.key_format is not None) and not (encoded and ENCODED in names):
        raise DeclarationError(f"topic {topic.name}: its formats need a writer (routing.writers)")
    if topic.format.kind == "json":
        value = F.to_json(F.struct(*[col(f.name).cast(f.dataType).alias(f.name) for f in declared.fields]))
    else:
        value = col(ENCODED)["value"]
    if topic.key_format is not None:
        key = col(ENCODED)["key"]
    elif topic.key is not None:
        key = col(topic.key).cast("string").cast("binary")
    else:
        key = F.lit(None).cast("binary")
    return key, value.cast("binary")


def out_records(
    names: Sequence[str], proc: Processor, topics: dict[str, Topic], headers: dict[str, str]
) -> list[Column]:
    """The Kafka records (topic, key, value, headers, timestamp) of a result whose every row goes "out" to the
    processor's one output in JSON (no `_route`, no `_output`, no format of its own), with `headers` stamped: what
    `route` then `stamped` give such rows, without the route's cases and the headers' filter, which Spark plans
    and evaluates for every row (a higher-order function runs uncompiled)."""
    out = topics[proc.outputs[0]]
    key, value = _record(names, out)
    stamp = [_header(k, F.lit(v)) for k, v in headers.items()]
    mine = _header(PROCESSOR_HEADER, F.lit(proc.name))
    src = origin(names)
    if src is None:
        hs = F.array(mine, *stamp)
    else:
        source = _header(SOURCE_HEADER, F.concat_ws("/", src["topic"], src["partition"].cast("string"),
                                                    src["offset"].cast("string")))  # fmt: skip
        hs = F.when(src["offset"].isNotNull(), F.array(mine, source, *stamp)).otherwise(F.array(mine, *stamp))
    stamp_col = col("timestamp").cast("timestamp") if "timestamp" in names else F.lit(None).cast("timestamp")
    return [F.lit(out.name).alias("topic"), key.alias("key"), value.alias("value"), hs.alias("headers"),
            stamp_col.alias("timestamp")]  # fmt: skip


def route(
    df: DataFrame, proc: Processor, topics: dict[str, Topic], encoders: dict[str, RecordWriter] | None = None
) -> DataFrame:
    """The routed form of a processor's result (docs/pipelines.md, routing); `encoders`: `writers`."""
    df = with_encoded(df, proc, topics, encoders)
    return df.select(*route_columns(tuple(df.columns), proc, topics, encoders))


def route_columns(
    names: tuple[str, ...], proc: Processor, topics: dict[str, Topic], encoders: dict[str, RecordWriter] | None = None
) -> list[Column]:
    """The columns of `route` for a result with these columns. Unresolved expressions, so one list serves every
    batch of a processor: building them takes a hundred calls into the JVM, a tenth of a second of every
    small batch's driver time on a loaded machine. A result of a processor that writes a format of its own
    (Avro, Protobuf, JSON Schema) has its `ENCODED` column (`with_encoded`): a row the format refuses is a dead
    letter, its row as JSON, with the format's reason (docs/formats.md)."""
    route_col = col(ROUTE) if ROUTE in names else F.lit(OUT)
    encoders = encoders or {}
    outputs = [topics[t] for t in proc.outputs if t in topics]
    if OUTPUT in names:
        dest_out = col(OUTPUT)
        pairs = [(col(OUTPUT) == t.name, _record(names, t, t.name in encoders)) for t in outputs]
    else:
        dest_out = F.lit(outputs[0].name) if outputs else F.lit(None).cast("string")
        pairs = [(F.lit(True), _record(names, outputs[0], outputs[0].name in encoders))] if outputs else []
    raw_key = col("key").cast("binary") if "key" in names else F.lit(None).cast("binary")
    raw_value = col("value").cast("binary") if "value" in names else F.lit(None).cast("binary")
    refused = None
    if ENCODED in names:
        refused = F.when(route_col.isin(OUT, EMIT), col(ENCODED)["error"])
        route_col = F.when(refused.isNotNull(), F.lit(DLQ)).otherwise(route_col)
        fields = sorted({f.name for t in outputs for f in declared_type(t).fields if f.name in names})
        raw_value = F.when(refused.isNotNull(), F.to_json(F.struct(*map(col, fields))).cast("binary")).otherwise(
            raw_value
        )
    is_output = route_col.isin(OUT, EMIT)

    def pick(i: int, raw: Column) -> Column:
        expr = None
        for cond, kv in pairs:
            expr = (F.when if expr is None else expr.when)(is_output & cond, kv[i])
        return raw if expr is None else expr.otherwise(raw)

    src_topic = col("topic") if "topic" in names else F.lit(None).cast("string")
    if refused is not None and proc.inputs:  # a refused output row without its input's topic: the first input's
        src_topic = F.when(refused.isNotNull(), F.coalesce(src_topic, F.lit(proc.inputs[0]))).otherwise(src_topic)
    dest = (
        F.when(is_output, dest_out)
        .when(route_col == LATE, F.concat(src_topic, F.lit(".late")))
        .when(route_col == DLQ, F.concat(src_topic, F.lit(".dlq")))
    )
    if proc.sink is not None:  # a sink processor's results go to its sink, not to a topic
        dest = F.when(is_output, F.lit(None).cast("string")).otherwise(dest)
    if proc.shadow is not None:  # a shadow writes topics of its own, never the live ones (null stays null)
        dest = F.concat(dest, F.lit(proc.shadow.suffix))
    stamp = col("timestamp").cast("timestamp") if "timestamp" in names else F.lit(None).cast("timestamp")
    # A struct, not a "t/p/o" string: counting distinct structs of three columns is cheaper than building and
    # shuffling a string per row (this column is only ever counted, see route_groups).
    src = origin(names)
    source = F.lit(None).cast(SOURCE_TYPE) if src is None else F.when(is_output & src["offset"].isNotNull(), src)
    absorbed = col(ABSORBED).cast("long") if ABSORBED in names else F.lit(None).cast("long")
    return [
        route_col.alias(ROUTE),
        dest.alias(DEST),
        F.when(route_col.isin(ABSORB, EXPIRED), absorbed).alias(ABSORBED),
        pick(0, raw_key).alias("key"),
        pick(1, raw_value).alias("value"),
        _headers(names, proc, refused).alias("headers"),
        stamp.alias("timestamp"),
        source.alias(SOURCE),
    ]


def destinations(proc: Processor) -> list[tuple[str, str | None]]:
    """Every (route, destination topic) that `route` gives a processor's rows: its outputs for "out" and
    "emit" (none for a sink processor), `<input>.late` and `<input>.dlq`, no topic for the rest (and for late
    and dead-letter rows without a source topic)."""
    outs: list[str | None] = [*proc.outputs] if proc.sink is None and proc.outputs else [None]
    combos = [(r, t) for r in (OUT, EMIT) for t in outs]
    for r, suffix in ((LATE, ".late"), (DLQ, ".dlq")):
        combos += [(r, f"{t}{suffix}") for t in proc.inputs] + [(r, None)]
    combos += [(r, None) for r in (ABSORB, DUPLICATE, FILTERED, EXPIRED)]
    if proc.shadow is not None:
        return [(r, None if t is None else proc.shadow.topic(t)) for r, t in combos]
    return combos


def dead_letters(batch: DataFrame, proc: Processor) -> DataFrame:
    """Routed rows for the input records with `_error` set: they failed to decode, or user code raised on them."""
    bad = batch.where(col(ERROR_COLUMN).isNotNull()).withColumn(ROUTE, F.lit(DLQ))
    return route(bad.select(*COORDINATES, "key", "value", "timestamp", ERROR_COLUMN, ROUTE), proc, {})


def check_outputs(proc: Processor, result: DataFrame | dict, topics: dict[str, Topic]) -> None:
    """Raise DeclarationError when a result cannot be written to its declared output topic(s)."""
    found = []
    for name, df in _by_output(proc, result).items():
        if name in topics:
            found += output_problems(proc, df, topics[name])
    if proc.stateful and ROUTE not in next(iter(_by_output(proc, result).values())).columns:
        found.append(
            f"processor {proc.name} is stateful, but its result has no {ROUTE} column: build it with weir's "
            f"stateful blocks (joins, windows, deduplicate, @stateful), which account for every input record"
        )
    if found:
        raise DeclarationError("\n".join(found))


def _by_output(proc: Processor, result: DataFrame | dict) -> dict[str, DataFrame]:
    if isinstance(result, dict):
        unknown = sorted(set(result) - set(proc.outputs))
        if unknown:
            raise DeclarationError(
                f"processor {proc.name} returned output(s) {', '.join(unknown)} it does not declare "
                f"(declared: {', '.join(proc.outputs)})"
            )
        return result
    if not isinstance(result, DataFrame):
        raise DeclarationError(
            f"processor {proc.name} returned {type(result).__name__}; it must return a DataFrame or a dict of "
            f"DataFrames by output topic"
        )
    if len(proc.outputs) > 1 and OUTPUT not in result.columns:
        raise DeclarationError(
            f"processor {proc.name} has {len(proc.outputs)} outputs: return a dict by topic, or add an "
            f"{OUTPUT} column naming each row's topic"
        )
    if OUTPUT in result.columns:
        return {t: result for t in proc.outputs}
    return {proc.outputs[0]: result} if proc.outputs else {"": result}


def by_route(combos: list[tuple[str, str | None]]) -> list[Column]:
    """Aggregates of routed rows: all of them, the records they absorbed, the keys whose state expired, and the
    rows of each (route, destination) in `combos`, as `n<index>`."""
    is_dest = [col(DEST).isNull() if d is None else col(DEST) == d for _, d in combos]
    metrics = [
        F.count(F.lit(1)).alias("rows"),
        F.coalesce(F.sum(F.when(col(ROUTE) == ABSORB, col(ABSORBED))), F.lit(0)).alias("absorbed"),
        F.coalesce(F.sum(F.when(col(ROUTE) == EXPIRED, col(ABSORBED))), F.lit(0)).alias("expired"),
    ]
    pairs = enumerate(zip(combos, is_dest, strict=True))
    return metrics + [F.count_if((col(ROUTE) == r) & c).alias(f"n{i}") for i, ((r, _), c) in pairs]


def route_groups(routed: DataFrame, sources: bool = True) -> list:
    """Rows and absorbed records per route and destination, and (with `sources`, else 0) the distinct input
    records behind them: one small row per group, the action that computes (and caches) the batch."""
    distinct = F.count_distinct(SOURCE) if sources else F.lit(0)
    return (
        routed.groupBy(ROUTE, DEST)
        .agg(F.count("*").alias("n"), F.coalesce(F.sum(ABSORBED), F.lit(0)).alias("a"), distinct.alias("sources"))
        .collect()
    )


def observed_groups(got: dict, combos: list[tuple[str, str | None]]) -> list[tuple[str | None, str | None, int, int]]:
    """(route, destination, rows, absorbed) groups from an observed row of `by_route(combos)`: those with rows, and
    the rows under no combo as one group of no route (a violation for `from_routes`)."""
    groups = []
    for i, (r, d) in enumerate(combos):
        n = int(got[f"n{i}"])
        if n:
            absorbed = int(got["absorbed"]) if r == ABSORB else int(got["expired"]) if r == EXPIRED else 0
            groups.append((r, d, n, absorbed))
    stray = int(got["rows"]) - sum(n for _, _, n, _ in groups)
    if stray:
        groups.append((None, None, stray, 0))
    return groups


# Logical operators after which a partition's rows no longer come in the order its input records were read
_REORDERING = frozenset((
    "Join", "Aggregate", "Window", "Sort", "Repartition", "RepartitionByExpression", "RebalancePartitions",
    "Deduplicate", "DeduplicateWithinWatermark", "FlatMapGroupsInPandas", "FlatMapCoGroupsInPandas",
    "FlatMapGroupsInArrow", "FlatMapCoGroupsInArrow", "GlobalLimit", "Expand", "Intersect", "Except",
))  # fmt: skip


def keeps_order(df: DataFrame, analyzed: bool = False) -> bool:
    """Whether `df`'s optimized plan keeps each partition's rows in the order of the input records they came from:
    only row by row operators (projections, filters, explodes, narrow unions), no join, aggregate, sort or
    exchange."""
    qe = df._jdf.queryExecution()
    # A streaming DataFrame has no optimized plan outside its query (Spark refuses to plan it as a batch): its
    # analyzed plan names the same operators, before the optimizer removes any
    plan = (qe.analyzed() if analyzed else qe.optimizedPlan()).toString()
    for line in plan.splitlines():
        node = line.lstrip(" :+-|").split(" ", 1)[0]
        if node in _REORDERING:
            return False
    return True
