"""Exact bias selection: every role and preset on every architecture selects exactly what it names."""

from __future__ import annotations

import pytest
import torch
import transformers as T
from conftest import BIASED_ARCHS, BIASLESS_ARCHS, batch, tiny_model

from bitfit_hf import BitFitConfig, SelectionError, apply_bitfit, resolve
from bitfit_hf.tuners.roles import PAPER_ROLES, roles_for

# Hand-written parameter names (layer index {L}) for each role, independent of the regex tables.
EXPECTED = {
    "bert": ("bert.encoder.layer.{L}.", {
        "b_q": "attention.self.query.bias", "b_k": "attention.self.key.bias", "b_v": "attention.self.value.bias",
        "b_m1": "attention.output.dense.bias", "b_LN1": "attention.output.LayerNorm.bias",
        "b_m2": "intermediate.dense.bias", "b_m3": "output.dense.bias", "b_LN2": "output.LayerNorm.bias"}),
    "distilbert": ("distilbert.transformer.layer.{L}.", {
        "b_q": "attention.q_lin.bias", "b_k": "attention.k_lin.bias", "b_v": "attention.v_lin.bias",
        "b_m1": "attention.out_lin.bias", "b_LN1": "sa_layer_norm.bias", "b_m2": "ffn.lin1.bias",
        "b_m3": "ffn.lin2.bias", "b_LN2": "output_layer_norm.bias"}),
    "mpnet": ("mpnet.encoder.layer.{L}.", {
        "b_q": "attention.attn.q.bias", "b_k": "attention.attn.k.bias", "b_v": "attention.attn.v.bias",
        "b_m1": "attention.attn.o.bias", "b_LN1": "attention.LayerNorm.bias", "b_m2": "intermediate.dense.bias",
        "b_m3": "output.dense.bias", "b_LN2": "output.LayerNorm.bias"}),
    "deberta-v2": ("deberta.encoder.layer.{L}.", {
        "b_q": "attention.self.query_proj.bias", "b_k": "attention.self.key_proj.bias",
        "b_v": "attention.self.value_proj.bias", "b_m1": "attention.output.dense.bias",
        "b_LN1": "attention.output.LayerNorm.bias", "b_m2": "intermediate.dense.bias", "b_m3": "output.dense.bias",
        "b_LN2": "output.LayerNorm.bias"}),
    "gpt2": ("transformer.h.{L}.", {
        "b_q": "attn.c_attn.bias", "b_k": "attn.c_attn.bias", "b_v": "attn.c_attn.bias", "b_m1": "attn.c_proj.bias",
        "b_LN1": "ln_1.bias", "b_m2": "mlp.c_fc.bias", "b_m3": "mlp.c_proj.bias", "b_LN2": "ln_2.bias"}),
    "llama": ("model.layers.{L}.", {
        "b_q": "self_attn.q_proj.bias", "b_k": "self_attn.k_proj.bias", "b_v": "self_attn.v_proj.bias",
        "b_m1": "self_attn.o_proj.bias", "b_LN1": "input_layernorm.bias",
        "b_m2": ("mlp.gate_proj.bias", "mlp.up_proj.bias"), "b_m3": "mlp.down_proj.bias",
        "b_LN2": "post_attention_layernorm.bias"}),
    "opt": ("model.decoder.layers.{L}.", {
        "b_q": "self_attn.q_proj.bias", "b_k": "self_attn.k_proj.bias", "b_v": "self_attn.v_proj.bias",
        "b_m1": "self_attn.out_proj.bias", "b_LN1": "self_attn_layer_norm.bias", "b_m2": "fc1.bias", "b_m3": "fc2.bias",
        "b_LN2": "final_layer_norm.bias"}),
    "phi": ("model.layers.{L}.", {  # one LayerNorm feeds attention and MLP in parallel: no b_LN2
        "b_q": "self_attn.q_proj.bias", "b_k": "self_attn.k_proj.bias", "b_v": "self_attn.v_proj.bias",
        "b_m1": "self_attn.dense.bias", "b_LN1": "input_layernorm.bias", "b_m2": "mlp.fc1.bias", "b_m3": "mlp.fc2.bias"}),
}
EXPECTED["roberta"] = ("roberta.encoder.layer.{L}.", EXPECTED["bert"][1])
EXPECTED["electra"] = ("electra.encoder.layer.{L}.", EXPECTED["bert"][1])
EXPECTED["mistral"] = EXPECTED["llama"]
HEADS = {"bert": ["classifier."], "roberta": ["classifier."], "electra": ["classifier."], "mpnet": ["classifier."],
         "distilbert": ["pre_classifier.", "classifier."], "deberta-v2": ["pooler.", "classifier."],
         "gpt2": ["score."], "llama": ["score."], "mistral": ["score."], "t5": ["classification_head."],
         "albert": ["classifier."], "bart": ["classification_head."], "mbart": ["classification_head."],
         "opt": ["score."], "phi": ["score."]}


def expected_names(arch, role, layers=2):
    prefix, table = EXPECTED[arch]
    tails = table[role] if isinstance(table[role], tuple) else (table[role],)
    return sorted(prefix.format(L=layer) + tail for layer in range(layers) for tail in tails)


@pytest.mark.parametrize("arch", [a for a in EXPECTED if a not in BIASLESS_ARCHS])
@pytest.mark.parametrize("role", list(PAPER_ROLES))
def test_each_role_selects_exactly_its_biases(arch, role):
    model = tiny_model(arch)
    if role not in EXPECTED[arch][1]:  # the architecture has no such bias: a clear error, not an empty selection
        with pytest.raises(ValueError, match=f"Role '{role}' selects no parameter.*This architecture has the roles"):
            resolve(model, BitFitConfig([role], train_head=False))
        return
    selection = resolve(model, BitFitConfig([role], train_head=False))
    assert sorted(selection.parameter_names) == expected_names(arch, role)
    assert {e.role for e in selection.entries} == {role}
    assert sorted({e.layer for e in selection.entries}) == ["0", "1"]


@pytest.mark.parametrize("arch", BIASED_ARCHS)
def test_b_m3_never_catches_the_attention_output(arch):
    """The official code's substring 'output' also trained attention.output.dense.bias; ours must not."""
    model = tiny_model(arch)
    names = resolve(model, BitFitConfig(["b_m3"], train_head=False)).parameter_names
    assert names and not any("attention" in n or "attn.c_proj" in n for n in names)
    if "b_LN2" not in roles_for(model.config.model_type):  # Phi: one LayerNorm per layer
        return
    ln2 = resolve(model, BitFitConfig(["b_LN2"], train_head=False)).parameter_names
    assert ln2 and not any("attention" in n or "attn" in n or "sa_layer_norm" in n or "ln_1" in n for n in ln2)


@pytest.mark.parametrize("arch", BIASED_ARCHS + BIASLESS_ARCHS)
def test_presets(arch):
    model = tiny_model(arch)
    params = dict(model.named_parameters())
    heads = [n for n in params if any(n.startswith(h) for h in HEADS[arch])]
    biases = [n for n in params if n.endswith(".bias") and n not in heads]
    add = arch in BIASLESS_ARCHS

    sel = resolve(model, BitFitConfig("all", add_missing_biases=add))
    if add:
        assert not biases or arch == "t5"  # these models have no bias terms of their own
        assert sel.biases_to_add and all(e.added for e in sel.entries if e.role != "head")
    else:
        assert sorted(sel.bias_parameter_names) == sorted(biases)  # every bias, nothing else
    assert sorted(sel.head_parameter_names) == sorted(heads)

    frozen = resolve(model, BitFitConfig("frozen"))
    assert sorted(frozen.parameter_names) == sorted(heads)
    with pytest.raises(SelectionError, match="selects nothing"):  # README: selecting nothing is an error
        BitFitConfig("frozen", train_head=False)

    full = resolve(model, BitFitConfig("full"))
    assert sorted(full.parameter_names) == sorted(params)

    if arch in EXPECTED:
        subset = resolve(model, BitFitConfig("paper-subset", train_head=False, add_missing_biases=add))
        assert sorted(subset.parameter_names) == sorted(set(expected_names(arch, "b_q") + expected_names(arch, "b_m2")))


def test_t5_roles_cover_encoder_and_decoder_stacks():
    model = tiny_model("t5")
    sel = resolve(model, BitFitConfig(["b_q", "b_m2", "b_LN2", "b_xq"], train_head=False, add_missing_biases=True))
    by_role = {}
    for e in sel.entries:
        by_role.setdefault(e.role, []).append(e.name)
    assert sorted(by_role["b_q"]) == sorted(f"transformer.{s}.block.{l}.layer.0.SelfAttention.q.bias" for s in ("encoder", "decoder") for l in (0, 1))
    assert sorted(by_role["b_LN2"]) == sorted(
        [f"transformer.encoder.block.{l}.layer.1.layer_norm.bias" for l in (0, 1)]
        + [f"transformer.decoder.block.{l}.layer.2.layer_norm.bias" for l in (0, 1)])
    assert sorted(by_role["b_xq"]) == [f"transformer.decoder.block.{l}.layer.1.EncDecAttention.q.bias" for l in (0, 1)]
    assert {e.layer for e in sel.entries} == {"encoder.0", "encoder.1", "decoder.0", "decoder.1"}


@pytest.mark.parametrize("arch", ["bart", "mbart"])
def test_bart_roles_cover_both_stacks_and_cross_attention(arch):
    model = tiny_model(arch)
    roles = ["b_q", "b_m1", "b_LN1", "b_LN2", "b_xq", "b_xLN", "b_emb_LN"]
    sel = resolve(model, BitFitConfig(roles, train_head=False))
    by_role = {}
    for e in sel.entries:
        by_role.setdefault(e.role, []).append(e.name)
    layers = [(s, l) for s in ("encoder", "decoder") for l in (0, 1)]
    assert sorted(by_role["b_q"]) == sorted(f"model.{s}.layers.{l}.self_attn.q_proj.bias" for s, l in layers)
    assert sorted(by_role["b_m1"]) == sorted(f"model.{s}.layers.{l}.self_attn.out_proj.bias" for s, l in layers)
    assert sorted(by_role["b_LN1"]) == sorted(f"model.{s}.layers.{l}.self_attn_layer_norm.bias" for s, l in layers)
    assert sorted(by_role["b_LN2"]) == sorted(f"model.{s}.layers.{l}.final_layer_norm.bias" for s, l in layers)
    assert sorted(by_role["b_xq"]) == [f"model.decoder.layers.{l}.encoder_attn.q_proj.bias" for l in (0, 1)]
    assert sorted(by_role["b_xLN"]) == [f"model.decoder.layers.{l}.encoder_attn_layer_norm.bias" for l in (0, 1)]
    assert sorted(by_role["b_emb_LN"]) == [f"model.{s}.layernorm_embedding.bias" for s in ("decoder", "encoder")]
    assert {e.layer for e in sel.entries if e.role != "b_emb_LN"} == {"encoder.0", "encoder.1", "decoder.0", "decoder.1"}
    if arch == "mbart":  # pre-LN stacks end in a LayerNorm of their own
        final = resolve(model, BitFitConfig(["b_final_LN"], train_head=False)).parameter_names
        assert sorted(final) == ["model.decoder.layer_norm.bias", "model.encoder.layer_norm.bias"]
    else:
        with pytest.raises(ValueError, match="selects no parameter"):
            resolve(model, BitFitConfig(["b_final_LN"], train_head=False))


def test_albert_roles_address_the_shared_layer_group():
    """ALBERT reuses one layer's weights at every depth: each role is one bias vector, labelled group 0."""
    model = tiny_model("albert")
    layer = "albert.encoder.albert_layer_groups.0.albert_layers.0."
    expected = {"b_q": "attention.query", "b_k": "attention.key", "b_v": "attention.value", "b_m1": "attention.dense",
                "b_LN1": "attention.LayerNorm", "b_m2": "ffn", "b_m3": "ffn_output", "b_LN2": "full_layer_layer_norm"}
    for role, module in expected.items():
        sel = resolve(model, BitFitConfig([role], train_head=False))
        assert sel.parameter_names == [layer + module + ".bias"], role
        assert [e.layer for e in sel.entries] == ["0"]
    assert resolve(model, BitFitConfig(["b_pooler"], train_head=False)).parameter_names == ["albert.pooler.bias"]
    subset = resolve(model, BitFitConfig("paper-subset", train_head=False)).parameter_names
    assert sorted(subset) == sorted([layer + "attention.query.bias", layer + "ffn.bias"])


@pytest.mark.parametrize("arch", ["albert", "bart", "opt", "phi"])
def test_new_architectures_train_only_biases_and_round_trip(arch, tmp_path):
    """On each newly tabled architecture: BitFit moves the selected biases and the head, leaves every other
    tensor bit-identical, and the saved adapter reproduces the logits on a fresh stock model."""
    from bitfit_hf import load_adapter, save_adapter

    model = tiny_model(arch).train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    apply_bitfit(model, BitFitConfig("paper-subset"))
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    inputs = batch()
    inputs["input_ids"][:, -1] = 2  # BART classifies from the last <eos>; the others ignore it
    for _ in range(2):
        model(**inputs, labels=torch.tensor([0, 1, 2, 0])).loss.backward()
        opt.step(), opt.zero_grad()
    after = dict(model.named_parameters())
    assert trained and all(not torch.equal(after[n], before[n]) for n in trained if n.endswith(".bias"))
    assert all(torch.equal(after[n], before[n]) for n in before if n not in trained)
    save_adapter(model, tmp_path / "adapter")
    model.eval()
    fresh = tiny_model(arch).eval()  # the same random base, untrained biases and head
    with torch.no_grad():
        assert not torch.equal(fresh(**inputs).logits, model(**inputs).logits)
        load_adapter(fresh, tmp_path / "adapter")
        assert torch.equal(fresh(**inputs).logits, model(**inputs).logits)


def test_gpt2_fused_qkv_trains_only_the_selected_chunk():
    model = tiny_model("gpt2").train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = apply_bitfit(model, BitFitConfig(["b_q"], train_head=False))
    assert state.summary.per_role["b_q"] == 2 * 32  # one third of each 96-wide c_attn bias
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.0)
    ids = torch.randint(3, 100, (4, 10))
    for _ in range(3):
        model(input_ids=ids, labels=torch.tensor([0, 1, 2, 0])).loss.backward()
        opt.step(), opt.zero_grad()
    for layer in (0, 1):
        name = f"transformer.h.{layer}.attn.c_attn.bias"
        p, b = dict(model.named_parameters())[name].detach(), before[name]
        assert not torch.equal(p[:32], b[:32])  # q moved
        assert torch.equal(p[32:], b[32:])  # k and v bit-identical
    for n, p in model.named_parameters():
        if "c_attn.bias" not in n:
            assert torch.equal(p, before[n]), n


def test_patterns_and_unknown_inputs_give_clear_errors():
    model = tiny_model("bert")
    sel = resolve(model, BitFitConfig("frozen", patterns=[r".*\.attention\.output\.LayerNorm\.weight"], train_head=False))
    assert sorted(sel.parameter_names) == [f"bert.encoder.layer.{l}.attention.output.LayerNorm.weight" for l in (0, 1)]
    with pytest.raises(ValueError, match=r"Unknown bias term.*b_qq.*Roles: b_q"):
        BitFitConfig(["b_qq"])
    with pytest.raises(ValueError, match=r"Pattern 'nothing\\\\.here' selects no parameter.*bert\.embeddings\.LayerNorm\.bias"):
        resolve(model, BitFitConfig("frozen", patterns=[r"nothing\.here"]))
    with pytest.raises(ValueError, match=r"Role 'b_final_LN'.*selects no parameter.*This architecture has the roles"):
        resolve(model, BitFitConfig(["b_final_LN"]))
    with pytest.raises(ValueError, match="mixes the preset"):
        BitFitConfig(["all", "b_q"])
    with pytest.raises(ValueError, match="no bias-role table for model_type"):
        resolve(T.AutoModelForSequenceClassification.from_config(  # q, k, v fused and interleaved per head
            T.GPTNeoXConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=100)),
            BitFitConfig(["b_q"]))


def test_biasless_model_without_add_missing_biases_is_an_error():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="add_missing_biases=True"):
        resolve(model, BitFitConfig(["b_q"]))
    with pytest.raises(ValueError, match="has no bias terms"):
        resolve(model, BitFitConfig("all", train_head=False))


NORM_ROLES = ["b_LN1", "b_LN2", "b_emb_LN", "b_final_LN", "g_LN1", "g_LN2", "g_emb_LN", "g_final_LN"]


@pytest.mark.parametrize("arch, roles", [
    ("bert", {"b_LN1", "b_LN2", "b_emb_LN", "g_LN1", "g_LN2", "g_emb_LN"}),  # post-LN: no final norm
    ("gpt2", {"b_LN1", "b_LN2", "b_final_LN", "g_LN1", "g_LN2", "g_final_LN"}),  # no embeddings norm
    ("llama", {"g_LN1", "g_LN2", "g_final_LN"}),  # RMSNorm: gains, no bias
])
def test_a_role_list_skips_the_roles_a_model_lacks(arch, roles, caplog):
    """One list of every norm role serves every architecture: each model trains the norms it has."""
    with caplog.at_level("INFO", logger="bitfit_hf"):
        selection = resolve(tiny_model(arch), BitFitConfig(NORM_ROLES, train_head=False))
    assert {e.role for e in selection.entries} == roles
    assert all(e.name.endswith(".weight" if e.role.startswith("g_") else ".bias") for e in selection.entries)
    skipped = set(NORM_ROLES) - roles
    assert f"skipping {', '.join(r for r in NORM_ROLES if r in skipped)}" in caplog.text


def test_a_single_role_or_a_list_the_model_lacks_is_an_error_naming_the_roles_it_has():
    config = T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100)
    tagger = T.BertForTokenClassification(config)  # no pooler
    assert {e.role for e in resolve(tagger, BitFitConfig(["b_q", "b_pooler"])).entries} == {"b_q", "head"}
    for terms, what in ((["b_pooler"], "Role 'b_pooler'"), (["b_pooler", "b_xq"], "bias_terms b_pooler b_xq")):
        with pytest.raises(SelectionError) as caught:
            resolve(tagger, BitFitConfig(terms))
        message = str(caught.value)
        assert message.startswith(f"{what} selects no parameter of this bert model")
        has = message.split("This architecture has the roles: ")[1]
        assert has.startswith("b_q, b_k, b_v") and "g_LN1" in has and "b_pooler" not in has
    with pytest.raises(SelectionError, match="Role 'b_q' names 2 module.*add_missing_biases=True"):
        resolve(tiny_model("llama"), BitFitConfig(["b_q", "b_v"]))  # none has a bias: how to add them


def test_string_forms_of_bias_terms():
    assert BitFitConfig("b_q b_m2").bias_terms == ["b_q", "b_m2"]
    assert BitFitConfig("b_q,b_m2").bias_terms == ["b_q", "b_m2"]
    assert BitFitConfig(["paper-subset"]).preset == "paper-subset"


def test_paper_fractions_on_bert_base_config():
    """The paper: biases are ~0.09% of BERT-base, b_q+b_m2 ~0.04%."""
    with torch.device("meta"):
        model = T.BertModel(T.BertConfig())  # bert-base-uncased's shape, no memory used
    all_summary = apply_bitfit(model, BitFitConfig("all")).summary
    assert all_summary.bias_params == 102_912  # 12 x (7 x 768 + 3072) + embeddings LN 768 + pooler 768
    assert round(100 * all_summary.bias_fraction, 2) == 0.09
    subset = apply_bitfit(model, BitFitConfig("paper-subset")).summary
    assert subset.bias_params == 12 * (768 + 3072)
    assert round(100 * subset.bias_fraction, 2) == 0.04
    assert set(subset.per_role_layer["b_q"]) == {str(i) for i in range(12)}
    text = str(all_summary)
    assert "b_LN2" in text and "0.09" in text
