"""Package names resolved on first use: importing `weir.<package>.<module>` runs the package's __init__, which
must not pull in PySpark, pandas or pyarrow for a caller (the `weir` command, the monitor) that needs none."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def exports(package: str, where: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` giving each name of `where` (name -> module) from its module, imported then."""

    def __getattr__(name: str) -> Any:
        if name in where:
            return getattr(importlib.import_module(where[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
