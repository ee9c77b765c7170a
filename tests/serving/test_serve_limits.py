"""Bad input and load: every one gets a clear status and reason, and the server keeps serving."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import pytest
from serve_support import adapters, call, metric, predict, specs, start_server  # noqa: F401 - fixtures


@pytest.fixture
def server(adapters, start_server):  # noqa: F811
    return start_server(specs(adapters, "c0", "c1", "tag", "qa"), max_client_batch_size=4, payload_limit=2000)


BAD_INPUTS = [
    # (why, raw body, status, error_type, words in the reason)
    ("malformed JSON", b'{"inputs": "the cat", "adapter": ', 400, "invalid_json", ["malformed JSON", "line 1"]),
    ("empty body", b"", 400, "invalid_json", ["empty"]),
    ("not UTF-8", b'{"inputs": "\xff\xfe"}', 400, "invalid_json", ["UTF-8"]),
    ("not an object", b'["the cat"]', 422, "validation", ["JSON object"]),
    ("unknown adapter", b'{"inputs": "the cat", "adapter": "nope"}', 404, "not_found", ["'nope'", "c0, c1, qa, tag"]),
    ("no adapter with several served", b'{"inputs": "the cat"}', 422, "validation", ["c0, c1, qa, tag"]),
    ("no inputs", b'{"adapter": "c0"}', 422, "validation", ["no 'inputs'"]),
    ("inputs of the wrong type", b'{"inputs": 42, "adapter": "c0"}', 422, "validation", ["42"]),
    ("empty batch", b'{"inputs": [], "adapter": "c0"}', 422, "validation", ["non-empty"]),
    ("a batch item of the wrong shape", b'{"inputs": ["a", ["b", "c", "d"], "e"], "adapter": "c0"}', 422, "validation", ["inputs[1]"]),
    ("unknown field", b'{"inputs": "a", "adapter": "c0", "temperature": 1}', 422, "validation", ["temperature"]),
    ("truncate not a boolean", b'{"inputs": "a", "adapter": "c0", "truncate": "yes"}', 422, "validation", ["truncate"]),
    ("top_k not positive", b'{"inputs": "a", "adapter": "c0", "top_k": 0}', 422, "validation", ["top_k"]),
    ("a text for a QA adapter", b'{"inputs": "the cat", "adapter": "qa"}', 422, "validation", ["[question, context]"]),
    ("a pair for a tagger", b'{"inputs": [["a", "b"]], "adapter": "tag"}', 422, "validation", ["inputs[0] is a pair", "one sentence"]),
    ("no words to tag", b'{"inputs": "   ", "adapter": "tag"}', 422, "validation", ["no words"]),
    ("too many inputs", json.dumps({"inputs": [["a"]] * 5, "adapter": "c0"}).encode(), 413, "payload_too_large",
     ["5 inputs", "at most 4"]),
    ("input too long", json.dumps({"inputs": " ".join(["cat"] * 100), "adapter": "c0"}).encode(), 422, "validation",
     ["102 tokens", "at most 64", "truncate"]),
    ("body too large", json.dumps({"inputs": "cat " * 600, "adapter": "c0"}).encode(), 413, "payload_too_large",
     ["at most 2000"]),
]


@pytest.mark.parametrize("why,raw,status,error_type,words", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_gets_its_status_and_reason(server, why, raw, status, error_type, words):
    got, _, body = call(server.url, "POST", "/predict", raw=raw)
    assert got == status, body
    assert body["error_type"] == error_type
    for word in words:
        assert word in body["error"], (word, body["error"])
    assert predict(server.url, {"inputs": "the cat", "adapter": "c0"})[0] == 200  # still serving


def test_unknown_adapter_lists_the_served_ones(server):
    status, _, body = predict(server.url, {"inputs": "x", "adapter": "sst2"})
    assert status == 404 and body["adapters"] == ["c0", "c1", "qa", "tag"]


def test_chunked_body_over_the_limit_is_413(server):
    """No Content-Length (chunked transfer): the limit is enforced while reading."""
    parsed = urlparse(server.url)
    chunk = b'{"inputs": "' + b"cat " * 700 + b'", "adapter": "c0"}'
    with socket.create_connection((parsed.hostname, parsed.port), timeout=30) as sock:
        sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n0\r\n\r\n")
        reply = b""
        while b"}" not in reply:
            part = sock.recv(65536)
            if not part:
                break
            reply += part
        reply = reply.decode()
    assert reply.startswith("HTTP/1.1 413") and "payload_limit" in reply


def test_full_queue_is_503_with_retry_after_then_everything_queued_is_answered(adapters, start_server):  # noqa: F811
    server = start_server(specs(adapters, "c0", "c1"), max_queue=3, max_wait_ms=0)
    server.engine.worker.pause()
    with ThreadPoolExecutor(3) as pool:
        waiting = [pool.submit(predict, server.url, {"inputs": "the cat", "adapter": f"c{i % 2}"}) for i in range(3)]
        until = time.monotonic() + 30
        while server.engine.worker.queued < 3 and time.monotonic() < until:
            time.sleep(0.01)
        status, headers, body = predict(server.url, {"inputs": "the cat", "adapter": "c0"})
        assert status == 503 and headers["retry-after"] == "1"
        assert body["error_type"] == "overloaded" and "queue is full" in body["error"]
        text = call(server.url, "GET", "/metrics")[2]
        assert metric(text, "bitfit_serve_queue_depth", adapter="c0") == 2
        assert metric(text, "bitfit_serve_queue_depth", adapter="c1") == 1
        server.engine.worker.pause(False)
        assert [f.result()[0] for f in waiting] == [200, 200, 200]
    assert metric(call(server.url, "GET", "/metrics")[2], "bitfit_serve_queue_size") == 0


def test_request_timeout_is_504_and_the_late_job_is_dropped(adapters, start_server):  # noqa: F811
    server = start_server(specs(adapters, "c0"), request_timeout_s=0.3)
    server.engine.worker.pause()
    status, _, body = predict(server.url, {"inputs": "the cat", "adapter": "c0"})
    assert status == 504 and body["error_type"] == "timeout" and "0.3 s" in body["error"]
    batches = server.engine.worker.batches
    server.engine.config = dataclasses.replace(server.engine.config, request_timeout_s=60.0)  # a slow CI machine
    server.engine.worker.pause(False)                                                         # still answers in time
    assert predict(server.url, {"inputs": "the cat", "adapter": "c0"})[0] == 200
    text = call(server.url, "GET", "/metrics")[2]
    assert metric(text, "bitfit_serve_cancelled_total", reason="timeout") >= 1
    assert metric(text, "bitfit_serve_inputs_total", adapter="c0") == 1  # the timed-out input never ran
    assert server.engine.worker.batches >= batches + 1


def test_client_that_disconnects_mid_request_is_dropped_and_others_are_served(adapters, start_server):  # noqa: F811
    server = start_server(specs(adapters, "c0", "c1"))
    server.engine.worker.pause()
    parsed = urlparse(server.url)
    body = json.dumps({"inputs": "the cat", "adapter": "c1"}).encode()
    sock = socket.create_connection((parsed.hostname, parsed.port), timeout=30)
    sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    until = time.monotonic() + 30
    while server.engine.worker.queued < 1 and time.monotonic() < until:
        time.sleep(0.01)
    sock.close()  # the client leaves while its request waits
    time.sleep(0.3)
    server.engine.worker.pause(False)
    assert predict(server.url, {"inputs": "the cat", "adapter": "c0"})[0] == 200
    until = time.monotonic() + 10
    while time.monotonic() < until:
        text = call(server.url, "GET", "/metrics")[2]
        if metric(text, "bitfit_serve_cancelled_total", reason="client_gone") == 1:
            break
        time.sleep(0.05)
    assert metric(text, "bitfit_serve_cancelled_total", reason="client_gone") == 1
    assert metric(text, "bitfit_serve_inputs_total", adapter="c1") == 0  # its forward pass never ran
    assert metric(text, "bitfit_serve_requests_total", adapter="c1", status="499") == 1


def test_graceful_shutdown_answers_every_queued_request(adapters, start_server):  # noqa: F811
    server = start_server(specs(adapters, "c0", "c1"), max_wait_ms=0)
    server.engine.worker.pause()
    results = []

    def client(i):
        results.append(predict(server.url, {"inputs": "the cat", "adapter": f"c{i % 2}"})[0])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    until = time.monotonic() + 30
    while server.engine.worker.queued < 6 and time.monotonic() < until:
        time.sleep(0.01)
    server.server.should_exit = True  # what SIGTERM does
    time.sleep(0.2)
    with pytest.raises(OSError):  # no longer accepting
        predict(server.url, {"inputs": "the cat", "adapter": "c0"}, timeout=5)
    server.engine.worker.pause(False)
    for t in threads:
        t.join(30)
    server.thread.join(30)
    assert results == [200] * 6
    assert not server.engine.worker.alive and not server.thread.is_alive()
