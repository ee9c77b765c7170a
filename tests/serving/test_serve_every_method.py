"""`bitfit-hf serve` mixes adapters of every method in its forward passes: classification, tagging and QA adapters
of BitFit, `one-d`, (IA)³, BitFit + (IA)³, LoRA, BitFit + LoRA, AdapterBias and LayerNorm tuning, asked
concurrently, each answer what that adapter loaded alone onto a fresh base answers (1e-5)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from serve_support import call, metric, predict, start_server  # noqa: F401 - fixtures
from tiny import alone, make_adapter, save_base, tiny_tokenizer

from bitfit_hf import BitFitConfig
from bitfit_hf.serving.config import AdapterSpec
from bitfit_hf.tuners.adapterbias import AdapterBiasConfig
from bitfit_hf.tuners.bitfit_ia3 import BitFitIA3Config, IA3Config
from bitfit_hf.tuners.bitfit_lora import BitFitLoraConfig
from bitfit_hf.tuners.ln_tuning import LNTuningMethodConfig

ATOL = 1e-5
METHODS = {
    "bitfit": BitFitConfig("all"), "one_d": BitFitConfig("one-d"), "ia3": IA3Config(), "bitfit_ia3": BitFitIA3Config(),
    "lora": BitFitLoraConfig(lora_r=4, lora_alpha=8, lora_dropout=0.0, bias_terms="frozen"),
    "bitfit_lora": BitFitLoraConfig(lora_r=2, lora_dropout=0.0), "adapterbias": AdapterBiasConfig(share_alpha=True),
    "ln_tuning": LNTuningMethodConfig(),
}
TAGGERS, READERS = ("ia3", "lora", "adapterbias", "ln_tuning"), ("bitfit_lora", "one_d", "adapterbias")
TEXTS = ["the cat sat on the mat", "a very good film", "boring and long", "what a delight"]


@pytest.fixture(scope="module")
def every_method(tmp_path_factory):
    root = tmp_path_factory.mktemp("every")
    base = save_base(str(root / "base"))
    found = {}
    for i, (name, config) in enumerate(METHODS.items()):
        found[f"cls_{name}"] = make_adapter(base, str(root / f"cls_{name}"), 2 + i % 3, seed=40 + i, scale=0.3,
                                            method_config=config)
        if name in TAGGERS:
            found[f"tag_{name}"] = make_adapter(base, str(root / f"tag_{name}"), 4, seed=50 + i, head="tok", scale=0.3,
                                                method_config=config)
        if name in READERS:
            found[f"qa_{name}"] = make_adapter(base, str(root / f"qa_{name}"), seed=60 + i, head="qa", scale=0.3,
                                               method_config=config)
    return found


def _classification(model, text):
    with torch.no_grad():
        probs = model(**tiny_tokenizer()(text, return_tensors="pt")).logits[0].softmax(-1)
    return {model.config.id2label[i]: float(p) for i, p in enumerate(probs)}


def _tags(model, text):
    enc = tiny_tokenizer()(text.split(), is_split_into_words=True, return_tensors="pt")
    with torch.no_grad():
        probs = model(**enc).logits[0].softmax(-1)
    firsts = {}
    for position, word in enumerate(enc.word_ids(0)):
        if word is not None and word not in firsts:
            firsts[word] = position
    return [(model.config.id2label[int(probs[firsts[w]].argmax())], float(probs[firsts[w]].max()))
            for w in range(len(firsts))]


def _answer(model, question, context):
    tok = tiny_tokenizer()
    enc = tok(question, context, return_offsets_mapping=True, return_tensors="pt")
    offsets = enc.pop("offset_mapping")[0].tolist()
    seq = enc.sequence_ids(0)
    with torch.no_grad():
        out = model(**enc)
    ctx = [i for i, s in enumerate(seq) if s == 1]
    best = max(((s, e) for s in ctx for e in ctx if s <= e < s + 30),
               key=lambda se: float(out.start_logits[0, se[0]] + out.end_logits[0, se[1]]))
    return context[offsets[best[0]][0]:offsets[best[1]][1]]


def test_every_method_and_task_head_mixes_and_answers_as_each_adapter_alone(every_method, start_server):  # noqa: F811
    server = start_server([AdapterSpec(n, f) for n, f in every_method.items()], max_wait_ms=30, max_batch_size=64)
    assert {a["name"]: a["batching"] for a in call(server.url, "GET", "/adapters")[2]} == {n: "mixed" for n in every_method}
    models = {name: alone(folder) for name, folder in every_method.items()}
    question, context = "who sat on the mat", "the cat sat on the mat and the dog runs"
    jobs = [(name, text) for text in TEXTS for name in every_method if name.startswith(("cls_", "tag_"))]
    jobs += [(name, None) for name in every_method if name.startswith("qa_")]

    def send(job):
        name, text = job
        inputs = [question, context] if text is None else text
        return predict(server.url, {"inputs": inputs, "adapter": name})

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(send, jobs))
    for (name, text), (status, _, body) in zip(jobs, answers):
        assert status == 200, (name, body)
        if name.startswith("cls_"):
            assert {g["label"]: g["score"] for g in body} == pytest.approx(_classification(models[name], text), abs=ATOL), name
        elif name.startswith("tag_"):
            want = _tags(models[name], text)
            assert [s["tag"] for s in body["spans"]] == [tag for tag, _ in want], name
            assert [s["score"] for s in body["spans"]] == pytest.approx([p for _, p in want], abs=ATOL), name
        else:
            assert body["answer"] == _answer(models[name], question, context), name
    text = call(server.url, "GET", "/metrics")[2]
    assert metric(text, "bitfit_serve_batch_size_count", mode="switch") == 0
    forwards = metric(text, "bitfit_serve_batch_adapters_count")
    assert metric(text, "bitfit_serve_batch_adapters_sum") > forwards, "no forward pass mixed two adapters"
