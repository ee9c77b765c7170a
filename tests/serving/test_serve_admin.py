"""Adding and removing adapters while serving: token-protected, the others keep serving through a failed
load, and the token never reaches a log."""

from __future__ import annotations

import logging
import os
import shutil
import threading

import pytest
from serve_support import ADMIN_TOKEN, adapters, call, predict, specs, start_server  # noqa: F401 - fixtures
from tiny import alone, tiny_tokenizer

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def scores(model, text):
    import torch

    with torch.no_grad():
        probs = model(**tiny_tokenizer()(text, return_tensors="pt")).logits[0].softmax(-1)
    return {model.config.id2label[i]: float(p) for i, p in enumerate(probs)}


def test_admin_routes_need_the_token(adapters, start_server):  # noqa: F811
    off = start_server(specs(adapters, "c0"))
    status, _, body = call(off.url, "POST", "/admin/adapters", {"name": "c1", "source": adapters["c1"]}, headers=AUTH)
    assert status == 403 and "BITFIT_HF_ADMIN_TOKEN" in body["error"]
    on = start_server(specs(adapters, "c0"), admin_token=ADMIN_TOKEN)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": ADMIN_TOKEN}):
        status, _, body = call(on.url, "POST", "/admin/adapters", {"name": "c1", "source": adapters["c1"]}, headers=headers)
        assert status == 401 and body["error_type"] == "unauthorized"
        assert call(on.url, "DELETE", "/admin/adapters/c0", headers=headers)[0] == 401
    assert [a["name"] for a in call(on.url, "GET", "/adapters")[2]] == ["c0"]


def test_hot_add_and_remove_while_serving(adapters, start_server, caplog):  # noqa: F811
    caplog.set_level(logging.DEBUG)
    server = start_server(specs(adapters, "c0"), admin_token=ADMIN_TOKEN)
    stop = threading.Event()
    statuses = []

    def traffic():  # c0 is asked all along: adding and removing others never disturbs it
        while not stop.is_set():
            statuses.append(predict(server.url, {"inputs": "the cat sat", "adapter": "c0"})[0])

    worker = threading.Thread(target=traffic)
    worker.start()
    try:
        status, _, added = call(server.url, "POST", "/admin/adapters", {"name": "sst", "source": adapters["c2"]}, headers=AUTH)
        assert status == 201 and added["name"] == "sst" and added["batching"] == "mixed" and len(added["labels"]) == 5
        status, _, body = predict(server.url, {"inputs": "a good film", "adapter": "sst"})
        assert status == 200
        assert {g["label"]: g["score"] for g in body} == pytest.approx(scores(alone(adapters["c2"]), "a good film"), abs=1e-5)
        status, _, added = call(server.url, "POST", "/admin/adapters", {"name": "ab", "source": adapters["ab"]}, headers=AUTH)
        assert status == 201 and added["batching"] == "mixed"  # AdapterBias shares the batches too
        assert predict(server.url, {"inputs": "a good film", "adapter": "ab"})[0] == 200
        status, _, tagger = call(server.url, "POST", "/admin/adapters", {"name": "pos", "source": adapters["tag"]}, headers=AUTH)
        assert status == 201 and tagger["task"] == "tagging"  # a new head type: built on the shared base
        assert predict(server.url, {"inputs": "the cat", "adapter": "pos"})[0] == 200

        assert call(server.url, "POST", "/admin/adapters", {"name": "sst", "source": adapters["c1"]}, headers=AUTH)[0] == 409
        status, _, body = call(server.url, "DELETE", "/admin/adapters/sst", headers=AUTH)
        assert status == 200 and body["removed"] == "sst" and "sst" not in body["adapters"]
        status, _, body = predict(server.url, {"inputs": "a good film", "adapter": "sst"})
        assert status == 404 and "c0" in body["error"]
        assert call(server.url, "DELETE", "/admin/adapters/sst", headers=AUTH)[0] == 404
    finally:
        stop.set()
        worker.join(30)
    assert statuses and set(statuses) == {200}
    assert sorted(a["name"] for a in call(server.url, "GET", "/adapters")[2]) == ["ab", "c0", "pos"]
    assert ADMIN_TOKEN not in caplog.text


def test_an_adapter_that_fails_to_load_leaves_the_others_serving(adapters, start_server, tmp_path):  # noqa: F811
    server = start_server(specs(adapters, "c0", "c1"), admin_token=ADMIN_TOKEN)
    assert predict(server.url, {"inputs": "the cat", "adapter": "c0"})[0] == 200  # the worker has started
    before = call(server.url, "GET", "/adapters")[2]
    damaged = shutil.copytree(adapters["c2"], tmp_path / "damaged")
    weights = os.path.join(damaged, "adapter_model.safetensors")
    with open(weights, "r+b") as handle:
        handle.seek(os.path.getsize(weights) - 8)
        handle.write(b"\x00" * 8)  # the tensors no longer match their recorded digest
    cases = [
        ({"name": "bad", "source": str(damaged)}, "bad"),
        ({"name": "gone", "source": str(tmp_path / "missing")}, "gone"),
        ({"name": "other", "source": adapters["other"]}, "differ"),  # trained on another base
        ({"name": "x y", "source": adapters["c2"]}, "not usable"),
        ({"name": "c3"}, "source"),
    ]
    for payload, word in cases:
        status, _, body = call(server.url, "POST", "/admin/adapters", payload, headers=AUTH)
        assert status == 422, body
        assert word in body["error"] and "\n" not in body["error"], body
        assert predict(server.url, {"inputs": "the cat", "adapter": "c1"})[0] == 200
    assert call(server.url, "GET", "/adapters")[2] == before
    status, _, body = call(server.url, "POST", "/admin/adapters", raw=b"{oops", headers=AUTH)
    assert status == 400 and body["error_type"] == "invalid_json"


def test_an_add_builds_a_new_head_types_model_off_the_worker_thread(adapters, start_server, monkeypatch):  # noqa: F811
    """The worker answers requests while a tagger's model (a new head type) is built for an admin add."""
    from bitfit_hf.serving.models import Backbone

    builds = []
    build = Backbone.build

    def recording(self, adapter):
        builds.append(threading.current_thread().name)
        return build(self, adapter)

    monkeypatch.setattr(Backbone, "build", recording)
    server = start_server(specs(adapters, "c0"), admin_token=ADMIN_TOKEN)
    assert builds == ["MainThread"]  # the first model, at start-up
    status, _, added = call(server.url, "POST", "/admin/adapters", {"name": "pos", "source": adapters["tag"]}, headers=AUTH)
    assert status == 201 and added["task"] == "tagging"
    assert len(builds) == 2 and builds[1] != "bitfit-serve-worker"
    assert predict(server.url, {"inputs": "the cat", "adapter": "pos"})[0] == 200
    assert call(server.url, "DELETE", "/admin/adapters/pos", headers=AUTH)[0] == 200
    assert call(server.url, "POST", "/admin/adapters", {"name": "pos2", "source": adapters["tag"]}, headers=AUTH)[0] == 201
    assert len(builds) == 2  # the tagger's group is kept: no second build
