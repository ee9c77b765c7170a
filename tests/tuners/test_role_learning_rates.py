"""Per-role learning rates (``role_learning_rates`` / ``--role_learning_rates b_q=1e-2 b_m2=1e-2``): the roles named
train at their own rate, every other bias at the bias rate, the head at its own."""

from __future__ import annotations

import pytest
from conftest import tiny_model
from transformers import HfArgumentParser

from bitfit_hf import BitFitConfig, apply_bitfit
from bitfit_hf.recipe_kit import RecipeError
from bitfit_hf.recipe_kit.args import BitFitArguments
from bitfit_hf.training.optim import parameter_groups


def test_named_roles_get_their_rate_and_the_rest_keep_theirs():
    config = BitFitConfig(role_learning_rates={"b_q": 1e-2, "b_m2": 2e-2}, bias_learning_rate=1e-3, head_learning_rate=5e-4)
    assert (config.learning_rate_for("b_q"), config.learning_rate_for("b_m2")) == (1e-2, 2e-2)
    assert (config.learning_rate_for("b_v"), config.learning_rate_for("head")) == (1e-3, 5e-4)
    assert BitFitConfig.from_dict(config.to_dict()) == config
    model = tiny_model("bert", num_labels=2)
    state = apply_bitfit(model, config)
    groups = parameter_groups(model, state, learning_rate=3e-3, weight_decay=0.0, decay_parameter_names=[])
    names = dict(model.named_parameters())
    rate_of = {id(p): g["lr"] for g in groups for p in g["params"]}
    for name in state.selection.parameter_names:
        want = (1e-2 if ".attention.self.query." in name else 2e-2 if ".intermediate.dense." in name
                else 5e-4 if name.startswith("classifier") else 1e-3)
        assert rate_of[id(names[name])] == want, name


def test_unknown_roles_and_bad_rates_are_refused():
    with pytest.raises(ValueError, match="'b_query' is no role"):
        BitFitConfig(role_learning_rates={"b_query": 1e-2})
    with pytest.raises(ValueError, match="positive"):
        BitFitConfig(role_learning_rates={"b_q": 0})


def test_the_recipe_flag():
    args, = HfArgumentParser(BitFitArguments).parse_args_into_dataclasses(
        ["--method", "bitfit", "--role_learning_rates", "b_q=1e-2", "b_m2=3e-2"])
    assert args.method_config().role_learning_rates == {"b_q": 1e-2, "b_m2": 3e-2}
    bad, = HfArgumentParser(BitFitArguments).parse_args_into_dataclasses(["--role_learning_rates", "b_q:1e-2"])
    with pytest.raises(RecipeError, match="ROLE=RATE"):
        bad.method_config()
