"""Several task adapters on one backbone: load once, switch the active task in place.

Switching rebinds each touched parameter's ``.data`` to tensors prepared at load time (already on the
model's device and dtype), so it costs one pointer swap per bias tensor and never touches the frozen
weights. Heads of different sizes swap the same way, and the label maps follow.

Methods whose tensors live in peft layers (BitFit + LoRA, (IA)³, BitFit + (IA)³) bring those tensors too.
The bank asks the method (its registry hooks ``bank_modules`` / ``bank_attach`` / ``bank_switch``) to wrap
their modules once, turned off (the stock model's outputs do not change), and keeps every tensor under its
stock name (``query.bias``, not ``query.base_layer.bias``), so bias-only and wrapped tasks share one table.
Activating a task swaps its tensors in and has each method turn its layers on exactly in that task's
modules, with the task's settings (LoRA's scaling); a task that does not use a method, or
:meth:`AdapterBank.restore_base`, turns that method's layers off, so those run the stock forward, bit for
bit.
"""

from __future__ import annotations

import copy
from types import MappingProxyType
from typing import Dict, List, Mapping, Optional, Tuple, Union

import torch
from torch import nn

from bitfit_hf.adapters import sparse as sparse_format
from bitfit_hf.adapters.adapter import BitFitAdapter, prepare_base_for
from bitfit_hf.adapters.config import AdapterError, BaseModelMismatchError
from bitfit_hf.tuners import METHODS, method_spec
from bitfit_hf.tuners.bias.layer import add_zero_bias, has_bias, remove_added_bias
from bitfit_hf.tuners.peft_layers import is_branch_parameter, peft_layers, stock_name
from bitfit_hf.tuners.state import unwrap
from bitfit_hf.utils.fingerprint import base_fingerprint


class AdapterBank:
    """Task adapters over one frozen model. ``bank.activate("sst2")``; ``bank.restore_base()``."""

    def __init__(self, model: nn.Module):
        self.model = unwrap(model)
        self.adapters: Dict[str, BitFitAdapter] = {}
        self._tensors: Dict[str, Dict[str, torch.Tensor]] = {}
        self._base: Dict[str, torch.Tensor] = {}
        self._added: set = set()
        self._switched: Dict[str, Dict[str, object]] = {}  # task -> {method: its settings (bank_attach)}
        self._inserted: set = set()  # parameters of modules a method inserted (never part of the base)
        self.active: Optional[str] = None
        self._base_labels = _labels_of(self.model)  # put back by restore_base()

    @property
    def names(self) -> List[str]:
        return list(self.adapters)

    def task_tensors(self, name: str) -> Mapping[str, torch.Tensor]:
        """The tensors ``activate(name)`` puts in place, under stock names (read-only view)."""
        if name not in self._tensors:
            raise KeyError(f"No adapter named {name!r}; loaded: {self.names}.")
        return MappingProxyType(self._tensors[name])

    def stock_tensor(self, name: str) -> Optional[torch.Tensor]:
        """The base model's own value of a tensor some task replaces (``None`` if no task touches it)."""
        return self._base.get(name)

    def add(self, name: str, adapter: Union[str, BitFitAdapter], check_base: bool = True, **hub_kwargs) -> None:
        """Register an adapter (object, local directory or Hub id) under ``name``.

        All or nothing: when the adapter does not fit (another base, tensors this model lacks), the error is
        raised with the model as it was: the biases this call added are taken out again and the task that
        was active is active again. Modules the call inserted (AdapterBias shifts, LoRA layers) take the
        model's mode; they change no output while no task using them is active."""
        if name in self.adapters:
            raise ValueError(f"An adapter named {name!r} is already loaded; remove() it first or pick another name.")
        if isinstance(adapter, str):
            adapter = BitFitAdapter.from_pretrained(adapter, **hub_kwargs)
        cfg = adapter.config
        found_type = getattr(self.model.config, "model_type", "")
        if cfg.model_type != found_type:
            raise AdapterError(f"Adapter {name!r} is for a {cfg.model_type!r} model, this backbone is {found_type!r}.")
        _check_same_pooling(name, cfg, self.adapters.values())
        wrapped = _wrapped_modules(name, adapter)  # {method: modules its layers wrap for this adapter}
        wrapped_now = [m for modules in wrapped.values() for m in modules]
        modules = dict(self.model.named_modules())
        missing = [m for m in cfg.added_biases if m not in modules]
        if missing:
            raise AdapterError(f"Adapter {name!r} adds a bias to {missing[0]!r}, which this model does not have.")
        trained = {stock_name(n, wrapped_now) for n in cfg.trained_parameters}
        previous = self.active
        self.restore_base()
        added_now: List[tuple] = []  # (module name, module, whether it had an empty ``bias`` slot)
        base_before, inserted_before = set(self._base), set(self._inserted)
        try:
            for module_name in cfg.added_biases:
                module = modules[module_name]
                if not has_bias(module):
                    slot = "bias" in module._parameters
                    add_zero_bias(module)
                    added_now.append((module_name, module, slot))
                    self._added.add(f"{module_name}.bias")
            before = set(self._params())
            prepare_base_for(self.model, cfg)  # AdapterBias: its shifts (zero, so the base is unchanged)
            self._inserted.update(n for n in self._params() if n not in before)
            if check_base:
                # The fingerprint covers the stock weights under their stock names (as at training time).
                found = base_fingerprint(
                    _StockView(self.model),
                    exclude=trained | self._added | self._inserted | {f"{m}.bias" for m in cfg.added_biases},
                    head_modules=cfg.head_modules,
                )
                if found != cfg.base_fingerprint:
                    raise BaseModelMismatchError(
                        f"Adapter {name!r} was trained on {cfg.base_model_name_or_path!r}; this backbone's frozen "
                        f"weights differ (fingerprint {found}, expected {cfg.base_fingerprint})."
                    )
            dense, sparse = sparse_format.split(adapter.tensors, cfg.sparse_parameters)
            dense = {stock_name(n, wrapped_now): t for n, t in dense.items()}
            if wrapped:
                self._attach_layers(name, adapter, wrapped)
            params = self._params()
            unknown = [n for n in list(dense) + list(sparse) if n not in params]
            if unknown:
                raise AdapterError(f"Adapter {name!r} holds tensors this model lacks: {unknown[:5]}.")
            prepared = {}
            for tensor_name, tensor in dense.items():
                param = params[tensor_name]
                if tensor_name not in self._base:
                    self._base[tensor_name] = param.data
                prepared[tensor_name] = tensor.to(device=param.device, dtype=param.dtype)
            for tensor_name, (indices, values) in sparse.items():  # entries of a weight: one dense copy per task
                param = params[tensor_name]
                if tensor_name not in self._base:
                    self._base[tensor_name] = param.data
                prepared[tensor_name] = sparse_format.densify(self._base[tensor_name], indices, values)
        except BaseException:
            for tensor_name in set(self._base) - base_before:
                self._base.pop(tensor_name)
            for module_name, module, slot in reversed(added_now):
                remove_added_bias(module, slot)
                self._added.discard(f"{module_name}.bias")
            self._inserted = inserted_before | {n for n in self._inserted if n in self._params()}
            self._switched.pop(name, None)
            if previous is not None:
                self.activate(previous)
            raise
        self.adapters[name] = adapter
        self._tensors[name] = prepared
        if previous is not None:
            self.activate(previous)

    def _attach_layers(self, name: str, adapter: BitFitAdapter, wrapped: Dict[str, List[str]]) -> None:
        """Each method wraps the task's modules where the backbone has none of its layers yet (turned off until
        a task using them is active); the task's settings per method are kept for :meth:`activate`."""
        settings = {}
        for method, modules in wrapped.items():
            clash = [m for m in modules if m in _modules_of_other_methods(self, method)]
            if clash:
                raise AdapterError(
                    f"Adapter {name!r} ({method}) needs {clash[0]!r}, which another method's layer of this bank already "
                    "wraps: one module holds one method's layers. Serve these tasks from banks of their own."
                )
            try:
                settings[method] = method_spec(method).bank_attach(self.model, modules, adapter.config.method_config)
            except ValueError as err:
                raise AdapterError(f"Adapter {name!r}: {err}.") from None
        self._switched[name] = settings

    def remove(self, name: str) -> None:
        if self.active == name:
            self.restore_base()
        self.adapters.pop(name)
        self._tensors.pop(name)
        self._switched.pop(name, None)

    def _params(self) -> Dict[str, nn.Parameter]:
        """The model's parameters under their stock names (peft-wrapped modules' ``base_layer`` dropped)."""
        wrapped = list(peft_layers(self.model))
        return {stock_name(n, wrapped): p for n, p in self.model.named_parameters()}

    def _switch_layers(self, name: Optional[str]) -> None:
        """Every method with layers in this bank turns them on for the task's modules, with its settings, and off
        everywhere else (``name`` None, or a task that does not use the method: all off)."""
        settings = self._switched.get(name, {}) if name is not None else {}
        used = {method for task in self._switched.values() for method in task}
        switches: Dict[str, Tuple[object, object]] = {}  # methods of one layer kind (ia3 / bitfit_ia3) share a switch
        for method in sorted(used):
            spec = method_spec(method)
            if switches.get(spec.layer_kind, (None, None))[1] is None:
                switches[spec.layer_kind] = (spec, settings.get(method))
        for spec, task_settings in switches.values():
            spec.bank_switch(self.model, task_settings)

    def activate(self, name: str) -> None:
        """Make ``name`` the active task: its biases and head, in place, without touching weights."""
        if name not in self._tensors:
            raise KeyError(f"No adapter named {name!r}; loaded: {self.names}.")
        tensors = self._tensors[name]
        params = self._params()
        for tensor_name, base in self._base.items():
            params[tensor_name].data = tensors.get(tensor_name, base)
        self._switch_layers(name)
        self._set_labels(self.adapters[name])
        self.active = name

    def restore_base(self) -> None:
        """Put the base model's own biases, head and label names back; added biases return to zero."""
        params = self._params()
        for tensor_name, base in self._base.items():
            params[tensor_name].data = base
        self._switch_layers(None)
        _put_labels(self.model, self._base_labels)
        self.active = None

    def _set_labels(self, adapter: BitFitAdapter) -> None:
        """The task's labels over the base's: a task that records none (or no problem type) gets the base's."""
        _put_labels(self.model, self._base_labels)
        cfg, hf = adapter.config, self.model.config
        if cfg.id2label:
            hf.id2label = {int(k): v for k, v in cfg.id2label.items()}
            hf.label2id = {k: int(v) for k, v in (cfg.label2id or {}).items()}
        if cfg.num_labels:
            hf.num_labels = cfg.num_labels
            if hasattr(self.model, "num_labels"):
                self.model.num_labels = cfg.num_labels
        hf.problem_type = cfg.problem_type


def _labels_of(model: nn.Module) -> dict:
    """The label fields of a model's config (and ``model.num_labels``), copied."""
    hf = getattr(model, "config", None)
    found = {key: copy.deepcopy(getattr(hf, key, None)) for key in ("id2label", "label2id", "problem_type")}
    found["model_num_labels"] = getattr(model, "num_labels", None)
    return found


def _put_labels(model: nn.Module, labels: dict) -> None:
    hf = getattr(model, "config", None)
    if hf is None:
        return
    for key in ("id2label", "label2id", "problem_type"):
        setattr(hf, key, copy.deepcopy(labels[key]))
    if labels["model_num_labels"] is not None and hasattr(model, "num_labels"):
        model.num_labels = labels["model_num_labels"]


def _wrapped_modules(name: str, adapter: BitFitAdapter) -> Dict[str, List[str]]:
    """``{method: modules}`` whose peft layers the adapter's own tensors need (its method's ``bank_modules``)."""
    try:
        spec = method_spec(adapter.config.method)
    except ValueError as err:
        raise AdapterError(f"Adapter {name!r}: {err}") from None
    modules = spec.bank_modules(list(adapter.tensors))
    return {spec.name: modules} if modules else {}


def _modules_of_other_methods(bank: "AdapterBank", method: str) -> set:
    """Modules that the layers of methods other than ``method`` already wrap in the bank's model."""
    found = set()
    own = METHODS[method].layer_kind
    for other in {m for task in bank._switched.values() for m in task if m != method}:
        spec = METHODS[other]
        if spec.layer_kind != own:  # not layers of the same kind
            found.update(spec.bank_layers(bank.model))
    return found


class _StockView(nn.Module):
    """A model seen with stock parameter names, for the base fingerprint (no copy, no registration)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        object.__setattr__(self, "_inner", model)
        self.base_model_prefix = getattr(model, "base_model_prefix", "")

    def named_parameters(self, *args, **kwargs):
        wrapped = list(peft_layers(self._inner))
        for name, param in self._inner.named_parameters(*args, **kwargs):
            if not is_branch_parameter(name, wrapped):
                yield stock_name(name, wrapped), param


def _check_same_pooling(name: str, cfg, loaded) -> None:
    """Tasks on one backbone share how it pools a sentence: the checkpoint's pooling (pooler removed) or
    the model's own pooler; an adapter trained the other way is refused before anything changes."""
    pooling = {adapter.config.sentence_pooling for adapter in loaded}
    if not pooling or pooling == {cfg.sentence_pooling}:
        return

    def what(mode):
        return f"{mode} pooling" if mode else "the model's own pooler"

    raise AdapterError(
        f"Adapter {name!r} classifies from {what(cfg.sentence_pooling)}; the adapters loaded classify from "
        f"{what(next(iter(pooling)))}. Tasks on one backbone share its pooling: train them with the same --pooling_head."
    )
