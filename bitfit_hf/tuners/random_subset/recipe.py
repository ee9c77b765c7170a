"""The recipes' ``--method rand_uniform`` / ``rand_row_col``: ``--random_seed`` and the bias selection whose size they
match (``--match_bias_terms``: ``--bias_terms`` is BitFit's own selection, which they refuse)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Optional

from bitfit_hf.tuners.random_subset.config import RandomSubsetConfig, RandRowColConfig, RandUniformConfig
from bitfit_hf.tuners.recipe import CommonFlags, RecipeMethod, words


@dataclass
class RandomSubsetArguments:
    """The random baselines' own flags."""

    random_seed: int = field(
        default=0, metadata={"help": "With --method rand_uniform / rand_row_col: the seed of the drawn entries."}
    )
    match_bias_terms: Optional[List[str]] = field(
        default=None,
        metadata={"help": "With --method rand_uniform / rand_row_col: train as many entries as this bias selection "
                  "(a preset or roles, as --bias_terms). Default: all."},
    )


def builder(config_class: type) -> Callable[[CommonFlags, RandomSubsetArguments], RandomSubsetConfig]:
    def build(common: CommonFlags, own: RandomSubsetArguments) -> RandomSubsetConfig:
        return config_class(bias_terms=words(own.match_bias_terms) or "all", random_seed=own.random_seed,
                            **common.bitfit_fields())

    return build


HELP = ("rand_uniform / rand_row_col: the paper's random baselines, as many random weight entries (single entries / "
        "whole rows or columns) as the --match_bias_terms selection has, + head")
HINT = "The random baselines take the selection to match as --match_bias_terms."
# They train BitFit's number of scalars, at BitFit's rate: the comparison changes only *which* scalars.
# Default learning rates (without --learning_rate) come from benchmarks/lr_sweep.py on the GLUE recipe's default
# budget (300 steps; a dev split carved from the training data, two seeds at each method's two best rates); they are
# rates for short runs. The table (benchmarks/results/lr_sweep.md) has every rate's score. On all-mpnet-base-v2
# rand_uniform's 1e-1 predicted one class: its base-size default is a grid step below its small-model one.
RAND_UNIFORM = RecipeMethod("rand_uniform", builder(RandUniformConfig), RandomSubsetArguments, help=HELP, hint=HINT,
                            learning_rate_like="bitfit", default_learning_rate=3e-2, base_size_learning_rate=1e-2)
RAND_ROW_COL = RecipeMethod("rand_row_col", builder(RandRowColConfig), RandomSubsetArguments, help=HELP, hint=HINT,
                            learning_rate_like="bitfit", default_learning_rate=1e-2)
