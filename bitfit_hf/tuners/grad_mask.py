"""Gradient masks for methods that train only some entries of a tensor (chunks of a fused bias, random
entries of a weight matrix).

The mask is built where the parameter lives when the method is applied, usually on the CPU before the
Trainer moves the model to its device; the hook follows the gradient's device (and keeps that copy), so
the same prepared model trains on a GPU without re-applying the method.
"""

from __future__ import annotations

import torch

__all__ = ["GradMask"]


class GradMask:
    """A tensor hook that zeroes every gradient entry where ``keep`` is false.

    ``torch.where`` rather than a product, so a NaN or inf outside the kept entries cannot leak in.
    """

    def __init__(self, keep: torch.Tensor):
        self.keep = keep.to(torch.bool)

    def __call__(self, grad: torch.Tensor) -> torch.Tensor:
        if self.keep.device != grad.device:
            self.keep = self.keep.to(grad.device)
        return torch.where(self.keep, grad, torch.zeros((), dtype=grad.dtype, device=grad.device))
