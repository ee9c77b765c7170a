"""One mixed batch, every method: each example's answer equals its adapter loaded alone onto a fresh base
(``BitFitAdapter.apply_to``), within 1e-5, for sequence classification, token classification and extractive QA
heads; a bank holding all of them switches between them exactly."""

from __future__ import annotations

import pytest
import torch
import transformers as T
from conftest import TINY_CONFIGS

from bitfit_hf import AdapterBank, BitFitConfig
from bitfit_hf.adapters.multitask import MultiTaskModel
from bitfit_hf.tuners.adapterbias import AdapterBiasConfig
from bitfit_hf.tuners.bitfit_ia3 import BitFitIA3Config, IA3Config
from bitfit_hf.tuners.bitfit_lora import BitFitLoraConfig
from bitfit_hf.tuners.ln_tuning import LNTuningMethodConfig

try:
    from tests.support.perturbed_adapters import perturbed_method_adapter
except ImportError:  # tests/ (not the repo root) is on sys.path
    from support.perturbed_adapters import perturbed_method_adapter  # type: ignore[no-redef]

ATOL = 1e-5
HEADS = {"seq": T.AutoModelForSequenceClassification, "token": T.AutoModelForTokenClassification,
         "qa": T.AutoModelForQuestionAnswering}


def _configs():
    """One adapter per method and variant: every kind of change the routing knows, two LoRA ranks, both
    AdapterBias L_alpha layouts, norm gains (BitFit's one-d, LayerNorm tuning)."""
    return {
        "bitfit": BitFitConfig(),
        "one_d": BitFitConfig(bias_terms="one-d"),
        "ia3": IA3Config(),
        "bitfit_ia3": BitFitIA3Config(),
        "lora": BitFitLoraConfig(lora_r=4, lora_dropout=0.0, bias_terms="frozen"),
        "bitfit_lora": BitFitLoraConfig(lora_r=2, lora_alpha=8, lora_dropout=0.0, lora_target_modules=["query", "value", "key"]),
        "adapterbias": AdapterBiasConfig(),
        "adapterbias_shared": AdapterBiasConfig(share_alpha=True),
        "ln_tuning": LNTuningMethodConfig(),
    }


def _base(arch: str, head: str, num_labels: int = 2):
    torch.manual_seed(0)
    config = TINY_CONFIGS[arch]()
    config.num_labels = num_labels
    return HEADS[head].from_config(config).eval()


def _adapters(arch: str, head: str):
    labels = {"seq": [2, 3], "token": [5, 3], "qa": [2, 2]}[head]
    return {name: perturbed_method_adapter(_base(arch, head, labels[i % 2]), config, seed=i + 1, scale=0.3)
            for i, (name, config) in enumerate(_configs().items())}


def _inputs(n: int, seed: int = 4):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 100, (n, 9), generator=g)
    mask = torch.ones(n, 9, dtype=torch.long)
    mask[::3, -3:] = 0
    return ids, mask


def _alone(adapter, arch, head, ids, mask):
    model = adapter.apply_to(_base(arch, head, adapter.config.num_labels or 2))
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    return out


@pytest.mark.parametrize("arch,head", [("bert", "seq"), ("roberta", "seq"), ("bert", "token"), ("bert", "qa")])
def test_every_method_mixes_in_one_batch_and_matches_each_adapter_alone(arch, head):
    adapters = _adapters(arch, head)
    names = list(adapters)
    tasks = names + ["__base__"] + names[::-1]
    ids, mask = _inputs(len(tasks))
    mt = MultiTaskModel(_base(arch, head), adapters)
    with torch.no_grad():
        out = mt(input_ids=ids, attention_mask=mask, task_ids=tasks)
    stock = _base(arch, head)
    for i, task in enumerate(tasks):
        if task == "__base__":
            with torch.no_grad():
                want = stock(input_ids=ids[i:i + 1], attention_mask=mask[i:i + 1])
        else:
            want = _alone(adapters[task], arch, head, ids[i:i + 1], mask[i:i + 1])
        if head == "qa":
            for key in ("start_logits", "end_logits"):
                got = out.outputs[key][i]
                assert (got - want[key][0]).abs().max().item() <= ATOL, (task, key)
        else:
            got = out.per_example()[i]
            assert got.shape == want.logits[0].shape, task
            assert (got - want.logits[0]).abs().max().item() <= ATOL, task


def test_a_bank_of_every_method_switches_exactly_and_leaves_the_stock_model():
    adapters = _adapters("bert", "seq")
    ids, mask = _inputs(4)
    expected = {name: _alone(adapter, "bert", "seq", ids, mask).logits for name, adapter in adapters.items()}
    base = _base("bert", "seq")
    with torch.no_grad():
        stock = base(input_ids=ids, attention_mask=mask).logits
    names_before = [n for n, _ in base.named_parameters()]
    bank = AdapterBank(base)
    for name, adapter in adapters.items():
        bank.add(name, adapter)
    assert [n for n, _ in base.named_parameters()] == names_before  # nothing wrapped or inserted
    order = list(adapters) + [None] + list(adapters)[::-1]
    with torch.no_grad():
        for name in order:
            bank.activate(name) if name else bank.restore_base()
            got = base(input_ids=ids, attention_mask=mask).logits
            assert torch.equal(got, expected[name] if name else stock), name
        bank.activate("lora")  # a mixed forward over the bank sets the active task aside and restores it
        MultiTaskModel(bank)(input_ids=ids, attention_mask=mask, task_ids=["ia3", "adapterbias", "one_d", "lora"])
        assert torch.equal(base(input_ids=ids, attention_mask=mask).logits, expected["lora"])
