"""BitFit + LoRA as registered, with the recipes' ``lora`` (the same method training no bias term)."""

from __future__ import annotations

from typing import Any, Optional, Tuple

from bitfit_hf.tuners.bitfit_lora import layer
from bitfit_hf.tuners.bitfit_lora.config import LORA, BitFitLoraConfig
from bitfit_hf.tuners.bitfit_lora.model import apply_bitfit_lora
from bitfit_hf.tuners.bitfit_lora.recipe import RECIPE
from bitfit_hf.tuners.registry import Method, bias_terms_of, method_settings, selection_words


def lora_only(config: Any) -> bool:
    """The recipes' ``--method lora``: BitFit + LoRA stored with ``bias_terms`` frozen (no bias trained)."""
    return bias_terms_of(config) == ["frozen"]


class BitFitLora(Method):
    name = "bitfit_lora"
    config_class = BitFitLoraConfig
    description = "bias terms + head, plus peft LoRA matrices (default: query and value projections)"
    display_name = "BitFit + LoRA"
    recipe = RECIPE
    inserts_modules = True
    peft_refusal = ("its LoRA matrices: a PEFT adapter holds one tuner type, and BEFT (bias deltas) has no LoRA part. "
                    "Use bitfit-hf to load it, or `bitfit-hf merge` for a plain checkpoint")

    def apply(self, model, config):
        return apply_bitfit_lora(model, config)

    def tensor_role(self, name: str) -> Optional[str]:
        return LORA if layer.is_lora_tensor(name) else None

    def merge(self, state, model):
        return state.merged_state_dict(model)

    def route(self, model, name, method_config):
        return layer.route(name, method_config)

    def label(self, config: Any) -> Optional[str]:
        return "lora" if lora_only(config) else None

    def describe(self, config: Any) -> str:
        if lora_only(config):
            return f"lora (LoRA, no bias term: stored as bitfit_lora with bias_terms frozen; {method_settings(config)})"
        return f"bitfit_lora (bias terms {selection_words(config)}; {method_settings(config)})"

    def card_variant(self, config: Any) -> Optional[Tuple[str, str]]:
        """The recipes' ``--method lora`` must not claim biases on its card."""
        if lora_only(config):
            return "LoRA", "peft LoRA matrices (default: query and value projections) + head, no bias term"
        return None
