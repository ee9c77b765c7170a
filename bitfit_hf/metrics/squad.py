"""Offline SQuAD v1.1 scoring, identical to the official v1.1 evaluation script.

Same inputs and outputs as ``evaluate.load("squad")``:

>>> squad_v1_compute(
...     predictions=[{"id": "q1", "prediction_text": "the Denver Broncos"}],
...     references=[{"id": "q1", "answers": {"text": ["Denver Broncos"], "answer_start": [177]}}],
... )
{'exact_match': 100.0, 'f1': 100.0}

Answers are normalised (lower case, punctuation removed, articles a/an/the
removed, whitespace collapsed); each question scores the maximum over its
ground truths; both numbers are percentages over all references (a reference
without a prediction scores 0, as in the official script).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any, Callable, Iterable, Mapping, Sequence

__all__ = ["normalize_answer", "exact_match_score", "f1_score", "squad_v1_compute"]

_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace (official order)."""
    text = s.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def f1_score(prediction: str, ground_truth: str) -> float:
    """Token-overlap F1 of the normalised strings (0 when nothing overlaps)."""
    prediction_tokens = normalize_answer(prediction).split()
    ground_truth_tokens = normalize_answer(ground_truth).split()
    common = Counter(prediction_tokens) & Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(prediction_tokens)
    recall = num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def exact_match_score(prediction: str, ground_truth: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def _max_over_ground_truths(metric_fn: Callable[[str, str], float], prediction: str, ground_truths: Iterable[str]):
    return max(metric_fn(prediction, gt) for gt in ground_truths)


def squad_v1_compute(
    predictions: Sequence[Mapping[str, Any]],
    references: Sequence[Mapping[str, Any]],
) -> dict[str, float]:
    """SQuAD v1.1 ``exact_match`` and ``f1`` (both 0-100).

    Args:
        predictions: ``[{"id": str, "prediction_text": str}, ...]``.
        references: ``[{"id": str, "answers": {"text": [str, ...], ...}}, ...]``;
            the total is the number of references.

    Raises:
        ValueError: no references, or a reference with no ground-truth answer.
    """
    pred_dict = {p["id"]: p["prediction_text"] for p in predictions}
    if not references:
        raise ValueError("no references to score")
    exact_match = 0.0
    f1 = 0.0
    for ref in references:
        qid = ref["id"]
        ground_truths = list(ref["answers"]["text"])
        if not ground_truths:
            raise ValueError(f"reference {qid!r} has no ground-truth answer text")
        if qid not in pred_dict:
            continue  # unanswered: scores 0, still counted in the total
        prediction = pred_dict[qid]
        exact_match += float(_max_over_ground_truths(exact_match_score, prediction, ground_truths))
        f1 += _max_over_ground_truths(f1_score, prediction, ground_truths)
    total = len(references)
    return {"exact_match": 100.0 * exact_match / total, "f1": 100.0 * f1 / total}
