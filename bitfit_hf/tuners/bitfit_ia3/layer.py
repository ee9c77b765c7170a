"""How one module changes: ``peft`` wraps it in an (IA)³ layer (``base_layer`` + the vector ``ia3_l``).

The mechanics are peft's (:func:`peft.inject_adapter_in_model` with an ``IA3Config``): a target's output is
multiplied by ``ia3_l`` (bias included), a feedforward target's input is. This module names things, folds a
vector into its base weight for a merged checkpoint, and gives the AdapterBank its hooks.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Dict, Iterable, List

import torch
from torch import nn

from bitfit_hf.tuners.peft_layers import ADAPTER_NAME, peft_layers, set_layer_enabled
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


# ---- AdapterBank hooks (Method.bank_modules / bank_attach / bank_switch / bank_layers) -----------------


def bank_modules(tensor_names: Iterable[str]) -> List[str]:
    return list(dict.fromkeys(ia3_module_of(n) for n in tensor_names if is_ia3_tensor(n)))


def bank_switch(model: nn.Module, settings) -> None:
    """(IA)³ on in the task's modules, off in every other one (``settings`` None: all off)."""
    on = settings or {}
    for module_name, layer in ia3_layers(model).items():
        set_layer_enabled(layer, module_name in on)


def bank_layers(model: nn.Module) -> List[str]:
    return list(ia3_layers(model))


# ---- mixed-task batches (Method.batch_router) ------------------------------------------------------


class BatchRouter:
    """Per-example (IA)³ scaling for a mixed-task batch (``MultiTaskModel``).

    A scaling vector is as routable as a bias: example ``i`` of task ``t`` gets ``output[i] * l_t`` (a key's or a
    value's output) or ``input[i] * l_t`` (the FFN output projection's input), with ``l_t`` picked from a
    ``[rows, features]`` table by the task ids; a row of a task without a vector there is ones. During a routed
    forward every (IA)³ layer of the model is switched off and hooks on the layers do the scaling, in the same
    dtype steps as peft's own forward; afterwards the layers are as they were.

    ``rows``: per task (in task-index order, then the stock model) ``{tensor name: vector}`` of its (IA)³
    vectors, under the bank's (stock) names.
    """

    def __init__(self, model: nn.Module, rows: List[Dict[str, torch.Tensor]]):
        self.model = model
        layers = ia3_layers(model)
        self.modules = list(layers)  # the wrapped modules this router answers for (their biases: base layer)
        used = list(dict.fromkeys(ia3_module_of(n) for row in rows for n in row if is_ia3_tensor(n)))
        self.tables: Dict[str, torch.Tensor] = {}
        for module_name in used:
            own = layers[module_name].ia3_l[ADAPTER_NAME]
            table = torch.ones(len(rows), own.numel(), dtype=own.dtype, device=own.device)
            for index, row in enumerate(rows):
                vector = next((t for n, t in row.items() if is_ia3_tensor(n) and ia3_module_of(n) == module_name), None)
                if vector is not None:
                    table[index] = vector.reshape(-1).to(table)
            self.tables[module_name] = table

    @contextlib.contextmanager
    def route(self, task_ids: torch.Tensor):
        """While open: the model's (IA)³ layers scale each example with its task's vectors."""
        layers = ia3_layers(self.model)
        enabled = {name: not layer.disable_adapters for name, layer in layers.items()}
        handles = []
        try:
            for layer in layers.values():
                set_layer_enabled(layer, False)
            for module_name, table in self.tables.items():
                scale = table.index_select(0, task_ids.to(table.device))
                layer = layers[module_name]
                if layer.is_feedforward:
                    handles.append(layer.register_forward_pre_hook(_scale_input(scale)))
                else:
                    handles.append(layer.register_forward_hook(_scale_output(scale)))
            yield
        finally:
            for handle in handles:
                handle.remove()
            for name, layer in layers.items():
                set_layer_enabled(layer, enabled[name])


def _per_example(scale: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if like.dim() < 2 or like.shape[0] != scale.shape[0]:
        raise RuntimeError(f"(IA)³ routing: a tensor of shape {tuple(like.shape)} is not [batch={scale.shape[0]}, ..., "
                           "features]; this layout is not supported in mixed-task batches.")
    return scale.view(scale.shape[0], *([1] * (like.dim() - 2)), scale.shape[-1])


def _scale_input(scale: torch.Tensor):
    def hook(module, args):
        x, rest = args[0], args[1:]
        scaled = (x.to(scale.dtype) * _per_example(scale, x)).to(x.dtype)  # peft: (x.to(dtype) * l).to(previous dtype)
        return (scaled, *rest)

    return hook


def _scale_output(scale: torch.Tensor):
    def hook(module, args, output):
        return (output * _per_example(scale, output)).to(output.dtype)  # peft: (result * l).to(result dtype)

    return hook
