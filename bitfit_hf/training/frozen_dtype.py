"""Frozen weights in the compute dtype (``frozen_dtype``): no float32 master copy of weights nobody trains.

Under bf16 mixed precision (``bf16=True``: autocast, float32 parameters) every forward pass casts every
frozen matrix from float32 to bf16 again: autocast caches its casts only for tensors that require grad.
A bias-only (or LoRA / (IA)³ / AdapterBias) run trains none of those matrices, so they can be stored in
bf16 once, which removes those casts and half of their memory, while every trained tensor (biases,
head, LoRA matrices, (IA)³ vectors) and its optimizer state stays float32.

What is cast: the frozen float32 weights (and frozen biases) of the modules whose product autocast
runs in bf16 anyway: ``nn.Linear`` (also a peft layer's ``base_layer``), transformers' ``Conv1D``
and ``nn.Conv1d/2d/3d``. Autocast rounds those to bf16 on every call, to the very values stored
here, so **forward and backward compute the same numbers as the float32-master run** (bit for bit on
the CPU; tests/training/test_frozen_dtype.py). Embedding tables, norms and any tensor also used
by another module (tied weights) stay float32: their operations do not run in bf16 under autocast
(a LayerNorm with a bf16 weight and a float32 bias fails), so casting them would change the numbers.

Mixed dtypes in one Linear (bf16 weight, float32 trained bias) need autocast; a model whose weights
were cast therefore runs its forward under bf16 autocast whenever the caller has none active
(:func:`cast_frozen_weights` wraps ``model.forward``), so a plain ``model(**inputs)`` after training
works. A submodule called on its own outside autocast does not get that wrapper.

Adapters are unaffected: they hold the trained float32 tensors only, and the base fingerprint samples
values rounded to bf16 (:mod:`bitfit_hf.utils.fingerprint`), so it is the same for either dtype. An
adapter reloaded on a stock float32 base gives the trained model's logits exactly under bf16 autocast
(autocast makes the same casts) or after :func:`cast_frozen_weights`; in plain float32 they differ by
the bf16 rounding of the frozen weights (measured in the tests).
"""

from __future__ import annotations

import functools
import logging
from types import MethodType
from typing import Optional, Union

import torch
from torch import nn

from bitfit_hf.utils.errors import UserError

logger = logging.getLogger("bitfit_hf")

FROZEN_DTYPES = ("float32", "bfloat16", "auto")
_WRAPPED_ATTR = "_bitfit_frozen_dtype_forward"  # the forward that the autocast wrapper calls
_CONV_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


class FrozenDtypeError(UserError, ValueError):
    """A ``frozen_dtype`` that cannot work with the rest of the run (the message says which flag to change)."""


def _is_autocast_product(module: nn.Module) -> bool:
    """A module whose product autocast runs in the lower precision (so its frozen weight is rounded anyway)."""
    return isinstance(module, (nn.Linear, *_CONV_TYPES)) or type(module).__name__ == "Conv1D"


def castable_parameters(model: nn.Module):
    """``[(name, parameter)]`` that :func:`cast_frozen_weights` would cast: frozen float32 parameters held
    directly by Linear / Conv1D / Conv modules and by no other module (a tied embedding stays float32)."""
    owners = {}
    for module_name, module in model.named_modules(remove_duplicate=False):
        for param_name, param in module.named_parameters(recurse=False):
            owners.setdefault(id(param), []).append((module, f"{module_name}.{param_name}" if module_name else param_name))
    found, seen = [], set()
    for module_name, module in model.named_modules():
        if not _is_autocast_product(module):
            continue
        for param_name, param in module.named_parameters(recurse=False):
            if id(param) in seen or param.requires_grad or param.dtype != torch.float32 or type(param) is not nn.Parameter:
                continue  # trained, already cast, or a quantizer's own parameter type
            if not all(_is_autocast_product(owner) for owner, _ in owners[id(param)]):
                continue  # tied to an embedding (or another module that does not run under autocast's bf16)
            seen.add(id(param))
            found.append((f"{module_name}.{param_name}" if module_name else param_name, param))
    return found


def cast_frozen_weights(model: nn.Module, dtype: Union[str, torch.dtype] = torch.bfloat16) -> int:
    """Store ``model``'s frozen Linear / Conv weights in ``dtype`` (in place; the parameters stay the same
    objects) and make its forward run under autocast of that dtype when the caller has none active.
    ``dtype=torch.float32`` upcasts them back (to the bf16-rounded values) and removes the wrapper.
    Returns the number of tensors cast. Call it after choosing what is trained: it casts only
    parameters with ``requires_grad=False``."""
    dtype = _as_dtype(dtype)
    if dtype == torch.float32:
        count = 0
        for module in model.modules():
            if _is_autocast_product(module):
                for param in module.parameters(recurse=False):
                    if not param.requires_grad and param.dtype == torch.bfloat16 and type(param) is nn.Parameter:
                        param.data = param.data.to(torch.float32)
                        count += 1
        _remove_autocast_forward(model)
        return count
    params = castable_parameters(model)
    for _, param in params:
        param.data = param.data.to(dtype)
    if params:
        _install_autocast_forward(model, dtype)
    return len(params)


def _as_dtype(dtype: Union[str, torch.dtype]) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    found = getattr(torch, str(dtype), None)
    if not isinstance(found, torch.dtype) or found not in (torch.float32, torch.bfloat16):
        raise FrozenDtypeError(f"frozen_dtype {dtype!r}: choose one of {', '.join(FROZEN_DTYPES)}.")
    return found


def _install_autocast_forward(model: nn.Module, dtype: torch.dtype) -> None:
    """``model.forward`` runs under ``dtype`` autocast on the parameters' device unless autocast is on there.
    The original function is called with the model passed in (not captured), so a deep copy stays whole."""
    if _WRAPPED_ATTR in vars(model):
        return
    inner = getattr(model.forward, "__func__", None) or type(model).forward

    @functools.wraps(inner)  # the signature stays the model's: Trainer drops dataset columns forward does not take
    def forward(self, *args, **kwargs):
        device_type = next(self.parameters()).device.type
        if torch.is_autocast_enabled(device_type):
            return inner(self, *args, **kwargs)
        with torch.autocast(device_type, dtype=dtype):
            return inner(self, *args, **kwargs)

    setattr(model, _WRAPPED_ATTR, inner)
    model.forward = MethodType(forward, model)


def _remove_autocast_forward(model: nn.Module) -> None:
    inner = vars(model).pop(_WRAPPED_ATTR, None)
    if inner is None:
        return
    if inner is type(model).forward:
        vars(model).pop("forward", None)
    else:
        model.forward = MethodType(inner, model)


def resolve_frozen_dtype(choice: Optional[Union[str, torch.dtype]], args, config, model: nn.Module) -> Optional[torch.dtype]:
    """The dtype to store frozen weights in for a ``Trainer`` run (``None``: leave them float32).

    ``auto``: bf16 when training on a CUDA device with ``bf16=True`` and nothing below rules it out; float32
    otherwise (on a CPU bf16 autocast is usually slower, and float32 is what the CPU tables measured).
    ``bfloat16`` asked explicitly is refused where it cannot work: without ``bf16=True`` (mixed dtypes in one
    Linear need autocast), with full fine-tuning or ``save_full_model`` (a full checkpoint would hold the
    frozen weights rounded to bf16), and under DeepSpeed or FSDP (they flatten parameters of one dtype)."""
    if choice is None:
        return None
    name = str(choice).replace("torch.", "")
    if name not in FROZEN_DTYPES:
        raise FrozenDtypeError(f"frozen_dtype {choice!r}: choose one of {', '.join(FROZEN_DTYPES)}.")
    if name == "float32":
        return None
    device = getattr(getattr(args, "device", None), "type", "cpu")
    sharded = bool(getattr(args, "deepspeed", None)) or bool(getattr(args, "fsdp", None))
    blockers = []
    if not getattr(args, "bf16", False):
        blockers.append("it needs bf16 mixed precision (--bf16): a bf16 weight beside a float32 bias runs under autocast")
    if getattr(config, "is_full_finetuning", False):
        blockers.append("full fine-tuning trains every weight, so nothing is frozen")
    if getattr(config, "save_full_model", False):
        blockers.append("--save_full_model would write the frozen weights rounded to bf16")
    if sharded:
        blockers.append("DeepSpeed and FSDP flatten parameters of one dtype")
    if name == "auto":
        if blockers or device != "cuda":
            return None
        return torch.bfloat16 if model is None or castable_parameters(model) else None
    if blockers:
        raise FrozenDtypeError(f"frozen_dtype='bfloat16' cannot be used here: {blockers[0]}. Use --frozen_dtype float32 "
                               "(or auto, which picks float32 in this case).")
    return torch.bfloat16
