"""Word-level token accuracy for tagging (POS, chunking, NER tags as classes)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["token_accuracy"]


def token_accuracy(predictions: Any, labels: Any, ignore_index: int = -100) -> float:
    """Fraction of labelled positions whose prediction equals the label.

    Positions whose label equals ``ignore_index`` (padding, non-first sub-tokens)
    are left out.  Inputs are 2-D arrays of the same shape (e.g. from
    ``Trainer``'s ``EvalPrediction``) or lists of lists (rows may differ in
    length; a prediction row must be exactly as long as its label row).  Labels
    may be ids or tag strings.  3-D ``predictions`` (scores per class, same
    leading shape as ``labels``) are reduced with ``argmax`` over the last axis.

    Returns:
        correct / counted, or ``nan`` when no position is labelled.

    Raises:
        ValueError: mismatched shapes or row lengths.
    """
    if isinstance(predictions, tuple):  # Trainer may hand over (logits, ...) tuples
        predictions = predictions[0]
    pred_arr = _maybe_array(predictions)
    label_arr = _maybe_array(labels)
    if pred_arr is not None and label_arr is not None:
        if pred_arr.ndim == label_arr.ndim + 1 and pred_arr.dtype.kind in "iuf":
            pred_arr = pred_arr.argmax(axis=-1)
        if pred_arr.shape != label_arr.shape:
            raise ValueError(f"predictions shape {pred_arr.shape} does not match labels shape {label_arr.shape}")
        if label_arr.dtype.kind in "iuf":
            mask = label_arr != ignore_index
        else:
            mask = np.ones(label_arr.shape, dtype=bool)
        counted = int(mask.sum())
        if counted == 0:
            return float("nan")
        return float(np.sum((pred_arr == label_arr) & mask)) / counted

    # ragged lists of lists
    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} prediction rows but {len(labels)} label rows")
    correct = counted = 0
    for i, (pred_row, label_row) in enumerate(zip(predictions, labels)):
        pred_row = list(pred_row)
        label_row = list(label_row)
        if pred_row and isinstance(pred_row[0], (list, tuple, np.ndarray)):  # per-class scores
            pred_row = [int(np.argmax(scores)) for scores in pred_row]
        if len(pred_row) != len(label_row):
            raise ValueError(f"row {i}: {len(pred_row)} predictions but {len(label_row)} labels")
        for p, t in zip(pred_row, label_row):
            if _is_ignored(t, ignore_index):
                continue
            counted += 1
            correct += int(p == t)
    return correct / counted if counted else float("nan")


def _is_ignored(label: Any, ignore_index: int) -> bool:
    if isinstance(label, str):
        return False
    try:
        return bool(label == ignore_index)
    except Exception:  # pragma: no cover - exotic label types
        return False


def _maybe_array(values: Any) -> np.ndarray | None:
    """A rectangular numpy view of ``values``, or None for ragged input."""
    if isinstance(values, np.ndarray):
        return values
    if hasattr(values, "detach") and hasattr(values, "cpu"):  # torch tensor
        return values.detach().cpu().numpy()
    try:
        lengths = {len(row) for row in values}
    except TypeError:
        return np.asarray(values)
    if len(lengths) > 1:
        return None
    try:
        arr = np.asarray(values)
    except ValueError:
        return None
    return None if arr.dtype == object else arr
