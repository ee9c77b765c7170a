"""The machine and versions a process runs on: recorded with every cell (where it trained) and with the report
(where it was written), since a report can be rebuilt on another machine than the one its cells ran on."""

from __future__ import annotations

import os
import platform
from typing import Any, Dict, List, Mapping, Sequence

__all__ = ["environment", "cell_environments", "describe"]


def environment() -> Dict[str, Any]:
    """Versions and machine of this process: what a reader needs to judge the timings."""
    import torch
    import transformers

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    try:
        import datasets

        info["datasets"] = datasets.__version__
    except ImportError:  # pragma: no cover
        pass
    return info


def cell_environments(records: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """The distinct environments the finished cells recorded, each with how many cells ran there (records written
    before cells carried one are not counted)."""
    found: List[Dict[str, Any]] = []
    for record in records:
        env = record.get("environment")
        if not env:
            continue
        for entry in found:
            if entry["environment"] == env:
                entry["cells"] += 1
                break
        else:
            found.append({"environment": dict(env), "cells": 1})
    return found


def describe(env: Mapping[str, Any]) -> str:
    """One line: machine, GPU, versions."""
    return (f"{env['platform']}, {env['cpu_count']} CPUs" + (f", GPU {env['cuda']}" if env.get("cuda") else "")
            + f"; python {env['python']}, torch {env['torch']}, transformers {env['transformers']}"
            + (f", datasets {env['datasets']}" if env.get("datasets") else ""))
