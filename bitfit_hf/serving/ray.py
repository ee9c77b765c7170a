"""``bitfit-hf serve --ray``: the server as a Ray Serve application, for traffic past one process or machine.

Ray's own batching (``@serve.batch``) splits a batch by multiplexed model id, so it cannot put requests for
different adapters into one forward pass. Each replica here is therefore a whole :class:`Engine` (the base
once, every adapter, this project's mixed-adapter batcher) behind the *same* FastAPI app as the plain server
(``create_app``, mounted with ``@serve.ingress``): routes, wire format and errors are the plain server's.
Ray supplies the cluster: replicas on any node, autoscaling, an HTTP proxy that routes to healthy replicas.

The adapter set lives in one place, an ``AdapterCatalog`` deployment (one replica, no CPU), as numbered
snapshots. An admin add or remove, on whichever replica receives it, is applied there first (so its answer
and refusals are the plain server's), then recorded in the catalog, which answers with the snapshot that
includes it; the replica applies that whole snapshot, so a version a replica reports always means "every
change up to here applied", and a snapshot older than the one applied is never applied. Every replica
long-polls the catalog and converges; a replica started later (a restart, autoscaling) starts from the
catalog's current set, not the deploy-time list. A replica that cannot load an adapter keeps serving the
rest and reports the failure to the catalog (``GET /admin/replicas``). Replicas whose Ray actor died are
dropped from the catalog at once, so admin calls never wait for them.

Stopping (``serve_on_ray``): the catalog tells every replica to refuse new requests (503 with Retry-After)
and the front waits until they hold none; then Serve shuts down, which closes the HTTP proxies before it
removes the routes, so no client meets the proxy's 404 for a route that is gone.

Layout: the version rules (``is_newer``, ``plan``, ``has_applied``, ``live_replicas``), the catalog, one
replica (``ReplicatedEngine``, ``Gate``, ``BitFitServe``), ``build_app`` (a Ray Serve application from
adapter specs), ``app_builder`` (the same from the ``args`` of a ``serve run`` config), ``serve_on_ray``
(what the CLI runs). Needs the ``ray`` extra.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

from fastapi import Request
from fastapi.responses import JSONResponse
from ray import serve

from bitfit_hf.serving.app import create_app
from bitfit_hf.serving.config import AdapterSpec, ServeConfig, ServeError, read_adapters_file, require_specs, unique_specs
from bitfit_hf.serving.engine import Engine
from bitfit_hf.serving.tasks import InputError

logger = logging.getLogger(__name__)

#: The response header naming the replica that answered (for debugging and for the tests).
REPLICA_HEADER = "x-bitfit-replica"
#: The deployments' names in the Ray Serve application (a ``serve run`` config overrides them by these names).
SERVER_DEPLOYMENT = "BitFitServe"
CATALOG_DEPLOYMENT = "AdapterCatalog"
#: The Ray namespace of Serve's replica actors (their names are the replicas' full ids).
REPLICA_NAMESPACE = "serve"
#: A replica not heard from for this long is dropped even if Ray still calls its actor alive (a lost node,
#: until Ray notices); a dead actor is dropped at once.
REPLICA_STALE_S = 30.0
#: How long one long poll of the catalog waits for a change before the replica checks in anyway.
POLL_S = 10.0
#: How often a stopping replica reports the requests it still holds.
CLOSING_REPORT_S = 0.1

Applied = Tuple[Optional[str], int]  # (catalog epoch, version) of the last snapshot a replica applied whole


def _spec_dict(spec: AdapterSpec) -> Dict[str, Optional[str]]:
    return {"name": spec.name, "source": spec.source, "revision": spec.revision}


def _spec(entry: Dict[str, Optional[str]]) -> AdapterSpec:
    return AdapterSpec(entry["name"], entry["source"], entry.get("revision"))


# ---- versions: what a replica has applied -----------------------------------------------------------------
def is_newer(snapshot: Dict[str, Any], applied: Applied) -> bool:
    """Whether to apply ``snapshot``: it is later than what the replica applied, or from another catalog
    (one Ray restarted, which numbers from 0 again). A snapshot fetched before a change this replica has
    since applied is not: applying it would undo the change (re-serve a deleted adapter, drop an added one)."""
    epoch, version = applied
    return snapshot["epoch"] != epoch or snapshot["version"] > version


def has_applied(state: Dict[str, Any], snapshot: Dict[str, Any]) -> bool:
    """Whether a replica's report says it serves ``snapshot`` or a later one."""
    return state.get("epoch") == snapshot["epoch"] and state.get("version", -1) >= snapshot["version"]


def plan(served: Dict[str, tuple], wanted: Dict[str, Dict[str, Optional[str]]]) -> Tuple[List[str], List[str]]:
    """``(drop, load)``: the adapters to remove (gone from ``wanted``, or wanted from another source or
    revision) and to load, from ``served`` (``{name: (source, revision)}``)."""
    drop = [name for name, where in served.items()
            if name not in wanted or (wanted[name]["source"], wanted[name].get("revision")) != where]
    load = [name for name in wanted if name not in served or name in drop]
    return drop, load


def actor_alive(where: Optional[Dict[str, Any]]) -> bool:
    """Whether a replica's Ray actor lives. Ray forgets the name of an actor that died (killed, crashed,
    stopped) within milliseconds, where a missed report would take ``REPLICA_STALE_S``."""
    name = (where or {}).get("actor")
    if not name:
        return True
    import ray

    try:
        ray.get_actor(name, namespace=REPLICA_NAMESPACE)
    except ValueError:
        return False
    return True


def live_replicas(replicas: Dict[str, Dict[str, Any]], now: float, alive: Callable[[Any], bool]) -> List[str]:
    """The replicas to count: heard from within ``REPLICA_STALE_S`` and whose actor ``alive`` says lives."""
    return [r for r, state in replicas.items() if now - state["seen"] <= REPLICA_STALE_S and alive(state.get("where"))]


# ---- the adapter set, in one place ----------------------------------------------------------------------
@serve.deployment(name=CATALOG_DEPLOYMENT, num_replicas=1, ray_actor_options={"num_cpus": 0},
                  max_ongoing_requests=10_000, graceful_shutdown_timeout_s=1, graceful_shutdown_wait_loop_s=0.5,
                  logging_config={"log_level": "WARNING", "enable_access_log": False})
class AdapterCatalog:
    """What every replica serves, numbered, and what each replica reported.

    Kept in memory: a redeploy with another adapter list starts it again from that list (as a restart of the
    plain server forgets its run-time changes); make a change permanent in the adapters file. A catalog that
    Ray restarts starts from the deploy-time list under a new ``epoch``, and the replicas follow it. Many
    replicas wait on it at once (long polls), hence the high ``max_ongoing_requests``.
    """

    def __init__(self, specs: List[Dict[str, Optional[str]]], alive: Callable[[Any], bool] = actor_alive):
        self.adapters: Dict[str, Dict[str, Optional[str]]] = {s["name"]: dict(s) for s in specs}
        self.epoch = uuid.uuid4().hex[:12]
        self.version = 0
        self.closing = False
        self.replicas: Dict[str, Dict[str, Any]] = {}
        self.started = False  # a replica has reported: the deployment is up
        self.alive = alive
        self._changed: Optional[asyncio.Event] = None

    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _notify(self) -> None:
        event, self._changed = self._event(), asyncio.Event()
        event.set()  # wakes every waiting replica; later waits use the new event

    def _bump(self) -> None:
        self.version += 1
        self._notify()

    def _snapshot(self) -> Dict[str, Any]:
        # strict: no replica has started yet, so this is the deployment itself: every adapter must load
        return {"epoch": self.epoch, "version": self.version, "adapters": list(self.adapters.values()),
                "closing": self.closing, "strict": not self.started}

    async def snapshot(self) -> Dict[str, Any]:
        return self._snapshot()

    async def add(self, spec: Dict[str, Optional[str]]) -> Dict[str, Any]:
        """Record an add; the snapshot that includes it (or, refused, the current one)."""
        added = spec["name"] not in self.adapters
        if added:
            self.adapters[spec["name"]] = dict(spec)
            self._bump()
        return {"changed": added, "snapshot": self._snapshot()}

    async def remove(self, name: str) -> Dict[str, Any]:
        removed = self.adapters.pop(name, None) is not None
        if removed:
            self._bump()
        return {"changed": removed, "snapshot": self._snapshot()}

    async def close(self) -> None:
        """The application is stopping: every replica refuses new requests from now on."""
        self.closing = True
        self._notify()

    async def wait(self, epoch: Optional[str], version: int, timeout: float = POLL_S) -> Dict[str, Any]:
        """The set once it differs from ``(epoch, version)`` or the application stops, else after ``timeout``
        s (a long poll)."""
        if (epoch, version) == (self.epoch, self.version) and not self.closing:
            try:
                await asyncio.wait_for(self._event().wait(), timeout)
            except asyncio.TimeoutError:
                pass
        return self._snapshot()

    async def report(self, replica: str, state: Dict[str, Any]) -> None:
        """A replica checking in: the snapshot it applied, what it serves and failed to load, the requests it
        holds, whether it is stopping, where it runs (node, pid, actor)."""
        self.replicas[replica] = {**state, "seen": time.time()}
        self.started = True

    async def status(self) -> Dict[str, Any]:
        """The set and, per live replica, its report; replicas found dead are forgotten."""
        now = time.time()
        live = await asyncio.to_thread(live_replicas, dict(self.replicas), now, self.alive)
        for replica in set(self.replicas) - set(live):
            self.replicas.pop(replica, None)
        return {"epoch": self.epoch, "version": self.version, "adapters": sorted(self.adapters),
                "closing": self.closing, "replicas": {r: self._describe(self.replicas[r], now) for r in live
                                                      if r in self.replicas}}

    def _describe(self, state: Dict[str, Any], now: float) -> Dict[str, Any]:
        served = set(state.get("adapters", ()))
        shown = {k: v for k, v in state.items() if k not in ("adapters", "seen")}
        return {**shown, "missing": sorted(set(self.adapters) - served), "extra": sorted(served - set(self.adapters)),
                "seen_s_ago": round(now - state["seen"], 1)}


# ---- one replica ------------------------------------------------------------------------------------------
class Gate:
    """A replica's door. Once the application is stopping it refuses new requests with 503 and Retry-After,
    which clients retry (unlike the 404 Ray's proxy gives once the routes are gone), and it counts the
    requests it let in, so the front can wait until none is left."""

    def __init__(self, retry_after_s: int = 1):
        self.closing = False
        self.busy = 0
        self.retry_after_s = retry_after_s

    async def refuse(self, send) -> None:
        body = json.dumps({"error": f"the server is shutting down; retry in {self.retry_after_s} s.",
                           "error_type": "unavailable"}).encode()
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"retry-after", str(self.retry_after_s).encode())]})
        await send({"type": "http.response.body", "body": body})


class ReplicatedEngine(Engine):
    """An :class:`Engine` whose admin changes go to the catalog after they succeed here.

    The routes of ``create_app`` call ``engine.add`` / ``engine.remove``; overriding those two keeps the plain
    server's app unchanged. A change is applied locally first, so the receiving replica answers exactly as the
    plain server would (409, 422 with the reason), and a change that fails here never reaches the others.
    ``applied`` is the catalog snapshot this replica serves: set only by applying a snapshot whole.
    """

    catalog: Any = None          # the AdapterCatalog's DeploymentHandle
    replica: str = "local"       # this replica's id, as the catalog knows it
    where: Optional[Dict[str, Any]] = None  # node, pid and Ray actor name
    change_wait_s: float = 60.0  # how long an admin call waits for the other replicas to report
    lock: Optional[asyncio.Lock] = None
    failed: Dict[str, str]
    applied: Applied = (None, -1)
    gate: Gate

    def join(self, catalog: Any, replica: str, where: Optional[Dict[str, Any]], change_wait_s: float) -> None:
        """Make this engine a replica of the application whose catalog ``catalog`` is (``None``: a plain engine)."""
        self.catalog, self.replica, self.where, self.change_wait_s = catalog, replica, where, change_wait_s
        self.failed, self.gate = {}, Gate(self.config.retry_after_s)

    def changes_lock(self) -> asyncio.Lock:
        """Serialises admin changes with the catalog sync, so a sync never interleaves with a change."""
        if self.lock is None:
            self.lock = asyncio.Lock()
        return self.lock

    async def add(self, name: str, source: str, revision: Optional[str] = None) -> Dict[str, Any]:
        if self.catalog is None:  # not part of an application: a plain engine
            return await Engine.add(self, name, source, revision)
        async with self.changes_lock():
            described = await Engine.add(self, name, source, revision)  # the plain server's refusals, here first
            try:
                recorded = await self._record(self.catalog.add, {"name": name, "source": source, "revision": revision},
                                              f"adapter {name!r} not added")
            except InputError:
                await Engine.remove(self, name)  # not recorded: undone here too, so replicas do not diverge
                raise
            if not recorded["changed"]:  # another replica took the name meanwhile: serve the catalog's
                await Engine.remove(self, name)
            await self._apply(recorded["snapshot"])
        await self._report()
        if not recorded["changed"]:
            raise InputError(409, f"an adapter named {name!r} was added on another replica meanwhile; DELETE it "
                                  "first or pick another name.", "conflict")
        return {**described, "replicas": await self.replicas_at(recorded["snapshot"])}

    async def remove(self, name: str) -> None:
        if self.catalog is None:
            return await Engine.remove(self, name)
        async with self.changes_lock():
            recorded = await self._record(self.catalog.remove, name, f"adapter {name!r} not removed")
            await self._apply(recorded["snapshot"])
            if name in self.registry.entries or not recorded["changed"]:
                await Engine.remove(self, name)  # served here only: dropped; served nowhere: the plain 404
            self.failed.pop(name, None)
        await self._report()
        await self.replicas_at(recorded["snapshot"])

    async def _record(self, call: Any, arg: Any, what: str) -> Dict[str, Any]:
        try:
            return await call.remote(arg)
        except Exception as err:  # noqa: BLE001 - the catalog restarting or unreachable
            raise InputError(503, f"{what}: the adapter catalog is unreachable ({type(err).__name__}); retry.",
                             "unavailable", headers={"Retry-After": str(self.config.retry_after_s)}) from None

    async def replicas_at(self, snapshot: Dict[str, Any]) -> Dict[str, Any]:
        """Wait (up to ``change_wait_s``) until every live replica applied ``snapshot``; what each said. The
        catalog lists no replica whose actor died, so a dead one is never waited for."""
        until = time.monotonic() + self.change_wait_s
        while True:
            status = await self.catalog.status.remote()
            pending = sorted(r for r, state in status["replicas"].items() if not has_applied(state, snapshot))
            if not pending or time.monotonic() > until:
                break
            await asyncio.sleep(0.05)
        replicas = status["replicas"]
        return {"updated": sorted(r for r in replicas if r not in pending), "pending": pending,
                "failed": {r: v["failed"] for r, v in replicas.items() if v.get("failed")}}

    async def sync(self, snapshot: Dict[str, Any]) -> None:
        """Serve the catalog's ``snapshot`` (unless already past it) and report."""
        async with self.changes_lock():
            await self._apply(snapshot)
        await self._report()

    async def _apply(self, snapshot: Dict[str, Any]) -> None:
        """Make this replica serve exactly ``snapshot``'s set; what fails to load is kept in ``failed``. Only
        under the changes lock, and only a snapshot newer than the one applied (:func:`is_newer`)."""
        if not is_newer(snapshot, self.applied):
            return
        wanted = {s["name"]: s for s in snapshot["adapters"]}
        drop, load = plan({n: (e.source, e.revision) for n, e in self.registry.entries.items()}, wanted)
        for name in drop:
            await Engine.remove(self, name)
        failed = {}
        for name in load:
            try:
                await Engine.add(self, name, wanted[name]["source"], wanted[name].get("revision"))
                logger.warning("bitfit-hf serve: replica %s: adapter %r added from %s", self.replica, name,
                               wanted[name]["source"])
            except InputError as err:
                failed[name] = err.message
                logger.error("bitfit-hf serve: replica %s cannot serve adapter %r: %s", self.replica, name,
                             err.message)
        self.failed = failed
        self.applied = (snapshot["epoch"], snapshot["version"])

    def state(self) -> Dict[str, Any]:
        """This replica's report to the catalog."""
        epoch, version = self.applied
        return {"epoch": epoch, "version": version, "adapters": sorted(self.registry.entries),
                "failed": dict(self.failed), "busy": self.gate.busy, "closing": self.gate.closing, "where": self.where}

    async def _report(self) -> None:
        await self.catalog.report.remote(self.replica, self.state())

    async def follow(self) -> None:
        """Long-poll the catalog for as long as the replica serves."""
        while not self.worker.draining:
            try:
                await self._follow_once()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - the catalog restarting or unreachable: retry, keep serving
                logger.warning("bitfit-hf serve: replica %s: adapter catalog unreachable (%s); retrying",
                               self.replica, type(err).__name__)
                await asyncio.sleep(1.0)

    async def _follow_once(self) -> None:
        """One long poll; once the application is stopping, a report of the requests still held instead."""
        if self.gate.closing:
            await self._report()
            await asyncio.sleep(CLOSING_REPORT_S)
            return
        snapshot = await self.catalog.wait.remote(*self.applied, POLL_S)
        self.gate.closing = self.gate.closing or snapshot["closing"]
        await self.sync(snapshot)


def replica_app(engine: ReplicatedEngine, catalog: Any):
    """The plain server's app plus ``GET /admin/replicas`` (token-protected): the catalog's adapters and, per
    live replica, the catalog version it serves, the adapters it could not load, those it lacks or has
    beyond the catalog's. (Module level: a route defined in the shipped-by-value deployment class would not
    see this module's names.)"""
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


def publish_replica(app, tag: str, gate: Gate) -> None:
    _REPLICA.update(app=app, tag=tag, gate=gate)


def published_replica() -> tuple:
    return _REPLICA.get("app"), _REPLICA.get("tag", ""), _REPLICA.get("gate")


class ReplicaApp:
    """The ASGI app given to ``@serve.ingress``: forwards to this replica's ``create_app`` app through its
    :class:`Gate` and names the replica in a response header. (Works on every Ray with ASGI ingress,
    without late-bound app builders.)"""

    async def __call__(self, scope, receive, send):
        app, tag, gate = published_replica()
        if app is None:
            raise RuntimeError("bitfit-hf: the replica's app is not built yet")
        if scope["type"] != "http":
            return await app(scope, receive, send)
        named = _naming(send, tag.encode())
        if gate.closing:
            return await gate.refuse(named)
        gate.busy += 1
        try:
            await app(scope, receive, named)
        finally:
            gate.busy -= 1


def _naming(send, tag: bytes):
    async def named(message):
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (REPLICA_HEADER.encode(), tag)]}
        await send(message)

    return named


def start_engine(snapshot: Optional[Dict[str, Any]], deployed: List[Dict[str, Optional[str]]], config: ServeConfig,
                 base_model: Optional[str], tokenizer: Optional[str]) -> ReplicatedEngine:
    """A replica's engine on the catalog's current set (``snapshot``). The application's first replicas
    (``strict``) need every adapter to load, as the plain server does; a later one (a replacement,
    autoscaling) starts from the part that loads and reports the rest, since an adapter deleted or moved
    since the deployment must not keep it from starting. Without a loadable catalog adapter, a deploy-time
    one gives the base (the sync then drops it)."""
    wanted = [_spec(s) for s in (snapshot["adapters"] if snapshot else deployed)]
    token = Engine.admin_token_from_env()
    try:
        return ReplicatedEngine.create(wanted, config, base_model, tokenizer, token, True)
    except ServeError:
        if snapshot is None or snapshot["strict"]:
            raise
    names = {spec.name for spec in wanted}
    return _first_loading([*wanted, *(_spec(s) for s in deployed if s["name"] not in names)], config, base_model,
                          tokenizer, token)


def _first_loading(candidates: List[AdapterSpec], config: ServeConfig, base_model: Optional[str],
                   tokenizer: Optional[str], token: Optional[str]) -> ReplicatedEngine:
    reasons = []
    for spec in candidates:
        try:
            return ReplicatedEngine.create([spec], config, base_model, tokenizer, token, True)
        except ServeError as err:
            reasons.append(str(err))
    raise ServeError("no adapter loads on this replica, so it has no base: " + "; ".join(reasons))


@serve.deployment(name=SERVER_DEPLOYMENT, max_ongoing_requests=256, health_check_period_s=5)
@serve.ingress(ReplicaApp())
class BitFitServe:
    """One replica: the base once, every adapter in the catalog, the mixed-adapter batcher, the plain app."""

    async def __init__(self, specs: List[Dict[str, Optional[str]]], config: Dict[str, Any],
                       base_model: Optional[str] = None, tokenizer: Optional[str] = None, catalog: Any = None,
                       change_wait_s: float = 60.0):
        context = serve.get_replica_context()
        tag = context.replica_tag if context is not None else f"pid{os.getpid()}"
        snapshot = await catalog.snapshot.remote() if catalog is not None else None
        engine = await asyncio.to_thread(start_engine, snapshot, specs, ServeConfig(**config), base_model, tokenizer)
        engine.join(catalog, tag, {"pid": os.getpid(), "node": socket.gethostname(),
                                   "actor": context.replica_id.to_full_id_str() if context is not None else None},
                    change_wait_s)
        if catalog is not None:
            await engine.sync(snapshot)  # the rest of the set, and the first report
            self._follow = asyncio.get_running_loop().create_task(engine.follow())
        self.engine = engine
        publish_replica(replica_app(engine, catalog), tag, engine.gate)
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
def cluster_gpus() -> float:
    """GPUs of the Ray cluster this process is connected to (of this machine, before ``ray.init``)."""
    import ray

    if ray.is_initialized():
        return float(ray.cluster_resources().get("GPU", 0))
    import torch

    return float(torch.cuda.device_count())


def replica_gpus(device: str, gpus_in_cluster: float) -> float:
    """GPUs a replica asks Ray for: one where ``--device`` is CUDA, or ``auto`` on a cluster with GPUs.
    Ray hides every GPU from a replica that asked for none, so ``auto`` would then run on the CPU."""
    if device.startswith("cuda") or (device == "auto" and gpus_in_cluster > 0):
        return 1.0
    return 0.0


def deployment_options(replicas: Optional[int] = 1, autoscale: Optional[tuple] = None, num_cpus: float = 1.0,
                       config: Optional[ServeConfig] = None, access_log: bool = False,
                       num_gpus: Optional[float] = None) -> Dict[str, Any]:
    """Ray Serve options of the server deployment. A replica may hold up to ``max_queue`` requests (Ray's default
    of 5 would cap every batch at 5); autoscaling aims at one full batch of requests per replica; ``num_gpus``
    (per replica) defaults to :func:`replica_gpus` of ``config.device``."""
    config = config or ServeConfig()
    gpus = replica_gpus(config.device, cluster_gpus()) if num_gpus is None else num_gpus
    actor = {"num_cpus": num_cpus, **({"num_gpus": gpus} if gpus else {})}
    options: Dict[str, Any] = {"ray_actor_options": actor, "max_ongoing_requests": config.max_queue,
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
              num_cpus: float = 1.0, num_gpus: Optional[float] = None, change_wait_s: float = 60.0,
              access_log: bool = False):
    """A Ray Serve application serving ``specs``: ``serve.run(build_app(specs), route_prefix="/")``."""
    config = config or ServeConfig()
    require_specs(specs)
    plain = [_spec_dict(s) for s in unique_specs(list(specs))]
    catalog = AdapterCatalog.bind(plain)
    server = BitFitServe.options(**deployment_options(replicas, autoscale, num_cpus, config, access_log, num_gpus))
    return server.bind(plain, config.to_dict(), base_model, tokenizer, catalog, change_wait_s)


def app_builder(args: Dict[str, Any]):
    """``import_path: bitfit_hf.serving.ray:app_builder`` in a ``serve run`` / ``serve deploy`` config. ``args``:
    ``adapters_file`` and / or ``adapters`` (``{name: source or {source, revision}}``), ``base_model``,
    ``tokenizer``, ``config`` (:class:`ServeConfig` fields), ``replicas`` or ``autoscale: [min, max]``,
    ``num_cpus`` and ``num_gpus`` (per replica). The config file's ``deployments:`` section may override the
    Ray options."""
    args = dict(args or {})
    known = {"adapters_file", "adapters", "base_model", "tokenizer", "config", "replicas", "autoscale", "num_cpus",
             "num_gpus"}
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
    num_gpus = float(args["num_gpus"]) if args.get("num_gpus") is not None else None
    return build_app(specs, ServeConfig(**(args.get("config") or {})), base_model, args.get("tokenizer"),
                     replicas=int(args.get("replicas", 1)), autoscale=autoscale,
                     num_cpus=float(args.get("num_cpus", 1.0)), num_gpus=num_gpus)


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


# ---- running ----------------------------------------------------------------------------------------------
def close_replicas(name: str, timeout: float) -> bool:
    """Make every replica of application ``name`` refuse new requests (503, Retry-After) and wait, up to
    ``timeout`` s, until none holds a request; whether they all emptied in time."""
    catalog = serve.get_deployment_handle(CATALOG_DEPLOYMENT, app_name=name)
    try:
        catalog.close.remote().result(timeout_s=timeout)
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            replicas = catalog.status.remote().result(timeout_s=timeout)["replicas"].values()
            if all(r.get("closing") and not r.get("busy") for r in replicas):
                return True
            time.sleep(CLOSING_REPORT_S)
    except Exception as err:  # noqa: BLE001 - the catalog gone: stop anyway, as Ray would
        logger.warning("bitfit-hf serve: could not close the replicas first (%s)", type(err).__name__)
    return False


def stop_application(name: str, local: bool, timeout: float) -> None:
    """Stop serving: the replicas refuse new requests and finish theirs; then, for a cluster started here,
    Serve shuts down, closing the HTTP proxies before the routes go (a client meets 503, then a refused
    connection, never a 404). On a shared cluster only the application is deleted: its proxies stay, and
    answer 404 for its routes from then on."""
    closed = close_replicas(name, timeout)
    logger.warning("bitfit-hf serve: replicas %s; stopping", "empty" if closed else f"not empty after {timeout:.0f} s")
    if local:
        serve.shutdown()
    else:
        serve.delete(name)


def serve_on_ray(specs: List[AdapterSpec], config: ServeConfig, base_model: Optional[str] = None,
                 tokenizer: Optional[str] = None, *, host: str = "127.0.0.1", port: int = 8080,
                 replicas: Optional[int] = 1, autoscale: Optional[tuple] = None, num_cpus: float = 1.0,
                 num_gpus: Optional[float] = None, address: Optional[str] = None, name: str = "bitfit-hf",
                 access_log: bool = False, on_ready: Optional[Callable[[str], None]] = None) -> None:
    """Deploy on a Ray cluster (``address``; none: a local one started here) and serve until SIGINT / SIGTERM,
    then stop (:func:`stop_application`) and, for a local cluster, stop it."""
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
                        num_cpus=num_cpus, num_gpus=num_gpus, access_log=access_log)
        try:
            serve.run(app, name=name, route_prefix="/", blocking=False)
        except Exception as err:  # noqa: BLE001 - a replica's start-up error, as Ray reports it
            lines = [line for line in str(err).strip().splitlines() if line.strip()]
            raise ServeError(f"the Ray deployment did not start: {lines[-1] if lines else type(err).__name__}") from None
        if on_ready is not None:
            on_ready(f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}")
        while not stop.wait(0.5):
            pass
        logger.warning("bitfit-hf serve: stopping the Ray application (new requests get 503; replicas answer "
                       "what they hold)")
        stop_application(name, address is None, config.request_timeout_s + 5)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        ray.shutdown()
    print("bitfit-hf serve: stopped", file=sys.stderr, flush=True)


__all__ = ["AdapterCatalog", "BitFitServe", "Gate", "REPLICA_HEADER", "ReplicatedEngine", "app_builder", "build_app",
           "deployment_options", "free_port", "has_applied", "is_newer", "parse_autoscale", "plan", "replica_gpus",
           "serve_on_ray"]
