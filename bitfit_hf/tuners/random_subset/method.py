"""The random baselines as registered: ``rand_uniform`` and ``rand_row_col``, as many weight entries as a bias
selection, drawn uniformly or in whole rows / columns."""

from __future__ import annotations

from typing import Any, Optional

from bitfit_hf.tuners.random_subset.config import RandRowColConfig, RandUniformConfig
from bitfit_hf.tuners.random_subset.model import RANDOM, apply_random_subset
from bitfit_hf.tuners.random_subset.recipe import RAND_ROW_COL, RAND_UNIFORM
from bitfit_hf.tuners.registry import Method, selection_words


class RandomSubset(Method):
    """What both baselines share: entries of weight matrices, stored sparse, matched to a bias selection."""

    not_batchable = "it trains entries of weight matrices, and mixed-task batches route biases and heads only"
    flags = (("bias_terms", "--match_bias_terms"),)

    def apply(self, model, config):
        return apply_random_subset(model, config)

    def tensor_role(self, name: str) -> Optional[str]:
        """Entries of weight matrices are theirs."""
        return RANDOM if name.endswith(".weight") else None

    def describe(self, config: Any) -> str:
        seed = getattr(config, "random_seed", None)
        if seed is None:
            seed = (getattr(config, "method_config", None) or {}).get("random_seed")
        return (f"{config.method} (random weight entries, as many as bitfit {selection_words(config)}"
                + (f"; random_seed {seed}" if seed is not None else "") + ")")


class RandUniform(RandomSubset):
    name = "rand_uniform"
    config_class = RandUniformConfig
    description = "baseline: as many random weight entries as a bias selection (uniform)"
    recipe = (RAND_UNIFORM,)


class RandRowCol(RandomSubset):
    name = "rand_row_col"
    config_class = RandRowColConfig
    description = "baseline: as many weight entries as a bias selection, in random whole rows/columns"
    recipe = (RAND_ROW_COL,)
