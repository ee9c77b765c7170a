"""Walk the network: BitFit's selection first (on the stock module names), then LoRA through peft.

Order matters. BitFit resolves roles and adds biases on the stock architecture, and fingerprints the
frozen base there, so an adapter is checked against the same names with or without LoRA. peft then
wraps the target modules (``q`` becomes ``q.base_layer`` + ``q.lora_A`` / ``q.lora_B``) and freezes all
but the LoRA matrices; the selection is renamed to the wrapped names and ``requires_grad`` set on exactly
the LoRA matrices, the selected biases and the head.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch
from torch import nn

from bitfit_hf.tuners.bias.model import apply_bitfit
from bitfit_hf.tuners.bitfit_lora.config import LORA, BitFitLoraConfig
from bitfit_hf.tuners.bitfit_lora.layer import (
    inject_lora,
    lora_layers,
    matching_modules,
    merged_weight,
)
from bitfit_hf.tuners.peft_layers import merged_state_dict, select_with_branches
from bitfit_hf.tuners.roles import ARCHITECTURE_ROLES, match_role
from bitfit_hf.tuners.state import (
    Selection,
    TunerState,
    detect_head_modules,
    get_tuner_state,
    set_tuner_state,
    unwrap,
)
from bitfit_hf.utils.names import is_under

DEFAULT_LORA_ROLES = ("b_q", "b_v")  # LoRA on the query and value projections, as in the LoRA paper


class BitFitLoraState(TunerState):
    """:class:`TunerState` plus the LoRA-wrapped module names (stock names) and the LoRA settings."""

    def __init__(self, selection: Selection, added_biases: Dict[str, str], fingerprint: str, lora_modules: List[str]):
        super().__init__(selection, added_biases, fingerprint)
        self.lora_modules = lora_modules

    def merged_state_dict(self, model: nn.Module) -> Dict[str, torch.Tensor]:
        """The model's state dict in stock names with every LoRA update folded into its base weight."""
        model = unwrap(model)
        return merged_state_dict(model, lora_layers(model), lambda name, layer: {f"{name}.weight": merged_weight(layer)})


def default_target_modules(model: nn.Module, head_modules: List[str]) -> List[str]:
    """The modules of the roles ``b_q`` and ``b_v``; PEFT's per-architecture default where bitfit-hf has no
    role table. Fused projections (GPT-2's ``c_attn``) are targeted whole."""
    model_type = getattr(getattr(model, "config", None), "model_type", "") or ""
    if model_type in ARCHITECTURE_ROLES:
        table = ARCHITECTURE_ROLES[model_type]
        names = [
            name for name, _ in model.named_modules()
            if not is_under(name, head_modules)
            and any(match_role(rule, name) is not None for role in DEFAULT_LORA_ROLES for rule in table.get(role, []))
        ]
        if names:
            return names
    from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

    fallback = TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model_type)
    if not fallback:
        raise ValueError(
            f"No default LoRA target for a {model_type or type(model).__name__!r} model: set lora_target_modules "
            "(--lora_target_modules), e.g. the names of its query and value projections."
        )
    return matching_modules(model, list(fallback), exclude=head_modules)


def resolve_targets(model: nn.Module, config: BitFitLoraConfig, head_modules: List[str]) -> List[str]:
    """Exact module names that get LoRA; an error naming the model's Linear layers when nothing matches."""
    if config.lora_target_modules is None:
        return default_target_modules(model, head_modules)
    names = matching_modules(model, config.lora_target_modules, exclude=head_modules)
    if not names:
        linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)][:8]
        raise ValueError(
            f"lora_target_modules={config.lora_target_modules!r} matches no module of this model (outside the head "
            f"{head_modules}). Its Linear layers include: {', '.join(linears)}."
        )
    return names


def apply_bitfit_lora(model: nn.Module, config: Optional[BitFitLoraConfig] = None) -> BitFitLoraState:
    """Prepare ``model`` in place for BitFit + LoRA and return the state (also kept on the model)."""
    config = config or BitFitLoraConfig()
    model = unwrap(model)
    previous = get_tuner_state(model)
    if lora_layers(model):
        if isinstance(previous, BitFitLoraState) and previous.config == config:
            return previous
        raise ValueError(
            "This model already carries LoRA layers: BitFit + LoRA prepares a stock model once. Load a fresh base "
            "model to use other LoRA settings (or to apply this adapter)."
        )
    heads = list(config.head_modules) if config.head_modules is not None else detect_head_modules(model)
    targets = resolve_targets(model, config, heads)

    bitfit = apply_bitfit(model, config)  # roles, added biases, fingerprint: all on the stock names
    inject_lora(model, targets, config.lora_r, config.lora_alpha, config.lora_dropout)

    selection = select_with_branches(model, bitfit.selection, targets, LORA)
    state = BitFitLoraState(selection, dict(bitfit.added_biases), bitfit.fingerprint, targets)
    state.mask_handles = bitfit.mask_handles  # registered on the bias tensors themselves: still valid
    state.base_sketch = bitfit.base_sketch  # of the stock base, taken before LoRA wrapped its modules
    set_tuner_state(model, state)
    return state
