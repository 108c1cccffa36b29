"""Finding a pipeline from the command line: `path/to/file.py[:name]` or `package.module[:name]`."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType

from pyspark import cloudpickle

from weir.pipeline.model import DeclarationError, Pipeline


def _importable_here() -> None:
    """Modules under the working directory import on the driver (as with `python -m`) and on local workers,
    which inherit PYTHONPATH; on a cluster, ship them with spark.submit.pyFiles."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if cwd not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([cwd, *[p for p in paths if p]])


def _syntax(exc: SyntaxError, where: str) -> str:
    """One line for a pipeline file that does not parse: the file, the line, the column and what is wrong."""
    column = f":{exc.offset}" if exc.offset else ""
    return f"{exc.filename or where}:{exc.lineno}{column}: {exc.msg}"


def _needs_spark(exc: BaseException, path: Path) -> str | None:
    """One line for a pipeline file that asked for Spark while it loaded (a `@udf` on a module-level function, a
    DataFrame built at import): weir loads the pipeline first, to learn what session it needs. None: another error."""
    if "SESSION_OR_CONTEXT_NOT_EXISTS" not in str(exc):
        return None
    here = str(path.resolve())
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if str(Path(f.filename).resolve()) == here]
    at = f"{path}:{lines[-1]}" if lines else str(path)
    return (
        f"{at}: the pipeline asks for a Spark session while it loads, and weir starts Spark after loading it (to learn "
        "what the pipeline needs): make UDFs inside the processor's function (F.udf(f, 'bigint') there, not @F.udf "
        "at the top of the file), and build DataFrames there too"
    )


def load(spec: str) -> Pipeline:
    """The Pipeline named by `spec`; without `:name`, the only Pipeline the module defines. Topics whose schema
    is only in the schema registry read it there (the settings' schema_registry_url)."""
    found = _load(spec)
    if all(t.resolved for t in found.topics.values()):
        return found
    from weir.config import load as settings

    return found.with_schemas(settings().registry_conf())


def _load(spec: str) -> Pipeline:
    target, _, attr = spec.partition(":")
    module = load_module(target)
    if attr:
        found = getattr(module, attr, None)
        if not isinstance(found, Pipeline):
            raise DeclarationError(f"{target} has no Pipeline named {attr!r}")
        return found
    pipelines = [v for v in vars(module).values() if isinstance(v, Pipeline)]
    if len(pipelines) != 1:
        names = ", ".join(sorted(p.name for p in pipelines)) or "none"
        raise DeclarationError(f"{target} defines {len(pipelines)} pipelines ({names}); name one with {target}:<name>")
    return pipelines[0]


def load_module(target: str, what: str = "pipeline") -> ModuleType:
    """The module at `target`, a file path or a module name (`what` it holds, for messages and the module's
    name); a file's functions ship to Spark's workers by value."""
    _importable_here()
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise DeclarationError(f"no {what} file {target}")
        module_name = f"weir_{what}_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        try:
            module_spec.loader.exec_module(module)
        except SyntaxError as exc:
            raise DeclarationError(_syntax(exc, str(path))) from None
        except Exception as exc:
            if (why := _needs_spark(exc, path)) is None:
                raise
            raise DeclarationError(why) from None
        # Spark's workers cannot import a module loaded from a file path: ship its functions by value.
        cloudpickle.register_pickle_by_value(module)
    else:
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as exc:
            raise DeclarationError(f"cannot import {what} module {target!r}: {exc}") from None
        except SyntaxError as exc:
            raise DeclarationError(_syntax(exc, target)) from None
    return module
