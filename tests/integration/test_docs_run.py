"""Every page of README.md and docs/ runs as a reader would: its blocks in order, in one directory and one Python
namespace of the page's own, against a broker of its own and the run's Spark session (docs/testing.md, "The docs'
examples run"; the marks are read by tests/_docs.py). Blocks marked `not run` are checked statically by
tests/unit/test_docs_blocks.py.

What the test changes in a block, and only this: `127.0.0.1:9092` becomes the page's broker, and paths under
`/tmp/`, `/data/` and `/lake/` move into the page's directory (the page's lake is `<directory>/lake`). The
directory links `examples/` of the checkout, as a reader runs the commands from it. A page's broker is its own
(Tansu in memory, about a second to start) because the pages use fixed topic names (`orders`) that would meet in
the run's shared broker."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _docs import COMMANDS, REPO, Block, argv, blocks, commands, pages, parsed
from typer.testing import CliRunner

from weir.cli import app
from weir.kafka.broker import free_port
from weir.testing.environment import private_broker

pytestmark = pytest.mark.integration


def _runnable(page: Path) -> bool:
    return any(b.info not in ("text", "json", "toml") and b.not_run is None and not b.mark("run by")
               for b in blocks(page))  # fmt: skip


PAGES = [p for p in pages() if _runnable(p)]


class Reader:
    """One page's directory, environment and namespace; runs its blocks in order."""

    def __init__(self, page: Path, root: Path, bootstrap: str, fixtures: dict[str, object]) -> None:
        self.page, self.root, self.bootstrap, self.fixtures = page, root, bootstrap, fixtures
        self.namespace: dict[str, object] = {"__name__": "__doc__"}

    def text(self, body: str) -> str:
        body = body.replace("127.0.0.1:9092", self.bootstrap)
        return re.sub(r"(?<![\w.])/(tmp|data|lake)/", lambda m: f"{self.root}/{m.group(1)}/", body)

    def write(self, block: Block, name: str) -> None:
        path = self.root / name
        path.write_text(self.text(block.body))
        if name.endswith(".py"):
            compile(path.read_text(), str(path), "exec")  # a file the page only names must still be Python

    def run(self, block: Block) -> None:
        used = block.mark("uses")
        if used:
            name, _, other = used.partition(" from ")
            source = next(b for b in blocks(REPO / other) if b.file == name)
            self.write(source, name)
        if block.setup:
            exec(compile(self.text(block.setup), f"{block.where} (setup)", "exec"), self.namespace)
        if block.info == "python" and block.file:
            self.write(block, block.file)
        elif block.info == "python":
            before = set(self.namespace)
            exec(compile(self.text(block.body), block.where, "exec"), self.namespace)
            for name in sorted(set(self.namespace) - before):
                if name.startswith("test_") and callable(test := self.namespace[name]):
                    # as pytest would: a test the block defines runs, given the fixtures it names
                    test(**{p: self.fixtures[p] for p in inspect.signature(test).parameters})
        elif block.info in COMMANDS:
            for command in commands(block):
                self.command(block, self.text(command))
        else:
            parsed(block)

    def command(self, block: Block, command: str) -> None:
        env, words = argv(command)
        if words[0] == "weir":
            result = CliRunner().invoke(app, words[1:], env=env, catch_exceptions=False)
            output = result.output
            code = result.exit_code
        else:
            done = subprocess.run(command, shell=True, cwd=self.root, capture_output=True, text=True, timeout=300)
            output, code = done.stdout + done.stderr, done.returncode
        assert code == block.exit_code, f"{block.where}: `{command}` exited {code}:\n{output[-3000:]}"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_page_runs_as_a_reader_would(page, spark, pipeline_test, tmp_path, monkeypatch):
    root = tmp_path / "page"
    root.mkdir()
    (root / "examples").symlink_to(REPO / "examples")
    port = free_port()
    home = tmp_path / "home"
    broker = private_broker(home, port)
    broker.start()
    for key, value in {
        "WEIR_HOME": home, "WEIR_BROKER_PORT": port, "WEIR_BOOTSTRAP_SERVERS": broker.bootstrap,
        "WEIR_BROKER_KIND": broker.kind,
        "WEIR_CHECKPOINT_ROOT": tmp_path / "checkpoints", "WEIR_LAKE": root / "lake",
    }.items():  # fmt: skip
        monkeypatch.setenv(key, str(value))
    monkeypatch.chdir(root)
    monkeypatch.syspath_prepend(str(root))
    modules = set(sys.modules)
    reader = Reader(page, root, broker.bootstrap, {"pipeline_test": pipeline_test, "spark": spark})
    try:
        for block in blocks(page):
            if block.info == "text" or block.not_run is not None or block.mark("run by"):
                continue  # tests/unit/test_docs_blocks.py checks them
            reader.run(block)
    finally:
        reader.namespace.clear()  # the page's clients (a setup's producer) go before their broker does
        broker.stop()
        for name in set(sys.modules) - modules:  # the page's own modules (shop, payments) are not the next page's
            if getattr(sys.modules[name], "__file__", None) and str(root) in (sys.modules[name].__file__ or ""):
                del sys.modules[name]
