"""DeepSpeed ZeRO-3 partitions parameters across ranks; gather just the few tensors we read."""

from __future__ import annotations

import contextlib
from typing import Iterable

from torch import nn


def zero3_enabled() -> bool:
    try:
        from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
    except Exception:  # pragma: no cover - very old transformers
        return False
    return bool(is_deepspeed_zero3_enabled())


def full_numel(param) -> int:
    """Number of elements of ``param``, also while ZeRO-3 holds only a partition (``ds_numel``)."""
    return int(getattr(param, "ds_numel", param.numel()))


def full_shape(param):
    """Shape of ``param``, also while ZeRO-3 holds only a partition (``ds_shape``)."""
    return getattr(param, "ds_shape", None) or param.shape


def gathered(params: Iterable[nn.Parameter]):
    """Context in which ZeRO-3-partitioned ``params`` hold their full values (a no-op otherwise).

    Every rank must enter it together: gathering is a collective operation.
    """
    params = [p for p in params if hasattr(p, "ds_id")]
    if not params:
        return contextlib.nullcontext()
    import deepspeed  # `deepspeed.zero` is an attribute, not an importable module path

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)
