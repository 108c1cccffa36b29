"""One checkpoint, two readers (kafka/handover.py, checkpoint/log.py, runtime/reading.py) on hand-made checkpoint
directories: weir-kafka's offsets handed to Spark's connector are positions only, their weir-kafka form is what
the readers and `weir audit` read; the connector's batches start where the batch before ended (batch 0 at its
logged initial offset) and carry weir-kafka's counts; handed back, weir-kafka's counts go on where they were."""

from __future__ import annotations

import json

from weir.checkpoint.audit import LOSS, audit
from weir.checkpoint.files import Checkpoint
from weir.checkpoint.log import initial_offsets, planned_span, read_log, read_offsets
from weir.kafka import handover
from weir.runtime.reading import behind_log_start, fixed_reason

META = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}})


def batch(cp, n: int, line: dict, committed: bool = True) -> None:
    (cp / "offsets").mkdir(parents=True, exist_ok=True)
    (cp / "commits").mkdir(exist_ok=True)
    (cp / "offsets" / str(n)).write_text(f"v1\n{META}\n{json.dumps(line)}")
    (cp / "offsets" / f".{n}.crc").write_bytes(b"stale")
    if committed:
        (cp / "commits" / str(n)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def logged(cp, n: int) -> dict:
    return json.loads((cp / "offsets" / str(n)).read_text().split("\n")[2])


def weir_kafka_log(cp) -> None:
    batch(cp, 0, {"t": {"0": 10}, "@start": {"t": {"0": 0}}})
    loss = {"skippedOffsets": 5, "events": 1}
    batch(cp, 1, {"t": {"0": 20}, "@start": {"t": {"0": 15}}, "@dataLoss": loss})
    batch(cp, 2, {"t": {"0": 30}, "@start": {"t": {"0": 20}}, "@dataLoss": loss}, committed=False)


def on_the_connector(tmp_path):
    """weir-kafka's log, its last batch committed, handed to the connector, which then logs batch 3."""
    cp = tmp_path / "cp"
    weir_kafka_log(cp)
    (cp / "commits" / "2").write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    handover.to_connector(Checkpoint(str(cp)))
    batch(cp, 3, {"t": {"0": 42}})
    return cp


def test_handed_to_the_connector_the_last_batches_are_positions_only_and_their_plans_are_kept(tmp_path):
    cp = tmp_path / "cp"
    weir_kafka_log(cp)
    before = read_log(Checkpoint(str(cp)))
    assert handover.to_connector(Checkpoint(str(cp))) == [1, 2]
    assert logged(cp, 1) == {"t": {"0": 20}} and logged(cp, 2) == {"t": {"0": 30}}
    assert "@start" in logged(cp, 0)  # Spark reads the last two only: older ones stay as they were
    assert not (cp / "offsets" / ".1.crc").exists() and (cp / "offsets" / ".0.crc").exists()
    assert (cp / "offsets" / "1").read_text().startswith(f"v1\n{META}\n")
    assert read_log(Checkpoint(str(cp))).batches == before.batches  # the readers read weir-kafka's plans
    assert planned_span(Checkpoint(str(cp)), 2, "t") == {0: (20, 30)}
    assert handover.to_connector(Checkpoint(str(cp))) == []  # once only


def test_the_connectors_batches_start_where_the_batch_before_ended_and_carry_the_counts(tmp_path):
    cp = on_the_connector(tmp_path)
    log = read_log(Checkpoint(str(cp)))
    line = log.batches[-1].sources[0]
    assert line.start == {"t": {0: 30}} and line.loss.skipped_offsets == 5
    assert planned_span(Checkpoint(str(cp)), 3, "t") == {0: (30, 42)}
    assert read_offsets(Checkpoint(str(cp))).data_loss.skipped_offsets == 5
    result = audit("p", Checkpoint(str(cp)))
    assert result.silent_gaps == 0 and result.offsets(LOSS) == 5


def test_handed_back_to_weir_kafka_its_counts_go_on_where_they_were(tmp_path):
    cp = on_the_connector(tmp_path)
    batch(cp, 4, {"t": {"0": 50}}, committed=False)
    assert handover.to_weir_kafka(Checkpoint(str(cp))) == [3, 4]
    assert logged(cp, 4) == {"t": {"0": 50}, "@dataLoss": {"skippedOffsets": 5, "events": 1}}
    assert handover.to_weir_kafka(Checkpoint(str(cp))) == []


def test_batch_0_of_the_connector_starts_at_its_logged_initial_offset(tmp_path):
    cp = tmp_path / "cp"
    batch(cp, 0, {"t": {"0": 7, "1": 9}})
    (cp / "sources" / "0").mkdir(parents=True)
    (cp / "sources" / "0" / "0").write_bytes(b'\x00v1\n{"t":{"0":3,"1":0}}')
    assert initial_offsets(Checkpoint(str(cp)), 0) == {"t": {0: 3, 1: 0}}
    assert planned_span(Checkpoint(str(cp)), 0, "t") == {0: (3, 7), 1: (0, 9)}
    assert read_log(Checkpoint(str(cp))).batches[0].sources[0].start == {"t": {0: 3, 1: 0}}


def test_weir_kafka_reads_where_only_it_can_and_says_why():
    assert fixed_reason(setting="connector", archive=False, bounded=False, shadow=False) is None
    assert "archiver" in fixed_reason(setting="connector", archive=True, bounded=False, shadow=False)
    assert "shadow" in fixed_reason(setting="connector", archive=False, bounded=False, shadow=True)
    assert "settings" in fixed_reason(setting="weir-kafka", archive=False, bounded=True, shadow=False)
    by_partition = fixed_reason(setting="connector", archive=False, bounded=False, shadow=False, by_partition=True)
    assert "commits by Spark partition" in by_partition
    behind = behind_log_start({"t": {0: 5, 1: 40}}, {("t", 0): (10, 50), ("t", 1): (10, 50), ("u", 0): (0, 1)})
    assert behind == ["t/0 [5, 10)"]
