"""The same base loaded another way (quantized vs full precision) is recognised from the adapter's
sketch; another base, or a loading that cannot be compared, is refused with the reason."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from bitfit_hf import BitFitConfig, BitFitLoraConfig, apply_bitfit
from bitfit_hf.adapters.adapter import BitFitAdapter
from bitfit_hf.adapters.config import AdapterConfig, BaseModelMismatchError
from bitfit_hf.tuners import apply_method


def llama(seed):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1)
    return LlamaForCausalLM(config)


def quantized_copy(model, relative_noise=0.1):
    """``model`` as a 4-bit loading would see it: every matrix off by ~10% of its norm, marked quantized."""
    copy = llama(0)
    copy.load_state_dict(model.state_dict())
    with torch.no_grad():
        for param in copy.parameters():
            if param.dim() >= 2:
                param.add_(torch.randn_like(param) * param.std() * relative_noise)
    copy.is_quantized = True
    copy.quantization_method = "bitsandbytes"
    copy.config.quantization_config = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    return copy


@pytest.fixture(scope="module")
def adapter_from_4bit():
    base = llama(0)
    quantized = quantized_copy(base)
    apply_bitfit(quantized, BitFitConfig("all", add_missing_biases=True))
    with torch.no_grad():
        quantized.model.layers[0].self_attn.q_proj.bias.fill_(0.25)
    return base, BitFitAdapter.from_model(quantized, base_model_name_or_path="org/base")


def test_adapter_records_the_loading_and_a_sketch(adapter_from_4bit):
    _, adapter = adapter_from_4bit
    assert adapter.config.base_loading["quant_method"] == "bitsandbytes"
    assert adapter.config.base_loading["quantization_config"]["load_in_4bit"] is True
    assert len(adapter.config.base_sketch["samples"]) == 16


def test_full_precision_base_is_recognised(adapter_from_4bit):
    base, adapter = adapter_from_4bit
    model = llama(0)
    adapter.apply_to(model)
    assert torch.equal(model.model.layers[0].self_attn.q_proj.bias, torch.full((32,), 0.25))


def test_another_base_is_refused_with_the_difference(adapter_from_4bit):
    _, adapter = adapter_from_4bit
    with pytest.raises(BaseModelMismatchError, match=r"loaded as bitsandbytes \(load_in_4bit\).*full precision.*"
                                                     r"sampled weights differ by \d+% of their norm"):
        adapter.apply_to(llama(1))


def test_same_loading_different_weights_is_a_plain_mismatch(adapter_from_4bit):
    _, adapter = adapter_from_4bit
    with pytest.raises(BaseModelMismatchError, match="its frozen weights differ"):
        adapter.apply_to(quantized_copy(llama(1)))


def test_without_a_sketch_it_says_why_it_cannot_compare(adapter_from_4bit):
    _, adapter = adapter_from_4bit
    old = BitFitAdapter(AdapterConfig.from_dict({**adapter.config.to_dict(), "base_sketch": {}}), adapter.tensors)
    with pytest.raises(BaseModelMismatchError, match="records no sketch"):
        old.apply_to(llama(0))


def test_bitfit_lora_adapter_recognises_its_base_loaded_another_way():
    """LoRA wraps the base's modules after the sketch is taken: the check compares the stock base, so the
    same base loaded in full precision is accepted and another base is refused by its weights."""
    quantized = quantized_copy(llama(0))
    apply_method(quantized, BitFitLoraConfig("all", add_missing_biases=True, lora_r=2))
    with torch.no_grad():
        quantized.model.layers[0].self_attn.q_proj.lora_B["default"].weight.fill_(0.5)
    adapter = BitFitAdapter.from_model(quantized, base_model_name_or_path="org/base")
    assert adapter.config.base_sketch["samples"]
    model = adapter.apply_to(llama(0))
    assert torch.equal(model.model.layers[0].self_attn.q_proj.lora_B["default"].weight, torch.full((32, 2), 0.5))
    with pytest.raises(BaseModelMismatchError, match=r"sampled weights differ by \d+% of their norm"):
        adapter.apply_to(llama(1))
