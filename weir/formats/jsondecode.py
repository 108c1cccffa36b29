"""The json format: weir's own decoding of JSON values into the typed columns of a topic's `valueSchema` (weir's
DDL, weir.formats.ddl), with pyarrow, inside the reader, without dropping anything.

A record that cannot be decoded keeps its raw bytes and gets a non-null `_error`; its decoded columns are
null. A tombstone (null value) is not an error: its decoded columns are null and it is told apart by
`value IS NULL`, so a changelog's deletes survive the usual `_error IS NULL` filter.

Decoding a whole batch at once is the fast path; when it fails, the batch is bisected so only the bad
records pay per-record parsing, and every error names what was wrong: the field, what it holds as sent, and
what its type expects (`explain`).

A top-level TIMESTAMP field takes an ISO 8601 string or an epoch number: seconds when its magnitude is below
1e11 (before the year 5138), else milliseconds (after March 1973). A block whose timestamps are all numbers is
read in one pass as well (the field read as a number, then converted); one that mixes both is bisected.
"""

from __future__ import annotations

import io
import json
import re

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from weir.formats.ddl import SchemaError


def _reader_type(t: pa.DataType) -> pa.DataType:
    """The type the JSON reader is asked for: dates come as strings and are cast afterwards."""
    if pa.types.is_date(t):
        return pa.string()
    if pa.types.is_map(t):
        raise SchemaError(f"valueSchema: JSON decoding does not support map types ({t}); use a STRUCT")
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _reader_type(f.type)) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_reader_type(t.value_type))
    return t


class JsonDecoder:
    """Decodes JSON values into the arrow columns of `fields` (a pyarrow schema in output order)."""

    def __init__(self, fields: pa.Schema, required: set[str]) -> None:
        self.fields = fields
        self.required = [n for n in fields.names if n in required]
        self.reader_schema = pa.schema([pa.field(f.name, _reader_type(f.type)) for f in fields])
        self.needs_cast = self.reader_schema != pa.schema([pa.field(f.name, f.type) for f in fields])
        self.instants = {f.name for f in fields if pa.types.is_timestamp(f.type)}  # may come as epoch numbers
        self._alone = {f.name: pa.schema([pa.field(f.name, _reader_type(f.type))]) for f in fields}
        self._parse([b"{}"]).cast(self.fields)  # fail now, while planning, on a type JSON cannot produce

    def _parse(self, values: list[bytes], *, single: bool = False, schema: pa.Schema | None = None) -> pa.Table:
        data = b"\n".join(values)
        return pajson.read_json(
            io.BytesIO(data),
            read_options=pajson.ReadOptions(use_threads=False, block_size=max(1 << 20, len(data) + 1)),
            parse_options=pajson.ParseOptions(
                explicit_schema=schema or self.reader_schema,
                unexpected_field_behavior="ignore",
                newlines_in_values=single,
            ),
        )

    def parse(self, values: list[bytes], *, single: bool = False) -> pa.Table:
        """`values` (JSON objects) as one table of `fields`, or an error. A timestamp field that pyarrow finds
        holding numbers is read again as a number and converted from epoch seconds or milliseconds: a block
        of epoch times costs one more pass, not a record-by-record one."""
        reader, epoch = self.reader_schema, []
        while True:
            try:
                table = self._parse(values, single=single, schema=reader)
                break
            except pa.ArrowInvalid as exc:
                number = _TO_NUMBER.search(str(exc))
                if number is None or number.group(1) not in self.instants or number.group(1) in epoch:
                    raise
                epoch.append(number.group(1))
                at = reader.get_field_index(number.group(1))
                reader = reader.set(at, pa.field(number.group(1), pa.float64()))
        for name in epoch:
            at = table.schema.get_field_index(name)
            table = table.set_column(at, name, from_epoch(table.column(at), self.fields.field(name).type))
        if self.needs_cast or epoch:
            table = table.cast(self.fields)
        return table

    def explain(self, value: bytes) -> tuple[str, str] | None:
        """(field path, reason) of a record the parser refused, as the user sent it: the first declared field
        whose value does not fit its type (`field 'temp': expected a number, got the string "hot"`); None
        when the value is no JSON object or no field can be blamed. Only refused records come here."""
        try:
            doc = json.loads(value)
        except ValueError:
            return None
        if not isinstance(doc, dict):
            return None
        for f in self.fields:
            if doc.get(f.name) is None:
                continue
            misfit = _misfit(doc[f.name], f.type, f.name, f.name in self.instants)
            if misfit is None and isinstance(doc[f.name], str | dict | list):  # its content may still be refused
                try:
                    self._parse([json.dumps({f.name: doc[f.name]}).encode()], schema=self._alone[f.name]).cast(
                        pa.schema([f]))  # fmt: skip
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
                    misfit = (f.name, f"expected {_expected(f.type, f.name in self.instants)}, got "
                                      f"{_shown(doc[f.name])}")  # fmt: skip
            if misfit is not None:
                return misfit[0], f"field '{misfit[0]}': {misfit[1]}"
        return None

    def _parse_rows(
        self, values: list[bytes | None], errors: list[str | None], idx: list[int]
    ) -> list[tuple[list[int], pa.Table]]:
        """Parse values[i] for i in idx, bisecting on failure so only bad records are parsed alone.

        Returns (positions, table) pieces in position order; each bad record gets its error.
        """
        pieces: list[tuple[list[int], pa.Table]] = []
        stack = [idx]
        while stack:
            part = stack.pop()
            if not part:
                continue
            try:
                table = self.parse([values[i] for i in part], single=len(part) == 1)
                if table.num_rows != len(part):
                    raise ValueError(_count_message(table.num_rows, len(part)))
                pieces.append((part, table))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
                if len(part) == 1:
                    explained = self.explain(values[part[0]])
                    errors[part[0]] = explained[1] if explained else f"invalid JSON for valueSchema: {exc}"
                else:
                    mid = len(part) // 2
                    # Right half pushed first, so the left half is parsed first and pieces stay in order.
                    stack.append(part[mid:])
                    stack.append(part[:mid])
        return pieces

    def decode(self, values: list[bytes | None]) -> tuple[list[pa.Array], pa.Array]:
        """Decoded columns (one per field, len(values) rows) and the `_error` column."""
        n = len(values)
        errors: list[str | None] = [None] * n
        # A tombstone (null value) is a delete on a changelog, not a bad record: null fields, no error.
        # Marking it would make the usual `_error IS NULL` filter drop every delete without a trace.
        whole = values.count(None) == 0  # the usual case: no per-record Python below unless a record is odd
        present = list(range(n)) if whole else [i for i, v in enumerate(values) if v is not None]
        try:
            # One C-speed pass: JSON is UTF-8, and pyarrow's reader would pass bad bytes through.
            b"\n".join(values if whole else [values[i] for i in present]).decode("utf-8")
        except UnicodeDecodeError:
            for i in present:
                try:
                    values[i].decode("utf-8")
                except UnicodeDecodeError as exc:
                    byte = values[i][exc.start : exc.start + 1]
                    errors[i] = f"the value is not valid UTF-8 (byte {exc.start}: {byte!r})"
            present = [i for i in present if errors[i] is None]
        # Only objects reach the parser. A blank value parses to zero rows, so excluding it keeps blocks
        # aligned record for record; a bare literal such as `null` first in a block crashes pyarrow 26. Values
        # that start with "{" are told apart in one Arrow pass; only the others are looked at one by one.
        odd = pc.invert(pc.fill_null(pc.starts_with(pa.array(values, pa.binary()), b"{"), True))
        for i in pc.indices_nonzero(odd).to_pylist() if pc.any(odd).as_py() else ():
            v = values[i]
            if v.lstrip()[:1] != b"{" and errors[i] is None:
                errors[i] = "the value is empty" if not v.strip() else "the value is not a JSON object"
        if errors.count(None) != n:
            present = [i for i in present if errors[i] is None]
        pieces = self._parse_rows(values, errors, present)
        if len(pieces) == 1 and len(pieces[0][0]) == n:
            table = pieces[0][1]
            columns = [table.column(i).combine_chunks() for i in range(table.num_columns)]
        else:
            # Scatter parsed rows back to their positions; rows without a parse stay null.
            table = pa.concat_tables([t for _, t in pieces]) if pieces else self.fields.empty_table()
            where: list[int | None] = [None] * n
            for row, i in enumerate(i for part, _ in pieces for i in part):
                where[i] = row
            take = pa.array(where, pa.int64())
            columns = [pc.take(table.column(i).combine_chunks(), take) for i in range(table.num_columns)]
        self._check_required(columns, values, errors)
        if errors.count(None) == n:
            return columns, pa.nulls(n, pa.string())
        err = pa.array(errors, pa.string())
        # An error row carries no half-decoded values: downstream sees the raw bytes and the reason only.
        ok = pc.is_null(err)
        return [pc.if_else(ok, c, pa.nulls(n, c.type)) for c in columns], err

    def _check_required(self, columns: list[pa.Array], values: list, errors: list[str | None]) -> None:
        for name in self.required:
            missing = pc.is_null(columns[self.fields.get_field_index(name)])
            if not pc.any(missing).as_py():
                continue
            for i in pc.indices_nonzero(missing).to_pylist():
                if errors[i] is None and values[i] is not None:
                    errors[i] = f"required field '{name}' is missing or null"


def _count_message(rows: int, records: int) -> str:
    if records > 1:
        return "row count mismatch"
    return "the value holds no JSON document" if rows == 0 else "the value holds more than one JSON document"


_TO_NUMBER = re.compile(r"Column\(/([^)/\[]+)\) changed from string to number")
EPOCH_MS_FROM = 1e11  # |epoch| at or above: milliseconds (after 1973-03-03); below: seconds (before 5138)
EPOCH_MS_UNTIL = 9.2e15  # milliseconds beyond this overflow microseconds in 64 bits (about the year 293,000)


def from_epoch(numbers: pa.ChunkedArray | pa.Array, t: pa.DataType) -> pa.Array:
    """Epoch numbers as timestamps of type `t`: seconds below EPOCH_MS_FROM in magnitude, milliseconds above."""
    x = numbers.combine_chunks() if isinstance(numbers, pa.ChunkedArray) else numbers
    seconds = pc.less(pc.abs(x), EPOCH_MS_FROM)
    micros = pc.round(pc.if_else(seconds, pc.multiply(x, 1e6), pc.multiply(x, 1e3)))
    return pc.cast(pc.cast(micros, pa.int64()), pa.timestamp("us", t.tz)).cast(t)


def _expected(t: pa.DataType, epoch: bool = False) -> str:
    if pa.types.is_boolean(t):
        return "true or false"
    if pa.types.is_integer(t):
        return f"a whole number ({t})"
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "a number"
    if pa.types.is_date(t):
        return "a date string (YYYY-MM-DD)"
    if pa.types.is_timestamp(t):
        return "an ISO 8601 timestamp string" + (" or epoch seconds or milliseconds" if epoch else "")
    if pa.types.is_struct(t):
        return "an object"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return "an array"
    return "a string"


def _shown(v: object) -> str:
    """A JSON value as the user sent it, kind first, cut at 60 characters."""
    text = json.dumps(v, ensure_ascii=False)
    text = text if len(text) <= 60 else text[:57] + "..."
    if isinstance(v, bool) or v is None:
        return text
    kind = {str: "the string", int: "the number", float: "the number", dict: "the object", list: "the array"}
    return f"{kind[type(v)]} {text}"


def _misfit(v: object, t: pa.DataType, path: str, epoch: bool) -> tuple[str, str] | None:
    """(path, why) when the JSON value `v` is of the wrong kind for `t` (an object's fields and an array's items
    looked into); None when its kind fits. Epoch numbers fit a top-level timestamp field only."""
    number = isinstance(v, int | float) and not isinstance(v, bool)
    if pa.types.is_boolean(t):
        fits = isinstance(v, bool)
    elif pa.types.is_integer(t):
        fits = isinstance(v, int) and not isinstance(v, bool)
        if fits and not -(1 << (t.bit_width - 1)) <= v < (1 << (t.bit_width - 1)):
            return path, f"{_shown(v)} is out of range for {t}"
    elif pa.types.is_floating(t) or pa.types.is_decimal(t):
        fits = number
    elif pa.types.is_timestamp(t):
        fits = isinstance(v, str) or (epoch and number)
        if fits and number and abs(v) >= EPOCH_MS_UNTIL:
            return path, f"{_shown(v)} is out of range for epoch milliseconds"
    elif pa.types.is_struct(t):
        if not isinstance(v, dict):
            return path, f"expected an object, got {_shown(v)}"
        for f in t:
            if v.get(f.name) is not None and (inner := _misfit(v[f.name], f.type, f"{path}/{f.name}", False)):
                return inner
        return None
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        if not isinstance(v, list):
            return path, f"expected an array, got {_shown(v)}"
        for i, item in enumerate(v):
            if item is not None and (inner := _misfit(item, t.value_type, f"{path}[{i}]", False)):
                return inner
        return None
    else:
        fits = isinstance(v, str)
    return None if fits else (path, f"expected {_expected(t, epoch)}, got {_shown(v)}")
