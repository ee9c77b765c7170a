"""``BitFitTrainer``: a ``transformers.Trainer`` that trains only the selected biases and the head."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import re
import warnings
from typing import Any, Dict, List, Optional

import torch
from torch import nn
from transformers import Trainer

from bitfit_hf.adapters.adapter import BitFitAdapter
from bitfit_hf.adapters.base_check import check_same_base
from bitfit_hf.reporting.heatmap import BiasChange, snapshot_biases
from bitfit_hf.training.async_step import (
    FlopCounter,
    NonFiniteWindow,
    finite_or_running_mean,
    trained_parameters,
    use_non_blocking_copies,
)
from bitfit_hf.training.checkpoints import (
    CheckpointError,
    check_resume_config,
    clear_marker,
    mark_complete,
    resolve_resume_checkpoint,
)
from bitfit_hf.training.deepspeed_groups import is_deepspeed_dummy_optimizer, keep_trained_groups_in_deepspeed_optimizer
from bitfit_hf.training.eval_wrapping import (
    copied_outputs,
    reset_evaluation_wrapping,
    uncompiled_evaluation,
    zero12_evaluation_before_training,
)
from bitfit_hf.training.frozen_dtype import cast_frozen_weights, resolve_frozen_dtype
from bitfit_hf.training.launch_checks import check_trainer_launch
from bitfit_hf.training.optim import (
    compact_sparse_state,
    foreach_on_cpu,
    keep_untrained_entries,
    parameter_groups,
    without_names,
)
from bitfit_hf.training.pooling_head import apply_pooling_head, pooling_already_decided
from bitfit_hf.training.quantized_base import biases_count_as_adapter
from bitfit_hf.training.static_shapes import settle_problem_type
from bitfit_hf.tuners import apply_method, method_label, training_penalty
from bitfit_hf.tuners.errors import SelectionError
from bitfit_hf.tuners.state import adapter_parameter_names, detect_head_modules, get_tuner_state, unwrap
from bitfit_hf.utils.constants import BIAS_CHANGE_JSON, SUMMARY_NAME, WEIGHTS_NAME
from bitfit_hf.utils.io import write_json_atomic
from bitfit_hf.utils.secrets import protect_secret_fields
from bitfit_hf.utils.zero import gathered

logger = logging.getLogger("bitfit_hf")


def loss_uses_num_items(model: nn.Module) -> bool:
    """Whether ``model.forward`` really feeds ``num_items_in_batch`` to its loss.

    Trainer assumes so for any forward with ``**kwargs`` and then multiplies the loss by the world
    size; ``BertForSequenceClassification`` takes ``**kwargs`` but computes a plain mean loss, so
    distributed runs trained on a loss scaled by the number of processes. Only a forward that passes
    its kwargs to ``self.loss_function`` normalises by ``num_items_in_batch``.
    """
    explicit = getattr(model, "accepts_loss_kwargs", None)
    if explicit is not None:
        return bool(explicit)
    try:
        source = inspect.getsource(type(model).forward)
    except (OSError, TypeError):
        return False
    return re.search(r"self\.loss_function\((?:[^()]|\([^()]*\))*\*\*kwargs", source) is not None


class BitFitTrainerBase(Trainer):
    """Everything of :class:`bitfit_hf.BitFitTrainer` except Hub publishing (which the Hub layer adds
    on top): construct it exactly like ``Trainer``.

    With no ``method_config`` it trains every bias plus the task head (BitFit). ``method_config`` is any registered
    method's config (:class:`~bitfit_hf.BitFitConfig`: a preset, roles or patterns and per-group learning rates;
    ``BitFitLoraConfig``, ``AdapterBiasConfig``, ...); ``bitfit_config`` is its deprecated name. ``base_model_name_or_path`` /
    ``base_model_revision`` are recorded in the saved adapter (default: the model's ``_name_or_path``), and
    ``adapter_metadata`` in its metadata (the glue recipe's ``text_columns``, which ``bitfit-hf predict`` checks
    its inputs against). ``pooling_head`` says how a sequence classifier on a sentence-transformers checkpoint
    gets its sentence vector (:mod:`bitfit_hf.training.pooling_head`: its own pooling by default).
    ``save_model`` writes the adapter (the trained tensors) unless ``method_config.save_full_model`` is set.
    ``frozen_dtype`` (``"float32"``, ``"bfloat16"``, ``"auto"``; default: ``args.frozen_dtype`` where the
    arguments have one, as the recipes' do, else float32) stores the frozen Linear weights in bf16 under
    ``bf16=True``: see :mod:`bitfit_hf.training.frozen_dtype`. ``drop_last_train_batch`` (default:
    ``args.drop_last_train_batch`` where the arguments have one, as the recipes' do) drops the last partial
    training batch only, for compiled steps of one shape (docs/speed.md). ``probe_head_start`` (default:
    ``args.probe_head_start`` where the arguments have one, as the recipes' do, else off) fits the head to
    convergence on the frozen encoder's features before the first step (:mod:`bitfit_hf.training.probe`,
    :meth:`fit_probe_head`); ``probe_l2`` is that fit's L2 penalty. The frozen method (head only) is then
    done: ``train()`` fits the probe and takes no optimizer step.
    """

    def __init__(
        self,
        model: Optional[nn.Module] = None,
        args=None,
        *trainer_args,
        method_config: Optional[Any] = None,
        base_model_name_or_path: Optional[str] = None,
        base_model_revision: Optional[str] = None,
        adapter_metadata: Optional[Dict[str, Any]] = None,
        pooling_head: str = "checkpoint",
        frozen_dtype: Optional[Any] = None,
        drop_last_train_batch: Optional[bool] = None,
        probe_head_start: Optional[bool] = None,
        probe_l2: Optional[float] = None,
        **trainer_kwargs,
    ):
        if "bitfit_config" in trainer_kwargs:
            if method_config is not None:
                raise TypeError("BitFitTrainer got both method_config= and its deprecated name bitfit_config=.")
            warnings.warn("BitFitTrainer(bitfit_config=...) is deprecated: pass method_config= (any method's config).",
                          FutureWarning, stacklevel=2)
            method_config = trainer_kwargs.pop("bitfit_config")
        if model is None:
            raise ValueError("BitFitTrainer needs `model=`; model_init is not supported.")
        state = get_tuner_state(model)
        if state is None and not pooling_already_decided(model):  # the recipes decide when they load
            source = base_model_name_or_path or getattr(getattr(model, "config", None), "_name_or_path", None)
            apply_pooling_head(model, source, pooling_head, revision=base_model_revision)
        if state is None or (method_config is not None and method_config != state.config):
            state = apply_method(model, method_config)
        if state.selection.trainable_numel == 0:
            raise SelectionError(
                f"Nothing is trainable: the {method_label(state.config)} selection "
                f"(bias_terms={state.config.bias_terms}, train_head={state.config.train_head}) is empty. "
                "Select bias terms, or keep train_head=True on a model with a task head."
            )
        self.tuner_state = state
        self.base_model_name_or_path = base_model_name_or_path
        self.base_model_revision = base_model_revision
        self.adapter_metadata = dict(adapter_metadata or {})  # recorded in every adapter saved (text_columns, ...)
        if args is not None:  # before the Trainer builds its accelerator: batches copied without waiting
            use_non_blocking_copies(args)
        with biases_count_as_adapter(model, state.selection.trainable_numel):  # QBitFit: quantized bases
            super().__init__(model, args, *trainer_args, **trainer_kwargs)
        # The step's host work: docs/speed.md, bitfit_hf/training/async_step.py
        self._flop_counter = FlopCounter()
        self._clipped_parameters: Optional[List[nn.Parameter]] = None
        self._nonfinite_on_device = bool(self.args.logging_nan_inf_filter) and keeps_running_loss(Trainer)
        self._nonfinite_window = NonFiniteWindow()
        self._user_args: Dict[str, Any] = {}  # fields of self.args set aside for a while (_args_set): the user's values
        self._problem_type_pending = bool(self.args.torch_compile)  # settle_problem_type: once, at the first batch
        self.drop_last_train_batch = bool(drop_last_train_batch if drop_last_train_batch is not None
                                          else getattr(self.args, "drop_last_train_batch", False))
        protect_secret_fields(self.args)  # training_args.bin (full-model saves) is a pickle of the args
        self.model_accepts_loss_kwargs = loss_uses_num_items(unwrap(self.model))
        # Stop launches that exit 0 while training wrongly (ranks alone, DeepSpeed off): docs/distributed.md
        check_trainer_launch(self)
        # After the Trainer placed the model, before any optimizer exists: frozen matrices in bf16 (or left alone).
        choice = frozen_dtype if frozen_dtype is not None else getattr(self.args, "frozen_dtype", None)
        self.frozen_dtype = resolve_frozen_dtype(choice, self.args, state.config, unwrap(self.model))
        if self.frozen_dtype is not None:
            count = cast_frozen_weights(unwrap(self.model), self.frozen_dtype)
            logger.info("Frozen weights stored in %s (%d tensors); trained tensors stay float32.",
                        str(self.frozen_dtype).replace("torch.", ""), count)
        if getattr(self.args, "activation_checkpointing", None) or getattr(self.args, "gradient_checkpointing", False):
            self._prepare_gradient_checkpointing()
        self._summary_logged = False
        self.probe_head_start = bool(probe_head_start if probe_head_start is not None
                                     else getattr(self.args, "probe_head_start", False))
        self.probe_l2 = probe_l2 if probe_l2 is not None else getattr(self.args, "probe_l2", None)
        self.probe_result = None  # what the probe head start did (fit_probe_head), for the run's metrics
        # The biases before training: b0 of the bias-change heat map in the model card (docs/hub.md).
        self._base_biases = _snapshot_base_biases(model, state)

    # ---- set-up --------------------------------------------------------------------------------
    def _prepare_gradient_checkpointing(self) -> None:
        """Frozen embeddings give checkpointed blocks inputs without grad: reentrant checkpoints then
        skip every bias inside. Use non-reentrant checkpoints unless the user chose otherwise, and
        make the inputs require grad when they did."""
        # transformers 5 renamed gradient_checkpointing* to activation_checkpointing*; keep both in sync.
        names = [n for n in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs") if hasattr(self.args, n)]
        kwargs = dict(next((getattr(self.args, n) for n in names if getattr(self.args, n)), None) or {})
        if "use_reentrant" not in kwargs:
            kwargs["use_reentrant"] = False
            for name in names:
                setattr(self.args, name, kwargs)
        if kwargs["use_reentrant"] and hasattr(unwrap(self.model), "enable_input_require_grads"):
            unwrap(self.model).enable_input_require_grads()

    @property
    def method_config(self) -> Any:
        """The config of the method being trained (the state's)."""
        return self.tuner_state.config

    @property
    def bitfit_config(self) -> Any:
        """Deprecated name of :attr:`method_config`."""
        warnings.warn("BitFitTrainer.bitfit_config is deprecated: use method_config.", FutureWarning, stacklevel=2)
        return self.method_config

    @property
    def bitfit_state(self):
        """Deprecated name of :attr:`tuner_state`."""
        warnings.warn("BitFitTrainer.bitfit_state is deprecated: use tuner_state.", FutureWarning, stacklevel=2)
        return self.tuner_state

    def trained_parameter_groups(self, model: nn.Module) -> List[Dict[str, Any]]:
        """Optimizer groups of the selection (see :func:`bitfit_hf.training.optim.parameter_groups`)."""
        return parameter_groups(model, self.tuner_state, self.args.learning_rate, self.args.weight_decay,
                                self.get_decay_parameter_names(model))

    def bitfit_parameter_groups(self, model: nn.Module) -> List[Dict[str, Any]]:
        """Deprecated name of :meth:`trained_parameter_groups`."""
        warnings.warn("BitFitTrainer.bitfit_parameter_groups is deprecated: use trained_parameter_groups.",
                      FutureWarning, stacklevel=2)
        return self.trained_parameter_groups(model)

    def create_optimizer(self, model=None):
        optimizer = self._create_method_optimizer(model)
        # Methods that train some entries of a tensor; DeepSpeed steps flat copies instead (there the
        # gradient masks and zero-decay groups keep those entries).
        if not self.is_deepspeed_enabled and not is_deepspeed_dummy_optimizer(optimizer):
            keep_untrained_entries(optimizer, self.model, self.tuner_state)
            compact_sparse_state(optimizer, self.model, self.tuner_state)  # optimizer.pt: trained entries only
        return optimizer

    def _create_method_optimizer(self, model=None):
        if is_deepspeed_dummy_optimizer(self.optimizer) and not self.method_config.is_full_finetuning:
            # The DeepSpeed config has an "optimizer" block: DeepSpeed builds it, over BitFit's groups.
            return keep_trained_groups_in_deepspeed_optimizer(self, self.optimizer)
        if self.optimizer is not None or self.method_config.is_full_finetuning:
            return super().create_optimizer(model) if self.optimizer is None else self.optimizer
        opt_model = self.model if model is None else model
        if self.optimizer_cls_and_kwargs is not None:
            optimizer_cls, optimizer_kwargs = self.optimizer_cls_and_kwargs
        else:
            optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, opt_model)
        optimizer_kwargs = dict(optimizer_kwargs)
        if any(key in optimizer_kwargs for key in ("params", "model", "optimizer_dict")) or not isinstance(optimizer_cls, type):
            # GaLore / LOMO / layer-wise / factory optimizers build their own groups from requires_grad.
            return super().create_optimizer(model)
        optimizer_kwargs.pop("lr", None)  # each group carries its own
        groups = self.trained_parameter_groups(opt_model)
        if self.optimizer_cls_and_kwargs is None:  # --optim's choice: fused stays fused on a GPU
            optimizer_kwargs = foreach_on_cpu(optimizer_kwargs, groups)
        self.optimizer = optimizer_cls(without_names(groups), **optimizer_kwargs)
        return self.optimizer

    # ---- training ------------------------------------------------------------------------------
    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """``Trainer.train``; ``resume_from_checkpoint=True`` resumes from the newest *complete* checkpoint
        (one interrupted while being written is skipped; see :mod:`bitfit_hf.training.checkpoints`)."""
        resume_from_checkpoint = resolve_resume_checkpoint(resume_from_checkpoint, self.args.output_dir)
        if resume_from_checkpoint is not None:
            self.check_resume(resume_from_checkpoint)  # before anything of it is loaded
        if not self._summary_logged and self.is_world_process_zero():
            logger.info("Trainable parameters (%s):\n%s", method_label(self.method_config), self.tuner_state.summary)
            self._summary_logged = True
        reset_evaluation_wrapping(self)  # evaluate() before train() left the model unwrappable (DDP) / an inference engine
        if self.probe_head_start and resume_from_checkpoint is None and self.probe_result is None \
                and self._probe_possible():
            from bitfit_hf.training.probe import ProbeError

            try:
                self.fit_probe_head()
            except ProbeError as err:  # a head the probe cannot fit: train from the head as loaded, as without it
                logger.warning("Probe head start skipped, the head trains from its initial values: %s",
                               str(err).replace(" Run without --probe_head_start.", ""))
            else:
                if self._trains_only_the_head():  # the frozen method: the probe fitted all it trains
                    return self._probe_only_output()
        # training_step filters non-finite losses on the device: the loop's own check (a host read) is off meanwhile
        with self._args_set("logging_nan_inf_filter", False, when=self._nonfinite_on_device):
            output = super().train(resume_from_checkpoint, *args, **kwargs)
        if self.probe_result is not None:  # the probe ran before the Trainer's clock and state began
            probe = self.probe_result.as_metrics()
            output.metrics.update(probe)
            self.state.log_history.insert(0, {**probe, "step": 0})
        return output

    def _trains_only_the_head(self) -> bool:
        """Whether every trainable parameter belongs to the task head (``--method frozen``): then the fitted probe
        is the whole training. Other methods with frozen biases (LoRA, (IA)³) train tensors of their own."""
        model = unwrap(self.model)
        heads = tuple(f"{name}." for name in detect_head_modules(model))
        return all(name.startswith(heads) for name, p in model.named_parameters() if p.requires_grad)

    def _probe_possible(self) -> bool:
        """Whether the head's parameters are whole in this process: ZeRO-3 and FSDP shard them across ranks."""
        plugin = getattr(getattr(getattr(self, "accelerator", None), "state", None), "deepspeed_plugin", None)
        sharded = (self.is_deepspeed_enabled and getattr(plugin, "zero_stage", 0) == 3) or self.is_fsdp_enabled
        if sharded:
            logger.warning("Probe head start skipped: ZeRO-3 / FSDP shard the head's parameters across processes; the "
                           "head starts as loaded (run with ZeRO-1/2 or one process for the head start).")
        return not sharded

    def fit_probe_head(self, dataset=None):
        """Fit the head to convergence on the frozen encoder's features of ``dataset`` (default: the training
        set), in place, before training (:mod:`bitfit_hf.training.probe`); returns the
        :class:`~bitfit_hf.training.probe.ProbeResult`, also kept as ``probe_result``. Every process fits
        the same head: each runs the whole set (no sharding) and the fit is deterministic."""
        from torch.utils.data import DataLoader

        from bitfit_hf.training.probe import DEFAULT_L2, probe_head

        dataset = dataset if dataset is not None else self.train_dataset
        if dataset is None:
            raise ValueError("fit_probe_head needs a training dataset.")
        model = unwrap(self.model)
        keys = set(inspect.signature(model.forward).parameters) | {"label", "labels", "label_ids"}
        if hasattr(dataset, "column_names"):
            dataset = dataset.remove_columns([c for c in dataset.column_names if c not in keys])
        loader = DataLoader(dataset, batch_size=self.args.per_device_eval_batch_size, shuffle=False,
                            collate_fn=self.data_collator)
        self.probe_result = probe_head(model, loader, l2=self.probe_l2 if self.probe_l2 is not None else DEFAULT_L2,
                                       device=self.args.device)
        return self.probe_result

    def _probe_only_output(self):
        """``train()``'s result for the frozen method under the probe head start: no optimizer step was taken."""
        from transformers.trainer_utils import TrainOutput

        result = self.probe_result
        seconds = result.feature_seconds + result.fit_seconds
        metrics = {"train_runtime": round(seconds, 4), "train_loss": result.loss_after, **result.as_metrics()}
        self.state.global_step = 0
        self.state.log_history.append({**result.as_metrics(), "step": 0})
        return TrainOutput(0, result.loss_after, metrics)

    def get_train_dataloader(self):
        """``Trainer``'s; with ``drop_last_train_batch`` every training batch is full (one shape for a compiled step),
        while evaluation and prediction, which read ``dataloader_drop_last`` too, keep every example."""
        with self._args_set("dataloader_drop_last", True, when=self.drop_last_train_batch):
            return super().get_train_dataloader()

    @contextlib.contextmanager
    def _args_set(self, name: str, value: Any, when: bool = True):
        """``self.args.<name>`` is ``value`` inside the block (when ``when``), and what it was after: the Trainer
        reads one flag in several places that want it differently (training, evaluation). The user's value is
        what a checkpoint's ``training_args.bin`` records (:meth:`_user_args_restored`)."""
        before = getattr(self.args, name)
        overridden = self._user_args
        outermost = when and name not in overridden
        if when:
            if outermost:
                overridden[name] = before
            setattr(self.args, name, value)
        try:
            yield
        finally:
            setattr(self.args, name, before)
            if outermost:
                del overridden[name]

    @contextlib.contextmanager
    def _user_args_restored(self):
        """The user's values of the fields set aside (:meth:`_args_set`) back in ``self.args`` for the block: what
        ``Trainer`` pickles into ``training_args.bin`` is then the user's arguments."""
        aside = {name: getattr(self.args, name) for name in self._user_args}
        for name, value in self._user_args.items():
            setattr(self.args, name, value)
        try:
            yield
        finally:
            for name, value in aside.items():
                setattr(self.args, name, value)

    def training_step(self, model, inputs, num_items_in_batch=None):
        """``Trainer.training_step``; a non-finite loss is replaced for logging on the device (the value
        ``logging_nan_inf_filter`` would log), so the loop reads nothing back from the device."""
        loss = super().training_step(model, inputs, num_items_in_batch)
        if not (self._nonfinite_on_device or self.args.logging_nan_inf_filter):
            return loss
        finite = torch.isfinite(loss)
        self._nonfinite_window.add(finite)  # the filter hides non-finite losses: counted for log()
        if not self._nonfinite_on_device:
            return loss
        since_log = self.state.global_step - getattr(self, "_globalstep_last_logged", self.state.global_step)
        return finite_or_running_mean(loss, getattr(self, "_tr_loss", None), since_log, finite)

    def log(self, logs: Dict[str, float], start_time: Optional[float] = None) -> None:
        """``Trainer.log``; a training log whose window had only non-finite losses reports the loss as NaN (the
        filter would log its substitute, 0.0 when nothing finite came first), so a collapse shows in the loss."""
        if "loss" in logs and self._nonfinite_window.all_nonfinite():
            logs = {**logs, "loss": float("nan")}
        super().log(logs, start_time)

    def floating_point_ops(self, inputs) -> int:
        """``Trainer``'s figure (6 x tokens x non-embedding parameters), the parameters counted once."""
        return self._flop_counter(self.model, inputs)

    def _clip_grad_norm(self, model):
        """``Trainer``'s clipping over the tensors that can hold a gradient (the same norm, without walking the
        frozen ones every step); DeepSpeed and FSDP clip their own way."""
        mixed_meshes = getattr(self, "_has_mixed_mesh_grads", None)  # tensor-parallel DTensors: Trainer's own way
        if (self.is_deepspeed_enabled or self.is_fsdp_enabled or not hasattr(Trainer, "_clip_grad_norm")
                or (mixed_meshes is not None and mixed_meshes(model))):
            return super()._clip_grad_norm(model)
        if self._clipped_parameters is None:
            self._clipped_parameters = trained_parameters(model)
        return self.accelerator.clip_grad_norm_(self._clipped_parameters, self.args.max_grad_norm)

    def check_resume(self, checkpoint: str) -> None:
        """The checkpoint belongs to this run, or a clear error before anything changes: the same method and
        selection (:func:`~bitfit_hf.training.checkpoints.check_resume_config`, naming both), and an adapter
        checkpoint's trained tensors and base are this model's (another base is a ``BaseModelMismatchError``)."""
        check_resume_config(checkpoint, self.method_config)
        if not os.path.isfile(os.path.join(checkpoint, WEIGHTS_NAME)):
            return
        cfg = BitFitAdapter.from_directory(checkpoint).config
        selected = self.tuner_state.selection.parameter_names
        if cfg.trained_parameters != selected:
            missing = [n for n in cfg.trained_parameters if n not in set(selected)]
            extra = [n for n in selected if n not in set(cfg.trained_parameters)]
            raise CheckpointError(
                f"the checkpoint {os.path.basename(os.path.normpath(checkpoint))} trains other tensors than this run "
                f"selects (only in the checkpoint: {missing[:3]}; only in this run: {extra[:3]}): it was trained on "
                f"{cfg.architecture} ({cfg.base_model_name_or_path}). Resume it with the model and flags it was "
                "trained with, or start afresh."
            )
        check_same_base(cfg, self.tuner_state, unwrap(self.model))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """``Trainer``'s loss plus the method's penalty in training (Method.penalty: AdapterBias's L0 term),
        counted once per optimizer step whatever the gradient accumulation."""
        if self._problem_type_pending and model.training:  # fixed before the first compiled forward, not after it
            self._problem_type_pending = False
            settle_problem_type(unwrap(model), inputs.get("labels"))
        result = super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        penalty = training_penalty(unwrap(model), self.tuner_state) if model.training else None
        if penalty is None:
            return result
        scaled = getattr(self, "loss_is_scaled_for_ga", None)
        if scaled is None:  # Trainer divides the loss by the accumulation steps unless it is normalised already
            scaled = (self.model_accepts_loss_kwargs and num_items_in_batch is not None) or self.compute_loss_func is not None
        if scaled:
            penalty = penalty / self.current_gradient_accumulation_steps
        if return_outputs:
            loss, outputs = result
            return loss + penalty.to(loss.dtype), outputs
        return result + penalty.to(result.dtype)

    def evaluation_loop(self, *args, **kwargs):
        # DeepSpeed builds no ZeRO-1/2 inference engine; evaluation filters its losses as the user chose; and it runs
        # the uncompiled module (compiled graphs' outputs would be overwritten by the next batch).
        with zero12_evaluation_before_training(self), uncompiled_evaluation(self), self._args_set(
                "logging_nan_inf_filter", True, when=self._nonfinite_on_device):
            return super().evaluation_loop(*args, **kwargs)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """``Trainer``'s; when compiling, each batch's outputs are copied, since the loop keeps them past the next
        forward (a compiled or user-compiled model may write every batch's outputs into the same memory)."""
        loss, logits, labels = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        if self.args.torch_compile:
            loss, logits = copied_outputs(loss), copied_outputs(logits)
        return loss, logits, labels

    # ---- saving --------------------------------------------------------------------------------
    def adapter_tensors(self) -> Dict[str, torch.Tensor]:
        """The adapter's tensors, gathered under ZeRO-3 (collective: call on every rank)."""
        model = unwrap(self.model)
        params = dict(model.named_parameters())
        names = adapter_parameter_names(model, self.tuner_state)
        with gathered([params[n] for n in names]):
            return {n: params[n].detach().to("cpu", copy=True).contiguous() for n in names}

    def build_adapter(self, tensors: Optional[Dict[str, torch.Tensor]] = None) -> BitFitAdapter:
        """The adapter of the model now; a training checkpoint's keeps the training-only tensors (AdapterBias's
        L0 gates) so that a resume continues exactly, every other save holds what the method releases."""
        metadata = {**self.adapter_metadata, "training_args": _public_args(self.args)}
        if self.frozen_dtype is not None:  # how to reproduce the trained model's numbers (docs: frozen_dtype)
            metadata["frozen_dtype"] = str(self.frozen_dtype).replace("torch.", "")
        return BitFitAdapter.from_model(
            self.model,
            base_model_name_or_path=self.base_model_name_or_path,
            base_model_revision=self.base_model_revision,
            metadata=metadata,
            tensors=tensors if tensors is not None else self.adapter_tensors(),
            release=not getattr(self, "_writing_checkpoint", False),
        )

    def save_model(self, output_dir: Optional[str] = None, _internal_call: bool = False) -> None:
        if self.method_config.save_full_model or self.method_config.is_full_finetuning:
            with self._user_args_restored():
                return super().save_model(output_dir, _internal_call)
        output_dir = output_dir or self.args.output_dir
        tensors = self.adapter_tensors()
        if self.args.should_save:
            adapter = self.build_adapter(tensors)
            adapter.save_pretrained(output_dir)
            write_json_atomic(os.path.join(output_dir, SUMMARY_NAME), self.tuner_state.summary.to_dict())
            _write_bias_change(output_dir, self._base_biases, adapter)
            if self.processing_class is not None:
                self.processing_class.save_pretrained(output_dir)
            logger.info("Saved the %s adapter (%d tensors) to %s", method_label(self.method_config), len(tensors), output_dir)
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def _save_checkpoint(self, model, trial) -> None:
        """``Trainer``'s checkpoint, then ``checkpoint_complete.json`` once every process has written its
        part; old checkpoints are rotated out only after that, so a kill mid-save never leaves the
        half-written folder as the only one."""
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        run_dir = self._get_output_dir(trial=trial)
        folder = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if self.args.should_save:
            clear_marker(folder)
        limit = self.args.save_total_limit
        self._writing_checkpoint = True  # build_adapter keeps training-only tensors
        try:
            with self._args_set("save_total_limit", None):  # Trainer rotates inside; we rotate after marking
                super()._save_checkpoint(model, trial)
        finally:
            self._writing_checkpoint = False
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            mark_complete(folder, self.state.global_step)
            if hasattr(self, "_rotate_checkpoints"):  # transformers < 5
                self._rotate_checkpoints(use_mtime=False, output_dir=run_dir)
            else:
                from transformers.trainer_utils import rotate_checkpoints

                rotate_checkpoints(output_dir=run_dir, save_total_limit=limit,
                                   best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        if not os.path.isfile(os.path.join(resume_from_checkpoint, WEIGHTS_NAME)):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        BitFitAdapter.from_directory(resume_from_checkpoint).apply_to(model if model is not None else self.model)

    def _load_best_model(self):
        best = self.state.best_model_checkpoint
        if best and os.path.isfile(os.path.join(best, WEIGHTS_NAME)) and not self.is_deepspeed_enabled:
            logger.info("Loading the best BitFit adapter from %s (score: %s).", best, self.state.best_metric)
            BitFitAdapter.from_directory(best).apply_to(self.model)
            return
        return super()._load_best_model()


#: The Trainer attributes the on-device non-finite filter reads (:func:`keeps_running_loss`).
RUNNING_LOSS_NAMES = ("_tr_loss", "_globalstep_last_logged")


@functools.lru_cache(maxsize=None)
def keeps_running_loss(trainer_class) -> bool:
    """Whether this transformers keeps the running training loss and the step of the last log on the trainer
    (``self._tr_loss``, ``self._globalstep_last_logged``), both of which the on-device non-finite filter reads;
    without either (older versions keep the loss in a local variable), the Trainer keeps its own filter."""
    source = ""
    for name in ("_run_epoch", "_inner_training_loop", "_maybe_log_save_evaluate"):
        try:
            source += inspect.getsource(getattr(trainer_class, name))
        except (AttributeError, OSError, TypeError):
            continue
    return all(f"self.{name}" in source for name in RUNNING_LOSS_NAMES)


def _snapshot_base_biases(model: nn.Module, state) -> Dict[str, torch.Tensor]:
    try:
        return snapshot_biases(model, state.selection.bias_parameter_names)
    except Exception as err:  # noqa: BLE001 - the heat map is optional, training is not
        logger.info("No bias snapshot for the bias-change map (%s).", err)
        return {}


def _write_bias_change(output_dir: str, base_biases: Dict[str, torch.Tensor], adapter: BitFitAdapter) -> None:
    """``bias_change.json`` beside a saved adapter, against the biases before training."""
    if not base_biases:
        return
    try:
        BiasChange.compute(base_biases, adapter).save(os.path.join(output_dir, BIAS_CHANGE_JSON))
    except ValueError as err:  # e.g. a head-only adapter: nothing to draw
        logger.info("No bias-change map: %s", err)


def _public_args(args) -> Dict[str, Any]:
    """Training hyper-parameters worth recording in an adapter (never tokens or paths)."""
    keep = ("learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps",
            "weight_decay", "warmup_steps", "lr_scheduler_type", "seed", "optim", "max_grad_norm", "bf16", "fp16")
    return {key: getattr(args, key) if not hasattr(getattr(args, key), "value") else getattr(args, key).value
            for key in keep if hasattr(args, key)}
