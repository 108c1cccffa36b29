"""weir's DDL: the grammar of a topic's `valueSchema` ("user STRING NOT NULL, amount DOUBLE") and of the columns
every value format gives, read without Spark.

`parse_fields` splits a field list into names, types and NOT NULL; `type_problem` says what is wrong with a type
before anything starts; `arrow_type` gives the pyarrow type Spark's `to_arrow_schema` gives a DDL type, which the
decoders fill (weir.formats.jsondecode, the Avro, Protobuf and JSON Schema formats).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

import pyarrow as pa


class SchemaError(ValueError):
    """The valueSchema DDL cannot be used for JSON decoding."""


@dataclass(frozen=True)
class FieldSpec:
    name: str
    type_ddl: str
    required: bool


def _split_top_level(ddl: str) -> list[str]:
    """Split a DDL field list at commas outside <>, (), quotes and backticks."""
    parts, depth, quote, current = [], 0, "", []
    for ch in ddl:
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"`":
            quote = ch
        elif ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def parse_fields(ddl: str) -> list[FieldSpec]:
    """Fields of a DDL like "user STRING NOT NULL, amount DOUBLE": names, types, and NOT NULL as required.

    NOT NULL means "must be present and non-null in every record"; a record that breaks it is an error
    row. The type text itself is left for Spark's own DDL parser.
    """
    fields = []
    for part in _split_top_level(ddl):
        if part.startswith("`"):
            end = part.find("`", 1)
            if end < 0:
                raise SchemaError(f"valueSchema: unterminated backtick in {part!r}")
            name, rest = part[1:end], part[end + 1 :].strip()
        else:
            name, _, rest = part.partition(" ")
            name = name.rstrip(":")
            rest = rest.strip().lstrip(":").strip()
        if not name or not rest:
            raise SchemaError(f"valueSchema: expected '<name> <type>', got {part!r}")
        words = rest.split()
        required = len(words) >= 2 and [w.upper() for w in words[-2:]] == ["NOT", "NULL"]
        type_ddl = " ".join(words[:-2]) if required else rest
        fields.append(FieldSpec(name, type_ddl, required))
    if not fields:
        raise SchemaError("valueSchema names no field")
    names = [f.name for f in fields]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SchemaError(f"valueSchema names field(s) {', '.join(dupes)} more than once")
    return fields


_PRIMITIVES = {
    "BOOLEAN", "TINYINT", "BYTE", "SMALLINT", "SHORT", "INT", "INTEGER", "BIGINT", "LONG", "FLOAT", "REAL",
    "DOUBLE", "DATE", "TIMESTAMP", "TIMESTAMP_NTZ", "TIMESTAMP_LTZ", "STRING", "BINARY",
}  # fmt: skip
_SIZED = {"DECIMAL": 2, "DEC": 2, "NUMERIC": 2, "CHAR": 1, "CHARACTER": 1, "VARCHAR": 1}  # most arguments
_TYPE = re.compile(r"\s*([A-Za-z_]+)\s*")


def type_problem(ddl: str, *, maps: bool = False) -> str | None:
    """What is wrong with a field type as Spark's DDL writes it ("STRING", "DECIMAL(10,2)",
    "ARRAY<STRUCT<a: INT>>"), for JSON decoding; None when it is fine. Checked without Spark, so that a
    declaration is refused before anything starts; Spark's own parser reads the type later. `maps` accepts
    MAP<K, V>, which the columns of Avro and Protobuf values have and JSON decoding does not."""
    try:
        rest = _check_type(ddl, maps)
    except ValueError as exc:
        return str(exc)
    return None if not rest.strip() else f"unexpected {rest.strip()!r} after the type"


def _check_type(text: str, maps: bool = False) -> str:
    """Check the type at the start of `text`; the text after it."""
    m = _TYPE.match(text)
    if not m:
        raise ValueError(f"expected a type at {text.strip()!r}" if text.strip() else "a type is missing")
    name, rest = m.group(1).upper(), text[m.end() :]
    if name in _PRIMITIVES:
        return rest
    if name in _SIZED:
        if rest.startswith("("):
            args, _, rest = rest[1:].partition(")")
            numbers = [a.strip() for a in args.split(",")]
            if not all(a.isdigit() for a in numbers) or len(numbers) > _SIZED[name]:
                raise ValueError(f"{name}({args}): expected at most {_SIZED[name]} whole number(s)")
        elif name != "DECIMAL" and name not in ("DEC", "NUMERIC"):
            raise ValueError(f"{name} needs a length, e.g. {name}(20)")
        return rest
    if name == "MAP" and not maps:
        raise ValueError("JSON decoding does not support MAP types; use a STRUCT")
    if name == "MAP":
        if not rest.lstrip().startswith("<"):
            raise ValueError("MAP needs <key, value>, e.g. MAP<STRING, INT>")
        rest = _check_type(rest.lstrip()[1:], maps)
        if not rest.lstrip().startswith(","):
            raise ValueError("MAP<...> needs a key type and a value type, e.g. MAP<STRING, INT>")
        rest = _check_type(rest.lstrip()[1:], maps)
        if not rest.lstrip().startswith(">"):
            raise ValueError("MAP<...> is not closed with '>'")
        return rest.lstrip()[1:]
    if name in ("ARRAY", "STRUCT"):
        if not rest.lstrip().startswith("<"):
            raise ValueError(f"{name} needs <...>, e.g. {name}<{'STRING' if name == 'ARRAY' else 'a: STRING'}>")
        rest = rest.lstrip()[1:]
        if name == "ARRAY":
            rest = _check_type(rest, maps)
        else:
            while True:
                field = re.match(r"\s*(`[^`]+`|[A-Za-z_][A-Za-z0-9_]*)\s*:?", rest)
                if not field:
                    raise ValueError(f"STRUCT: expected '<name>: <type>' at {rest.strip()!r}")
                rest = _check_type(rest[field.end() :], maps)
                rest = re.sub(r"^\s*NOT\s+NULL", "", rest, flags=re.I)
                rest = re.sub(r"^\s*COMMENT\s+'(?:[^'\\]|\\.)*'", "", rest, flags=re.I)
                if not rest.lstrip().startswith(","):
                    break
                rest = rest.lstrip()[1:]
        if not rest.lstrip().startswith(">"):
            raise ValueError(f"{name}<...> is not closed with '>'")
        return rest.lstrip()[1:]
    known = sorted(_PRIMITIVES | set(_SIZED) | {"ARRAY", "STRUCT"})
    close = difflib.get_close_matches(name, known, n=1)
    raise ValueError(f"unknown type {m.group(1)}" + (f" (did you mean {close[0]}?)" if close else ""))


_SIMPLE = {
    "BOOLEAN": pa.bool_(), "TINYINT": pa.int8(), "BYTE": pa.int8(), "SMALLINT": pa.int16(), "SHORT": pa.int16(),
    "INT": pa.int32(), "INTEGER": pa.int32(), "BIGINT": pa.int64(), "LONG": pa.int64(), "FLOAT": pa.float32(),
    "REAL": pa.float32(), "DOUBLE": pa.float64(), "DATE": pa.date32(), "TIMESTAMP": pa.timestamp("us", tz="UTC"),
    "TIMESTAMP_LTZ": pa.timestamp("us", tz="UTC"), "TIMESTAMP_NTZ": pa.timestamp("us"), "STRING": pa.string(),
    "BINARY": pa.binary(), "CHAR": pa.string(), "CHARACTER": pa.string(), "VARCHAR": pa.string(),
}  # fmt: skip


def _split(inner: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in inner:
        depth += ch in "<("
        depth -= ch in ">)"
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def arrow_type(ddl: str) -> pa.DataType:
    """The pyarrow type Spark's `to_arrow_schema` gives a DDL type (the ones `type_problem` accepts)."""
    text = ddl.strip()
    name = re.match(r"[A-Za-z_]+", text).group(0).upper()
    rest = text[len(name) :].strip()
    if name in ("DECIMAL", "DEC", "NUMERIC"):
        digits = [int(a) for a in rest.strip("()").split(",") if a.strip()] if rest else []
        return pa.decimal128(digits[0] if digits else 10, digits[1] if len(digits) > 1 else 0)
    if name == "ARRAY":
        return pa.list_(arrow_type(rest[1:-1]))
    if name == "MAP":
        key, value = _split(rest[1:-1])
        return pa.map_(arrow_type(key), arrow_type(value))
    if name == "STRUCT":
        fields = []
        for part in _split(rest[1:-1]):
            fname, _, ftype = part.partition(":") if ":" in part.split()[0] + " " else part.partition(" ")
            ftype = re.sub(r"\s+NOT\s+NULL\s*$|\s+COMMENT\s+'.*'$", "", ftype.strip(), flags=re.I)
            fields.append(pa.field(fname.strip().strip("`"), arrow_type(ftype)))
        return pa.struct(fields)
    return _SIMPLE[name]
