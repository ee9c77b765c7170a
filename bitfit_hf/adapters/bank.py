"""Several task adapters on one backbone: load once, switch the active task in place.

An adapter's tensors are of two sorts. Tensors of the stock model (biases, norm gains, the head, entries of a
weight) are prepared at load time on the model's device and dtype, and switching rebinds each parameter's
``.data`` to them: one pointer swap per tensor, the frozen weights never touched. Tensors a method adds (LoRA
matrices, (IA)³ vectors, AdapterBias shifts) are held by the layer-level routing of
:mod:`bitfit_hf.adapters.routing`, the same contract a mixed batch uses: activating a task routes every example
to it, with the same operations in the same order as the method's own layers, so its outputs are those of the
adapter loaded alone, bit for bit. The model itself stays the stock architecture: nothing is wrapped or
inserted, so adapters of every method share one bank, and :meth:`AdapterBank.restore_base` gives the stock
model back.
"""

from __future__ import annotations

import copy
from types import MappingProxyType
from typing import Callable, Dict, List, Mapping, Optional, Tuple, Union

import torch
from torch import nn

from bitfit_hf.adapters import sparse as sparse_format
from bitfit_hf.adapters.adapter import BitFitAdapter, prepare_pooling_for
from bitfit_hf.adapters.config import AdapterError, BaseModelMismatchError
from bitfit_hf.adapters.routing import Router
from bitfit_hf.tuners import method_spec
from bitfit_hf.tuners.bias.layer import add_zero_bias, has_bias, remove_added_bias
from bitfit_hf.tuners.peft_layers import BASE_LAYER
from bitfit_hf.tuners.routes import ANY_SHIFT, Route
from bitfit_hf.tuners.state import unwrap
from bitfit_hf.utils.fingerprint import base_fingerprint


class AdapterBank:
    """Task adapters over one frozen model. ``bank.activate("sst2")``; ``bank.restore_base()``."""

    def __init__(self, model: nn.Module):
        self.model = unwrap(model)
        self.adapters: Dict[str, BitFitAdapter] = {}
        self._tensors: Dict[str, Dict[str, torch.Tensor]] = {}  # task -> stock tensors, swapped in
        self._routed: Dict[str, Dict[str, Tuple[Route, torch.Tensor]]] = {}  # task -> a method's own tensors
        self._base: Dict[str, torch.Tensor] = {}
        self._added: set = set()
        self.router = Router(self.model, self.stock_tensor)
        self._release: Optional[Callable[[], None]] = None
        self.active: Optional[str] = None
        self._base_labels = _labels_of(self.model)  # put back by restore_base()

    @property
    def names(self) -> List[str]:
        return list(self.adapters)

    def task_tensors(self, name: str) -> Mapping[str, torch.Tensor]:
        """Every tensor of task ``name`` under its stock-model name (read-only view): those ``activate(name)``
        swaps in and those the routing holds."""
        if name not in self._tensors:
            raise KeyError(f"No adapter named {name!r}; loaded: {self.names}.")
        return MappingProxyType({**self._tensors[name], **{n: t for n, (_, t) in self._routed[name].items()}})

    def stock_tensor(self, name: str) -> Optional[torch.Tensor]:
        """The base model's own value of a tensor some task replaces (``None`` if no task touches it, or the
        tensor is one a method adds)."""
        return self._base.get(name)

    def add(self, name: str, adapter: Union[str, BitFitAdapter], check_base: bool = True, **hub_kwargs) -> None:
        """Register an adapter (object, local directory or Hub id) under ``name``.

        All or nothing: when the adapter does not fit (another base, tensors this model lacks), the error is
        raised with the model as it was: the biases this call added are taken out again and the task that
        was active is active again."""
        if name in self.adapters:
            raise ValueError(f"An adapter named {name!r} is already loaded; remove() it first or pick another name.")
        if isinstance(adapter, str):
            adapter = BitFitAdapter.from_pretrained(adapter, **hub_kwargs)
        cfg = adapter.config
        found_type = getattr(self.model.config, "model_type", "")
        if cfg.model_type != found_type:
            raise AdapterError(f"Adapter {name!r} is for a {cfg.model_type!r} model, this backbone is {found_type!r}.")
        try:
            method_spec(cfg.method)
        except ValueError as err:
            raise AdapterError(f"Adapter {name!r}: {err}") from None
        _check_same_pooling(name, cfg, self.adapters.values())
        modules = dict(self.model.named_modules())
        missing = [m for m in cfg.added_biases if m not in modules]
        if missing:
            raise AdapterError(f"Adapter {name!r} adds a bias to {missing[0]!r}, which this model does not have.")
        previous = self.active
        self.restore_base()
        added_now: List[tuple] = []  # (module name, module, whether it had an empty ``bias`` slot)
        base_before = set(self._base)
        try:
            for module_name in cfg.added_biases:
                module = modules[module_name]
                if not has_bias(module):
                    slot = "bias" in module._parameters
                    add_zero_bias(module)
                    added_now.append((module_name, module, slot))
                    self._added.add(f"{module_name}.bias")
            prepare_pooling_for(self.model, cfg)
            if check_base:
                found = base_fingerprint(
                    self.model,
                    exclude={stock_name(n) for n in cfg.trained_parameters} | self._added
                    | {f"{m}.bias" for m in cfg.added_biases},
                    head_modules=cfg.head_modules,
                )
                if found != cfg.base_fingerprint:
                    raise BaseModelMismatchError(
                        f"Adapter {name!r} was trained on {cfg.base_model_name_or_path!r}; this backbone's frozen "
                        f"weights differ (fingerprint {found}, expected {cfg.base_fingerprint})."
                    )
            prepared, routed = self._split(name, adapter, modules)
        except BaseException:
            for tensor_name in set(self._base) - base_before:
                self._base.pop(tensor_name)
            for module_name, module, slot in reversed(added_now):
                remove_added_bias(module, slot)
                self._added.discard(f"{module_name}.bias")
            if previous is not None:
                self.activate(previous)
            raise
        self.adapters[name] = adapter
        self._tensors[name] = prepared
        self._routed[name] = routed
        self.router.add(name, routed)
        if previous is not None:
            self.activate(previous)

    def _split(self, name: str, adapter: BitFitAdapter, modules: Dict[str, nn.Module]):
        """``(stock tensors prepared for swapping, {name: (route, tensor)} of the method's own)``."""
        cfg = adapter.config
        dense, sparse = sparse_format.split(adapter.tensors, cfg.sparse_parameters)
        params = dict(self.model.named_parameters())
        prepared: Dict[str, torch.Tensor] = {}
        routed: Dict[str, Tuple[Route, torch.Tensor]] = {}
        spec = method_spec(cfg.method)
        for stored, tensor in dense.items():
            tensor_name = stock_name(stored)
            param = params.get(tensor_name)
            if param is not None:  # a head of another width swaps in the same way
                self._base.setdefault(tensor_name, param.data)
                prepared[tensor_name] = tensor.to(device=param.device, dtype=param.dtype)
                continue
            route = spec.route(self.model, stored, cfg.method_config)
            if route is None or (route.module not in modules and route.module != ANY_SHIFT):
                raise AdapterError(f"Adapter {name!r} holds tensors this model lacks: {stored!r}.")
            like = _module_tensor(modules.get(route.module), self.model)
            routed[stored] = (route, tensor.to(device=like.device, dtype=like.dtype if like.is_floating_point()
                                               and tensor.is_floating_point() else tensor.dtype))
        for tensor_name, (indices, values) in sparse.items():  # entries of a weight: one dense copy per task
            param = params.get(tensor_name)
            if param is None:
                raise AdapterError(f"Adapter {name!r} holds tensors this model lacks: {tensor_name!r}.")
            self._base.setdefault(tensor_name, param.data)
            prepared[tensor_name] = sparse_format.densify(self._base[tensor_name], indices, values)
        return prepared, routed

    def remove(self, name: str) -> None:
        if self.active == name:
            self.restore_base()
        self.adapters.pop(name)
        self._tensors.pop(name)
        self._routed.pop(name)
        self.router.delete(name)

    def activate(self, name: str) -> None:
        """Make ``name`` the active task: its stock tensors swapped in place, its method's own tensors routed."""
        if name not in self._tensors:
            raise KeyError(f"No adapter named {name!r}; loaded: {self.names}.")
        tensors = self._tensors[name]
        params = dict(self.model.named_parameters())
        for tensor_name, base in self._base.items():
            params[tensor_name].data = tensors.get(tensor_name, base)
        if self._release is not None:
            self._release()
        self._release = self.router.hold(name)
        self._set_labels(self.adapters[name])
        self.active = name

    def restore_base(self) -> None:
        """Put the base model's own biases, head and label names back; added biases return to zero."""
        params = dict(self.model.named_parameters())
        for tensor_name, base in self._base.items():
            params[tensor_name].data = base
        if self._release is not None:
            self._release()
            self._release = None
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


def stock_name(name: str) -> str:
    """A stored tensor's name in the stock architecture (a peft-wrapped ``q.base_layer.bias`` is ``q.bias``)."""
    return name.replace(f".{BASE_LAYER}.", ".")


def _module_tensor(module: Optional[nn.Module], model: nn.Module) -> torch.Tensor:
    """A tensor whose device and dtype a routed tensor of ``module`` takes (the model's for a shared one)."""
    for source in (module, model):
        if source is not None:
            found = next((p for p in source.parameters() if p.is_floating_point()), None)
            if found is not None:
                return found
    return torch.zeros(())


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
