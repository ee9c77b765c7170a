"""``bitfit-hf serve --workers N``: N server processes on one port, each with the base, every adapter and a batcher.

Why: a forward pass returns to Python, and to the GIL, between operators, so one process keeps two cores busy
less well than two processes of one torch thread each (docs/serving.md, "Where a request's CPU goes"). N
workers do on one machine what N replicas behind a load balancer do, without the balancer: the socket is bound
once and shared, and the kernel hands each new connection to one worker.

uvicorn's own process supervisor runs them (its ``--workers``): it replaces a worker that dies while the others
go on serving, and SIGTERM or SIGINT stops every worker gracefully (each answers what it holds). Each worker
builds its engine from the settings this module puts in its environment (``WORKER_ENV``); a replacement loads
the adapters that still load and logs the rest, so an adapter folder removed since the start cannot keep it down.

The adapter set is fixed at the start: a run-time change would reach one worker only, so ``run`` refuses the
admin token (use ``--ray``, whose catalog keeps its replicas in agreement, or change the adapters file and
restart). Prometheus metrics are summed over the workers (prometheus_client's multiprocess mode, a folder of
per-process files that ``run`` creates and removes).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Callable, List, Optional

from bitfit_hf.serving.config import ADMIN_TOKEN_ENV, AdapterSpec, ServeConfig, ServeError

logger = logging.getLogger(__name__)

#: The settings a worker process builds its engine from (JSON).
WORKER_ENV = "BITFIT_HF_SERVE_WORKER"
#: Set in the supervisor once every first worker is serving: later workers are replacements.
STARTED_ENV = "BITFIT_HF_SERVE_WORKERS_STARTED"
#: prometheus_client reads this when imported: where every process writes its metric values.
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: How long the supervisor waits for one worker's first start (loading the base and every adapter).
START_TIMEOUT_S = 900.0
#: How long a worker may leave the supervisor's health ping unanswered before it counts as hung and is
#: replaced: generous, since importing torch or loading weights can hold the GIL for seconds on a busy host.
HEALTHCHECK_S = 60
#: How long a replacement that cannot start waits before it exits and the supervisor starts another.
REPLACEMENT_RETRY_S = 5.0


def worker_settings(specs: List[AdapterSpec], config: ServeConfig, base_model: Optional[str], tokenizer: Optional[str],
                    graceful_timeout: Optional[float], ready_dir: str) -> str:
    return json.dumps({"specs": [dataclasses.asdict(s) for s in specs], "config": config.to_dict(),
                       "base_model": base_model, "tokenizer": tokenizer, "graceful_timeout": graceful_timeout,
                       "ready_dir": ready_dir})


def loadable(specs: List[AdapterSpec]) -> List[AdapterSpec]:
    """The specs whose adapter still loads; each one that does not is logged with its reason."""
    from bitfit_hf.serving.engine import load_adapter_source

    kept = []
    for spec in specs:
        try:
            load_adapter_source(spec.source, spec.revision)
        except ServeError as err:
            logger.error("bitfit-hf serve: worker %d: adapter %r (%s) no longer loads, served by the other workers "
                         "only until they restart: %s", os.getpid(), spec.name, spec.describe(), err)
            continue
        kept.append(spec)
    return kept


def worker_app():
    """uvicorn's app factory in each worker process: the plain server's app over an engine of its own."""
    from uvicorn.config import STARTUP_FAILURE

    from bitfit_hf.serving.app import create_app
    from bitfit_hf.serving.engine import Engine

    settings = json.loads(os.environ[WORKER_ENV])
    specs = [AdapterSpec(**s) for s in settings["specs"]]
    replacement = bool(os.environ.get(STARTED_ENV))
    if replacement:  # serve what still loads rather than nothing
        specs = loadable(specs) or specs
    try:
        engine = Engine.create(specs, ServeConfig(**settings["config"]), base_model=settings["base_model"],
                               tokenizer=settings["tokenizer"], admin_token=None, start=False)
    except ServeError as err:
        for line in str(err).splitlines():
            logger.error("bitfit-hf serve: worker %d: %s", os.getpid(), line)
        if not replacement:  # the start itself is wrong: uvicorn's supervisor stops every worker
            raise SystemExit(STARTUP_FAILURE) from None
        time.sleep(REPLACEMENT_RETRY_S)  # the others go on serving; the supervisor tries again after this
        raise SystemExit(1) from None
    app = create_app(engine, drain_timeout=settings["graceful_timeout"])
    with open(os.path.join(settings["ready_dir"], str(os.getpid())), "w"):  # tells the supervisor
        pass
    logger.info("bitfit-hf serve: worker %d ready with %d adapter(s)", os.getpid(), len(engine.registry.entries))
    return app


def _supervisor(config, sockets, ready_dir: str, on_ready: Callable[[], None]):
    """uvicorn's supervisor, which also says when every first worker serves (each leaves a file named by its pid
    in ``ready_dir``: the supervisor's pipe to a worker is its own thread's) and forgets the metric files of a
    worker it replaced (a dead process's gauges would otherwise count)."""
    from prometheus_client import multiprocess
    from uvicorn.supervisors import Multiprocess

    class Supervisor(Multiprocess):
        def init_processes(self) -> None:
            super().init_processes()
            threading.Thread(target=self._announce, name="bitfit-serve-ready", daemon=True).start()

        def _announce(self) -> None:
            until = time.monotonic() + START_TIMEOUT_S
            while not self.should_exit.wait(0.1) and time.monotonic() < until:
                if all(os.path.exists(os.path.join(ready_dir, str(p.pid))) for p in list(self.processes)):
                    os.environ[STARTED_ENV] = "1"  # inherited by every worker started from now on
                    on_ready()
                    return

        def terminate_all(self) -> None:
            for sock in self.sockets:  # the workers close theirs as they stop: new connections are then refused
                sock.close()          # at once, not left in a backlog that nobody accepts from
            super().terminate_all()

        def keep_subprocess_alive(self) -> None:
            before = {p.pid for p in self.processes}
            super().keep_subprocess_alive()
            for pid in before - {p.pid for p in self.processes}:
                multiprocess.mark_process_dead(pid)

    return Supervisor(config, sockets=sockets)


def serve_workers(specs: List[AdapterSpec], config: ServeConfig, workers: int, base_model: Optional[str] = None,
                  tokenizer: Optional[str] = None, host: str = "127.0.0.1", port: int = 8080, log_level: str = "info",
                  access_log: bool = False, graceful_timeout: Optional[float] = None,
                  on_ready: Optional[Callable[[str], None]] = None) -> bool:
    """Serve with ``workers`` processes until SIGINT / SIGTERM; False if a worker failed its first start
    (its error is logged), True after a clean stop."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE

    from bitfit_hf.serving.listening import bind, url_of

    if os.environ.get(ADMIN_TOKEN_ENV):
        raise ServeError(f"run-time adapter changes reach one worker only, so --workers {workers} does not take "
                         f"{ADMIN_TOKEN_ENV}: unset it and change the adapters file and restart, or serve with --ray "
                         "(its catalog keeps every replica in agreement).")
    sock = bind(host, port)
    url = url_of(sock)
    metrics_dir = tempfile.mkdtemp(prefix="bitfit-serve-metrics-")
    ready_dir = tempfile.mkdtemp(prefix="bitfit-serve-ready-")
    saved = {key: os.environ.get(key) for key in (WORKER_ENV, METRICS_DIR_ENV, STARTED_ENV)}
    os.environ[WORKER_ENV] = worker_settings(specs, config, base_model, tokenizer, graceful_timeout, ready_dir)
    os.environ[METRICS_DIR_ENV] = metrics_dir
    os.environ.pop(STARTED_ENV, None)
    try:
        server_config = uvicorn.Config(f"{__name__}:worker_app", factory=True, workers=workers, log_level=log_level,
                                       access_log=access_log, lifespan="on", timeout_keep_alive=30,
                                       timeout_graceful_shutdown=int(graceful_timeout) if graceful_timeout else None,
                                       timeout_worker_healthcheck=HEALTHCHECK_S)
        supervisor = _supervisor(server_config, [sock], ready_dir, lambda: on_ready(url) if on_ready else None)
        supervisor.run()
        return not any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes)
    finally:
        sock.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
        shutil.rmtree(ready_dir, ignore_errors=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        sys.stderr.flush()
