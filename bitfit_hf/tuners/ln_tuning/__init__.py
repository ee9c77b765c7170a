"""LayerNorm tuning (Zhao et al., ICLR 2024; peft's ``LNTuningConfig``): every normalisation layer's gain and bias
(LayerNorm, RMSNorm) plus the task head, every weight matrix frozen."""

from bitfit_hf.tuners.ln_tuning.config import LNTuningMethodConfig
from bitfit_hf.tuners.ln_tuning.method import LNTuning
from bitfit_hf.tuners.ln_tuning.model import apply_ln_tuning, resolve_ln_tuning
from bitfit_hf.tuners.registry import register_method

register_method(LNTuning)

__all__ = ["LNTuning", "LNTuningMethodConfig", "apply_ln_tuning", "resolve_ln_tuning"]
