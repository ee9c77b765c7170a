"""The learning-rate sweep's two stages: finalists from the first seed, the choice on the finalists' means."""

from __future__ import annotations

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sweep_module():
    if os.path.join(ROOT, "benchmarks") not in sys.path:  # the script imports its sibling helper modules
        sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    spec = importlib.util.spec_from_file_location("lr_sweep", os.path.join(ROOT, "benchmarks", "lr_sweep.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(sweep, scores):
    """{(rate, seed): dev accuracy} for bitfit -> the results mapping the sweep keeps."""
    return {sweep.cell_key("bitfit", rate, seed): {"method": "bitfit", "learning_rate": rate, "seed": seed,
                                                   "dev_accuracy": acc} for (rate, seed), acc in scores.items()}


def test_later_seeds_run_only_at_the_first_seeds_best_rates():
    sweep = sweep_module()
    done = rows(sweep, {(3e-4, 0): 0.70, (1e-3, 0): 0.78, (3e-3, 0): 0.80, (1e-2, 0): 0.79})
    assert sweep.finalist_rates(done, "bitfit", 0, 2) == [3e-3, 1e-2]
    assert sweep.finalist_rates(done, "bitfit", 0, 0) == [3e-3, 1e-2, 1e-3, 3e-4]


def test_the_best_rate_is_chosen_among_the_rates_run_on_every_seed():
    sweep = sweep_module()
    # 1e-3 scored highest on seed 0 alone, but only 3e-3 and 1e-2 went on to seed 1: the choice is between those.
    done = rows(sweep, {(1e-3, 0): 0.90, (3e-3, 0): 0.80, (1e-2, 0): 0.79, (3e-3, 1): 0.76, (1e-2, 1): 0.79})
    summary = sweep.best_rates(done)["bitfit"]
    assert summary["best"] == 1e-2
    assert abs(summary["means"][3e-3] - 0.78) < 1e-9


def test_rates_picks_named_rates_and_the_recipe_default():
    sweep = sweep_module()
    assert sweep.chosen_rates("bitfit", None) == sweep.rates("bitfit")
    from bitfit_hf.tuners import recipe_methods

    bitfit_default = recipe_methods()["bitfit"].default_learning_rate
    assert sweep.chosen_rates("bitfit", ["default", "5e-4"]) == [bitfit_default, 5e-4]
    # a row that is a method with a flag takes its method's default
    assert sweep.chosen_rates("adapterbias_shared", ["default"]) == [recipe_methods()["adapterbias"].default_learning_rate]
    # 'default' is the rate the recipe picks for the sweep's model: a base-size one takes the base-size rate
    assert sweep.chosen_rates("adapterbias", ["default"], "mpnet") == [recipe_methods()["adapterbias"].base_size_learning_rate]


def test_later_seeds_choose_among_the_named_rates_only():
    sweep = sweep_module()
    done = rows(sweep, {(3e-4, 0): 0.70, (1e-3, 0): 0.78, (3e-3, 0): 0.80, (5e-4, 0): 0.60})
    assert sweep.finalist_rates(done, "bitfit", 0, 2, [5e-4, 3e-4]) == [3e-4, 5e-4]


def test_rates_rejects_a_word_that_is_not_a_rate(capsys):
    import pytest

    sweep = sweep_module()
    with pytest.raises(SystemExit):
        sweep.main(["--rates", "fast", "--report", "--results", os.path.join(ROOT, "nonexistent-dir", "x.jsonl")])
    assert "neither a number nor 'default'" in capsys.readouterr().err


def test_the_table_names_the_rate_the_recipes_pick_for_the_model():
    sweep = sweep_module()
    from bitfit_hf.tuners import recipe_methods

    recipe = recipe_methods()["adapterbias"]
    assert sweep.recipe_default("adapterbias", None) == recipe.default_learning_rate
    assert sweep.recipe_default("adapterbias_shared", "mpnet") == recipe.base_size_learning_rate
    assert sweep.model_of(["--model_name_or_path", "mpnet", "--max_train_samples", "1000"]) == "mpnet"
    table = sweep.markdown(rows(sweep, {(3e-3, 0): 0.8}), "a machine")
    assert f"| 0.003 | {recipe_methods()['bitfit'].default_learning_rate:g} |" in table


def test_the_default_is_weighed_against_each_rate_on_the_seeds_both_ran():
    sweep = sweep_module()
    # the default (3e-3) ran on two seeds, 1e-3 on seed 0 only: 1e-3 is compared with the default's seed-0 score
    done = rows(sweep, {(3e-3, 0): 0.80, (3e-3, 1): 0.90, (1e-3, 0): 0.83, (1e-2, 0): 0.70})
    assert sweep.default_gap(done, "bitfit", 3e-3) == "-3.0 vs 0.001 (seed 0)"
    assert sweep.default_gap(done, "bitfit", 1e-3) == "best"
    assert sweep.default_gap(done, "bitfit", 3e-4) == "not run"
    both = rows(sweep, {(3e-3, 0): 0.80, (3e-3, 1): 0.90, (1e-3, 0): 0.83, (1e-3, 1): 0.89})
    assert sweep.default_gap(both, "bitfit", 3e-3) == "-1.0 vs 0.001 (seeds 0, 1)"
    table = sweep.markdown(done, "a machine")
    assert f"| {sweep.default_gap(done, 'bitfit', sweep.recipe_default('bitfit', None))} |\n" in table
