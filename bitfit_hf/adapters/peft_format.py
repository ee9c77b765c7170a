"""PEFT's side of a bias-only adapter: the BEFT tuner format, read without peft's loader.

A PEFT BEFT adapter folder holds ``adapter_config.json`` (``"peft_type": "BEFT"``, ``target_modules``,
``modules_to_save``, ``task_type``) and ``adapter_model.safetensors`` whose keys are
``base_model.model.<module>.beft_bias`` (a ``[1, out_features]`` delta added to that ``nn.Linear``'s
output) and ``base_model.model.<module>.<param>`` for every module saved whole (norms, the task head).
BitFit expresses the same thing with absolute biases: ``b = b_stock + delta``.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, Tuple

import torch
from torch import nn

from bitfit_hf.adapters.config import AdapterError
from bitfit_hf.tuners import apply_method
from bitfit_hf.tuners.bias.config import BitFitConfig
from bitfit_hf.tuners.bias.layer import has_bias
from bitfit_hf.tuners.bias.selection import detect_head_modules
from bitfit_hf.tuners.state import unwrap
from bitfit_hf.utils.constants import CONFIG_NAME, WEIGHTS_NAME
from bitfit_hf.utils.io import read_json_object
from bitfit_hf.utils.names import is_under

PEFT_TYPE_BEFT = "BEFT"
PEFT_PREFIX = "base_model.model."  # PEFT's key prefix for the wrapped model's modules
BEFT_SUFFIX = ".beft_bias"


def peft_type_of(directory: str) -> str | None:
    """The ``peft_type`` of a PEFT adapter folder, ``None`` for anything else (a BitFit adapter, no folder)."""
    data = read_json_object(os.path.join(directory, CONFIG_NAME))
    return data.get("peft_type") if data is not None and "adapter_type" not in data else None


def read_peft_adapter(directory: str) -> Tuple[Dict[str, Any], Dict[str, torch.Tensor]]:
    """The config and tensors of a PEFT adapter folder (safetensors only: nothing is unpickled)."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    config = read_json_object(os.path.join(directory, CONFIG_NAME))
    if config is None:
        raise AdapterError(f"{directory!r} has no readable {CONFIG_NAME} (a JSON object): it is not a PEFT adapter.")
    weights = os.path.join(directory, WEIGHTS_NAME)
    if not os.path.isfile(weights):
        raise AdapterError(f"{directory!r} has no {WEIGHTS_NAME}: bitfit-hf reads PEFT adapters saved as safetensors "
                           "only (save_pretrained(..., safe_serialization=True), PEFT's default).")
    with open(weights, "rb") as handle:
        data = handle.read()
    try:
        tensors = load(data)
    except (SafetensorError, ValueError) as err:
        raise AdapterError(f"{weights} is not a valid safetensors file ({err}).") from None
    return config, tensors


def load_peft_beft(model: nn.Module, directory: str) -> nn.Module:
    """Load a PEFT BEFT adapter folder onto a stock ``model`` as a BitFit selection, in place.

    Each ``beft_bias`` delta becomes the absolute bias ``b_stock + delta`` of its Linear module; every
    tensor of a saved module (``modules_to_save``) is copied, and trained as a BitFit pattern (norm biases,
    and norm weights that differ from the stock ones) or as the head. The model can then be saved as a BitFit
    adapter (``save_adapter``). PEFT records no fingerprint of the base: load it onto the base it names.
    """
    config, tensors = read_peft_adapter(directory)
    if config.get("peft_type") != PEFT_TYPE_BEFT:
        raise AdapterError(f"{directory!r} is a PEFT {config.get('peft_type')!r} adapter; bitfit-hf reads PEFT BEFT "
                           "adapters (bias deltas) only. Load it with peft.PeftModel.from_pretrained.")
    inner = unwrap(model)
    modules = dict(inner.named_modules())
    params = dict(inner.named_parameters())
    values: Dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        name = key[len(PEFT_PREFIX):] if key.startswith(PEFT_PREFIX) else key
        if name.endswith(BEFT_SUFFIX):
            module_name = name[: -len(BEFT_SUFFIX)]
            module = modules.get(module_name)
            if module is None:
                raise AdapterError(f"The BEFT adapter has a bias delta for {module_name!r}, which this "
                                   f"{type(inner).__name__} does not have.")
            if not has_bias(module):
                raise AdapterError(f"The BEFT adapter adds a bias to {module_name!r}, which has none in this "
                                   f"{type(inner).__name__}: bitfit-hf loads BEFT deltas onto existing biases only.")
            values[f"{module_name}.bias"] = module.bias.detach() + tensor.reshape(-1).to(module.bias)
        elif name in params:
            values[name] = tensor
        else:
            raise AdapterError(f"The PEFT adapter holds {name!r}, which this {type(inner).__name__} does not have.")
    saved = list(config.get("modules_to_save") or [])
    heads = [h for h in detect_head_modules(inner) if any(is_under(n, [h]) for n in values) and h in saved]

    def in_head(name: str) -> bool:
        return is_under(name, heads)

    trained = [n for n, v in values.items()
               if not in_head(n) and (n.endswith(".bias") or not torch.equal(v.to(params[n]), params[n].detach()))]
    apply_method(inner, BitFitConfig(bias_terms="frozen", patterns=[re.escape(n) for n in trained],
                                     train_head=bool(heads), head_modules=heads))
    params = dict(inner.named_parameters())
    with torch.no_grad():
        for name, value in values.items():
            params[name].copy_(value.to(params[name]))
    return model
