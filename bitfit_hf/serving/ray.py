"""``bitfit-hf serve --ray``: the server as a Ray Serve application, for traffic past one process or machine.

Ray's own batching (``@serve.batch``) splits a batch by multiplexed model id, so it cannot put requests for
different adapters into one forward pass. Each replica here is therefore a whole :class:`Engine` (the base
once, every adapter, this project's mixed-adapter batcher) behind the *same* FastAPI app as the plain server
(``create_app``, mounted with ``@serve.ingress``): routes, wire format and errors are the plain server's.
Ray supplies the cluster: replicas on any node, autoscaling, an HTTP proxy that routes to healthy replicas.

The adapter set lives in one place, an ``AdapterCatalog`` deployment (one replica, no CPU). An admin add or
remove, on whichever replica receives it, is applied there first (so its answer and refusals are the plain
server's), then recorded in the catalog; every replica long-polls the catalog and converges, and a replica
started later (a restart, autoscaling) loads the current set before it takes traffic. A replica that cannot
load an adapter keeps serving the rest and reports the failure to the catalog (``GET /admin/replicas``).

Layout: ``build_app`` (a Ray Serve application from adapter specs), ``app_builder`` (the same from the ``args``
of a ``serve run`` config), ``serve_on_ray`` (what the CLI runs). Needs the ``ray`` extra.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from fastapi import Request
from fastapi.responses import JSONResponse
from ray import serve

from bitfit_hf.serving.app import create_app
from bitfit_hf.serving.config import AdapterSpec, ServeConfig, ServeError, read_adapters_file, unique_specs
from bitfit_hf.serving.engine import Engine
from bitfit_hf.serving.tasks import InputError

logger = logging.getLogger(__name__)

#: The response header naming the replica that answered (for debugging and for the tests).
REPLICA_HEADER = "x-bitfit-replica"
#: The deployments' names in the Ray Serve application (a ``serve run`` config overrides them by these names).
SERVER_DEPLOYMENT = "BitFitServe"
CATALOG_DEPLOYMENT = "AdapterCatalog"
#: A replica not heard from for this long is left out of an admin change's report (dead or replaced).
REPLICA_STALE_S = 30.0
#: How long one long poll of the catalog waits for a change before the replica checks in anyway.
POLL_S = 10.0


def _spec_dict(spec: AdapterSpec) -> Dict[str, Optional[str]]:
    return {"name": spec.name, "source": spec.source, "revision": spec.revision}


# ---- the adapter set, in one place ----------------------------------------------------------------------
@serve.deployment(name=CATALOG_DEPLOYMENT, num_replicas=1, ray_actor_options={"num_cpus": 0},
                  max_ongoing_requests=10_000, graceful_shutdown_timeout_s=1, graceful_shutdown_wait_loop_s=0.5,
                  logging_config={"log_level": "WARNING", "enable_access_log": False})
class AdapterCatalog:
    """What every replica serves, and what each replica reported it could load.

    Kept in memory: a redeploy with another adapter list starts it again from that list (as a restart of the
    plain server forgets its run-time changes); make a change permanent in the adapters file. Many replicas
    wait on it at once (long polls), hence the high ``max_ongoing_requests``.
    """

    def __init__(self, specs: List[Dict[str, Optional[str]]]):
        self.adapters: Dict[str, Dict[str, Optional[str]]] = {s["name"]: dict(s) for s in specs}
        self.version = 0
        self.replicas: Dict[str, Dict[str, Any]] = {}
        self._changed: Optional[asyncio.Event] = None

    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _bump(self) -> None:
        self.version += 1
        event, self._changed = self._event(), asyncio.Event()
        event.set()  # wakes every waiting replica; later waits use the new event

    async def snapshot(self) -> Dict[str, Any]:
        return {"version": self.version, "adapters": list(self.adapters.values())}

    async def add(self, spec: Dict[str, Optional[str]]) -> Dict[str, Any]:
        if spec["name"] in self.adapters:
            return {"added": False, "version": self.version}
        self.adapters[spec["name"]] = dict(spec)
        self._bump()
        return {"added": True, "version": self.version}

    async def remove(self, name: str) -> Dict[str, Any]:
        if self.adapters.pop(name, None) is None:
            return {"removed": False, "version": self.version}
        self._bump()
        return {"removed": True, "version": self.version}

    async def wait(self, version: int, timeout: float = POLL_S) -> Dict[str, Any]:
        """The set once its version differs from ``version``, or after ``timeout`` s (a long poll)."""
        if self.version == version:
            try:
                await asyncio.wait_for(self._event().wait(), timeout)
            except asyncio.TimeoutError:
                pass
        return await self.snapshot()

    async def report(self, replica: str, version: int, failed: Dict[str, str], where: Optional[Dict] = None) -> None:
        """A replica checking in: the version it serves, what it failed to load, where it runs (node, pid, actor)."""
        where = where or self.replicas.get(replica, {}).get("where")
        self.replicas[replica] = {"version": version, "failed": dict(failed), "seen": time.time(), "where": where}

    async def status(self) -> Dict[str, Any]:
        now = time.time()
        live = {r: {**v, "seen_s_ago": round(now - v["seen"], 1)} for r, v in self.replicas.items()
                if now - v["seen"] <= REPLICA_STALE_S}
        return {"version": self.version, "adapters": sorted(self.adapters), "replicas": live}


# ---- one replica ------------------------------------------------------------------------------------------
class ReplicatedEngine(Engine):
    """An :class:`Engine` whose admin changes go to the catalog after they succeed here.

    The routes of ``create_app`` call ``engine.add`` / ``engine.remove``; overriding those two keeps the plain
    server's app unchanged. A change is applied locally first, so the receiving replica answers exactly as the
    plain server would (409, 422 with the reason, 404), and a change that fails here never reaches the others.
    """

    catalog: Any = None          # the AdapterCatalog's DeploymentHandle
    replica: str = "local"       # this replica's id, as the catalog knows it
    where: Optional[Dict[str, Any]] = None  # node, pid and Ray actor name, told to the catalog once
    change_wait_s: float = 60.0  # how long an admin call waits for the other replicas to report
    lock: Optional[asyncio.Lock] = None
    failed: Dict[str, str]
    seen_version: int = -1

    def changes_lock(self) -> asyncio.Lock:
        """Serialises admin changes with the catalog sync, so a sync never undoes a change being recorded."""
        if self.lock is None:
            self.lock = asyncio.Lock()
        return self.lock

    async def add(self, name: str, source: str, revision: Optional[str] = None) -> Dict[str, Any]:
        if self.catalog is None:  # not part of an application: a plain engine
            return await Engine.add(self, name, source, revision)
        async with self.changes_lock():
            described = await Engine.add(self, name, source, revision)
            try:
                recorded = await self.catalog.add.remote({"name": name, "source": source, "revision": revision})
            except Exception as err:  # noqa: BLE001 - not recorded: undo here too, so replicas do not diverge
                await Engine.remove(self, name)
                raise InputError(503, f"adapter {name!r} not added: the adapter catalog is unreachable "
                                      f"({type(err).__name__}); retry.", "unavailable") from None
            if not recorded["added"]:  # another replica took the name meanwhile
                await Engine.remove(self, name)
                raise InputError(409, f"an adapter named {name!r} was added on another replica meanwhile; DELETE it "
                                      "first or pick another name.", "conflict")
            self.seen_version = recorded["version"]
        await self.catalog.report.remote(self.replica, self.seen_version, self.failed)
        return {**described, "replicas": await self.replicas_at(recorded["version"])}

    async def remove(self, name: str) -> None:
        if self.catalog is None:
            return await Engine.remove(self, name)
        async with self.changes_lock():
            try:
                await Engine.remove(self, name)
            except InputError as err:  # 404 here, unless it is an adapter this replica failed to load
                if err.status != 404 or name not in self.failed:
                    raise
            recorded = await self.catalog.remove.remote(name)
            self.failed.pop(name, None)
            self.seen_version = max(self.seen_version, recorded["version"])
        await self.catalog.report.remote(self.replica, self.seen_version, self.failed)
        await self.replicas_at(recorded["version"])

    async def replicas_at(self, version: int) -> Dict[str, Any]:
        """Wait (up to ``change_wait_s``) until every live replica reported ``version``; what each said."""
        until = time.monotonic() + self.change_wait_s
        while True:
            status = await self.catalog.status.remote()
            pending = sorted(r for r, v in status["replicas"].items() if v["version"] < version)
            if not pending or time.monotonic() > until:
                break
            await asyncio.sleep(0.05)
        replicas = status["replicas"]
        return {"updated": sorted(r for r in replicas if r not in pending), "pending": pending,
                "failed": {r: v["failed"] for r, v in replicas.items() if v["failed"]}}

    async def sync(self, snapshot: Dict[str, Any]) -> None:
        """Make this replica serve the catalog's set; failures are kept in ``failed`` and reported."""
        async with self.changes_lock():
            wanted = {s["name"]: s for s in snapshot["adapters"]}
            for name, entry in list(self.registry.entries.items()):
                spec = wanted.get(name)
                if spec is None or (spec["source"], spec["revision"]) != (entry.source, entry.revision):
                    await Engine.remove(self, name)
            failed = {}
            for name, spec in wanted.items():
                if name in self.registry.entries:
                    continue
                try:
                    await Engine.add(self, name, spec["source"], spec["revision"])
                    logger.warning("bitfit-hf serve: replica %s: adapter %r added from %s", self.replica, name,
                                   spec["source"])
                except InputError as err:
                    failed[name] = err.message
                    logger.error("bitfit-hf serve: replica %s cannot serve adapter %r: %s", self.replica, name,
                                 err.message)
            self.failed = failed
            self.seen_version = snapshot["version"]
        await self.catalog.report.remote(self.replica, self.seen_version, self.failed, self.where)

    async def follow(self) -> None:
        """Long-poll the catalog for as long as the replica serves."""
        while not self.worker.draining:
            try:
                snapshot = await self.catalog.wait.remote(self.seen_version, POLL_S)
                if snapshot["version"] != self.seen_version:
                    await self.sync(snapshot)
                else:
                    await self.catalog.report.remote(self.replica, self.seen_version, self.failed)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - the catalog restarting or unreachable: retry, keep serving
                logger.warning("bitfit-hf serve: replica %s: adapter catalog unreachable (%s); retrying",
                               self.replica, type(err).__name__)
                await asyncio.sleep(1.0)


def replica_app(engine: ReplicatedEngine, catalog: Any):
    """The plain server's app plus ``GET /admin/replicas`` (token-protected): the catalog's adapters and, per
    live replica, the catalog version it serves and the adapters it could not load. (Module level: a route
    defined in the shipped-by-value deployment class would not see this module's names.)"""
    app = create_app(engine)

    @app.get("/admin/replicas")
    async def replicas(request: Request):
        refused = engine.check_token(request.headers.get("authorization"))
        if refused is not None:
            return JSONResponse({"error": refused.message, "error_type": refused.error_type},
                                status_code=refused.status)
        return await catalog.status.remote()

    return app


#: This process's replica app. Ray runs one replica per actor process, and hands ``@serve.ingress`` an ASGI
#: app before the replica exists, so the app it is given looks the replica's app up here. Read and written
#: only through the two functions below: Ray ships the deployment class by value, with a copy of any module
#: data its methods name, while module functions travel by reference (to this module's one copy).
_REPLICA: Dict[str, Any] = {}


def publish_replica(app, tag: str) -> None:
    _REPLICA.update(app=app, tag=tag)


def published_replica() -> tuple:
    return _REPLICA.get("app"), _REPLICA.get("tag", "")


class ReplicaApp:
    """The ASGI app given to ``@serve.ingress``: forwards to this replica's ``create_app`` app and names the
    replica in a response header. (Works on every Ray with ASGI ingress, without late-bound app builders.)"""

    async def __call__(self, scope, receive, send):
        app, tag = published_replica()
        tag = tag.encode()
        if app is None:
            raise RuntimeError("bitfit-hf: the replica's app is not built yet")
        if scope["type"] != "http":
            return await app(scope, receive, send)

        async def named(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (REPLICA_HEADER.encode(), tag)]}
            await send(message)

        await app(scope, receive, named)


@serve.deployment(name=SERVER_DEPLOYMENT, max_ongoing_requests=256, health_check_period_s=5)
@serve.ingress(ReplicaApp())
class BitFitServe:
    """One replica: the base once, every adapter in the catalog, the mixed-adapter batcher, the plain app."""

    async def __init__(self, specs: List[Dict[str, Optional[str]]], config: Dict[str, Any],
                       base_model: Optional[str] = None, tokenizer: Optional[str] = None, catalog: Any = None,
                       change_wait_s: float = 60.0):
        context = serve.get_replica_context()
        tag = context.replica_tag if context is not None else f"pid{os.getpid()}"
        serve_config = ServeConfig(**config)
        adapter_specs = [AdapterSpec(s["name"], s["source"], s.get("revision")) for s in specs]
        # the deploy-time adapters must all load, as for the plain server; later ones may fail here and are reported
        engine = await asyncio.to_thread(ReplicatedEngine.create, adapter_specs, serve_config, base_model, tokenizer,
                                         Engine.admin_token_from_env(), True)
        engine.catalog, engine.replica, engine.change_wait_s, engine.failed = catalog, tag, change_wait_s, {}
        engine.where = {"pid": os.getpid(), "node": socket.gethostname(),
                        "actor": context.replica_id.to_full_id_str() if context is not None else None}
        if catalog is not None:
            await engine.sync(await catalog.snapshot.remote())  # a replica started later: the current set first
            self._follow = asyncio.get_running_loop().create_task(engine.follow())
        self.engine = engine
        app = replica_app(engine, catalog)
        publish_replica(app, tag)
        logger.warning("bitfit-hf serve: replica %s ready with %d adapter(s)", tag, len(engine.registry.entries))

    def check_health(self) -> None:
        """Ray replaces a replica whose batcher thread died (its requests would never be answered)."""
        if not self.engine.worker.alive and not self.engine.worker.draining:
            raise RuntimeError("the batcher thread stopped")

    def __del__(self):
        follow = getattr(self, "_follow", None)
        if follow is not None:
            follow.cancel()


# ---- building the application -----------------------------------------------------------------------------
def deployment_options(replicas: Optional[int] = 1, autoscale: Optional[tuple] = None, num_cpus: float = 1.0,
                       config: Optional[ServeConfig] = None, access_log: bool = False) -> Dict[str, Any]:
    """Ray Serve options of the server deployment. A replica may hold up to ``max_queue`` requests (Ray's default
    of 5 would cap every batch at 5); autoscaling aims at one full batch of requests per replica."""
    config = config or ServeConfig()
    options: Dict[str, Any] = {"ray_actor_options": {"num_cpus": num_cpus}, "max_ongoing_requests": config.max_queue,
                               "logging_config": {"enable_access_log": access_log}}
    if autoscale is not None:
        low, high = autoscale
        options["autoscaling_config"] = {"min_replicas": low, "max_replicas": high, "initial_replicas": low,
                                         "target_ongoing_requests": config.max_batch_size}
    else:
        options["num_replicas"] = replicas
    return options


def build_app(specs: List[AdapterSpec], config: Optional[ServeConfig] = None, base_model: Optional[str] = None,
              tokenizer: Optional[str] = None, *, replicas: Optional[int] = 1, autoscale: Optional[tuple] = None,
              num_cpus: float = 1.0, change_wait_s: float = 60.0, access_log: bool = False):
    """A Ray Serve application serving ``specs``: ``serve.run(build_app(specs), route_prefix="/")``."""
    config = config or ServeConfig()
    if not specs:
        raise ServeError("no adapters to serve: give one or more NAME=SOURCE (a folder or a Hub id), or --adapters-file.")
    plain = [_spec_dict(s) for s in unique_specs(list(specs))]
    catalog = AdapterCatalog.bind(plain)
    server = BitFitServe.options(**deployment_options(replicas, autoscale, num_cpus, config, access_log))
    return server.bind(plain, config.to_dict(), base_model, tokenizer, catalog, change_wait_s)


def app_builder(args: Dict[str, Any]):
    """``import_path: bitfit_hf.serving.ray:app_builder`` in a ``serve run`` / ``serve deploy`` config. ``args``:
    ``adapters_file`` and / or ``adapters`` (``{name: source or {source, revision}}``), ``base_model``,
    ``tokenizer``, ``config`` (:class:`ServeConfig` fields), ``replicas`` or ``autoscale: [min, max]``,
    ``num_cpus`` (per replica). The config file's ``deployments:`` section may override the Ray options."""
    args = dict(args or {})
    known = {"adapters_file", "adapters", "base_model", "tokenizer", "config", "replicas", "autoscale", "num_cpus"}
    unknown = sorted(set(args) - known)
    if unknown:
        raise ServeError(f"unknown args {', '.join(unknown)}; bitfit_hf.serving.ray:app_builder takes {', '.join(sorted(known))}.")
    specs: List[AdapterSpec] = []
    base_model = args.get("base_model")
    if args.get("adapters_file"):
        specs, file_base = read_adapters_file(args["adapters_file"])
        base_model = base_model or file_base
    for name, value in (args.get("adapters") or {}).items():
        value = value if isinstance(value, dict) else {"source": value}
        specs.append(AdapterSpec(name, str(value["source"]), value.get("revision")))
    autoscale = tuple(args["autoscale"]) if args.get("autoscale") else None
    return build_app(specs, ServeConfig(**(args.get("config") or {})), base_model, args.get("tokenizer"),
                     replicas=int(args.get("replicas", 1)), autoscale=autoscale,
                     num_cpus=float(args.get("num_cpus", 1.0)))


def parse_autoscale(text: str) -> tuple:
    """``"1:4"`` -> ``(1, 4)``."""
    low, sep, high = text.partition(":")
    try:
        pair = (int(low), int(high)) if sep else None
    except ValueError:
        pair = None
    if pair is None or pair[0] < 1 or pair[1] < pair[0]:
        raise ServeError(f"--autoscale is MIN:MAX replicas with 1 <= MIN <= MAX (got {text!r}).")
    return pair


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now (Ray's proxy cannot report the one it took for port 0)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def serve_on_ray(specs: List[AdapterSpec], config: ServeConfig, base_model: Optional[str] = None,
                 tokenizer: Optional[str] = None, *, host: str = "127.0.0.1", port: int = 8080,
                 replicas: Optional[int] = 1, autoscale: Optional[tuple] = None, num_cpus: float = 1.0,
                 address: Optional[str] = None, name: str = "bitfit-hf", access_log: bool = False,
                 on_ready: Optional[Callable[[str], None]] = None) -> None:
    """Deploy on a Ray cluster (``address``; none: a local one started here) and serve until SIGINT / SIGTERM,
    then delete the application (the replicas drain their queues) and, for a local cluster, stop it."""
    import ray

    port = free_port(host) if port == 0 else port
    # the replicas read BITFIT_HF_ADMIN_TOKEN / HF_TOKEN from their environment: a local cluster inherits this
    # process's; on a cluster, that of `ray start` (never passed in a runtime_env, which the cluster shows to all)
    local = {"include_dashboard": False} if address is None else {}  # only for a cluster started here
    ray.init(address=address, logging_level=logging.WARNING, **local)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        serve.start(http_options={"host": host, "port": port})
        app = build_app(specs, config, base_model, tokenizer, replicas=replicas, autoscale=autoscale,
                        num_cpus=num_cpus, access_log=access_log)
        try:
            serve.run(app, name=name, route_prefix="/", blocking=False)
        except Exception as err:  # noqa: BLE001 - a replica's start-up error, as Ray reports it
            lines = [line for line in str(err).strip().splitlines() if line.strip()]
            raise ServeError(f"the Ray deployment did not start: {lines[-1] if lines else type(err).__name__}") from None
        if on_ready is not None:
            on_ready(f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}")
        while not stop.wait(0.5):
            pass
        logger.warning("bitfit-hf serve: stopping the Ray application (replicas answer what they hold)")
        serve.delete(name)
        if address is None:
            serve.shutdown()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        ray.shutdown()
    print("bitfit-hf serve: stopped", file=sys.stderr, flush=True)


__all__ = ["AdapterCatalog", "BitFitServe", "REPLICA_HEADER", "ReplicatedEngine", "app_builder", "build_app",
           "deployment_options", "free_port", "parse_autoscale", "serve_on_ray"]
