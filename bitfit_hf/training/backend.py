"""The device backend and CPU threads a process trains with, chosen so one recipe runs on GPUs and CPUs alike.

Without CUDA (or another accelerator torch drives), ``TrainingArguments`` need ``use_cpu=True`` or every
launched process trains alone; :func:`training_args_kwargs` adds it. A bare ``accelerate launch`` pins a
single CPU process to one thread; :func:`use_available_cpu_threads` undoes that default.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch

from bitfit_hf.training.launcher import (
    accelerate_launch_process,
    env_true,
    launched_world_size,
    process_environ,
)

logger = logging.getLogger("bitfit_hf")


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
        if launched_world_size() > 1 or env_true("ACCELERATE_USE_DEEPSPEED") or out.get("deepspeed"):
            logger.info("No CUDA device: training on CPU processes (use_cpu=True, gloo process group).")
    if out.get("fp16"):
        logger.warning("fp16 needs a GPU; training in bf16 on CPU instead.")
        out["fp16"] = False
        out["bf16"] = True
    return out


def default_use_cpu() -> bool:
    """The ``use_cpu`` default for ``TrainingArguments``: true when no CUDA-like device (or MPS) exists."""
    return not accelerator_available()


def threads_pinned_by_launcher(ancestors: Optional[List[Tuple[int, List[str]]]] = None,
                               environ_of=process_environ) -> bool:
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
    found = accelerate_launch_process(ancestors)
    if found is None:
        return False
    pid, launch_argv = found
    if any(arg.startswith("--num_cpu_threads_per_process") for arg in launch_argv):
        return False
    env = environ_of(pid)
    return env is not None and "OMP_NUM_THREADS" not in env


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


def torch_extensions_dir() -> str:
    """A stable cache for DeepSpeed's compiled C++ ops (``$TORCH_EXTENSIONS_DIR`` if set)."""
    return os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "bitfit_hf", "torch_extensions"
    )


def release_process_group() -> bool:
    """Destroy torch.distributed's process groups at the end of a run that finished, as PyTorch asks of every
    training process: groups left to interpreter teardown can abort a run after its work is saved
    ("terminate called without an active exception"). A no-op in a single process; returns whether a group
    was destroyed."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return False
    dist.destroy_process_group()
    return True
