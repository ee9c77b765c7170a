"""SQuAD preprocessing and post-processing on hand-built examples: doc_stride windows, span labels
from offset mappings, context-only offsets, and n-best span selection."""

from __future__ import annotations

import datasets
import numpy as np
import pytest

from bitfit_hf.recipe_kit import RecipeError
from bitfit_hf.recipe_kit.tasks.qa import (
    check_qa_split,
    check_window_sizes,
    constant_loss,
    make_eval_features_function,
    make_train_features_function,
    postprocess_qa_predictions,
    read_squad_native,
    warn_if_constant_answers,
)

FILLER = "The committee met on a rainy Tuesday to discuss the annual budget of the town library. "
CONTEXT = FILLER * 3 + "The telescope was invented by Hans Lippershey in 1608. " + FILLER * 3
ANSWER = "Hans Lippershey"
EXAMPLES = {
    "id": ["q1", "q2"],
    "question": ["   Who invented the telescope?", "When was the telescope invented?"],
    "context": [CONTEXT, CONTEXT],
    "answers": [
        {"text": [ANSWER], "answer_start": [CONTEXT.index(ANSWER)]},
        {"text": ["1608"], "answer_start": [CONTEXT.index("1608")]},
    ],
}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from bitfit_hf.data.assets import minilm_path

    return AutoTokenizer.from_pretrained(minilm_path())


def test_training_windows_label_the_answer_tokens(tokenizer):
    max_len, stride = 48, 12
    features = make_train_features_function(tokenizer, "question", "context", "answers", max_len, stride, False)(EXAMPLES)
    sample_map = []
    enc = tokenizer([q.lstrip() for q in EXAMPLES["question"]], EXAMPLES["context"], truncation="only_second",
                    max_length=max_len, stride=stride, return_overflowing_tokens=True, return_offsets_mapping=True)
    sample_map = enc["overflow_to_sample_mapping"]
    assert len(features["input_ids"]) == len(sample_map) > 4  # the long context really was windowed
    assert all(len(ids) <= max_len for ids in features["input_ids"])
    found = {0: 0, 1: 0}
    for i, (start, end) in enumerate(zip(features["start_positions"], features["end_positions"])):
        example = sample_map[i]
        if start == 0 and end == 0:
            continue  # CLS: this window does not hold the whole answer
        offsets = enc["offset_mapping"][i]
        assert enc.sequence_ids(i)[start] == 1 and enc.sequence_ids(i)[end] == 1
        assert CONTEXT[offsets[start][0] : offsets[end][1]] == EXAMPLES["answers"][example]["text"][0]
        found[example] += 1
    assert found[0] >= 1 and found[1] >= 1
    # windows without the answer point at CLS
    assert features["start_positions"].count(0) >= len(sample_map) - 4


def test_consecutive_windows_overlap_by_doc_stride(tokenizer):
    max_len, stride = 48, 12
    features = make_eval_features_function(tokenizer, "question", "context", "id", max_len, stride, False)(
        {k: v[:1] for k, v in EXAMPLES.items()}
    )
    spans = []
    for offsets in features["offset_mapping"]:
        context_offsets = [o for o in offsets if o is not None]
        spans.append((context_offsets[0][0], context_offsets[-1][1], len(context_offsets)))
    assert all(e == "q1" for e in features["example_id"])
    for (s0, e0, n0), (s1, e1, _) in zip(spans, spans[1:]):
        assert s0 < s1 < e0 < e1  # next window starts inside the previous one (the shared stride)
    # the shared part is exactly `stride` tokens
    first = [tuple(o) for o in features["offset_mapping"][0] if o is not None]
    second = [tuple(o) for o in features["offset_mapping"][1] if o is not None]
    assert len(set(first) & set(second)) == stride
    # question and special tokens carry no offset, so they can never be an answer
    ids = features["input_ids"][0]
    assert features["offset_mapping"][0][0] is None and ids[0] == tokenizer.cls_token_id


def test_gold_spans_survive_post_processing(tokenizer):
    """Logits peaked at the labelled tokens give back exactly the gold answers."""
    max_len, stride = 48, 12
    train = make_train_features_function(tokenizer, "question", "context", "answers", max_len, stride, False)(EXAMPLES)
    evalf = make_eval_features_function(tokenizer, "question", "context", "id", max_len, stride, False)(EXAMPLES)
    width = max(len(ids) for ids in evalf["input_ids"])
    start = np.full((len(evalf["input_ids"]), width), -100.0)
    end = np.full_like(start, -100.0)
    for i, ids in enumerate(evalf["input_ids"]):
        start[i, : len(ids)] = 0.0
        end[i, : len(ids)] = 0.0
        if train["start_positions"][i] or train["end_positions"][i]:
            start[i, train["start_positions"][i]] = 10.0
            end[i, train["end_positions"][i]] = 10.0
    answers, nbest = postprocess_qa_predictions(
        datasets.Dataset.from_dict(EXAMPLES), datasets.Dataset.from_dict(dict(evalf)), (start, end), n_best_size=5
    )
    assert answers == {"q1": ANSWER, "q2": "1608"}
    assert nbest["q1"][0]["text"] == ANSWER and sum(c["probability"] for c in nbest["q1"]) == pytest.approx(1.0)


def test_post_processing_rules_on_hand_built_logits():
    context = "alpha beta gamma delta epsilon"
    #          0     6    11    17    23
    word_offsets = [[0, 5], [6, 10], [11, 16], [17, 22], [23, 30]]
    # feature layout: [CLS] q q [SEP] w0 w1 w2 w3 w4 [SEP]; window 2 holds w3 w4 only
    f1 = [None, None, None, None] + word_offsets + [None]
    f2 = [None, None, None, None] + word_offsets[3:] + [None]
    examples = datasets.Dataset.from_dict({"id": ["a", "b"], "context": [context, context]})
    features = datasets.Dataset.from_dict({"example_id": ["a", "a", "b"], "offset_mapping": [f1, f2, f1]})
    width = len(f1) + 2  # padded rows, as Trainer pads with -100
    start = np.full((3, width), -100.0)
    end = np.full((3, width), -100.0)
    start[:, : len(f1)] = 0.0
    end[:, : len(f1)] = 0.0
    start[1, len(f2) :] = end[1, len(f2) :] = -100.0
    # example a, window 1: best raw pair is a question token (index 1): skipped; then beta..gamma = 3+3
    start[0, 1], end[0, 1] = 50.0, 50.0
    start[0, 5], end[0, 6] = 3.0, 3.0
    # window 2: delta..epsilon scores 4+4 = 8 > 6, so the answer comes from the second window
    start[1, 4], end[1, 5] = 4.0, 4.0
    # example b: the top pair is reversed (end before start) and the long span is too long
    start[2, 8], end[2, 4] = 9.0, 9.0
    answers, nbest = postprocess_qa_predictions(examples, features, (start, end), n_best_size=3, max_answer_length=3)
    assert answers["a"] == "delta epsilon"
    assert nbest["a"][1]["text"] == "beta gamma"
    assert all(len(c["text"].split()) <= 3 for c in nbest["b"])
    assert answers["b"] != context  # the 5-word span exceeds max_answer_length=3
    # nothing valid at all: empty answer
    only_question = datasets.Dataset.from_dict({"example_id": ["a"], "offset_mapping": [[None, None, [0, 5]]]})
    none_valid = postprocess_qa_predictions(
        examples.select([0]), only_question, (np.array([[5.0, 5.0, -1.0]]), np.array([[5.0, 5.0, -1.0]])), n_best_size=1
    )
    assert none_valid[0] == {"a": ""}


def test_qa_input_checks(tokenizer):
    ok = datasets.Dataset.from_dict(EXAMPLES)
    assert check_qa_split(ok, "train", "question", "context", "answers", True) == 0
    no_answer = datasets.Dataset.from_dict({**EXAMPLES, "answers": [{"text": [], "answer_start": []}] * 2})
    with pytest.raises(RecipeError, match="without an answer.*SQuAD v2.0"):
        check_qa_split(no_answer, "train", "question", "context", "answers", True)
    assert check_qa_split(no_answer, "test", "question", "context", "answers", False) == 0
    outside = datasets.Dataset.from_dict({**EXAMPLES, "answers": [{"text": ["x"], "answer_start": [10**6]}] * 2})
    with pytest.raises(RecipeError, match="lies outside the context"):
        check_qa_split(outside, "validation", "question", "context", "answers", True)
    shifted = datasets.Dataset.from_dict({**EXAMPLES, "answers": [{"text": [ANSWER], "answer_start": [0]}] * 2})
    assert check_qa_split(shifted, "train", "question", "context", "answers", True) == 2
    with pytest.raises(RecipeError, match="no column 'context'"):
        check_qa_split(ok.rename_column("context", "passage"), "train", "question", "context", "answers", True)
    with pytest.raises(RecipeError, match="doc_stride"):
        check_window_sizes(tokenizer, 128, 64)
    with pytest.raises(RecipeError, match="exceeds the model's maximum"):
        check_window_sizes(tokenizer, 4096, 128)


def test_squad_json_reader(tmp_path):
    import json

    doc = {"version": "1.1", "data": [{"title": "T", "paragraphs": [{"context": CONTEXT, "qas": [
        {"id": "q1", "question": "Who?", "answers": [{"text": ANSWER, "answer_start": CONTEXT.index(ANSWER)}]}]}]}]}
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(doc))
    data = read_squad_native(str(path))
    assert data[0]["answers"] == {"text": [ANSWER], "answer_start": [CONTEXT.index(ANSWER)]}
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({"data": [{"id": "q1", "question": "Who?", "context": CONTEXT,
                                          "answers": {"text": [ANSWER], "answer_start": [1]}}]}))
    assert read_squad_native(str(flat))["id"] == ["q1"]
    lines = tmp_path / "x.jsonl"
    lines.write_text('{"id": "q1"}\n')
    assert read_squad_native(str(lines)) is None


def _nbest(spans):
    return {str(i): [{"text": "x", "offsets": list(span)}] for i, span in enumerate(spans)}


def test_every_question_one_answer_is_called_out(caplog):
    ids = [str(i) for i in range(25)]
    with caplog.at_level("WARNING", logger="bitfit_hf.recipe_kit.tasks.qa"):
        assert warn_if_constant_answers(dict.fromkeys(ids, ""), _nbest([(0, 0)] * 25))  # no valid span anywhere
        # different texts, the same span of every context: answered by position, not by the question
        spans = {i: f"word{i}" for i in ids}
        assert warn_if_constant_answers(spans, _nbest([(0, 5)] * 25))
        assert not warn_if_constant_answers(spans, _nbest([(0, 5)] * 24 + [(6, 9)]))  # one differs
        assert not warn_if_constant_answers(spans, None)  # no offsets to compare
        assert not warn_if_constant_answers(dict.fromkeys(ids[:10], "a"))  # 10 questions: too few to say
    messages = [r.getMessage() for r in caplog.records if "questions got" in r.getMessage()]
    assert len(messages) == 2
    assert "all 25 questions got the same answer, ''" in messages[0] and "--learning_rate" in messages[0]
    assert "the same span of their contexts (characters 0-5)" in messages[1]


def test_constant_loss_is_the_entropy_of_the_answer_positions():
    import math

    features = datasets.Dataset.from_dict({"start_positions": [5, 5, 7, 7], "end_positions": [6, 6, 6, 6]})
    level = constant_loss(features)
    assert level.value == pytest.approx((math.log(2) + 0.0) / 2)  # the QA loss: the mean of start and end
    assert "answer positions" in level.source
    assert constant_loss(datasets.Dataset.from_dict({"example_id": ["a"]})) is None
