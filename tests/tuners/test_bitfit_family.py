"""The bias family around BitFit: the one-d preset (biases + norm gains), layer-wise learning-rate decay,
and how added (and, on request, pretrained) biases are initialised."""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import batch, tiny_model

from bitfit_hf import BitFitConfig, apply_bitfit, resolve
from bitfit_hf.training.optim import parameter_groups

LAYERS = (0, 1)
# Hand-written, independent of the role tables: every gain of each tiny model, with its role.
GAINS = {
    "bert": {"bert.embeddings.LayerNorm.weight": "g_emb_LN",
             **{f"bert.encoder.layer.{L}.attention.output.LayerNorm.weight": "g_LN1" for L in LAYERS},
             **{f"bert.encoder.layer.{L}.output.LayerNorm.weight": "g_LN2" for L in LAYERS}},
    "roberta": {"roberta.embeddings.LayerNorm.weight": "g_emb_LN",
                **{f"roberta.encoder.layer.{L}.attention.output.LayerNorm.weight": "g_LN1" for L in LAYERS},
                **{f"roberta.encoder.layer.{L}.output.LayerNorm.weight": "g_LN2" for L in LAYERS}},
    "gpt2": {"transformer.ln_f.weight": "g_final_LN",
             **{f"transformer.h.{L}.ln_1.weight": "g_LN1" for L in LAYERS},
             **{f"transformer.h.{L}.ln_2.weight": "g_LN2" for L in LAYERS}},
    "llama": {"model.norm.weight": "g_final_LN",
              **{f"model.layers.{L}.input_layernorm.weight": "g_LN1" for L in LAYERS},
              **{f"model.layers.{L}.post_attention_layernorm.weight": "g_LN2" for L in LAYERS}},
}
HEAD = {"bert": "classifier.", "roberta": "classifier.", "gpt2": "score.", "llama": "score."}


@pytest.mark.parametrize("arch", list(GAINS))
def test_one_d_selects_exactly_every_bias_and_every_gain(arch):
    model = tiny_model(arch)
    selection = resolve(model, BitFitConfig("one-d", train_head=False))
    biases = {n for n, _ in model.named_parameters() if n.endswith(".bias") and not n.startswith(HEAD[arch])}
    assert set(selection.parameter_names) == biases | set(GAINS[arch])
    roles = {e.name: e.role for e in selection.entries if e.name.endswith(".weight")}
    assert roles == GAINS[arch]
    assert all(dict(model.named_parameters())[n].dim() == 1 for n in selection.parameter_names)


def test_one_d_with_added_biases_on_llama():
    model = tiny_model("llama")
    state = apply_bitfit(model, BitFitConfig("one-d", add_missing_biases=True))
    names = set(state.selection.parameter_names)
    assert set(GAINS["llama"]) <= names and "model.layers.0.self_attn.q_proj.bias" in names
    assert "model.layers.1.input_layernorm.bias" in names  # a bias added to the RMSNorm too


@pytest.mark.parametrize("role,expected", [("g_LN1", "attention.output.LayerNorm.weight"), ("g_LN2", "output.LayerNorm.weight")])
def test_a_gain_role_alone(role, expected):
    selection = resolve(tiny_model("bert"), BitFitConfig([role, "b_q"], train_head=False))
    gains = sorted(n for n in selection.parameter_names if n.endswith(".weight"))
    assert gains == [f"bert.encoder.layer.{L}.{expected}" for L in LAYERS]


def _rates(model, config, lr=1e-2):
    state = apply_bitfit(model, config)
    groups = parameter_groups(model, state, lr, 0.0, [])
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: g["lr"] for g in groups for p in g["params"]}


def test_layerwise_lr_decay_gives_each_layer_its_rate():
    rates = _rates(tiny_model("bert"), BitFitConfig(layerwise_lr_decay=0.5))
    lr = 1e-2
    for L, expected in ((1, lr), (0, lr * 0.5)):  # layer l of L=2 (counted from 1) gets lr * 0.5 ** (2 - l)
        layer = {n: r for n, r in rates.items() if f".layer.{L}." in n}
        assert layer and all(rate == pytest.approx(expected) for rate in layer.values())
    assert rates["bert.embeddings.LayerNorm.bias"] == pytest.approx(lr * 0.25)  # below the first layer
    assert rates["bert.pooler.dense.bias"] == pytest.approx(lr)  # above the top layer
    assert rates["classifier.weight"] == rates["classifier.bias"] == pytest.approx(lr)


def test_layerwise_lr_decay_on_gpt2_with_bias_rate_and_final_norm():
    rates = _rates(tiny_model("gpt2"), BitFitConfig("one-d", layerwise_lr_decay=0.9, bias_learning_rate=1e-3,
                                                    head_learning_rate=5e-3))
    assert rates["transformer.h.1.attn.c_attn.bias"] == pytest.approx(1e-3)
    assert rates["transformer.h.0.ln_1.weight"] == pytest.approx(1e-3 * 0.9)
    assert rates["transformer.ln_f.weight"] == rates["transformer.ln_f.bias"] == pytest.approx(1e-3)
    assert rates["score.weight"] == pytest.approx(5e-3)


def test_no_decay_keeps_one_rate():
    rates = _rates(tiny_model("bert"), BitFitConfig())
    assert set(rates.values()) == {1e-2}
    with pytest.raises(ValueError, match="layerwise_lr_decay"):
        BitFitConfig(layerwise_lr_decay=1.5)


def test_added_biases_zero_by_default_keep_the_outputs():
    model = tiny_model("llama")
    with torch.no_grad():
        before = model(**batch()).logits
    apply_bitfit(model, BitFitConfig(add_missing_biases=True))
    with torch.no_grad():
        assert torch.equal(model(**batch()).logits, before)


def test_added_bias_init_normal_is_drawn_and_deterministic():
    values = []
    for _ in range(2):
        model = tiny_model("llama")
        state = apply_bitfit(model, BitFitConfig(add_missing_biases=True, added_bias_init="normal:0.1,0.02"))
        params = dict(model.named_parameters())
        values.append(torch.cat([params[f"{m}.bias"].detach().reshape(-1) for m in state.added_biases]))
    assert torch.equal(values[0], values[1])
    assert values[0].mean().item() == pytest.approx(0.1, abs=0.005)
    assert values[0].std().item() == pytest.approx(0.02, rel=0.15)


def test_pretrained_biases_are_kept_unless_reinit_is_asked(caplog):
    model = tiny_model("bert")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    apply_bitfit(model, BitFitConfig(added_bias_init="normal:0,0.02"))  # nothing added: nothing changes
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    model = tiny_model("bert")
    with caplog.at_level(logging.WARNING, logger="bitfit_hf"):
        state = apply_bitfit(model, BitFitConfig(reinit_existing_biases=True))
    assert "reinit_existing_biases=True" in caplog.text
    params = dict(model.named_parameters())
    reinitialised = [n for n in state.selection.bias_parameter_names if n.endswith(".bias")]
    assert reinitialised and all(not params[n].any() for n in reinitialised)  # zero, the default init
    assert all(torch.equal(params[n], before[n]) for n in params if n not in reinitialised)


@pytest.mark.parametrize("spec", ["uniform", "normal:0", "normal:a,b", "normal:0,-1"])
def test_bad_added_bias_init_is_refused(spec):
    with pytest.raises(ValueError, match="added_bias_init must be"):
        BitFitConfig(added_bias_init=spec)


def test_trainer_optimizer_carries_the_layerwise_rates(tmp_path):
    import transformers as T

    from bitfit_hf import BitFitTrainer

    model = tiny_model("bert")
    args = T.TrainingArguments(output_dir=str(tmp_path), learning_rate=1e-2, report_to=[], use_cpu=True)
    trainer = BitFitTrainer(model, args, method_config=BitFitConfig(layerwise_lr_decay=0.5))
    optimizer = trainer.create_optimizer()
    names = {id(p): n for n, p in model.named_parameters()}
    rates = {names[id(p)]: g["lr"] for g in optimizer.param_groups for p in g["params"]}
    assert rates["bert.encoder.layer.1.output.dense.bias"] == pytest.approx(1e-2)
    assert rates["bert.encoder.layer.0.output.dense.bias"] == pytest.approx(5e-3)
    assert rates["bert.embeddings.LayerNorm.bias"] == pytest.approx(2.5e-3)
