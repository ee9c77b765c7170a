"""BitFit + LoRA: a BitFit selection and the head, plus peft LoRA matrices (default: query and value)."""

from bitfit_hf.tuners.bitfit_lora.config import LORA, BitFitLoraConfig
from bitfit_hf.tuners.bitfit_lora.method import BitFitLora
from bitfit_hf.tuners.bitfit_lora.model import BitFitLoraState, apply_bitfit_lora
from bitfit_hf.tuners.registry import register_method

register_method(BitFitLora)

__all__ = ["LORA", "BitFitLoraConfig", "BitFitLoraState", "apply_bitfit_lora"]
