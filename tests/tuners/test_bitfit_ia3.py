"""(IA)³ and BitFit + (IA)³: peft scaling vectors on keys, values and the FFN's inner activation (plus the selected
biases and the head) train; nothing else moves; the adapter reproduces the trained logits exactly on a stock base,
the bank switches them, and the merged checkpoint matches up to float rounding."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T
from conftest import batch, tiny_model

from bitfit_hf import BitFitConfig, BitFitTrainer
from bitfit_hf.tuners import METHODS, apply_method
from bitfit_hf.tuners.bitfit_ia3 import IA3, BitFitIA3Config, BitFitIA3State, IA3Config

try:
    from tests.support import adapter_roundtrip, perturbed_adapters, tiny_training
except ImportError:  # tests/ (not the repo root) is on sys.path
    from support import adapter_roundtrip, perturbed_adapters, tiny_training  # type: ignore[no-redef]

MERGE_ATOL = 1e-5  # x (W * l) rounds differently from (x W) * l


@pytest.mark.parametrize("config_class", [IA3Config, BitFitIA3Config], ids=["ia3", "bitfit_ia3"])
@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_only_the_methods_tensors_move_and_the_adapter_reloads_exactly(arch, config_class, tmp_path):
    model = tiny_model(arch, num_labels=2)
    base_dir = tmp_path / "base"
    model.save_pretrained(base_dir)
    model = T.AutoModelForSequenceClassification.from_pretrained(base_dir)
    config = config_class(ia3_learning_rate=3e-2, bias_learning_rate=1e-2)
    state = apply_method(model, config)
    assert isinstance(state, BitFitIA3State)
    leaves = {m.rsplit(".", 2)[-2:][-1] if not m.endswith("output.dense") else "output.dense" for m in state.ia3_modules}
    assert leaves == {"key", "value", "output.dense"}
    assert not any("attention.output.dense" in m for m in state.ia3_modules)  # b_m3 only, never b_m1
    roles = {e.role for e in state.selection.entries}
    assert IA3 in roles and "head" in roles
    assert (len(roles) > 2) == (config_class is BitFitIA3Config)  # ia3 trains no bias
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = BitFitTrainer(model, tiny_training.quiet_cpu_training_args(tmp_path),
                            train_dataset=tiny_training.parity_dataset(model.config.vocab_size), method_config=config)
    trainer.train()
    model.eval()
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved == set(state.selection.parameter_names)  # everything else bit-identical
    rates = {g.get("initial_lr", g["lr"]) for g in trainer.optimizer.param_groups}
    assert 3e-2 in rates

    inputs = batch(vocab=model.config.vocab_size)
    with torch.no_grad():
        trained = model(**inputs).logits
    trainer.save_model(str(tmp_path / "adapter"))
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert saved["method"] == config_class.method
    assert any(".ia3_l." in n for n in saved["adapter_parameters"])
    summary = json.loads((tmp_path / "adapter" / "trainable_summary.json").read_text())
    assert summary["per_role"][IA3] > 0

    adapter_roundtrip.assert_reloads_exactly_and_merges(tmp_path / "adapter", base_dir, tmp_path / "merged", inputs, trained,
                                                        method_marker="ia3", merge_atol=MERGE_ATOL)


def test_ia3_leaves_outputs_unchanged_until_trained():
    model = tiny_model("bert", num_labels=2)
    with torch.no_grad():
        expected = model(**batch()).logits
    apply_method(model, BitFitIA3Config())
    with torch.no_grad():
        assert torch.equal(model(**batch()).logits, expected)


def _perturbed_adapter(config, seed):
    model = tiny_model("bert", num_labels=2 + seed % 2)
    return perturbed_adapters.perturbed_adapter_and_logits(model, config, seed, batch(), scale=0.2)


def test_adapter_bank_switches_ia3_tasks_bias_tasks_and_the_base_exactly():
    ia3 = _perturbed_adapter(IA3Config(), 1)
    bias_only = _perturbed_adapter(BitFitConfig(), 2)
    both = _perturbed_adapter(BitFitIA3Config(ia3_target_modules=["value"]), 3)
    tasks = {"bias": bias_only, "ia3": ia3, "both": both}  # added to the bank in this order
    perturbed_adapters.assert_bank_switches_exactly(tiny_model("bert", num_labels=2), tasks,
                                                    ["ia3", "bias", "both", "ia3", None, "both", "bias"], batch())


def test_multitask_serves_ia3_tasks_in_mixed_batches():
    """Scaling vectors route per example (tests/adapters/test_multitask_ia3.py checks the logits)."""
    from bitfit_hf.adapters.multitask import MultiTaskModel

    ia3, logits = _perturbed_adapter(IA3Config(), 1)
    mt = MultiTaskModel(tiny_model("bert", num_labels=2), {"ia3": ia3})
    with torch.no_grad():
        got = mt(**batch(), task_ids=["ia3"] * 4).logits
    assert (got - logits).abs().max().item() <= 1e-5


def test_registry_and_config_checks():
    assert METHODS["ia3"].supports("merge") and not METHODS["bitfit_ia3"].not_batchable
    assert IA3Config().bias_terms == ["frozen"]
    with pytest.raises(ValueError, match="full"):
        BitFitIA3Config(bias_terms="full")
    with pytest.raises(ValueError, match="matches no module"):
        apply_method(tiny_model("bert"), IA3Config(ia3_target_modules=["nothing_here"]))
    assert IA3Config.from_dict(IA3Config(ia3_target_modules=["value"]).to_dict()).ia3_target_modules == ["value"]
