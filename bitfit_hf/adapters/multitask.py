"""Mixed-task batched inference: one forward pass, many task adapters of any method, one frozen backbone.

An adapter differs from the base model in a few tensors per module and a task head. Each of those changes is one
of a few kinds that can be applied per example after (or, for an input scaling, before) the stock module runs:
a bias delta, a norm's gain delta times its normalised input, LoRA's ``B A x``, AdapterBias's ``L_alpha(h) v``,
an (IA)³ scaling (:mod:`bitfit_hf.adapters.routing`). So a batch whose examples belong to different tasks runs
through the backbone once, and every module some task changes picks, per example, the rows of that example's task
from tables built once. The task heads (``classifier``, ``qa_outputs``, ...) are applied per task to their own
rows, with each task's head tensors, via ``torch.func.functional_call``. BitFit, (IA)³, BitFit + (IA)³, LoRA,
BitFit + LoRA, AdapterBias and LayerNorm tuning tasks mix in one batch; a method that stores a tensor no route
covers (the random baselines' weight entries) is refused with the reason.

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
rows) up to float rounding: a change is added after the module instead of inside it. On float32 the tests
assert ``atol=1e-5`` for every method and task head, and the argmax is identical. Nothing in the model is changed outside a forward call: the hooks are registered and the heads
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
from bitfit_hf.adapters.packing import Packing, encoder_of, packed
from bitfit_hf.adapters.routing import Router, TokenRows, route_of
from bitfit_hf.tuners import method_spec
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

    # ---- set-up --------------------------------------------------------------------------------
    def _build_tables(self) -> None:
        """Every served task's tensors into the layer-level routing (:mod:`bitfit_hf.adapters.routing`: one
        ``[num_tasks + 1, ...]`` table per module and kind of change), and per head module each task's tensors."""
        modules = dict(self.model.named_modules())
        heads = self._served_heads()
        self.router = Router(self.model, self.bank.stock_tensor)
        for task in self.tasks:
            config = self.bank.adapters[task].config
            refusal = method_spec(config.method).not_batchable
            if refusal:
                raise TaskRefused(task, f"Task {task!r} uses {config.method}: {refusal}. Serve it with "
                                        "AdapterBank.activate(task) on batches of that task alone.")
            routed = {}
            for name, tensor in self.bank.task_tensors(task).items():
                if is_under(name, heads):
                    continue
                route = route_of(self.model, modules, config.method, name, config.method_config)
                if route is None:
                    raise TaskRefused(
                        task,
                        f"Task {task!r} ({config.method}) trains {name!r}, which no per-example route covers: mixed "
                        "batches route module biases, norm gains and the tensors a method routes (LoRA, (IA)³, "
                        "AdapterBias shifts). Serve it with AdapterBank.activate(task) on batches of that task alone."
                    )
                routed[name] = (route, tensor)
            self.router.add(task, routed)
        self.router.set_active(self.tasks)
        self.head_modules = heads
        self._encoder: Optional[str] = None  # the encoder's module name, for packed passes
        self._head_tensors = {head: self._head_table(head, modules[head]) for head in heads}
        self._head_modules = {h: modules[h] for h in heads}

    def build_tables(self) -> None:
        """Build the routing tables now rather than in the first forward pass. Call it on the thread that runs
        the forward passes: a server whose tables were built on its event loop's thread ran every pass slower
        (docs/serving.md, "Two torch threads")."""
        self.router.build()

    def _served_heads(self) -> List[str]:
        """The served tasks' head modules, outermost only (a head nested in another is routed with it)."""
        heads: List[str] = []
        for task in self.tasks:
            for head in self.bank.adapters[task].config.head_modules:
                if head not in heads:
                    heads.append(head)
        return [h for h in heads if not is_under(h, [o for o in heads if o != h])]

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
    @contextlib.contextmanager
    def _routing(self, task_ids: torch.Tensor, widths: Dict[int, int], packing: Optional[Packing] = None):
        """The model as the stock one (a task the bank has active is set aside meanwhile), each module routed per
        example (per token inside an encoder running on ``packing``'s rows), each head per task."""
        previous = self.bank.active
        with contextlib.ExitStack() as stack:
            if previous is not None:
                self.bank.restore_base()
                stack.callback(self.bank.activate, previous)
            tokens = None
            if packing is not None:
                stack.enter_context(packed(self.model, packing))
                tokens = TokenRows(self._encoder_name(), packing.example_of.view(packing.rows, packing.row_width))
            stack.enter_context(self.router.route(task_ids, tokens))
            for head, module in self._head_modules.items():
                parent_name, _, child = head.rpartition(".")
                parent = self.model.get_submodule(parent_name) if parent_name else self.model
                setattr(parent, child, _RoutedHead(module, self._head_tensors[head], task_ids, widths))
                stack.callback(setattr, parent, child, module)
            yield

    def _encoder_name(self) -> str:
        if self._encoder is None:
            encoder = encoder_of(self.model)
            self._encoder = next(name for name, module in self.model.named_modules() if module is encoder)
        return self._encoder

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

    def forward(self, input_ids=None, attention_mask=None, task_ids=None, adapter_names=None, pack: bool = False,
                **kwargs) -> MultiTaskOutput:
        """One forward pass over a mixed batch: example ``i`` uses task ``task_ids[i]``'s biases and head.

        ``task_ids``: a ``LongTensor [batch]`` of indices into ``self.tasks``, or a list of task names.
        ``adapter_names``: the same as a list of names, in PEFT's calling convention
        (``model(**inputs, adapter_names=["sst2", "__base__", ...])``); ``"__base__"`` runs an example
        through the stock model (its own biases and head). Give one of the two.
        ``pack``: run the encoder on the inputs packed end to end in rows, computing no padding
        (:mod:`bitfit_hf.adapters.packing`; a right-padded batch of an encoder-only model, where it saves tokens;
        check a model with :func:`~bitfit_hf.adapters.packing.packing_agrees` first).
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
        packing = None
        if pack and attention_mask is not None and input_ids is not None and encoder_of(self.model) is not None:
            packing = Packing.of(attention_mask)
        with self._routing(ids, widths, packing):
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
