"""Decode speed of the value formats, on records shaped like the peer workload's (bench/peers.py: produce).

    .venv/bin/python bench/decode.py [--records 200000] [--formats json,avro,avro-framed] [--repeat 3]

Each format encodes the same records once, then its decoder decodes them as a read task does: in chunks of
weir.kafka.read.CHUNK values, with cyclic garbage collection paused (weir.kafka.read.gc_paused). It prints
records/s of each format (the best of --repeat runs), its ratio to json, and the machine's load average before and
after, since a loaded machine slows every figure.

A format is one entry of FORMATS: name -> (encode, decoder), where encode turns the records (dicts) into values
(bytes) and decoder() makes a fresh decoder (weir.formats.base.Decoder: decode(values) -> (columns, errors)).
Protobuf and JSON Schema add theirs there.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from weir.formats import FormatSpec, value_format  # noqa: E402
from weir.formats.base import Decoder  # noqa: E402
from weir.formats.ddl import arrow_type, parse_fields  # noqa: E402
from weir.formats.jsondecode import JsonDecoder  # noqa: E402
from weir.kafka.read import CHUNK, gc_paused  # noqa: E402

# The peer workload's event (bench/peers.py: produce) and its DDL (bench/peers/weir_pipelines.py: EVENTS).
EVENTS = "id BIGINT, user STRING NOT NULL, amount DOUBLE, ts BIGINT, item STRING, country STRING, note STRING"
EVENT_AVRO = {
    "type": "record", "name": "Event", "namespace": "peers",
    "fields": [
        {"name": "id", "type": "long"}, {"name": "user", "type": "string"}, {"name": "amount", "type": "double"},
        {"name": "ts", "type": "long"}, {"name": "item", "type": "string"}, {"name": "country", "type": "string"},
        {"name": "note", "type": "string"},
    ],
}  # fmt: skip
SCHEMA_ID = 1


def events(n: int, seed: int = 7) -> list[dict]:
    """N events as bench/peers.py's produce makes them (1000 events/s, up to 200 ms of jitter)."""
    rng = random.Random(seed)
    t0 = int(time.time() * 1000) - n
    return [
        {
            "id": i, "user": f"u{rng.randrange(997):04d}", "amount": rng.randrange(1, 400) * 0.25,
            "ts": t0 + i - rng.randrange(201), "item": f"sku-{rng.randrange(100_000):06d}",
            "country": rng.choice(("FR", "DE", "US", "JP", "BR")), "note": "x" * 24,
        }
        for i in range(n)
    ]  # fmt: skip


def _columns() -> pa.Schema:
    return pa.schema([pa.field(f.name, arrow_type(f.type_ddl)) for f in parse_fields(EVENTS)])


def json_format() -> tuple[Callable[[list[dict]], list[bytes]], Callable[[], Decoder]]:
    def encode(records: list[dict]) -> list[bytes]:
        return [json.dumps(r).encode() for r in records]

    return encode, lambda: JsonDecoder(_columns(), {"user"})


def avro_format(framed: bool) -> tuple[Callable[[list[dict]], list[bytes]], Callable[[], Decoder]]:
    """Avro values encoded by weir's encoder; framed: in the Confluent wire format, the writer's schema found by
    id (in a stand-in for the registry: a real one is asked once per decoder, and then cached)."""
    spec = FormatSpec("avro", json.dumps(EVENT_AVRO))
    fmt = value_format(spec, "events")

    def encode(records: list[dict]) -> list[bytes]:
        rows = pa.array(records, pa.struct(list(_columns())))
        return fmt.encoder(SCHEMA_ID if framed else None).encode(rows).to_pylist()

    def decoder() -> Decoder:
        if not framed:
            return fmt.decoder()
        dec = value_format(FormatSpec("avro", spec.schema, registry=True), "events", {"url": "http://unused"}).decoder()
        dec._client = _OneSchema(spec.schema or "")  # the client is made lazily; this one answers without a server
        return dec

    return encode, decoder


class _OneSchema:
    """Answers SchemaRegistryClient.get_schema for SCHEMA_ID."""

    def __init__(self, text: str) -> None:
        from confluent_kafka.schema_registry import Schema

        self.schema = Schema(text, "AVRO")

    def get_schema(self, schema_id: int) -> object:
        assert schema_id == SCHEMA_ID
        return self.schema


EVENT_PROTO = """syntax = "proto3";
package peers;
message Event {
  int64 id = 1; string user = 2; double amount = 3; int64 ts = 4; string item = 5; string country = 6; string note = 7;
}
"""


def protobuf_format(framed: bool) -> tuple[Callable[[list[dict]], list[bytes]], Callable[[], Decoder]]:
    """Protobuf values encoded by weir's encoder; framed: in the Confluent wire format (schema id and message
    indexes), the writer's schema found by id in a stand-in for the registry, as avro_format's."""
    spec = FormatSpec("protobuf", EVENT_PROTO)
    fmt = value_format(spec, "events")

    def encode(records: list[dict]) -> list[bytes]:
        rows = pa.array(records, pa.struct(list(_columns())))
        return fmt.encoder(SCHEMA_ID if framed else None).encode(rows).to_pylist()

    def decoder() -> Decoder:
        if not framed:
            return fmt.decoder()
        dec = value_format(FormatSpec("protobuf", EVENT_PROTO, registry=True), "events", {"url": "http://unused"})
        dec = dec.decoder()
        from confluent_kafka.schema_registry import Schema

        stand_in = _OneSchema(EVENT_PROTO)  # the registry's client is made lazily; this one answers without a server
        stand_in.schema = Schema(EVENT_PROTO, "PROTOBUF")
        dec.registry._client = stand_in
        return dec

    return encode, decoder


EVENT_JSON_SCHEMA = {
    "type": "object", "required": ["user"],
    "properties": {
        "id": {"type": "integer"}, "user": {"type": "string"}, "amount": {"type": "number"}, "ts": {"type": "integer"},
        "item": {"type": "string"}, "country": {"type": "string"}, "note": {"type": "string"},
    },
}  # fmt: skip


def json_schema_format() -> tuple[Callable[[list[dict]], list[bytes]], Callable[[], Decoder]]:
    """JSON values checked against a JSON Schema (plain: no registry), encoded by weir's encoder."""
    fmt = value_format(FormatSpec("json-schema", json.dumps(EVENT_JSON_SCHEMA)), "events")

    def encode(records: list[dict]) -> list[bytes]:
        rows = pa.array(records, pa.struct(list(_columns())))
        return fmt.encoder(None).encode(rows).to_pylist()

    return encode, fmt.decoder


FORMATS: dict[str, Callable[[], tuple[Callable[[list[dict]], list[bytes]], Callable[[], Decoder]]]] = {
    "json": json_format,
    "avro": lambda: avro_format(framed=False),
    "avro-framed": lambda: avro_format(framed=True),
    "protobuf": lambda: protobuf_format(framed=False),
    "protobuf-framed": lambda: protobuf_format(framed=True),
    "json-schema": json_schema_format,
}


def decode_rate(decoder: Callable[[], Decoder], values: list[bytes], repeat: int) -> float:
    """Records/s of decoding `values` in read-task chunks, the best of `repeat` runs with a fresh decoder each."""
    best = 0.0
    for _ in range(repeat):
        dec = decoder()
        start = time.perf_counter()
        with gc_paused():
            for at in range(0, len(values), CHUNK):
                _, errors = dec.decode(values[at : at + CHUNK])
                if errors.null_count != len(errors):
                    raise RuntimeError(f"records did not decode: {errors.drop_null()[0]}")
        best = max(best, len(values) / (time.perf_counter() - start))
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated, of {', '.join(FORMATS)}")
    parser.add_argument("--repeat", type=int, default=3, help="runs per format; the best is shown")
    args = parser.parse_args()
    names = [n.strip() for n in args.formats.split(",") if n.strip()]
    unknown = [n for n in names if n not in FORMATS]
    if unknown:
        parser.error(f"unknown format(s) {', '.join(unknown)}; known: {', '.join(FORMATS)}")
    load_before = os.getloadavg()
    records = events(args.records)
    rates: dict[str, float] = {}
    print(f"{args.records:,} peer events, chunks of {CHUNK:,}, best of {args.repeat}")
    print(f"{'format':<14}{'bytes/record':>14}{'encode rec/s':>16}{'decode rec/s':>16}{'vs json':>10}")
    for name in names:
        encode, decoder = FORMATS[name]()
        start = time.perf_counter()
        values = encode(records)
        encode_rate = len(values) / (time.perf_counter() - start)
        rates[name] = decode_rate(decoder, values, args.repeat)
        size = sum(map(len, values)) / len(values)
        ratio = f"{rates[name] / rates['json']:.2f}x" if "json" in rates else "-"
        print(f"{name:<14}{size:>14.1f}{encode_rate:>16,.0f}{rates[name]:>16,.0f}{ratio:>10}")
    load_after = os.getloadavg()
    print(f"load average (1, 5, 15 min): before {_load(load_before)}, after {_load(load_after)}; {os.cpu_count()} CPUs")
    return 0


def _load(load: tuple[float, float, float]) -> str:
    return " ".join(f"{x:.2f}" for x in load)


if __name__ == "__main__":
    sys.exit(main())
