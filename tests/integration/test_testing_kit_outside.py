"""A user's project outside weir's repository runs its own tests with weir's pytest plugin: weir is
`pip install`ed into a fresh virtual environment, the project (the complete example of docs/testing.md) has
no conftest, and its tests get the `pipeline_test` fixture through the `pytest11` entry point alone."""

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

DOCS = REPO / "docs" / "testing.md"
INSTALLED = """
import sys

import weir


def test_weir_is_the_installed_package():
    assert weir.__file__.startswith(sys.prefix), weir.__file__
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

    # The project: the complete example of docs/testing.md (its pipeline, then its tests), which keeps the
    # page honest, and a check that its weir is the one installed here.
    project.mkdir()
    pipeline, tests = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)[:2]
    (project / "payments.py").write_text(pipeline)
    (project / "test_payments.py").write_text(tests)
    (project / "test_installed.py").write_text(INSTALLED)
    # The windows test of the example runs in weir's own run (test_testing_kit.py), on its warm session: here
    # it would add three stateful runs to a cold one.
    pytest_run = (python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not windows")
    result = run(*pytest_run, cwd=project, timeout=PROJECT_TIMEOUT_S)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "3 passed, 1 deselected" in output, output[-4000:]
