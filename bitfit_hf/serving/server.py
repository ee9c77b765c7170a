"""Running the app under uvicorn: in the foreground (``bitfit-hf serve``) or in a background thread
(notebooks, tests). Both bind the socket first, so port 0 (any free port) reports the port it got.

SIGTERM is how process supervisors (systemd, Kubernetes, Docker) ask for a stop: the server drains its queue
and the process exits with status 0, a clean stop, where uvicorn alone re-raises the signal once it has shut
down (status 143, recorded as a failure). Ctrl-C (SIGINT) keeps uvicorn's behaviour.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Callable, Optional

import uvicorn

from bitfit_hf.serving.app import create_app
from bitfit_hf.serving.engine import Engine
from bitfit_hf.serving.listening import bind, url_of


class DrainingServer(uvicorn.Server):
    """uvicorn's server, except that SIGTERM stops it as a request to stop, not as a fatal signal."""

    def handle_exit(self, sig, frame) -> None:
        if sig == signal.SIGTERM:
            self.should_exit = True  # drain and return from run(); not re-raised after shutdown
            return
        super().handle_exit(sig, frame)


def _config(app, log_level: str, access_log: bool, graceful_timeout: Optional[float]):
    return uvicorn.Config(app, log_level=log_level, access_log=access_log, lifespan="on",
                          timeout_graceful_shutdown=int(graceful_timeout) if graceful_timeout else None,
                          timeout_keep_alive=30)


def serve_forever(engine: Engine, host: str = "127.0.0.1", port: int = 8080, log_level: str = "info",
                  access_log: bool = False, graceful_timeout: Optional[float] = None,
                  on_ready: Optional[Callable[[str], None]] = None) -> None:
    """Serve until SIGINT / SIGTERM; then stop accepting, answer every request already taken, and return
    (after SIGTERM the caller exits 0)."""
    sock = bind(host, port)
    app = create_app(engine, drain_timeout=graceful_timeout)
    server = DrainingServer(_config(app, log_level, access_log, graceful_timeout))
    if on_ready is not None:
        on_ready(url_of(sock))
    server.run(sockets=[sock])


class BackgroundServer:
    """``with BackgroundServer(engine) as server: requests.post(server.url + "/predict", ...)``."""

    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
                 graceful_timeout: Optional[float] = None):
        self.engine = engine
        self.sock = bind(host, port)
        self.url = url_of(self.sock)
        self.app = create_app(engine, drain_timeout=graceful_timeout)
        self.server = DrainingServer(_config(self.app, log_level, False, graceful_timeout))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="bitfit-serve-http", daemon=True)

    def start(self, timeout: float = 60.0) -> "BackgroundServer":
        self.thread.start()
        until = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > until:
                raise RuntimeError("the background server did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """Graceful: in-flight requests are answered, the queue drains, then the worker stops."""
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
