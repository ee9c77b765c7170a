"""AdapterBank edge cases: the base's labels come back with ``restore_base()``; a failed ``add`` leaves the model
as it was (no biases of its own left behind, the task that was active active again); ``~`` in adapter paths."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import batch, tiny_model

from bitfit_hf import AdapterBank, AutoBitFitModel, BitFitAdapter, BitFitConfig, apply_bitfit, load_adapter
from bitfit_hf.adapters.config import AdapterError, BaseModelMismatchError

try:
    from tests.support.perturbed_adapters import perturb_trainable
except ImportError:  # tests/ (not the repo root) is on sys.path
    from support.perturbed_adapters import perturb_trainable  # type: ignore[no-redef]


def perturbed_adapter(base, config: BitFitConfig, seed: int, num_labels=None, labels=None) -> BitFitAdapter:
    """An adapter of ``config`` trained (here: randomly moved) on ``base``'s frozen weights."""
    model = copy.deepcopy(base)
    if num_labels is not None:
        import transformers as T

        model_config = copy.deepcopy(base.config)
        model_config.num_labels = num_labels
        model_config.id2label = {i: name for i, name in enumerate(labels)}
        model_config.label2id = {name: i for i, name in enumerate(labels)}
        model_config.problem_type = "single_label_classification"
        torch.manual_seed(seed)
        model = T.AutoModelForSequenceClassification.from_config(model_config).eval()
        body = base.base_model_prefix
        getattr(model, body).load_state_dict(getattr(base, body).state_dict())
    apply_bitfit(model, config)
    perturb_trainable(model, seed, scale=0.3)
    return BitFitAdapter.from_model(model)


def logits(model):
    with torch.no_grad():
        return model(**batch()).logits


def labels_of(model):
    cfg = model.config
    return (dict(cfg.id2label), dict(cfg.label2id), cfg.num_labels, cfg.problem_type, getattr(model, "num_labels", None))


def test_restore_base_puts_the_base_labels_back():
    base = tiny_model("bert", num_labels=2)
    stock = labels_of(base)
    stock_logits = logits(base)
    bank = AdapterBank(base)
    bank.add("nli", perturbed_adapter(base, BitFitConfig(), 1, num_labels=3, labels=["entail", "neutral", "contra"]))
    bank.add("plain", perturbed_adapter(base, BitFitConfig(), 2))  # records the base's own label names
    bank.activate("nli")
    assert base.config.id2label == {0: "entail", 1: "neutral", 2: "contra"} and base.config.num_labels == 3
    bank.restore_base()
    assert labels_of(base) == stock
    assert torch.equal(logits(base), stock_logits)
    bank.activate("nli")
    bank.activate("plain")  # a task whose labels are the base's: nothing of nli's stays
    assert labels_of(base)[:3] == stock[:3]


def _llama_bank():
    base = tiny_model("llama", num_labels=2)
    first = perturbed_adapter(base, BitFitConfig(bias_terms=["b_q"], add_missing_biases=True), 1)
    bank = AdapterBank(base)
    bank.add("first", first)
    bank.activate("first")
    return base, bank


def test_a_failed_add_leaves_no_bias_behind_and_reactivates_the_active_task():
    base, bank = _llama_bank()
    names = [n for n, _ in base.named_parameters()]
    expected = logits(base)
    other = tiny_model("llama", num_labels=2, seed=7)  # another base: its adapters do not fit this one
    foreign = perturbed_adapter(other, BitFitConfig(bias_terms=["b_v", "b_m1"], add_missing_biases=True), 2)
    with pytest.raises(BaseModelMismatchError):
        bank.add("foreign", foreign)
    assert [n for n, _ in base.named_parameters()] == names  # no v_proj / gate_proj bias left behind
    assert bank.active == "first" and bank.names == ["first"]
    assert torch.equal(logits(base), expected)


def test_an_add_failing_after_its_biases_were_added_takes_them_out_again():
    base, bank = _llama_bank()
    names = [n for n, _ in base.named_parameters()]
    expected = logits(base)
    stock = tiny_model("llama", num_labels=2)  # the same weights as the bank's base
    adapter = perturbed_adapter(stock, BitFitConfig(bias_terms=["b_v"], add_missing_biases=True), 3)
    adapter.tensors["model.layers.0.self_attn.nowhere.bias"] = torch.zeros(4)  # a tensor this model lacks
    with pytest.raises(AdapterError, match="lacks"):
        bank.add("broken", adapter)
    assert [n for n, _ in base.named_parameters()] == names
    assert bank.active == "first" and bank.names == ["first"]
    assert torch.equal(logits(base), expected)
    bank.add("v", perturbed_adapter(stock, BitFitConfig(bias_terms=["b_v"], add_missing_biases=True), 3))
    bank.activate("v")  # the same modules can take their biases afterwards


def test_a_tilde_in_an_adapter_path_is_the_home_folder(tmp_path, monkeypatch):
    base = tiny_model("bert", num_labels=2)
    adapter = perturbed_adapter(base, BitFitConfig(), 1)
    (tmp_path / "adapters").mkdir()
    adapter.save_pretrained(str(tmp_path / "adapters" / "sst2"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    expected = logits(adapter.apply_to(tiny_model("bert", num_labels=2)))
    assert BitFitAdapter.from_pretrained("~/adapters/sst2").tensors.keys() == adapter.tensors.keys()
    assert torch.equal(logits(load_adapter(tiny_model("bert", num_labels=2), "~/adapters/sst2")), expected)
    model = AutoBitFitModel.from_pretrained("~/adapters/sst2", base_model=tiny_model("bert", num_labels=2))
    assert torch.equal(logits(model), expected)
    bank = AdapterBank(tiny_model("bert", num_labels=2))
    bank.add("sst2", "~/adapters/sst2")
    bank.activate("sst2")
    assert torch.equal(logits(bank.model), expected)
