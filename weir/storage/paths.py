"""A location weir stores to (lake, Parquet sink, checkpoint): a local path or any URL pyarrow opens (file://,
s3://, gs://, hdfs://), as one pyarrow filesystem and path for weir, and one URL for Spark.

A relative path is made absolute against the current directory once, here, so that pyarrow and Spark (whose
bare paths resolve against Hadoop's fs.defaultFS) name the same place. pyarrow is imported when a function
runs, not with this module: the monitor reads checkpoints through it and stays light until it does.
"""

from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyarrow import fs as pafs


def url(path_or_url: str) -> str:
    """The location as a URL or an absolute path, without a trailing slash."""
    text = path_or_url.rstrip("/")
    return text if is_url(text) else os.path.abspath(text)


def is_url(path_or_url: str) -> bool:
    return "://" in path_or_url or path_or_url.startswith("file:")


def resolve(path_or_url: str) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, path within it, without a trailing slash) of a path or URL; ValueError or
    OSError (pyarrow's) when no filesystem opens it."""
    from pyarrow import fs as pafs

    location = url(path_or_url)
    if location.startswith("s3a://"):  # Hadoop's name for S3 (Spark's URL of it): pyarrow knows it as s3://
        location = "s3://" + location.removeprefix("s3a://")
    filesystem, path = pafs.FileSystem.from_uri(location)
    return filesystem, path.rstrip("/")


def spark_url(path_or_url: str) -> str:
    """The URL Spark should use for the same location: `file:///abs` for a local path (a bare path would
    resolve against Hadoop's fs.defaultFS, which can differ from what pyarrow reads), `s3a://` for `s3://` (Hadoop's
    S3 filesystem, whose jars weir's Spark session adds: weir.spark), else the URL as given."""
    text = url(path_or_url)
    if text.startswith("s3://"):
        return "s3a://" + text.removeprefix("s3://")
    return text if is_url(text) else f"file://{text}"


def on_s3(path_or_url: str) -> bool:
    return path_or_url.startswith(("s3://", "s3a://"))


def join(base: str, *parts: str) -> str:
    """`base/part/...` with single slashes (pyarrow paths and URLs alike); empty parts are skipped."""
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts if p.strip("/"))])


def write_atomic(filesystem: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write a small file so that readers see all of it or none: a hidden temp file beside it, then a rename
    (atomic on local, NFS and HDFS filesystems); the parent directory is created."""
    parent, name = path.rsplit("/", 1)
    filesystem.create_dir(parent, recursive=True)
    tmp = f"{parent}/.{name}.{uuid.uuid4().hex}.tmp"
    with filesystem.open_output_stream(tmp) as f:
        f.write(data)
    filesystem.move(tmp, path)
