"""Hand-computed checks of bitfit_hf.metrics.tokens.token_accuracy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bitfit_hf.metrics import token_accuracy


def test_2d_arrays_with_ignore_index():
    preds = np.array([[1, 2, 3, 0], [4, 4, 0, 0]])
    labels = np.array([[1, 2, 0, -100], [4, 5, -100, -100]])
    # counted: 3 + 2 = 5 positions; correct: row 0 -> 1,2 (2), row 1 -> 4 (1) -> 3/5
    assert token_accuracy(preds, labels) == pytest.approx(0.6)


def test_logits_are_argmaxed():
    logits = np.zeros((1, 3, 4))
    logits[0, 0, 2] = logits[0, 1, 1] = logits[0, 2, 3] = 5.0  # -> [2, 1, 3]
    assert token_accuracy(logits, np.array([[2, 0, -100]])) == pytest.approx(0.5)  # 1 of 2 labelled
    assert token_accuracy((logits, None), np.array([[2, 1, 3]])) == 1.0  # Trainer-style tuple


def test_ragged_lists_of_lists():
    # 2 of 3 correct
    assert token_accuracy([[1, 2], [3]], [[1, 0], [3]]) == pytest.approx(2 / 3)
    # -100 ignored in lists too: 1 of 1
    assert token_accuracy([[1, 9], [7]], [[1, -100], [-100]]) == 1.0


def test_string_tags():
    # NN ok, DT wrong, VB ok -> 2/3
    assert token_accuracy([["NN", "DT"], ["VB"]], [["NN", "NN"], ["VB"]]) == pytest.approx(2 / 3)
    assert token_accuracy([["NN", "DT"]], [["NN", "DT"]]) == 1.0  # rectangular strings


def test_custom_ignore_index():
    # label 0 ignored: positions with labels 1, 2 -> preds 1 (ok), 3 (wrong) -> 1/2
    assert token_accuracy([[1, 3, 5]], [[1, 2, 0]], ignore_index=0) == pytest.approx(0.5)


def test_torch_tensors():
    torch = pytest.importorskip("torch")
    assert token_accuracy(torch.tensor([[1, 2]]), torch.tensor([[1, -100]])) == 1.0


def test_nothing_labelled_is_nan():
    assert math.isnan(token_accuracy(np.array([[1, 2]]), np.array([[-100, -100]])))
    assert math.isnan(token_accuracy([[1], [2, 3]], [[-100], [-100, -100]]))


def test_shape_errors():
    with pytest.raises(ValueError, match="shape"):
        token_accuracy(np.zeros((2, 3), dtype=int), np.zeros((2, 4), dtype=int))
    with pytest.raises(ValueError, match="row 1"):
        token_accuracy([[1], [2, 3]], [[1], [2]])
    with pytest.raises(ValueError, match="shape|rows"):
        token_accuracy([[1]], [[1], [2]])
