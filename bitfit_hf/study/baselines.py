"""Each task's constant predictor: the score of the best input-blind answer on the very examples a run is scored on.

A constant is what a model that learned nothing about its inputs reaches (the committed default-budget
runs show it: pair at 51.25 on every seed of both methods). The *best* constant on the scored examples
is taken, not the training majority class: a run stuck on the other class would otherwise look as if it
learned something. The examples are the recipes' own slices of the offline data (``select_samples``:
the first N of a split; the sweep's dev split: the last N training examples).

* classification (``glue``): the most frequent class of the scored examples, for every example;
* tagging (``pos``): the most frequent tag of the scored words, for every word (words a run loses to
  truncation are not scored by the recipe; the constant counts them all);
* extractive QA (``squad``, F1): the passage's first k words as every answer, with the k in 1-30 that
  scores best on the scored questions (a position prior, the QA analogue of a majority class).
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = [
    "CONSTANT_RULES",
    "MAX_PREFIX_WORDS",
    "best_class_accuracy",
    "best_tag_accuracy",
    "best_prefix_f1",
    "constant_score",
    "task_constants",
]

#: The longest "first k words" answer tried for QA (the recipes' default --max_answer_length is 30 tokens).
MAX_PREFIX_WORDS = 30

CONSTANT_RULES = {
    "glue": "the most frequent class of the scored examples, for every example",
    "pos": "the most frequent tag of the scored words, for every word",
    "squad": f"the passage's first k words as every answer, the best k in 1-{MAX_PREFIX_WORDS} on the scored questions",
}


def best_class_accuracy(labels: Sequence[Any]) -> float:
    """Accuracy (points) of answering every example with the most frequent of ``labels``."""
    if not labels:
        raise ValueError("no examples to score")
    return 100.0 * Counter(labels).most_common(1)[0][1] / len(labels)


def best_tag_accuracy(tag_lists: Iterable[Sequence[Any]]) -> float:
    """Token accuracy (points) of tagging every word with the most frequent tag."""
    return best_class_accuracy([tag for tags in tag_lists for tag in tags])


def best_prefix_f1(questions: Sequence[Tuple[str, Sequence[str]]], max_words: int = MAX_PREFIX_WORDS) -> Tuple[float, int]:
    """(SQuAD F1 in points, k) of answering every ``(context, answer texts)`` with the context's first k words,
    for the best k in 1..``max_words``."""
    from bitfit_hf.metrics.squad import f1_score

    if not questions:
        raise ValueError("no questions to score")
    best = (-1.0, 0)
    for k in range(1, max_words + 1):
        f1 = statistics.fmean(
            max(f1_score(" ".join(context.split()[:k]), answer) for answer in answers) for context, answers in questions
        )
        best = max(best, (100.0 * f1, -k))  # ties: the shorter answer
    return best[0], -best[1]


def constant_score(recipe: str, rows: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """The constant predictor's score on ``rows`` (dictionaries of an offline dataset split) for ``recipe``."""
    if recipe == "glue":
        return {"score": best_class_accuracy([r["label"] for r in rows]), "n": len(rows)}
    if recipe == "pos":
        return {"score": best_tag_accuracy([r["pos_tags"] for r in rows]), "n": len(rows)}
    if recipe == "squad":
        score, k = best_prefix_f1([(r["context"], list(r["answers"]["text"])) for r in rows])
        return {"score": score, "n": len(rows), "k": k}
    raise ValueError(f"no constant predictor for the {recipe!r} recipe")


def _first(split, n: Optional[int]) -> List[Dict[str, Any]]:
    count = len(split) if n is None or n < 0 else min(n, len(split))
    return [split[i] for i in range(count)]


def _last(split, n: int) -> List[Dict[str, Any]]:
    return [split[i] for i in range(len(split) - n, len(split))]


def task_constants(recipe: str, dataset: str, eval_samples: Optional[int], train_samples: Optional[int],
                   dev_samples: Optional[int] = None) -> Dict[str, Any]:
    """The constant predictor of a task on its scored slices: ``validation`` (the first ``eval_samples``),
    ``train`` (the first ``train_samples`` training examples: the training-set score) and, with
    ``dev_samples``, ``dev`` (the sweep's dev split: the last ``dev_samples`` training examples)."""
    from bitfit_hf.data.offline import load_offline_dataset

    raw = load_offline_dataset(dataset)
    out: Dict[str, Any] = {
        "rule": CONSTANT_RULES[recipe],
        "validation": constant_score(recipe, _first(raw["validation"], eval_samples)),
        "train": constant_score(recipe, _first(raw["train"], train_samples)),
    }
    if dev_samples:
        out["dev"] = constant_score(recipe, _last(raw["train"], dev_samples))
    return out
