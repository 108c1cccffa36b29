"""Counting a lake snapshot's undecodable rows (a non-null `_error`) from its Parquet footers where they can be
trusted, reading the `_error` column only for the row groups they cannot answer.

Footers written by pyarrow's Parquet writer (the archiver's: weir.storage.delta.FileWriter) carry each column
chunk's exact null count, so a row group's undecodable rows are its rows minus that count, with no data read.
Reading the footers first also costs the query nothing extra: the dataset's fragments keep them, and the scan
that follows opens the files with them instead of reading them again. Row groups of another writer, without a
null count, or only partly inside the snapshot's coverage filter are read as before.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from weir.formats import ERROR_COLUMN
from weir.query.seam import Span

TRUSTED_WRITER = "parquet-cpp-arrow"  # the `created_by` of pyarrow's writer; its null counts are exact


def _column(meta: pq.FileMetaData, name: str) -> int | None:
    for i in range(meta.num_columns):
        if meta.schema.column(i).path == name:
            return i
    return None


def _inside(
    group: pq.RowGroupMetaData, part: int | None, off: int | None, coverage: Mapping[int, list[Span]]
) -> bool | None:
    """Whether every row of the group lies in the coverage (True), none does (False), or the footer cannot tell
    (None): from the min and max of its `partition` and `offset` columns."""
    if part is None or off is None:
        return None
    ps, os_ = group.column(part).statistics, group.column(off).statistics
    if ps is None or os_ is None or not ps.has_min_max or not os_.has_min_max or ps.null_count or os_.null_count:
        return None
    if ps.min != ps.max:
        return None
    spans = coverage.get(int(ps.min), [])
    if any(start <= os_.min and os_.max < end for start, end in spans):
        return True
    if all(os_.max < start or os_.min >= end for start, end in spans):
        return False
    return None


def _from_footer(
    group: pq.RowGroupMetaData, error: int | None, part: int | None, off: int | None,
    coverage: Mapping[int, list[Span]] | None, trusted: bool,
) -> int | None:  # fmt: skip
    """The group's undecodable rows (within the coverage, if given) as its footer tells them; None: read them."""
    if coverage is not None:
        inside = _inside(group, part, off, coverage)
        if inside is False:
            return 0
        if inside is None:
            return None
    if error is None:
        return 0  # a file written before the column existed: the dataset reads it as all nulls
    stats = group.column(error).statistics
    if not trusted or stats is None or not stats.has_null_count or stats.null_count > group.num_rows:
        return None
    return group.num_rows - stats.null_count


def undecodable(
    dataset: pads.FileSystemDataset, flt: pc.Expression | None, coverage: Mapping[int, list[Span]] | None
) -> int:
    """Rows of `dataset` (those of `flt`, the filter built from `coverage`, when given) with a non-null `_error`."""
    known = 0
    unread: list[pads.Fragment] = []
    for frag in dataset.get_fragments():
        meta = frag.metadata  # the footer, kept by the fragment for the scan that follows
        trusted = (meta.created_by or "").startswith(TRUSTED_WRITER)
        error, part, off = _column(meta, ERROR_COLUMN), _column(meta, "partition"), _column(meta, "offset")
        rest = []
        for g in range(meta.num_row_groups):
            n = _from_footer(meta.row_group(g), error, part, off, coverage if flt is not None else None, trusted)
            if n is None:
                rest.append(g)
            else:
                known += n
        if len(rest) == meta.num_row_groups:
            unread.append(frag)
        elif rest:
            unread.append(frag.subset(row_group_ids=rest))
    if not unread:
        return known
    part_ds = pads.FileSystemDataset(unread, dataset.schema, dataset.format, dataset.filesystem)
    errors = part_ds.to_table(columns=[ERROR_COLUMN], filter=flt).column(ERROR_COLUMN)
    return known + len(errors) - errors.null_count
