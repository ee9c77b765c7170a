"""Adapters trained through a sentence-transformers checkpoint's own pooling: round trip onto a stock
base, the bank, and the exports that cannot express the pooling (a tiny BERT saved here with a
``modules.json``)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T

from bitfit_hf import AdapterBank, AdapterError, AutoBitFitModel, BitFitAdapter, BitFitConfig, apply_bitfit, export_merged
from bitfit_hf.adapters.peft_export import PeftExportError, export_peft
from bitfit_hf.utils.sentence_pooling import install_sentence_pooling, sentence_pooling_of


@pytest.fixture
def st_folder(tmp_path):
    """A tiny BERT saved as a sentence-transformers checkpoint (mean pooling)."""
    torch.manual_seed(0)
    config = T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                          vocab_size=100)
    T.BertModel(config).save_pretrained(tmp_path / "base")
    (tmp_path / "base" / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (tmp_path / "base" / "1_Pooling").mkdir()
    (tmp_path / "base" / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "mean"}))
    return str(tmp_path / "base")


def trained_adapter(folder, pooling="mean", seed=1) -> BitFitAdapter:
    torch.manual_seed(seed)
    model = T.BertForSequenceClassification.from_pretrained(folder, num_labels=2).eval()
    if pooling:
        install_sentence_pooling(model, pooling)
    apply_bitfit(model, BitFitConfig("all"))
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.3 * torch.randn_like(param))
    return model, BitFitAdapter.from_model(model, base_model_name_or_path=folder)


IDS = torch.tensor([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]])
MASK = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])


def run(model):
    with torch.no_grad():
        return model(input_ids=IDS, attention_mask=MASK).logits


def test_pooled_adapter_reproduces_the_trained_logits_on_a_stock_base(st_folder, tmp_path):
    model, adapter = trained_adapter(st_folder)
    assert adapter.config.sentence_pooling == "mean"
    assert not any("pooler" in name for name in adapter.tensors), "the untrained pooler is removed, not stored"
    adapter.save_pretrained(str(tmp_path / "adapter"))
    loaded = AutoBitFitModel.from_pretrained(str(tmp_path / "adapter")).eval()
    assert sentence_pooling_of(loaded) == "mean" and loaded.bert.pooler is None
    assert torch.equal(run(loaded), run(model))
    # the same adapter onto a base the caller built (load_adapter / apply_to) pools the same way
    stock = T.BertForSequenceClassification.from_pretrained(st_folder, num_labels=2).eval()
    assert torch.equal(run(BitFitAdapter.from_pretrained(str(tmp_path / "adapter")).apply_to(stock)), run(model))


def test_the_bank_switches_pooled_tasks_and_refuses_mixing_poolings(st_folder):
    model_a, adapter_a = trained_adapter(st_folder, seed=1)
    model_b, adapter_b = trained_adapter(st_folder, seed=2)
    _, pooler_adapter = trained_adapter(st_folder, pooling=None, seed=3)
    bank = AdapterBank(T.BertForSequenceClassification.from_pretrained(st_folder, num_labels=2).eval())
    bank.add("a", adapter_a)
    bank.add("b", adapter_b)
    bank.activate("a")
    assert torch.equal(run(bank.model), run(model_a))
    bank.activate("b")
    assert torch.equal(run(bank.model), run(model_b))
    with pytest.raises(AdapterError, match="share its pooling"):
        bank.add("c", pooler_adapter)


def test_exports_that_cannot_express_the_pooling_refuse_with_the_way_out(st_folder, tmp_path):
    model, adapter = trained_adapter(st_folder)
    with pytest.raises(AdapterError, match="--pooling_head train_pooler"):
        export_merged(model, str(tmp_path / "merged"))
    assert not (tmp_path / "merged").exists()
    with pytest.raises(PeftExportError, match="--pooling_head train_pooler"):
        export_peft(adapter, str(tmp_path / "peft"))
    assert not (tmp_path / "peft").exists()


def test_a_pooler_adapter_on_a_pooled_model_is_refused(st_folder):
    _, pooler_adapter = trained_adapter(st_folder, pooling=None)
    pooled = install_sentence_pooling(T.BertForSequenceClassification.from_pretrained(st_folder, num_labels=2), "mean")
    with pytest.raises(AdapterError, match="own pooler"):
        pooler_adapter.apply_to(pooled)


def test_mixed_task_batches_pool_each_example_like_its_adapter_alone(st_folder):
    from bitfit_hf.adapters.multitask import MultiTaskModel

    model_a, adapter_a = trained_adapter(st_folder, seed=1)
    model_b, adapter_b = trained_adapter(st_folder, seed=2)
    base = T.BertForSequenceClassification.from_pretrained(st_folder, num_labels=2).eval()
    mixed = MultiTaskModel(base, {"a": adapter_a, "b": adapter_b})
    with torch.no_grad():
        logits = mixed(input_ids=IDS, attention_mask=MASK, task_ids=["a", "b"]).logits
    assert torch.allclose(logits[0], run(model_a)[0], atol=1e-5)
    assert torch.allclose(logits[1], run(model_b)[1], atol=1e-5)


def test_a_base_model_path_under_home_is_expanded(st_folder, tmp_path, monkeypatch):
    model, adapter = trained_adapter(st_folder)
    adapter.save_pretrained(str(tmp_path / "adapter"))
    monkeypatch.setenv("HOME", str(tmp_path))
    loaded = AutoBitFitModel.from_pretrained(str(tmp_path / "adapter"), base_model="~/base").eval()
    assert torch.equal(run(loaded), run(model))
