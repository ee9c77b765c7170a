"""How wide the model in hand is, read before anything loads: the recipes' default learning rate depends on it.

The per-method default rates were swept on all-MiniLM-L6-v2 (hidden size 384). On a base-size encoder (hidden size
768: BERT-base, RoBERTa-base, all-mpnet-base-v2) some of them sit past the edge of stability and the run predicts
one class (benchmarks/results/lr_sweep-mpnet-1000.md), so a method may name a second default for models at least
:data:`BASE_SIZE_WIDTH` wide (``RecipeMethod.base_size_learning_rate``). The choice is made while the command line is
parsed, before ``TrainingArguments`` is built (a DeepSpeed config's ``"auto"`` rate is filled from it there), so the
width is read from the model's ``config.json`` alone: a packaged model's recorded width, a local folder's file, or
the Hub's file (what loading the model reads a moment later anyway).
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional

__all__ = ["BASE_SIZE_WIDTH", "WIDTH_KEYS", "config_width", "model_width", "is_base_size"]

#: Models at least this wide take the methods' base-size default rates.
BASE_SIZE_WIDTH = 768
#: Where configs keep the width: BERT-likes / LLaMA, T5 / BART, GPT-2, DistilBERT.
WIDTH_KEYS = ("hidden_size", "d_model", "n_embd", "dim")


def config_width(values: Mapping[str, Any]) -> Optional[int]:
    """The width a config's values record (a multimodal config's text model's), or None."""
    for key in WIDTH_KEYS:
        value = values.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    text = values.get("text_config")
    return config_width(text) if isinstance(text, Mapping) else None


def _folder_width(folder: str) -> Optional[int]:
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            values = json.load(handle)
    except (OSError, ValueError):
        return None  # loading the model reports the broken file in its own words
    return config_width(values) if isinstance(values, dict) else None


def model_width(name_or_path: Optional[str], default_asset: str = "minilm", revision: Optional[str] = None,
                gguf_file: Optional[str] = None) -> Optional[int]:
    """The width of the model ``--model_name_or_path`` (or ``--config_name``) names; ``None`` (no
    ``--model_name_or_path``) is the recipe's ``default_asset``. Returns None when it cannot be told without loading
    (a GGUF file, a Hub model not reachable now): the caller keeps the small-model default and says so."""
    from bitfit_hf.data.assets import MODEL_ASSETS, model_asset_name

    name = name_or_path or default_asset
    asset = model_asset_name(name)
    if asset is not None:
        return MODEL_ASSETS[asset].hidden_size or None
    if os.path.isdir(name):
        return _folder_width(name)
    if gguf_file:
        return None  # the width is inside the GGUF file, read only when the model loads
    for spec in MODEL_ASSETS.values():  # a packaged model's Hub id: its recorded width
        if spec.hub_id and spec.hub_id == name and revision in (None, "main") and spec.hidden_size:
            return spec.hidden_size
    try:
        from transformers import PretrainedConfig

        values, _ = PretrainedConfig.get_config_dict(name, revision=revision)
    except Exception:  # noqa: BLE001 - unreachable or unknown: loading the model names the cause
        return None
    return config_width(values)


def is_base_size(width: Optional[int]) -> bool:
    return width is not None and width >= BASE_SIZE_WIDTH
