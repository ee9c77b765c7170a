"""BitFit: train bias terms (all, or a subset by the paper's role names) plus the task head.

The selection machinery is shared (:mod:`bitfit_hf.tuners.bias`): BitFit + LoRA, BitFit + (IA)³ and the random
baselines are defined relative to a bias selection. This folder is the ``bitfit`` method as registered
(``method.py``) and its recipe entries (``recipe.py``)."""

from bitfit_hf.tuners.bias.config import BitFitConfig
from bitfit_hf.tuners.bias.model import BitFitState, apply_bitfit
from bitfit_hf.tuners.bias.selection import Selection, resolve
from bitfit_hf.tuners.bitfit.method import BitFit
from bitfit_hf.tuners.registry import register_method
from bitfit_hf.tuners.state import get_bitfit_state  # deprecated alias of get_tuner_state
from bitfit_hf.tuners.summary import TrainableSummary

register_method(BitFit)

__all__ = ["BitFit", "BitFitConfig", "BitFitState", "Selection", "TrainableSummary", "apply_bitfit", "get_bitfit_state",
           "resolve"]

