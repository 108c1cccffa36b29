"""A processor's version is the code it runs (weir.pipeline.codeversion), without Spark: user modules written into
tmp_path and imported under names of their own, each variant a fresh module. The version changes with any code the
processor reaches (helpers, transitively, constants, @stateful handlers and declarations, closures, defaults) and
not with code it does not (another processor, a comment, another helper), the same in any process."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from weir.pipeline.model import Pipeline, code_version

ROOT = Path(__file__).resolve().parents[2]

PIPELINE = """
from weir.pipeline import Pipeline
import {helpers} as helpers
from {helpers} import clean

p = Pipeline("p")
a = p.topic("a", schema="id BIGINT")
b = p.topic("b", schema="id BIGINT")
c = p.topic("c", schema="id BIGINT")


@p.processor(inputs=[a], outputs=[b])
def proc(df):
    return helpers.score(clean(df))


# another processor of the same module
@p.processor(inputs=[a], outputs=[c])
def other(df):
    return df + 1
"""

HELPERS = """
def clean(x):
    return x


def score(x):
    return _scale(x) + 1


def _scale(x):
    return x * 2


def unused(x):
    return x - 1
"""


def load(tmp_path: Path, modules: dict[str, str], tag: str | None = None) -> dict[str, object]:
    """Import `modules` (a name as the sources say it -> its source, `{name}` for another's module name), in order,
    from a directory of their own, under names of their own (or `tag`'s, for sources that name a module in a
    function's body: the loaded ones of that name are dropped first): each call gives fresh modules."""
    where = tmp_path / uuid.uuid4().hex[:10]
    where.mkdir()
    names = {name: f"{name}_{tag or where.name}" for name in modules}
    for name in names.values():
        sys.modules.pop(name, None)
    for name, source in modules.items():
        for other, real in names.items():
            source = source.replace("{" + other + "}", real)
        (where / f"{names[name]}.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(where))
    try:
        return {name: importlib.import_module(names[name]) for name in modules}
    finally:
        sys.path.remove(str(where))


def version(
    tmp_path: Path, pipeline: str = PIPELINE, helpers: str = HELPERS, name: str = "proc", tag: str | None = None
) -> str:
    return load(tmp_path, {"helpers": helpers, "pipeline": pipeline}, tag)["pipeline"].p.processors[name].version


def test_the_same_code_in_fresh_modules_has_one_version(tmp_path):
    assert version(tmp_path) == version(tmp_path)
    assert version(tmp_path).startswith("src-")


def test_a_rewrite_of_a_helper_it_calls_changes_the_version_directly_by_name_and_transitively(tmp_path):
    before = version(tmp_path)
    assert version(tmp_path, helpers=HELPERS.replace("return _scale(x) + 1", "return _scale(x) + 2")) != before
    negated = HELPERS.replace("def clean(x):\n    return x", "def clean(x):\n    return -x")
    assert version(tmp_path, helpers=negated) != before  # imported by name: `from helpers import clean`
    assert version(tmp_path, helpers=HELPERS.replace("return x * 2", "return x * 3")) != before  # _scale, via score


def test_a_change_to_code_it_does_not_reach_leaves_the_version(tmp_path):
    before = version(tmp_path)
    assert version(tmp_path, helpers=HELPERS.replace("return x - 1", "return x - 100")) == before  # helpers.unused
    assert version(tmp_path, pipeline=PIPELINE.replace("return df + 1", "return df + 2")) == before  # another processor
    elsewhere = PIPELINE.replace("# another processor of the same module", "# a comment rewritten\n\n\n# and moved")
    assert version(tmp_path, pipeline=elsewhere) == before
    assert version(tmp_path, pipeline="# a new first line\n" + PIPELINE) == before  # every line number moved
    assert version(tmp_path, pipeline=PIPELINE + "\nTHRESHOLD = 5\n") == before  # a constant it does not read
    assert version(tmp_path, pipeline=PIPELINE, name="other") != before


CONSTANTS = """
from dataclasses import dataclass

from weir.pipeline import Pipeline

p = Pipeline("p")
a = p.topic("a", schema="id BIGINT")
b = p.topic("b", schema="id BIGINT")


@p.processor(inputs=[a], outputs=[b])
def proc(df):
    return [x for x in df if x > THRESHOLD and LIMITS.low < x and x in ALLOWED and Rule().keeps(x)]


@dataclass(frozen=True)
class Limits:
    low: float


class Rule:
    def keeps(self, x):
        return x % 2 == 0


THRESHOLD = 10
LIMITS = Limits(0.5)
ALLOWED = frozenset({"x", "y", "z"})
"""


def test_a_changed_constant_dataclass_or_class_it_reads_changes_the_version_even_defined_below_it(tmp_path):
    before = version(tmp_path, pipeline=CONSTANTS)
    assert version(tmp_path, pipeline=CONSTANTS) == before
    assert version(tmp_path, pipeline=CONSTANTS.replace("THRESHOLD = 10", "THRESHOLD = 11")) != before
    assert version(tmp_path, pipeline=CONSTANTS.replace("Limits(0.5)", "Limits(0.25)")) != before
    assert version(tmp_path, pipeline=CONSTANTS.replace('"z"}', '"w"}')) != before
    assert version(tmp_path, pipeline=CONSTANTS.replace("x % 2 == 0", "x % 3 == 0")) != before  # a method's code
    assert version(tmp_path, pipeline=CONSTANTS.replace("low: float", "low: int")) != before  # the dataclass's


STATEFUL = """
from weir.blocks import ListOf, Value, stateful
from weir.pipeline import Pipeline

WATERMARK = "10 seconds"
STATE_DECLARATIONS

p = Pipeline("p")
a = p.topic("a", schema="device STRING, at TIMESTAMP, celsius DOUBLE")
b = p.topic("b", schema="device STRING, n BIGINT")


@stateful(key="device", output="n BIGINT", state=STATE, event_time="at", watermark=WATERMARK)
def count(device, records, state, timers):
    state.n.value = (state.n.value or 0) + len(records)
    timers.set(records[-1]["at"])
    return ()


@count.on_timer
def fire(device, at, state, timers):
    yield {"n": state.n.value}


@p.processor(inputs=[a], outputs=[b], stateful=True)
def counts(readings):
    return count(readings)
"""


def stateful_version(tmp_path: Path, source: str = STATEFUL, state: str = 'STATE = {"n": Value("bigint")}') -> str:
    source = source.replace("STATE_DECLARATIONS", state)
    return version(tmp_path, pipeline=source, name="counts")


def test_a_change_to_a_stateful_function_its_handlers_or_its_declarations_changes_the_version(tmp_path):
    before = stateful_version(tmp_path)
    assert stateful_version(tmp_path) == before
    assert stateful_version(tmp_path, STATEFUL.replace("+ len(records)", "+ 2 * len(records)")) != before
    assert stateful_version(tmp_path, STATEFUL.replace('yield {"n": state.n.value}', 'yield {"n": 0}')) != before
    assert stateful_version(tmp_path, state='STATE = {"n": Value("double")}') != before  # a declaration
    assert stateful_version(tmp_path, state='STATE = {"n": ListOf("bigint", keep=3)}') != before
    assert stateful_version(tmp_path, STATEFUL.replace('"10 seconds"', '"20 seconds"')) != before  # its watermark
    migrated = STATEFUL + "\n\n@count.migrate\ndef from_old(device, old):\n    return old\n"
    assert stateful_version(tmp_path, migrated) != before
    assert stateful_version(tmp_path, migrated.replace("return old\n", "return None\n")) != (
        stateful_version(tmp_path, migrated)
    )


FACTORY = """
from weir.pipeline import Pipeline

KEY = lambda r: r["id"]


def build(limit, scale):
    p = Pipeline("p")
    a = p.topic("a", schema="id BIGINT")
    b = p.topic("b", schema="id BIGINT")

    @p.processor(inputs=[a], outputs=[b])
    def proc(rows, factor=2, *, offset=0):
        return [KEY(r) * factor * scale + offset for r in rows if KEY(r) > limit]

    return p


p = build(10, 1.5)
"""


def test_a_changed_closure_value_lambda_or_default_changes_the_version(tmp_path):
    before = version(tmp_path, pipeline=FACTORY)
    assert version(tmp_path, pipeline=FACTORY.replace("build(10, 1.5)", "build(11, 1.5)")) != before
    assert version(tmp_path, pipeline=FACTORY.replace("build(10, 1.5)", "build(10, 2.5)")) != before
    assert version(tmp_path, pipeline=FACTORY.replace('r["id"]', 'r["id"] + 1')) != before  # the lambda
    assert version(tmp_path, pipeline=FACTORY.replace("factor=2", "factor=3")) != before
    assert version(tmp_path, pipeline=FACTORY.replace("offset=0", "offset=1")) != before


IMPORTS_IN_BODY = """
from weir.pipeline import Pipeline

p = Pipeline("p")
a = p.topic("a", schema="id BIGINT")
b = p.topic("b", schema="id BIGINT")


@p.processor(inputs=[a], outputs=[b])
def proc(df):
    import json
    from {helpers} import score
    return json.dumps(score(df))
"""


def test_a_user_module_imported_in_the_function_body_is_read_a_library_is_named_only(tmp_path):
    tag = f"in_body_{uuid.uuid4().hex[:10]}"  # one module name: the function's source names it
    before = version(tmp_path, pipeline=IMPORTS_IN_BODY, tag=tag)
    assert version(tmp_path, pipeline=IMPORTS_IN_BODY, tag=tag) == before
    assert version(tmp_path, pipeline=IMPORTS_IN_BODY, helpers=HELPERS.replace("x * 2", "x * 4"), tag=tag) != before
    assert version(tmp_path, pipeline=IMPORTS_IN_BODY, helpers=HELPERS.replace("x - 1", "x - 4"), tag=tag) == before
    from weir.pipeline.codeversion import code_text

    text = code_text(load(tmp_path, {"helpers": HELPERS, "pipeline": IMPORTS_IN_BODY}, tag)["pipeline"].proc)
    assert "import json: module json" in text and "def dumps" not in text  # the standard library is not read
    assert "def _scale(x):" in text
    unloaded = tmp_path / "unloaded"
    unloaded.mkdir()
    (unloaded / f"helpers_{tag}.py").write_text(HELPERS)
    sys.modules.pop(f"helpers_{tag}", None)  # not imported yet when the version is read: its file is hashed
    sys.path.insert(0, str(unloaded))
    try:
        text = code_text(load(tmp_path, {"pipeline": IMPORTS_IN_BODY.replace("{helpers}", f"helpers_{tag}")})[
            "pipeline"
        ].proc)  # fmt: skip
    finally:
        sys.path.remove(str(unloaded))
    assert f"import helpers_{tag}: not loaded, file sha256 " in text and f"helpers_{tag}" not in sys.modules


DETERMINISM = """
from weir.pipeline import Pipeline
import {helpers} as helpers

p = Pipeline("p")
a = p.topic("a", schema="id BIGINT")
b = p.topic("b", schema="id BIGINT")

WORDS = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"}
BY_WORD = {w: len(w) for w in WORDS}  # in the set's order, which the hash seed decides
HANDLERS = {helpers.score, helpers.clean, helpers._scale, lambda x: x + 1, lambda x: x + 2, lambda x: x * 3}


@p.processor(inputs=[a], outputs=[b])
def proc(df):
    return [h(x) for x in df for h in HANDLERS if x in WORDS and BY_WORD.get(x)]
"""


def test_the_same_code_has_the_same_version_in_other_interpreters_whatever_their_hash_seed(tmp_path):
    module = load(tmp_path, {"helpers": HELPERS, "pipeline": DETERMINISM})["pipeline"]
    here = module.p.processors["proc"].version
    where = str(Path(module.__file__).parent)
    script = f"import {module.__name__} as m; print(m.p.processors['proc'].version)"
    seen = set()
    for seed in ("1", "2", "3", "12345", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": os.pathsep.join([str(ROOT), where])}
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        seen.add(done.stdout.strip())
    assert seen == {here}
    assert version(tmp_path, pipeline=DETERMINISM.replace("x * 3", "x * 4")) != here  # a lambda in the set


RECURSIVE = """
from weir.pipeline import Pipeline

p = Pipeline("p")
a = p.topic("a", schema="id BIGINT")
b = p.topic("b", schema="id BIGINT")


def even(n):
    return n == 0 or odd(n - 1)


def odd(n):
    return n != 0 and even(n - 1)


def down(n):
    return 0 if n == 0 else down(n - 1) + CHAIN[0](n)


@p.processor(inputs=[a], outputs=[b])
def proc(rows):
    return [even(r) + down(r) + f0(r) for r in rows]


CHAIN = [proc]  # a value that leads back to the function
"""


def chain(depth: int, last: str = "return x") -> str:
    """f0 calls f1 ... calls f{depth-1}: deeper than Python's recursion limit."""
    return "".join(f"\n\ndef f{i}(x):\n    return f{i + 1}(x)\n" for i in range(depth - 1)) + (
        f"\n\ndef f{depth - 1}(x):\n    {last}\n"
    )


def test_recursion_and_a_call_chain_deeper_than_the_recursion_limit_terminate(tmp_path):
    depth = sys.getrecursionlimit() + 500
    before = version(tmp_path, pipeline=RECURSIVE + chain(depth))
    assert version(tmp_path, pipeline=RECURSIVE + chain(depth)) == before
    assert version(tmp_path, pipeline=RECURSIVE + chain(depth, "return x + 1")) != before  # the chain's far end


def test_a_function_without_source_is_versioned_by_its_bytecode_and_an_explicit_version_stays(tmp_path):
    def exec_version(body: str) -> str:
        scope: dict = {"LIMIT": 3}
        exec(f"def keep(rows):\n    return [r for r in rows if {body}]\n", scope)  # no file: no source
        return code_version(scope["keep"])

    assert exec_version("r > LIMIT") == exec_version("r > LIMIT")
    assert exec_version("r > LIMIT") != exec_version("r >= LIMIT")
    p = Pipeline("p")
    a, b = p.topic("a", schema="id BIGINT"), p.topic("b", schema="id BIGINT")
    p.processor(inputs=[a], outputs=[b], version="v7")(lambda df: df)
    assert p.processors["<lambda>"].version == "v7"


@pytest.mark.parametrize("value", [print, len, str.upper, object(), open])
def test_values_whose_repr_holds_an_address_or_no_code_do_not_crash_or_leak_it(value):
    from weir.pipeline.codeversion import code_text

    scope: dict = {"VALUE": value}
    exec("def fn(x):\n    return VALUE(x)\n", scope)
    text = code_text(scope["fn"])
    assert " at 0x" not in text and "0x" not in text.split("global VALUE = ", 1)[1].split("\n", 1)[0]


LOADED = """
from weir.pipeline import Pipeline


class Scale:
    __slots__ = ("factor",)

    def __init__(self, factor):
        self.factor = factor

    def __call__(self, x):
        return x * self.factor


SCALE = Scale(FACTOR)

p = Pipeline("p")
a = p.topic("a", schema="id BIGINT")
b = p.topic("b", schema="id BIGINT")


@p.processor(inputs=[a], outputs=[b])
def proc(rows):
    return [SCALE(r) for r in rows]
"""


def test_one_file_loaded_by_path_or_by_module_name_has_one_version(tmp_path, monkeypatch):
    from weir.pipeline.load import load as load_pipeline

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # load() adds the working directory
    monkeypatch.setattr(sys, "path", list(sys.path))
    name = f"scaled_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{name}.py").write_text(LOADED.replace("Scale(FACTOR)", "Scale(2)"))
    by_path = load_pipeline(str(tmp_path / f"{name}.py")).processors["proc"].version  # module weir_pipeline_<name>
    assert load_pipeline(name).processors["proc"].version == by_path  # module <name>
    (tmp_path / f"{name}_3.py").write_text(LOADED.replace("Scale(FACTOR)", "Scale(3)"))
    assert load_pipeline(str(tmp_path / f"{name}_3.py")).processors["proc"].version != by_path  # a slot's value
