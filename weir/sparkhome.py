"""A SPARK_HOME for a local master whose Python workers import PySpark from bytecode.

Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on every Python worker's path, and pip's PySpark ships that
zip with sources only: each worker (the streaming source runner of every query, the planner, the daemon) compiled
PySpark's modules again when it started, 1.25 s of CPU against 0.4 s from bytecode. Spark gives the streaming
source runner 10 s, hard-coded, to connect back; on a loaded machine the compiling alone ran past it ("Python
worker failed to connect back"). This home is pip's PySpark directory by symbolic links, with the zips under
`python/lib` copied and their bytecode added (unchecked hash-based .pyc beside each .py, which zipimport reads
first). It is built once per PySpark directory and Python version, in the user's cache (`make venv` builds it).
"""

from __future__ import annotations

import hashlib
import os
import py_compile
import shutil
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path

READY = ".weir-ready"  # written last: a home without it is half built
LAYOUT = 1  # in each home's name: a change to how homes are built makes new ones


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "weir"


def worker_home(root: Path | None = None) -> Path | None:
    """The home for this PySpark and Python (built when missing), or None when PySpark's directory is no Spark
    home with a pyspark.zip (a Spark installed apart: its SPARK_HOME is left alone)."""
    import pyspark

    real = Path(pyspark.__file__).resolve().parent
    if not (real / "python" / "lib" / "pyspark.zip").is_file() or not (real / "jars").is_dir():
        return None
    # One per PySpark directory (its links point there: another virtual environment gets a home of its own)
    where = hashlib.sha1(str(real).encode()).hexdigest()[:10]
    python = f"py{sys.version_info.major}.{sys.version_info.minor}"
    version = f"pyspark-{pyspark.__version__}-{python}-{where}-v{LAYOUT}"
    home = (root or cache_root()) / version
    if (home / READY).exists():
        return home
    home.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{version}.", dir=home.parent))
    try:
        _build(real, building, home)
        try:
            building.rename(home)  # atomic: two processes building at once keep one home
        except OSError:
            if not (home / READY).exists():
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return home


def _build(real: Path, home: Path, final: Path) -> None:
    """Build in `home`, to be renamed `final` (the path its code objects name)."""
    for entry in real.iterdir():
        if entry.name != "python":
            (home / entry.name).symlink_to(entry)
    (home / "python").mkdir()
    for entry in (real / "python").iterdir():
        if entry.name != "lib":
            (home / "python" / entry.name).symlink_to(entry)
    (home / "python" / "lib").mkdir()
    for entry in (real / "python" / "lib").iterdir():
        if entry.suffix == ".zip":
            _compiled_zip(entry, home / "python" / "lib" / entry.name, final / "python" / "lib" / entry.name)
        else:
            (home / "python" / "lib" / entry.name).symlink_to(entry)
    (home / READY).write_text(str(real))


def _compiled_zip(source: Path, target: Path, final: Path) -> None:
    """`source` with a .pyc beside each .py but its tests (no worker imports them). Code objects name the path
    zipimport gives them (`<final>/<module>.py`), so that tracebacks show the lines, read from the zip."""
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(source) as zin, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SyntaxWarnings of PySpark's own sources, once per build
        zin.extractall(tmp)
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zout:
            for info in zin.infolist():
                zout.writestr(info, zin.read(info))
                if info.filename.endswith(".py") and "/tests/" not in info.filename:
                    pyc = Path(tmp) / (info.filename + "c")
                    try:
                        py_compile.compile(
                            str(Path(tmp) / info.filename), cfile=str(pyc), dfile=f"{final}/{info.filename}",
                            doraise=True, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
                        )  # fmt: skip
                    except py_compile.PyCompileError:  # a module this Python cannot compile stays a source
                        continue
                    zout.write(pyc, info.filename + "c")
