"""The lake's processes: the archiver, the retention guard, inspection and compaction (see docs/lake.md)."""

from weir.lazy import exports

_WHERE = {
    "ArchiveSink": "weir.lake.archive", "archiver": "weir.lake.archive", "with_archivers": "weir.lake.archive",
}  # fmt: skip
__all__ = sorted(_WHERE)

__getattr__ = exports(__name__, _WHERE)
