"""BitFit: train bias terms (all, or a subset by the paper's role names) plus the task head.

The selection machinery is shared (:mod:`bitfit_hf.tuners.bias`): BitFit + LoRA, BitFit + (IA)³ and the random
baselines are defined relative to a bias selection. This folder is the ``bitfit`` method as registered."""

from bitfit_hf.tuners.bitfit.config import BitFitConfig
from bitfit_hf.tuners.bitfit.model import BitFitState, apply_bitfit, get_bitfit_state
from bitfit_hf.tuners.bitfit.selection import Selection, resolve
from bitfit_hf.tuners.bitfit.summary import TrainableSummary

__all__ = ["BitFitConfig", "BitFitState", "Selection", "TrainableSummary", "apply_bitfit", "get_bitfit_state", "resolve"]
