"""Hand-computed checks of bitfit_hf.metrics.glue (same keys and values as evaluate's glue metric)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr

from bitfit_hf.metrics import GLUE_METRIC_CONFIGS, GLUE_TASKS, glue_compute


def test_glue_task_table():
    assert list(GLUE_TASKS) == ["cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"]
    assert GLUE_TASKS["cola"].text_keys == ("sentence", None)
    assert GLUE_TASKS["sst2"].text_keys == ("sentence", None)
    assert GLUE_TASKS["mrpc"].text_keys == ("sentence1", "sentence2")
    assert GLUE_TASKS["qqp"].text_keys == ("question1", "question2")
    assert GLUE_TASKS["qnli"].text_keys == ("question", "sentence")
    assert GLUE_TASKS["mnli"].text_keys == ("premise", "hypothesis")
    assert GLUE_TASKS["stsb"].num_labels == 1 and GLUE_TASKS["stsb"].is_regression
    assert GLUE_TASKS["mnli"].num_labels == 3
    assert GLUE_TASKS["mnli"].label_names == ("entailment", "neutral", "contradiction")
    assert GLUE_TASKS["mnli"].validation_splits == ("validation_matched", "validation_mismatched")
    assert GLUE_TASKS["rte"]["validation_splits"] == ("validation",)  # dict-style access works too
    for name, task in GLUE_TASKS.items():
        assert task.name == name
        if not task.is_regression:
            assert len(task.label_names) == task.num_labels
    assert GLUE_TASKS["cola"].metric_names == ("matthews_correlation",)
    assert GLUE_TASKS["stsb"].metric_names == ("pearson", "spearmanr")
    assert GLUE_TASKS["qqp"].metric_names == ("accuracy", "f1")
    assert set(GLUE_TASKS) < set(GLUE_METRIC_CONFIGS)


def test_keys_follow_task_table():
    rng = np.random.default_rng(0)
    for name, task in GLUE_TASKS.items():
        if task.is_regression:
            preds, refs = rng.random(20), rng.random(20)
        else:
            preds, refs = rng.integers(0, task.num_labels, 20), rng.integers(0, task.num_labels, 20)
        out = glue_compute(name, preds, refs)
        assert tuple(out) == task.metric_names
        assert all(type(v) is float for v in out.values())


def test_cola_matthews_binary_by_hand():
    refs = [1, 1, 1, 0, 0]
    preds = [1, 1, 0, 0, 1]
    # TP=2 (items 0,1), FN=1 (item 2), TN=1 (item 3), FP=1 (item 4)
    # MCC = (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (2-1)/sqrt(3*3*2*2) = 1/6
    out = glue_compute("cola", preds, refs)
    assert out == {"matthews_correlation": pytest.approx(1 / 6, abs=1e-12)}


def test_cola_matthews_extremes():
    assert glue_compute("cola", [0, 1, 1, 0], [0, 1, 1, 0])["matthews_correlation"] == pytest.approx(1.0)
    assert glue_compute("cola", [1, 0, 0, 1], [0, 1, 1, 0])["matthews_correlation"] == pytest.approx(-1.0)
    # constant predictions: (TP+FP)(TN+FN) has a zero factor -> 0.0 (scikit-learn's convention)
    assert glue_compute("cola", [1, 1, 1, 1], [0, 1, 1, 0])["matthews_correlation"] == 0.0


def test_matthews_multiclass_by_hand():
    from bitfit_hf.metrics.glue import matthews_corrcoef

    refs = np.array([0, 1, 2, 0, 1, 2])
    preds = np.array([0, 2, 1, 0, 0, 2])
    # confusion (rows true, cols pred): [[2,0,0],[1,0,1],[0,1,1]]
    # t = row sums [2,2,2], p = col sums [3,1,2], c = trace 3, s = 6
    # cov_tp = c*s - t.p = 18 - (6+2+4) = 6; cov_pp = 36 - (9+1+4) = 22; cov_tt = 36 - 12 = 24
    # MCC = 6 / sqrt(22*24) = 6 / sqrt(528)
    assert matthews_corrcoef(refs, preds) == pytest.approx(6 / math.sqrt(528), abs=1e-12)


def test_mrpc_accuracy_and_f1_by_hand():
    refs = [1, 1, 1, 0, 0, 0]
    preds = [1, 1, 0, 1, 0, 0]
    # TP=2, FN=1, FP=1, TN=2: accuracy 4/6; precision 2/3, recall 2/3 -> F1 = 2/3 = 2TP/(2TP+FP+FN) = 4/6
    out = glue_compute("mrpc", preds, refs)
    assert out["accuracy"] == pytest.approx(4 / 6)
    assert out["f1"] == pytest.approx(2 / 3)
    assert list(out) == ["accuracy", "f1"]


def test_qqp_f1_without_positives_is_zero():
    # no positive in predictions or references: F1 is 0/0 -> 0.0 (scikit-learn zero_division)
    assert glue_compute("qqp", [0, 0, 0], [0, 0, 0]) == {"accuracy": 1.0, "f1": 0.0}
    # all predicted positive, one of two correct: P=1/2, R=1 -> F1 = 2*(1/2)*1/(3/2) = 2/3
    assert glue_compute("qqp", [1, 1], [1, 0])["f1"] == pytest.approx(2 / 3)


def test_accuracy_tasks_by_hand():
    # 3 of 4 agree -> 0.75
    for task in ("sst2", "qnli", "rte", "wnli", "mnli", "mnli_matched", "mnli_mismatched", "hans"):
        assert glue_compute(task, [0, 1, 1, 0], [0, 1, 0, 0]) == {"accuracy": 0.75}
    # mnli has three classes: 2 of 3 agree
    assert glue_compute("mnli", [2, 1, 0], [2, 1, 1]) == {"accuracy": pytest.approx(2 / 3)}


def test_logits_are_reduced_with_argmax():
    logits = np.array([[0.1, 0.9], [2.0, 1.0], [0.3, 0.4]])  # -> [1, 0, 1]
    assert glue_compute("sst2", logits, [1, 0, 0]) == {"accuracy": pytest.approx(2 / 3)}


def test_integer_valued_floats_accepted_like_evaluate():
    assert glue_compute("rte", np.array([1.0, 0.0]), [1, 0]) == {"accuracy": 1.0}


def test_stsb_pearson_spearman_by_hand_and_scipy():
    preds = [1.0, 2.0, 3.0, 4.0, 5.0]
    refs = [2.0, 4.0, 5.0, 4.0, 5.0]
    # Pearson: dx = [-2,-1,0,1,2], dy = [-2,0,1,0,1]; sum dx*dy = 6, sum dx^2 = 10, sum dy^2 = 6
    #   r = 6 / sqrt(60)
    # Spearman: ranks(refs) = [1, 2.5, 4.5, 2.5, 4.5] (ties averaged); d = [-2,-.5,1.5,-.5,1.5]
    #   sum dx*d = 4+.5+0-.5+3 = 7, sum d^2 = 9 -> rho = 7 / sqrt(90)
    out = glue_compute("stsb", preds, refs)
    assert list(out) == ["pearson", "spearmanr"]
    assert out["pearson"] == pytest.approx(6 / math.sqrt(60), rel=1e-6)
    assert out["spearmanr"] == pytest.approx(7 / math.sqrt(90), rel=1e-6)
    assert out["pearson"] == pytest.approx(pearsonr(preds, refs)[0], rel=1e-6)
    assert out["spearmanr"] == pytest.approx(spearmanr(preds, refs)[0], rel=1e-6)


def test_stsb_matches_scipy_on_random_scores():
    rng = np.random.default_rng(7)
    refs = rng.uniform(0, 5, 200)
    preds = refs + rng.normal(0, 1, 200)
    out = glue_compute("stsb", preds, refs)
    # evaluate casts stsb inputs to float32 first; so does glue_compute
    p32, r32 = preds.astype(np.float32), refs.astype(np.float32)
    assert out["pearson"] == float(pearsonr(p32, r32)[0])
    assert out["spearmanr"] == float(spearmanr(p32, r32)[0])
    assert out["pearson"] == pytest.approx(pearsonr(preds, refs)[0], rel=1e-5)
    # a (n, 1) regression head output is accepted
    assert glue_compute("stsb", preds[:, None], refs) == out


def test_matches_sklearn_when_available():
    sk = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(3)
    for _ in range(30):
        n = int(rng.integers(2, 50))
        refs, preds = rng.integers(0, 2, n), rng.integers(0, 2, n)
        assert glue_compute("cola", preds, refs)["matthews_correlation"] == pytest.approx(
            sk.matthews_corrcoef(refs, preds), abs=1e-12
        )
        out = glue_compute("mrpc", preds, refs)
        assert out["f1"] == pytest.approx(sk.f1_score(refs, preds, zero_division=0.0), abs=1e-12)
        assert out["accuracy"] == pytest.approx(sk.accuracy_score(refs, preds), abs=1e-12)
    from bitfit_hf.metrics.glue import matthews_corrcoef

    refs, preds = rng.integers(0, 4, 100), rng.integers(0, 4, 100)
    assert matthews_corrcoef(refs, preds) == pytest.approx(sk.matthews_corrcoef(refs, preds), abs=1e-12)


def test_errors():
    with pytest.raises(KeyError, match="unknown GLUE task"):
        glue_compute("squad", [0], [0])
    with pytest.raises(ValueError, match="2 predictions but 3 references"):
        glue_compute("sst2", [0, 1], [0, 1, 1])
    with pytest.raises(ValueError, match="no predictions"):
        glue_compute("sst2", [], [])
    with pytest.raises(ValueError, match="integer class ids"):
        glue_compute("rte", [0.5, 1.0], [0, 1])
    with pytest.raises(ValueError, match="binary"):
        glue_compute("mrpc", [0, 2], [0, 1])
