"""How one module changes: the token-dependent shift on an FFN output projection.

The projection (``nn.Linear``, GPT-2's ``Conv1D``, LLaMA's ``down_proj``) gets a child module
``token_shift`` (:class:`TokenShift`) and a forward hook: for an input ``h`` (the FFN's intermediate
activation, ``[..., d_ff]``) the projection's output ``[..., d]`` becomes ``output + L_alpha(h) * v``.
``v`` starts at zero, so the output is bit-identical to the stock module's until training moves it.

The shift is a module called from the hook (not a bare tensor expression) so that DeepSpeed ZeRO-3,
which gathers a module's partitioned parameters when the module is called, gathers ``v`` and
``L_alpha`` too. A shared ``L_alpha`` lives once on the base model and each shift holds an
unregistered reference to it, so its parameters have one name.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import nn

from bitfit_hf.tuners.adapterbias.l0 import GatedAlpha

CHILD = "token_shift"  # the shift's name under its projection: <projection>.token_shift.{vector,alpha.*}
SHARED_ALPHA = "token_shift_alpha"  # the shared L_alpha's name on the base model
HOOK_ATTR = "_adapterbias_hook"
# The names hold neither "bias" nor "norm": Trainer exempts parameters whose path contains those from
# weight decay, and the official code decays v and L_alpha's weight (only L_alpha's bias is exempt).


def projection_sizes(module: nn.Module) -> Tuple[int, int]:
    """``(d_ff, d)``: the input and output sizes of an FFN output projection."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf"):  # GPT-2: weight is [d_ff, d]
        return int(getattr(module, "nx", 0) or module.weight.shape[0]), int(module.nf)
    raise ValueError(
        f"AdapterBias shifts the output of a linear FFN output projection (nn.Linear or GPT-2's Conv1D); "
        f"this model's is a {type(module).__name__}."
    )


def new_alpha(d_ff: int, seed: int, like: torch.Tensor, gated: bool = False) -> nn.Linear:
    """``L_alpha: R^{d_ff} -> R`` with ``nn.Linear``'s default initialisation, drawn from a seeded
    generator (so the result does not depend on, or disturb, the global random state); ``gated``: with L0 gates
    on its input weights (the same initial weights)."""
    alpha = nn.Linear(d_ff, 1, device="meta")
    generator = torch.Generator().manual_seed(seed)
    # nn.Linear's reset_parameters: kaiming_uniform(a=sqrt(5)) on the weight = U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
    # and the bias from the same range.
    bound = 1.0 / math.sqrt(d_ff)
    weight = (torch.rand(1, d_ff, generator=generator) * 2 - 1) * bound
    bias = (torch.rand(1, generator=generator) * 2 - 1) * bound
    dtype = like.dtype if like.is_floating_point() else torch.float32
    alpha.weight = nn.Parameter(weight.to(device=like.device, dtype=dtype))
    alpha.bias = nn.Parameter(bias.to(device=like.device, dtype=dtype))
    return GatedAlpha(alpha) if gated else alpha


def is_gated(alpha: nn.Module) -> bool:
    return isinstance(alpha, GatedAlpha)


class TokenShift(nn.Module):
    """``alpha(h) * v`` for ``h`` of shape ``[..., d_ff]``: ``[..., d]``."""

    def __init__(self, d: int, like: torch.Tensor, alpha: Optional[nn.Linear] = None, d_ff: int = 0, seed: int = 0,
                 gated: bool = False):
        super().__init__()
        dtype = like.dtype if like.is_floating_point() else torch.float32
        self.vector = nn.Parameter(torch.zeros(d, device=like.device, dtype=dtype))
        self.shared = alpha is not None
        if alpha is None:
            self.alpha = new_alpha(d_ff, seed, like, gated)
        else:
            self._shared_alpha = (alpha,)  # a tuple: not registered here, so the shared one keeps one name

    def alpha_module(self) -> nn.Linear:
        return self._shared_alpha[0] if self.shared else self.alpha

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha_module()
        weight = alpha(hidden.to(alpha.weight.dtype) if not torch.is_autocast_enabled() else hidden)
        return weight * self.vector.to(weight.dtype)


def _add_shift(module: nn.Module, args, output):
    shift = getattr(module, CHILD)(args[0])
    return output + shift.to(output.dtype)


def attach(projection: nn.Module, shift: TokenShift) -> None:
    """Give ``projection`` the shift and the hook that adds it to the output."""
    projection.add_module(CHILD, shift)
    setattr(projection, HOOK_ATTR, projection.register_forward_hook(_add_shift))


def attached(projection: nn.Module) -> Optional[TokenShift]:
    shift = getattr(projection, CHILD, None)
    return shift if isinstance(shift, TokenShift) else None
