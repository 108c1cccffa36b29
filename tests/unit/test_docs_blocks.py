"""The docs' blocks, without running them (tests/_docs.py): every block says how it is tested, and a block that
is not run is still checked: its Python compiles, its weir commands and options exist, its data parses.
tests/integration/test_docs_run.py runs the rest. And the pages hold together: every relative link resolves (to a
file, and to a heading when it names one), and docs/README.md lists every page."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from _docs import COMMANDS, REPO, argv, blocks, cli_problems, commands, pages, parsed, problems

ALL = [b for p in pages() for b in blocks(p)]


def test_every_block_of_every_page_says_how_it_is_tested():
    found = [problem for b in ALL for problem in problems(b)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("block", [b for b in ALL if b.not_run is not None], ids=lambda b: b.where)
def test_a_block_that_is_not_run_is_still_checked(block):
    if block.info == "python":
        compile(block.setup + block.body, block.where, "exec")
    elif block.info in COMMANDS:
        assert commands(block), f"{block.where}: no command in it"
        found = [problem for c in commands(block) for problem in cli_problems(c)]
        assert not found, "\n".join(found)
    else:
        pytest.fail(f"{block.where}: a {block.info} block is parsed, never 'not run'")


@pytest.mark.parametrize("block", [b for b in ALL if b.info in ("json", "toml")], ids=lambda b: b.where)
def test_json_and_toml_blocks_parse(block):
    parsed(block)


def test_every_command_of_a_run_block_is_a_command_weir_has():
    # a run block fails at run time too, but this names the wrong option without Spark
    found = [problem for b in ALL if b.info in COMMANDS for c in commands(b) for problem in cli_problems(c)]
    assert not found, "\n".join(found)


def page(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "page.md"
    path.write_text(textwrap.dedent(text))
    return path


def test_marks_setup_and_commands_are_read_from_the_comments_above_a_fence(tmp_path):
    path = page(
        tmp_path,
        """\
        Intro.

        <!-- doc: file shop.py -->
        ```python
        x = 1
        ```

        <!-- doc: setup
        y = 2
        -->
        <!-- doc: exit 1 -->

        ```console
        $ WEIR_X=1 .venv/bin/weir graph shop.py \\
            --dot   # the dot
        output line
        ```

        ```
        untagged
        ```
        """,
    )
    a, b, c = blocks(path)
    assert (a.info, a.file, a.line, a.body) == ("python", "shop.py", 4, "x = 1\n")
    assert (b.setup.strip(), b.exit_code, b.marks) == ("y = 2", 1, ["exit 1"])
    assert commands(b) == ["WEIR_X=1 .venv/bin/weir graph shop.py      --dot   # the dot"]
    assert argv(commands(b)[0]) == ({"WEIR_X": "1"}, ["weir", "graph", "shop.py", "--dot"])
    assert c.marks == [] and problems(c) == [
        f"{c.page}:19: info string '': one of bash, console, json, proto, python, sh, text, toml says how to test it"
    ]


def test_a_reasonless_or_unknown_mark_is_a_problem(tmp_path):
    path = page(
        tmp_path,
        """\
        <!-- doc: not run -->
        ```sh
        weir run shop.py
        ```
        <!-- doc: skip it -->
        ```text
        x
        ```
        """,
    )
    a, b = blocks(path)
    assert problems(a) == [f"{a.where}: 'not run' without a reason"]
    assert f"{b.where}: unknown mark 'skip it' (known: file, uses, exit, not run, run by, setup)" in problems(b)


def test_cli_problems_name_a_missing_command_or_option():
    assert cli_problems("weir run shop.py --once --reset enrich") == []
    assert cli_problems("weir lake stats orders --json") == []
    assert cli_problems("weir run shop.py --onse") == ["'weir run shop.py --onse': weir run has no option --onse"]
    assert cli_problems("weir lake frob x") == ["'weir lake frob x': weir lake frob x: no such weir command"]
    assert cli_problems("make demo DURATION=5") == []
    assert cli_problems("make demonstrate") == ["'make demonstrate': no make target demonstrate"]


def test_json_elisions_read_as_null():
    from _docs import Block

    text = '{"a": 1795..., "b": "...", "c": ..., "d": {...}, "e": [...]}\n{"f": 1, ...}'
    assert parsed(Block("p", 1, "json", text)) == [{"a": None, "b": "...", "c": None, "d": {}, "e": []}, {"f": 1}]
    assert parsed(Block("p", 1, "json", '"@admission": {"limit": 2}')) == [{"@admission": {"limit": 2}}]
    with pytest.raises(ValueError):
        parsed(Block("p", 1, "json", '{"a": 1,}'))


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _outside_fences(path: Path) -> list[tuple[int, str]]:
    """A page's lines outside fenced blocks, with their numbers."""
    found, fenced = [], False
    for number, line in enumerate(path.read_text().split("\n"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            found.append((number, line))
    return found


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens, a repeated
    one numbered."""
    found: set[str] = set()
    count: dict[str, int] = {}
    for _, line in _outside_fences(path):
        if re.match(r"#{1,6} ", line):
            slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            n = count.get(slug, 0)
            found.add(slug if n == 0 else f"{slug}-{n}")
            count[slug] = n + 1
    return found


def link_problems(path: Path) -> list[str]:
    found = []
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
    for number, line in _outside_fences(path):
        for target in _LINK.findall(re.sub(r"`[^`]*`", "", line)):  # a link in inline code is code
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not a page of the repository
                continue
            file, _, anchor = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            if not linked.exists():
                found.append(f"{where}:{number}: {target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                found.append(f"{where}:{number}: {target}: {linked.name} has no heading whose anchor is #{anchor}")
    return found


def test_every_relative_link_of_every_page_resolves():
    found = [problem for p in pages() for problem in link_problems(p)]
    assert not found, "\n".join(found)


def test_the_docs_index_lists_every_page():
    index = (REPO / "docs" / "README.md").read_text()
    listed = set(_LINK.findall(index))
    missing = [p.name for p in sorted((REPO / "docs").glob("*.md")) if p.name != "README.md" and p.name not in listed]
    assert not missing, f"docs/README.md lists no line for {missing}"


def test_a_broken_link_or_anchor_is_named(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## The goals, where they stand (2026-12-06)\n")
    path = page(
        tmp_path,
        """\
        # Page

        [fine](other.md), [anchor](other.md#the-goals-where-they-stand-2026-12-06), [web](https://example.com)
        [gone](missing.md) and [bad anchor](other.md#nowhere), `[in code](missing.md)`

        ```text
        [in a block](missing.md)
        ```
        """,
    )
    assert link_problems(path) == [
        "page.md:4: missing.md: no such file",
        "page.md:4: other.md#nowhere: other.md has no heading whose anchor is #nowhere",
    ]
