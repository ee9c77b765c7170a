"""Walk the network: put a token shift on every FFN output projection, train exactly AdapterBias's
tensors, and remember the selection (the :class:`~bitfit_hf.tuners.state.TunerState` every method
returns, so the trainer, the adapter format and the reports work unchanged).

The projections are found through the per-architecture role tables: the modules of role ``b_m3``
(the MLP output projection, whose input is the FFN's intermediate activation ``h``). An architecture
without that role is refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from bitfit_hf.tuners.adapterbias import l0
from bitfit_hf.tuners.adapterbias.config import ALPHA, GAIN_PREFIX, GATE, VECTOR, AdapterBiasConfig
from bitfit_hf.tuners.adapterbias.layer import (
    CHILD,
    SHARED_ALPHA,
    TokenShift,
    attach,
    attached,
    is_gated,
    new_alpha,
    projection_sizes,
)
from bitfit_hf.tuners.roles import ARCHITECTURE_ROLES, match_role
from bitfit_hf.tuners.routes import ANY_SHIFT, Route
from bitfit_hf.tuners.state import (
    HEAD,
    Selection,
    TrainedTensor,
    TunerState,
    detect_head_modules,
    get_tuner_state,
    set_tuner_state,
)
from bitfit_hf.utils.fingerprint import base_fingerprint
from bitfit_hf.utils.modes import inserted_modules_follow
from bitfit_hf.utils.names import is_under
from bitfit_hf.utils.zero import full_numel

FFN_OUTPUT_ROLE = "b_m3"


def _model_type(model: nn.Module) -> str:
    return getattr(getattr(model, "config", None), "model_type", "") or ""


def ffn_output_projections(model: nn.Module, head_modules: List[str]) -> List[Tuple[str, str, nn.Module]]:
    """``(module name, layer, module)`` of every FFN output projection, in model order."""
    model_type = _model_type(model)
    table = ARCHITECTURE_ROLES.get(model_type)
    if not table or FFN_OUTPUT_ROLE not in table:
        known = sorted(t for t, roles in ARCHITECTURE_ROLES.items() if FFN_OUTPUT_ROLE in roles)
        raise ValueError(
            f"AdapterBias puts its shift on each layer's FFN output projection (role {FFN_OUTPUT_ROLE}), and "
            f"bitfit-hf knows no such module for model_type {model_type or type(model).__name__!r}. "
            f"Architectures with an FFN output role: {', '.join(known)}."
        )
    found = []
    for name, module in model.named_modules():
        if is_under(name, head_modules) or CHILD in name.split("."):
            continue
        for rule in table[FFN_OUTPUT_ROLE]:
            layer = match_role(rule, name)
            if layer is not None:
                found.append((name, layer, module))
                break
    if not found:
        raise ValueError(f"This {model_type} model has no module matching the FFN output role {FFN_OUTPUT_ROLE}: "
                         "AdapterBias has nowhere to put its shift.")
    return found


def _shift_root(model: nn.Module) -> nn.Module:
    """Where a shared ``L_alpha`` lives: the base model (``bert``, ``model``, ...), never beside the head."""
    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, prefix, None) if prefix else None
    return base if isinstance(base, nn.Module) else model


def insert_shifts(model: nn.Module, config: AdapterBiasConfig) -> Dict[str, TokenShift]:
    """Insert the shift modules (zero ``v``) the config describes, unless they are there already;
    returns ``{projection name: shift}``. Used before an adapter's tensors are loaded, too. The shifts take
    the model's mode (``train()`` / ``eval()``)."""
    with inserted_modules_follow(model):
        return _insert_shifts(model, config)


def _insert_shifts(model: nn.Module, config: AdapterBiasConfig) -> Dict[str, TokenShift]:
    heads = list(config.head_modules) if config.head_modules is not None else detect_head_modules(model)
    projections = ffn_output_projections(model, heads)
    root = _shift_root(model)
    shared: Optional[nn.Linear] = getattr(root, SHARED_ALPHA, None)
    existing = [attached(module) for _, _, module in projections]
    if any(s is not None for s in existing):
        kinds = {s.shared for s in existing if s is not None}
        if None in existing or kinds != {config.share_alpha}:
            raise ValueError(
                f"This model already holds AdapterBias shifts with share_alpha={not config.share_alpha}; an adapter "
                f"with share_alpha={config.share_alpha} needs another copy of the base model."
            )
        gated = {is_gated(s.alpha_module()) for s in existing}
        if gated != {config.gated}:
            have, want = ("L0 gates", "none") if True in gated else ("no L0 gates", "L0 gates (an l0_lambda run)")
            raise ValueError(f"This model already holds AdapterBias shifts with {have}; this configuration needs "
                             f"{want}. Use another copy of the base model.")
        return {name: attached(module) for name, _, module in projections}
    sizes = {projection_sizes(module) for _, _, module in projections}
    if config.share_alpha and shared is None:
        d_ffs = {d_ff for d_ff, _ in sizes}
        if len(d_ffs) != 1:
            raise ValueError(f"share_alpha needs one FFN width across layers; this model has {sorted(d_ffs)}.")
        like = projections[0][2].weight
        shared = new_alpha(d_ffs.pop(), config.alpha_init_seed, like, config.gated)
        root.add_module(SHARED_ALPHA, shared)
    shifts = {}
    for index, (name, _, module) in enumerate(projections):
        d_ff, d = projection_sizes(module)
        shift = TokenShift(d, module.weight, alpha=shared if config.share_alpha else None, d_ff=d_ff,
                           seed=config.alpha_init_seed + index, gated=config.gated)
        attach(module, shift)
        shifts[name] = shift
    return shifts


def resolve_adapterbias(model: nn.Module, config: AdapterBiasConfig, total_params: int) -> Selection:
    """The exact trained tensors: every ``v`` and ``L_alpha``, the norms of ``norm_roles`` (gain and
    bias), and the head."""
    model_type = _model_type(model)
    heads = list(config.head_modules) if config.head_modules is not None else detect_head_modules(model)
    modules = dict(model.named_modules())
    missing = [m for m in heads if m not in modules]
    if missing:
        raise ValueError(f"head_modules {missing} are not modules of this model.")
    params = dict(model.named_parameters())
    entries: List[TrainedTensor] = []

    def take(name: str, role: str, layer: str = "") -> None:
        entries.append(TrainedTensor(name, role, layer, full_numel(params[name])))

    root_name = next(n for n, m in modules.items() if m is _shift_root(model))
    for name, layer, _ in ffn_output_projections(model, heads):
        take(f"{name}.{CHILD}.vector", VECTOR, layer)
        if not config.share_alpha:
            take(f"{name}.{CHILD}.alpha.weight", ALPHA, layer)
            take(f"{name}.{CHILD}.alpha.bias", ALPHA, layer)
            if config.gated:
                take(f"{name}.{CHILD}.alpha.{l0.GATE}.log_alpha", GATE, layer)
    if config.share_alpha:
        prefix = f"{root_name}.{SHARED_ALPHA}" if root_name else SHARED_ALPHA
        take(f"{prefix}.weight", ALPHA)
        take(f"{prefix}.bias", ALPHA)
        if config.gated:
            take(f"{prefix}.{l0.GATE}.log_alpha", GATE)

    table = ARCHITECTURE_ROLES[model_type]
    for role in config.norm_roles:
        for name, module in modules.items():
            if is_under(name, heads):
                continue
            for rule in table.get(role, []):
                layer = match_role(rule, name)
                if layer is None:
                    continue
                for attr, kind in (("weight", GAIN_PREFIX + role[2:]), ("bias", role)):
                    if isinstance(getattr(module, attr, None), nn.Parameter):
                        take(f"{name}.{attr}", kind, layer)
                break
    if config.train_head:
        covered = {e.name for e in entries}
        for name in params:
            if is_under(name, heads) and name not in covered:
                take(name, HEAD)
    return Selection(config, model_type, entries, {}, heads, total_params)


def apply_adapterbias(model: nn.Module, config: Optional[AdapterBiasConfig] = None) -> TunerState:
    """Prepare ``model`` for AdapterBias in place and return what was done.

    Inserts the shifts (``v = 0``: outputs unchanged), sets ``requires_grad`` on exactly the trained
    tensors and off everywhere else, and fingerprints the frozen base weights.
    """
    config = config or AdapterBiasConfig()
    previous = get_tuner_state(model)
    for handle in (previous.mask_handles if previous is not None else []):
        handle.remove()
    if previous is not None and previous.config.method != config.method:
        previous = None  # another method's fingerprint excludes other tensors
    total = sum(full_numel(p) for n, p in model.named_parameters()
                if CHILD not in n.split(".") and SHARED_ALPHA not in n.split("."))
    insert_shifts(model, config)
    selection = resolve_adapterbias(model, config, total)
    fingerprint = previous.fingerprint if previous is not None else None
    if fingerprint is None:
        fingerprint = base_fingerprint(model, exclude=set(selection.parameter_names), head_modules=selection.head_modules)
    trained = set(selection.parameter_names)
    for name, param in model.named_parameters():
        param.requires_grad_(name in trained)
    state = AdapterBiasState(selection, dict(previous.added_biases) if previous is not None else {}, fingerprint)
    state.gates = tuple(l0.gates_of(model).values()) if config.gated else ()
    set_tuner_state(model, state)
    return state


class AdapterBiasState(TunerState):
    """:class:`TunerState` plus the L0 gates of an ``l0_lambda`` run (none otherwise): the summary states how many
    of ``L_alpha``'s input weights they keep, and how many values the released adapter stores (the gates train
    but are folded into ``L_alpha`` at save, so they count as trained, not as stored)."""

    gates: Tuple[l0.HardConcreteGate, ...] = ()

    @property
    def summary(self):
        summary = super().summary
        if self.gates:
            counts = l0.gate_counts(self.gates)
            summary.notes["l0"] = {"l0_lambda": self.config.l0_lambda, **counts,
                                   "stored_params": summary.trainable_params - counts["gated"]}
        return summary


def l0_penalty(model: nn.Module, state: Any) -> Optional[torch.Tensor]:
    """Method.penalty: ``l0_lambda`` times the expected number of open gates in the last training forward
    (None without gates, or when no training forward ran)."""
    gates = getattr(state, "gates", None) or []
    total = l0.penalty(gates) if gates else None
    return None if total is None else state.config.l0_lambda * total


def release_adapter(config: AdapterBiasConfig, tensors: Dict[str, torch.Tensor]):
    """Method.release: an L0 run's adapter with its gates folded into ``L_alpha`` (pruned weights exact zeros,
    no ``log_alpha`` stored), and the config it loads with (``l0_folded``: the gates' counts). Other configs as
    they are."""
    if not config.gated:
        return config, tensors
    suffix = f".{l0.GATE}.log_alpha"
    counts = {"gated": 0, "active": 0, "expected_active": 0.0}
    for name, log_alpha in tensors.items():
        if name.endswith(suffix):
            counts["gated"] += log_alpha.numel()
            counts["active"] += int((l0.deterministic_gate(log_alpha) > 0).sum())
            counts["expected_active"] += float(l0.expected_l0(log_alpha))
    counts["expected_active"] = round(counts["expected_active"], 1)
    return dataclasses.replace(config, l0_folded=counts), l0.fold_gates(tensors)


def adapterbias_tensor_role(name: str) -> Optional[str]:
    """The role of a stored tensor of AdapterBias's shifts (``ab_v`` / ``ab_alpha``), None for any other."""
    parts = name.split(".")
    if l0.GATE in parts:
        return GATE
    if CHILD in parts:
        return VECTOR if parts[-1] == "vector" else ALPHA
    if SHARED_ALPHA in parts:
        return ALPHA
    return None


def adapterbias_route(name: str) -> Optional[Route]:
    """Method.route: a shift vector ``v`` and its ``L_alpha`` (``w`` and ``c``) act on their projection's output;
    a shared ``L_alpha`` on every projection with a vector. None for a gate's ``log_alpha`` (never stored: folded
    at save) and any other tensor."""
    parts = name.split(".")
    if l0.GATE in parts:
        return None
    slot = {"vector": "v", "weight": "w", "bias": "c"}.get(parts[-1])
    if CHILD in parts and slot:
        return Route(".".join(parts[: parts.index(CHILD)]), "shift", slot)
    if SHARED_ALPHA in parts and slot in ("w", "c"):
        return Route(ANY_SHIFT, "shift", slot)
    return None
