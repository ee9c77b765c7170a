"""The recipes' default learning rate follows the model's width: a base-size model takes a method's base-size rate."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Optional

import pytest

from bitfit_hf.recipe_kit import DataArguments, RecipeDefaults, parse_recipe_args
from bitfit_hf.recipe_kit.model_size import BASE_SIZE_WIDTH, config_width, model_width
from bitfit_hf.tuners import recipe_methods


@dataclass
class _Data(DataArguments):
    task_name: Optional[str] = field(default=None)


DEFAULTS = RecipeDefaults(recipe="demo", offline_dataset="movie_reviews", offline_task="sst2")


def model_folder(tmp_path, name, **config):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", **config}))
    return str(folder)


def methods_with_base_rates():
    return {name: recipe for name, recipe in recipe_methods().items()
            if recipe.base_size_learning_rate not in (None, recipe.default_learning_rate)}


def test_some_methods_name_a_base_size_rate_below_their_small_model_rate():
    chosen = methods_with_base_rates()
    assert "adapterbias" in chosen  # its small-model default collapses on all-mpnet-base-v2
    for name, recipe in chosen.items():
        assert recipe.base_size_learning_rate < recipe.default_learning_rate, name


@pytest.mark.parametrize("method", sorted(methods_with_base_rates()))
def test_a_base_size_folder_takes_the_base_size_rate(tmp_path, method):
    recipe = recipe_methods()[method]
    wide = model_folder(tmp_path, "wide", hidden_size=BASE_SIZE_WIDTH)
    small = model_folder(tmp_path, "small", hidden_size=384)
    parsed = parse_recipe_args(_Data, DEFAULTS, ["--method", method, "--model_name_or_path", wide])
    assert parsed.training.learning_rate == recipe.base_size_learning_rate
    assert parsed.applied_defaults["learning_rate"] == recipe.base_size_learning_rate
    assert any("base-size default" in note and "hidden size 768" in note for note in parsed.notes)
    parsed = parse_recipe_args(_Data, DEFAULTS, ["--method", method, "--model_name_or_path", small])
    assert parsed.training.learning_rate == recipe.default_learning_rate and parsed.notes == []


def test_the_dashed_spelling_is_read_too(tmp_path):
    wide = model_folder(tmp_path, "wide", hidden_size=768)
    for argv in (["--model-name-or-path", wide], [f"--model_name_or_path={wide}"]):
        parsed = parse_recipe_args(_Data, DEFAULTS, ["--method", "adapterbias", *argv])
        assert parsed.training.learning_rate == recipe_methods()["adapterbias"].base_size_learning_rate, argv


def test_the_packaged_models_need_no_loading_to_be_sized():
    method = sorted(methods_with_base_rates())[0]
    recipe = recipe_methods()[method]
    assert parse_recipe_args(_Data, DEFAULTS, ["--method", method]).training.learning_rate == recipe.default_learning_rate
    for name in ("mpnet", "sentence-transformers/all-mpnet-base-v2"):
        parsed = parse_recipe_args(_Data, DEFAULTS, ["--method", method, "--model_name_or_path", name])
        assert parsed.training.learning_rate == recipe.base_size_learning_rate


def test_an_explicit_rate_wins_on_a_base_size_model(tmp_path):
    wide = model_folder(tmp_path, "wide", hidden_size=1024)
    parsed = parse_recipe_args(_Data, DEFAULTS, ["--method", "adapterbias", "--model_name_or_path", wide,
                                                 "--learning_rate", "2e-2"])
    assert parsed.training.learning_rate == 2e-2 and parsed.notes == []
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"method": "adapterbias", "model_name_or_path": wide, "learning_rate": 5e-3}))
    assert parse_recipe_args(_Data, DEFAULTS, [str(args_file)]).training.learning_rate == 5e-3


def test_an_arguments_file_sizes_its_model_too(tmp_path):
    wide = model_folder(tmp_path, "wide", d_model=768)  # a T5 / BART-style config
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"method": "adapterbias", "model_name_or_path": wide}))
    parsed = parse_recipe_args(_Data, DEFAULTS, [str(args_file)])
    assert parsed.training.learning_rate == recipe_methods()["adapterbias"].base_size_learning_rate


def test_config_name_is_where_the_width_is_read(tmp_path):
    small = model_folder(tmp_path, "small", hidden_size=384)
    wide_config = model_folder(tmp_path, "wide_config", hidden_size=768)
    parsed = parse_recipe_args(_Data, DEFAULTS, ["--method", "adapterbias", "--model_name_or_path", small,
                                                 "--config_name", wide_config])
    assert parsed.training.learning_rate == recipe_methods()["adapterbias"].base_size_learning_rate


def test_a_model_whose_width_cannot_be_read_keeps_the_small_rate_and_says_how_to_choose(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read at import: patch, no retries
    parsed = parse_recipe_args(_Data, DEFAULTS, ["--method", "adapterbias", "--model_name_or_path", "org/not-cached"])
    recipe = recipe_methods()["adapterbias"]
    assert parsed.training.learning_rate == recipe.default_learning_rate
    assert len(parsed.notes) == 1
    assert "could not be read" in parsed.notes[0] and f"--learning_rate {recipe.base_size_learning_rate:g}" in parsed.notes[0]


def test_a_method_without_a_base_size_rate_never_reads_the_model(tmp_path, monkeypatch):
    import bitfit_hf.recipe_kit.args as args_module

    def refuse(*_args, **_kwargs):
        raise AssertionError("the model's width was read")

    monkeypatch.setattr(args_module, "model_width", refuse)
    plain = [name for name, recipe in recipe_methods().items()
             if recipe.default_learning_rate is not None and recipe.base_size_learning_rate is None]
    assert plain
    parsed = parse_recipe_args(_Data, DEFAULTS, ["--method", plain[0], "--model_name_or_path", "org/not-cached"])
    assert parsed.training.learning_rate == recipe_methods()[plain[0]].default_learning_rate


def test_config_width_reads_each_family_spelling():
    assert config_width({"hidden_size": 768}) == 768
    assert config_width({"d_model": 512}) == 512
    assert config_width({"n_embd": 1600}) == 1600
    assert config_width({"dim": 768}) == 768
    assert config_width({"text_config": {"hidden_size": 2048}}) == 2048
    assert config_width({"hidden_size": True}) is None and config_width({}) is None


def test_a_broken_config_file_leaves_the_width_unknown(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text("{not json")
    assert model_width(str(folder)) is None
    assert model_width(str(tmp_path)) is None  # a folder without config.json


def test_the_recorded_widths_match_the_packaged_configs():
    from bitfit_hf.data.assets import MODEL_ASSETS, AssetNotFoundError, model_path

    checked = 0
    for name, spec in MODEL_ASSETS.items():
        try:
            folder = model_path(name, fetch=False)
        except AssetNotFoundError:
            continue
        config = json.loads(open(f"{folder}/config.json", encoding="utf-8").read()) if spec.check_file == "config.json" else None
        if config is not None:
            assert config_width(config) == spec.hidden_size, name
            checked += 1
    assert checked >= 1  # all-MiniLM-L6-v2 is installed wherever the tests run


def test_the_help_names_the_base_size_rates():
    from bitfit_hf.recipe_kit.args import METHOD_RATES_HELP

    assert f"hidden size >= {BASE_SIZE_WIDTH}" in METHOD_RATES_HELP
    assert "adapterbias" in METHOD_RATES_HELP.split("hidden size >=")[1]


def test_the_run_log_says_which_rate_was_chosen_and_why(tmp_path, caplog):
    from bitfit_hf.recipe_kit.run import log_run_header

    wide = model_folder(tmp_path, "wide", hidden_size=768)
    parsed = parse_recipe_args(_Data, DEFAULTS, ["--method", "adapterbias", "--model_name_or_path", wide,
                                                 "--output_dir", str(tmp_path / "out")])
    with caplog.at_level(logging.INFO, logger="bitfit_hf"):
        log_run_header(parsed, "demo")
    assert "the base-size default of --method adapterbias" in caplog.text


def test_a_base_size_rate_replaces_a_recipes_offline_rate_too(tmp_path):
    """A recipe's own offline rate (SQuAD trains BitFit at 1e-2 on MiniLM) is a small-model rate: on a wide model the
    method's base-size rate stands in for it, and a method without one keeps the recipe's rate."""
    defaults = RecipeDefaults(recipe="demo", offline_dataset="movie_reviews", offline_task="sst2",
                              offline_learning_rates={"bitfit": 1e-2, "frozen": 1e-2})
    wide = model_folder(tmp_path, "wide", hidden_size=768)
    small = model_folder(tmp_path, "small", hidden_size=384)
    bitfit, frozen = recipe_methods()["bitfit"], recipe_methods()["frozen"]
    assert bitfit.base_size_learning_rate is not None and frozen.base_size_learning_rate is None
    rate = {(method, folder): parse_recipe_args(_Data, defaults, ["--method", method, "--model_name_or_path", folder])
            .training.learning_rate for method in ("bitfit", "frozen") for folder in (wide, small)}
    assert rate[("bitfit", small)] == 1e-2 and rate[("bitfit", wide)] == bitfit.base_size_learning_rate
    assert rate[("frozen", small)] == rate[("frozen", wide)] == 1e-2


def test_a_method_that_follows_bitfits_offline_rate_follows_its_base_size_rate_too(tmp_path):
    """The random baselines train at BitFit's offline rate (``learning_rate_like``), so the comparison changes only
    which scalars train; on a wide model they follow BitFit's base-size rate as well."""
    defaults = RecipeDefaults(recipe="demo", offline_dataset="movie_reviews", offline_task="sst2",
                              offline_learning_rates={"bitfit": 1e-2})
    wide = model_folder(tmp_path, "wide", hidden_size=768)
    small = model_folder(tmp_path, "small", hidden_size=384)
    bitfit_wide = recipe_methods()["bitfit"].base_size_learning_rate
    for method in ("rand_uniform", "rand_row_col"):
        assert recipe_methods()[method].learning_rate_like == "bitfit"
        rate = {folder: parse_recipe_args(_Data, defaults, ["--method", method, "--model_name_or_path", folder])
                .training.learning_rate for folder in (wide, small)}
        assert rate[small] == 1e-2 and rate[wide] == bitfit_wide, method
