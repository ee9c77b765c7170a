"""The probe head start in the recipes (the honest frozen baseline included), the SNLI pair data, and what a
short run leaves in its folder."""

from __future__ import annotations

import os

import pytest
from recipe_support import few_threads, load_recipe, read_json  # noqa: F401 - few_threads: an autouse fixture

pytestmark = pytest.mark.slow

SMALL = ["--max_train_samples", "64", "--max_eval_samples", "32", "--per_device_train_batch_size", "16",
         "--disable_tqdm", "True", "--eval_before_training", "false"]


def test_frozen_with_the_probe_fits_the_head_and_takes_no_step(tmp_path):
    out = tmp_path / "frozen"
    load_recipe("glue").main(["--output_dir", str(out), "--method", "frozen", "--probe_head_start", *SMALL])
    train = read_json(out / "train_results.json")
    assert train["probe_examples"] == 64 and train["probe_loss"] < train["probe_loss_before"]
    assert read_json(out / "trainer_state.json")["global_step"] == 0  # the probe was the training
    assert not [p for p in os.listdir(out) if p.startswith("checkpoint-")]
    results = read_json(out / "eval_results.json")
    again = tmp_path / "again"  # the saved head, on a fresh base, reproduces the run's evaluation
    load_recipe("glue").main(["--output_dir", str(again), "--do_eval", "--adapter_name_or_path", str(out),
                              "--max_eval_samples", "32", "--disable_tqdm", "True"])
    reloaded = read_json(again / "eval_results.json")
    assert reloaded["eval_accuracy"] == results["eval_accuracy"]
    assert reloaded["eval_loss"] == pytest.approx(results["eval_loss"], abs=1e-5)


def test_bitfit_starts_from_the_probe_then_trains(tmp_path):
    out = tmp_path / "bitfit"
    load_recipe("glue").main(["--output_dir", str(out), "--probe_head_start", "--max_steps", "2", *SMALL])
    history = read_json(out / "trainer_state.json")["log_history"]
    assert any("probe_loss" in entry for entry in history)  # logged before the first step
    assert read_json(out / "trainer_state.json")["global_step"] == 2


def test_the_end_of_training_checkpoint_goes_and_the_cadence_ones_stay(tmp_path):
    out = tmp_path / "ckpt"
    load_recipe("glue").main(["--output_dir", str(out), "--max_steps", "3", "--save_steps", "2", *SMALL])
    checkpoints = sorted(p for p in os.listdir(out) if p.startswith("checkpoint-"))
    assert checkpoints == ["checkpoint-2"]
    assert (out / "adapter_model.safetensors").is_file()


def test_snli_runs_as_a_sentence_pair_task(tmp_path):
    out = tmp_path / "snli"
    load_recipe("glue").main(["--output_dir", str(out), "--dataset_name", "snli", "--max_steps", "2", *SMALL])
    config = read_json(out / "adapter_config.json")
    assert config["metadata"]["text_columns"] == ["premise", "hypothesis"]
    assert config["id2label"] == {"0": "entailment", "1": "neutral", "2": "contradiction"}
