"""How one module changes: ``peft`` wraps it in a LoRA layer (``base_layer`` + ``lora_A`` / ``lora_B``).

All LoRA mechanics are peft's: injection (:func:`peft.inject_adapter_in_model`), target matching
(:func:`peft.tuners.tuners_utils.check_target_module_exists`) and the merged weight update
(``LoraLayer.get_delta_weight``). This module only names things: which modules are wrapped, and how a
wrapped module's parameter names map back to the stock architecture's.
"""

from __future__ import annotations

import warnings
from typing import Dict, Iterable, List, Optional

import torch
from torch import nn

from bitfit_hf.tuners.peft_layers import ADAPTER_NAME, peft_layers
from bitfit_hf.tuners.routes import Route
from bitfit_hf.utils.modes import inserted_modules_follow
from bitfit_hf.utils.names import is_under

LORA_MARKER = ".lora_"  # peft's tensors of a LoRA branch: q.lora_A.default.weight, q.lora_B.default.weight


def is_lora_tensor(name: str) -> bool:
    """A LoRA matrix by its (peft) name, wherever it is stored: a model, an adapter file, a bank."""
    return LORA_MARKER in name


def lora_module_of(name: str) -> str:
    """The module a LoRA tensor belongs to (``q`` for ``q.lora_A.default.weight``)."""
    return name.split(LORA_MARKER, 1)[0]


def lora_config(module_names: Iterable[str], r: int, alpha: float, dropout: float, fan_in_fan_out: bool = False):
    """A ``peft.LoraConfig`` targeting exactly ``module_names`` (no bias handling: BitFit owns biases).
    ``fan_in_fan_out``: the targets store their weight transposed (GPT-2's ``Conv1D``)."""
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(module_names), bias="none",
                      fan_in_fan_out=fan_in_fan_out)


def matching_modules(model: nn.Module, target_modules, exclude: Iterable[str] = ()) -> List[str]:
    """Names of the modules that PEFT's own matching rule picks for ``target_modules``."""
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists

    probe = LoraConfig(target_modules=target_modules)
    skip = tuple(exclude)
    return [name for name, _ in model.named_modules()
            if name and not is_under(name, skip)
            and bool(check_target_module_exists(probe, name))]


def inject_lora(model: nn.Module, module_names: List[str], r: int, alpha: float, dropout: float) -> None:
    """Wrap ``module_names`` in peft LoRA layers, in place (``lora_B`` starts at zero: outputs unchanged).
    The LoRA layers take the model's mode: no dropout in a model in eval mode."""
    from peft import inject_adapter_in_model

    modules = dict(model.named_modules())
    transposed = any(type(modules[name]).__name__ == "Conv1D" for name in module_names)
    with warnings.catch_warnings(), inserted_modules_follow(model):
        # A second injection (an AdapterBank adding another task's modules) is intended here.
        warnings.filterwarnings("ignore", message="Already found a `peft_config` attribute")
        inject_adapter_in_model(lora_config(module_names, r, alpha, dropout, transposed), model,
                                adapter_name=ADAPTER_NAME)


def lora_layers(model: nn.Module) -> Dict[str, nn.Module]:
    """``{module name: peft LoRA layer}`` of a model (empty when peft never touched it)."""
    from peft.tuners.lora import LoraLayer

    return peft_layers(model, LoraLayer)


def merged_weight(layer: nn.Module) -> torch.Tensor:
    """The base weight with the LoRA update folded in, computed by peft."""
    base = layer.get_base_layer().weight
    return (base.detach() + layer.get_delta_weight(ADAPTER_NAME).detach().to(base.dtype)).to("cpu")


# ---- mixed-task batches (Method.route) ----------------------------------------------------------


def route(name: str, method_config: dict) -> Optional[Route]:
    """A LoRA matrix adds ``alpha / r * B A x`` to its module's output: ``A`` and ``B`` (scaled) by slot."""
    if not is_lora_tensor(name):
        return None
    slot = name.split(LORA_MARKER, 1)[1][:1]  # lora_A... / lora_B...
    try:
        scale = float(method_config["lora_alpha"]) / int(method_config["lora_r"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    return Route(lora_module_of(name), "lora", slot, scale if slot == "B" else 1.0)
