"""A training step the host never waits on: what ``BitFitTrainer`` changes in ``Trainer``'s step.

A bias-only step is short on a GPU (a BERT-base step at batch 32 is about 9 ms under CUDA graphs), so the host
has to queue the next step while the device runs this one. Each read of a device value by the host (``bool()``,
``.item()``, a blocking host-to-device copy) makes it wait for every kernel queued so far, and then the device
waits for the host's Python. ``Trainer`` does two such reads per step: its ``logging_nan_inf_filter`` check
(``torch.isnan(loss) or torch.isinf(loss)``) and the blocking copy of each batch to the device. It also walks the
whole module tree for the FLOP count and the whole parameter list for gradient clipping at every step.

What replaces them, with the same results (docs/speed.md):

* :func:`finite_or_running_mean`: the non-finite-loss filter computed on the device (``torch.where``), the
  same substitute value ``Trainer`` logs (the mean of the losses since the last log);
* :func:`use_non_blocking_copies`: batches copied from pinned memory without blocking the host (CUDA only);
* :class:`FlopCounter`: ``Trainer.floating_point_ops``'s figure with the parameter count taken once;
* :func:`trained_parameters`: what gradient clipping needs to visit (frozen tensors never hold a gradient);
* :class:`NonFiniteWindow`: counts the non-finite losses of a logging window on the device, so a window whose
  every loss was non-finite is logged as NaN rather than as the filter's substitute (0.0 when nothing finite came
  before it in the window), whatever the gradient norm shows.

:class:`HostReads` counts the host's reads of tensor values inside a block: on a GPU each one is a
synchronisation, so a test on the CPU can show that a step makes none.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

#: Tensor methods that hand a tensor's value to Python (each a device synchronisation on a GPU).
VALUE_READS = frozenset({"__bool__", "item", "__float__", "__int__", "__index__", "tolist", "numpy"})


class HostReads(TorchFunctionMode):
    """Inside ``with HostReads() as reads:``, ``reads.names`` lists every read of a tensor's value by Python
    (``bool(t)``, ``t.item()``, ``float(t)``, ``t.tolist()``, ...) in order. A CPU stand-in for
    ``torch.cuda.set_sync_debug_mode``: what a step reads here, it would wait for on a GPU."""

    def __init__(self):
        super().__init__()
        self.names: List[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in VALUE_READS:
            self.names.append(name)
        return func(*args, **(kwargs or {}))

    @property
    def count(self) -> int:
        return len(self.names)


def finite_or_running_mean(loss: torch.Tensor, logged_sum: Optional[torch.Tensor], steps_since_log: int,
                           finite: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``loss`` where finite, else the mean of the losses accumulated since the last log (``logged_sum`` over
    ``steps_since_log + 1`` steps, as ``Trainer``'s ``logging_nan_inf_filter`` substitutes), decided on the device.
    ``finite``: ``torch.isfinite(loss)`` when the caller has it already."""
    fallback = logged_sum / (1 + steps_since_log) if logged_sum is not None else torch.zeros_like(loss)
    return torch.where(torch.isfinite(loss) if finite is None else finite, loss, fallback.to(loss.dtype))


def use_non_blocking_copies(args) -> bool:
    """Turn on non-blocking batch copies (``accelerator_config.non_blocking``) for a run on a CUDA device whose
    data loader pins memory, where the user left the choice at its default; returns whether they are on. A
    blocking copy from pageable or pinned memory waits for the device to finish the previous step."""
    config = getattr(args, "accelerator_config", None)
    if config is None or not hasattr(config, "non_blocking"):
        return False
    if config.non_blocking:
        return True
    if getattr(args, "use_cpu", False) or not torch.cuda.is_available() or not getattr(args, "dataloader_pin_memory", False):
        return False
    config.non_blocking = True
    return True


class FlopCounter:
    """``Trainer.floating_point_ops`` (``6 x tokens x non-embedding parameters``) with the parameter count taken
    on first use: counting walks every module and parameter, at every step, for a number that never changes."""

    def __init__(self):
        self._parameters: Optional[int] = None

    def __call__(self, model: nn.Module, inputs: Dict[str, Any]) -> int:
        main_input = getattr(model, "main_input_name", "input_ids")
        if main_input not in inputs or not hasattr(model, "num_parameters"):
            return 0
        if self._parameters is None:
            self._parameters = model.num_parameters(exclude_embeddings=True)
        return 6 * inputs[main_input].numel() * self._parameters


def trained_parameters(model: nn.Module) -> List[nn.Parameter]:
    """The parameters that can hold a gradient (``requires_grad``): gradient clipping over these equals clipping
    over ``model.parameters()``, whose frozen tensors hold none."""
    return [param for param in model.parameters() if param.requires_grad]


class NonFiniteWindow:
    """The finite training losses since the last log, counted on the device (one addition per step, no host read).
    Read once per log, where the Trainer reads the loss anyway."""

    def __init__(self):
        self._finite: Optional[torch.Tensor] = None
        self.losses = 0

    def add(self, finite: torch.Tensor) -> None:
        """Count one loss; ``finite`` is ``torch.isfinite(loss)`` (a scalar)."""
        self._finite = finite.to(torch.int32) if self._finite is None else self._finite + finite
        self.losses += 1

    def all_nonfinite(self) -> bool:
        """True when the window had losses and none was finite; starts the next window."""
        every = self.losses > 0 and int(self._finite) == 0
        self._finite, self.losses = None, 0
        return every
