import pytest

from weir.kafka.options import OptionError, parse_offsets, parse_sink, parse_source

BASE = {"kafka.bootstrap.servers": "h:9092", "subscribe": "a, b"}


def test_names_are_case_insensitive():
    opts = parse_source({**BASE, "MAXOFFSETSPERTRIGGER": "10", "minPartitions": "3"}, streaming=True)
    assert opts.max_offsets == 10 and opts.min_partitions == 3
    assert opts.topics == ("a", "b")


def test_unknown_option_lists_the_valid_ones():
    with pytest.raises(OptionError) as exc:
        parse_source({**BASE, "maxOffsetPerTrigger": "10"}, streaming=True)
    assert "maxoffsetpertrigger" in str(exc.value)
    assert "maxoffsetspertrigger" in str(exc.value) and "startingoffsets" in str(exc.value)


def test_kafka_settings_pass_through_and_managed_ones_are_refused():
    opts = parse_source({**BASE, "kafka.security.protocol": "SASL_SSL", "kafka.sasl.password": "s3"}, streaming=True)
    assert opts.consumer_settings()["security.protocol"] == "SASL_SSL"
    assert opts.describe()["sasl.password"] == "***"
    with pytest.raises(OptionError, match=r"group\.id"):
        parse_source({**BASE, "kafka.group.id": "g"}, streaming=True)


def test_subscribe_and_pattern_are_exclusive_and_required():
    with pytest.raises(OptionError, match="exactly one"):
        parse_source({"kafka.bootstrap.servers": "h"}, streaming=True)
    with pytest.raises(OptionError, match="exactly one"):
        parse_source({**BASE, "subscribePattern": "a.*"}, streaming=True)
    opts = parse_source({"kafka.bootstrap.servers": "h", "subscribePattern": "ord.*"}, streaming=True)
    assert opts.matches("orders") and not opts.matches("xorders")


def test_bootstrap_is_required():
    with pytest.raises(OptionError, match=r"kafka\.bootstrap\.servers"):
        parse_source({"subscribe": "a"}, streaming=True)


def test_offsets_forms():
    assert parse_offsets("x", None, "latest") == "latest"
    assert parse_offsets("x", "EARLIEST", "latest") == "earliest"
    assert parse_offsets("x", '{"t": {"0": 5, "1": -2}}', "latest") == {"t": {0: 5, 1: -2}}
    with pytest.raises(OptionError, match="JSON"):
        parse_offsets("x", "{nope", "latest")
    with pytest.raises(OptionError, match="invalid"):
        parse_offsets("x", '{"t": {"0": -7}}', "latest")


def test_batch_only_and_stream_only_rules():
    with pytest.raises(OptionError, match="batch reads"):
        parse_source({**BASE, "endingOffsets": "latest"}, streaming=True)
    with pytest.raises(OptionError, match="not allowed for batch"):
        parse_source({**BASE, "startingOffsets": "latest"}, streaming=False)
    assert parse_source(BASE, streaming=False).starting == "earliest"
    assert parse_source(BASE, streaming=True).starting == "latest"


def test_stream_ending_offsets_are_exact_offsets():
    opts = parse_source({**BASE, "endingOffsets": '{"a": {"0": 120, "1": 80}}'}, streaming=True)
    assert opts.ending == {"a": {0: 120, 1: 80}}
    assert parse_source(BASE, streaming=True).ending == "latest"  # not given: no end
    for moving in ("latest", "earliest", "LATEST"):
        with pytest.raises(OptionError, match=r"endingOffsets must be exact.*earliest and latest are for batch"):
            parse_source({**BASE, "endingOffsets": moving}, streaming=True)
    for special in ("-1", "-2"):
        with pytest.raises(OptionError, match=rf"endingOffsets must be exact offsets.*\(a/1: {special}\)"):
            parse_source({**BASE, "endingOffsets": f'{{"a": {{"0": 5, "1": {special}}}}}'}, streaming=True)
    # Batch reads keep their forms
    assert parse_source({**BASE, "endingOffsets": "latest"}, streaming=False).ending == "latest"
    assert parse_source({**BASE, "endingOffsets": '{"a": {"0": -1}}'}, streaming=False).ending == {"a": {0: -1}}


def test_lake_until(tmp_path):
    lake = {"lake": str(tmp_path), "startingOffsets": '{"a": {"0": 10, "1": 0}}'}
    opts = parse_source({**BASE, **lake, "lakeUntil": '{"a": {"0": 60}}'}, streaming=True)
    assert opts.lake_until == {"a": {0: 60}}
    assert parse_source({**BASE, **lake}, streaming=True).lake_until == {}
    assert parse_source({**BASE, **lake, "LAKEUNTIL": '{"a": {"1": 7}}'}, streaming=False).lake_until == {"a": {1: 7}}
    with pytest.raises(OptionError, match=r"lakeUntil needs the option lake"):
        parse_source({**BASE, "lakeUntil": '{"a": {"0": 60}}'}, streaming=True)
    with pytest.raises(OptionError, match=r"lakeUntil must be exact offsets"):
        parse_source({**BASE, **lake, "lakeUntil": "latest"}, streaming=True)
    with pytest.raises(OptionError, match=r"lakeUntil must be exact offsets.*a/0: -1"):
        parse_source({**BASE, **lake, "lakeUntil": '{"a": {"0": -1}}'}, streaming=True)
    with pytest.raises(OptionError, match="JSON"):
        parse_source({**BASE, **lake, "lakeUntil": "{nope"}, streaming=True)


def test_lake_until_needs_exact_starting_offsets_where_it_applies(tmp_path):
    """`earliest` would resolve to the earliest offset lakeUntil raised, and leave the offsets below unread."""
    until = {"lake": str(tmp_path), "lakeUntil": '{"a": {"0": 60}}'}
    with pytest.raises(OptionError, match=r"lakeUntil names a/0, where startingOffsets is earliest"):
        parse_source({**BASE, **until, "startingOffsets": "earliest"}, streaming=True)
    with pytest.raises(OptionError, match=r"a/0, where startingOffsets is earliest"):
        parse_source({**BASE, **until}, streaming=False)  # a batch read's default
    for start in ('{"a": {"0": -2}}', '{"a": {"1": 5}}'):  # -2, or not named: earliest
        with pytest.raises(OptionError, match=r"a/0, where startingOffsets is earliest"):
            parse_source({**BASE, **until, "startingOffsets": start}, streaming=True)
    assert parse_source({**BASE, **until}, streaming=True).lake_until == {"a": {0: 60}}  # a stream's latest
    opts = parse_source({**BASE, **until, "startingOffsets": '{"a": {"0": 0, "1": -2}}'}, streaming=True)
    assert opts.starting == {"a": {0: 0, 1: -2}}  # partition 1 reads the broker from its earliest


def test_numbers_and_booleans_are_checked():
    with pytest.raises(OptionError, match="positive integer"):
        parse_source({**BASE, "maxOffsetsPerTrigger": "0"}, streaming=True)
    with pytest.raises(OptionError, match="true or false"):
        parse_source({**BASE, "failOnDataLoss": "nope"}, streaming=True)
    assert parse_source({**BASE, "failOnDataLoss": "FALSE"}, streaming=True).fail_on_data_loss is False


def test_json_format_needs_a_schema():
    with pytest.raises(OptionError, match="valueSchema"):
        parse_source({**BASE, "valueFormat": "json"}, streaming=True)
    with pytest.raises(OptionError, match="valueFormat=json"):
        parse_source({**BASE, "valueSchema": "a INT"}, streaming=True)


def test_sink_options():
    opts = parse_sink({"kafka.bootstrap.servers": "h", "topic": "out", "checkpointLocation": "/c"})
    settings = opts.producer_settings()
    assert settings["enable.idempotence"] is True and settings["acks"] == "all"
    with pytest.raises(OptionError, match="unknown weir-kafka sink option"):
        parse_sink({"kafka.bootstrap.servers": "h", "subscribe": "x"})
