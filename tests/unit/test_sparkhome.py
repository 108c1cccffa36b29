"""weir.sparkhome: the SPARK_HOME whose pyspark.zip holds bytecode, on a PySpark directory made for the test."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from weir import sparkhome


@pytest.fixture
def fake_pyspark(tmp_path, monkeypatch) -> Path:
    """A PySpark directory as pip installs it: bin/, jars/, python/lib/pyspark.zip of sources."""
    real = tmp_path / "site" / "pyspark"
    (real / "bin").mkdir(parents=True)
    (real / "jars").mkdir()
    (real / "bin" / "spark-submit").write_text("#!/bin/sh\n")
    lib = real / "python" / "lib"
    lib.mkdir(parents=True)
    with zipfile.ZipFile(lib / "pyspark.zip", "w") as z:
        z.writestr("pyspark/__init__.py", "")
        z.writestr("pyspark/fast.py", "def boom():\n    raise ValueError('from the zip')\n")
        z.writestr("pyspark/sql/tests/test_x.py", "x = 1\n")
        z.writestr("pyspark/broken.py", "def (:\n")  # this Python cannot compile it: it stays a source
    (lib / "notes.txt").write_text("kept")
    monkeypatch.setattr("pyspark.__file__", str(real / "__init__.py"))
    return real


def test_the_home_links_pysparks_directory_and_adds_bytecode_beside_each_source(fake_pyspark, tmp_path):
    home = sparkhome.worker_home(tmp_path / "cache")
    assert home is not None and (home / sparkhome.READY).exists()
    assert (home / "bin").resolve() == (fake_pyspark / "bin").resolve() and (home / "jars").is_symlink()
    assert (home / "python" / "lib" / "notes.txt").read_text() == "kept"
    names = set(zipfile.ZipFile(home / "python" / "lib" / "pyspark.zip").namelist())
    assert {"pyspark/fast.py", "pyspark/fast.pyc", "pyspark/__init__.pyc", "pyspark/broken.py"} <= names
    assert "pyspark/broken.pyc" not in names and "pyspark/sql/tests/test_x.pyc" not in names
    # A second call finds it built; no half-built directory is left beside it
    assert sparkhome.worker_home(tmp_path / "cache") == home
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [home.name]


def test_a_worker_imports_the_bytecode_and_its_tracebacks_show_the_sources_lines(fake_pyspark, tmp_path):
    zipped = sparkhome.worker_home(tmp_path / "cache") / "python" / "lib" / "pyspark.zip"
    # As Spark's workers format an error: with the traceback module, which reads lines through the zip's loader
    code = (
        "import traceback, pyspark.fast as m; print(m.__spec__.origin)\n"
        "try: m.boom()\nexcept ValueError: traceback.print_exc()"
    )
    done = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(zipped)}, capture_output=True,
                          text=True)  # fmt: skip
    assert done.stdout.strip() == f"{zipped}/pyspark/fast.pyc", done.stderr
    assert f'File "{zipped}/pyspark/fast.py", line 2, in boom' in done.stderr, done.stderr
    assert "raise ValueError('from the zip')" in done.stderr, done.stderr


def test_a_spark_installed_apart_is_left_alone(tmp_path, monkeypatch):
    real = tmp_path / "pyspark"
    real.mkdir()
    monkeypatch.setattr("pyspark.__file__", str(real / "__init__.py"))
    assert sparkhome.worker_home(tmp_path / "cache") is None
