"""What the random baselines train: as many weight entries as a reference bias selection has."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict

from bitfit_hf.tuners.bias.config import BitFitConfig


@dataclass
class RandomSubsetConfig(BitFitConfig):
    """The paper's random baselines ("are bias parameters special?").

    ``bias_terms`` / ``patterns`` / ``add_missing_biases`` describe the *reference* BitFit selection
    (default: every bias): the baseline trains exactly as many scalars as that selection has outside
    the head, drawn from the weight matrices with ``random_seed``. The head is trained as in BitFit.
    Learning rates, layer-wise decay and ``save_full_model`` work as for :class:`BitFitConfig`.
    """

    method: ClassVar[str] = "rand_uniform"
    draw: ClassVar[str] = "uniform"
    role_descriptions: ClassVar[Dict[str, str]] = {"random": "random entries of weight matrices"}

    random_seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.preset in ("full", "frozen"):
            raise ValueError(
                f"The {self.method} baseline matches the size of a bias selection; bias_terms={self.preset!r} "
                "is not one. Use 'all' (default), 'one-d', 'paper-subset' or roles such as 'b_q b_m2'."
            )
        if self.reinit_existing_biases:
            raise ValueError(f"reinit_existing_biases applies to bitfit, not to {self.method} (it trains no bias).")
        if isinstance(self.random_seed, bool) or not isinstance(self.random_seed, int) or self.random_seed < 0:
            raise ValueError(f"random_seed must be a non-negative integer, got {self.random_seed!r}.")


@dataclass
class RandUniformConfig(RandomSubsetConfig):
    """``rand_uniform``: single entries drawn uniformly, without replacement, from every weight matrix."""

    method: ClassVar[str] = "rand_uniform"
    draw: ClassVar[str] = "uniform"
    role_descriptions: ClassVar[Dict[str, str]] = {"random": "random entries of weight matrices"}


@dataclass
class RandRowColConfig(RandomSubsetConfig):
    """``rand_row_col``: whole rows or columns of the weight matrices, the last one cut to the count."""

    method: ClassVar[str] = "rand_row_col"
    draw: ClassVar[str] = "row_col"
