"""Record keys in a format of their own (a topic's `key_format`, docs/formats.md): Avro, Protobuf or JSON Schema
keys, subject <topic>-key, whose fields are fields of the topic's records.

Writing, a `RecordWriter` encodes each row's value (its value format) and key (its key fields, under the key
format); a row either refuses is refused whole, with the reason. Reading, a `KeyedDecoder` decodes the key
beside the value: a key that does not decode makes the record a dead letter ("key: ..."), and the key's fields
fill the record's where the value has none (a tombstone's key fields are in its key only).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from weir.formats.base import Decoder, EncodeError, Encoder

KEY_REFUSED = "key: "  # how a key's refusal (writing) or a key that does not decode (reading) is told apart


def key_struct(rows: pa.StructArray, fields: Sequence[str]) -> pa.StructArray:
    """The key's fields of `rows` (a null row stays null: no record, no key)."""
    return pa.StructArray.from_arrays(
        [rows.field(name) for name in fields], names=list(fields), mask=rows.is_null() if rows.null_count else None
    )


@dataclass(frozen=True)
class RecordWriter:
    """How one topic's records are encoded in write tasks (executors). Made on the driver (weir.formats.
    writer), its schemas registered first; it holds no credential.

    value: the value format's encoder; None for JSON values (Spark's to_json writes them).
    key: the key format's encoder; None for a text key (the key field as a string, Spark casts it).
    key_fields: the key's fields, as the key format's schema lists them (all fields of the rows).
    """

    value: Encoder | None
    key: Encoder | None = None
    key_fields: tuple[str, ...] = ()

    def encode(self, rows: pa.StructArray) -> tuple[pa.BinaryArray | None, pa.BinaryArray | None]:
        """(values, keys) of `rows`, None for the part this writer leaves to Spark. Raises EncodeError for the
        first row either format refuses, a key's reason starting with "key: "."""
        values = self.value.encode(rows) if self.value is not None else None
        if self.key is None:
            return values, None
        try:
            return values, self.key.encode(key_struct(rows, self.key_fields))
        except EncodeError as exc:
            raise EncodeError(f"{KEY_REFUSED}{exc}") from None

    def encode_key(self, fields: Mapping[str, Any], row_type: pa.StructType) -> bytes:
        """The key of the record of these key fields (a tombstone's, which has no row), typed as `row_type` (the
        topic's records) types them. Raises EncodeError ("key: ...") when the key format refuses them."""
        assert self.key is not None, "a text key needs no encoding"
        typed = pa.struct([row_type.field(name) for name in self.key_fields])
        try:
            return self.key.encode(pa.array([{n: fields.get(n) for n in self.key_fields}], typed))[0].as_py()
        except EncodeError as exc:
            raise EncodeError(f"{KEY_REFUSED}{exc}") from None

    def encode_each(self, rows: pa.StructArray) -> tuple[pa.BinaryArray, pa.BinaryArray, pa.StringArray]:
        """(values, keys, errors) of `rows`: each row's value and key (null where this writer leaves them to
        Spark), or nulls and why a format refused the row. The batch is encoded at once; only a batch with a
        refused row is bisected, so only refused rows are encoded alone."""
        n = len(rows)
        values: list[bytes | None] = [None] * n
        keys: list[bytes | None] = [None] * n
        errors: list[str | None] = [None] * n
        stack = [(0, n)]
        while stack:
            lo, hi = stack.pop()
            if hi <= lo:
                continue
            try:
                v, k = self.encode(rows.slice(lo, hi - lo))
            except EncodeError as exc:
                if hi - lo == 1:
                    errors[lo] = str(exc)
                else:
                    mid = (lo + hi) // 2
                    stack += [(mid, hi), (lo, mid)]
                continue
            if v is not None:
                values[lo:hi] = v.to_pylist()
            if k is not None:
                keys[lo:hi] = k.to_pylist()
        return pa.array(values, pa.binary()), pa.array(keys, pa.binary()), pa.array(errors, pa.string())


class KeyedDecoder:
    """A topic's values and keys decoded together in read tasks (executors), as `Decoder` does values alone.

    `places` pairs each key field with the value column it fills: (index among the value's columns, index among
    the key's). A key that does not decode makes its record a dead letter with the reason ("key: ..."), unless
    its value already is one; where the value holds no field (a tombstone, a field the value lacks), the key's
    field is the column's."""

    def __init__(self, values: Decoder, keys: Decoder, places: Sequence[tuple[int, int]]) -> None:
        self.values, self.keys, self.places = values, keys, tuple(places)

    def decode(
        self, values: list[bytes | None], keys: list[bytes | None] | None = None
    ) -> tuple[list[pa.Array], pa.Array]:
        columns, errors = self.values.decode(values)
        if keys is None:
            return columns, errors
        key_columns, key_errors = self.keys.decode(keys)
        for at, k in self.places:
            columns[at] = pc.coalesce(columns[at], key_columns[k].cast(columns[at].type))
        if key_errors.null_count == len(key_errors):
            return columns, errors
        told = pc.binary_join_element_wise(pa.scalar(KEY_REFUSED), key_errors, "")
        return columns, pc.coalesce(errors, told)


def decode_records(decoder: Decoder | KeyedDecoder, values: list[bytes | None],
                   keys: Callable[[], list[bytes | None]]) -> tuple[list[pa.Array], pa.Array]:  # fmt: skip
    """`decoder`'s columns and errors for records of these values and keys (`keys` read only when wanted)."""
    if isinstance(decoder, KeyedDecoder):
        return decoder.decode(values, keys())
    return decoder.decode(values)
