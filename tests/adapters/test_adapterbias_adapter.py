"""AdapterBias end to end on the real all-MiniLM-L6-v2: BitFitTrainer with its own optimizer groups,
the adapter format (only v, L_alpha, the trained LayerNorms and the head), loading onto a stock base
(load_adapter, AutoBitFitModel, AdapterBank), the refusals of export_merged and MultiTaskModel, the
model card and `bitfit-hf info`, and resuming from a checkpoint."""

from __future__ import annotations

import pytest
import torch
import transformers as T
from conftest import batch, tiny_model
from datasets import Dataset

from bitfit_hf import (
    AdapterBank,
    AdapterError,
    AutoBitFitModel,
    BitFitAdapter,
    BitFitConfig,
    BitFitTrainer,
    MultiTaskModel,
    apply_bitfit,
    export_merged,
    load_adapter,
    save_adapter,
)
from bitfit_hf.tuners import apply_method
from bitfit_hf.tuners.adapterbias import AdapterBiasConfig

TEXTS = ["a gorgeous, witty movie.", "boring and far too long.", "an utter delight.", "a tedious mess."] * 4
D, D_FF, LAYERS = 384, 1536, 6  # all-MiniLM-L6-v2
ADAPTER_LR, HEAD_LR, WEIGHT_DECAY = 2e-2, 5e-3, 0.01


def stock(minilm_dir, seed=123):
    torch.manual_seed(seed)  # another random head than the trained model's: the adapter brings its own
    return T.AutoModelForSequenceClassification.from_pretrained(minilm_dir, num_labels=2).eval()


def logits(model, tok, texts=TEXTS[:4]):
    with torch.no_grad():
        return model(**tok(texts, return_tensors="pt", padding=True)).logits


@pytest.fixture(scope="module", params=[False, True], ids=["per-layer", "shared"])
def trained(request, minilm_dir, tmp_path_factory):
    share = request.param
    out = tmp_path_factory.mktemp("ab")
    torch.manual_seed(0)
    model = T.AutoModelForSequenceClassification.from_pretrained(minilm_dir, num_labels=2)
    tok = T.AutoTokenizer.from_pretrained(minilm_dir)
    before_logits = logits(model.eval(), tok)
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = apply_method(model, AdapterBiasConfig(share_alpha=share, adapter_learning_rate=ADAPTER_LR,
                                                  head_learning_rate=HEAD_LR))
    unchanged = torch.equal(logits(model, tok), before_logits)
    enc = tok(TEXTS, padding="max_length", max_length=16)
    data = Dataset.from_dict({**enc, "labels": [i % 2 for i in range(len(TEXTS))]})
    args = T.TrainingArguments(str(out), max_steps=4, per_device_train_batch_size=8, learning_rate=1e-3,
                               weight_decay=WEIGHT_DECAY, report_to=[], use_cpu=True, save_strategy="no",
                               disable_tqdm=True, seed=0)
    trainer = BitFitTrainer(model, args, train_dataset=data, method_config=state.config,
                            base_model_name_or_path="sentence-transformers/all-MiniLM-L6-v2")
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.train()
    trainer.save_model()
    return {"model": model.eval(), "tok": tok, "out": str(out), "share": share, "base": base, "start": start,
            "trainer": trainer, "unchanged_before_training": unchanged}


def expected_names(share):
    names = {"bert.embeddings.LayerNorm.weight", "bert.embeddings.LayerNorm.bias", "classifier.weight", "classifier.bias"}
    for layer in range(LAYERS):
        prefix = f"bert.encoder.layer.{layer}.output."
        names |= {prefix + "dense.token_shift.vector", prefix + "LayerNorm.weight", prefix + "LayerNorm.bias"}
        if not share:
            names |= {prefix + "dense.token_shift.alpha.weight", prefix + "dense.token_shift.alpha.bias"}
    if share:
        names |= {"bert.token_shift_alpha.weight", "bert.token_shift_alpha.bias"}
    return names


def test_minilm_unchanged_before_training_and_exactly_the_right_tensors_train(trained):
    assert trained["unchanged_before_training"]
    model, share = trained["model"], trained["share"]
    names = expected_names(share)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == names
    shift = LAYERS * D + (D_FF + 1 if share else LAYERS * (D_FF + 1))
    norms = (LAYERS + 1) * 2 * D
    head = D * 2 + 2
    assert trained["trainer"].tuner_state.summary.trainable_params == shift + norms + head
    after = dict(model.named_parameters())
    base = trained["base"]
    assert all(torch.equal(after[n], base[n]) for n in base if n not in names), "a frozen tensor moved"
    assert all(not torch.equal(after[n], trained["start"][n]) for n in names)


def test_optimizer_groups_follow_the_official_code(trained):
    """lr per group from the config; no weight decay on the LayerNorms and L_alpha's bias (v, L_alpha's
    weight and the head's weight take the trainer's weight decay, as AdamW's default did officially)."""
    model, opt = trained["model"], trained["trainer"].optimizer
    name_of = {id(p): n for n, p in model.named_parameters()}
    seen = {}
    for group in opt.param_groups:
        for p in group["params"]:
            seen[name_of[id(p)]] = (group.get("initial_lr", group["lr"]), group["weight_decay"])
    assert set(seen) == expected_names(trained["share"])
    for name, (lr, wd) in seen.items():
        if "token_shift" in name:
            assert lr == ADAPTER_LR and wd == (0.0 if name.endswith(".bias") else WEIGHT_DECAY), name
        elif name.startswith("classifier"):
            assert lr == HEAD_LR and wd == (0.0 if name.endswith(".bias") else WEIGHT_DECAY), name
        else:  # LayerNorms: the trainer's rate, no decay
            assert "LayerNorm" in name and (lr, wd) == (1e-3, 0.0), name


def test_adapter_holds_only_the_trained_tensors_and_loads_onto_a_stock_model(trained, minilm_dir):
    adapter = BitFitAdapter.from_directory(trained["out"])
    cfg = adapter.config
    assert cfg.method == "adapterbias" and cfg.method_config["share_alpha"] == trained["share"]
    assert set(adapter.tensors) == set(cfg.trained_parameters) == expected_names(trained["share"])
    expected = logits(trained["model"], trained["tok"])

    fresh = stock(minilm_dir)
    assert not torch.equal(logits(fresh, trained["tok"]), expected)
    load_adapter(fresh, trained["out"])
    assert torch.equal(logits(fresh.eval(), trained["tok"]), expected)

    auto = AutoBitFitModel.from_pretrained(trained["out"], base_model=minilm_dir).eval()
    assert torch.equal(logits(auto, trained["tok"]), expected)


def test_adapter_bank_switches_between_adapterbias_and_bitfit(trained, minilm_dir, tmp_path):
    tok = trained["tok"]
    torch.manual_seed(5)
    bitfit = T.AutoModelForSequenceClassification.from_pretrained(minilm_dir, num_labels=2).eval()
    apply_bitfit(bitfit, BitFitConfig("all"))
    with torch.no_grad():
        for p in bitfit.parameters():
            if p.requires_grad:
                p.add_(0.01 * torch.randn_like(p))
    save_adapter(bitfit, str(tmp_path / "bitfit"))

    backbone = stock(minilm_dir, seed=7)
    plain = logits(backbone, tok)
    bank = AdapterBank(backbone)
    bank.add("bitfit", str(tmp_path / "bitfit"))
    bank.add("ab", trained["out"])
    bank.activate("ab")
    assert torch.equal(logits(backbone, tok), logits(trained["model"], tok))
    bank.activate("bitfit")
    assert torch.equal(logits(backbone, tok), logits(bitfit, tok))
    bank.restore_base()  # the shifts stay, with v back at zero: the stock model's outputs exactly
    assert torch.equal(logits(backbone, tok), plain)


def test_export_merged_refuses_with_the_reason_and_mixed_batches_give_the_adapter_alone(trained, minilm_dir, tmp_path):
    model = AutoBitFitModel.from_pretrained(trained["out"], base_model=minilm_dir)
    with pytest.raises(AdapterError, match="token-dependent shift"):
        export_merged(model, str(tmp_path / "merged"))
    assert not (tmp_path / "merged").exists()
    inputs = batch(n=4)
    mt = MultiTaskModel(stock(minilm_dir), {"ab": trained["out"]})
    with torch.no_grad():
        mixed = mt(**inputs, task_ids=["ab", "__base__", "ab", "__base__"]).logits
        alone = model(**inputs).logits
        base = stock(minilm_dir)(**inputs).logits
    assert (mixed[0::2] - alone[0::2]).abs().max().item() <= 1e-5
    assert (mixed[1::2, : base.shape[-1]] - base[1::2]).abs().max().item() <= 1e-5


def test_model_card_and_info_name_the_method_and_its_parameter_count(trained):
    from bitfit_hf.cli.info_cmd import describe
    from bitfit_hf.reporting.model_card import build_model_card

    adapter = BitFitAdapter.from_directory(trained["out"])
    summary = trained["trainer"].tuner_state.summary
    outside_head = summary.bias_params
    card = str(build_model_card(adapter, "me/minilm-ab", summary=summary.to_dict()))
    assert "An **AdapterBias** adapter" in card and f"**{outside_head:,} parameters** outside the head" in card
    assert "fu-etal-2022-adapterbias" in card and "- adapterbias" in card
    assert "| `ab_v` | AdapterBias shift vector" in card
    rows = dict(describe(adapter, trained["out"]))
    assert rows["method"] == (f"adapterbias (alpha_init_seed=0, norm_roles=['b_LN2', 'b_emb_LN'], "
                              f"share_alpha={trained['share']})")
    assert rows["parameters"].startswith(f"{summary.trainable_params:,} trained")
    assert "ab_v" in rows["trained roles"] and "ab_alpha" in rows["trained roles"]


def test_resume_from_a_checkpoint_equals_the_uninterrupted_run(tmp_path):
    inputs = batch(n=16)
    data = [{"input_ids": inputs["input_ids"][i], "attention_mask": inputs["attention_mask"][i], "labels": i % 3}
            for i in range(16)]

    def run(out, resume=None):
        model = tiny_model("bert")
        args = T.TrainingArguments(str(out), max_steps=4, per_device_train_batch_size=4, learning_rate=1e-2,
                                   report_to=[], use_cpu=True, save_strategy="steps", save_steps=2,
                                   disable_tqdm=True, seed=0)
        trainer = BitFitTrainer(model, args, train_dataset=data, method_config=AdapterBiasConfig(share_alpha=True))
        trainer.train(resume_from_checkpoint=resume)
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    full = run(tmp_path / "full")
    assert (tmp_path / "full" / "checkpoint-2" / "adapter_model.safetensors").is_file()
    resumed = run(tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-2"))
    assert set(full) == set(resumed)
    assert all(torch.equal(full[n], resumed[n]) for n in full)
