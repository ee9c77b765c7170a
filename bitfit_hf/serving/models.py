"""The models behind a server: one frozen base whose weights every task model shares, and the groups that
run the adapters.

* :class:`Backbone` loads the base once. A task model of another head type (token classification beside
  sequence classification, say) is built from the same checkpoint and its parameters are then pointed at
  the first model's storage wherever name, shape and values agree, so the frozen weights live in memory
  once whatever the number of head types.
* :class:`MixedGroup`: the adapters of one architecture, of every method, in one
  :class:`~bitfit_hf.adapters.bank.AdapterBank` read by a :class:`~bitfit_hf.adapters.multitask.MultiTaskModel`
  rebuilt (copy-on-write) whenever the set changes; a forward pass mixes them.
* :class:`SwitchGroup`: adapters served by switching (``--batching switch``, or an adapter whose tensors have no
  per-example route), in a bank of their own on a model of their own (its weights shared too).
* :class:`Registry` decides where an adapter goes and refuses, with one line, what cannot share the base.

Everything here is called from the server's one worker thread (or before it starts), except
:meth:`Registry.prebuild`, which builds a new head type's model off it and hands it over under a lock.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from bitfit_hf.adapters.adapter import BitFitAdapter
from bitfit_hf.adapters.auto import AutoBitFitModel
from bitfit_hf.adapters.bank import AdapterBank
from bitfit_hf.adapters.config import AdapterConfig, AdapterError
from bitfit_hf.adapters.multitask import MultiTaskModel, TaskRefused
from bitfit_hf.adapters.packing import packing_agrees
from bitfit_hf.adapters.task_types import QUESTION_ANS, SEQ_CLS, TOKEN_CLS
from bitfit_hf.data.assets import packaged_copy_or
from bitfit_hf.serving.config import ServeError
from bitfit_hf.tuners import method_spec
from bitfit_hf.utils.base_loading import loading_kwargs
from bitfit_hf.utils.errors import UserError, first_line
from bitfit_hf.utils.fingerprint import SKETCH_TOLERANCE, sketch_difference

logger = logging.getLogger(__name__)

#: Task types a server answers, and what a client gets back for each.
TASKS = {SEQ_CLS: "classification", TOKEN_CLS: "tagging", QUESTION_ANS: "question-answering"}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        found = torch.device(device)
    except RuntimeError as err:
        raise ServeError(f"--device {device!r} is not a torch device: {err}") from None
    if found.type == "cuda" and not torch.cuda.is_available():
        raise ServeError(f"--device {device}: this torch has no CUDA device; use --device cpu.")
    return found


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``--dtype``: ``auto`` is bfloat16 on a CUDA device (tensor cores; a GPU forward pass in float32 runs several
    times slower for answers that agree to bf16's precision) and float32 on a CPU."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)


class Backbone:
    """The frozen base, loaded once; every task model built later shares its weights."""

    def __init__(self, base_model: Optional[str] = None, device: str = "auto", dtype: str = "auto"):
        self.base_model = base_model  # --base-model; None: the base the first adapter records
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.stock: Dict[str, torch.Tensor] = {}
        self.model_type: Optional[str] = None
        self.source: Optional[str] = None
        self.revision: Optional[str] = None
        self.models_built = 0
        self.shared_tensors = 0
        self._first: Optional[AdapterConfig] = None

    @property
    def first_config(self) -> Optional[AdapterConfig]:
        """The config of the adapter whose base was loaded (``None`` before any)."""
        return self._first

    def describe(self) -> Dict[str, Any]:
        return {"model_id": self.source, "revision": self.revision, "model_type": self.model_type,
                "dtype": str(self.dtype).replace("torch.", ""), "device": str(self.device),
                "parameters": int(sum(t.numel() for t in self.stock.values()))}

    def build(self, adapter: BitFitAdapter) -> nn.Module:
        """A stock model of ``adapter``'s architecture on this base, its weights shared with the first."""
        cfg = adapter.config
        if self.model_type is not None and cfg.model_type != self.model_type:
            raise ServeError(f"it is for a {cfg.model_type!r} model; this server's base {self.source!r} is a "
                             f"{self.model_type!r}.")
        try:
            if self.base_model is not None:
                model = AutoBitFitModel.build_base(adapter, base_model=self.base_model)
            elif self._first is None:
                model = AutoBitFitModel.build_base(adapter)
            else:  # the first adapter's base, whatever this one records (the bank checks the fingerprint)
                first = self._first
                source = packaged_copy_or(first.base_model_name_or_path, first.base_model_revision)
                kwargs = dict(loading_kwargs(first.base_loading))
                if source == first.base_model_name_or_path and first.base_model_revision:
                    kwargs["revision"] = first.base_model_revision
                model = AutoBitFitModel.build_base(adapter, base_model=source, **kwargs)
        except UserError:
            raise
        except (OSError, ValueError) as err:  # transformers: the class does not fit this checkpoint
            raise ServeError(f"its base cannot be loaded as {cfg.architecture}: {first_line(err)}") from None
        model.requires_grad_(False)
        if not getattr(model, "quantization_method", None) and not getattr(model, "hf_quantizer", None):
            model.to(device=self.device, dtype=self.dtype)
        model.eval()
        self._share(model)
        if self._first is None:
            self._first = cfg
            self.model_type = cfg.model_type
            self.source = self.base_model or cfg.base_model_name_or_path
            self.revision = None if self.base_model else cfg.base_model_revision
        self.models_built += 1
        return model

    def _share(self, model: nn.Module) -> None:
        """Point ``model``'s parameters at the stock tensors where they are the same (name, shape, values)."""
        params = dict(model.named_parameters())
        if not self.stock:
            self.stock = {name: param.data for name, param in params.items()}
            return
        for name, param in params.items():
            ref = self.stock.get(name)
            if (ref is not None and ref.shape == param.shape and ref.dtype == param.dtype
                    and ref.device == param.device and torch.equal(ref, param.data)):
                param.data = ref
                self.shared_tensors += 1


def _size_bytes(adapter: BitFitAdapter) -> int:
    return int(sum(t.numel() * t.element_size() for t in adapter.tensors.values()))


def another_base(cfg: AdapterConfig, reference: Optional[AdapterConfig]) -> Optional[str]:
    """Why ``cfg`` was trained on another base than ``reference`` (``None``: the same, or no way to tell).

    Decided from the two adapters' recorded sketches of their bases (a few sampled frozen weights, compared
    within quantization error), before any model is touched: so a refusal names this cause first, not a
    consequence of it (another pooling, a tensor the model lacks)."""
    if reference is None or reference is cfg or not cfg.base_sketch or not reference.base_sketch:
        return None
    difference = sketch_difference(reference.base_sketch, cfg.base_sketch)
    if difference is None or difference <= SKETCH_TOLERANCE:
        return None
    return (f"it was trained on another base model: {cfg.base_model_name_or_path!r}, whose frozen weights differ "
            f"from those of this server's base {reference.base_model_name_or_path!r} (sampled weights "
            f"{difference:.0%} apart). One server serves adapters of one base; serve it from a server of its own.")


def mixable(cfg: AdapterConfig) -> Optional[str]:
    """``None`` when a mixed-task batch can route this adapter per example (every method's tensors have a route:
    :mod:`bitfit_hf.adapters.routing`), unless its method says it cannot (``Method.not_batchable``); otherwise why
    not (it is then served by switching). A tensor no route covers is found when the group is rebuilt."""
    spec = method_spec(cfg.method)
    return f"{cfg.method}: {spec.not_batchable}" if spec.not_batchable else None


@dataclass
class Entry:
    """A served adapter: what requests and ``GET /adapters`` need, read without touching the model."""

    name: str
    source: str
    revision: Optional[str]
    config: AdapterConfig
    task: str
    mode: str  # "mixed" or "switch"
    group: Tuple[str, str]
    size_bytes: int
    id2label: Dict[int, str] = field(default_factory=dict)
    switch_reason: Optional[str] = None

    def describe(self, base: Optional[str]) -> Dict[str, Any]:
        cfg = self.config
        return {
            "name": self.name, "source": self.source, "revision": self.revision,
            "commit": cfg.metadata.get("resolved_commit"),  # what a Hub id resolved to
            "method": cfg.method, "task": TASKS[self.task], "base": cfg.base_model_name_or_path,
            "served_on": base, "labels": [self.id2label[i] for i in sorted(self.id2label)],
            "size_bytes": self.size_bytes, "batching": self.mode,
            **({"switch_reason": self.switch_reason} if self.switch_reason else {}),
            **({"sentence_pooling": cfg.sentence_pooling} if cfg.sentence_pooling else {}),
        }


class MixedGroup:
    """Adapters of one architecture whose examples share forward passes."""

    mode = "mixed"

    def __init__(self, model: nn.Module, packing: str = "auto"):
        self.bank = AdapterBank(model)
        self.model = self.bank.model
        self.mt: Optional[MultiTaskModel] = None
        self.packing = packing
        self.packs: Optional[bool] = None  # decided by the first build_tables, on the worker

    @property
    def names(self) -> List[str]:
        return self.bank.names

    def add(self, name: str, adapter: BitFitAdapter) -> None:
        """Into the bank (refusals raise, all or nothing); call :meth:`rebuild` to route it."""
        self.bank.add(name, adapter)

    def rebuild(self, candidates: List[str]) -> List[Tuple[str, Exception]]:
        """A new routing over every adapter in the bank (copy-on-write: the old one serves until this one is
        built). Adapters among ``candidates`` that cannot be routed per example are taken out again and
        returned with the reason: the one a :class:`TaskRefused` names, else every candidate."""
        failed: List[Tuple[str, Exception]] = []
        candidates = list(candidates)
        while self.bank.names:
            try:
                self.mt = MultiTaskModel(self.bank, tasks=self.bank.names)
                return failed
            except AdapterError as err:
                culprits = _culprits(err, candidates)
                if not culprits:
                    raise
                for culprit in culprits:
                    self.bank.remove(culprit)
                    candidates.remove(culprit)
                    failed.append((culprit, err))
        self.mt = None
        return failed

    def remove(self, name: str) -> None:
        self.bank.remove(name)
        self.rebuild([])

    def build_tables(self) -> None:
        """The routing tables, built on the calling thread (the worker's: see :meth:`MultiTaskModel.build_tables`);
        the first time, whether this model's passes are packed: ``--packing auto`` packs a model whose packed
        pass gives what its padded pass gives on a probe batch (a check that runs the model, so on the worker)."""
        if self.mt is not None:
            self.mt.build_tables()
        if self.packs is None:
            self.packs = self.packing == "auto" and packing_agrees(self.model)
            if self.packing == "auto" and not self.packs:
                logger.info("bitfit-hf serve: %s passes are padded, not packed: its encoder is not one packing "
                            "gives the same outputs on (--packing).", type(self.model).__name__)

    def forward(self, batch: Dict[str, torch.Tensor], tasks: List[str]):
        return self.mt(task_ids=tasks, pack=bool(self.packs), **batch)


def _culprits(err: AdapterError, candidates: List[str]) -> List[str]:
    """The candidates to take out after ``err``: the one it names, else all of them (a refusal of an adapter
    served before, or of none, comes from what the new ones brought)."""
    named = err.task if isinstance(err, TaskRefused) else None
    return [named] if named in candidates else list(candidates)


class SwitchGroup:
    """Adapters of one architecture served one at a time, by switching the bank's active task."""

    mode = "switch"

    def __init__(self, model: nn.Module):
        self.bank = AdapterBank(model)
        self.model = self.bank.model
        self.switches = 0

    @property
    def names(self) -> List[str]:
        return self.bank.names

    @property
    def active(self) -> Optional[str]:
        return self.bank.active

    def add(self, name: str, adapter: BitFitAdapter) -> None:
        self.bank.add(name, adapter)

    def remove(self, name: str) -> None:
        self.bank.remove(name)

    def build_tables(self) -> None:
        """Nothing to build: a switched adapter is written into the model when it is activated."""

    def forward(self, batch: Dict[str, torch.Tensor], name: str):
        if self.bank.active != name:
            self.bank.activate(name)
            self.switches += 1
        return self.model(**batch)


class Registry:
    """The served adapters. ``entries`` is replaced, never changed in place (copy-on-write): request
    handlers read it from other threads while the worker adds and removes."""

    def __init__(self, backbone: Backbone, batching: str = "mixed", packing: str = "auto"):
        self.backbone = backbone
        self.batching = batching
        self.packing = packing
        self.groups: Dict[Tuple[str, str], Any] = {}
        self._entries: Mapping[str, Entry] = MappingProxyType({})
        self._built: Dict[Tuple[str, str], nn.Module] = {}  # models built ahead, off the worker (prebuild)
        self._building = threading.Lock()

    @property
    def entries(self) -> Mapping[str, Entry]:
        return self._entries

    def _publish(self, entries: Dict[str, Entry]) -> None:
        self._entries = MappingProxyType(dict(entries))

    def check(self, name: str, adapter: BitFitAdapter, reference: Optional[AdapterConfig] = None) -> None:
        """Refusals that need no model, the first real cause first: the task, a method that cannot share the
        base, another base type, another base (than ``reference``, else the loaded base's adapter)."""
        cfg = adapter.config
        if name in self._entries:
            raise ServeError(f"an adapter named {name!r} is already served; remove it first or pick another name.")
        if cfg.task_type not in TASKS:
            raise ServeError(f"it is a {cfg.task_type or 'untyped'} adapter ({cfg.architecture}); the server answers "
                             "classification, token classification (tagging) and extractive QA adapters.")
        if cfg.sparse_parameters:
            raise ServeError(f"it is a {cfg.method} adapter: it changes entries of weight matrices "
                             f"({cfg.sparse_parameters[0]!r}, ...), so every task would hold its own copy of them and "
                             "cannot share the frozen base; serve it alone (bitfit-hf merge, then any server).")
        try:
            method_spec(cfg.method)
        except ValueError as err:
            raise ServeError(str(err)) from None
        if self.backbone.model_type is not None and cfg.model_type != self.backbone.model_type:
            raise ServeError(f"it is for a {cfg.model_type!r} model; this server's base {self.backbone.source!r} is a "
                             f"{self.backbone.model_type!r}.")
        reason = another_base(cfg, self.backbone.first_config or reference)
        if reason:
            raise ServeError(reason)

    def _mode(self, adapter: BitFitAdapter) -> Tuple[str, Optional[str]]:
        reason = "--batching switch" if self.batching == "switch" else mixable(adapter.config)
        return ("switch" if reason else "mixed"), reason

    def prebuild(self, adapter: BitFitAdapter) -> None:
        """Build the model a new group for ``adapter`` needs (a new head type), on the calling thread: an admin add
        calls this off the worker, so inference goes on meanwhile; the worker's add then only takes it. Nothing
        the worker reads changes here (the backbone's shared tensors are only read)."""
        if self.backbone.first_config is None:
            return  # the first model sets the base: built by the add itself
        key = (adapter.config.architecture, self._mode(adapter)[0])
        with self._building:
            if key in self.groups or key in self._built:
                return
            self._built[key] = self.backbone.build(adapter)

    def _group(self, mode: str, adapter: BitFitAdapter):
        key = (adapter.config.architecture, mode)
        if key not in self.groups:
            with self._building:
                model = self._built.pop(key, None)
            model = model if model is not None else self.backbone.build(adapter)
            self.groups[key] = MixedGroup(model, self.packing) if mode == "mixed" else SwitchGroup(model)
        return key, self.groups[key]

    def add_many(self, items: List[Tuple[str, str, Optional[str], BitFitAdapter]]) -> List[Tuple[str, str]]:
        """Add ``(name, source, revision, adapter)`` items; returns ``(name, refusal)`` for each refused one
        (the others are served). Adapters for one group are added together: one routing rebuild."""
        refused: List[Tuple[str, str]] = []
        entries = dict(self._entries)
        plan: Dict[Tuple[str, str], List] = {}
        reference: Optional[AdapterConfig] = None  # the first accepted one, while no base is loaded yet
        for name, source, revision, adapter in items:
            try:
                self.check(name, adapter, reference)
                if name in entries or any(name == n for items_ in plan.values() for n, *_ in items_):
                    raise ServeError(f"an adapter named {name!r} is already served.")
            except UserError as err:
                refused.append((name, first_line(err)))
                continue
            reference = reference or adapter.config
            mode, reason = self._mode(adapter)
            plan.setdefault((adapter.config.architecture, mode), []).append((name, source, revision, adapter, reason))
        retry: List = []
        for (_, mode), group_items in plan.items():
            self._add_to_group(mode, group_items, entries, refused, retry)
        by_architecture: Dict[str, List] = {}
        for item in retry:  # not routable per example after all: served by switching
            by_architecture.setdefault(item[3].config.architecture, []).append(item)
        for group_items in by_architecture.values():
            self._add_to_group("switch", group_items, entries, refused, [])
        self._publish(entries)
        return refused

    def _add_to_group(self, mode, group_items, entries, refused, retry) -> None:
        """Items of one (architecture, mode): each into the bank (a refusal is per adapter), routed once."""
        try:
            key, group = self._group(mode, group_items[0][3])
        except (UserError, ValueError, OSError) as err:
            refused.extend((item[0], first_line(err)) for item in group_items)
            return
        accepted = []
        for item in group_items:
            try:
                group.add(item[0], item[3])
                accepted.append(item)
            except (UserError, ValueError, KeyError) as err:
                refused.append((item[0], first_line(err)))
        if mode == "mixed" and accepted:
            failed = dict(group.rebuild([item[0] for item in accepted]))
            for item in accepted:
                if item[0] in failed:
                    retry.append((*item[:4], f"not routable per example: {first_line(failed[item[0]])}"))
            accepted = [item for item in accepted if item[0] not in failed]
        for item in accepted:
            entries[item[0]] = self._entry(item, mode, key)

    def _entry(self, item, mode: str, key) -> Entry:
        name, source, revision, adapter, reason = item
        cfg = adapter.config
        id2label = {int(k): v for k, v in (cfg.id2label or {}).items()}
        if not id2label and cfg.num_labels:
            id2label = {i: f"LABEL_{i}" for i in range(cfg.num_labels)}
        if reason:
            logger.info("adapter %r is served by switching: %s", name, reason)
        return Entry(name=name, source=source, revision=revision, config=cfg, task=cfg.task_type, mode=mode,
                     group=key, size_bytes=_size_bytes(adapter), id2label=id2label,
                     switch_reason=reason if mode == "switch" else None)

    def add(self, name: str, source: str, revision: Optional[str], adapter: BitFitAdapter) -> Entry:
        refused = self.add_many([(name, source, revision, adapter)])
        if refused:
            raise ServeError(refused[0][1])
        return self._entries[name]

    def remove(self, name: str) -> None:
        entry = self._entries.get(name)
        if entry is None:
            raise KeyError(name)
        entries = dict(self._entries)
        entries.pop(name)
        self._publish(entries)  # requests already queued for it are answered 404 from here on
        self.groups[entry.group].remove(name)

    def group(self, key):
        return self.groups[key]

    def build_tables(self) -> None:
        """Every group's routing tables, on the calling thread (the worker's, when it starts and after a change)."""
        for group in self.groups.values():
            group.build_tables()
