"""A shadow's pieces without Spark: its checkpoint seeded from the live one as of a committed batch, its topics,
and its candidate found in a file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from weir.checkpoint.files import Checkpoint
from weir.config import load
from weir.pipeline import Pipeline
from weir.pipeline.model import Shadow
from weir.runtime import routing
from weir.shadow.seed import SeedError, seed
from weir.shadow.start import ShadowError, candidate, plan


def live_checkpoint(root: Path) -> Path:
    """A live checkpoint whose batch 3 is planned, not committed, and whose state has files of version 4."""
    cp = root / "live"
    files = {
        **{f"offsets/{b}": f"v1\n{{}}\n{{\"t\":{{\"0\":{10 * (b + 1)}}}}}" for b in range(4)},
        **{f"commits/{b}": "v1\n{}" for b in range(3)},
        "metadata": json.dumps({"id": "live-query-id"}),
        "sources/0/0": "v1\n{}",
        "state/0/0/1.delta": "a", "state/0/0/3.delta": "b", "state/0/0/3_4f2a.zip": "c",
        "state/0/0/4.delta": "written by batch 3", "state/0/0/4.changelog": "too",
        "state/0/0/SSTs/000007-9c1d.sst": "shared", "state/0/0/.3.delta.crc": "checksum",
        "state/0/_metadata/metadata": "operator", "state/0/_metadata/v2/4": "batch 3's",
        "weir.json": json.dumps({"version": "src-live"}), "weir/folded.json": "{}",
        "weir/marks/3.json": "live topics' marks",
    }  # fmt: skip
    for name, text in files.items():
        (cp / name).parent.mkdir(parents=True, exist_ok=True)
        (cp / name).write_text(text)
    return cp


def copied(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_a_shadow_checkpoint_is_the_live_one_as_of_a_committed_batch(tmp_path):
    live = live_checkpoint(tmp_path)
    n = seed(Checkpoint(str(live)), Checkpoint(str(tmp_path / "shadow")), 2)
    got = copied(tmp_path / "shadow")
    assert got == {
        "offsets/0", "offsets/1", "offsets/2", "commits/0", "commits/1", "commits/2", "metadata", "sources/0/0",
        "state/0/0/1.delta", "state/0/0/3.delta", "state/0/0/3_4f2a.zip", "state/0/0/SSTs/000007-9c1d.sst",
        "state/0/_metadata/metadata", "weir.json", "weir/folded.json",
    }  # fmt: skip
    assert n == len(got)
    assert (tmp_path / "shadow/offsets/2").read_text() == (live / "offsets/2").read_text()
    assert json.loads((tmp_path / "shadow/metadata").read_text())["id"] != "live-query-id"  # a run of its own
    with pytest.raises(SeedError, match="exists already"):
        seed(Checkpoint(str(live)), Checkpoint(str(tmp_path / "shadow")), 2)
    with pytest.raises(SeedError, match=r"has no .*commits/3"):
        seed(Checkpoint(str(live)), Checkpoint(str(tmp_path / "other")), 3)  # batch 3 is not committed


def declare(fn_source: str = "def keep(df):\n    return df\n") -> Pipeline:
    p = Pipeline("p")
    a = p.topic("a", schema="id BIGINT")
    b = p.topic("b", schema="id BIGINT")
    scope: dict = {}
    exec(fn_source, scope)
    p.processor(inputs=[a], outputs=[b], name="keep")(scope["keep"])
    return p


def test_a_shadow_writes_topics_of_its_own_only():
    proc = declare().processors["keep"]
    live = sorted({t for _, t in routing.destinations(proc) if t is not None})
    assert live == ["a.dlq", "a.late", "b"]
    proc.shadow = Shadow(follow="/cps/p/keep")
    assert sorted({t for _, t in routing.destinations(proc) if t is not None}) == [
        "a.dlq.shadow",
        "a.late.shadow",
        "b.shadow",
    ]


def test_the_candidate_is_the_processor_a_file_declares_or_its_function(tmp_path):
    live = declare().processors["keep"]
    by_function = tmp_path / "by_function.py"
    by_function.write_text("def keep(df):\n    return df.limit(1)\n")
    fn, version = candidate(live, str(by_function))
    assert fn.__name__ == "keep" and version.startswith("src-") and version != live.version
    declared = tmp_path / "declared.py"
    declared.write_text(
        "from weir.pipeline import Pipeline\np = Pipeline('p')\na = p.topic('a', schema='id BIGINT')\n"
        "b = p.topic('b', schema='id BIGINT')\n"
        "@p.processor(inputs=[a], outputs=[b], name='keep', version='v2')\ndef other_name(df):\n    return df\n"
    )
    assert candidate(live, str(declared))[1] == "v2"
    moved = tmp_path / "moved.py"
    moved.write_text(declared.read_text().replace("outputs=[b]", "outputs=[a]"))
    with pytest.raises(ShadowError, match=r"declares outputs \['a'\], the live one \['b'\]"):
        candidate(live, str(moved))
    nothing = tmp_path / "nothing.py"
    nothing.write_text("x = 1\n")
    with pytest.raises(ShadowError, match=r"declares no processor keep .* and defines no function keep"):
        candidate(live, str(nothing))


def test_a_shadow_is_refused_for_what_writes_no_topic(tmp_path):
    p = declare()
    s = load(home=str(tmp_path), checkpoint_root=str(tmp_path / "cps"))
    with pytest.raises(ShadowError, match=r"has no processor nope .it has keep"):
        plan(p, "nope", "x.py", s)
    sh = plan(p, "keep", str(_file(tmp_path)), s)
    assert sh.shadow.name == "keep.shadow" and sh.shadow.checkpoint == "p/keep.shadow"
    assert sh.shadow.shadow.follow == sh.live_checkpoint.url and sh.checkpoint.url.endswith("p/keep.shadow")


def _file(tmp_path: Path) -> Path:
    f = tmp_path / "cand.py"
    f.write_text("def keep(df):\n    return df\n")
    return f
