"""The rules that keep Ray replicas in agreement, without a Ray cluster: catalog versions, which snapshot a
replica applies, which replicas an admin call waits for, how a replacement starts, the stopping gate, and
the GPU a replica asks for. The replicas here are real engines on tiny adapters; the catalog is the
deployment's class itself, called in-process through a stand-in for its handle."""

from __future__ import annotations

import asyncio
import shutil
import types

import pytest
from serve_support import adapters  # noqa: F401 - fixture

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'bitfit-hf[ray]')")

from bitfit_hf.serving import ray as on_ray  # noqa: E402
from bitfit_hf.serving.config import AdapterSpec, ServeConfig, ServeError  # noqa: E402
from bitfit_hf.serving.tasks import InputError  # noqa: E402

Catalog = on_ray.AdapterCatalog.func_or_class


def spec(name, source):
    return {"name": name, "source": str(source), "revision": None}


def snap(version, names=(), epoch="e1", strict=False, entries=None):
    entries = [spec(n, f"/a/{n}") for n in names] if entries is None else entries
    return {"epoch": epoch, "version": version, "adapters": entries, "closing": False, "strict": strict}


class Handle:
    """A DeploymentHandle stand-in: ``handle.method.remote(*args)`` awaits the catalog's method. ``delay_s``
    holds a long poll's answer back after it was taken, as the network does."""

    def __init__(self, catalog, delay_s: float = 0.0):
        self.catalog, self.delay_s = catalog, delay_s

    def __getattr__(self, name):
        method = getattr(self.catalog, name)
        if name != "wait" or not self.delay_s:
            return types.SimpleNamespace(remote=method)

        async def late(*args):
            answer = await method(*args)
            await asyncio.sleep(self.delay_s)
            return answer

        return types.SimpleNamespace(remote=late)


async def replica(handle, tag, source, change_wait_s=0.2):
    """A replica on one adapter, joined to the catalog behind ``handle`` and synced with it."""
    engine = on_ray.ReplicatedEngine.create([AdapterSpec("c0", source)], ServeConfig(threads=1, max_wait_ms=1))
    engine.join(handle, tag, None, change_wait_s)
    await engine.sync(await handle.catalog.snapshot())
    return engine


def close(*engines):
    for engine in engines:
        engine.close(5)


# ---- the rules, as functions ------------------------------------------------------------------------------
def test_only_a_later_snapshot_or_another_catalog_is_applied():
    assert on_ray.is_newer(snap(3, []), (None, -1))             # a new replica applies anything
    assert on_ray.is_newer(snap(4, []), ("e1", 3))
    assert not on_ray.is_newer(snap(3, []), ("e1", 3))          # the one applied
    assert not on_ray.is_newer(snap(2, []), ("e1", 3))          # older: fetched before a change applied since
    assert on_ray.is_newer(snap(0, [], epoch="e2"), ("e1", 3))  # a restarted catalog numbers from 0 again
    assert on_ray.has_applied({"epoch": "e1", "version": 4}, snap(3, []))
    assert not on_ray.has_applied({"epoch": "e1", "version": 2}, snap(3, []))
    assert not on_ray.has_applied({"epoch": "e0", "version": 9}, snap(3, []))


def test_plan_drops_what_is_gone_or_moved_and_loads_what_is_missing():
    served = {"a": ("/a/a", None), "b": ("/a/b", None), "c": ("/old/c", None)}
    drop, load = on_ray.plan(served, {s["name"]: s for s in snap(1, ["a", "c", "d"])["adapters"]})
    assert sorted(drop) == ["b", "c"] and sorted(load) == ["c", "d"]


def test_dead_and_silent_replicas_are_not_counted():
    replicas = {"live": {"seen": 100.0, "where": {"actor": "A"}}, "killed": {"seen": 100.0, "where": {"actor": "K"}},
                "silent": {"seen": 100.0 - on_ray.REPLICA_STALE_S - 1, "where": {"actor": "S"}}}
    assert on_ray.live_replicas(replicas, 100.0, lambda where: where["actor"] != "K") == ["live"]


# ---- the catalog ------------------------------------------------------------------------------------------
def test_the_catalog_numbers_changes_and_forgets_dead_replicas():
    async def scenario():
        dead = set()
        catalog = Catalog([spec("c0", "/a/c0")], alive=lambda where: where["actor"] not in dead)
        first = await catalog.snapshot()
        assert first["version"] == 0 and first["strict"]
        added = await catalog.add(spec("x", "/a/x"))
        assert added["changed"] and added["snapshot"]["version"] == 1
        assert [s["name"] for s in added["snapshot"]["adapters"]] == ["c0", "x"]
        again = await catalog.add(spec("x", "/b/x"))
        assert not again["changed"] and again["snapshot"]["version"] == 1
        assert (await catalog.wait(first["epoch"], 0, 5))["version"] == 1  # behind: answered at once
        waiting = asyncio.ensure_future(catalog.wait(first["epoch"], 1, 5))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        removed = await catalog.remove("x")
        assert removed["changed"] and (await waiting)["version"] == 2
        assert not (await catalog.remove("x"))["changed"]
        for tag in ("r1", "r2"):
            await catalog.report(tag, {"epoch": first["epoch"], "version": 2, "adapters": ["c0"], "failed": {},
                                       "where": {"actor": tag}})
        assert not (await catalog.snapshot())["strict"]  # a replica started: later ones start leniently
        dead.add("r2")
        status = await catalog.status()
        assert list(status["replicas"]) == ["r1"] and status["replicas"]["r1"]["missing"] == []
        closing = asyncio.ensure_future(catalog.wait(first["epoch"], 2, 5))
        await asyncio.sleep(0.05)
        await catalog.close()
        assert (await closing)["closing"]

    asyncio.run(scenario())


# ---- replicas against one catalog -------------------------------------------------------------------------
def test_a_stale_snapshot_never_undoes_a_change(adapters):  # noqa: F811
    """A long poll's snapshot taken before a delete, applied after it, must not re-serve the adapter."""

    async def scenario():
        catalog = Catalog([spec("c0", adapters["c0"])])
        a = await replica(Handle(catalog), "A", adapters["c0"])
        try:
            await a.add("x", adapters["c1"])
            stale = await catalog.snapshot()
            await a.remove("x")
            await a.sync(stale)
            assert "x" not in a.registry.entries and a.applied == (catalog.epoch, 2)
        finally:
            close(a)

    asyncio.run(scenario())


def test_add_then_delete_within_10_ms_never_reserves_it(adapters):  # noqa: F811
    """The same race live: a replica following a catalog whose answers arrive 20 ms late, an add and a
    delete 10 ms apart; the registry is sampled every millisecond after the delete returned."""

    async def scenario():
        catalog = Catalog([spec("c0", adapters["c0"])])
        handle = Handle(catalog, delay_s=0.02)
        a = await replica(handle, "A", adapters["c0"])
        follow = asyncio.ensure_future(a.follow())
        reserved = 0
        try:
            for i in range(5):
                added = asyncio.ensure_future(a.add(f"x{i}", adapters["c1"]))
                await asyncio.sleep(0.01)
                try:
                    await a.remove(f"x{i}")
                except InputError as err:  # the delete reached the catalog first: delete again once added
                    assert err.status == 404
                    await added
                    await a.remove(f"x{i}")
                await added
                for _ in range(100):
                    reserved += f"x{i}" in a.registry.entries
                    await asyncio.sleep(0.001)
            assert reserved == 0
            assert set(a.registry.entries) == {"c0"}
        finally:
            follow.cancel()
            close(a)

    asyncio.run(scenario())


def test_concurrent_adds_on_two_replicas_reach_both(adapters):  # noqa: F811
    """B adds while it has not yet seen A's add: the catalog's answer holds both, so B serves both and its
    version is honest; A gets B's with its next long poll. Then 10 rounds of simultaneous adds, followed."""

    async def scenario():
        catalog = Catalog([spec("c0", adapters["c0"])])
        handle = Handle(catalog)
        a = await replica(handle, "A", adapters["c0"])
        b = await replica(handle, "B", adapters["c0"])
        follows = []
        try:
            await a.add("x", adapters["c1"])
            answer = await b.add("y", adapters["c2"])
            assert set(b.registry.entries) == {"c0", "x", "y"} and b.applied == (catalog.epoch, 2)
            assert answer["replicas"]["pending"] == ["A"]  # A has not followed yet (no long poll running)
            await a.sync(await catalog.wait(*a.applied, 5))
            assert set(a.registry.entries) == {"c0", "x", "y"}
            a.change_wait_s = b.change_wait_s = 30

            follows = [asyncio.ensure_future(e.follow()) for e in (a, b)]
            for i in range(10):
                answers = await asyncio.gather(a.add(f"p{i}", adapters["c1"]), b.add(f"q{i}", adapters["c2"]))
                assert all(not x["replicas"]["pending"] for x in answers), answers
            want = {"c0", "x", "y", *(f"p{i}" for i in range(10)), *(f"q{i}" for i in range(10))}
            assert set(a.registry.entries) == set(b.registry.entries) == want
            assert a.applied == b.applied == (catalog.epoch, catalog.version)
        finally:
            for task in follows:
                task.cancel()
            close(a, b)

    asyncio.run(scenario())


# ---- starting a replica -----------------------------------------------------------------------------------
def test_a_replacement_starts_from_the_catalog_whatever_was_deleted(adapters, tmp_path):  # noqa: F811
    doomed = shutil.copytree(adapters["c1"], tmp_path / "doomed")
    deployed = [spec("doomed", doomed), spec("c0", adapters["c0"])]
    shutil.rmtree(doomed)  # deleted from the catalog, its folder gone since
    config = ServeConfig(threads=1)
    engine = on_ray.start_engine(snap(2, entries=[spec("c0", adapters["c0"])]), deployed, config, None, None)
    assert set(engine.registry.entries) == {"c0"}
    close(engine)

    # the catalog still lists an adapter this replica cannot load: it starts on the rest, and reports it
    listed = [spec("doomed", doomed), spec("c0", adapters["c0"])]
    engine = on_ray.start_engine(snap(2, entries=listed), deployed, config, None, None)
    assert set(engine.registry.entries) == {"c0"}
    close(engine)

    # the deployment itself (no replica has started yet) still needs every adapter, as the plain server
    with pytest.raises(ServeError, match="doomed"):
        on_ray.start_engine(snap(0, entries=listed, strict=True), deployed, config, None, None)

    # an empty catalog: a deploy-time adapter gives the base, and the sync drops it
    engine = on_ray.start_engine(snap(3), deployed, config, None, None)
    assert set(engine.registry.entries) == {"c0"}
    close(engine)


# ---- stopping ---------------------------------------------------------------------------------------------
def test_the_gate_refuses_new_requests_with_retry_after_once_stopping(monkeypatch):
    gate = on_ray.Gate(retry_after_s=2)
    seen = []

    async def app(scope, receive, send):
        seen.append(gate.busy)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    monkeypatch.setattr(on_ray, "_REPLICA", {"app": app, "tag": "r1", "gate": gate})

    async def call():
        sent = []

        async def send(message):
            sent.append(message)

        await on_ray.ReplicaApp()({"type": "http", "path": "/predict"}, None, send)
        return sent[0]["status"], dict(sent[0]["headers"])

    status, headers = asyncio.run(call())
    assert status == 200 and headers[on_ray.REPLICA_HEADER.encode()] == b"r1"
    assert seen == [1] and gate.busy == 0
    gate.closing = True
    status, headers = asyncio.run(call())
    assert status == 503 and headers[b"retry-after"] == b"2" and headers[on_ray.REPLICA_HEADER.encode()] == b"r1"
    assert seen == [1]


def test_every_503_of_the_app_says_when_to_retry():
    from bitfit_hf.serving.app import _error

    assert _error(InputError(503, "the server is shutting down.", "unavailable"), 3).headers["retry-after"] == "3"
    full = InputError(503, "full", "overloaded", headers={"Retry-After": "7"})
    assert _error(full, 3).headers["retry-after"] == "7"
    assert "retry-after" not in _error(InputError(404, "no adapter", "not_found")).headers


# ---- the GPU ----------------------------------------------------------------------------------------------
def test_replicas_ask_for_a_gpu_where_the_device_is_cuda(monkeypatch):
    import ray
    import torch

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0, "GPU": 2.0})
    assert on_ray.cluster_gpus() == 2.0

    def actor(device, **kwargs):
        return on_ray.deployment_options(config=ServeConfig(device=device), **kwargs)["ray_actor_options"]

    assert actor("auto") == {"num_cpus": 1.0, "num_gpus": 1.0}   # auto on a cluster with GPUs
    assert actor("cuda:0") == {"num_cpus": 1.0, "num_gpus": 1.0}
    assert actor("cpu") == {"num_cpus": 1.0}
    assert actor("auto", num_gpus=0.5) == {"num_cpus": 1.0, "num_gpus": 0.5}  # replicas sharing a GPU
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0})
    assert actor("auto") == {"num_cpus": 1.0}                     # no GPU anywhere: the CPU, as asked
    assert actor("cuda") == {"num_cpus": 1.0, "num_gpus": 1.0}    # Ray then waits for a GPU node

    monkeypatch.setattr(ray, "is_initialized", lambda: False)     # before ray.init: this machine's
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert actor("auto") == {"num_cpus": 1.0, "num_gpus": 1.0}
