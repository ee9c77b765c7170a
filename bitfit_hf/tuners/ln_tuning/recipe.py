"""The recipes' ``--method ln_tuning``: every normalisation layer's gain and bias + head. No flags of its own; BitFit's
selection flags are refused (it selects no bias), the head and rate flags apply."""

from __future__ import annotations

from typing import Any

from bitfit_hf.tuners.ln_tuning.config import LNTuningMethodConfig
from bitfit_hf.tuners.recipe import CommonFlags, FlagRefused, RecipeMethod


def refuse_bias_flags(common: CommonFlags) -> None:
    given = [flag for flag, value in (("--bias_terms", common.bias_terms), ("--bias_patterns", common.patterns),
                                      ("--add_missing_biases", common.add_missing_biases),
                                      ("--added_bias_init", common.added_bias_init != "zero"),
                                      ("--bias_learning_rate", common.bias_learning_rate)) if value]
    if given:
        raise FlagRefused(f"{', '.join(given)} select or tune BitFit's biases; --method ln_tuning trains every "
                          "normalisation layer's gain and bias and the head (rates: --learning_rate, "
                          "--head_learning_rate).")


def build(common: CommonFlags, own: Any = None) -> LNTuningMethodConfig:
    return LNTuningMethodConfig(train_head=common.train_head, head_learning_rate=common.head_learning_rate,
                                layerwise_lr_decay=common.layerwise_lr_decay, save_full_model=common.save_full_model)


# Default learning rate (without --learning_rate): 1e-3 is NOT swept yet (benchmarks/lr_sweep.py --methods ln_tuning
# has not been run). It is chosen by analogy: LN tuning trains vectors of the size and scale BitFit's biases have
# (gains start at one, biases near zero), and 1e-3 is BitFit's base-size rate, a grid step below its small-model 3e-3
# (3e-2 diverges for BitFit, 1e-2 predicted one class on all-mpnet-base-v2), so it is the same rate on every model
# size here. Sweep it before quoting accuracies at it.
RECIPE = (
    RecipeMethod("ln_tuning", build, help="ln_tuning: LayerNorm tuning (Zhao et al., 2024), every LayerNorm / RMSNorm "
                                          "gain and bias + head",
                 refuse=refuse_bias_flags, default_learning_rate=1e-3),
)
