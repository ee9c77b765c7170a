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

from bitfit_hf.tuners.peft_layers import ADAPTER_NAME, peft_layers, set_layer_enabled
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


# ---- AdapterBank hooks (Method.bank_modules / bank_attach / bank_switch) ------------------------------


def bank_modules(tensor_names: Iterable[str]) -> List[str]:
    """The modules an adapter's LoRA matrices belong to, in order."""
    return list(dict.fromkeys(lora_module_of(n) for n in tensor_names if is_lora_tensor(n)))


def bank_attach(model: nn.Module, modules: List[str], method_config: dict) -> Dict[str, float]:
    """Wrap ``modules`` in LoRA layers where the shared model has none yet (turned off until a task using them
    is active); the task's settings: its scaling per module."""
    try:
        r, alpha = int(method_config["lora_r"]), float(method_config["lora_alpha"])
    except (KeyError, TypeError, ValueError):
        raise ValueError("the adapter holds LoRA matrices but no lora_r / lora_alpha in its config") from None
    existing = lora_layers(model)
    missing = [m for m in modules if m not in existing]
    if missing:
        inject_lora(model, missing, r, alpha, float(method_config.get("lora_dropout", 0.0)))
        for module_name, layer in lora_layers(model).items():
            if module_name in missing:
                set_layer_enabled(layer, False)
    return {m: alpha / r for m in modules}


def bank_switch(model: nn.Module, settings) -> None:
    """LoRA on (with the task's scaling) in the task's modules, off in every other one (``settings`` None: all off)."""
    scaling = settings or {}
    for module_name, layer in lora_layers(model).items():
        if module_name in scaling:
            layer.scaling[ADAPTER_NAME] = scaling[module_name]
        set_layer_enabled(layer, module_name in scaling)
