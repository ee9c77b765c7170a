"""Refuse launches that exit 0 while training wrongly, naming the cause (see ``docs/distributed.md``).

Four such launches, all common on machines without CUDA:

* ``TrainingArguments(use_cpu=False)`` on a CPU-only machine: every process trains alone.
* ``distributed_type: MULTI_CPU`` without ``mpirun``: accelerate starts ONE process.
* ``ACCELERATE_USE_CPU=true`` (``accelerate launch --cpu``) with DeepSpeed configured: DeepSpeed is switched
  off and plain DDP (or nothing) trains instead.
* a model that is not synchronised when training starts (e.g. prepared by an ``evaluate()`` before
  ``train()``): every rank trains alone.

:func:`check_launch` compares what the launcher asked for (:mod:`bitfit_hf.training.launcher`) with what the
``Trainer``'s accelerator runs; :func:`check_trainer_launch` (called by ``BitFitTrainer``) adds the DeepSpeed
``"scheduler"`` check and :func:`check_training_wrapper` at the start of every ``train()``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch

from bitfit_hf.training.backend import accelerator_available
from bitfit_hf.training.launcher import LauncherRequest, env_true, find_launcher_request, launched_world_size

logger = logging.getLogger("bitfit_hf")

SKIP_ENV = "BITFIT_HF_SKIP_LAUNCH_CHECKS"
EXPECTED_ENV = "BITFIT_HF_EXPECTED_WORLD_SIZE"


class LaunchError(RuntimeError):
    """The launch degraded silently (fewer processes, DeepSpeed off, ...); the message names the cause."""


@dataclass
class LaunchState:
    """What the ``Trainer``'s accelerator actually runs."""

    num_processes: int
    distributed_type: str
    deepspeed_active: bool
    zero_stage: Optional[int]
    process_group_size: int
    backend: Optional[str]

    def describe(self) -> str:
        text = f"{self.num_processes} process(es), {self.distributed_type}"
        if self.backend:
            text += f" ({self.backend})"
        if self.deepspeed_active:
            text += f", DeepSpeed ZeRO-{self.zero_stage}"
        return text


def launch_state(accelerator) -> LaunchState:
    import torch.distributed as dist

    state = accelerator.state
    plugin = getattr(state, "deepspeed_plugin", None)
    distributed_type = str(getattr(state, "distributed_type", "NO")).split(".")[-1]
    group = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    stage = getattr(plugin, "zero_stage", None) if plugin is not None else None
    return LaunchState(
        num_processes=int(getattr(state, "num_processes", 1) or 1),
        distributed_type=distributed_type,
        deepspeed_active=plugin is not None and distributed_type == "DEEPSPEED",
        zero_stage=int(stage) if stage is not None else None,
        process_group_size=group,
        backend=getattr(state, "backend", None),
    )


_CPU_FIX = (
    "On a machine without CUDA, TrainingArguments need use_cpu=True: build them with "
    "TrainingArguments(**bitfit_hf.training.distributed.training_args_kwargs(...)) (the bitfit-hf recipes do), or "
    "pass use_cpu=True."
)


def _problems(
    actual: LaunchState,
    request: Optional[LauncherRequest],
    args=None,
    deepspeed_requested: Optional[str] = None,
) -> List[str]:
    """What is wrong with this launch: the three ways a run exits 0 while training wrongly."""
    use_cpu = bool(getattr(args, "use_cpu", False)) if args is not None else None
    no_gpu_but_cuda_asked = not accelerator_available() and use_cpu is False
    problems = _group_problems(actual, no_gpu_but_cuda_asked)
    if not problems:
        problems += _missing_process_problems(actual, request, no_gpu_but_cuda_asked)
    problems += _deepspeed_problems(actual, request, deepspeed_requested)
    return problems


def _group_problems(actual: LaunchState, no_gpu_but_cuda_asked: bool) -> List[str]:
    """Processes that were started but do not form the Trainer's process group."""
    started = launched_world_size()
    if started > actual.num_processes or actual.process_group_size > actual.num_processes:
        got = max(started, actual.process_group_size)
        cause = (
            f"TrainingArguments(use_cpu=False) on a machine without CUDA: accelerate set up no process group "
            f"for the CPU processes. {_CPU_FIX}"
            if no_gpu_but_cuda_asked
            else "the process group was initialised outside accelerate's state (check ACCELERATE_* variables "
            "and the TrainingArguments device settings)."
        )
        return [
            f"The launcher started {got} processes (WORLD_SIZE={got}) but the Trainer runs {actual.describe()}: "
            f"every process would train alone on its own copy. Cause: {cause}"
        ]
    if actual.num_processes > 1 and actual.distributed_type == "NO":
        return [
            f"{actual.num_processes} processes share a process group but accelerate's distributed_type is NO: "
            "gradients would never be synchronised. Cause: ddp_backend was set without use_cpu on a machine "
            f"without CUDA. {_CPU_FIX}"
        ]
    return []


def _missing_process_problems(actual: LaunchState, request: Optional[LauncherRequest], no_gpu_but_cuda_asked: bool) -> List[str]:
    """Fewer processes than the launch asked for (``BITFIT_HF_EXPECTED_WORLD_SIZE`` or the launcher's request)."""
    explicit = os.environ.get(EXPECTED_ENV, "").strip()
    if explicit.isdigit():
        expected, source = int(explicit), f"{EXPECTED_ENV}={explicit}"
    elif request is not None:
        expected = request.num_processes
        where = f" (config {request.config_file})" if request.config_file else ""
        source = (
            f"`{request.command}`{where}: distributed_type {request.distributed_type}, "
            f"num_processes {request.num_processes}, num_machines {request.num_machines}"
        )
    else:
        return []
    if actual.num_processes >= expected:
        return []
    return [
        f"The launch asked for {expected} processes ({source}) but the Trainer runs {actual.describe()}. "
        f"Cause: {_why_processes_are_missing(request, no_gpu_but_cuda_asked)}"
    ]


def _why_processes_are_missing(request: Optional[LauncherRequest], no_gpu_but_cuda_asked: bool) -> str:
    if request is not None and request.launcher == "simple" and request.num_processes > 1:
        if request.distributed_type == "MULTI_CPU" or request.cpu_flag:
            return (
                "accelerate's MULTI_CPU / --cpu launcher starts one process per machine unless it is given "
                "mpirun and a hostfile (mpirun_hostfile); without MPI each process trains alone. For CPU "
                "processes on one or more machines use distributed_type MULTI_GPU with use_cpu: true "
                "(accelerate_configs/cpu_ddp.yaml, cpu_two_node_ddp.yaml) or DEEPSPEED "
                "(cpu_deepspeed_zero2.yaml, cpu_deepspeed_zero3.yaml, cpu_two_node_deepspeed.yaml)."
            )
        return "this accelerate configuration runs the simple one-process launcher."
    if request is not None and request.num_machines > 1:
        return (
            f"a {request.num_machines}-machine launch where the processes did not join one group; check that "
            "every machine uses the same main_process_ip/main_process_port, its own machine_rank, and a "
            "distributed_type of MULTI_GPU or DEEPSPEED (not MULTI_CPU)."
        )
    if no_gpu_but_cuda_asked:
        return _CPU_FIX
    return "fewer processes joined the process group than were requested."


def _deepspeed_problems(actual: LaunchState, request: Optional[LauncherRequest], deepspeed_requested: Optional[str]) -> List[str]:
    """DeepSpeed asked for, but the Trainer runs without it."""
    ds_source = deepspeed_requested
    if ds_source is None and request is not None and request.use_deepspeed:
        ds_source = f"`{request.command}` (distributed_type DEEPSPEED)"
    if not ds_source or actual.deepspeed_active:
        return []
    if env_true("ACCELERATE_USE_CPU") or (request is not None and request.cpu_flag):
        cause = (
            "ACCELERATE_USE_CPU=true (`accelerate launch --cpu`, or the variable exported in the shell) "
            "switches DeepSpeed off in accelerate. Remove it: on a machine without CUDA, bitfit-hf's "
            "training_args_kwargs() already selects the CPU backend, and DeepSpeed runs on CPU processes."
        )
    else:
        cause = ("accelerate's state was created without the DeepSpeed plugin (an Accelerator/PartialState made "
                 "before TrainingArguments, or use_configured_state).")
    return [
        f"DeepSpeed was requested by {ds_source} but the Trainer runs {actual.describe()} without DeepSpeed. "
        f"Cause: {cause}"
    ]


def _deepspeed_requested(args=None) -> Optional[str]:
    if args is not None and getattr(args, "deepspeed", None):
        return f"TrainingArguments(deepspeed={args.deepspeed!r})" if isinstance(args.deepspeed, str) else \
            "TrainingArguments(deepspeed=<dict>)"
    if env_true("ACCELERATE_USE_DEEPSPEED"):
        return "ACCELERATE_USE_DEEPSPEED=true (an accelerate DeepSpeed config)"
    if os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE"):
        return f"ACCELERATE_DEEPSPEED_CONFIG_FILE={os.environ['ACCELERATE_DEEPSPEED_CONFIG_FILE']}"
    return None


def check_launch(accelerator, args=None, raise_error: bool = True) -> List[str]:
    """Compare what the launch asked for with what ``accelerator`` runs; raise :class:`LaunchError`.

    Checks: the launcher's process count (``WORLD_SIZE``, the ``accelerate launch`` command line and its
    config file among this process's ancestors, or ``$BITFIT_HF_EXPECTED_WORLD_SIZE``) against
    ``accelerator.num_processes``; a multi-process group that accelerate does not synchronise; DeepSpeed
    requested (``TrainingArguments.deepspeed``, an accelerate DeepSpeed config) but inactive. Set
    ``BITFIT_HF_SKIP_LAUNCH_CHECKS=1`` to skip. Returns the problems found (empty when all is well).
    """
    if env_true(SKIP_ENV):
        return []
    actual = launch_state(accelerator)
    request = find_launcher_request()
    problems = _problems(actual, request, args, _deepspeed_requested(args))
    if problems and raise_error:
        raise LaunchError(
            "bitfit-hf stopped a launch that would train wrongly:\n- "
            + "\n- ".join(problems)
            + f"\n(Set {SKIP_ENV}=1 to skip these checks.)"
        )
    return problems


def check_training_wrapper(trainer, model_wrapped=None) -> None:
    """At the start of training: the model really is synchronised across processes.

    With more than one process the model must be inside DistributedDataParallel (MULTI_* types) or a
    DeepSpeed engine with an optimizer; otherwise each rank would train alone. Raises :class:`LaunchError`.
    """
    if env_true(SKIP_ENV):
        return
    state = launch_state(trainer.accelerator)
    if state.num_processes <= 1:
        return
    wrapped = trainer.model_wrapped if model_wrapped is None else model_wrapped
    if state.deepspeed_active:
        engine = getattr(trainer.accelerator, "deepspeed_engine_wrapped", None)
        if engine is None or getattr(engine.engine, "optimizer", None) is None:
            raise LaunchError(
                f"Training starts under {state.describe()} without a DeepSpeed training engine (the model was "
                "wrapped for inference, e.g. by an evaluate() before train()): gradients would not be reduced."
            )
        return
    if state.distributed_type.startswith("MULTI_"):
        from torch.nn.parallel import DistributedDataParallel

        inner = wrapped
        while inner is not None and not isinstance(inner, DistributedDataParallel):
            # a compiled wrapper first: it forwards ``.module`` to what it wraps, which would skip a DDP inside it
            nxt = getattr(inner, "_orig_mod", None) or getattr(inner, "module", None)
            inner = nxt if isinstance(nxt, torch.nn.Module) and nxt is not inner else None
        if inner is None:
            raise LaunchError(
                f"Training starts under {state.describe()} but the model is not wrapped in "
                "DistributedDataParallel: every process would train alone on its shard of the data. (A model "
                "prepared by accelerate for evaluation before training is returned unwrapped; BitFitTrainer.train() "
                "resets that - if you prepared the model yourself, pass the bare model.)"
            )


def deepspeed_config(trainer) -> Optional[Dict[str, Any]]:
    """The DeepSpeed config the Trainer's accelerator runs with, ``None`` without DeepSpeed."""
    plugin = getattr(getattr(trainer, "accelerator", None), "state", None)
    plugin = getattr(plugin, "deepspeed_plugin", None)
    if plugin is None:
        return None
    hf = getattr(plugin, "hf_ds_config", None)
    return getattr(hf, "config", None) or getattr(plugin, "deepspeed_config", None)


def _group_lrs(trainer) -> List[float]:
    groups = trainer.trained_parameter_groups(trainer.model)
    return sorted({float(group["lr"]) for group in groups})


def check_deepspeed_optimizer(trainer) -> None:
    """Refuse a DeepSpeed ``"scheduler"`` block when BitFit's groups need different learning rates.

    DeepSpeed's schedulers (WarmupLR, WarmupDecayLR, ...) set one learning rate on every parameter group,
    which would silently replace ``bias_learning_rate`` / ``head_learning_rate``.
    """
    config = deepspeed_config(trainer)
    if not config or getattr(trainer.method_config, "is_full_finetuning", False):
        return
    if "scheduler" in config and len(_group_lrs(trainer)) > 1:
        raise LaunchError(
            f"The DeepSpeed config has a \"scheduler\" block ({config['scheduler'].get('type')}), which sets one "
            f"learning rate on every parameter group, but BitFit trains groups with different learning rates "
            f"{_group_lrs(trainer)} (bias_learning_rate / head_learning_rate). Remove the \"scheduler\" block "
            "(the Trainer's lr_scheduler_type then schedules each group), or use one learning rate."
        )


def check_trainer_launch(trainer) -> LaunchState:
    """:func:`check_launch` for a ``Trainer``, plus the DeepSpeed optimizer check, plus a callback that checks
    at the start of every ``train()`` that the model really is wrapped for synchronised training
    (:func:`check_training_wrapper`); logs the launch once."""
    check_launch(trainer.accelerator, trainer.args)
    check_deepspeed_optimizer(trainer)
    if not any(isinstance(cb, _SyncGuard) for cb in trainer.callback_handler.callbacks):
        trainer.add_callback(_SyncGuard(trainer))
    actual = launch_state(trainer.accelerator)
    if actual.num_processes > 1 and trainer.is_world_process_zero():
        logger.info("BitFit launch: %s.", actual.describe())
    return actual


def _sync_guard_base():
    from transformers import TrainerCallback

    return TrainerCallback


class _SyncGuard(_sync_guard_base()):
    """Runs :func:`check_training_wrapper` when training begins (after the model was wrapped)."""

    def __init__(self, trainer):
        self._trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        check_training_wrapper(self._trainer)
