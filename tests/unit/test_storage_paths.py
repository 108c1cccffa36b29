"""weir.storage.paths (a path or URL as a pyarrow filesystem, a Spark URL), Delta storage options, and the
lake's partition layout."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta, timezone

from pyarrow import fs as pafs

from weir.storage import delta, paths
from weir.storage.lake import (
    Lake,
    date_dir_value,
    hour_dir,
    hour_dir_value,
    hour_of,
    hour_start,
)


def test_a_relative_path_and_its_file_url_are_one_location(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    filesystem, path = paths.resolve("lake/")
    assert isinstance(filesystem, pafs.LocalFileSystem)
    assert path == str(tmp_path / "lake")
    assert paths.url("lake/") == str(tmp_path / "lake")
    assert paths.spark_url("lake") == f"file://{tmp_path}/lake"
    assert paths.resolve(f"file://{tmp_path}/lake/")[1] == path
    assert paths.spark_url(f"file://{tmp_path}/lake/") == f"file://{tmp_path}/lake"
    assert paths.spark_url("s3://bucket/lake/") == "s3a://bucket/lake"  # Hadoop's S3A, whose jars weir's session adds
    assert paths.on_s3("s3a://bucket/lake") and paths.on_s3("s3://bucket/lake") and not paths.on_s3("/s3/lake")
    assert paths.is_url("hdfs://nn/x") and paths.is_url("file:/x") and not paths.is_url("x/y")


def test_join():
    assert paths.join("/a/", "b", "/c/", "") == "/a/b/c"
    assert paths.join("s3://bucket/x", "metadata") == "s3://bucket/x/metadata"


def test_write_atomic_leaves_no_temporary_file(tmp_path):
    filesystem, root = paths.resolve(str(tmp_path))
    paths.write_atomic(filesystem, f"{root}/deep/er/doc.json", b"{}")
    paths.write_atomic(filesystem, f"{root}/deep/er/doc.json", b'{"a": 1}')
    assert (tmp_path / "deep/er/doc.json").read_bytes() == b'{"a": 1}'
    assert os.listdir(tmp_path / "deep/er") == ["doc.json"]


def test_the_lake_resolves_through_paths(tmp_path):
    lake = Lake(str(tmp_path) + "/")
    assert (lake.url, lake.root, lake.spark_root) == (str(tmp_path), str(tmp_path), f"file://{tmp_path}")
    assert lake.topic_url("orders") == f"{tmp_path}/orders" and lake.topics() == []


def test_delta_storage_options_come_from_the_aws_settings(monkeypatch):
    for k in ("AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert delta.storage_options("/local/lake") == {}
    assert delta.storage_options("s3://b/lake") == {
        "AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_REGION": "eu-west-1",
    }  # fmt: skip
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")  # a local S3 server: plain HTTP allowed
    assert delta.storage_options("s3://b/lake")["AWS_ALLOW_HTTP"] == "true"
    assert delta.table_url("file:///x/y/") == "/x/y" and delta.table_url("s3://b/x/") == "s3://b/x"


def test_the_lake_layout():
    assert hour_dir("2026-11-21", "07") == "date=2026-11-21/hour=07"
    assert hour_of(datetime(2026, 11, 21, 9, 30, tzinfo=timezone(timedelta(hours=2)))) == ("2026-11-21", "07")
    assert hour_start("2026-11-21", "07") == datetime(2026, 11, 21, 7, tzinfo=UTC)
    assert date_dir_value("date=2026-11-21") == "2026-11-21"
    assert [date_dir_value(n) for n in ("date=2026-02-30", "date=2026-1-01", "day=2026-11-21")] == [None] * 3
    assert hour_dir_value("hour=23") == "23"
    assert [hour_dir_value(n) for n in ("hour=24", "hour=7", "hour=07x")] == [None] * 3
