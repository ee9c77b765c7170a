"""Export a BitFit adapter as a PEFT BEFT adapter: ``peft.PeftModel.from_pretrained(stock, folder)`` loads it
with no bitfit-hf installed.

The mapping (written by peft's own ``save_pretrained``, so the format is peft's by construction):

* a trained bias of an ``nn.Linear`` -> a BEFT target with the delta ``b_trained - b_stock``;
* a trained norm (LayerNorm bias, or any tensor of a module whose parameters are all vectors) -> the
  module in ``modules_to_save`` (saved whole: its weight travels along, unchanged);
* the task head -> ``modules_to_save``.

A method whose tensors are a peft tuner's own ((IA)³: it overrides ``Method.peft_model``) exports that tuner
instead: the hook builds the ``peft.PeftModel``, the head and trained norms go to ``modules_to_save``, and a
trained bias of any other module is refused (one tuner type per PEFT adapter).

What PEFT cannot express is refused with an error naming the part: a bias added to a bias-less module
(PEFT declines to add biases: a BEFT delta there could not be merged), a fused chunk (GPT-2's ``c_attn``
thirds) or any bias of a non-Linear module (BEFT wraps ``nn.Linear`` only), weight matrices selected by
patterns, and adapters of other methods (LoRA parts, random subsets, ...).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import List, Optional, Union

import torch
from torch import nn

from bitfit_hf.adapters.adapter import BitFitAdapter
from bitfit_hf.adapters.auto import AutoBitFitModel
from bitfit_hf.adapters.config import AdapterError
from bitfit_hf.adapters.export import check_export_target, replace_dir
from bitfit_hf.adapters.task_types import LABELLED
from bitfit_hf.tuners import METHODS, tensor_role_of
from bitfit_hf.tuners.bias.selection import resolve
from bitfit_hf.tuners.peft_layers import BASE_LAYER
from bitfit_hf.utils.constants import CONFIG_NAME
from bitfit_hf.utils.io import read_json_object
from bitfit_hf.utils.names import is_under


class PeftExportError(AdapterError):
    """A part of the adapter has no PEFT equivalent; the message names it."""


@dataclass
class PeftPlan:
    """Where each part of a BitFit adapter goes in a PEFT BEFT adapter."""

    beft_targets: List[str] = field(default_factory=list)  # nn.Linear modules carrying a bias delta
    modules_to_save: List[str] = field(default_factory=list)  # norms with trained tensors, then the head


def _method_refusal(method: str) -> str:
    """Why an adapter of ``method`` has no PEFT export ("" when it has one: BEFT, or a peft tuner of its own)."""
    spec = METHODS.get(method)
    if spec is not None and (spec.beft_export or spec.supports("peft_model")):
        return ""
    what = f" ({spec.description})" if spec is not None and spec.description else ""
    if spec is not None and spec.peft_refusal:
        return spec.peft_refusal.rstrip(".") + "."
    return (f"it is an adapter of method {method!r}{what}; PEFT's BEFT tuner expresses plain BitFit selections "
            "(whole bias vectors) only.")


def _is_beft(method: str) -> bool:
    spec = METHODS.get(method)
    return spec is not None and spec.beft_export


def _own_tuner(method: str):
    """The method's PEFT export hook when it writes a tuner of its own (``Method.peft_model``)."""
    spec = METHODS.get(method)
    return spec.peft_model if spec is not None and spec.supports("peft_model") else None


def own_tuner_plan(adapter: BitFitAdapter, model: nn.Module) -> PeftPlan:
    """The layout of an adapter whose method exports its own peft tuner (``Method.peft_model``): the
    method's tensors go to the tuner, the head and trained norms to ``modules_to_save``. A trained bias of any
    other module is a :class:`PeftExportError`: a PEFT adapter holds one tuner type, and ``modules_to_save`` would
    ship that module's whole weight matrix."""
    cfg = adapter.config
    spec = METHODS[cfg.method]
    name_of_method = spec.display_name or cfg.method
    if cfg.added_biases:
        first = next(iter(cfg.added_biases))
        raise PeftExportError(f"Cannot export to PEFT: the bias added to {first!r}: the stock {cfg.architecture} has "
                              "none there, and PEFT adds no biases. Keep the bitfit-hf adapter format for this model.")
    modules = dict(model.named_modules())
    heads = [h for h in cfg.head_modules if any(is_under(n, [h]) for n in adapter.tensors)]
    plan = PeftPlan()
    for name in adapter.tensors:
        if is_under(name, heads) or tensor_role_of(cfg.method, name) is not None:
            continue
        module_name = name.replace(f".{BASE_LAYER}.", ".").rpartition(".")[0]  # a peft-wrapped layer's stock name
        module = modules.get(module_name)
        if module is None:
            raise PeftExportError(f"Cannot export to PEFT: {name!r} is not a parameter of {type(model).__name__}.")
        if all(p.dim() == 1 for p in module.parameters(recurse=False)):
            if module_name not in plan.modules_to_save:
                plan.modules_to_save.append(module_name)
            continue
        raise PeftExportError(
            f"Cannot export to PEFT: the trained bias {name!r} of a {type(module).__name__} beside the "
            f"{name_of_method} tensors. A PEFT adapter holds one tuner type, peft's {name_of_method} tuner has no bias "
            "part, and modules_to_save would ship the module's whole weight matrix. Keep the bitfit-hf format, or "
            "`bitfit-hf merge` it into a plain checkpoint."
        )
    plan.modules_to_save += heads
    return plan


def _pooling_refusal(cfg) -> str:
    return (f"this adapter classifies from the sentence-transformers checkpoint's {cfg.sentence_pooling} pooling "
            f"(its untrained pooler removed); a PEFT adapter on the stock {cfg.architecture} classifies from the "
            "pooler. Train with --pooling_head train_pooler for an adapter that exports")


def peft_plan(adapter: BitFitAdapter, model: nn.Module) -> PeftPlan:
    """The PEFT layout of ``adapter`` on ``model`` (a stock base: real or on the meta device); a
    :class:`PeftExportError` naming the first part PEFT cannot express."""
    cfg = adapter.config
    if not _is_beft(cfg.method):
        raise PeftExportError(f"Cannot export to PEFT as BEFT: {_method_refusal(cfg.method) or 'its method exports its own tuner'}")
    if cfg.added_biases:
        first = next(iter(cfg.added_biases))
        raise PeftExportError(
            f"Cannot export to PEFT: the bias added to {first!r} (and {len(cfg.added_biases) - 1} more): the stock "
            f"{cfg.architecture} has no bias there, and PEFT does not add biases to bias-less layers (a BEFT delta "
            "there cannot be merged). Keep the bitfit-hf adapter format for this model."
        )
    selection = resolve(model, cfg.bitfit_config())
    chunks = selection.chunk_masks()
    if chunks:
        name, parts = next(iter(chunks.items()))
        roles = [e.role for e in selection.entries if e.name == name and e.chunk is not None]
        raise PeftExportError(
            f"Cannot export to PEFT: {' '.join(dict.fromkeys(roles))}, {len(parts)} of the {parts[0][1]} fused parts of "
            f"{name!r} (GPT-2's c_attn holds the q, k and v biases end to end): PEFT has no way to train part of a "
            "bias vector. Keep the bitfit-hf format for this adapter."
        )
    modules = dict(model.named_modules())
    heads = [h for h in cfg.head_modules if any(is_under(n, [h]) for n in adapter.tensors)]
    plan = PeftPlan()
    for name in adapter.tensors:
        if is_under(name, heads):
            continue
        module_name, _, attr = name.rpartition(".")
        module = modules.get(module_name)
        if module is None:
            raise PeftExportError(f"Cannot export to PEFT: {name!r} is not a parameter of {type(model).__name__}.")
        if attr == "bias" and isinstance(module, nn.Linear):
            if module_name not in plan.beft_targets:
                plan.beft_targets.append(module_name)
        elif all(p.dim() == 1 for p in module.parameters(recurse=False)):
            if module_name not in plan.modules_to_save:
                plan.modules_to_save.append(module_name)
        elif attr == "bias":
            raise PeftExportError(
                f"Cannot export to PEFT: the bias {name!r} belongs to a {type(module).__name__}, and PEFT's BEFT "
                "tuner adds bias deltas to nn.Linear layers only (saving the whole module would carry its weight "
                "matrix). Keep the bitfit-hf format for this model."
            )
        else:
            raise PeftExportError(
                f"Cannot export to PEFT: {name!r} is a weight matrix selected by a pattern; a BEFT adapter carries "
                "biases, norms and the head only."
            )
    if not plan.beft_targets:  # peft's BEFT tuner refuses a config that targets no module
        raise PeftExportError(
            "Cannot export to PEFT: the adapter trains no bias of a Linear layer (only "
            f"{', '.join(plan.modules_to_save + heads) or 'nothing'}: a head-only adapter such as --method frozen), and "
            "PEFT's BEFT tuner needs at least one to target. Keep the bitfit-hf format for this adapter."
        )
    plan.modules_to_save += heads
    return plan


def is_peft_adapter(folder: str) -> bool:
    """A PEFT adapter folder (its ``adapter_config.json`` names a ``peft_type``)."""
    return "peft_type" in (read_json_object(os.path.join(folder, CONFIG_NAME)) or {})


def export_peft(
    adapter: Union[str, BitFitAdapter],
    save_directory: str,
    base_model: Union[None, str, nn.Module] = None,
    check_base: bool = True,
    **model_kwargs,
) -> str:
    """Write ``adapter`` (an adapter, its folder or Hub id) as a PEFT adapter (BEFT; (IA)³ adapters as peft IA3) into ``save_directory``
    (replaced atomically); returns the directory. ``base_model`` overrides the recorded base (a path, a Hub
    id, or a stock model, which is changed in place). Loading it::

        model = AutoModelForSequenceClassification.from_pretrained(base_id, num_labels=...)
        model = peft.PeftModel.from_pretrained(model, save_directory)
    """
    import peft

    check_export_target(save_directory, is_peft_adapter, "PEFT adapter")
    if isinstance(adapter, str):
        adapter = BitFitAdapter.from_pretrained(adapter)
    cfg = adapter.config
    refusal = _method_refusal(cfg.method)
    if refusal:  # before any model is loaded
        raise PeftExportError(f"Cannot export to PEFT: {refusal}")
    if cfg.sentence_pooling:
        raise PeftExportError(f"Cannot export to PEFT: {_pooling_refusal(cfg)}")
    own_tuner = _own_tuner(cfg.method)
    if own_tuner is None and not hasattr(peft, "BeftConfig"):
        raise PeftExportError(f"peft {peft.__version__} has no BEFT tuner: install peft >= 0.20 to export.")
    model = base_model if isinstance(base_model, nn.Module) else AutoBitFitModel.build_base(adapter, base_model, **model_kwargs)
    if own_tuner is not None:
        plan = own_tuner_plan(adapter, model)
        adapter.apply_to(model, check_base=check_base)  # checks the base; the method's layers, norms and head
        peft_model = own_tuner(model, cfg.tuner_config(), plan.modules_to_save, cfg.task_type)
    else:
        peft_model = _beft_model(adapter, model, check_base)
    # peft records the folder the model was loaded from; users need the base the adapter names (a Hub id).
    peft_model.peft_config[peft_model.active_adapter].base_model_name_or_path = cfg.base_model_name_or_path or None
    peft_model.peft_config[peft_model.active_adapter].revision = cfg.base_model_revision

    parent = os.path.dirname(os.path.abspath(save_directory))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".export-peft-", dir=parent)
    try:
        peft_model.save_pretrained(tmp, save_embedding_layers=False)
        replace_dir(tmp, save_directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return save_directory


def _beft_model(adapter: BitFitAdapter, model: nn.Module, check_base: bool):
    """A plain BitFit adapter as a peft BEFT model: bias deltas on Linear layers, norms and head saved whole."""
    import peft

    cfg = adapter.config
    plan = peft_plan(adapter, model)
    params = dict(model.named_parameters())
    stock = {m: params[f"{m}.bias"].detach().clone() for m in plan.beft_targets}
    adapter.apply_to(model, check_base=check_base)  # checks the base, writes trained biases, norms and head
    deltas = {m: (params[f"{m}.bias"].detach() - stock[m]).reshape(1, -1) for m in plan.beft_targets}
    with torch.no_grad():
        for module_name, value in stock.items():  # the base keeps its stock biases; BEFT adds the deltas
            params[f"{module_name}.bias"].copy_(value)
    peft_config = peft.BeftConfig(
        task_type=cfg.task_type,
        target_modules=list(plan.beft_targets),
        modules_to_save=list(plan.modules_to_save),
        base_model_name_or_path=cfg.base_model_name_or_path or None,
        revision=cfg.base_model_revision,
    )
    peft_model = peft.get_peft_model(model, peft_config)
    inner = peft_model.get_base_model()
    with torch.no_grad():
        for module_name, delta in deltas.items():
            layer = inner.get_submodule(module_name)
            layer.beft_bias[peft_model.active_adapter].copy_(delta.to(layer.beft_bias[peft_model.active_adapter]))
    return peft_model


def peft_export_blocker(adapter: BitFitAdapter, model: Optional[nn.Module] = None) -> Optional[str]:
    """Why ``adapter`` cannot be exported to PEFT (``None``: it can). Without ``model``, the check runs on
    a weightless (meta-device) copy of the recorded base's architecture, built from its config; when that
    config is not at hand, the answer is a reason too (nothing is claimed unchecked)."""
    if _method_refusal(adapter.config.method):
        return _method_refusal(adapter.config.method)
    if adapter.config.sentence_pooling:
        return _pooling_refusal(adapter.config)
    try:
        import peft

        own_tuner = _own_tuner(adapter.config.method)
        if own_tuner is None and not hasattr(peft, "BeftConfig"):
            return f"peft {peft.__version__} has no BEFT tuner"
        if model is None:
            model = _meta_base(adapter)
        (own_tuner_plan if own_tuner is not None else peft_plan)(adapter, model)
    except PeftExportError as err:
        return str(err)
    except (OSError, ValueError, ImportError) as err:
        return f"the base model's architecture could not be checked ({err.__class__.__name__})"
    return None


def _meta_base(adapter: BitFitAdapter, source: Optional[str] = None) -> nn.Module:
    """The adapter's base class built from the base config on the meta device (no weights)."""
    import transformers

    cfg = adapter.config
    config = transformers.AutoConfig.from_pretrained(source or cfg.base_model_name_or_path,
                                                     revision=cfg.base_model_revision or None)
    if cfg.num_labels and cfg.task_type in LABELLED:
        config.num_labels = cfg.num_labels
    model_cls = getattr(transformers, cfg.architecture)
    with torch.device("meta"):
        return model_cls(config)
