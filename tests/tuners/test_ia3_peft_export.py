"""``export-peft`` of (IA)³ adapters: plain ``peft.PeftModel.from_pretrained`` loads the IA3 vectors (and the head,
and trained norms as saved modules) and reproduces the bitfit-hf logits; a BitFit + (IA)³ adapter with trained
Linear biases is refused with the reason, one with norm biases only exports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import peft
import pytest
import torch
import transformers as T
from conftest import batch, tiny_model
from safetensors.torch import load_file, save_file

from bitfit_hf import BitFitAdapter, export_peft, save_adapter
from bitfit_hf.adapters.peft_export import PeftExportError, peft_export_blocker
from bitfit_hf.cli.main import main as cli
from bitfit_hf.tuners import apply_method
from bitfit_hf.tuners.bitfit_ia3 import BitFitIA3Config, IA3Config

CHECK = Path(__file__).parents[1] / "adapters" / "peft_check.py"


def _trained(tmp_path, config, arch="bert"):
    """A stock tiny model saved as the base, and a copy with the method's tensors and the head perturbed."""
    base_dir = tmp_path / "base"
    tiny_model(arch, num_labels=2).save_pretrained(base_dir)
    model = T.AutoModelForSequenceClassification.from_pretrained(base_dir).eval()
    apply_method(model, config)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.3 * torch.randn(param.shape, generator=g))
        logits = model(**batch()).logits
    save_adapter(model, str(tmp_path / "adapter"))
    return base_dir, logits


def _peft_logits(base_dir, peft_dir):
    model = T.AutoModelForSequenceClassification.from_pretrained(base_dir, num_labels=2)
    model = peft.PeftModel.from_pretrained(model, str(peft_dir)).eval()
    with torch.no_grad():
        return model(**batch()).logits


@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_ia3_adapter_exports_as_peft_ia3_with_the_same_logits(arch, tmp_path):
    base_dir, expected = _trained(tmp_path, IA3Config(), arch)
    adapter = BitFitAdapter.from_directory(str(tmp_path / "adapter"))
    assert peft_export_blocker(adapter) is None
    export_peft(str(tmp_path / "adapter"), str(tmp_path / "peft"))
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["peft_type"] == "IA3" and config["task_type"] == "SEQ_CLS"
    assert config["base_model_name_or_path"] == str(base_dir)
    assert len(config["target_modules"]) == 6 and len(config["feedforward_modules"]) == 2  # k, v, FFN out x 2 layers
    stored = load_file(str(tmp_path / "peft" / "adapter_model.safetensors"))
    assert sum(".ia3_l" in n for n in stored) == 6 and any("classifier" in n for n in stored)
    assert torch.equal(_peft_logits(base_dir, tmp_path / "peft"), expected)  # the same peft layers: exact


@pytest.mark.slow  # a fresh interpreter importing torch + peft
def test_ia3_export_loads_without_bitfit_hf(tmp_path):
    base_dir, expected = _trained(tmp_path, IA3Config())
    assert cli(["export-peft", str(tmp_path / "adapter"), str(tmp_path / "peft")]) == 0
    save_file({k: v.contiguous() for k, v in batch().items()}, str(tmp_path / "inputs.safetensors"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, str(CHECK), str(base_dir), str(tmp_path / "peft"),
                           str(tmp_path / "inputs.safetensors"), str(tmp_path / "out.safetensors")],
                          capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert torch.equal(load_file(str(tmp_path / "out.safetensors"))["logits"], expected)


def test_bitfit_ia3_with_linear_biases_is_refused_with_the_reason(tmp_path):
    _trained(tmp_path, BitFitIA3Config())
    adapter = BitFitAdapter.from_directory(str(tmp_path / "adapter"))
    reason = peft_export_blocker(adapter)
    assert reason and "one tuner type" in reason and "bias" in reason
    with pytest.raises(PeftExportError, match=r"trained bias '.*\.bias' of a Linear .*one tuner type.*whole weight matrix"):
        export_peft(adapter, str(tmp_path / "peft"))
    assert not (tmp_path / "peft").exists()


def test_bitfit_ia3_with_norm_biases_only_exports_them_as_saved_modules(tmp_path):
    base_dir, expected = _trained(tmp_path, BitFitIA3Config(bias_terms=["b_LN2"]))
    adapter = BitFitAdapter.from_directory(str(tmp_path / "adapter"))
    assert peft_export_blocker(adapter) is None
    export_peft(adapter, str(tmp_path / "peft"))
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert {f"bert.encoder.layer.{i}.output.LayerNorm" for i in range(2)} <= set(config["modules_to_save"])
    assert torch.equal(_peft_logits(base_dir, tmp_path / "peft"), expected)
