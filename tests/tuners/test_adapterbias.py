"""AdapterBias on every supported architecture: outputs unchanged before training, exactly v, L_alpha,
the selected LayerNorms and the head trained, the parameter count of the paper's formula, and a saved
adapter that reproduces the logits on a stock model."""

from __future__ import annotations

import pytest
import torch
import transformers as T
from conftest import batch, tiny_model

from bitfit_hf import load_adapter, save_adapter
from bitfit_hf.tuners import apply_method
from bitfit_hf.tuners.adapterbias import AdapterBiasConfig

# Hand-written, independent of the role tables: per architecture the base-model prefix, the FFN output
# projection and the FFN LayerNorm of layer {L}, the embeddings LayerNorm (None: the architecture has
# none), and the FFN width of the tiny config (GPT-2's is 4 x hidden).
ARCHS = {
    "bert": ("bert", "bert.encoder.layer.{L}.output.dense", "bert.encoder.layer.{L}.output.LayerNorm",
             "bert.embeddings.LayerNorm", 64),
    "roberta": ("roberta", "roberta.encoder.layer.{L}.output.dense", "roberta.encoder.layer.{L}.output.LayerNorm",
                "roberta.embeddings.LayerNorm", 64),
    "electra": ("electra", "electra.encoder.layer.{L}.output.dense", "electra.encoder.layer.{L}.output.LayerNorm",
                "electra.embeddings.LayerNorm", 64),
    "distilbert": ("distilbert", "distilbert.transformer.layer.{L}.ffn.lin2",
                   "distilbert.transformer.layer.{L}.output_layer_norm", "distilbert.embeddings.LayerNorm", 64),
    "mpnet": ("mpnet", "mpnet.encoder.layer.{L}.output.dense", "mpnet.encoder.layer.{L}.output.LayerNorm",
              "mpnet.embeddings.LayerNorm", 64),
    "deberta-v2": ("deberta", "deberta.encoder.layer.{L}.output.dense", "deberta.encoder.layer.{L}.output.LayerNorm",
                   "deberta.embeddings.LayerNorm", 64),
    "gpt2": ("transformer", "transformer.h.{L}.mlp.c_proj", "transformer.h.{L}.ln_2", None, 128),
    "llama": ("model", "model.layers.{L}.mlp.down_proj", "model.layers.{L}.post_attention_layernorm", None, 64),
}
HIDDEN, LAYERS = 32, 2
LABELS = torch.tensor([0, 1, 2, 0])


def expected_trained(arch, model, share_alpha):
    prefix, proj, ln, emb_ln, _ = ARCHS[arch]
    params = dict(model.named_parameters())
    names = set()
    for layer in range(LAYERS):
        p = proj.format(L=layer)
        names.add(f"{p}.token_shift.vector")
        if not share_alpha:
            names |= {f"{p}.token_shift.alpha.weight", f"{p}.token_shift.alpha.bias"}
        names |= {n for n in (f"{ln.format(L=layer)}.weight", f"{ln.format(L=layer)}.bias") if n in params}
    if share_alpha:
        names |= {f"{prefix}.token_shift_alpha.weight", f"{prefix}.token_shift_alpha.bias"}
    if emb_ln:
        names |= {f"{emb_ln}.weight", f"{emb_ln}.bias"}
    head = {n for n in params if not n.startswith(prefix + ".")}
    return names | head, head


def formula_count(arch, model, share_alpha, head):
    """Per layer d + d_ff + 1 (or d per layer and d_ff + 1 once when shared), plus the norms and the head."""
    _, _, ln, emb_ln, d_ff = ARCHS[arch]
    params = dict(model.named_parameters())
    shift = LAYERS * HIDDEN + (d_ff + 1 if share_alpha else LAYERS * (d_ff + 1))
    norms = sum(p.numel() for n, p in params.items()
                if any(n.startswith(ln.format(L=layer) + ".") for layer in range(LAYERS))
                or (emb_ln and n.startswith(emb_ln + ".")))
    return shift + norms + sum(params[n].numel() for n in head)


def inputs_for(arch):
    inputs = batch()
    if arch in ("gpt2", "llama"):  # causal LMs classify from the last non-pad token
        inputs["input_ids"][:, -1] = 5
    return inputs


@pytest.mark.parametrize("share_alpha", [False, True], ids=["per-layer", "shared"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_adapterbias_trains_exactly_its_tensors_and_round_trips(arch, share_alpha, tmp_path):
    model = tiny_model(arch)
    inputs = inputs_for(arch)
    with torch.no_grad():
        stock_logits = model(**inputs).logits
    base = {n: p.detach().clone() for n, p in model.named_parameters()}

    state = apply_method(model, AdapterBiasConfig(share_alpha=share_alpha))
    with torch.no_grad():  # v = 0: outputs bit-identical to the stock model's
        assert torch.equal(model(**inputs).logits, stock_logits)

    expected, head = expected_trained(arch, model, share_alpha)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == expected
    assert set(state.selection.parameter_names) == expected
    count = formula_count(arch, model, share_alpha, head)
    assert state.summary.trainable_params == count == sum(p.numel() for p in model.parameters() if p.requires_grad)

    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    for _ in range(3):  # step 1 moves v (L_alpha's gradient is v, zero at first); later steps move L_alpha
        model(**inputs, labels=LABELS).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    after = dict(model.named_parameters())
    assert all(torch.equal(after[n], base[n]) for n in base if n not in expected), "a frozen tensor moved"
    assert all(not torch.equal(after[n], start[n]) for n in expected), [n for n in expected if torch.equal(after[n], start[n])]

    save_adapter(model, tmp_path / "adapter")
    fresh = tiny_model(arch)  # the same random base: stock weights, untrained norms and head
    with torch.no_grad():
        trained_logits = model(**inputs).logits
        assert not torch.equal(fresh(**inputs).logits, trained_logits)
        load_adapter(fresh, str(tmp_path / "adapter"))
        assert torch.equal(fresh(**inputs).logits, trained_logits)


def test_shift_is_alpha_of_the_ffn_hidden_state_times_v():
    """The shift follows the paper: projection(h) + L_alpha(h) * v, h the projection's input."""
    model = tiny_model("bert")
    apply_method(model, AdapterBiasConfig())
    proj = model.bert.encoder.layer[0].output.dense
    shift = proj.token_shift
    with torch.no_grad():
        shift.vector.copy_(torch.randn(HIDDEN))
        h = torch.randn(3, 5, 64)
        expected = torch.nn.functional.linear(h, proj.weight, proj.bias) + shift.alpha(h) * shift.vector
        assert torch.allclose(proj(h), expected, atol=1e-6)
        assert shift.alpha(h).shape == (3, 5, 1)  # one weight per token


def test_alpha_initialisation_does_not_depend_on_the_global_random_state():
    """Every process (and every run) builds the same L_alpha: DDP ranks and the single-process reference agree."""
    first, second = tiny_model("bert"), tiny_model("bert")
    torch.manual_seed(1)
    apply_method(first, AdapterBiasConfig())
    torch.manual_seed(2)
    apply_method(second, AdapterBiasConfig())
    a = first.bert.encoder.layer[1].output.dense.token_shift.alpha.weight
    b = second.bert.encoder.layer[1].output.dense.token_shift.alpha.weight
    assert torch.equal(a, b)
    assert not torch.equal(a, first.bert.encoder.layer[0].output.dense.token_shift.alpha.weight)


def test_architecture_without_an_ffn_output_role_is_refused():
    config = T.GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                             vocab_size=100, pad_token_id=0, num_labels=2)
    model = T.AutoModelForSequenceClassification.from_config(config)
    with pytest.raises(ValueError, match=r"FFN output projection \(role b_m3\).*'gpt_neox'.*Architectures with an FFN output role: .*bert"):
        apply_method(model, AdapterBiasConfig())
    assert not any(n.endswith("token_shift.vector") for n, _ in model.named_parameters())


def test_config_round_trip_and_refusals():
    cfg = AdapterBiasConfig(share_alpha=True, adapter_learning_rate=1e-3, head_learning_rate=5e-4)
    assert AdapterBiasConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.learning_rate_for("ab_v") == cfg.learning_rate_for("ab_alpha") == 1e-3
    assert cfg.learning_rate_for("head") == 5e-4 and cfg.learning_rate_for("b_LN2") is None
    # an adapter hands BitFit's selection fields back; only their neutral values are accepted
    assert AdapterBiasConfig.from_dict({"share_alpha": True, "bias_terms": [], "patterns": [],
                                        "add_missing_biases": False}).share_alpha
    with pytest.raises(ValueError, match="no 'bias_terms' setting"):
        AdapterBiasConfig.from_dict({"bias_terms": ["b_q"]})
    with pytest.raises(ValueError, match="unknown role"):
        AdapterBiasConfig(norm_roles=["b_LN9"])


def test_reapplying_keeps_one_set_of_shifts_and_refuses_a_different_structure():
    model = tiny_model("bert")
    apply_method(model, AdapterBiasConfig())
    count = sum(1 for n, _ in model.named_parameters() if n.endswith("token_shift.vector"))
    apply_method(model, AdapterBiasConfig(train_head=False))
    assert sum(1 for n, _ in model.named_parameters() if n.endswith("token_shift.vector")) == count == LAYERS
    with pytest.raises(ValueError, match="share_alpha=False.*share_alpha=True"):
        apply_method(model, AdapterBiasConfig(share_alpha=True))
