"""The code blocks of README.md and docs/*.md, as a test reads them (docs/testing.md, "The docs' examples run").

A block's info string says what it is: `python` is run; `sh`, `bash` and `console` (its `$ ` lines) are commands
run; `json` and `toml` are parsed; `text` is output or a picture, with nothing to run; `proto` is a Protobuf file
(a `file` block) that the test which runs the page's example compiles. An HTML comment right above
a fence (blank lines allowed) says more:

    <!-- doc: file shop.py -->            the block is the content of shop.py in the page's directory
    <!-- doc: uses payments.py from docs/testing.md -->   a file block of another page, written here first
    <!-- doc: exit 1 -->                  its commands exit with 1 (an example of an error)
    <!-- doc: not run: REASON -->         not run (a server that runs until stopped, a cloud bucket); checked:
                                          Python compiles, every weir command and option exists, make targets exist
    <!-- doc: run by tests/integration/test_x.py -->   that test extracts and runs it
    <!-- doc: setup
    python code                           run before the block, in the page's namespace
    -->

Pure: parsing and the checks that need no broker or Spark; tests/integration/test_docs_run.py runs the pages."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KINDS = {"python", "sh", "bash", "console", "json", "toml", "text", "proto"}
COMMANDS = {"sh", "bash", "console"}
_FENCE = re.compile(r"^( *)```(\S*)\s*$")  # a fence may be indented (in a list item)
_MARK = re.compile(r"<!--\s*doc:\s*(.*?)\s*-->", re.S)


@dataclass
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    info: str
    body: str
    marks: list[str] = field(default_factory=list)  # the marks' first lines: "file shop.py", "not run: ..."
    setup: str = ""  # Python run before the block

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def mark(self, word: str) -> str | None:
        """The rest of the mark that starts with `word` ("file" -> "shop.py"), or None."""
        for m in self.marks:
            if m == word or m.startswith(word + " ") or m.startswith(word + ":"):
                return m[len(word) :].lstrip(" :")
        return None

    @property
    def not_run(self) -> str | None:
        return self.mark("not run")

    @property
    def file(self) -> str | None:
        return self.mark("file")

    @property
    def exit_code(self) -> int:
        code = self.mark("exit")
        return int(code) if code else 0


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of a page, in order, with the marks of the comments right above it."""
    lines = path.read_text().split("\n")
    page = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, indent, info = i, len(m.group(1)), m.group(2)
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```")), None)
        if end is None:
            raise ValueError(f"{page}:{start + 1}: a fence that never closes")
        block = Block(page, start + 1, info, "\n".join(ln[indent:] for ln in lines[start + 1 : end]) + "\n")
        for text in _comments_above(lines, start):
            for mark in _MARK.findall(text):
                first, _, rest = mark.partition("\n")
                if first.strip() == "setup":
                    block.setup += rest + "\n"
                else:
                    block.marks.append(" ".join(mark.split()))
        found.append(block)
        i = end + 1
    return found


def _comments_above(lines: list[str], fence: int) -> list[str]:
    """The HTML comments between the previous paragraph and the fence, top to bottom."""
    comments: list[str] = []
    j = fence - 1
    while j >= 0:
        if not lines[j].strip():
            j -= 1
            continue
        if not lines[j].rstrip().endswith("-->"):
            break
        k = j
        while k >= 0 and "<!--" not in lines[k]:
            k -= 1
        if k < 0:
            break
        comments.insert(0, "\n".join(lines[k : j + 1]))
        j = k - 1
    return comments


def problems(block: Block) -> list[str]:
    """What is wrong with a block's declaration, without running it."""
    found = []
    if block.info not in KINDS:
        found.append(
            f"{block.where}: info string {block.info!r}: one of {', '.join(sorted(KINDS))} says how to test it"
        )
    known = ("file", "uses", "exit", "not run", "run by")
    for m in block.marks:
        if not any(m == w or m.startswith(w + " ") or m.startswith(w + ":") for w in known):
            found.append(f"{block.where}: unknown mark {m!r} (known: {', '.join(known)}, setup)")
    if block.not_run is not None and not block.not_run:
        found.append(f"{block.where}: 'not run' without a reason")
    if block.info == "proto" and not (block.file and block.mark("run by")):
        found.append(f"{block.where}: a proto block is a file some test compiles: mark it 'file' and 'run by'")
    if block.info == "text" and (block.marks or block.setup):
        found.append(f"{block.where}: a text block runs nothing; marks {block.marks} mean nothing on it")
    by = block.mark("run by")
    if by is not None and block.page not in (REPO / by).read_text():
        found.append(f"{block.where}: {by} does not name {block.page}")
    return found


def commands(block: Block) -> list[str]:
    """The commands of a `sh`/`bash`/`console` block, continuation lines joined; `console` keeps its `$ ` lines."""
    lines = block.body.replace("\\\n", " ").split("\n")
    if block.info == "console":
        return [ln[2:] for ln in lines if ln.startswith("$ ")]
    return [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def argv(command: str) -> tuple[dict[str, str], list[str]]:
    """A command line's leading VAR=value assignments and its words, comments dropped; `.venv/bin/weir` is weir."""
    words = shlex.split(command, comments=True)
    env: dict[str, str] = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    if words and words[0].endswith("/weir"):
        words[0] = "weir"
    return env, words


def parsed(block: Block) -> list[object]:
    """A toml block's data, or a json block's values (one or more, as in JSON Lines). In JSON, `...` outside
    strings stands for elided text: `{...}` an object's members, `, ...` the rest of them, else a value (null)."""
    if block.info == "toml":
        return [tomllib.loads(block.body)]

    def elide(m: re.Match) -> str:
        if m.group(1):
            return m.group(1)  # a string, kept as it is
        return {"{...}": "{}", "[...]": "[]"}.get(m.group(0), "" if m.group(0).startswith(",") else "null")

    text = re.sub(r'("(?:[^"\\]|\\.)*")|\{\.\.\.\}|\[\.\.\.\]|,\s*\.\.\.(?=\s*[}\]])|\d*\.\.\.', elide, block.body)
    text = text.strip()
    if not text.startswith(("{", "[")):
        text = "{" + text + "}"  # a fragment of an object: its members
    values, decoder, at = [], json.JSONDecoder(), 0
    while at < len(text):
        value, at = decoder.raw_decode(text, at)
        values.append(value)
        while at < len(text) and text[at].isspace():
            at += 1
    return values


def cli_problems(command: str) -> list[str]:
    """A weir command line checked against the CLI without running it: its command and every option exist.
    `make TARGET` is checked against the Makefile."""
    import typer

    from weir.cli import app

    _, words = argv(command)
    if not words:
        return [f"{command!r}: no command"]
    if words[0] == "make":
        targets = re.findall(r"^([a-z][\w-]*):", (REPO / "Makefile").read_text(), re.M)
        return [f"{command!r}: no make target {t}" for t in words[1:] if "=" not in t and t not in targets]
    if words[0] != "weir":
        return [f"{command!r}: not a weir or make command, and not run"]
    cmd = typer.main.get_command(app)  # typer's own click: a group is what has subcommands
    rest = words[1:]
    while hasattr(cmd, "commands") and rest and rest[0] in cmd.commands:
        cmd = cmd.commands[rest.pop(0)]
    if hasattr(cmd, "commands"):
        return [f"{command!r}: {' '.join(words)}: no such weir command"]
    if cmd.context_settings.get("ignore_unknown_options"):  # `weir broker tool`: the options are Kafka's tool's
        return []
    options = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
    return [
        f"{command!r}: weir {cmd.name} has no option {w.split('=')[0]}"
        for w in rest
        if w.startswith("-") and w != "-" and w.split("=")[0] not in options
    ]
