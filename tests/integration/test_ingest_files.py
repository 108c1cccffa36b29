"""`weir ingest files` as a real process: SIGKILLed at moments picked by the output (mid-file, between files,
after a file's last acknowledgement and before the ledger), restarted each time, and the topic then holds
every row of every file exactly once; JSON-lines files appended to read on, each line once, also across
SIGKILL; rewritten files reported, not re-read; CSV and Parquet with bad rows and a corrupt file dead-lettered
while the job goes on; new files picked up as they land."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _ingest import Child, produced, read_topic

pytestmark = pytest.mark.integration
SCHEMA = "order_id STRING NOT NULL, amount DOUBLE, qty INT"


def args(where: Path | str, topic: str, fmt: str = "json", *extra: str) -> list[str]:
    return ["ingest", "files", str(where), "--topic", topic, "--format", fmt, "--schema", SCHEMA, "--key",
            "order_id", "--partitions", "3", "--settle", "0", *extra]  # fmt: skip


def write_json(path: Path, rows: int, bad_every: int = 0) -> int:
    """JSON lines, with a bad line every `bad_every` lines; the number of good ones."""
    good = 0
    with path.open("w") as f:
        for i in range(1, rows + 1):
            if bad_every and i % bad_every == 0:
                f.write('{"order_id": null, "amount": 1}\n')
            else:
                f.write(json.dumps({"order_id": f"{path.stem}-{i}", "amount": i / 2, "qty": i % 7}) + "\n")
                good += 1
    return good


def coordinates(messages: list) -> Counter:
    heads = [dict(m.headers()) for m in messages]
    return Counter((h["weir.ingest.file"].decode(), int(h["weir.ingest.row"])) for h in heads)


def test_sigkill_at_any_moment_neither_resends_nor_skips(bootstrap, tmp_path, topic_name):
    inbox = tmp_path / "in"
    inbox.mkdir()
    good = sum(write_json(inbox / f"part{n}.json", 4000, bad_every=997) for n in range(4))
    env = {"WEIR_HOME": str(tmp_path / "home"), "WEIR_BOOTSTRAP_SERVERS": bootstrap}
    # A kill after a file's last acknowledgement, before the ledger says done: the worst moment.
    fault = Child(args(inbox, topic_name, "json", "--chunk", "200"), env, tmp_path / "fault.log",
                  fault="kill-after-file-acks")  # fmt: skip
    assert fault.proc.wait(60) == -9
    fault.stop()
    kills = []
    for threshold in (6000, 9000, 12000):
        # Chunks of 10 records, each acknowledged before the next: on a loaded machine a poll of the topic took
        # seconds, and a child producing chunks of 100 ingested every file in between (all three kills at the end).
        # Each child is killed past its threshold, or at the first record it adds, if the one before overshot.
        child = Child(args(inbox, topic_name, "json", "--chunk", "10"), env, tmp_path / f"run-{threshold}.log")
        target = max(threshold, produced(bootstrap, topic_name) + 1)
        deadline = time.monotonic() + 60
        while produced(bootstrap, topic_name) < target and time.monotonic() < deadline:
            assert child.proc.poll() is None, child.text()[-2000:]
            time.sleep(0.01)
        child.kill()
        kills.append(produced(bootstrap, topic_name))
    last = Child(args(inbox, topic_name, "json", "--once"), env, tmp_path / "last.log")
    assert last.proc.wait(120) == 0, last.text()[-3000:]
    last.stop()
    assert kills[0] < good, f"the kills came after the end ({kills}): they tested nothing"
    out = coordinates(read_topic(bootstrap, topic_name))
    assert max(out.values()) == 1, [k for k, n in out.items() if n > 1][:5]
    expected = {(str(inbox / f"part{n}.json"), i) for n in range(4) for i in range(1, 4001) if i % 997}
    assert set(out) == expected
    dead = coordinates(read_topic(bootstrap, f"{topic_name}.dlq"))
    assert max(dead.values()) == 1 and len(dead) == 4 * 4
    assert "resuming" in (tmp_path / "run-6000.log").read_text()  # the fault's file was read back


def line(path: Path, i: int) -> str:
    return json.dumps({"order_id": f"{path.stem}-{i}", "amount": i / 2, "qty": i % 7}) + "\n"


def once(args: list[str], env: dict, log: Path) -> dict:
    child = Child(args, env, log)
    assert child.proc.wait(60) == 0, child.text()[-3000:]
    child.stop()
    return json.loads(child.text().strip().splitlines()[-1])


def test_appended_lines_are_read_once_and_rewrites_reported(bootstrap, tmp_path, topic_name):
    """A JSON-lines file appended to: what was appended is read, once; a last line without its newline waits
    for it; a file whose read part changed, or that shrank, is reported and not read again."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    log = inbox / "a.json"
    write_json(log, 50)
    env = {"WEIR_HOME": str(tmp_path / "home"), "WEIR_BOOTSTRAP_SERVERS": bootstrap}
    argv = args(inbox, topic_name, "json", "--once")
    assert once(argv, env, tmp_path / "1.log")["files_done"] == 1
    half = line(log, 52)
    with log.open("a") as f:
        f.write(line(log, 51) + "\n" + half[:10])  # a blank line, then half a line
    summary = once(argv, env, tmp_path / "2.log")
    assert (summary["appends"], summary["files_changed"], summary["partial_lines"]) == (1, 0, 1)
    assert "without a newline" in (tmp_path / "2.log").read_text()
    with log.open("a") as f:
        f.write(half[10:])
    assert once(argv, env, tmp_path / "3.log")["appends"] == 1
    assert once(argv, env, tmp_path / "4.log")["appends"] == 0  # nothing new
    out = coordinates(read_topic(bootstrap, topic_name))
    assert max(out.values()) == 1 and set(out) == {(str(log), i) for i in [*range(1, 52), 53]}
    kept = [json.loads(m.value())["order_id"] for m in read_topic(bootstrap, topic_name)]
    assert sorted(kept) == sorted(f"a-{i}" for i in range(1, 53))

    log.write_text(log.read_text().replace("a-3", "A-3", 1) + line(log, 54))  # its start rewritten, and longer
    summary = once(argv, env, tmp_path / "5.log")
    assert (summary["files_changed"], summary["appends"]) == (1, 0)
    assert "changed after it was read" in (tmp_path / "5.log").read_text()
    (inbox / "b.json").write_text("".join(line(inbox / "b.json", i) for i in range(1, 11)))
    assert once(argv, env, tmp_path / "6.log")["files_done"] == 1
    (inbox / "b.json").write_text(line(inbox / "b.json", 1))  # shrank
    assert once(argv, env, tmp_path / "7.log")["files_changed"] == 2  # both, each reported again by a new run
    assert len(read_topic(bootstrap, topic_name)) == 52 + 10
    progress = [json.loads(x) for x in (tmp_path / "home" / "progress" / "ingest.jsonl").read_text().splitlines()]
    assert any(p.get("ingest", {}).get("files_changed") == 1 for p in progress)


def test_a_growing_file_is_read_exactly_once_across_sigkill(bootstrap, tmp_path, topic_name):
    """A log appended to while the job runs, SIGKILLed after an append's acknowledgements and before the
    ledger (the fault), then at moments picked by the output; its writer leaves half lines between writes.
    Every line is in the topic once."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    log = inbox / "events.json"
    total, written = 8000, 0

    def append(n: int) -> None:
        nonlocal written
        text = "".join(line(log, i) for i in range(written + 1, written + n + 1))
        with log.open("a") as f:  # two writes, the cut inside a line: a reader may see the first alone
            f.write(text[: len(text) - 7])
            f.flush()
            time.sleep(0.002)
            f.write(text[len(text) - 7 :])
        written += n

    append(1000)
    env = {"WEIR_HOME": str(tmp_path / "home"), "WEIR_BOOTSTRAP_SERVERS": bootstrap}
    argv = args(inbox, topic_name, "json", "--chunk", "100", "--interval", "0.05")
    assert once([*argv, "--once"], env, tmp_path / "first.log")["files_done"] == 1
    append(500)
    fault = Child([*argv, "--once"], env, tmp_path / "fault.log", fault="kill-after-file-acks")
    assert fault.proc.wait(60) == -9  # the append acknowledged, the ledger not told
    fault.stop()
    kills = []
    for threshold in (2500, 4500, 6500):
        child = Child(argv, env, tmp_path / f"run-{threshold}.log")
        deadline = time.monotonic() + 60
        while produced(bootstrap, topic_name) < threshold and time.monotonic() < deadline:
            assert child.proc.poll() is None, child.text()[-2000:]
            if written < total:
                append(100)
            time.sleep(0.005)
        child.kill()
        kills.append(produced(bootstrap, topic_name))
    while written < total:
        append(min(500, total - written))  # the file ends at line `total`, wherever the kills left its writer
    summary = once([*argv, "--once"], env, tmp_path / "last.log")
    assert kills[-1] < total, f"the kills came after the end ({kills}): they tested nothing"
    assert "resuming" in (tmp_path / "run-2500.log").read_text()  # the fault's append was read back
    out = coordinates(read_topic(bootstrap, topic_name))
    assert max(out.values()) == 1, [k for k, n in out.items() if n > 1][:5]
    assert set(out) == {(str(log), i) for i in range(1, total + 1)}
    assert summary["files_changed"] == 0 and read_topic(bootstrap, f"{topic_name}.dlq") == []


def test_csv_parquet_bad_rows_and_a_corrupt_file(bootstrap, tmp_path, topic_name):
    inbox = tmp_path / "in"
    inbox.mkdir()
    (inbox / "a.csv").write_text("order_id,amount,qty\nc1,1.5,2\nc2,lots,3\n,2,1\nc4,,\n")
    pq.write_table(pa.table({"order_id": ["p1", None, "p3"], "amount": [1.0, 2.0, 3.0], "qty": [1, 2, 3]}),
                   inbox / "b.parquet")  # fmt: skip
    (inbox / "c.parquet").write_bytes(b"PAR1 this is not parquet")
    env = {"WEIR_HOME": str(tmp_path / "home"), "WEIR_BOOTSTRAP_SERVERS": bootstrap}
    for fmt, glob in (("csv", "*.csv"), ("parquet", "*.parquet")):
        child = Child(args(inbox / glob, topic_name, fmt, "--once", "--job", f"j-{fmt}"), env, tmp_path / f"{fmt}.log")
        assert child.proc.wait(60) == 0, child.text()[-2000:]
        child.stop()
    kept = {json.loads(m.value())["order_id"]: json.loads(m.value()) for m in read_topic(bootstrap, topic_name)}
    assert kept == {
        "c1": {"order_id": "c1", "amount": 1.5, "qty": 2}, "c4": {"order_id": "c4", "amount": None, "qty": None},
        "p1": {"order_id": "p1", "amount": 1.0, "qty": 1}, "p3": {"order_id": "p3", "amount": 3.0, "qty": 3},
    }  # fmt: skip
    dead = {(Path(dict(m.headers())["weir.ingest.file"].decode()).name, int(dict(m.headers())["weir.ingest.row"])):
            dict(m.headers())["weir.error"].decode() for m in read_topic(bootstrap, f"{topic_name}.dlq")}  # fmt: skip
    assert set(dead) == {("a.csv", 2), ("a.csv", 3), ("b.parquet", 2), ("c.parquet", 0)}
    assert "amount" in dead[("a.csv", 2)] and "order_id" in dead[("a.csv", 3)]
    assert "cannot be read as parquet" in dead[("c.parquet", 0)]


def test_new_files_are_picked_up_as_they_land(bootstrap, tmp_path, topic_name):
    inbox = tmp_path / "in"
    inbox.mkdir()
    env = {"WEIR_HOME": str(tmp_path / "home"), "WEIR_BOOTSTRAP_SERVERS": bootstrap}
    child = Child(["ingest", "files", str(inbox), "--topic", topic_name, "--format", "json", "--schema", SCHEMA,
                   "--settle", "0.3", "--interval", "0.2"], env, tmp_path / "run.log")  # fmt: skip
    try:
        child.wait_for("reading")
        for n in range(3):
            write_json(inbox / f".tmp{n}", 100)
            (inbox / f".tmp{n}").rename(inbox / f"drop{n}.json")  # hidden while written
            deadline = time.monotonic() + 30
            while produced(bootstrap, topic_name) < 100 * (n + 1) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert produced(bootstrap, topic_name) == 100 * (n + 1)
    finally:
        assert child.stop() == 0


def test_files_under_an_s3_prefix_are_taken_in_each_once_across_a_rerun(bootstrap, s3, tmp_path, topic_name):
    """The same job over `s3://` (the S3 server process): every row of every object once, a rerun sends nothing
    again, and an object added later is picked up by the next run."""
    from pyarrow import fs as pafs

    prefix = f"{s3}/{uuid.uuid4().hex[:8]}/in"
    filesystem, base = pafs.FileSystem.from_uri(prefix)
    for n in range(2):
        local = tmp_path / f"part{n}.json"
        write_json(local, 500, bad_every=100)
        with filesystem.open_output_stream(f"{base}/part{n}.json") as f:
            f.write(local.read_bytes())
    env = {"WEIR_HOME": str(tmp_path / "home"), "WEIR_BOOTSTRAP_SERVERS": bootstrap}
    for run in range(2):
        child = Child(args(f"{prefix}/", topic_name, "json", "--once"), env, tmp_path / f"s3-{run}.log")
        assert child.proc.wait(120) == 0, child.text()[-3000:]
        child.stop()
    out = coordinates(read_topic(bootstrap, topic_name))
    assert max(out.values()) == 1 and len(out) == 2 * 495
    assert {f for f, _ in out} == {f"{prefix}/part{n}.json" for n in range(2)}
    write_json(tmp_path / "part2.json", 50)
    with filesystem.open_output_stream(f"{base}/part2.json") as f:
        f.write((tmp_path / "part2.json").read_bytes())
    child = Child(args(f"{prefix}/", topic_name, "json", "--once"), env, tmp_path / "s3-late.log")
    assert child.proc.wait(120) == 0, child.text()[-3000:]
    child.stop()
    out = coordinates(read_topic(bootstrap, topic_name))
    assert max(out.values()) == 1 and len(out) == 2 * 495 + 50
