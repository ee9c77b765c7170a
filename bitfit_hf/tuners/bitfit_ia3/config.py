"""What (IA)³ and BitFit + (IA)³ train: learned scaling vectors (Liu et al., 2022) on the attention keys and
values and on the FFN's inner activation, through peft's ``IA3`` tuner, beside a BitFit selection and the head."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, List, Optional, Tuple, Union

from bitfit_hf.tuners.bias.config import BitFitConfig

IA3 = "ia3"  # the role of an (IA)³ scaling vector in a selection (and the name of its optimizer group)


@dataclass
class BitFitIA3Config(BitFitConfig):
    """BitFit (``bias_terms``, ``patterns``, head: as :class:`BitFitConfig`) plus (IA)³ vectors through ``peft``.

    Args:
        ia3_target_modules: modules that get a scaling vector, in PEFT's sense (exact names or name suffixes; one
            string is a regular expression over whole module names). ``None``: the modules of the roles ``b_k``,
            ``b_v`` (their outputs are scaled) and ``b_m3`` (the FFN output projection: its *input*, the FFN's inner
            activation, is scaled), as in the (IA)³ paper.
        ia3_feedforward_modules: which targets scale their input (PEFT's ``feedforward_modules``). ``None``: the
            ``b_m3`` modules among the targets.
        ia3_learning_rate: learning rate of the (IA)³ group (``None``: ``TrainingArguments.learning_rate``).
    """

    method: ClassVar[str] = "bitfit_ia3"
    role_descriptions: ClassVar[Dict[str, str]] = {IA3: "(IA)³ scaling vectors (peft ia3_l)"}
    own_group_roles: ClassVar[Tuple[str, ...]] = (IA3,)
    trains_more: ClassVar[bool] = True  # scaling vectors beside the bias selection: an empty one is fine

    ia3_target_modules: Optional[Union[str, List[str]]] = None
    ia3_feedforward_modules: Optional[Union[str, List[str]]] = None
    ia3_learning_rate: Optional[float] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.is_full_finetuning:
            raise ValueError("bias_terms='full' trains every weight already; (IA)³ on top of it means nothing.")
        if self.ia3_learning_rate is not None and not self.ia3_learning_rate > 0:
            raise ValueError(f"ia3_learning_rate must be a positive number, got {self.ia3_learning_rate!r}.")
        for name in ("ia3_target_modules", "ia3_feedforward_modules"):
            value = getattr(self, name)
            if isinstance(value, (list, tuple)):
                names = [t for item in value for t in str(item).replace(",", " ").split()]
                if not names:
                    raise ValueError(f"{name} is empty: name modules, or leave it unset for the paper's modules.")
                setattr(self, name, list(dict.fromkeys(names)))

    def learning_rate_for(self, role: str) -> Optional[float]:
        return self.ia3_learning_rate if role == IA3 else super().learning_rate_for(role)


@dataclass
class IA3Config(BitFitIA3Config):
    """(IA)³ alone: the scaling vectors and the head, no bias term (``bias_terms`` ``frozen``)."""

    method: ClassVar[str] = "ia3"
    bias_terms: Union[str, List[str]] = "frozen"
