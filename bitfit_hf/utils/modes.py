"""Modules inserted into a model take the model's mode (``train()`` / ``eval()``).

A new ``nn.Module`` starts in training mode. Inserted into a model that is in eval mode (a peft LoRA layer
wrapped around a projection, an AdapterBias shift), it would run its dropout at inference while the model
reports ``training == False``: logits would change from one call to the next. Everything in bitfit-hf that
inserts modules does it inside :func:`inserted_modules_follow`.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from torch import nn

__all__ = ["inserted_modules_follow", "modes_differing"]


@contextlib.contextmanager
def inserted_modules_follow(model: nn.Module) -> Iterator[None]:
    """Every module that joins ``model`` inside the block gets ``model.training``; modules that were already
    there keep their own mode (a caller may have set one on purpose)."""
    before = {id(module) for module in model.modules()}
    try:
        yield
    finally:
        mode = model.training
        for module in model.modules():
            if id(module) not in before:
                module.training = mode


def modes_differing(model: nn.Module) -> list:
    """Names of the submodules whose mode is not the model's (empty for a consistent model)."""
    return [name for name, module in model.named_modules() if module.training != model.training]
