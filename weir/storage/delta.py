"""Delta tables by URL (a local path, or `s3://` on any S3-compatible store), through delta-rs: no JVM jar.

Writing is split as Spark splits work: `FileWriter` runs inside a task and writes Parquet files into the table's
directory (invisible to readers until committed); `commit` runs on the driver and adds them in one Delta commit
carrying an app transaction (writer, batch id), so a replayed batch is recognised and skipped. Credentials come
from the usual AWS settings (environment, profile, instance role), read by delta-rs and pyarrow themselves:
weir passes them on and never logs them. Commit order and crash cases: docs/lake.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from weir.storage import paths

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

COMMIT_KEY = "weir"  # the commit info key of weir's own facts about a commit (writer, batch, rows, ...)
# The AWS settings delta-rs and pyarrow read; passed to delta-rs explicitly so a lake on S3 needs nothing else.
_AWS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_ALLOW_HTTP")  # fmt: skip
_MS = timedelta(milliseconds=1)
FILE_META = "path string, size long, rows long, partition_values string, stats string, schema binary"


class DeltaError(RuntimeError):
    """A Delta table cannot do what was asked; the message names the table, never a credential."""


def table_url(path_or_url: str) -> str:
    """The URL delta-rs opens: an absolute local path, or the URL as given (s3://bucket/prefix)."""
    text = paths.url(path_or_url)
    return text.removeprefix("file://") if text.startswith("file://") else text


def storage_options(url: str) -> dict[str, str]:
    """delta-rs storage options for `url`: for s3:// the AWS settings of the environment (never logged), and
    plain HTTP allowed when the endpoint says http:// (a local S3 server)."""
    if not url.startswith(("s3://", "s3a://")):
        return {}
    opts = {k: os.environ[k] for k in _AWS if os.environ.get(k)}
    endpoint = opts.get("AWS_ENDPOINT_URL_S3") or opts.get("AWS_ENDPOINT_URL") or ""
    if endpoint.startswith("http://"):
        opts.setdefault("AWS_ALLOW_HTTP", "true")
    if "AWS_REGION" not in opts and "AWS_DEFAULT_REGION" in opts:
        opts["AWS_REGION"] = opts["AWS_DEFAULT_REGION"]
    return opts


def open_table(url: str, version: int | None = None, at: datetime | str | None = None) -> DeltaTable | None:
    """The Delta table at `url` (at `version`, or as of instant `at`: time travel), None if there is none."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    url = table_url(url)
    try:
        dt = DeltaTable(url, version=version, storage_options=storage_options(url))
    except TableNotFoundError:
        return None
    if at is not None:
        dt.load_as_version(at)
    return dt


def dataset(url: str, version: int | None = None, at: datetime | str | None = None) -> Any:
    """The table's current (or travelled-to) files as a pyarrow dataset: pandas, polars and DuckDB read it."""
    dt = open_table(url, version, at)
    if dt is None:
        raise DeltaError(f"no Delta table at {table_url(url)}")
    return arrow_dataset(dt)


def arrow_dataset(dt: DeltaTable) -> Any:
    """The table's files at its loaded version as a pyarrow dataset, whose files carry their partition values
    (hive paths) and nothing else. delta-rs' own `to_pyarrow_dataset()` also adds every file's log statistics to
    its partition expression, and a column without min/max there (weir records them for numeric and time
    columns only) becomes `col >= null`: any filter on it then skips every file (measured with deltalake 1.6.6:
    `category = 'books'` matched 0 of 98 rows, and `_error IS NOT NULL` all 300). Readers still prune by the
    partition values here, and by the Parquet footers' statistics. The files are the log's (add actions), opened
    through pyarrow with the same URL and AWS settings as delta-rs."""
    from urllib.parse import unquote

    import pyarrow as pa
    import pyarrow.dataset as pads

    schema = pa.schema(dt.schema().to_arrow())
    columns = dt.metadata().partition_columns
    filesystem, root = paths.resolve(table_url(dt.table_uri))
    files = [f"{root}/{unquote(p)}" for p in pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist()]
    partitioning = pads.partitioning(pa.schema([schema.field(c) for c in columns]), flavor="hive") if columns else None
    return pads.dataset(files, schema=schema, filesystem=filesystem, format="parquet", partitioning=partitioning,
                        partition_base_dir=root)  # fmt: skip


# -- executors: writing files ----------------------------------------------------------------------------
@dataclass
class _Open:
    rel: str
    sink: Any  # the output stream
    writer: Any  # pq.ParquetWriter
    values: dict[str, str | None]
    rows: int = 0
    stats: dict[str, Any] | None = None
    pending: list = field(default_factory=list)  # tables not yet written: a row group is written when enough wait
    waiting: int = 0


# Rows buffered per file before a row group is written, and in all of a writer's files together (a task's memory:
# about 60 MB of 250-byte records): each write call of a ParquetWriter is a row group, and 20k-row groups (one per
# consumed chunk) compress and read worse.
ROW_GROUP = 65_536
PENDING = 4 * ROW_GROUP


class FileWriter:
    """Inside a task: writes Arrow batches as Parquet files under a table's directory, one per partition value
    combination, and describes each (for the driver's commit). Files are named `part-<tag>-<uuid>.parquet`:
    never overwritten, and invisible to Delta readers until a commit adds them."""

    def __init__(self, url: str, tag: str, partition_by: Sequence[str] = (), plain: Sequence[str] = ()) -> None:
        self.fs, self.root = paths.resolve(table_url(url))
        self.tag, self.partition_by = tag, list(partition_by)
        # Columns written without a dictionary: values nearly all distinct (raw bytes, offsets), where building
        # one only to drop it cost about a third of the Parquet write.
        self.plain = set(plain)
        self.files: dict[tuple, _Open] = {}
        self.waiting = 0

    def write(self, batch: pa.RecordBatch) -> None:
        """Rows that carry their partition columns: split by their values."""
        import pyarrow as pa

        if batch.num_rows == 0:
            return
        for key, part in _split(pa.Table.from_batches([batch]), self.partition_by):
            self.add(key, part)

    def add(self, key: tuple[str | None, ...], rows: pa.Table | pa.RecordBatch) -> None:
        """Rows of the partition whose values (as strings) are `key`, without the partition columns."""
        import pyarrow as pa

        if rows.num_rows == 0:
            return
        table = rows if isinstance(rows, pa.Table) else pa.Table.from_batches([rows])
        f = self._file(key, table.schema)
        f.pending.append(table)
        f.waiting += table.num_rows
        self.waiting += table.num_rows
        if f.waiting >= ROW_GROUP:
            self._flush(f)
        elif self.waiting >= PENDING:
            for other in self.files.values():
                self._flush(other)

    def _flush(self, f: _Open) -> None:
        import pyarrow as pa

        if not f.pending:
            return
        table = pa.concat_tables(f.pending) if len(f.pending) > 1 else f.pending[0]
        f.writer.write_table(table, row_group_size=max(table.num_rows, 1))
        f.rows += table.num_rows
        f.stats = _merge(f.stats, _stats(table))
        self.waiting -= f.waiting
        f.pending, f.waiting = [], 0

    def close(self) -> Iterator[dict[str, Any]]:
        """Close every file; one description per file, the FILE_META columns."""
        for f in self.files.values():
            self._flush(f)
            f.writer.close()
            f.sink.close()
            size = self.fs.get_file_info(f"{self.root}/{f.rel}").size
            yield {
                "path": f.rel, "size": size, "rows": f.rows, "partition_values": json.dumps(f.values),
                "stats": json.dumps(_stats_json(f.rows, f.stats or {})),
                "schema": f.writer.schema.serialize().to_pybytes(),
            }  # fmt: skip
        self.files = {}

    def abort(self) -> None:
        """Close what is open after a failure: the files stay unreferenced (no commit names them)."""
        for f in self.files.values():
            for close in (f.writer.close, f.sink.close):
                with contextlib.suppress(Exception):  # the failure that brought us here is the one to raise
                    close()
        self.files = {}

    def _file(self, key: tuple, schema: pa.Schema) -> _Open:
        import pyarrow.parquet as pq

        if key not in self.files:
            values = dict(zip(self.partition_by, key, strict=True))
            prefix = "/".join(f"{k}={_escape(v)}" for k, v in values.items())
            rel = paths.join(prefix, f"part-{self.tag}-{uuid.uuid4().hex}.parquet").lstrip("/")
            parent = f"{self.root}/{rel}".rsplit("/", 1)[0]
            self.fs.create_dir(parent, recursive=True)
            sink = self.fs.open_output_stream(f"{self.root}/{rel}")
            dictionary = [n for n in schema.names if n not in self.plain] if self.plain else True
            writer = pq.ParquetWriter(sink, schema, compression="snappy", use_dictionary=dictionary)
            self.files[key] = _Open(rel, sink, writer, values)
        return self.files[key]


def describe(filesystem: Any, path: str, rel: str, values: dict[str, str | None]) -> dict[str, Any]:
    """The FileWriter description (FILE_META) of a Parquet file another writer wrote (Spark's own), from its
    footer: rows, and statistics merged over its row groups."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with filesystem.open_input_file(path) as f:
        pf = pq.ParquetFile(f)
        meta, schema = pf.metadata, pf.schema_arrow
    stats: dict[str, Any] = {}
    for i in range(meta.num_columns):
        name = meta.schema.column(i).path
        if "." in name or name not in schema.names:
            continue  # nested: no statistics Delta readers use
        t = schema.field(name).type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_timestamp(t) or pa.types.is_date(t)):
            continue
        merged: tuple | None = (None, None, 0)
        for g in range(meta.num_row_groups):
            st = meta.row_group(g).column(i).statistics
            if st is None or merged is None:
                merged = None
                continue
            lo, hi, n = merged
            if st.has_min_max:
                lo, hi = _pick(min, lo, st.min), _pick(max, hi, st.max)
            elif st.null_count != meta.row_group(g).num_rows:
                merged = None  # values without bounds: no statistics at all, rather than wrong ones
                continue
            merged = (lo, hi, n + (st.null_count or 0))
        if merged is not None:
            stats[name] = merged
    size = filesystem.get_file_info(path).size
    return {
        "path": rel, "size": size, "rows": meta.num_rows, "partition_values": json.dumps(values),
        "stats": json.dumps(_stats_json(meta.num_rows, stats)), "schema": schema.serialize().to_pybytes(),
    }  # fmt: skip


def _escape(value: str | None) -> str:
    # Hive-style directory names: Delta readers take the value from the log, not from the path.
    return "__HIVE_DEFAULT_PARTITION__" if value is None else value.replace("/", "%2F").replace("=", "%3D")


def _split(table: pa.Table, columns: list[str]) -> Iterator[tuple[tuple, pa.Table]]:
    """(partition values as strings, rows without the partition columns) per value combination."""
    import pyarrow.compute as pc

    if not columns:
        yield (), table
        return
    keys = table.select(columns).group_by(columns).aggregate([]).to_pylist()
    rest = [c for c in table.column_names if c not in columns]
    for key in keys:
        mask = None
        for c in columns:
            m = pc.is_null(table[c]) if key[c] is None else pc.equal(table[c], key[c])
            mask = m if mask is None else pc.and_(mask, m)
        yield tuple(None if key[c] is None else str(key[c]) for c in columns), table.filter(mask).select(rest)


def _stats(table: pa.Table) -> dict[str, Any]:
    """Min, max and null count of the columns Delta readers prune on: numbers, timestamps, dates."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out = {}
    for name, col in zip(table.column_names, table.columns, strict=True):
        t = col.type
        if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_timestamp(t) or pa.types.is_date(t):
            mm = pc.min_max(col)
            out[name] = (mm["min"].as_py(), mm["max"].as_py(), col.null_count)
    return out


def _merge(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    if a is None:
        return b
    out = {}
    for k, (lo, hi, n) in b.items():
        lo0, hi0, n0 = a[k]
        out[k] = (_pick(min, lo0, lo), _pick(max, hi0, hi), n0 + n)
    return out


def _pick(f: Any, x: Any, y: Any) -> Any:
    return y if x is None else x if y is None else f(x, y)


def _stat_value(v: Any, upper: bool) -> Any:
    """A statistic as Delta's JSON holds it. Timestamps are milliseconds (the format's precision): a max is
    rounded up, so no row ever lies outside its file's [min, max]."""
    if isinstance(v, datetime):
        if upper and v.microsecond % 1000:
            v = v.replace(microsecond=v.microsecond - v.microsecond % 1000) + _MS
        else:
            v = v.replace(microsecond=v.microsecond - v.microsecond % 1000)
        return v.strftime("%Y-%m-%dT%H:%M:%S.") + f"{v.microsecond // 1000:03d}Z"
    return v.isoformat() if hasattr(v, "isoformat") else v


def _stats_json(rows: int, stats: dict[str, Any]) -> dict[str, Any]:
    have = {k: v for k, v in stats.items() if v[0] is not None}
    return {
        "numRecords": rows,
        "minValues": {k: _stat_value(v[0], False) for k, v in have.items()},
        "maxValues": {k: _stat_value(v[1], True) for k, v in have.items()},
        "nullCount": {k: v[2] for k, v in stats.items()},
    }


# -- the driver: committing ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Committed:
    """What `commit` did: the table version it made (None: nothing new), rows added, or rows a replay found."""

    version: int | None
    rows: int
    replayed: int = 0


def commit(
    url: str,
    files: Iterable[dict[str, Any]],
    partition_by: Sequence[str],
    app_id: str,
    batch_id: int,
    facts: dict[str, Any] | None = None,
    configuration: dict[str, str] | None = None,
    removed: Sequence[Any] = (),
    rewritten: Sequence[dict[str, Any]] = (),
    base: DeltaTable | None = None,
) -> Committed:
    """Add `files` (FileWriter descriptions) to the table in one commit with app transaction (app_id, batch_id);
    the table is created at the first commit. A batch id not above the app's last committed one is a replay:
    nothing is committed, and the rows its commit recorded are returned as replayed. `facts` go into the
    commit info under "weir". An upsert's rewrite also removes files (`removed`, RemoveActions) and adds their
    kept rows (`rewritten`, FileWriter descriptions, not rows of the batch) in the same commit; `base` is the table
    as it was read to choose them, so that delta-rs refuses the commit if a concurrent one removed them too."""
    import pyarrow as pa
    from deltalake import CommitProperties, DeltaTable, Transaction
    from deltalake.transaction import AddAction

    url = table_url(url)
    files = list(files)
    dt = base if base is not None else open_table(url)
    if dt is not None and (last := dt.transaction_version(app_id)) is not None and batch_id <= last:
        return Committed(None, 0, replayed=committed_rows(dt, app_id, batch_id))
    rows = sum(int(f["rows"]) for f in files)
    files += rewritten
    if not files and (dt is None or not facts):
        return Committed(None, 0)  # an empty batch with nothing to record: a replay of it writes nothing either
    if files:
        schema: Any = _table_schema(pa.ipc.read_schema(pa.py_buffer(files[0]["schema"])), partition_by)
    else:  # facts of an empty batch (the offsets it covered): a commit without files
        schema = dt.schema()
    if dt is None:
        dt = DeltaTable.create(url, schema, mode="ignore", partition_by=list(partition_by) or None,
                               configuration=configuration, storage_options=storage_options(url))  # fmt: skip
    elif files:
        schema = _evolve(dt, schema, url)
    now = int(datetime.now().timestamp() * 1000)
    actions = [
        AddAction(f["path"], int(f["size"]), json.loads(f["partition_values"]), now, True, f["stats"]) for f in files
    ]
    info = {COMMIT_KEY: {"app": app_id, "batch": batch_id, "rows": rows, **(facts or {})}}
    props = CommitProperties(custom_metadata=info, app_transactions=[Transaction(app_id, batch_id)])
    dt.create_write_transaction([*actions, *removed], "append", schema, list(partition_by) or None,
                                commit_properties=props)  # fmt: skip
    dt.update_incremental()  # the version this commit made (or a later one, of a concurrent writer)
    return Committed(dt.version(), rows)


def _evolve(dt: DeltaTable, schema: pa.Schema, url: str) -> Any:
    """The schema to commit files of `schema` with: the table's, plus any new columns (added to the table first,
    in their own commit: Delta's schema evolution). A column whose type changed is refused: readers would mis-read
    the older or the newer files."""
    import pyarrow as pa
    from deltalake.schema import Field

    current = pa.schema(dt.schema().to_arrow())
    # Nested types are not compared: their child names and nullability differ between writers (Spark, pyarrow,
    # delta-rs) without any change of meaning.
    changed = [f.name for f in schema if f.name in current.names and not pa.types.is_nested(f.type)
               and current.field(f.name).type != f.type]  # fmt: skip
    if changed:
        how = ", ".join(f"{n}: {current.field(n).type} -> {schema.field(n).type}" for n in changed)
        raise DeltaError(
            f"{url}: column(s) changed type ({how}); a Delta table cannot change a column's type in place, and "
            f"readers would mis-read the older or the newer files. Write to a new table"
        )
    new = [f for f in schema if f.name not in current.names]
    if new:
        dt.alter.add_columns([Field.from_arrow(f) for f in new])
    return dt.schema()


def _table_schema(file_schema: pa.Schema, partition_by: Sequence[str]) -> pa.Schema:
    """The table's schema: the files' columns, then the partition columns (strings: their values are the log's)."""
    import pyarrow as pa

    fields = [f.with_type(pa.timestamp("us", "UTC")) if pa.types.is_timestamp(f.type) else f for f in file_schema]
    return pa.schema(fields + [pa.field(c, pa.string()) for c in partition_by])


def committed_rows(dt: DeltaTable, app_id: str, batch_id: int, look_back: int = 1000) -> int:
    """Rows the commit of (app_id, batch_id) recorded, from the newest `look_back` commit infos; 0 if not found
    (its commit info was cleaned up, or it held no rows)."""
    for info in dt.history(look_back):
        mine = info.get(COMMIT_KEY)
        if isinstance(mine, str):
            mine = json.loads(mine)
        if isinstance(mine, dict) and mine.get("app") == app_id and mine.get("batch") == batch_id:
            return int(mine.get("rows", 0))
    return 0


def commit_facts(dt: DeltaTable, limit: int | None = None) -> list[dict[str, Any]]:
    """weir's facts of every commit still in the log (newest first), with the commit's version and time."""
    out = []
    for info in dt.history(limit):
        mine = info.get(COMMIT_KEY)
        if isinstance(mine, str):
            mine = json.loads(mine)
        if isinstance(mine, dict):
            out.append(mine | {"version": info.get("version"), "timestamp": info.get("timestamp")})
    return out
