"""Walk the network for LayerNorm tuning: find every normalisation layer, train its gain and bias (and the head),
freeze the rest, and remember the selection (the :class:`~bitfit_hf.tuners.state.TunerState` every method returns,
so the trainer, the adapter format and the reports work unchanged).

A normalisation layer is a LayerNorm or an RMSNorm-style module with a 1-D gain (``is_norm`` of the shared bias
selection): BERT's ``LayerNorm``s, GPT-2's ``ln_*``, LLaMA's ``*_layernorm`` and final ``norm``, T5's
``layer_norm``s, Qwen3's per-head ``q_norm`` / ``k_norm``, ... on any architecture. Each trained tensor takes the
role the architecture's role table gives its module (``g_LN1`` / ``b_LN1``, ``g_emb_LN``, ``g_final_LN``, ...),
as BitFit's ``one-d`` preset names the same tensors, else ``gain`` / ``bias`` (a norm no role names): the summary,
the heat map and ``bitfit-hf info`` count them as they count BitFit's.
"""

from __future__ import annotations

import warnings
from typing import List, Optional

from torch import nn

from bitfit_hf.tuners.bias.quantized import check_selected_are_float
from bitfit_hf.tuners.bias.selection import GAIN, OTHER_BIAS, count_layers, is_norm
from bitfit_hf.tuners.errors import SelectionError
from bitfit_hf.tuners.ln_tuning.config import LNTuningMethodConfig
from bitfit_hf.tuners.roles import ARCHITECTURE_ROLES, GAIN_ROLES, module_roles
from bitfit_hf.tuners.state import (
    HEAD,
    Selection,
    TrainedTensor,
    TunerState,
    detect_head_modules,
    get_tuner_state,
    set_tuner_state,
    unwrap,
)
from bitfit_hf.utils.fingerprint import base_fingerprint, base_sketch
from bitfit_hf.utils.names import is_under
from bitfit_hf.utils.zero import full_numel


def _model_type(model: nn.Module) -> str:
    return getattr(getattr(model, "config", None), "model_type", "") or ""


def norm_modules(model: nn.Module, head_modules: List[str]) -> List[str]:
    """Names of the normalisation layers outside the head, in model order."""
    return [name for name, module in model.named_modules() if name and not is_under(name, head_modules)
            and is_norm(module)]


def resolve_ln_tuning(model: nn.Module, config: LNTuningMethodConfig) -> Selection:
    """The exact trained tensors: every norm's gain and bias (roles from the architecture's table where it has
    one), then the head."""
    model_type = _model_type(model)
    modules = dict(model.named_modules())
    heads = list(config.head_modules) if config.head_modules is not None else detect_head_modules(model)
    missing = [m for m in heads if m not in modules]
    if missing:
        raise SelectionError(f"head_modules {missing} are not modules of this model.")
    params = dict(model.named_parameters())
    table = ARCHITECTURE_ROLES.get(model_type, {})
    entries: List[TrainedTensor] = []
    norms = norm_modules(model, heads)
    if not norms:
        raise SelectionError(
            f"This {model_type or type(model).__name__} model has no normalisation layer with a gain (a LayerNorm or "
            "an RMSNorm-style module with a 1-D weight) outside the head: LN tuning has nothing to train."
        )
    for module_name in norms:
        for attr in ("weight", "bias"):
            name = f"{module_name}.{attr}"
            if name not in params:  # no bias (RMSNorm, LayerNorm(bias=False)), or a tensor shared under another name
                continue
            # The roles the heat map reads back from an adapter (reporting/heatmap.classify_trained): a gain by the
            # gain roles of its module, a bias by the bias roles.
            found = list(module_roles(table, module_name, list(GAIN_ROLES) if attr == "weight" else None))
            if not found:
                found = [(GAIN if attr == "weight" else OTHER_BIAS, None, "")]
            for role, _, layer in found:
                entries.append(TrainedTensor(name, role, layer, full_numel(params[name])))
    if config.train_head:
        covered = {entry.name for entry in entries}
        entries += [TrainedTensor(n, HEAD, "", full_numel(p)) for n, p in params.items()
                    if is_under(n, heads) and n not in covered]
    total = sum(full_numel(p) for p in params.values())
    return Selection(config, model_type, entries, {}, heads, total, count_layers(model_type, modules))


def apply_ln_tuning(model: nn.Module, config: Optional[LNTuningMethodConfig] = None) -> TunerState:
    """Prepare ``model`` for LayerNorm tuning in place and return what was done.

    Sets ``requires_grad`` on exactly the norms' gains and biases and the head (off everywhere else), fingerprints
    the frozen base (every tensor but those and the head, before training) and keeps the state on the model.
    Calling it again keeps the fingerprint taken the first time, from the base rather than the trained model.
    """
    config = config if config is not None else LNTuningMethodConfig()
    previous = get_tuner_state(model)
    for handle in (previous.mask_handles if previous is not None else []):
        handle.remove()
    selection = resolve_ln_tuning(model, config)
    check_selected_are_float(model, selection.parameter_names)  # e.g. a head the quantizer packed
    if previous is not None and previous.config.method == config.method:
        # applied again: keep what was taken from the base, not from the trained model
        fingerprint, sketch = previous.fingerprint, previous.base_sketch
    else:  # before training, over every tensor but the trained ones and the head
        exclude = set(selection.parameter_names)
        fingerprint = base_fingerprint(model, exclude=exclude, head_modules=selection.head_modules)
        sketch = base_sketch(model, exclude=exclude, head_modules=selection.head_modules)
    trained = set(selection.parameter_names)
    for name, param in model.named_parameters():
        param.requires_grad_(name in trained)
    state = TunerState(selection, {}, fingerprint)
    state.base_sketch = sketch  # recognises this base loaded another way (adapters/base_check.py)
    set_tuner_state(model, state)
    return state


def peft_model(model: nn.Module, config, modules_to_save: List[str], task_type: Optional[str]):
    """Method.peft_model: ``model`` (a stock base with the adapter applied: norms and head) as a ``peft`` LN tuning
    model, ``peft.LNTuningConfig`` targeting exactly the trained norms, the head in ``modules_to_save``.

    peft's LN tuning layer trains a copy of each target module taken when it wraps it; the model given holds the
    trained norms already, so the copies (what the PEFT adapter stores) are the trained ones, and the loaded PEFT
    adapter computes exactly what the bitfit-hf one does. Changes ``model`` in place."""
    import peft

    model = unwrap(model)
    modules = dict(model.named_modules())
    state = get_tuner_state(model)
    heads = list(state.selection.head_modules) if state is not None else list(config.head_modules or [])
    norms = [m for m in modules_to_save if m in modules and is_norm(modules[m]) and not is_under(m, heads)]
    saved = [m for m in modules_to_save if m not in norms]
    if not norms:
        raise SelectionError("This adapter trains no normalisation layer: there is nothing for PEFT's LN tuning "
                             "tuner to hold.")
    if hasattr(model, "peft_config"):  # left by an earlier peft wrapping; get_peft_model starts afresh
        del model.peft_config
    peft_config = peft.LNTuningConfig(task_type=task_type, target_modules=norms, modules_to_save=saved or None)
    with warnings.catch_warnings():  # peft names only nn.LayerNorm-like layers; an RMSNorm copy works the same
        warnings.filterwarnings("ignore", message="Unsupported layer type", category=UserWarning)
        return peft.get_peft_model(model, peft_config)
