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


def _frozen(model: nn.Module, exclude: Set[str], heads: tuple):
    """``(name without the base-model prefix, parameter)`` of the frozen base, sorted by that name."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    for name, param in sorted(model.named_parameters(), key=lambda item: _normalized(item[0], prefix)):
        if name not in exclude and not is_under(name, heads):
            yield _normalized(name, prefix), param


def _spread(flat: torch.Tensor, count: int) -> torch.Tensor:
    """``count`` entries spread evenly over ``flat`` (integer positions: float linspace rounds past the end)."""
    count = min(count, flat.numel())
    index = torch.arange(count, dtype=torch.int64) * (flat.numel() - 1) // max(count - 1, 1)
    return flat[index.to(flat.device)].to("cpu", torch.float32)


def _sample(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().reshape(-1)
    if flat.numel() == 0 or flat.is_meta:  # a meta model (sizes only) has no values to sample
        return b""
    return _spread(flat, SAMPLES_PER_TENSOR).to(torch.bfloat16).to(torch.float32).numpy().tobytes()


def base_fingerprint(
    model: nn.Module, exclude: Optional[Set[str]] = None, head_modules: Iterable[str] = ()
) -> str:
    """Fingerprint of ``model``'s parameters other than ``exclude`` and the head modules."""
    digest = hashlib.sha256(VERSION.encode())
    for name, param in _frozen(model, exclude or set(), tuple(head_modules)):
        with gathered([param]):
            digest.update(name.encode())
            digest.update(repr(tuple(param.shape)).encode())
            digest.update(_sample(param))
    return f"{VERSION}:{digest.hexdigest()[:32]}"



# ---- the same base loaded another way -------------------------------------------------------------
# The fingerprint above hashes stored values, so a base read from a GGUF file or quantized to 4 bits
# never matches its full-precision checkpoint. The sketch below keeps what survives quantization: the
# frozen tensors' names and logical shapes (hashed), and a few values of some weights as floats, so two
# loadings of one base can be compared within quantization error.

SKETCH_VERSION = "s1"
SKETCH_TENSORS = 16
SKETCH_SAMPLES = 16
#: Largest relative L2 difference of a sketched tensor between two loadings of one base. 4-bit block
#: quantization (GGUF Q4, NF4) changes weights by about 10% of their norm; unrelated weights of the same
#: shape differ by about 140%.
SKETCH_TOLERANCE = 0.5


def logical_shape(param) -> tuple:
    """The shape of the float tensor a (possibly packed, quantized) parameter stands for."""
    quant_state = getattr(param, "quant_state", None)  # bitsandbytes 4-bit packs two values per byte
    shape = getattr(quant_state, "shape", None)
    return tuple(shape) if shape is not None else tuple(getattr(param, "ds_shape", None) or param.shape)


def logical_values(param) -> Optional[torch.Tensor]:
    """The float values a parameter stands for, or ``None`` when this quantized storage cannot be read."""
    if param.is_floating_point() and getattr(param, "quant_state", None) is None:
        return param.detach()
    quant_state = getattr(param, "quant_state", None)
    if quant_state is not None:  # bitsandbytes 4-bit
        try:
            import bitsandbytes.functional as bnb_functional
        except ImportError:  # pragma: no cover - a 4-bit model implies bitsandbytes
            return None
        return bnb_functional.dequantize_4bit(param.data, quant_state).reshape(logical_shape(param))
    scale = getattr(param, "SCB", None)
    if param.dtype == torch.int8 and scale is not None:  # bitsandbytes 8-bit: row-wise absmax scaling
        return param.detach().float() * (scale.float().reshape(-1, 1) / 127.0)
    return None


def base_sketch(model: nn.Module, exclude: Optional[Set[str]] = None, head_modules: Iterable[str] = (),
                names: Optional[Iterable[str]] = None) -> dict:
    """``{"version", "structure", "samples"}`` of the frozen base: a hash of names and logical shapes,
    and :data:`SKETCH_SAMPLES` float values of :data:`SKETCH_TENSORS` weights (or of ``names``)."""
    frozen = list(_frozen(model, exclude or set(), tuple(head_modules)))
    digest = hashlib.sha256(SKETCH_VERSION.encode())
    for name, param in frozen:
        digest.update(name.encode())
        digest.update(repr(logical_shape(param)).encode())
    if names is None:
        matrices = [name for name, param in frozen if len(logical_shape(param)) >= 2]
        step = max(len(matrices) / SKETCH_TENSORS, 1.0)
        names = list(dict.fromkeys(matrices[int(i * step)] for i in range(min(SKETCH_TENSORS, len(matrices)))))
    wanted = set(names)
    samples = {}
    for name, param in frozen:
        if name not in wanted:
            continue
        with gathered([param]):
            values = logical_values(param)
            if values is None or values.is_meta or values.numel() == 0:  # unreadable / sizes only
                continue
            # 4 significant digits: far finer than quantization error, and short in adapter_config.json.
            samples[name] = [float(f"{v:.4g}") for v in _spread(values.reshape(-1), SKETCH_SAMPLES).tolist()]
    return {"version": SKETCH_VERSION, "structure": digest.hexdigest()[:32], "samples": samples}


def sketch_difference(recorded: dict, found: dict) -> Optional[float]:
    """The largest relative L2 difference over the tensors both sketches sampled (``None``: none shared)."""
    worst = None
    for name, values in (recorded.get("samples") or {}).items():
        other = (found.get("samples") or {}).get(name)
        if other is None or len(other) != len(values):
            continue
        a, b = torch.tensor(values, dtype=torch.float64), torch.tensor(other, dtype=torch.float64)
        difference = float((a - b).norm() / a.norm().clamp_min(1e-12))
        worst = difference if worst is None else max(worst, difference)
    return worst
