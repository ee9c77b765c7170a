"""Walk the network for a random baseline: count the reference, draw the entries, mask the gradients."""

from __future__ import annotations

from typing import Dict, List, Optional

import torch
from torch import nn

from bitfit_hf.tuners.bias.config import BitFitConfig
from bitfit_hf.tuners.bias.model import BitFitState
from bitfit_hf.tuners.bias.selection import (
    HEAD,
    Selection,
    TrainedTensor,
    count_layers,
    detect_head_modules,
    resolve,
)
from bitfit_hf.tuners.grad_mask import GradMask
from bitfit_hf.tuners.random_subset.config import RandomSubsetConfig
from bitfit_hf.tuners.random_subset.draw import candidate_weights, draw_rows_cols, draw_uniform
from bitfit_hf.tuners.roles import ARCHITECTURE_ROLES, match_role, roles_for
from bitfit_hf.tuners.state import get_tuner_state, set_tuner_state
from bitfit_hf.utils.errors import UserError
from bitfit_hf.utils.fingerprint import base_fingerprint
from bitfit_hf.utils.names import is_under
from bitfit_hf.utils.zero import full_numel, zero3_enabled

RANDOM = "random"  # the role of a weight matrix trained in random entries


class UnsupportedSetupError(UserError, ValueError):
    """A random baseline was asked to run where its masks cannot be kept exact."""


class RandomSubsetState(BitFitState):
    """:class:`BitFitState` plus the drawn entries: ``sparse_indices`` maps each partially trained weight
    to the sorted flat indices of its trained entries (what the adapter stores)."""

    def __init__(self, selection: Selection, fingerprint: str, sparse_indices: Dict[str, torch.Tensor],
                 reference_count: int):
        super().__init__(selection, {}, fingerprint)
        self.sparse_indices = sparse_indices
        self.reference_count = reference_count

    def use_indices(self, model: nn.Module, sparse_indices: Dict[str, torch.Tensor]) -> None:
        """Train exactly these entries (an adapter's recorded ones) instead of the drawn ones."""
        self.sparse_indices = {name: indices.to(torch.int64) for name, indices in sparse_indices.items()}
        _mask_gradients(model, self)


def reference_count(model: nn.Module, config: RandomSubsetConfig) -> int:
    """Scalars the reference BitFit selection trains outside the head (biases it would add included)."""
    reference = BitFitConfig(bias_terms=config.bias_terms, patterns=config.patterns, train_head=False,
                             head_modules=config.head_modules, add_missing_biases=config.add_missing_biases)
    return resolve(model, reference).trainable_numel


def _layer_of(model_type: str, parameter: str) -> str:
    """The layer label of a weight, from the architecture's role table (``""`` outside the layers)."""
    if model_type not in ARCHITECTURE_ROLES:
        return ""
    module = parameter.rpartition(".")[0]
    for rules in roles_for(model_type).values():
        for rule in rules:
            layer = match_role(rule, module)
            if layer is not None:
                return layer
    return ""


def apply_random_subset(model: nn.Module, config: Optional[RandomSubsetConfig] = None) -> RandomSubsetState:
    """Prepare ``model`` in place for a random baseline and return what was done.

    Counts the reference selection, draws that many entries of the weight matrices with the config's
    seed, sets ``requires_grad`` on those matrices (and the head) only, and zeroes every gradient entry
    outside the draw. The optimizer side (no weight decay, untouched entries restored after each step)
    is in :mod:`bitfit_hf.training.optim`.
    """
    config = config if config is not None else RandomSubsetConfig()
    if zero3_enabled() or any(hasattr(p, "ds_id") for p in model.parameters()):
        raise UnsupportedSetupError(
            f"{config.method} under DeepSpeed ZeRO-3 is not supported: ZeRO-3 partitions the weight matrices "
            "whose entries are masked. Use DDP or ZeRO-1/2 (accelerate_configs/cpu_ddp.yaml, "
            "cpu_deepspeed_zero2.yaml) for the random baselines."
        )
    previous = get_tuner_state(model)
    if previous is not None:
        for handle in previous.mask_handles:
            handle.remove()
    model_type = getattr(getattr(model, "config", None), "model_type", "") or ""
    head_modules = list(config.head_modules) if config.head_modules is not None else detect_head_modules(model)
    count = reference_count(model, config)
    candidates = candidate_weights(model, head_modules)
    draw = draw_uniform if config.draw == "uniform" else draw_rows_cols
    indices = draw(candidates, count, config.random_seed)

    params = dict(model.named_parameters())
    entries: List[TrainedTensor] = [
        TrainedTensor(name, RANDOM, _layer_of(model_type, name), int(chosen.numel()))
        for name, chosen in indices.items()
    ]
    if config.train_head:
        entries += [TrainedTensor(n, HEAD, "", full_numel(p)) for n, p in params.items()
                    if is_under(n, head_modules)]
    total = sum(full_numel(p) for p in params.values())
    layers = count_layers(model_type, (name for name, _ in model.named_modules()))  # for layer-wise rates
    selection = Selection(config, model_type, entries, {}, head_modules, total, layers)
    fingerprint = previous.fingerprint if previous is not None else None
    if fingerprint is None:
        fingerprint = base_fingerprint(model, exclude=set(selection.parameter_names), head_modules=head_modules)
    trained = set(selection.parameter_names)
    for name, param in params.items():
        param.requires_grad_(name in trained)
    state = RandomSubsetState(selection, fingerprint, indices, count)
    _mask_gradients(model, state)
    set_tuner_state(model, state)
    return state


def _mask_gradients(model: nn.Module, state: RandomSubsetState) -> None:
    """Zero every gradient entry outside the drawn ones."""
    for handle in state.mask_handles:
        handle.remove()
    state.mask_handles = []
    params = dict(model.named_parameters())
    for name, indices in state.sparse_indices.items():
        param = params[name]
        trained = torch.zeros(param.numel(), dtype=torch.bool, device=param.device)
        trained[indices.to(param.device)] = True
        trained = trained.view(param.shape)
        state.mask_handles.append(param.register_hook(GradMask(trained)))
