"""GLUE task facts and an offline copy of the ``evaluate`` ``glue`` metric.

``evaluate.load("glue", task)`` needs the Hub, which is unreachable offline.
:func:`glue_compute` gives the same keys and values:

* ``cola``: ``matthews_correlation``
* ``stsb``: ``pearson``, ``spearmanr``
* ``mrpc``, ``qqp``: ``accuracy``, ``f1`` (binary F1 of class 1)
* ``sst2``, ``mnli`` (+ ``mnli_matched`` / ``mnli_mismatched``), ``qnli``,
  ``rte``, ``wnli``, ``hans``: ``accuracy``

Like ``evaluate``, inputs are cast to int64 (float32 for ``stsb``) before
computing.  As a convenience, 2-D class scores (logits) are reduced with
``argmax`` for the classification tasks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

__all__ = [
    "GlueTask",
    "GLUE_TASKS",
    "GLUE_METRIC_CONFIGS",
    "glue_compute",
    "simple_accuracy",
    "binary_f1",
    "matthews_corrcoef",
    "pearson_and_spearman",
]


@dataclass(frozen=True)
class GlueTask:
    """Facts about one GLUE task (as in the Hub ``glue`` dataset)."""

    name: str
    text_keys: tuple[str, str | None]
    num_labels: int
    label_names: tuple[str, ...]
    validation_splits: tuple[str, ...]
    metric_names: tuple[str, ...]
    is_regression: bool = False

    def __getitem__(self, key: str) -> Any:  # dict-style access: GLUE_TASKS["rte"]["num_labels"]
        return getattr(self, key)


GLUE_TASKS: dict[str, GlueTask] = {
    t.name: t
    for t in (
        GlueTask("cola", ("sentence", None), 2, ("unacceptable", "acceptable"), ("validation",),
                 ("matthews_correlation",)),
        GlueTask("sst2", ("sentence", None), 2, ("negative", "positive"), ("validation",), ("accuracy",)),
        GlueTask("mrpc", ("sentence1", "sentence2"), 2, ("not_equivalent", "equivalent"), ("validation",),
                 ("accuracy", "f1")),
        GlueTask("qqp", ("question1", "question2"), 2, ("not_duplicate", "duplicate"), ("validation",),
                 ("accuracy", "f1")),
        GlueTask("stsb", ("sentence1", "sentence2"), 1, (), ("validation",), ("pearson", "spearmanr"),
                 is_regression=True),
        GlueTask("mnli", ("premise", "hypothesis"), 3, ("entailment", "neutral", "contradiction"),
                 ("validation_matched", "validation_mismatched"), ("accuracy",)),
        GlueTask("qnli", ("question", "sentence"), 2, ("entailment", "not_entailment"), ("validation",),
                 ("accuracy",)),
        GlueTask("rte", ("sentence1", "sentence2"), 2, ("entailment", "not_entailment"), ("validation",),
                 ("accuracy",)),
        GlueTask("wnli", ("sentence1", "sentence2"), 2, ("not_entailment", "entailment"), ("validation",),
                 ("accuracy",)),
    )
}

#: Every config name the ``evaluate`` glue metric accepts.
GLUE_METRIC_CONFIGS = (
    "sst2", "mnli", "mnli_mismatched", "mnli_matched", "cola", "stsb", "mrpc", "qqp", "qnli", "rte", "wnli", "hans",
)
_ACCURACY_ONLY = {"sst2", "mnli", "mnli_mismatched", "mnli_matched", "qnli", "rte", "wnli", "hans"}


def _as_int_labels(values: Any, what: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim == 2 and what == "predictions":
        arr = arr.argmax(axis=-1)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be 1-D (got shape {arr.shape})")
    if arr.dtype.kind in "iub":
        return arr.astype(np.int64)
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise ValueError(f"{what} must hold integer class ids (got non-integer values)")
        return arr.astype(np.int64)
    raise ValueError(f"{what} must hold integer class ids (got dtype {arr.dtype})")


def simple_accuracy(preds: np.ndarray, labels: np.ndarray) -> float:
    return float((preds == labels).mean())


def binary_f1(labels: np.ndarray, preds: np.ndarray, pos_label: int = 1) -> float:
    """F1 of the positive class: 2*TP / (2*TP + FP + FN), 0.0 when that is 0/0 (as scikit-learn)."""
    tp = int(np.sum((preds == pos_label) & (labels == pos_label)))
    fp = int(np.sum((preds == pos_label) & (labels != pos_label)))
    fn = int(np.sum((preds != pos_label) & (labels == pos_label)))
    denom = 2 * tp + fp + fn
    return 0.0 if denom == 0 else 2 * tp / denom


def matthews_corrcoef(labels: np.ndarray, preds: np.ndarray) -> float:
    """Multi-class Matthews correlation (Gorodkin's R_K), as scikit-learn computes it.

    With the confusion matrix C: t = row sums, p = column sums, c = trace, s = total,
    MCC = (c*s - t.p) / sqrt((s^2 - p.p) * (s^2 - t.t)); 0.0 when the denominator is 0.
    """
    labels = np.asarray(labels)
    preds = np.asarray(preds)
    classes, inverse = np.unique(np.concatenate([labels, preds]), return_inverse=True)
    k = len(classes)
    y_true, y_pred = inverse[: len(labels)], inverse[len(labels):]
    conf = np.zeros((k, k), dtype=np.float64)
    np.add.at(conf, (y_true, y_pred), 1)
    t_sum = conf.sum(axis=1)
    p_sum = conf.sum(axis=0)
    n_correct = np.trace(conf)
    n_samples = p_sum.sum()
    cov_ytyp = n_correct * n_samples - np.dot(t_sum, p_sum)
    cov_ypyp = n_samples**2 - np.dot(p_sum, p_sum)
    cov_ytyt = n_samples**2 - np.dot(t_sum, t_sum)
    if cov_ypyp * cov_ytyt == 0:
        return 0.0
    return float(cov_ytyp / np.sqrt(cov_ytyt * cov_ypyp))


def pearson_and_spearman(preds: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    from scipy.stats import pearsonr, spearmanr

    return {"pearson": float(pearsonr(preds, labels)[0]), "spearmanr": float(spearmanr(preds, labels)[0])}


def glue_compute(task: str, predictions: Sequence[Any], references: Sequence[Any]) -> dict[str, float]:
    """Score GLUE predictions offline; same keys and values as ``evaluate.load("glue", task)``.

    Args:
        task: a GLUE config name (see :data:`GLUE_METRIC_CONFIGS`).
        predictions: class ids (or 2-D logits, reduced with argmax); floats for ``stsb``.
        references: gold class ids; floats for ``stsb``.

    Raises:
        KeyError: unknown task.
        ValueError: empty or mismatched inputs, non-integer class ids.
    """
    if task not in GLUE_METRIC_CONFIGS:
        raise KeyError(f"unknown GLUE task {task!r}; choose one of {list(GLUE_METRIC_CONFIGS)}")
    if task == "stsb":
        preds = np.asarray(predictions, dtype=np.float32)
        refs = np.asarray(references, dtype=np.float32)
        if preds.ndim == 2 and preds.shape[1] == 1:
            preds = preds[:, 0]
        if preds.ndim != 1 or refs.ndim != 1:
            raise ValueError(f"stsb predictions and references must be 1-D (got {preds.shape}, {refs.shape})")
    else:
        preds = _as_int_labels(predictions, "predictions")
        refs = _as_int_labels(references, "references")
    if len(preds) != len(refs):
        raise ValueError(f"{len(preds)} predictions but {len(refs)} references")
    if len(refs) == 0:
        raise ValueError("no predictions to score")
    if task == "cola":
        return {"matthews_correlation": matthews_corrcoef(refs, preds)}
    if task == "stsb":
        return pearson_and_spearman(preds, refs)
    if task in ("mrpc", "qqp"):
        extra = sorted(set(np.unique(preds).tolist() + np.unique(refs).tolist()) - {0, 1})
        if extra:
            raise ValueError(f"{task} is binary: class ids must be 0 or 1 (got {extra})")
        return {"accuracy": simple_accuracy(preds, refs), "f1": binary_f1(refs, preds)}
    assert task in _ACCURACY_ONLY
    return {"accuracy": simple_accuracy(preds, refs)}
