"""docs/architecture.md is the map of the code: it names every module of the `weir` package, by its path in
backticks (`weir/kafka/source.py`, a package's `weir/kafka/__init__.py`), with a line saying what it does."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "architecture.md"


def modules() -> list[str]:
    """Every module of the weir package as a path from the repository's root: weir/kafka/source.py, ..."""
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "weir").rglob("*.py") if "__pycache__" not in p.parts)


def test_architecture_names_every_module():
    text = PAGE.read_text()
    missing = [m for m in modules() if f"`{m}`" not in text]
    assert not missing, "docs/architecture.md names no line for these modules (add one each):\n" + "\n".join(missing)


def test_architecture_names_no_module_that_is_gone():
    text = PAGE.read_text()
    named = set(re.findall(r"`(weir/[\w/]*\.py)`", text))
    gone = sorted(m for m in named if not (REPO / m).is_file())
    assert not gone, f"docs/architecture.md names modules that do not exist: {gone}"


def test_the_walk_finds_packages_and_modules():
    found = modules()
    assert "weir/__init__.py" in found and "weir/kafka/source.py" in found and "weir/formats/base.py" in found
