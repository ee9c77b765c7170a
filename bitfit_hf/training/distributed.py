"""Distributed runs: pick the device backend, and refuse launches that silently degrade.

Three things go wrong quietly when a recipe meets ``accelerate launch`` / ``torchrun`` / ``deepspeed``,
above all on machines without CUDA (see ``docs/distributed.md``):

* ``TrainingArguments(use_cpu=False)`` on a CPU-only machine: every process trains alone, exit 0.
* ``distributed_type: MULTI_CPU`` without ``mpirun``: accelerate starts ONE process, exit 0.
* ``ACCELERATE_USE_CPU=true`` (``accelerate launch --cpu``) with DeepSpeed configured: DeepSpeed is
  switched off and plain DDP (or nothing) trains instead, exit 0.
* ``evaluate()`` before ``train()`` (the recipes do it): under DDP the model comes back unwrapped and
  every rank trains alone, exit 0; under DeepSpeed training crashes (ZeRO-3) or evaluation is refused
  (ZeRO-1/2). :func:`reset_evaluation_wrapping` / :class:`zero12_evaluation_before_training` fix it, and
  :func:`check_training_wrapper` verifies at the start of training that the model is synchronised.

:func:`training_args_kwargs` chooses the backend so the same recipe runs on GPUs and on CPU processes
without extra flags; :func:`check_launch` (called by ``BitFitTrainer``) compares what the launcher asked
for with what the ``Trainer``'s accelerator actually runs, and raises :class:`LaunchError` naming the
cause. :func:`keep_bitfit_groups_in_deepspeed_optimizer` makes a DeepSpeed config that brings its own
``"optimizer"`` block train exactly BitFit's parameter groups (or refuses).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

import torch

logger = logging.getLogger("bitfit_hf")

SKIP_ENV = "BITFIT_HF_SKIP_LAUNCH_CHECKS"
EXPECTED_ENV = "BITFIT_HF_EXPECTED_WORLD_SIZE"
_MPI_SIZE_ENVS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "PMIX_SIZE")
_TRUE = ("1", "true", "yes", "on", "y", "t")


class LaunchError(RuntimeError):
    """The launch degraded silently (fewer processes, DeepSpeed off, ...); the message names the cause."""


# --------------------------------------------------------------------------------------------------
# (a) backend selection
# --------------------------------------------------------------------------------------------------
def accelerator_available() -> bool:
    """Whether torch sees a device accelerate would train on (CUDA/ROCm, MPS, XPU, NPU, HPU, MLU, MUSA)."""
    if torch.cuda.is_available():
        return True
    mps = getattr(getattr(torch, "backends", None), "mps", None)
    try:
        if mps is not None and mps.is_available():
            return True
    except Exception:  # pragma: no cover
        pass
    try:
        from transformers.utils import (
            is_torch_hpu_available,
            is_torch_mlu_available,
            is_torch_musa_available,
            is_torch_npu_available,
            is_torch_xpu_available,
        )
    except ImportError:  # pragma: no cover - very old transformers
        return False
    checks = (is_torch_xpu_available, is_torch_npu_available, is_torch_hpu_available, is_torch_mlu_available,
              is_torch_musa_available)
    for check in checks:
        try:
            if check():
                return True
        except Exception:  # pragma: no cover - broken vendor plugins
            continue
    return False


def launched_world_size() -> int:
    """Processes the launcher says it started (``WORLD_SIZE``, or the MPI equivalents), 1 if none."""
    for name in ("WORLD_SIZE",) + _MPI_SIZE_ENVS:
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def training_args_kwargs(kwargs: Optional[Mapping[str, Any]] = None, **more: Any) -> Dict[str, Any]:
    """``TrainingArguments`` keyword arguments with the device backend chosen for this machine.

    On a machine without CUDA (or another accelerator torch can drive) this sets ``use_cpu=True``
    unless the caller set ``use_cpu`` explicitly: accelerate then initialises a CPU process group
    (gloo, or oneCCL when installed) and every ``accelerate launch`` / ``torchrun`` / DeepSpeed
    launch trains as one job. Without it each process silently trains alone. With a GPU nothing
    changes. ``fp16`` (GPU only) becomes ``bf16`` on CPU, with a warning.

        args = TrainingArguments(**training_args_kwargs(output_dir="out", learning_rate=1e-3))
    """
    out = dict(kwargs or {})
    out.update(more)
    if accelerator_available():
        return out
    if "use_cpu" not in out and not out.get("no_cuda"):
        out["use_cpu"] = True
        if launched_world_size() > 1 or _env_true("ACCELERATE_USE_DEEPSPEED") or out.get("deepspeed"):
            logger.info("No CUDA device: training on CPU processes (use_cpu=True, gloo process group).")
    if out.get("fp16"):
        logger.warning("fp16 needs a GPU; training in bf16 on CPU instead.")
        out["fp16"] = False
        out["bf16"] = True
    return out


def default_use_cpu() -> bool:
    """The ``use_cpu`` default for ``TrainingArguments``: true when no CUDA-like device (or MPS) exists."""
    return not accelerator_available()


# --------------------------------------------------------------------------------------------------
# (b) launch checks
# --------------------------------------------------------------------------------------------------
@dataclass
class LauncherRequest:
    """What an ``accelerate launch`` command line (plus its config file) asked for."""

    command: str
    config_file: Optional[str]
    distributed_type: str
    num_processes: int
    num_machines: int
    machine_rank: int
    launcher: str  # "simple", "multi_gpu", "deepspeed", "fsdp", "mpirun", "other"
    use_deepspeed: bool
    use_cpu: bool
    cpu_flag: bool


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def _ancestors(max_depth: int = 6) -> List[tuple]:
    """``(pid, command line)`` of this process's ancestors, parent first (Linux ``/proc``; empty elsewhere)."""
    found: List[tuple] = []
    pid = os.getpid()
    for _ in range(max_depth):
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                stat = handle.read().decode(errors="replace")
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if ppid <= 1:
            break
        try:
            with open(f"/proc/{ppid}/cmdline", "rb") as handle:
                raw = handle.read()
        except OSError:
            break
        found.append((ppid, [part.decode(errors="replace") for part in raw.split(b"\0") if part]))
        pid = ppid
    return found


def _ancestor_cmdlines(max_depth: int = 6) -> List[List[str]]:
    """Command lines of this process's ancestors (Linux ``/proc``; empty elsewhere)."""
    return [argv for _, argv in _ancestors(max_depth)]


def _environ_of(pid: int) -> Optional[Dict[str, str]]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    pairs = (part.decode(errors="replace").partition("=") for part in raw.split(b"\0") if part)
    return {key: value for key, _, value in pairs}


def threads_pinned_by_launcher(ancestors: Optional[List[tuple]] = None,
                               environ_of=_environ_of) -> bool:
    """Whether ``accelerate launch`` set ``OMP_NUM_THREADS=1`` for this process on its own.

    Without ``--num_cpu_threads_per_process``, an ``OMP_NUM_THREADS`` of its own, or ``use_cpu`` in its
    config, ``accelerate launch`` exports ``OMP_NUM_THREADS=1`` to the script, so a single CPU-only
    process would train on one core of many. True only when this process is alone, torch runs one
    thread, and the launch command named no thread count while its environment had none.
    """
    if os.environ.get("OMP_NUM_THREADS") != "1" or torch.get_num_threads() != 1:
        return False
    if launched_world_size() > 1 or accelerator_available():
        return False
    for pid, argv in (_ancestors() if ancestors is None else ancestors):
        launch_argv = _accelerate_launch_argv(argv)
        if launch_argv is None:
            continue
        if any(arg.startswith("--num_cpu_threads_per_process") for arg in launch_argv):
            return False
        env = environ_of(pid)
        return env is not None and "OMP_NUM_THREADS" not in env
    return False


def use_available_cpu_threads() -> Optional[int]:
    """Undo ``accelerate launch``'s default of one CPU thread for a single-process CPU run (see
    :func:`threads_pinned_by_launcher`); an explicit thread count is always kept. Returns the new count."""
    if not threads_pinned_by_launcher():
        return None
    try:
        threads = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        threads = os.cpu_count() or 1
    if threads <= 1:
        return None
    torch.set_num_threads(threads)
    logger.info("accelerate launch left this single CPU process at 1 thread (OMP_NUM_THREADS=1, its default); "
                "training on the %d available cores instead. Pass --num_cpu_threads_per_process N to "
                "`accelerate launch`, or set OMP_NUM_THREADS, to choose.", threads)
    return threads


def _accelerate_launch_argv(argv: List[str]) -> Optional[List[str]]:
    """The arguments after ``launch`` when ``argv`` is an ``accelerate launch`` command, else ``None``.

    Recognises ``accelerate launch ...``, ``python /path/to/accelerate launch ...`` and
    ``python -m accelerate.commands.launch ...`` (or ``-m accelerate.commands.accelerate_cli launch``).
    """
    if not argv:
        return None
    rest = argv
    if os.path.basename(rest[0]).startswith("python"):
        rest = rest[1:]
        while rest and rest[0].startswith("-") and rest[0] != "-m":  # interpreter flags (-u, -X ..., -W ...)
            rest = rest[2:] if rest[0] in ("-X", "-W") else rest[1:]
        if rest[:1] == ["-m"] and len(rest) > 1:
            module, rest = rest[1], rest[2:]
            if module == "accelerate.commands.launch":
                return rest
            if module in ("accelerate", "accelerate.commands.accelerate_cli"):
                return rest[1:] if rest[:1] == ["launch"] else None
            return None
    if not rest:
        return None
    base = os.path.basename(rest[0])
    if base == "accelerate-launch":
        return rest[1:]
    if base == "accelerate":
        return rest[2:] if rest[1:2] == ["launch"] else None
    return None


def parse_accelerate_launch(launch_argv: List[str]) -> Optional[LauncherRequest]:
    """Resolve an ``accelerate launch`` argument list the way accelerate does (config file + flags)."""
    try:
        from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    except ImportError:  # pragma: no cover - accelerate is a dependency
        return None
    parser = launch_command_parser()
    try:
        args = parser.parse_args(launch_argv)
    except SystemExit:
        return None
    accelerate_logger = logging.getLogger("accelerate.commands.launch")
    level = accelerate_logger.level
    accelerate_logger.setLevel(logging.ERROR)
    try:
        args, defaults, _ = _validate_launch_command(args)
    except Exception:  # noqa: BLE001 - a launcher that cannot be re-validated here is not judged
        return None
    finally:
        accelerate_logger.setLevel(level)
    distributed_type = str(getattr(defaults, "distributed_type", "") or "")
    distributed_type = distributed_type.split(".")[-1] if distributed_type else ""
    cpu_flag = bool(args.cpu)
    if args.use_deepspeed and not cpu_flag:
        launcher = "deepspeed"
    elif (args.use_fsdp or getattr(args, "use_megatron_lm", False)) and not cpu_flag:
        launcher = "fsdp"
    elif args.multi_gpu and not cpu_flag:
        launcher = "multi_gpu"
    elif getattr(args, "tpu", False) and not cpu_flag:
        launcher = "other"
    elif getattr(args, "mpirun_hostfile", None):
        launcher = "mpirun"
    else:
        launcher = "simple"
    if not distributed_type:
        distributed_type = {"deepspeed": "DEEPSPEED", "multi_gpu": "MULTI_GPU", "fsdp": "FSDP"}.get(
            launcher, "MULTI_CPU" if cpu_flag and (args.num_processes or 1) > 1 else "NO"
        )
    return LauncherRequest(
        command="accelerate launch " + " ".join(launch_argv),
        config_file=args.config_file,
        distributed_type=distributed_type,
        num_processes=int(args.num_processes or 1),
        num_machines=int(args.num_machines or 1),
        machine_rank=int(getattr(args, "machine_rank", 0) or 0),
        launcher=launcher,
        use_deepspeed=bool(args.use_deepspeed),
        use_cpu=bool(getattr(args, "use_cpu", False) or cpu_flag),
        cpu_flag=cpu_flag,
    )


def find_launcher_request() -> Optional[LauncherRequest]:
    """The ``accelerate launch`` request among this process's ancestors, if any."""
    for argv in _ancestor_cmdlines():
        launch_argv = _accelerate_launch_argv(argv)
        if launch_argv is not None:
            return parse_accelerate_launch(launch_argv)
    return None


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
    if _env_true("ACCELERATE_USE_CPU") or (request is not None and request.cpu_flag):
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
    if _env_true("ACCELERATE_USE_DEEPSPEED"):
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
    if _env_true(SKIP_ENV):
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


# --------------------------------------------------------------------------------------------------
# DeepSpeed "optimizer" blocks
# --------------------------------------------------------------------------------------------------
def deepspeed_config(trainer) -> Optional[Dict[str, Any]]:
    plugin = getattr(getattr(trainer, "accelerator", None), "state", None)
    plugin = getattr(plugin, "deepspeed_plugin", None)
    if plugin is None:
        return None
    hf = getattr(plugin, "hf_ds_config", None)
    return getattr(hf, "config", None) or getattr(plugin, "deepspeed_config", None)


def _group_lrs(trainer) -> List[float]:
    groups = trainer.bitfit_parameter_groups(trainer.model)
    return sorted({float(group["lr"]) for group in groups})


def check_deepspeed_optimizer(trainer) -> None:
    """Refuse a DeepSpeed ``"scheduler"`` block when BitFit's groups need different learning rates.

    DeepSpeed's schedulers (WarmupLR, WarmupDecayLR, ...) set one learning rate on every parameter group,
    which would silently replace ``bias_learning_rate`` / ``head_learning_rate``.
    """
    config = deepspeed_config(trainer)
    if not config or getattr(trainer.bitfit_config, "is_full_finetuning", False):
        return
    if "scheduler" in config and len(_group_lrs(trainer)) > 1:
        raise LaunchError(
            f"The DeepSpeed config has a \"scheduler\" block ({config['scheduler'].get('type')}), which sets one "
            f"learning rate on every parameter group, but BitFit trains groups with different learning rates "
            f"{_group_lrs(trainer)} (bias_learning_rate / head_learning_rate). Remove the \"scheduler\" block "
            "(the Trainer's lr_scheduler_type then schedules each group), or use one learning rate."
        )


def keep_bitfit_groups_in_deepspeed_optimizer(trainer, dummy) -> Any:
    """Give DeepSpeed's own optimizer (a config ``"optimizer"`` block) BitFit's parameter groups.

    ``transformers`` hands DeepSpeed every parameter that requires grad as one group, so the config's
    ``weight_decay`` would hit every bias and ``bias_learning_rate`` / ``head_learning_rate`` would be
    lost. This replaces that list by BitFit's groups (each with its ``lr`` and ``weight_decay``), after
    checking that they hold exactly the same tensors; DeepSpeed builds the optimizer type its config
    names over them. Returns ``dummy``.
    """
    from bitfit_hf.tuners.state import unwrap

    check_deepspeed_optimizer(trainer)
    groups = [{k: v for k, v in group.items() if k != "name"} for group in trainer.bitfit_parameter_groups(unwrap(trainer.model))]
    ours = {id(p) for group in groups for p in group["params"]}
    given = dummy.params
    given_params = [p for item in given for p in (item["params"] if isinstance(item, dict) else [item])]
    theirs = {id(p) for p in given_params}
    if ours != theirs:
        names = {id(p): n for n, p in unwrap(trainer.model).named_parameters()}
        extra = sorted(names.get(i, "?") for i in theirs - ours)[:5]
        missing = sorted(names.get(i, "?") for i in ours - theirs)[:5]
        raise LaunchError(
            "The DeepSpeed config brings its own \"optimizer\" block, and the parameters DeepSpeed would train "
            f"differ from BitFit's selection (not selected: {extra}; selected but missing: {missing}). Refusing "
            "to train something else: remove the \"optimizer\" block (BitFitTrainer then builds the optimizer "
            "from TrainingArguments) or fix requires_grad."
        )
    # transformers already filled the block's "auto" lr / weight_decay from TrainingArguments (and
    # refuses explicit values that differ), so each group's own lr / weight_decay is what a
    # single-process BitFitTrainer would use.
    config = deepspeed_config(trainer) or {}
    dummy.params = groups
    if trainer.is_world_process_zero():
        logger.info(
            "DeepSpeed builds its %s optimizer over BitFit's %d parameter groups (%d tensors).",
            (config.get("optimizer") or {}).get("type", "configured"),
            len(groups),
            len(ours),
        )
    return dummy


def is_deepspeed_dummy_optimizer(optimizer) -> bool:
    return type(optimizer).__name__ == "DummyOptim" and hasattr(optimizer, "params")


# --------------------------------------------------------------------------------------------------
# evaluate() before train() under DeepSpeed
# --------------------------------------------------------------------------------------------------
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


def check_training_wrapper(trainer, model_wrapped=None) -> None:
    """At the start of training: the model really is synchronised across processes.

    With more than one process the model must be inside DistributedDataParallel (MULTI_* types) or a
    DeepSpeed engine with an optimizer; otherwise each rank would train alone. Raises :class:`LaunchError`.
    """
    if _env_true(SKIP_ENV):
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
            nxt = getattr(inner, "module", None) or getattr(inner, "_orig_mod", None)
            inner = nxt if isinstance(nxt, torch.nn.Module) and nxt is not inner else None
        if inner is None:
            raise LaunchError(
                f"Training starts under {state.describe()} but the model is not wrapped in "
                "DistributedDataParallel: every process would train alone on its shard of the data. (A model "
                "prepared by accelerate for evaluation before training is returned unwrapped; BitFitTrainer.train() "
                "resets that - if you prepared the model yourself, pass the bare model.)"
            )


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


# --------------------------------------------------------------------------------------------------
# small helpers for scripts and tests
# --------------------------------------------------------------------------------------------------
def torch_extensions_dir() -> str:
    """A stable cache for DeepSpeed's compiled C++ ops (``$TORCH_EXTENSIONS_DIR`` if set)."""
    return os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "bitfit_hf", "torch_extensions"
    )


def main(argv: Optional[List[str]] = None) -> int:  # pragma: no cover - diagnostic CLI
    """``python -m bitfit_hf.training.distributed``: print what this launch would run as."""
    request = find_launcher_request()
    print(f"accelerator available: {accelerator_available()}; launched world size: {launched_world_size()}")
    print(f"launcher request: {request}")
    print(f"training_args_kwargs() adds: {training_args_kwargs()}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
