"""Export a merged, plain transformers checkpoint that loads without bitfit-hf installed.

Biases a model already had are ordinary parameters, so merging is simply saving (methods that insert
modules, such as LoRA, fold their update into the stock weights through their state's
``merged_state_dict``). Biases that BitFit added need a place in the stock architecture: LLaMA-style configs have ``attention_bias`` and
``mlp_bias`` switches (which create a bias on every projection of that kind; the ones BitFit did not
add are exported as zeros). A bias added to a norm that the stock class has no bias for cannot be
represented and is refused with an explanation.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile

import torch
import transformers
from torch import nn

from bitfit_hf.adapters.config import AdapterError
from bitfit_hf.tuners import method_spec
from bitfit_hf.tuners.bias.layer import HOOK
from bitfit_hf.tuners.state import get_tuner_state, unwrap
from bitfit_hf.utils.constants import CONFIG_NAME
from bitfit_hf.utils.errors import UserError
from bitfit_hf.utils.sentence_pooling import sentence_pooling_of

_FLAG_FOR = {"self_attn.": "attention_bias", "mlp.": "mlp_bias"}


class ExportTargetError(UserError, FileExistsError):
    """An export would replace a folder that is not an earlier export of the same kind."""


def is_merged_checkpoint(folder: str) -> bool:
    """A plain transformers checkpoint (``config.json``), not an adapter folder."""
    return (os.path.isfile(os.path.join(folder, transformers.utils.CONFIG_NAME))
            and not os.path.exists(os.path.join(folder, CONFIG_NAME)))


def check_export_target(target: str, earlier_export, what: str) -> None:
    """An export replaces its target folder as a whole: refuse, before any work, a target that holds
    something else than an earlier export of the same kind (``earlier_export(folder)``), so a mistyped
    output folder (the adapter's own, a parent, a home directory) never loses files."""
    if not os.path.lexists(target):
        return
    if not os.path.isdir(target) or os.path.islink(target):
        raise ExportTargetError(f"{target!r} exists and is not a folder: pick a new folder for the {what}.")
    if os.listdir(target) and not earlier_export(target):
        raise ExportTargetError(
            f"{target!r} already holds files that are not a {what}; the export replaces its folder as a whole, "
            f"so it would delete them. Pick a new (or empty) folder, or remove that one first."
        )


def export_merged(model: nn.Module, save_directory: str, tokenizer=None) -> str:
    """Save ``model`` (with its adapter applied) as a stock checkpoint; returns the directory. An existing
    ``save_directory`` is replaced only if it is empty or an earlier merged checkpoint."""
    check_export_target(save_directory, is_merged_checkpoint, "merged checkpoint")
    model = unwrap(model)
    state = get_tuner_state(model)
    refusal = method_spec(state.config.method).not_mergeable if state is not None else ""
    if refusal:
        raise AdapterError(f"Cannot export a plain {type(model).__name__} checkpoint: {refusal}. Keep the adapter "
                           "format (load_adapter / AutoBitFitModel) for this model.")
    pooled = sentence_pooling_of(model)
    if pooled:
        raise AdapterError(
            f"Cannot export a plain {type(model).__name__} checkpoint: this adapter classifies from the "
            f"sentence-transformers checkpoint's {pooled} pooling, and the stock class classifies from its pooler. "
            "Keep the adapter format (AutoBitFitModel / bitfit-hf predict), or train with --pooling_head "
            "train_pooler for an adapter that merges."
        )
    added = state.added_biases if state is not None else {}
    hooked = [m for m, kind in added.items() if kind == HOOK]
    if hooked:
        raise AdapterError(
            f"Cannot export a plain {type(model).__name__}: biases were added to {hooked[0]!r} (and "
            f"{len(hooked) - 1} more norm modules), which the stock class has no bias for. Keep the adapter "
            "format (load_adapter) for this model, or train without norm roles."
        )
    config = model.config.__class__.from_dict(model.config.to_dict())
    for module_name in added:
        flags = [flag for part, flag in _FLAG_FOR.items() if part in module_name]
        if not flags or not hasattr(config, flags[0]):
            raise AdapterError(
                f"Cannot export a plain {type(model).__name__}: a bias was added to {module_name!r} and "
                f"{config.model_type} configs have no switch that creates it. Keep the adapter format."
            )
        setattr(config, flags[0], True)
    # Methods that insert modules (LoRA, (IA)³) fold them back into stock tensors themselves (Method.merge).
    merged = method_spec(state.config.method).merge(state, model) if state is not None else None
    if merged is None:
        merged = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
    with torch.device("meta"):
        reference = type(model)(config)
    expected = reference.state_dict()
    for key, tensor in expected.items():
        if key not in merged and key.endswith(".bias"):
            merged[key] = torch.zeros(tensor.shape, dtype=merged[key.replace(".bias", ".weight")].dtype)
    extra = sorted(set(merged) - set(expected))
    if extra:
        raise AdapterError(f"Cannot export: {extra[:3]} have no place in a stock {type(model).__name__}.")
    plain = type(model)(config)
    plain.load_state_dict(merged, strict=True)
    plain.to(next(model.parameters()).dtype)

    parent = os.path.dirname(os.path.abspath(save_directory))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".export-", dir=parent)
    try:
        plain.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        replace_dir(tmp, save_directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return save_directory


def replace_dir(new: str, target: str) -> None:
    """Move ``new`` to ``target``; an existing ``target`` is kept until the new one is in place."""
    if not os.path.exists(target):
        os.replace(new, target)
        return
    old = target.rstrip("/") + ".old-" + secrets.token_hex(4)
    os.replace(target, old)
    try:
        os.replace(new, target)
    except BaseException:
        os.replace(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)
