"""Every method is named as the user asked for it: the save log says which adapter it saved ("Saved the lora
adapter", not "the BitFit adapter" for every method), and ``bitfit-hf info`` names a ``--method lora`` adapter
lora (stored as BitFit + LoRA training no bias)."""

from __future__ import annotations

import logging

import pytest
import torch
import transformers as T
from conftest import tiny_model
from datasets import Dataset

from bitfit_hf import BitFitConfig, BitFitTrainer
from bitfit_hf.tuners import method_label
from bitfit_hf.tuners.adapterbias import AdapterBiasConfig
from bitfit_hf.tuners.bitfit_lora import BitFitLoraConfig
from bitfit_hf.tuners.random_subset import RandUniformConfig

CONFIGS = {
    "bitfit": lambda: BitFitConfig(),
    "frozen": lambda: BitFitConfig(bias_terms="frozen"),
    "lora": lambda: BitFitLoraConfig(bias_terms="frozen", lora_r=4),
    "bitfit_lora": lambda: BitFitLoraConfig(lora_r=4),
    "adapterbias": lambda: AdapterBiasConfig(),
    "rand_uniform": lambda: RandUniformConfig(),
}


def _trainer(tmp_path, config):
    args = T.TrainingArguments(str(tmp_path / "out"), report_to=[], use_cpu=True, disable_tqdm=True)
    data = Dataset.from_dict({"input_ids": [[5, 6, 7]], "attention_mask": [[1, 1, 1]], "labels": [0]})
    return BitFitTrainer(tiny_model("bert", num_labels=2), args, train_dataset=data, method_config=config)


@pytest.mark.parametrize("method", list(CONFIGS))
def test_the_save_log_names_the_method(tmp_path, caplog, method):
    trainer = _trainer(tmp_path, CONFIGS[method]())
    with caplog.at_level(logging.INFO, logger="bitfit_hf"):
        trainer.save_model(str(tmp_path / "adapter"))
    saved = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Saved the ")]
    assert len(saved) == 1 and saved[0].startswith(f"Saved the {method} adapter ("), saved


@pytest.mark.parametrize("method", list(CONFIGS))
def test_method_label_of_the_config_and_of_the_saved_adapter(tmp_path, method):
    from bitfit_hf import BitFitAdapter

    trainer = _trainer(tmp_path, CONFIGS[method]())
    assert method_label(trainer.method_config) == method
    trainer.save_model(str(tmp_path / "adapter"))
    assert method_label(BitFitAdapter.from_pretrained(str(tmp_path / "adapter")).config) == method


def test_info_names_a_lora_adapter_lora(tmp_path, capsys):
    from bitfit_hf.cli.main import main

    _trainer(tmp_path, CONFIGS["lora"]()).save_model(str(tmp_path / "lora"))
    _trainer(tmp_path, CONFIGS["bitfit_lora"]()).save_model(str(tmp_path / "both"))
    assert main(["info", str(tmp_path / "lora")]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("method"))
    assert row.split()[1] == "lora" and "no bias term" in row and "bitfit_lora" in row
    assert main(["info", str(tmp_path / "both")]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("method"))
    assert row.split()[1] == "bitfit_lora" and "bias terms all" in row
    with torch.no_grad():
        pass
