"""BitFit: train bias terms (all, or a subset by the paper's role names) plus the task head."""

from bitfit_hf.tuners.bitfit.config import BitFitConfig
from bitfit_hf.tuners.bitfit.model import BitFitState, apply_bitfit, get_bitfit_state
from bitfit_hf.tuners.bitfit.selection import Selection, resolve
from bitfit_hf.tuners.bitfit.summary import TrainableSummary

__all__ = ["BitFitConfig", "BitFitState", "Selection", "TrainableSummary", "apply_bitfit", "get_bitfit_state", "resolve"]
