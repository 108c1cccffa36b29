"""The local driver JVM maps weir's class-data archive (weir.classdata, built by `weir jars fetch`, so by `make
venv`), and an archive a JVM cannot map whole is never put where a driver looks for one."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from pyspark import SparkContext

from weir import classdata

pytestmark = pytest.mark.integration


def test_the_test_sessions_driver_maps_the_archive_of_its_class_path(spark):
    path = classdata.archive(os.environ["SPARK_HOME"], spark.conf.get("spark.driver.extraClassPath"))
    assert path.is_file(), f"no class-data archive at {path}: `weir jars fetch` builds it (make venv runs it)"
    pid = SparkContext._gateway.proc.pid
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert str(path) in maps, f"the driver JVM {pid} started without mapping {path}"


def test_an_archive_cut_short_is_refused_before_it_is_put_in_place(tmp_path, spark):
    path = classdata.archive(os.environ["SPARK_HOME"], spark.conf.get("spark.driver.extraClassPath"))
    whole = tmp_path / "whole.jsa"
    shutil.copyfile(path, whole)
    classdata.check(whole)
    cut = tmp_path / "cut.jsa"
    cut.write_bytes(whole.read_bytes()[: 50 << 20])  # a dump cut short (a full disk, a kill): SIGBUS in the JVM
    with pytest.raises(RuntimeError, match=r"(?s)cut\.jsa does not map \(java exited -6\).*SIGBUS"):
        classdata.check(cut)
