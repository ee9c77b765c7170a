"""BitFit + LoRA: peft LoRA matrices, the selected biases and the head train; nothing else moves; the adapter
reproduces the trained logits exactly, and the merged checkpoint up to float rounding."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T
from conftest import batch, tiny_model
from datasets import Dataset

from bitfit_hf import AutoBitFitModel, BitFitAdapter, BitFitConfig, BitFitTrainer
from bitfit_hf.tuners import apply_method
from bitfit_hf.tuners.bitfit_lora import LORA, BitFitLoraConfig, BitFitLoraState

try:
    from tests.support import adapter_roundtrip, perturbed_adapters, tiny_training
except ImportError:  # tests/ (not the repo root) is on sys.path
    from support import adapter_roundtrip, perturbed_adapters, tiny_training  # type: ignore[no-redef]

MERGE_ATOL = 1e-5  # W + BA folded into one matrix rounds differently from x W + (x A) B; measured <= 5e-7

# LLaMA has no biases: BitFit adds zero ones (b_k left out: softmax ignores a shift of the keys, its gradient is 0)
ARCH_CONFIGS = {
    "bert": dict(),
    "roberta": dict(),
    "llama": dict(bias_terms=["b_q", "b_v", "b_m1", "b_m2", "b_m3"], add_missing_biases=True),
}


def _snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _train(model, tmp_path, config, vocab, **kw):
    trainer = BitFitTrainer(model, tiny_training.quiet_cpu_training_args(tmp_path, **kw),
                            train_dataset=tiny_training.parity_dataset(vocab), method_config=config)
    trainer.train()
    model.eval()
    return trainer


def _check_only_selection_moved(model, before, state):
    """Every frozen tensor bit-identical; every LoRA matrix, selected bias and head tensor moved."""
    trained = set(state.selection.parameter_names)
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved == trained, (sorted(moved - trained)[:5], sorted(trained - moved)[:5])
    roles = {e.role for e in state.selection.entries}
    assert LORA in roles and "head" in roles and len(roles) > 2


@pytest.mark.parametrize("arch", sorted(ARCH_CONFIGS))
def test_tiny_models_move_exactly_lora_biases_and_head_and_reload_exactly(arch, tmp_path):
    model = tiny_model(arch, num_labels=2)
    base_dir = tmp_path / "base"
    model.save_pretrained(base_dir)
    model = T.AutoModelForSequenceClassification.from_pretrained(base_dir)
    config = BitFitLoraConfig(lora_r=4, lora_alpha=8, lora_dropout=0.1, bias_learning_rate=1e-2,
                              lora_learning_rate=3e-2, **ARCH_CONFIGS[arch])
    state = apply_method(model, config)
    assert isinstance(state, BitFitLoraState) and state.lora_modules  # query/value projections by default
    assert all(m.rsplit(".", 1)[-1] in ("query", "value", "q_proj", "v_proj") for m in state.lora_modules)
    before = _snapshot(model)
    trainer = _train(model, tmp_path, config, model.config.vocab_size)
    _check_only_selection_moved(model, before, state)
    # separate learning rates for the LoRA matrices and the biases
    rates = {g["lr"] if "initial_lr" not in g else g["initial_lr"] for g in trainer.optimizer.param_groups}
    assert {3e-2, 1e-2} <= rates

    inputs = batch(vocab=model.config.vocab_size)
    with torch.no_grad():
        trained = model(**inputs).logits
    trainer.save_model(str(tmp_path / "adapter"))
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert saved["method"] == "bitfit_lora"
    assert {"lora_r": 4, "lora_alpha": 8, "lora_dropout": 0.1}.items() <= saved["method_config"].items()
    assert any(".lora_A." in n for n in saved["adapter_parameters"])

    adapter_roundtrip.assert_reloads_exactly_and_merges(tmp_path / "adapter", base_dir, tmp_path / "merged", inputs, trained,
                                                        method_marker="lora", merge_atol=MERGE_ATOL)


def test_real_minilm_moves_exactly_lora_biases_and_head(minilm_dir, tmp_path):
    tok = T.AutoTokenizer.from_pretrained(minilm_dir)
    texts = ["a gorgeous, witty, seductive movie.", "dull, lifeless and badly acted."] * 4
    enc = tok(texts, padding="max_length", max_length=16, truncation=True)
    data = Dataset.from_dict({**enc, "labels": [1, 0] * 4})
    torch.manual_seed(0)
    model = T.AutoModelForSequenceClassification.from_pretrained(minilm_dir, num_labels=2)
    config = BitFitLoraConfig()  # the defaults: r 8, alpha 16, dropout 0.1, query + value, every bias
    state = apply_method(model, config)
    assert len(state.lora_modules) == 12  # 6 layers x (query, value)
    before = _snapshot(model)
    trainer = BitFitTrainer(model, tiny_training.quiet_cpu_training_args(tmp_path, max_steps=2, learning_rate=1e-2),
                            train_dataset=data, method_config=config)
    trainer.train()
    model.eval()
    _check_only_selection_moved(model, before, state)
    inputs = {k: torch.tensor(v[:4]) for k, v in enc.items()}
    with torch.no_grad():
        trained = model(**inputs).logits
    trainer.save_model(str(tmp_path / "adapter"))
    loaded = AutoBitFitModel.from_pretrained(str(tmp_path / "adapter"), base_model=minilm_dir).eval()
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits, trained)


def test_gpt2_fused_c_attn_gets_lora_whole_and_reloads_exactly():
    model = tiny_model("gpt2", num_labels=2)
    state = apply_method(model, BitFitLoraConfig(lora_r=2, lora_dropout=0.0, bias_terms=["b_q"]))
    assert [m.rsplit(".", 1)[-1] for m in state.lora_modules] == ["c_attn", "c_attn"]
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.1 * torch.randn_like(param))
        trained = model(**batch()).logits
    adapter = BitFitAdapter.from_model(model)
    fresh = tiny_model("gpt2", num_labels=2)
    adapter.apply_to(fresh)
    with torch.no_grad():
        assert torch.equal(fresh(**batch()).logits, trained)


def test_lora_leaves_outputs_unchanged_until_trained():
    model = tiny_model("bert")
    with torch.no_grad():
        before = model(**batch()).logits
    apply_method(model, BitFitLoraConfig(lora_dropout=0.0))
    with torch.no_grad():
        assert torch.equal(model(**batch()).logits, before)


def test_explicit_targets_follow_peft_matching_and_bad_targets_are_named():
    model = tiny_model("bert")
    state = apply_method(model, BitFitLoraConfig(lora_target_modules=["key", "output.dense"]))
    tails = sorted({m.split("layer.", 1)[1].split(".", 1)[1] for m in state.lora_modules})
    assert tails == ["attention.output.dense", "attention.self.key", "output.dense"]
    with pytest.raises(ValueError, match="matches no module.*Linear layers include"):
        apply_method(tiny_model("bert"), BitFitLoraConfig(lora_target_modules=["no_such_proj"]))


def test_other_lora_settings_on_a_prepared_model_are_refused():
    model = tiny_model("bert")
    apply_method(model, BitFitLoraConfig(lora_r=4))
    assert apply_method(model, BitFitLoraConfig(lora_r=4)) is not None  # same settings: the same state
    with pytest.raises(ValueError, match="already carries LoRA layers"):
        apply_method(model, BitFitLoraConfig(lora_r=8))


def test_config_checks():
    with pytest.raises(ValueError, match="lora_r"):
        BitFitLoraConfig(lora_r=0)
    with pytest.raises(ValueError, match="full"):
        BitFitLoraConfig(bias_terms="full")
    cfg = BitFitLoraConfig(lora_target_modules=["query,value"], lora_learning_rate=1e-4, bias_learning_rate=1e-3)
    assert cfg.lora_target_modules == ["query", "value"]
    assert (cfg.learning_rate_for(LORA), cfg.learning_rate_for("b_q")) == (1e-4, 1e-3)
    assert BitFitLoraConfig.from_dict(cfg.to_dict()) == cfg


def _perturbed_adapter(config, seed):
    model = tiny_model("bert", num_labels=2 + seed % 2)
    return perturbed_adapters.perturbed_adapter_and_logits(model, config, seed, batch(), scale=0.2)


def test_adapter_bank_switches_lora_tasks_bias_tasks_and_the_base_exactly():
    lora_qv = _perturbed_adapter(BitFitLoraConfig(lora_r=4, lora_dropout=0.0), 1)
    bias_only = _perturbed_adapter(BitFitConfig(), 2)
    lora_k = _perturbed_adapter(
        BitFitLoraConfig(lora_r=2, lora_alpha=4, lora_target_modules=["key"], lora_dropout=0.0, bias_terms="b_k"), 3)
    tasks = {"bias": bias_only, "qv": lora_qv, "k": lora_k}  # added to the bank in this order
    perturbed_adapters.assert_bank_switches_exactly(tiny_model("bert", num_labels=2), tasks,
                                                    ["qv", "bias", "k", "qv", None, "k", "bias"], batch())


def test_resume_from_a_checkpoint_continues_exactly(tmp_path):
    """checkpoint-2 holds the adapter (LoRA matrices under peft's wrapped names, biases, head) and the optimizer
    state; a fresh stock model resumed from it to step 4 ends bit-identical to the uninterrupted run (LoRA
    dropout on: the checkpoint's RNG state is restored too)."""
    from bitfit_hf.utils.constants import WEIGHTS_NAME

    def run(out, resume=None):
        model = tiny_model("bert").train()
        args = tiny_training.quiet_cpu_training_args(tmp_path, output_dir=str(out), max_steps=4, save_strategy="steps",
                                                     save_steps=2)
        trainer = BitFitTrainer(model, args, train_dataset=tiny_training.parity_dataset(model.config.vocab_size, n=32),
                                method_config=BitFitLoraConfig(lora_r=4, lora_learning_rate=5e-3))
        trainer.train(resume_from_checkpoint=resume)
        return model

    full = run(tmp_path / "full")
    checkpoint = tmp_path / "full" / "checkpoint-2"
    assert (checkpoint / WEIGHTS_NAME).is_file()
    assert any(".lora_A." in n for n in BitFitAdapter.from_directory(str(checkpoint)).tensors)
    resumed = run(tmp_path / "resumed", resume=str(checkpoint))
    theirs = dict(full.named_parameters())
    for name, param in resumed.named_parameters():
        assert torch.equal(param, theirs[name]), name
    moved = [n for n, p in resumed.named_parameters() if ".lora_B." in n and p.abs().sum() > 0]
    assert moved  # LoRA trained (lora_B starts at zero), so the comparison above covers it


def test_model_cards_name_lora_alone_and_bitfit_plus_lora_apart():
    from bitfit_hf.reporting.model_card import build_model_card

    both, _ = _perturbed_adapter(BitFitLoraConfig(), 1)
    alone, _ = _perturbed_adapter(BitFitLoraConfig(bias_terms="frozen"), 2)
    assert "**BitFit + LoRA**" in build_model_card(both, "me/both").content
    card = build_model_card(alone, "me/alone").content
    assert "A **LoRA**" in card and "BitFit + LoRA" not in card and "no bias term" in card
    lora_numel = sum(t.numel() for n, t in alone.tensors.items() if ".lora_" in n)
    assert lora_numel > 0 and f"trains **{lora_numel:,} parameters** outside the head" in card


def test_lora_alone_without_head_trains_only_the_lora_matrices():
    model = tiny_model("bert", num_labels=2)
    state = apply_method(model, BitFitLoraConfig(bias_terms="frozen", train_head=False))
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    assert {e.role for e in state.selection.entries} == {LORA}
    with pytest.raises(ValueError, match="selects nothing"):  # plain BitFit still refuses an empty selection
        BitFitConfig(bias_terms="frozen", train_head=False)
