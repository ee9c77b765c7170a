"""Hand-computed checks of bitfit_hf.metrics.squad (the official SQuAD v1.1 evaluation)."""

from __future__ import annotations

import pytest

from bitfit_hf.metrics import normalize_answer, squad_v1_compute
from bitfit_hf.metrics.squad import exact_match_score, f1_score


def _score(prediction, ground_truths):
    return squad_v1_compute(
        predictions=[{"id": "q", "prediction_text": prediction}],
        references=[{"id": "q", "answers": {"text": list(ground_truths), "answer_start": [0] * len(ground_truths)}}],
    )


@pytest.mark.parametrize(
    "raw, normalised",
    [
        ("The Cat!", "cat"),  # case + punctuation + article
        ("  A   an  the apple ", "apple"),  # every article, extra whitespace
        ("theater another anthem", "theater another anthem"),  # articles only as whole words
        ("Hello,   World.", "hello world"),
        ("the-end", "theend"),  # punctuation is deleted, not replaced by a space
        ("a.m.", "am"),  # "a." loses its dot first, then "am" is not an article
        ("Don't", "dont"),
        ("\tDenver\nBroncos ", "denver broncos"),  # tabs/newlines are whitespace
        ("Café  Crème", "café crème"),  # non-ASCII letters are kept
        ("“quoted”", "“quoted”"),  # only string.punctuation (ASCII) is removed, as in the official script
        ("", ""),
    ],
)
def test_normalize_answer(raw, normalised):
    assert normalize_answer(raw) == normalised


def test_exact_match_ignores_case_punctuation_articles_whitespace():
    assert _score("the  Denver Broncos.", ["Denver Broncos"]) == {"exact_match": 100.0, "f1": 100.0}


def test_f1_partial_overlap_by_hand():
    # pred -> "cat sat on mat" (4 tokens), truth -> "cat sat" (2); common 2
    # precision 2/4, recall 2/2 -> F1 = 2 * .5 * 1 / 1.5 = 2/3
    assert f1_score("the cat sat on the mat", "a cat sat") == pytest.approx(2 / 3)
    out = _score("the cat sat on the mat", ["a cat sat"])
    assert out["exact_match"] == 0.0
    assert out["f1"] == pytest.approx(100 * 2 / 3)


def test_f1_counts_repeated_tokens_once_per_match():
    # pred -> "cat cat", truth -> "cat": common = min(2, 1) = 1; P = 1/2, R = 1 -> F1 = 2/3
    assert f1_score("the cat cat", "cat") == pytest.approx(2 / 3)


def test_max_over_multiple_ground_truths():
    # EM: matches the second truth exactly
    assert _score("Denver Broncos", ["Broncos", "Denver Broncos"]) == {"exact_match": 100.0, "f1": 100.0}
    # F1 vs "Denver Broncos": common 1, P = 1, R = 1/2 -> 2/3; vs "Broncos": 0 -> max 2/3
    out = _score("Denver", ["Denver Broncos", "Broncos"])
    assert out["exact_match"] == 0.0 and out["f1"] == pytest.approx(100 * 2 / 3)
    # EM and F1 maxima may come from different truths
    out = _score("Denver Broncos team", ["the Denver Broncos", "Broncos team!", "Denver Broncos team"])
    assert out == {"exact_match": 100.0, "f1": 100.0}


def test_empty_prediction():
    # nothing in common -> F1 0, EM 0
    assert _score("", ["Denver"]) == {"exact_match": 0.0, "f1": 0.0}
    # a truth that normalises to "" (only an article) equals the empty prediction: EM 1 but F1 0
    assert exact_match_score("", "The") is True
    assert _score("", ["The"]) == {"exact_match": 100.0, "f1": 0.0}


def test_compute_over_several_questions_by_hand():
    predictions = [
        {"id": "q1", "prediction_text": "Denver Broncos"},  # EM 1, F1 1
        {"id": "q2", "prediction_text": "Carolina"},  # vs "Carolina Panthers": P 1, R 1/2 -> F1 2/3
        {"id": "zz", "prediction_text": "ignored: not a reference"},
    ]
    references = [
        {"id": "q1", "answers": {"text": ["Denver Broncos", "The Broncos"], "answer_start": [0, 0]}},
        {"id": "q2", "answers": {"text": ["Carolina Panthers"], "answer_start": [0]}},
        {"id": "q3", "answers": {"text": ["Levi's Stadium"], "answer_start": [0]}},  # unanswered -> 0
    ]
    out = squad_v1_compute(predictions=predictions, references=references)
    # EM = 100 * (1 + 0 + 0) / 3; F1 = 100 * (1 + 2/3 + 0) / 3
    assert out["exact_match"] == pytest.approx(100 / 3)
    assert out["f1"] == pytest.approx(100 * (5 / 3) / 3)
    assert list(out) == ["exact_match", "f1"]


def test_errors():
    with pytest.raises(ValueError, match="no references"):
        squad_v1_compute(predictions=[], references=[])
    with pytest.raises(ValueError, match="no ground-truth"):
        squad_v1_compute(
            predictions=[{"id": "a", "prediction_text": "x"}], references=[{"id": "a", "answers": {"text": []}}]
        )
