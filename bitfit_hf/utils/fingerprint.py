"""A fingerprint of a base model's frozen weights, so an adapter is never applied to the wrong base.

Hashing every byte of a large model is slow and breaks when the base is loaded in another dtype, so
the fingerprint hashes, for every frozen tensor in name order, its name (without the task-class
prefix such as ``bert.``), its shape and 64 values sampled at fixed positions and rounded to bfloat16.
Two different checkpoints of one architecture differ in those samples; the same checkpoint loaded in
float32, float16 or bfloat16 gives the same fingerprint.
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Optional, Set

import torch
from torch import nn

from bitfit_hf.utils.names import is_under
from bitfit_hf.utils.zero import gathered

SAMPLES_PER_TENSOR = 64
VERSION = "v1"


def _normalized(name: str, prefix: str) -> str:
    return name[len(prefix) + 1 :] if prefix and name.startswith(prefix + ".") else name


def _sample(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().reshape(-1)
    if flat.numel() == 0 or flat.is_meta:  # a meta model (sizes only) has no values to sample
        return b""
    count = min(SAMPLES_PER_TENSOR, flat.numel())
    # Integer positions spread evenly over the tensor (float linspace rounds past the end on big tensors).
    index = torch.arange(count, dtype=torch.int64) * (flat.numel() - 1) // max(count - 1, 1)
    values = flat[index.to(flat.device)].to("cpu", torch.float32).to(torch.bfloat16).to(torch.float32)
    return values.numpy().tobytes()


def base_fingerprint(
    model: nn.Module, exclude: Optional[Set[str]] = None, head_modules: Iterable[str] = ()
) -> str:
    """Fingerprint of ``model``'s parameters other than ``exclude`` and the head modules."""
    exclude = exclude or set()
    heads = tuple(head_modules)
    prefix = getattr(model, "base_model_prefix", "") or ""
    digest = hashlib.sha256(VERSION.encode())
    for name, param in sorted(model.named_parameters(), key=lambda item: _normalized(item[0], prefix)):
        if name in exclude or is_under(name, heads):
            continue
        with gathered([param]):
            digest.update(_normalized(name, prefix).encode())
            digest.update(repr(tuple(param.shape)).encode())
            digest.update(_sample(param))
    return f"{VERSION}:{digest.hexdigest()[:32]}"

