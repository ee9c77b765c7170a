"""The recipes on a real decoder base with no bias terms: SmolLM2-135M-Instruct from its wheel's GGUF file,
clm.py's default and glue.py with --gguf_file, each a two-step run on real data, then the adapter reloaded
onto a fresh copy of the base."""

from __future__ import annotations

import math

import pytest
import torch
from recipe_support import few_threads, load_recipe, read_json  # noqa: F401 - few_threads: an autouse fixture

from bitfit_hf import AutoBitFitModel, BitFitAdapter
from bitfit_hf.data.assets import SMOLLM2_GGUF, smollm2_path

pytestmark = pytest.mark.slow

TINY = ["--max_steps", "2", "--save_strategy", "no", "--disable_tqdm", "True", "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "4"]


def _check_adapter(out, task_type: str) -> BitFitAdapter:
    """Biases were added (LLaMA has none), trained away from zero, recorded with how the base was loaded,
    and the adapter rebuilds its model from the same GGUF file with the trained values in place."""
    adapter = BitFitAdapter.from_pretrained(str(out))
    config = adapter.config
    assert config.task_type == task_type and config.model_type == "llama"
    assert config.base_loading.get("gguf_file") == SMOLLM2_GGUF
    assert config.added_biases, "SmolLM2 has no bias terms: the recipe must add them"
    added = [n for n in adapter.tensors if n.rsplit(".", 1)[0] in config.added_biases]
    assert added and any(adapter.tensors[n].abs().max() > 0 for n in added), "no added bias moved in training"
    model = AutoBitFitModel.from_pretrained(str(out))
    params = dict(model.named_parameters())
    for name in added:
        assert torch.equal(params[name].detach().float(), adapter.tensors[name].float()), name
    return adapter


def test_clm_default_trains_the_gguf_base(tmp_path):
    out = tmp_path / "clm"
    load_recipe("clm").main(["--output_dir", str(out), "--max_train_samples", "8", "--max_eval_samples", "4",
                             "--block_size", "32", *TINY])
    results = read_json(out / "all_results.json")
    assert math.isfinite(results["eval_perplexity"]) and math.isfinite(results["init_eval_perplexity"])
    assert results["train_samples"] == 8
    summary = read_json(out / "trainable_summary.json")
    assert 0 < summary["trainable_params"] < 0.01 * summary["total_params"]  # biases only: the LM head stays frozen
    _check_adapter(out, "CAUSAL_LM")


def test_glue_with_gguf_file_trains_a_classifier_on_smollm2(tmp_path):
    out = tmp_path / "glue"
    load_recipe("glue").main(["--output_dir", str(out), "--model_name_or_path", smollm2_path(), "--gguf_file",
                              SMOLLM2_GGUF, "--add_missing_biases", "--max_train_samples", "16", "--max_eval_samples", "8",
                              *TINY])
    results = read_json(out / "all_results.json")
    assert 0.0 <= results["eval_accuracy"] <= 1.0 and results["eval_samples"] == 8
    adapter = _check_adapter(out, "SEQ_CLS")
    assert "score" in adapter.config.head_modules
