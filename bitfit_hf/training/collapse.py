"""Noticing a run that has stopped learning, while it trains and in its predictions.

A learning rate too high for the checkpoint in hand makes a run collapse: the model gives every input the same
prediction and its training loss goes flat at the loss of that constant prediction (on all-mpnet-base-v2 two
methods at their default rates predicted one class for every sentence). The final evaluation shows it, but only
once the whole budget is spent. :class:`CollapseCallback` reads the training loss that ``Trainer`` already logs
every ``logging_steps`` (``on_log``: no host sync of its own; its only per-step work compares the step number with
the few steps it asked a log for) and logs one warning, saying what happened and what to try, when for
consecutive logged steps:

* the loss or the gradient norm is not finite (``nonfinite_patience`` logs, default 2);
* the loss is not below the *constant level* less ``tolerance`` (``patience`` logs, default 3): the loss of the
  best prediction that ignores the input, which the caller computes from the training labels (the entropy of
  their distribution for classification and tagging, of the answer positions for QA, of the token frequencies for
  a language model; the label variance for regression; see :func:`label_entropy`);
* the loss stays more than ``rise`` (default 25%) above the first logged loss (``patience`` logs): training is
  undoing what the model knew, the sign of a diverging run where no constant level says more (a pretrained
  language model starts far below its unigram entropy).

Logs made during learning-rate warm-up do not count towards the last two (the rate is still climbing, so a flat
loss says nothing yet). A collapse is reported at the ``patience``-th logged step after warm-up; where the
logging cadence leaves fewer than that in the first epoch, the callback asks for ``patience`` logs of its own
spread over it, so the report comes within the first epoch (the log line at the start of training says when). :func:`warn_if_constant` is the end-of-run counterpart: every scored prediction the same.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
from transformers import TrainerCallback

logger = logging.getLogger(__name__)

__all__ = [
    "ConstantLoss",
    "CollapseReport",
    "CollapseCallback",
    "label_entropy",
    "label_variance",
    "token_constant_loss",
    "learning_rate_advice",
    "warn_if_constant",
    "CONSTANT_MIN_EXAMPLES",
]

IGNORE_INDEX = -100

#: Fewer scored predictions than this say nothing about a constant prediction (a handful can agree by chance).
CONSTANT_MIN_EXAMPLES = 20


def learning_rate_advice(learning_rate: Optional[float] = None) -> str:
    """What to try after a collapse, in the words every warning of the recipes uses."""
    if learning_rate:
        return (f"try a lower --learning_rate than this run's {learning_rate:g} (a third of it, "
                f"{learning_rate / 3:.1g}, is one step down the rate sweep's grid), or more training steps")
    return "try a lower --learning_rate (a third of the one used), or more training steps"


# --------------------------------------------------------------------------- the constant level


@dataclass(frozen=True)
class ConstantLoss:
    """The training loss of the best prediction that ignores the input (``value``), and what it is (``source``,
    quoted by the warning, e.g. "the entropy of the training labels")."""

    value: float
    source: str = "the loss of a constant prediction"


def _flat_labels(labels: Iterable[Any], ignore_index: int) -> np.ndarray:
    """One flat array of the labels that count: rows of lists (tagging, language models) are concatenated."""
    rows: List[np.ndarray] = []
    scalars: List[Any] = []
    for item in labels:
        if isinstance(item, (list, tuple, np.ndarray)):
            rows.append(np.asarray(item, dtype=np.int64).ravel())
        else:
            scalars.append(item)
    flat = np.concatenate(rows + [np.asarray(scalars, dtype=np.int64)]) if rows else np.asarray(scalars, dtype=np.int64)
    return flat[flat != ignore_index]


def label_entropy(labels: Iterable[Any], ignore_index: int = IGNORE_INDEX) -> Optional[float]:
    """The entropy, in nats, of the distribution of ``labels`` (class ids, or rows of them; ``ignore_index`` left
    out): the cross-entropy loss of predicting those frequencies for every input, the least any prediction that
    ignores the input can reach. ``None`` when there is no label."""
    flat = _flat_labels(labels, ignore_index)
    if flat.size == 0:
        return None
    counts = np.unique(flat, return_counts=True)[1].astype(np.float64)
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum())


def token_constant_loss(features, column: str = "labels", max_rows: int = 4096) -> Optional[ConstantLoss]:
    """For a language model: the entropy of its target tokens' frequencies (``column`` of the training features,
    -100 left out; the first ``max_rows`` rows, which on a large corpus underestimates it a little), the loss of
    predicting every token from its frequency alone. A pretrained model starts far below it; a diverging one climbs
    towards it. ``None`` without features."""
    if features is None or column not in features.column_names or len(features) == 0:
        return None
    rows = features.select(range(min(len(features), max_rows))) if len(features) > max_rows else features
    value = label_entropy(rows[column])
    return None if value is None else ConstantLoss(value, "the entropy of the training tokens' frequencies")


def label_variance(values: Iterable[float]) -> Optional[float]:
    """The variance of regression targets: the mean squared error of predicting their mean for every input.
    ``None`` when no target is finite."""
    array = np.asarray(list(values), dtype=np.float64)
    array = array[np.isfinite(array)]
    return float(array.var()) if array.size else None


# --------------------------------------------------------------------------- the callback


@dataclass(frozen=True)
class CollapseReport:
    """What the callback reported: ``kind`` (``"nonfinite"``, ``"constant"`` or ``"rising"``), the global
    ``step`` of the log that completed the evidence, and the warning's text."""

    kind: str
    step: int
    message: str


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


class CollapseCallback(TrainerCallback):
    """Warn once, while training runs, that it has stopped learning (the module docstring gives the rules).

    ``constant_loss``: the constant level (a :class:`ConstantLoss`, or a bare float), or ``None`` where none is
    known (then only the non-finite and rising checks run). The warning is logged on the main process only (every
    process sees the same all-reduced loss); ``report`` holds it afterwards.
    """

    def __init__(
        self,
        constant_loss: Union[ConstantLoss, float, None] = None,
        patience: int = 3,
        nonfinite_patience: int = 2,
        tolerance: float = 0.02,
        rise: float = 0.25,
    ):
        if patience < 1 or nonfinite_patience < 1:
            raise ValueError(f"patience and nonfinite_patience must be at least 1 (got {patience}, {nonfinite_patience}).")
        if constant_loss is not None and not isinstance(constant_loss, ConstantLoss):
            constant_loss = ConstantLoss(float(constant_loss))
        if constant_loss is not None and not (_finite(constant_loss.value) and constant_loss.value > 0):
            constant_loss = None  # one label only (entropy 0) or no label: nothing to compare with
        self.constant_loss = constant_loss
        self.patience = patience
        self.nonfinite_patience = nonfinite_patience
        self.tolerance = tolerance
        self.rise = rise
        self.report: Optional[CollapseReport] = None
        self._reset()

    def _reset(self) -> None:
        self._start: Optional[float] = None  # the first finite logged loss: the rising check's reference
        self._nonfinite: List[int] = []  # steps of the consecutive logs with a non-finite loss or gradient norm
        self._flat: List[Tuple[int, float]] = []  # (step, loss) of the consecutive logs at the constant level
        self._rising: List[Tuple[int, float]] = []  # ... and of those above the first loss by more than `rise`
        self._warmup = 0
        self._extra_logs: List[int] = []  # steps of the first epoch where this check asks for a log of its own

    def on_train_begin(self, args, state, control, **kwargs):
        self.report = None  # a second train() on the same trainer is watched afresh
        self._reset()
        self._warmup = args.get_warmup_steps(state.max_steps) if state.max_steps and state.max_steps > 0 else 0
        logging_steps = _logging_interval(args, state)
        if logging_steps:
            self._extra_logs = _first_epoch_logs(state, self._warmup, logging_steps, self.patience)
        if state.is_world_process_zero and logging_steps:
            # the first log that counts is the first one after warm-up; the report comes `patience` logs later
            regular = [logging_steps * (self._warmup // logging_steps + k) for k in range(1, self.patience + 1)]
            counted = sorted({step for step in regular + self._extra_logs if step > self._warmup})
            first = counted[self.patience - 1]
            level = (f"at the level of a constant prediction ({self.constant_loss.value:.4g}, "
                     f"{self.constant_loss.source}) or " if self.constant_loss else "")
            logger.info(
                "Collapse check: a warning if the training loss stays %s%.0f%% above its first value for %d logged "
                "steps, or is not finite for %d (logged every %d steps%s: the first such warning can come at step %d%s).",
                level, 100 * self.rise, self.patience, self.nonfinite_patience, logging_steps,
                f", and at steps {', '.join(map(str, self._extra_logs))} for this check" if self._extra_logs else "",
                first, _epoch_note(first, state),
            )
        return control

    def on_step_end(self, args, state, control, **kwargs):
        """Ask for a log at the first epoch's extra steps: a collapse is then reported within the first epoch
        whatever ``logging_steps`` is (Trainer reads the loss at those steps only)."""
        if self.report is None and state.global_step in self._extra_logs:
            control.should_log = True
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.report is not None or not logs or "loss" not in logs:
            return control  # reported already, or an evaluation's / the final summary's log
        step = state.global_step
        loss, grad_norm = logs.get("loss"), logs.get("grad_norm")
        if not _finite(loss) or (grad_norm is not None and not _finite(grad_norm)):
            # With logging_nan_inf_filter (the default) a NaN loss is logged as a finite number; the gradient norm
            # still shows it. The level and rising evidence is not interrupted by these logs, nor counted.
            self._nonfinite.append(step)
            if len(self._nonfinite) >= self.nonfinite_patience:
                self._warn(args, state, "nonfinite", self._nonfinite_message(args, loss, grad_norm))
            return control
        self._nonfinite.clear()
        loss = float(loss)
        if self._start is None:
            self._start = loss
        if step <= self._warmup:
            return control
        if self.constant_loss is not None:
            threshold = self.constant_loss.value * (1 - self.tolerance)
            self._flat = self._flat + [(step, loss)] if loss >= threshold else []
            if len(self._flat) >= self.patience:
                self._warn(args, state, "constant", self._constant_message(args, threshold))
                return control
        self._rising = self._rising + [(step, loss)] if loss > self._start * (1 + self.rise) else []
        if len(self._rising) >= self.patience:
            self._warn(args, state, "rising", self._rising_message(args))
        return control

    # ------------------------------------------------------------------ the warnings

    def _warn(self, args, state, kind: str, message: str) -> None:
        self.report = CollapseReport(kind, state.global_step, message)
        if state.is_world_process_zero:
            logger.warning("%s", message)

    def _span(self, evidence: List[Tuple[int, float]]) -> str:
        steps = [step for step, _ in evidence]
        losses = ", ".join(f"{loss:.4g}" for _, loss in evidence)
        return f"{len(evidence)} consecutive logged steps ({steps[0]}-{steps[-1]}: loss {losses})"

    def _constant_message(self, args, threshold: float) -> str:
        level = self.constant_loss
        return (
            f"Training has stopped learning: the training loss has not gone below {threshold:.4g} for "
            f"{self._span(self._flat)}, the level of a prediction that ignores the input ({level.value:.4g}, "
            f"{level.source}). The model does no better than giving every input the same prediction: training "
            f"collapsed (most often a learning rate too high for this checkpoint) or has not started to learn (a rate "
            f"too low, or too few steps). If it collapsed, {learning_rate_advice(args.learning_rate)}."
        )

    def _rising_message(self, args) -> str:
        return (
            f"Training is diverging: the training loss has stayed more than {self.rise:.0%} above its first logged "
            f"value ({self._start:.4g}) for {self._span(self._rising)}, so training is undoing what the model knew "
            f"(most often a learning rate too high for this checkpoint): {learning_rate_advice(args.learning_rate)}."
        )

    def _nonfinite_message(self, args, loss, grad_norm) -> str:
        steps = ", ".join(map(str, self._nonfinite))
        what = f"loss {loss}" + ("" if grad_norm is None else f", gradient norm {grad_norm}")
        precision = (" Under --fp16 an overflow does this: --bf16 (where the device has it) or full precision avoids "
                     "it." if getattr(args, "fp16", False) else "")
        return (
            f"Training has stopped learning: the training loss or its gradient norm is not finite at logged steps "
            f"{steps} (last: {what}): once the weights hold NaN or inf nothing more is learned; "
            f"{learning_rate_advice(args.learning_rate)}.{precision}"
        )


def _logging_interval(args, state) -> int:
    """Steps between training-loss logs (``logging_steps`` below 1 is a fraction of the training steps)."""
    strategy = str(getattr(args.logging_strategy, "value", args.logging_strategy))
    if strategy != "steps" or not args.logging_steps:
        return 0
    steps = args.logging_steps
    if steps < 1:
        steps = math.ceil((state.max_steps or 0) * steps)
    return int(steps)


def _first_epoch_logs(state, warmup: int, logging_steps: int, patience: int) -> List[int]:
    """Steps for extra logs when the regular ones leave fewer than ``patience`` after warm-up in the first epoch
    (and none when they do, or when the epoch's length is unknown): spread evenly after warm-up, the last before the
    epoch ends."""
    epochs = getattr(state, "num_train_epochs", 0)
    if not (epochs and state.max_steps):
        return []
    per_epoch = int(state.max_steps / epochs)
    if logging_steps * (warmup // logging_steps + patience) <= per_epoch:
        return []
    room = per_epoch - warmup
    if room < patience:
        return []
    spacing = room // patience
    return [warmup + spacing * k for k in range(1, patience + 1)]


def _epoch_note(step: int, state) -> str:
    """`` (in epoch N)`` when the run's epoch length is known."""
    epochs = getattr(state, "num_train_epochs", 0)
    if not (epochs and state.max_steps):
        return ""
    per_epoch = state.max_steps / epochs
    epoch = math.ceil(step / per_epoch) if per_epoch else 0
    if epoch <= 1:
        return ", within the first epoch"
    return f", in epoch {epoch}: lower --logging_steps for an earlier check"


# --------------------------------------------------------------------------- after the run


def warn_if_constant(preds: np.ndarray, labels: np.ndarray, unit: str = "evaluated examples", kind: str = "class",
                     source: Optional[logging.Logger] = None, names: Optional[Sequence[str]] = None) -> bool:
    """Warn when every scored prediction is the same ``kind`` (class, tag): the run learned nothing (it collapsed,
    or never left its start), whatever its score looks like; the warning puts that score beside the most frequent
    label's. ``preds`` and ``labels``: the scored predictions and their labels, aligned and flat; ``names``: the
    label names by id, to show them; ``source``: the logger to warn through. Returns whether it warned (never for
    fewer than :data:`CONSTANT_MIN_EXAMPLES` predictions, or labels all alike)."""
    preds, labels = np.asarray(preds).ravel(), np.asarray(labels).ravel()
    values, counts = np.unique(labels, return_counts=True)
    if preds.size < CONSTANT_MIN_EXAMPLES or values.size < 2 or np.unique(preds).size != 1:
        return False
    majority = counts.max() / labels.size

    def shown(value):
        return names[int(value)] if names is not None and 0 <= int(value) < len(names) else value

    (source or logger).warning(
        "all %d %s were given the same %s (%s): the model learned a constant prediction, which scores %.1f%% here "
        "(the majority %s %s scores %.1f%%). Training collapsed or never started: %s.",
        preds.size, unit, kind, shown(preds.flat[0]), 100 * float((preds == labels).mean()), kind,
        shown(values[counts.argmax()]),
        100 * majority, learning_rate_advice())
    return True
