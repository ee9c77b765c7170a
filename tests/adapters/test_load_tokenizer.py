"""``load_tokenizer``: the tokenizer that goes with an adapter, found offline for the packaged default base."""

from __future__ import annotations

import pytest
import transformers as T

from bitfit_hf import AdapterError, BitFitAdapter, BitFitConfig, apply_bitfit, load_tokenizer
from bitfit_hf.utils.constants import DEFAULT_MODEL_ID

TEXT = "a gripping, beautifully shot film"


@pytest.fixture
def adapter_on_default_base(minilm_dir, tmp_path):
    """An adapter of the real all-MiniLM-L6-v2 that records the base by its Hub id (as the recipes do), no tokenizer."""
    model = T.AutoModelForSequenceClassification.from_pretrained(minilm_dir, num_labels=2)
    apply_bitfit(model, BitFitConfig("all"))
    BitFitAdapter.from_model(model, base_model_name_or_path=DEFAULT_MODEL_ID).save_pretrained(tmp_path / "adapter")
    return tmp_path / "adapter"


def test_the_default_base_tokenizer_loads_offline_from_its_packaged_copy(adapter_on_default_base, minilm_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer = load_tokenizer(adapter_on_default_base)
    assert tokenizer(TEXT)["input_ids"] == T.AutoTokenizer.from_pretrained(minilm_dir)(TEXT)["input_ids"]
    assert load_tokenizer(BitFitAdapter.from_pretrained(adapter_on_default_base))(TEXT)["input_ids"] == \
        tokenizer(TEXT)["input_ids"]


def test_a_tokenizer_saved_beside_the_adapter_wins(adapter_on_default_base, minilm_dir, monkeypatch):
    T.AutoTokenizer.from_pretrained(minilm_dir, model_max_length=17).save_pretrained(adapter_on_default_base)
    assert load_tokenizer(adapter_on_default_base).model_max_length == 17


def test_an_unreachable_base_names_the_local_way(adapter_on_default_base, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(AdapterError, match="bitfit-hf assets path minilm"):
        load_tokenizer(adapter_on_default_base, base_model=str(tmp_path / "no-such-model"))
