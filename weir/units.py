"""One grammar for durations and one for instants, used by every option, declaration, record and file of weir.

Durations (`duration_ms`): "90s", "1h30m", "1 hour 30 minutes", Spark's "interval 5 seconds"; instants
(`parse_instant`, `instant_ms`): ISO 8601 dates and datetimes, UTC unless an offset is given; `iso` writes
one back. The grammar: see docs/pipelines.md ("Durations and instants").
Standard library only: the monitor and the command line import this without Spark or pandas.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta

_MS = {
    "ms": 1, "msec": 1, "msecs": 1, "millisecond": 1, "milliseconds": 1,
    "s": 1000, "sec": 1000, "secs": 1000, "second": 1000, "seconds": 1000,
    "m": 60_000, "min": 60_000, "mins": 60_000, "minute": 60_000, "minutes": 60_000,
    "h": 3_600_000, "hr": 3_600_000, "hrs": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
    "d": 86_400_000, "day": 86_400_000, "days": 86_400_000,
    "w": 604_800_000, "week": 604_800_000, "weeks": 604_800_000,
}  # fmt: skip
_TERM = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*")
_SPARK_UNITS = (("day", 86_400_000), ("hour", 3_600_000), ("minute", 60_000), ("second", 1000), ("millisecond", 1))
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
DURATION_EXAMPLES = "500ms, 45s, 30m, 12h, 3d, '5 seconds' or '1 hour 30 minutes'"
INSTANT_EXAMPLES = "2026-11-20, 2026-11-20T14:00 (UTC) or 2026-11-20T16:00+02:00"


class UnitError(ValueError):
    """A duration or an instant cannot be read; the message names what it was for, the value and examples."""


class DurationError(UnitError):
    pass


class InstantError(UnitError):
    pass


# -- durations ---------------------------------------------------------------------------------------------
def duration_ms(
    value: int | float | str | timedelta,
    what: str,
    *,
    bare: str | None = "ms",
    forever: bool = False,
    positive: bool = False,
) -> int:
    """Milliseconds of a duration (the grammar: docs/pipelines.md, durations and instants), rounded to the millisecond.

    `bare`: the unit of a number without one (None: a unit is required); `forever`: -1 is allowed and
    returned as -1; `positive`: 0 is refused. DurationError (a ValueError) names `what` and the value."""
    ms = _duration(value, bare)
    if ms == -1 and forever:
        return -1
    if ms is None or ms < 0:
        hint = "; a number needs a unit" if bare is None and _is_number(value) else ""
        raise DurationError(f"{what}: {value!r} is not a duration such as {DURATION_EXAMPLES}{hint}")
    if positive and ms == 0:
        raise DurationError(f"{what}: the duration {value!r} must be positive")
    return ms


def bare_ms(value: object) -> int | None:
    """The milliseconds a number without a unit (90, "90") stands for when read as milliseconds; None for
    anything else, a negative number included."""
    if not _is_number(value):
        return None
    ms = _duration(value, "ms")
    return ms if ms is not None and ms >= 0 else None


def compact(ms: int) -> str:
    """A duration in its shortest spelling of one unit: "1d", "36h", "90s", "1500ms"."""
    for unit in ("w", "d", "h", "m", "s"):
        if ms and ms % _MS[unit] == 0:
            return f"{ms // _MS[unit]}{unit}"
    return f"{ms}ms"


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) or (isinstance(value, str) and _TERM.fullmatch(value.lower()) is not None)


def _duration(value: object, bare: str | None) -> int | None:
    """Milliseconds, -1 for a bare -1, or None for anything that is not a duration."""
    if isinstance(value, bool):
        return None
    if isinstance(value, timedelta):
        return round(value / timedelta(milliseconds=1))
    if isinstance(value, int | float):
        if value == -1:
            return -1
        return round(value * _MS[bare]) if bare is not None and value >= 0 else None
    if not isinstance(value, str):
        return None
    text = value.strip().lower()
    if text == "-1":
        return -1
    text = text.removeprefix("interval").strip()
    total, pos, terms = 0.0, 0, 0
    while pos < len(text):
        m = _TERM.match(text, pos)
        if not m or m.end() == pos:
            return None
        unit = m.group(2)
        if unit == "" and (bare is None or pos > 0 or m.end() < len(text)):
            return None  # a bare number must be the whole value
        scale = _MS.get(unit or bare or "")
        if scale is None:
            return None
        total += float(m.group(1)) * scale
        pos, terms = m.end(), terms + 1
    return round(total) if terms else None


def spark_interval(ms: int) -> str:
    """A duration as Spark's interval strings read it (triggers, watermark delays): "5 seconds", "1500 milliseconds"."""
    if ms < 0:
        raise DurationError(f"{ms} ms is negative: not a Spark interval")
    for unit, size in _SPARK_UNITS:
        if ms % size == 0 and (ms or size == 1):
            n = ms // size
            return f"{n} {unit}" if n == 1 else f"{n} {unit}s"
    raise AssertionError("unreachable: every whole number of milliseconds has a unit")


def duration_text(d: timedelta) -> str:
    """A duration as weir writes it back (Spark's interval words, "10 minutes"), which reads in again as itself."""
    return spark_interval(round(d / timedelta(milliseconds=1)))


def spark_trigger(value: int | float | str | timedelta, what: str = "trigger") -> str:
    """Spark's processingTime string of a trigger interval: "5s", "5 seconds" and 5 (a bare number is in
    seconds, as the monitor reads triggers) all give "5 seconds"."""
    return spark_interval(duration_ms(value, what, bare="s"))


# -- instants ----------------------------------------------------------------------------------------------
def parse_instant(value: str | int | float | datetime | date, what: str = "time") -> datetime:
    """An aware UTC datetime from ISO 8601 text, a datetime (naive: UTC), a date (midnight UTC) or epoch ms."""
    if isinstance(value, datetime):
        t = value
    elif isinstance(value, date):
        t = datetime(value.year, value.month, value.day)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        return _EPOCH + timedelta(milliseconds=value)
    elif isinstance(value, str):
        raw = value.strip()
        try:
            t = datetime.fromisoformat(raw[:-1] + "+00:00" if raw[-1:] in ("z", "Z") else raw)
        except ValueError:
            raise InstantError(
                f"{what} {value!r} is not an ISO 8601 date or datetime: use e.g. {INSTANT_EXAMPLES}"
            ) from None
    else:
        raise InstantError(f"{what} {value!r} is {type(value).__name__}, not an ISO 8601 date or datetime")
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def instant_ms(value: str | int | float | datetime | date, what: str = "time") -> int:
    """Epoch milliseconds (rounded down) of an instant (see `parse_instant`)."""
    return (parse_instant(value, what) - _EPOCH) // timedelta(milliseconds=1)


def iso(t: int | float | datetime, timespec: str | None = None) -> str:
    """UTC ISO 8601 with `Z`: `2026-11-20T14:00:01.234Z` for epoch ms (millisecond precision), and for a
    datetime as precise as it is (`2026-11-20T14:00:00Z`, `...00.000005Z`); `timespec` as datetime.isoformat."""
    if isinstance(t, datetime):
        dt, spec = t if t.tzinfo else t.replace(tzinfo=UTC), timespec or "auto"
    else:
        dt, spec = datetime.fromtimestamp(t / 1000, UTC), timespec or "milliseconds"
    return dt.astimezone(UTC).isoformat(timespec=spec).removesuffix("+00:00") + "Z"


def now_iso() -> str:
    """The current time, `2026-11-20T14:00:01.234Z`."""
    return iso(datetime.now(UTC), "milliseconds")
