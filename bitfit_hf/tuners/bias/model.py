"""BitFit's walk over the network: add missing biases, freeze everything else, and remember the selection.

Shared (not a method folder): ``bitfit`` registers it as is, and the methods defined relative to a bias
selection (``bitfit_lora``, ``bitfit_ia3``, the random baselines) call it first."""

from __future__ import annotations

import logging
from typing import List, Optional, Tuple

import torch
from torch import nn

from bitfit_hf.tuners.bias.config import BitFitConfig, parse_bias_init
from bitfit_hf.tuners.bias.layer import add_zero_biases, initialize_biases
from bitfit_hf.tuners.bias.quantized import check_modules_take_bias, check_selected_are_float, keep_biases_trainable
from bitfit_hf.tuners.bias.selection import resolve
from bitfit_hf.tuners.grad_mask import GradMask
from bitfit_hf.tuners.state import Selection, TunerState, get_tuner_state, set_tuner_state
from bitfit_hf.utils.fingerprint import base_fingerprint, base_sketch
from bitfit_hf.utils.zero import full_shape

logger = logging.getLogger("bitfit_hf")

# BitFit's state is the state every method leaves on the model.
BitFitState = TunerState


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
    quantized base the trained biases are float32 (see :mod:`bitfit_hf.tuners.bias.quantized`).
    Calling it again with another config re-selects from scratch (added biases stay).
    """
    config = config or BitFitConfig()
    previous = get_tuner_state(model)
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
        sketch = previous.base_sketch
    added = dict(previous.added_biases) if previous is not None else {}
    new = add_zero_biases(model, {m: k for m, k in selection.biases_to_add.items() if m not in added})
    added.update(new)
    keep_biases_trainable(model, selection.bias_parameter_names)  # quantized bases: float32, outside kernels
    _initialize(model, config, selection, [f"{m}.bias" for m in new])

    trained = set(selection.parameter_names)
    for name, param in model.named_parameters():
        param.requires_grad_(name in trained)

    state = BitFitState(selection, added, fingerprint)
    state.base_sketch = sketch  # recognises this base loaded another way (adapters/base_check.py)
    params = dict(model.named_parameters())
    for name, chunks in selection.chunk_masks().items():
        mask = _chunk_mask(params[name], chunks)
        state.mask_handles.append(params[name].register_hook(GradMask(mask)))
    set_tuner_state(model, state)
    return state


def _initialize(model: nn.Module, config: BitFitConfig, selection: Selection, added: List[str]) -> None:
    """``added_bias_init`` for the biases just added, and for the pretrained ones only on explicit request."""
    mean_std = parse_bias_init(config.added_bias_init)
    params = dict(model.named_parameters())
    names = list(added)
    if config.reinit_existing_biases:
        existing = [e.name for e in selection.entries if e.name.endswith(".bias") and not e.added and e.role != "head"]
        logger.warning("reinit_existing_biases=True: overwriting %d pretrained bias tensors with %s; their "
                       "pretrained values are lost for this run.", len(existing), config.added_bias_init)
        names += list(dict.fromkeys(existing))
        if mean_std is None:
            with torch.no_grad():
                for name in existing:
                    params[name].zero_()
    initialize_biases(params, names, mean_std)
