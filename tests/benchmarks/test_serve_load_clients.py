"""serve_load.py's closed loop sends exactly the requests asked for, in one process or spread over several, and
counts every answer that is not 200 (a plain HTTP server on loopback stands in for `bitfit-hf serve`)."""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def serve_load():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))  # the script imports its sibling report.py
    try:
        yield importlib.import_module("serve_load")
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))


@pytest.fixture()
def answering():
    """A server that answers /predict with 200, or 503 for the adapter "down"; it counts what it was sent."""
    seen = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the clients expect

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                seen.append(body)
            payload = b"[]"
            self.send_response(503 if body["adapter"] == "down" else 200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield SimpleNamespace(host="127.0.0.1", port=server.server_address[1]), seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("procs", [1, 3])
def test_exactly_the_requests_asked_for(serve_load, answering, procs):
    target, seen = answering
    result = serve_load.closed_loop(target, ["a", "b"], ["one sentence.", "another one."], clients=5, requests=37,
                                    seed=0, procs=procs)
    assert result["requests"] == 37 == len(seen) and result["failed"] == 0
    assert {body["adapter"] for body in seen} == {"a", "b"} and result["rps"] > 0
    assert result["p50_ms"] <= result["p99_ms"] and 0.0 <= result["client_busy"]


def test_failures_are_counted_across_processes(serve_load, answering):
    target, seen = answering
    result = serve_load.closed_loop([target, target], ["down"], ["x."], clients=4, requests=10, seed=1, procs=2)
    assert result["requests"] == 10 and result["failed"] == 10 and result["failures"][0].startswith("503")
