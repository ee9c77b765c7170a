"""Helpers for the reliability tests (imported by basename: pytest puts this folder on sys.path):
a tiny real adapter on disk, and a runner for code that must die in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict

import torch

REPO = Path(__file__).resolve().parents[2]
SECRET = "hf_" + "Qx7Ls9Kd2Vb4Nm8Pz3Rt6Wy1"  # token-shaped, never a real one


def tiny_bert(num_labels: int = 2, seed: int = 0):
    import transformers as T

    torch.manual_seed(seed)
    config = T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                          vocab_size=100, num_labels=num_labels)
    return T.BertForSequenceClassification(config).eval()


def make_adapter(root: Path, num_labels: int = 2, seed: int = 0, **save_kwargs):
    """A stock tiny BERT saved as ``root/base`` and a BitFit adapter of it (biases moved off their
    initial values, so a load that silently kept the base's would show) saved as ``root/adapter``.
    Returns ``(base_dir, adapter_dir, adapter_tensors)``."""
    from bitfit_hf import BitFitAdapter, apply_bitfit, save_adapter

    base_dir, adapter_dir = root / "base", root / "adapter"
    model = tiny_bert(num_labels, seed)
    model.save_pretrained(base_dir)
    apply_bitfit(model)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.25)
    save_adapter(model, str(adapter_dir), base_model_name_or_path=str(base_dir), **save_kwargs)
    return base_dir, adapter_dir, BitFitAdapter.from_pretrained(str(adapter_dir)).tensors


def same_tensors(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def python_env(**extra: str) -> dict:
    env = dict(os.environ)
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
               OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def run_python(code: str, timeout: float = 300, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=python_env(**env), capture_output=True,
                          text=True, timeout=timeout)


def files_holding(root: Path, needle: str):
    """Every file under ``root`` whose bytes contain ``needle``."""
    found = []
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            try:
                if needle.encode() in path.read_bytes():
                    found.append(str(path))
            except OSError:
                pass
    return found
