"""What every benchmark reports besides its numbers: the machine, versions, load and command it ran
with (so a table always names its context), and the ``--json`` / ``--markdown`` files."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from typing import List


def load_average() -> List[float]:
    """The 1/5/15-minute load averages (empty where the OS has none): shared machines drift."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def cpu_model() -> str:
    """``lscpu``'s model name, else what ``platform`` knows."""
    name = platform.processor() or platform.machine()
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name"):
                name = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return name


def machine_info() -> dict:
    """CPU, thread count, library versions, UTC date and any glibc malloc tuning in the environment."""
    import torch
    import transformers

    try:
        import peft

        peft_version = peft.__version__
    except ImportError:
        peft_version = "-"
    return {
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft_version,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
    }


def footer(info: dict) -> str:
    """The lines under every table: machine, versions, date, malloc tuning, load, and the exact command."""
    return (f"Machine: {info['cpu']} ({info['cpus']} CPUs, {info['torch_threads']} torch threads"
            f"{', GPU ' + info['gpu'] if info.get('gpu') else ''}{', CUDA ' + info['cuda'] if info.get('cuda') else ''}); Python {info['python']}, torch {info['torch']}, "
            f"transformers {info['transformers']}, peft {info['peft']}; {info['date']}; "
            f"glibc malloc settings {info.get('malloc_env') or 'default'}; load average before {info['load_before']}, "
            f"after {info['load_after']}.\nCommand: `{info['command'].strip()}`\n")


def write_outputs(json_path, markdown_path, results: dict, markdown: str) -> None:
    """Everything measured to ``--json``, the tables and footer to ``--markdown`` (either may be None)."""
    if json_path:
        with open(json_path, "w") as handle:
            json.dump(results, handle, indent=1)
    if markdown_path:
        with open(markdown_path, "w") as handle:
            handle.write(markdown)
