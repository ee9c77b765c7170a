"""A converged linear probe as the head's starting point (LP-FT, Kumar et al., ICLR 2022).

The encoder runs once over the training set with every weight as loaded; what the task head reads (its
input) is cached, and the head alone is fitted on that cache to convergence: full-batch L-BFGS on the
model's own loss plus an L2 penalty on the head's weights. That is the honest frozen baseline
(``--method frozen``), and every other method starts from it (``--probe_head_start``): the biases (or the
adapters) then only have to improve on a head that already fits the frozen features, instead of dragging
a random head along with them.

Every head the recipes build is covered by the loss its model uses:

* sequence classification (``*ForSequenceClassification``): cross-entropy, or mean squared error for one
  output (regression);
* token classification: cross-entropy over the labelled tokens (label ``-100`` is ignored);
* extractive QA (``qa_outputs``): cross-entropy of the start and of the end position over the sequence.

The probe is linear: a head with a hidden layer of its own (RoBERTa's and MPNet's ``dense`` + tanh +
``out_proj``) has only its output layer fitted, on what that layer reads with the hidden layer as
initialised; the hidden layer trains with the method afterwards. Fitting the whole two-layer head instead
(590k parameters for a base-size encoder) drives the training loss to near zero on a thousand examples:
the head then overfits, and leaves the method nothing to learn from.

The fit is deterministic (full batch, no sampling), costs one forward pass over the training data plus
a fraction of a second, and leaves the head at a minimum of its objective on the cache (tested).
"""

from __future__ import annotations

import inspect
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from bitfit_hf.tuners.state import detect_head_modules

logger = logging.getLogger(__name__)

__all__ = ["ProbeError", "ProbeCache", "ProbeResult", "head_kind", "collect_head_inputs", "fit_head", "probe_head",
           "probe_layer"]

#: The L2 penalty on the head's weights (per example: mean loss + l2/2 * ||W||^2); a light one, like
#: scikit-learn's LogisticRegression at C=0.1 on a few thousand examples.
DEFAULT_L2 = 1e-3
#: L-BFGS iterations at most; the fit stops earlier once the gradient is flat.
DEFAULT_MAX_ITER = 500
#: The cache's size at most: past it the probe is fitted on the batches cached so far (a QA head over a whole
#: SQuAD training set would cache every position of every window: tens of GB).
DEFAULT_MAX_CACHE_BYTES = 2 << 30


class ProbeError(ValueError):
    """The model's head cannot be fitted as a probe (several head modules, an unknown head kind)."""


def head_kind(model: nn.Module) -> str:
    """``"sequence"``, ``"token"`` or ``"qa"``: which loss the head is fitted with (from the model's class)."""
    name = type(model).__name__
    for suffix, kind in (("ForSequenceClassification", "sequence"), ("ForTokenClassification", "token"),
                         ("ForQuestionAnswering", "qa")):
        if name.endswith(suffix):
            return kind
    raise ProbeError(f"No probe for a {name}: the probe head start covers sequence classification, token "
                     "classification and extractive QA heads. Run without --probe_head_start.")


def _head_module(model: nn.Module) -> tuple[str, nn.Module]:
    names = detect_head_modules(model)
    if len(names) != 1:
        raise ProbeError(f"The probe fits one head module; {type(model).__name__} has {len(names)} "
                         f"({', '.join(names) or 'none'}). Run without --probe_head_start.")
    return names[0], getattr(model, names[0])


def probe_layer(model: nn.Module) -> tuple[str, nn.Linear]:
    """The layer the probe fits, by name: the head itself where it is one linear layer, otherwise the head's
    last linear layer (its output layer; :func:`collect_head_inputs` checks that it is)."""
    name, head = _head_module(model)
    if isinstance(head, nn.Linear):
        return name, head
    linears = [(sub, module) for sub, module in head.named_modules() if isinstance(module, nn.Linear)]
    if not linears:
        raise ProbeError(f"The head {name} ({type(head).__name__}) has no linear layer for a linear probe to fit. "
                         "Run without --probe_head_start.")
    sub, layer = linears[-1]
    return f"{name}.{sub}", layer


@dataclass
class ProbeCache:
    """What the head reads, cached once: ``inputs`` (one tensor per batch) and the targets of the loss."""

    kind: str
    inputs: List[torch.Tensor]
    targets: List[Dict[str, torch.Tensor]]
    seconds: float = 0.0
    truncated: bool = False  # the cache reached its size limit before the last batch

    @property
    def num_examples(self) -> int:
        return sum(len(x) for x in self.inputs)


@dataclass
class ProbeResult:
    kind: str
    head: str
    examples: int
    loss_before: float
    loss_after: float
    iterations: int
    feature_seconds: float
    fit_seconds: float
    train_accuracy: Optional[float] = None

    def as_metrics(self) -> Dict[str, float]:
        metrics = {"probe_loss_before": self.loss_before, "probe_loss": self.loss_after,
                   "probe_examples": self.examples, "probe_iterations": self.iterations,
                   "probe_feature_seconds": round(self.feature_seconds, 3),
                   "probe_fit_seconds": round(self.fit_seconds, 3)}
        if self.train_accuracy is not None:
            metrics["probe_train_accuracy"] = self.train_accuracy
        return metrics


def _forward_keys(model: nn.Module) -> set:
    return set(inspect.signature(model.forward).parameters)


@torch.no_grad()
def collect_head_inputs(model: nn.Module, batches, device: Optional[torch.device] = None,
                        max_cache_bytes: int = DEFAULT_MAX_CACHE_BYTES) -> ProbeCache:
    """Run ``model`` (in eval mode, no gradient) over ``batches`` (dicts of tensors, as a collator gives them)
    and cache what the probe's layer (:func:`probe_layer`) reads, with the loss targets of each batch; once the
    cache holds ``max_cache_bytes``, the remaining batches are left out (``ProbeCache.truncated``)."""
    kind = head_kind(model)
    _, head = _head_module(model)
    _, layer = probe_layer(model)
    device = device or next(model.parameters()).device
    captured: List[torch.Tensor] = []
    outputs: Dict[str, torch.Tensor] = {}

    def grab(module, args, kwargs):
        captured.append((args[0] if args else next(iter(kwargs.values()))).detach())

    def keep_output(key):
        def hook(module, args, output):
            outputs[key] = output
        return hook

    keys = _forward_keys(model)
    target_keys = {"sequence": ("labels",), "token": ("labels",), "qa": ("start_positions", "end_positions")}[kind]
    inputs, targets = [], []
    cached_bytes, truncated = 0, False
    was_training = model.training
    model.eval()
    handles = [layer.register_forward_pre_hook(grab, with_kwargs=True)]
    if layer is not head:  # the layer must be the head's output: nothing may follow it
        handles += [layer.register_forward_hook(keep_output("layer")), head.register_forward_hook(keep_output("head"))]
    start = time.perf_counter()
    try:
        for batch in batches:
            if cached_bytes >= max_cache_bytes:
                truncated = True
                break
            batch = dict(batch)
            if "label" in batch and "labels" not in batch:
                batch["labels"] = batch.pop("label")
            missing = [key for key in target_keys if key not in batch]
            if missing:
                raise ProbeError(f"The training batches hold no {', '.join(missing)}: nothing to fit the probe to.")
            wanted = {k: v.to(device) for k, v in batch.items() if k in keys and k not in target_keys
                      and isinstance(v, torch.Tensor)}
            captured.clear()
            model(**wanted)
            if len(captured) != 1:
                raise ProbeError(f"The head's output layer ran {len(captured)} times in one forward pass; the probe "
                                 "needs once. Run without --probe_head_start.")
            if layer is not head and outputs.pop("layer") is not outputs.pop("head"):
                raise ProbeError(f"The head {type(head).__name__} transforms its last linear layer's output, so a "
                                 "linear probe cannot fit it. Run without --probe_head_start.")
            feature = captured[0].float()
            target = {k: batch[k].to(device) for k in target_keys}
            if kind == "token":  # keep the labelled tokens only: (M, H) and their labels
                labels = target["labels"]
                keep = labels != -100
                feature, target = feature[keep], {"labels": labels[keep]}
            inputs.append(feature)
            targets.append(target)
            cached_bytes += feature.numel() * feature.element_size()
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return ProbeCache(kind, inputs, targets, time.perf_counter() - start, truncated)


def _batch_loss(kind: str, logits: torch.Tensor, target: Dict[str, torch.Tensor]) -> torch.Tensor:
    """The summed loss of one cached batch, as the model's own forward computes it (mean taken by the caller)."""
    if kind == "qa":
        start_logits, end_logits = logits.split(1, dim=-1)
        start_logits, end_logits = start_logits.squeeze(-1), end_logits.squeeze(-1)
        length = start_logits.size(1)
        start = target["start_positions"].clamp(0, length)
        end = target["end_positions"].clamp(0, length)
        return (F.cross_entropy(start_logits, start, ignore_index=length, reduction="sum")
                + F.cross_entropy(end_logits, end, ignore_index=length, reduction="sum")) / 2
    labels = target["labels"]
    if logits.dim() == 2 and logits.size(-1) == 1 and labels.is_floating_point():  # regression
        return F.mse_loss(logits.squeeze(-1), labels, reduction="sum")
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1).long(), reduction="sum")


def probe_objective(head: nn.Module, cache: ProbeCache, l2: float) -> Callable[[], torch.Tensor]:
    """The function L-BFGS minimises: the mean loss over the cache plus ``l2``/2 times the squared norm of the
    head's weight matrices (biases are not penalised)."""
    weights = [p for name, p in head.named_parameters() if p.dim() > 1]
    count = cache.num_examples

    def objective() -> torch.Tensor:
        total = sum(_batch_loss(cache.kind, head(x), t) for x, t in zip(cache.inputs, cache.targets))
        return total / count + 0.5 * l2 * sum((w.float() ** 2).sum() for w in weights)

    return objective


def fit_head(head: nn.Module, cache: ProbeCache, l2: float = DEFAULT_L2, max_iter: int = DEFAULT_MAX_ITER) -> tuple[float, float, int]:
    """Fit ``head``'s parameters in place on ``cache``; returns (objective before, after, iterations)."""
    params = [p for p in head.parameters()]
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(True)
    objective = probe_objective(head, cache, l2)
    was_training = head.training
    head.eval()  # dropout inside the head off: the fit is deterministic
    try:
        with torch.no_grad():
            before = float(objective())
        optimizer = torch.optim.LBFGS(params, lr=1.0, max_iter=max_iter, tolerance_grad=1e-6,
                                      tolerance_change=1e-12, history_size=20, line_search_fn="strong_wolfe")

        def closure():
            optimizer.zero_grad(set_to_none=True)
            loss = objective()
            loss.backward()
            return loss

        optimizer.step(closure)
        iterations = int(optimizer.state[optimizer._params[0]].get("n_iter", 0))
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            after = float(objective())
    finally:
        for p, flag in zip(params, flags):
            p.requires_grad_(flag)
            p.grad = None
        head.train(was_training)
    if not after <= before:  # L-BFGS never ends above its start on a smooth objective; a NaN does
        raise ProbeError(f"The probe fit did not lower its objective ({before:.4f} -> {after:.4f}).")
    return before, after, iterations


def _train_accuracy(head: nn.Module, cache: ProbeCache) -> Optional[float]:
    if cache.kind == "qa":
        return None
    correct = total = 0
    with torch.no_grad():
        for x, t in zip(cache.inputs, cache.targets):
            logits = head(x)
            if logits.size(-1) == 1:
                return None
            correct += int((logits.reshape(-1, logits.size(-1)).argmax(-1) == t["labels"].reshape(-1)).sum())
            total += t["labels"].numel()
    return correct / total if total else None


def probe_head(model: nn.Module, batches, l2: float = DEFAULT_L2, max_iter: int = DEFAULT_MAX_ITER,
               device: Optional[Any] = None, max_cache_bytes: int = DEFAULT_MAX_CACHE_BYTES) -> ProbeResult:
    """Cache what ``model``'s head output layer reads over ``batches`` and fit that layer on it (in place); see
    the module."""
    name, head = probe_layer(model)
    cache = collect_head_inputs(model, batches, device, max_cache_bytes)
    if cache.truncated:
        logger.warning("Probe head start: the cache reached %.1f GB, so the head is fitted on the first %d cached "
                       "%s only (a head start, not the converged probe of the whole set).", max_cache_bytes / 2**30,
                       cache.num_examples, "tokens" if cache.kind == "token" else "examples")
    if cache.num_examples == 0:
        raise ProbeError("No training example reached the head: nothing to fit the probe to.")
    start = time.perf_counter()
    before, after, iterations = fit_head(head, cache, l2, max_iter)
    result = ProbeResult(cache.kind, name, cache.num_examples, before, after, iterations, cache.seconds,
                         time.perf_counter() - start, _train_accuracy(head, cache))
    logger.info("Probe head start: %s fitted on %d cached %s (encoder pass %.1f s, fit %.2f s, %d L-BFGS steps): "
                "loss %.4f -> %.4f%s.", name, result.examples,
                "tokens" if cache.kind == "token" else "examples", result.feature_seconds, result.fit_seconds,
                iterations, before, after,
                f", training accuracy {result.train_accuracy:.1%}" if result.train_accuracy is not None else "")
    return result
