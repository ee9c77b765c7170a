"""Bias terms on quantized bases (QBitFit): the biases are the adapter, the quantized weights stay frozen.

transformers marks a model quantized whenever a quantizer loaded it: bitsandbytes 4/8-bit layers, but
also a GGUF file (dequantised to ordinary float tensors). Whatever the quantizer, BitFit needs two
things of each module whose bias it trains:

* the bias is an ordinary floating-point ``nn.Parameter`` (not a buffer, not a packed tensor), or the
  module is one that can take one (an ``nn.Linear`` subclass, a norm): otherwise the quantizer is
  refused with an error that names it and the layer type;
* the trained bias stays float32, so that small updates are not rounded away. Kernels that compute in
  another dtype, or that cast their bias in place (bitsandbytes casts ``bias.data`` to the input's
  dtype on every forward), get the bias added to their output instead: the kernel sees no bias, a
  forward hook adds ``bias.to(output.dtype)``. ``W x + b`` is the same sum either way.
"""

from __future__ import annotations

from typing import Iterable, List

import torch
from torch import nn

from bitfit_hf.tuners.bias.layer import HOOK_ATTR
from bitfit_hf.utils.base_loading import quantization_method
from bitfit_hf.utils.errors import UserError

OUTSIDE = "outside"  # the bias is added to the module's output by hooks, outside its (quantized) kernel
_HIDDEN_ATTR = "_bitfit_hidden_bias"
_OUTSIDE_HANDLES_ATTR = "_bitfit_outside_handles"


class QuantizedBaseError(UserError, ValueError):
    """A quantized base whose layers cannot hold a trainable bias."""


def _is_plain_float(tensor) -> bool:
    return (isinstance(tensor, torch.Tensor) and tensor.is_floating_point()
            and type(tensor) in (torch.Tensor, nn.Parameter))


def _computes_in_float32(module: nn.Module) -> bool:
    """Whether ``module``'s own kernel can apply a float32 bias as it is (plain float32 weight)."""
    weight = getattr(module, "weight", None)
    return weight is None or (_is_plain_float(weight) and weight.dtype == torch.float32)


def _hide_bias(module: nn.Module, args) -> None:
    bias = module._parameters.get("bias")
    if bias is not None:
        module._parameters["bias"] = None
        module.__dict__[_HIDDEN_ATTR] = bias


def _add_hidden_bias(module: nn.Module, args, output):
    bias = module.__dict__.pop(_HIDDEN_ATTR, None)
    if bias is None:
        return output
    module._parameters["bias"] = bias
    if output is None:  # the forward raised: the bias is back in place, nothing to add
        return output
    return output + bias.to(output.dtype)


def apply_bias_outside(module: nn.Module) -> None:
    """Make ``module`` add its ``bias`` to its output instead of passing it to its kernel."""
    if hasattr(module, _OUTSIDE_HANDLES_ATTR):
        return
    handles = (module.register_forward_pre_hook(_hide_bias),
               module.register_forward_hook(_add_hidden_bias, always_call=True))
    setattr(module, _OUTSIDE_HANDLES_ATTR, handles)


def _refuse(method: str, module_name: str, module: nn.Module, why: str) -> QuantizedBaseError:
    return QuantizedBaseError(
        f"bitfit-hf cannot train biases on this {method}-quantized model: {module_name} is a "
        f"{type(module).__module__}.{type(module).__name__}, {why}. BitFit needs a bias that is an ordinary "
        "float tensor; load the base with a quantizer whose layers keep one (bitsandbytes 4/8-bit, GGUF), "
        "or in full precision."
    )


def check_modules_take_bias(model: nn.Module) -> None:
    """Refuse, naming the quantizer and the layer, a quantized model whose layers keep their bias as
    something other than a float parameter (a buffer, packed integers): BitFit could not train it, and
    ``bias_terms="all"`` would silently leave it out."""
    method = quantization_method(model)
    if method is None:
        return
    for name, module in model.named_modules():
        bias = module.__dict__.get("_buffers", {}).get("bias")
        if bias is not None:
            raise _refuse(method, name, module, "whose bias is a buffer, not a parameter")
        bias = module._parameters.get("bias")
        if bias is not None and not bias.is_floating_point():
            raise _refuse(method, name, module, f"whose bias is stored as {bias.dtype}")


def keep_biases_trainable(model: nn.Module, parameter_names: Iterable[str]) -> List[str]:
    """On a quantized base: make every named bias a float32 parameter, applied outside kernels that
    do not compute in float32. Returns the modules whose bias is now added outside. No-op on a model
    that no quantizer loaded."""
    method = quantization_method(model)
    if method is None:
        return []
    modules = dict(model.named_modules())
    outside = []
    for name in parameter_names:
        module_name, _, attr = name.rpartition(".")
        if attr != "bias" or module_name not in modules:
            continue
        module = modules[module_name]
        bias = module._parameters.get("bias")
        if bias is None:
            continue
        if not _is_plain_float(bias):
            raise _refuse(method, module_name, module, f"whose bias is a {type(bias).__name__} of {bias.dtype}")
        if bias.dtype != torch.float32:
            bias.data = bias.data.to(torch.float32)
        if not _computes_in_float32(module) and not hasattr(module, HOOK_ATTR):
            if not isinstance(module, (nn.Linear, nn.LayerNorm)):
                raise _refuse(method, module_name, module, "whose kernel cannot take a float32 bias from outside")
            apply_bias_outside(module)
            outside.append(module_name)
    return outside


def check_selected_are_float(model: nn.Module, parameter_names: Iterable[str]) -> None:
    """A selected tensor the quantizer packed (a task head quantized with the rest) cannot be trained:
    say which, and how to keep it in full precision."""
    method = quantization_method(model)
    if method is None:
        return
    params = dict(model.named_parameters())
    packed = [n for n in parameter_names if n in params and not params[n].is_floating_point()]
    if packed:
        modules = sorted({n.rpartition(".")[0] for n in packed})
        raise QuantizedBaseError(
            f"{packed[0]} was quantized by {method} ({params[packed[0]].dtype}), so BitFit cannot train it. Keep "
            f"the task head in full precision when loading, e.g. BitsAndBytesConfig(..., llm_int8_skip_modules="
            f"{modules!r}); the bitfit-hf recipes do this for the usual head names."
        )
