"""`--method ia3` / `--method bitfit_ia3`: their configs, learning rates and output folders, the --ia3_* flags, the
flags of other methods refused before anything is loaded; and one tiny end-to-end glue run per method."""

from __future__ import annotations

import pytest
from recipe_support import few_threads, load_recipe, read_json  # noqa: F401 - few_threads: an autouse fixture
from test_recipe_args import parse

from bitfit_hf.recipe_kit import RecipeError
from bitfit_hf.recipe_kit.args import DEFAULT_LEARNING_RATES, BitFitArguments
from bitfit_hf.tuners.bitfit_ia3 import IA3, BitFitIA3Config, IA3Config


def test_ia3_trains_vectors_and_head_no_bias():
    parsed = parse("--method", "ia3")
    assert parsed.training.learning_rate == DEFAULT_LEARNING_RATES["ia3"]
    assert parsed.training.output_dir.replace("\\", "/") == "outputs/demo-sst2-ia3"
    config = parsed.bitfit.method_config()
    assert type(config) is IA3Config and config.bias_terms == ["frozen"]
    assert config.ia3_target_modules is None and config.ia3_feedforward_modules is None  # the paper's modules


def test_bitfit_ia3_flags():
    parsed = parse("--method", "bitfit_ia3", "--bias_terms", "b_q", "b_v", "--ia3_target_modules", "value",
                   "output.dense", "--ia3_feedforward_modules", "output.dense", "--ia3_learning_rate", "1e-2",
                   "--learning_rate", "2e-3")
    assert parsed.training.learning_rate == 2e-3 and parsed.training.output_dir.endswith("-bitfit_ia3")
    assert parse("--method", "bitfit_ia3").training.learning_rate == DEFAULT_LEARNING_RATES["bitfit_ia3"]
    config = parsed.bitfit.method_config()
    assert type(config) is BitFitIA3Config and config.bias_terms == ["b_q", "b_v"]
    assert config.ia3_target_modules == ["value", "output.dense"] and config.ia3_feedforward_modules == ["output.dense"]
    assert config.learning_rate_for(IA3) == 1e-2 and config.learning_rate_for("b_q") is None
    assert parse("--method", "bitfit_ia3").bitfit.method_config().bias_terms == ["all"]


@pytest.mark.parametrize("argv, message", [
    (["--ia3_target_modules", "value"], r"--ia3_\* flags apply to --method ia3 / bitfit_ia3 only"),
    (["--method", "lora", "--ia3_learning_rate", "1e-2"], r"--ia3_\* flags apply to --method ia3 / bitfit_ia3 only"),
    (["--method", "ia3", "--bias_terms", "b_q"], "applies to --method bitfit only"),
    (["--method", "ia3", "--lora_target_modules", "query"], "--lora_"),
    (["--method", "bitfit_ia3", "--share_alpha"], "--share_alpha applies to --method adapterbias only"),
    (["--method", "ia3", "--l0_lambda", "1e-3"], "--l0_lambda applies to --method adapterbias only"),
    (["--method", "bitfit_ia3", "--bias_terms", "full"], "spelled --method full"),
    (["--method", "bitfit_ia3", "--ia3_learning_rate", "0"], "--ia3_learning_rate: ia3_learning_rate must be a positive"),
])
def test_flags_of_other_methods_and_bad_values_are_refused(argv, message):
    with pytest.raises(RecipeError, match=message):
        parse(*argv).bitfit.method_config()


def test_empty_target_list_is_refused():
    with pytest.raises(RecipeError, match="ia3_target_modules is empty"):
        BitFitArguments(method="ia3", ia3_target_modules=[" "]).method_config()


TINY = ["--max_train_samples", "32", "--max_eval_samples", "32", "--max_steps", "2",
        "--per_device_train_batch_size", "16", "--save_strategy", "no", "--disable_tqdm", "True"]


@pytest.mark.slow
@pytest.mark.parametrize("method, roles", [("ia3", {"ia3", "head"}), ("bitfit_ia3", {"ia3", "head", "b_q", "b_m3"})])
def test_glue_recipe_runs_ia3_methods(method, roles, tmp_path):
    out = tmp_path / method
    load_recipe("glue").main(["--output_dir", str(out), *TINY, "--method", method])
    assert 0.0 <= read_json(out / "eval_results.json")["eval_accuracy"] <= 1.0
    config = read_json(out / "adapter_config.json")
    assert config["method"] == method and config["bias_terms"] == (["frozen"] if method == "ia3" else ["all"])
    per_role = read_json(out / "trainable_summary.json")["per_role"]
    assert roles <= set(per_role) and per_role["ia3"] == 6 * (384 + 384 + 1536)  # k, v, FFN input of 6 layers
