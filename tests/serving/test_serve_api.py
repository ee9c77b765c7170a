"""`bitfit-hf serve` over real HTTP on an ephemeral port: concurrent clients over several adapters get what
each adapter loaded alone answers, requests for different adapters share forward passes, and the routes
answer in text-embeddings-inference's shape."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from serve_support import adapters, call, metric, predict, specs, start_server  # noqa: F401 - fixtures
from tiny import alone, tiny_tokenizer

ATOL = 1e-5  # probabilities; a padded mixed batch against one unpadded input alone


@pytest.fixture(scope="module")
def references(adapters):  # noqa: F811
    return {name: alone(adapters[name]) for name in ("c0", "c1", "c2", "ab", "tag", "qa")}


def expected_classification(model, text, pair=None):
    tok = tiny_tokenizer()
    with torch.no_grad():
        probs = model(**tok(text, pair, return_tensors="pt")).logits[0].softmax(-1)
    return {model.config.id2label[i]: float(p) for i, p in enumerate(probs)}


TEXTS = ["the cat sat on the mat", "a very good film", "boring and long", "what a delight", "the dog runs",
         "it was not fun at all and the ending was sad", "red car", "who did this"]


def assert_each_answers_as_alone(server, folders) -> None:
    """Concurrent requests over ``folders`` ({name: adapter folder}) get what each adapter loaded alone answers."""
    models = {name: alone(folder) for name, folder in folders.items()}
    jobs = [(name, text) for text in TEXTS[:4] for name in folders]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda job: predict(server.url, {"inputs": job[1], "adapter": job[0]}), jobs))
    for (name, text), (status, _, body) in zip(jobs, answers):
        assert status == 200, body
        want = expected_classification(models[name], text)
        assert {g["label"]: g["score"] for g in body} == pytest.approx(want, abs=ATOL), name


def random_request(rng: random.Random):
    adapter = rng.choice(["c0", "c1", "c2", "ab"])
    kind = rng.choice(["single", "pair", "batch"])
    if kind == "single":
        return adapter, rng.choice(TEXTS), [(None, None)]
    if kind == "pair":
        a, b = rng.sample(TEXTS, 2)
        return adapter, [a, b], [(a, b)]
    items = [rng.choice(TEXTS) if rng.random() < 0.5 else rng.sample(TEXTS, 2) for _ in range(rng.randint(1, 5))]
    inputs = [[x] if isinstance(x, str) else x for x in items]  # [["a"], ["b"]]: a batch of single texts
    return adapter, inputs, [(x, None) if isinstance(x, str) else tuple(x) for x in items]


def test_concurrent_clients_over_several_adapters_equal_each_adapter_alone(adapters, start_server, references):  # noqa: F811
    server = start_server(specs(adapters, "c0", "c1", "c2", "ab"), max_wait_ms=25, max_batch_size=32)
    rng = random.Random(0)
    jobs = [random_request(rng) for _ in range(60)]

    def send(job):
        adapter, inputs, _ = job
        return predict(server.url, {"inputs": inputs, "adapter": adapter})

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(send, jobs))
    for (adapter, inputs, items), (status, _, body) in zip(jobs, answers):
        assert status == 200, body
        single = isinstance(inputs, str) or (isinstance(inputs, list) and len(inputs) == 2 and all(isinstance(x, str) for x in inputs))
        per_input = [body] if single else body
        assert len(per_input) == len(items)
        for (text, pair), got in zip(items, per_input):
            if text is None:
                text, pair = (inputs, None) if isinstance(inputs, str) else (inputs[0], inputs[1])
            want = expected_classification(references[adapter], text, pair)
            assert [g["score"] for g in got] == sorted((g["score"] for g in got), reverse=True)
            assert {g["label"] for g in got} == set(want)
            for g in got:
                assert g["score"] == pytest.approx(want[g["label"]], abs=ATOL)
    text = call(server.url, "GET", "/metrics")[2]
    batches = metric(text, "bitfit_serve_batch_adapters_count")
    one_adapter = metric(text, "bitfit_serve_batch_adapters_bucket", le="1.0")
    assert batches > 0 and one_adapter < batches, "no forward pass mixed two adapters"
    assert metric(text, "bitfit_serve_batch_size_count", mode="mixed") > 0
    assert metric(text, "bitfit_serve_batch_size_count", mode="switch") == 0  # "ab" (AdapterBias) mixes too
    assert sum(metric(text, "bitfit_serve_requests_total", adapter=a, status="200") for a in ("c0", "c1", "c2", "ab")) == 60


def test_switch_batching_answers_the_same(adapters, start_server, references):  # noqa: F811
    server = start_server(specs(adapters, "c0", "c1", "c2"), batching="switch", max_wait_ms=10)
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda i: (i, predict(server.url, {"inputs": TEXTS[i % 8], "adapter": f"c{i % 3}"})), range(18)))
    for i, (status, _, body) in answers:
        assert status == 200
        want = expected_classification(references[f"c{i % 3}"], TEXTS[i % 8])
        assert {g["label"]: pytest.approx(g["score"], abs=ATOL) for g in body} == want
    assert all(e["batching"] == "switch" for e in call(server.url, "GET", "/adapters")[2])


def test_tagging_and_qa_answers_equal_the_adapters_alone(adapters, start_server, references):  # noqa: F811
    server = start_server(specs(adapters, "c0", "tag", "qa"))
    tok = tiny_tokenizer()
    text = "the cat sat on the mat"
    status, _, body = predict(server.url, {"inputs": text, "adapter": "tag"})
    assert status == 200
    enc = tok(text.split(), is_split_into_words=True, return_tensors="pt")
    with torch.no_grad():
        logits = references["tag"](**enc).logits[0]
    firsts = {}
    for position, word in enumerate(enc.word_ids(0)):
        if word is not None and word not in firsts:
            firsts[word] = position
    tags = [references["tag"].config.id2label[int(logits[firsts[w]].argmax())] for w in range(6)]
    assert body["tagged"] == " ".join(f"{w}/{t}" for w, t in zip(text.split(), tags))
    assert [(s["start"], s["end"]) for s in body["spans"]] == [(0, 3), (4, 7), (8, 11), (12, 14), (15, 18), (19, 22)]
    batch = predict(server.url, {"inputs": [text, "a dog"], "adapter": "tag"})[2]  # a list of texts: a batch
    # in a batch, the same tags and spans, scores to float rounding (a packed pass sums in another order)
    assert batch[0]["tagged"] == body["tagged"] and batch[1]["tagged"].startswith("a/")
    for got, want in zip(batch[0]["spans"], body["spans"], strict=True):
        assert {**got, "score": pytest.approx(want["score"], abs=ATOL)} == want

    question, context = "who sat on the mat", "the cat sat on the mat and the dog runs"
    status, _, answer = predict(server.url, {"inputs": [question, context], "adapter": "qa"})
    assert status == 200
    enc = tok(question, context, return_offsets_mapping=True, return_tensors="pt")
    offsets = enc.pop("offset_mapping")[0].tolist()
    seq = enc.sequence_ids(0)
    with torch.no_grad():
        out = references["qa"](**enc)
    ctx = [i for i, s in enumerate(seq) if s == 1]
    best = max(((s, e) for s in ctx for e in ctx if s <= e < s + 30),
                key=lambda se: float(out.start_logits[0, se[0]] + out.end_logits[0, se[1]]))
    assert answer["answer"] == context[offsets[best[0]][0]:offsets[best[1]][1]]
    assert context[answer["start"]:answer["end"]] == answer["answer"] and 0 < answer["score"] <= 1
    same = predict(server.url, {"inputs": [{"question": question, "context": context}], "adapter": "qa"})[2]
    assert same == [answer]


def test_routes_adapters_info_health_metrics(adapters, start_server):  # noqa: F811
    server = start_server(specs(adapters, "c0", "c1", "ab", "tag"))
    status, _, listed = call(server.url, "GET", "/adapters")
    assert status == 200
    by_name = {a["name"]: a for a in listed}
    assert set(by_name) == {"c0", "c1", "ab", "tag"}
    assert by_name["c1"]["labels"] == ["s2_seq0", "s2_seq1", "s2_seq2"] and by_name["c1"]["method"] == "bitfit"
    assert by_name["c1"]["base"] == adapters["base"] and by_name["c1"]["size_bytes"] > 0
    assert by_name["c1"]["batching"] == "mixed" and by_name["tag"]["task"] == "tagging"
    assert by_name["ab"]["method"] == "adapterbias" and by_name["ab"]["batching"] == "mixed"
    info = call(server.url, "GET", "/info")[2]
    assert info["model_id"] == adapters["base"] and info["adapters"] == 4 and info["max_batch_size"] == 32
    assert info["max_input_length"] == 64 and info["max_client_batch_size"] == 32
    assert call(server.url, "GET", "/health")[:1] == (200,)
    predict(server.url, {"inputs": "the cat", "adapter": "c0"})
    status, headers, text = call(server.url, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    for name in ("bitfit_serve_requests_total", "bitfit_serve_request_duration_seconds_bucket", "bitfit_serve_batch_size_bucket",
                 "bitfit_serve_queue_depth", "bitfit_serve_adapter_switches_total", "bitfit_serve_adapters"):
        assert name in text, name
    assert metric(text, "bitfit_serve_requests_total", adapter="c0", status="200") == 1
    assert metric(text, "bitfit_serve_adapters", mode="mixed") == 4
    # a refused request counts under the adapter it named; an adapter that is not served, under "unknown"
    assert predict(server.url, {"inputs": "the cat", "adapter": "c0", "top_k": 0})[0] == 422
    assert predict(server.url, {"inputs": "the cat", "adapter": "nope"})[0] == 404
    text = call(server.url, "GET", "/metrics")[2]
    assert metric(text, "bitfit_serve_requests_total", adapter="c0", status="422") == 1
    assert metric(text, "bitfit_serve_requests_total", adapter="unknown", status="404") == 1
    # one served adapter: "adapter" may be left out, as a TEI client would
    only = start_server(specs(adapters, "c2"))
    assert predict(only.url, {"inputs": "the cat"})[0] == 200


def test_raw_scores_top_k_and_truncation(adapters, start_server, references):  # noqa: F811
    server = start_server(specs(adapters, "c2"))
    body = predict(server.url, {"inputs": "the cat", "adapter": "c2", "raw_scores": True})[2]
    tok = tiny_tokenizer()
    with torch.no_grad():
        logits = references["c2"](**tok("the cat", return_tensors="pt")).logits[0]
    assert {g["label"]: g["score"] for g in body} == pytest.approx(
        {references["c2"].config.id2label[i]: float(v) for i, v in enumerate(logits)}, abs=1e-4)
    assert len(predict(server.url, {"inputs": "the cat", "adapter": "c2", "top_k": 2})[2]) == 2
    long_text = " ".join(["cat"] * 100)  # 102 tokens, the server takes 64
    status, _, body = predict(server.url, {"inputs": long_text, "adapter": "c2", "truncate": True})
    assert status == 200 and len(body) == 5


def test_lora_and_gain_adapters_are_mixed_and_answer_as_alone(adapters, start_server, tmp_path):  # noqa: F811
    """BitFit + LoRA (LoRA matrices) and a `one-d` adapter (LayerNorm gains) are routed per example beside BitFit
    adapters, with the answers of each adapter loaded alone."""
    from tiny import make_adapter

    from bitfit_hf import BitFitConfig, BitFitLoraConfig
    from bitfit_hf.serving.config import AdapterSpec

    lora = make_adapter(adapters["base"], str(tmp_path / "lora"), 3, seed=31, scale=0.2,
                        method_config=BitFitLoraConfig(lora_r=4, lora_alpha=8, lora_dropout=0.0))
    gains = make_adapter(adapters["base"], str(tmp_path / "gains"), 2, seed=32, method_config=BitFitConfig("one-d"))
    server = start_server([*specs(adapters, "c0", "c1"), AdapterSpec("lora", lora), AdapterSpec("gains", gains)],
                          max_wait_ms=20)
    modes = {a["name"]: a["batching"] for a in call(server.url, "GET", "/adapters")[2]}
    assert modes == {"c0": "mixed", "c1": "mixed", "lora": "mixed", "gains": "mixed"}
    folders = {"c0": adapters["c0"], "c1": adapters["c1"], "lora": lora, "gains": gains}
    assert_each_answers_as_alone(server, folders)


@pytest.mark.slow
def test_pooled_minilm_adapters_mixed_equal_each_alone(minilm_dir, start_server, tmp_path):  # noqa: F811
    """The default recipe's kind of adapter (MiniLM classified through its mean pooling), three of them mixed."""
    import transformers as T

    from bitfit_hf import BitFitAdapter, BitFitConfig, apply_bitfit
    from bitfit_hf.serving.config import AdapterSpec
    from bitfit_hf.utils.sentence_pooling import checkpoint_pooling, install_sentence_pooling

    folders = {}
    for seed, labels in enumerate([2, 3, 2]):
        torch.manual_seed(seed)
        model = T.AutoModelForSequenceClassification.from_pretrained(minilm_dir, num_labels=labels)
        install_sentence_pooling(model, checkpoint_pooling(minilm_dir))
        apply_bitfit(model, BitFitConfig("all"))
        with torch.no_grad():
            for param in model.parameters():
                if param.requires_grad:
                    param.add_(0.05 * torch.randn_like(param))
        folders[f"m{seed}"] = str(tmp_path / f"m{seed}")
        BitFitAdapter.from_model(model).save_pretrained(folders[f"m{seed}"])
    server = start_server([AdapterSpec(n, f) for n, f in folders.items()], max_wait_ms=20)
    tok = T.AutoTokenizer.from_pretrained(minilm_dir)
    texts = ["a gripping, beautiful film.", "dull and far too long", "it was fine, I suppose.", "what a mess"]
    jobs = [(name, text) for text in texts for name in folders]
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda job: predict(server.url, {"inputs": job[1], "adapter": job[0]}), jobs))
    assert all(a["sentence_pooling"] == "mean" and a["batching"] == "mixed" for a in call(server.url, "GET", "/adapters")[2])
    models = {name: alone(folder) for name, folder in folders.items()}
    for (name, text), (status, _, body) in zip(jobs, answers):
        assert status == 200, body
        with torch.no_grad():
            probs = models[name](**tok(text, return_tensors="pt")).logits[0].softmax(-1)
        assert {g["label"]: g["score"] for g in body} == pytest.approx(
            {models[name].config.id2label[i]: float(p) for i, p in enumerate(probs)}, abs=ATOL)


def test_bfloat16_base_answers_as_float32_does(adapters, start_server, references):  # noqa: F811
    """--dtype bfloat16 (what --dtype auto picks on a CUDA device), checked on the CPU: mixed batches over three
    adapters give each input the float32 answer's label, with probabilities within bf16's precision."""
    from bitfit_hf.serving.models import resolve_dtype

    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("float16", torch.device("cpu")) == torch.float16
    server = start_server(specs(adapters, "c0", "c1", "c2"), dtype="bfloat16")
    status, _, info = call(server.url, "GET", "/info")
    assert status == 200 and "bfloat16" in str(info)
    for i, text in enumerate(TEXTS):
        name = f"c{i % 3}"
        status, _, body = predict(server.url, {"inputs": text, "adapter": name})
        assert status == 200
        expected = expected_classification(references[name], text)
        got = {g["label"]: g["score"] for g in body}
        assert got == pytest.approx(expected, abs=2e-2)
        assert max(got, key=got.get) == max(expected, key=expected.get) or max(expected.values()) - sorted(
            expected.values())[-2] < 2e-2  # the label, unless float32's top two are within bf16's precision


def test_ia3_adapters_share_mixed_batches_with_bitfit_ones(adapters, start_server, tmp_path):  # noqa: F811
    """(IA)³ and BitFit + (IA)³ vectors route per example (MultiTaskModel's router), so the server mixes them with
    BitFit adapters in one forward pass; each answer equals its adapter loaded alone."""
    from tiny import make_adapter

    from bitfit_hf.serving.config import AdapterSpec
    from bitfit_hf.tuners.bitfit_ia3 import BitFitIA3Config, IA3Config

    folders = {"c0": adapters["c0"],
               "ia3": make_adapter(adapters["base"], str(tmp_path / "ia3"), 3, seed=41, method_config=IA3Config()),
               "bia3": make_adapter(adapters["base"], str(tmp_path / "bia3"), 2, seed=42,
                                    method_config=BitFitIA3Config(bias_terms="all"))}
    server = start_server([AdapterSpec(n, f) for n, f in folders.items()], max_wait_ms=20)
    modes = {a["name"]: a["batching"] for a in call(server.url, "GET", "/adapters")[2]}
    assert modes == {"c0": "mixed", "ia3": "mixed", "bia3": "mixed"}
    assert_each_answers_as_alone(server, folders)
    shared = metric(call(server.url, "GET", "/metrics")[2], "bitfit_serve_batch_adapters_sum")
    assert shared > 0
