"""recipes/squad.py end to end on the real all-MiniLM-L6-v2 and tiny slices of the real SQuAD v1.1
dev set, under ``accelerate launch``: exact match / F1 before and after, predictions files."""

from __future__ import annotations

import pytest
from recipe_support import accelerate_launch, read_json

from bitfit_hf.data.offline import load_offline_dataset
from bitfit_hf.metrics.squad import squad_v1_compute
from bitfit_hf.recipe_kit import DEFAULT_MODEL_ID

pytestmark = pytest.mark.slow


def test_default_data_under_accelerate_launch(tmp_path):
    out = tmp_path / "squad"
    accelerate_launch("squad", [
        "--output_dir", out, "--max_train_samples", "16", "--max_eval_samples", "8", "--max_predict_samples", "4",
        "--max_seq_length", "192", "--doc_stride", "48", "--max_steps", "2", "--save_strategy", "no",
        "--do_train", "--do_eval", "--do_predict",
    ], tmp_path)
    results = read_json(out / "eval_results.json")
    for key in ("eval_exact_match", "eval_f1", "init_eval_exact_match", "init_eval_f1"):
        assert 0.0 <= results[key] <= 100.0
    assert results["eval_samples"] == 8
    # the answers file scores to exactly the reported metrics with the official v1.1 rules
    validation = load_offline_dataset("squad_dev")["validation"].select(range(8))
    answers = read_json(out / "eval_predictions.json")
    assert list(answers) == validation["id"]
    rescored = squad_v1_compute(
        predictions=[{"id": k, "prediction_text": v} for k, v in answers.items()],
        references=[{"id": ex["id"], "answers": ex["answers"]} for ex in validation],
    )
    assert rescored["exact_match"] == pytest.approx(results["eval_exact_match"])
    assert rescored["f1"] == pytest.approx(results["eval_f1"])
    nbest = read_json(out / "eval_nbest_predictions.json")
    assert all(nbest[k][0]["text"] == v for k, v in answers.items() if nbest[k])
    assert len(read_json(out / "predict_predictions.json")) == 4
    assert "predict_f1" in read_json(out / "all_results.json")
    config = read_json(out / "adapter_config.json")
    assert config["base_model_name_or_path"] == DEFAULT_MODEL_ID and config["task_type"] == "QUESTION_ANS"
