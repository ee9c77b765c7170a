"""``bitfit-hf env``: versions and settings to paste into a bug report (like ``accelerate env``)."""

from __future__ import annotations

import argparse
import os
import platform
import sys
from importlib import metadata
from typing import List, Tuple

PACKAGES = ("torch", "transformers", "accelerate", "peft", "datasets", "evaluate", "huggingface-hub", "safetensors",
            "deepspeed", "bitsandbytes", "gguf", "numpy")
SETTINGS = ("HF_HUB_OFFLINE", "HF_ENDPOINT", "HF_HOME", "BITFIT_HF_CACHE", "BITFIT_HF_OFFLINE", "CUDA_VISIBLE_DEVICES",
            "OMP_NUM_THREADS", "ACCELERATE_CONFIG_FILE")


def register(verbs) -> None:
    parser = verbs.add_parser("env", help="print versions and settings for a bug report",
                              description="Versions of bitfit-hf, Python and the libraries it builds on, the machine, "
                                          "and the environment variables that change its behaviour.")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    for key, value in report():
        print(f"- {key}: {value}")
    return 0


def report() -> List[Tuple[str, str]]:
    from bitfit_hf.utils.constants import __version__

    rows = [("bitfit-hf", __version__), ("Python", sys.version.split()[0]), ("Platform", platform.platform()),
            ("CPU cores", str(os.cpu_count()))]
    for name in PACKAGES:
        try:
            rows.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            rows.append((name, "not installed"))
    rows.append(("accelerator", _accelerator()))
    rows += [(name, os.environ[name]) for name in SETTINGS if name in os.environ]
    return rows


def _accelerator() -> str:
    try:
        import torch
    except ImportError:
        return "unknown (no torch)"
    if torch.cuda.is_available():
        return f"CUDA {torch.version.cuda}: " + ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    return "none (CPU only)"
