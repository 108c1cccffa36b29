"""The schema registry test double (tests/registry_server.py) answers as Confluent's does: through confluent_kafka's
SchemaRegistryClient, which weir uses, and through raw HTTP for the documented bodies and error codes; and its Avro
compatibility check agrees with fastavro's own schema resolution on round-tripped records."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro
import httpx2
import psycopg
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from registry_server import CONTENT_TYPE, Avro, RegistryServer, avro_read_problems, reachable_dsn

REPO = Path(__file__).resolve().parents[2]


def record(name: str, *fields: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": list(fields), **extra}


def fld(name: str, type_: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, **extra}


V1 = record("User", fld("id", "long"))
WITH_DEFAULT = record("User", fld("id", "long"), fld("email", "string", default=""))
WITHOUT_DEFAULT = record("User", fld("id", "long"), fld("email", "string"))


def avro(schema: dict[str, Any]) -> Schema:
    return Schema(json.dumps(schema), "AVRO")


@pytest.fixture
def subject() -> str:
    return f"s-{uuid.uuid4().hex[:10]}-value"


@pytest.fixture
def client(schema_registry: str) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": schema_registry})


@pytest.fixture
def http(schema_registry: str) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=schema_registry, timeout=10) as c:
        yield c


def fails_with(code: int, call: Any, *args: Any) -> SchemaRegistryError:
    with pytest.raises(SchemaRegistryError) as raised:
        call(*args)
    assert raised.value.error_code == code, raised.value
    return raised.value


def error(response: httpx2.Response, status: int, code: int) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(CONTENT_TYPE)
    assert response.json()["error_code"] == code, response.text
    return response.json()["message"]


# --- Through confluent_kafka's client ------------------------------------------------------------------------------


def test_a_registered_schema_reads_back_by_id_and_as_latest(client, schema_registry, subject):
    schema_id = client.register_schema(subject, avro(V1))
    # A fresh client: the first one answers from its cache, this one asks the server.
    fresh = SchemaRegistryClient({"url": schema_registry})
    assert json.loads(fresh.get_schema(schema_id).schema_str) == V1
    latest = fresh.get_latest_version(subject)
    assert (latest.version, latest.schema_id, latest.subject) == (1, schema_id, subject)
    assert json.loads(latest.schema.schema_str) == V1


def test_registering_the_same_schema_again_makes_no_new_version(schema_registry, subject):
    first = SchemaRegistryClient({"url": schema_registry}).register_schema(subject, avro(V1))
    # Other whitespace and key order: the same schema, so the same id and still one version.
    spaced = Schema(json.dumps(dict(reversed(V1.items())), indent=4), "AVRO")
    again = SchemaRegistryClient({"url": schema_registry}).register_schema(subject, spaced)
    assert again == first
    assert SchemaRegistryClient({"url": schema_registry}).get_versions(subject) == [1]


def test_lookup_finds_the_version_and_refuses_unknown_schemas_and_subjects(client, schema_registry, subject):
    client.register_schema(subject, avro(V1))
    schema_id = client.register_schema(subject, avro(WITH_DEFAULT))
    found = SchemaRegistryClient({"url": schema_registry}).lookup_schema(subject, avro(WITH_DEFAULT))
    assert (found.subject, found.version, found.schema_id) == (subject, 2, schema_id)
    fails_with(40403, client.lookup_schema, subject, avro(record("Other", fld("x", "int"))))
    fails_with(40401, client.lookup_schema, f"{subject}-missing", avro(V1))


def test_backward_accepts_a_field_added_with_a_default_and_refuses_one_without(client, subject):
    client.register_schema(subject, avro(V1))
    assert client.test_compatibility(subject, avro(WITH_DEFAULT)) is True
    assert client.test_compatibility(subject, avro(WITHOUT_DEFAULT)) is False
    second = client.register_schema(subject, avro(WITH_DEFAULT))
    refused = fails_with(
        409, client.register_schema, subject, avro(record("User", fld("id", "long"), fld("age", "int")))
    )
    assert refused.http_status_code == 409
    assert "'age'" in refused.error_message and "READER_FIELD_MISSING_DEFAULT_VALUE" in refused.error_message
    latest = client.get_latest_version(subject)
    assert (latest.version, latest.schema_id) == (2, second)


def test_backward_transitive_checks_every_earlier_version(client, subject):
    # v3 reads v2's data (it has email) but not v1's (no email, and v3 gives no default): only BACKWARD allows it.
    plain, transitive = f"{subject}-plain", f"{subject}-transitive"
    client.set_compatibility(plain, "BACKWARD")
    client.set_compatibility(transitive, "BACKWARD_TRANSITIVE")
    for name in (plain, transitive):
        client.register_schema(name, avro(V1))
        client.register_schema(name, avro(WITH_DEFAULT))
    assert client.test_compatibility(transitive, avro(WITHOUT_DEFAULT)) is False
    assert client.test_compatibility(transitive, avro(WITHOUT_DEFAULT), version=2) is True
    refused = fails_with(409, client.register_schema, transitive, avro(WITHOUT_DEFAULT))
    assert "version 1" in refused.error_message and "'email'" in refused.error_message
    client.register_schema(plain, avro(WITHOUT_DEFAULT))
    assert client.get_latest_version(plain).version == 3


def test_forward_and_full_check_the_other_direction(client, subject):
    forward, full = f"{subject}-forward", f"{subject}-full"
    client.set_compatibility(forward, "FORWARD")
    client.set_compatibility(full, "FULL")
    for name in (forward, full):
        client.register_schema(name, avro(WITH_DEFAULT))
    # FORWARD: the old schema reads the new data. Dropping email is fine (the old schema has its default), dropping
    # id is not (it has none).
    assert client.test_compatibility(forward, avro(V1)) is True
    assert client.test_compatibility(forward, avro(record("User", fld("email", "string")))) is False
    # Adding a field without default: new readers fail on old data (FULL) while old readers skip it (FORWARD).
    wider = avro(record("User", fld("id", "long"), fld("email", "string", default=""), fld("age", "int")))
    assert client.test_compatibility(forward, wider) is True
    assert client.test_compatibility(full, wider) is False


def test_the_same_schema_under_two_subjects_has_one_id(client, http, subject):
    unique = record(f"U{uuid.uuid4().hex}", fld("id", "long"))  # the session's other tests use V1 too
    first = client.register_schema(f"{subject}-a", avro(unique))
    second = client.register_schema(f"{subject}-b", avro(unique))
    assert first == second
    assert http.get(f"/schemas/ids/{first}/versions").json() == [
        {"subject": f"{subject}-a", "version": 1},
        {"subject": f"{subject}-b", "version": 1},
    ]
    other = client.register_schema(f"{subject}-a", avro({**unique, "doc": "another schema: another id"}))
    assert other != first


def test_subject_compatibility_is_set_read_and_absent_until_set(client, http, subject):
    assert client.set_compatibility(subject, "full") == {"compatibility": "FULL"}
    assert client.get_compatibility(subject) == "FULL"
    error(http.get(f"/config/{subject}-unset"), 404, 40408)
    assert http.get(f"/config/{subject}-unset", params={"defaultToGlobal": "true"}).json() == {
        "compatibilityLevel": "BACKWARD"
    }
    error(http.put(f"/config/{subject}", json={"compatibility": "SIDEWAYS"}), 422, 42203)
    assert client.get_compatibility(subject) == "FULL"


def test_delete_subject_soft_then_permanent(client, http, schema_registry, subject):
    client.register_schema(subject, avro(V1))
    client.register_schema(subject, avro(WITH_DEFAULT))
    error(http.delete(f"/subjects/{subject}", params={"permanent": "true"}), 404, 40405)
    assert client.delete_subject(subject) == [1, 2]
    fails_with(40401, SchemaRegistryClient({"url": schema_registry}).get_latest_version, subject)
    assert subject not in client.get_subjects()
    assert subject in http.get("/subjects", params={"deleted": "true"}).json()
    # Version numbers go on after a soft delete (a fresh client: the first would answer from its cache).
    SchemaRegistryClient({"url": schema_registry}).register_schema(subject, avro(V1))
    assert SchemaRegistryClient({"url": schema_registry}).get_latest_version(subject).version == 3
    assert client.delete_subject(subject) == [3]
    assert client.delete_subject(subject, permanent=True) == [1, 2, 3]
    assert subject not in http.get("/subjects", params={"deleted": "true"}).json()


def test_delete_one_version(client, http, subject):
    client.register_schema(subject, avro(V1))
    client.register_schema(subject, avro(WITH_DEFAULT))
    assert http.delete(f"/subjects/{subject}/versions/latest").json() == 2
    assert http.get(f"/subjects/{subject}/versions").json() == [1]
    error(http.delete(f"/subjects/{subject}/versions/2"), 404, 40406)
    error(http.delete(f"/subjects/{subject}/versions/1", params={"permanent": "true"}), 404, 40407)
    assert http.delete(f"/subjects/{subject}/versions/2", params={"permanent": "true"}).json() == 2
    error(http.get(f"/subjects/{subject}/versions/2", params={"deleted": "true"}), 404, 40402)


# --- Through raw HTTP ----------------------------------------------------------------------------------------------


def test_the_documented_bodies(http, subject):
    body = {"schema": json.dumps(V1)}
    registered = http.post(f"/subjects/{subject}/versions", json=body)
    assert registered.status_code == 200 and registered.headers["content-type"].startswith(CONTENT_TYPE)
    schema_id = registered.json()["id"]
    assert registered.json() == {"id": schema_id}
    canonical = json.dumps(V1, separators=(",", ":"))  # compact, its keys in the order they came
    # AVRO: no schemaType field, as Confluent answers.
    expected = {"subject": subject, "id": schema_id, "version": 1, "schema": canonical}
    assert http.get(f"/subjects/{subject}/versions/1").json() == expected
    assert http.get(f"/subjects/{subject}/versions/latest").json() == expected
    assert http.get(f"/subjects/{subject}/versions/1/schema").json() == V1
    assert http.get(f"/subjects/{subject}/versions").json() == [1]
    assert http.get(f"/schemas/ids/{schema_id}").json() == {"schema": canonical}
    assert http.post(f"/subjects/{subject}", json=body).json() == expected
    assert http.get("/schemas/types").json() == ["JSON", "PROTOBUF", "AVRO"]
    assert subject in http.get("/subjects").json()


def test_the_vendor_media_type_is_accepted_and_other_types_are_not(http, subject):
    content = json.dumps({"schema": json.dumps(V1)})
    vendor = http.post(f"/subjects/{subject}/versions", content=content, headers={"content-type": CONTENT_TYPE})
    assert vendor.status_code == 200, vendor.text
    error(http.post(f"/subjects/{subject}/versions", content=content, headers={"content-type": "text/plain"}), 415, 415)


def test_error_codes(http, subject):
    http.post(f"/subjects/{subject}/versions", json={"schema": json.dumps(V1)}).raise_for_status()
    assert "not found" in error(http.get(f"/subjects/{subject}-missing/versions"), 404, 40401)
    assert "Version 7" in error(http.get(f"/subjects/{subject}/versions/7"), 404, 40402)
    error(http.get("/schemas/ids/987654"), 404, 40403)
    error(http.post(f"/subjects/{subject}", json={"schema": json.dumps(WITH_DEFAULT)}), 404, 40403)
    for bad in ("0", "-2", "first", "2147483648"):
        assert "not a valid version" in error(http.get(f"/subjects/{subject}/versions/{bad}"), 422, 42202)
    refused = error(http.post(f"/subjects/{subject}/versions", json={"schema": json.dumps(WITHOUT_DEFAULT)}), 409, 409)
    assert "'email'" in refused
    verbose = http.post(f"/compatibility/subjects/{subject}/versions/latest", params={"verbose": "true"},
                        json={"schema": json.dumps(WITHOUT_DEFAULT)})  # fmt: skip
    assert verbose.json()["is_compatible"] is False and "'email'" in verbose.json()["messages"][0]


def test_invalid_schemas_are_42201_with_the_parsers_message(http, subject):
    unknown_type = json.dumps(record("User", fld("id", "lnog")))
    assert "lnog" in error(http.post(f"/subjects/{subject}/versions", json={"schema": unknown_type}), 422, 42201)
    assert "JSON" in error(http.post(f"/subjects/{subject}/versions", json={"schema": "{nope"}), 422, 42201)
    bad_default = json.dumps(record("User", fld("id", "long", default="x")))
    error(http.post(f"/subjects/{subject}/versions", json={"schema": bad_default}), 422, 42201)
    error(http.post(f"/subjects/{subject}/versions", json={"schema": "{", "schemaType": "JSON"}), 422, 42201)
    no_message = {"schema": 'syntax = "proto3";', "schemaType": "PROTOBUF"}
    error(http.post(f"/subjects/{subject}/versions", json=no_message), 422, 42201)
    error(http.post(f"/subjects/{subject}/versions", json={"schema": "x", "schemaType": "XML"}), 422, 42201)
    assert http.get(f"/subjects/{subject}/versions").status_code == 404  # nothing was registered


def test_protobuf_and_json_schemas_register_without_a_compatibility_check(http, subject):
    proto = {"schema": 'syntax = "proto3";\nmessage A { string x = 1; }', "schemaType": "PROTOBUF"}
    first = http.post(f"/subjects/{subject}-p/versions", json=proto).json()["id"]
    changed = {"schema": 'syntax = "proto3";\nmessage A { int64 x = 1; }', "schemaType": "PROTOBUF"}
    assert http.post(f"/subjects/{subject}-p/versions", json=changed).json()["id"] != first
    latest = http.get(f"/subjects/{subject}-p/versions/latest").json()
    assert (latest["version"], latest["schemaType"]) == (2, "PROTOBUF")
    json_schema = {"schema": '{"type": "object"}', "schemaType": "JSON"}
    schema_id = http.post(f"/subjects/{subject}-j/versions", json=json_schema).json()["id"]
    assert http.get(f"/schemas/ids/{schema_id}").json() == {"schema": '{"type":"object"}', "schemaType": "JSON"}
    # Another type under a subject is incompatible unless the level is NONE.
    error(http.post(f"/subjects/{subject}-j/versions", json={"schema": json.dumps(V1)}), 409, 409)


def test_avro_references_define_named_types(http, subject):
    address = record("Address", fld("city", "string"), namespace="shop")
    http.post(f"/subjects/{subject}-address/versions", json={"schema": json.dumps(address)}).raise_for_status()
    ref = {"name": "shop.Address", "subject": f"{subject}-address", "version": 1}
    user = json.dumps(record("User", fld("home", "shop.Address"), namespace="shop"))
    error(http.post(f"/subjects/{subject}/versions", json={"schema": user}), 422, 42201)  # unknown without it
    registered = http.post(f"/subjects/{subject}/versions", json={"schema": user, "references": [ref]})
    assert registered.status_code == 200, registered.text
    assert http.get(f"/subjects/{subject}/versions/1").json()["references"] == [ref]


def test_the_global_level_and_its_default(subject):
    with RegistryServer() as registry, httpx2.Client(base_url=registry.url) as http:  # its own: global state
        assert http.get("/config").json() == {"compatibilityLevel": "BACKWARD"}
        assert http.put("/config", json={"compatibility": "NONE"}).json() == {"compatibility": "NONE"}
        assert http.get("/config").json() == {"compatibilityLevel": "NONE"}
        http.post(f"/subjects/{subject}/versions", json={"schema": json.dumps(V1)}).raise_for_status()
        assert (
            http.post(f"/subjects/{subject}/versions", json={"schema": json.dumps(WITHOUT_DEFAULT)}).status_code == 200
        )


def test_basic_auth_refuses_requests_without_the_credentials(subject):
    with RegistryServer(user="alice", password="s3cret") as registry:
        assert error(httpx2.get(f"{registry.url}/subjects"), 401, 401) == "Unauthorized"
        error(httpx2.get(f"{registry.url}/subjects", auth=("alice", "wrong")), 401, 401)
        refused = fails_with(401, SchemaRegistryClient({"url": registry.url}).get_subjects)
        assert refused.http_status_code == 401
        allowed = SchemaRegistryClient({"url": registry.url, "basic.auth.user.info": "alice:s3cret"})
        schema_id = allowed.register_schema(subject, avro(V1))
        assert httpx2.get(f"{registry.url}/schemas/ids/{schema_id}", auth=("alice", "s3cret")).status_code == 200


def _schemas_named(name: str) -> list[str]:
    with psycopg.connect(reachable_dsn()) as conn:
        return [row[0] for row in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname = %s", (name,))]


def test_stopping_drops_the_postgresql_schema():
    registry = RegistryServer().start()
    assert _schemas_named(registry.schema) == [registry.schema]
    registry.stop()
    assert _schemas_named(registry.schema) == []


def test_python_m_runs_it_in_the_foreground_until_sigterm(subject):
    schema = f"registry_test_{uuid.uuid4().hex[:8]}"
    argv = [sys.executable, "-m", "tests.registry_server", "--port", "0", "--schema", schema]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # it says where it listens once it is about to serve
        if not line:
            pytest.fail(f"python -m tests.registry_server ended without serving: {proc.communicate(timeout=20)[1]}")
        url = line.split(" on ")[1].split()[0]
        registry = SchemaRegistryClient({"url": url})
        assert registry.get_subjects() == []  # a fresh schema: nothing registered yet
        assert registry.register_schema(subject, avro(V1)) == 1
        assert _schemas_named(schema) == [schema]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert _schemas_named(schema) == []


# --- The Avro check against fastavro's resolution ------------------------------------------------------------------

E3 = {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}
E2 = {"type": "enum", "name": "E", "symbols": ["A", "B"]}
INNER = record("Inner", fld("x", "int"))


def one(type_: Any) -> dict[str, Any]:
    """A record of one field `a` of `type_`."""
    return record("R", fld("a", type_))


def array(items: Any) -> dict[str, Any]:
    return {"type": "array", "items": items}


def fixed(size: int) -> dict[str, Any]:
    return {"type": "fixed", "name": "F", "size": size}


# (writer, reader, readable?) by the Avro specification's resolution rules.
CASES = [
    (V1, WITH_DEFAULT, True),
    (V1, WITHOUT_DEFAULT, False),
    (WITHOUT_DEFAULT, V1, True),  # a field the reader lacks is skipped
    (one("int"), one("long"), True),
    (one("int"), one("double"), True),
    (one("long"), one("float"), True),
    (one("float"), one("double"), True),
    (one("long"), one("int"), False),
    (one("double"), one("float"), False),
    (one("string"), one("bytes"), True),
    (one("bytes"), one("string"), True),
    (one("string"), one("int"), False),
    (one("string"), one(["null", "string"]), True),
    (one(["null", "string"]), one("string"), False),
    (one(["null", "int"]), one(["null", "long"]), True),
    (one(["null", "int", "string"]), one(["null", "int"]), False),
    (one(E2), one(E3), True),
    (one(E3), one(E2), False),
    (one(E3), one({**E2, "default": "A"}), True),
    (one(INNER), one(record("Inner", fld("x", "int"), fld("y", "int"))), False),
    (one(INNER), one(record("Inner", fld("x", "int"), fld("y", "int", default=0))), True),
    (record("R", fld("a", INNER), fld("b", "Inner")), record("R", fld("a", INNER), fld("b", "Inner")), True),
    (one(["null", INNER]), one(["null", record("Inner", fld("x", "long"))]), True),
    (one(array("int")), one(array("long")), True),
    (one(array("long")), one(array("int")), False),
    (one({"type": "map", "values": "string"}), one({"type": "map", "values": "int"}), False),
    (one(fixed(4)), one(fixed(4)), True),
    (one(fixed(4)), one(fixed(8)), False),
    (one("int"), record("Renamed", fld("a", "int")), False),
    (one("int"), record("Renamed", fld("a", "int"), aliases=["R"]), True),
    (one("int"), record("R", fld("b", "int", aliases=["a"])), True),
    (record("R", fld("a", "int"), namespace="old"), record("R", fld("a", "int"), namespace="new"), True),
]


def samples(schema: Any, names: dict[str, Any]) -> list[Any]:
    """Values of a parsed schema: one per union branch and enum symbol, the first a record's others vary from, so
    every way the writer may have written is read back."""
    schema = names.get(schema, schema) if isinstance(schema, str) else schema
    if isinstance(schema, list):
        return [value for branch in schema for value in samples(branch, names)]
    kind = schema if isinstance(schema, str) else schema["type"]
    simple = {"null": None, "boolean": True, "int": 7, "long": 7, "float": 1.5, "double": 1.5, "bytes": b"b",
              "string": "s"}  # fmt: skip
    if kind in simple:
        return [simple[kind]]
    if kind == "enum":
        return list(schema["symbols"])
    if kind == "fixed":
        return [b"\x01" * schema["size"]]
    if kind in ("array", "map"):
        inner = samples(schema["items" if kind == "array" else "values"], names)
        return [[v] for v in inner] if kind == "array" else [{"k": v} for v in inner]
    fields = {f["name"]: samples(f["type"], names) for f in schema["fields"]}
    base = {name: values[0] for name, values in fields.items()}
    return [base] + [{**base, name: value} for name, values in fields.items() for value in values[1:]]


def round_trips(writer: Any, reader: Any) -> bool:
    """Whether fastavro reads every sample written with `writer` under `reader`."""
    named: dict[str, Any] = {}
    parsed = fastavro.parse_schema(writer, named_schemas=named)
    for value in samples(parsed, named):
        out = io.BytesIO()
        fastavro.schemaless_writer(out, writer, value)
        out.seek(0)
        try:
            fastavro.schemaless_reader(out, writer, reader_schema=reader)
        except fastavro.read.SchemaResolutionError:
            return False
    return True


@pytest.mark.parametrize(("writer", "reader", "readable"), CASES)
def test_the_avro_check_follows_the_resolution_rules_and_agrees_with_fastavro(writer, reader, readable):
    problems = avro_read_problems(Avro.parse(writer), Avro.parse(reader))
    assert (not problems) is readable, problems
    assert round_trips(writer, reader) is readable


def test_a_recursive_type_is_checked_without_looping():
    node = record("Node", fld("v", "int"), fld("next", ["null", "Node"], default=None))
    wider = record("Node", fld("v", "long"), fld("next", ["null", "Node"], default=None))
    narrower = record("Node", fld("v", "int"), fld("next", ["null", "Node"], default=None), fld("w", "int"))
    assert avro_read_problems(Avro.parse(node), Avro.parse(wider)) == []
    problems = avro_read_problems(Avro.parse(node), Avro.parse(narrower))
    assert len(problems) == 1 and "'w'" in problems[0]
