"""How one module changes: adding a zero-initialised bias where a module has none.

``nn.Linear`` and ``nn.LayerNorm`` already know how to apply a ``bias`` parameter, so one is simply
set (a zero bias leaves their outputs bit-identical). Other modules (``LlamaRMSNorm``,
``T5LayerNorm``, ...) never read ``self.bias``; for them the parameter is registered under the same
name and a forward hook adds it to the output, which is ``x + 0 == x`` until it is trained.
"""

from __future__ import annotations

from typing import Dict

import torch
from torch import nn

NATIVE = "native"  # the module's own forward applies ``self.bias``
HOOK = "hook"  # a forward hook adds ``self.bias`` to the output

HOOK_ATTR = "_bitfit_bias_hook"


def has_bias(module: nn.Module) -> bool:
    return isinstance(getattr(module, "bias", None), nn.Parameter)


def bias_kind(module: nn.Module) -> str:
    """How a bias added to ``module`` would be applied."""
    if isinstance(module, (nn.Linear, nn.LayerNorm)):
        return NATIVE
    weight = getattr(module, "weight", None)
    if isinstance(weight, nn.Parameter) and weight.dim() == 1:
        return HOOK
    raise ValueError(
        f"Cannot add a bias to a module of type {type(module).__name__}: bitfit-hf adds biases to "
        "nn.Linear, nn.LayerNorm and norm modules with a 1-D weight (RMSNorm-style)."
    )


def _add_bias_to_output(module: nn.Module, args, output):
    return output + module.bias.to(output.dtype)


def add_zero_bias(module: nn.Module) -> str:
    """Give ``module`` a trainable zero bias; returns how it is applied (``"native"`` or ``"hook"``)."""
    if has_bias(module):
        raise ValueError(f"{type(module).__name__} already has a bias; nothing to add.")
    kind = bias_kind(module)
    weight = module.weight
    if isinstance(module, nn.Linear):
        size = module.out_features
    else:
        shape = getattr(weight, "ds_shape", None) or weight.shape  # ZeRO-3 partitions hold (0,)
        size = shape[0] if len(shape) == 1 else int(torch.Size(module.normalized_shape).numel())
    # A quantized weight (uint8 / int8 storage) gives no bias dtype: such biases are float32.
    dtype = weight.dtype if weight.is_floating_point() else torch.float32
    bias = nn.Parameter(torch.zeros(size, dtype=dtype, device=weight.device))
    if kind == NATIVE:
        module.bias = bias
    else:
        module.register_parameter("bias", bias)
        setattr(module, HOOK_ATTR, module.register_forward_hook(_add_bias_to_output))
    return kind


def remove_added_bias(module: nn.Module, keep_slot: bool) -> None:
    """Undo :func:`add_zero_bias`: the hook goes, and ``bias`` is ``None`` again (``keep_slot``: the module
    had a ``bias`` entry set to ``None``, as ``nn.Linear(bias=False)``) or no attribute at all."""
    handle = getattr(module, HOOK_ATTR, None)
    if handle is not None:
        handle.remove()
        delattr(module, HOOK_ATTR)
    if keep_slot:
        module.register_parameter("bias", None)
    else:
        del module._parameters["bias"]


def add_zero_biases(model: nn.Module, module_names) -> Dict[str, str]:
    """Add zero biases to the named modules of ``model``; returns ``{module name: kind}``."""
    modules = dict(model.named_modules())
    added = {}
    for name in module_names:
        if name not in modules:
            raise KeyError(f"The model has no module named {name!r} to add a bias to.")
        added[name] = add_zero_bias(modules[name])
    return added


BIAS_INIT_SEED = 0  # fixed, so every rank (and every rerun) draws the same initial biases


def initialize_biases(params: Dict[str, nn.Parameter], names, mean_std) -> None:
    """Fill the named bias parameters from ``normal(mean, std)`` in the given order (``mean_std`` as
    :func:`bitfit_hf.tuners.bias.config.parse_bias_init` returns it; ``None`` leaves them as they are).
    One fixed-seed generator on CPU draws them, so the values do not depend on the device or the rank."""
    if mean_std is None:
        return
    mean, std = mean_std
    generator = torch.Generator().manual_seed(BIAS_INIT_SEED)
    with torch.no_grad():
        for name in names:
            param = params[name]
            values = torch.randn(param.shape, generator=generator, dtype=torch.float32) * std + mean
            param.copy_(values.to(device=param.device, dtype=param.dtype))

