"""The routing tables a mixed forward pass reads are built on the worker thread that reads them: at start and
after every admin change, never on the thread that created the engine (the server's event loop), where they made
every pass slower under load. And the bias deltas a pass gathers at once equal those the tables hold."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time

import pytest
import torch
from serve_support import adapters, specs  # noqa: F401 - fixture

from bitfit_hf.adapters.routing import Router
from bitfit_hf.serving.engine import Engine


def test_tables_are_built_on_the_worker_at_start_and_after_an_admin_change(adapters, monkeypatch):  # noqa: F811
    built = []
    original = Router.build

    def build(self):
        original(self)
        built.append(threading.current_thread().name)

    monkeypatch.setattr(Router, "build", build)
    engine = Engine.create(specs(adapters, "c0", "c1", "ab"), tokenizer=adapters["base"])
    try:
        assert "MainThread" not in built  # creating the engine built nothing here
        until = time.monotonic() + 30
        while not built and time.monotonic() < until:
            time.sleep(0.01)
        assert built == ["bitfit-serve-worker"]
        group = next(g for g in engine.registry.groups.values() if g.mode == "mixed")
        assert group.mt.router._fused is not None  # noqa: SLF001 - built before the first pass
        asyncio.run(engine.remove("c1"))  # an admin change, run on the worker
        assert built == ["bitfit-serve-worker"] * 2
        assert group.mt.router._fused is not None  # noqa: SLF001 - the rebuilt routing's, built before it serves
    finally:
        engine.close()


def test_the_gathered_bias_deltas_are_each_layers_rows(adapters):  # noqa: F811
    engine = Engine.create(specs(adapters, "c0", "c1", "ab"), tokenizer=adapters["base"], start=False)
    group = next(g for g in engine.registry.groups.values() if g.mode == "mixed")
    router = group.mt.router
    router.build()
    ids = torch.tensor([2, 0, 3, 1, 0])  # index 3: the stock model
    picked = router._picked_bias(ids)  # noqa: SLF001 - the gather under test
    assert picked
    for name, layer in router.layers.items():
        rows = layer.bias_rows()
        if rows is None:
            assert name not in picked
            continue
        assert torch.equal(picked[name].squeeze(1), rows[ids])
        assert not picked[name][2].any()  # the stock model's row adds nothing


def test_the_worker_its_torch_threads_and_the_tokenizers_carry_their_os_names(adapters):  # noqa: F811
    """So `top -H` and benchmarks/serve_load.py can tell the server's CPU by thread."""
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc (Linux)")
    from bitfit_hf.serving.batcher import WORKER_THREAD
    from bitfit_hf.serving.engine import TOKENIZER_THREAD

    engine = Engine.create(specs(adapters, "c0", "c1"), tokenizer=adapters["base"])
    try:
        body = {"inputs": "a short sentence", "adapter": "c0"}
        asyncio.run(engine.prepare_off_loop(body))  # starts a tokenizing thread
        done = threading.Event()
        engine.submit(engine.resolve("c0"), engine.prepare(body)[2], lambda result, error: done.set(), time.monotonic() + 60)
        assert done.wait(60)
        names = {}
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/comm") as handle:
                names[int(tid)] = handle.read().strip()
        worker = next(t for t in threading.enumerate() if t.name == "bitfit-serve-worker")
        assert names[worker.native_id] == WORKER_THREAD
        assert TOKENIZER_THREAD in names.values()
    finally:
        engine.close()
