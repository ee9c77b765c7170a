"""transformers.Trainer refuses a model a quantizer loaded unless an adapter is attached; BitFitTrainer
trains its biases (the adapter) with no flag, leaves every frozen tensor bit-identical, and does not
leave the model looking like a PEFT model afterwards."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from bitfit_hf import BitFitConfig, BitFitTrainer
from bitfit_hf.adapters.adapter import BitFitAdapter


def tiny_llama(quant):
    """A tiny LLaMA marked as transformers marks a model that a quantizer (here GGUF) loaded."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, pad_token_id=0)
    model = LlamaForCausalLM(config)
    model.is_quantized = True
    model.quantization_method = quant
    model.hf_quantizer = SimpleNamespace(is_trainable=False, is_qat_trainable=False,
                                         quantization_config=SimpleNamespace(quant_method=quant))
    return model


def data():
    ids = torch.randint(1, 64, (8, 6), generator=torch.Generator().manual_seed(0)).tolist()
    return [{"input_ids": row, "labels": row} for row in ids]


def args(tmp_path):
    return TrainingArguments(str(tmp_path), max_steps=3, per_device_train_batch_size=4, learning_rate=1e-2,
                             use_cpu=True, report_to=[], save_strategy="no")


def test_plain_trainer_refuses_what_bitfit_trains(tmp_path):
    model = tiny_llama(quant="gguf")
    with pytest.raises(ValueError, match="purely quantized"):
        Trainer(model=model, args=args(tmp_path), train_dataset=data())
    frozen = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = BitFitTrainer(model=model, args=args(tmp_path), train_dataset=data(),
                            method_config=BitFitConfig("all", add_missing_biases=True))
    assert not getattr(model, "_hf_peft_config_loaded", False)  # the guard's flag is not left behind
    trainer.train()
    params = dict(model.named_parameters())
    trained = set(trainer.tuner_state.selection.parameter_names)
    assert all(torch.equal(params[n], t) for n, t in frozen.items())  # no base tensor is trained here
    assert any(float(params[n].abs().max()) > 0 for n in trained)
    trainer.save_model(str(tmp_path / "adapter"))
    loading = BitFitAdapter.from_pretrained(str(tmp_path / "adapter")).config.base_loading
    assert loading["quant_method"] == "gguf"
