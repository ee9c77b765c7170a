"""How a base model was loaded (GGUF file, quantizer and its config, dtype), so an adapter can rebuild it.

transformers keeps the quantization config on the model but forgets which GGUF file it read; a caller
that knows it says so with :func:`remember_base_loading`, and a folder holding exactly one ``.gguf``
file answers for itself.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

from torch import nn

_GGUF_ATTR = "_bitfit_gguf_file"


def quantization_method(model: nn.Module) -> Optional[str]:
    """The transformers quantizer that loaded ``model`` (``"gguf"``, ``"bitsandbytes"``, ...) or ``None``."""
    if not getattr(model, "is_quantized", False):
        return None
    method = getattr(model, "quantization_method", None)
    if method is None:
        config = getattr(getattr(model, "config", None), "quantization_config", None)
        method = config.get("quant_method") if isinstance(config, dict) else getattr(config, "quant_method", None)
    method = getattr(method, "value", method)
    return str(method) if method else "unknown"


def remember_base_loading(model: nn.Module, gguf_file: Optional[str] = None) -> nn.Module:
    """Record on ``model`` what transformers does not keep (the GGUF file it was read from)."""
    if gguf_file:
        setattr(model, _GGUF_ATTR, os.path.basename(gguf_file) if os.path.isabs(gguf_file) else gguf_file)
    return model


def _gguf_file(model: nn.Module) -> Optional[str]:
    remembered = getattr(model, _GGUF_ATTR, None)
    if remembered:
        return remembered
    folder = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    if os.path.isdir(folder):
        found = sorted(f for f in os.listdir(folder) if f.endswith(".gguf"))
        if len(found) == 1:
            return found[0]
    return None


def describe_base_loading(model: nn.Module) -> Dict[str, Any]:
    """``{}`` for a plain base; else ``quant_method``, ``gguf_file`` / ``quantization_config`` and ``dtype``."""
    method = quantization_method(model)
    if method is None:
        return {}
    out: Dict[str, Any] = {"quant_method": method}
    if method == "gguf":
        out["gguf_file"] = _gguf_file(model)
    else:
        config = getattr(getattr(model, "config", None), "quantization_config", None)
        out["quantization_config"] = config.to_dict() if hasattr(config, "to_dict") else dict(config or {})
    dtype = getattr(model, "dtype", None)
    if dtype is not None:
        out["dtype"] = str(dtype).replace("torch.", "")
    return out


def loading_kwargs(description: Dict[str, Any]) -> Dict[str, Any]:
    """``from_pretrained`` keyword arguments that load a base the way ``description`` says."""
    if not description:
        return {}
    import torch

    kwargs: Dict[str, Any] = {}
    if description.get("quant_method") == "gguf":
        if description.get("gguf_file"):
            kwargs["gguf_file"] = description["gguf_file"]
        return kwargs
    if description.get("quantization_config"):
        from transformers.quantizers.auto import AutoQuantizationConfig

        kwargs["quantization_config"] = AutoQuantizationConfig.from_dict(dict(description["quantization_config"]))
    dtype = getattr(torch, str(description.get("dtype", "")), None)
    if isinstance(dtype, torch.dtype):
        kwargs["dtype"] = dtype
    return kwargs


def describe_for_humans(description: Dict[str, Any]) -> str:
    """``"full precision"``, ``"GGUF file x.gguf"``, ``"bitsandbytes (load_in_4bit)"``, ..."""
    if not description:
        return "full precision (no quantizer)"
    method = description.get("quant_method")
    if method == "gguf":
        return f"GGUF file {description.get('gguf_file') or '?'} (dequantised)"
    config = description.get("quantization_config") or {}
    bits = [k for k in ("load_in_4bit", "load_in_8bit") if config.get(k)]
    return f"{method}" + (f" ({bits[0]})" if bits else "")
