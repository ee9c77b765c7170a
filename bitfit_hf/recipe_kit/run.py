"""The flow every recipe shares: start (parse, log, check, claim the output folder, fetch the default assets),
evaluate before and after training, save the adapter and the results files in transformers' layout, finish,
and the CLI entry point. Loading the model is :mod:`bitfit_hf.recipe_kit.loading`'s.

Output directory of a run (``--output_dir``):

* the bias-only adapter (``adapter_config.json``, ``adapter_model.safetensors``) and the tokenizer,
  or a full checkpoint with ``--method full`` / ``--save_full_model``;
* ``trainable_summary.json`` (what was trained, per role and layer);
* ``train_results.json``, ``eval_results.json`` (``eval_*`` after training, ``init_eval_*`` for the
  untrained model), ``predict_results.json`` and ``all_results.json`` (all of them merged), as
  transformers' example scripts write them; ``trainer_state.json``;
* ``run_args.json``: every argument of the run (credentials redacted) and the defaults the recipe chose;
* the recipe's predictions with ``--do_predict``;
* while the run works, ``_bitfit_run.lock`` (its process id): another run into the same folder is refused.

A folder that already holds an earlier run's files is refused before anything is loaded, unless
``--overwrite_output_dir`` is given or the run resumes (:mod:`bitfit_hf.recipe_kit.output_dir`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from typing import Any, Callable, Dict, Optional

from bitfit_hf.recipe_kit.args import (
    ParsedArgs,
    RecipeDefaults,
    check_data_args,
    check_training_args,
    parse_recipe_args,
    recipe_prog,
)
from bitfit_hf.recipe_kit.errors import RecipeError
from bitfit_hf.recipe_kit.output_dir import check_output_dir, claim_output_dir, release_output_dir
from bitfit_hf.training.backend import release_process_group
from bitfit_hf.training.checkpoints import (
    check_resume_config,
    check_same_training,
    last_complete_checkpoint,
    resolve_resume_checkpoint,
)
from bitfit_hf.tuners import describe_method, method_label
from bitfit_hf.utils.constants import RUN_ARGS_NAME, SUMMARY_NAME
from bitfit_hf.utils.errors import exit_on_user_error
from bitfit_hf.utils.io import write_json_atomic
from bitfit_hf.utils.secrets import install_log_redaction, redact, redact_argv

logger = logging.getLogger(__name__)

__all__ = [
    "start_run",
    "setup_logging",
    "log_run_header",
    "fetch_default_assets",
    "evaluate_sets",
    "evaluate_before_training",
    "trainer_options",
    "pad_multiple",
    "train_and_save",
    "train_and_evaluate",
    "finish_run",
    "save_metrics",
    "check_resume_target",
    "check_adapter_target",
    "record_run",
    "write_trainable_summary",
    "write_run_args",
    "cli_entry",
]


# --------------------------------------------------------------------------- logging


def setup_logging(training_args) -> None:
    """Our loggers at INFO on the main process (WARNING elsewhere); transformers/datasets at
    ``--log_level`` (default: warning)."""
    import datasets
    import transformers

    handler = logging.StreamHandler(sys.stdout)
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[handler],
    )
    ours = logging.INFO if training_args.should_log else logging.WARNING
    for name in ("bitfit_hf", "__main__"):
        logging.getLogger(name).setLevel(ours)
    level = training_args.get_process_log_level()
    datasets.utils.logging.set_verbosity(level)
    transformers.utils.logging.set_verbosity(level)
    transformers.utils.logging.enable_default_handler()
    transformers.utils.logging.enable_explicit_format()
    # No token-shaped text reaches a log line, whoever logs it (tokens are also kept out of every file).
    install_log_redaction(*logging.getLogger().handlers, *logging.getLogger("transformers").handlers,
                          *logging.getLogger("datasets").handlers)


def log_run_header(parsed: ParsedArgs, recipe: str, config: Any = None) -> None:
    args = parsed.training
    logger.info(
        "%s: process rank %s of %s, device %s, n_gpu %s, bf16 %s, fp16 %s",
        recipe, args.process_index, args.world_size, args.device, args.n_gpu, args.bf16, args.fp16,
    )
    if parsed.offline_data:
        logger.info("No dataset given: running the offline default (%s).", parsed.data.dataset_name)
    if parsed.applied_defaults:
        shown = ", ".join(f"{k}={v}" for k, v in parsed.applied_defaults.items())
        logger.info("Recipe defaults (override any with its flag): %s", shown)
    for note in parsed.notes:
        logger.info("%s", note)
    method, selection = parsed.bitfit.method, config if config is not None else parsed.bitfit.method_config()
    if parsed.model.adapter_name_or_path and not args.do_train and logger.isEnabledFor(logging.INFO):
        from bitfit_hf.adapters.adapter import BitFitAdapter

        # Evaluating or predicting with an adapter runs its method, whatever --method says.
        selection = BitFitAdapter.from_pretrained(parsed.model.adapter_name_or_path).config
        method = method_label(selection)
    logger.info("method=%s selection=%s learning_rate=%g output_dir=%s", method, describe_method(selection),
                args.learning_rate, args.output_dir)


def start_run(data_class, defaults: RecipeDefaults, argv=None):
    """The first step of every recipe: parse the arguments (``--help`` lists them all), set up logging,
    log what the run will do, check ``--method`` / ``--bias_terms`` and ``--output_dir`` (an earlier run's
    outputs are refused, :mod:`bitfit_hf.recipe_kit.output_dir`) before anything is loaded, take the output
    folder's lock, and seed.
    Returns ``(parsed, method_config)``; ``parsed`` unpacks to model, data, BitFit and training arguments."""
    from transformers import set_seed

    from bitfit_hf.recipe_kit.loading import check_base_loading
    from bitfit_hf.training.backend import use_available_cpu_threads

    parsed = parse_recipe_args(data_class, defaults, argv)
    check_training_args(parsed.training)
    check_data_args(parsed.data)
    check_base_loading(parsed.model)  # --load_in_4bit on a CPU fails here, before any loading
    setup_logging(parsed.training)
    use_available_cpu_threads()  # `accelerate launch` alone gives a CPU process one thread
    method_config = parsed.bitfit.method_config()
    check_frozen_dtype(parsed.training, method_config)
    log_run_header(parsed, defaults.recipe, method_config)
    check_output_dir(parsed.training)  # an earlier run's outputs: refused before anything is loaded or written
    check_resume_target(parsed, method_config)  # a checkpoint of another method or selection: refused here too
    check_adapter_target(parsed, method_config)  # so is training on from an adapter of another method
    # _bitfit_run.lock: no other live run writes here (released by finish_run). Every process has checked the
    # folder before the one that saves goes on (a barrier under a multi-process launch).
    with parsed.training.main_process_first(local=not parsed.training.save_on_each_node, desc="claiming --output_dir"):
        claim_output_dir(parsed.training)
    fetch_default_assets(parsed, defaults.default_model_asset)
    set_seed(parsed.training.seed)
    return parsed, method_config


def check_frozen_dtype(training_args, method_config) -> None:
    """``--frozen_dtype bfloat16`` where it cannot work (no --bf16, --method full, --save_full_model, DeepSpeed /
    FSDP): refused before anything loads; ``auto`` is decided by ``BitFitTrainer`` once the device is known."""
    from bitfit_hf.training.frozen_dtype import resolve_frozen_dtype

    choice = getattr(training_args, "frozen_dtype", None)
    if choice not in (None, "auto"):
        resolve_frozen_dtype(choice, training_args, method_config, model=None)


# --------------------------------------------------------------------------- assets


def fetch_default_assets(parsed: ParsedArgs, model_asset: str = "minilm") -> None:
    """Before anything is loaded, make sure the default model (no ``--model_name_or_path``) and the
    offline dataset this run uses are at hand: fetched on first use, like Hub downloads, by the main
    process of each node while the others wait. So is a model asset named by ``--model_name_or_path``
    (``mpnet``). Offline (``BITFIT_HF_OFFLINE=1`` or ``HF_HUB_OFFLINE=1``) a missing one stops the run
    with the one command that fetches it."""
    from bitfit_hf.data.assets import ASSETS, ensure_assets, model_asset_name

    names = []
    if parsed.model.model_name_or_path is None:
        names.append(model_asset)
    elif model_asset_name(parsed.model.model_name_or_path) is not None:
        names.append(parsed.model.model_name_or_path)
    if parsed.data.dataset_name in ASSETS:
        names.append(parsed.data.dataset_name)
    if names:
        with parsed.training.main_process_first(desc="fetching the default model and data"):
            ensure_assets(names)


# --------------------------------------------------------------------------- running


def evaluate_sets(trainer, eval_sets: Dict[str, Any], prefix: str = "eval") -> Dict[str, float]:
    """``trainer.evaluate`` on each dataset; keys of the set named ``s`` get the suffix ``s``
    (``{"": matched, "_mm": mismatched}`` gives ``eval_accuracy`` and ``eval_accuracy_mm``)."""
    metrics: Dict[str, float] = {}
    for suffix, dataset in eval_sets.items():
        result = trainer.evaluate(eval_dataset=dataset, metric_key_prefix=prefix)
        metrics.update({f"{k}{suffix}": v for k, v in result.items()})
    return metrics


class _EvaluateAtTrainBegin:
    """A callback that runs the untrained-model evaluation once, when training begins."""

    def __init__(self, run: Callable[[], Dict[str, float]]):
        self.run = run
        self.metrics: Dict[str, float] = {}
        self.done = False

    def on_train_begin(self, args, state, control, **kwargs):
        if not self.done:
            self.done = True
            self.metrics.update(self.run())
        return control


def evaluate_before_training(trainer, run: Callable[[], Dict[str, float]]) -> Dict[str, float]:
    """The untrained model's metrics (``init_eval_*``); ``run`` evaluates, e.g.
    ``lambda: evaluate_sets(trainer, sets, "init_eval")``.

    Under DeepSpeed the engine is only built inside ``train()``, and evaluating first would build an
    inference engine that training cannot reuse: there the evaluation runs as the first thing of
    ``train()`` (a callback at train begin), and the returned dict is filled in then.
    """
    if not getattr(trainer, "is_deepspeed_enabled", False):
        return run()
    from transformers import TrainerCallback

    callback = type("EvaluateAtTrainBegin", (_EvaluateAtTrainBegin, TrainerCallback), {})(run)
    trainer.add_callback(callback)
    return callback.metrics


def _resume_value(training_args) -> Optional[Any]:
    """``--resume_from_checkpoint`` as ``Trainer.train`` takes it: ``True`` for last / latest / true (the
    newest *complete* checkpoint, resolved by ``BitFitTrainer.train``), a path, or ``None``."""
    value = training_args.resume_from_checkpoint
    if value is None or str(value).lower() in ("", "false", "no", "none"):
        return None
    if str(value).lower() in ("true", "last", "latest"):
        return True
    return value


def _resume_checkpoint(training_args) -> Optional[Any]:
    value = _resume_value(training_args)
    if value is None and last_complete_checkpoint(training_args.output_dir):
        logger.warning(
            "%s holds checkpoints from an earlier run; training starts afresh. Pass --resume_from_checkpoint "
            "last to resume the latest one.", training_args.output_dir,
        )
    return value


def check_resume_target(parsed: ParsedArgs, method_config) -> None:
    """Before anything is loaded: the checkpoint ``--resume_from_checkpoint`` names exists, is complete and was
    trained with this run's ``--method`` and selection (an error naming both otherwise)."""
    training = parsed.training
    value = _resume_value(training)
    if value is None or not training.do_train:
        return
    check_resume_config(resolve_resume_checkpoint(value, training.output_dir), method_config)


def check_adapter_target(parsed: ParsedArgs, method_config) -> None:
    """Before the model loads: training on from ``--adapter_name_or_path`` needs the adapter's method and
    selection (another one would train a new selection over the loaded tensors and save an adapter without
    them); evaluating or predicting with it needs nothing more."""
    model_args, training = parsed.model, parsed.training
    if not model_args.adapter_name_or_path or not training.do_train:
        return
    from bitfit_hf.adapters.adapter import BitFitAdapter

    recorded = BitFitAdapter.from_pretrained(model_args.adapter_name_or_path).config
    check_same_training(recorded, method_config, f"--adapter_name_or_path {model_args.adapter_name_or_path!r}",
                        advice="Train on with the adapter's --method and flags, or leave --adapter_name_or_path out to "
                               "start afresh.", error=RecipeError)


def record_run(trainer, parsed: ParsedArgs) -> None:
    """Check what the run resumes from against the model just built (its trained tensors and base; nothing
    is written before), then write ``trainable_summary.json`` and ``run_args.json``. Recipes call it once the
    trainer exists, before evaluating or training."""
    training = parsed.training
    value = _resume_value(training)
    if value is not None and training.do_train:
        trainer.check_resume(resolve_resume_checkpoint(value, training.output_dir))
    write_trainable_summary(trainer, training.output_dir)
    write_run_args(parsed, training.output_dir)


def trainer_options(model_args, method_config) -> Dict[str, Any]:
    """The ``BitFitTrainer`` arguments every recipe passes: what to train, and the base model (id and
    revision) that the saved adapter names, so it can be pulled back onto a stock model."""
    return {
        "method_config": method_config,
        "base_model_name_or_path": model_args.base_model_name_or_path,
        "base_model_revision": None if model_args.model_revision == "main" else model_args.model_revision,
    }


def pad_multiple(training_args) -> Optional[int]:
    """Pad batches to a multiple of 8 under fp16 / bf16 (tensor-core friendly shapes), else exactly."""
    return 8 if training_args.fp16 or training_args.bf16 else None


def _drop_end_of_training_checkpoint(trainer) -> None:
    """transformers saves a checkpoint when training ends, off the ``--save_steps`` cadence too; once the
    adapter is saved beside it, that copy (with its optimizer state) only fills the folder: removed. A
    checkpoint the cadence wrote stays, as does everything with ``--save_strategy`` other than steps."""
    import shutil

    args, step = trainer.args, trainer.state.global_step
    if str(getattr(args, "save_strategy", "")).split(".")[-1].lower() != "steps" or not step:
        return
    every = getattr(trainer.state, "save_steps", None) or args.save_steps  # a fraction becomes steps in the state
    if every and every >= 1 and step % int(every) == 0:
        return
    folder = os.path.join(args.output_dir, f"checkpoint-{step}")
    if trainer.is_world_process_zero() and os.path.isdir(folder):
        shutil.rmtree(folder, ignore_errors=True)
        logger.info("Removed %s: written only because training ended (the adapter is saved); --save_steps %s "
                    "checkpoints are kept.", folder, args.save_steps)


def train_and_save(trainer, training_args, num_train_samples: int) -> Dict[str, float]:
    """Train (resuming when asked), save the adapter (or full model), and write ``train_results.json``.

    Nothing is pushed here even with ``--push_to_hub``: :func:`finish_run` pushes once the final
    evaluation is written, so the model card carries the final metrics.
    """
    result = trainer.train(resume_from_checkpoint=_resume_checkpoint(training_args))
    trainer.save_model(_internal_call=True)
    _drop_end_of_training_checkpoint(trainer)
    metrics = dict(result.metrics)
    metrics["train_samples"] = num_train_samples
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    return metrics


def train_and_evaluate(
    trainer,
    parsed: ParsedArgs,
    evaluate: Callable[[str], Dict[str, float]],
    num_train_samples: Optional[int],
    eval_counts: Optional[Dict[str, int]] = None,
    constant_loss: Any = None,
) -> Dict[str, float]:
    """The middle of every recipe: evaluate the untrained model (``init_eval_*``, unless
    ``--eval_before_training false``), train and save, evaluate again; writes ``train_results.json`` and
    ``eval_results.json``. ``evaluate(prefix)`` returns metrics keyed ``<prefix>_*``; ``eval_counts``
    (e.g. ``{"eval_samples": 872}``) are added to the final evaluation's metrics. Training is watched for a
    collapse (:class:`~bitfit_hf.training.collapse.CollapseCallback`): ``constant_loss`` is the training loss of
    a prediction that ignores the input (the task module's ``constant_loss``; ``None``: no such level, only the
    non-finite and rising checks)."""
    training_args = parsed.training
    init_metrics: Dict[str, float] = {}
    if training_args.do_eval and training_args.do_train and parsed.bitfit.eval_before_training:
        init_metrics = evaluate_before_training(trainer, lambda: evaluate("init_eval"))
    if training_args.do_train:
        from bitfit_hf.training.collapse import CollapseCallback

        trainer.add_callback(CollapseCallback(constant_loss))
        train_and_save(trainer, training_args, num_train_samples)
    if not training_args.do_eval:
        return {}
    metrics = {**evaluate("eval"), **(eval_counts or {})}
    save_metrics(trainer, "eval", {**init_metrics, **metrics})
    return metrics


def finish_run(trainer, parsed: ParsedArgs, tasks: str, hub_default: Optional[tuple] = None) -> None:
    """The last step of every recipe, after evaluation and prediction (so the card has the final metrics):
    with ``--push_to_hub``, push the adapter and its model card; otherwise, after training, write the
    card (``README.md`` with the bias-change heat map) into ``--output_dir``. Call it on every process
    (under ZeRO-3 saving is collective). ``hub_default``: the recipe's ``load_raw_datasets`` default.
    Releases the output folder's lock (``_bitfit_run.lock``) at the end."""
    try:
        _write_card_or_push(trainer, parsed, tasks, hub_default)
    finally:
        release_output_dir()


def _write_card_or_push(trainer, parsed: ParsedArgs, tasks: str, hub_default: Optional[tuple]) -> None:
    training_args, data = parsed.training, parsed.data
    if not (training_args.push_to_hub or training_args.do_train):
        return
    local_files = data.train_file or data.validation_file or data.test_file
    if parsed.offline_data:
        from bitfit_hf.data.offline import OFFLINE_DATASETS

        spec = OFFLINE_DATASETS.get(data.dataset_name)
        card = {"dataset": spec.description if spec else data.dataset_name}
    elif data.dataset_name or (hub_default and not local_files):
        name, config = (data.dataset_name, data.dataset_config_name) if data.dataset_name else hub_default
        card = {"dataset_tags": name, "dataset_args": config, "dataset": name}
    else:
        card = {}
    card = {"tasks": tasks, "language": "en" if parsed.offline_data else None, **card}
    card = {k: v for k, v in card.items() if v is not None}
    if training_args.push_to_hub:
        trainer.push_to_hub(commit_message="End of training", **card)
    else:
        trainer.create_model_card(**card)


def save_metrics(trainer, split: str, metrics: Dict[str, float]) -> None:
    """Print and write ``<split>_results.json`` (merged into ``all_results.json``)."""
    trainer.log_metrics(split, metrics)
    trainer.save_metrics(split, metrics)


def write_trainable_summary(trainer, output_dir: str) -> None:
    """``trainable_summary.json`` for every method: an adapter's save writes it too, a full model's save does not."""
    if not trainer.is_world_process_zero():
        return
    summary = trainer.tuner_state.summary
    os.makedirs(output_dir, exist_ok=True)
    write_json_atomic(os.path.join(output_dir, SUMMARY_NAME), summary.to_dict())


def write_run_args(parsed: ParsedArgs, output_dir: str) -> None:
    """``run_args.json``: the parsed arguments, the defaults the recipe chose, the command; every
    credential (``--hub_token``, ``--token``, token-shaped text) replaced by ``<redacted>``."""
    if not parsed.training.should_save:
        return

    def fields(obj):
        return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else dict(obj)

    payload = {
        "command": redact_argv([os.path.basename(sys.argv[0])] + sys.argv[1:]),
        "model_args": fields(parsed.model),
        "data_args": fields(parsed.data),
        "bitfit_args": fields(parsed.bitfit),
        "training_args": parsed.training.to_dict(),
        "recipe_defaults": dict(parsed.applied_defaults),
        "offline_data": parsed.offline_data,
    }
    os.makedirs(output_dir, exist_ok=True)
    write_json_atomic(os.path.join(output_dir, RUN_ARGS_NAME), redact(json.loads(json.dumps(payload, default=str))))


def cli_entry(main: Callable[[], Any]) -> None:
    """Run a recipe's ``main``; bad input (any :class:`~bitfit_hf.utils.errors.UserError`: a recipe
    flag, a missing asset, a bad adapter, a Hub refusal) prints one ``error:`` line and exits with
    status 2 instead of a traceback. A run that finished destroys its process groups (under a launcher)."""
    try:
        exit_on_user_error(main, recipe_prog())
        release_process_group()
    finally:
        release_output_dir()  # the run's lock, whatever way it ended
