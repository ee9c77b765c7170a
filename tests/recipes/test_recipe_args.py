"""Argument parsing of the recipes: method-dependent learning rates, defaults that never override an
explicit flag, offline-default caps, argument files, and --method/--bias_terms checks."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Optional

import pytest

from bitfit_hf.recipe_kit import DataArguments, RecipeDefaults, RecipeError, parse_recipe_args
from bitfit_hf.recipe_kit.args import DEFAULT_LEARNING_RATES, BitFitArguments, default_use_cpu


@dataclass
class _Data(DataArguments):
    task_name: Optional[str] = field(default=None)


DEFAULTS = RecipeDefaults(
    recipe="demo",
    offline_dataset="movie_reviews",
    offline_task="sst2",
    training={"per_device_train_batch_size": 32},
    offline={"max_train_samples": 3200},
)


def parse(*argv):
    return parse_recipe_args(_Data, DEFAULTS, list(argv))


def test_no_arguments_gives_the_offline_default_run():
    parsed = parse()
    model, data, bitfit, training = parsed
    assert parsed.offline_data
    assert data.dataset_name == "movie_reviews" and data.task_name == "sst2"
    assert data.max_train_samples == 3200
    assert training.do_train and training.do_eval and not training.do_predict
    assert training.learning_rate == DEFAULT_LEARNING_RATES["bitfit"] == 3e-3  # the sweep's choice
    assert training.per_device_train_batch_size == 32
    assert training.output_dir.replace("\\", "/") == "outputs/demo-sst2-bitfit"
    assert training.use_cpu == default_use_cpu()
    assert bitfit.method == "bitfit" and model.model_name_or_path is None


@pytest.mark.parametrize("method, lr", [("bitfit", 3e-3), ("frozen", 1e-2), ("full", 1e-4), ("adapterbias", 1e-2),
                                        ("rand_uniform", 3e-2)])
def test_learning_rate_follows_the_method(method, lr):
    _, _, _, training = parse("--method", method)
    assert training.learning_rate == lr


@pytest.mark.parametrize("flag", ["--learning_rate", "--learning-rate"])
def test_explicit_learning_rate_wins(flag):
    _, _, _, training = parse("--method", "full", flag, "3e-4")
    assert training.learning_rate == 3e-4
    _, _, _, training = parse(f"{flag}=5e-3")
    assert training.learning_rate == 5e-3


def test_explicit_flags_win_over_recipe_defaults():
    parsed = parse("--per_device_train_batch_size", "4", "--do_eval", "--output_dir", "/tmp/x", "--use_cpu", "False")
    training = parsed.training
    assert training.per_device_train_batch_size == 4
    assert training.do_eval and not training.do_train  # one do_* flag given: no do_* defaults
    assert training.output_dir == "/tmp/x"
    assert training.use_cpu is False
    assert "output_dir" not in parsed.applied_defaults


def test_offline_caps_apply_only_to_the_offline_data(tmp_path):
    csv = tmp_path / "train.csv"
    csv.write_text("sentence,label\na,0\nb,1\n")
    parsed = parse("--train_file", str(csv))
    assert not parsed.offline_data
    assert parsed.data.max_train_samples is None and parsed.data.dataset_name is None
    assert parsed.training.output_dir.replace("\\", "/") == "outputs/demo-train-bitfit"
    parsed = parse("--max_train_samples", "10")
    assert parsed.offline_data and parsed.data.max_train_samples == 10
    # a task name alone means the Hub dataset, not the offline default
    parsed = parse("--task_name", "rte")
    assert not parsed.offline_data and parsed.data.dataset_name is None


def test_offline_learning_rate_per_method():
    defaults = RecipeDefaults(recipe="demo", offline_dataset="movie_reviews", offline_learning_rates={"bitfit": 5e-3})
    assert parse_recipe_args(_Data, defaults, []).training.learning_rate == 5e-3
    assert parse_recipe_args(_Data, defaults, ["--method", "full"]).training.learning_rate == DEFAULT_LEARNING_RATES["full"]
    assert parse_recipe_args(_Data, defaults, ["--learning_rate", "1e-4"]).training.learning_rate == 1e-4
    assert parse_recipe_args(_Data, defaults, ["--train_file", "x.csv"]).training.learning_rate == 3e-3


def test_arguments_file(tmp_path):
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"method": "full", "num_train_epochs": 1, "output_dir": str(tmp_path / "o")}))
    parsed = parse(str(path))
    assert parsed.bitfit.method == "full"
    assert parsed.training.learning_rate == DEFAULT_LEARNING_RATES["full"] and parsed.training.num_train_epochs == 1
    assert parsed.training.output_dir == str(tmp_path / "o")
    assert parsed.data.dataset_name == "movie_reviews"


def test_bias_terms_and_method():
    _, _, bitfit, _ = parse("--bias_terms", "b_q", "b_m2")
    config = bitfit.method_config()
    assert config.bias_terms == ["b_q", "b_m2"]
    _, _, bitfit, _ = parse("--bias_terms", "paper-subset", "--no_train_head")
    config = bitfit.method_config()
    assert config.bias_terms == ["paper-subset"] and config.train_head is False
    assert BitFitArguments(method="full").method_config().is_full_finetuning
    assert BitFitArguments(method="frozen").method_config().bias_terms == ["frozen"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"method": "full", "bias_terms": ["b_q"]}, "applies to --method bitfit only"),
        ({"bias_terms": ["full"]}, "--method full"),
        ({"bias_terms": ["b_zz"]}, "Unknown bias term"),
        ({"method": "frozen", "train_head": False}, "trains nothing"),
    ],
)
def test_bad_bitfit_arguments(kwargs, message):
    with pytest.raises(RecipeError, match=message):
        BitFitArguments(**kwargs).method_config()


def test_unknown_method_is_refused():
    with pytest.raises((RecipeError, SystemExit)):
        parse("--method", "prefix_tuning")


def test_bitfit_lora_method_and_flags():
    from bitfit_hf.tuners.bitfit_lora import BitFitLoraConfig

    parsed = parse("--method", "bitfit_lora", "--lora_r", "4", "--lora_target_modules", "query", "key",
                   "--lora_learning_rate", "5e-4", "--bias_terms", "b_q", "b_v")
    assert parsed.training.learning_rate == DEFAULT_LEARNING_RATES["bitfit_lora"]
    assert parsed.training.output_dir.endswith("demo-sst2-bitfit_lora")
    config = parsed.bitfit.method_config()
    assert isinstance(config, BitFitLoraConfig)
    assert (config.lora_r, config.lora_alpha, config.lora_dropout) == (4, 16, 0.1)
    assert config.lora_target_modules == ["query", "key"] and config.bias_terms == ["b_q", "b_v"]
    assert config.learning_rate_for("lora") == 5e-4
    with pytest.raises(RecipeError, match="--lora_\\* flags apply to --method lora / bitfit_lora only"):
        BitFitArguments(lora_target_modules=["query"]).method_config()
    with pytest.raises(RecipeError, match="lora_r"):
        BitFitArguments(method="bitfit_lora", lora_r=0).method_config()


def test_lora_method_trains_no_bias():
    from bitfit_hf.tuners.bitfit_lora import BitFitLoraConfig

    parsed = parse("--method", "lora", "--lora_r", "4")
    assert parsed.training.learning_rate == DEFAULT_LEARNING_RATES["lora"]
    assert parsed.training.output_dir.replace("\\", "/") == "outputs/demo-sst2-lora"
    config = parsed.bitfit.method_config()
    assert isinstance(config, BitFitLoraConfig) and config.bias_terms == ["frozen"] and config.lora_r == 4
    with pytest.raises(RecipeError, match="applies to --method bitfit only"):
        BitFitArguments(method="lora", bias_terms=["b_q"]).method_config()


@pytest.mark.parametrize("method", ["rand_uniform", "rand_row_col"])
def test_random_baseline_flags(method):
    from bitfit_hf.tuners.random_subset import RandomSubsetConfig

    parsed = parse("--method", method, "--random_seed", "5", "--match_bias_terms", "b_q", "b_m2",
                   "--layerwise_lr_decay", "0.9")
    assert parsed.training.learning_rate == DEFAULT_LEARNING_RATES[method]  # each random baseline's own swept rate
    assert parsed.training.output_dir.replace("\\", "/") == f"outputs/demo-sst2-{method}"
    config = parsed.bitfit.method_config()
    assert isinstance(config, RandomSubsetConfig) and config.method == method
    assert config.random_seed == 5 and config.bias_terms == ["b_q", "b_m2"] and config.layerwise_lr_decay == 0.9
    assert parse("--method", method).bitfit.method_config().bias_terms == ["all"]
    defaults = RecipeDefaults(recipe="demo", offline_dataset="movie_reviews", offline_learning_rates={"bitfit": 5e-3})
    assert parse_recipe_args(_Data, defaults, ["--method", method]).training.learning_rate == 5e-3  # BitFit's


def test_bias_family_flags():
    config = parse("--bias_terms", "one-d", "--layerwise_lr_decay", "0.8", "--add_missing_biases",
                   "--added_bias_init", "normal:0,0.02").bitfit.method_config()
    assert config.bias_terms == ["one-d"] and config.layerwise_lr_decay == 0.8
    assert config.add_missing_biases and config.added_bias_init == "normal:0,0.02"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"method": "rand_uniform", "bias_terms": ["b_q"]}, "take the selection to match as --match_bias_terms"),
        ({"method": "bitfit", "match_bias_terms": ["b_q"]}, "applies to --method rand_uniform / rand_row_col"),
        ({"method": "rand_row_col", "match_bias_terms": ["full"]}, "matches the size of a bias selection"),
        ({"added_bias_init": "uniform"}, "added_bias_init must be"),
        ({"layerwise_lr_decay": 0.0}, "layerwise_lr_decay must be"),
    ],
)
def test_bad_bias_family_arguments(kwargs, message):
    with pytest.raises(RecipeError, match=message):
        BitFitArguments(**kwargs).method_config()


def test_an_unknown_flag_is_a_clear_error_with_the_nearest_known_one(tmp_path):
    with pytest.raises(RecipeError, match=r"unknown option\(s\): --warmup_ratio 0\.1.*--warmup_steps 0\.1"):
        parse("--warmup_ratio", "0.1")  # transformers 5 dropped it: a fraction goes to --warmup_steps
    with pytest.raises(RecipeError, match=r"--learnig_rate: did you mean --learning_rate"):
        parse("--learnig_rate", "1e-3")
    args_file = tmp_path / "args.json"
    args_file.write_text('{"output_dir": "out", "warmup_ratio": 0.1}')
    with pytest.raises(RecipeError, match=r"unknown key\(s\) in .*args\.json: warmup_ratio"):
        parse(str(args_file))



def _help(argv, capsys, monkeypatch, prog=None):
    """The recipe's --help, as ``python glue.py`` (or, with ``prog``, the bitfit-hf command) prints it."""
    import re

    from recipe_support import load_recipe

    monkeypatch.setattr(sys, "argv", ["glue.py"])
    monkeypatch.delenv("BITFIT_HF_PROG", raising=False)
    if prog:
        monkeypatch.setenv("BITFIT_HF_PROG", prog)
    with pytest.raises(SystemExit):
        load_recipe("glue").main([*argv, "--help"])
    out = capsys.readouterr().out
    options = {}  # each option's help text, words joined (argparse wraps lines)
    for block in re.split(r"\n  (?=--)", out):
        flag = block.split()[0].rstrip(",")
        options[flag] = " ".join(block.split())
    return " ".join(out.split()), options


def test_help_shows_the_values_a_run_uses(capsys, monkeypatch):
    text, options = _help([], capsys, monkeypatch)
    assert text.startswith("usage: glue.py ")
    for flag, value in (("--learning_rate", "0.003"), ("--per_device_train_batch_size", "32"),
                        ("--per_device_eval_batch_size", "64"), ("--logging_steps", "25"), ("--do_train", "True"),
                        ("--do_eval", "True"), ("--output_dir", "outputs/glue-sst2-bitfit")):
        assert options[flag].endswith(f"(default: {value})"), options[flag]
        assert "default set by the recipe" in options[flag]
    assert options["--no_train_head"].startswith("--no_train_head, --no-train-head Turn off --train_head")
    assert "Turn off --eval_before_training" in options["--no_eval_before_training"]
    _, frozen = _help(["--method", "frozen"], capsys, monkeypatch)
    assert frozen["--output_dir"].endswith("(default: outputs/glue-sst2-frozen)")
    assert frozen["--probe_head_start"].endswith("(default: True)") and "converged probe" in frozen["--probe_head_start"]


def test_through_the_cli_the_usage_line_names_the_cli(capsys, monkeypatch):
    text, _ = _help([], capsys, monkeypatch, prog="bitfit-hf train glue")
    assert text.startswith("usage: bitfit-hf train glue ")
