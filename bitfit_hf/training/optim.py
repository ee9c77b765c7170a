"""Optimizer parameter groups for a BitFit selection.

Biases never take weight decay (the paper trains them without it); other selected tensors (the head's
weights, weights chosen by ``patterns``) follow ``Trainer``'s decay rule. Each group carries its own
learning rate, so ``bias_learning_rate`` and ``head_learning_rate`` need no custom optimizer.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional

from torch import nn

from bitfit_hf.tuners.bitfit.model import BitFitState, unwrap
from bitfit_hf.tuners.bitfit.selection import HEAD
from bitfit_hf.tuners.bitfit_lora.config import LORA

#: Roles of methods built on BitFit whose tensors get a group of their own, named after the role.
OWN_GROUP_ROLES = (LORA,)


def parameter_groups(
    model: nn.Module,
    state: BitFitState,
    learning_rate: float,
    weight_decay: float,
    decay_parameter_names: Iterable[str],
) -> List[Dict[str, Any]]:
    """The non-empty groups ``bias``, ``pattern_decay``, ``head``, ``head_decay`` (and ``lora`` /
    ``lora_decay`` for BitFit + LoRA), each with
    ``params``, ``lr`` (``config.learning_rate_for(role)``, else ``learning_rate``), ``weight_decay``
    and ``name``; a kind whose roles have several rates gets one group per rate (``bias@lr=...``)."""
    cfg = state.config
    role_of = {entry.name: entry.role for entry in state.selection.entries}
    decay = set(decay_parameter_names)
    groups: Dict[tuple, Dict[str, Any]] = {}
    for name, param in unwrap(model).named_parameters():
        if name not in role_of or not param.requires_grad:
            continue
        role = role_of[name]
        decays = name in decay and not name.endswith("bias")
        kind = "head" if role == HEAD else role if role in OWN_GROUP_ROLES else "pattern" if decays else "bias"
        key = kind + ("_decay" if decays else "")
        lr = cfg.learning_rate_for(role) or learning_rate
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
