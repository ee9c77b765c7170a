"""Sentence-transformers checkpoints and never-trained modules, on tiny models built here."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T

from bitfit_hf.tuners.state import detect_head_modules
from bitfit_hf.utils.sentence_pooling import (
    PoolingConfigError,
    checkpoint_pooling,
    install_sentence_pooling,
    mark_untrained_modules,
    newly_initialised_modules,
    pool,
    pooling_mode_from_config,
    sentence_pooling_of,
)

try:
    from tests.support.sentence_transformers_files import OLD_MEAN, write_sentence_transformers_files
except ImportError:  # tests/ (not the repo root) is on sys.path
    from support.sentence_transformers_files import OLD_MEAN, write_sentence_transformers_files  # type: ignore[no-redef]


@pytest.mark.parametrize("config, mode", [
    (OLD_MEAN, "mean"),
    ({**OLD_MEAN, "pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True}, "cls"),
    ({**OLD_MEAN, "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": True}, "max"),
    ({"embedding_dimension": 32, "pooling_mode": "mean", "include_prompt": True}, "mean"),
    ({"embedding_dimension": 32, "pooling_mode": "cls"}, "cls"),
])
def test_both_pooling_config_formats_are_read(tmp_path, config, mode):
    write_sentence_transformers_files(tmp_path, config, pooling_dir="pool_here")
    assert checkpoint_pooling(str(tmp_path)) == mode


def test_a_plain_transformers_folder_is_no_sentence_transformers_checkpoint(tmp_path):
    assert checkpoint_pooling(str(tmp_path)) is None
    (tmp_path / "modules.json").write_text(json.dumps([{"idx": 0, "path": "", "type": "x.Transformer"}]))
    assert checkpoint_pooling(str(tmp_path)) is None


@pytest.mark.parametrize("config", [
    {**OLD_MEAN, "pooling_mode_cls_token": True},  # two modes concatenated: twice the width
    {"pooling_mode": "weightedmean"},
    {},
])
def test_poolings_a_classifier_cannot_take_are_refused_with_the_way_out(config):
    with pytest.raises(PoolingConfigError, match="--pooling_head train_pooler"):
        pooling_mode_from_config(config)


def test_damaged_modules_json_is_a_clear_error(tmp_path):
    (tmp_path / "modules.json").write_text("{not json")
    with pytest.raises(PoolingConfigError, match="modules.json"):
        checkpoint_pooling(str(tmp_path))


def test_mean_and_max_pooling_leave_padding_out():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert torch.equal(pool(hidden, mask, "mean"), torch.tensor([[2.0, 3.0]]))
    assert torch.equal(pool(hidden, mask, "max"), torch.tensor([[3.0, 4.0]]))
    assert torch.equal(pool(hidden, mask, "cls"), torch.tensor([[1.0, 2.0]]))
    assert torch.allclose(pool(hidden, mask, "mean_sqrt_len"), torch.tensor([[4.0, 6.0]]) / 2 ** 0.5)


def tiny_bert(seed=0):
    torch.manual_seed(seed)
    config = T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                          vocab_size=100, num_labels=2)
    return T.BertForSequenceClassification(config).eval()


def test_pooled_bert_classifies_from_the_masked_mean_of_token_states():
    model = tiny_bert()
    install_sentence_pooling(model, "mean")
    assert model.bert.pooler is None and sentence_pooling_of(model) == "mean"
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 10, 11]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
        states = model.bert(input_ids=ids, attention_mask=mask).last_hidden_state
        expected = model.classifier((states * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True))
    assert torch.allclose(logits, expected, atol=1e-6)
    # padding does not change a sentence's prediction
    with torch.no_grad():
        alone = model(input_ids=ids[:1, :3], attention_mask=mask[:1, :3]).logits
    assert torch.allclose(alone, logits[:1], atol=1e-5)


def test_models_whose_head_reads_the_first_token_get_the_pooled_vector_there():
    torch.manual_seed(0)
    config = T.RobertaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                             vocab_size=100, num_labels=2)
    model = T.RobertaForSequenceClassification(config).eval()
    install_sentence_pooling(model, "mean")
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        install_free = T.RobertaForSequenceClassification(config).eval()
        install_free.load_state_dict(model.state_dict())
        states = install_free.roberta(input_ids=ids).last_hidden_state
        expected = install_free.classifier(states.mean(1, keepdim=True))
    assert torch.allclose(logits, expected, atol=1e-6)


def test_pooling_is_idempotent_and_refuses_a_second_mode_and_other_heads():
    model = tiny_bert()
    install_sentence_pooling(model, "mean")
    install_sentence_pooling(model, "mean")
    with pytest.raises(PoolingConfigError, match="already"):
        install_sentence_pooling(model, "cls")
    tagger = T.BertForTokenClassification(model.config)
    with pytest.raises(PoolingConfigError, match="sequence classification"):
        install_sentence_pooling(tagger, "mean")


def test_newly_initialised_modules_are_found_and_join_the_head():
    model = tiny_bert()
    missing = [k for k in model.state_dict() if k.startswith(("bert.pooler", "classifier"))]
    assert newly_initialised_modules(model, missing, exclude=["classifier"]) == ["bert.pooler"]
    assert detect_head_modules(model) == ["classifier"]
    mark_untrained_modules(model, ["bert.pooler"])
    assert detect_head_modules(model) == ["classifier", "bert.pooler"]
    with pytest.raises(PoolingConfigError, match="not modules"):
        mark_untrained_modules(model, ["bert.nowhere"])
