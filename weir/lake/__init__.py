"""The lake: topics archived continuously and exactly once to partitioned Parquet (see docs/lake.md)."""

from weir.lazy import exports

_WHERE = {
    "ArchiveSink": "weir.lake.archive", "archiver": "weir.lake.archive", "with_archivers": "weir.lake.archive",
    "Lake": "weir.lake.store", "LakeError": "weir.lake.store", "Manifest": "weir.lake.store",
    "Range": "weir.lake.store",
}  # fmt: skip
__all__ = sorted(_WHERE)

__getattr__ = exports(__name__, _WHERE)
