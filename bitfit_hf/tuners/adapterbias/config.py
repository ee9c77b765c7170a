"""What AdapterBias trains: the configuration (a plain, JSON-serialisable dataclass).

AdapterBias (Fu et al., Findings of NAACL 2022) adds to the output of each layer's FFN output
projection a token-dependent shift ``alpha(h) * v``: ``v`` is a vector of the hidden size and
``alpha = L_alpha(h)`` one weight per token, computed by a linear layer from the projection's input
``h`` (the FFN's intermediate activation). Besides ``v`` and ``L_alpha`` the official code trains the
FFN LayerNorm of every layer and the embeddings LayerNorm (gain and bias), and the task head.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Optional

from bitfit_hf.tuners.config_fields import from_fields
from bitfit_hf.tuners.roles import ALL_ROLES

#: Roles of the tensors AdapterBias trains (beside the norms' ``g_<role>`` gains and ``b_<role>`` biases).
VECTOR = "ab_v"  # the shift vector v of one layer
ALPHA = "ab_alpha"  # L_alpha (weight and bias) of one layer, or the shared one (layer "")
GATE = "ab_l0"  # the L0 gates' log_alpha on L_alpha's input weights (training only: folded in at save)
GAIN_PREFIX = "g_"  # a trained norm's gain: "g_LN2" beside the bias role "b_LN2"

#: The official code's LayerNorms: every one whose name lacks "attention" (the FFN's and the embeddings').
DEFAULT_NORM_ROLES = ("b_LN2", "b_emb_LN")

# Fields every adapter records for BitFit; AdapterBias has no use for them and accepts them only
# with their neutral values (an adapter's config hands them back when it is loaded).
_NEUTRAL = {"bias_terms": ([], ["frozen"], None), "patterns": ([], None), "add_missing_biases": (False, None)}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class AdapterBiasConfig:
    """Which parameters AdapterBias trains.

    Args:
        share_alpha: one ``L_alpha`` shared by every layer (the paper's parameter-sharing variant)
            instead of one per layer.
        norm_roles: norm roles (see :data:`bitfit_hf.tuners.roles.ALL_ROLES`) whose modules are trained,
            gain and bias. Default: the FFN LayerNorm of every layer and the embeddings LayerNorm, as the
            official code; a role the architecture lacks (GPT-2 has no embeddings LayerNorm) is skipped.
        train_head: train the task head.
        head_modules: module names of the head; detected from the model when ``None``.
        adapter_learning_rate / norm_learning_rate / head_learning_rate: per-group learning rates for
            ``BitFitTrainer`` (``v`` and ``L_alpha``; the norms; the head). ``None``: the trainer's
            ``learning_rate`` (the official code trains everything at 1e-4).
        alpha_init_seed: ``L_alpha`` starts as ``nn.Linear``'s default initialisation, drawn from a
            generator seeded with this value plus the layer index, so every process and every run
            builds the same one whatever the global random state. ``v`` starts at zero, so the
            initial ``L_alpha`` never changes the model's outputs.
        save_full_model: ``BitFitTrainer.save_model`` writes a full checkpoint instead of the adapter.
        l0_lambda: strength of the paper's L0 regularisation of ``L_alpha``: > 0 puts a hard-concrete gate on
            each input weight of every ``L_alpha`` (:mod:`~bitfit_hf.tuners.adapterbias.l0`) and adds
            ``l0_lambda`` times the expected number of open gates to the training loss. 0: no gates at all.
        l0_learning_rate: learning rate of the gates' ``log_alpha``. They live on a logit scale (a gate closes
            after moving ~5 units), not on the weights' scale, so they get a rate of their own: 0.1 lets a gate
            close within a few hundred steps (``None``: the trainer's ``learning_rate``).
        l0_folded: written by a save, never by hand: the gates were folded into ``L_alpha``'s weights (pruned
            ones stored as zeros) and the adapter holds no gate; records ``gated`` / ``active`` /
            ``expected_active`` (the expected L0 at save). An adapter with it loads with no gates.
    """

    method: ClassVar[str] = "adapterbias"

    share_alpha: bool = False
    norm_roles: List[str] = field(default_factory=lambda: list(DEFAULT_NORM_ROLES))
    train_head: bool = True
    head_modules: Optional[List[str]] = None
    adapter_learning_rate: Optional[float] = None
    norm_learning_rate: Optional[float] = None
    head_learning_rate: Optional[float] = None
    alpha_init_seed: int = 0
    save_full_model: bool = False
    l0_lambda: float = 0.0
    l0_learning_rate: Optional[float] = 0.1
    l0_folded: Optional[Dict[str, float]] = None

    def __post_init__(self) -> None:
        self.norm_roles = list(self.norm_roles or [])
        unknown = [role for role in self.norm_roles if role not in ALL_ROLES]
        if unknown:
            raise ValueError(f"AdapterBiasConfig.norm_roles: unknown role(s) {unknown}; roles: {', '.join(ALL_ROLES)}.")
        for lr_name in ("adapter_learning_rate", "norm_learning_rate", "head_learning_rate", "l0_learning_rate"):
            lr = getattr(self, lr_name)
            if lr is not None and not (_is_number(lr) and math.isfinite(lr) and lr > 0):
                raise ValueError(f"AdapterBiasConfig.{lr_name} must be a positive number, got {lr!r}.")
        if not (_is_number(self.l0_lambda) and math.isfinite(self.l0_lambda) and self.l0_lambda >= 0):
            raise ValueError(f"AdapterBiasConfig.l0_lambda must be a finite number >= 0 (0: no L0 gates), got "
                             f"{self.l0_lambda!r}. The paper's penalty is l0_lambda times the expected number of "
                             "open gates: try 1e-4 to 1e-2.")
        self.l0_lambda = float(self.l0_lambda)
        if self.l0_folded is not None:
            keys = {"gated", "active", "expected_active"}
            if self.l0_lambda == 0 or not isinstance(self.l0_folded, dict) or set(self.l0_folded) != keys:
                raise ValueError(f"AdapterBiasConfig.l0_folded is written by a save of an L0-gated model "
                                 f"(l0_lambda > 0) as a map with the keys {sorted(keys)}; got {self.l0_folded!r} "
                                 f"with l0_lambda={self.l0_lambda}. Leave it unset.")

    @property
    def gated(self) -> bool:
        """Whether the model carries L0 gates: an L0 run (not an adapter whose gates were folded in)."""
        return self.l0_lambda > 0 and self.l0_folded is None

    # What the adapter format reads from every method config (BitFit's selection fields).
    bias_terms: ClassVar[List[str]] = []
    patterns: ClassVar[List[str]] = []
    add_missing_biases: ClassVar[bool] = False
    is_full_finetuning: ClassVar[bool] = False
    preset: ClassVar[Optional[str]] = None

    #: How the summary and the model card describe this method's roles.
    role_descriptions: ClassVar[Dict[str, str]] = {
        VECTOR: "AdapterBias shift vector v (hidden size)",
        ALPHA: "AdapterBias L_alpha: FFN width -> one weight per token (weight + bias)",
        "g_LN2": "gain of the LayerNorm after (post-LN) or before (pre-LN) the MLP",
        "g_emb_LN": "gain of the embeddings LayerNorm",
        GATE: "L0 gates' log_alpha on L_alpha's input weights (training only: folded into L_alpha at save)",
    }

    @staticmethod
    def describe_l0(fields: Dict[str, Any]) -> str:
        """What the L0 option did, from a config's fields (an adapter's ``method_config``); "" without L0."""
        if not fields.get("l0_lambda"):
            return ""
        folded = fields.get("l0_folded")
        if not folded:
            return f"L0 gates on L_alpha's input weights, l0_lambda={fields['l0_lambda']:g}"
        return (f"L0 l0_lambda={fields['l0_lambda']:g}: {folded['active']:,} of {folded['gated']:,} L_alpha input weights "
                f"kept, expected_active={folded['expected_active']}, the others stored as zeros")

    def learning_rate_for(self, role: str) -> Optional[float]:
        """The learning rate of a trained tensor of ``role`` (``None``: the trainer's)."""
        if role == "head":
            return self.head_learning_rate
        if role == GATE:
            return self.l0_learning_rate
        if role in (VECTOR, ALPHA):
            return self.adapter_learning_rate
        return self.norm_learning_rate

    def to_dict(self) -> Dict[str, Any]:
        """The fields; the L0 ones only for an L0 run, so adapters without L0 keep the fields they always had."""
        data = dataclasses.asdict(self)
        if data["l0_folded"] is None:
            del data["l0_folded"]
        if not self.l0_lambda:
            del data["l0_lambda"], data["l0_learning_rate"]
        return data

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "AdapterBiasConfig":
        return from_fields(cls, data, _NEUTRAL, "AdapterBias", "it trains v, L_alpha, norms and the head only")
