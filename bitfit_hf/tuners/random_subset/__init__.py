"""The paper's random baselines: as many scalars as a bias selection, drawn from the weight matrices."""

from bitfit_hf.tuners.random_subset.config import RandomSubsetConfig, RandRowColConfig, RandUniformConfig
from bitfit_hf.tuners.random_subset.method import RandRowCol, RandUniform
from bitfit_hf.tuners.random_subset.model import RandomSubsetState, apply_random_subset
from bitfit_hf.tuners.registry import register_method

register_method(RandUniform)
register_method(RandRowCol)

__all__ = ["RandomSubsetConfig", "RandRowColConfig", "RandUniformConfig", "RandomSubsetState", "apply_random_subset"]
