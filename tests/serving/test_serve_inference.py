"""The server answers through bitfit_hf.inference, as `bitfit-hf predict` and the pipelines do: a long QA context
is read whole (in windows batched with other requests), multi-label scores are sigmoids everywhere, and every
adapter takes text-embeddings-inference's input layouts. Real server, ephemeral loopback port."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from serve_support import adapters, call, predict, specs, start_server  # noqa: F401 - fixtures
from tiny import NEEDLE, alone, long_qa, make_adapter, make_needle_qa, tiny_tokenizer

from bitfit_hf.cli.main import main
from bitfit_hf.serving.config import AdapterSpec


@pytest.fixture(scope="module")
def needle(tmp_path_factory) -> str:
    return make_needle_qa(str(tmp_path_factory.mktemp("needle")))


@pytest.fixture(scope="module")
def multi_label(adapters) -> str:  # noqa: F811
    return make_adapter(adapters["base"], adapters["base"] + "_multi", 4, seed=41, problem_type="multi_label_classification")


def test_a_long_qa_context_is_read_whole_batched_with_other_requests(needle, start_server):
    question, context, start = long_qa()
    assert len(tiny_tokenizer()(context[:start])["input_ids"]) > 1500  # the model reads 64 tokens at a time
    server = start_server([AdapterSpec("needle", needle)], max_wait_ms=20, max_batch_size=16, max_client_batch_size=8)
    bodies = [{"inputs": [question, context], "adapter": "needle"},
              {"inputs": {"question": question, "context": "the cat sat on the mat"}, "adapter": "needle"},
              {"inputs": [[question, context], [question, context[:start + 40]]], "adapter": "needle"}]
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda body: predict(server.url, body), bodies))
    assert [a[0] for a in answers] == [200, 200, 200], answers
    found = answers[0][2]
    assert found["answer"] == NEEDLE and (found["start"], found["end"]) == (start, start + len(NEEDLE))
    assert answers[1][2]["answer"] != NEEDLE  # a context without the needle: not found there by chance
    assert [a["start"] for a in answers[2][2]] == [start, start]


def test_multi_label_scores_are_sigmoids_in_the_server_predict_and_the_pipeline(multi_label, start_server, capsys):
    from transformers import pipeline

    from bitfit_hf import AutoBitFitModel

    text = "a very good film"
    model = alone(multi_label)
    with torch.no_grad():
        logits = model(**tiny_tokenizer()(text, return_tensors="pt")).logits[0]
    want = {model.config.id2label[i]: float(p) for i, p in enumerate(torch.sigmoid(logits))}
    assert abs(sum(want.values()) - 1) > 0.05  # sigmoids, not a distribution: softmax would be caught

    server = start_server([AdapterSpec("multi", multi_label)])
    status, _, body = predict(server.url, {"inputs": text, "adapter": "multi"})
    assert status == 200 and {a["label"]: a["score"] for a in body} == pytest.approx(want, abs=1e-5)

    capsys.readouterr()
    assert main(["predict", multi_label, text, "--top-k", "4"]) == 0
    printed = capsys.readouterr().out.strip().split("\t")[0]
    shown = {label: float(score) for label, score in (part.split() for part in printed.split(", "))}
    assert shown == pytest.approx(want, abs=1e-4)

    classify = pipeline("text-classification", model=AutoBitFitModel.from_pretrained(multi_label).eval(),
                        tokenizer=tiny_tokenizer())
    piped = classify(text, top_k=None)
    assert {a["label"]: a["score"] for a in piped} == pytest.approx(want, abs=1e-5)


def scores(answer):
    """A classification answer as ``{label: score}`` (padding in a batch moves scores by float rounding)."""
    return pytest.approx({a["label"]: a["score"] for a in answer}, abs=1e-5)


def test_every_adapter_takes_tei_layouts(adapters, start_server):  # noqa: F811
    server = start_server(specs(adapters, "c0", "tag", "qa"))
    one = predict(server.url, {"inputs": "the cat sat", "adapter": "c0"})[2]
    pair = predict(server.url, {"inputs": ["the cat", "a dog"], "adapter": "c0"})[2]
    status, _, batch = predict(server.url, {"inputs": [["the cat sat"], ["the cat", "a dog"]], "adapter": "c0"})
    assert status == 200 and len(batch) == 2
    assert {a["label"]: a["score"] for a in batch[0]} == scores(one) and {a["label"]: a["score"] for a in batch[1]} == scores(pair)
    status, _, texts = predict(server.url, {"inputs": ["the cat sat", "the cat sat", "red car"], "adapter": "c0"})
    assert status == 200 and len(texts) == 3  # three texts: a batch (two would be a pair)
    assert {a["label"]: a["score"] for a in texts[1]} == scores(one)

    tagged = predict(server.url, {"inputs": "the cat sat", "adapter": "tag"})[2]
    for layout in ([["the cat sat"], ["a dog runs"]], ["the cat sat", "a dog runs"]):
        status, _, body = predict(server.url, {"inputs": layout, "adapter": "tag"})
        assert status == 200 and body[0]["tagged"] == tagged["tagged"] and body[1]["tagged"].startswith("a/"), body

    q, c = "who sat on the mat", "the cat sat on the mat"
    answered = predict(server.url, {"inputs": [q, c], "adapter": "qa"})[2]
    status, _, body = predict(server.url, {"inputs": [[q, c], {"question": q, "context": c}], "adapter": "qa"})
    assert status == 200 and [(a["answer"], a["start"]) for a in body] == [(answered["answer"], answered["start"])] * 2
    status, _, body = predict(server.url, {"inputs": [[q]], "adapter": "qa"})
    assert status == 422 and "no context" in body["error"]


def test_doc_stride_is_the_servers_to_choose(needle, start_server):
    """--doc-stride reaches the windows (its default is the one predict and the pipeline use); with little overlap
    the needle is still found, and a negative stride is one clear error."""
    import argparse

    from bitfit_hf.cli import serve_cmd
    from bitfit_hf.inference.inputs import DOC_STRIDE
    from bitfit_hf.serving.config import ServeConfig, ServeError

    parser = argparse.ArgumentParser()
    serve_cmd.register(parser.add_subparsers())
    assert parser.parse_args(["serve"]).doc_stride == DOC_STRIDE == ServeConfig().doc_stride
    with pytest.raises(ServeError, match="--doc-stride"):
        ServeConfig(doc_stride=-1)
    question, context, start = long_qa()
    server = start_server([AdapterSpec("needle", needle)], doc_stride=4)
    assert predict(server.url, {"inputs": [question, context], "adapter": "needle"})[2]["start"] == start
    assert '"doc_stride": 4' in str(call(server.url, "GET", "/info")[2]).replace("'", '"')
