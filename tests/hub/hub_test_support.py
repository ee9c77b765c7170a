"""Shared pieces of the hub tests: the project's test Hub fixtures and a client runner.

Every scenario runs the real ``huggingface_hub`` client in a fresh subprocess whose environment
points ``HF_ENDPOINT`` at a server on 127.0.0.1 (the rule of ``tests/support/hub_server.py``); the
snippet imports :mod:`hub_client_lib` and ``bitfit_hf`` and leaves what the test checks in ``result``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

try:
    from tests.support import hub_server as hub_support
    from tests.support import olah_server as olah_support
except ImportError:  # tests/ (not the repo root) is on sys.path
    from support import hub_server as hub_support  # type: ignore[no-redef]
    from support import olah_server as olah_support  # type: ignore[no-redef]

# each name bound once, whichever spelling imported the support modules; the hub tests import them from here
DEFAULT_TOKEN, OTHER_TOKEN, HubServer = hub_support.DEFAULT_TOKEN, hub_support.OTHER_TOKEN, hub_support.HubServer
client_env, run_client = hub_support.client_env, hub_support.run_client
hf_home, hub_server, hub_server_factory = hub_support.hf_home, hub_support.hub_server, hub_support.hub_server_factory  # fixtures
olah_available, serve_with_olah = olah_support.olah_available, olah_support.serve_with_olah

HERE = Path(__file__).resolve().parent
TOKENS = (DEFAULT_TOKEN, OTHER_TOKEN)


def run(code: str, server, home, *, timeout: float = 300, expect_ok: bool = True, log_level: str = "DEBUG",
        **env_kwargs: Any):
    """Run ``code`` against ``server`` (a HubServer or an endpoint URL) with ``HF_HOME=home``.

    The client logs bitfit_hf at ``log_level`` (and everything else at INFO) so that the token check
    covers what a user would capture. Returns the ``ClientResult``; with ``expect_ok`` the snippet
    must succeed. Any token showing up in the client's output fails the test.
    """
    extra = dict(env_kwargs.pop("extra", {}) or {})
    extra["PYTHONPATH"] = os.pathsep.join([str(HERE), client_env(None, hf_home=home)["PYTHONPATH"]])
    extra.setdefault("TOKENIZERS_PARALLELISM", "false")
    extra.setdefault("OMP_NUM_THREADS", "1")
    env = client_env(server, hf_home=home, extra=extra, **env_kwargs)
    prelude = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stderr, format='%(levelname)s %(name)s %(message)s')\n"
        f"logging.getLogger('bitfit_hf').setLevel(logging.{log_level})\n"
        "from hub_client_lib import *\n"
    )
    result = run_client(prelude + code, env=env, timeout=timeout)
    for token in TOKENS:
        assert token not in result.stdout and token not in result.stderr, "a token was printed or logged"
    if expect_ok:
        result.unwrap()
    return result


def snippet(code: str, **variables: Any) -> str:
    """Prefix ``code`` with ``NAME = repr(value)`` lines."""
    return "".join(f"{name} = {value!r}\n" for name, value in variables.items()) + code


def assert_no_token_in_files(*roots) -> None:
    for root in roots:
        for folder, _dirs, names in os.walk(root):
            for name in names:
                path = os.path.join(folder, name)
                try:
                    data = Path(path).read_bytes()
                except OSError:
                    continue
                for token in TOKENS:
                    assert token.encode() not in data, f"a token was written into {path}"


def assert_clean_error(err: dict, *, kind: str, words=()) -> None:
    """A bitfit-hf Hub error of class ``kind`` whose message has ``words``, shown without a raw
    HTTP traceback (no chained huggingface_hub / httpx exception)."""
    assert err is not None, "expected an error"
    assert kind in err["mro"], err
    assert "HubError" in err["mro"] or "AdapterError" in err["mro"], err
    assert not err["chained"], err["traceback"]
    for noise in ("HfHubHTTPError", "httpx", "huggingface_hub/"):
        assert noise not in err["traceback"], err["traceback"]
    message = err["message"].lower()
    for word in words:
        assert word.lower() in message, (word, err["message"])


@pytest.fixture(scope="session")
def tiny_base_dir(tmp_path_factory) -> str:
    """One stock tiny BERT base shared by the hub tests (saved once, read by every client)."""
    import hub_client_lib

    return hub_client_lib.make_base(str(tmp_path_factory.mktemp("tiny-base") / "base"), seed=0)


@pytest.fixture(scope="session")
def other_base_dir(tmp_path_factory) -> str:
    """Same architecture, other weights: adapters trained on ``tiny_base_dir`` must be refused here."""
    import hub_client_lib

    return hub_client_lib.make_base(str(tmp_path_factory.mktemp("other-base") / "base"), seed=123)


class CuttingProxy:
    """An HTTP proxy in front of a test Hub that cuts the download of one file half-way.

    Every request is forwarded to ``upstream``; a GET of a path ending with ``cut_suffix`` gets the
    full headers but only half of the body before the connection drops, and a resumed (``Range``)
    GET of it is dropped before any response: the client's retries run out mid-file.
    """

    def __init__(self, upstream: str, cut_suffix: str = "/adapter_model.safetensors"):
        import http.server
        import threading
        import urllib.error
        import urllib.request

        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _forward(self, method: str):
                request = urllib.request.Request(upstream + self.path, method=method,
                                                 headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
                try:
                    response = urllib.request.urlopen(request, timeout=10)  # noqa: S310 - 127.0.0.1 only
                except urllib.error.HTTPError as err:
                    response = err
                body = response.read() if method != "HEAD" else b""
                return response.status if hasattr(response, "status") else response.code, response.headers, body

            def _reply(self, status, headers, body, cut=False):
                self.send_response(status)
                for key, value in headers.items():
                    if key.lower() not in ("transfer-encoding", "connection", "server", "date"):
                        self.send_header(key, value)
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body[: len(body) // 2] if cut else body)
                self.wfile.flush()
                self.close_connection = True

            def do_HEAD(self):
                self._reply(*self._forward("HEAD"))

            def do_GET(self):
                if self.path.endswith(cut_suffix):
                    proxy.cut_requests += 1
                    if self.headers.get("Range"):
                        self.close_connection = True
                        return
                    self._reply(*self._forward("GET"), cut=True)
                    return
                self._reply(*self._forward("GET"))

        self.cut_requests = 0
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
