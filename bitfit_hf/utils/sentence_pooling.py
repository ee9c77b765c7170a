"""Bases whose parts were never trained: sentence-transformers checkpoints and newly initialised modules.

A sentence-transformers checkpoint (``modules.json`` naming a ``Pooling`` module) embeds a sentence by
pooling its token states (mean, CLS or max, as ``1_Pooling/config.json`` says); its BERT-style
``pooler.dense`` was never trained by that objective. transformers' ``*ForSequenceClassification``
classifies from that pooler, so a method that freezes the base would classify through random features.
Two ways out, chosen by the recipes' ``--pooling_head`` flag:

* ``checkpoint``: classify through the checkpoint's own pooling (:func:`install_sentence_pooling`): the
  untrained pooler is removed and the pooled sentence vector feeds the usual task head;
* ``train_pooler``: keep the model's own path and train the untrained pooler as part of the head
  (:func:`mark_untrained_modules`, which the head detection reads).

Modules that a load reports as newly initialised outside the task head are marked the same way, so
they are trained with the head instead of being frozen as if they were pretrained.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Iterable, List, Optional

import torch
from torch import nn

logger = logging.getLogger(__name__)

POOLING_MODES = ("mean", "cls", "max", "mean_sqrt_len")
POOLING_HEADS = ("checkpoint", "train_pooler")
_POOLING_ATTR = "_bitfit_sentence_pooling"
_UNTRAINED_ATTR = "_bitfit_untrained_modules"
# The old format's booleans, in the order sentence-transformers concatenates them.
_FLAG_MODES = (("pooling_mode_cls_token", "cls"), ("pooling_mode_mean_tokens", "mean"),
               ("pooling_mode_max_tokens", "max"), ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len"))


class PoolingConfigError(ValueError):
    """A sentence-transformers pooling config that cannot be read or used for classification."""


# --------------------------------------------------------------------------- reading the checkpoint


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError) as err:
        raise PoolingConfigError(f"{path} cannot be read as JSON ({err}).") from None


def _checkpoint_file(source: str, filename: str, revision: Optional[str] = None, token: Any = None) -> Optional[str]:
    """``filename`` of a local folder or a Hub repo, or ``None`` where it has none (or the Hub is out of reach:
    a checkpoint without its pooling config is used as a plain transformers model)."""
    if os.path.isdir(source):
        path = os.path.join(source, filename)
        return path if os.path.isfile(path) else None
    try:
        from huggingface_hub import hf_hub_download

        return hf_hub_download(source, filename, revision=revision, token=token)
    except Exception:  # noqa: BLE001 - not on the Hub, no such file, offline: no sentence-transformers config
        return None


def pooling_mode_from_config(config: Any, source: str = "the pooling config") -> str:
    """The pooling mode of a sentence-transformers ``Pooling`` config, in either format: the old booleans
    (``pooling_mode_mean_tokens`` ...) or ``{"pooling_mode": "mean"}`` (sentence-transformers 5.4+)."""
    if not isinstance(config, dict):
        raise PoolingConfigError(f"{source} must hold a JSON object.")
    if "pooling_mode" in config:
        modes = [str(config["pooling_mode"]).lower().replace("-", "_")]
        modes = ["mean_sqrt_len" if m == "mean_sqrt_len_tokens" else m for m in modes]
    else:
        modes = [mode for key, mode in _FLAG_MODES if config.get(key)]
    if len(modes) != 1:
        raise PoolingConfigError(
            f"{source} asks for {' + '.join(modes) if modes else 'no'} pooling; a classification head here takes "
            f"exactly one of {', '.join(POOLING_MODES)}. Pass --pooling_head train_pooler to classify through the "
            "model's own pooler instead."
        )
    if modes[0] not in POOLING_MODES:
        raise PoolingConfigError(
            f"{source} asks for {modes[0]!r} pooling, which this version does not build (it builds "
            f"{', '.join(POOLING_MODES)}). Pass --pooling_head train_pooler to classify through the model's own "
            "pooler instead."
        )
    return modes[0]


def checkpoint_pooling(source: str, revision: Optional[str] = None, token: Any = None) -> Optional[str]:
    """The pooling mode a sentence-transformers checkpoint declares (``"mean"`` for all-MiniLM-L6-v2), or
    ``None`` for a checkpoint that is not one (no ``modules.json``, or no ``Pooling`` module in it)."""
    modules_file = _checkpoint_file(source, "modules.json", revision, token)
    if modules_file is None:
        return None
    modules = _read_json(modules_file)
    if not isinstance(modules, list):
        raise PoolingConfigError(f"{modules_file} must hold a list of modules.")
    pooling = [m for m in modules if isinstance(m, dict) and str(m.get("type", "")).endswith(".Pooling")]
    if not pooling:
        return None
    folder = str(pooling[0].get("path") or "1_Pooling")
    config_file = _checkpoint_file(source, f"{folder}/config.json", revision, token)
    if config_file is None:
        raise PoolingConfigError(f"{source} names a Pooling module in {folder!r} but has no {folder}/config.json.")
    return pooling_mode_from_config(_read_json(config_file), config_file)


# --------------------------------------------------------------------------- the pooled head


def pool(hidden: torch.Tensor, mask: Optional[torch.Tensor], mode: str) -> torch.Tensor:
    """One vector per sequence from token states ``hidden`` (batch, tokens, dim), padding excluded."""
    if mode == "cls":
        return hidden[:, 0]
    if mask is None:
        mask = torch.ones(hidden.shape[:2], dtype=hidden.dtype, device=hidden.device)
    weights = mask[:, : hidden.shape[1]].to(hidden.dtype).unsqueeze(-1)
    if mode == "max":
        floor = torch.finfo(hidden.dtype).min
        return hidden.masked_fill(weights == 0, floor).max(dim=1).values
    summed = (hidden * weights).sum(dim=1)
    counts = weights.sum(dim=1).clamp(min=1e-9)
    return summed / (counts.sqrt() if mode == "mean_sqrt_len" else counts)


def sentence_pooling_of(model: nn.Module) -> Optional[str]:
    """The pooling :func:`install_sentence_pooling` put on ``model``, or ``None``."""
    return getattr(model, _POOLING_ATTR, None)


def _base_of(model: nn.Module) -> nn.Module:
    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, prefix, None) if prefix else None
    if not isinstance(base, nn.Module) or base is model:
        raise PoolingConfigError(
            f"{type(model).__name__} has no separate base model to pool: sentence pooling applies to encoder "
            "classification models (BERT, MPNet, RoBERTa, ...)."
        )
    return base


def install_sentence_pooling(model: nn.Module, mode: str) -> nn.Module:
    """Make a ``*ForSequenceClassification`` model classify from the ``mode`` pooled sentence vector, in place.

    Models with a pooler (BERT, ALBERT): the pooler is removed (its weights were never trained) and the
    pooled vector is the pooler output the classifier reads. Models whose head reads the first token
    (RoBERTa, MPNet, DistilBERT, ELECTRA): the pooled vector takes that token's place. Idempotent; a
    model already pooled another way is an error."""
    if mode not in POOLING_MODES:
        raise PoolingConfigError(f"Unknown sentence pooling {mode!r}; use one of {', '.join(POOLING_MODES)}.")
    current = sentence_pooling_of(model)
    if current == mode:
        return model
    if current is not None:
        raise PoolingConfigError(f"This model already classifies from {current!r} pooling, not {mode!r}.")
    if not type(model).__name__.endswith("ForSequenceClassification"):
        raise PoolingConfigError(
            f"Sentence pooling applies to sequence classification models, not {type(model).__name__}."
        )
    base = _base_of(model)
    has_pooler = isinstance(getattr(base, "pooler", None), nn.Module)
    if has_pooler:
        base.pooler = None

    def replace_output(module, args, kwargs, output):
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        hidden = output[0]
        pooled = pool(hidden, mask, mode)
        if not hasattr(output, "keys"):  # a tuple (return_dict=False)
            return (hidden, pooled, *output[2:]) if has_pooler else (
                torch.cat([pooled.unsqueeze(1), hidden[:, 1:]], dim=1), *output[1:])
        fields = {key: output[key] for key in output.keys()}
        if has_pooler:
            fields["pooler_output"] = pooled
        else:
            fields["last_hidden_state"] = torch.cat([pooled.unsqueeze(1), hidden[:, 1:]], dim=1)
        return type(output)(**fields)  # field order kept: outputs[1] is the pooler output

    base.register_forward_hook(replace_output, with_kwargs=True)
    setattr(model, _POOLING_ATTR, mode)
    return model


# --------------------------------------------------------------------------- untrained modules


def mark_untrained_modules(model: nn.Module, names: Iterable[str]) -> None:
    """Record modules of ``model`` whose weights were never trained, to be trained with the task head."""
    known = dict(model.named_modules())
    missing = [n for n in names if n not in known]
    if missing:
        raise PoolingConfigError(f"{missing} are not modules of this {type(model).__name__}.")
    marked = list(dict.fromkeys([*untrained_modules(model), *names]))
    setattr(model, _UNTRAINED_ATTR, marked)


def untrained_modules(model: nn.Module) -> List[str]:
    """Modules :func:`mark_untrained_modules` recorded on ``model`` (in the order they were marked)."""
    return list(getattr(model, _UNTRAINED_ATTR, []))


def newly_initialised_modules(model: nn.Module, missing_keys: Iterable[str], exclude: Iterable[str] = ()) -> List[str]:
    """The smallest modules all of whose parameters a load reported missing (newly initialised), outside
    the modules in ``exclude`` (the task head, which is trained anyway)."""
    missing = set(missing_keys)
    excluded = list(exclude)
    found: List[str] = []
    for name, module in model.named_modules():
        if not name or any(name == e or name.startswith(e + ".") for e in excluded):
            continue
        if any(name.startswith(f + ".") for f in found):
            continue
        params = [f"{name}.{p}" for p, _ in module.named_parameters()]
        if params and all(p in missing for p in params):
            found.append(name)
    return found


def untrained_pooler(model: nn.Module) -> Optional[str]:
    """The module name of the base's pooler (``"bert.pooler"``), or ``None`` where the model has none."""
    try:
        base = _base_of(model)
    except PoolingConfigError:
        return None
    if not isinstance(getattr(base, "pooler", None), nn.Module):
        return None
    return f"{model.base_model_prefix}.pooler"
