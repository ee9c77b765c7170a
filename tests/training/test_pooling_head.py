"""BitFitTrainer on a sentence-transformers checkpoint the user loaded: the head reads the checkpoint's pooling."""

from __future__ import annotations

import pytest
import torch
import transformers as T

from bitfit_hf.hub.trainer import BitFitTrainer
from bitfit_hf.training.pooling_head import apply_pooling_head
from bitfit_hf.utils.sentence_pooling import PoolingConfigError, sentence_pooling_of

try:
    from tests.support.sentence_transformers_files import OLD_MEAN, write_sentence_transformers_files
except ImportError:  # tests/ (not the repo root) is on sys.path
    from support.sentence_transformers_files import OLD_MEAN, write_sentence_transformers_files  # type: ignore[no-redef]


def saved_tiny_bert(folder, sentence_transformers: bool):
    torch.manual_seed(0)
    config = T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                          vocab_size=100, num_labels=2)
    T.BertModel(config).save_pretrained(folder)
    if sentence_transformers:
        write_sentence_transformers_files(folder, OLD_MEAN)
    return T.BertForSequenceClassification.from_pretrained(folder, num_labels=2)


def trainer_for(model, tmp_path, **kwargs):
    args = T.TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True)
    return BitFitTrainer(model=model, args=args, **kwargs)


def trainable(model):
    return {name for name, p in model.named_parameters() if p.requires_grad}


def test_a_user_loaded_sentence_transformers_classifier_reads_the_checkpoint_pooling(tmp_path):
    model = saved_tiny_bert(tmp_path / "st", sentence_transformers=True)
    trainer_for(model, tmp_path)
    assert sentence_pooling_of(model) == "mean"
    assert not any(".pooler." in name for name, _ in model.named_parameters())
    ids = torch.tensor([[1, 5, 7, 0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    hidden = model.bert(input_ids=ids, attention_mask=mask).last_hidden_state
    pooled = (hidden[:, :3]).mean(dim=1)
    assert torch.allclose(model(input_ids=ids, attention_mask=mask).logits, model.classifier(pooled), atol=1e-6)


def test_train_pooler_trains_the_untrained_pooler_and_as_loaded_leaves_it_frozen(tmp_path):
    model = saved_tiny_bert(tmp_path / "st", sentence_transformers=True)
    trainer_for(model, tmp_path, pooling_head="train_pooler")
    assert sentence_pooling_of(model) is None
    assert {"bert.pooler.dense.weight", "bert.pooler.dense.bias"} <= trainable(model)

    other = saved_tiny_bert(tmp_path / "st2", sentence_transformers=True)
    trainer_for(other, tmp_path, pooling_head="as_loaded")
    assert sentence_pooling_of(other) is None
    assert "bert.pooler.dense.weight" not in trainable(other)


def test_a_plain_checkpoint_is_left_as_loaded(tmp_path):
    model = saved_tiny_bert(tmp_path / "plain", sentence_transformers=False)
    trainer_for(model, tmp_path)
    assert sentence_pooling_of(model) is None
    assert "bert.pooler.dense.weight" not in trainable(model)


def test_an_unknown_pooling_head_is_refused_with_the_choices(tmp_path):
    model = saved_tiny_bert(tmp_path / "st", sentence_transformers=True)
    with pytest.raises(PoolingConfigError, match="checkpoint, train_pooler, as_loaded"):
        apply_pooling_head(model, str(tmp_path / "st"), "mean")
