"""A query's tables resolved to data: for each table, one lake snapshot, the seam plan, the tail, provenance.

The order is what makes the seam exact: every lake snapshot (a Delta version) is taken first and its coverage
read from that version's own commits; only then are the broker's watermarks read, and the tail is read from the
broker for every offset the snapshot does not cover. An archive commit that lands meanwhile covers offsets the
broker already held when the watermarks were read: the tail reads them, the snapshot does not have them.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from weir.formats import ERROR_COLUMN
from weir.kafka.log import LogView
from weir.query import lakecount, seam, tail
from weir.query.catalog import TableSpec
from weir.storage import delta
from weir.storage.lake import Lake, coverage_of
from weir.storage.views import PROVENANCE

DECODE_CHUNK = 65_536  # lake rows decoded at a time, when the lake kept raw values only


@dataclass
class Provenance:
    """Where one table's rows came from, in this answer."""

    table: str
    archived: bool = True
    lake_version: int | None = None
    lake_rows: int = 0
    tail_rows: int = 0
    undecodable: int = 0
    missing_offsets: int = 0  # offsets neither the lake nor the broker holds (retention deleted them first)
    excluded: int = 0  # lake rows outside the coverage its commits record (never expected; left out, counted)
    provider: str | None = None  # a table given by the caller (a view), not a topic: what its rows came from
    rows: int | None = None  # a given table's rows (None: a stream whose length is not known before it is read)

    def line(self) -> str:
        if self.provider is not None:
            return f"{self.table}: " + (f"{self.rows:,} rows from " if self.rows is not None else "") + self.provider
        if not self.archived:
            text = f"{self.table}: not archived, {self.tail_rows:,} rows from the broker alone"
        else:
            text = (
                f"{self.table}: {self.lake_rows:,} rows from the lake (version {self.lake_version}), "
                f"{self.tail_rows:,} from the broker tail"
            )
        notes = []
        if self.undecodable:
            notes.append(f"{self.undecodable:,} undecodable (null fields, _error set)")
        if self.missing_offsets:
            notes.append(f"{self.missing_offsets:,} offsets in neither the lake nor the broker")
        if self.excluded:
            notes.append(f"{self.excluded:,} lake rows outside its recorded coverage left out")
        return text + ("; " + "; ".join(notes) if notes else "")

    def to_json(self) -> dict[str, Any]:
        if self.provider is not None:  # neither archived nor a tail: lake and tail figures would say 0 rows
            return {"table": self.table, "provider": self.provider, "rows": self.rows}
        return {k: v for k, v in self.__dict__.items() if v is not None and k != "rows"}

    @classmethod
    def given(cls, table: str, data: Any) -> Provenance:
        """A caller's table (a view): its rows and, from its schema's `weir.provenance` metadata, their origin."""
        schema = getattr(data, "schema", None)
        said = ((schema.metadata if schema is not None else None) or {}).get(PROVENANCE.encode())
        rows = getattr(data, "num_rows", None)
        return cls(table, archived=False, provider=said.decode() if said else "a table given by the caller",
                   rows=rows if isinstance(rows, int) else None)  # fmt: skip


@dataclass
class Source:
    """One table's data for one query: the lake part (a pyarrow dataset, or a table when the lake values had to
    be decoded), the tail, and what the answer says about them."""

    spec: TableSpec
    provenance: Provenance
    tail: pa.Table
    lake: Any = None  # pyarrow Dataset or Table, None when not archived
    lake_url: str | None = None
    lake_decoded: bool = False  # the lake part is a table in the table's schema (decoded here)
    lake_filter: pc.Expression | None = None  # only when rows lie outside the coverage
    plan: seam.Plan = field(default_factory=lambda: seam.Plan({}))


@dataclass
class _Snapshot:
    url: str
    version: int
    dataset: pads.Dataset
    coverage: dict[int, list[seam.Span]]
    covered_rows: int
    rows: int


def _snapshot(lake: Lake, topic: str, dt: Any = None) -> _Snapshot | None:
    dt = dt if dt is not None else lake.table(topic)
    if dt is None:
        return None
    version = dt.version()
    coverage = coverage_of(lake.batches(topic, dt))  # the commits of this version only (see Lake.batches)
    actions = pa.table(dt.get_add_actions(flatten=True))
    dataset = delta.arrow_dataset(dt)
    counts = actions.column("num_records") if "num_records" in actions.column_names else None
    rows = int(pc.sum(counts).as_py() or 0) if counts is not None and counts.null_count == 0 else dataset.count_rows()
    return _Snapshot(
        lake.topic_url(topic),
        version,
        dataset,
        {p: [(r.start, r.end) for r in rs] for p, rs in coverage.items()},
        sum(r.rows for rs in coverage.values() for r in rs),
        rows,
    )


def _coverage_filter(coverage: dict[int, list[seam.Span]]) -> pc.Expression:
    expr = pc.scalar(False)
    for p, spans in coverage.items():
        for start, end in spans:
            expr = expr | ((pc.field("partition") == p) & (pc.field("offset") >= start) & (pc.field("offset") < end))
    return expr


def _lake_usable(spec: TableSpec, dataset: pads.Dataset) -> bool:
    """Whether the lake's own decoded columns are the table's (same names and types): no decoding needed."""
    names = dataset.schema.names
    return all(f.name in names and dataset.schema.field(f.name).type == f.type for f in spec.fields) and (
        not spec.decoded or ERROR_COLUMN in names
    )


def _decode_lake(spec: TableSpec, dataset: pads.Dataset, flt: pc.Expression | None, deadline: float) -> pa.Table:
    """The lake's rows with the table's decoded columns computed from their raw values (bounded by the query's
    deadline: TailTimeout past it)."""
    decoder = spec.decoder()
    schema = spec.schema()
    raw = [n for n in schema.names if n in dataset.schema.names and n not in spec.fields.names and n != ERROR_COLUMN]
    pieces = []
    for batch in dataset.to_batches(columns=raw, filter=flt, batch_size=DECODE_CHUNK):
        if time.monotonic() > deadline:
            raise tail.TailTimeout(f"decoding the lake's {spec.topic} values (archived without this schema)")
        columns, errors = decoder.decode(batch.column("value").to_pylist())
        arrays = {n: batch.column(n) for n in raw}
        arrays.update(zip(spec.fields.names, columns, strict=True))
        arrays[ERROR_COLUMN] = errors
        pieces.append(
            pa.table([arrays.get(f.name, pa.nulls(batch.num_rows, f.type)).cast(f.type) for f in schema], schema=schema)
        )
    return pa.concat_tables(pieces) if pieces else schema.empty_table()


@dataclass
class _LakePart:
    data: Any  # the snapshot's dataset, or a table of its decoded rows
    flt: pc.Expression | None
    rows: int
    excluded: int
    undecodable: int
    decoded: bool


def _lake_part(spec: TableSpec, snap: _Snapshot, deadline: float) -> _LakePart:
    """The table's lake part: the snapshot's rows (within its recorded coverage), decoded here if the lake's own
    columns are not the table's, and its undecodable rows counted."""
    flt, rows, excluded = None, snap.rows, 0
    if snap.rows != snap.covered_rows:
        flt = _coverage_filter(snap.coverage)
        rows = snap.dataset.count_rows(filter=flt)
        excluded = snap.rows - rows
    if _lake_usable(spec, snap.dataset):
        bad = lakecount.undecodable(snap.dataset, flt, snap.coverage) if spec.decoded else 0
        return _LakePart(snap.dataset, flt, rows, excluded, bad, False)
    table = _decode_lake(spec, snap.dataset, flt, deadline)
    return _LakePart(table, flt, rows, excluded, tail.undecodable(table), True)


def resolve(
    lake: Lake,
    view: LogView,
    client: dict[str, str],
    specs: list[TableSpec],
    deadline: float,
    read_tail: bool = True,
    opened: dict[str, Any] | None = None,
    parts: dict[str, list[int]] | None = None,
) -> dict[str, Source]:
    """Every table of `specs` resolved: lake snapshots first (`opened`: Delta tables already opened, at the
    versions to read), then the watermarks, then the tails (unless the engine reads them itself: `read_tail=False`
    leaves `tail` empty and its counts to the engine)."""
    opened = opened or {}
    snapshots = {s.name: _snapshot(lake, s.topic, opened.get(s.topic)) if s.archived else None for s in specs}
    # The lake parts need nothing from the broker: one thread works on them (footers, counts, any decoding) while
    # this one reads the watermarks and the tails, mostly waiting on the network.
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weir-lake")
    try:
        parts_of = {s.name: pool.submit(_lake_part, s, snap, deadline) for s in specs if (snap := snapshots[s.name])}
        marks = tail.watermarks(view, sorted({s.topic for s in specs}), exact=not read_tail, parts=parts)
        out: dict[str, Source] = {}
        for spec in specs:
            snap = snapshots[spec.name]
            plan = seam.plan(snap.coverage if snap else {}, marks.get(spec.topic, {}))
            if read_tail:
                # Spans below the lake's end are gaps, read as planned; past it, the tail runs to the high-water
                # mark of its first fetch (ListOffsets' latest may fall short of it: docs/sql.md).
                ends = {p: (max(marks[spec.topic][p][0], pp.lake[-1][1] if pp.lake else 0), marks[spec.topic][p][1])
                        for p, pp in plan.partitions.items() if pp.on_broker}  # fmt: skip
                gaps = {p: [sp for sp in plan.partitions[p].broker if sp[1] <= s] for p, (s, _) in ends.items()}
                rows = tail.read(client, spec, gaps, deadline, open_from=ends)
            else:
                rows = spec.schema().empty_table()
            prov = Provenance(spec.name, archived=snap is not None, tail_rows=len(rows))
            prov.missing_offsets = plan.missing_offsets
            prov.undecodable = tail.undecodable(rows)
            source = Source(spec, prov, rows, plan=plan)
            if snap is not None:
                part = parts_of[spec.name].result()
                prov.lake_version, prov.lake_rows, prov.excluded = snap.version, part.rows, part.excluded
                prov.undecodable += part.undecodable
                source.lake_url, source.lake_filter = snap.url, part.flt
                source.lake, source.lake_decoded = part.data, part.decoded
            out[spec.name] = source
        return out
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
