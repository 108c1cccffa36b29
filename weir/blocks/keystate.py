"""The keyed state of a `@stateful` function (weir.blocks.keyed), without Spark: declarations, the handle a
user function gets per key, its timers, and a bucket of keys as it is stored.

A bucket holds every key hashed to it as one JSON document (`Bucket.dumps`): per key its state variables, its
pending timers (epoch ms) and when its state was last written (the clock of the processor: the watermark for
an event-time one, the wall clock otherwise), from which a time to live expires it. JSON, not pickle: a
checkpoint is data that `weir state` prints and that must never run code when read. Semantics: docs/blocks.md
("Keyed state of one's own").
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from weir.blocks import ordering

if TYPE_CHECKING:
    import numpy as np

FORMAT = 1  # of the stored bucket; another one is refused, naming both
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
KINDS = ("bigint", "double", "string", "boolean", "timestamp", "json")


class StateError(TypeError):
    """A state variable was given a value of another type, or asked for what it is not; names both."""


def _micros(t: datetime) -> int:
    t = t if t.tzinfo is not None else t.replace(tzinfo=UTC)  # naive: UTC, as Spark's session time zone here
    return (t - _EPOCH) // timedelta(microseconds=1)


def instant(us: int) -> datetime:
    """An epoch-µs instant as an aware UTC datetime."""
    return _EPOCH + timedelta(microseconds=int(us))


def _encode(kind: str, v: Any, what: str) -> Any:
    """A Python value of `kind` as it is stored (JSON), or StateError naming `what`."""
    if v is None:
        return None
    ok = {
        "bigint": isinstance(v, int) and not isinstance(v, bool),
        "double": isinstance(v, (int, float)) and not isinstance(v, bool),
        "string": isinstance(v, str),
        "boolean": isinstance(v, bool),
        "timestamp": isinstance(v, datetime),
        "json": True,
    }[kind]
    if not ok:
        raise StateError(f"{what} is {kind}: cannot hold {type(v).__name__} {v!r}")
    if kind == "timestamp":
        return _micros(v)
    if kind == "double":
        return float(v)
    if kind == "json":
        try:
            return json.loads(json.dumps(v, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise StateError(f"{what} is json: cannot hold {type(v).__name__} {v!r}: {exc}") from None
    return v


def _decode(kind: str, v: Any) -> Any:
    if v is None:
        return None
    if kind == "timestamp":
        return instant(v)
    if kind == "double" and isinstance(v, str):  # NaN and infinities are stored as text (JSON has none)
        return float(v)
    return v


def _stored_double(v: Any) -> Any:
    return str(v) if isinstance(v, float) and not math.isfinite(v) else v


@dataclass(frozen=True)
class Value:
    """One value per key: `state.<name>.value` (None until set), `.set(v)`, `.clear()`."""

    kind: str

    def describe(self) -> str:
        return f"value<{self.kind}>"


@dataclass(frozen=True)
class ListOf:
    """A list per key, oldest first: `.append(v)`, `.items()`, `len()`, `.clear()`; `keep`: at most this many,
    the oldest dropped first (a bounded history: a customer's last 10 payments)."""

    kind: str
    keep: int | None = None

    def describe(self) -> str:
        return f"list<{self.kind}>" + (f" keep={self.keep}" if self.keep else "")


@dataclass(frozen=True)
class MapOf:
    """A map per key: `.get(k, default)`, `.put(k, v)`, `.remove(k)`, `k in`, `.items()`, `len()`, `.clear()`.
    Its keys are strings or integers."""

    key_kind: str
    kind: str

    def describe(self) -> str:
        return f"map<{self.key_kind},{self.kind}>"


Declaration = Value | ListOf | MapOf


def check_declarations(fn: str, state: Mapping[str, Declaration]) -> None:
    """ValueError naming what is wrong with a `@stateful` function's state declarations."""
    for name, decl in state.items():
        if not name.isidentifier() or name.startswith("_") or name in ("clear", "written"):
            raise ValueError(
                f"{fn}: state name {name!r} must be an identifier, not starting with _ (nor clear/written)"
            )
        if not isinstance(decl, (Value, ListOf, MapOf)):
            raise ValueError(f"{fn}: state {name!r} is {decl!r}: declare it Value(kind), ListOf(kind) or MapOf(k, v)")
        if decl.kind not in KINDS:
            raise ValueError(f"{fn}: state {name!r} has kind {decl.kind!r}; kinds: {', '.join(KINDS)}")
        if isinstance(decl, MapOf) and decl.key_kind not in ("string", "bigint"):
            raise ValueError(f"{fn}: state {name!r}: a map's keys are string or bigint, not {decl.key_kind!r}")
        if isinstance(decl, ListOf) and decl.keep is not None and not (isinstance(decl.keep, int) and decl.keep > 0):
            raise ValueError(f"{fn}: state {name!r}: keep must be a positive integer, not {decl.keep!r}")


def describe(state: Mapping[str, Declaration]) -> str:
    """The declarations as the shape of the stored state names them: another one cannot read it."""
    return ",".join(f"{n}:{d.describe()}" for n, d in sorted(state.items()))


class _Var:
    def __init__(self, owner: KeyState, name: str, decl: Declaration) -> None:
        self._owner = owner
        self._name = name
        self._decl = decl

    @property
    def _what(self) -> str:
        return f"state {self._name!r} of key {self._owner.key!r}"

    def _stored(self) -> Any:
        return self._owner._entry["s"].get(self._name)

    def _store(self, v: Any) -> None:
        if v is None:
            self._owner._entry["s"].pop(self._name, None)
        else:
            self._owner._entry["s"][self._name] = v
        self._owner.written = True

    def clear(self) -> None:
        self._store(None)


class ValueVar(_Var):
    @property
    def value(self) -> Any:
        return _decode(self._decl.kind, self._stored())

    @value.setter
    def value(self, v: Any) -> None:
        self.set(v)

    def set(self, v: Any) -> None:
        self._store(_stored_double(_encode(self._decl.kind, v, self._what)))

    def __repr__(self) -> str:
        return f"Value({self.value!r})"


class ListVar(_Var):
    def items(self) -> list:
        return [_decode(self._decl.kind, v) for v in self._stored() or []]

    def __iter__(self) -> Iterator:
        return iter(self.items())

    def __len__(self) -> int:
        return len(self._stored() or [])

    def append(self, v: Any) -> None:
        kept = [*(self._stored() or []), _stored_double(_encode(self._decl.kind, v, self._what))]
        keep = self._decl.keep  # type: ignore[union-attr]
        self._store(kept[-keep:] if keep else kept)

    def set(self, values: list) -> None:
        self.clear()
        for v in values:
            self.append(v)

    def __repr__(self) -> str:
        return f"ListOf({self.items()!r})"


class MapVar(_Var):
    def _k(self, k: Any) -> str:
        kind = self._decl.key_kind  # type: ignore[union-attr]
        _encode(kind, k, f"a key of {self._what}")
        if k is None:
            raise StateError(f"a key of {self._what} cannot be None")
        return str(k)

    def _key_out(self, k: str) -> Any:
        return int(k) if self._decl.key_kind == "bigint" else k  # type: ignore[union-attr]

    def get(self, k: Any, default: Any = None) -> Any:
        stored = (self._stored() or {}).get(self._k(k))
        return default if stored is None else _decode(self._decl.kind, stored)

    def put(self, k: Any, v: Any) -> None:
        m = dict(self._stored() or {})
        m[self._k(k)] = _stored_double(_encode(self._decl.kind, v, f"{self._what} at {k!r}"))
        self._store(m)

    def remove(self, k: Any) -> None:
        m = dict(self._stored() or {})
        if m.pop(self._k(k), None) is not None:
            self._store(m or None)

    def __contains__(self, k: Any) -> bool:
        return self._k(k) in (self._stored() or {})

    def __len__(self) -> int:
        return len(self._stored() or {})

    def items(self) -> list[tuple[Any, Any]]:
        return [(self._key_out(k), _decode(self._decl.kind, v)) for k, v in (self._stored() or {}).items()]

    def set(self, mapping: Mapping[Any, Any]) -> None:
        self.clear()
        for k, v in dict(mapping).items():
            self.put(k, v)

    def __repr__(self) -> str:
        return f"MapOf({dict(self.items())!r})"


_VARS = {Value: ValueVar, ListOf: ListVar, MapOf: MapVar}


class KeyState:
    """What a `@stateful` function gets for one key: its declared variables as attributes (`state.last`),
    `clear()` for all of them, and `written`: whether this call changed any (a write restarts the time to
    live). Runs on Spark's Python workers, inside the call for the key's bucket."""

    def __init__(self, key: Any, entry: dict, declarations: Mapping[str, Declaration]) -> None:
        self.key = key
        self._entry = entry
        self._vars = {n: _VARS[type(d)](self, n, d) for n, d in declarations.items()}
        self.written = False

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_vars"][name]
        except KeyError:
            declared = ", ".join(sorted(self.__dict__.get("_vars", {}))) or "none"
            raise AttributeError(f"no state {name!r} is declared (declared: {declared})") from None

    def clear(self) -> None:
        for var in self._vars.values():
            var.clear()

    def as_dict(self) -> dict[str, Any]:
        """Every variable that holds something, as Python values (`weir state` prints this)."""
        out: dict[str, Any] = {}
        for name, var in self._vars.items():
            if var._stored() is not None:
                out[name] = var.value if isinstance(var, ValueVar) else var.items()
        return out


class Timers:
    """A key's timers. `now` is the processor's clock (the watermark for an event-time function, the wall clock
    otherwise) as an aware UTC datetime; `set(at)` (a datetime) calls the function's timer handler for this key
    once the clock passed `at`; `after(delta)` is `set(now + delta)`. At most one timer per key and instant."""

    def __init__(self, key: Any, entry: dict, now_ms: int, handled: bool) -> None:
        self.key = key
        self._entry = entry
        self._now_ms = now_ms
        self._handled = handled

    @property
    def now(self) -> datetime:
        return instant(self._now_ms * 1000)

    def _ms(self, at: datetime) -> int:
        if not isinstance(at, datetime):
            raise StateError(f"a timer of key {self.key!r} is set at a datetime, not {type(at).__name__} {at!r}")
        return -(-_micros(at) // 1000)  # rounded up: it never fires before `at`

    def set(self, at: datetime) -> None:
        if not self._handled:
            raise StateError(
                "this @stateful function sets a timer but declares no handler: add one with @<fn>.on_timer"
            )
        ms = self._ms(at)
        if ms not in self._entry["t"]:
            self._entry["t"] = sorted([*self._entry["t"], ms])

    def after(self, delta: timedelta) -> None:
        if not isinstance(delta, timedelta):
            raise StateError(f"Timers.after takes a timedelta, not {type(delta).__name__} {delta!r}")
        self.set(self.now + delta)

    def delete(self, at: datetime) -> None:
        ms = self._ms(at)
        self._entry["t"] = [t for t in self._entry["t"] if t != ms]

    def clear(self) -> None:
        self._entry["t"] = []

    def pending(self) -> list[datetime]:
        return [instant(t * 1000) for t in self._entry["t"]]


def expired(entry: dict, at_ms: int, ttl_ms: int | None) -> bool:
    """Whether the entry's state was last written `ttl_ms` or more before `at_ms`."""
    return ttl_ms is not None and bool(entry["s"]) and entry["w"] is not None and entry["w"] + ttl_ms <= at_ms


def expire_entry(entry: dict, at_ms: int, ttl_ms: int | None) -> bool:
    """Clear the entry's state if it expired by `at_ms` (its timers stay); whether it did."""
    if expired(entry, at_ms, ttl_ms):
        entry["s"], entry["w"] = {}, None
        return True
    return False


def empty_entry() -> dict:
    return {"s": {}, "t": [], "w": None}


class Bucket:
    """The keys of one bucket: key (as the wire carries it) -> entry {"s": variables, "t": timers (ms), "w": the
    clock at the last write, and, for an ordered function, "h": the records it holds (weir.blocks.ordering)}. Keys
    with neither state, timers nor held records are not kept."""

    def __init__(self, entries: dict[Any, dict] | None = None) -> None:
        self.entries: dict[Any, dict] = entries or {}

    @classmethod
    def loads(cls, data: bytes | None, fn: str) -> Bucket:
        if not data:
            return cls()
        doc = json.loads(bytes(data).decode())
        if doc.get("format") != FORMAT:
            raise ValueError(
                f"{fn}: the checkpoint's keyed state has format {doc.get('format')}, this weir reads {FORMAT}"
            )
        return cls({k: e for k, e in doc["keys"]})

    def dumps(self) -> bytes | None:
        if not self.entries:
            return None
        doc = {"format": FORMAT, "keys": [[k, e] for k, e in self.entries.items()]}
        return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()

    def entry(self, key: Any) -> dict:
        """A copy of the key's entry (a fresh one if it has none): a call that fails leaves the bucket as it was."""
        found = self.entries.get(key)
        return copy.deepcopy(found) if found is not None else empty_entry()

    def put(self, key: Any, entry: dict, written: bool, at_ms: int) -> None:
        """Keep the key's entry after a call (`at_ms`: when it wrote, if it did), or drop it when it holds nothing."""
        if written:
            entry["w"] = max(at_ms, entry["w"] or at_ms)  # a late write never moves the last one back
        if entry["s"] or entry["t"] or entry.get(ordering.HELD):
            self.entries[key] = entry
        else:
            self.entries.pop(key, None)

    def expire(self, now_ms: int, ttl_ms: int | None) -> int:
        """Clear the state of every key not written for `ttl_ms` (its timers stay); how many keys it cleared. A key
        with a timer due keeps it for now: the timer came first, and its call expires the state as of its instant
        (`expire_entry`)."""
        if ttl_ms is None:
            return 0
        gone = [
            k for k, e in self.entries.items()
            if expired(e, now_ms, ttl_ms) and not (e["t"] and e["t"][0] <= now_ms)
        ]  # fmt: skip
        for k in gone:
            e = self.entries[k]
            e["s"], e["w"] = {}, None
            if not e["t"] and not e.get(ordering.HELD):
                del self.entries[k]
        return len(gone)

    def due(self, now_ms: int) -> list[tuple[int, Any]]:
        """(timer ms, key) of every timer the clock passed, earliest first (then by key)."""
        found = [(t, k) for k, e in self.entries.items() for t in e["t"] if t <= now_ms]
        return sorted(found, key=lambda tk: (tk[0], str(tk[1])))

    def next_due(self, ttl_ms: int | None) -> int | None:
        """The earliest time (ms) something happens without input: a timer, a key's state expiring, or a held record
        released."""
        times = [t for e in self.entries.values() for t in e["t"][:1]]
        times += [t for e in self.entries.values() if (t := ordering.first_due_ms(e)) is not None]
        if ttl_ms is not None:
            times += [e["w"] + ttl_ms for e in self.entries.values() if e["s"] and e["w"] is not None]
        return min(times) if times else None


def migrate_bucket(
    b: Bucket, old: Mapping[str, Declaration], new: Mapping[str, Declaration],
    migrate: Callable[[Any, dict[str, Any]], Mapping[str, Any] | None], user_key: Callable[[Any], Any], fn: str,
) -> None:  # fmt: skip
    """Rewrite every key of `b` from the `old` declarations to the `new` ones by the user's `migrate(key, old
    values)`: the key's variables that hold something, as Python values, to a mapping of the new variables'
    values (one left out is empty; None: the key's state is dropped). Timers and the last write stay. A
    migration that raises or returns what the new declarations refuse raises RuntimeError naming the function,
    the key and the reason: the query fails and the stored state stays as it was."""
    for k, entry in list(b.entries.items()):
        key = user_key(k)
        where = f"{fn}'s migration for key {key!r}"
        fresh = {"s": {}, "t": list(entry["t"]), "w": entry["w"]}
        if entry.get(ordering.HELD):  # an ordered function's held records are input, not state: they stay
            fresh[ordering.HELD] = entry[ordering.HELD]
        try:
            values = migrate(key, KeyState(key, entry, old).as_dict())
            if values is not None and not isinstance(values, Mapping):
                raise StateError(f"it returned {type(values).__name__} {values!r}, not a mapping of state names")
            state = KeyState(key, fresh, new)
            for name, v in (values or {}).items():
                if name not in new:
                    raise StateError(f"it returned state {name!r}, which is not declared ({', '.join(sorted(new))})")
                if v is not None:
                    getattr(state, name).set(v)
        except Exception as exc:
            raise RuntimeError(f"{where} raised {type(exc).__name__}: {exc}") from exc
        if not fresh["s"]:
            fresh["w"] = None
        if fresh["s"] or fresh["t"] or fresh.get(ordering.HELD):
            b.entries[k] = fresh
        else:
            del b.entries[k]


def unmigrated(stored: str, current: str) -> bool:
    """Whether a bucket stored as shape `stored` differs from the query's `current` in its declarations only:
    what a migration can rewrite (the buckets, the clock and the time to live it cannot)."""
    return stored != current and stored.split(" state=", 1)[0] == current.split(" state=", 1)[0]


# -- values between the wire and the user's function ------------------------------------------------------------
# A column's "wire kind" says how it crosses between Spark and pandas exactly (weir.blocks.keyed chooses it from
# the Spark type): integers and timestamps (µs) as text, nested types as JSON text, decimals and dates as text.


_FROM_WIRE: dict[str, Callable[[Any], Any]] = {
    "int": int,
    "ts": lambda x: instant(int(x)),
    "date": date.fromisoformat,
    "decimal": Decimal,
    "json": json.loads,
    "bool": bool,
}  # every other kind: the wire value is the value


def from_wire(kind: str, v: Any) -> Any:
    """A wire value as the user's function sees it (None for null)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None  # pandas' null: a double column's NaN is Spark's null or NaN, which pandas cannot tell apart
    convert = _FROM_WIRE.get(kind)
    return v if convert is None else convert(v)


def column_from_wire(kind: str, values: np.ndarray) -> list:
    """`from_wire` of every value of a column, in one pass (the per-record cost of a @stateful batch)."""
    convert = _FROM_WIRE.get(kind)
    out = values.tolist()
    if convert is None:
        return [None if v is None or (isinstance(v, float) and v != v) else v for v in out]
    return [None if v is None or (isinstance(v, float) and v != v) else convert(v) for v in out]


def to_wire(kind: str, v: Any, what: str) -> Any:
    """A value the user's function returned, as the wire carries it; StateError naming `what` for a wrong type."""
    if v is None:
        return None
    try:
        if kind == "int":
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError
            return str(v)
        if kind == "ts":
            if not isinstance(v, datetime):
                raise TypeError
            return str(_micros(v))
        if kind == "date":
            if not isinstance(v, date):
                raise TypeError
            return v.isoformat()
        if kind == "decimal":
            if not isinstance(v, (int, Decimal)) or isinstance(v, bool):
                raise TypeError
            return str(v)
        if kind == "json":
            return json.dumps(v, default=_json_default)
        if kind == "double":
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError
            return float(v)
        if kind == "bool":
            if not isinstance(v, bool):
                raise TypeError
            return v
        if kind == "str":
            if not isinstance(v, str):
                raise TypeError
            return v
        if kind == "bytes":
            if not isinstance(v, (bytes, bytearray)):
                raise TypeError
            return bytes(v)
    except TypeError:
        raise StateError(f"{what} is {kind}: cannot take {type(v).__name__} {v!r}") from None
    return v


def _json_default(v: Any) -> Any:
    if isinstance(v, datetime):
        return v.isoformat()
    if isinstance(v, (date, Decimal)):
        return str(v)
    raise TypeError(f"{type(v).__name__} is not JSON")


_DECLARED = re.compile(r"(\w+):(?:value<(\w+)>|list<(\w+)>(?: keep=(\d+))?|map<(\w+),(\w+)>)")


def declarations_of(shape: str) -> dict[str, Declaration]:
    """The declarations a stored shape names (`describe`'s text after `state=`): the state explains itself to a
    reader that lacks the code (`weir state`)."""
    text = shape.split(" state=", 1)[1] if " state=" in shape else ""
    out: dict[str, Declaration] = {}
    for m in _DECLARED.finditer(text):
        name, value, listed, keep, map_key, map_value = m.groups()
        if value:
            out[name] = Value(value)
        elif listed:
            out[name] = ListOf(listed, int(keep) if keep else None)
        else:
            out[name] = MapOf(map_key, map_value)
    return out


def inspected(data: bytes | None, shape: str, fn: str) -> Iterator[dict[str, Any]]:
    """Each key of a stored bucket as `weir state` shows it: key, state (Python values), timers and last write
    (ISO instants)."""
    decl = declarations_of(shape)
    for key, entry in Bucket.loads(data, fn).entries.items():
        yield {
            "key": key,
            "state": KeyState(key, entry, decl).as_dict(),
            "timers": [instant(t * 1000).isoformat() for t in entry["t"]],
            "written": None if entry["w"] is None else instant(entry["w"] * 1000).isoformat(),
            "held": ordering.held(entry),
        }
