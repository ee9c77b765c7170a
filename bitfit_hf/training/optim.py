"""Optimizer parameter groups for a BitFit selection.

Biases never take weight decay (the paper trains them without it); other selected tensors (the head's
weights, weights chosen by ``patterns``) follow ``Trainer``'s decay rule. Each group carries its own
learning rate, so ``bias_learning_rate``, ``head_learning_rate`` and layer-wise decay need no custom
optimizer.

Tensors a method trains only in some entries (``state.sparse_indices``: the random-subset baselines)
take no weight decay either, since decoupled decay would shrink their frozen entries, and
:func:`keep_untrained_entries` puts those entries back after every step of any optimizer.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional

import torch
from torch import nn

from bitfit_hf.tuners.bitfit.model import BitFitState, unwrap
from bitfit_hf.tuners.bitfit.selection import HEAD, layer_depths

_GUARD_ATTR = "_bitfit_untrained_entries_guard"


def parameter_groups(
    model: nn.Module,
    state: BitFitState,
    learning_rate: float,
    weight_decay: float,
    decay_parameter_names: Iterable[str],
) -> List[Dict[str, Any]]:
    """The non-empty groups ``bias``, ``sparse`` (tensors trained in some entries only),
    ``pattern_decay``, ``head`` and ``head_decay``, plus one group per role in the config's
    ``own_group_roles`` (BitFit + LoRA: ``lora`` / ``lora_decay``), each with ``params``, ``lr``
    (``config.learning_rate_for(role)``, else ``learning_rate``, times ``config.layer_lr_scale(role,
    depth)`` where the config has it), ``weight_decay`` and ``name``; a kind whose tensors have several
    rates gets one group per rate (``bias@lr=...``)."""
    cfg = state.config
    role_of = {entry.name: entry.role for entry in state.selection.entries}
    depth_of = layer_depths(state.selection)
    scale = getattr(cfg, "layer_lr_scale", None)
    sparse = set(getattr(state, "sparse_indices", None) or {})
    own_groups = tuple(getattr(cfg, "own_group_roles", ()))  # roles a method trains at a rate of their own
    decay = set(decay_parameter_names) - sparse
    groups: Dict[tuple, Dict[str, Any]] = {}
    for name, param in unwrap(model).named_parameters():
        if name not in role_of or not param.requires_grad:
            continue
        role = role_of[name]
        decays = name in decay and not name.endswith("bias")
        kind = ("head" if role == HEAD else role if role in own_groups else "sparse" if name in sparse
                else "pattern" if decays else "bias")
        key = kind + ("_decay" if decays else "")
        lr = cfg.learning_rate_for(role) or learning_rate
        if scale is not None:
            lr = lr * scale(role, depth_of.get(name, 0))
        group = groups.setdefault((key, lr), _group(key, lr, weight_decay if decays else 0.0))
        group["params"].append(param)
    rates: Dict[str, int] = {}
    for key, _ in groups:
        rates[key] = rates.get(key, 0) + 1
    for (key, lr), group in groups.items():
        if rates[key] > 1:  # e.g. layer-wise rates: one group per rate, named by it
            group["name"] = f"{key}@lr={lr:g}"
    return list(groups.values())


def without_names(groups: List[Dict[str, Any]], extra: Optional[Dict[str, Any]] = None) -> List[Dict[str, Any]]:
    """The groups as a ``torch.optim`` constructor takes them (no ``name`` key)."""
    return [{k: v for k, v in group.items() if k != "name"} | dict(extra or {}) for group in groups]


def _group(name: str, lr: float, weight_decay: float) -> Dict[str, Any]:
    return {"params": [], "weight_decay": weight_decay, "lr": lr, "name": name}


def keep_untrained_entries(optimizer, model: nn.Module, state: BitFitState) -> int:
    """Make ``optimizer.step()`` leave the untrained entries of partially trained tensors bit-identical.

    Gradient masks keep those entries' gradients at zero, but an optimizer may still move them
    (decoupled weight decay, a user-supplied optimizer with its own groups). A pre-step hook copies the
    watched tensors, a post-step hook writes the untrained entries back. Only tensors this optimizer
    steps directly are watched (DeepSpeed steps flat copies: there the zero-decay groups and the gradient
    masks keep them). Returns the number of tensors watched; installing twice is a no-op.
    """
    sparse = getattr(state, "sparse_indices", None) or {}
    if not sparse or getattr(optimizer, _GUARD_ATTR, None) is not None:
        return 0
    params = dict(unwrap(model).named_parameters())
    stepped = {id(p) for group in getattr(optimizer, "param_groups", []) for p in group["params"]}
    watched = []
    for name, indices in sparse.items():
        param = params.get(name)
        if param is None or id(param) not in stepped:
            continue
        trained = torch.zeros(param.numel(), dtype=torch.bool, device=param.device)
        trained[indices.to(param.device)] = True
        watched.append((param, trained.view(param.shape)))
    if not watched:
        return 0
    saved: List[torch.Tensor] = []

    def before_step(opt, args, kwargs):
        saved[:] = [param.detach().clone() for param, _ in watched]

    def after_step(opt, args, kwargs):
        with torch.no_grad():
            for (param, trained), before in zip(watched, saved):
                param.copy_(torch.where(trained, param, before))
        saved.clear()

    handles = (optimizer.register_step_pre_hook(before_step), optimizer.register_step_post_hook(after_step))
    setattr(optimizer, _GUARD_ATTR, handles)
    return len(watched)

