"""A recipe's probe head start may follow the model's width: on for small encoders, off on base-size ones."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional

from bitfit_hf.recipe_kit import DataArguments, RecipeDefaults, parse_recipe_args
from bitfit_hf.recipe_kit.model_size import BASE_SIZE_WIDTH


@dataclass
class _Data(DataArguments):
    task_name: Optional[str] = field(default=None)


SMALL_ONLY = RecipeDefaults(recipe="demo", offline_dataset="movie_reviews", offline_task="sst2",
                            small_model_probe_head_start=("bitfit",))
ALWAYS = RecipeDefaults(recipe="demo", offline_dataset="movie_reviews", offline_task="sst2",
                        probe_head_start=("bitfit",))


def _folder(tmp_path, name, width):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": width}))
    return str(folder)


def test_small_models_start_from_the_probe_and_base_size_ones_do_not(tmp_path):
    small, wide = _folder(tmp_path, "small", 384), _folder(tmp_path, "wide", BASE_SIZE_WIDTH)
    parsed = parse_recipe_args(_Data, SMALL_ONLY, ["--model_name_or_path", small])
    assert parsed.training.probe_head_start is True and not any("probe_head_start" in n for n in parsed.notes)
    parsed = parse_recipe_args(_Data, SMALL_ONLY, ["--model_name_or_path", wide])
    assert parsed.training.probe_head_start is False
    assert any("--probe_head_start false" in n and "hidden size 768" in n for n in parsed.notes)
    # the packaged models are sized without loading: MiniLM (384) starts from the probe, mpnet (768) does not
    assert parse_recipe_args(_Data, SMALL_ONLY, []).training.probe_head_start is True
    assert parse_recipe_args(_Data, SMALL_ONLY, ["--model_name_or_path", "mpnet"]).training.probe_head_start is False


def test_the_flag_wins_both_ways(tmp_path):
    small, wide = _folder(tmp_path, "small", 384), _folder(tmp_path, "wide", 1024)
    parsed = parse_recipe_args(_Data, SMALL_ONLY, ["--model_name_or_path", wide, "--probe_head_start"])
    assert parsed.training.probe_head_start is True and not any("probe_head_start" in n for n in parsed.notes)
    parsed = parse_recipe_args(_Data, SMALL_ONLY, ["--model_name_or_path", small, "--probe_head_start", "false"])
    assert parsed.training.probe_head_start is False and parsed.notes == []


def test_other_methods_and_unconditional_defaults_never_read_the_width(tmp_path):
    wide = _folder(tmp_path, "wide", 768)
    assert parse_recipe_args(_Data, SMALL_ONLY, ["--method", "lora", "--model_name_or_path", wide]).training.probe_head_start is False
    assert parse_recipe_args(_Data, ALWAYS, ["--model_name_or_path", wide]).training.probe_head_start is True


def test_a_model_whose_width_cannot_be_read_starts_from_a_random_head_and_says_how_to_choose(monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    parsed = parse_recipe_args(_Data, SMALL_ONLY, ["--model_name_or_path", "org/not-cached"])
    assert parsed.training.probe_head_start is False
    assert any("could not be read" in n and "Pass --probe_head_start" in n for n in parsed.notes)


def test_the_width_is_read_once_for_both_defaults_that_follow_it(tmp_path, monkeypatch):
    """BitFit's base-size rate and its head start both follow the width: one read of the config serves both."""
    import bitfit_hf.recipe_kit.args as recipe_args

    calls = []
    real = recipe_args.model_width
    monkeypatch.setattr(recipe_args, "model_width", lambda *a, **k: calls.append(a) or real(*a, **k))
    parsed = parse_recipe_args(_Data, SMALL_ONLY, ["--model_name_or_path", _folder(tmp_path, "wide", 768)])
    from bitfit_hf.tuners import recipe_methods

    assert parsed.training.probe_head_start is False
    assert parsed.training.learning_rate == recipe_methods()["bitfit"].base_size_learning_rate
    assert len(calls) == 1


def test_the_glue_recipe_starts_bitfit_and_lora_from_the_probe_on_minilm_only():
    """The measured defaults (docs/probe-head-start.md): BitFit and LoRA gained on MiniLM on both seeds; on mpnet
    both lost, and no other method gained on MiniLM on both seeds."""
    from recipe_support import load_recipe

    glue = load_recipe("glue")
    for method, on_minilm in (("bitfit", True), ("lora", True), ("ia3", False), ("bitfit_lora", False),
                              ("adapterbias", False), ("full", False)):
        assert parse_recipe_args(glue.GlueDataArguments, glue.DEFAULTS,
                                 ["--method", method]).training.probe_head_start is on_minilm, method
        assert parse_recipe_args(glue.GlueDataArguments, glue.DEFAULTS,
                                 ["--method", method, "--model_name_or_path", "mpnet"]).training.probe_head_start is False
