"""Mixed-task batched inference: one forward pass, many BitFit tasks, one frozen backbone.

BitFit adapters differ from the base model only in bias vectors and a task head. Every bias BitFit trains
is *additive on its module's output* (``nn.Linear``, ``nn.LayerNorm``, GPT-2's ``Conv1D``, and the zero
biases bitfit-hf adds to RMSNorm-style norms): ``module(x; b_task) == module(x; b_base) + (b_task - b_base)``.
So a batch whose examples belong to different tasks runs through the backbone once, and a forward hook on
every biased module adds to each example's row the bias difference of that example's task, picked from a
``[num_tasks, features]`` table by a task-id tensor. The task heads (``classifier``, ``qa_outputs``, ...)
are applied per task to their own rows, with each task's head tensors, via ``torch.func.functional_call``.

A method whose own tensors route per example the same way gives a router (``Method.batch_router``): (IA)³
scaling vectors multiply each example's key / value output or FFN input by its task's vector, picked from a
``[num_tasks, features]`` table as the biases are (a task without a vector there gets ones), so (IA)³ and
BitFit + (IA)³ tasks mix with BitFit tasks in one batch. Methods whose tensors change weights (LoRA, the random
baselines) or add token-dependent shifts (AdapterBias) are refused with the reason (``Method.not_batchable``).

Example::

    from bitfit_hf import AdapterBank, MultiTaskModel

    mt = MultiTaskModel(base_model, {"sst2": "out/sst2", "mnli": "out/mnli", "pos": adapter})
    out = mt(input_ids, attention_mask, task_ids=["sst2", "mnli", "sst2"])   # or a LongTensor of indices
    out.logits          # [batch, ..., max_labels], padded with -inf past each example's own label count
    out.per_example()   # list of per-example logits, each cut to its task's label count
    out = mt(**enc, adapter_names=["sst2", "__base__", "mnli"])   # PEFT's spelling; "__base__": the stock model

    mt = MultiTaskModel(base_model, adapters, tokenizer=tok)
    mt.classify(["great film", "A man sleeps. A person rests."], tasks=["sst2", "mnli"])
    # [{'task': 'sst2', 'label': 'positive', 'score': 0.97}, {'task': 'mnli', 'label': 'entailment', ...}]

Outputs match running each task separately (``AdapterBank.activate(task)`` then the model on that task's
rows) up to float rounding: the bias is added after the module instead of inside it. On float32 the
largest logit difference measured is of order 1e-6 (tests assert ``atol=1e-4``) and the argmax is
identical. Nothing in the model is changed outside a forward call: the hooks are registered and the heads
routed only for the duration of :meth:`MultiTaskModel.forward`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Union

import torch
from torch import nn

from bitfit_hf.adapters.adapter import BitFitAdapter
from bitfit_hf.adapters.bank import AdapterBank
from bitfit_hf.adapters.config import AdapterError
from bitfit_hf.tuners import method_spec, tensor_role_of
from bitfit_hf.tuners.bias.layer import HOOK_ATTR
from bitfit_hf.utils.names import is_under

__all__ = ["BASE_TASK", "MultiTaskModel", "MultiTaskOutput", "TaskRefused"]

#: The task name of the stock model (no adapter), as in PEFT's ``adapter_names=[..., "__base__"]``; its
#: index is ``len(tasks)``.
BASE_TASK = "__base__"

AdapterLike = Union[str, BitFitAdapter]


class TaskRefused(AdapterError):
    """A task that cannot be routed per example; ``task`` names it, so a caller holding several tasks can set
    that one aside without reading the message."""

    def __init__(self, task: str, message: str):
        super().__init__(message)
        self.task = task


def _additive_bias_types():
    types = [nn.Linear, nn.LayerNorm]
    try:
        from transformers.pytorch_utils import Conv1D

        types.append(Conv1D)
    except ImportError:  # pragma: no cover - transformers always has it
        pass
    return tuple(types)


@dataclass
class MultiTaskOutput:
    """The result of :meth:`MultiTaskModel.forward`.

    ``logits``: ``[batch, ..., max_labels]``; entries past an example's own label count are ``-inf``.
    ``task_ids``: ``[batch]`` task indices into ``tasks``. ``num_labels``: per task, the head's width.
    """

    logits: Optional[torch.Tensor]
    task_ids: torch.Tensor
    tasks: List[str]
    num_labels: List[int]
    outputs: object = None  # the model's own output (``start_logits`` / ``end_logits`` for QA heads, ...)

    def per_example(self) -> List[torch.Tensor]:
        """One logits tensor per example, cut to the label count of its own task."""
        return [self.logits[i, ..., : self.num_labels[int(t)]] for i, t in enumerate(self.task_ids.tolist())]


class MultiTaskModel(nn.Module):
    """Serve several BitFit tasks from one frozen backbone, mixing tasks inside a batch.

    Args:
        model_or_bank: a stock model holding the base weights (the architecture the adapters were trained
            on, e.g. ``AutoModelForSequenceClassification``), or an :class:`~bitfit_hf.AdapterBank` over one.
        adapters: ``{task name: adapter}`` (a :class:`~bitfit_hf.BitFitAdapter` or a directory / Hub id).
            With a bank they are added to it; by default every adapter of the bank is served.
        tasks: the served task names, in task-index order (default: every adapter, in insertion order).
        tokenizer: used by :meth:`classify`.
        check_base: verify each adapter's base-model fingerprint (as ``AdapterBank.add`` does).

    The model is put in eval mode: this is an inference wrapper (dropout would not be per task anyway).
    """

    def __init__(
        self,
        model_or_bank: Union[nn.Module, AdapterBank],
        adapters: Optional[Mapping[str, AdapterLike]] = None,
        tasks: Optional[Sequence[str]] = None,
        tokenizer=None,
        check_base: bool = True,
    ):
        super().__init__()
        bank = model_or_bank if isinstance(model_or_bank, AdapterBank) else AdapterBank(model_or_bank)
        for name, adapter in (adapters or {}).items():
            bank.add(name, adapter, check_base=check_base)
        self.bank = bank
        self.model = bank.model  # registered as a submodule: .to(), .parameters() work as usual
        self.tokenizer = tokenizer
        self.tasks: List[str] = list(tasks) if tasks is not None else bank.names
        if not self.tasks:
            raise ValueError("MultiTaskModel needs at least one task adapter.")
        missing = [t for t in self.tasks if t not in bank.adapters]
        if missing:
            raise KeyError(f"No adapter named {missing}; loaded: {bank.names}.")
        self.model.eval()
        self._build_tables()
        self._routing_ids: Optional[torch.Tensor] = None
        self._signature = None
        self._routed: Dict[str, Optional[torch.Tensor]] = {}  # module -> its current bias, for modules some task changes

    # ---- set-up --------------------------------------------------------------------------------
    def _build_tables(self) -> None:
        """Per biased module: a ``[num_tasks, features]`` table of each task's absolute bias; per head module:
        each task's head tensors."""
        modules = dict(self.model.named_modules())
        params = dict(self.model.named_parameters())
        heads = self._served_heads()
        for task in self.tasks:
            method = self.bank.adapters[task].config.method
            refusal = method_spec(method).not_batchable
            if refusal:
                raise TaskRefused(
                    task,
                    f"Task {task!r} uses {method}: {refusal}. Serve it with AdapterBank.activate(task) on batches "
                    "of that task alone."
                )
        routed_by_method = self._build_routers()
        claimed = {m for router in self._routers for m in router.modules}
        additive = _additive_bias_types()
        bias_names: List[str] = []
        for task in self.tasks:
            for name in self.bank.task_tensors(task):
                if not is_under(name, heads) and name not in bias_names and name not in routed_by_method:
                    self._check_routable(task, name, modules, additive, claimed)
                    bias_names.append(name)
        self.head_modules = heads
        self.bias_names = bias_names
        self._bias_modules = {name: _bias_owner(modules[name.rpartition(".")[0]]) for name in bias_names}
        self._tables: Dict[str, torch.Tensor] = {name: self._bias_table(name, params) for name in bias_names}
        self._head_tensors = {head: self._head_table(head, modules[head]) for head in heads}
        self._head_modules = {h: modules[h] for h in heads}

    def _build_routers(self) -> set:
        """One router per layer kind (Method.batch_router) for the served tasks' own tensors ((IA)³ vectors,
        routed per example); returns the names of the tensors they route."""
        by_kind: Dict[str, List[str]] = {}  # layer kind -> its methods: ia3 and bitfit_ia3 share one router
        router_of = {}
        for task in self.tasks:
            spec = method_spec(self.bank.adapters[task].config.method)
            if spec.supports("batch_router"):
                by_kind.setdefault(spec.layer_kind or spec.name, []).append(spec.name)
                router_of.setdefault(spec.layer_kind or spec.name, spec.batch_router)
        self._routers = []
        routed = set()
        for kind, methods in by_kind.items():
            rows = []
            for task in self.tasks:
                method = self.bank.adapters[task].config.method
                own = {} if method not in methods else {
                    n: t for n, t in self.bank.task_tensors(task).items() if tensor_role_of(method, n) is not None}
                routed.update(own)
                rows.append(own)
            rows.append({})  # BASE_TASK: the stock model
            self._routers.append(router_of[kind](self.model, rows))
        return routed

    def _served_heads(self) -> List[str]:
        """The served tasks' head modules, outermost only (a head nested in another is routed with it)."""
        heads: List[str] = []
        for task in self.tasks:
            for head in self.bank.adapters[task].config.head_modules:
                if head not in heads:
                    heads.append(head)
        return [h for h in heads if not is_under(h, [o for o in heads if o != h])]

    def _check_routable(self, task: str, name: str, modules: Dict[str, nn.Module], additive, claimed=()) -> None:
        """Refuse a task tensor that is not an output-additive module bias (the only thing routed per example,
        besides what a method's router routes). A module wrapped in a peft layer that a router answers for has
        its bias routed on the wrapped base layer."""
        config = self.bank.adapters[task].config
        module_name, _, attr = name.rpartition(".")
        module = modules.get(module_name)
        if module_name in claimed:
            module = _bias_owner(module)
        elif type(module).__module__.startswith("peft."):
            raise TaskRefused(
                task,
                f"Task {task!r} ({config.method}) trains the bias of {module_name!r}, which the bank has wrapped in "
                "another task's peft layer: mixed-task batches route per-example bias deltas only. Serve the tasks "
                "whose method wraps modules one at a time with AdapterBank.activate(), from a bank of their own."
            )
        if attr != "bias" or module is None:
            raise TaskRefused(
                task,
                f"Task {task!r} trains {name!r}, which is not a module bias: mixed-task batches support "
                "adapters that train biases (and heads) only."
            )
        if not (isinstance(module, additive) or hasattr(module, HOOK_ATTR)):
            raise TaskRefused(
                task,
                f"Task {task!r} trains the bias of {module_name!r} ({type(module).__name__}), whose bias is "
                "not known to be added to its output; mixed-task batches support nn.Linear, nn.LayerNorm, "
                "Conv1D and biases added by bitfit-hf."
            )

    def _bias_table(self, name: str, params: Dict[str, nn.Parameter]) -> torch.Tensor:
        """``[num_tasks + 1, features]``: each task's bias, then the stock model's (``BASE_TASK``)."""
        base = self.bank.stock_tensor(name)
        if base is None:
            base = params[name].data if name in params else None
        if base is None:
            base = torch.zeros_like(next(t[name] for t in map(self.bank.task_tensors, self.tasks) if name in t))
        rows = [self.bank.task_tensors(task).get(name, base).reshape(-1) for task in self.tasks]
        rows.append(base.reshape(-1))
        return torch.stack(rows)

    def _head_table(self, head: str, module: nn.Module) -> List[Dict[str, torch.Tensor]]:
        """Per task, then the stock model (``BASE_TASK``): the head's tensors by their names inside it."""
        prefix = head + "."
        per_task = [
            {n[len(prefix):]: t for n, t in self.bank.task_tensors(task).items() if n.startswith(prefix)}
            for task in self.tasks
        ]
        stock = {}
        for n, p in module.named_parameters():
            value = self.bank.stock_tensor(prefix + n)
            stock[n] = p.data if value is None else value
        per_task.append(stock)
        return per_task

    # ---- routing -------------------------------------------------------------------------------
    def _current_bias(self, name: str) -> Optional[torch.Tensor]:
        bias = getattr(self._bias_modules[name], "bias", None)
        return bias.data if isinstance(bias, torch.Tensor) else None

    def _routed_modules(self) -> Dict[str, Optional[torch.Tensor]]:
        """The modules whose bias some example must change (a row of ``table - current bias`` is not zero),
        with their current bias; recomputed only when a bias tensor was swapped or changed (e.g.
        ``AdapterBank.activate``). Only the tables are kept: each forward subtracts the current bias from the
        rows it picks, which gives the same numbers as a kept ``table - current`` without a second copy of
        every task's biases."""
        current = {n: self._current_bias(n) for n in self.bias_names}
        signature = tuple((c.data_ptr(), c._version) if c is not None else None for c in current.values())
        if signature != self._signature:
            routed = {}
            for name, table in self._tables.items():
                cur = current[name]
                if cur is None or not torch.equal(table, cur.reshape(1, -1).to(table.dtype).expand_as(table)):
                    routed[name] = cur
            self._routed = routed
            self._signature = signature
        return self._routed

    def _bias_hook(self, name: str):
        def hook(module, args, output):
            ids = self._routing_ids
            if ids is None:
                return output
            tensor = output[0] if isinstance(output, tuple) else output
            batch = ids.shape[0]
            if tensor.dim() < 2 or tensor.shape[0] != batch:
                raise RuntimeError(
                    f"MultiTaskModel: the output of {name.rpartition('.')[0]!r} has shape {tuple(tensor.shape)}, "
                    f"not [batch={batch}, ..., features]; this attention/packing layout is not supported."
                )
            delta = self._tables[name].index_select(0, ids)
            cur = self._routed[name]
            if cur is not None:
                delta = delta - cur.reshape(1, -1).to(delta.dtype)
            delta = delta.to(tensor.dtype)
            delta = delta.view(batch, *([1] * (tensor.dim() - 2)), delta.shape[-1])
            if torch.is_grad_enabled() and tensor.requires_grad:
                tensor = tensor + delta
            else:
                tensor = tensor.add_(delta)
            return (tensor, *output[1:]) if isinstance(output, tuple) else tensor

        return hook

    @contextlib.contextmanager
    def _routing(self, task_ids: torch.Tensor, widths: Dict[int, int]):
        routed = self._routed_modules()
        handles = [self._bias_modules[n].register_forward_hook(self._bias_hook(n)) for n in routed]
        swapped = []
        routers = contextlib.ExitStack()
        try:
            for router in self._routers:
                routers.enter_context(router.route(task_ids))
            for head, module in self._head_modules.items():
                parent_name, _, child = head.rpartition(".")
                parent = self.model.get_submodule(parent_name) if parent_name else self.model
                router = _RoutedHead(module, self._head_tensors[head], task_ids, widths)
                setattr(parent, child, router)
                swapped.append((parent, child, module))
            self._routing_ids = task_ids
            yield
        finally:
            self._routing_ids = None
            routers.close()
            for handle in handles:
                handle.remove()
            for parent, child, module in swapped:
                setattr(parent, child, module)

    # ---- public API ----------------------------------------------------------------------------
    def task_index(self, tasks: Union[torch.Tensor, Sequence[Union[str, int]]], device=None) -> torch.Tensor:
        """Task names (or indices) to a ``LongTensor`` of task indices; ``"__base__"`` (the stock model) is
        index ``len(self.tasks)``."""
        if isinstance(tasks, torch.Tensor):
            ids = tasks.long()
        else:
            lookup = {t: i for i, t in enumerate(self.tasks)}
            lookup[BASE_TASK] = len(self.tasks)
            try:
                ids = torch.tensor([t if isinstance(t, int) else lookup[t] for t in tasks], dtype=torch.long)
            except KeyError as err:
                raise KeyError(f"Unknown task {err.args[0]!r}; served tasks: {self.tasks} "
                               f"(and {BASE_TASK!r}, the stock model).") from None
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) > len(self.tasks)):
            raise IndexError(f"task ids must be in [0, {len(self.tasks)}] ({len(self.tasks)}: {BASE_TASK}); "
                             f"got {ids.tolist()}.")
        return ids.to(device) if device is not None else ids

    def forward(self, input_ids=None, attention_mask=None, task_ids=None, adapter_names=None,
                **kwargs) -> MultiTaskOutput:
        """One forward pass over a mixed batch: example ``i`` uses task ``task_ids[i]``'s biases and head.

        ``task_ids``: a ``LongTensor [batch]`` of indices into ``self.tasks``, or a list of task names.
        ``adapter_names``: the same as a list of names, in PEFT's calling convention
        (``model(**inputs, adapter_names=["sst2", "__base__", ...])``); ``"__base__"`` runs an example
        through the stock model (its own biases and head). Give one of the two.
        Other keyword arguments (``token_type_ids``, ``inputs_embeds``, ...) go to the model.
        """
        if adapter_names is not None:
            if task_ids is not None:
                raise ValueError("Give task_ids or adapter_names (the same thing in PEFT's spelling), not both.")
            if isinstance(adapter_names, (str, torch.Tensor)):
                raise TypeError("adapter_names is a list with one adapter name per example, as in PEFT.")
            task_ids = list(adapter_names)
        if task_ids is None:
            raise ValueError("MultiTaskModel.forward needs task_ids (one task per example).")
        first = input_ids if input_ids is not None else kwargs.get("inputs_embeds")
        device = first.device if first is not None else None
        ids = self.task_index(task_ids, device=device)
        if first is not None and ids.shape[0] != first.shape[0]:
            raise ValueError(f"{ids.shape[0]} task ids for a batch of {first.shape[0]} examples.")
        widths: Dict[int, int] = {}
        with self._routing(ids, widths):
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        if hasattr(out, "keys"):
            logits = out["logits"] if "logits" in out.keys() else None
        else:
            logits = out[0]
        fallback = logits.shape[-1] if logits is not None else 0
        tasks = list(self.tasks) + ([BASE_TASK] if bool((ids == len(self.tasks)).any()) else [])
        num_labels = [widths.get(i, fallback) for i in range(len(tasks))]
        return MultiTaskOutput(logits=logits, task_ids=ids, tasks=tasks, num_labels=num_labels, outputs=out)

    @torch.inference_mode()
    def classify(
        self,
        texts: Sequence[Union[str, tuple]],
        tasks: Union[str, Sequence[str]],
        tokenizer=None,
        batch_size: int = 32,
        max_length: Optional[int] = None,
        top_k: Optional[int] = 1,
    ) -> List[Union[dict, List[dict]]]:
        """Sequence classification of mixed-task texts, ``pipeline``-style.

        ``texts``: strings, or ``(text, text_pair)`` tuples for pair tasks. ``tasks``: one task name per
        text (or one name for all). Returns, per text, ``{"task", "label", "score"}`` (``top_k=1``), or a
        list of the ``top_k`` best (``top_k=None``: every label). Scores are softmax probabilities (sigmoid
        for ``multi_label_classification`` adapters).
        """
        tokenizer = tokenizer or self.tokenizer
        if tokenizer is None:
            raise ValueError("classify() needs a tokenizer: MultiTaskModel(..., tokenizer=tok) or classify(..., tokenizer=tok).")
        texts = list(texts)
        tasks = [tasks] * len(texts) if isinstance(tasks, str) else list(tasks)
        if len(tasks) != len(texts):
            raise ValueError(f"{len(tasks)} tasks for {len(texts)} texts.")
        device = next(self.model.parameters()).device
        results: List[Union[dict, List[dict]]] = []
        for start in range(0, len(texts), batch_size):
            chunk, chunk_tasks = texts[start : start + batch_size], tasks[start : start + batch_size]
            if any(isinstance(c, (tuple, list)) for c in chunk):  # pairs, possibly mixed with single texts
                encoded = [tokenizer(*c, truncation=True, max_length=max_length) if isinstance(c, (tuple, list))
                           else tokenizer(c, truncation=True, max_length=max_length) for c in chunk]
                enc = tokenizer.pad(encoded, return_tensors="pt")
            else:
                enc = tokenizer(chunk, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
            enc = {k: v.to(device) for k, v in enc.items()}
            out = self(task_ids=chunk_tasks, **enc)
            for task, logits in zip(chunk_tasks, out.per_example()):
                cfg = self.bank.adapters[task].config if task != BASE_TASK else self.model.config
                logits = logits.float()
                if cfg.problem_type == "multi_label_classification":
                    scores = torch.sigmoid(logits)
                else:
                    scores = torch.softmax(logits, dim=-1)
                id2label = {int(k): v for k, v in (cfg.id2label or {}).items()}
                order = torch.argsort(scores, descending=True).tolist()
                k = len(order) if top_k is None else min(top_k, len(order))
                ranked = [{"task": task, "label": id2label.get(i, f"LABEL_{i}"), "score": float(scores[i])}
                          for i in order[:k]]
                results.append(ranked[0] if top_k == 1 else ranked)
        return results


def _bias_owner(module: nn.Module) -> nn.Module:
    """The module whose output a bias is added to: a peft-wrapped module's base layer (the bias sits there, and
    the wrapper's scaling, routed by its method, comes after it), else the module itself."""
    base = getattr(module, "get_base_layer", None)
    return base() if callable(base) and type(module).__module__.startswith("peft.") else module


class _RoutedHead(nn.Module):
    """Stands in for a head module during a mixed forward: each task's rows through the head with that
    task's tensors; outputs padded with ``-inf`` to the widest task."""

    def __init__(self, module: nn.Module, per_task: List[Dict[str, torch.Tensor]], task_ids: torch.Tensor,
                 widths: Dict[int, int]):
        super().__init__()
        self.inner = module
        self.per_task = per_task
        self.task_ids = task_ids
        self.widths = widths  # task -> output width, shared: the head module that runs last wins

    def forward(self, *args, **kwargs):
        from torch.func import functional_call

        ids = self.task_ids
        batch = ids.shape[0]
        present = torch.unique(ids).tolist()
        if len(present) == 1:  # one task: no slicing
            out = functional_call(self.inner, self.per_task[present[0]], args, kwargs, strict=False)
            if isinstance(out, torch.Tensor):
                self.widths[present[0]] = out.shape[-1]
            return out

        def rows(value, index):
            return value.index_select(0, index) if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == batch else value

        outs, indices = [], []
        for task in present:
            index = (ids == task).nonzero(as_tuple=True)[0]
            sub_args = tuple(rows(a, index) for a in args)
            sub_kwargs = {k: rows(v, index) for k, v in kwargs.items()}
            outs.append(functional_call(self.inner, self.per_task[task], sub_args, sub_kwargs, strict=False))
            indices.append(index)
        if not all(isinstance(o, torch.Tensor) for o in outs):
            raise RuntimeError("MultiTaskModel: a routed head returned a non-tensor output.")
        for task, out in zip(present, outs):
            self.widths[task] = out.shape[-1]
        width = max(o.shape[-1] for o in outs)
        first = outs[0]
        result = first.new_full((batch, *first.shape[1:-1], width), float("-inf"))
        for out, index in zip(outs, indices):
            result[index, ..., : out.shape[-1]] = out
        return result
