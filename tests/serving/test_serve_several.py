"""One request, several adapters: ``"adapter": [names]`` or ``{"task": ...}`` gets every adapter's answer, keyed by
name, from forward passes the adapters share; each answer is what that adapter loaded alone gives."""

from __future__ import annotations

import pytest
import torch
from serve_support import adapters, call, metric, predict, specs, start_server  # noqa: F401 - fixtures
from tiny import alone, tiny_tokenizer

ATOL = 1e-5


def _scores(model, text, pair=None):
    with torch.no_grad():
        probs = model(**tiny_tokenizer()(text, pair, return_tensors="pt")).logits[0].softmax(-1)
    return {model.config.id2label[i]: float(p) for i, p in enumerate(probs)}


def test_one_request_names_several_adapters_and_gets_each_ones_answer_from_one_forward_pass(adapters, start_server):  # noqa: F811
    server = start_server(specs(adapters, "c0", "c1", "ab", "tag"), max_wait_ms=50)
    models = {name: alone(adapters[name]) for name in ("c0", "c1", "ab")}
    status, _, body = predict(server.url, {"inputs": "a very good film", "adapter": ["c0", "ab", "c1"]})
    assert status == 200, body
    assert list(body) == ["c0", "ab", "c1"]  # keyed by adapter, in the order asked
    for name, answer in body.items():
        assert {g["label"]: g["score"] for g in answer} == pytest.approx(_scores(models[name], "a very good film"), abs=ATOL)
    text = call(server.url, "GET", "/metrics")[2]
    assert metric(text, "bitfit_serve_batch_adapters_count") == 1  # the three adapters' inputs: one forward pass
    assert metric(text, "bitfit_serve_batch_adapters_sum") == 3
    assert all(metric(text, "bitfit_serve_requests_total", adapter=a, status="200") == 1 for a in ("c0", "c1", "ab"))

    status, _, by_task = predict(server.url, {"inputs": [["a very good film"], ["boring"]],
                                              "adapter": {"task": "classification"}})
    assert status == 200 and sorted(by_task) == ["ab", "c0", "c1"] and all(len(a) == 2 for a in by_task.values())
    second = {g["label"]: g["score"] for g in by_task["c1"][1]}
    assert second == pytest.approx(_scores(models["c1"], "boring"), abs=ATOL)


def test_several_adapters_are_refused_clearly(adapters, start_server):  # noqa: F811
    server = start_server(specs(adapters, "c0", "c1", "tag"), max_client_batch_size=4)
    status, _, body = predict(server.url, {"inputs": "x", "adapter": ["c0", "tag"]})
    assert status == 422 and "one task" in body["error"] and "tag (tagging)" in body["error"]
    status, _, body = predict(server.url, {"inputs": "x", "adapter": ["c0", "nope"]})
    assert status == 404 and "nope" in body["error"]
    assert predict(server.url, {"inputs": "x", "adapter": ["c0", "c0"]})[0] == 422
    assert predict(server.url, {"inputs": "x", "adapter": []})[0] == 422
    assert predict(server.url, {"inputs": "x", "adapter": {"task": "translation"}})[0] == 422
    status, _, body = predict(server.url, {"inputs": "x", "adapter": {"task": "question-answering"}})
    assert status == 404 and "no question-answering adapter" in body["error"]
    status, _, body = predict(server.url, {"inputs": [["a"], ["b"], ["c"]], "adapter": ["c0", "c1"]})
    assert status == 413 and "3 input(s) for 2 adapters is 6 answers" in body["error"]
