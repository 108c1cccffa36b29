"""The lake: topics archived continuously and exactly once to partitioned Parquet (see docs/lake.md)."""

from typing import Any

_WHERE = {
    "ArchiveSink": "weir.lake.archive", "archiver": "weir.lake.archive", "with_archivers": "weir.lake.archive",
    "Lake": "weir.lake.store", "LakeError": "weir.lake.store", "Manifest": "weir.lake.store",
    "Range": "weir.lake.store",
}  # fmt: skip
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    # Imported on first use: importing weir.lake.<module> must not pull in PySpark and the sinks.
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(name)
