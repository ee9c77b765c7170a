"""An unreachable or failing Hub gives the clear HubConnectionError at once, not after
huggingface_hub's own retry back-off (about 25 s before the fix). Cached adapters still load with the
server gone (tests/hub/test_hub_pull.py::test_revision_pinning_and_offline_after_first_download)."""

from __future__ import annotations

import http.server
import socket
import sys
import threading

import pytest
from reliability_support import REPO

sys.path.insert(0, str(REPO / "tests" / "hub"))
from hub_test_support import assert_clean_error, run, snippet  # noqa: E402

pytestmark = pytest.mark.hub

PULL = """
import time
from bitfit_hf import BitFitAdapter
start = time.monotonic()
error = catch(BitFitAdapter.from_pretrained, "tester/some-adapter")
result = {"error": error, "seconds": time.monotonic() - start}
"""


def closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


class Failing(http.server.BaseHTTPRequestHandler):
    def _fail(self):
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = do_POST = _fail

    def log_message(self, *args):
        pass


@pytest.fixture
def failing_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_nobody_listening_fails_fast_with_the_clear_error(tmp_path):
    result = run(snippet(PULL), closed_port(), tmp_path / "home").value
    assert_clean_error(result["error"], kind="HubConnectionError", words=["cannot reach the hub", "HF_ENDPOINT"])
    assert result["seconds"] < 8, f"took {result['seconds']:.1f} s: huggingface_hub's retries were not bypassed"


def test_a_hub_answering_503_fails_fast_with_the_clear_error(tmp_path, failing_server):
    result = run(snippet(PULL), failing_server, tmp_path / "home").value
    assert_clean_error(result["error"], kind="HubConnectionError", words=["HTTP 503", "try again later"])
    assert result["seconds"] < 8, f"took {result['seconds']:.1f} s: huggingface_hub's retries were not bypassed"
