"""The recipes' ``--method lora`` (LoRA and the head, no bias: BitFit + LoRA with ``bias_terms`` ``frozen``) and
``--method bitfit_lora`` (``--bias_terms`` + head + LoRA), with the ``--lora_*`` flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, List, Optional, Union

from bitfit_hf.tuners.bias.recipe import bias_selection
from bitfit_hf.tuners.bitfit_lora.config import BitFitLoraConfig
from bitfit_hf.tuners.recipe import CommonFlags, RecipeMethod


@dataclass
class LoraArguments:
    """LoRA's own flags."""

    flags_name: ClassVar[str] = "--lora_* flags"

    lora_r: int = field(default=8, metadata={"help": "With --method lora / bitfit_lora: the LoRA rank."})
    lora_alpha: float = field(default=16, metadata={"help": "With --method lora / bitfit_lora: LoRA alpha (scale alpha/r)."})
    lora_dropout: float = field(default=0.1, metadata={"help": "With --method lora / bitfit_lora: dropout on the LoRA input."})
    lora_target_modules: Optional[List[str]] = field(
        default=None,
        metadata={"help": "With --method lora / bitfit_lora: modules that get LoRA (PEFT's rule: exact names or name "
                          "suffixes, e.g. `query value`). Default: the query and value projections."},
    )
    lora_learning_rate: Optional[float] = field(
        default=None, metadata={"help": "With --method lora / bitfit_lora: learning rate of the LoRA group (default: --learning_rate)."}
    )


def config(bias_terms: Union[str, List[str]], common: CommonFlags, own: LoraArguments) -> BitFitLoraConfig:
    return BitFitLoraConfig(bias_terms=bias_terms, **common.bitfit_fields(), lora_r=own.lora_r, lora_alpha=own.lora_alpha,
                            lora_dropout=own.lora_dropout, lora_target_modules=own.lora_target_modules,
                            lora_learning_rate=own.lora_learning_rate)


def build_lora(common: CommonFlags, own: LoraArguments) -> BitFitLoraConfig:
    return config("frozen", common, own)


def build_bitfit_lora(common: CommonFlags, own: LoraArguments) -> BitFitLoraConfig:
    return config(bias_selection(common), common, own)


# Default learning rates (without --learning_rate) come from benchmarks/lr_sweep.py on the GLUE recipe's default
# budget (300 steps; a dev split carved from the training data, two seeds at each method's two best rates); they are
# rates for short runs. The table (benchmarks/results/lr_sweep.md) has every rate's score.
# 1e-2 diverges for lora and bitfit_lora. On all-mpnet-base-v2 bitfit_lora's 3e-3 predicted one class at batch 8 (the GPU
# study, docs/reproduction-gpu.md) and trained at batch 32 (benchmarks/results/lr_sweep-mpnet-1000.md): the base-size
# default is 1e-3, a third of the edge. lora's 1e-2 predicted one class on all-mpnet-base-v2, so its base-size
# default is also a grid step below its small-model one.
RECIPE = (
    RecipeMethod("lora", build_lora, LoraArguments, help="lora: LoRA (peft) on --lora_target_modules + head",
                 default_learning_rate=3e-3, base_size_learning_rate=1e-3),
    RecipeMethod("bitfit_lora", build_bitfit_lora, LoraArguments, help="bitfit_lora: bias terms + head + LoRA",
                 bias_terms=True, default_learning_rate=3e-3, base_size_learning_rate=1e-3),
)
