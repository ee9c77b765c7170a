"""The recipes' ``--method ia3`` ((IA)³ vectors and the head, no bias) and ``--method bitfit_ia3`` (``--bias_terms`` +
head + (IA)³ vectors), with the ``--ia3_*`` flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, List, Optional

from bitfit_hf.tuners.bias.recipe import bias_selection
from bitfit_hf.tuners.bitfit_ia3.config import BitFitIA3Config, IA3Config
from bitfit_hf.tuners.recipe import CommonFlags, RecipeMethod


@dataclass
class IA3Arguments:
    """(IA)³'s own flags."""

    flags_name: ClassVar[str] = "--ia3_* flags"

    ia3_target_modules: Optional[List[str]] = field(
        default=None,
        metadata={"help": "With --method ia3 / bitfit_ia3: modules that get an (IA)³ vector (PEFT's rule). Default: "
                          "the key, value and FFN output projections (the FFN's input activation is scaled)."},
    )
    ia3_feedforward_modules: Optional[List[str]] = field(
        default=None,
        metadata={"help": "With --method ia3 / bitfit_ia3: which targets scale their input. Default: the FFN output "
                          "projections."},
    )
    ia3_learning_rate: Optional[float] = field(
        default=None, metadata={"help": "With --method ia3 / bitfit_ia3: learning rate of the (IA)³ group (default: --learning_rate)."}
    )


def own_fields(own: IA3Arguments) -> dict:
    return dict(ia3_target_modules=own.ia3_target_modules, ia3_feedforward_modules=own.ia3_feedforward_modules,
                ia3_learning_rate=own.ia3_learning_rate)


def build_ia3(common: CommonFlags, own: IA3Arguments) -> IA3Config:
    return IA3Config(bias_terms="frozen", **common.bitfit_fields(), **own_fields(own))


def build_bitfit_ia3(common: CommonFlags, own: IA3Arguments) -> BitFitIA3Config:
    return BitFitIA3Config(bias_terms=bias_selection(common), **common.bitfit_fields(), **own_fields(own))


#: Default rates from benchmarks/lr_sweep.py on the GLUE recipe's default budget (its table has every rate's score, as
#: for every method's default rate). ``ia3`` 3e-2: scaling vectors start at one and need a large step to move in
#: 300 steps (1e-1 falls back). ``bitfit_ia3`` 3e-3: the biases set the limit (3e-2 diverges, as for BitFit alone).
#: On all-mpnet-base-v2 the next rate up from each (1e-1, 1e-2) predicted one class: the base-size defaults are one grid
#: step down (benchmarks/results/lr_sweep-mpnet-1000.md), so a change of batch or data does not put them past the edge.
IA3_RECIPE = RecipeMethod("ia3", build_ia3, IA3Arguments, default_learning_rate=3e-2, base_size_learning_rate=1e-2,
                          help="ia3: (IA)³ scaling vectors (peft) + head")
BITFIT_IA3_RECIPE = RecipeMethod("bitfit_ia3", build_bitfit_ia3, IA3Arguments, bias_terms=True, default_learning_rate=3e-3,
                                 base_size_learning_rate=1e-3,
                                 help="bitfit_ia3: bias terms + head + (IA)³ vectors")
