"""Evaluation beside training: undo what an ``evaluate()`` before ``train()`` did to the model, and keep
evaluation off compiled graphs.

The recipes evaluate before training. Under DDP the model then comes back unwrapped and every rank trains
alone (exit 0); under DeepSpeed training crashes (ZeRO-3) or evaluation is refused (ZeRO-1/2).
:func:`reset_evaluation_wrapping` and :class:`zero12_evaluation_before_training` fix both;
:func:`bitfit_hf.training.launch_checks.check_training_wrapper` verifies it when training starts.

With ``torch_compile`` on, accelerate would compile the model for an evaluation before training too. Under CUDA
graphs each batch's logits are then a graph output that the next batch's replay overwrites, while the evaluation
loop still holds them: wrong metrics, or a RuntimeError. :func:`uncompiled_evaluation` keeps evaluation and
prediction on the plain module, and :func:`copied_outputs` gives the loop outputs of its own whatever the model
returned.
"""

from __future__ import annotations

import contextlib
from typing import Any, List

import torch


def reset_evaluation_wrapping(trainer) -> List[str]:
    """Undo what an ``evaluate()`` before ``train()`` did to the model, so training wraps it properly.

    Two silent failures in transformers/accelerate, both hit by the recipes (they evaluate first):

    * DDP: the evaluation's ``accelerator.prepare_model(model, evaluation_mode=True)`` marks the bare model
      ``_is_accelerate_prepared``; ``train()`` then gets it back unwrapped - no DistributedDataParallel -
      and every rank trains alone on its shard, exit 0.
    * DeepSpeed: the evaluation wraps the model in an optimizer-less engine; ``train()`` frees it
      (``accelerator.free_memory()``) but still sees a wrapped model, never builds the training engine and
      fails at the first backward (``'NoneType' object has no attribute 'backward'``).

    Returns what was reset (for logging and tests).
    """
    done: List[str] = []
    model = trainer.model
    engine = trainer.model_wrapped
    if engine is not model and getattr(engine, "_orig_mod", None) is model:  # compiled for the evaluation only
        trainer.model_wrapped = engine = model
        done.append("compiled evaluation wrapper")
    if getattr(trainer, "is_deepspeed_enabled", False) and engine is not None and engine is not model:
        wrapped = getattr(trainer.accelerator, "deepspeed_engine_wrapped", None)
        if wrapped is None or getattr(wrapped, "engine", None) is not engine:
            destroy = getattr(engine, "destroy", None)
            if callable(destroy):  # accelerate.free_memory() only destroys the engine it tracks
                destroy()
        trainer.model_wrapped = model
        trainer.deepspeed = None
        done.append("deepspeed inference engine")
    if trainer.model_wrapped is model and getattr(model, "_is_accelerate_prepared", False):
        model._is_accelerate_prepared = False  # bare, not wrapped: let accelerate wrap it for training
        done.append("_is_accelerate_prepared")
    return done


class zero12_evaluation_before_training:  # noqa: N801 - used as a context manager
    """Let ``evaluate()`` run before ``train()`` under DeepSpeed ZeRO-1/2.

    transformers builds DeepSpeed inference engines for ZeRO-3 only ("ZeRO inference only makes sense with
    ZeRO Stage 3"), and DeepSpeed refuses a ZeRO-1/2 engine without an optimizer. Under ZeRO-1/2 every
    rank holds the whole model anyway, so before the training engine exists the evaluation runs the plain
    model on this rank's device (evaluation data sharded and gathered as usual).
    """

    def __init__(self, trainer):
        self.trainer = trainer
        self.active = False
        self.placeholder = False

    def __enter__(self):
        t = self.trainer
        if not getattr(t, "is_deepspeed_enabled", False) or t.deepspeed is not None or t.model_wrapped is not t.model:
            return self
        from bitfit_hf.utils.zero import zero3_enabled

        plugin = getattr(t.accelerator.state, "deepspeed_plugin", None)
        stage = getattr(plugin, "zero_stage", None)
        if stage is None or int(stage) >= 3 or zero3_enabled():
            return self  # ZeRO-3: transformers' inference engine works (released again by train())
        self.active = True
        t.model.to(t.args.device)
        t.deepspeed = t.model  # skip transformers' ZeRO-3-only inference deepspeed_init
        models = getattr(t.accelerator, "_models", None)
        if isinstance(models, list) and not models:
            models.append(t.model)  # ...and accelerate.prepare(model), which would build a DeepSpeed engine
            self.placeholder = True
        return self

    def __exit__(self, *exc):
        if self.active:
            t = self.trainer
            if self.placeholder:
                t.accelerator._models[:] = [m for m in t.accelerator._models if m is not t.model]
            if t.deepspeed is t.model:
                t.deepspeed = None
        return False


@contextlib.contextmanager
def uncompiled_evaluation(trainer):
    """Inside the block, accelerate prepares no compiled model (its dynamo backend reads ``NO``): an evaluation or
    prediction run before training gets the plain module, as the ones during and after training already do."""
    plugin = getattr(getattr(trainer.accelerator, "state", None), "dynamo_plugin", None)
    backend = getattr(plugin, "backend", None)
    if not trainer.args.torch_compile or backend is None:
        yield
        return
    from accelerate.utils import DynamoBackend

    plugin.backend = DynamoBackend.NO
    try:
        yield
    finally:
        plugin.backend = backend


def copied_outputs(value: Any) -> Any:
    """``value`` (a tensor, or tuples / lists / dicts of them) with every tensor copied: the evaluation loop keeps
    a batch's outputs past the next forward, which may write into the same memory (CUDA-graph outputs)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(copied_outputs(v) for v in value)
    if isinstance(value, dict):
        return type(value)({k: copied_outputs(v) for k, v in value.items()})
    return value
