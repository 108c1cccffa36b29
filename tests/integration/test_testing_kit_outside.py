"""A user's project outside weir's repository runs its own tests with weir's pytest plugin: weir is
`pip install`ed into a fresh virtual environment, the project has no conftest, and its tests get the
`pipeline_test` fixture through the `pytest11` entry point alone."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
PROJECT_TIMEOUT_S = 300

PIPELINE = """
from pyspark.sql import functions as F

from weir.pipeline import Pipeline

pipeline = Pipeline("payments")
payments = pipeline.topic("payments", "id STRING NOT NULL, cents BIGINT", key="id", partitions=2)
large = pipeline.topic("payments.large", "id STRING, euros DOUBLE", key="id")


@pipeline.processor(inputs=[payments], outputs=[large])
def large_payments(df):
    return df.where("cents >= 10000").select("id", (F.col("cents") / 100).alias("euros"))
"""

TESTS = """
import sys
import time

import weir
from payments import pipeline
from weir.testing import assert_rows

ROWS = [{"id": "p1", "cents": 25000}, {"id": "p2", "cents": 999}, b"garbage"]


def test_weir_is_the_installed_package():
    assert weir.__file__.startswith(sys.prefix), weir.__file__


def test_large_payments(pipeline_test):
    began = time.monotonic()
    t = pipeline_test(pipeline)
    t.send("payments", ROWS)
    t.run_once()
    assert_rows(t.read("payments.large"), [{"id": "p1", "euros": 250.0}])
    print(f"first result: run_once, cold: {time.monotonic() - began:.1f} s")
    assert [r.value for r in t.dead_letters("payments")] == [b"garbage"]


def test_large_payments_fast(pipeline_test):
    began = time.monotonic()
    t = pipeline_test(pipeline)
    counts = t.run_batch("large_payments", ROWS)
    assert_rows(t.read("payments.large"), [{"id": "p1", "euros": 250.0}])
    print(f"first result: run_batch, warm: {time.monotonic() - began:.1f} s")
    assert (counts.in_, counts.out, counts.filtered, counts.dlq) == (3, 1, 1, 1)
"""


def run(*command: str | Path, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}  # nothing of the repo's
    try:
        return subprocess.run(
            [str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{' '.join(map(str, command))} did not finish within {timeout}s: {exc.stdout}") from exc


def test_a_project_outside_the_repository_tests_its_pipeline_with_the_plugin(tmp_path):
    venv, source, project = tmp_path / "venv", tmp_path / "weir-src", tmp_path / "project"
    made = run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path, timeout=60)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    # weir's dependencies come from this interpreter's site-packages (a .pth line), so the test needs no
    # network and pip installs weir alone; weir itself is the one built and installed here, not the repo's.
    purelib = run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp_path, timeout=60)
    (Path(purelib.stdout.strip()) / "weir-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    source.mkdir()
    shutil.copytree(REPO / "weir", source / "weir", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)  # a copy: the build writes build/ and *.egg-info next to it
    installed = run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", source,
                    cwd=tmp_path, timeout=240)  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr

    project.mkdir()
    (project / "payments.py").write_text(PIPELINE)
    (project / "test_payments.py").write_text(TESTS)
    result = run(python, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", cwd=project, timeout=PROJECT_TIMEOUT_S)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "3 passed" in output, output[-4000:]
    assert "fixture 'pipeline_test' not found" not in output
    print("\n" + "\n".join(re.findall(r"first result: .*", output)))
