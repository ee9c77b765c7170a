"""The HTTP routes (FastAPI), in the shape of text-embeddings-inference plus an ``adapter`` field.

``POST /predict``, ``GET /adapters``, ``GET /health``, ``GET /info``, ``GET /metrics``, and the admin routes
``POST /admin/adapters`` / ``DELETE /admin/adapters/{name}`` (``Authorization: Bearer $BITFIT_HF_ADMIN_TOKEN``).
Errors answer ``{"error": "...", "error_type": "..."}`` with the status that says what happened: 400
malformed JSON, 404 unknown adapter (naming the served ones), 413 body or batch too large, 422 invalid
input, 499 (logged only) client gone, 503 queue full or shutting down, 504 timed out. Every 503 carries
``Retry-After``: each says "try again", here or on another replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from bitfit_hf.serving.engine import Engine, settle_future
from bitfit_hf.serving.tasks import InputError

logger = logging.getLogger(__name__)


def _error(err: InputError, retry_after_s: int = 1) -> JSONResponse:
    body = {"error": err.message, "error_type": err.error_type}
    headers = err.extra.pop("headers", None) if err.extra else None
    if err.status == 503:
        headers = {"Retry-After": str(retry_after_s), **(headers or {})}
    body.update(err.extra or {})
    return JSONResponse(body, status_code=err.status, headers=headers)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise InputError(413, f"the body is {int(declared)} bytes; this server takes at most {limit} (payload_limit).",
                         "payload_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise InputError(413, f"the body is over {limit} bytes (payload_limit).", "payload_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def _parse_json(raw: bytes) -> Any:
    if not raw.strip():
        raise InputError(400, "the body is empty; send JSON {\"inputs\": ..., \"adapter\": \"<name>\"}.", "invalid_json")
    try:
        return json.loads(raw)
    except UnicodeDecodeError:
        raise InputError(400, "the body is not UTF-8 text.", "invalid_json") from None
    except json.JSONDecodeError as err:
        raise InputError(400, f"malformed JSON: {err.msg} at line {err.lineno} column {err.colno}.", "invalid_json") from None


def create_app(engine: Engine, drain_timeout: Optional[float] = None) -> FastAPI:
    """The FastAPI application over ``engine``; its shutdown drains the queue and stops the worker."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if not engine.worker.alive and not engine.worker.draining:
            engine.worker.start()
        yield
        stopped = await asyncio.to_thread(engine.close, drain_timeout)  # answers every queued request first
        left = engine.worker.queued
        logger.info("bitfit-hf serve: stopped%s", " after answering every queued request" if stopped and not left
                    else f"; {left} queued request(s) not answered within --graceful-timeout")

    app = FastAPI(title="bitfit-hf serve", version=engine.info()["version"], lifespan=lifespan,
                  description="Many BitFit task adapters on one frozen base, with mixed-task dynamic batching.")
    app.state.engine = engine
    metrics = engine.metrics
    error = lambda err: _error(err, engine.config.retry_after_s)

    @app.post("/predict")
    async def predict(request: Request):
        began = time.monotonic()
        labels = ["unknown"]
        try:
            body = _parse_json(await _read_body(request, engine.config.payload_limit))
            entries, parsed, encoded, options, several = await engine.prepare_off_loop(body)
            labels = [e.name for e in entries]
            outputs = await _run(engine, request, entries, encoded, began)
            answers = [engine.answer(e, parsed, encoded, out, options) for e, out in zip(entries, outputs)]
            response = JSONResponse({e.name: a for e, a in zip(entries, answers)} if several else answers[0])
        except InputError as err:
            labels = [err.adapter] if err.adapter else (["unknown"] if err.status == 404 else labels)
            response = error(err)
        for label in labels:
            metrics.requests.labels(label, str(response.status_code)).inc()
            if response.status_code == 200:
                metrics.latency.labels(label).observe(time.monotonic() - began)
        return response

    @app.get("/adapters")
    async def adapters():
        return engine.adapters()

    @app.get("/health")
    async def health():
        if engine.healthy():
            return {"status": "ok", "adapters": len(engine.registry.entries), "queued": engine.worker.queued}
        return JSONResponse({"status": "unavailable", "error": "the worker is stopped or the server is shutting down."},
                            status_code=503)

    @app.get("/info")
    async def info():
        return engine.info()

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.post("/admin/adapters", status_code=201)
    async def add_adapter(request: Request):
        refused = engine.check_token(request.headers.get("authorization"))
        if refused is not None:
            return error(refused)
        try:
            body = _parse_json(await _read_body(request, 64_000))
            if not isinstance(body, dict) or not isinstance(body.get("name"), str) or not isinstance(body.get("source"), str):
                raise InputError(422, "send {\"name\": \"<name>\", \"source\": \"<folder or Hub id>\", \"revision\": optional}.")
            revision = body.get("revision")
            if revision is not None and not isinstance(revision, str):
                raise InputError(422, "'revision' is a branch, tag or commit (a string).")
            described = await engine.add(body["name"], body["source"], revision)
        except InputError as err:
            return error(err)
        logger.warning("bitfit-hf serve: adapter %r added from %s", body["name"], body["source"])
        return JSONResponse(described, status_code=201)

    @app.delete("/admin/adapters/{name}")
    async def remove_adapter(name: str, request: Request):
        refused = engine.check_token(request.headers.get("authorization"))
        if refused is not None:
            return error(refused)
        try:
            await engine.remove(name)
        except InputError as err:
            return error(err)
        logger.warning("bitfit-hf serve: adapter %r removed", name)
        return {"removed": name, "adapters": sorted(engine.registry.entries)}

    return app


async def _run(engine: Engine, request: Request, entries, encoded, began: float) -> list:
    """Queue the inputs once per adapter, together (so they share forward passes), and wait for every adapter's
    outputs, the request's time limit, or the client leaving."""
    loop = asyncio.get_running_loop()
    deadline = began + engine.config.request_timeout_s
    futures, jobs = [], []
    for entry in entries:
        future = loop.create_future()

        def done(result, error, future=future):
            loop.call_soon_threadsafe(settle_future, future, result, error)

        try:
            jobs.append(engine.submit(entry, encoded, done, deadline=deadline))
        except InputError:
            for job in jobs:
                job.cancelled = True
            raise
        futures.append(future)
    every = asyncio.gather(*futures)
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        finished, _ = await asyncio.wait({every, gone}, timeout=max(0.0, deadline - time.monotonic()),
                                         return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if every in finished:
        return every.result()  # an InputError (e.g. removed while queued) raises here
    for job in jobs:
        job.cancelled = True
    every.cancel()  # the worker's late answers (a 499 / 504 of their own) are then dropped, not left unread
    if gone in finished:
        logger.info("bitfit-hf serve: client left before its answer (adapter(s) %s)", ", ".join(e.name for e in entries))
        raise InputError(499, "the client closed the connection.", "cancelled")
    engine.metrics.cancelled.labels("timeout").inc()
    raise InputError(504, f"no answer within {engine.config.request_timeout_s} s (request_timeout); the server is "
                          "busy or the batch is large.", "timeout")


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the body has been read: the next ASGI message is the disconnect)."""
    while True:
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            return
