"""The recipes' ``--method adapterbias``: ``--share_alpha`` (its own default output folder, ``-shared``) and the L0
option (``--l0_lambda``, ``--l0_learning_rate``). BitFit's selection flags are refused: AdapterBias trains its
shift, the FFN / embeddings LayerNorms and the head."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from bitfit_hf.tuners.adapterbias.config import AdapterBiasConfig
from bitfit_hf.tuners.recipe import CommonFlags, FlagRefused, RecipeMethod


@dataclass
class AdapterBiasArguments:
    """AdapterBias's own flags."""

    share_alpha: bool = field(
        default=False, metadata={"help": "With --method adapterbias: one L_alpha shared by all layers."}
    )
    l0_lambda: float = field(
        default=0.0,
        metadata={"help": "With --method adapterbias: the paper's L0 regularisation of L_alpha, hard-concrete gates on its "
                  "input weights and this times their expected open count added to the loss; the saved adapter holds "
                  "the pruned weights as zeros. 0 (default): no gates. See docs/adapterbias.md."},
    )
    l0_learning_rate: Optional[float] = field(
        default=None, metadata={"help": "With --method adapterbias --l0_lambda: learning rate of the gates (default 0.1)."}
    )


def refuse_bias_flags(common: CommonFlags) -> None:
    given = [flag for flag, value in (("--bias_terms", common.bias_terms), ("--bias_patterns", common.patterns),
                                      ("--add_missing_biases", common.add_missing_biases),
                                      ("--bias_learning_rate", common.bias_learning_rate)) if value]
    if given:
        raise FlagRefused(f"{', '.join(given)} select or tune BitFit's biases; --method adapterbias trains its "
                          "shift, the FFN/embeddings LayerNorms and the head (rates: --learning_rate, "
                          "--head_learning_rate).")


def build(common: CommonFlags, own: AdapterBiasArguments) -> AdapterBiasConfig:
    if own.l0_learning_rate is not None and not own.l0_lambda:
        raise FlagRefused("--l0_learning_rate is the rate of the L0 gates, which only --l0_lambda > 0 adds.")
    l0_rate = {} if own.l0_learning_rate is None else {"l0_learning_rate": own.l0_learning_rate}
    return AdapterBiasConfig(share_alpha=own.share_alpha, train_head=common.train_head,
                             head_learning_rate=common.head_learning_rate, save_full_model=common.save_full_model,
                             l0_lambda=own.l0_lambda, **l0_rate)


# Default learning rates (without --learning_rate) come from benchmarks/lr_sweep.py on the GLUE recipe's default
# budget (300 steps; a dev split carved from the training data, two seeds at each method's two best rates); they are
# rates for short runs. The table (benchmarks/results/lr_sweep.md) has every rate's score.
# 3e-2 diverges; the official AdapterBias code's 1e-4 assumes 20-120 epochs. On all-mpnet-base-v2 1e-2 predicts one
# class and 1e-3 trains best (benchmarks/results/lr_sweep-mpnet-1000.md): the base-size default.
RECIPE = (
    RecipeMethod("adapterbias", build, AdapterBiasArguments, default_learning_rate=1e-2, base_size_learning_rate=1e-3,
                 help="adapterbias: AdapterBias (Fu et al., 2022), a token-dependent shift on each FFN output + the FFN "
                      "and embeddings LayerNorms + head",
                 refuse=refuse_bias_flags, output_suffix=(("share_alpha", "-shared"),)),
)
