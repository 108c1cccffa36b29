"""The lake: topics archived continuously and exactly once to partitioned Parquet (see docs/lake.md)."""

from weir.lake.archive import ArchiveSink, archiver, with_archivers
from weir.lake.store import Lake, LakeError, Manifest, Range

__all__ = ["ArchiveSink", "Lake", "LakeError", "Manifest", "Range", "archiver", "with_archivers"]
