"""POS preprocessing: first-sub-token label alignment (hand-built and with the real MiniLM tokenizer),
the tag set, tag checks, the word/TAG and CoNLL readers, and the predictions file."""

from __future__ import annotations

import datasets
import numpy as np
import pytest

from bitfit_hf.recipe_kit import RecipeError
from bitfit_hf.recipe_kit.tasks.tagging import (
    IGNORE_INDEX,
    PTB_TAGS,
    align_labels_with_words,
    check_tagged_split,
    constant_loss,
    make_tokenize_and_align,
    read_tagging_native,
    resolve_tag_set,
    resolve_tagging_columns,
    warn_if_constant_tags,
    word_level_predictions,
    write_tagged_predictions,
)

X = IGNORE_INDEX


def test_alignment_by_hand():
    # [CLS] w0 w1a w1b w1c w2 [SEP]
    word_ids = [None, 0, 1, 1, 1, 2, None]
    assert align_labels_with_words(word_ids, [5, 7, 9]) == [X, 5, 7, X, X, 9, X]
    assert align_labels_with_words(word_ids, [5, 7, 9], label_all_tokens=True) == [X, 5, 7, 7, 7, 9, X]
    # truncation: word 2 lost entirely
    assert align_labels_with_words([None, 0, 1, None], [5, 7, 9]) == [X, 5, 7, X]
    # padding positions (None) stay ignored
    assert align_labels_with_words([None, 0, None, None, None], [3]) == [X, 3, X, X, X]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from bitfit_hf.data.assets import minilm_path

    return AutoTokenizer.from_pretrained(minilm_path())


def test_alignment_with_the_real_tokenizer(tokenizer):
    words = ["Pierre", "Vinken", ",", "61", "years", "old", "unpredictability"]
    tags = ["NNP", "NNP", ",", "CD", "NNS", "JJ", "NN"]
    label_to_id = {t: i for i, t in enumerate(PTB_TAGS)}
    fn = make_tokenize_and_align(tokenizer, "tokens", "pos_tags", label_to_id, 64, False)
    out = fn({"tokens": [words], "pos_tags": [tags]})
    labels = out["labels"][0]
    word_ids = tokenizer(words, is_split_into_words=True).word_ids()
    assert len(labels) == len(out["input_ids"][0]) == len(word_ids)
    # exactly one label per word, on its first sub-token, in order
    labelled = [i for i, label in enumerate(labels) if label != X]
    assert [word_ids[i] for i in labelled] == list(range(len(words)))
    assert [PTB_TAGS[labels[i]] for i in labelled] == tags
    assert len(word_ids) > len(words) + 2  # some words really were split (e.g. "unpredictability")
    assert out["words_dropped"] == [0]
    # truncation drops whole words and counts them
    short = make_tokenize_and_align(tokenizer, "tokens", "pos_tags", label_to_id, 5, False)({"tokens": [words], "pos_tags": [tags]})
    assert short["words_dropped"][0] > 0
    # unlabelled text: every first sub-token marked with a placeholder, so predictions map back to words
    bare = make_tokenize_and_align(tokenizer, "tokens", None, None, 64, False)({"tokens": [words]})
    assert sum(label != X for label in bare["labels"][0]) == len(words)


def test_word_level_predictions_skip_ignored_positions():
    logits = np.zeros((2, 5, 3))
    logits[0, 1, 2] = logits[0, 3, 1] = logits[1, 1, 0] = 1.0
    labels = np.array([[X, 0, X, 0, X], [X, 0, X, X, X]])
    assert word_level_predictions(logits, labels) == [[2, 1], [0]]


def test_tag_set():
    raw = {"train": datasets.Dataset.from_dict({"tokens": [["a", "b"]], "pos_tags": [["DT", "NN"]]})}
    tags, ids = resolve_tag_set(raw, "pos_tags")
    assert tags == list(PTB_TAGS) and not ids  # PTB data: the whole tag set, rare tags included
    raw = {"train": datasets.Dataset.from_dict({"tokens": [["a", "b"]], "pos_tags": [["DET", "NOUN"]]})}
    assert resolve_tag_set(raw, "pos_tags") == (["DET", "NOUN"], False)
    features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                  "pos_tags": datasets.Sequence(datasets.ClassLabel(names=["X", "Y"]))})
    raw = {"train": datasets.Dataset.from_dict({"tokens": [["a"]], "pos_tags": [[1]]}, features=features)}
    assert resolve_tag_set(raw, "pos_tags") == (["X", "Y"], True)


def test_tag_checks():
    good = datasets.Dataset.from_dict({"tokens": [["a", "b"]], "pos_tags": [["DET", "NOUN"]]})
    check_tagged_split(good, "train", "tokens", "pos_tags", ["DET", "NOUN"], False)
    unseen = datasets.Dataset.from_dict({"tokens": [["a", "b"]], "pos_tags": [["DET", "VERB"]]})
    with pytest.raises(RecipeError, match=r"'validation' split has tags outside the label set: 'VERB' \(1x\)"):
        check_tagged_split(unseen, "validation", "tokens", "pos_tags", ["DET", "NOUN"], False)
    ragged = datasets.Dataset.from_dict({"tokens": [["a", "b"]], "pos_tags": [["DET"]]})
    with pytest.raises(RecipeError, match="row 0: 2 words but 1 tags"):
        check_tagged_split(ragged, "train", "tokens", "pos_tags", ["DET"], False)
    with pytest.raises(RecipeError, match="no tag column.*Name it with --label_column_name"):
        resolve_tagging_columns(datasets.Dataset.from_dict({"tokens": [["a"]], "ner": [["O"]]}), "train", None, None)
    with pytest.raises(RecipeError, match="no word column"):
        resolve_tagging_columns(datasets.Dataset.from_dict({"text": ["a"], "tags": [["O"]]}), "train", None, None)


def test_native_readers_and_prediction_file(tmp_path):
    tagged = tmp_path / "train.pos"
    tagged.write_text("Pierre/NNP Vinken/NNP ,/, 61/CD years/NNS old/JJ ./.\n\n1\\/2/CD cup/NN\n")
    data = read_tagging_native(str(tagged))
    assert data["tokens"] == [["Pierre", "Vinken", ",", "61", "years", "old", "."], ["1/2", "cup"]]
    assert data["pos_tags"][1] == ["CD", "NN"]
    conll = tmp_path / "train.conll"
    conll.write_text("-DOCSTART- -X- O\n\nEU NNP B-NP\nrejects VBZ B-VP\n\nPeter NNP B-NP\n")
    data = read_tagging_native(str(conll))
    assert data["tokens"] == [["EU", "rejects"], ["Peter"]]
    assert data["pos_tags"] == [["B-NP", "B-VP"], ["B-NP"]]  # the LAST column is the tag
    assert read_tagging_native(str(tmp_path / "x.json")) is None
    out = tmp_path / "predictions.txt"
    missed = write_tagged_predictions(str(out), [["1/2", "cup", "sugar"]], [["CD", "NN"]])
    assert out.read_text() == "1\\/2/CD cup/NN sugar/_\n" and missed == 1
    assert read_tagging_native(str(out))["tokens"] == [["1/2", "cup", "sugar"]]


def test_every_word_one_tag_is_called_out(caplog):
    """Scored positions only (-100 left out, whatever is predicted there), tag names shown, logits accepted."""
    labels = np.array([[X, 0, 1, 2, 0, X, X]] * 6)  # 24 scored words: NN 12, DT 6, VB 6
    constant = np.zeros((6, 7, 3))
    constant[:, :, 0] = 1.0  # NN everywhere
    constant[:, 0, :] = [0.0, 0.0, 9.0]  # another tag at an ignored position does not count
    names = ["NN", "DT", "VB"]
    with caplog.at_level("WARNING", logger="bitfit_hf.recipe_kit.tasks.tagging"):
        assert warn_if_constant_tags(constant, labels, names)
        varied = constant.argmax(-1)
        varied[0, 2] = 1
        assert not warn_if_constant_tags(varied, labels, names)
        assert not warn_if_constant_tags(constant[:2], labels[:2], names)  # 8 words: too few to say
    [message] = [r.getMessage() for r in caplog.records if "same tag" in r.getMessage()]
    assert "all 24 scored words were given the same tag (NN)" in message
    assert "scores 50.0% here (the majority tag NN scores 50.0%)" in message and "--learning_rate" in message


def test_constant_loss_is_the_entropy_of_the_tags_the_loss_sees():
    import math

    features = datasets.Dataset.from_dict({"labels": [[X, 3, 3, X], [4, X, 3, 4]]})
    level = constant_loss(features)
    assert level.value == pytest.approx(-(0.6 * math.log(0.6) + 0.4 * math.log(0.4)))
    assert level.source == "the entropy of the training tags"
    assert constant_loss(None) is None and constant_loss(datasets.Dataset.from_dict({"tokens": [["a"]]})) is None


def test_the_recipe_tags_each_word_as_predict_and_the_server_do():
    """The POS recipe's predictions.txt reads the first sub-token of each word (positions labelled in training);
    bitfit_hf.inference.answers.tagging_answer, behind predict and the server, reads the same tokens: the tags agree."""
    import torch

    from bitfit_hf.inference.answers import tagging_answer
    from bitfit_hf.recipe_kit.tasks.tagging import word_level_predictions

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 9, 5, generator=generator)
    word_ids = [None, 0, 0, 1, 2, 2, 2, 3, None]  # [CLS] w0 w0 w1 w2 w2 w2 w3 [SEP]
    labels = np.array([[-100, 1, -100, 2, 0, -100, -100, 4, -100]])  # labelled at each word's first sub-token
    ours = word_level_predictions(logits.numpy(), labels)[0]
    words = [(f"w{i}", 3 * i, 3 * i + 2) for i in range(4)]
    served = tagging_answer(logits[0], {"words": words, "word_ids": word_ids}, {i: str(i) for i in range(5)})
    assert [int(span["tag"]) for span in served["spans"]] == ours
