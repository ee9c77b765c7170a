"""Tokens and tokenizing: batches capped by padded tokens, each input tokenized once on a tokenizing thread,
the shared tokenizer never changed by a request's truncation side, and an adapter that cannot be routed per
example named by its refusal."""

from __future__ import annotations

import copy
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import List

import pytest
from serve_support import adapters, predict, specs  # noqa: F401 - fixtures
from tiny import alone, tiny_tokenizer

from bitfit_hf.adapters.multitask import TaskRefused
from bitfit_hf.inference.inputs import Feature, encode
from bitfit_hf.inference.predictor import Predictor
from bitfit_hf.serving import models
from bitfit_hf.serving.batcher import Job, Worker
from bitfit_hf.serving.config import ServeConfig
from bitfit_hf.serving.engine import Engine
from bitfit_hf.serving.metrics import Metrics
from bitfit_hf.serving.server import BackgroundServer

LONG = " ".join(["cat", "dog", "film"] * 40)  # 122 tokens, past the tiny model's 64


class Counted:
    """A tokenizer that records each call's thread; its copies (one per thread and side) share the record."""

    def __init__(self, inner, calls: List[str]):
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "calls", calls)

    def __call__(self, *args, **kwargs):
        self.calls.append(threading.current_thread().name)
        return self.inner(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __setattr__(self, name, value):
        setattr(self.inner, name, value)

    def __deepcopy__(self, memo):
        return Counted(copy.deepcopy(self.inner, memo), self.calls)


def feature(length: int, item: int = 0) -> Feature:
    return Feature({"input_ids": [1] * length, "attention_mask": [1] * length}, item)


def job(*lengths: int) -> Job:
    return Job(adapter="a", inputs=[feature(n, i) for i, n in enumerate(lengths)], on_done=lambda *_: None)


def worker(**caps) -> Worker:
    return Worker(None, Metrics(), max_wait_ms=0, max_queue=100, pad_id=0, **caps)


def test_the_token_budget_splits_a_batch_by_tokens():
    w = worker(max_batch_size=32, max_batch_tokens=150)
    long, short = job(120), [job(10) for _ in range(3)]
    for j in (long, *short):
        w.submit(j)
    assert w._next_batch() == [long]  # 2 rows x 120 tokens is past 150: the long input goes alone
    assert w._next_batch() == short
    rows = [(0, 0, feature(120)), *((1, i, feature(10)) for i in range(3))]
    assert [[r[2].length for r in c] for c in w._chunks(rows)] == [[120], [10, 10, 10]]
    assert [len(c) for c in worker(max_batch_size=32, max_batch_tokens=30)._chunks(rows[1:])] == [3]
    assert [len(c) for c in worker(max_batch_size=3, max_batch_tokens=10**6)._chunks(rows)] == [1, 3]


def test_inputs_of_very_different_lengths_go_in_passes_of_their_own_when_the_padding_saved_outweighs_a_pass():
    w = worker(max_batch_size=32, max_batch_tokens=10**6)
    overhead = w.pass_cost.overhead_tokens  # the prior: no pass seen yet
    assert f"bitfit_serve_pass_overhead_tokens {overhead}".encode() in w.metrics.render()  # before the first pass

    def cut(*lengths):
        return [[r[2].length for r in c] for c in w._chunks([(0, i, feature(n)) for i, n in enumerate(lengths)])]

    assert cut(20, 19, 18, 18, 17) == [[20, 19, 18, 18, 17]]  # little padding: one pass
    assert cut(60, 58, 12, 11, 10, 10, 9, 9) == [[60, 58], [12, 11, 10, 10, 9, 9]]  # 8 x 60 padded: two passes
    assert 0 < overhead < 60
    many = [30] + [10] * 3  # splitting saves 3 x 20 = 60 padded tokens, more than one pass's overhead
    assert cut(*many) == [[30], [10, 10, 10]]
    for tokens in [40, 80, 160, 320] * 10:  # passes that cost 100 tokens' worth beyond their tokens
        w.pass_cost.observe(tokens, 0.001 * (100 + tokens))
    assert w.pass_cost.overhead_tokens == pytest.approx(100, rel=1e-6)
    assert cut(*many) == [many]  # the same split now saves less than the pass it adds
    assert cut(60, 58, 12, 11, 10, 10, 9, 9) == [[60, 58], [12, 11, 10, 10, 9, 9]]  # 8 x 60: still worth it


def test_a_small_token_budget_splits_forward_passes_and_keeps_the_answers(adapters):  # noqa: F811
    engine = Engine.create(specs(adapters, "c0"), ServeConfig(max_batch_tokens=100, device="cpu"), start=False)
    group = next(iter(engine.registry.groups.values()))
    passes, forward = [], group.forward
    group.forward = lambda batch, tasks: passes.append(tuple(batch["input_ids"].shape)) or forward(batch, tasks)
    items = [LONG, "the cat sat", "a dog runs", "the film was good"]
    entry, parsed, encoded, options = engine.prepare({"inputs": items, "adapter": "c0", "truncate": True})
    done = []
    engine.worker.run_batch([Job("c0", encoded, lambda result, error: done.append((result, error)))])
    assert passes == [(1, 64), (3, 6)]  # the 64-token row alone; three short rows padded to 6 together
    assert engine.worker.pass_cost.passes == 2  # each pass taught the cost model
    result, error = done[0]
    assert error is None
    served = engine.answer(entry, parsed, encoded, result, options)
    expected = Predictor(alone(adapters["c0"]), tiny_tokenizer(), "SEQ_CLS").predict([(t, None) for t in items])
    for got, want in zip(served, expected):
        assert {g["label"]: g["score"] for g in got} == pytest.approx({w["label"]: w["score"] for w in want}, abs=1e-5)
    engine.tokenizers.close()


@pytest.mark.parametrize("side", ["right", "left"])
def test_an_input_cut_from_its_uncut_encoding_equals_the_tokenizers_own_cut(side):
    tok = tiny_tokenizer()
    tok.truncation_side = side
    for text, limit in [(LONG, 64), (LONG, 3), ("the cat sat on the mat", 5), ("the cat", 64)]:
        want = tok(text, truncation=True, max_length=limit)
        got = encode(tok, "SEQ_CLS", [(text, None)], limit)[0]
        assert got.features == {k: list(want[k]) for k in ("input_ids", "attention_mask", "token_type_ids") if k in want}
        assert got.meta["tokens"] == len(tok(text)["input_ids"])


@pytest.fixture
def counted_server(adapters):  # noqa: F811
    calls: List[str] = []
    tokenizer = Counted(tiny_tokenizer(), calls)
    engine = Engine.create(specs(adapters, "c0"), ServeConfig(device="cpu"), tokenizer=tokenizer, start=False)
    server = BackgroundServer(engine).start()
    try:
        yield server, tokenizer, calls
    finally:
        server.stop()


def test_each_input_is_tokenized_once_off_the_event_loop(counted_server):
    server, _, calls = counted_server
    inputs = ["the cat sat", LONG, "the film"]  # the long one is cut from its uncut encoding
    status, _, body = predict(server.url, {"inputs": inputs, "adapter": "c0", "truncate": True})
    assert status == 200 and len(body) == 3
    assert len(calls) == 3
    assert all(name.startswith("bitfit-tokenize") for name in calls), calls


def test_truncation_sides_of_concurrent_requests_never_touch_the_shared_tokenizer(counted_server, adapters):  # noqa: F811
    server, tokenizer, _ = counted_server
    seen, stop = set(), threading.Event()

    def watch():
        while not stop.is_set():
            seen.add(tokenizer.inner.truncation_side)

    watcher = threading.Thread(target=watch)
    watcher.start()
    sides = ["Left", "Right"] * 8
    try:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda side: predict(server.url, {"inputs": LONG, "adapter": "c0", "truncate": True,
                                                                      "truncation_direction": side})[2], sides))
    finally:
        stop.set()
        watcher.join()
    assert seen == {"right"}
    model = alone(adapters["c0"])
    for side in ("left", "right"):
        tok = tiny_tokenizer()
        tok.truncation_side = side
        want = {w["label"]: w["score"] for w in Predictor(model, tok, "SEQ_CLS").predict([(LONG, None)])[0]}
        for got, asked in zip(answers, sides):
            if asked.lower() == side:
                assert {g["label"]: g["score"] for g in got} == pytest.approx(want, abs=1e-5)


def _group_of_three(adapters):
    """A mixed group holding c0, c1 and c2."""
    from bitfit_hf import BitFitAdapter

    group = models.MixedGroup(models.Backbone(device="cpu", dtype="float32").build(BitFitAdapter.from_pretrained(adapters["c0"])))
    for name in ("c0", "c1", "c2"):
        group.add(name, BitFitAdapter.from_pretrained(adapters[name]))
    return group


def test_eviction_names_the_adapter_its_refusal_names(adapters, monkeypatch):  # noqa: F811
    group = _group_of_three(adapters)
    real = models.MultiTaskModel

    def refusing(bank, tasks):
        if "c0" in tasks:  # the message names another adapter: only the exception's data may decide
            raise TaskRefused("c0", "Task 'c2' is mentioned here, but 'c0' is the one refused.")
        return real(bank, tasks=tasks)

    monkeypatch.setattr(models, "MultiTaskModel", refusing)
    failed = group.rebuild(["c0", "c1", "c2"])
    assert [name for name, _ in failed] == ["c0"]
    assert group.names == ["c1", "c2"] and group.mt.tasks == ["c1", "c2"]


def test_a_refusal_naming_no_candidate_takes_every_candidate_out(adapters, monkeypatch):  # noqa: F811
    from bitfit_hf.adapters.config import AdapterError

    group = _group_of_three(adapters)
    real = models.MultiTaskModel

    def refusing(bank, tasks):
        if len(tasks) > 1:
            raise AdapterError("Task 'c2' cannot share a batch with the others.")
        return real(bank, tasks=tasks)

    monkeypatch.setattr(models, "MultiTaskModel", refusing)
    failed = group.rebuild(["c1", "c2"])
    assert sorted(name for name, _ in failed) == ["c1", "c2"]
    assert group.names == ["c0"]
