"""Fixtures of the serving tests: tiny adapters on disk, and real servers on ephemeral ports. Test modules
import the fixtures by name (no conftest here: tests/conftest.py is the only one, imported as `conftest`)."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import threading
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlparse

import pytest
from tiny import make_adapter, save_base

ADMIN_TOKEN = "test-admin-token-0123456789"


@pytest.fixture(scope="session")
def adapters(tmp_path_factory) -> Dict[str, str]:
    """``{name: folder}``: three classification adapters (2, 3, 5 labels), a tagger, a QA adapter, an
    AdapterBias one (mixed with the rest), all on one tiny base (``"base"``)."""
    from bitfit_hf.tuners.adapterbias import AdapterBiasConfig

    root = tmp_path_factory.mktemp("serving")
    base = save_base(str(root / "base"))
    found = {"base": base}
    for i, labels in enumerate([2, 3, 5]):
        found[f"c{i}"] = make_adapter(base, str(root / f"c{i}"), labels, seed=i + 1)
    found["tag"] = make_adapter(base, str(root / "tag"), 4, seed=7, head="tok")
    found["qa"] = make_adapter(base, str(root / "qa"), seed=8, head="qa")
    found["ab"] = make_adapter(base, str(root / "ab"), 2, seed=9, method_config=AdapterBiasConfig())
    other = save_base(str(root / "other_base"), seed=5)  # same architecture, other weights
    found["other"] = make_adapter(other, str(root / "other"), 2, seed=11)
    return found


def specs(adapters: Dict[str, str], *names: str):
    from bitfit_hf.serving.config import AdapterSpec

    return [AdapterSpec(n, adapters[n]) for n in names]


@pytest.fixture
def start_server():
    """``start_server(specs, **ServeConfig fields)`` -> a started BackgroundServer, stopped after the test."""
    from bitfit_hf.serving.config import ServeConfig
    from bitfit_hf.serving.engine import Engine
    from bitfit_hf.serving.server import BackgroundServer

    started = []

    def start(adapter_specs, admin_token: Optional[str] = None, **config):
        engine = Engine.create(adapter_specs, ServeConfig(**config), admin_token=admin_token, start=False)
        server = BackgroundServer(engine).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.engine.worker.pause(False)
        server.stop()


def call(url: str, method: str, path: str, body: Any = None, headers: Optional[Dict[str, str]] = None,
         raw: Optional[bytes] = None, timeout: float = 60) -> Tuple[int, Dict[str, str], Any]:
    """One HTTP request on a new connection: ``(status, headers, JSON or text)``."""
    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=timeout)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    try:
        conn.request(method, path, body=data, headers=all_headers)
        response = conn.getresponse()
        payload = response.read()
        found = {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()
    try:
        decoded = json.loads(payload)
    except ValueError:
        decoded = payload.decode("utf-8", "replace")
    return response.status, found, decoded


def predict(url: str, body: Any, **kwargs):
    return call(url, "POST", "/predict", body, **kwargs)


def metric(text: str, name: str, **labels) -> float:
    """The value of one Prometheus sample in ``/metrics`` text (0.0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key == (f"{name}{{{want}}}" if want else name):
            return float(value)
    return 0.0


def start_cli(*serve_args: str, drop_env: Tuple[str, ...] = ()) -> Tuple[subprocess.Popen, str, List[str]]:
    """``bitfit-hf serve *serve_args`` as a process (one torch thread); ``(process, url, stderr lines so far and
    to come)`` once it says where it listens."""
    env = {k: v for k, v in os.environ.items() if k not in drop_env}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    command = [sys.executable, "-m", "bitfit_hf.cli", "serve", "--port", "0", "--log-level", "warning", *serve_args]
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: List[str] = []
    for line in server.stderr:
        lines.append(line)
        found = re.search(r"listening on (http://\S+)", line)
        if found:
            threading.Thread(target=lambda: lines.extend(server.stderr), daemon=True).start()  # keep the pipe drained
            return server, found.group(1), lines
    server.wait(60)
    raise AssertionError(f"serve {' '.join(serve_args[:4])} did not start:\n" + "".join(lines[-30:]))
