"""L0 regularisation of ``L_alpha``'s input weights: hard-concrete gates (Louizos, Welling & Kingma, ICLR 2018).

The AdapterBias paper prunes ``L_alpha`` (the linear layer ``R^{d_ff} -> R``) with an L0 penalty; the official
code never released it. Each input weight ``w_i`` gets a gate ``z_i`` in ``[0, 1]`` with a trained location
``log_alpha_i``; the layer uses ``w * z``:

* training: ``z`` is sampled from the hard-concrete distribution (a stretched, clamped binary concrete), so
  exact zeros and ones occur and the gradient still reaches ``log_alpha`` through the reparameterisation;
* evaluation: ``z = clamp(sigmoid(log_alpha) * (zeta - gamma) + gamma, 0, 1)``, the paper's deterministic
  estimator, so evaluation is repeatable;
* penalty: the expected number of non-zero gates, ``sum(sigmoid(log_alpha - beta * log(-gamma / zeta)))``,
  which the trainer adds to the loss times ``l0_lambda``.

A saved adapter keeps no gate: :func:`fold_gates` multiplies each weight by its deterministic gate (pruned
weights become exact zeros), so the adapter is a plain AdapterBias adapter that reproduces the evaluated model.
"""

from __future__ import annotations

import math
from typing import Dict, Iterable, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

BETA, GAMMA, ZETA = 2.0 / 3.0, -0.1, 1.1  # the paper's temperature and stretch interval
# Every gate starts open: deterministic value 1 (that needs sigmoid(log_alpha) >= 11/12, log_alpha >= 2.40),
# non-zero in ~99% of the training samples, so the gated layer starts as the ungated one and only the
# penalty and the task loss decide which weights close.
INIT_LOG_ALPHA = 3.0
_EPS = 1e-6  # keeps the uniform sample off 0 and 1 (log of 0)
_SHIFT = BETA * math.log(-GAMMA / ZETA)

GATE = "l0_gate"  # the gate's name under its L_alpha: <alpha>.l0_gate.log_alpha


class HardConcreteGate(nn.Module):
    """One hard-concrete gate per input weight of ``L_alpha``; calling it returns the gate values ``z``."""

    def __init__(self, size: int, like: torch.Tensor):
        super().__init__()
        dtype = like.dtype if like.is_floating_point() else torch.float32
        self.log_alpha = nn.Parameter(torch.full((size,), INIT_LOG_ALPHA, device=like.device, dtype=dtype))
        # The expected L0 of the last training forward, computed while the gate is called, so that DeepSpeed
        # ZeRO-3 (which gathers a module's parameters only while it is called) sees the real log_alpha.
        self.last_expected_l0: Optional[torch.Tensor] = None

    def forward(self) -> torch.Tensor:
        log_alpha = self.log_alpha.float()
        if self.training:
            u = torch.rand_like(log_alpha).clamp_(_EPS, 1 - _EPS)
            s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / BETA)
            self.last_expected_l0 = expected_l0(log_alpha)
            return (s * (ZETA - GAMMA) + GAMMA).clamp(0.0, 1.0)
        return deterministic_gate(log_alpha)

    def deterministic(self) -> torch.Tensor:
        """The evaluation gates (no sampling), whatever the module's mode."""
        return deterministic_gate(self.log_alpha.detach())


def deterministic_gate(log_alpha: torch.Tensor) -> torch.Tensor:
    """The paper's test-time gate ``clamp(sigmoid(log_alpha) * (zeta - gamma) + gamma, 0, 1)``: exact zeros below
    ``log_alpha = -2.40``, exact ones above ``+2.40``."""
    return (torch.sigmoid(log_alpha.float()) * (ZETA - GAMMA) + GAMMA).clamp(0.0, 1.0)


def expected_l0(log_alpha: torch.Tensor) -> torch.Tensor:
    """The expected number of non-zero gates: ``sum P(z_i != 0)``."""
    return torch.sigmoid(log_alpha.float() - _SHIFT).sum()


class GatedAlpha(nn.Linear):
    """``L_alpha`` whose input weights pass through hard-concrete gates: ``h @ (w * z) + b``. The gate is a child
    module called from here (DeepSpeed ZeRO-3 gathers it then), and ``weight`` / ``bias`` keep ``nn.Linear``'s
    names, so a folded adapter loads into a plain ``nn.Linear``."""

    def __init__(self, linear: nn.Linear):
        super().__init__(linear.in_features, linear.out_features, device="meta")
        self.weight, self.bias = linear.weight, linear.bias
        self.add_module(GATE, HardConcreteGate(linear.in_features, linear.weight))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        gate = getattr(self, GATE)()
        return F.linear(hidden, gated_weight(self.weight, gate), self.bias)


def gated_weight(weight: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``weight * gate`` (gates over the input dimension), in the weight's dtype; the one place the product is
    computed, so a folded weight equals the evaluated one bit for bit."""
    return weight * gate.to(weight.dtype)


def gates_of(model: nn.Module) -> Dict[str, HardConcreteGate]:
    """``{module name: gate}`` of a model."""
    return {name: module for name, module in model.named_modules() if isinstance(module, HardConcreteGate)}


def penalty(gates: Iterable[HardConcreteGate]) -> Optional[torch.Tensor]:
    """The expected L0 of the gates in the last training forward (None: no training forward called them).
    A gate whose recorded value carries no gradient while one is wanted (a forward under reentrant activation
    checkpointing) is recomputed from its parameter."""
    terms: List[torch.Tensor] = []
    for gate in gates:
        recorded, gate.last_expected_l0 = gate.last_expected_l0, None
        if recorded is None:
            continue
        if torch.is_grad_enabled() and gate.log_alpha.requires_grad and not recorded.requires_grad:
            recorded = expected_l0(gate.log_alpha)
        terms.append(recorded)
    return torch.stack(terms).sum() if terms else None


def gate_counts(gates: Iterable[HardConcreteGate]) -> Dict[str, float]:
    """``gated`` weights, ``active`` ones (deterministic gate above zero: stored non-zero) and
    ``expected_active`` (the expected L0, rounded to 0.1) of the gates now."""
    gates = list(gates)
    gated = sum(g.log_alpha.numel() for g in gates)
    active = sum(int((g.deterministic() > 0).sum()) for g in gates)
    expected = sum(float(expected_l0(g.log_alpha.detach())) for g in gates)
    return {"gated": gated, "active": active, "expected_active": round(expected, 1)}


def fold_gates(tensors: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """An adapter's tensors with every gate folded in: ``<alpha>.weight`` times its deterministic gate (pruned
    weights exact zeros), the ``log_alpha`` tensors dropped."""
    suffix = f".{GATE}.log_alpha"
    folded = {name: tensor for name, tensor in tensors.items() if not name.endswith(suffix)}
    for name, log_alpha in tensors.items():
        if name.endswith(suffix):
            weight_name = name[: -len(suffix)] + ".weight"
            folded[weight_name] = gated_weight(tensors[weight_name], deterministic_gate(log_alpha)).contiguous()
    return folded
