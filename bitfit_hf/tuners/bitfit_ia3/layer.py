"""How one module changes: ``peft`` wraps it in an (IA)³ layer (``base_layer`` + the vector ``ia3_l``).

The mechanics are peft's (:func:`peft.inject_adapter_in_model` with an ``IA3Config``): a target's output is
multiplied by ``ia3_l`` (bias included), a feedforward target's input is. This module names things, folds a
vector into its base weight for a merged checkpoint.
"""

from __future__ import annotations

import warnings
from typing import Dict, Iterable, List

import torch
from torch import nn

from bitfit_hf.tuners.peft_layers import ADAPTER_NAME, peft_layers
from bitfit_hf.utils.modes import inserted_modules_follow

IA3_MARKER = ".ia3_l."  # peft's tensor of an (IA)³ layer: value.ia3_l.default


def is_ia3_tensor(name: str) -> bool:
    """An (IA)³ vector by its (peft) name, wherever it is stored: a model, an adapter file, a bank."""
    return IA3_MARKER in name or name.endswith(".ia3_l")


def ia3_module_of(name: str) -> str:
    return name.split(".ia3_l", 1)[0]


def inject_ia3(model: nn.Module, module_names: List[str], feedforward: Iterable[str]) -> None:
    """Wrap ``module_names`` in peft (IA)³ layers, in place; vectors start at one (outputs unchanged)."""
    from peft import IA3Config, inject_adapter_in_model

    modules = dict(model.named_modules())
    transposed = any(type(modules[name]).__name__ == "Conv1D" for name in module_names)
    config = IA3Config(target_modules=list(module_names), feedforward_modules=[m for m in feedforward if m in module_names],
                       fan_in_fan_out=transposed)
    with warnings.catch_warnings(), inserted_modules_follow(model):
        warnings.filterwarnings("ignore", message="Already found a `peft_config` attribute")
        inject_adapter_in_model(config, model, adapter_name=ADAPTER_NAME)


def ia3_layers(model: nn.Module) -> Dict[str, nn.Module]:
    """``{module name: peft (IA)³ layer}`` of a model."""
    from peft.tuners.ia3 import IA3Layer

    return peft_layers(model, IA3Layer)


def merged_tensors(name: str, layer: nn.Module) -> Dict[str, torch.Tensor]:
    """The base weight (and bias) of one (IA)³ layer with its vector folded in, in stock names under ``name``."""
    base = layer.get_base_layer()
    vector = layer.ia3_l[ADAPTER_NAME].detach()
    weight = base.weight.detach()
    transposed = getattr(layer, "fan_in_fan_out", False)
    scale = vector.T if transposed else vector  # (out, 1) scales rows; feedforward (1, in) scales columns
    out = {f"{name}.weight": (weight * scale.to(weight.dtype)).to("cpu")}
    if getattr(base, "bias", None) is not None:
        bias = base.bias.detach()
        out[f"{name}.bias"] = (bias if layer.is_feedforward else bias * vector.reshape(bias.shape).to(bias.dtype)).to("cpu")
    return out
