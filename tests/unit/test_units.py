"""weir.units: the one grammar of durations and the one of instants, and their errors."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from weir.units import (
    DurationError,
    InstantError,
    duration_ms,
    instant_ms,
    iso,
    now_iso,
    parse_instant,
    spark_interval,
    spark_trigger,
)

S, M, H, D = 1000, 60_000, 3_600_000, 86_400_000


# -- durations ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "ms"),
    [
        ("500ms", 500), ("45s", 45 * S), ("30m", 30 * M), ("12h", 12 * H), ("3d", 3 * D), ("2w", 14 * D),
        ("1 second", S), ("5 seconds", 5 * S), ("10 minutes", 10 * M), ("2 hours", 2 * H), ("1 day", D),
        ("1 week", 7 * D), ("250 ms", 250), ("3 milliseconds", 3), ("90 sec", 90 * S), ("5 mins", 5 * M),
        ("2 hrs", 2 * H), ("1 hour 30 minutes", 90 * M), ("1h30m", 90 * M), ("1.5h", 90 * M), ("0.5s", 500),
        ("interval 5 seconds", 5 * S), ("INTERVAL 2 Minutes", 2 * M), ("  72h ", 72 * H), ("0s", 0),
        (timedelta(minutes=2), 2 * M), (timedelta(microseconds=1500), 2),
    ],
)  # fmt: skip
def test_every_form_of_duration(value, ms):
    assert duration_ms(value, "x") == ms


def test_a_bare_number_is_in_the_callers_unit_or_refused():
    assert duration_ms(259_200_000, "retention") == 3 * D
    assert duration_ms("1500", "retention") == 1500
    assert duration_ms(90, "threshold", bare="s") == 90 * S
    assert duration_ms("1.5", "threshold", bare="s") == 1500
    assert duration_ms(0.25, "threshold", bare="s") == 250
    with pytest.raises(DurationError, match="a number needs a unit"):
        duration_ms("90", "window", bare=None)
    with pytest.raises(DurationError, match="not a duration"):
        duration_ms("5 10s", "x")  # a bare number only on its own


def test_minus_one_is_forever_only_where_allowed():
    assert duration_ms(-1, "retention", forever=True) == -1
    assert duration_ms("-1", "retention", forever=True) == -1
    with pytest.raises(DurationError):
        duration_ms(-1, "x")
    with pytest.raises(DurationError):
        duration_ms(-5, "retention", forever=True)


@pytest.mark.parametrize("bad", ["three days", "2 fortnights", "", "  ", "s", "1 2", "-3s", "5 s s", True, None, [1]])
def test_bad_durations_name_what_the_value_and_examples(bad):
    with pytest.raises(DurationError) as info:
        duration_ms(bad, "topic t retention")
    text = str(info.value)
    assert text.startswith(f"topic t retention: {bad!r} is not a duration such as 500ms, 45s")
    assert isinstance(info.value, ValueError)


def test_positive_refuses_zero():
    assert duration_ms("1ms", "size", positive=True) == 1
    with pytest.raises(DurationError, match="size: the duration '0 seconds' must be positive"):
        duration_ms("0 seconds", "size", positive=True)


@pytest.mark.parametrize(
    ("ms", "text"),
    [(0, "0 milliseconds"), (1, "1 millisecond"), (1500, "1500 milliseconds"), (S, "1 second"),
     (5 * S, "5 seconds"), (M, "1 minute"), (90 * M, "90 minutes"), (2 * H, "2 hours"), (D, "1 day"),
     (7 * D, "7 days")],
)  # fmt: skip
def test_spark_intervals(ms, text):
    assert spark_interval(ms) == text
    assert duration_ms(text, "x") == ms  # Spark's strings are in the grammar


def test_spark_triggers_read_a_bare_number_as_seconds():
    assert spark_trigger("1 second") == "1 second"
    assert spark_trigger("5s") == "5 seconds"
    assert spark_trigger(5) == "5 seconds"
    assert spark_trigger("interval 500 milliseconds") == "500 milliseconds"
    with pytest.raises(DurationError, match="enrich: trigger: 'soon' is not a duration"):
        spark_trigger("soon", "enrich: trigger")
    with pytest.raises(DurationError):
        spark_interval(-1)


# -- instants -------------------------------------------------------------------------------------------------
def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-11-20", utc(2026, 11, 20)),
        ("2026-11-20T14:30", utc(2026, 11, 20, 14, 30)),
        ("2026-11-20 14:30:05", utc(2026, 11, 20, 14, 30, 5)),
        ("2026-11-20T14:30:05Z", utc(2026, 11, 20, 14, 30, 5)),
        ("2026-11-20T14:30:05.250z", utc(2026, 11, 20, 14, 30, 5, 250_000)),
        ("2026-11-20T16:30+02:00", utc(2026, 11, 20, 14, 30)),
        ("2026-11-20T09:30:00-05:00", utc(2026, 11, 20, 14, 30)),
        ("2026-11-21T10:00:01.234+00:00", utc(2026, 11, 21, 10, 0, 1, 234_000)),
        ("  2026-11-20T14:00  ", utc(2026, 11, 20, 14)),
        (date(2026, 1, 2), utc(2026, 1, 2)),
        (datetime(2026, 1, 2, 3), utc(2026, 1, 2, 3)),
        (datetime(2026, 1, 2, 5, tzinfo=UTC) + timedelta(hours=-2), utc(2026, 1, 2, 3)),
        (1_700_000_000_123, utc(2023, 11, 14, 22, 13, 20, 123_000)),
        (0, utc(1970, 1, 1)),
    ],
)
def test_every_form_of_instant_is_utc(value, expected):
    assert parse_instant(value) == expected
    assert parse_instant(value).tzinfo == UTC
    assert instant_ms(value) == (expected - utc(1970, 1, 1)) // timedelta(milliseconds=1)


@pytest.mark.parametrize("bad", ["yesterday", "2026-13-01", "20/11/2026", "", "2026-11-20T25:00", "1700000000"])
def test_bad_instants_name_what_the_value_and_examples(bad):
    with pytest.raises(InstantError, match=r"--from .* is not an ISO 8601 date or datetime: use e\.g\. 2026-11-20"):
        parse_instant(bad, "--from")
    with pytest.raises(ValueError):
        instant_ms(bad, "--from")
    with pytest.raises(InstantError, match="not an ISO 8601"):
        parse_instant(None, "at")  # type: ignore[arg-type]


def test_iso_is_utc_with_z():
    assert iso(utc(2026, 11, 20, 14)) == "2026-11-20T14:00:00Z"
    assert iso(utc(2026, 11, 20, 14, 0, 0, 5)) == "2026-11-20T14:00:00.000005Z"
    assert iso(datetime(2026, 11, 20, 16, tzinfo=UTC) - timedelta(hours=2)) == "2026-11-20T14:00:00Z"
    assert iso(1_700_000_000_123) == "2023-11-14T22:13:20.123Z"
    assert iso(0) == "1970-01-01T00:00:00.000Z"
    assert iso(utc(2026, 11, 20, 14), "minutes") == "2026-11-20T14:00Z"
    assert instant_ms(iso(1_700_000_000_123)) == 1_700_000_000_123
    assert now_iso().endswith("Z") and len(now_iso()) == len("2026-11-20T14:00:00.000Z")


# -- the callers' own errors ----------------------------------------------------------------------------------
def test_callers_raise_their_own_error_types():
    from weir.backfill import BackfillError, parse_time
    from weir.monitor.config import parse_duration
    from weir.monitor.records import BadRecord, time_ms
    from weir.pipeline.model import DeclarationError, Pipeline

    p = Pipeline("p")
    assert p.topic("t", "x INT", retention="3 days").retention_ms == 3 * D
    assert p.topic("forever", "x INT", retention=-1).retention_ms == -1
    with pytest.raises(DeclarationError, match="topic u retention: 'three days' is not a duration"):
        p.topic("u", "x INT", retention="three days")
    p.processor(inputs=["t"], trigger="5s")(lambda t: t)
    with pytest.raises(DeclarationError, match="processor f trigger: 'often' is not a duration"):
        p.processor(inputs=["t"], name="f", trigger="often")(lambda t: t)
    with pytest.raises(BackfillError, match="--to 'soon' is not an ISO 8601"):
        parse_time("soon", "--to")
    assert parse_duration("interval 2 minutes") == 120.0
    assert time_ms("2026-11-21T10:00:01.234", "at") == time_ms("2026-11-21T10:00:01.234Z", "at")
    with pytest.raises(BadRecord, match="not an ISO time"):
        time_ms("yesterday", "at")
