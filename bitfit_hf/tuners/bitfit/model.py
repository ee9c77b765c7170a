"""Walk the network: add missing biases, freeze everything else, and remember the selection."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from bitfit_hf.tuners.bitfit.config import BitFitConfig, parse_added_bias_init
from bitfit_hf.tuners.bitfit.layer import add_zero_biases
from bitfit_hf.tuners.bitfit.selection import Selection, resolve
from bitfit_hf.tuners.bitfit.summary import TrainableSummary
from bitfit_hf.tuners.quantized import check_modules_take_bias, check_selected_are_float, keep_biases_trainable
from bitfit_hf.utils.fingerprint import base_fingerprint, base_sketch
from bitfit_hf.utils.zero import full_shape

_STATE_ATTR = "_bitfit_state"


class BitFitState:
    """What :func:`apply_bitfit` did to a model; kept on the model as ``model._bitfit_state``."""

    def __init__(self, selection: Selection, added_biases: Dict[str, str], fingerprint: str):
        self.selection = selection
        self.added_biases = added_biases  # module name -> "native" | "hook"
        self.fingerprint = fingerprint  # of the frozen base weights, taken before training
        self.mask_handles: List = []

    @property
    def config(self) -> BitFitConfig:
        return self.selection.config

    @property
    def summary(self) -> TrainableSummary:
        return TrainableSummary.from_selection(self.selection)


def _chunk_mask(param: nn.Parameter, chunks: List[Tuple[int, int]]) -> torch.Tensor:
    shape = full_shape(param)  # gradients arrive full-size under ZeRO-3 too
    mask = torch.zeros(shape, dtype=torch.bool, device=param.device)
    size = shape[0] // chunks[0][1]
    for index, _ in chunks:
        mask[index * size : (index + 1) * size] = True
    return mask


def apply_bitfit(model: nn.Module, config: Optional[BitFitConfig] = None) -> BitFitState:
    """Prepare ``model`` for BitFit in place and return what was done.

    Adds the zero biases the config asks for, sets ``requires_grad`` on exactly the selected tensors
    (and off everywhere else), and masks gradients outside the selected chunks of fused biases. On a
    quantized base the trained biases are float32 (see :mod:`bitfit_hf.tuners.quantized`).
    Calling it again with another config re-selects from scratch (added biases stay).
    """
    config = config or BitFitConfig()
    previous = get_bitfit_state(model)
    if previous is not None:
        for handle in previous.mask_handles:
            handle.remove()
    if not config.is_full_finetuning and config.preset != "frozen":
        check_modules_take_bias(model)  # a quantizer whose layers cannot hold a trainable bias: refused by name
    selection = resolve(model, config)
    check_selected_are_float(model, selection.parameter_names)  # e.g. a task head the quantizer packed
    fingerprint = previous.fingerprint if previous is not None else None
    if fingerprint is None:
        # Taken before anything is added or trained, over the tensors this adapter will not carry.
        fingerprint = base_fingerprint(model, exclude=set(selection.parameter_names), head_modules=selection.head_modules)
        sketch = base_sketch(model, exclude=set(selection.parameter_names), head_modules=selection.head_modules)
    else:
        sketch = getattr(previous, "base_sketch", {})
    added = dict(previous.added_biases) if previous is not None else {}
    added.update(add_zero_biases(model, selection.biases_to_add, parse_added_bias_init(config.added_bias_init)))
    keep_biases_trainable(model, selection.bias_parameter_names)  # quantized bases: float32, outside kernels

    trained = set(selection.parameter_names)
    for name, param in model.named_parameters():
        param.requires_grad_(name in trained)

    state = BitFitState(selection, added, fingerprint)
    state.base_sketch = sketch  # recognises this base loaded another way (adapters/base_check.py)
    params = dict(model.named_parameters())
    for name, chunks in selection.chunk_masks().items():
        mask = _chunk_mask(params[name], chunks)
        state.mask_handles.append(params[name].register_hook(lambda grad, mask=mask: grad * mask.to(grad.dtype)))
    setattr(model, _STATE_ATTR, state)
    return state


def get_bitfit_state(model: nn.Module) -> Optional[BitFitState]:
    """The :class:`BitFitState` of a model prepared by :func:`apply_bitfit`, or ``None``."""
    return getattr(unwrap(model), _STATE_ATTR, None)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's model inside DDP / DeepSpeed / torch.compile wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def trainable_state_dict(model: nn.Module) -> Dict[str, torch.Tensor]:
    """The tensors a BitFit adapter carries: every selected tensor plus the head, detached, on CPU."""
    state = get_bitfit_state(model)
    if state is None:
        raise ValueError("This model was not prepared with apply_bitfit(); there is no BitFit selection to save.")
    params = dict(unwrap(model).named_parameters())
    return {name: params[name].detach().to("cpu").contiguous() for name in adapter_parameter_names(model, state)}


def adapter_parameter_names(model: nn.Module, state: BitFitState) -> List[str]:
    """Trained tensors plus the whole head: the head travels with the adapter even when frozen,
    because a stock model's head is randomly initialised."""
    heads = state.selection.head_modules
    head = [n for n, _ in unwrap(model).named_parameters() if any(n == h or n.startswith(h + ".") for h in heads)]
    return list(dict.fromkeys(state.selection.parameter_names + head))
