"""Added biases start at zero and leave the model's outputs bit-identical; they then train."""

from __future__ import annotations

import pytest
import torch
from conftest import BIASLESS_ARCHS, batch, tiny_model

from bitfit_hf import BitFitConfig, apply_bitfit
from bitfit_hf.tuners.bias.layer import HOOK, NATIVE, add_zero_bias


def _logits(model, inputs):
    with torch.no_grad():
        if model.config.model_type == "t5":  # T5's classification head pools at the EOS token
            ids = inputs["input_ids"].clone()
            ids[:, -1] = model.config.eos_token_id
            return model(input_ids=ids, attention_mask=inputs["attention_mask"]).logits
        return model(**inputs).logits


@pytest.mark.parametrize("arch", BIASLESS_ARCHS)
def test_added_biases_leave_outputs_bit_identical(arch):
    model = tiny_model(arch)
    inputs = batch()
    before = _logits(model, inputs)
    state = apply_bitfit(model, BitFitConfig("all", add_missing_biases=True))
    assert state.added_biases
    kinds = set(state.added_biases.values())
    assert NATIVE in kinds and HOOK in kinds  # Linear projections natively, RMSNorm-style norms by hook
    for name in state.selection.bias_parameter_names:
        assert torch.count_nonzero(dict(model.named_parameters())[name]) == 0
    assert torch.equal(_logits(model, inputs), before)


def test_added_biases_train_and_change_outputs():
    model = tiny_model("llama").train()
    state = apply_bitfit(model, BitFitConfig(["b_q", "b_LN1"], add_missing_biases=True, train_head=False))
    params = dict(model.named_parameters())
    opt = torch.optim.SGD([params[n] for n in state.selection.parameter_names], lr=0.1)
    inputs = batch()
    model(**inputs, labels=torch.tensor([0, 1, 2, 0])).loss.backward()
    opt.step()
    for name in state.selection.parameter_names:
        assert torch.count_nonzero(params[name]) > 0, name  # hook-applied norm biases get gradients too


def test_cannot_add_to_a_module_that_has_one_or_cannot_take_one():
    with pytest.raises(ValueError, match="already has a bias"):
        add_zero_bias(torch.nn.Linear(3, 4))
    with pytest.raises(ValueError, match="Cannot add a bias to a module of type Embedding"):
        add_zero_bias(torch.nn.Embedding(3, 4))


def _smollm2_dir():
    from bitfit_hf.data.assets import smollm2_path

    return smollm2_path()  # installed wheel or cache; raises with `bitfit-hf assets fetch smollm2` when missing


@pytest.mark.slow
def test_real_biasless_smollm2_outputs_unchanged_after_adding_biases():
    """SmolLM2-135M (LLaMA architecture, no bias at all), from its PyPI wheel."""
    from transformers import AutoModelForCausalLM

    from bitfit_hf.data.assets import SMOLLM2_GGUF

    model = AutoModelForCausalLM.from_pretrained(_smollm2_dir(), gguf_file=SMOLLM2_GGUF).eval()
    assert not any(n.endswith(".bias") for n, _ in model.named_parameters())
    ids = torch.randint(0, 49152, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).logits
    state = apply_bitfit(model, BitFitConfig("all", add_missing_biases=True))
    # 30 layers x (q 576 + k 192 + v 192 + o 576 + 2 norms 576 + gate/up 1536 each + down 576) + final norm 576
    assert state.summary.bias_params == 30 * (576 + 192 + 192 + 576 + 2 * 576 + 2 * 1536 + 576) + 576
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)
