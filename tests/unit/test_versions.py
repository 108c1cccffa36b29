"""A stateful processor's restart against its checkpoint's version record (weir.runtime.versions), without Spark:
a refusal names what changed, field by field, and the block setting, not the same version twice."""

from __future__ import annotations

import pytest

from weir.checkpoint.files import Checkpoint
from weir.pipeline.model import Processor
from weir.runtime import versions

BLOCK = {"block": "tumbling_window", "key": "device", "size": "1 minute", "watermark": "10 seconds"}


def counts(version: str = "src-bc9a09054e0c") -> Processor:
    return Processor("counts", fn=lambda df: df, inputs=("readings",), outputs=("counts",), version=version,
                     checkpoint="iot/counts", stateful=True)  # fmt: skip


def test_a_refusal_names_the_field_the_input_schema_and_the_block_setting_that_changed(tmp_path):
    cp = Checkpoint(str(tmp_path / "counts"))
    versions.check(counts(), cp, "struct<device:string,n:bigint>", {"readings": "device STRING, celsius DOUBLE"},
                   [BLOCK])  # fmt: skip
    with pytest.raises(versions.IncompatibleChange) as refused:
        versions.check(
            counts(), cp, "struct<device:string,n:bigint,humidity:double>",
            {"readings": "device STRING, celsius DOUBLE, humidity DOUBLE"}, [BLOCK | {"size": "5 minutes"}],
        )  # fmt: skip
    message = str(refused.value)
    assert "its result gained field humidity (double)" in message
    assert "input readings: its declared schema gained field humidity (DOUBLE)" in message
    assert "tumbling_window's size changed from 1 minute to 5 minutes" in message
    assert "the code is unchanged (src-bc9a09054e0c)" in message and message.count("src-bc9a09054e0c") == 1
    assert "weir run --reset counts" in message


def test_graph_only_looks_and_an_older_record_is_still_compared(tmp_path):
    cp = Checkpoint(str(tmp_path / "counts"))
    versions.write(cp, versions.VersionRecord("counts", "src-1", True, ["readings"], "struct<a:int,b:map<string,int>>"))
    with pytest.raises(versions.IncompatibleChange, match=r"its result's field a changed from int to bigint; the "
                       r"code changed \(src-1 -> src-2\)"):  # fmt: skip
        versions.check(counts("src-2"), cp, "struct<a:bigint,b:map<string,int>>", record=False)
    assert versions.read(cp).result_schema == "struct<a:int,b:map<string,int>>"
    assert versions.check(counts("src-2"), cp, "struct<a:int,b:map<string,int>>", record=False) == (
        "processor counts: code version src-1 -> src-2"
    )
    assert versions.read(cp).version == "src-1"  # record=False wrote nothing


def test_shapes_compare_per_output_topic_and_schemas_field_by_field():
    after = '{"a": "struct<x:int,y:string>", "b": "struct<z:int>"}'
    assert versions.shape_changes('{"a": "struct<x:int>"}', after) == [
        "its result for a gained field y (string)", "its result for b appeared",
    ]  # fmt: skip
    assert versions.schema_changes("id STRING NOT NULL, at STRUCT<d: INT, e: INT>", "id STRING NOT NULL") == [
        "its declared schema lost field at (STRUCT<d: INT, e: INT>)"
    ]
    assert versions.block_changes([BLOCK], [BLOCK]) == []
    assert versions.block_changes([BLOCK], []) == ["its blocks changed from ['tumbling_window'] to []"]


def test_a_nullable_field_gained_resumes_and_says_so_a_state_setting_changed_refuses(tmp_path):
    cp = Checkpoint(str(tmp_path / "counts"))
    schemas = {"readings": "device STRING, celsius DOUBLE"}
    versions.check(counts(), cp, "struct<device:string,celsius:double>", schemas, [BLOCK], required={"": ["device"]})
    evolved = {"readings": "device STRING, celsius DOUBLE, humidity DOUBLE"}
    note = versions.check(counts(), cp, "struct<device:string,celsius:double,humidity:double>", evolved,
                          [BLOCK | {"watermark": "1 minute"}], required={"": ["device"]})  # fmt: skip
    assert note == (
        "processor counts: resumes from its state across its result gained field humidity (double), nullable; "
        "tumbling_window's watermark changed from 10 seconds to 1 minute; input readings: its declared schema "
        "gained field humidity (DOUBLE)"
    )
    assert versions.read(cp).result_schema.endswith("humidity:double>")  # the next start compares with this one
    assert versions.check(counts(), cp, "struct<device:string,celsius:double,humidity:double>", evolved,
                          [BLOCK | {"watermark": "1 minute"}], required={"": ["device"]}) is None  # fmt: skip
    for result, blocks, required, said in [
        ("struct<device:string,celsius:double,humidity:double,n:bigint>", [BLOCK | {"watermark": "1 minute"}],
         {"": ["device", "n"]}, "its result gained field n (bigint), which is not nullable: declare it nullable"),
        ("struct<device:string,celsius:double,humidity:double>", [BLOCK | {"watermark": "1 minute", "key": "room"}],
         {}, "tumbling_window's key changed from device to room"),
        ("struct<device:string,celsius:double>", [BLOCK | {"watermark": "1 minute"}], {},
         "its result lost field humidity (double)"),
        ("struct<device:string,celsius:float,humidity:double>", [BLOCK | {"watermark": "1 minute"}], {},
         "its result's field celsius changed from double to float"),
    ]:  # fmt: skip
        with pytest.raises(versions.IncompatibleChange) as refused:
            versions.check(counts(), cp, result, evolved, blocks, required=required)
        assert said in str(refused.value) and "weir run --reset counts" in str(refused.value)


def test_a_result_change_is_refused_when_sparks_own_operator_keeps_its_rows(tmp_path):
    stored = versions.VersionRecord("counts", "v", True, ["readings"], "struct<device:string,n:bigint>")
    gained = versions.VersionRecord("counts", "v", True, ["readings"], "struct<device:string,n:bigint,m:bigint>")
    assert versions.decide(stored, gained, ["transformWithStateInPandasExec"]).evolved == [
        "its result gained field m (bigint), nullable"
    ]
    refused = versions.decide(stored, gained, ["stateStoreSave", "stateStoreRestore"]).refused
    assert refused == [
        "its result gained field m (bigint), and Spark's own stateStoreRestore, stateStoreSave keeps rows of the "
        "result in its state"
    ]


def test_the_operators_of_a_checkpoints_state_are_read_from_sparks_metadata(tmp_path):
    cp = tmp_path / "cp"
    assert Checkpoint(str(cp)).state_operators() == []
    v1 = cp / "state" / "0" / "_metadata"
    v1.mkdir(parents=True)
    (v1 / "metadata").write_text('v1\n{"operatorInfo":{"operatorId":0,"operatorName":"dedupe"},"stateStoreInfo":[]}')
    v2 = cp / "state" / "1" / "_metadata" / "v2"
    v2.mkdir(parents=True)
    for batch, name in [(0, "old"), (4, "transformWithStateInPandasExec")]:
        (v2 / str(batch)).write_text(f'v2\n{{"operatorInfo":{{"operatorId":1,"operatorName":"{name}"}}}}')
    (v2 / ".4.crc").write_text("crc")
    assert Checkpoint(str(cp)).state_operators() == ["dedupe", "transformWithStateInPandasExec"]
    assert Checkpoint(str(cp)).operators() == {0: "dedupe", 1: "transformWithStateInPandasExec"}


def test_changed_stateful_declarations_resume_only_with_a_migration():
    block = {"block": "stateful", "name": "rule", "key": "customer", "ttl_ms": "None", "state": "last:list<double>"}
    stored = versions.VersionRecord("rule", "v", True, ["orders"], "struct<customer:string>", blocks=[block])
    changed = block | {"state": "amounts:list<double>,n:value<bigint>"}
    current = versions.VersionRecord("rule", "v", True, ["orders"], "struct<customer:string>", blocks=[changed])
    assert versions.decide(stored, current).refused == [
        "stateful's state changed from last:list<double> to amounts:list<double>,n:value<bigint> (a migration of "
        "one's own, @rule.migrate, would resume from it)"
    ]
    current.blocks = [changed | {"migrate": "from_v1"}]
    decision = versions.decide(stored, current)
    assert decision.refused == [] and decision.evolved == [
        "stateful's state changed from last:list<double> to amounts:list<double>,n:value<bigint>, migrated by "
        "from_v1", "stateful's migrate changed from None to from_v1",
    ]  # fmt: skip
    current.blocks = [changed | {"migrate": "from_v1", "ttl_ms": "60000"}]
    assert versions.decide(stored, current).refused == ["stateful's ttl_ms changed from None to 60000"]


def test_a_note_says_which_state_record_it_is(tmp_path) -> None:
    cp = Checkpoint(str(tmp_path / "cp"))
    versions.check(counts(), cp, "struct<device:string,celsius:double>", required={"": ["device"]}, blocks=[BLOCK])
    grown = versions.check(counts(), cp, "struct<device:string,celsius:double,humidity:double>", blocks=[BLOCK],
                           required={"": ["device"]})  # fmt: skip
    assert grown is not None and grown.kind == "state_evolved"
    changed = versions.check(counts("src-2"), cp, "struct<device:string,celsius:double,humidity:double>",
                             blocks=[BLOCK], required={"": ["device"]})  # fmt: skip
    assert changed is not None and changed.kind == "code_changed" and ": code version " in changed
