"""A topic's declared schema as the ingest side checks it: the same JSON decoder the weir-kafka source uses
downstream, so a record accepted here is a record that decodes there.

The DDL is turned into a pyarrow schema without Spark (an ingest server starts no JVM). Errors name fields
(`field 'temp': expected a number, got the string "hot"`, `required field 'order_id' is missing or null`);
the names are lifted into `fields`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from weir.kafka.decode import JsonDecoder, SchemaError, arrow_type, parse_fields, type_problem
from weir.kafka.formats.base import EncodeError, Encoder

__all__ = ["Invalid", "RecordSchema", "arrow_type"]

_FIELD_IN_ERROR = re.compile(r"Column\(/([^)\[]+)|field '([^']+)'")


def _named(reason: str) -> tuple[str, ...]:
    """The fields a reason names."""
    return tuple(dict.fromkeys(a or b for a, b in _FIELD_IN_ERROR.findall(reason)))


@dataclass(frozen=True)
class Invalid:
    """Why one record was refused: the reason as the decoder gives it, and the fields it names."""

    row: int
    reason: str
    fields: tuple[str, ...]

    def to_json(self) -> dict:
        return {"row": self.row, "fields": list(self.fields), "reason": self.reason}


class RecordSchema:
    """Checks JSON values against a topic's schema; `key` names the field whose value is the record key."""

    def __init__(self, ddl: str, key: str | None = None, encoder: Encoder | None = None) -> None:
        specs = parse_fields(ddl)
        for spec in specs:
            problem = type_problem(spec.type_ddl)
            if problem:
                raise SchemaError(f"field {spec.name}: {problem}")
        self.names = [s.name for s in specs]
        if key is not None and key not in self.names:
            raise SchemaError(f"key {key!r} is not a field of the schema ({', '.join(self.names)})")
        self.key = key
        arrow = pa.schema([pa.field(s.name, arrow_type(s.type_ddl)) for s in specs])
        self.decoder = JsonDecoder(arrow, {s.name for s in specs if s.required})
        # JSON in, the topic's format out (Avro, Protobuf, JSON Schema): valid records are encoded, here
        self.encoder, self.row_type = encoder, pa.struct(list(arrow))

    def _all_valid(self, values: list[bytes]) -> list[pa.Array] | None:
        """The decoded columns when every value is valid, found with one parse (the usual case); None when
        some value is not, and the decoder's record-by-record path must say which and why."""
        try:
            b"\n".join(values).decode("utf-8")
            # Only objects reach the parser: a bare literal first in a block crashes pyarrow (weir/kafka/decode.py).
            if any(v[:1] != b"{" or b"\n" in v for v in values):
                return None
            table = self.decoder.parse(values)
            if table.num_rows != len(values):
                return None
        except (UnicodeDecodeError, pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
            return None
        columns = [table.column(i).combine_chunks() for i in range(table.num_columns)]
        for name in self.decoder.required:
            if columns[self.names.index(name)].null_count:
                return None
        return columns

    def key_of(self, value: bytes) -> bytes | None:
        """The key field's value as sent, of a record refused: its dead letter keeps the key (a scalar's text,
        as a valid record's key), so it can be found and sent again by key. Only refused records come here."""
        if self.key is None:
            return None
        try:
            doc = json.loads(value)
        except ValueError:
            return None
        k = doc.get(self.key) if isinstance(doc, dict) else None
        return None if k is None or isinstance(k, dict | list) else str(k).encode()

    def check(self, values: list[bytes]) -> tuple[list[bytes | None], list[Invalid | None], list[bytes]]:
        """Per value: its key (the key field as UTF-8, None without key field or value) and None, or None and
        why it is invalid; and the value to produce (as sent, or in the topic's format: a record the format
        refuses is invalid, with the encoder's reason). A null key field on a valid record is allowed unless the
        field is NOT NULL."""
        keys, problems, columns = self._checked(values)
        if self.encoder is None or not values:
            return keys, problems, values
        out = list(values)
        for i, (value, problem) in enumerate(zip(self._encoded(columns, problems), problems, strict=True)):
            if isinstance(value, EncodeError):
                problems[i], keys[i] = Invalid(i, str(value), _named(str(value))), None
            elif problem is None:
                out[i] = value
        return keys, problems, out

    def _encoded(self, columns: list[pa.Array], problems: list[Invalid | None]) -> list[bytes | EncodeError | None]:
        """The valid rows in the topic's format: all at once, else row by row to find the ones it refuses."""
        rows = pa.StructArray.from_arrays(columns, fields=list(self.row_type))
        valid = [i for i, p in enumerate(problems) if p is None]
        out: list[bytes | EncodeError | None] = [None] * len(problems)
        try:
            for i, v in zip(valid, self.encoder.encode(rows.take(valid)).to_pylist(), strict=True):
                out[i] = v
        except EncodeError:
            for i in valid:
                try:
                    out[i] = self.encoder.encode(rows.slice(i, 1))[0].as_py()
                except EncodeError as exc:
                    out[i] = exc
        return out

    def _checked(self, values: list[bytes]) -> tuple[list[bytes | None], list[Invalid | None], list[pa.Array]]:
        if not values:
            return [], [], []
        fast = self._all_valid(values)
        if fast is not None:
            columns, errors = fast, pa.nulls(len(values), pa.string())
        else:
            columns, errors = self.decoder.decode(list(values))
        problems: list[Invalid | None] = [None] * len(values)
        if errors.null_count < len(values):
            for i in pc.indices_nonzero(pc.is_valid(errors)).to_pylist():
                reason = errors[i].as_py()
                problems[i] = Invalid(i, reason, _named(reason))
        if self.key is None:
            return [None] * len(values), problems, columns
        raw = columns[self.names.index(self.key)].to_pylist()
        keys = [None if k is None or p is not None else str(k).encode() for k, p in zip(raw, problems, strict=True)]
        return keys, problems, columns
