"""What the methods that use peft tuner layers share (shared, not a method): peft wraps a module as
``<module>.base_layer`` plus the method's own tensors (``lora_A`` / ``lora_B``, ``ia3_l``), and these helpers map
between the wrapped and the stock architecture's names and list the wrapped layers.

Nothing here names a method: any ``peft.tuners.tuners_utils.BaseTunerLayer`` is a wrapped layer.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Dict, Iterable, List

import torch
from torch import nn

from bitfit_hf.tuners.state import HEAD, Selection, TrainedTensor

_LAYER_INDEX = re.compile(r"\.(\d+)\.")
ADAPTER_NAME = "default"  # peft's adapter name inside the wrapped modules (one adapter per method per model)
BASE_LAYER = "base_layer"


def peft_layers(model: nn.Module, layer_type=None) -> Dict[str, nn.Module]:
    """``{module name: peft tuner layer}`` of a model (``layer_type``: one tuner's layer class; default any)."""
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:  # pragma: no cover - peft is a dependency
        return {}
    kind = layer_type or BaseTunerLayer
    return {name: module for name, module in model.named_modules() if isinstance(module, kind)}


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


def is_branch_parameter(name: str, wrapped: Iterable[str]) -> bool:
    """A parameter a peft layer added (``lora_A``, ``ia3_l``, ...), not one of the wrapped base layer's."""
    return any(name.startswith(f"{m}.") and not name.startswith(f"{m}.{BASE_LAYER}.") for m in wrapped)


def is_wrapped_base_tensor(name: str) -> bool:
    """A stored name of a base-layer tensor inside a peft wrapper (``q.base_layer.bias``): missing from a stock
    model until the method wraps the module."""
    return f".{BASE_LAYER}." in name


def merged_state_dict(model: nn.Module, layers: Dict[str, nn.Module],
                      fold: Callable[[str, nn.Module], Dict[str, torch.Tensor]]) -> Dict[str, torch.Tensor]:
    """``model``'s state dict as the stock architecture names it, on CPU, with each wrapped layer's method folded in:
    the layers' own tensors (LoRA matrices, (IA)³ vectors) dropped, base-layer tensors renamed to stock names, and
    ``fold(name, layer)`` (the layer's merged tensors under stock names) replacing its base weight (and bias).
    The one place export_merged's state dict of a peft-wrapped model is built, whatever the method."""
    merged = {}
    for key, value in model.state_dict().items():
        if is_branch_parameter(key, layers):
            continue
        merged[stock_name(key, layers)] = value.detach().to("cpu")
    for name, layer in layers.items():
        merged.update(fold(name, layer))
    return merged


def select_with_branches(model: nn.Module, selection: Selection, wrapped: List[str], role: str) -> Selection:
    """A BitFit ``selection`` of the stock model moved onto the wrapped one: its names under ``base_layer``, the
    branch tensors the peft layers added (tagged ``role`` and their layer index) inserted before the head, and
    ``requires_grad`` set on exactly these tensors. The methods that put peft layers beside BitFit differ only
    in how they wrap, so this is the one place that decides what such a model trains."""
    params = dict(model.named_parameters())
    entries = [dataclasses.replace(e, name=wrapped_name(e.name, wrapped)) for e in selection.entries]
    branches = []
    for name, param in params.items():
        if is_branch_parameter(name, wrapped):
            found = _LAYER_INDEX.search(name)
            branches.append(TrainedTensor(name, role, found.group(1) if found else "", param.numel()))
    head_start = next((i for i, e in enumerate(entries) if e.role == HEAD), len(entries))
    moved = dataclasses.replace(selection, entries=entries[:head_start] + branches + entries[head_start:])
    trained = set(moved.parameter_names)
    for name, param in params.items():
        param.requires_grad_(name in trained)
    return moved
