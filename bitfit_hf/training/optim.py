"""Optimizer parameter groups for a method's selection.

Biases never take weight decay (the paper trains them without it); other selected tensors (the head's
weights, weights chosen by ``patterns``) follow ``Trainer``'s decay rule. Each group carries its own
learning rate, so ``bias_learning_rate``, ``head_learning_rate`` and layer-wise decay need no custom
optimizer.

Tensors a method trains only in some entries (``state.sparse_indices``: the random-subset baselines)
take no weight decay either, since decoupled decay would shrink their frozen entries, and
:func:`keep_untrained_entries` puts those entries back after every step of any optimizer. Their optimizer
state is checkpointed for the trained entries only (:func:`compact_sparse_state`).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional

import torch
from torch import nn

from bitfit_hf.tuners.bias.selection import HEAD, layer_depths
from bitfit_hf.tuners.state import TunerState as BitFitState
from bitfit_hf.tuners.state import unwrap

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


def foreach_on_cpu(optimizer_kwargs: Dict[str, Any], groups: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The optimizer keyword arguments for these groups: ``fused=True`` over CPU tensors only becomes
    ``foreach=True``; anything else (a GPU, ``--optim adamw_torch``) is returned unchanged.

    The default optim (``adamw_torch_fused``) on a CPU opens one OpenMP region per tensor, and BitFit trains
    ~100 tiny tensors: on a shared 2-core CPU that cost 1.38x -> 1.10x of full FT's speed
    (benchmarks/README.md). foreach computes the same AdamW update with no parallel region. On a GPU the
    fused kernel is what the flag asks for, and it is kept."""
    if optimizer_kwargs.get("fused") and all(p.device.type == "cpu" for g in groups for p in g["params"]):
        return {**optimizer_kwargs, "fused": False, "foreach": True}
    return optimizer_kwargs


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



_COMPACT_ATTR = "_bitfit_compact_sparse_state"
COMPACT_KEY = "bitfit_sparse_state"  # in a saved optimizer state dict: which entries hold trained entries only


def compact_sparse_state(optimizer, model: nn.Module, state: BitFitState) -> bool:
    """Make ``optimizer.state_dict()`` (what a checkpoint's ``optimizer.pt`` holds) keep, for each tensor trained
    in some entries only, the state of those entries (AdamW's ``exp_avg`` / ``exp_avg_sq``: one value per trained
    entry instead of one per entry of the matrix), and ``optimizer.load_state_dict`` put them back in place.

    Lossless by construction: the untrained entries' gradients are masked to zero, so their moments stay zero;
    a state tensor with any non-zero untrained entry (another optimizer) is saved dense as before. The state
    the optimizer steps with in memory is unchanged. Returns whether it was installed (a no-op for methods
    that train whole tensors, and when installed already)."""
    if not getattr(state, "sparse_indices", None) or getattr(optimizer, _COMPACT_ATTR, False):
        return False
    inner = unwrap(model)
    save, load = optimizer.state_dict, optimizer.load_state_dict

    def sparse_params():
        """``[(index in the state dict, param, name, flat indices)]`` of the partially trained tensors."""
        names = {id(p): n for n, p in inner.named_parameters()}
        indices = state.sparse_indices
        ordered = [p for group in optimizer.param_groups for p in group["params"]]
        return [(i, p, names[id(p)], indices[names[id(p)]]) for i, p in enumerate(ordered)
                if names.get(id(p)) in indices]

    def state_dict():
        saved = save()
        entries, packed = dict(saved["state"]), {}
        for index, param, name, indices in sparse_params():
            if index not in entries:
                continue
            entry, keys = dict(entries[index]), []
            for key, value in entry.items():
                if not (isinstance(value, torch.Tensor) and value.shape == param.shape and value.numel() > indices.numel()):
                    continue
                flat = value.detach().reshape(-1)
                where = indices.to(flat.device)
                untrained = torch.ones(flat.numel(), dtype=torch.bool, device=flat.device)
                untrained[where] = False
                if torch.count_nonzero(flat[untrained]):
                    continue  # not zero outside the trained entries: keep it dense
                entry[key] = flat[where].clone()
                keys.append(key)
            if keys:
                entries[index] = entry
                packed[index] = {"name": name, "keys": keys, "shape": list(param.shape)}
        if not packed:
            return saved
        return {**saved, "state": entries, COMPACT_KEY: packed}

    def load_state_dict(saved):
        packed = saved.get(COMPACT_KEY) if isinstance(saved, dict) else None
        if packed:
            entries = dict(saved["state"])
            found = {name: (index, param, indices) for index, param, name, indices in sparse_params()}
            for index, info in packed.items():
                _, param, indices = found[info["name"]]
                entry = dict(entries[int(index)])
                for key in info["keys"]:
                    values = entry[key]
                    dense = torch.zeros(param.numel(), dtype=values.dtype, device=values.device)
                    dense[indices.to(values.device)] = values
                    entry[key] = dense.view(info["shape"])
                entries[int(index)] = entry
            saved = {k: v for k, v in saved.items() if k != COMPACT_KEY}
            saved["state"] = entries
        return load(saved)

    optimizer.state_dict = state_dict
    optimizer.load_state_dict = load_state_dict
    setattr(optimizer, _COMPACT_ATTR, True)
    return True
