"""(IA)³ (Liu et al., 2022) and BitFit + (IA)³: peft scaling vectors on keys, values and the FFN's inner activation,
alone (``ia3``) or beside a BitFit selection (``bitfit_ia3``), plus the head."""

from bitfit_hf.tuners.bitfit_ia3.config import IA3, BitFitIA3Config, IA3Config
from bitfit_hf.tuners.bitfit_ia3.method import BitFitIA3, IA3Only
from bitfit_hf.tuners.bitfit_ia3.model import BitFitIA3State, apply_bitfit_ia3
from bitfit_hf.tuners.registry import register_method

register_method(IA3Only)
register_method(BitFitIA3)

__all__ = ["IA3", "BitFitIA3Config", "BitFitIA3State", "IA3Config", "apply_bitfit_ia3"]
