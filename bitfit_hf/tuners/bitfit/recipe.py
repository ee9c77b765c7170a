"""The recipes' ``--method bitfit`` and its two presets with a ``--method`` of their own: ``full`` (every parameter,
the baseline) and ``frozen`` (the task head only). BitFit's flags (``--bias_terms``, ``--bias_patterns``, ...) are
the ones every method sees (:class:`~bitfit_hf.tuners.recipe.CommonFlags`); it has none of its own."""

from __future__ import annotations

from typing import Any

from bitfit_hf.tuners.bias.config import BitFitConfig
from bitfit_hf.tuners.bias.recipe import bias_selection
from bitfit_hf.tuners.recipe import CommonFlags, FlagRefused, RecipeMethod


def build_bitfit(common: CommonFlags, own: Any = None) -> BitFitConfig:
    return BitFitConfig(bias_terms=bias_selection(common), **common.bitfit_fields())


def build_full(common: CommonFlags, own: Any = None) -> BitFitConfig:
    return BitFitConfig(bias_terms="full", **common.bitfit_fields())


def build_frozen(common: CommonFlags, own: Any = None) -> BitFitConfig:
    if not common.train_head:
        raise FlagRefused("--method frozen --no_train_head trains nothing: frozen means 'train the head only'.")
    return BitFitConfig(bias_terms="frozen", **common.bitfit_fields())


# Default learning rates (without --learning_rate) come from benchmarks/lr_sweep.py on the GLUE recipe's default
# budget (300 steps; a dev split carved from the training data, two seeds at each method's two best rates); they are
# rates for short runs. The table (benchmarks/results/lr_sweep.md) has every rate's score.
# 3e-2 diverges for bitfit. On all-mpnet-base-v2 bitfit's 1e-2 predicted one class: its base-size default is a grid
# step below its small-model one. Full fine-tuning of a base-size model over many epochs usually wants 2e-5 to 5e-5.
RECIPE = (
    RecipeMethod("bitfit", build_bitfit, help="bitfit: bias terms + task head", bias_terms=True, default_learning_rate=3e-3,
                 base_size_learning_rate=1e-3),
    RecipeMethod("full", build_full, help="full: every parameter (the baseline)", default_learning_rate=1e-4),
    # The honest frozen baseline: the head fitted to convergence on the frozen encoder's features (the probe),
    # not a few SGD epochs of it; --probe_head_start false trains the head by SGD at its rate instead.
    RecipeMethod("frozen", build_frozen, help="frozen: the task head only (fitted as a converged linear probe)",
                 default_learning_rate=1e-2, probe_head_start=True),
)
