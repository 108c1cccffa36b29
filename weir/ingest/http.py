"""`weir ingest http`: POST JSON records into topics; answered 201 only once the broker acknowledged them all.

    POST /topics/<topic>   one JSON object (application/json), or NDJSON (application/x-ndjson): one per line
    GET  /healthz          open: {"ok": true} (503 while the broker is unreachable)
    GET  /stats            the books and the producer's counters

Answers: 201 all acknowledged; 400 some records invalid (named fields; they are in `<topic>.dlq`, the valid
ones in the topic, offsets of both given); 503 + Retry-After broker unreachable, buffer full or not
acknowledged in time; 413 over the body limit; 409 a request with the same Idempotency-Key is in progress;
422 an Idempotency-Key reused for another body. The contract and every failure case: docs/ingest.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from weir import net
from weir.ingest.intake import Intake, Plan, unit_id
from weir.ingest.ledger import Ledger
from weir.ingest.producer import ACK_MARGIN_S, Acks, Backpressure, IngestProducer
from weir.ingest.progress import Books
from weir.ingest.readback import resume
from weir.kafka.log import BrokerUnavailable
from weir.net import TokenAuth

log = logging.getLogger("weir.ingest")
COUNTS = ("requests", "created", "invalid", "unavailable", "too_large", "conflict", "replayed", "resolved")
KEY = "key"  # the ledger's kind for Idempotency-Keys


def check_exposure(host: str, token: str | None) -> None:
    """Anyone who reaches the server can write into the topics: off loopback only with a token."""
    net.check_exposure(host, token, "ingest", "--token or WEIR_INGEST_TOKEN")


@dataclass
class HttpIngest:
    """The server's state: one Intake per topic, the job's ledger and books."""

    job: str
    intakes: dict[str, Intake]
    producer: IngestProducer
    ledger: Ledger
    books: Books
    client: dict[str, str]
    max_body: int = 10 << 20
    horizon_ms: int = 86_400_000
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    _keys_in_progress: set[str] = field(default_factory=set)

    def answer(self, status: int, body: dict, retry_after: int | None = None, replayed: bool = False) -> Response:
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
        if replayed:
            headers["Idempotent-Replayed"] = "true"
        name = {201: "created", 400: "invalid", 503: "unavailable", 413: "too_large", 409: "conflict"}.get(status)
        if name:
            self.counts[name] += 1
        return Response(json.dumps(body, separators=(",", ":")), status, headers, "application/json")


async def _body(request: Request, limit: int) -> bytes | None:
    """The body, or None when it is over `limit` bytes (read no further than that)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def split(body: bytes, content_type: str) -> list[bytes] | str:
    """The records of a body: NDJSON lines, a JSON array's items, or one JSON object; a string says why not."""
    if "ndjson" in content_type or "jsonl" in content_type or "json-seq" in content_type:
        return [line.strip() for line in body.split(b"\n") if line.strip()]
    text = body.strip()
    if text.startswith(b"["):
        try:
            items = json.loads(text)
        except ValueError as exc:
            return f"the body is not a JSON array: {exc}"
        return [json.dumps(item, separators=(",", ":")).encode() for item in items]
    if b"\n" in text:  # one pretty-printed object: one line, as the readers downstream parse values
        try:
            return [json.dumps(json.loads(text), separators=(",", ":")).encode()]
        except ValueError:  # not one document: NDJSON sent without its content type
            return [line.strip() for line in text.split(b"\n") if line.strip()]
    return [text] if text else []


def _placed(acks: Acks, rows: range | list[int]) -> list[Any]:
    return [list(acks.placed[r][1:]) if r in acks.placed else None for r in rows]


async def ingest(request: Request) -> Response:
    state: HttpIngest = request.app.state.ingest
    state.counts["requests"] += 1
    topic = request.path_params["topic"]
    intake = state.intakes.get(topic)
    if intake is None:
        known = sorted(state.intakes)
        return state.answer(404, {"error": f"this server does not ingest into {topic!r}", "topics": known})
    body = await _body(request, state.max_body)
    if body is None:
        return state.answer(413, {"error": f"the body is over the limit of {state.max_body} bytes"})
    values = split(body, request.headers.get("content-type", "application/json"))
    if isinstance(values, str):
        return state.answer(400, {"error": values})
    if not values:
        return state.answer(400, {"error": "the body holds no record"})
    key = request.headers.get("idempotency-key")
    try:
        state.producer.check(len(values))
    except Backpressure as exc:
        return state.answer(503, {"error": str(exc)}, exc.retry_after)
    client = request.client.host if request.client else "?"
    provenance = [("weir.ingest.client", client.encode())]
    if key is None:
        plan = intake.plan(unit_id(state.job, uuid.uuid4().hex), values, provenance)
        return await _finish(state, intake, plan, await _send(state, intake, plan), None)
    return await _keyed(state, intake, key, body, values, provenance)


async def _send(state: HttpIngest, intake: Intake, plan: Plan) -> Acks | None:
    """Produce the plan and wait for its acknowledgements, at most the producer's message timeout and a margin
    (librdkafka fails a record by then); None when they did not all come."""
    loop = asyncio.get_running_loop()
    settled = loop.create_future()

    def wake(_: Acks) -> None:  # on librdkafka's poll thread
        loop.call_soon_threadsafe(lambda: settled.done() or settled.set_result(True))

    acks = intake.send(plan, on_done=wake)
    try:
        await asyncio.wait_for(settled, state.producer.ack_timeout_s + ACK_MARGIN_S)
    except TimeoutError:
        return None
    return acks


async def _keyed(
    state: HttpIngest, intake: Intake, key: str, body: bytes, values: list[bytes], provenance: list
) -> Response:  # fmt: skip
    """At most one copy per Idempotency-Key within the horizon, across restarts (docs/ingest.md)."""
    name = f"{intake.topic}\n{key}"
    fingerprint = hashlib.sha256(body).hexdigest()
    if name in state._keys_in_progress:
        return state.answer(409, {"error": f"a request with Idempotency-Key {key!r} is in progress"}, 1)
    state._keys_in_progress.add(name)
    try:
        seen = await run_in_threadpool(state.ledger.get, KEY, name)
        fresh = seen is None or seen.at_ms < int(time.time() * 1000) - state.horizon_ms
        if not fresh and seen.fingerprint != fingerprint:
            return state.answer(422, {"error": f"Idempotency-Key {key!r} was used for another body"})
        unit = unit_id(state.job, name)
        skip: dict[int, tuple[str, int, int]] = {}
        if not fresh and seen.state == "done":
            state.counts["replayed"] += 1
            state.books.add(**{"in": seen.rows, "replayed": seen.rows})
            return state.answer(seen.answer["status"], seen.answer["body"], replayed=True)
        if not fresh:  # started and never finished: a crash, or a failed attempt; what reached the topics?
            try:
                skip = await run_in_threadpool(
                    resume, state.ledger, seen, unit, state.client, state.producer.ack_timeout_s
                )
            except BrokerUnavailable as exc:
                return state.answer(503, {"error": f"cannot check what an earlier attempt delivered: {exc}"}, 5)
            state.counts["resolved"] += 1
        else:
            since = {tp: o for tp, o in state.producer.next_offsets.items() if tp[0] in (intake.topic, intake.dlq)}
            await run_in_threadpool(state.ledger.started, KEY, name, len(values), fingerprint, since)
        plan = intake.plan(unit, values, provenance, skip=set(skip))
        if skip:
            state.books.add(**{"in": len(skip), "replayed": len(skip)})
        acks = await _send(state, intake, plan)
        if acks is not None:
            acks.placed.update(skip)
        return await _finish(state, intake, plan, acks, name)
    finally:
        state._keys_in_progress.discard(name)


async def _finish(state: HttpIngest, intake: Intake, plan: Plan, acks: Acks | None, name: str | None) -> Response:
    rows = range(plan.rows)
    if acks is None:
        return state.answer(503, {"error": f"not every record was acknowledged within {state.producer.ack_timeout_s:g}s"
                                  "; send again (with the same Idempotency-Key, nothing is doubled)"}, 5)  # fmt: skip
    if acks.failed:
        first = next(iter(acks.failed.values()))
        return state.answer(503, {
            "error": f"{len(acks.failed)} record(s) were not acknowledged, e.g. {first}", "placed": _placed(acks, rows),
        }, 5)  # fmt: skip
    status = 400 if plan.invalid else 201
    body: dict[str, Any] = {"topic": intake.topic, "records": plan.rows, "placed": _placed(acks, rows)}
    if plan.invalid:
        body["dead_letter_topic"] = intake.dlq
        body["errors"] = [i.to_json() for i in plan.invalid]
    if name is not None:
        await run_in_threadpool(state.ledger.done, KEY, name, {"status": status, "body": body})
    return state.answer(status, body)


async def healthz(request: Request) -> Response:
    state: HttpIngest = request.app.state.ingest
    down = state.producer.down_reason or state.producer.broken
    return JSONResponse({"ok": not down, "broker": down or "reachable"}, 503 if down else 200)


async def stats(request: Request) -> Response:
    state: HttpIngest = request.app.state.ingest
    totals, outputs, newest = state.books.snapshot()
    return JSONResponse({
        "job": state.job, "requests": state.counts, "books": dict(totals), "outputs": dict(outputs),
        "newest_ms": newest, "producer": {**state.producer.counts, "in_flight": state.producer.in_flight},
    })  # fmt: skip


def create_app(state: HttpIngest, token: str | None) -> ASGIApp:
    app = Starlette(routes=[
        Route("/topics/{topic}", ingest, methods=["POST"]), Route("/healthz", healthz), Route("/stats", stats),
    ])  # fmt: skip
    app.state.ingest = state
    return TokenAuth(app, token)
