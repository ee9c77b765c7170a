"""How one module changes: ``peft`` wraps it in a LoRA layer (``base_layer`` + ``lora_A`` / ``lora_B``).

All LoRA mechanics are peft's: injection (:func:`peft.inject_adapter_in_model`), target matching
(:func:`peft.tuners.tuners_utils.check_target_module_exists`) and the merged weight update
(``LoraLayer.get_delta_weight``). This module only names things: which modules are wrapped, and how a
wrapped module's parameter names map back to the stock architecture's.
"""

from __future__ import annotations

import warnings
from typing import Dict, Iterable, List

import torch
from torch import nn

from bitfit_hf.utils.modes import inserted_modules_follow
from bitfit_hf.utils.names import is_under

ADAPTER_NAME = "default"  # peft's adapter name inside the wrapped modules (one LoRA per model)
BASE_LAYER = "base_layer"
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
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # pragma: no cover - peft is a dependency
        return {}
    return {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}


def stock_name(name: str, wrapped: Iterable[str]) -> str:
    """The stock architecture's name of a parameter of a wrapped model (``q.base_layer.bias`` -> ``q.bias``)."""
    for module in wrapped:
        prefix = f"{module}.{BASE_LAYER}."
        if name.startswith(prefix):
            return f"{module}.{name[len(prefix):]}"
    return name


def wrapped_name(name: str, wrapped: Iterable[str]) -> str:
    """The wrapped model's name of a stock parameter name (``q.bias`` -> ``q.base_layer.bias``)."""
    module, _, attr = name.rpartition(".")
    return f"{module}.{BASE_LAYER}.{attr}" if module in set(wrapped) else name


def is_lora_parameter(name: str, wrapped: Iterable[str]) -> bool:
    """A parameter of a LoRA branch (``lora_A`` / ``lora_B`` / ...), not of a wrapped base layer."""
    return any(name.startswith(f"{m}.") and not name.startswith(f"{m}.{BASE_LAYER}.") for m in wrapped)


def merged_weight(layer: nn.Module) -> torch.Tensor:
    """The base weight with the LoRA update folded in, computed by peft."""
    base = layer.get_base_layer().weight
    return (base.detach() + layer.get_delta_weight(ADAPTER_NAME).detach().to(base.dtype)).to("cpu")
