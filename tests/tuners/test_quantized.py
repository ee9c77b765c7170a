"""Biases on quantized bases: float32, applied outside kernels that do not compute in float32, and a
clear refusal (naming the quantizer) where a layer cannot hold a trainable bias. The model is a tiny
LLaMA marked the way transformers marks a model a quantizer loaded."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from bitfit_hf import BitFitConfig, apply_bitfit
from bitfit_hf.tuners.bias.quantized import QuantizedBaseError
from bitfit_hf.utils.base_loading import describe_base_loading, quantization_method


def tiny_llama(dtype=torch.float32, quant="gguf"):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, pad_token_id=0)
    model = LlamaForCausalLM(config).to(dtype)
    if quant:
        mark_quantized(model, quant)
    return model


def mark_quantized(model, method):
    model.is_quantized = True
    model.quantization_method = method
    model.hf_quantizer = SimpleNamespace(is_trainable=False, is_qat_trainable=False,
                                         quantization_config=SimpleNamespace(quant_method=method))
    model.config.quantization_config = {"quant_method": method, "bits": 4}


def test_plain_model_is_not_quantized():
    model = tiny_llama(quant=None)
    assert quantization_method(model) is None and describe_base_loading(model) == {}


def test_half_precision_base_trains_float32_biases_added_outside_the_kernel():
    model = tiny_llama(torch.bfloat16, quant="fakequant")
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
    state = apply_bitfit(model, BitFitConfig("all", add_missing_biases=True))
    params = dict(model.named_parameters())
    assert {params[n].dtype for n in state.selection.bias_parameter_names} == {torch.float32}
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, before)  # zero biases: outputs unchanged
        q_proj = model.model.layers[0].self_attn.q_proj
        q_proj.bias.fill_(0.5)
        x = torch.randn(1, 16, dtype=torch.bfloat16)
        expected = nn.functional.linear(x, q_proj.weight) + torch.tensor(0.5, dtype=torch.bfloat16)
        assert torch.equal(q_proj(x), expected) and q_proj.bias.dtype == torch.float32
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert q_proj.bias.grad is not None and q_proj.bias.grad.dtype == torch.float32
    assert "bias" in dict(q_proj.named_parameters())  # hidden from the kernel only during forward


class PackedLinear(nn.Module):
    """A quantized layer in the style of GPTQ / AWQ kernels: packed integer weights, bias as a buffer."""

    def __init__(self, out_features, in_features):
        super().__init__()
        self.register_buffer("qweight", torch.zeros(out_features, in_features // 8, dtype=torch.int32))
        self.register_buffer("bias", torch.zeros(out_features))

    def forward(self, x):
        return x.new_zeros(*x.shape[:-1], self.bias.shape[0]) + self.bias


def test_bias_held_as_a_buffer_is_refused_naming_the_quantizer():
    model = tiny_llama(quant="awq")
    model.model.layers[0].self_attn.q_proj = PackedLinear(16, 16)
    with pytest.raises(QuantizedBaseError, match=r"awq-quantized model: model\.layers\.0\.self_attn\.q_proj is a .*PackedLinear, whose bias is a buffer"):
        apply_bitfit(model, BitFitConfig(["b_q"], add_missing_biases=True))


def test_added_bias_init_on_a_half_precision_quantized_base_is_drawn_in_float32():
    config = BitFitConfig(["b_q"], add_missing_biases=True, added_bias_init="normal:0.5,0.01")
    plain, quantized = tiny_llama(quant=None), tiny_llama(torch.bfloat16, quant="fakequant")
    apply_bitfit(plain, config)
    apply_bitfit(quantized, config)
    expected = plain.model.layers[0].self_attn.q_proj.bias
    found = quantized.model.layers[0].self_attn.q_proj.bias
    assert found.dtype == torch.float32 and torch.equal(found, expected)  # no bfloat16 rounding of the draw


def test_a_quantized_head_is_refused_with_the_fix():
    from transformers import LlamaForSequenceClassification

    model = LlamaForSequenceClassification(tiny_llama(quant=None).config)
    mark_quantized(model, "bitsandbytes")
    model.score.weight = nn.Parameter(torch.zeros(2, 16, dtype=torch.uint8), requires_grad=False)
    with pytest.raises(QuantizedBaseError, match=r"score\.weight was quantized by bitsandbytes.*llm_int8_skip_modules=\['score'\]"):
        apply_bitfit(model, BitFitConfig("all", add_missing_biases=True))
