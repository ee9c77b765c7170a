"""MultiTaskModel with (IA)³ and BitFit + (IA)³ tasks: per-example scaling vectors are routed like per-example bias
deltas, so a mixed batch of (IA)³, BitFit + (IA)³, BitFit tasks and the stock model gives each example its own
task's logits (within 1e-5), and the model is as it was after the forward."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from bitfit_hf import AdapterBank, BitFitConfig
from bitfit_hf.adapters.multitask import MultiTaskModel
from bitfit_hf.tuners.bitfit_ia3 import BitFitIA3Config, IA3Config
from bitfit_hf.tuners.bitfit_ia3.layer import ia3_layers

try:
    from tests.support.perturbed_adapters import perturbed_method_adapter
except ImportError:  # tests/ (not the repo root) is on sys.path
    from support.perturbed_adapters import perturbed_method_adapter  # type: ignore[no-redef]

ATOL = 1e-5


def _adapter(config, seed, num_labels=2, arch="bert"):
    """An adapter of ``config`` with its tensors perturbed (stands in for training) on the shared tiny base."""
    return perturbed_method_adapter(tiny_model(arch, num_labels=num_labels), config, seed, scale=0.3)


def _inputs(n=10, length=9, seed=4):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 100, (n, length), generator=g)
    mask = torch.ones(n, length, dtype=torch.long)
    mask[::3, -3:] = 0  # some padding
    return ids, mask


def _alone(adapters, tasks, ids, mask, arch="bert"):
    """Each example through a bank with only its task active (or the stock model)."""
    bank = AdapterBank(tiny_model(arch, num_labels=2))
    for name, adapter in adapters.items():
        bank.add(name, adapter)
    rows = []
    with torch.no_grad():
        for i, task in enumerate(tasks):
            bank.activate(task) if task != "__base__" else bank.restore_base()
            rows.append(bank.model(input_ids=ids[i : i + 1], attention_mask=mask[i : i + 1]).logits[0])
    return rows


@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_mixed_ia3_bitfit_ia3_bitfit_and_base_rows_match_each_task_alone(arch):
    adapters = {
        "ia3": _adapter(IA3Config(), 1, arch=arch),
        "both": _adapter(BitFitIA3Config(), 2, num_labels=3, arch=arch),  # biases of the scaled modules too
        "value_only": _adapter(BitFitIA3Config(ia3_target_modules=["value"]), 3, arch=arch),
        "bias": _adapter(BitFitConfig(), 4, arch=arch),
    }
    ids, mask = _inputs()
    tasks = ["ia3", "both", "bias", "__base__", "value_only", "both", "ia3", "bias", "value_only", "__base__"]
    expected = _alone(adapters, tasks, ids, mask, arch)

    mt = MultiTaskModel(tiny_model(arch, num_labels=2), adapters)
    with torch.no_grad():
        got = mt(input_ids=ids, attention_mask=mask, task_ids=tasks).per_example()
    for i, task in enumerate(tasks):
        assert got[i].shape == expected[i].shape, task
        assert (got[i] - expected[i]).abs().max().item() <= ATOL, (i, task)


def test_routing_leaves_the_bank_as_it_was_and_respects_the_active_task():
    adapters = {"ia3": _adapter(IA3Config(), 1), "both": _adapter(BitFitIA3Config(), 2)}
    ids, mask = _inputs(n=4)
    expected = _alone(adapters, ["ia3", "both", "both", "ia3"], ids, mask)
    bank = AdapterBank(tiny_model("bert", num_labels=2))
    for name, adapter in adapters.items():
        bank.add(name, adapter)
    bank.activate("both")  # its (IA)³ layers on and its biases in place: routing must undo neither wrongly
    mt = MultiTaskModel(bank)
    enabled = {n: layer.disable_adapters for n, layer in ia3_layers(bank.model).items()}
    with torch.no_grad():
        got = mt(input_ids=ids, attention_mask=mask, task_ids=["ia3", "both", "both", "ia3"]).per_example()
        assert all((g - e).abs().max().item() <= ATOL for g, e in zip(got, expected))
        assert {n: layer.disable_adapters for n, layer in ia3_layers(bank.model).items()} == enabled
        alone = bank.model(input_ids=ids[:1], attention_mask=mask[:1]).logits[0]  # still "both", outside a forward
    assert (alone - _alone(adapters, ["both"], ids[:1], mask[:1])[0]).abs().max().item() <= ATOL
