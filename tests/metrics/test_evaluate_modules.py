"""The packaged `evaluate` modules: loaded with `evaluate.load(<path>, config)` offline, same keys as the Hub's
scripts, values checked against scikit-learn and SciPy, and nothing written outside the HF cache."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import evaluate
import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from bitfit_hf.metrics import GLUE_METRIC_CONFIGS
from bitfit_hf.metrics.loading import METRIC_MODULES, load_metric, metric_module_path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _classes(rng, n, k=2):
    return rng.integers(0, k, n), rng.integers(0, k, n)


@pytest.mark.parametrize("config", GLUE_METRIC_CONFIGS)
def test_glue_module_matches_sklearn_and_scipy(config):
    metric = evaluate.load(metric_module_path("glue"), config)
    rng = np.random.default_rng(len(config))
    if config == "stsb":
        preds, refs = rng.random(50) * 5, rng.random(50) * 5
        out = metric.compute(predictions=preds, references=refs)
        p32, r32 = preds.astype(np.float32), refs.astype(np.float32)  # the metric's features are float32
        assert out == {"pearson": pytest.approx(float(pearsonr(p32, r32)[0]), rel=1e-6),
                       "spearmanr": pytest.approx(float(spearmanr(p32, r32)[0]), rel=1e-6)}
        return
    preds, refs = _classes(rng, 60, 3 if config.startswith("mnli") or config == "hans" else 2)
    out = metric.compute(predictions=preds, references=refs)
    if config == "cola":
        assert out == {"matthews_correlation": pytest.approx(matthews_corrcoef(refs, preds), abs=1e-12)}
    elif config in ("mrpc", "qqp"):
        assert out == {"accuracy": pytest.approx(accuracy_score(refs, preds)), "f1": pytest.approx(f1_score(refs, preds))}
    else:
        assert out == {"accuracy": pytest.approx(accuracy_score(refs, preds))}
    assert all(type(v) is float for v in out.values())


def test_glue_module_unknown_config_is_a_key_error():
    with pytest.raises(KeyError, match="sst2"):
        evaluate.load(metric_module_path("glue"), "not_a_task")


def test_squad_module_scores_like_the_official_rules():
    metric = evaluate.load(metric_module_path("squad"))
    predictions = [
        {"id": "a", "prediction_text": "The Denver Broncos!"},  # normalises to a gold answer: EM 1, F1 1
        {"id": "b", "prediction_text": "in the year 1990"},  # gold "1990 season": 1 common token, P 1/3, R 1/2
        {"id": "c", "prediction_text": "a guess"},  # no token in common: 0
    ]
    references = [
        {"id": "a", "answers": {"text": ["Denver Broncos", "Broncos"], "answer_start": [0, 7]}},
        {"id": "b", "answers": {"text": ["1990 season"], "answer_start": [3]}},
        {"id": "c", "answers": {"text": ["something else"], "answer_start": [0]}},
    ]
    out = metric.compute(predictions=predictions, references=references)
    f1_b = 2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2)
    assert set(out) == {"exact_match", "f1"}
    assert out["exact_match"] == pytest.approx(100 / 3)
    assert out["f1"] == pytest.approx(100 * (1 + f1_b) / 3)


def test_token_accuracy_module_matches_sklearn_on_labelled_positions():
    rng = np.random.default_rng(7)
    refs = rng.integers(0, 5, (8, 12))
    refs[:, 0] = -100  # [CLS]
    refs[rng.random((8, 12)) < 0.3] = -100  # non-first sub-tokens, padding
    preds = rng.integers(0, 5, (8, 12))
    out = load_metric("token_accuracy").compute(predictions=preds, references=refs)
    mask = refs != -100
    assert out == {"accuracy": pytest.approx(accuracy_score(refs[mask], preds[mask]))}
    nothing = load_metric("token_accuracy").compute(predictions=[[1, 2]], references=[[-100, -100]])
    assert math.isnan(nothing["accuracy"])


def test_every_module_ships_and_unknown_names_fail():
    for name in METRIC_MODULES:
        assert Path(metric_module_path(name)).is_file()
    with pytest.raises(KeyError, match="glue"):
        metric_module_path("bleu")


def test_glue_recipe_computes_through_the_packaged_module(monkeypatch):
    from transformers import EvalPrediction

    from bitfit_hf.recipe_kit.tasks import classification

    calls = []

    def spy(name, config_name=None):
        calls.append((name, config_name))
        return load_metric(name, config_name)

    monkeypatch.setattr(classification, "load_metric", spy)
    logits = np.array([[0.2, 0.8], [0.9, 0.1], [0.3, 0.7], [0.6, 0.4]])
    labels = np.array([1, 0, 0, 0])
    out = classification.make_compute_metrics(classification.GLUE_TASKS["mrpc"], False)(EvalPrediction(logits, labels))
    assert calls == [("glue", "mrpc")]
    assert out == {"accuracy": pytest.approx(0.75), "f1": pytest.approx(f1_score(labels, [1, 0, 1, 0]))}


NO_NETWORK = """
import socket

def _refuse(*args, **kwargs):
    raise OSError("network access attempted during an offline metric load")

socket.socket.connect = _refuse
socket.socket.connect_ex = _refuse
socket.create_connection = _refuse
"""

LOAD_ALL = """
from bitfit_hf.metrics.loading import metric_module_path
import evaluate
print(evaluate.load(metric_module_path("glue"), "sst2").compute(predictions=[1, 0, 1], references=[1, 1, 1]))
print(evaluate.load(metric_module_path("squad")).compute(
    predictions=[{"id": "q", "prediction_text": "x"}], references=[{"id": "q", "answers": {"text": ["x"], "answer_start": [0]}}]))
print(evaluate.load(metric_module_path("token_accuracy")).compute(predictions=[[1, 2]], references=[[1, -100]]))
"""


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow  # a fresh interpreter with the network cut
def test_packaged_modules_load_offline_and_write_only_into_the_hf_cache(tmp_path):
    home, work, site = tmp_path / "home", tmp_path / "work", tmp_path / "site"
    for folder in (home, work, site):
        folder.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(NO_NETWORK))
    package_dir = REPO_ROOT / "bitfit_hf" / "metrics" / "evaluate_modules"
    before = _files(package_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "XDG_"))}
    env.update(HOME=str(home), HF_HUB_OFFLINE="1", HF_EVALUATE_OFFLINE="1", TMPDIR=str(tmp_path / "tmp"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    (tmp_path / "tmp").mkdir()
    proc = subprocess.run([sys.executable, "-c", LOAD_ALL], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "{'accuracy': 0.6666666666666666}", "{'exact_match': 100.0, 'f1': 100.0}", "{'accuracy': 1.0}",
    ]
    assert _files(work) == set()
    assert _files(package_dir) == before
    written = _files(home)
    assert written and all(p.startswith(".cache/huggingface/") for p in written), sorted(written)
