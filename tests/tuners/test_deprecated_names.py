"""Old public names keep working for one release, each with a FutureWarning that names its replacement."""

from __future__ import annotations

import pytest
import transformers as T
from conftest import tiny_model
from datasets import Dataset

from bitfit_hf import BitFitConfig, BitFitTrainer


@pytest.fixture
def trainer(tmp_path):
    args = T.TrainingArguments(str(tmp_path / "out"), report_to=[], use_cpu=True, disable_tqdm=True)
    data = Dataset.from_dict({"input_ids": [[5, 6, 7]], "attention_mask": [[1, 1, 1]], "labels": [0]})
    return BitFitTrainer(tiny_model("bert", num_labels=2), args, train_dataset=data,
                         method_config=BitFitConfig(bias_terms="b_q"))


def test_bitfit_config_keyword_still_selects_and_warns(tmp_path):
    args = T.TrainingArguments(str(tmp_path / "out"), report_to=[], use_cpu=True, disable_tqdm=True)
    with pytest.warns(FutureWarning, match="method_config="):
        trainer = BitFitTrainer(tiny_model("bert", num_labels=2), args, bitfit_config=BitFitConfig(bias_terms="b_q"))
    assert trainer.method_config.bias_terms == ["b_q"]
    with pytest.raises(TypeError, match="both method_config= and"):
        BitFitTrainer(tiny_model("bert", num_labels=2), args, method_config=BitFitConfig(),
                      bitfit_config=BitFitConfig())


def test_bitfit_config_property_warns(trainer):
    with pytest.warns(FutureWarning, match="use method_config"):
        assert trainer.bitfit_config is trainer.method_config


def test_bitfit_state_property_warns(trainer):
    with pytest.warns(FutureWarning, match="use tuner_state"):
        assert trainer.bitfit_state is trainer.tuner_state


def test_bitfit_parameter_groups_warns(trainer):
    with pytest.warns(FutureWarning, match="use trained_parameter_groups"):
        groups = trainer.bitfit_parameter_groups(trainer.model)
    expected = trainer.trained_parameter_groups(trainer.model)
    assert [[id(p) for p in g["params"]] for g in groups] == [[id(p) for p in g["params"]] for g in expected]


@pytest.mark.parametrize("where", ["bitfit_hf", "bitfit_hf.tuners.state", "bitfit_hf.tuners.bitfit"])
def test_get_bitfit_state_is_get_tuner_state_and_warns(where):
    import importlib

    from bitfit_hf.tuners import apply_method, get_tuner_state

    get_bitfit_state = getattr(importlib.import_module(where), "get_bitfit_state")
    model = tiny_model("bert", num_labels=2)
    apply_method(model)
    with pytest.warns(FutureWarning, match="use get_tuner_state"):
        assert get_bitfit_state(model) is get_tuner_state(model)


def test_method_spec_builds_a_method_and_warns():
    from bitfit_hf.tuners import Method, MethodSpec, tensor_role_of
    from bitfit_hf.tuners.bias.model import apply_bitfit

    with pytest.warns(FutureWarning, match="subclass bitfit_hf.tuners.registry.Method"):
        spec = MethodSpec("old_style", BitFitConfig, apply_bitfit, "biases", peft_export="beft",
                          tensor_role=lambda name: "mine" if name.endswith(".x") else None, not_mergeable="why not")
    assert isinstance(spec, Method) and spec.beft_export and spec.not_mergeable == "why not"
    assert spec.supports("tensor_role") and spec.tensor_role("a.x") == "mine" and not spec.supports("route")
    model = tiny_model("bert", num_labels=2)
    assert spec.apply(model, BitFitConfig()).selection.parameter_names
    assert tensor_role_of("old_style", "a.x") is None  # not registered: the registry does not know it


def test_recipe_arguments_bitfit_config_warns():
    from bitfit_hf.recipe_kit.args import BitFitArguments

    arguments = BitFitArguments(method="bitfit_lora", lora_r=4)
    with pytest.warns(FutureWarning, match="use method_config"):
        old = arguments.bitfit_config()
    assert old == arguments.method_config() and old.lora_r == 4
