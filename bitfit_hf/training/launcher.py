"""Which launcher started this process, and what it asked for.

The environment says most of it: torchrun, accelerate's torchrun-based launchers and DeepSpeed export
``WORLD_SIZE`` (MPI its own size variables), and every ``accelerate launch`` exports ``ACCELERATE_*``
variables (mixed precision, use_cpu, dynamo, DeepSpeed settings). accelerate's one-process "simple" launcher
exports neither the process count nor the config file it was given, so the request behind a launch that
started fewer processes than asked is read from the ``accelerate launch`` command line among this
process's ancestors (Linux ``/proc``), and only when the environment shows that accelerate started us.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

MPI_SIZE_ENVS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "PMIX_SIZE")
_TRUE = ("1", "true", "yes", "on", "y", "t")
# accelerate's DistributedType values its launcher turns into `--multi_gpu`
_MULTI_DEVICE_TYPES = ("MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU", "MULTI_HPU",
                       "MULTI_NEURON")
_LAUNCHER_FLAGS = ("multi_gpu", "tpu", "tpu_use_cluster", "use_deepspeed", "use_fsdp", "use_megatron_lm")


def env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def launched_world_size() -> int:
    """Processes the launcher says it started (``WORLD_SIZE``, or the MPI equivalents), 1 if none."""
    for name in ("WORLD_SIZE",) + MPI_SIZE_ENVS:
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def launched_by_accelerate() -> bool:
    """Whether an ``accelerate launch`` may have started this process: all its launchers export ``ACCELERATE_*``."""
    return any(name.startswith("ACCELERATE_") for name in os.environ)


# Kept: the simple launcher's process count, config file and thread flag reach the script only on its command line.
def ancestor_processes(max_depth: int = 6) -> List[Tuple[int, List[str]]]:
    """``(pid, command line)`` of this process's ancestors, parent first (Linux ``/proc``; empty elsewhere)."""
    found: List[Tuple[int, List[str]]] = []
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


# Kept: only the launcher's own environment tells accelerate's OMP_NUM_THREADS=1 default from the user's choice.
def process_environ(pid: int) -> Optional[Dict[str, str]]:
    """The environment process ``pid`` started with (Linux ``/proc``), ``None`` when it cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    pairs = (part.decode(errors="replace").partition("=") for part in raw.split(b"\0") if part)
    return {key: value for key, _, value in pairs}


def accelerate_launch_argv(argv: List[str]) -> Optional[List[str]]:
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


def accelerate_launch_process(
    ancestors: Optional[List[Tuple[int, List[str]]]] = None,
) -> Optional[Tuple[int, List[str]]]:
    """``(pid, arguments after launch)`` of the nearest ``accelerate launch`` ancestor, if accelerate started us."""
    if ancestors is None:
        if not launched_by_accelerate():
            return None
        ancestors = ancestor_processes()
    for pid, argv in ancestors:
        launch_argv = accelerate_launch_argv(argv)
        if launch_argv is not None:
            return pid, launch_argv
    return None


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


def _enum_name(value) -> str:
    text = str(value or "")
    return text.split(".")[-1] if text else ""


def _device_count() -> int:
    import torch

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "device_count"):
        return int(accelerator.device_count())
    return torch.cuda.device_count()  # pragma: no cover - torch < 2.6


def resolve_launch_args(args) -> str:
    """Fill parsed ``accelerate launch`` arguments from its config file the way ``accelerate launch`` does.

    Mirrors the parts of accelerate's launch validation that pick the launcher and the process count,
    through its public config loader. Returns the config's ``distributed_type`` ("" without a config).
    """
    from accelerate.commands.config import default_config_file, load_config_from_file

    if args.config_file is None and (args.cpu or not os.path.isfile(default_config_file)):
        if args.num_processes is None:
            args.num_processes = _device_count()
        if not args.multi_gpu and args.num_processes > 1 and _device_count() > 1:
            args.multi_gpu = True
        if args.num_machines is None:
            args.num_machines = 1
        if not hasattr(args, "use_cpu"):
            args.use_cpu = args.cpu
        return ""
    defaults = load_config_from_file(args.config_file)
    distributed_type = _enum_name(getattr(defaults, "distributed_type", ""))
    if not any(getattr(args, flag, False) for flag in _LAUNCHER_FLAGS):
        args.use_deepspeed = distributed_type == "DEEPSPEED"
        args.multi_gpu = distributed_type in _MULTI_DEVICE_TYPES
        args.tpu = distributed_type == "XLA"
        args.use_fsdp = distributed_type == "FSDP"
        args.use_megatron_lm = distributed_type == "MEGATRON_LM"
    if args.multi_gpu and args.num_machines is None:
        args.num_machines = defaults.num_machines
    if _enum_name(defaults.compute_environment) == "LOCAL_MACHINE":
        given = getattr(args, "nondefault", None)  # the flags named on the command line
        for name, value in vars(defaults).items():
            if isinstance(value, dict):  # e.g. mpirun_config -> args.mpirun_hostfile
                for key, item in value.items():
                    if given is not None and key not in given:
                        setattr(args, key, item)
            elif name not in ("compute_environment", "mixed_precision", "distributed_type") and getattr(args, name, None) is None:
                setattr(args, name, value)
    return distributed_type


def launcher_request(launch_argv: List[str], args, distributed_type: str) -> LauncherRequest:
    """The :class:`LauncherRequest` of resolved ``accelerate launch`` arguments."""
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


def parse_accelerate_launch(launch_argv: List[str]) -> Optional[LauncherRequest]:
    """Resolve an ``accelerate launch`` argument list the way accelerate does (config file + flags)."""
    try:
        from accelerate.commands.launch import launch_command_parser
    except ImportError:  # pragma: no cover - accelerate is a dependency
        return None
    try:
        args = launch_command_parser().parse_args(launch_argv)
    except SystemExit:
        return None
    try:
        distributed_type = resolve_launch_args(args)
    except Exception:  # noqa: BLE001 - a launch whose config cannot be read here is not judged
        return None
    return launcher_request(launch_argv, args, distributed_type)


def find_launcher_request() -> Optional[LauncherRequest]:
    """The ``accelerate launch`` request that started this process, if any."""
    found = accelerate_launch_process()
    return parse_accelerate_launch(found[1]) if found is not None else None
