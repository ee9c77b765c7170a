"""Shared logic of the training recipes in ``recipes/`` (``glue.py``, ``pos.py``, ``squad.py``, ``clm.py``).

* :mod:`.args` -- parsing the arguments and the default rules (learning rate per method, CPU backend, offline
  default data); the argument dataclasses live in :mod:`.arg_groups` (model, data, training) and
  :mod:`.method_args` (``--method``, the flags every method sees and each method's own, from its folder), the
  command-line and arguments-file handling in :mod:`.argv`;
* :mod:`.data` -- the run's datasets (an offline default from :mod:`bitfit_hf.data.offline`, Hub datasets, local
  files) and the split/column checks;
* :mod:`.loading` -- the model: its source, config with head checks, tokenizer, weights, adapter;
* :mod:`.run` -- the run's flow: start, evaluate-before-and-after, results files, CLI entry;
* :class:`.errors.RecipeError` -- bad input, raised before any training starts.

Task-specific preprocessing and post-processing live in :mod:`bitfit_hf.recipe_kit.tasks`.
"""

from bitfit_hf.data.offline import OFFLINE_DATASETS, load_offline_dataset
from bitfit_hf.recipe_kit.args import (
    DEFAULT_MODEL_ID,
    DataArguments,
    ModelArguments,
    ParsedArgs,
    RecipeDefaults,
    default_use_cpu,
    parse_recipe_args,
)
from bitfit_hf.recipe_kit.data import load_raw_datasets
from bitfit_hf.recipe_kit.errors import RecipeError

__all__ = [
    "DEFAULT_MODEL_ID",
    "OFFLINE_DATASETS",
    "DataArguments",
    "ModelArguments",
    "ParsedArgs",
    "RecipeDefaults",
    "RecipeError",
    "default_use_cpu",
    "load_offline_dataset",
    "load_raw_datasets",
    "parse_recipe_args",
]

#: Computed from the method registry on access (a method registered later appears), so read through ``args``.
_FROM_REGISTRY = ("DEFAULT_LEARNING_RATES", "METHODS", "BitFitArguments")


def __getattr__(name: str):
    if name in _FROM_REGISTRY:
        from bitfit_hf.recipe_kit import args

        return getattr(args, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
