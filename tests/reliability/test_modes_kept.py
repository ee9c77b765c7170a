"""Modules a method inserts (peft LoRA layers, AdapterBias shifts) take the mode of the model they join:
an eval model stays an eval model after ``AdapterBank.add``, ``apply_to``, ``AutoBitFitModel.from_pretrained``
or ``load_adapter``, so LoRA dropout never runs at inference (two passes give the same logits, and a bank
gives what the adapter loaded alone gives); a model in training mode gets inserted modules in training mode."""

from __future__ import annotations

import pytest
import torch
from conftest import batch, tiny_model

from bitfit_hf import AdapterBank, AutoBitFitModel, BitFitAdapter, BitFitConfig, load_adapter
from bitfit_hf.tuners import apply_method
from bitfit_hf.tuners.adapterbias import AdapterBiasConfig
from bitfit_hf.tuners.bitfit_lora import BitFitLoraConfig

try:
    from tests.support.perturbed_adapters import perturbed_method_adapter
except ImportError:  # tests/ (not the repo root) is on sys.path
    from support.perturbed_adapters import perturbed_method_adapter  # type: ignore[no-redef]

DROPOUT = 0.1

CONFIGS = {
    "bitfit_lora": lambda: BitFitLoraConfig(lora_r=4, lora_dropout=DROPOUT),
    "lora": lambda: BitFitLoraConfig(lora_r=4, lora_dropout=DROPOUT, bias_terms="frozen"),
    "adapterbias": lambda: AdapterBiasConfig(),
}


def trained_adapter(config, seed: int = 1) -> BitFitAdapter:
    """An adapter of ``config`` with every trained tensor moved (LoRA's B off zero: dropout would show)."""
    return perturbed_method_adapter(tiny_model("bert", num_labels=2), config, seed, scale=0.3)


def modes_differing(model) -> list:
    return [name for name, module in model.named_modules() if module.training != model.training]


def logits(model):
    with torch.no_grad():
        return model(**batch()).logits


@pytest.mark.parametrize("method", list(CONFIGS))
def test_a_bank_keeps_an_eval_model_in_eval_mode(method):
    adapter = trained_adapter(CONFIGS[method]())
    base = tiny_model("bert", num_labels=2)  # .eval()
    bank = AdapterBank(base)
    bank.add("task", adapter)
    bank.activate("task")
    assert not base.training and modes_differing(base) == []
    first, second = logits(base), logits(base)
    assert torch.equal(first, second)  # no dropout at inference
    alone = adapter.apply_to(tiny_model("bert", num_labels=2))
    assert modes_differing(alone) == []
    assert torch.equal(first, logits(alone))


@pytest.mark.parametrize("method", list(CONFIGS))
def test_loading_an_adapter_alone_keeps_the_mode(method, tmp_path):
    adapter = trained_adapter(CONFIGS[method]())
    adapter.save_pretrained(str(tmp_path / "adapter"))
    model = AutoBitFitModel.from_pretrained(str(tmp_path / "adapter"), base_model=tiny_model("bert", num_labels=2))
    assert model.training is False and modes_differing(model) == []
    assert torch.equal(logits(model), logits(model))
    loaded = load_adapter(tiny_model("bert", num_labels=2), str(tmp_path / "adapter"))
    assert modes_differing(loaded) == []


def test_inserted_modules_follow_a_model_in_training_mode():
    adapter = trained_adapter(CONFIGS["bitfit_lora"]())
    base = tiny_model("bert", num_labels=2).train()
    bank = AdapterBank(base)
    bank.add("task", adapter)
    assert base.training and modes_differing(base) == []
    model = tiny_model("bert", num_labels=2).train()
    apply_method(model, CONFIGS["adapterbias"]())
    assert modes_differing(model) == []


def test_a_bank_with_a_lora_task_and_a_bias_task_switches_deterministically():
    lora = trained_adapter(CONFIGS["lora"](), seed=2)
    bias = trained_adapter(BitFitConfig(), seed=3)
    base = tiny_model("bert", num_labels=2)
    bank = AdapterBank(base)
    bank.add("bias", bias)
    bank.add("lora", lora)
    expected = {"lora": logits(lora.apply_to(tiny_model("bert", num_labels=2))),
                "bias": logits(bias.apply_to(tiny_model("bert", num_labels=2)))}
    for name in ["lora", "bias", "lora"]:
        bank.activate(name)
        assert torch.equal(logits(base), expected[name]), name
    assert modes_differing(base) == []
