"""What LayerNorm tuning trains: the configuration (a plain, JSON-serialisable dataclass).

LayerNorm tuning (Zhao et al., ICLR 2024) freezes every weight matrix and trains the normalisation layers only: the
gain (``weight``) and, where the layer has one, the bias of every LayerNorm / RMSNorm of the network, plus the task
head. It has no bias selection of its own, so the fields every adapter records for BitFit are class attributes here,
empty, as for AdapterBias.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Optional

from bitfit_hf.tuners.config_fields import from_fields, layer_scale

# Fields every adapter records for BitFit; LN tuning has no use for them and accepts them back (an adapter's config
# hands them to ``from_dict``) only with their neutral values.
_NEUTRAL = {"bias_terms": ([], None), "patterns": ([], None), "add_missing_biases": (False, None)}


def _is_rate(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


@dataclass
class LNTuningMethodConfig:
    """Which parameters LayerNorm tuning trains: every normalisation layer's gain and bias, and the head.

    (Named apart from ``peft.LNTuningConfig``, which the PEFT export writes.)

    Args:
        train_head: train the task head (``classifier``, ``score``, ...).
        head_modules: module names of the head; detected from the model when ``None``.
        norm_learning_rate / head_learning_rate: per-group learning rates for ``BitFitTrainer`` (the norms' gains
            and biases; the head). ``None``: ``TrainingArguments.learning_rate``.
        layerwise_lr_decay: layer-wise learning-rate decay for the norms, as BitFit's: layer ``l`` of ``L``
            (counted from 1) trains at ``rate * decay ** (L - l)``; final norms and the head keep the full rate, the
            embeddings' norm gets ``decay ** L``. Needs the architecture's role table to place a norm in its layer
            (a norm no role names keeps the full rate). ``None``: off.
        save_full_model: ``BitFitTrainer.save_model`` writes a full checkpoint instead of the adapter.
    """

    method: ClassVar[str] = "ln_tuning"

    train_head: bool = True
    head_modules: Optional[List[str]] = None
    norm_learning_rate: Optional[float] = None
    head_learning_rate: Optional[float] = None
    layerwise_lr_decay: Optional[float] = None
    save_full_model: bool = False

    # What the adapter format reads from every method config (BitFit's selection fields): none selected here.
    bias_terms: ClassVar[List[str]] = []
    patterns: ClassVar[List[str]] = []
    add_missing_biases: ClassVar[bool] = False
    is_full_finetuning: ClassVar[bool] = False
    preset: ClassVar[Optional[str]] = None

    def __post_init__(self) -> None:
        if not isinstance(self.train_head, bool):
            raise ValueError(f"LNTuningMethodConfig.train_head must be True or False, got {self.train_head!r}.")
        if self.head_modules is not None:
            if isinstance(self.head_modules, str) or not all(isinstance(m, str) and m for m in self.head_modules):
                raise ValueError(f"LNTuningMethodConfig.head_modules must be a list of module names, got "
                                 f"{self.head_modules!r}.")
            self.head_modules = list(self.head_modules)
        for name in ("norm_learning_rate", "head_learning_rate"):
            rate = getattr(self, name)
            if rate is not None and not _is_rate(rate):
                raise ValueError(f"LNTuningMethodConfig.{name} must be a positive number, got {rate!r}.")
        decay = self.layerwise_lr_decay
        if decay is not None and not (_is_rate(decay) and decay <= 1):
            raise ValueError(f"layerwise_lr_decay must be in (0, 1], got {decay!r} (e.g. 0.9).")

    def learning_rate_for(self, role: str) -> Optional[float]:
        """The learning rate of a trained tensor of ``role`` (``None``: the trainer's): the head's, else the norms'."""
        return self.head_learning_rate if role == "head" else self.norm_learning_rate

    def layer_lr_scale(self, role: str, depth: int) -> float:
        """Factor on the learning rate of a tensor ``depth`` layers below the top (layer-wise decay)."""
        return layer_scale(self.layerwise_lr_decay, role, depth)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "LNTuningMethodConfig":
        return from_fields(cls, data, _NEUTRAL, "LN tuning", "it trains every normalisation layer's gain and bias, and the head")
