"""`weir audit`'s logic on hand-made checkpoint directories (files only, no Spark, no broker): gaps, overlaps,
a batch in flight, counted losses, logs without @start, purged logs, a reset's history and a backfill."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from weir.checkpoint.audit import IN_FLIGHT, LOSS, SILENT, UNKNOWN, Backfilled, audit, fold
from weir.checkpoint.files import Checkpoint, write_json
from weir.cli import app
from weir.runtime import versions

META = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}})


def batch(cp, n: int, end: dict, start: dict | None = None, committed: bool = True, lost: int = 0) -> None:
    """Batch `n` of a one-source query: its end (and @start), committed or not, with cumulative @dataLoss."""
    line: dict = {t: {str(p): o for p, o in ps.items()} for t, ps in end.items()}
    if start is not None:
        line["@start"] = {t: {str(p): o for p, o in ps.items()} for t, ps in start.items()}
    if lost:
        line["@dataLoss"] = {"skippedOffsets": lost, "events": 1}
    (cp / "offsets").mkdir(parents=True, exist_ok=True)
    (cp / "commits").mkdir(exist_ok=True)
    (cp / "offsets" / str(n)).write_text(f"v1\n{META}\n{json.dumps(line)}\n")
    if committed:
        (cp / "commits" / str(n)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def segments(result, tp=("t", 0)):
    part = next(p for p in result.partitions if (p.topic, p.partition) == tp)
    return [(s.start, s.end, s.kind or s.times) for s in part.segments]


def test_contiguous_batches_are_processed_once(tmp_path):
    cp = tmp_path / "cp"
    batch(cp, 0, {"t": {0: 10, 1: 4}}, {"t": {0: 0, 1: 0}})
    batch(cp, 1, {"t": {0: 25, 1: 4}}, {"t": {0: 10, 1: 4}})
    result = audit("p", Checkpoint(str(cp)))
    assert segments(result) == [(0, 25, 1)] and segments(result, ("t", 1)) == [(0, 4, 1)]
    assert result.silent_gaps == 0 and result.offsets(LOSS) == 0


def test_a_batch_without_new_records_repeats_the_plan_before_and_processes_nothing(tmp_path):
    cp = tmp_path / "cp"
    batch(cp, 0, {"t": {0: 10}}, {"t": {0: 0}})
    batch(cp, 1, {"t": {0: 10}}, {"t": {0: 0}})  # a watermark's batch: Spark logs the same end, plan included
    batch(cp, 2, {"t": {0: 12}}, {"t": {0: 10}})
    assert segments(audit("p", Checkpoint(str(cp)))) == [(0, 12, 1)]


def test_a_skipped_range_is_a_silent_gap_and_a_counted_one_a_loss(tmp_path):
    silent, counted = tmp_path / "silent", tmp_path / "counted"
    for cp, lost in ((silent, 0), (counted, 5)):
        batch(cp, 0, {"t": {0: 10}}, {"t": {0: 0}})
        batch(cp, 1, {"t": {0: 20}}, {"t": {0: 15}}, lost=lost)
    s = audit("p", Checkpoint(str(silent)))
    assert segments(s) == [(0, 10, 1), (10, 15, SILENT), (15, 20, 1)] and s.silent_gaps == 1
    c = audit("p", Checkpoint(str(counted)))
    assert segments(c) == [(0, 10, 1), (10, 15, LOSS), (15, 20, 1)] and c.silent_gaps == 0 and c.offsets(LOSS) == 5


def test_an_overlap_is_processed_twice(tmp_path):
    cp = tmp_path / "cp"
    batch(cp, 0, {"t": {0: 10}}, {"t": {0: 0}})
    batch(cp, 1, {"t": {0: 20}}, {"t": {0: 6}})
    assert segments(audit("p", Checkpoint(str(cp)))) == [(0, 6, 1), (6, 10, 2), (10, 20, 1)]


def test_a_batch_not_committed_is_in_flight_not_a_gap(tmp_path):
    cp = tmp_path / "cp"
    batch(cp, 0, {"t": {0: 10}}, {"t": {0: 0}})
    batch(cp, 1, {"t": {0: 30}}, {"t": {0: 10}}, committed=False)
    result = audit("p", Checkpoint(str(cp)))
    assert segments(result) == [(0, 10, 1), (10, 30, IN_FLIGHT)] and result.silent_gaps == 0


def test_a_log_without_start_continues_from_the_batch_before_and_does_not_guess_batch_0(tmp_path):
    cp = tmp_path / "cp"
    batch(cp, 0, {"t": {0: 10}})  # written before batches carried @start: where batch 0 began is unknown
    batch(cp, 1, {"t": {0: 20}})
    batch(cp, 2, {"t": {0: 30}}, {"t": {0: 25}})  # a newer source, after an upgrade: skips are seen again
    result = audit("p", Checkpoint(str(cp)))
    assert segments(result) == [(10, 20, 1), (20, 25, SILENT), (25, 30, 1)]
    assert any("unknown" in n for n in result.notes)


def test_a_purged_log_and_an_unknown_start_are_unknown_below_not_gaps(tmp_path):
    cp = Checkpoint(str(tmp_path / "cp"))
    batch(tmp_path / "cp", 0, {"t": {0: 30}}, {"t": {0: 0}})
    versions.reset(cp)  # the first run read [0, 30)
    batch(tmp_path / "cp", 7, {"t": {0: 60}}, {"t": {0: 50}})  # Spark purged batches 0-6 of the second run
    result = audit("p", cp)
    assert segments(result) == [(0, 30, 1), (30, 50, UNKNOWN), (50, 60, 1)] and result.silent_gaps == 0


def purge(cp, below: int) -> None:
    """What Spark does past minBatchesToRetain: the log's files of batches below `below` deleted."""
    for d in ("offsets", "commits"):
        for f in (cp / d).iterdir():
            if int(f.name) < below:
                f.unlink()


def test_folded_batches_stay_known_after_spark_purges_them(tmp_path):
    cp = tmp_path / "cp"
    for n in range(30):  # 10 records a batch; batch 20 a watermark's batch (no new records)
        lo = 10 * n if n <= 20 else 10 * (n - 1)
        batch(cp, n, {"t": {0: lo + (0 if n == 20 else 10)}}, {"t": {0: lo if n != 20 else lo - 10}})
    whole = segments(audit("p", Checkpoint(str(cp))))
    assert whole == [(0, 290, 1)]
    assert audit_fold(cp) == (0, 29) and audit_fold(cp) == (0, 29)  # folding the same batches again: no change
    purge(cp, 25)
    result = audit("p", Checkpoint(str(cp)))
    assert segments(result) == whole and result.silent_gaps == 0 and result.offsets(UNKNOWN) == 0
    assert json.loads((cp / "weir" / "folded.json").read_text())["processed"] == {"t": {"0": [[0, 290]]}}
    # Without the fold, the same purged log knows nothing below batch 25 (and says so)
    (cp / "weir" / "folded.json").unlink()
    bare = audit("p", Checkpoint(str(cp)))
    assert segments(bare) == [(240, 290, 1)] and any("purged" in n for n in bare.notes)


def test_a_fold_continues_the_log_checks_across_its_boundary(tmp_path):
    cp = tmp_path / "cp"
    batch(cp, 0, {"t": {0: 10}}, {"t": {0: 0}})
    batch(cp, 1, {"t": {0: 20}}, {"t": {0: 10}})
    audit_fold(cp)
    batch(cp, 2, {"t": {0: 40}}, {"t": {0: 25}})  # 20-25 never read: a silent gap, across the fold
    batch(cp, 3, {"t": {0: 50}}, {"t": {0: 40}}, committed=False)
    purge(cp, 2)
    result = audit("p", Checkpoint(str(cp)))
    assert segments(result) == [(0, 20, 1), (20, 25, SILENT), (25, 40, 1), (40, 50, IN_FLIGHT)]
    assert audit_fold(cp) == (0, 2)  # a batch in flight is never folded
    assert segments(audit("p", Checkpoint(str(cp)))) == [(0, 20, 1), (20, 25, SILENT), (25, 40, 1), (40, 50, IN_FLIGHT)]


def test_a_reset_keeps_the_folded_coverage_too(tmp_path):
    cp = tmp_path / "cp"
    for n in range(4):
        batch(cp, n, {"t": {0: 10 * n + 10}}, {"t": {0: 10 * n}})
    audit_fold(cp)
    purge(cp, 3)
    assert versions.reset(Checkpoint(str(cp))) and not cp.exists()
    kept = json.loads((tmp_path / "cp.weir-history" / "resets" / "000001.json").read_text())
    assert kept["processed"] == {"t": {"0": [[0, 40]]}} and kept["batches"] == [0, 3]
    batch(cp, 0, {"t": {0: 45}}, {"t": {0: 40}})  # the new checkpoint: its own log, no fold of the old one
    assert segments(audit("p", Checkpoint(str(cp)))) == [
        (0, 40, 1),
        (40, 45, 1),
    ]  # by the run before the reset, then this one


def audit_fold(cp) -> tuple[int, int] | None:
    epoch = fold(Checkpoint(str(cp)))
    return None if epoch is None or epoch.batches is None else tuple(epoch.batches)


def test_a_reset_keeps_its_coverage_and_the_reread_counts_twice(tmp_path):
    cp = tmp_path / "cp"
    batch(cp, 0, {"t": {0: 10}}, {"t": {0: 0}})
    batch(cp, 1, {"t": {0: 20}}, {"t": {0: 10}})
    batch(cp, 2, {"t": {0: 28}}, {"t": {0: 20}}, committed=False)  # in flight when reset: never processed
    (cp / "weir.json").write_text(json.dumps({"processor": "p", "version": "v1", "stateful": True, "inputs": ["t"],
                                              "result_schema": "x"}))  # fmt: skip
    assert versions.reset(Checkpoint(str(cp))) and not cp.exists()
    kept = json.loads((tmp_path / "cp.weir-history" / "resets" / "000001.json").read_text())
    assert kept["processed"] == {"t": {"0": [[0, 20]]}} and kept["version"] == "v1" and kept["at"]
    batch(cp, 0, {"t": {0: 30}}, {"t": {0: 0}})
    result = audit("p", Checkpoint(str(cp)))
    assert segments(result) == [(0, 20, 2), (20, 30, 1)]
    twice = result.partitions[0].segments[0]
    assert twice.by == ("before reset 1", "current") and result.silent_gaps == 0


def test_a_reset_that_left_offsets_behind_is_a_gap(tmp_path):
    cp = tmp_path / "cp"
    batch(cp, 0, {"t": {0: 10}}, {"t": {0: 0}})
    versions.reset(Checkpoint(str(cp)))
    batch(cp, 0, {"t": {0: 30}}, {"t": {0: 18}})  # the new run began at 18 (latest): 10-18 never read
    assert segments(audit("p", Checkpoint(str(cp)))) == [(0, 10, 1), (10, 18, SILENT), (18, 30, 1)]


def test_a_backfill_counts_on_top_and_fills_a_gap(tmp_path):
    cp = tmp_path / "cp"
    batch(cp, 0, {"t": {0: 10}}, {"t": {0: 0}})
    batch(cp, 1, {"t": {0: 20}}, {"t": {0: 15}})
    write_json(f"{Checkpoint(str(cp)).backfills}/b1.1.json", Backfilled("b1", "now", {("t", 0): [(5, 16)]}).to_json())
    result = audit("p", Checkpoint(str(cp)))
    assert segments(result) == [(0, 5, 1), (5, 10, 2), (10, 15, 1), (15, 16, 2), (16, 20, 1)]
    assert result.silent_gaps == 0 and result.partitions[0].segments[2].by == ("backfill b1",)


def test_the_cli_names_the_gap_and_exits_1(tmp_path, monkeypatch):
    spec = tmp_path / "pipe.py"
    spec.write_text(
        "from weir.pipeline import Pipeline\np = Pipeline('au')\nt = p.topic('t', 'x INT')\n"
        "@p.processor(inputs=[t], outputs=[])\ndef copy(df):\n    return df\n"
    )
    monkeypatch.setenv("WEIR_CHECKPOINT_ROOT", str(tmp_path / "cps"))
    cp = tmp_path / "cps" / "au" / "copy"
    batch(cp, 0, {"t": {0: 10}}, {"t": {0: 0}})
    batch(cp, 1, {"t": {0: 20}}, {"t": {0: 12}})
    runner = CliRunner()
    result = runner.invoke(app, ["audit", str(spec)])
    assert result.exit_code == 1, result.output
    assert "t/0" in result.output and "10" in result.output and "silent" in result.output
    result = runner.invoke(app, ["audit", str(spec), "--json"])
    found = json.loads(result.output)
    assert found["silent_gaps"] == 1 and result.exit_code == 1
    holes = found["processors"][0]["partitions"][0]["holes"]
    assert holes == [{"start": 10, "end": 12, "kind": "silent"}]
    batch(cp, 1, {"t": {0: 20}}, {"t": {0: 10}})  # the same checkpoint without the skip
    assert runner.invoke(app, ["audit", str(spec)]).exit_code == 0


def test_the_audit_never_imports_pyspark():
    code = "import sys, weir.cli.audit, weir.checkpoint.audit; print('pyspark' in sys.modules, 'pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_a_fold_that_fails_is_counted_for_the_progress_records(tmp_path):
    from weir.runtime.folding import Folder

    not_a_checkpoint = tmp_path / "cp"
    not_a_checkpoint.write_text("a file, not a checkpoint directory")
    folder = Folder(100)
    folder.finished(Checkpoint(str(not_a_checkpoint)), 0)
    folder.close()
    other = Checkpoint(str(tmp_path / "other"))
    assert folder.failed(Checkpoint(str(not_a_checkpoint))) == 1 and folder.failed(other) == 0
    cp = tmp_path / "good"
    batch(cp, 0, {"t": {0: 10}}, {"t": {0: 0}})
    folder = Folder(100)
    folder.finished(Checkpoint(str(cp)), 0)
    folder.close()
    assert folder.failed(Checkpoint(str(cp))) == 0 and audit_fold(cp) is not None


def start(cp, version: str) -> None:
    """A start of processor `p` under code `version`, as the runner records it before its query runs."""
    from weir.pipeline.model import Processor

    proc = Processor("p", lambda df: df, ("t",), (), version, "p")
    versions.check(proc, Checkpoint(str(cp)), "struct<x:int>", {"t": "x INT"})


def test_each_version_owns_the_batches_it_ran_across_a_fold_a_purge_and_a_reset(tmp_path):
    cp = tmp_path / "cp"
    start(cp, "v1")
    for n in range(3):  # v1: batches 0-2, offsets 0-30
        batch(cp, n, {"t": {0: 10 * n + 10, 1: n + 1}}, {"t": {0: 10 * n, 1: n}})
    batch(cp, 3, {"t": {0: 40, 1: 4}}, {"t": {0: 30, 1: 3}}, committed=False)  # planned, not committed
    start(cp, "v1")  # a restart of the same code: no new release
    start(cp, "v2")  # a release: batch 3 runs again under v2
    batch(cp, 3, {"t": {0: 40, 1: 4}}, {"t": {0: 30, 1: 3}})
    batch(cp, 4, {"t": {0: 55, 1: 4}}, {"t": {0: 40, 1: 4}})
    audit_fold(cp)
    purge(cp, 4)
    start(cp, "v1")  # rolled back
    batch(cp, 5, {"t": {0: 60, 1: 6}}, {"t": {0: 55, 1: 4}})
    releases = json.loads((cp / "weir.json").read_text())["releases"]
    assert [(r["version"], r["first_batch"]) for r in releases] == [("v1", 0), ("v2", 3), ("v1", 5)]
    found = audit("p", Checkpoint(str(cp))).versions()
    assert found == {"v1": {("t", 0): [(0, 30), (55, 60)], ("t", 1): [(0, 3), (4, 6)]},
                     "v2": {("t", 0): [(30, 55)], ("t", 1): [(3, 4)]}}  # fmt: skip
    assert versions.reset(Checkpoint(str(cp)))  # the reset run's versions stay in its history
    start(cp, "v3")
    batch(cp, 0, {"t": {0: 70, 1: 6}}, {"t": {0: 60, 1: 6}})
    after = audit("p", Checkpoint(str(cp)))
    assert after.versions() == {**found, "v3": {("t", 0): [(60, 70)]}}
    assert after.to_json()["versions"]["v2"] == {"t": {"0": [[30, 55]], "1": [[3, 4]]}}


def test_the_cli_lists_the_ranges_of_each_version(tmp_path, monkeypatch):
    spec = tmp_path / "pipe.py"
    spec.write_text(
        "from weir.pipeline import Pipeline\np = Pipeline('au')\nt = p.topic('t', 'x INT')\n"
        "@p.processor(inputs=[t], outputs=[], version='v1')\ndef copy(df):\n    return df\n"
    )
    monkeypatch.setenv("WEIR_CHECKPOINT_ROOT", str(tmp_path / "cps"))
    cp = tmp_path / "cps" / "au" / "copy"
    start(cp, "v1")
    batch(cp, 0, {"t": {0: 10}}, {"t": {0: 0}})
    start(cp, "v2")
    batch(cp, 1, {"t": {0: 25}}, {"t": {0: 10}})
    result = CliRunner().invoke(app, ["audit", str(spec)])
    assert result.exit_code == 0, result.output
    assert "  version v1: t/0 0-9" in result.output and "  version v2: t/0 10-24" in result.output


def test_the_unknown_note_is_printed_once_naming_the_processors_it_concerns(capsys):
    from weir.checkpoint.audit import UNKNOWN_NOTE, ProcessorAudit
    from weir.cli import audit as audit_cli

    audits = [ProcessorAudit(name, f"/cp/{name}", notes=[UNKNOWN_NOTE]) for name in ("enrich", "totals")]
    audits.append(ProcessorAudit("archive", "/cp/archive", notes=["no checkpoint: the processor has not run"]))
    audit_cli._table("shop", audits)
    text = capsys.readouterr().out
    assert text.count("is `unknown`, not a gap") == 1, text
    assert "note (enrich, totals): where a batch's start" in text and "note: no checkpoint" in text


def test_a_batch_lost_from_the_middle_of_the_log_is_a_silent_gap_named_by_batch(tmp_path):
    """Spark purges its log from the start only: a batch missing between two it holds is not `unknown`."""
    cp = tmp_path / "cp"
    batch(cp, 0, {"t": {0: 10}}, {"t": {0: 0}})
    batch(cp, 1, {"t": {0: 20}}, {"t": {0: 10}})
    batch(cp, 3, {"t": {0: 40}}, {"t": {0: 30}})  # batch 2 planned [20, 30): its files are gone
    result = audit("p", Checkpoint(str(cp)))
    assert segments(result) == [(0, 20, 1), (20, 30, SILENT), (30, 40, 1)] and result.silent_gaps == 1
    assert any("batch(es) 2 are missing from the middle of the offset log" in n for n in result.notes), result.notes
    purged = tmp_path / "purged"  # the same log without its first batches: Spark purged them
    batch(purged, 3, {"t": {0: 40}}, {"t": {0: 30}})
    batch(purged, 4, {"t": {0: 45}}, {"t": {0: 40}})
    assert segments(audit("p", Checkpoint(str(purged)))) == [(30, 45, 1)]


def test_a_run_starting_on_a_checkpoint_with_a_silent_gap_says_so_naming_it(tmp_path):
    from weir.runtime.runner import gaps_warning

    cp = tmp_path / "cp"
    batch(cp, 0, {"t": {0: 10}}, {"t": {0: 0}})
    assert gaps_warning("enrich", Checkpoint(str(cp))) is None
    batch(cp, 1, {"t": {0: 20}}, {"t": {0: 15}})  # 10-14 skipped, counted nowhere
    warning = gaps_warning("enrich", Checkpoint(str(cp)))
    assert warning is not None and "processor enrich" in warning and "5 in 1 silent gap(s): t/0 10-14" in warning
    assert gaps_warning("enrich", Checkpoint(str(tmp_path / "none"))) is None  # no checkpoint yet: nothing skipped
