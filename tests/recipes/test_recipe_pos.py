"""recipes/pos.py end to end on the real all-MiniLM-L6-v2 and tiny slices of the real WSJ sample:
under ``accelerate launch`` on the offline default, and in process from word/TAG + CoNLL files."""

from __future__ import annotations

import pytest
import torch
from recipe_support import accelerate_launch, load_recipe, read_json

from bitfit_hf.data.offline import load_offline_dataset
from bitfit_hf.recipe_kit import DEFAULT_MODEL_ID
from bitfit_hf.recipe_kit.tasks.tagging import PTB_TAGS

pytestmark = pytest.mark.slow


def test_default_data_under_accelerate_launch(tmp_path):
    out = tmp_path / "pos"
    accelerate_launch("pos", [
        "--output_dir", out, "--max_train_samples", "32", "--max_eval_samples", "16", "--max_predict_samples", "5",
        "--max_steps", "2", "--save_strategy", "no", "--do_train", "--do_eval", "--do_predict",
    ], tmp_path)
    results = read_json(out / "eval_results.json")
    assert 0.0 <= results["eval_accuracy"] <= 1.0 and 0.0 <= results["init_eval_accuracy"] <= 1.0
    test = load_offline_dataset("wsj_pos")["test"].select(range(5))
    assert results["eval_words"] == sum(len(t) for t in load_offline_dataset("wsj_pos")["validation"].select(range(16))["tokens"])
    # predictions: the test sentences back as word/TAG lines, every tag a PTB tag
    lines = (out / "predictions.txt").read_text().splitlines()
    assert len(lines) == 5
    for line, words in zip(lines, test["tokens"]):
        pairs = [piece.rpartition("/") for piece in line.split(" ")]
        assert [w.replace("\\/", "/") for w, _, _ in pairs] == words
        assert all(tag in PTB_TAGS for _, _, tag in pairs)
    assert "predict_accuracy" in read_json(out / "all_results.json")
    config = read_json(out / "adapter_config.json")
    assert config["base_model_name_or_path"] == DEFAULT_MODEL_ID and config["task_type"] == "TOKEN_CLS"
    assert config["num_labels"] == len(PTB_TAGS)


def test_tagged_text_and_conll_files_in_process(tmp_path):
    torch.set_num_threads(2)
    wsj = load_offline_dataset("wsj_pos")
    train = tmp_path / "train.pos"
    train.write_text("".join(" ".join(f"{w}/{t}" for w, t in zip(r["tokens"], r["pos_tags"])) + "\n"
                             for r in wsj["train"].select(range(16))))
    dev = tmp_path / "dev.conll"
    dev.write_text("".join("".join(f"{w}\t{t}\n" for w, t in zip(r["tokens"], r["pos_tags"])) + "\n"
                           for r in wsj["validation"].select(range(8))))
    out = tmp_path / "files"
    load_recipe("pos").main([
        "--train_file", str(train), "--validation_file", str(dev), "--output_dir", str(out), "--max_steps", "1",
        "--save_strategy", "no", "--disable_tqdm", "True", "--method", "frozen",
    ])
    results = read_json(out / "eval_results.json")
    assert results["eval_samples"] == 8 and "eval_accuracy" in results
    summary = read_json(out / "trainable_summary.json")
    assert set(summary["per_role"]) == {"head"}  # frozen: the head alone
