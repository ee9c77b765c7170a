"""What BitFit + LoRA trains: a BitFit selection and the head, plus LoRA matrices on chosen modules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, List, Optional, Tuple, Union

from bitfit_hf.tuners.bias.config import BitFitConfig

LORA = "lora"  # the role of a LoRA matrix in a selection (and the name of its optimizer group)


@dataclass
class BitFitLoraConfig(BitFitConfig):
    """BitFit (``bias_terms``, ``patterns``, head: as :class:`BitFitConfig`) plus LoRA through ``peft``.

    Args:
        lora_r / lora_alpha / lora_dropout: LoRA rank, scaling numerator (the update is scaled by
            ``alpha / r``) and dropout on the LoRA branch's input, as in ``peft.LoraConfig``.
        lora_target_modules: modules that get LoRA, in PEFT's sense (exact names or name suffixes such as
            ``["query", "value"]``; one string is a regular expression over whole module names). ``None``:
            the modules of the roles ``b_q`` and ``b_v`` (the query and value projections), or PEFT's own
            default for an architecture without a role table.
        lora_learning_rate: learning rate of the LoRA group (``None``: ``TrainingArguments.learning_rate``);
            biases keep ``bias_learning_rate`` and the head ``head_learning_rate``.
    """

    method: ClassVar[str] = "bitfit_lora"
    role_descriptions: ClassVar[Dict[str, str]] = {LORA: "LoRA matrices (peft lora_A / lora_B)"}
    own_group_roles: ClassVar[Tuple[str, ...]] = (LORA,)  # the optimizer gives LoRA a group (and rate) of its own
    trains_more: ClassVar[bool] = True  # LoRA matrices beside the bias selection: an empty one is fine

    lora_r: int = 8
    lora_alpha: float = 16
    lora_dropout: float = 0.1
    lora_target_modules: Optional[Union[str, List[str]]] = None
    lora_learning_rate: Optional[float] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.is_full_finetuning:
            raise ValueError("bias_terms='full' trains every weight already; LoRA on top of it means nothing.")
        if not (isinstance(self.lora_r, int) and self.lora_r > 0):
            raise ValueError(f"lora_r must be a positive integer, got {self.lora_r!r}.")
        if not 0.0 <= float(self.lora_dropout) < 1.0:
            raise ValueError(f"lora_dropout must be in [0, 1), got {self.lora_dropout!r}.")
        if self.lora_learning_rate is not None and not self.lora_learning_rate > 0:
            raise ValueError(f"lora_learning_rate must be a positive number, got {self.lora_learning_rate!r}.")
        if isinstance(self.lora_target_modules, (list, tuple)):
            names = [t for item in self.lora_target_modules for t in str(item).replace(",", " ").split()]
            if not names:
                raise ValueError("lora_target_modules is empty: name modules, or leave it unset for query/value.")
            self.lora_target_modules = list(dict.fromkeys(names))

    def learning_rate_for(self, role: str) -> Optional[float]:
        return self.lora_learning_rate if role == LORA else super().learning_rate_for(role)
