"""transformers' text- and token-classification pipelines on an adapter (`AutoBitFitModel.from_pretrained`) give
the answers of bitfit_hf.inference (what `predict` and `serve` print), and the score function is the pipeline's
for every problem type."""

from __future__ import annotations

import pytest
from serving.tiny import make_adapter, save_base, tiny_tokenizer

from bitfit_hf import AutoBitFitModel, BitFitAdapter
from bitfit_hf.inference.answers import score_function
from bitfit_hf.inference.predictor import Predictor


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipes")
    base = save_base(str(root / "base"))
    return {"single": make_adapter(base, str(root / "single"), 3, seed=1),
            "multi": make_adapter(base, str(root / "multi"), 3, seed=2, problem_type="multi_label_classification"),
            "one": make_adapter(base, str(root / "one"), 1, seed=3),
            "regression": make_adapter(base, str(root / "regression"), 1, seed=4, problem_type="regression"),
            "tag": make_adapter(base, str(root / "tag"), 4, seed=5, head="tok")}


TEXTS = ["the cat sat on the mat", "a very good film", "boring and long"]


@pytest.mark.parametrize("kind", ["single", "multi", "one", "regression"])
def test_text_classification_pipeline_equals_predict(folders, kind):
    from transformers import pipeline

    assert BitFitAdapter.from_pretrained(folders[kind]).config.task_type == "SEQ_CLS"
    model = AutoBitFitModel.from_pretrained(folders[kind]).eval()
    ours = Predictor(model, tiny_tokenizer(), "SEQ_CLS").predict([(t, None) for t in TEXTS] + [("the cat", "a dog")])
    classify = pipeline("text-classification", model=model, tokenizer=tiny_tokenizer())
    theirs = classify(TEXTS, top_k=None) + [classify({"text": "the cat", "text_pair": "a dog"}, top_k=None)]
    for mine, piped in zip(ours, theirs):
        assert [a["label"] for a in mine] == [a["label"] for a in piped]
        assert [a["score"] for a in mine] == pytest.approx([a["score"] for a in piped], abs=1e-6)


@pytest.mark.parametrize("problem_type,labels,want", [("regression", 1, "none"), (None, 1, "sigmoid"),
                                                      ("multi_label_classification", 3, "sigmoid"),
                                                      ("single_label_classification", 3, "softmax"), (None, 3, "softmax")])
def test_the_score_function_is_the_pipelines(problem_type, labels, want):
    assert score_function(problem_type, labels) == want


def test_token_classification_pipeline_scores_equal_the_word_tags(folders):
    """The pipeline scores tokens; a word's tag is its first token's (the pipeline's "first" aggregation
    without its merging of neighbouring words, which would join two adjacent nouns into one entity)."""
    from transformers import pipeline

    model = AutoBitFitModel.from_pretrained(folders["tag"]).eval()
    text = "the cat sat on the mat"
    (ours,) = Predictor(model, tiny_tokenizer(), "TOKEN_CLS").predict([text])
    tokens = pipeline("token-classification", model=model, tokenizer=tiny_tokenizer(), aggregation_strategy="none",
                      ignore_labels=[])(text)
    assert [(t["word"], t["entity"], t["start"], t["end"]) for t in tokens] == \
        [(s["word"], s["tag"], s["start"], s["end"]) for s in ours["spans"]]  # one token per word here
    assert [float(t["score"]) for t in tokens] == pytest.approx([s["score"] for s in ours["spans"]], abs=1e-6)


def test_a_word_past_the_limit_is_shown_untagged(folders):
    model = AutoBitFitModel.from_pretrained(folders["tag"]).eval()
    (found,) = Predictor(model, tiny_tokenizer(), "TOKEN_CLS", max_length=6).predict(["the cat sat on the mat"])
    assert found["untagged"] == [4, 5] and found["tagged"].endswith("the/? mat/?") and len(found["spans"]) == 4
