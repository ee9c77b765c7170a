"""Distributed runs: the public names ``docs/distributed.md`` gives users, and a diagnostic CLI.

User scripts import these from here; the code lives in one module per job:

* :mod:`bitfit_hf.training.launcher`: which launcher started this process and what it asked for.
* :mod:`bitfit_hf.training.backend`: the device backend (``use_cpu`` without CUDA), CPU threads, and the process
  groups a finished run destroys.
* :mod:`bitfit_hf.training.launch_checks`: :class:`LaunchError` for launches that exit 0 while training wrongly.
* :mod:`bitfit_hf.training.deepspeed_groups`: a DeepSpeed ``"optimizer"`` block trains the method's groups.
* :mod:`bitfit_hf.training.eval_wrapping`: ``evaluate()`` before ``train()`` leaves the model trainable.

``python -m bitfit_hf.training.distributed`` prints what the current launch resolves to.
"""

from __future__ import annotations

import sys
from typing import List, Optional

from bitfit_hf.training.backend import (
    accelerator_available,
    default_use_cpu,
    release_process_group,
    torch_extensions_dir,
    training_args_kwargs,
    use_available_cpu_threads,
)
from bitfit_hf.training.eval_wrapping import reset_evaluation_wrapping
from bitfit_hf.training.launch_checks import EXPECTED_ENV, SKIP_ENV, LaunchError, check_launch
from bitfit_hf.training.launcher import find_launcher_request, launched_world_size

__all__ = [
    "EXPECTED_ENV",
    "SKIP_ENV",
    "LaunchError",
    "check_launch",
    "default_use_cpu",
    "release_process_group",
    "reset_evaluation_wrapping",
    "torch_extensions_dir",
    "training_args_kwargs",
    "use_available_cpu_threads",
]


def main(argv: Optional[List[str]] = None) -> int:  # pragma: no cover - diagnostic CLI
    """``python -m bitfit_hf.training.distributed``: print what this launch would run as."""
    request = find_launcher_request()
    print(f"accelerator available: {accelerator_available()}; launched world size: {launched_world_size()}")
    print(f"launcher request: {request}")
    print(f"training_args_kwargs() adds: {training_args_kwargs()}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
