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

from weir.formats.ddl import SchemaError, arrow_type, parse_fields, type_problem
from weir.formats.jsondecode import JsonDecoder
from weir.formats.keys import RecordWriter

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

    def __init__(self, ddl: str, key: str | None = None, writer: RecordWriter | None = None) -> None:
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
        # JSON in, the topic's formats out (Avro, Protobuf, JSON Schema values or keys): valid records are
        # encoded here
        self.writer, self.row_type = writer, pa.struct(list(arrow))

    def _all_valid(self, values: list[bytes]) -> list[pa.Array] | None:
        """The decoded columns when every value is valid, found with one parse (the usual case); None when
        some value is not, and the decoder's record-by-record path must say which and why."""
        try:
            b"\n".join(values).decode("utf-8")
            # Only objects reach the parser: a bare literal first in a block crashes pyarrow (weir.formats.jsondecode).
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
        """Per value: its key (the key field as UTF-8, or the key's record in the topic's key format; None without
        key field or value) and None, or None and why it is invalid; and the value to produce (as sent, or in the
        topic's format: a record a format refuses is invalid, with the encoder's reason). A null key field on a
        valid record is allowed unless the field is NOT NULL."""
        keys, problems, columns = self._checked(values)
        if self.writer is None or not values:
            return keys, problems, values
        valid = [i for i, p in enumerate(problems) if p is None]
        rows = pa.StructArray.from_arrays(columns, fields=list(self.row_type)).take(valid)
        encoded, encoded_keys, errors = (a.to_pylist() for a in self.writer.encode_each(rows))
        out = list(values)
        for j, i in enumerate(valid):
            if errors[j] is not None:
                problems[i], keys[i] = Invalid(i, errors[j], _named(errors[j])), None
                continue
            if self.writer.value is not None:
                out[i] = encoded[j]
            if self.writer.key is not None:
                keys[i] = encoded_keys[j]
        return keys, problems, out

    @property
    def keys_formatted(self) -> bool:
        """Whether keys are written in a format of their own (the topic's key_format), not as the key's text."""
        return self.writer is not None and self.writer.key is not None

    def tombstone_key(self, fields: dict) -> bytes:
        """The key of a tombstone deleting the record of these key fields, in the topic's key format. Raises
        EncodeError naming the field when the key format refuses them."""
        assert self.writer is not None
        return self.writer.encode_key(fields, self.row_type)

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
