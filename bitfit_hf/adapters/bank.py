"""Several task adapters on one backbone: load once, switch the active task in place.

Switching rebinds each touched parameter's ``.data`` to tensors prepared at load time (already on the
model's device and dtype), so it costs one pointer swap per bias tensor and never touches the frozen
weights. Heads of different sizes swap the same way, and the label maps follow.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Union

import torch
from torch import nn

from bitfit_hf.adapters import sparse as sparse_format
from bitfit_hf.adapters.adapter import BitFitAdapter, prepare_base_for
from bitfit_hf.adapters.config import AdapterError, BaseModelMismatchError
from bitfit_hf.tuners.bitfit.layer import add_zero_bias, has_bias
from bitfit_hf.tuners.bitfit.model import unwrap
from bitfit_hf.utils.fingerprint import base_fingerprint


class AdapterBank:
    """Task adapters over one frozen model. ``bank.activate("sst2")``; ``bank.restore_base()``."""

    def __init__(self, model: nn.Module):
        self.model = unwrap(model)
        self.adapters: Dict[str, BitFitAdapter] = {}
        self._tensors: Dict[str, Dict[str, torch.Tensor]] = {}
        self._base: Dict[str, torch.Tensor] = {}
        self._added: set = set()
        self._inserted: set = set()  # parameters of modules a method inserted (never part of the base)
        self.active: Optional[str] = None

    @property
    def names(self) -> List[str]:
        return list(self.adapters)

    def add(self, name: str, adapter: Union[str, BitFitAdapter], check_base: bool = True, **hub_kwargs) -> None:
        """Register an adapter (object, local directory or Hub id) under ``name``."""
        if name in self.adapters:
            raise ValueError(f"An adapter named {name!r} is already loaded; remove() it first or pick another name.")
        if isinstance(adapter, str):
            adapter = BitFitAdapter.from_pretrained(adapter, **hub_kwargs)
        cfg = adapter.config
        found_type = getattr(self.model.config, "model_type", "")
        if cfg.model_type != found_type:
            raise AdapterError(f"Adapter {name!r} is for a {cfg.model_type!r} model, this backbone is {found_type!r}.")
        previous = self.active
        self.restore_base()
        modules = dict(self.model.named_modules())
        for module_name in cfg.added_biases:
            if module_name not in modules:
                raise AdapterError(f"Adapter {name!r} adds a bias to {module_name!r}, which this model does not have.")
            if not has_bias(modules[module_name]):
                add_zero_bias(modules[module_name])
                self._added.add(f"{module_name}.bias")
        before = {n for n, _ in self.model.named_parameters()}
        prepare_base_for(self.model, cfg)  # AdapterBias: its shifts (zero, so the base is unchanged)
        params = dict(self.model.named_parameters())
        self._inserted.update(n for n in params if n not in before)
        dense, sparse = sparse_format.split(adapter.tensors, cfg.sparse_parameters)
        unknown = [n for n in list(dense) + list(sparse) if n not in params]
        if unknown:
            raise AdapterError(f"Adapter {name!r} holds tensors this model lacks: {unknown[:5]}.")
        if check_base:
            found = base_fingerprint(
                self.model,
                exclude=(set(cfg.trained_parameters) | self._added | self._inserted
                         | {f"{m}.bias" for m in cfg.added_biases}),
                head_modules=cfg.head_modules,
            )
            if found != cfg.base_fingerprint:
                raise BaseModelMismatchError(
                    f"Adapter {name!r} was trained on {cfg.base_model_name_or_path!r}; this backbone's frozen "
                    f"weights differ (fingerprint {found}, expected {cfg.base_fingerprint})."
                )
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
        self.adapters[name] = adapter
        self._tensors[name] = prepared
        if previous is not None:
            self.activate(previous)

    def remove(self, name: str) -> None:
        if self.active == name:
            self.restore_base()
        self.adapters.pop(name)
        self._tensors.pop(name)

    def activate(self, name: str) -> None:
        """Make ``name`` the active task: its biases and head, in place, without touching weights."""
        if name not in self._tensors:
            raise KeyError(f"No adapter named {name!r}; loaded: {self.names}.")
        tensors = self._tensors[name]
        params = dict(self.model.named_parameters())
        for tensor_name, base in self._base.items():
            params[tensor_name].data = tensors.get(tensor_name, base)
        self._set_labels(self.adapters[name])
        self.active = name

    def restore_base(self) -> None:
        """Put the base model's own biases (and head) back; added biases return to zero."""
        params = dict(self.model.named_parameters())
        for tensor_name, base in self._base.items():
            params[tensor_name].data = base
        self.active = None

    def _set_labels(self, adapter: BitFitAdapter) -> None:
        cfg, hf = adapter.config, self.model.config
        if cfg.id2label:
            hf.id2label = {int(k): v for k, v in cfg.id2label.items()}
            hf.label2id = {k: int(v) for k, v in (cfg.label2id or {}).items()}
        if cfg.num_labels:
            hf.num_labels = cfg.num_labels
            if hasattr(self.model, "num_labels"):
                self.model.num_labels = cfg.num_labels
        hf.problem_type = cfg.problem_type
