"""What to train: the BitFit configuration (a plain, JSON-serialisable dataclass)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Optional, Sequence, Tuple, Union

from bitfit_hf.tuners.roles import ALL_ROLES, PRESETS


@dataclass
class BitFitConfig:
    """Which parameters BitFit trains.

    Args:
        bias_terms: a preset (``"all"``, ``"paper-subset"``, ``"frozen"``, ``"full"``) or paper roles
            (``["b_q", "b_m2"]``; see :data:`bitfit_hf.tuners.roles.ALL_ROLES`). A space- or comma-separated
            string of roles is accepted too (``"b_q b_m2"``).
        patterns: extra regular expressions, matched against whole parameter names, whose parameters are
            trained as well (``[r".*\\.attention\\..*\\.bias"]``).
        train_head: train the task head (``classifier``, ``qa_outputs``, ``score``, ...).
        head_modules: module names of the head; detected from the model when ``None``.
        add_missing_biases: where a selected role's module has no bias (LLaMA, T5, ...), add one,
            initialised to zero so the model's outputs do not change.
        bias_learning_rate / head_learning_rate: per-group learning rates for ``BitFitTrainer``;
            ``None`` uses ``TrainingArguments.learning_rate``.
        save_full_model: ``BitFitTrainer.save_model`` writes a full checkpoint instead of the adapter.
        added_bias_init: how biases added by ``add_missing_biases`` start: ``"zero"`` (outputs unchanged)
            or ``"normal:MEAN,STD"`` (drawn from torch's global generator, so ``set_seed`` fixes them).
    """

    method: ClassVar[str] = "bitfit"

    bias_terms: Union[str, List[str]] = "all"
    patterns: List[str] = field(default_factory=list)
    train_head: bool = True
    head_modules: Optional[List[str]] = None
    add_missing_biases: bool = False
    bias_learning_rate: Optional[float] = None
    head_learning_rate: Optional[float] = None
    save_full_model: bool = False
    added_bias_init: str = "zero"

    def __post_init__(self) -> None:
        parse_added_bias_init(self.added_bias_init)
        self.bias_terms = normalize_bias_terms(self.bias_terms)
        self.patterns = list(self.patterns or [])
        for lr_name in ("bias_learning_rate", "head_learning_rate"):
            lr = getattr(self, lr_name)
            if lr is not None and not lr > 0:
                raise ValueError(f"BitFitConfig.{lr_name} must be a positive number, got {lr!r}.")

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
        return self.head_learning_rate if role == "head" else self.bias_learning_rate

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "BitFitConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"Unknown BitFitConfig field(s) {unknown}; known fields: {sorted(known)}.")
        return cls(**data)


def normalize_bias_terms(bias_terms: Union[str, Sequence[str], None]) -> List[str]:
    """Turn ``"b_q b_m2"``, ``"b_q,b_m2"``, ``["b_q", "b_m2"]`` or a preset into a checked list."""
    if bias_terms is None:
        return ["all"]
    if isinstance(bias_terms, str):
        items = bias_terms.replace(",", " ").split()
    else:
        items = [item for term in bias_terms for item in str(term).replace(",", " ").split()]
    if not items:
        raise ValueError(
            "bias_terms is empty. Give a preset (" + ", ".join(PRESETS) + ") or roles such as 'b_q b_m2'."
        )
    presets = [item for item in items if item in PRESETS]
    if presets and len(items) > 1:
        raise ValueError(
            f"bias_terms mixes the preset {presets[0]!r} with other terms {items}: give either one preset "
            "or a list of roles."
        )
    unknown = [item for item in items if item not in PRESETS and item not in ALL_ROLES]
    if unknown:
        raise ValueError(
            f"Unknown bias term(s) {unknown}. Presets: {', '.join(PRESETS)}. Roles: "
            + ", ".join(f"{role} ({what})" for role, what in ALL_ROLES.items())
            + ". For anything else use `patterns=[regex, ...]`."
        )
    return list(dict.fromkeys(items))


def parse_added_bias_init(spec: str) -> Optional[Tuple[float, float]]:
    """``"zero"`` -> ``None``; ``"normal:MEAN,STD"`` -> ``(mean, std)``; anything else is an error."""
    if spec in (None, "", "zero"):
        return None
    kind, _, args = str(spec).partition(":")
    try:
        mean, std = (float(v) for v in args.split(","))
    except ValueError:
        mean = std = None
    if kind != "normal" or std is None or not std >= 0:
        raise ValueError(f"added_bias_init {spec!r}: use 'zero' or 'normal:MEAN,STD' (e.g. 'normal:0,0.01').")
    return mean, std
