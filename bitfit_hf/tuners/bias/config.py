"""What to train: the BitFit configuration (a plain, JSON-serialisable dataclass)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Optional, Sequence, Tuple, Union

from bitfit_hf.tuners.config_fields import layer_scale
from bitfit_hf.tuners.errors import SelectionError
from bitfit_hf.tuners.roles import ALL_ROLES, PRESETS


@dataclass
class BitFitConfig:
    """Which parameters BitFit trains.

    Args:
        bias_terms: a preset (``"all"``, ``"one-d"``, ``"paper-subset"``, ``"frozen"``, ``"full"``) or roles
            (``["b_q", "b_m2"]``; see :data:`bitfit_hf.tuners.roles.ALL_ROLES`). A space- or comma-separated
            string of roles is accepted too (``"b_q b_m2"``). ``"one-d"`` is every bias plus every
            LayerNorm / RMSNorm gain (roles ``g_LN1``, ``g_LN2``, ``g_emb_LN``, ``g_final_LN``, ...).
        patterns: extra regular expressions, matched against whole parameter names, whose parameters are
            trained as well (``[r".*\\.attention\\..*\\.bias"]``).
        train_head: train the task head (``classifier``, ``qa_outputs``, ``score``, ...).
        head_modules: module names of the head; detected from the model when ``None``.
        add_missing_biases: where a selected role's module has no bias (LLaMA, T5, ...), add one,
            initialised to zero so the model's outputs do not change.
        added_bias_init: how :attr:`add_missing_biases` initialises the biases it adds: ``"zero"``
            (outputs unchanged) or ``"normal:MEAN,STD"`` (drawn with a fixed seed, identical on every rank).
        reinit_existing_biases: also re-initialise the *pretrained* selected biases with
            ``added_bias_init`` (off by default; throws away pretrained values, so it is logged as a warning).
        layerwise_lr_decay: layer-wise learning-rate decay for the trained vectors: layer ``l`` of ``L``
            (counted from 1) trains at ``rate * decay ** (L - l)``; the top layer, the pooler, final norms
            and the head keep the full rate, the embeddings' norm gets ``decay ** L``. ``None``: off.
        bias_learning_rate / head_learning_rate: per-group learning rates for ``BitFitTrainer``;
            ``None`` uses ``TrainingArguments.learning_rate``.
        role_learning_rates: ``{role: rate}`` for single roles (``{"b_q": 1e-2, "b_m2": 1e-2}``: the paper finds
            the query bias and the FFN's intermediate bias move most), over ``bias_learning_rate``.
        save_full_model: ``BitFitTrainer.save_model`` writes a full checkpoint instead of the adapter.
    """

    method: ClassVar[str] = "bitfit"
    # True for a method that trains its own tensors beside the bias selection (BitFit + LoRA): there an
    # empty selection (bias_terms='frozen' without the head) is not an error.
    trains_more: ClassVar[bool] = False

    bias_terms: Union[str, List[str]] = "all"
    patterns: List[str] = field(default_factory=list)
    train_head: bool = True
    head_modules: Optional[List[str]] = None
    add_missing_biases: bool = False
    bias_learning_rate: Optional[float] = None
    head_learning_rate: Optional[float] = None
    save_full_model: bool = False
    layerwise_lr_decay: Optional[float] = None
    added_bias_init: str = "zero"
    reinit_existing_biases: bool = False
    role_learning_rates: Optional[Dict[str, float]] = None

    def __post_init__(self) -> None:
        self.bias_terms = normalize_bias_terms(self.bias_terms)
        self.patterns = list(self.patterns or [])
        for pattern in self.patterns:
            try:
                re.compile(pattern)
            except (re.error, TypeError) as err:
                raise SelectionError(f"Invalid regular expression in patterns: {pattern!r} ({err}).") from None
        if self.bias_terms == ["frozen"] and not self.train_head and not self.patterns and not self.trains_more:
            raise SelectionError(
                "bias_terms='frozen' with train_head=False selects nothing: 'frozen' trains the task head only. "
                "Keep train_head=True, or select bias terms or patterns."
            )
        for lr_name in ("bias_learning_rate", "head_learning_rate"):
            lr = getattr(self, lr_name)
            if lr is not None and not lr > 0:
                raise ValueError(f"BitFitConfig.{lr_name} must be a positive number, got {lr!r}.")
        for role, rate in (self.role_learning_rates or {}).items():
            if role not in ALL_ROLES:
                raise ValueError(f"role_learning_rates: {role!r} is no role; roles: {', '.join(ALL_ROLES)}.")
            if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not rate > 0:
                raise ValueError(f"role_learning_rates[{role!r}] must be a positive number, got {rate!r}.")
        decay = self.layerwise_lr_decay
        if decay is not None and not 0 < decay <= 1:
            raise ValueError(f"layerwise_lr_decay must be in (0, 1], got {decay!r} (e.g. 0.9).")
        parse_bias_init(self.added_bias_init)

    @property
    def preset(self) -> Optional[str]:
        """The preset name when ``bias_terms`` is one, else ``None``."""
        if len(self.bias_terms) == 1 and self.bias_terms[0] in PRESETS:
            return self.bias_terms[0]
        return None

    @property
    def is_full_finetuning(self) -> bool:
        return self.preset == "full"

    def learning_rate_for(self, role: str) -> Optional[float]:
        """The learning rate of a trained tensor of ``role`` (``None``: the trainer's)."""
        if role == "head":
            return self.head_learning_rate
        return (self.role_learning_rates or {}).get(role, self.bias_learning_rate)

    def layer_lr_scale(self, role: str, depth: int) -> float:
        """Factor on the learning rate of a tensor ``depth`` layers below the top (layer-wise decay)."""
        return layer_scale(self.layerwise_lr_decay, role, depth)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "BitFitConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"Unknown BitFitConfig field(s) {unknown}; known fields: {sorted(known)}.")
        return cls(**data)


def parse_bias_init(spec: str) -> Optional[Tuple[float, float]]:
    """``"zero"`` -> ``None``; ``"normal:MEAN,STD"`` -> ``(mean, std)``; anything else is an error."""
    text = str(spec).strip().lower()
    if text == "zero":
        return None
    if text.startswith("normal:"):
        parts = text[len("normal:"):].split(",")
        try:
            mean, std = (float(p) for p in parts)
        except ValueError:
            pass
        else:
            if std >= 0:
                return mean, std
    raise ValueError(f"added_bias_init must be 'zero' or 'normal:MEAN,STD' (e.g. 'normal:0,0.02'), got {spec!r}.")


def normalize_bias_terms(bias_terms: Union[str, Sequence[str], None]) -> List[str]:
    """Turn ``"b_q b_m2"``, ``"b_q,b_m2"``, ``["b_q", "b_m2"]`` or a preset into a checked list."""
    if bias_terms is None:
        return ["all"]
    if isinstance(bias_terms, str):
        items = bias_terms.replace(",", " ").split()
    else:
        items = [item for term in bias_terms for item in str(term).replace(",", " ").split()]
    if not items:
        raise SelectionError(
            "bias_terms is empty. Give a preset (" + ", ".join(PRESETS) + ") or roles such as 'b_q b_m2'."
        )
    presets = [item for item in items if item in PRESETS]
    if presets and len(items) > 1:
        raise SelectionError(
            f"bias_terms mixes the preset {presets[0]!r} with other terms {items}: give either one preset "
            "or a list of roles."
        )
    unknown = [item for item in items if item not in PRESETS and item not in ALL_ROLES]
    if unknown:
        raise SelectionError(
            f"Unknown bias term(s) {unknown}. Presets: {', '.join(PRESETS)}. Roles: "
            + ", ".join(f"{role} ({what})" for role, what in ALL_ROLES.items())
            + ". For anything else use `patterns=[regex, ...]`."
        )
    return list(dict.fromkeys(items))
