"""A method's recipe flags come from its folder: ``BitFitArguments`` composes every registered method's own flags
(``tuners/<method>/recipe.py``, ``Method.recipe``), refuses them for other methods naming the methods that take
them, and hands the method its common and own flags to build its config. A toy method registered from outside
recipe_kit gets all of it: its flags, its refusals, its learning rate and its output folder."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from typing import List, Optional

import pytest
from transformers import HfArgumentParser

from bitfit_hf.recipe_kit import RecipeError
from bitfit_hf.recipe_kit.args import DEFAULT_LEARNING_RATES, METHOD_RATES_HELP, METHODS, RECIPE_METHODS, BitFitArguments
from bitfit_hf.recipe_kit.method_args import compose_method_arguments
from bitfit_hf.tuners.recipe import CommonFlags, RecipeMethod

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class ToyArguments:
    toy_scale: float = field(default=1.0, metadata={"help": "With --method toy: the toy's scale."})
    toy_modules: Optional[List[str]] = field(default=None, metadata={"help": "With --method toy: where it goes."})


def build_toy(common: CommonFlags, own: ToyArguments):
    if own.toy_scale <= 0:
        raise ValueError(f"toy_scale must be positive, got {own.toy_scale}.")
    return ("toy", common.train_head, common.head_learning_rate, own.toy_scale)


TOY = RecipeMethod("toy", build_toy, ToyArguments, help="toy: a toy method")


@pytest.fixture(scope="module")
def with_toy():
    return compose_method_arguments({**RECIPE_METHODS, "toy": TOY}, "bitfit", METHOD_RATES_HELP, __name__)


def parse(cls, *argv):
    (args,) = HfArgumentParser(cls).parse_args_into_dataclasses(args=list(argv), look_for_args_file=False)
    return args


def test_every_method_has_its_flags_and_a_learning_rate():
    assert METHODS == tuple(RECIPE_METHODS) and set(METHODS) <= set(DEFAULT_LEARNING_RATES)
    names = [f.name for f in dataclasses.fields(BitFitArguments)]
    for recipe in RECIPE_METHODS.values():
        for own in dataclasses.fields(recipe.arguments) if recipe.arguments else ():
            assert own.name in names, f"--{own.name} of --method {recipe.name}"
    assert names[0] == "method" and names[-1] == "eval_before_training"


def test_a_new_method_gets_its_flags_choice_and_help(with_toy):
    args = parse(with_toy, "--method", "toy", "--toy_scale", "2.5", "--head_learning_rate", "1e-3")
    assert args.method_config() == ("toy", True, 1e-3, 2.5)
    method = next(f for f in dataclasses.fields(with_toy) if f.name == "method")
    assert method.metadata["choices"][-1] == "toy" and "; toy: a toy method. The" in method.metadata["help"]
    assert parse(with_toy).method_config().bias_terms == ["all"]  # bitfit by default, as before


@pytest.mark.parametrize("argv, message", [
    (["--method", "bitfit", "--toy_scale", "2"], r"^--toy_scale applies to --method toy only \(got --method bitfit\)\.$"),
    (["--method", "toy", "--lora_r", "4"], r"^--lora_\* flags apply to --method lora / bitfit_lora only \(got --method toy\)\.$"),
    (["--method", "toy", "--share_alpha"], r"^--share_alpha applies to --method adapterbias only \(got --method toy\)\.$"),
    (["--method", "toy", "--bias_terms", "b_q"],
     r"^--bias_terms b_q applies to --method bitfit only \(and bitfit_lora / bitfit_ia3; got --method toy\)\.$"),
    (["--method", "toy", "--toy_scale", "0"], r"^--toy_scale: toy_scale must be positive, got 0.0\.$"),
])
def test_a_new_method_is_refused_and_refuses_like_the_others(with_toy, argv, message):
    with pytest.raises(RecipeError, match=message):
        parse(with_toy, *argv).method_config()


def test_a_flag_two_methods_declare_is_a_programming_error():
    @dataclass
    class Clash:
        lora_r: int = 4

    with pytest.raises(TypeError, match="--lora_r of .*Clash is already one of LoraArguments"):
        compose_method_arguments({**RECIPE_METHODS, "clash": RecipeMethod("clash", build_toy, Clash)}, "bitfit", "", __name__)
    with pytest.raises(TypeError, match="--train_head .*the common flags"):
        compose_method_arguments({"clash": RecipeMethod("clash", build_toy, dataclass(type("T", (), {
            "__annotations__": {"train_head": bool}, "train_head": False})))}, "clash", "", __name__)


def test_unknown_method_built_directly_is_refused():
    with pytest.raises(RecipeError, match="--method 'prefix_tuning': choose one of bitfit, full, frozen"):
        BitFitArguments(method="prefix_tuning").method_config()


TOY_RUN = textwrap.dedent('''
    import json, sys
    from dataclasses import dataclass, field
    from bitfit_hf.tuners import Method, register_method
    from bitfit_hf.tuners.bias.config import BitFitConfig
    from bitfit_hf.tuners.bias.model import apply_bitfit
    from bitfit_hf.tuners.recipe import RecipeMethod

    @dataclass
    class ToyArguments:
        toy_shared: bool = field(default=False, metadata={"help": "With --method toy: one toy for all layers."})

    def build(common, own):
        return BitFitConfig(bias_terms="b_q" if own.toy_shared else "all", **common.bitfit_fields())

    class Toy(Method):
        name, config_class = "toy", BitFitConfig
        recipe = (RecipeMethod("toy", build, ToyArguments, help="toy: a toy", default_learning_rate=7e-4,
                               output_suffix=(("toy_shared", "-shared"),)),)

        def apply(self, model, config):
            return apply_bitfit(model, config)

    register_method(Toy)

    from bitfit_hf.recipe_kit import DataArguments, RecipeDefaults, parse_recipe_args
    defaults = RecipeDefaults(recipe="demo", offline_dataset="movie_reviews")
    parsed = parse_recipe_args(DataArguments, defaults, sys.argv[1:])
    print(json.dumps({"lr": parsed.training.learning_rate, "out": parsed.training.output_dir,
                      "terms": parsed.bitfit.method_config().bias_terms}))
''')


@pytest.mark.parametrize("argv, expected", [
    (["--method", "toy"], {"lr": 7e-4, "out": "outputs/demo-movie_reviews-toy", "terms": ["all"]}),
    (["--method", "toy", "--toy_shared", "--learning_rate", "1e-2"],
     {"lr": 1e-2, "out": "outputs/demo-movie_reviews-toy-shared", "terms": ["b_q"]}),
])
def test_a_method_registered_outside_recipe_kit_runs_through_the_recipe_arguments(argv, expected, tmp_path):
    """The registry line alone: recipe_kit is imported after the toy registers, as a new method's folder would be."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", TOY_RUN, *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {**result, "out": result["out"].replace("\\", "/")} == expected
